"""A minimal MCP child for bench.scale's streaming target: tool `stream {"count": N, "interval": S}` sends N progress
notifications S seconds apart (each stamped with the wall time it was written, in `message`), then its result.

Standard library only; one thread per running call, one lock on stdout. Run as a file (`python3 bench/progsrv.py`):
the installed copies the bench runs on do not have the checkout's `bench` package.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

LOCK = threading.Lock()
TOOL = {"name": "stream", "description": "progress notifications at a steady rate",
        "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}, "interval": {"type": "number"}}}}


def send(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    with LOCK:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def stream(request_id: Any, params: dict[str, Any]) -> None:
    arguments = params.get("arguments") or {}
    count, interval = int(arguments.get("count", 1)), float(arguments.get("interval", 0.01))
    token = (params.get("_meta") or {}).get("progressToken")
    start = time.monotonic()
    for step in range(1, count + 1):
        # Paced against the start, so a late step does not push every later one back.
        delay = start + step * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": step, "total": count, "message": repr(time.time())}})
    send({"jsonrpc": "2.0", "id": request_id,
          "result": {"content": [{"type": "text", "text": f"sent {count}"}], "isError": False}})


def main() -> int:
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # notifications (initialized, cancelled) need nothing here
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": message["params"].get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "progsrv", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": [TOOL]}})
        elif method == "tools/call":
            threading.Thread(target=stream, args=(request_id, message.get("params") or {}), daemon=True).start()
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
