"""Confirm: a call that needs a person waits here until one approves it, once, or it is denied.

Owns how the question is put: operators always (gatewayctl, and the web page if the policy says so,
through approvals.py), the caller's own user too when its session can answer an MCP elicitation on
the call's stream; the `approval_pending` notice to an SSE caller; withdrawing the question when the
caller disconnects or its session ends; the client's answers to the elicitations it was sent; an
operator's "allow again" that lets the very same call run without asking; and the error a caller
gets when the answer is no. Also how a caller that cannot hold its request open (a plain JSON
caller behind an HTTP timeout) waits instead: with `_meta["io.gatewayd/approval"] = "retry"` the
call is answered at once with `-32018` and the approval id, the approval stays pending without the
connection (this gate owns the task that waits for its decision and records it), and the very same
call sent again — same client, method and canonical arguments — gets the same `-32018` while it is
pending, runs once it is approved (exactly once: the first such call takes it), and gets the denial or
expiry once that is the answer. Does not own the registry of approvals (approvals.py) or their
audit records' shape (records.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from gatewayd import approvals, display, modern, request_state
from gatewayd.calls import Call, CallContext, request_key
from gatewayd.config.models import ConfirmOptions
from gatewayd.errors import (
    AuditUnavailable,
    ConfirmationDenied,
    ConfirmationExpired,
    ConfirmationPending,
    InvalidParams,
    RequestCancelled,
)
from gatewayd.jsonrpc import Response
from gatewayd.records import Records

logger = logging.getLogger(__name__)

# Arguments shown in an elicitation message are cut here; the full arguments are on the operators' channels.
ELICIT_ARGUMENTS_CHARS = 2000
# The one field of the form a client's user answers.
ELICIT_FIELD = "approve"
ELICIT_SCHEMA = {
    "type": "object",
    "properties": {ELICIT_FIELD: {
        "type": "boolean", "title": "Run this call once",
        "description": "Let this call run once, with exactly these arguments.", "default": False,
    }},
    "required": [ELICIT_FIELD],
}
# The key of the approval question among an input-required result's requests (MCP 2026-07-28).
INPUT_KEY = "io.gatewayd/approval"
# The `_meta` key and value by which a caller asks to be answered at once and to send the call again (above).
RETRY_KEY = "io.gatewayd/approval"
RETRY = "retry"
# A decided approval waits this long for the call to be sent again; then it is forgotten (an approved call would need
# a new approval): a person approved running it soon, not whenever the caller comes back.
RETRY_WITHIN = 600.0
# Decided approvals waiting for their call to come back; past this the oldest is forgotten (memory stays bounded
# however many callers never come back).
MAX_DECIDED_WAITING = 1000

# Recording those approvals' withdrawal when the daemon stops is a few fsyncs; a stuck disk must not hold the stop.
CLOSE_WAIT = 5.0
# (client, canonical method, params hash): the call an approval a caller will send again belongs to.
RetryKey = tuple[str, str, str]


class ConfirmationGate:
    """Holds calls until a person answers; `answer` takes a client's reply to an elicitation it was sent."""

    def __init__(self, registry: approvals.Approvals, records: Records,
                 max_decided: int = MAX_DECIDED_WAITING) -> None:
        self.approvals = registry
        self.records = records
        # Where a person can approve on the web, told to waiting callers (None: no page).
        self.approval_url: str | None = None
        # Elicitations sent to callers, by (client, session id, request id): who gets the client's answer.
        self._elicitations: dict[tuple[str, str, str], Callable[[Response], None]] = {}
        # Approvals of calls that will be sent again, pending or decided, by the call they belong to…
        self._parked: dict[RetryKey, approvals.Approval] = {}
        # …those decided, with when (monotonic), oldest first…
        self._decided: collections.OrderedDict[RetryKey, float] = collections.OrderedDict()
        self.max_decided = max_decided
        # …and the tasks that wait for the pending ones' decisions (this gate owns them: `close` ends them).
        self._settling: set[asyncio.Task[None]] = set()
        # The one-use nonces of approvals carried to a call's later rounds (`_carry`), with when, oldest first; kept
        # as long as a state is good (request_state.MAX_AGE), at most `max_decided`.
        self._carried: collections.OrderedDict[str, float] = collections.OrderedDict()

    async def confirm(self, call: Call, options: ConfirmOptions) -> None:
        """Return once a person approved the call; raise if they deny it, nobody answers, or the caller goes.

        A call an operator allowed again (same client, method and arguments, within the time they gave) is
        approved without asking.
        """
        asker = call.ctx.asker
        if isinstance(asker, modern.Asker) and (carried := asker.carried()) is not None:
            await self._carry(call, asker, *carried)
            return
        if _sends_again(call.meta):
            await self._confirm_by_retry(call, options)
            return
        if isinstance(asker, modern.Asker) and approvals.CLIENT in options.channels \
                and (asker.envelope.declares("elicitation") or asker.approval() is not None):
            await self._confirm_by_input(call, options, asker)
            return
        ctx = call.ctx
        channels = frozenset(options.channels)
        ask_client = approvals.CLIENT in channels and ctx.emit is not None and ctx.session is not None \
            and ctx.session.supports_form_elicitation()
        approval = self.approvals.open(
            client=ctx.principal.name, method=call.method, arguments=call.arguments,
            params_sha256=call.params_sha256(), session_id=ctx.session.id if ctx.session else None,
            channels=channels if ask_client else channels - {approvals.CLIENT}, timeout=options.timeout,
        )
        undo: list[Callable[[], None]] = []
        try:
            await self.records.approval(call, "approval_requested", approval)
            standing = self.approvals.standing_for(approval)
            if standing is not None:
                # An operator said this very call may run again for a while: nobody is asked this time.
                self.approvals.approve_standing(approval, standing)
            else:
                undo.extend(self._withdraw_when_gone(ctx, approval))
                self._announce(ctx, approval)
                if ask_client:
                    undo.append(self._elicit(ctx, approval))
                await self.approvals.wait(approval)
        finally:
            for step in undo:
                step()
            if approval.state is approvals.State.PENDING:
                # Failed before anyone could answer (the audit record could not be written, say): nobody may
                # approve a call that is no longer waiting.
                self.approvals.withdraw(approval, "the call ended before an answer")
        await self.records.approval(call, "approval_decided", approval)
        _raise_unless_approved(approval)
        _approved(call, approval)

    async def _carry(self, call: Call, asker: modern.Asker, approval_id: str, nonce: str) -> None:
        """The next round of a call a person approved, whose modern tool server asked its caller for input: the
        retry's sealed state (bound to this client, method and exact arguments) carries the approval, so it runs
        without asking again — once per state (a replayed one is refused)."""
        now = time.monotonic()
        while self._carried and next(iter(self._carried.values())) < now - request_state.MAX_AGE:
            self._carried.popitem(last=False)
        if nonce in self._carried:
            raise InvalidParams(f"requestState carries approval {approval_id} for a round that was sent already: "
                                "send the call without it to be asked again", {"approval_id": approval_id,
                                                                               "reason": "used"})
        self._carried[nonce] = now
        while len(self._carried) > self.max_decided:
            self._carried.popitem(last=False)
        await self.records.approval_carried(call, approval_id)
        asker.approved = approval_id

    async def _confirm_by_retry(self, call: Call, options: ConfirmOptions) -> None:
        """Return if this call's approval was given (using it up), or an operator allowed it again; else raise: the
        pending error (opening the approval if there is none), or the denial or expiry."""
        key = (call.ctx.principal.name, call.method, call.params_sha256())
        approval = self._parked_for(key)
        if approval is not None:
            if approval.state is approvals.State.PENDING:
                raise self._pending(approval)
            await self._use(call, key, approval)
            return
        approval = await self._park(call, options, key, frozenset(options.channels) - {approvals.CLIENT})
        if approval is None:
            return
        raise self._pending(approval)

    async def _confirm_by_input(self, call: Call, options: ConfirmOptions, asker: modern.Asker) -> None:
        """A modern caller that can be asked (MCP 2026-07-28): the question goes back as an input-required result
        whose state names the approval (opened and parked as for a call sent again, `_confirm_by_retry`, so an
        operator can decide it meanwhile); the retry carrying that state decides it with the caller's answer, and
        runs the call once it is approved, or raises the denial or expiry. A state whose approval was used already
        is refused."""
        key = (call.ctx.principal.name, call.method, call.params_sha256())
        named = asker.approval()
        if named is None:
            approval = await self._park(call, options, key, frozenset(options.channels))
            if approval is None:
                return
            raise self._question(approval)
        approval = self._parked_for(key)
        if approval is None or approval.id != named:
            raise InvalidParams(f"requestState names approval {named}, which was used already or is no longer "
                                "waiting: send the call without it to be asked again",
                                {"approval_id": named, "reason": "used"})
        answer = asker.answer(INPUT_KEY)
        if approval.state is approvals.State.PENDING and answer is not None:
            approve, reason = _verdict(answer)
            self.approvals.decide(approval.id, approve=approve, by=f"the user of client {approval.client} "
                                  "(input-required result)", channel=approvals.CLIENT, reason=reason)
        if approval.state is approvals.State.PENDING:
            # Not answered yet (nor by an operator): the same question again, the same approval.
            raise self._question(approval)
        await self._use(call, key, approval)

    async def _use(self, call: Call, key: RetryKey, approval: approvals.Approval) -> None:
        """A decided approval a call came back for: used up before anything awaits (of two calls sent again at once,
        only one may run); return to run the call once if it was approved, else raise the denial or expiry."""
        self._forget(key)
        if approval.state is approvals.State.APPROVED:
            await self.records.approval(call, "approval_used", approval)
            _approved(call, approval)
            return
        _raise_unless_approved(approval)

    async def _park(self, call: Call, options: ConfirmOptions, key: RetryKey,
                    channels: frozenset[str]) -> approvals.Approval | None:
        """Open the approval of a call that will come back, parked by the call it belongs to, its decision awaited by
        a task this gate owns; None when an operator's "allow again" approved it at once."""
        approval = self.approvals.open(
            client=call.ctx.principal.name, method=call.method, arguments=call.arguments,
            params_sha256=key[2], session_id=call.ctx.session.id if call.ctx.session else None,
            channels=channels, timeout=options.timeout,
        )
        # Parked before anything awaits: the same call sent again meanwhile finds this approval, not a new one.
        self._parked[key] = approval
        try:
            await self.records.approval(call, "approval_requested", approval)
        except BaseException:
            self._forget(key)
            self.approvals.withdraw(approval, "the call ended before an answer")
            raise
        standing = self.approvals.standing_for(approval)
        if standing is not None:
            self._forget(key)
            self.approvals.approve_standing(approval, standing)
            await self.records.approval(call, "approval_decided", approval)
            _approved(call, approval)
            return None
        settle = asyncio.create_task(self._settle(call, key, approval), name=f"approval {approval.id}")
        self._settling.add(settle)
        settle.add_done_callback(self._settling.discard)
        return approval

    def _question(self, approval: approvals.Approval) -> modern.InputRequired:
        """The approval's question as an input-required result: the elicitation the legacy era sends, its state
        naming the approval."""
        request = {"method": "elicitation/create",
                   "params": {"mode": "form", "message": question(approval), "requestedSchema": ELICIT_SCHEMA}}
        return modern.InputRequired({INPUT_KEY: request},
                                    modern.GatewayState(request_state.APPROVAL, {"a": approval.id}))

    def _parked_for(self, key: RetryKey) -> approvals.Approval | None:
        """The approval of this call, unless it was decided longer than RETRY_WITHIN ago (then it is forgotten)."""
        decided = self._decided.get(key)
        if decided is not None and time.monotonic() - decided > RETRY_WITHIN:
            self._forget(key)
            return None
        return self._parked.get(key)

    def _forget(self, key: RetryKey) -> None:
        self._parked.pop(key, None)
        self._decided.pop(key, None)

    async def _settle(self, call: Call, key: RetryKey, approval: approvals.Approval) -> None:
        """Wait for the decision of an approval whose call will come back (expiring it at its deadline), record it,
        and keep it for the call's return."""
        await self.approvals.wait(approval)
        if self._parked.get(key) is approval:
            self._decided[key] = time.monotonic()
            while len(self._decided) > self.max_decided:
                oldest, _ = self._decided.popitem(last=False)
                self._parked.pop(oldest, None)
        try:
            await self.records.approval(call, "approval_decided", approval)
        except AuditUnavailable as exc:
            logger.error("approval %s %s, not recorded: %s", approval.id, approval.state.value, exc.message)

    def _pending(self, approval: approvals.Approval) -> ConfirmationPending:
        """The answer to a call whose approval is pending: which approval, until when, and where to approve it."""
        data: dict[str, object] = {"approval_id": approval.id, "deadline": approval.deadline,
                                   "approve_with": f"gatewayctl approve {approval.id}"}
        if self.approval_url and approvals.WEB in approval.channels:
            data["approval_page"] = self.approval_url
        return ConfirmationPending(f"{approval.method} waits for a person's confirmation (approval {approval.id}): "
                                   "send the same call again once it is approved", data)

    async def close(self) -> None:
        """The daemon stops: the approvals of calls that would have come back are withdrawn, and recorded so."""
        for approval in list(self._parked.values()):
            self.approvals.withdraw(approval, "the daemon stopped")
        settling = list(self._settling)
        try:
            async with asyncio.timeout(CLOSE_WAIT):
                await asyncio.gather(*settling, return_exceptions=True)
        except TimeoutError:
            for task in settling:
                task.cancel()
            await asyncio.gather(*settling, return_exceptions=True)

    def answer(self, ctx: CallContext, message: Response) -> None:
        """A client's response to a request the gateway sent it (an elicitation); anything else is dropped."""
        deliver = self._elicitations.pop(request_key(ctx, message.id), None)
        if deliver is None:
            logger.debug("client=%s response to unknown id %.64r dropped", ctx.principal.name, message.id)
            return
        deliver(message)

    def _withdraw_when_gone(self, ctx: CallContext, approval: approvals.Approval) -> list[Callable[[], None]]:
        """Withdraw the approval if the caller disconnects or its session ends; returns how to stop watching."""
        undo = []
        if ctx.on_disconnect is not None:
            undo.append(ctx.on_disconnect(lambda: self.approvals.withdraw(approval, "the caller disconnected")))
        if ctx.session is not None:
            undo.append(ctx.session.on_end(lambda: self.approvals.withdraw(approval, "the caller's session ended")))
        return undo

    def _announce(self, ctx: CallContext, approval: approvals.Approval) -> None:
        """Tell an SSE caller its call waits for approval: which id, until when, and where to approve it."""
        if ctx.emit is None or (ctx.session is not None and not ctx.session.wants_log("notice")):
            return
        data = {"event": "approval_pending", "approval_id": approval.id, "method": approval.method,
                "deadline": approval.deadline, "approve_with": f"gatewayctl approve {approval.id}"}
        if self.approval_url and approvals.WEB in approval.channels:
            data["approval_page"] = self.approval_url
        ctx.emit({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "notice", "logger": "gatewayd.approvals", "data": data}})

    def _elicit(self, ctx: CallContext, approval: approvals.Approval) -> Callable[[], None]:
        """Ask the caller's user on the call's stream; their answer decides like an operator's would."""
        assert ctx.emit is not None and ctx.session is not None
        request_id = f"gatewayd-approval-{approval.id}"
        key = request_key(ctx, request_id)
        message = question(approval)
        who = f"the user of client {approval.client} (elicitation)"

        def deliver(response: Response) -> None:
            approve, reason = _elicitation_verdict(response)
            self.approvals.decide(approval.id, approve=approve, by=who, channel=approvals.CLIENT, reason=reason)

        self._elicitations[key] = deliver
        emit = ctx.emit
        emit({"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create",
              "params": {"mode": "form", "message": message, "requestedSchema": ELICIT_SCHEMA}})

        def withdraw_question() -> None:
            # Settled some other way (an operator, expiry, withdrawal): let the client close its question.
            if self._elicitations.pop(key, None) is not None:
                emit({"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": request_id, "reason": f"approval {approval.state.value}"}})

        return withdraw_question


