"""`python -m bench.run`: the one benchmark command. gatewayd beside its floors, interleaved, in one run.

Owns the benchmark's plan and report: launch-to-first-call (fresh daemons, and the floor for
comparison), then rounds in which every target runs at every concurrency (order rotated each
round), RSS of the daemon idle / at peak / after load, the summary (medians across rounds,
per-round ratios gatewayd ÷ floor and ÷ child), the goals, the table on stdout and the raw
record in bench/results/<timestamp>.json. Load is loopback only, bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.driver import (
    JsonTarget,
    LoadResult,
    ModernTarget,
    SseTarget,
    StdioTarget,
    Target,
    client_session,
    run_load,
)
from bench.floor import TOKEN_ENV
from bench.procs import (
    KIB,
    MemorySampler,
    ServerProcess,
    bench_env,
    daemon_argv,
    floor_argv,
    install_copy,
    interpreter,
    rss_kib,
    status_kib,
    tree,
    write_config,
)

DEFAULT_ROUNDS = 5
# Measured seconds per target × concurrency per round, after DEFAULT_WARMUP unmeasured seconds.
DEFAULT_DURATION = 2.5
DEFAULT_WARMUP = 0.5
DEFAULT_CONCURRENCY = (1, 8, 32)
DEFAULT_LAUNCHES = 5
# How often the daemon's RSS is sampled during load.
MEM_SAMPLE_INTERVAL = 0.25
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHILD_ARGV = ["python3", "-m", "gatewayd.examples.calc"]

FLOOR = "floor-http"
RELAY = "floor-relay"
GATEWAYD_JSON = "gatewayd-json"
GATEWAYD_SSE = "gatewayd-sse"
# MCP 2026-07-28: a stateless `tools/call`, no session.
GATEWAYD_MODERN = "gatewayd-modern"
CHILD = "child-direct"
TARGETS = (FLOOR, RELAY, GATEWAYD_JSON, GATEWAYD_SSE, GATEWAYD_MODERN, CHILD)
GATEWAYD_TARGETS = (GATEWAYD_JSON, GATEWAYD_SSE, GATEWAYD_MODERN)

# Issue 20's goals that this run can judge: gatewayd ≥ 0.8× the relay floor (aiohttp in front of the same child,
# nothing else) at every concurrency on every path; idle RSS ≤ 45 MB, in decimal megabytes, the stricter reading
# (MiB are reported too); launch → first call ≤ 0.16 s. The issue judges the launch in the peer harness
# (../shared/peers-bench), beside the aiohttp floor's own: this run's figure is its own launch, for a change's
# direction.
GOAL_RELAY_RATIO = 0.8
GOAL_IDLE_RSS_MB = 45.0
GOAL_LAUNCH_S = 0.16
MIB = 1024 * 1024
MB = 1_000_000


@dataclass
class Launch:
    """One launch: seconds from spawn to the "listening on" line and to the first answered call; stop time."""

    listening_s: float
    first_call_s: float
    stop_s: float


# -- launch ----------------------------------------------------------------------------------


async def measure_launch(name: str, server: ServerProcess, token: str) -> Launch:
    """Spawn `server`, call echo once as soon as it listens, stop it."""
    try:
        async with client_session(1) as http:
            url = await server.start()
            await JsonTarget(name, http, url, token, server.pid).call()
            answered = time.perf_counter()
    finally:
        stop_s = await server.stop()
    return Launch(server.listening_at - server.spawned_at, answered - server.spawned_at, stop_s)


async def measure_launches(
    config_dir: Path, token: str, count: int, daemon_args: list[str]
) -> dict[str, list[Launch]]:
    """`count` fresh daemons on the same config, alternating with fresh floors (the same work without gatewayd)."""
    launches: dict[str, list[Launch]] = {"gatewayd": [], FLOOR: []}
    for index in range(count):
        daemon = ServerProcess("gatewayd", daemon_argv(config_dir, daemon_args), env=bench_env(), cwd=config_dir)
        launches["gatewayd"].append(await measure_launch(GATEWAYD_JSON, daemon, token))
        floor = ServerProcess("floor", floor_argv(), env=bench_env({TOKEN_ENV: token}))
        launches[FLOOR].append(await measure_launch(FLOOR, floor, token))
        print(f"launch {index + 1}/{count}: gatewayd first call {launches['gatewayd'][-1].first_call_s:.3f}s, "
              f"floor {launches[FLOOR][-1].first_call_s:.3f}s", file=sys.stderr)
    return launches


# -- load ------------------------------------------------------------------------------------


def rotate(items: Sequence[Any], by: int) -> list[Any]:
    """`items` starting at index `by` (mod len)."""
    shift = by % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


async def run_rounds(
    targets: list[Target], concurrency: list[int], rounds: int, duration: float, warmup: float
) -> list[dict[str, Any]]:
    """Every target at every concurrency, each round; orders rotate so no target always runs first."""
    results: list[dict[str, Any]] = []
    for round_index in range(rounds):
        for level in rotate(concurrency, round_index):
            for target in rotate(targets, round_index):
                result: LoadResult = await run_load(target, level, duration, warmup)
                results.append({"round": round_index, **result.as_dict()})
                print(f"round {round_index + 1}/{rounds} c={level:<3} {target.name:<14} "
                      f"{result.calls_per_s:8.0f} calls/s  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms"
                      + (f"  {result.errors} errors: {result.first_errors[0]}" if result.errors else ""),
                      file=sys.stderr)
    return results


async def measure_load(config_dir: Path, token: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start the floor, gatewayd and the child once; memory before any call; the rounds; memory at peak and after."""
    env = bench_env()
    floor = ServerProcess("floor", floor_argv(), env=bench_env({TOKEN_ENV: token}))
    relay = ServerProcess("relay", floor_argv("bench.relay"), env=bench_env({TOKEN_ENV: token}))
    daemon = ServerProcess("gatewayd", daemon_argv(config_dir, args.daemon_arg), env=env, cwd=config_dir)
    child = StdioTarget(CHILD, CHILD_ARGV, env)
    max_in_flight = max(args.concurrency)
    sessions: list[aiohttp.ClientSession] = []
    sampler: MemorySampler | None = None
    try:
        floor_url = await floor.start()
        relay_url = await relay.start()
        daemon_url = await daemon.start()
        memory: dict[str, Any] = {
            "daemon_idle_kib": status_kib(daemon.pid, "VmRSS"),
            "daemon_tree_idle_kib": rss_kib(tree(daemon.pid)),
            "daemon_children_at_idle": len(tree(daemon.pid)) - 1,
            "floor_idle_kib": status_kib(floor.pid, "VmRSS"),
        }
        await child.start()
        sampler = MemorySampler(daemon.pid, MEM_SAMPLE_INTERVAL)
        sampler.start()
        sessions = [client_session(max_in_flight) for _ in range(5)]
        sse = SseTarget(GATEWAYD_SSE, sessions[2], daemon_url, token, daemon.pid)
        await sse.open_session()
        by_name: dict[str, Target] = {
            FLOOR: JsonTarget(FLOOR, sessions[0], floor_url, token, floor.pid),
            RELAY: JsonTarget(RELAY, sessions[3], relay_url, token, relay.pid),
            GATEWAYD_JSON: JsonTarget(GATEWAYD_JSON, sessions[1], daemon_url, token, daemon.pid),
            GATEWAYD_SSE: sse,
            GATEWAYD_MODERN: ModernTarget(GATEWAYD_MODERN, sessions[4], daemon_url, token, daemon.pid),
            CHILD: child,
        }
        for target in by_name.values():
            await target.call()  # the first gatewayd call starts the child (on-demand)
        memory["child_idle_kib"] = status_kib(child.pid, "VmRSS")
        memory["daemon_tree_after_first_call_kib"] = rss_kib(tree(daemon.pid))
        targets = [by_name[name] for name in args.targets]
        results = await run_rounds(targets, args.concurrency, args.rounds, args.duration, args.warmup)
        peak = await sampler.stop()
        sampler = None
        memory.update({
            "daemon_peak_sampled_kib": peak.process_kib,
            "daemon_tree_peak_sampled_kib": peak.tree_kib,
            "daemon_vmhwm_kib": status_kib(daemon.pid, "VmHWM"),
            "daemon_after_load_kib": status_kib(daemon.pid, "VmRSS"),
            "daemon_tree_after_load_kib": rss_kib(tree(daemon.pid)),
        })
        return {"results": results, "memory": memory}
    finally:
        if sampler is not None:
            await sampler.stop()
        for session in sessions:
            await session.close()
        await child.stop()
        await daemon.stop()
        await relay.stop()
        await floor.stop()


