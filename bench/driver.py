"""The load driver and the call targets it drives.

Owns: keeping N calls in flight for a fixed time and measuring them (`run_load`: calls/s,
latency percentiles, CPU of the driver and of the server side), starting calls at a fixed rate
whatever their answers take (`run_paced`: what an ordinary client that is not trying to fill the
machine sees), and one `Target` per way of
calling echo — JSON over HTTP (the floor and gatewayd's direct `echo.echo`), MCP `tools/call`
answered as SSE (with its session), and the calc child over its stdio pipe. Every HTTP client
is aiohttp; every call has a deadline. The same driver measures every target, so the ratios
are fair even where the driver itself is the bottleneck.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import aiohttp

from bench import wire
from bench.procs import cpu_seconds, tree

# A call that takes longer than this is an error, not a latency sample.
CALL_TIMEOUT = 10.0
# Longest line the stdio target accepts from the child.
MAX_LINE_BYTES = 1024 * 1024
# Time for the child to exit after its stdin closes, before it is killed.
CHILD_EXIT_DEADLINE = 5.0
# First error messages kept per measurement.
ERRORS_KEPT = 3
# Calls a paced load lets be in flight at once before it counts the next one due as not made.
PACED_MAX_IN_FLIGHT = 64
MS = 1000.0
US = 1_000_000.0


class Target(Protocol):
    """One way of calling echo: `call()` makes one call and raises if the answer is wrong."""

    name: str

    async def call(self) -> None: ...

    def server_pids(self) -> list[int]:
        """The processes doing the serving, for CPU accounting."""
        ...


@dataclass
class LoadResult:
    """One measurement: one target at one concurrency for `seconds`."""

    target: str
    concurrency: int
    calls: int
    errors: int
    seconds: float
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    driver_cpu_us_per_call: float
    server_cpu_us_per_call: float
    first_errors: list[str]
    # Calls started a second (run_paced); None: as many as `concurrency` in flight allowed (run_load).
    rate: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, round(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class _Measure:
    """What one load measures: the calls started from `measure_from` on, their latencies and errors, and the
    driver's and the server side's CPU from the first of them."""

    def __init__(self, target: Target, measure_from: float) -> None:
        self.target = target
        self.measure_from = measure_from
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.error_count = 0
        self.pids = target.server_pids()
        self.marks: dict[str, float] = {}

    def starting(self, at: float) -> None:
        """A call is about to start at `at`: the CPU counts begin with the first one measured."""
        if at >= self.measure_from and not self.marks:
            self.marks["driver"] = time.process_time()
            self.marks["server"] = cpu_seconds(self.pids)

    def failed(self, at: float, message: str) -> None:
        """A call started at `at` failed (or was not made) with `message`."""
        if at >= self.measure_from:
            self.error_count += 1
            if len(self.errors) < ERRORS_KEPT:
                self.errors.append(message[:300])

    async def call(self) -> None:
        """One call of the target, timed from its start, its failure counted."""
        began = time.perf_counter()
        try:
            await self.target.call()
        except (aiohttp.ClientError, wire.BadAnswer, TimeoutError, ValueError, OSError) as exc:
            self.failed(began, f"{type(exc).__name__}: {exc}")
            return
        if began >= self.measure_from:
            self.latencies.append(time.perf_counter() - began)

    def result(self, concurrency: int, rate: float | None = None) -> LoadResult:
        elapsed = time.perf_counter() - self.measure_from
        driver_cpu = time.process_time() - self.marks.get("driver", time.process_time())
        server_cpu = cpu_seconds(self.pids) - self.marks["server"] if self.marks else 0.0
        latencies = sorted(self.latencies)
        calls = len(latencies)
        return LoadResult(
            target=self.target.name,
            concurrency=concurrency,
            calls=calls,
            errors=self.error_count,
            seconds=elapsed,
            calls_per_s=calls / elapsed if elapsed > 0 else 0.0,
            p50_ms=statistics.median(latencies) * MS if latencies else 0.0,
            p99_ms=percentile(latencies, 0.99) * MS,
            driver_cpu_us_per_call=driver_cpu / calls * US if calls else 0.0,
            server_cpu_us_per_call=server_cpu / calls * US if calls else 0.0,
            first_errors=self.errors,
            rate=rate,
        )


async def run_load(target: Target, concurrency: int, duration: float, warmup: float) -> LoadResult:
    """Keep `concurrency` calls in flight for `warmup + duration` seconds; measure calls started after the warm-up."""
    measure = _Measure(target, time.perf_counter() + warmup)
    stop_at = measure.measure_from + duration

    async def worker() -> None:
        while (began := time.perf_counter()) < stop_at:
            measure.starting(began)
            await measure.call()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return measure.result(concurrency)


async def run_paced(target: Target, rate: float, duration: float, warmup: float,
                    max_in_flight: int = PACED_MAX_IN_FLIGHT) -> LoadResult:
    """Start a call every 1/`rate` s for `warmup + duration` seconds, whether or not earlier ones have been answered,
    at most `max_in_flight` at once (a call due beyond that is not made and counts as an error: the target fell
    behind); measure the calls started after the warm-up, each from its start."""
    start = time.perf_counter()
    measure = _Measure(target, start + warmup)
    stop_at = measure.measure_from + duration
    in_flight: set[asyncio.Task[None]] = set()
    async with asyncio.TaskGroup() as group:
        for n in itertools.count():
            due = start + n / rate
            if due >= stop_at:
                break
            # Pacing by the clock is what this driver is for: the next call is due then, answered or not.
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            measure.starting(due)
            if len(in_flight) >= max_in_flight:
                measure.failed(due, f"{max_in_flight} calls still in flight when the next was due")
                continue
            task = group.create_task(measure.call())
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
    return measure.result(max_in_flight, rate)


# -- HTTP targets ----------------------------------------------------------------------------


def client_session(max_connections: int) -> aiohttp.ClientSession:
    """An aiohttp client keeping up to `max_connections` keep-alive connections, every call bounded."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT))


