"""An MCP stdio child for bench.scale's resources target: `RESSRV_ITEMS` (default 100) resources `res://item/N`, and
as many templates `SCHEME://kindN/{id}` (`RESSRV_SCHEME`, default `tmpl`).

Answers the handshake, empty tool and prompt lists, its resource and template lists in one page each, and
`resources/read` of any of its URIs or of any expansion of its templates; anything else is "method not found".
Standard library only, one request a line, answered in order. Run as a file (`python3 bench/ressrv.py`): the
installed copies the bench runs on do not have the checkout's `bench` package.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

ITEMS = int(os.environ.get("RESSRV_ITEMS", "100"))
URIS = [f"res://item/{index}" for index in range(ITEMS)]
SCHEME = os.environ.get("RESSRV_SCHEME", "tmpl")
TEMPLATES = [f"{SCHEME}://kind{index}/{{id}}" for index in range(ITEMS)]
EXPANSION = re.compile(re.escape(SCHEME) + r"://kind(\d+)/[^/?#]+")


def answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The result of `method`, or None for one it does not have."""
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"resources": {}}, "serverInfo": {"name": "ressrv", "version": "0"}}
    if method == "ping":
        return {}
    if method in ("tools/list", "prompts/list"):
        return {method.split("/")[0]: []}
    if method == "resources/templates/list":
        return {"resourceTemplates": [{"uriTemplate": template, "name": "kind"} for template in TEMPLATES]}
    if method == "resources/list":
        return {"resources": [{"uri": uri, "name": uri.rsplit("/", 1)[1]} for uri in URIS]}
    uri = params.get("uri")
    if method == "resources/read" and isinstance(uri, str) and (uri in URIS or _expands(uri)):
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": "ok"}]}
    return None


def _expands(uri: str) -> bool:
    match = EXPANSION.fullmatch(uri)
    return match is not None and int(match.group(1)) < ITEMS


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
