"""Records: a call's outcome is counted and written once its caller's answer has gone out, in the order the calls
ended, with the duration it had when it ended; nothing is lost on the way."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gatewayd import calls
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.metrics import Metrics
from gatewayd.policy import Principal
from gatewayd.records import Records

# How long the loop turn that ended the calls goes on before it yields: far above what the calls themselves took.
TURN_GOES_ON = 0.05


def _call(request_id: int) -> calls.Call:
    return calls.direct(CallContext(Principal("dev"), {}), calls.DIRECT, request_id, "s.add", {"a": request_id})


async def test_outcomes_are_recorded_at_the_next_loop_turn_in_the_order_the_calls_ended(tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    metrics = Metrics()
    records = Records(audit_log, metrics)
    try:
        ended = [_call(request_id) for request_id in (3, 1, 2)]
        for call in ended:
            records.allowed(call, "role 'dev'")
            records.outcome(call, "ok")
        # Not yet: the caller's answer is written in this turn, before anything is counted or recorded.
        assert metrics.calls[("s", "add", "ok")] == 0
        goes_on_until = time.monotonic() + TURN_GOES_ON
        while time.monotonic() < goes_on_until:  # the turn keeps the loop: the durations were taken at the end
            pass
        await asyncio.sleep(0)
        assert metrics.calls[("s", "add", "ok")] == 3
        await audit_log.flush()
        written = [json.loads(line) for line in trail.read_text().splitlines()]
        assert [(r["event"], r["request_id"], r["decision"], r["status"]) for r in written] == \
            [("outcome", 3, "allow", "ok"), ("outcome", 1, "allow", "ok"), ("outcome", 2, "allow", "ok")]
        assert all(r["duration_ms"] < TURN_GOES_ON * 1000 for r in written)
    finally:
        await audit_log.close()


def test_off_a_loop_an_outcome_is_recorded_at_once() -> None:
    metrics = Metrics()
    records = Records(AuditLog(None), metrics)
    records.outcome(_call(1), "timeout", error_code=-32001)
    assert metrics.calls[("s", "add", "timeout")] == 1


async def test_outcomes_of_the_last_loop_turn_are_written_before_the_log_closes(tmp_path: Path) -> None:
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    records = Records(audit_log, Metrics())
    call = _call(7)
    records.allowed(call, "role 'dev'")
    records.outcome(call, "cancelled")  # in the same turn as the shutdown's close: its turn never comes
    await records.close()
    written = [json.loads(line) for line in trail.read_text().splitlines()]
    assert [(r["event"], r["request_id"], r["status"]) for r in written] == [("outcome", 7, "cancelled")]
