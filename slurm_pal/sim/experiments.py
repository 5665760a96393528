"""Many simulations at once: grids of configs, optionally in worker processes, and the
normalizations the paper reports (average JCT relative to Packed-Sticky = Tiresias)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slurm_pal.adapters.config import AdvisorConfig
from slurm_pal.core.workload import SimJob
from slurm_pal.sim.engine import SimConfig, simulate
from slurm_pal.sim.faults import FaultPlan, loop_summary
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.variability import SimGpus

__all__ = [
    "BASELINE",
    "PairedRatios",
    "geomean_gain",
    "grid_configs",
    "improvement",
    "limits_note",
    "run_grid",
    "run_notes",
    "waiting_note",
    "with_gains",
]

BASELINE = "packed-sticky"
FaultRun = tuple[FaultPlan, AdvisorConfig]
"""Faults to inject into every run, and the site's advisor settings the loop runs under."""


def _run_one(
    args: tuple[Sequence[SimJob], SimGpus, SimConfig, FaultRun | None],
) -> SimResult:
    jobs, gpus, config, faults = args
    if faults is None:
        return simulate(jobs, gpus, config)
    plan, advisor = faults
    loop = plan.hooks(gpus, plan.draw(gpus, jobs, config.seed), advisor, config.seed)
    result = simulate(jobs, gpus, config, hooks=loop)
    return replace(result, faults=loop_summary(loop))


def run_grid(
    jobs: Sequence[SimJob],
    gpus: SimGpus,
    configs: Sequence[SimConfig],
    *,
    workers: int = 1,
    on_done: Callable[[SimConfig], None] | None = None,
    faults: FaultRun | None = None,
) -> list[SimResult]:
    """Run every config on the same trace and GPUs; results in ``configs`` order.
    ``workers > 1`` runs them in that many processes (results are the same: runs are
    deterministic and independent). ``faults``: a plan and the site's advisor settings; each
    run then has its own closed loop (the same faults for every config of a seed), its
    account in the result's ``faults``."""
    if workers <= 1 or len(configs) <= 1:
        results = []
        for config in configs:
            results.append(_run_one((jobs, gpus, config, faults)))
            if on_done is not None:
                on_done(config)
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_one, (jobs, gpus, config, faults)) for config in configs]
        results = []
        for config, future in zip(configs, futures, strict=True):
            results.append(future.result())
            if on_done is not None:
                on_done(config)
        return results


def grid_configs(
    placements: Sequence[str],
    schedulers: Sequence[str],
    common: Mapping[str, Any],
    advisor: Mapping[str, Any],
) -> list[SimConfig]:
    """One config per (scheduler, placement), placements varying fastest. ``advisor``: the
    options of the ``advisor`` placement as a site config sets it up; its L x V matrix uses the
    config's penalty while jobs pay the site's (``common["locality_penalty"]``)."""
    as_configured = {**advisor, "site_locality_penalty": common["locality_penalty"]}
    return [
        SimConfig(scheduler=s, **{**common, **as_configured})
        if p == "advisor"
        else SimConfig(placement=p, scheduler=s, **common)
        for s in schedulers
        for p in placements
    ]


def with_gains(results: Sequence[SimResult]) -> list[dict]:
    """Summaries plus each run's gain over Packed-Sticky under the same scheduler."""
    summaries: list[dict[str, Any]] = [result.summary() for result in results]
    baseline = {s["scheduler"]: s["avg_jct"] for s in summaries if s["placement"] == BASELINE}
    for summary in summaries:
        summary["gain_vs_baseline"] = improvement(
            summary["avg_jct"], baseline.get(summary["scheduler"], math.nan)
        )
    return summaries


def improvement(value: float, baseline: float) -> float:
    """Relative gain over the baseline (0.4 = 40 % lower average JCT); NaN without a baseline."""
    if not (math.isfinite(value) and math.isfinite(baseline)) or baseline <= 0:
        return math.nan
    return 1.0 - value / baseline


