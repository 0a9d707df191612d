"""MCP sessions of the 2025-era Streamable HTTP transport, and their server-to-client streams.

Owns: minting unguessable session ids, binding each to the client that created it, negotiated version and
capabilities, the queue behind the session's GET stream (its ids and readers: resumable.py), the limit on how many
exist, and forgetting idle ones. Does not own HTTP (web/) or calls (gateway.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gatewayd.errors import TooManySessions
from gatewayd.once import Once
from gatewayd.resumable import Replays, SessionStream

logger = logging.getLogger(__name__)

# Versions of the legacy (initialize + Mcp-Session-Id) era this gateway speaks, newest first.
SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST_VERSION = SUPPORTED_VERSIONS[0]
# Notifications held for a session's GET stream before the oldest are dropped.
OUTBOUND_QUEUE_LIMIT = 256
# Idle sessions are looked for this often (half the idle timeout, within these bounds), so a session a client left
# without DELETE ends, its per-session children and queue with it, at most this long after its idle timeout, not
# only when another session is created.
EXPIRY_SWEEP_MAX = 10.0
EXPIRY_SWEEP_MIN = 0.05
# Session ids carry this many random bytes (256 bits): unguessable.
SESSION_ID_BYTES = 32
# Characters of a session id shown to operators (status, audit): enough to correlate, useless to replay.
SESSION_ID_SHOWN = 12
# What a session keeps of the capabilities and client info `initialize` declared is cut to these sizes: a client
# may send megabytes there, and a session lives for an hour. Real declarations are a few keys, two levels deep.
KEPT_KEYS = 32
KEPT_DEPTH = 3
KEPT_STRING = 256

LOG_MESSAGE = "notifications/message"
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass
class Session:
    """One MCP client session, owned by the client that created it. It holds the client's name, not its grants:
    each request authenticates afresh against the config generation current when it begins."""

    id: str
    client: str
    protocol_version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.monotonic)
    log_level: str = "debug"
    # None tells the GET stream to end (the session was deleted).
    outbound: asyncio.Queue[dict[str, Any] | None] = field(
        default_factory=lambda: asyncio.Queue(OUTBOUND_QUEUE_LIMIT)
    )
    # Which connection reads the GET stream, and what it wrote last, for a reconnection (resumable.py).
    stream: SessionStream = field(default_factory=SessionStream)
    # (server, uri) of each resource this session subscribed to (surfaces.py): who hears `resources/updated`.
    subscriptions: set[tuple[str, str]] = field(default_factory=set)
    # Its calls' event streams kept for a client that reconnects with `Last-Event-ID` (resumable.py).
    replays: Replays = field(default_factory=Replays)
    # The session ends (DELETE, expiry): pending approvals of its calls are withdrawn.
    _ended: Once = field(default_factory=Once)

    @property
    def stream_open(self) -> bool:
        """Whether a connection reads the session's GET stream."""
        return self.stream.cut is not None

    @property
    def ended(self) -> bool:
        return self._ended.happened

    def on_end(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the session ends (at once if it has); returns a function that cancels this."""
        return self._ended.add(callback)

    def end(self) -> None:
        """The session is over: tell whoever asked, and end its GET stream."""
        if self._ended.fire():
            self.push(None)

    def view(self) -> dict[str, Any]:
        """What operators see of a session (gatewayctl status): never the whole id."""
        now = time.monotonic()
        name = self.client_info.get("name")
        return {"id": self.id[:SESSION_ID_SHOWN], "client": self.client, "version": self.protocol_version,
                "client_info": str(name)[:64] if name is not None else None, "age_s": round(now - self.created, 1),
                "idle_s": round(now - self.last_used, 1), "stream_open": self.stream_open,
                "streams_kept": self.replays.waiting()}

    def supports_form_elicitation(self) -> bool:
        """Whether the client declared MCP elicitation in form mode (`elicitation: {}` means form)."""
        declared = self.capabilities.get("elicitation")
        return isinstance(declared, dict) and (not declared or isinstance(declared.get("form"), dict))

    def supports_elicitation(self, mode: Any) -> bool:
        """Whether the client declared MCP elicitation in `mode` ("form", or "url" as 2025-11-25 names it)."""
        if mode == "form":
            return self.supports_form_elicitation()
        declared = self.capabilities.get("elicitation")
        return mode == "url" and isinstance(declared, dict) and isinstance(declared.get("url"), dict)

    def push(self, message: dict[str, Any] | None) -> None:
        """Queue a notification for the GET stream (None ends it); the oldest is dropped when full."""
        if self.outbound.full():
            self.outbound.get_nowait()
        self.outbound.put_nowait(message)
        self.stream.wake()

    def hear(self, message: dict[str, Any]) -> None:
        """A log line (`notifications/message`) of a child of this session's own, outside any call: on the GET
        stream, at the level the session set."""
        params = message.get("params")
        if message.get("method") == LOG_MESSAGE and isinstance(params, dict) and self.wants_log(params.get("level")):
            self.push({"jsonrpc": "2.0", "method": LOG_MESSAGE, "params": params})

    def wants_log(self, level: Any) -> bool:
        """Whether a `notifications/message` at `level` passes this session's `logging/setLevel`."""
        if level not in LOG_LEVELS:
            return True
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(self.log_level)


def kept(declared: Any, depth: int = 1) -> dict[str, Any]:
    """What a session keeps of a declared object: at most KEPT_KEYS keys per object, KEPT_DEPTH levels, strings cut to
    KEPT_STRING characters; lists and anything else are dropped."""
    if not isinstance(declared, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in declared.items():
        if len(out) >= KEPT_KEYS:
            break
        if len(key) > KEPT_STRING:
            continue
        if isinstance(value, dict):
            if depth < KEPT_DEPTH:
                out[key] = kept(value, depth + 1)
        elif isinstance(value, str):
            out[key] = value[:KEPT_STRING]
        elif isinstance(value, bool | int | float) or value is None:
            out[key] = value
    return out


def negotiate(requested: Any) -> str:
    """The version to answer `initialize` with: the client's if supported, else our latest."""
    return requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION


class Audience(Protocol):
    """Others who hear what sessions hear (listeners.py: the `subscriptions/listen` streams of MCP 2026-07-28)."""

    def broadcast(self, message: dict[str, Any], to: Callable[[Session], bool] | None = None) -> None: ...

    def broadcast_close(self) -> None: ...


class Sessions:
    """All live sessions."""

    def __init__(self, max_sessions: int, idle_timeout: float, per_client: int | None = None) -> None:
        self._by_id: dict[str, Session] = {}
        self._per_client: dict[str, int] = {}
        self.max_sessions = max_sessions
        self.max_per_client = per_client or max_sessions
        self.idle_timeout = idle_timeout
        self._others: list[Audience] = []

    def attach(self, audience: Audience) -> None:
        """`audience` hears every broadcast from now on, through the same `to` filter."""
        self._others.append(audience)

    def __len__(self) -> int:
        return len(self._by_id)

    def all(self) -> list[Session]:
        """Every live session."""
        return list(self._by_id.values())

    def create(self, client: str, params: dict[str, Any]) -> Session:
        """A new session of `client` for an `initialize` request. Raises TooManySessions when at the limit, or when
        the client holds its share of them."""
        self.expire()
        if self._per_client.get(client, 0) >= self.max_per_client:
            raise TooManySessions(f"this client holds {self.max_per_client} MCP sessions already: end one (DELETE)",
                                  client_share=True)
        if len(self._by_id) >= self.max_sessions:
            raise TooManySessions("too many MCP sessions")
        session = Session(
            id=secrets.token_urlsafe(SESSION_ID_BYTES),
            client=client,
            protocol_version=negotiate(params.get("protocolVersion")),
            capabilities=kept(params.get("capabilities")),
            client_info=kept(params.get("clientInfo")),
        )
        self._by_id[session.id] = session
        self._per_client[client] = self._per_client.get(client, 0) + 1
        logger.info("session created for client=%s (%s, %d live)", client, session.protocol_version, len(self))
        return session

    def get(self, session_id: str, client: str) -> Session | None:
        """The session, if it exists and belongs to `client`; another client's id is as good as unknown."""
        session = self._by_id.get(session_id)
        if session is None or session.client != client:
            return None
        session.last_used = time.monotonic()
        return session

    def delete(self, session_id: str) -> None:
        """End a session; its id answers 404 from now on."""
        session = self._by_id.pop(session_id, None)
        if session is not None:
            left = self._per_client.get(session.client, 0) - 1
            if left > 0:
                self._per_client[session.client] = left
            else:
                self._per_client.pop(session.client, None)
            session.end()

    def expire(self) -> None:
        """Forget sessions unused for `idle_timeout`."""
        cutoff = time.monotonic() - self.idle_timeout
        for session_id in [sid for sid, s in self._by_id.items() if s.last_used < cutoff and not s.stream_open]:
            logger.info("session of client=%s ended: unused for %gs", self._by_id[session_id].client,
                        self.idle_timeout)
            self.delete(session_id)

    async def sweep(self) -> None:
        """Expire idle sessions as they pass their idle timeout, until cancelled (the daemon owns this task)."""
        interval = min(EXPIRY_SWEEP_MAX, max(EXPIRY_SWEEP_MIN, self.idle_timeout / 2))
        while True:
            await asyncio.sleep(interval)
            self.expire()

    def hear(self, client: str, message: dict[str, Any]) -> None:
        """A log line of `client`'s own child outside any call (`isolation = "client"`): every session of that
        client hears it, each at its level (which of them the child's work was for is not known)."""
        for session in self._by_id.values():
            if session.client == client:
                session.hear(message)

    def broadcast(self, message: dict[str, Any], to: Callable[[Session], bool] | None = None) -> None:
        """Queue a notification for the GET stream of every session (that `to` accepts)."""
        for session in self._by_id.values():
            if to is None or to(session):
                session.push(message)
        for audience in self._others:
            audience.broadcast(message, to)

    def broadcast_close(self) -> None:
        """Tell every GET stream to end (the daemon is stopping)."""
        for session in self._by_id.values():
            session.push(None)
        for audience in self._others:
            audience.broadcast_close()
