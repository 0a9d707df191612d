"""Calls waiting for a person: open, wait, decide, expire, withdraw.

Owns the registry of pending confirmations, their ids and deadlines, the exactly-once decision
(the first of approve, deny, expiry and withdrawal wins; the others are told what happened),
which channels may answer an approval, and telling watchers (the web page's live list) about
every change. An approval belongs to one call: its client, method and the hash of its canonical
arguments. It is used once, by that call (or, when its caller asked to send the call again, by the
first identical call sent again: confirmation.py); another call, even with the same arguments, needs
its own. Does not own how the question reaches a person (gateway.py: elicitation; admin.py:
gatewayctl; web/console.py: the page) nor the audit records (gateway.py).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import secrets
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from gatewayd import display, jsonrpc
from gatewayd.errors import InvalidParams, Overloaded

logger = logging.getLogger(__name__)

# Channels: `gatewayctl approve` on the admin socket always works; the others are per policy. It is named
# "gatewayctl", as `gatewayctl explain` names it (until 0.x it was "cli" in the approvals JSON and the audit log).
CLI = "gatewayctl"
CLIENT = "client"
WEB = "web"
# How a call approved by an operator's "allow again" was decided (no person was asked this time).
STANDING = "standing"
# An operator may let the same client make the very same call again without asking, for at most this long:
# enough for a work session, short enough that a forgotten permission lapses by itself.
STANDING_MAX = 3600.0
# Ids are typed after `gatewayctl approve`: short, random, never reused while remembered.
ID_BYTES = 5
# A flood of confirm-gated calls must not grow memory without bound: past this, new ones are refused…
MAX_PENDING = 1000
# …and one client may hold only this share of them, so the others' calls can still wait for a person.
MAX_PENDING_PER_CLIENT = 100
# Arguments a person is asked to review are kept whole until the call ends; more than this nobody can review.
MAX_ARGUMENT_BYTES = 64 * 1024
# Finished approvals kept so a late answer is told what happened instead of "no such approval"; arguments larger
# than FINISHED_ARGUMENT_BYTES are not kept with them (the audit log has their hash and summary).
FINISHED_KEPT = 1000
FINISHED_ARGUMENT_BYTES = 4096
# A watcher (the web page's stream) this far behind is dropped; it reconnects and reads the list again.
WATCHER_BACKLOG = 1000
# A reason is a short note for the caller and the audit log, not a document.
MAX_REASON_CHARS = 500
# The keys an operator's answer may carry (gatewayctl and the web page send the same body).
ANSWER_KEYS = frozenset({"reason", "allow_again_for"})


class State(enum.Enum):
    """Where an approval stands; every state but PENDING is final."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


@dataclass(eq=False)
class Approval:
    """One call waiting for a person."""

    id: str
    client: str
    method: str
    arguments: Any
    params_sha256: str
    session_id: str | None
    channels: frozenset[str]
    timeout: float
    created: float = field(default_factory=time.time)
    state: State = State.PENDING
    decided_by: str | None = None
    channel: str | None = None
    reason: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def deadline(self) -> float:
        """Wall-clock time (epoch seconds) after which it expires."""
        return self.created + self.timeout

    def view(self) -> dict[str, Any]:
        """What operators are shown (gatewayctl, the web page): everything but the session id. The fields are the
        exact values (what the hash covers and the call is sent with); `shown` has the text a person reads of
        them, escaped by display.py (the web page renders only that)."""
        now = time.time()
        return {
            "id": self.id, "client": self.client, "method": self.method, "arguments": self.arguments,
            "params_sha256": self.params_sha256, "state": self.state.value, "channels": sorted(self.channels),
            "created": self.created, "deadline": self.deadline, "age_s": round(now - self.created, 3),
            "expires_in_s": round(max(0.0, self.deadline - now), 3),
            "decided_by": self.decided_by, "channel": self.channel, "reason": self.reason,
            "shown": {
                "client": display.shown(self.client), "method": display.shown(self.method),
                "arguments": display.shown_json(self.arguments, indent=2),
                "decided_by": _shown(self.decided_by), "reason": _shown(self.reason),
            },
        }


def _shown(text: str | None) -> str | None:
    return display.shown(text) if text is not None else None


def parse_answer(body: Any, *, approve: bool) -> tuple[str | None, float | None]:
    """The reason and "allow again" seconds of an operator's answer `{"reason": …, "allow_again_for": …}` (both
    optional; None for no body). Raises ValueError, with a message for the operator, for anything else."""
    if body is None:
        return None, None
    if not isinstance(body, dict) or set(body) - ANSWER_KEYS:
        raise ValueError('the body must be a JSON object with only "reason" and "allow_again_for"')
    return _reason(body.get("reason")), _allow_again(body.get("allow_again_for"), approve)


