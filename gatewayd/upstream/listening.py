"""What a 2026-07-28 child says changed: the gateway's one `subscriptions/listen` on it.

That era has no unsolicited notifications and no `resources/subscribe`: a child tells of changes only on a listen
stream its client opened. The dialect (dialects.py) opens one on each modern child at its start, for what the child's
`server/discover` says it tells of (the `listChanged` of its tools, prompts, resources); sessions' subscriptions to its
resources (`resources/subscribe`, `unsubscribe`, which reach the dialect as for any child: surfaces.py) join and leave
that listen, which is opened again with the URIs held — once for all the changes of one loop turn, the new one before
the old one ends, so that no change falls between them, and at once even while a listen the child ended waits out its
backoff (REOPEN_FIRST…REOPEN_LAST). The child's notifications then reach the server as a legacy
child's do (server.py), its subscription id taken off: it is nothing the gateway's callers know.

Owns that listen: the URIs it holds, the one open (its connection and id), and a child that refused to listen (not
asked again). Does not own what the notifications do (server.py, surfaces.py) or the pipes (peer.py `listen`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from gatewayd.errors import INVALID_PARAMS, METHOD_NOT_FOUND, ToolServerUnavailable, UpstreamError
from gatewayd.modern import LISTEN, SUBSCRIPTION_ID_KEY
from gatewayd.surfaces import SUBSCRIBE
from gatewayd.upstream.connection import Connection

logger = logging.getLogger(__name__)

# The filter flag of each list a child may tell of changing, by the capability whose `listChanged` says it does.
FLAGS: Final = {"toolsListChanged": "tools", "promptsListChanged": "prompts", "resourcesListChanged": "resources"}
# A listen's acknowledgement: no news.
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
# Seconds before a listen the child ended itself (without exiting) is opened again: doubling from the first to the
# last while the child keeps ending it, back to the first with a new child.
REOPEN_FIRST: Final = 1.0
REOPEN_LAST: Final = 60.0


class Listening:
    """The listen of one modern child's server; `params` wraps a request's params in the era's envelope."""

    def __init__(self, name: str, params: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.name = name
        self._params = params
        # What the child's `server/discover` says it offers (its capabilities).
        self._offers: dict[str, Any] = {}
        self._uris: set[str] = set()
        self._open: tuple[Connection, int] | None = None
        self._again: asyncio.Handle | asyncio.TimerHandle | None = None
        self._deaf: Connection | None = None
        self._reopen = REOPEN_FIRST

    def start(self, conn: Connection, offers: dict[str, Any]) -> None:
        """A new child is up: listen to it for what it offers. The resources sessions hold are subscribed again once
        it is (surfaces.py `child_up`), each joining this listen."""
        self._offers = offers
        self._uris.clear()
        self._reopen = REOPEN_FIRST
        self._listen(conn)

    def says(self, kind: str, feature: str) -> bool:
        """Whether the child's `server/discover` capabilities say `kind.feature` (`tools.listChanged`, …)."""
        offered = self._offers.get(kind)
        return isinstance(offered, dict) and offered.get(feature) is True

    def subscription(self, conn: Connection, method: str, params: Any) -> dict[str, Any]:
        """`resources/subscribe` or `unsubscribe` for the child, which has neither: the URI joins or leaves the
        listen. `-32601` when its `server/discover` does not say `resources.subscribe`."""
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            raise UpstreamError({"code": INVALID_PARAMS, "message": "params.uri must be a string"})
        if method == SUBSCRIBE and not self.says("resources", "subscribe"):
            raise UpstreamError({"code": METHOD_NOT_FOUND,
                                 "message": f"tool server {self.name!r} offers no resource subscriptions"})
        held = len(self._uris)
        if method == SUBSCRIBE:
            self._uris.add(uri)
        else:
            self._uris.discard(uri)
        if len(self._uris) != held and (self._again is None or isinstance(self._again, asyncio.TimerHandle)):
            # A reopen waiting out the backoff of a child that keeps ending listens waits no longer: a session's
            # subscription is not held back by the child's doing.
            if self._again is not None:
                self._again.cancel()
            self._again = asyncio.get_running_loop().call_soon(self._listen, conn)
        return {}

    def taken(self, message: dict[str, Any]) -> bool:
        """Take the child's subscription id off a notification of its; whether it is one of the listen's own (its
        acknowledgement), not for the server."""
        params = message.get("params")
        if isinstance(params, dict) and isinstance(meta := params.get("_meta"), dict) and SUBSCRIPTION_ID_KEY in meta:
            rest = {key: value for key, value in meta.items() if key != SUBSCRIPTION_ID_KEY}
            if rest:
                params["_meta"] = rest
            else:
                del params["_meta"]
        return message.get("method") == ACKNOWLEDGED

    def _listen(self, conn: Connection) -> None:
        """Open the listen for what is wanted now, then end the one it replaces; with nothing wanted, end it."""
        self._again = None
        if not conn.alive or self._deaf is conn:
            return
        notifications: dict[str, Any] = {flag: True for flag, kind in FLAGS.items() if self.says(kind, "listChanged")}
        if self._uris:
            notifications["resourceSubscriptions"] = sorted(self._uris)
        old, self._open = self._open, None
        if notifications:
            try:
                listen_id = conn.listen(LISTEN, self._params({"notifications": notifications}),
                                        lambda answer: self._ended(conn, answer))
            except ToolServerUnavailable as exc:
                logger.info("server=%s %s not sent: %s", self.name, LISTEN, exc.message)
                self._open = old
                return
            logger.info("server=%s pid=%d listening for changes of its lists and of %d resources", self.name,
                        conn.pid, len(self._uris))
            self._open = conn, listen_id
        if old is not None and old[0] is conn:
            conn.unlisten(old[1])

    def _ended(self, conn: Connection, answer: dict[str, Any]) -> None:
        """The child ended a listen: refused it (not asked again on this child), or ended it itself (the open one
        is opened again after REOPEN_FIRST…REOPEN_LAST seconds)."""
        current = self._open == (conn, answer.get("id"))
        if current:
            self._open = None
        if "error" in answer:
            self._deaf = conn
            logger.warning("server=%s refused %s (%.200s): changes of its tools, prompts and resources are not "
                           "heard", self.name, LISTEN, answer.get("error"))
            return
        if not current:
            return  # one it replaced already
        logger.info("server=%s ended the gateway's %s; opened again in %gs", self.name, LISTEN, self._reopen)
        if self._again is None:
            self._again = asyncio.get_running_loop().call_later(self._reopen, self._listen, conn)
            self._reopen = min(self._reopen * 2, REOPEN_LAST)
