"""`tools/list` through the in-memory Gateway: microseconds per answer for a catalog of many tools.

Owns one quick measurement of the list path alone (no HTTP, no child): `servers` × `tools` scripted tools, a
principal allowed all of them, `rounds` answers timed after a warm-up (in the process's CPU time, steadier than
wall time on a shared machine); the median of `repeats` runs is printed.
Run before and after a change to the list path and compare the medians (same machine, same moment):

    .venv/bin/python -m bench.lists --servers 10 --tools 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.confirmation import ConfirmationGate
from gatewayd.gateway import Gateway
from gatewayd.inflight import Inflight
from gatewayd.jsonrpc import Request
from gatewayd.metrics import Metrics
from gatewayd.policy import Grant, Principal
from gatewayd.records import Records
from gatewayd.upstream.api import ANYONE, Delivery, ToolDef


class Listed:
    """An upstream that only lists tools (what `tools/list` asks of a server)."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.prefix = name
        self._tools = [ToolDef(f"tool_{index:04d}", f"tool {index}", {"type": "object"},
                               {"name": f"tool_{index:04d}", "description": f"tool {index}",
                                "inputSchema": {"type": "object"}}) for index in range(count)]

    def needs_confirmation(self, method: str) -> bool:
        return False

    def is_dangerous(self, method: str) -> bool:
        return False

    async def has_tool(self, method: str) -> bool:
        return True

    async def tools(self) -> list[ToolDef]:
        return self._tools

    def tools_known(self) -> list[ToolDef] | None:
        return self._tools

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        raise NotImplementedError

    async def call_method(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        raise NotImplementedError

    async def surface(self, kind: str) -> list[dict[str, Any]]:
        return []

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        raise NotImplementedError

    async def notify(self, method: str, params: Any, delivery: Delivery = ANYONE) -> bool:
        return False


async def measure(servers: int, tools: int, rounds: int, repeats: int, cursor_pages: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        audit = AuditLog(Path(tmp) / "audit.jsonl")
        await audit.start()
        records = Records(audit, Metrics())
        gateway = Gateway(Catalog("__"), records, ConfirmationGate(Approvals(), records), Inflight())
        upstreams: dict[str, Any] = {f"s{index:02d}": Listed(f"s{index:02d}", tools) for index in range(servers)}
        principal = Principal("bench", (Grant("bench", "p.toml", allow=("*",)),))
        ctx = CallContext(principal, upstreams)
        request = Request(1, "tools/list", None)
        answer = await gateway.dispatch(ctx, request)
        assert len(answer["result"]["tools"]) == servers * tools or "nextCursor" in answer["result"], answer
        runs = []
        for _ in range(repeats):
            for _ in range(rounds // 10):
                await gateway.dispatch(ctx, request)
            start = time.process_time()
            for _ in range(rounds):
                await gateway.dispatch(ctx, request)
            runs.append((time.process_time() - start) / rounds * 1e6)
        await audit.close()
        return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10)
    parser.add_argument("--tools", type=int, default=50, help="tools per server")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    runs = asyncio.run(measure(args.servers, args.tools, args.rounds, args.repeats, False))
    print(f"tools/list of {args.servers * args.tools} tools: median {statistics.median(runs):.0f} µs "
          f"(runs: {', '.join(f'{run:.0f}' for run in runs)})")


if __name__ == "__main__":
    main()