def _reason(reason: Any) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise ValueError("reason must be a string")
    # One line, no control characters: it reaches logs, the audit trail and the agent.
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON_CHARS:
        raise ValueError(f"reason is longer than {MAX_REASON_CHARS} characters")
    if any(unicodedata.category(char) == "Cc" for char in reason):
        raise ValueError("reason must not contain control characters")
    return reason or None


def _allow_again(value: Any, approve: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not approve \
            or not 0 < value <= STANDING_MAX:
        raise ValueError(f"allow_again_for: seconds, more than 0 and at most {STANDING_MAX:g}, and only when "
                         "approving")
    return float(value)


@dataclass(frozen=True)
class Standing:
    """An operator's "allow again": this client may make this exact call (method and arguments) until `until`."""

    client: str
    method: str
    params_sha256: str
    until: float
    by: str
    approval_id: str

    def view(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "client": self.client, "method": self.method,
                "params_sha256": self.params_sha256, "until": self.until, "by": self.by,
                "expires_in_s": round(max(0.0, self.until - time.time()), 3)}


@dataclass(frozen=True)
class Answer:
    """What a person who answered is told."""

    ok: bool
    message: str
    approval: Approval | None = None


class Approvals:
    """Every pending approval, and those recently finished."""

    def __init__(self, max_pending: int = MAX_PENDING, per_client: int = MAX_PENDING_PER_CLIENT) -> None:
        self.max_pending = max_pending
        self.max_per_client = per_client
        self._pending: dict[str, Approval] = {}
        self._by_client: dict[str, int] = {}
        self._finished: collections.OrderedDict[str, Approval] = collections.OrderedDict()
        self._watchers: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._standing: dict[tuple[str, str, str], Standing] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self) -> list[Approval]:
        """Pending approvals, oldest first."""
        return sorted(self._pending.values(), key=lambda a: a.created)

    def get(self, approval_id: str) -> Approval | None:
        """A pending or remembered approval."""
        return self._pending.get(approval_id) or self._finished.get(approval_id)

    def open(
        self, *, client: str, method: str, arguments: Any, params_sha256: str, session_id: str | None,
        channels: frozenset[str], timeout: float,
    ) -> Approval:
        """A new pending approval for one call. Raises Overloaded when too many are pending (or this client's share
        of them is), InvalidParams when its arguments are too large for a person to review."""
        size = len(jsonrpc.dumps(arguments))
        if size > MAX_ARGUMENT_BYTES:
            raise InvalidParams(f"{method} needs a person's confirmation, and its arguments ({size} bytes) are more "
                                f"than the {MAX_ARGUMENT_BYTES} a person is shown", {"limit": MAX_ARGUMENT_BYTES})
        if len(self._pending) >= self.max_pending:
            raise Overloaded(f"more than {self.max_pending} calls are waiting for confirmation; retry later",
                             {"pending_approvals": len(self._pending)})
        if self._by_client.get(client, 0) >= self.max_per_client:
            raise Overloaded(f"{self.max_per_client} calls of this client are waiting for confirmation already; "
                             "retry once some are answered", {"pending_approvals": self.max_per_client})
        approval_id = secrets.token_hex(ID_BYTES)
        while approval_id in self._pending or approval_id in self._finished:
            approval_id = secrets.token_hex(ID_BYTES)
        approval = Approval(approval_id, client, method, arguments, params_sha256, session_id,
                            channels | {CLI}, timeout)
        self._pending[approval_id] = approval
        self._by_client[client] = self._by_client.get(client, 0) + 1
        logger.info("approval %s opened: client=%s method=%s (expires in %gs)", approval_id, client, method, timeout)
        self._tell("pending", approval)
        return approval

    async def wait(self, approval: Approval) -> Approval:
        """Wait for the decision; at the deadline it expires. If the waiter is cancelled, it is withdrawn."""
        remaining = max(0.0, approval.deadline - time.time())
        try:
            # The deadline operators are shown, whatever happened between opening and waiting.
            async with asyncio.timeout(remaining):
                await approval.done.wait()
        except TimeoutError:
            self._finish(approval, State.EXPIRED, None, None, f"no answer within {approval.timeout:g}s")
        except asyncio.CancelledError:
            self._finish(approval, State.WITHDRAWN, None, None, "the call was cancelled")
            raise
        return approval

    def decide(self, approval_id: str, *, approve: bool, by: str, channel: str, reason: str | None = None,
               allow_again_for: float | None = None) -> Answer:
        """An answer from a person. Only the first answer to a pending approval counts. An operator approving may
        also let the same client make the very same call again for `allow_again_for` seconds without asking
        (checked by parse_answer; a caller's own user may never grant it)."""
        if allow_again_for is not None:
            if channel == CLIENT:
                raise ValueError("allow-again is for operators approving")
            _allow_again(allow_again_for, approve)  # raises ValueError when out of bounds or not approving
        approval = self.get(approval_id)
        if approval is None:
            return Answer(False, f"no approval {approval_id!r} (unknown, or finished long ago)")
        if approval.state is not State.PENDING:
            return Answer(False, f"approval {approval_id} was already {_said(approval)}; this answer changed nothing",
                          approval)
        if channel not in approval.channels:
            return Answer(False, f"approval {approval_id} does not take answers from the {channel} channel", approval)
        state = State.APPROVED if approve else State.DENIED
        self._finish(approval, state, by, channel, reason)
        message = (f"approval {approval_id} {state.value}: {display.shown(approval.client)} may "
                   f"{'now run' if approve else 'not run'} {display.shown(approval.method)}")
        if allow_again_for is not None:
            standing = Standing(approval.client, approval.method, approval.params_sha256,
                                time.time() + allow_again_for, by, approval.id)
            self._standing[(standing.client, standing.method, standing.params_sha256)] = standing
            message += f", and make the same call again for {allow_again_for:g}s without asking"
            logger.info("standing approval %s: client=%s method=%s for %gs by %s", approval.id, approval.client,
                        approval.method, allow_again_for, by)
        return Answer(True, message, approval)

    def standing_for(self, approval: Approval) -> Standing | None:
        """The live "allow again" that covers this call (same client, method and arguments), if any."""
        key = (approval.client, approval.method, approval.params_sha256)
        standing = self._standing.get(key)
        if standing is not None and standing.until <= time.time():
            del self._standing[key]
            return None
        return standing

    def approve_standing(self, approval: Approval, standing: Standing) -> None:
        """Approve a call covered by an operator's "allow again" without asking anyone."""
        self._finish(approval, State.APPROVED, f"{standing.by}, allowed again until {standing.until:.0f}",
                     STANDING, f"allowed again by approval {standing.approval_id}")

    def standing(self) -> list[Standing]:
        """Live "allow again" permissions, soonest to lapse first."""
        now = time.time()
        for key in [key for key, item in self._standing.items() if item.until <= now]:
            del self._standing[key]
        return sorted(self._standing.values(), key=lambda item: item.until)

    def revoke(self, approval_id: str) -> bool:
        """End the "allow again" that approval `approval_id` gave; False if there is none."""
        for key, item in list(self._standing.items()):
            if item.approval_id == approval_id:
                del self._standing[key]
                logger.info("standing approval %s revoked", approval_id)
                return True
        return False

    def withdraw(self, approval: Approval, reason: str) -> None:
        """The caller is gone: nothing will run, a late answer is told so."""
        self._finish(approval, State.WITHDRAWN, None, None, reason)

    def _finish(
        self, approval: Approval, state: State, by: str | None, channel: str | None, reason: str | None
    ) -> None:
        if approval.state is not State.PENDING:
            return
        approval.state, approval.decided_by, approval.channel, approval.reason = state, by, channel, reason
        approval.done.set()
        del self._pending[approval.id]
        left = self._by_client.get(approval.client, 0) - 1
        if left > 0:
            self._by_client[approval.client] = left
        else:
            self._by_client.pop(approval.client, None)
        size = len(jsonrpc.dumps(approval.arguments))
        if size > FINISHED_ARGUMENT_BYTES:
            approval.arguments = f"[{size} bytes of arguments, not kept once the approval was {state.value}]"
        self._finished[approval.id] = approval
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)
        logger.info("approval %s %s%s%s", approval.id, state.value, f" by {by}" if by else "",
                    f": {reason}" if reason else "")
        self._tell("finished", approval)

    # -- watchers ----------------------------------------------------------------------------

    def watch(self) -> asyncio.Queue[dict[str, Any] | None]:
        """A queue of changes ({"type": "pending"|"finished", "approval": view}); None means: read the list again."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers.add(queue)
        return queue

    def unwatch(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        """Stop telling this watcher."""
        self._watchers.discard(queue)

    def _tell(self, kind: str, approval: Approval) -> None:
        if not self._watchers:
            return
        change = {"type": kind, "approval": approval.view()}
        for queue in list(self._watchers):
            if queue.qsize() >= WATCHER_BACKLOG:
                # Too far behind: drop what it has not read and tell it to start over.
                self._watchers.discard(queue)
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(None)
                continue
            queue.put_nowait(change)


def _said(approval: Approval) -> str:
    who = f" by {approval.decided_by}" if approval.decided_by else ""
    why = f" ({approval.reason})" if approval.reason else ""
    return f"{approval.state.value}{who}{why}"
