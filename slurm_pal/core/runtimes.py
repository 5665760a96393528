"""What a job will run, learned from the jobs that ended at the site.

Why: waiting for a good GPU pays when the job runs long enough for the outlier to cost more than
the wait, so the wait is weighed against the job's expected runtime. A job's time limit says
little of it (a site's jobs end anywhere from minutes into a two-day limit to at it), and a job
without one says nothing: weighed at a fixed hour, a 16-GPU gang with no limit, which ran 22 h,
took a 2.5x GPU rather than wait two hours for a good one, and ran 104 h instead of 44 h
(a site-like week, 1 GPU per node). The site's own history says more: what share of their
limit its limited jobs used (those with limits like the job's: how much of a limit is used
depends on its length), and how long its unlimited jobs ran, by size.

Scikit-learn's shape: :meth:`RuntimeModel.fit` on finished jobs, :meth:`partial_fit` as each
ends, :meth:`predict` for a job; no I/O. An unlimited job's runtime is a median (heavy-tailed,
it errs toward a shorter wait; the job has no end to bound it); a limited job's is the mean
share of the nearest limits, which the limit bounds, since the outlier's cost grows with the
runtime (``benchmarks/runtime_model.py`` measures the predictions). Only the last ``window``
jobs of each kind count, so the model follows a site whose jobs change; below ``min_runs`` of a
kind it knows nothing of it (``None``) and the policy's fixed rules stand.

Jobs still running count too, as censored observations: each has run at least what it has run
so far (:class:`RunningJob`, read off the cluster view by
:func:`slurm_pal.core.waiting.running_jobs`, which the service and the simulator fill alike).
Learned only from jobs that had ended, a site's early hours know only its short jobs: on a
university week a 2-GPU job with a 100 h limit was weighed at 1.6 h (its class's ends so far),
took two 2.4x outliers over two nodes and ran 20 days. So a class's share is a product-limit
(Kaplan-Meier) estimate over its ended jobs and its running ones, and what a job is predicted
to run is never less than what a running job of its limit class has already run.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EndedJob", "RunningJob", "RuntimeModel", "product_limit", "size_bucket"]

SIZE_BUCKETS = ((1, "1 GPU"), (8, "2-8 GPUs"), (math.inf, "over 8 GPUs"))
"""Unlimited jobs' runtimes are learned apart by size: a site's gangs run unlike its 1-GPU jobs."""


TYPICAL_LIMITS = (25, 50, 75, 90)
"""Percentiles of the limits that ended, at which :meth:`RuntimeModel.learned` shows admins the
share a job is weighed at (the share depends on the limit's length)."""


def size_bucket(gpus: int) -> str:
    """The size class an unlimited job's runtime is learned in."""
    return next(name for top, name in SIZE_BUCKETS if gpus <= top)


@dataclass(frozen=True)
class EndedJob:
    """A job that ran to its end: its GPU count, its time limit (``inf`` or ``None``: none)
    and what it ran, in seconds."""

    gpus: int
    time_limit_s: float | None
    runtime_s: float

    @property
    def limited(self) -> bool:
        return self.time_limit_s is not None and math.isfinite(self.time_limit_s)


@dataclass(frozen=True)
class RunningJob:
    """A job still running: its GPU count, its time limit (``inf`` or ``None``: none) and what
    it has run so far, in seconds (its runtime is at least that: a censored observation)."""

    gpus: int
    time_limit_s: float | None
    elapsed_s: float

    @property
    def limited(self) -> bool:
        return self.time_limit_s is not None and math.isfinite(self.time_limit_s)


def product_limit(times: np.ndarray, ended: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier survival curve of ``times`` (``ended``: the job ended then; else it was
    still running then, and ran at least that): the distinct end times and the share of jobs
    still running just after each. At a tie an end counts before a censoring (the usual
    convention: the running job was at risk at that end)."""
    order = np.lexsort((~ended, times))
    times, ended = times[order], ended[order]
    at_risk = times.size - np.arange(times.size)
    factors = np.where(ended, 1.0 - 1.0 / at_risk, 1.0)
    survival = np.cumprod(factors)
    # one step per distinct end time: the survival after its last tied end
    ends = np.flatnonzero(ended)
    if ends.size == 0:
        return np.empty(0), np.empty(0)
    end_times = times[ends]
    last = np.r_[end_times[1:] != end_times[:-1], True]
    return end_times[last], survival[ends[last]]


def _survival_mean(times: np.ndarray, survival: np.ndarray, top: float) -> float:
    """The mean restricted to ``top`` of a product-limit curve (the area under it up to
    ``top``): the jobs still running after the last end are taken to end at ``top`` (a
    limited job is ended at its limit)."""
    edges = np.r_[0.0, np.minimum(times, top), top]
    heights = np.r_[1.0, survival]
    return float(np.sum(heights * np.diff(edges)))


def _survival_median(
    times: np.ndarray, survival: np.ndarray, top: float, after: float = 0.0
) -> float:
    """The first end after which at most half the jobs still run (of those that ran past
    ``after``); ``top`` when more than half still run after the last end."""
    before = np.flatnonzero(times <= after)
    alive = float(survival[before[-1]]) if before.size else 1.0
    if alive <= 0:
        return top
    below = np.flatnonzero((times > after) & (survival <= 0.5 * alive + 1e-12))
    return float(times[below[0]]) if below.size else top


class RuntimeModel:
    """Expected runtimes from the site's finished jobs: a limited job is predicted to use the
    mean share of their limits that the jobs with the nearest limits used; an unlimited one to
    run the median of unlimited jobs of its size (or of all sizes while its size has too few)."""

    def __init__(self, *, min_runs: int = 20, window: int = 2000) -> None:
        if min_runs < 1 or window < min_runs:
            raise ValueError(
                f"need 1 <= min_runs <= window, got min_runs={min_runs}, window={window}"
            )
        self.min_runs = min_runs
        self.window = window
        self._shares: deque[float] = deque(maxlen=window)
        self._limits: deque[float] = deque(maxlen=window)
        self._near: dict[tuple[float, str], float] = {}
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._unlimited: dict[str, deque[float]] = {}
        self._any_unlimited: deque[float] = deque(maxlen=window)
        self._median: dict[str, float | None] = {}

    def __repr__(self) -> str:
        return (
            f"RuntimeModel(min_runs={self.min_runs}, window={self.window}, "
            f"limited={len(self._shares)}, unlimited={len(self._any_unlimited)})"
        )

    def fit(self, ended: Iterable[EndedJob]) -> RuntimeModel:
        """Start over from ``ended`` (oldest first)."""
        self._shares.clear()
        self._limits.clear()
        self._near.clear()
        self._arrays = None
        self._unlimited.clear()
        self._any_unlimited.clear()
        self._median.clear()
        for job in ended:
            self.partial_fit(job)
        return self

    def copy(self) -> RuntimeModel:
        """A model that knows what this one knows and learns apart from it (a driver that
        learns on one thread hands copies to the threads that predict)."""
        other = RuntimeModel(min_runs=self.min_runs, window=self.window)
        other._shares.extend(self._shares)
        other._limits.extend(self._limits)
        other._near.update(self._near)
        other._any_unlimited.extend(self._any_unlimited)
        for bucket, runtimes in self._unlimited.items():
            other._unlimited[bucket] = deque(runtimes, maxlen=self.window)
        other._median.update(self._median)
        return other

    def partial_fit(self, job: EndedJob) -> RuntimeModel:
        """One more job that ended. A runtime that is not a positive number is ignored (a
        record without a start)."""
        if not (job.runtime_s > 0 and math.isfinite(job.runtime_s)) or job.gpus < 1:
            return self
        if job.limited and not job.time_limit_s > 0:  # type: ignore[operator]
            return self
        if job.limited:
            limit = float(job.time_limit_s)  # type: ignore[arg-type]
            self._shares.append(min(1.0, job.runtime_s / limit))
            self._limits.append(limit)
            self._median.pop("share", None)
            self._near.clear()
            self._arrays = None
        else:
            bucket = size_bucket(job.gpus)
            self._unlimited.setdefault(bucket, deque(maxlen=self.window)).append(job.runtime_s)
            self._any_unlimited.append(job.runtime_s)
            self._median.pop(bucket, None)
            self._median.pop("any", None)
        return self

    @property
    def limit_share(self) -> float | None:
        """The median share of their limit that the site's limited jobs used (None: too few)."""
        return self._cached("share", self._shares)

    def share_of(
        self,
        time_limit_s: float,
        running: Sequence[RunningJob] | None = None,
        used: float = 0.0,
    ) -> float | None:
        """The share of a ``time_limit_s`` limit its holder is expected to have used when it
        ends: the median share of the ``min_runs`` ended limited jobs whose limits were
        nearest it (on a log scale); None while fewer have ended. Sites' jobs use less of a
        long limit than of a short one, and their short jobs are the many: on Sia-Philly with
        limits of twice the run time in whole hours, nine jobs in ten ask for an hour and use
        7 % of it, the jobs that ask for a day or more use half. One site-wide share (0.09)
        weighed a 32-GPU gang's 50 h at 5 h, and its holders' ends hours too early. Over
        each job of 12 such traces and 12 site-like ones, predicted from those before it,
        the nearest limits err by a factor of 2.0 (median), the site-wide share by 2.4-2.5.

        ``running``: the jobs running now; those of the same limit class (limits no farther
        from it than the nearest ended ones) count as censored at what they have used so far
        (the product-limit median). ``used``: the share of its limit the holder has run
        already; its median end given that (half the class's jobs that ran that long end
        by then), which is never before ``used``: a holder past its class's median is not
        expected at its limit's end, nor one short of it at the class's median."""
        return self._nearest(time_limit_s, np.median, running, used)

    def mean_share_of(
        self, time_limit_s: float, running: Sequence[RunningJob] | None = None
    ) -> float | None:
        """The mean share of the same nearest limits: what a cost that grows with the runtime
        (the outlier's slowdown times it) is expected to be. Shares are skewed (most jobs
        end early, some run to the limit), so the median calls the long ones short. With
        ``running``, the product-limit mean over the class's ended and running jobs."""
        return self._nearest(time_limit_s, np.mean, running)

    def running_floor_s(
        self, time_limit_s: float | None, running: Sequence[RunningJob] | None
    ) -> float:
        """The longest any running job of the limit class has run (capped at the limit): a job
        of the class is never expected to run less. The class: the running jobs whose limits
        are no farther from ``time_limit_s`` (log scale) than the ``min_runs`` nearest ended
        ones, or all running jobs with exactly this limit while too few have ended. Unlimited
        jobs have no class here (0): their runtimes are heavy-tailed, and one job running for
        weeks says little of the next."""
        if not running or time_limit_s is None or not math.isfinite(time_limit_s):
            return 0.0
        if not time_limit_s > 0:
            return 0.0
        limits, elapsed = _running_arrays(running)
        if limits.size == 0:
            return 0.0
        radius = self._radius(time_limit_s)
        near = np.abs(np.log(limits) - math.log(time_limit_s)) <= radius
        if not near.any():
            return 0.0
        return float(min(elapsed[near].max(), time_limit_s))

    def _radius(self, time_limit_s: float) -> float:
        """The log-distance of the farthest of the ``min_runs`` ended limits nearest
        ``time_limit_s`` (0 while fewer have ended: the same limit only)."""
        if len(self._shares) < self.min_runs:
            return 0.0
        log_limits, _ = self._ended_arrays()
        distance = np.abs(log_limits - math.log(time_limit_s))
        return float(np.partition(distance, self.min_runs - 1)[self.min_runs - 1])

    def _ended_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:  # once per job end, not once per limit asked
            count = len(self._limits)
            self._arrays = (
                np.log(np.fromiter(self._limits, float, count)),
                np.fromiter(self._shares, float, count),
            )
        return self._arrays

    def _nearest(
        self,
        time_limit_s: float,
        statistic: Callable[[np.ndarray], float],
        running: Sequence[RunningJob] | None = None,
        used: float = 0.0,
    ) -> float | None:
        if len(self._shares) < self.min_runs or not time_limit_s > 0:
            return None
        key = (time_limit_s, statistic.__name__)
        conditional = used > 0 and statistic is np.median
        if key in self._near and not running and not conditional:
            return self._near[key]
        log_limits, shares = self._ended_arrays()
        log_limit = math.log(time_limit_s)
        distance = np.abs(log_limits - log_limit)
        nearest = np.argpartition(distance, self.min_runs - 1)[: self.min_runs]
        own = shares[nearest]
        censored = np.empty(0)
        if running:
            limits, elapsed = _running_arrays(running)
            radius = float(distance[nearest].max())
            near = np.abs(np.log(limits) - log_limit) <= radius
            censored = np.minimum(1.0, elapsed[near] / limits[near])
        if censored.size == 0 and not conditional:
            value = float(statistic(own))
            if not running:
                self._near[key] = value
            return value
        times, survival = product_limit(
            np.r_[own, censored], np.r_[np.ones(own.size, bool), np.zeros(censored.size, bool)]
        )
        if statistic is np.median:
            return _survival_median(times, survival, 1.0, after=min(used, 1.0))
        return _survival_mean(times, survival, 1.0)

    def unlimited_runtime_s(self, gpus: int) -> float | None:
        """The median runtime of unlimited jobs of ``gpus``' size, else of every size, else
        None (too few)."""
        bucket = size_bucket(gpus)
        own = self._cached(bucket, self._unlimited.get(bucket, ()))
        return own if own is not None else self._cached("any", self._any_unlimited)

    def predict(
        self,
        gpus: int,
        time_limit_s: float | None,
        running: Sequence[RunningJob] | None = None,
    ) -> float | None:
        """What a job of ``gpus`` GPUs with this limit is expected to run (None: the model
        has too few such jobs to say). ``running``: the jobs running now, counted as having
        run at least what they ran so far; a limited job's prediction is never less than
        what one of its limit class has already run (:meth:`running_floor_s`)."""
        if time_limit_s is not None and math.isfinite(time_limit_s):
            share = self.mean_share_of(time_limit_s, running)
            if share is None:
                return None
            return max(time_limit_s * share, self.running_floor_s(time_limit_s, running))
        return self.unlimited_runtime_s(gpus)

    def learned(self) -> dict[str, dict[str, float | int | None]]:
        """What the model knows, for admins: the site-wide limit share (``limited``); the
        share a job is weighed at for the site's typical limits (``limited, <h> h limit``:
        the quartiles and 90th percentile of the limits that ended, with ``limit_s``), the
        unlimited median of each size and of all sizes (``unlimited <size>``, ``unlimited any
        size``), each with the jobs it rests on (the last ``window``, or the ``min_runs``
        nearest limits); None where they are fewer than ``min_runs``."""
        out: dict[str, dict[str, float | int | None]] = {
            "limited": {"limit_share": self.limit_share, "jobs": len(self._shares)}
        }
        if self.limit_share is not None:
            limits = np.fromiter(self._limits, float, len(self._limits))
            for limit in sorted({float(q) for q in np.percentile(limits, TYPICAL_LIMITS)}):
                out[f"limited, {limit / 3600:.3g} h limit"] = {
                    "limit_share": self.mean_share_of(limit),
                    "jobs": self.min_runs,
                    "limit_s": limit,
                }
        for _, bucket in SIZE_BUCKETS:
            runtimes = self._unlimited.get(bucket, ())
            median = self._cached(bucket, runtimes)
            out[f"unlimited {bucket}"] = {"median_s": median, "jobs": len(runtimes)}
        median = self._cached("any", self._any_unlimited)
        out["unlimited any size"] = {"median_s": median, "jobs": len(self._any_unlimited)}
        return out

    def _cached(self, key: str, values: Iterable[float]) -> float | None:
        if key in self._median:
            return self._median[key]
        data = list(values)
        median = float(np.median(data)) if len(data) >= self.min_runs else None
        self._median[key] = median
        return median


def _running_arrays(running: Sequence[RunningJob]) -> tuple[np.ndarray, np.ndarray]:
    """The limits and elapsed seconds of the limited running jobs (others left out)."""
    kept = [
        (float(job.time_limit_s), max(0.0, job.elapsed_s))  # type: ignore[arg-type]
        for job in running
        if job.limited and job.time_limit_s > 0 and math.isfinite(job.elapsed_s)  # type: ignore[operator]
    ]
    if not kept:
        return np.empty(0), np.empty(0)
    data = np.array(kept, dtype=float)
    return data[:, 0], data[:, 1]
