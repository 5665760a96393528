"""What a simulation produced, and the figures admins compare (pure).

Definitions (PAL's artifact where it has one, ``blox_manager.update_metrics``):

- JCT = end - submit of each *tracked* job; ``avg_jct`` their mean; ``p99_jct`` the sorted JCTs
  at index ``int(0.99 x n)`` (PAL's definition: the 159th of 160, not an interpolation);
- ``makespan`` = last tracked end - first tracked submit (PAL's simulator prints 0 here: it
  measures wall-clock time);
- ``avg_wait`` = mean of first start - submit (time queued before the job first ran);
- ``utilization`` = GPU-seconds in use / (GPUs x makespan window), from the GPUs-in-use curve;
- ``preemptions`` (a running job stopped without being placed again) and ``migrations`` (a
  running job moved to other GPUs between rounds), over all jobs;
- ``spread_jobs``: tracked jobs that fit in one node but ran across nodes at some point (they
  paid the locality penalty for nothing but a placement choice or fragmentation);
- per-class and per-size (GPU count buckets) averages;
- finish-time fairness (Themis, reported by FFT): ``FTF_j = JCT_j / T_id_j`` where ``T_id`` is
  the job's run time on an exclusive ``1/N`` share of the cluster, ``N`` the time-averaged
  number of jobs in the system (submitted, unfinished) over the job's life:
  ``T_id = work x max(1, N x gpus / cluster GPUs)`` (a job cannot run faster than its own GPU
  count allows; work is its median-GPU, one-node time). ``avg_ftf``, ``max_ftf`` and
  ``ftf_over_1`` (share of jobs treated worse than their fair share) over the tracked jobs
  that finished; every job, tracked or not, counts in ``N``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SIZE_BUCKETS", "JobOutcome", "SimResult", "finish_time_fairness", "size_bucket"]

SIZE_BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-8", 5, 8),
    ("9-16", 9, 16),
    ("17+", 17, 1 << 30),
)


def size_bucket(gpus: int) -> str:
    """The size bucket of a job: 1, 2-4 (one node of 4), 5-8, 9-16, 17+ GPUs."""
    for name, low, high in SIZE_BUCKETS:
        if low <= gpus <= high:
            return name
    raise ValueError(f"no size bucket for {gpus} GPUs")


@dataclass(frozen=True)
class JobOutcome:
    """One job's fate. ``start``/``end`` are None when it never started/finished;
    ``max_nodes`` is the widest node count it ran on."""

    job_id: str
    job_class: str
    gpus: int
    submit: float
    start: float | None
    end: float | None
    work: float
    tracked: bool
    preemptions: int
    migrations: int
    max_nodes: int = 0
    held_s: float = 0.0
    """Seconds the advisor held it back for GPUs that are not outliers for it (Slurm mode)."""
    held_to_bound: bool = False
    """It was held until its bound (``advisor.max_wait_s``), not routed before."""
    placed_on: tuple[str, ...] = ()
    """Its last allocation as ``node:index`` (the node's order), to read a run job by job."""
    timed_out: bool = False
    """Ended at its time limit with work left, as Slurm ends it (``SimConfig.enforce_limits``)."""

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.submit


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return float(ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)])


def finish_time_fairness(jobs: Sequence[JobOutcome], n_gpus: int) -> dict[str, float]:
    """Per finished job, ``JCT / T_id`` (see the module docstring), keyed by job id.

    ``N`` over ``[submit, end]`` is the integral of the jobs-in-system count over that window
    divided by its length, from a step function over every job's submit and end (a job that
    never ended stays in the system to the last event)."""
    events: list[tuple[float, int]] = []
    last = max([j.end for j in jobs if j.end is not None] + [j.submit for j in jobs], default=0.0)
    for job in jobs:
        events.append((job.submit, 1))
        events.append((job.end if job.end is not None else last, -1))
    events.sort()
    times = np.array([t for t, _ in events])
    counts = np.cumsum([d for _, d in events])
    # area[k] = integral of the count from times[0] to times[k]
    widths = np.diff(times, prepend=times[0] if len(times) else 0.0)
    area = np.concatenate(([0.0], np.cumsum(counts[:-1] * widths[1:]))) if len(times) else times

    def integral(t: float) -> float:
        k = int(np.searchsorted(times, t, side="right")) - 1
        if k < 0:
            return 0.0
        return float(area[k] + counts[k] * (t - times[k]))

    ftf: dict[str, float] = {}
    for job in jobs:
        if job.end is None:
            continue
        span = job.end - job.submit
        n_avg = (integral(job.end) - integral(job.submit)) / span if span > 0 else 1.0
        ideal = job.work * max(1.0, n_avg * job.gpus / n_gpus)
        ftf[job.job_id] = span / ideal
    return ftf