# -- summary ---------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarise(results: list[dict[str, Any]], names: list[str], concurrency: list[int]) -> list[dict[str, Any]]:
    """Per target and concurrency: medians across rounds, and the median per-round ratio to each floor."""
    cell = {(r["target"], r["concurrency"], r["round"]): r for r in results}
    rounds = sorted({r["round"] for r in results})
    rows: list[dict[str, Any]] = []
    for name in names:
        for level in concurrency:
            runs = [cell[(name, level, i)] for i in rounds if (name, level, i) in cell]
            row: dict[str, Any] = {"target": name, "concurrency": level, "rounds": len(runs)}
            for key in ("calls_per_s", "p50_ms", "p99_ms", "driver_cpu_us_per_call", "server_cpu_us_per_call"):
                row[key] = _median([r[key] for r in runs])
            row["errors"] = sum(r["errors"] for r in runs)
            for floor_name, label in ((FLOOR, "vs_floor"), (RELAY, "vs_relay"), (CHILD, "vs_child")):
                ratios = [cell[(name, level, i)]["calls_per_s"] / cell[(floor_name, level, i)]["calls_per_s"]
                          for i in rounds
                          if (name, level, i) in cell and cell.get((floor_name, level, i), {}).get("calls_per_s")]
                row[label] = _median(ratios) if ratios else None
            rows.append(row)
    return rows


