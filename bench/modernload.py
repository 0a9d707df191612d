"""`python bench/modernload.py HARNESS load.py-arguments…`: the peer harness's load client, speaking MCP 2026-07-28.

The harness's `load.py` speaks 2025 sessions (initialize, then `Mcp-Session-Id` on every call), so the 2026-07-28
stateless path cannot be put beside the peers through it as it is. This runs that same `load.py` (its loop, its
timing, its checks of every answer) with only the request changed as that era asks: `--protocol raw` (no
handshake, no session), the call's params carrying the `_meta` envelope (version, client capabilities and info),
and `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` on every request. Runs on the harness's Python, which has
aiohttp; imports nothing of gatewayd's but `bench.wire`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import wire


def speak_modern(load: Any) -> None:
    """Make `load.Client` send 2026-07-28 stateless calls."""
    made = load.Client.__init__

    def __init__(self: Any, args: Any) -> None:
        made(self, args)
        params = {"name": args.tool, "arguments": self.tool_args, "_meta": wire.MODERN_META}
        self.body_tail = b',"method":"tools/call","params":' + wire.compact(params) + b"}"
        self.base_headers.update({wire.VERSION_HEADER: wire.MODERN_VERSION, "Mcp-Method": "tools/call",
                                  "Mcp-Name": args.tool})

    load.Client.__init__ = __init__


def main(argv: list[str]) -> int:
    harness, rest = argv[0], argv[1:]
    sys.path.insert(0, harness)
    import load  # type: ignore[import-not-found]  # the harness's own client

    speak_modern(load)
    return int(load.main(rest + ["--protocol", "raw", "--verify", "strict"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
