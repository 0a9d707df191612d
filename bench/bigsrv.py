"""A plain JSON-RPC 2.0 child for bench.scale's payload target: `blob {"bytes": N}` answers `{"text": "x" * N}`,
`take {"text": T}` answers `{"chars": len(T)}` (a large argument, the other way).

Standard library only, one request a line, answered in order. Run as a file (`python3 bench/bigsrv.py`): the
installed copies the bench runs on do not have the checkout's `bench` package.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        params = request.get("params") or {}
        if request.get("method") == "blob":
            reply = {"jsonrpc": "2.0", "id": request.get("id"), "result": {"text": "x" * int(params.get("bytes", 0))}}
        elif request.get("method") == "take":
            reply = {"jsonrpc": "2.0", "id": request.get("id"), "result": {"chars": len(params.get("text", ""))}}
        else:
            reply = {"jsonrpc": "2.0", "id": request.get("id"),
                     "error": {"code": -32601, "message": "Method not found"}}
        if "id" in request:
            out.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