def goals(rows: list[dict[str, Any]], memory: dict[str, Any], launches: dict[str, list[Launch]]) -> dict[str, Any]:
    """The issue's goals this run can judge, each with the figure it was judged on (a goal whose figure this run
    did not measure, such as the relay ratio without the floor-relay target, is not judged)."""
    ratios = {f"{r['target']}@{r['concurrency']}": r["vs_relay"] for r in rows
              if r["target"] in GATEWAYD_TARGETS and r["vs_relay"] is not None}
    idle_bytes = memory["daemon_idle_kib"] * KIB
    judged: dict[str, Any] = {}
    if ratios:
        judged["relay_ratio_at_least_0.8"] = {"met": min(ratios.values()) >= GOAL_RELAY_RATIO,
                                              "ratios": {key: round(value, 3) for key, value in ratios.items()}}
    judged["idle_rss_at_most_45MB"] = {"met": idle_bytes / MB <= GOAL_IDLE_RSS_MB, "MB": round(idle_bytes / MB, 1),
                                       "MiB": round(idle_bytes / MIB, 1)}
    if launches.get("gatewayd"):
        launch_s = _median([launch.first_call_s for launch in launches["gatewayd"]])
        floors = [launch.first_call_s for launch in launches.get(FLOOR, [])]
        judged["launch_to_first_call_at_most_0.16s"] = {
            "met": launch_s <= GOAL_LAUNCH_S, "seconds": round(launch_s, 3),
            "floor_seconds": round(_median(floors), 3) if floors else None}
    return judged


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The medians as a Markdown table."""
    lines = ["| target | in flight | calls/s | p50 ms | p99 ms | ÷ floor-http | ÷ floor-relay | ÷ child-direct "
             "| server CPU µs/call | driver CPU µs/call | errors |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    lines.extend(
        f"| {row['target']} | {row['concurrency']} | {row['calls_per_s']:.0f} | {row['p50_ms']:.2f} "
        f"| {row['p99_ms']:.2f} | {_ratio(row['vs_floor'])} | {_ratio(row['vs_relay'])} | {_ratio(row['vs_child'])} "
        f"| {row['server_cpu_us_per_call']:.0f} | {row['driver_cpu_us_per_call']:.0f} | {row['errors']} |"
        for row in sorted(rows, key=lambda r: (r["concurrency"], TARGETS.index(r["target"])))
    )
    return "\n".join(lines)


def report(record: dict[str, Any]) -> str:
    """The human summary printed at the end."""
    memory = record["memory"]
    mib = {key: value * KIB / MIB for key, value in memory.items() if key.endswith("_kib")}
    python = record["machine"]["python"]
    build = "libpython shared" if python["libpython_shared"] else "libpython linked in"
    out = [f"machine: {record['machine']['nproc']} CPUs, Python {python['version']} ({python['base_executable']}, "
           f"{build}), aiohttp {record['machine']['aiohttp']}; {record['args']['rounds']} rounds × "
           f"{record['args']['duration']}s (+{record['args']['warmup']}s warm-up); medians across rounds, "
           "ratios = median of per-round ratios", "", table(record["summary"]), ""]
    out.append(f"RSS gatewayd idle (before any call): {mib['daemon_idle_kib']:.1f} MiB "
               f"(children: {memory['daemon_children_at_idle']}); after the first call with its child: "
               f"{mib['daemon_tree_after_first_call_kib']:.1f} MiB; peak under load: daemon "
               f"{mib['daemon_vmhwm_kib']:.1f} MiB (VmHWM), "
               f"daemon + child {mib['daemon_tree_peak_sampled_kib']:.1f} MiB; "
               f"after load: daemon {mib['daemon_after_load_kib']:.1f} MiB")
    out.append(f"RSS floor-http idle: {mib['floor_idle_kib']:.1f} MiB; "
               f"calc child idle: {mib['child_idle_kib']:.1f} MiB")
    for name, launches in record["launches"].items():
        if launches:
            out.append(f"launch → first call, {name}: median {_median([x['first_call_s'] for x in launches]):.3f}s "
                       f"(→ listening {_median([x['listening_s'] for x in launches]):.3f}s, "
                       f"stop {_median([x['stop_s'] for x in launches]):.3f}s; n={len(launches)})")
    out.append("")
    if not record["goals"]:
        out.append(f"goals not judged: gatewayd ran with {' '.join(record['args']['daemon_arg'])}")
    for goal, verdict in record["goals"].items():
        figure = {key: value for key, value in verdict.items() if key != "met"}
        out.append(f"goal {goal}: {'MET' if verdict['met'] else 'NOT MET'} {json.dumps(figure)}")
    return "\n".join(out)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": interpreter(),
        "aiohttp": aiohttp.__version__,
        "platform": platform.platform(),
        "loadavg_start": os.getloadavg(),
    }


# -- command line ----------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers, e.g. 1,8,32")
    return levels


def _targets(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(names) - set(TARGETS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(TARGETS)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION,
                        help=f"measured seconds per target and concurrency per round (default {DEFAULT_DURATION})")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP,
                        help=f"unmeasured seconds before each (default {DEFAULT_WARMUP})")
    parser.add_argument("--concurrency", type=_levels, default=list(DEFAULT_CONCURRENCY),
                        help="calls in flight, comma-separated (default 1,8,32)")
    parser.add_argument("--targets", type=_targets, default=list(TARGETS),
                        help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--launches", type=int, default=DEFAULT_LAUNCHES,
                        help=f"fresh daemons timed from spawn to first call (default {DEFAULT_LAUNCHES}; 0 skips)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    parser.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for gatewayd, repeatable (e.g. --daemon-arg=--audit-path= to see "
                             "what the audit log costs); the goals are judged on the default settings only")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0 or args.launches < 0:
        parser.error("--rounds ≥ 1, --duration > 0, --warmup ≥ 0, --launches ≥ 0")
    return args


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; the record."""
    started = time.perf_counter()
    record: dict[str, Any] = {"machine": machine(), "args": {
        key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="gatewayd-bench-") as tmp:
        install_copy(Path(tmp))
        config_dir = Path(tmp) / "config"
        token = write_config(config_dir)
        launches = await measure_launches(config_dir, token, args.launches, args.daemon_arg)
        load = await measure_load(config_dir, token, args)
    record["launches"] = {name: [asdict(x) for x in runs] for name, runs in launches.items()}
    record["memory"] = load["memory"]
    record["results"] = load["results"]
    record["summary"] = summarise(load["results"], args.targets, args.concurrency)
    # The goals are the daemon's as shipped: a run with other settings measures something else.
    record["goals"] = goals(record["summary"], load["memory"], launches) if not args.daemon_arg else {}
    record["machine"]["loadavg_end"] = os.getloadavg()
    record["wall_s"] = round(time.perf_counter() - started, 1)
    return record


def save(record: dict[str, Any], results_dir: Path, prefix: str = "") -> Path:
    """Write a run's record to `results_dir`/`prefix`<UTC timestamp>.json; its path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir / f"{prefix}{stamp}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(bench(args))
    print(report(record))
    print(f"\nraw results: {save(record, args.results_dir)} (wall {record['wall_s']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
