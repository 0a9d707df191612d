"""URL-mode elicitations in progress (MCP 2025-11-25): whom a tool server's `notifications/elicitation/complete` is for.

A tool server that needs a person to do something out of band (sign in to a third party, say) asks for a URL-mode
elicitation: as a request during a call (`elicitation/create` with `mode: "url"` and an `elicitationId`, relayed to
the caller by relay.py), or as a call's error (`-32042`, URLElicitationRequiredError, its `data.elicitations` each
with an `elicitationId`). When the interaction completes it may send `notifications/elicitation/complete` naming
the id, which the spec says goes only to the client that was asked: the gateway is that client to the server, and
passes the notification on to the MCP session it put the question to (on the session's own stream: the call is
usually over by then), once, and to no one else. A 2026-07-28 caller learns the outcome by retrying its request
(that era has no such notification), so only legacy sessions are remembered.

Owns the table: (server, elicitation id) → the session asked, at most MAX_OPEN entries (the oldest forgotten past
that), each forgotten OPEN_FOR seconds after it was asked or once completed; an id the table does not hold, or
another server's, is dropped as the spec asks a client to drop it. Does not own relaying the request (relay.py) or
the session's stream (sessions.py).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from gatewayd.sessions import Session

logger = logging.getLogger(__name__)

COMPLETE: Final = "notifications/elicitation/complete"
# The error a tool server answers when a URL-mode elicitation must complete first.
URL_ELICITATION_REQUIRED: Final = -32042
# URL-mode elicitations remembered at once, across servers and sessions.
MAX_OPEN: Final = 1024
# Seconds one is remembered: long enough for a person to sign in somewhere, not for ever.
OPEN_FOR: Final = 3600.0
# Longest elicitation id remembered (a longer one is no id this gateway passes on).
MAX_ID_CHARS: Final = 256


class UrlElicitations:
    """The URL-mode elicitations put to legacy sessions, by (server, elicitation id)."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], tuple[Session, float]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def asked(self, server: str, params: Any, session: Session | None) -> None:
        """`server` asked `session` a URL-mode elicitation (an `elicitation/create`'s params): remember whom."""
        if session is None or not isinstance(params, dict) or params.get("mode") != "url":
            return
        self._remember(server, params.get("elicitationId"), session)

    def required(self, server: str, error: dict[str, Any], session: Session | None) -> None:
        """`server` answered a call of `session` with a URLElicitationRequiredError: remember whom each is for."""
        data = error.get("data")
        elicitations = data.get("elicitations") if isinstance(data, dict) else None
        if session is None or error.get("code") != URL_ELICITATION_REQUIRED or not isinstance(elicitations, list):
            return
        for elicitation in elicitations[:MAX_OPEN]:
            if isinstance(elicitation, dict) and elicitation.get("mode", "url") == "url":
                self._remember(server, elicitation.get("elicitationId"), session)

    def completed(self, server: str, message: dict[str, Any]) -> bool:
        """`server` says an elicitation completed: the session it was asked of is told (once); whether one was."""
        params = message.get("params")
        elicitation_id = params.get("elicitationId") if isinstance(params, dict) else None
        entry = self._open.pop((server, elicitation_id), None) if isinstance(elicitation_id, str) else None
        if entry is None or entry[1] < time.monotonic():
            logger.info("server=%s %s for an elicitation no session waits for: dropped", server, COMPLETE)
            return False
        session = entry[0]
        if session.ended:
            return False
        session.push({"jsonrpc": "2.0", "method": COMPLETE, "params": {"elicitationId": elicitation_id}})
        logger.info("server=%s elicitation %.64s completed: client=%s told", server, elicitation_id, session.client)
        return True

    def _remember(self, server: str, elicitation_id: Any, session: Session) -> None:
        if not isinstance(elicitation_id, str) or not elicitation_id or len(elicitation_id) > MAX_ID_CHARS:
            return
        now = time.monotonic()
        key = (server, elicitation_id)
        self._open.pop(key, None)  # asked again: the latest asking counts, and is the newest
        self._open[key] = (session, now + OPEN_FOR)
        while self._open and (len(self._open) > MAX_OPEN or next(iter(self._open.values()))[1] < now):
            del self._open[next(iter(self._open))]
