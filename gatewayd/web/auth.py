"""Failed logins: every request refused with 401 is counted, and recorded in the log and the audit log, rate-limited.

Owns what is kept about a refused token: a metric for every one (`gatewayd_auth_failures_total`), and at most
AUTH_RECORDS_PER_INTERVAL log lines and audit records each AUTH_RECORD_INTERVAL, the next one carrying how many
were left out, so a client hammering the port with wrong tokens cannot fill the disk or the journal. A record names
the peer address, the path and why the token was refused; never a token, nor any part of one. Does not own the
token check itself (tokens.py) or the 401 answer (errors.refusal).
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from gatewayd.errors import Unauthenticated
from gatewayd.state import DaemonState

logger = logging.getLogger(__name__)

# A burst of this many refusals is each logged and audited; past it, only counted until the interval ends.
AUTH_RECORDS_PER_INTERVAL = 10
AUTH_RECORD_INTERVAL = 60.0
METRIC = "gatewayd_auth_failures_total"


class FailedLogins:
    """Counts 401s and records the first few of each interval."""

    def __init__(self, per_interval: int = AUTH_RECORDS_PER_INTERVAL, interval: float = AUTH_RECORD_INTERVAL) -> None:
        self.total = 0
        self._per_interval = per_interval
        self._interval = interval
        self._window_start = -interval
        self._in_window = 0
        self._left_out = 0

    def refused(self, state: DaemonState, request: web.Request, exc: Unauthenticated) -> None:
        """One request refused for its token."""
        self.total += 1
        now = time.monotonic()
        if now - self._window_start >= self._interval:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self._per_interval:
            self._left_out += 1
            return
        self._in_window += 1
        left_out, self._left_out = self._left_out, 0
        peer = request.remote or "unknown"
        more = f" ({left_out} more not logged)" if left_out else ""
        logger.warning("401 for %s %r from %s: %s%s", request.method, request.path[:200], peer, exc.reason, more)
        if state.audit.enabled:
            state.audit.queue({"event": "auth_failed", "peer": peer, "http_method": request.method,
                               "path": request.path[:200], "reason": exc.reason, "not_recorded_before": left_out})

    def gauges(self) -> list[tuple[str, str, dict[str, str], float]]:
        """The metric row, read at each scrape."""
        return [(METRIC, "Requests refused with 401 (no, malformed or unknown bearer token).", {}, self.total)]


FAILED_LOGINS = web.AppKey("failed_logins", FailedLogins)
