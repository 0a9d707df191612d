"""The daemon's shared state: what its parts (web, admin socket, reloader) read, and the one swapped reference.

Owns `DaemonState`: the settings, the current config generation (replaced whole by a reload, never
edited), and the long-lived parts every generation shares — the gateway and its registries
(sessions, approvals, calls in flight), the audit log, the metrics and the pool of tool servers.
Built and wired by app.py, which owns start and stop. Does not own any behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.continuations import Continuations
from gatewayd.deadlines import Deadlines
from gatewayd.gateway import Gateway
from gatewayd.generation import Generation
from gatewayd.inflight import Inflight
from gatewayd.listeners import Listeners
from gatewayd.metrics import Metrics
from gatewayd.modern_tasks import Tasks
from gatewayd.policy import Principal
from gatewayd.request_state import Sealer
from gatewayd.sessions import Sessions
from gatewayd.settings import Settings
from gatewayd.upstream.pool import Pool
from gatewayd.urls import Links


@dataclass(eq=False)
class DaemonState:
    """Everything the daemon's parts share; `generation` is the only field a reload changes."""

    settings: Settings
    generation: Generation
    pool: Pool
    gateway: Gateway
    sessions: Sessions
    approvals: Approvals
    inflight: Inflight
    audit: AuditLog
    metrics: Metrics
    # Where the MCP endpoint listens, and the Host and Origin values served; empty until the daemon knows its port.
    url: str = ""
    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    # The URLs the daemon hands out (urls.py); the listening address until the daemon knows its port.
    links: Links = field(default_factory=lambda: Links(""))
    # The Prometheus text of the whole daemon, once the daemon has wired it.
    metrics_text: Callable[[], Awaitable[str]] | None = None
    # The first keep-alive of each SSE answer: one loop timer for them all.
    deadlines: Deadlines = field(default_factory=Deadlines)
    # Large bodies are parsed off the event loop one at a time: a second worker would only share the one GIL.
    big_parses: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    # The `subscriptions/listen` streams of MCP 2026-07-28: they hear what sessions hear.
    listeners: Listeners = field(default_factory=Listeners)
    # Seals the `requestState` of input-required results with a key made now (request_state.py).
    request_states: Sealer = field(default_factory=Sealer)
    # Modern calls kept running between an input-required answer and its retry (continuations.py).
    continuations: Continuations = field(default_factory=Continuations)
    # Modern calls their callers poll as tasks (modern_tasks.py).
    modern_tasks: Tasks = field(default_factory=Tasks)

    def __post_init__(self) -> None:
        self.sessions.attach(self.listeners)

    def principal(self, client: str) -> Principal | None:
        """The client's principal in the current generation; None if it no longer exists."""
        return self.generation.principal(client)