@dataclass(frozen=True)
class SimResult:
    """A run's outcomes plus the GPUs-in-use curve (``(time, GPUs in use from then on)``)."""

    placement: str
    scheduler: str
    mode: str
    n_gpus: int
    jobs: tuple[JobOutcome, ...]
    timeline: tuple[tuple[float, int], ...]
    unplaceable: tuple[str, ...] = ()
    gpus_per_node: int = 0
    faults: Mapping[str, object] | None = None
    """With injected faults: the closed loop's account (:func:`slurm_pal.sim.faults.
    loop_summary`), in :meth:`summary` as ``faults``."""

    def tracked(self) -> list[JobOutcome]:
        return [job for job in self.jobs if job.tracked]

    def jcts(self) -> list[float]:
        """JCTs of the tracked jobs that finished, in job order."""
        return [job.jct for job in self.tracked() if job.jct is not None]

    def busy_gpu_seconds(self, start: float, end: float) -> float:
        """GPU-seconds in use between ``start`` and ``end`` (the curve is a step function)."""
        total = 0.0
        points = self.timeline
        for (time, busy), following in zip(points, [*points[1:], (math.inf, 0)], strict=True):
            low, high = max(time, start), min(following[0], end)
            if high > low:
                total += busy * (high - low)
        return total

    def _group(self, jobs: list[JobOutcome]) -> dict[str, float | int]:
        jcts = [job.jct for job in jobs if job.jct is not None]
        waits = [job.wait for job in jobs if job.wait is not None]
        return {"jobs": len(jobs), "avg_jct": _mean(jcts), "avg_wait": _mean(waits)}

    def summary(self) -> dict[str, object]:
        """The JSON object of this run (seconds throughout)."""
        tracked = self.tracked()
        finished = [job for job in tracked if job.end is not None]
        jcts = [job.jct for job in finished if job.jct is not None]
        waits = [job.wait for job in tracked if job.wait is not None]
        if finished:
            first = min(job.submit for job in tracked)
            last = max(job.end for job in finished if job.end is not None)
            makespan = last - first
            used = self.busy_gpu_seconds(first, last)
            utilization = used / (self.n_gpus * makespan) if makespan > 0 else math.nan
        else:
            makespan = utilization = math.nan
        fairness = finish_time_fairness(self.jobs, self.n_gpus)
        ftf = [fairness[job.job_id] for job in finished if job.job_id in fairness]
        classes = sorted({job.job_class for job in tracked})
        sizes = [name for name, _, _ in SIZE_BUCKETS]
        return {
            "placement": self.placement,
            "scheduler": self.scheduler,
            "mode": self.mode,
            "jobs": len(tracked),
            "unfinished": len(tracked) - len(finished),
            "avg_jct": _mean(jcts),
            "p99_jct": _p99(jcts),
            "makespan": makespan,
            "avg_wait": _mean(waits),
            "utilization": utilization,
            "avg_ftf": _mean(ftf),
            "max_ftf": max(ftf) if ftf else math.nan,
            "ftf_over_1": (sum(1 for v in ftf if v > 1.0) / len(ftf)) if ftf else math.nan,
            "preemptions": sum(job.preemptions for job in self.jobs),
            "migrations": sum(job.migrations for job in self.jobs),
            "held_jobs": sum(1 for job in tracked if job.held_s > 0),
            "held_avg_s": _mean([job.held_s for job in tracked if job.held_s > 0]),
            "held_max_s": max((job.held_s for job in tracked), default=0.0),
            "held_to_bound": sum(1 for job in tracked if job.held_to_bound),
            "timed_out": sum(1 for job in tracked if job.timed_out),
            "spread_jobs": sum(
                1 for job in tracked if job.gpus <= self.gpus_per_node and job.max_nodes > 1
            ),
            "unplaceable": list(self.unplaceable),
            "per_class": {
                name: self._group([job for job in tracked if job.job_class == name])
                for name in classes
            },
            "per_size": {
                s: self._group(group)
                for s in sizes
                if (group := [j for j in tracked if size_bucket(j.gpus) == s])
            },
            **({"faults": dict(self.faults)} if self.faults is not None else {}),
        }
