"""A caller that cannot wait for a person sends the call again (confirmation.py, `_meta["io.gatewayd/approval"] =
"retry"`): answered at once with -32018, the approval stays pending without it, and the very same call sent again
runs once approved, exactly once; denied, expired, other arguments and the limits on what is kept.

The gateway is the real one, wired as the daemon wires it; only its upstream is a script (tests/test_gateway.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gatewayd import approvals, confirmation
from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.config.models import ConfirmOptions
from gatewayd.confirmation import ConfirmationGate
from gatewayd.errors import CONFIRMATION_DENIED, CONFIRMATION_EXPIRED, CONFIRMATION_PENDING
from gatewayd.gateway import Gateway
from gatewayd.inflight import Inflight
from gatewayd.jsonrpc import Request
from gatewayd.metrics import Metrics
from gatewayd.policy import Grant, Principal
from gatewayd.records import Records
from tests.test_gateway import Scripted
from tests.waiting import eventually

RETRY = {"io.gatewayd/approval": "retry"}
# Long enough that nothing expires unless a test means it to.
TIMEOUT = 60.0


@dataclass
class Retrier:
    gateway: Gateway
    gate: ConfirmationGate
    upstream: Scripted
    approvals: Approvals
    audit: AuditLog
    trail: Path
    principal: Principal

    async def send(self, params: dict[str, Any], request_id: Any = 1, meta: dict[str, Any] | None = None) -> Any:
        """`s.run` with these arguments, asking to be answered at once (or with `meta`)."""
        ctx = CallContext(self.principal, {"s": self.upstream})
        message = Request(request_id, "s.run", {**params, "_meta": RETRY if meta is None else meta})
        return await self.gateway.dispatch(ctx, message)

    def decide(self, approval_id: str, approve: bool) -> None:
        assert self.approvals.decide(approval_id, approve=approve, by="test", channel=approvals.CLI, reason="r").ok

    async def records(self) -> list[dict[str, Any]]:
        await self.audit.flush()
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


def principal(timeout: float) -> Principal:
    grant = Grant("dev", "policies/test.toml", confirm=("s.run",),
                  confirmation=(("s.run", ConfirmOptions(timeout=timeout, channels=["client", "web"])),))
    return Principal("dev", (grant,))


@asynccontextmanager
async def make(tmp_path: Path, timeout: float = TIMEOUT, max_decided: int = 1000) -> AsyncIterator[Retrier]:
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    registry = Approvals()
    records = Records(audit_log, Metrics())
    gate = ConfirmationGate(registry, records, max_decided=max_decided)
    gate.approval_url = "http://127.0.0.1:1/approvals"
    gateway = Gateway(Catalog("__"), records, gate, Inflight())
    try:
        yield Retrier(gateway, gate, Scripted("s", ["run"]), registry, audit_log, trail, principal(timeout))
    finally:
        await gate.close()
        await audit_log.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Retrier]:
    async with make(tmp_path) as made:
        yield made


def pending_id(answer: dict[str, Any]) -> str:
    error = answer["error"]
    assert error["code"] == CONFIRMATION_PENDING, answer
    approval_id: str = error["data"]["approval_id"]
    return approval_id


async def test_answered_at_once_then_the_same_call_runs_once_approved_exactly_once(rig: Retrier) -> None:
    first = await rig.send({"cmd": "ls"}, request_id="a")
    approval_id = pending_id(first)
    data = first["error"]["data"]
    assert data["approve_with"] == f"gatewayctl approve {approval_id}" and data["retryable"] is True
    assert data["approval_page"] == "http://127.0.0.1:1/approvals" and data["deadline"] > 0
    assert [a.id for a in rig.approvals.pending()] == [approval_id] and rig.upstream.received == []
    # Sent again before anyone answers: the same approval, still pending, nothing runs.
    assert pending_id(await rig.send({"cmd": "ls"}, request_id="b")) == approval_id
    assert len(rig.approvals) == 1 and rig.upstream.received == []
    rig.decide(approval_id, approve=True)
    assert (await rig.send({"cmd": "ls"}, request_id="c"))["result"] == {"ok": "run"}
    assert rig.upstream.received == [("method", "run", {"cmd": "ls"})]
    # Single use: the next identical call needs a new approval.
    again = pending_id(await rig.send({"cmd": "ls"}, request_id="d"))
    assert again != approval_id and len(rig.upstream.received) == 1
    await eventually(lambda: approval_id in {r.get("approval_id") for r in _read(rig.trail)
                                              if r["event"] == "approval_decided"}, what="the decision recorded")
    events = [(r["event"], r["request_id"]) for r in await rig.records() if r.get("approval_id") == approval_id
              or r["event"] == "outcome"]
    assert ("approval_requested", "a") in events and ("approval_decided", "a") in events
    assert ("approval_used", "c") in events and ("outcome", "c") in events
    outcomes = {r["request_id"]: r["status"] for r in await rig.records() if r["event"] == "outcome"}
    assert outcomes == {"a": "confirmation_pending", "b": "confirmation_pending", "c": "ok",
                        "d": "confirmation_pending"}


async def test_other_arguments_are_another_approval(rig: Retrier) -> None:
    first = pending_id(await rig.send({"cmd": "ls"}))
    other = pending_id(await rig.send({"cmd": "ls -la"}))
    assert first != other and len(rig.approvals) == 2
    rig.decide(first, approve=True)
    assert pending_id(await rig.send({"cmd": "ls -la"})) == other
    assert rig.upstream.received == []


async def test_a_denial_is_told_to_the_call_sent_again_then_it_may_ask_anew(rig: Retrier) -> None:
    approval_id = pending_id(await rig.send({"cmd": "rm"}))
    rig.decide(approval_id, approve=False)
    error = (await rig.send({"cmd": "rm"}))["error"]
    assert error["code"] == CONFIRMATION_DENIED and error["data"]["approval_id"] == approval_id
    assert error["data"]["reason"] == "r"
    assert pending_id(await rig.send({"cmd": "rm"})) != approval_id
    assert rig.upstream.received == []


async def test_nobody_answering_expires_it_without_the_caller(tmp_path: Path) -> None:
    async with make(tmp_path, timeout=0.2) as rig:
        approval_id = pending_id(await rig.send({"cmd": "ls"}))
        approval = rig.approvals.get(approval_id)
        assert approval is not None
        await eventually(lambda: approval.state is approvals.State.EXPIRED, what="the approval expired")
        error = (await rig.send({"cmd": "ls"}))["error"]
        assert error["code"] == CONFIRMATION_EXPIRED and error["data"]["approval_id"] == approval_id
        assert rig.upstream.received == []


async def test_two_calls_sent_again_at_once_run_only_once(rig: Retrier) -> None:
    approval_id = pending_id(await rig.send({"cmd": "ls"}))
    rig.decide(approval_id, approve=True)
    answers = await asyncio.gather(rig.send({"cmd": "ls"}, request_id=1), rig.send({"cmd": "ls"}, request_id=2))
    assert sorted("result" in answer for answer in answers) == [False, True]
    assert len(rig.upstream.received) == 1


async def test_an_approval_not_used_in_time_lapses(rig: Retrier, monkeypatch: pytest.MonkeyPatch) -> None:
    approval_id = pending_id(await rig.send({"cmd": "ls"}))
    rig.decide(approval_id, approve=True)
    await eventually(lambda: approval_id in {r.get("approval_id") for r in _read(rig.trail)
                                              if r["event"] == "approval_decided"}, what="the decision recorded")
    # Past RETRY_WITHIN since the decision: what was approved is forgotten, and asked again.
    monkeypatch.setattr(confirmation, "RETRY_WITHIN", -1.0)
    assert pending_id(await rig.send({"cmd": "ls"})) != approval_id
    assert rig.upstream.received == []


async def test_decided_approvals_kept_for_their_calls_are_bounded(tmp_path: Path) -> None:
    async with make(tmp_path, max_decided=2) as rig:
        ids = [pending_id(await rig.send({"cmd": str(n)})) for n in range(3)]
        for n, approval_id in enumerate(ids, 1):
            rig.decide(approval_id, approve=False)
            await eventually(lambda: decisions(rig.trail) == n, what="the decision recorded")  # noqa: B023
        # The two most recent denials are still told; the oldest was forgotten, so that call asks anew.
        assert (await rig.send({"cmd": "1"}))["error"]["code"] == CONFIRMATION_DENIED
        assert (await rig.send({"cmd": "2"}))["error"]["code"] == CONFIRMATION_DENIED
        assert pending_id(await rig.send({"cmd": "0"})) not in ids


async def test_without_the_key_a_call_still_waits_for_the_person(rig: Retrier) -> None:
    call = asyncio.create_task(rig.send({"cmd": "ls"}, meta={}))
    await eventually(lambda: len(rig.approvals) == 1, what="the call waits")
    [approval] = rig.approvals.pending()
    rig.decide(approval.id, approve=True)
    assert (await call)["result"] == {"ok": "run"}


async def test_stopping_withdraws_and_records_what_waits_for_a_call_to_come_back(rig: Retrier) -> None:
    approval_id = pending_id(await rig.send({"cmd": "ls"}))
    await rig.gate.close()
    approval = rig.approvals.get(approval_id)
    assert approval is not None and approval.state is approvals.State.WITHDRAWN
    [decided] = [r for r in await rig.records() if r["event"] == "approval_decided"]
    assert decided["state"] == "withdrawn" and decided["reason"] == "the daemon stopped"


def decisions(trail: Path) -> int:
    return sum(record["event"] == "approval_decided" for record in _read(trail))


def _read(trail: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trail.read_text().splitlines()] if trail.exists() else []