class _HttpTarget:
    """An HTTP server under load: where it is, the token, and the process tree whose CPU it costs."""

    accept = wire.ACCEPT_JSON

    def __init__(self, name: str, http: aiohttp.ClientSession, url: str, token: str, server_pid: int) -> None:
        self.name = name
        self.http = http
        self.url = url
        self.server_pid = server_pid
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": self.accept}

    def server_pids(self) -> list[int]:
        return tree(self.server_pid)


class JsonTarget(_HttpTarget):
    """POST a fixed JSON-RPC body with `Accept: application/json`; the answer must be the echo."""

    async def call(self) -> None:
        async with self.http.post(self.url, data=wire.DIRECT_BODY, headers=self.headers) as response:
            body = await response.read()
            if response.status != 200:
                raise wire.BadAnswer(f"HTTP {response.status}: {body[:200]!r}")
        wire.check_direct(json.loads(body))


class _ToolCallTarget(_HttpTarget):
    """An MCP `tools/call` of the echo tool, accepting JSON or SSE as MCP clients do: a call that streams nothing
    before its answer is answered as one JSON body, one that does as SSE."""

    accept = wire.ACCEPT_SSE
    body = wire.TOOL_CALL_BODY

    async def call(self) -> None:
        async with self.http.post(self.url, data=self.body, headers=self.headers) as response:
            body = await response.read()
            if response.status != 200:
                raise wire.BadAnswer(f"HTTP {response.status} {response.content_type}: {body[:200]!r}")
        wire.check_tool_result(wire.response_of(body, response.content_type))


class SseTarget(_ToolCallTarget):
    """MCP `tools/call` in one 2025-11-25 session (`open_session` first)."""

    async def open_session(self) -> None:
        """`initialize`, keep its session id, send `notifications/initialized`."""
        async with self.http.post(self.url, data=wire.INITIALIZE_BODY, headers=self.headers) as response:
            body = await response.read()
            session_id = response.headers.get(wire.SESSION_HEADER)
            if response.status != 200 or not session_id:
                raise wire.BadAnswer(f"initialize: HTTP {response.status}: {body[:200]!r}")
        self.headers = {**self.headers, wire.SESSION_HEADER: session_id,
                        wire.VERSION_HEADER: wire.MCP_PROTOCOL_VERSION}
        async with self.http.post(self.url, data=wire.INITIALIZED_BODY, headers=self.headers) as response:
            if response.status != 202:
                raise wire.BadAnswer(f"notifications/initialized: HTTP {response.status}")


class ModernTarget(_ToolCallTarget):
    """MCP 2026-07-28 `tools/call`, stateless: no session, the `_meta` envelope and routing headers on every call."""

    body = wire.MODERN_TOOL_CALL_BODY

    def __init__(self, name: str, http: aiohttp.ClientSession, url: str, token: str, server_pid: int) -> None:
        super().__init__(name, http, url, token, server_pid)
        self.headers = {**self.headers, **wire.MODERN_HEADERS}


# -- the child over stdio ----------------------------------------------------------------------


class StdioTarget:
    """The calc child driven directly: newline-delimited JSON-RPC on its pipes, calls matched by id."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids: Callable[[], int] = itertools.count(1).__next__

    @property
    def pid(self) -> int:
        """The child's pid."""
        assert self._proc is not None, "start() first"
        return self._proc.pid

    def server_pids(self) -> list[int]:
        return [self.pid]

    async def start(self) -> None:
        """Spawn the child; it is ready when it answers (the first call waits for it)."""
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            limit=MAX_LINE_BYTES,
        )
        self._reader = asyncio.create_task(self._read(), name=f"{self.name}-stdout")

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            message = json.loads(line)
            call_id = message.get("id") if isinstance(message, dict) else None
            future = self._pending.pop(call_id, None) if isinstance(call_id, int) else None
            if future is not None and not future.done():
                future.set_result(message)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(OSError("the child closed its stdout"))

    async def call(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        call_id = self._ids()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            self._proc.stdin.write(wire.compact(wire.request(wire.CHILD_METHOD, wire.ECHO_PARAMS, call_id)) + b"\n")
            await self._proc.stdin.drain()
            async with asyncio.timeout(CALL_TIMEOUT):
                message = await future
        finally:
            self._pending.pop(call_id, None)
        wire.check_direct(message, call_id)

    async def stop(self) -> None:
        """Close the child's stdin and wait for it to exit (killed after CHILD_EXIT_DEADLINE)."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(CHILD_EXIT_DEADLINE):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
