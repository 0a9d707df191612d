"""Prometheus metrics: the counters the call path bumps, and the text exposition of everything.

Owns the metric names, their labels and the text format (version 0.0.4). Counters and the
latency histogram are updated on the call path (a dict update and a bisect, no locks: one
event loop); gauges (servers by state, children, sessions, approvals, config) are read from
their owners when scraped. Labels are only configured names (server, canonical method), never
anything a client made up, so a client cannot grow the series without bound.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Iterable

# Seconds; tool calls range from a millisecond (calc) to minutes (a build streamed through shell.run).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Gauges = Callable[[], Iterable[tuple[str, str, dict[str, str], float]]]


class Metrics:
    """Call counters and latency histograms, plus gauges read at scrape time."""

    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.denied = 0
        self._buckets: dict[str, list[int]] = {}
        self._sums: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._counts: collections.Counter[str] = collections.Counter()
        self._gauges: list[Gauges] = []

    def observe_call(self, server: str, method: str, outcome: str, seconds: float) -> None:
        """One finished call of a configured method: its outcome and how long it took."""
        self.calls[(server, method, outcome)] += 1
        buckets = self._buckets.get(server)
        if buckets is None:
            buckets = self._buckets[server] = [0] * len(LATENCY_BUCKETS)
        index = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        if index < len(buckets):
            buckets[index] += 1
        self._sums[server] += seconds
        self._counts[server] += 1

    def observe_denied(self) -> None:
        """A call refused by policy or for an unknown method (no labels: the name is the caller's)."""
        self.denied += 1

    def add_gauges(self, gauges: Gauges) -> None:
        """Read (name, help, labels, value) rows from `gauges` at every scrape."""
        self._gauges.append(gauges)

    def render(self) -> str:
        """The Prometheus text exposition."""
        out: list[str] = []
        _family(out, "gatewayd_calls_total", "counter", "Tool calls finished, by server, method and outcome.",
                [({"server": s, "method": m, "outcome": o}, n) for (s, m, o), n in sorted(self.calls.items())])
        _family(out, "gatewayd_calls_denied_total", "counter",
                "Calls refused as unknown or not allowed (one answer for both).", [({}, self.denied)])
        self._render_latency(out)
        rows: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {}
        for gauges in self._gauges:
            for name, help_text, labels, value in gauges():
                rows.setdefault(name, (help_text, []))[1].append((labels, value))
        for name, (help_text, samples) in rows.items():
            _family(out, name, "counter" if name.endswith("_total") else "gauge", help_text, samples)
        return "\n".join(out) + "\n"

    def _render_latency(self, out: list[str]) -> None:
        name = "gatewayd_call_duration_seconds"
        out.append(f"# HELP {name} Time from a call's decision to its answer, by server.")
        out.append(f"# TYPE {name} histogram")
        for server in sorted(self._buckets):
            running = 0
            for bound, count in zip(LATENCY_BUCKETS, self._buckets[server], strict=True):
                running += count
                out.append(f'{name}_bucket{{server="{_escape(server)}",le="{bound:g}"}} {running}')
            out.append(f'{name}_bucket{{server="{_escape(server)}",le="+Inf"}} {self._counts[server]}')
            out.append(f'{name}_sum{{server="{_escape(server)}"}} {self._sums[server]:.6f}')
            out.append(f'{name}_count{{server="{_escape(server)}"}} {self._counts[server]}')


def _family(out: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[dict[str, str], float]]) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        out.append(f"{name}{{{rendered}}} {value:g}" if rendered else f"{name} {value:g}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
