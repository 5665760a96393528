"""The service's counters (PROTOCOL.md ``stats``) and the cumulative histograms the metrics
endpoint exports.

Why apart from the server: every part of the service counts (the socket, the rounds, the refresh
loop), and the Prometheus collector (:mod:`.metrics`) reads them; none of them needs the rest of
the server for that.
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["DECIDE_BUCKETS", "ROUND_BUCKETS", "Counters", "Histogram", "format_stats"]

LATENCY_WINDOW = 2048


class Counters:
    """PROTOCOL.md's ``stats`` counters; decide latency percentiles over the last requests."""

    NAMES = (
        "decide_total",
        "decide_route",
        "decide_pass",
        "decide_wait",
        "decide_deny",
        "decide_errors",
        "decide_late",
        "decide_repeats",
        "answers_undelivered",
        "records_total",
        "records_duplicate",
        "records_rejected",
        "replans",
        "replans_at_job_end",
        "replans_coalesced",
        "replan_updates",
        "replan_failed",
        "routes_released",
        "routes_stalled",
        "refresh_errors",
        "peer_refused",
        "connections_refused",
        "connections_closed_for_room",
        "requests_timed_out",
        "bad_requests",
        "spool_applied",
        "spool_applied_prolog",
        "spool_applied_epilog",
        "spool_bad",
        "fail_open",
        "reloads",
        "reloads_refused",
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)
        self._latency: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._end_rounds: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._reads: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        # Cumulative since start, for the Prometheus endpoint (the windows above are for stats).
        self._histograms = {
            "decide": Histogram(DECIDE_BUCKETS),
            "replan_round": Histogram(ROUND_BUCKETS),
            "job_end": Histogram(ROUND_BUCKETS),
            "slurm_read": Histogram(ROUND_BUCKETS),
        }
        self._clock = clock
        self._started = clock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def total(self, *names: str) -> int:
        """The sum of these counters now (cheaper than a snapshot)."""
        with self._lock:
            return sum(int(self._values.get(name) or 0) for name in names)

    def decide_ms(self, ms: float) -> None:
        with self._lock:
            self._latency.append(ms)
            self._histograms["decide"].observe(ms / 1000)

    def replan_round_ms(self, ms: float) -> None:
        """How long one re-planning round took (plan and Slurm writes), whatever started it."""
        with self._lock:
            self._histograms["replan_round"].observe(ms / 1000)

    def job_end_ms(self, ms: float) -> None:
        """How long an Epilog waited for its answer: its round (or the one it joined) and the
        record's store write."""
        with self._lock:
            self._end_rounds.append(ms)
            self._histograms["job_end"].observe(ms / 1000)

    def slurm_read_ms(self, ms: float) -> None:
        """How long one Slurm read took (jobs and nodes, parsed, the queue worked out): what a
        large queue costs the refresh thread, and slurmctld with it."""
        with self._lock:
            self._reads.append(ms)
            self._histograms["slurm_read"].observe(ms / 1000)

    def histograms(self) -> dict[str, Histogram]:
        """Copies of the cumulative histograms (seconds): decide, replan_round, job_end,
        slurm_read."""
        with self._lock:
            return {name: h.copy() for name, h in self._histograms.items()}

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            out: dict[str, object] = dict(self._values)
            window = sorted(self._latency)
            ends = sorted(self._end_rounds)
            reads = sorted(self._reads)
        out["decide_ms_p50"] = _percentile(window, 0.50)
        out["decide_ms_p99"] = _percentile(window, 0.99)
        out["decide_window"] = len(window)
        out["job_end_ms_p50"] = _percentile(ends, 0.50)
        out["job_end_ms_p99"] = _percentile(ends, 0.99)
        out["job_end_ms_max"] = ends[-1] if ends else None
        out["slurm_read_ms_p50"] = _percentile(reads, 0.50)
        out["slurm_read_ms_max"] = reads[-1] if reads else None
        out["uptime_s"] = round(self._clock() - self._started, 3)
        return out


DECIDE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (s) of the decide histogram: a decide is well under a millisecond in memory; the
plugin gives up at advisor.submit_timeout_ms (300 ms)."""
ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (s) of the re-planning round and job-end histograms (the Epilog waits 900 ms)."""


class Histogram:
    """A cumulative histogram (Prometheus' ``le`` buckets, plus sum and count); not locked:
    :class:`Counters` holds its lock around every use."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket; the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def copy(self) -> Histogram:
        twin = Histogram(self.bounds)
        twin.counts, twin.sum, twin.count = list(self.counts), self.sum, self.count
        return twin


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, min(len(values), int(-(-q * len(values) // 1))))
    return round(values[rank - 1], 4)


def format_stats(stats: Mapping[str, object]) -> str:
    """One log line of the counters (for the periodic journal line)."""
    return json.dumps({k: v for k, v in stats.items() if k not in ("v", "ok")}, sort_keys=True)
