"""`subscriptions/listen` of MCP 2026-07-28: the streams on which clients without a session hear that lists changed
and that resources they subscribed to were updated.

Owns: the filter a listener asked for and the part of it the gateway honours (the acknowledgement), tagging each
notification with the listener's subscription id, the registry of open listeners, and the limits on how many there
are. A listener hears exactly what a legacy session's GET stream would: the same broadcasts (catalog.py,
surfaces.py) with the same per-client filters reach it, because each listener is a `Session` that is never
registered as one (no id a client could present, never minted on `initialize`), attached to `Sessions` as a second
audience. Does not own the HTTP stream (web/modern.py) or who may see what (policy, catalog.py, surfaces.py).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from gatewayd.errors import InvalidParams, Overloaded
from gatewayd.modern import SUBSCRIPTION_ID_KEY, Envelope
from gatewayd.sessions import SESSION_ID_BYTES, Session
from gatewayd.surfaces import PROMPTS_CHANGED, RESOURCES_CHANGED, UPDATED

logger = logging.getLogger(__name__)

ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
TOOLS_CHANGED: Final = "notifications/tools/list_changed"
# The filter's list-changed keys and the notification each lets through.
LIST_FILTERS: Final = {"toolsListChanged": TOOLS_CHANGED, "promptsListChanged": PROMPTS_CHANGED,
                       "resourcesListChanged": RESOURCES_CHANGED}
RESOURCE_FILTER: Final = "resourceSubscriptions"
# The tasks extension's filter (SEP-2663, modern_tasks.py): the task ids whose status changes the listener hears.
TASK_FILTER: Final = "taskIds"
TASKS_NOTIFICATION: Final = "notifications/tasks"
# Tasks one listener may follow (as many as one client may hold, modern_tasks.MAX_TASKS_PER_CLIENT).
MAX_TASK_SUBSCRIPTIONS: Final = 64
# Open listen streams in all: each holds a connection and a queue; a client needs one or two.
MAX_LISTENERS: Final = 1024
# Open listen streams one client may hold, so that one client cannot take every slot; a new one past it ends the
# client's oldest.
MAX_LISTENERS_PER_CLIENT: Final = 32
# Resource URIs one listener may subscribe to (as a legacy session may hold surfaces.MAX_SUBSCRIPTIONS).
MAX_RESOURCE_SUBSCRIPTIONS: Final = 1024


@dataclass
class Listener(Session):
    """One `subscriptions/listen` stream: a session nobody can name, hearing only what its filter asked for."""

    subscription_id: Any = None
    wanted: frozenset[str] = field(default_factory=frozenset)

    def push(self, message: dict[str, Any] | None) -> None:
        """Queue a notification this listener asked for, tagged with its subscription id (None ends the stream)."""
        if message is None:
            super().push(None)
            return
        method = message.get("method")
        if method not in self.wanted:
            return
        params = message.get("params")
        params = dict(params) if isinstance(params, dict) else {}
        meta = params.get("_meta")
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), SUBSCRIPTION_ID_KEY: self.subscription_id}
        super().push({"jsonrpc": "2.0", "method": method, "params": params})


def requested(params: Any) -> tuple[set[str], list[str]]:
    """The list-changed notifications and the resource URIs a listen request asks for (-32602 if malformed)."""
    notifications = params.get("notifications") if isinstance(params, dict) else None
    if not isinstance(notifications, dict):
        raise InvalidParams("subscriptions/listen needs params.notifications, an object")
    wanted = {method for key, method in LIST_FILTERS.items() if notifications.get(key) is True}
    uris = notifications.get(RESOURCE_FILTER, [])
    if not isinstance(uris, list) or not all(isinstance(uri, str) for uri in uris):
        raise InvalidParams(f"subscriptions/listen params.notifications.{RESOURCE_FILTER} must be a list of URIs")
    if len(uris) > MAX_RESOURCE_SUBSCRIPTIONS:
        raise InvalidParams(f"subscriptions/listen: at most {MAX_RESOURCE_SUBSCRIPTIONS} resource subscriptions")
    return wanted, list(dict.fromkeys(uris))


def requested_tasks(params: Any) -> list[str]:
    """The task ids a listen request asks to follow (-32602 if malformed); its filter is checked by `requested`."""
    notifications = params.get("notifications") if isinstance(params, dict) else None
    task_ids = notifications.get(TASK_FILTER, []) if isinstance(notifications, dict) else []
    if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
        raise InvalidParams(f"subscriptions/listen params.notifications.{TASK_FILTER} must be a list of task ids")
    if len(task_ids) > MAX_TASK_SUBSCRIPTIONS:
        raise InvalidParams(f"subscriptions/listen: at most {MAX_TASK_SUBSCRIPTIONS} task ids")
    return list(dict.fromkeys(task_ids))


def acknowledgement(listener: Listener, uris: list[str], task_ids: list[str] | None = None) -> dict[str, Any]:
    """The first message of a listen stream: what of the filter the gateway honours (URIs it could subscribe to,
    tasks it will tell of)."""
    honoured: dict[str, Any] = {key: True for key, method in LIST_FILTERS.items() if method in listener.wanted}
    if uris:
        honoured[RESOURCE_FILTER] = uris
    if task_ids:
        honoured[TASK_FILTER] = task_ids
    return {"jsonrpc": "2.0", "method": ACKNOWLEDGED,
            "params": {"notifications": honoured, "_meta": {SUBSCRIPTION_ID_KEY: listener.subscription_id}}}


class Listeners:
    """Every open listen stream: a second audience of `Sessions.broadcast`."""

    def __init__(self, limit: int = MAX_LISTENERS, per_client: int = MAX_LISTENERS_PER_CLIENT) -> None:
        self._open: dict[str, Listener] = {}
        self._per_client: dict[str, int] = {}
        self.limit = limit
        self.per_client = per_client

    def __len__(self) -> int:
        return len(self._open)

    def open(self, client: str, envelope: Envelope, subscription_id: Any, wanted: set[str]) -> Listener:
        """A new listener of `client` (Overloaded past the limit of all); `close` it when its stream ends. A client at
        its own limit has its oldest stream ended to make room: most likely one whose network went away without a
        word, which the gateway cannot tell from a quiet one (a client needs one or two)."""
        if self._per_client.get(client, 0) >= self.per_client:
            oldest = next(listener for listener in self._open.values() if listener.client == client)
            logger.info("client=%s holds %d subscriptions/listen streams: its oldest ended for a new one", client,
                        self.per_client)
            self.close(oldest)
        if len(self._open) >= self.limit:
            raise Overloaded("too many subscriptions/listen streams; retry later")
        listener = Listener(id=f"listen-{secrets.token_urlsafe(SESSION_ID_BYTES)}", client=client,
                            protocol_version=envelope.version, capabilities={}, client_info={},
                            subscription_id=subscription_id, wanted=frozenset(wanted))
        self._open[listener.id] = listener
        self._per_client[client] = self._per_client.get(client, 0) + 1
        return listener

    def close(self, listener: Listener) -> None:
        """The listener's stream ended: forget it, and end its resource subscriptions."""
        if self._open.pop(listener.id, None) is None:
            return
        left = self._per_client.get(listener.client, 0) - 1
        if left > 0:
            self._per_client[listener.client] = left
        else:
            self._per_client.pop(listener.client, None)
        listener.end()

    def broadcast(self, message: dict[str, Any], to: Callable[[Session], bool] | None = None) -> None:
        """Queue a notification for every listener that `to` accepts and whose filter asked for it."""
        for listener in self._open.values():
            if listener.wanted and (to is None or to(listener)):
                listener.push(message)

    def broadcast_close(self) -> None:
        """Tell every listen stream to end (the daemon is stopping)."""
        for listener in self._open.values():
            listener.push(None)


def subscribed_updates(listener: Listener) -> None:
    """A listener that subscribed to resources hears their updates (the `to` filter checks the subscription)."""
    listener.wanted = listener.wanted | {UPDATED}
