"""A minimal MCP child for bench.scale's streaming target: tool `stream {"count": N, "interval": S}` sends N progress
notifications S seconds apart (each stamped with the wall time it was written, in `message`), then its result.

Standard library only. Every running call is paced by one scheduler thread (a heap of due times), each
notification its own line and its own write, as a thread per call would send it. A thread per call cost this
child ~30 µs of CPU a notification (100 threads waking 10,000 times a second, each taking the GIL), 0.3 of a core
the daemon under test shared on a 2-core machine; one scheduler ~21 µs (bench/README.md).

Run as a file (`python3 bench/progsrv.py`): the installed copies the bench runs on do not have the checkout's
`bench` package.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LOCK = threading.Lock()
TOOL = {"name": "stream", "description": "progress notifications at a steady rate",
        "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}, "interval": {"type": "number"}}}}


def send(message: dict[str, Any]) -> None:
    line = memoryview(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    with LOCK:
        while line:
            line = line[os.write(1, line):]


def _result(request_id: Any, count: int) -> None:
    send({"jsonrpc": "2.0", "id": request_id,
          "result": {"content": [{"type": "text", "text": f"sent {count}"}], "isError": False}})


@dataclass(order=True)
class Stream:
    """One running call: its next step is due at `due`, paced against its start so a late step does not push
    every later one back."""

    due: float
    request_id: Any = field(compare=False)
    token: Any = field(compare=False)
    count: int = field(compare=False)
    interval: float = field(compare=False)
    start: float = field(compare=False)
    step: int = field(compare=False, default=1)


class Scheduler:
    """The one thread that sends every stream's notifications when they are due."""

    def __init__(self) -> None:
        self._due: list[Stream] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def add(self, request_id: Any, params: dict[str, Any]) -> None:
        arguments = params.get("arguments") or {}
        count, interval = int(arguments.get("count", 1)), float(arguments.get("interval", 0.01))
        token = (params.get("_meta") or {}).get("progressToken")
        start = time.monotonic()
        if count < 1:
            _result(request_id, 0)
            return
        with self._changed:
            heapq.heappush(self._due, Stream(start + interval, request_id, token, count, interval, start))
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0].due > time.monotonic():
                    wait = self._due[0].due - time.monotonic() if self._due else None
                    self._changed.wait(wait)
                stream = heapq.heappop(self._due)
            if self._send_step(stream):
                with self._changed:
                    heapq.heappush(self._due, stream)

    @staticmethod
    def _send_step(stream: Stream) -> bool:
        """Send the stream's due notification (and its result after the last); whether it has more to send."""
        if stream.token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": stream.token, "progress": stream.step, "total": stream.count,
                             "message": repr(time.time())}})
        if stream.step >= stream.count:
            _result(stream.request_id, stream.count)
            return False
        stream.step += 1
        stream.due = stream.start + stream.step * stream.interval
        return True


def main() -> int:
    scheduler = Scheduler()
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
            scheduler.add(request_id, message.get("params") or {})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
