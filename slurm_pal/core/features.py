"""An application's utilization features, and the weighted-mean math that produces them.

PAL's job classes live in a 2-D plane: DRAM utilization and peak functional-unit (FU)
utilization, both in percent of peak (0-100). The three telemetry sources (Nsight Compute
CSV, NVML GPM / utilization rates, DCGM profiling fields) all reduce to this one record, so
the classifier and the store never need to know where a figure came from; ``source``,
``dram_source`` and ``fu_source`` say it for the humans reading the output.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = [
    "FEATURE_ORDER",
    "IDLE_BELOW_PCT",
    "BusyTimeMean",
    "UtilizationFeatures",
    "WeightedMean",
    "busy_time_mean",
    "time_weighted_mean",
    "weighted_mean_skipping_missing",
]

#: Column order of the classifier's feature matrix. Both are percent of peak.
FEATURE_ORDER: tuple[str, str] = ("dram_util", "fu_util")

VALID_SOURCES: tuple[str, ...] = ("ncu", "nvml", "dcgm")


@dataclass(frozen=True)
class UtilizationFeatures:
    """DRAM and peak functional-unit utilization of one application (or job, or GPU).

    Attributes:
        dram_util: weighted mean DRAM utilization, percent of peak (0-100).
        fu_util: weighted mean of the per-measurement max over the FU pipes, percent.
        source: where the numbers came from: "ncu", "nvml" or "dcgm".
        dram_source: which metric gave ``dram_util`` (e.g. the ncu metric name).
        fu_source: which metrics gave ``fu_util``; says "fallback" when it is not a pipe metric.
        measurements: kernel launches (ncu) or sampling intervals (nvml, dcgm) that went in.
        weight_total: total weight, in ``weight_unit`` (kernel time, or sampled time).
        weight_unit: "ns" for kernel time, "s" for sampled wall time, "samples" for equal weights.
        dram_excluded_fraction: share of the weight left out of ``dram_util`` (metric missing).
        fu_excluded_fraction: share of the weight left out of ``fu_util`` (metric missing).
        busy_fraction: share of the sampled time the GPU was busy (sampled sources only; None
            when unknown). The figures are then taken over the busy time, like ncu's kernel
            time, so idle seconds in a job do not dilute them.
    """

    dram_util: float
    fu_util: float
    source: str
    dram_source: str
    fu_source: str
    measurements: int
    weight_total: float
    weight_unit: str
    dram_excluded_fraction: float = 0.0
    fu_excluded_fraction: float = 0.0
    busy_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.source not in VALID_SOURCES:
            raise ValueError(f"source must be one of {VALID_SOURCES}, got {self.source!r}")
        for name in ("dram_util", "fu_util", "weight_total"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.measurements < 1:
            raise ValueError(f"measurements must be >= 1, got {self.measurements}")
        for name in ("dram_excluded_fraction", "fu_excluded_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value!r}")
        if self.busy_fraction is not None and not 0.0 <= self.busy_fraction <= 1.0:
            raise ValueError(f"busy_fraction must be within [0, 1], got {self.busy_fraction!r}")

    def as_point(self) -> tuple[float, float]:
        """The (DRAM, FU) point the classifier works on, in ``FEATURE_ORDER``."""
        return (self.dram_util, self.fu_util)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, for the store."""
        return asdict(self)

    @classmethod
    def over_busy_time(
        cls,
        dram: BusyTimeMean,
        fu: BusyTimeMean,
        *,
        source: str,
        dram_source: str,
        fu_source: str,
        measurements: int,
        weight_unit: str,
    ) -> UtilizationFeatures:
        """Features from busy-time means (a sampled source: NVML, DCGM), so every source
        records its busy time and fraction the same way."""
        return cls(
            dram_util=dram.mean,
            fu_util=fu.mean,
            source=source,
            dram_source=dram_source,
            fu_source=fu_source,
            measurements=measurements,
            weight_total=dram.busy_s,
            weight_unit=weight_unit,
            dram_excluded_fraction=dram.excluded_fraction,
            fu_excluded_fraction=fu.excluded_fraction,
            busy_fraction=dram.busy_fraction,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UtilizationFeatures:
        """Inverse of :meth:`to_dict`; unknown keys are an error (they mean a format change)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown UtilizationFeatures keys {unknown}; valid: {sorted(known)}")
        return cls(**dict(data))


@dataclass(frozen=True)
class WeightedMean:
    """Result of :func:`weighted_mean_skipping_missing`."""

    mean: float
    used_weight: float
    excluded_weight: float
    used_count: int

    @property
    def excluded_fraction(self) -> float:
        total = self.used_weight + self.excluded_weight
        return self.excluded_weight / total if total > 0 else 0.0


def _check_weights(weights: Sequence[float]) -> None:
    for index, weight in enumerate(weights):
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight #{index} must be finite and >= 0, got {weight!r}")


def time_weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """sum(v_i * w_i) / sum(w_i): kernel-time-weighted mean, as Minos intends and PAL needs.

    Every value counts with its own weight, so 162 launches of one kernel count 162 times
    (the bug that gives Minos 2429 % is dividing by one duration per kernel *name*).
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    if not values:
        raise ValueError("cannot average zero values")
    _check_weights(weights)
    for index, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"value #{index} must be finite, got {value!r}")
    total = math.fsum(weights)
    if total <= 0:
        raise ValueError("total weight is zero; nothing to weight the mean by")
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / total


