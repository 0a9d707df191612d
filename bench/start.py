"""Start and idle memory, paired: fresh daemons of a git revision and of the working tree, launched in turn.

Owns the paired judgement of start-up changes (lazy imports, fewer modules): each pair launches one daemon of each
side (order flipped every pair), reads its RSS once it listens (before any call: the idle figure) and times spawn →
"listening on" → first answered call (the child starts lazily on that call), then stops it. Reported per pair and
as medians of per-pair ratios, like bench.ab. Goals (issue 20): idle RSS ≤ 45 MB, launch → first call ≤ 0.16 s in
the peer harness; this measures the same things on the bench's own config and load client.

Run: `.venv/bin/python -m bench.start --base main --pairs 10`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ab import export_package
from bench.driver import JsonTarget, client_session
from bench.procs import ServerProcess, bench_env, daemon_argv, install_copy, status_kib, write_config
from bench.run import GATEWAYD_JSON, RESULTS_DIR, save

SIDES = ("base", "work")
DEFAULT_PAIRS = 8
KIB = 1024


class Launcher:
    """One side: an installed copy and its config; launches fresh daemons of it."""

    def __init__(self, name: str, root: Path, source: Path | None) -> None:
        self.name = name
        self.python = install_copy(root / "install", source)
        self.config_dir = root / "config"
        self.token = write_config(self.config_dir)

    async def launch(self) -> dict[str, float]:
        """One fresh daemon: seconds to listening and to the first answered call, idle RSS (MB, decimal)."""
        daemon = ServerProcess(f"gatewayd-{self.name}", daemon_argv(self.config_dir, python=self.python),
                               env=bench_env(python=self.python), cwd=self.config_dir)
        try:
            async with client_session(1) as http:
                url = await daemon.start()
                idle_kib = status_kib(daemon.pid, "VmRSS")
                await JsonTarget(GATEWAYD_JSON, http, url, self.token, daemon.pid).call()
                answered = time.perf_counter()
        finally:
            await daemon.stop()
        return {"listening_s": daemon.listening_at - daemon.spawned_at, "first_call_s": answered - daemon.spawned_at,
                "idle_rss_mb": idle_kib * KIB / 1e6}


async def compare(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gatewayd-start-") as tmp:
        root = Path(tmp)
        sides = {"base": Launcher("base", root / "base", export_package(args.base, root / "export")),
                 "work": Launcher("work", root / "work", None)}
        for pair in range(args.pairs):
            order = SIDES if pair % 2 == 0 else SIDES[::-1]
            row: dict[str, Any] = {"pair": pair + 1}
            for name in order:
                row[name] = await sides[name].launch()
            rows.append(row)
            base, work = row["base"], row["work"]
            print(f"pair {pair + 1}: first call {base['first_call_s']:.3f} → {work['first_call_s']:.3f} s, "
                  f"listening {base['listening_s']:.3f} → {work['listening_s']:.3f} s, "
                  f"idle RSS {base['idle_rss_mb']:.1f} → {work['idle_rss_mb']:.1f} MB", flush=True)
    summary = {key: _summary(rows, key) for key in ("first_call_s", "listening_s", "idle_rss_mb")}
    return {"base": args.base, "pairs": rows, "summary": summary}


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    return {"base_median": round(statistics.median(r["base"][key] for r in rows), 3),
            "work_median": round(statistics.median(r["work"][key] for r in rows), 3),
            "ratio_median": round(statistics.median(r["work"][key] / r["base"][key] for r in rows), 3),
            "pairs_work_lower": sum(r["work"][key] < r["base"][key] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare the working tree against")
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help=f"default {DEFAULT_PAIRS}")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs ≥ 1")
    record = asyncio.run(compare(args))
    for key, figures in record["summary"].items():
        print(f"{key}: {figures['base_median']} → {figures['work_median']} (work ÷ {args.base}: "
              f"×{figures['ratio_median']}, lower in {figures['pairs_work_lower']} of {args.pairs})")
    print(f"raw results: {save(record, args.results_dir, prefix='start-')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
