"""Scale targets (issue 20): gatewayd with many sessions and clients, many servers and tools, a large result.

Owns these targets, each its own daemon on an installed copy of the working tree, bounded in count and time,
loopback only, with its goal judged at the end:

- `sessions`: 1,000 open legacy MCP sessions, then 1,000 distinct clients (each its own token, added by a reload)
  making one stateless MCP 2026-07-28 `tools/call` each. Daemon RSS before and after; direct JSON calls/s and
  server CPU a call at 8 in flight against a second daemon that has the bench's one client alone, in alternating
  pairs (one measurement before and one after, in the same daemon, moved with the machine by more than the goal's
  10%). Goal: RSS ≤ 120 MB, calls/s with the sessions and clients within 10% of the one client's alone (median of
  the pairs' ratios).
- `tools`: 100 tool servers (plain JSON-RPC, 20 declared methods each: 2,000 tools, no child needed to list them).
  `tools/list` p50 (one page: the list page size is raised for it), `gatewayctl reload` of one changed file among
  100 (admin socket round trip), a new file callable after it is saved (the daemon watches its config), and direct
  calls/s at 8 in flight against a daemon with the echo server alone, in alternating pairs. Goals: p50 ≤ 5 ms,
  reload ≤ 100 ms, save → callable ≤ 0.5 s, per-call figures unchanged beyond the noise.
- `bare`: the same 100 servers exposed without a prefix (`prefix = ""`), the echo server last of them in name
  order, an MCP `tools/call` of `echo` (found by looking through the others first) at 8 in flight against a daemon
  with the echo server alone, alternating pairs: calls/s and server CPU a call. No goal of its own: the `tools`
  goal's "per-call figures unchanged" for tool names without a prefix.
- `resources`: 20 MCP servers listing 100 resources and 100 templates each (`bench/ressrv.py`, each server's
  templates its own), a `resources/read` of a listed URI and one of a URI only the last server's last template
  matches, at 8 in flight against a daemon with one such server alone, alternating pairs: calls/s and server CPU a
  call. No goal of its own: what finding a resource's server costs as servers, resources and templates grow.
- `children`: a child per MCP session (`isolation = "session"`), 100 sessions: each session's first call (which
  spawns its child) against its second, and the memory of the children and of the daemon. No goal in the issue:
  the figures are for sizing.
- `streaming`: 100 concurrent MCP `tools/call`s in one session, each streaming 100 progress notifications a second
  for 10 s (`bench/progsrv.py`, stamped with the wall time they were written; read by a process of their own,
  bench/streams.py), while direct calls run beside them, timed in this process: first 4 in flight, as many as
  answers allow (what the daemon has left over for them), then started at 500 a second whatever their answers take
  (`driver.run_paced`: what an ordinary client that is not filling the machine sees). Goals: none lost, p99
  notification latency ≤ 50 ms, the other calls' p99 ≤ 2× unloaded (each load against itself without the streams;
  the first is the one judged, as before). With them, how many cores the daemon,
  its children, the streams' reader and the other calls' driver kept busy meanwhile (the machine has 2), and a
  control: the other calls' p99 once more, with no streams, beside processes that only burn as much CPU as the
  load's own processes outside the daemon (the progress server, the streams' reader) did (bench/burner.py).
- `notifications`: the same streams with nothing beside them, and the daemon's CPU time per relayed notification
  (no goal: the figure that says what a streaming call costs, steadier than the other calls' p99).
- `payload`: a 10 MiB tool result (`bench/bigsrv.py`) relayed, against the same child read directly on its pipes;
  the daemon's peak RSS growth; a result over the child line limit (16 MiB) refused and the next call answered.
  Goals: rate ≥ 0.5× child-direct, peak growth ≤ 3× the payload. The other way (no goal): a 3 MiB argument of text
  lines (under the default 4 MiB body limit; newlines and quotes to escape, as code has) sent to the child, against
  the child sent it directly, and the daemon's CPU time a MiB of it.

Run: `.venv/bin/python -m bench.scale --targets sessions,tools,payload` (~2 min). Prints a table of figures and
goals; the record goes to `bench/results/scale-<stamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import aiohttp

from bench import wire
from bench.driver import (
    JsonTarget,
    LoadResult,
    ModernTarget,
    SseTarget,
    Target,
    client_session,
    run_load,
    run_paced,
)
from bench.procs import (
    ECHO_TOML,
    ROLE,
    ServerProcess,
    bench_env,
    cpu_seconds,
    daemon_argv,
    descendants,
    install_copy,
    status_kib,
    write_config,
)
from bench.run import RESULTS_DIR, save
from bench.streams import STREAM_RATE, STREAM_SECONDS
from gatewayd.admin import AdminClient
from gatewayd.tokens import hash_token, new_token

TARGETS: Final = ("sessions", "tools", "bare", "resources", "children", "streaming", "notifications", "payload")
KIB: Final = 1024
MB: Final = 1e6
# sessions
SESSIONS: Final = 1000
CLIENTS: Final = 1000
# Sessions and clients are opened this many at a time (one HTTP connection each).
OPENING_CONCURRENCY: Final = 16
LOAD_CONCURRENCY: Final = 8
LOAD_ROUNDS: Final = 3
LOAD_DURATION: Final = 2.0
LOAD_WARMUP: Final = 0.5
GOAL_SESSIONS_RSS_MB: Final = 120.0
GOAL_SESSIONS_SLOWDOWN: Final = 0.10
# Alternating pairs of loads: the daemon with the sessions and clients, and one with the bench's one client alone.
SESSION_PAIRS: Final = 6
# tools
SERVERS: Final = 100
TOOLS_PER_SERVER: Final = 20
LISTS: Final = 50
TOOL_PAIRS: Final = 3
# bare: servers exposed without a prefix, the called tool's server last of them in name order
BARE_PAIRS: Final = 4
# resources: MCP servers listing this many resources each (bench/ressrv.py)
RESOURCE_SERVERS: Final = 20
RESOURCES_EACH: Final = 100
RESSRV: Final = Path(__file__).resolve().parent / "ressrv.py"
GOAL_LIST_P50_MS: Final = 5.0
GOAL_RELOAD_MS: Final = 100.0
GOAL_SAVE_TO_CALLABLE_S: Final = 0.5
# Poll for the saved file's tool at this interval, at most this long (the goal is 0.5 s).
CALLABLE_POLL_S: Final = 0.01
CALLABLE_DEADLINE_S: Final = 10.0
# children
SESSION_CHILDREN: Final = 100
# streaming
STREAMS: Final = 100
OTHER_CONCURRENCY: Final = 4
# The other calls at a fixed rate: well under what the daemon answers with the streams going (~3,000 a second).
OTHER_RATE: Final = 500.0
PACED_UNLOADED_S: Final = 3.0
# Of the streams' 10 s, after a 1 s warm-up: the other calls in flight for this long, then paced for as long.
LOADED_EACH_S: Final = (STREAM_SECONDS - 3) / 2
GOAL_NOTIFICATION_P99_MS: Final = 50.0
GOAL_OTHER_P99_RATIO: Final = 2.0
PROGSRV: Final = Path(__file__).resolve().parent / "progsrv.py"
# payload
PAYLOAD_BYTES: Final = 10 * 1024 * 1024
PAYLOAD_CALLS: Final = 5
CHILD_LINE_LIMIT: Final = 16 * 1024 * 1024
GOAL_PAYLOAD_RATE: Final = 0.5
GOAL_PAYLOAD_GROWTH: Final = 3.0
# A large argument: under the default max_body_bytes (4 MiB), lines of text with something to escape in each.
ARGUMENT_BYTES: Final = 3 * 1024 * 1024
ARGUMENT_LINE: Final = 'for item in items: print("lorem ipsum dolor sit amet", item)\n'
# An answer over the child's line limit is refused "cleanly" when the caller hears of it well before its call's
# timeout (30 s by default) would have told it.
OVER_LIMIT_PROMPT_S: Final = 5.0
BIGSRV: Final = Path(__file__).resolve().parent / "bigsrv.py"
# Where `python -m bench.streams` is run from.
CHECKOUT: Final = Path(__file__).resolve().parent.parent
# One large answer may take a while on a loaded machine.
LARGE_CALL_TIMEOUT: Final = 60.0


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    return status_kib(pid, field) * KIB / MB


def _daemon(config_dir: Path, python: Path, *extra: str) -> ServerProcess:
    return ServerProcess("gatewayd", daemon_argv(config_dir, list(extra), python=python), env=bench_env(python=python),
                         cwd=config_dir)


async def _calls_per_s(target: JsonTarget) -> float:
    return (await _load(target))[0]


async def _load(target: Target) -> tuple[float, float]:
    """Median calls/s and server CPU µs a call at LOAD_CONCURRENCY in flight over LOAD_ROUNDS rounds."""
    rounds = [await run_load(target, LOAD_CONCURRENCY, LOAD_DURATION, LOAD_WARMUP) for _ in range(LOAD_ROUNDS)]
    if any(r.errors for r in rounds):
        raise RuntimeError(f"errors under load: {[r.errors for r in rounds]}")
    return (statistics.median(r.calls_per_s for r in rounds),
            statistics.median(r.server_cpu_us_per_call for r in rounds))


# One load's calls/s and server CPU µs a call, by side ("one": the daemon with one client or server, "many").
Pair = dict[str, tuple[float, float]]


@contextlib.asynccontextmanager
async def _daemons(python: Path, configs: dict[str, tuple[Path, str]],
                   *extra: str) -> AsyncIterator[dict[str, tuple[ServerProcess, str, str]]]:
    """A daemon on each written config (name → its directory and client token), started in order: name → (daemon,
    URL, token). Every one started is stopped at the end."""
    started: dict[str, tuple[ServerProcess, str, str]] = {}
    try:
        for name, (config_dir, token) in configs.items():
            daemon = _daemon(config_dir, python, *extra)
            started[name] = (daemon, await daemon.start(), token)
        yield started
    finally:
        for daemon, _, _ in started.values():
            await daemon.stop()


async def _alternating(one: Target, many: Target, count: int) -> list[Pair]:
    """`count` pairs of loads (`_load`) of the two targets, the order flipped every pair, so that a slow phase of the
    machine hits both alike."""
    pairs = []
    for pair in range(count):
        order = (("one", one), ("many", many)) if pair % 2 == 0 else (("many", many), ("one", one))
        pairs.append({name: await _load(target) for name, target in order})
    return pairs


def _paired(pairs: list[Pair]) -> dict[str, Any]:
    """The record of alternating pairs: each load's figures, and the medians of the pairs' many ÷ one."""
    return {
        "pairs": [{name: {"calls_per_s": round(rate), "server_cpu_us_per_call": round(cpu)}
                   for name, (rate, cpu) in pair.items()} for pair in pairs],
        "calls_per_s_many_over_one": round(statistics.median(p["many"][0] / p["one"][0] for p in pairs), 3),
        "server_cpu_many_over_one": round(statistics.median(p["many"][1] / p["one"][1] for p in pairs), 3),
    }


# -- sessions and clients ------------------------------------------------------------------------


def _add_clients(config_dir: Path, count: int) -> list[str]:
    """`count` more clients, each with its own token, in one file (written once: 1,000 edits would take long)."""
    tokens = [new_token() for _ in range(count)]
    lines = [f'[clients.scale{index}]\ntoken_sha256 = "{hash_token(token)}"\nroles = ["{ROLE}"]\n'
             for index, token in enumerate(tokens)]
    (config_dir / "policies" / "scale-clients.toml").write_text("\n".join(lines))
    return tokens


async def _bounded(jobs: list[Any], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> None:
        async with gate:
            await job

    await asyncio.gather(*(one(job) for job in jobs))


async def sessions(root: Path, python: Path) -> dict[str, Any]:
    alone_dir, config_dir = root / "sessions-alone", root / "sessions"
    configs = {"one": (alone_dir, write_config(alone_dir)), "many": (config_dir, write_config(config_dir))}
    limits = (f"--max-sessions={SESSIONS + 16}", f"--max-sessions-per-client={SESSIONS + 16}")
    async with _daemons(python, configs, *limits) as started, client_session(OPENING_CONCURRENCY) as http:
        alone, direct = (JsonTarget(name, http, url, token, daemon.pid)
                         for name, (daemon, url, token) in (("alone", started["one"]), ("direct", started["many"])))
        for target in (alone, direct):
            await target.call()
        daemon, url, token = started["many"]
        tokens = _add_clients(config_dir, CLIENTS)
        status, result = await AdminClient(config_dir / "gatewayd.sock").call("POST", "/reload")
        if status != 200:
            raise RuntimeError(f"reload failed: {result}")
        rss_before = _rss_mb(daemon.pid)
        opened = [SseTarget("sse", http, url, token, daemon.pid) for _ in range(SESSIONS)]
        begun = time.perf_counter()
        await _bounded([target.open_session() for target in opened], OPENING_CONCURRENCY)
        sessions_s = time.perf_counter() - begun
        rss_sessions = _rss_mb(daemon.pid)
        begun = time.perf_counter()
        await _bounded([ModernTarget("modern", http, url, each, daemon.pid).call() for each in tokens],
                       OPENING_CONCURRENCY)
        clients_s = time.perf_counter() - begun
        rss_after = _rss_mb(daemon.pid)
        pairs = await _alternating(alone, direct, SESSION_PAIRS)
        # Every session still answers: one call on the first and the last.
        for session in (opened[0], opened[-1]):
            await session.call()
    calls = _paired(pairs)
    return {
        "sessions": SESSIONS, "clients": CLIENTS, "open_sessions_s": round(sessions_s, 3),
        "first_calls_of_clients_s": round(clients_s, 3),
        "rss_mb": {"before": round(rss_before, 1), "with_sessions": round(rss_sessions, 1),
                   "with_sessions_and_clients": round(rss_after, 1)},
        "calls_at_8": calls,
        "goals": {"rss_at_most_120MB": rss_after <= GOAL_SESSIONS_RSS_MB,
                  "calls_within_10_percent": calls["calls_per_s_many_over_one"] >= 1 - GOAL_SESSIONS_SLOWDOWN},
    }


# -- many servers and tools ----------------------------------------------------------------------


def _server_toml(index: int) -> str:
    methods = "".join(f'\n[methods.m{method:02d}]\ndescription = "method {method} of server {index}"\n'
                      f'input_schema = {{ type = "object", properties = {{ x = {{ type = "integer" }} }} }}\n'
                      for method in range(TOOLS_PER_SERVER))
    # Each server runs the calc child, which answers only `echo` among these: listing needs no child at all.
    return 'command = ["python3", "-m", "gatewayd.examples.calc"]\nprotocol = "jsonrpc"\n' + methods


def _many_servers(config_dir: Path) -> None:
    for index in range(SERVERS):
        (config_dir / "tools.d" / f"s{index:03d}.toml").write_text(_server_toml(index))
    (config_dir / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["*.*"]\n')


async def _list_ms(http: aiohttp.ClientSession, url: str, session: SseTarget) -> tuple[float, int]:
    body = wire.compact(wire.request("tools/list", {}))
    started = time.perf_counter()
    async with http.post(url, data=body, headers=session.headers) as response:
        raw = await response.read()
    took = (time.perf_counter() - started) * 1000
    message = wire.response_of(raw, response.content_type)
    result = message["result"]
    if "nextCursor" in result:
        raise RuntimeError("tools/list came in pages: raise --list-page-size")
    return took, len(result["tools"])


async def _callable_after_save(http: aiohttp.ClientSession, url: str, token: str, config_dir: Path) -> float:
    """Save a new server's file; seconds until its method answers (the calc child's `echo`)."""
    (config_dir / "tools.d" / "fresh.toml").write_text(ECHO_TOML)
    saved = time.perf_counter()
    body = wire.compact(wire.request("fresh.echo", wire.ECHO_PARAMS))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": wire.ACCEPT_JSON}
    while time.perf_counter() - saved < CALLABLE_DEADLINE_S:
        async with http.post(url, data=body, headers=headers) as response:
            answer = json.loads(await response.read())
        if answer.get("result") == wire.ECHO_PARAMS:
            return time.perf_counter() - saved
        await asyncio.sleep(CALLABLE_POLL_S)  # polling the daemon for the new file's tool, bounded above
    raise RuntimeError(f"the saved file was not callable within {CALLABLE_DEADLINE_S:g} s")


async def tools(root: Path, python: Path) -> dict[str, Any]:
    small_dir, large_dir = root / "one-server", root / "many-servers"
    small_token = write_config(small_dir)
    token = write_config(large_dir)
    _many_servers(large_dir)
    large = _daemon(large_dir, python, f"--list-page-size={SERVERS * TOOLS_PER_SERVER + 100}")
    small = _daemon(small_dir, python)
    large_url, small_url = await large.start(), await small.start()
    try:
        async with client_session(LOAD_CONCURRENCY) as http:
            session = SseTarget("sse", http, large_url, token, large.pid)
            await session.open_session()
            listed = [await _list_ms(http, large_url, session) for _ in range(LISTS)]
            counts = {count for _, count in listed}
            list_ms = sorted(ms for ms, _ in listed)
            # One changed file among 100, applied through the admin socket (as `gatewayctl reload` does).
            (large_dir / "tools.d" / "s000.toml").write_text(_server_toml(0).replace("method 0 ", "method zero "))
            admin = AdminClient(large_dir / "gatewayd.sock")
            started = time.perf_counter()
            status, result = await admin.call("POST", "/reload")
            reload_ms = (time.perf_counter() - started) * 1000
            if status != 200:
                raise RuntimeError(f"reload failed: {result}")
            callable_s = await _callable_after_save(http, large_url, token, large_dir)
            pairs = []
            for pair in range(TOOL_PAIRS):
                order = [("one", small_url, small_token, small.pid), ("many", large_url, token, large.pid)]
                figures: dict[str, float] = {}
                for name, url, each, pid in order if pair % 2 == 0 else order[::-1]:
                    figures[name] = await _calls_per_s(JsonTarget(name, http, url, each, pid))
                pairs.append(figures)
    finally:
        await large.stop()
        await small.stop()
    ratio = statistics.median(p["many"] / p["one"] for p in pairs)
    p50 = statistics.median(list_ms)
    return {
        "servers": SERVERS, "tools": SERVERS * TOOLS_PER_SERVER, "listed": sorted(counts),
        "tools_list_ms": {"p50": round(p50, 2), "max": round(list_ms[-1], 2), "n": LISTS},
        "reload_one_of_100_ms": round(reload_ms, 1), "save_to_callable_s": round(callable_s, 3),
        "calls_per_s_at_8": {"pairs": pairs, "many_over_one_median": round(ratio, 3)},
        "goals": {"list_p50_at_most_5ms": p50 <= GOAL_LIST_P50_MS, "reload_at_most_100ms": reload_ms <= GOAL_RELOAD_MS,
                  "save_to_callable_at_most_0.5s": callable_s <= GOAL_SAVE_TO_CALLABLE_S},
    }


def _bare_config(config_dir: Path, others: int) -> str:
    """The echo server exposed without a prefix, after `others` such servers (their children never started): the
    token."""
    token = write_config(config_dir)
    (config_dir / "tools.d" / "echo.toml").write_text(
        ECHO_TOML.replace('protocol = "jsonrpc"\n', 'protocol = "jsonrpc"\nprefix = ""\n'))
    for index in range(others):  # named a…, before echo
        (config_dir / "tools.d" / f"a{index:03d}.toml").write_text(
            f'command = ["python3", "-m", "gatewayd.examples.calc"]\nprotocol = "jsonrpc"\nprefix = ""\n'
            f'[methods.b{index:03d}]\n')
    (config_dir / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["*.*"]\n')
    return token


async def bare(root: Path, python: Path) -> dict[str, Any]:
    configs = {name: (root / f"bare-{name}", _bare_config(root / f"bare-{name}", others))
               for name, others in (("one", 0), ("many", SERVERS - 1))}
    async with _daemons(python, configs) as started, client_session(LOAD_CONCURRENCY) as http:
        targets = []
        for name, (daemon, url, token) in started.items():
            target = SseTarget(name, http, url, token, daemon.pid)
            target.body = wire.compact(wire.request("tools/call", {"name": wire.CHILD_METHOD,
                                                                   "arguments": wire.ECHO_PARAMS}))
            await target.open_session()
            await target.call()  # starts the echo child
            targets.append(target)
        one, many = targets
        pairs = await _alternating(one, many, BARE_PAIRS)
    return {"servers_before_it": SERVERS - 1, **_paired(pairs)}


class _ReadTarget(SseTarget):
    """`resources/read` of `uri` in one 2025-11-25 session; the answer must carry that resource."""

    def __init__(self, name: str, http: aiohttp.ClientSession, url: str, token: str, server_pid: int,
                 uri: str) -> None:
        super().__init__(name, http, url, token, server_pid)
        self.uri = uri
        self.body = wire.compact(wire.request("resources/read", {"uri": uri}))

    async def call(self) -> None:
        async with self.http.post(self.url, data=self.body, headers=self.headers) as response:
            raw = await response.read()
        message = wire.response_of(raw, response.content_type)
        contents = message.get("result", {}).get("contents") if isinstance(message, dict) else None
        if not contents or contents[0].get("uri") != self.uri:
            raise wire.BadAnswer(f"unexpected resources/read answer: {str(message)[:200]}")


def _resources_config(config_dir: Path, servers: int) -> str:
    """`servers` resource servers (r00, r01, …), each listing RESOURCES_EACH resources and as many templates of its
    own scheme (t00, t01, …): the token."""
    token = write_config(config_dir)
    for index in range(servers):
        (config_dir / "tools.d" / f"r{index:02d}.toml").write_text(
            f'command = ["python3", "{RESSRV}"]\n'
            f'env = {{ RESSRV_ITEMS = "{RESOURCES_EACH}", RESSRV_SCHEME = "t{index:02d}" }}\n')
    (config_dir / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["*.*"]\n')
    return token


async def resources(root: Path, python: Path) -> dict[str, Any]:
    configs = {name: (root / f"resources-{name}", _resources_config(root / f"resources-{name}", count))
               for name, count in (("one", 1), ("many", RESOURCE_SERVERS))}
    record: dict[str, Any] = {"servers": RESOURCE_SERVERS, "resources_each": RESOURCES_EACH,
                              "templates_each": RESOURCES_EACH}
    async with _daemons(python, configs) as started, client_session(LOAD_CONCURRENCY) as http:
        targets: dict[str, list[_ReadTarget]] = {"listed": [], "templated": []}
        for name, (daemon, url, token) in started.items():
            last = RESOURCE_SERVERS - 1 if name == "many" else 0
            # Every server lists the same URIs: the first in name order owns them. A templated URI only the last
            # server's last template matches is looked for in every server's lists first.
            for kind, uri in (("listed", f"res://item/{RESOURCES_EACH - 1}"),
                              ("templated", f"t{last:02d}://kind{RESOURCES_EACH - 1}/42")):
                target = _ReadTarget(name, http, url, token, daemon.pid, uri)
                await target.open_session()
                await target.call()  # starts the children and reads their lists
                targets[kind].append(target)
        for kind, (one, many) in targets.items():
            record[kind] = _paired(await _alternating(one, many, BARE_PAIRS))
    return record


# -- a child per session -------------------------------------------------------------------------


async def children(root: Path, python: Path) -> dict[str, Any]:
    config_dir = root / "children"
    token = write_config(config_dir)
    (config_dir / "tools.d" / "echo.toml").write_text(ECHO_TOML.replace(
        'protocol = "jsonrpc"\n', f'protocol = "jsonrpc"\nisolation = "session"\nmax_children = {SESSION_CHILDREN}\n'
        f'max_children_per_client = {SESSION_CHILDREN}\n'))
    daemon = _daemon(config_dir, python, f"--max-sessions-per-client={SESSION_CHILDREN + 16}",
                     f"--max-isolated-children={SESSION_CHILDREN + 16}")
    url = await daemon.start()
    try:
        async with client_session(1) as http:
            sessions = [SseTarget("sse", http, url, token, daemon.pid) for _ in range(SESSION_CHILDREN)]
            for session in sessions:
                await session.open_session()
            rss_before = _rss_mb(daemon.pid)
            first, second = [], []
            for session in sessions:  # one at a time: each first call's spawn is timed alone
                started = time.perf_counter()
                await session.call()
                first.append(time.perf_counter() - started)
                started = time.perf_counter()
                await session.call()
                second.append(time.perf_counter() - started)
            kids = descendants(daemon.pid)
            children_mb = sum(_rss_mb(pid) for pid in kids)
            rss_after = _rss_mb(daemon.pid)
            threads = status_kib(daemon.pid, "Threads")
    finally:
        await daemon.stop()
    return {
        "sessions": SESSION_CHILDREN, "children_running": len(kids),
        "first_call_ms_p50": round(statistics.median(first) * 1000, 1),
        "second_call_ms_p50": round(statistics.median(second) * 1000, 2),
        "spawn_cost_ms_p50": round((statistics.median(first) - statistics.median(second)) * 1000, 1),
        "child_rss_mb_each": round(children_mb / max(len(kids), 1), 1),
        "daemon_rss_mb": {"before": round(rss_before, 1), "after": round(rss_after, 1),
                          "per_child": round((rss_after - rss_before) / SESSION_CHILDREN, 3)},
        "daemon_threads_with_children": threads,
    }


# -- streaming calls -------------------------------------------------------------------------------


async def _streams_process(url: str, token: str, session: SseTarget) -> asyncio.subprocess.Process:
    """The streams, in a process of their own (bench/streams.py), once every one of them has begun."""
    session_id = session.headers[wire.SESSION_HEADER]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.streams", url, token, session_id, str(STREAMS),
        stdout=asyncio.subprocess.PIPE, cwd=CHECKOUT)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), STREAM_SECONDS)
    if line.strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"the streams did not begin: {line[:200]!r}")
    return proc


def streaming_config(config_dir: Path) -> str:
    """The echo server and the progress server, room for every stream and the other calls; the client's token."""
    token = write_config(config_dir)
    (config_dir / "tools.d" / "prog.toml").write_text(
        f'command = ["python3", "{PROGSRV}"]\nprotocol = "mcp"\ncall_timeout = "{int(STREAM_SECONDS * 6)}s"\n'
        f'max_in_flight = {STREAMS + OTHER_CONCURRENCY}\nmax_in_flight_per_client = {STREAMS + OTHER_CONCURRENCY}\n')
    (config_dir / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["echo.*", "prog.*"]\n')
    return token


async def notifications(root: Path, python: Path) -> dict[str, Any]:
    """The daemon's CPU per relayed progress notification: the streaming target's streams with nothing beside them,
    the daemon's CPU time from the moment every stream has begun to the last one's end."""
    config_dir = root / "notifications"
    token = streaming_config(config_dir)
    daemon = _daemon(config_dir, python)
    url = await daemon.start()
    try:
        async with client_session(4) as http:
            session = SseTarget("sse", http, url, token, daemon.pid)
            await session.open_session()
            streams = await _streams_process(url, token, session)
            before = cpu_seconds([daemon.pid])
            out, _ = await asyncio.wait_for(streams.communicate(), STREAM_SECONDS * 6)
            spent = cpu_seconds([daemon.pid]) - before
    finally:
        await daemon.stop()
    received = sum(each["received"] for each in json.loads(out))
    return {"streams": STREAMS, "rate_each": STREAM_RATE, "seconds": STREAM_SECONDS, "received": received,
            "daemon_cpu_s": round(spent, 3),
            "daemon_cpu_us_per_notification": round(spent / received * 1e6, 1) if received else None}


def _children_by_role(daemon_pid: int) -> dict[str, list[int]]:
    """The daemon's children: the progress server (part of the load) and the echo server (the other calls')."""
    roles: dict[str, list[int]] = {"progress_server": [], "echo_server": []}
    for pid in descendants(daemon_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        roles["progress_server" if PROGSRV.name.encode() in command else "echo_server"].append(pid)
    return roles


async def _beside_burners(direct: JsonTarget, shares: list[float]) -> LoadResult:
    """The other calls beside processes that only burn CPU, each as much of a core as one of the streaming load's
    processes outside the daemon used (no streams): what that load costs the other calls by taking cores alone."""
    burners: list[asyncio.subprocess.Process] = []
    try:
        # One at a time, so that each one started is stopped below even if a later one fails to start; each also
        # ends by itself soon after the load, should this process be gone before it can stop them.
        for share in shares:
            burners.append(await asyncio.create_subprocess_exec(  # noqa: PERF401
                sys.executable, "-m", "bench.burner", f"{share:.3f}", str(STREAM_SECONDS * 2), cwd=CHECKOUT))
        return await run_load(direct, OTHER_CONCURRENCY, STREAM_SECONDS - 3, 1.0)
    finally:
        for burner in burners:
            burner.kill()
            await burner.wait()


def _cpu_by_process(processes: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each group of processes, and of this one (the other calls' driver)."""
    spent = {name: cpu_seconds(pids) for name, pids in processes.items()}
    own = os.times()
    return {**spent, "driver": own.user + own.system}


def _cores_busy(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """How many of the machine's cores each process kept busy: whether the daemon under test had the CPU to itself."""
    busy = {name: round((after[name] - before[name]) / seconds, 2) for name in before}
    return {**busy, "total": round(sum(busy.values()), 2)}


async def streaming(root: Path, python: Path) -> dict[str, Any]:
    """100 streaming calls, and other calls beside them (see the module's docstring)."""
    config_dir = root / "streaming"
    token = streaming_config(config_dir)
    daemon = _daemon(config_dir, python)
    url = await daemon.start()
    try:
        async with client_session(STREAMS + OTHER_CONCURRENCY + 4) as http:
            direct = JsonTarget("direct", http, url, token, daemon.pid)
            await direct.call()
            unloaded = await run_load(direct, OTHER_CONCURRENCY, LOAD_DURATION, LOAD_WARMUP)
            unloaded_paced = await run_paced(direct, OTHER_RATE, PACED_UNLOADED_S, LOAD_WARMUP)
            session = SseTarget("sse", http, url, token, daemon.pid)
            await session.open_session()
            streams = await _streams_process(url, token, session)
            processes = {"daemon": [daemon.pid], **_children_by_role(daemon.pid), "streams": [streams.pid]}
            before, started = _cpu_by_process(processes), time.monotonic()
            # The other calls run while every stream is going, timed in this process alone.
            loaded = await run_load(direct, OTHER_CONCURRENCY, LOADED_EACH_S, 1.0)
            loaded_paced = await run_paced(direct, OTHER_RATE, LOADED_EACH_S, 0.0)
            cores = _cores_busy(before, _cpu_by_process(processes), time.monotonic() - started)
            out, _ = await asyncio.wait_for(streams.communicate(), STREAM_SECONDS * 6)
            results = json.loads(out)
            beside_burners = await _beside_burners(direct, [cores["progress_server"], cores["streams"]])
    finally:
        await daemon.stop()
    latencies = sorted(ms for each in results for ms in each["latencies"])
    received = sum(each["received"] for each in results)
    expected = STREAMS * int(STREAM_RATE * STREAM_SECONDS)
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("inf")
    ratio = loaded.p99_ms / unloaded.p99_ms if unloaded.p99_ms else float("inf")
    paced_ratio = loaded_paced.p99_ms / unloaded_paced.p99_ms if unloaded_paced.p99_ms else float("inf")
    return {
        "streams": STREAMS, "rate_each": STREAM_RATE, "seconds": STREAM_SECONDS,
        "notifications": {"expected": expected, "received": received, "results": sum(each["done"] for each in results),
                          "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
                          "p99_ms": round(p99, 1)},
        "other_calls": {"unloaded_p99_ms": round(unloaded.p99_ms, 2), "loaded_p99_ms": round(loaded.p99_ms, 2),
                        "ratio": round(ratio, 2), "loaded_calls_per_s": round(loaded.calls_per_s),
                        "errors": loaded.errors + beside_burners.errors,
                        "beside_burners_p99_ms": round(beside_burners.p99_ms, 2),
                        "beside_burners_ratio": round(beside_burners.p99_ms / unloaded.p99_ms, 2)
                        if unloaded.p99_ms else None},
        "other_calls_paced": {"rate": OTHER_RATE, "unloaded_p99_ms": round(unloaded_paced.p99_ms, 2),
                              "loaded_p99_ms": round(loaded_paced.p99_ms, 2), "ratio": round(paced_ratio, 2),
                              "unloaded_p50_ms": round(unloaded_paced.p50_ms, 2),
                              "loaded_p50_ms": round(loaded_paced.p50_ms, 2),
                              "loaded_calls_per_s": round(loaded_paced.calls_per_s),
                              "errors": unloaded_paced.errors + loaded_paced.errors},
        "cores_busy": cores,
        "goals": {"none_lost": received == expected, "notification_p99_at_most_50ms": p99 <= GOAL_NOTIFICATION_P99_MS,
                  "other_p99_at_most_2x": ratio <= GOAL_OTHER_P99_RATIO,
                  "paced_other_p99_at_most_2x": paced_ratio <= GOAL_OTHER_P99_RATIO},
    }


# -- a large result --------------------------------------------------------------------------------


async def _child_direct_s(python: Path, method: str, params: dict[str, Any],
                          answered: Callable[[Any], bool]) -> float:
    """Median seconds per `method` call of bigsrv, written to its stdin and read from its stdout directly; each
    answer's result must pass `answered`."""
    proc = await asyncio.create_subprocess_exec(str(python), str(BIGSRV), stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, limit=CHILD_LINE_LIMIT)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        times = []
        for call in range(PAYLOAD_CALLS + 1):
            started = time.perf_counter()
            proc.stdin.write(wire.compact(wire.request(method, params, call + 1)) + b"\n")
            line = await asyncio.wait_for(proc.stdout.readline(), LARGE_CALL_TIMEOUT)
            if not answered(json.loads(line)["result"]):
                raise RuntimeError(f"the child answered {method} short")
            if call:  # the first one warms up
                times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), LARGE_CALL_TIMEOUT)


def _argument_text() -> str:
    return (ARGUMENT_LINE * (ARGUMENT_BYTES // len(ARGUMENT_LINE) + 1))[:ARGUMENT_BYTES]


async def _take_through(http: aiohttp.ClientSession, url: str, token: str, daemon_pid: int,
                        text: str) -> tuple[float, float]:
    """Median seconds per `take` of `text` through the daemon, and the daemon's CPU seconds per call."""
    body = wire.compact(wire.request("big.take", {"text": text}))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": wire.ACCEPT_JSON}
    times = []
    cpu_before = cpu_seconds([daemon_pid])
    for _ in range(PAYLOAD_CALLS):
        started = time.perf_counter()
        async with http.post(url, data=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=LARGE_CALL_TIMEOUT)) as response:
            answer = json.loads(await response.read())
        times.append(time.perf_counter() - started)
        if answer.get("result") != {"chars": len(text)}:
            raise RuntimeError(f"unexpected answer: {str(answer)[:200]}")
    return statistics.median(times), (cpu_seconds([daemon_pid]) - cpu_before) / PAYLOAD_CALLS


async def _blob(http: aiohttp.ClientSession, url: str, token: str, size: int) -> dict[str, Any]:
    body = wire.compact(wire.request("big.blob", {"bytes": size}))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": wire.ACCEPT_JSON}
    async with http.post(url, data=body, headers=headers,
                         timeout=aiohttp.ClientTimeout(total=LARGE_CALL_TIMEOUT)) as response:
        answer: dict[str, Any] = json.loads(await response.read())
        return answer


async def payload(root: Path, python: Path) -> dict[str, Any]:
    config_dir = root / "payload"
    token = write_config(config_dir)
    (config_dir / "tools.d" / "big.toml").write_text(
        f'command = ["python3", "{BIGSRV}"]\nprotocol = "jsonrpc"\n[methods.blob]\n[methods.take]\n')
    (config_dir / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["echo.*", "big.*"]\n')
    direct_s = await _child_direct_s(python, "blob", {"bytes": PAYLOAD_BYTES},
                                     lambda result: len(result["text"]) == PAYLOAD_BYTES)
    text = _argument_text()
    take_direct_s = await _child_direct_s(python, "take", {"text": text},
                                          lambda result: result["chars"] == len(text))
    daemon = _daemon(config_dir, python)
    url = await daemon.start()
    try:
        async with client_session(1) as http:
            small = await _blob(http, url, token, 1)  # starts the child
            if small.get("result") != {"text": "x"}:
                raise RuntimeError(f"unexpected answer: {small}")
            idle = _rss_mb(daemon.pid)
            times = []
            for _ in range(PAYLOAD_CALLS):
                started = time.perf_counter()
                answer = await _blob(http, url, token, PAYLOAD_BYTES)
                times.append(time.perf_counter() - started)
                if len(answer["result"]["text"]) != PAYLOAD_BYTES:
                    raise RuntimeError("short answer through the daemon")
            peak = _rss_mb(daemon.pid, "VmHWM")
            started = time.perf_counter()
            over = await _blob(http, url, token, CHILD_LINE_LIMIT + 1)
            over_s = time.perf_counter() - started
            after = await _blob(http, url, token, 1)
            take_s, take_cpu_s = await _take_through(http, url, token, daemon.pid, text)
    finally:
        await daemon.stop()
    gateway_s = statistics.median(times)
    growth = peak - idle
    return {
        "payload_mib": PAYLOAD_BYTES / KIB / KIB,
        "child_direct_s": round(direct_s, 4), "through_gatewayd_s": round(gateway_s, 4),
        "rate_ratio": round(direct_s / gateway_s, 3),
        "rss_mb": {"idle": round(idle, 1), "peak": round(peak, 1), "growth_over_payload": round(
            growth * MB / PAYLOAD_BYTES, 2)},
        "over_line_limit": over.get("error"), "over_line_limit_answered_after_s": round(over_s, 2),
        "next_call_answered": after.get("result") == {"text": "x"},
        "argument": {"mib": round(ARGUMENT_BYTES / KIB / KIB, 1), "child_direct_s": round(take_direct_s, 4),
                     "through_gatewayd_s": round(take_s, 4), "rate_ratio": round(take_direct_s / take_s, 3),
                     "daemon_cpu_ms_per_mib": round(take_cpu_s * 1000 / (ARGUMENT_BYTES / KIB / KIB), 2)},
        "goals": {"rate_at_least_half_child_direct": direct_s / gateway_s >= GOAL_PAYLOAD_RATE,
                  "peak_growth_at_most_3x_payload": growth * MB <= GOAL_PAYLOAD_GROWTH * PAYLOAD_BYTES,
                  # Cleanly: an error of its own, not the call's timeout, and the next call answered.
                  "over_limit_refused_cleanly": "error" in over and over_s < OVER_LIMIT_PROMPT_S
                  and after.get("result") == {"text": "x"}},
    }


RUNNERS: Final = {"sessions": sessions, "tools": tools, "bare": bare, "resources": resources, "children": children,
                  "streaming": streaming, "notifications": notifications, "payload": payload}


async def run(targets: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gatewayd-scale-") as tmp:
        root = Path(tmp)
        python = install_copy(root / "install")
        for name in targets:
            print(f"{name} …", file=sys.stderr, flush=True)
            record[name] = await RUNNERS[name](root, python)
            print(json.dumps({name: record[name]}, indent=1), flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"some of {', '.join(TARGETS)}")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)
    targets = [name for name in args.targets.split(",") if name]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    record = asyncio.run(run(targets))
    print(f"raw results: {save(record, args.results_dir, prefix='scale-')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
