"""What the audit log and the metrics are told about each call: its decision, its approval, its outcome, and
the requests its tool server relayed to the caller.

Owns the shape of a call's records and which of them must be on disk before the call may go on
(`decided_durably`, `approval`): the others are queued by plain functions, not coroutines, because
they are on every call's path and nothing waits for the disk. An ordinary call that is allowed gets
one record, not two: its decision (`allowed`) is folded into its outcome record, which halves what
the audit log costs a plain call; the decision is written as its own record after all if anything
else is recorded about the call first, or if the call ends without an outcome (`unfinished`). Does
not own the log's file and writer (audit.py) or the metrics' rendering (metrics.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gatewayd import approvals, audit
from gatewayd.calls import Call
from gatewayd.metrics import Metrics
from gatewayd.sessions import SESSION_ID_SHOWN


class Records:
    """A call's records, to one audit log and one set of metrics."""

    def __init__(self, audit_log: audit.AuditLog, metrics: Metrics) -> None:
        self.audit = audit_log
        self.metrics = metrics
        # Calls of this loop turn that ended, recorded together at the start of the next (`outcome`).
        self._ended: list[tuple[Call, str, float, dict[str, Any]]] = []

    def decided(self, call: Call, decision: str, **fields: Any) -> None:
        """Record a decision; the record is queued, not waited for."""
        if decision == "deny":
            self.metrics.observe_denied()
        if self.audit.enabled:
            self.unfinished(call)
            self.audit.queue(_decision(call, decision, fields))

    def allowed(self, call: Call, rule: str | None) -> None:
        """An ordinary call is allowed: its outcome record will say so (or `unfinished`, if it gets none)."""
        if self.audit.enabled:
            call.allowed = {"decision": "allow", "rule": rule}

    def unfinished(self, call: Call) -> None:
        """Write a call's folded "allow" decision as its own record: something else is recorded about the call
        before its outcome, or it ends without one."""
        if call.allowed is not None:
            fields, call.allowed = call.allowed, None
            self.audit.queue(_decision(call, fields.pop("decision"), fields))

    async def decided_durably(self, call: Call, decision: str, **fields: Any) -> None:
        """Record a decision that must be on disk before the call runs, or raise AuditUnavailable."""
        if self.audit.enabled:
            self.unfinished(call)
            await self.audit.record(_decision(call, decision, fields), durable=True)

    async def approval(self, call: Call, event: str, approval: approvals.Approval) -> None:
        """Record that a call waits for a person, or what they decided; on disk before the call goes on."""
        if not self.audit.enabled:
            return
        self.unfinished(call)
        fields: dict[str, Any] = {"approval_id": approval.id, "state": approval.state.value}
        if approval.state is approvals.State.PENDING:
            fields.update(channels=sorted(approval.channels), timeout_s=approval.timeout,
                          params_sha256=approval.params_sha256)
        else:
            fields.update(decided_by=approval.decided_by, channel=approval.channel, reason=approval.reason)
        await self.audit.record(call.record(event, **fields), durable=True)

    async def approval_carried(self, call: Call, approval_id: str) -> None:
        """Record that a later round of an approved call runs on that approval (confirmation.py `_carry`); on disk
        before it goes on, as a decision is."""
        if self.audit.enabled:
            self.unfinished(call)
            await self.audit.record(call.record("approval_carried", approval_id=approval_id), durable=True)

    def outcome(self, call: Call, status: str, **fields: Any) -> None:
        """Record how a call ended, and count it. Its duration is taken now; the count and the record are made at
        the start of the next loop turn, with those of every call that ended in this one. By then the caller's answer
        has been written, so a lone caller no longer waits for its own record: it is made while the caller reads."""
        seconds = time.monotonic() - call.started
        if not self._ended:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not on a loop (a test, a tool): nothing to overlap with
                self._outcome(call, status, seconds, fields)
                return
            loop.call_soon(self._record_ended)
        self._ended.append((call, status, seconds, fields))

    async def close(self) -> None:
        """Record the outcomes still waiting for their loop turn, then close the audit log (last, at shutdown: a
        call that ended in the same turn would otherwise find the log closed)."""
        self._record_ended()
        await self.audit.close()

    def _record_ended(self) -> None:
        ended, self._ended = self._ended, []
        for call, status, seconds, fields in ended:
            self._outcome(call, status, seconds, fields)

    def _outcome(self, call: Call, status: str, seconds: float, fields: dict[str, Any]) -> None:
        server, _, method = call.method.partition(".")
        self.metrics.observe_call(server, method, status, seconds)
        if self.audit.enabled:
            if call.allowed is not None:
                # The call's decision, folded in: one record for an ordinary call instead of two.
                summary = audit.summarize(call.arguments)
                fields.update(call.allowed, params_sha256=call.params_sha256(summary is call.arguments), params=summary)
                call.allowed = None
            self.audit.queue(call.record("outcome", status=status, duration_ms=round(seconds * 1000, 3), **fields))

    def resumed(self, call: Call, round_: int, outcome: str, answers: int) -> None:
        """Record a modern caller's retry that resumed (or, denied, ended) a call parked for its answers
        (continuations.py): its own record, under the call's trace id, so the rounds of one call read as one."""
        if self.audit.enabled:
            self.unfinished(call)
            self.audit.queue(call.record("resumed", round=round_, outcome=outcome, answers=answers))

    def relayed(self, *, server: str, kind: str, client: str, session: str | None, request_id: str | None,
                outcome: str, params: Any, seconds: float) -> None:
        """Record how a request a tool server sent the client during a call ended (relay.py); queued, not waited
        for. `request_id` is the gateway's own id toward the client (None: refused before it was sent)."""
        if self.audit.enabled:
            self.audit.queue({
                "event": "relayed", "client": client,
                "session": session[:SESSION_ID_SHOWN] if session else None,
                "server": server, "kind": kind, "request_id": request_id, "outcome": outcome,
                "duration_ms": round(seconds * 1000, 3), "params": audit.summarize(params),
            })


def _decision(call: Call, decision: str, fields: dict[str, Any]) -> dict[str, Any]:
    return call.record("decision", decision=decision, params_sha256=call.params_sha256(),
                       params=audit.summarize(call.arguments), **fields)
