"""The admin API on a unix socket: what `gatewayctl` talks to, both ends.

Owns the socket (path, file mode, group, refusing to start over a live daemon's socket and
replacing a stale one), who is calling (the peer's uid from SO_PEERCRED, named in logs and in
approval decisions), the admin routes (JSON over HTTP/1.1), and `AdminClient`, the one way the
command line reaches them. Access control is the socket file's permissions: mode 0600 by default,
so only the daemon's user and root. Nothing here is reachable on the public port.

Routes: GET /v1/status, POST /v1/reload, POST /v1/servers/{name}/restart, GET /v1/metrics,
GET /v1/approvals, POST /v1/approvals/{id}/approve (body {"allow_again_for": seconds} optional),
POST /v1/approvals/{id}/deny (body {"reason": "..."} optional), DELETE /v1/approvals/{id}/standing,
GET /v1/tools[?client=NAME] (the tools/list each client, or that one, gets), POST /v1/call (body {"client",
"method", "arguments"}: a direct call made as that client through Gateway.dispatch — policy, confirmation,
audit — recorded as made by the operator on the socket).
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gatewayd import __version__, approvals, calls, metrics
from gatewayd.errors import GatewayError
from gatewayd.jsonrpc import Request
from gatewayd.reloader import Reloader
from gatewayd.state import DaemonState
from gatewayd.web import answers
from gatewayd.web.keys import STATE

logger = logging.getLogger(__name__)

API = "/v1"
# Admin requests are tiny; anything bigger is a mistake.
MAX_BODY_BYTES = 64 * 1024
# gatewayctl waits this long for an answer: every admin verb answers at once.
CLIENT_TIMEOUT = 30.0
# The JSON-RPC id of a `gatewayctl call` (the audit log's request_id).
CALL_ID = "gatewayctl-call"
# Probing whether an existing socket belongs to a live daemon.
PROBE_TIMEOUT = 1.0

RELOADER = web.AppKey("reloader", Reloader)
STARTED = web.AppKey("started", float)


class AdminUnavailable(Exception):
    """gatewayctl cannot reach the daemon; the message says why and what to do."""


# -- server ----------------------------------------------------------------------------------


def create_app(state: DaemonState, reloader: Reloader) -> web.Application:
    """The admin application."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app[RELOADER] = reloader
    app[STARTED] = time.time()
    app.router.add_get(f"{API}/status", _status)
    app.router.add_post(f"{API}/reload", _reload)
    app.router.add_get(f"{API}/metrics", _metrics)
    app.router.add_post(API + "/servers/{name}/restart", _restart)
    app.router.add_get(f"{API}/approvals", _approvals)
    app.router.add_post(API + "/approvals/{id}/{verdict:approve|deny}", _decide)
    app.router.add_delete(API + "/approvals/{id}/standing", _revoke)
    app.router.add_get(f"{API}/tools", _tools)
    app.router.add_post(f"{API}/call", _call)
    return app


def prepare_socket(path: Path) -> None:
    """Make room for the socket: refuse if a live daemon answers on it, remove it if stale."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(f"admin socket path {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise OSError(f"another gatewayd is listening on the admin socket {path}")


def secure_socket(path: Path, mode: int, group: str) -> None:
    """Give the socket its mode and group. Called right after bind, which ran under a umask of 0177."""
    # chown only when it changes something: the unit's system-call filter refuses chown.
    if group and (gid := grp.getgrnam(group).gr_gid) != path.stat().st_gid:
        os.chown(path, -1, gid)
    os.chmod(path, mode)


def peer(request: web.Request) -> str:
    """Who is on the other end of the socket: 'uid 1000 (alice)'."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None:
        return "unknown peer"
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return "unknown peer"
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
    return f"uid {uid} ({name})"


async def _status(request: web.Request) -> web.Response:
    state = request.app[STATE]
    sessions, registry = state.sessions, state.approvals
    servers = {name: server.status() for name, server in sorted(state.generation.servers.items())}
    return web.json_response({
        "version": __version__, "pid": os.getpid(), "uptime_s": round(time.time() - request.app[STARTED], 3),
        "url": state.url,
        "config": await request.app[RELOADER].status(), "servers": servers,
        "retiring": [server.status() for server in state.pool.retiring],
        "sessions": len(sessions), "session_list": [session.view() for session in sessions.all()],
        # Open `subscriptions/listen` streams of MCP 2026-07-28 callers (listeners.py).
        "listeners": len(state.listeners),
        "pending_approvals": len(registry),
        # Tasks of MCP 2026-07-28 callers (modern_tasks.py).
        "tasks": state.modern_tasks.status(),
        "approvals": [approval.view() for approval in registry.pending()],
        "audit": state.audit.status(),
    })


