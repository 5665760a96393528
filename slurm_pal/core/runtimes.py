"""What a job will run, learned from the jobs that ended at the site.

Why: waiting for a good GPU pays when the job runs long enough for the outlier to cost more than
the wait, so the wait is weighed against the job's expected runtime. A job's time limit says
little of it (a site's jobs end anywhere from minutes into a two-day limit to at it), and a job
without one says nothing: weighed at a fixed hour, a 16-GPU gang with no limit, which ran 22 h,
took a 2.5x GPU rather than wait two hours for a good one, and ran 104 h instead of 44 h
(a site-like week, 1 GPU per node). The site's own history says more: what share of their
limit its limited jobs used, and how long its unlimited jobs ran, by size.

Scikit-learn's shape: :meth:`RuntimeModel.fit` on finished jobs, :meth:`partial_fit` as each
ends, :meth:`predict` for a job; no I/O. Medians, not means: runtimes are heavy-tailed, and a
median errs toward a shorter wait. Only the last ``window`` jobs of each kind count, so the
model follows a site whose jobs change; below ``min_runs`` of a kind it knows nothing of it
(``None``) and the policy's fixed rules stand.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["EndedJob", "RuntimeModel", "size_bucket"]

SIZE_BUCKETS = ((1, "1 GPU"), (8, "2-8 GPUs"), (math.inf, "over 8 GPUs"))
"""Unlimited jobs' runtimes are learned apart by size: a site's gangs run unlike its 1-GPU jobs."""


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


class RuntimeModel:
    """Expected runtimes from the site's finished jobs: a limited job is predicted to use the
    median share of its limit that limited jobs used; an unlimited one to run the median of
    unlimited jobs of its size (or of all sizes while its size has too few)."""

    def __init__(self, *, min_runs: int = 20, window: int = 2000) -> None:
        if min_runs < 1 or window < min_runs:
            raise ValueError(
                f"need 1 <= min_runs <= window, got min_runs={min_runs}, window={window}"
            )
        self.min_runs = min_runs
        self.window = window
        self._shares: deque[float] = deque(maxlen=window)
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
        if job.limited:
            self._shares.append(min(1.0, job.runtime_s / float(job.time_limit_s)))  # type: ignore[arg-type]
            self._median.pop("share", None)
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

    def unlimited_runtime_s(self, gpus: int) -> float | None:
        """The median runtime of unlimited jobs of ``gpus``' size, else of every size, else
        None (too few)."""
        bucket = size_bucket(gpus)
        own = self._cached(bucket, self._unlimited.get(bucket, ()))
        return own if own is not None else self._cached("any", self._any_unlimited)

    def predict(self, gpus: int, time_limit_s: float | None) -> float | None:
        """What a job of ``gpus`` GPUs with this limit is expected to run (None: the model
        has too few such jobs to say)."""
        if time_limit_s is not None and math.isfinite(time_limit_s):
            share = self.limit_share
            return None if share is None else time_limit_s * share
        return self.unlimited_runtime_s(gpus)

    def learned(self) -> dict[str, dict[str, float | int | None]]:
        """What the model knows, for admins: the limit share (``limited``), the unlimited
        median of each size and of all sizes (``unlimited <size>``, ``unlimited any size``),
        each with the jobs it rests on (the last ``window``); None where they are fewer than
        ``min_runs``."""
        out: dict[str, dict[str, float | int | None]] = {
            "limited": {"limit_share": self.limit_share, "jobs": len(self._shares)}
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
