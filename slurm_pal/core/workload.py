"""Simulated jobs: what a trace says about a job, and a Synergy-style Poisson generator (pure).

A :class:`SimJob` carries only what the simulator needs: when it is submitted, how many GPUs it
asks for, its job class, and its *work*: the seconds it runs on median GPUs packed on one node
(the paper's ``t_iter^orig`` times its iteration count). Variability and locality stretch that
work at run time (Eq. (1)); the trace itself never says on which GPUs a job ran.

PAL's artifact reads the Sia-Philly traces with two tables kept here as the defaults:
``PAL_ITERATION_TIME`` (seconds per iteration per model; the trace's ``duration`` is an iteration
count) and ``PAL_MODEL_CLASS`` (model -> class, unknown models -> class A, "assume the worst").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PAL_DEFAULT_CLASS",
    "PAL_ITERATION_TIME",
    "PAL_MODEL_CLASS",
    "PHILLY_GPU_MIX",
    "SITE_GPU_MIX",
    "SITE_TIME_LIMITS",
    "SimJob",
    "pal_job_class",
    "poisson_workload",
    "site_like_workload",
    "user_time_limit",
]

PAL_ITERATION_TIME: Mapping[str, float] = {
    "bert": 0.179,
    "dcgan": 0.0469266931,
    "gpt2": 3.5714,
    "pointnet": 0.28125,
    "resnet50": 0.17540429367763434,
    "vgg19": 0.300610341,
}
"""Seconds per iteration (PAL artifact, ``workload/workload.py::iter_time_model``), lower-case."""

PAL_MODEL_CLASS: Mapping[str, str] = {
    "resnet50": "A",
    "vgg19": "C",
    "pointnet": "D",
    "gpt2": "B",
    "dcgan": "B",
    "bert": "B",
}
"""Model -> job class (PAL artifact, ``get_perfclass``), lower-case model names."""

PAL_DEFAULT_CLASS = "A"
"""PAL's class for an unknown model: the most variability-sensitive one."""