def question(approval: approvals.Approval) -> str:
    """What the caller's user is asked, in either era."""
    # The caller wrote these arguments, and its user is asked to trust them: nothing in them may reorder, hide
    # or restyle the question (display.py). The call still runs with exactly the arguments it sent.
    shown = display.shown_json(approval.arguments)
    if len(shown) > ELICIT_ARGUMENTS_CHARS:
        shown = shown[:ELICIT_ARGUMENTS_CHARS] + f"… ({len(shown) - ELICIT_ARGUMENTS_CHARS} more characters)"
    return (f"{display.shown(approval.client)} wants to run {display.shown(approval.method)} with arguments "
            f"{shown}. Allow it to run once? (approval {approval.id})")


def _sends_again(meta: object) -> bool:
    """Whether the caller asked to be answered at once and to send the call again (RETRY_KEY)."""
    return isinstance(meta, dict) and meta.get(RETRY_KEY) == RETRY


def _elicitation_verdict(response: Response) -> tuple[bool, str | None]:
    """(approve?, reason) from a client's answer to the approval elicitation: only accept + yes approves."""
    if response.error is not None:
        return False, "the client answered the question with an error"
    return _verdict(response.result)


def _verdict(answer: Any) -> tuple[bool, str | None]:
    """(approve?, reason) from an ElicitResult answering the approval question: only accept + yes approves."""
    result = answer if isinstance(answer, dict) else {}
    action = result.get("action")
    content = result.get("content")
    if action == "accept" and isinstance(content, dict) and content.get(ELICIT_FIELD) is True:
        return True, None
    if action in ("decline", "cancel"):
        return False, f"the client's user chose {action}"
    return False, "the client's user did not say yes"


def _approved(call: Call, approval: approvals.Approval) -> None:
    """Note on a modern caller's call which approval lets it run: a later round of it carries that (`_carry`)."""
    if isinstance(call.ctx.asker, modern.Asker):
        call.ctx.asker.approved = approval.id


def _raise_unless_approved(approval: approvals.Approval) -> None:
    data = {"approval_id": approval.id, "reason": approval.reason, "decided_by": approval.decided_by}
    if approval.state is approvals.State.APPROVED:
        return
    if approval.state is approvals.State.DENIED:
        raise ConfirmationDenied(f"{approval.method}: the confirmation was denied", data)
    if approval.state is approvals.State.EXPIRED:
        raise ConfirmationExpired(f"{approval.method}: nobody confirmed the call in time", data)
    raise RequestCancelled(f"{approval.method}: the approval was withdrawn ({approval.reason})", data)