def geomean_gain(normalized: Sequence[float]) -> float:
    """The paper's geomean improvement: 1 - geomean of normalized JCTs."""
    values = [v for v in normalized if math.isfinite(v) and v > 0]
    if not values:
        return math.nan
    return 1.0 - math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class PairedRatios:
    """A placement judged against a reference over paired runs (same trace, GPUs and seed).

    ``ratios`` are per-run average-JCT ratios placement / reference (< 1: better). The gain is
    ``1 - geomean``; its 95 % interval is a percentile bootstrap over the runs (seeded, so the
    same runs give the same interval). Single runs are chaotic under FIFO + backfill (one job
    ending earlier reorders the queue), so a placement is judged by the whole distribution.
    """

    ratios: tuple[float, ...]
    gain: float
    gain_low: float
    gain_high: float
    median: float
    p90: float
    worst: float
    best: float

    @classmethod
    def of(cls, ratios: Sequence[float], *, resamples: int = 4000, seed: int = 0) -> PairedRatios:
        values = np.array([r for r in ratios if math.isfinite(r) and r > 0], dtype=float)
        if values.size == 0:
            raise ValueError("no finite positive ratios to summarize")
        logs = np.log(values)
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, values.size, size=(resamples, values.size))
        means = logs[picks].mean(axis=1)
        low, high = np.quantile(means, [0.025, 0.975])
        return cls(
            ratios=tuple(float(v) for v in values),
            gain=float(1.0 - math.exp(logs.mean())),
            gain_low=float(1.0 - math.exp(high)),
            gain_high=float(1.0 - math.exp(low)),
            median=float(np.median(values)),
            p90=float(np.quantile(values, 0.9)),
            worst=float(values.max()),
            best=float(values.min()),
        )

    @property
    def clear_gain(self) -> bool:
        """The gain is clear of the noise: the interval's lower bound is above zero."""
        return self.gain_low > 0.0

    def summary(self) -> dict[str, float | int | list[float]]:
        return {
            "runs": len(self.ratios),
            "geomean_gain": self.gain,
            "gain_ci95": [self.gain_low, self.gain_high],
            "median_ratio": self.median,
            "p90_ratio": self.p90,
            "worst_ratio": self.worst,
            "best_ratio": self.best,
        }


def limits_note(jobs: Sequence[SimJob]) -> str | None:
    """What a history's time limits mean for waiting: the advisor never waits for GPUs held by
    jobs without a limit (nothing says when they end). None when the trace carries no limits
    (Sia-Philly: the scheduler knows run times exactly)."""
    limited = [job for job in jobs if job.time_limit is not None]
    if not limited:
        return None
    unlimited = sum(1 for job in limited if math.isinf(job.time_limit or 0.0))
    share = unlimited / len(jobs)
    text = f"{share:.0%} of the history's jobs have no time limit (UNLIMITED)"
    if share >= 0.5:
        return (
            f"{text}: the advisor waits for no GPU they hold, so on such a site it keeps jobs "
            "off outliers only where other GPUs are free"
        )
    return f"{text}: the advisor never waits for GPUs they hold" if unlimited else None


def run_notes(jobs: Sequence[SimJob], summaries: Sequence[dict]) -> list[str]:
    """What the history's time limits and each placement's holds mean for waiting."""
    notes = [limits_note(jobs)]
    notes += [waiting_note(str(s["placement"]), [s], []) for s in summaries]
    notes += [
        f"{s['placement']}: {s['timed_out']} of {s['jobs']} jobs ended at their time limit "
        "(TIMEOUT: their work lost)"
        for s in summaries
        if s.get("timed_out")
    ]
    return [note for note in notes if note is not None]


def waiting_note(label: str, summaries: Sequence[dict], ratios: Sequence[float]) -> str | None:
    """One line on how ``label`` held jobs back over its runs (``summaries``: each run's
    ``SimResult.summary()``) and where it lost to the reference (``ratios``: per-run average-JCT
    ratios), so an admin sees why waiting paid or did not. None when it never held a job."""
    held = [float(s.get("held_jobs", 0)) for s in summaries]
    if not any(held):
        return None
    jobs = float(np.mean([float(s["jobs"]) for s in summaries]))
    mean_s = [float(s["held_avg_s"]) for s in summaries if s.get("held_jobs")]
    longest = max(float(s.get("held_max_s", 0.0)) for s in summaries)
    at_bound = sum(float(s.get("held_to_bound", 0)) for s in summaries) / len(summaries)
    text = (
        f"{label}: held {np.mean(held):.0f} of {jobs:.0f} jobs per run for other GPUs, "
        f"{np.mean(mean_s) / 60:.1f} min on average (longest {longest / 60:.0f} min), "
        f"{at_bound:.0f} per run until the bound (advisor.max_wait_s)"
    )
    lost = [r for r in ratios if r > 1.03]
    if lost:
        text += (
            f"; lost to packing by more than 3 % in {len(lost)} of {len(ratios)} runs "
            f"(worst {max(lost):.2f}x): waiting is risky on this history, lower "
            'advisor.max_wait_s or set advisor.outliers = "last-resort"'
        )
    return text