PHILLY_GPU_MIX: Mapping[int, float] = {1: 0.80, 2: 0.06, 4: 0.08, 8: 0.05, 16: 0.01}
"""GPU-demand mix of Synergy's Philly-derived workloads: more than 80 % single-GPU jobs (PAL
paper, section IV-B1) and a thin tail of multi-node jobs. An approximation: the Philly job log
that Synergy samples from is not available here."""


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a trace. ``work`` is seconds on median GPUs within one node (> 0);
    ``tracked`` jobs count in the metrics (PAL tracks a window of job ids). ``known`` is False
    when nothing identified the job's class (the trace reader's default class was used): the
    advisor then places it as the site's default class, whatever its true class.

    ``time_limit``: the job's Slurm time limit in seconds (``inf``: UNLIMITED); what Slurm's
    backfill plans with and the advisor expects. None when the trace has none: the scheduler
    then knows each job's run time exactly (perfect limits, the paper's simulation)."""

    job_id: str
    submit_time: float
    gpus: int
    work: float
    job_class: str
    model: str = ""
    user: str = ""
    name: str = ""
    tracked: bool = True
    known: bool = True
    time_limit: float | None = None

    def __post_init__(self) -> None:
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(
                f"job {self.job_id}: time_limit must be > 0 seconds (inf: unlimited), "
                f"got {self.time_limit!r}"
            )
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"job {self.job_id}: gpus must be an int >= 1, got {self.gpus!r}")
        if not (math.isfinite(self.work) and self.work > 0):
            raise ValueError(f"job {self.job_id}: work must be > 0 seconds, got {self.work!r}")
        if not (math.isfinite(self.submit_time) and self.submit_time >= 0):
            raise ValueError(f"job {self.job_id}: submit_time must be >= 0, got {self.submit_time}")


def pal_job_class(
    model: str,
    model_class: Mapping[str, str] = PAL_MODEL_CLASS,
    default_class: str = PAL_DEFAULT_CLASS,
) -> str:
    """The class of a model name (case-insensitive), ``default_class`` when unknown."""
    lowered = {name.lower(): job_class for name, job_class in model_class.items()}
    return lowered.get(model.lower(), default_class)


def poisson_workload(
    n_jobs: int,
    jobs_per_hour: float,
    *,
    seed: int = 0,
    classes: Sequence[str] = ("A", "B", "C", "D"),
    gpu_mix: Mapping[int, float] = PHILLY_GPU_MIX,
    median_work_s: float = 7200.0,
    work_sigma: float = 1.8,
    max_work_s: float = 7 * 24 * 3600.0,
    track: tuple[int, int] | None = None,
) -> list[SimJob]:
    """Synergy-style synthetic trace: Poisson arrivals at ``jobs_per_hour``, GPU demand drawn
    from ``gpu_mix``, classes uniformly (Synergy splits its model zoo about evenly), and
    log-normal work (median ``median_work_s``, shape ``work_sigma``, clipped to [60 s,
    ``max_work_s``]): heavy-tailed like Philly's run times. The defaults (median 2 h, mean about
    10 h) make 256 GPUs saturate near 10-12 jobs/hour, as the paper's Synergy runs do (Fig. 15).

    ``track = (first, last)`` marks only job numbers in that window as tracked (the paper reports
    Synergy jobs 2000-3000, after the cluster reaches steady state); default: all.
    Same arguments and seed, same jobs.
    """
    if n_jobs < 0:
        raise ValueError(f"n_jobs must be >= 0, got {n_jobs}")
    if not jobs_per_hour > 0:
        raise ValueError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    if not classes:
        raise ValueError("at least one job class is needed")
    sizes = np.array(sorted(gpu_mix), dtype=int)
    weights = np.array([gpu_mix[int(s)] for s in sizes], dtype=float)
    if (sizes < 1).any() or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"gpu_mix needs sizes >= 1 and non-negative weights, got {gpu_mix}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / jobs_per_hour, n_jobs)
    submits = np.cumsum(gaps)
    demand = rng.choice(sizes, n_jobs, p=weights / weights.sum())
    work = np.clip(rng.lognormal(math.log(median_work_s), work_sigma, n_jobs), 60.0, max_work_s)
    picks = rng.integers(0, len(classes), n_jobs)
    jobs = []
    for number in range(n_jobs):
        tracked = track is None or track[0] <= number <= track[1]
        jobs.append(
            SimJob(
                job_id=str(number),
                submit_time=float(round(submits[number], 3)),
                gpus=int(demand[number]),
                work=float(round(work[number], 3)),
                job_class=classes[int(picks[number])],
                tracked=tracked,
            )
        )
    return jobs


SITE_GPU_MIX: Mapping[int, float] = {1: 0.85, 2: 0.06, 4: 0.05, 8: 0.03, 16: 0.01}
"""A university GPU cluster's week, as sessions have seen one: mostly single-GPU jobs, a few
whole-node and multi-node ones."""

SITE_TIME_LIMITS: Mapping[str, float] = {"unlimited": 0.3, "tight": 0.2, "loose": 0.3, "round": 0.2}
"""How users set time limits: none (UNLIMITED), a little above the run time (1.1-1.5x), far
above it (2-10x), or a round default (1, 2 or 7 days, never below the run time)."""


def user_time_limit(run_s: float, kind: str, stretch: float, default_s: float) -> float:
    """The ``--time`` a user of kind ``kind`` (:data:`SITE_TIME_LIMITS`) sets for a job that
    runs ``run_s``: UNLIMITED (inf); ``tight``, 1.1-1.5x the run time in minutes; ``loose``,
    2-10x in hours; ``round``, the site default ``default_s``, never below the run time in
    days. ``stretch`` in [0, 1) places the limit within its kind's range."""
    if kind == "unlimited":
        return math.inf
    if kind == "tight":
        return math.ceil(run_s * (1.1 + 0.4 * stretch) / 60.0) * 60.0
    if kind == "loose":
        return math.ceil(run_s * (2.0 + 8.0 * stretch) / 3600.0) * 3600.0
    if kind == "round":
        return max(default_s, math.ceil(run_s / 86400.0) * 86400.0)
    raise ValueError(f"unknown time-limit kind {kind!r}; valid: {', '.join(SITE_TIME_LIMITS)}")