def weighted_mean_skipping_missing(
    values: Sequence[float | None], weights: Sequence[float]
) -> WeightedMean:
    """Weighted mean over the values that exist; missing ones leave both sums.

    Returns how much weight was left out, so callers can report it rather than pretend a
    missing metric was zero (ncu writes ``n/a`` for metrics a chip does not have).
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    _check_weights(weights)
    present = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
    excluded = math.fsum(w for v, w in zip(values, weights, strict=True) if v is None)
    if not present:
        raise ValueError("no value present to average")
    mean = time_weighted_mean([v for v, _ in present], [w for _, w in present])
    return WeightedMean(
        mean=mean,
        used_weight=math.fsum(w for _, w in present),
        excluded_weight=excluded,
        used_count=len(present),
    )


#: An interval whose busy share (GPM graphics-engine activity, or NVML's kernel-active
#: ``gpu`` figure) is below this many percent counts as idle and is left out.
IDLE_BELOW_PCT = 1.0


@dataclass(frozen=True)
class BusyTimeMean:
    """Result of :func:`busy_time_mean`."""

    mean: float
    busy_s: float
    """Busy seconds that went into ``mean`` (sum of interval seconds x busy share)."""
    sampled_s: float
    """All the seconds given, idle ones included."""
    excluded_s: float
    """Busy seconds of intervals whose value is missing."""
    unknown_s: float
    """Seconds of intervals without a busy share (left out)."""
    used_count: int

    @property
    def busy_fraction(self) -> float:
        """Busy share of the seconds whose busy share is known."""
        known = self.sampled_s - self.unknown_s
        return min(1.0, (self.busy_s + self.excluded_s) / known) if known > 0 else 0.0

    @property
    def excluded_fraction(self) -> float:
        total = self.busy_s + self.excluded_s
        return self.excluded_s / total if total > 0 else 0.0


def busy_time_mean(
    values: Sequence[float | None],
    busy_pct: Sequence[float | None],
    seconds: Sequence[float],
    *,
    rescale: bool = True,
    idle_below_pct: float = IDLE_BELOW_PCT,
) -> BusyTimeMean:
    """Mean of sampled utilization over the time the GPU was busy, not the whole window.

    Why: ncu weights by kernel time, so a job's idle seconds do not count there; averaged
    over the whole window they halve a job's figures (measured on H100). Each interval
    weighs ``seconds x busy`` (busy in percent, 0-100); intervals below ``idle_below_pct``
    are idle and left out. With ``rescale`` (GPM: values are averaged over the whole
    interval) the value is divided by the busy share, i.e. taken over the busy part of the
    interval, and capped at 100: ``sum(v_i s_i) / sum(b_i s_i)``. Without it (NVML's
    coarse ``gpu`` figure, which is itself the busy share) the value is kept as it is.
    Raises ValueError when no busy interval has a value.
    """
    if not len(values) == len(busy_pct) == len(seconds):
        raise ValueError(
            f"{len(values)} values, {len(busy_pct)} busy shares and {len(seconds)} durations"
        )
    _check_weights(seconds)
    used: list[tuple[float, float]] = []
    excluded = unknown = 0.0
    for value, busy, secs in zip(values, busy_pct, seconds, strict=True):
        if busy is None or not math.isfinite(busy):
            unknown += secs
            continue
        share = min(max(busy, 0.0), 100.0) / 100.0
        if share * 100.0 < idle_below_pct:
            continue
        if value is None or not math.isfinite(value):
            excluded += secs * share
            continue
        over_busy = min(value / share, 100.0) if rescale else value
        used.append((over_busy, secs * share))
    if not used:
        raise ValueError("no busy interval with a value")
    busy_s = math.fsum(w for _, w in used)
    if busy_s <= 0:
        raise ValueError("no busy time")
    mean = math.fsum(v * w for v, w in used) / busy_s
    return BusyTimeMean(
        mean=mean,
        busy_s=busy_s,
        sampled_s=math.fsum(seconds),
        excluded_s=excluded,
        unknown_s=unknown,
        used_count=len(used),
    )
