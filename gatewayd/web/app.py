"""The aiohttp application: routes, the Host/Origin guard, and turning HttpError into a status.

Owns which paths exist, the checks every request passes before any handler (Host → 421,
Origin → 403), the order of the middlewares, and the one place an HttpError (or a refusal made
below the web layer: no token, too many sessions; errors.refusal) becomes an HTTP response.
Does not own the MCP endpoint's logic (mcp_http.py), tokens (tokens.py) or request limits
(limits.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from gatewayd import metrics
from gatewayd.errors import HttpError, TooManySessions, Unauthenticated, refusal
from gatewayd.state import DaemonState
from gatewayd.urls import MCP_PATH as MCP_PATH  # the endpoint's path, named where the routes are
from gatewayd.web import auth, console, limits, mcp_http
from gatewayd.web.keys import STATE

logger = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The routes served without aiohttp's router (aiohttp_hooks.Direct), through the same middlewares: every call.
DIRECT_ROUTES = ((hdrs.METH_POST, MCP_PATH),)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse requests for a Host we do not serve (DNS rebinding) or from a foreign Origin; map HttpError."""
    state = request.app[STATE]
    try:
        host = request.headers.get("Host", "")
        if host not in state.hosts:
            raise HttpError(421, f"Host {host[:100]!r} is not served here")
        origin = request.headers.get("Origin")
        if origin is not None and origin not in state.origins:
            raise HttpError(403, f"Origin {origin[:100]!r} is not allowed")
        return await handler(request)
    except HttpError as exc:
        return _refused(request, exc)
    except Unauthenticated as exc:
        request.app[auth.FAILED_LOGINS].refused(state, request, exc)
        return _refused(request, refusal(exc))
    except TooManySessions as exc:
        return _refused(request, refusal(exc))
    except web.HTTPRequestEntityTooLarge:
        return _refused(request, HttpError(413, "request body too large"))


def _refused(request: web.Request, exc: HttpError) -> web.Response:
    response = web.Response(status=exc.status, text=exc.reason + "\n", headers=exc.headers)
    limits.close_unless_read(request, response)
    return response


async def _healthz(request: web.Request) -> web.Response:
    """Liveness for probes and units: 200 "ok", or 503 "degraded" while dangerous calls are being refused."""
    if not request.app[STATE].audit.healthy:
        return web.Response(status=503, text="degraded: the audit log cannot be written; dangerous calls are refused\n")
    return web.Response(text="ok\n")


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus metrics, for a scraper's token only (policies: [scrapers.NAME])."""
    state = request.app[STATE]
    state.generation.tokens.scraper(request.headers.get("Authorization"))
    limits.authenticated(request)
    if state.metrics_text is None:
        raise HttpError(503, "metrics are not wired in this server")
    return web.Response(body=(await state.metrics_text()).encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


def create_app(state: DaemonState) -> web.Application:
    """The application; `state.hosts`/`origins` are filled in once the listening port is known."""
    # The guard runs first, so a 408 or 429 from the limits reaches the client as a response too.
    app = web.Application(middlewares=[_guard, limits.middleware], client_max_size=state.settings.max_body_bytes)
    app[STATE] = state
    app[limits.CLIENT_LIMITER] = limits.ClientLimiter.from_settings(state.settings)
    app[auth.FAILED_LOGINS] = logins = auth.FailedLogins()
    state.metrics.add_gauges(logins.gauges)
    app.router.add_post(MCP_PATH, mcp_http.handle_post)
    app.router.add_get(MCP_PATH, mcp_http.handle_get)
    app.router.add_delete(MCP_PATH, mcp_http.handle_delete)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    if state.settings.approval_page:
        console.add_routes(app)
    return app