def site_like_workload(
    n_gpus: int,
    *,
    load: float = 0.8,
    n_jobs: int = 800,
    seed: int = 0,
    classes: Sequence[str] = ("A", "B", "C", "D"),
    gpu_mix: Mapping[int, float] = SITE_GPU_MIX,
    median_work_s: float = 3 * 3600.0,
    work_sigma: float = 1.6,
    max_work_s: float = 7 * 24 * 3600.0,
    time_limits: Mapping[str, float] = SITE_TIME_LIMITS,
    known_share: float = 0.3,
) -> list[SimJob]:
    """A site-like Slurm history for ``n_gpus`` GPUs at ``load`` (offered GPU-seconds per
    second over GPUs, 0.6-0.95 is a busy site): Poisson arrivals, ``gpu_mix`` demand (sizes
    above ``n_gpus`` dropped), log-normal run times of minutes to days (median
    ``median_work_s``), time limits drawn from ``time_limits`` (UNLIMITED ones included), and
    only ``known_share`` of the jobs identified (the others get the site's default class, as
    unknown job names do). Same arguments, same jobs."""
    if not 0 < load <= 2:
        raise ValueError(f"load must be in (0, 2], got {load}")
    if n_jobs < 1 or n_gpus < 1:
        raise ValueError(f"need n_jobs >= 1 and n_gpus >= 1, got {n_jobs}, {n_gpus}")
    mix = {size: weight for size, weight in gpu_mix.items() if size <= n_gpus and weight > 0}
    if not mix:
        raise ValueError(f"no job size in {dict(gpu_mix)} fits {n_gpus} GPUs")
    kinds = [kind for kind in time_limits if time_limits[kind] > 0]
    unknown_kinds = sorted(set(kinds) - set(SITE_TIME_LIMITS))
    if unknown_kinds:
        raise ValueError(
            f"unknown time-limit kind(s) {unknown_kinds}; valid: {list(SITE_TIME_LIMITS)}"
        )
    rng = np.random.default_rng(seed)
    sizes = np.array(sorted(mix), dtype=int)
    weights = np.array([mix[int(size)] for size in sizes], dtype=float)
    demand = rng.choice(sizes, n_jobs, p=weights / weights.sum())
    work = np.clip(rng.lognormal(math.log(median_work_s), work_sigma, n_jobs), 120.0, max_work_s)
    mean_gpu_seconds = float((demand * work).mean())
    gap = mean_gpu_seconds / (load * n_gpus)
    submits = np.cumsum(rng.exponential(gap, n_jobs))
    submits -= submits[0]
    shares = np.array([time_limits[kind] for kind in kinds], dtype=float)
    limit_kind = rng.choice(len(kinds), n_jobs, p=shares / shares.sum())
    stretch = rng.uniform(0, 1, n_jobs)
    defaults = rng.choice([86400.0, 2 * 86400.0, 7 * 86400.0], n_jobs)
    picks = rng.integers(0, len(classes), n_jobs)
    known = rng.uniform(0, 1, n_jobs) < known_share
    jobs = []
    for number in range(n_jobs):
        run = float(round(work[number], 3))
        kind = kinds[int(limit_kind[number])]
        limit = user_time_limit(run, kind, float(stretch[number]), float(defaults[number]))
        jobs.append(
            SimJob(
                job_id=str(number),
                submit_time=float(round(submits[number], 3)),
                gpus=int(demand[number]),
                work=run,
                job_class=classes[int(picks[number])],
                known=bool(known[number]),
                time_limit=limit,
            )
        )
    return jobs
