"""An MCP stdio child for bench.scale's resources target: `RESSRV_ITEMS` (default 100) resources `res://item/N`.

Answers the handshake, empty tool, template and prompt lists, its resource list in one page, and `resources/read`
of any of its URIs; anything else is "method not found". Standard library only, one request a line, answered in
order. Run as a file (`python3 bench/ressrv.py`): the installed copies the bench runs on do not have the checkout's
`bench` package.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ITEMS = int(os.environ.get("RESSRV_ITEMS", "100"))
URIS = [f"res://item/{index}" for index in range(ITEMS)]


def answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The result of `method`, or None for one it does not have."""
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"resources": {}}, "serverInfo": {"name": "ressrv", "version": "0"}}
    if method == "ping":
        return {}
    if method in ("tools/list", "prompts/list", "resources/templates/list"):
        return {{"tools/list": "tools", "prompts/list": "prompts"}.get(method, "resourceTemplates"): []}
    if method == "resources/list":
        return {"resources": [{"uri": uri, "name": uri.rsplit("/", 1)[1]} for uri in URIS]}
    if method == "resources/read" and params.get("uri") in URIS:
        return {"contents": [{"uri": params["uri"], "mimeType": "text/plain", "text": "ok"}]}
    return None


def main() -> int:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" not in request:
            continue  # notifications/initialized and the like
        result = answer(str(request.get("method")), request.get("params") or {})
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if result is None:
            reply["error"] = {"code": -32601, "message": "Method not found"}
        else:
            reply["result"] = result
        out.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