async def _metrics(request: web.Request) -> web.Response:
    render = request.app[STATE].metrics_text
    if render is None:
        return web.Response(status=503, text="metrics are not wired\n")
    return web.Response(body=(await render()).encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


async def _reload(request: web.Request) -> web.Response:
    result = await request.app[RELOADER].reload(f"gatewayctl reload by {peer(request)}")
    return web.json_response(result.view(), status=200 if result.ok else 422)


async def _restart(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    server = request.app[STATE].generation.servers.get(name)
    if server is None:
        return web.json_response({"ok": False, "message": f"no tool server {name!r}"}, status=404)
    logger.info("server=%s restarted by %s", name, peer(request))
    try:
        await server.restart()
    except GatewayError as exc:
        return web.json_response({"ok": False, "message": exc.message}, status=502)
    return web.json_response({"ok": True, "message": f"{name} restarted", "server": server.status()})


async def _approvals(request: web.Request) -> web.Response:
    registry = request.app[STATE].approvals
    return web.json_response({"approvals": [approval.view() for approval in registry.pending()],
                              "standing": [item.view() for item in registry.standing()]})


async def _revoke(request: web.Request) -> web.Response:
    approval_id = request.match_info["id"]
    if not request.app[STATE].approvals.revoke(approval_id):
        return web.json_response({"ok": False, "message": f"no standing approval {approval_id!r}"}, status=404)
    logger.info("operator %s revoked standing approval %s", peer(request), approval_id)
    return web.json_response({"ok": True, "message": f"approval {approval_id} no longer allows anything again"})


async def _decide(request: web.Request) -> web.Response:
    approve = request.match_info["verdict"] == "approve"
    try:
        reason, again = approvals.parse_answer(await _body(request), approve=approve)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    by = f"operator {peer(request)} (gatewayctl)"
    answer = request.app[STATE].approvals.decide(
        request.match_info["id"], approve=approve, by=by, channel=approvals.CLI, reason=reason, allow_again_for=again)
    if answer.ok:
        logger.info("%s: %s", by, answer.message)
    status, body = answers.reported(answer)
    return web.json_response(body, status=status)


async def _tools(request: web.Request) -> web.Response:
    """What `tools/list` answers each client (or the one named), from the running config."""
    state = request.app[STATE]
    generation = state.generation
    names = sorted(generation.snapshot.clients)
    wanted = request.query.get("client")
    if wanted is not None:
        if wanted not in names:
            return web.json_response({"ok": False, "message": f"no client {wanted!r}"}, status=404)
        names = [wanted]
    listed: dict[str, Any] = {}
    for name in names:
        principal = generation.principal(name)
        if principal is not None:
            listed[name] = (await state.gateway.catalog.list_tools(principal, generation.servers))["tools"]
    return web.json_response({"ok": True, "clients": listed})


async def _call(request: web.Request) -> web.Response:
    """A direct call as a client, through the daemon's own pipeline; recorded as the operator's, on its behalf."""
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("client"), str) or not isinstance(body.get("method"), str):
        raise web.HTTPBadRequest(text='body must be {"client": NAME, "method": "server.method", "arguments": {...}}')
    state = request.app[STATE]
    generation = state.generation
    principal = generation.principal(body["client"])
    if principal is None:
        return web.json_response({"ok": False, "message": f"no client {body['client']!r}"}, status=404)
    by = f"operator {peer(request)} (gatewayctl call)"
    logger.info("%s calls %s as client %s", by, str(body["method"])[:200], principal.name)
    # No session and no stream: a call that needs confirmation waits for gatewayctl approve or the web page.
    ctx = calls.CallContext(principal, generation.servers, authority=state.principal, operator=by)
    answer = await state.gateway.dispatch(ctx, Request(CALL_ID, body["method"], body.get("arguments")))
    return web.json_response({"ok": "error" not in answer, "answer": answer})


async def _body(request: web.Request) -> Any:
    if not request.can_read_body:
        return None
    try:
        return await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text="body must be JSON: {\"reason\": \"...\"}") from exc


# -- client ----------------------------------------------------------------------------------


class AdminClient:
    """gatewayctl's side: one request to the daemon's admin socket, answered as (status, JSON body)."""

    def __init__(self, path: Path, timeout: float = CLIENT_TIMEOUT) -> None:
        self.path = path
        # `gatewayctl call` waits longer: its call may wait for a person's confirmation.
        self.timeout = timeout

    async def call(self, method: str, route: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Send one admin request; its status and JSON answer. Raises AdminUnavailable with a readable reason if
        the daemon is unreachable."""
        status, text = await self._request(method, route, body)
        with contextlib.suppress(ValueError):
            return status, json.loads(text)
        return status, {"ok": False, "message": text.strip()}

    async def text(self, route: str) -> tuple[int, str]:
        """GET a plain-text route (metrics)."""
        return await self._request("GET", route, None)

    async def _request(self, method: str, route: str, body: dict[str, Any] | None) -> tuple[int, str]:
        self._check_socket()
        connector = aiohttp.UnixConnector(path=str(self.path))
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                    session.request(method, f"http://gatewayd{API}{route}", json=body) as response:
                return response.status, await response.text()
        except aiohttp.ClientConnectorError as exc:
            raise AdminUnavailable(self._why(exc.os_error)) from exc
        except TimeoutError as exc:
            raise AdminUnavailable(f"gatewayd did not answer on {self.path} within {self.timeout:g}s") from exc

    def _check_socket(self) -> None:
        if not self.path.exists():
            raise AdminUnavailable(f"gatewayd is not running: no admin socket at {self.path} "
                                   "(start it, or pass --socket / set GATEWAYD_ADMIN_SOCKET)")

    def _why(self, error: OSError) -> str:
        if isinstance(error, PermissionError):
            return f"permission denied on {self.path}: run gatewayctl as the daemon's user or root"
        if isinstance(error, ConnectionRefusedError | FileNotFoundError):
            return f"gatewayd is not running: nothing listens on {self.path}"
        return f"cannot reach gatewayd on {self.path}: {error.strerror or error}"
