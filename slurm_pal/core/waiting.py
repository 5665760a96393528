"""When holding a job back for GPUs that are not outliers for it pays, and for how long at most.

A job kept off a far slower GPU waits. Unbounded, that wait stalled a cluster: on a site whose
jobs run for hours with unlimited time limits, single-GPU jobs waited for weeks behind long
neighbours while most GPUs sat idle. So a wait is weighed, not assumed:

- **what waiting costs the job**: the time until enough GPUs it may use without an outlier free
  up on as few nodes as packing uses, from when the jobs holding them are expected to end
  (:func:`expected_ends`: the share of their time limit the site's jobs use, as the waiting
  job's own runtime is weighed; their limits' ends once they run past it). A holder whose end
  is unknown (an unlimited limit) never frees in this estimate, so it never justifies a wait;
- **what the outlier costs it**: its expected runtime times the slowdown there minus one
  (``runtime_s``: its time limit; a job without one is weighed as if it ran the policy's
  ``assumed_runtime_s``, an hour by default, so an unknown runtime never buys a long wait);
- **the bound**: no job is held longer than ``max_wait_s`` from when it could first have
  started (``waited_s``), whatever the estimates say; they are estimates.

How the bound is kept, and what it does not promise. The hold is the job's begin time, set to
``since + max_wait_s`` (``since``: when it could first have started, kept across re-plans in
its admin comment; in the simulator ``_Job.first_wait``/``held_until``), and every round
re-weighs the job with ``waited_s`` from ``since``, so no hold outlasts the bound, in Slurm
also with the advisor gone. The bound is when the *hold* ends, not a promised start: Slurm
does not reserve for a job whose begin time is later (its backfill skips jobs not yet
eligible), nor does the simulated Slurm, so while a job is held the jobs around it may take the
GPUs it could have started on, and one that does not fit when its bound comes waits as any
pending job. In the production matrix a few per cent of held jobs start past their bound
that way, all large ones (8-48 GPUs of 64), some by days; the rules that stopped it inside the
round either cost most of the gain or left some (benchmarks/README, "The held job's bound, job
by job"). A start by the bound needs a reservation (the held job eligible and routed to the
GPUs it waits for, so that Slurm's backfill plans it there) and the held job first in line, or
the jobs ahead of it take those GPUs as they free. Simulated, a reservation alone left late
starts and cost gain; holding only the first job the round leaves unplaced, with the
reservation, left none but cost more gain and tail runs, as the jobs behind it take outliers
(benchmarks/README, "A held job that reserves the GPUs it waits for").

Who else pays: a held job is not yet eligible for Slurm (its begin time is the bound), so Slurm
neither reserves GPUs for it nor holds the jobs queued behind it; the wait costs the queue only
the GPUs the held job takes first once they free. Idle GPUs it could use without an outlier are
never left idle for its sake: the policy waits only when no such placement exists now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.runtimes import RunningJob

__all__ = ["WaitVerdict", "expected_ends", "expected_wait_s", "running_jobs", "weigh_wait"]


@dataclass(frozen=True)
class WaitVerdict:
    """Whether to hold the job back, until when at the latest, and why (for the admin)."""

    waits: bool
    until: float
    """The latest time (driver's clock) the job is held to: its bound."""
    why: str


def running_jobs(cluster: Cluster) -> tuple[RunningJob, ...]:
    """The jobs running on ``cluster`` whose start the view knows (``busy_since``), with their
    limits (``busy_until - busy_since``; ``inf``: none) and what they have run by its clock:
    what the runtime model counts as censored observations. The service's view and the
    simulator fill ``busy_since``/``busy_until`` alike, so both weigh waits from the same
    running jobs. A job is its GPUs with one start and one end: two jobs that started at the
    same moment with the same limit count as one (an observation too few, never a wrong one)."""
    busy = ~cluster.free & np.isfinite(cluster.busy_since)
    if not busy.any():
        return ()
    since = cluster.busy_since[busy]
    until = cluster.busy_until[busy]
    pairs, counts = np.unique(np.stack((since, until), axis=1), axis=0, return_counts=True)
    now = cluster.clock
    return tuple(
        RunningJob(int(count), float(end - start), max(0.0, now - float(start)))
        for (start, end), count in zip(pairs.tolist(), counts.tolist(), strict=True)
    )


def expected_ends(cluster: Cluster, share: float | np.ndarray | None) -> np.ndarray:
    """Per GPU, when its holder is expected to end: ``share`` of its limit after it started
    (one share for all, or one per GPU: what jobs with limits like the holder's used, as the
    waiting job's own runtime is weighed), or its limit's end once it has run past that or its
    start is unknown; ``inf`` for an unlimited holder. Without ``share``, the limits' ends.
    Weighing the holders at their whole limits and the waiting job at a share of its own
    called every wait too long on a site whose users ask for twice what they run, and jobs
    took a 2.3x GPU rather than wait for ones that freed within the hour (Sia-Philly with
    such limits, 8-GPU nodes)."""
    until = cluster.busy_until
    if share is None:
        return until
    since = cluster.busy_since
    with np.errstate(invalid="ignore"):
        likely = since + share * (until - since)
    usable = np.isfinite(likely) & (likely > cluster.clock)
    return np.where(usable, likely, until)  # share <= 1: never past the limit's end


def expected_wait_s(
    cluster: Cluster,
    good: np.ndarray,
    gpus: int,
    per_node: int | None,
    share: float | np.ndarray | None = None,
) -> float:
    """Seconds from ``cluster.clock`` until ``gpus`` GPUs of the ``good`` mask (usable by the
    job and not outliers for it) are expected free on as few nodes as packing would use: one
    node when the job fits on one, else whole nodes (``per_node`` of them on each node when the
    job says so). Counting good GPUs anywhere would call a scattered set a short wait that the
    job, which never takes more nodes to dodge an outlier, cannot use. ``inf`` when their
    holders never end in the estimate.

    GPUs free now count, though a held job holds nothing and the jobs behind it may take them.
    Counting only what one moment frees at once (tried) kept a 16-GPU job from a 41 h wait on
    a site-like week, but on Sia-Philly's gang jobs, whose waits of hours pay because the
    estimate comes true, it cost most of the gain: average JCT 0.50 -> 0.72 of packing, worst
    run 0.94 -> 1.58 (1 GPU per node, 8 runs). What overstated that job's wait was its cost:
    weighed at its full time limit, three times what it ran."""
    now = cluster.clock
    frees = np.where(cluster.free, now, expected_ends(cluster, share))
    frees = np.where(good, frees, np.inf)
    if per_node is not None:
        on_node, nodes = per_node, max(1, gpus // per_node)
    elif gpus <= cluster.max_gpus_per_node:
        on_node, nodes = gpus, 1
    else:
        on_node = cluster.max_gpus_per_node
        nodes = math.ceil(gpus / on_node)
    slots = cluster.node_gpus
    if on_node < 1 or on_node > slots.shape[1] or nodes > slots.shape[0]:
        return math.inf
    times = np.where(slots >= 0, frees[np.maximum(slots, 0)], np.inf)
    nth = np.partition(times, on_node - 1, axis=1)[:, on_node - 1]
    when = float(np.partition(nth, nodes - 1)[nodes - 1])
    return max(0.0, when - now)


def weigh_wait(
    *,
    slowdown: float,
    runtime_s: float,
    waited_s: float,
    wait_s: float,
    max_wait_s: float,
    now: float,
) -> WaitVerdict:
    """Hold the job back while the wait it can expect (``wait_s``) is shorter than what taking
    the outlier would cost it (``runtime_s x (slowdown - 1)``) and ends within the bound
    (``max_wait_s`` from when it could first have started, ``waited_s`` ago)."""
    until = now - waited_s + max_wait_s
    left = max_wait_s - waited_s
    if left <= 0:
        return WaitVerdict(False, until, f"waited {waited_s:.0f} s, the bound (max_wait_s)")
    if not math.isfinite(wait_s):
        return WaitVerdict(
            False, until, "no end expected for the jobs on the GPUs it waits for (no time limit)"
        )
    if wait_s > left:
        return WaitVerdict(
            False, until, f"expected wait {wait_s:.0f} s exceeds what is left of the bound"
        )
    cost = runtime_s * (slowdown - 1.0)
    if wait_s >= cost:
        return WaitVerdict(
            False, until, f"expected wait {wait_s:.0f} s >= {cost:.0f} s lost on the outlier"
        )
    return WaitVerdict(
        True, until, f"expected wait {wait_s:.0f} s < {cost:.0f} s lost on the outlier"
    )
