"""Faults as options of ``sim run`` and ``tune``: what the closed loop is worth on a site's
own history (pure, seeded).

A :class:`FaultPlan` is one ``--faults`` option (``rate=3,factors=1.5/2,visible=0,
classes=A/D,repair-days=14,from-days=7,loop=remeasure``): GPUs fault at ``rate`` per 1,000
GPU-days over the trace's span (after ``from-days``, the history a site's store already holds),
each slowing a class drawn from ``classes`` by a factor drawn from ``factors``, NVML seeing
``visible`` of them, repaired after ``repair-days`` on average. Every run of the grid gets its
own :class:`~slurm_pal.sim.loop.FaultLoop` (the same faults for every placement of a seed) in
the ``loop`` mode the plan names, built as the service runs it: the service's detector,
re-measurements under the site's ``advisor.remeasure_*`` limits, suspects steered as outliers
above ``advisor.avoid_above``. :func:`loop_summary` is what a run reports: per kind of fault,
how many were flagged before their repair and the GPU-hours they added to the jobs they slowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_pal.adapters.config import AdvisorConfig
from slurm_pal.core.remeasure import RemeasureLimits
from slurm_pal.core.suspicion import SuspicionDetector
from slurm_pal.core.workload import SimJob
from slurm_pal.errors import SlurmPalError
from slurm_pal.sim.loop import Fault, FaultLoop, fault_model
from slurm_pal.sim.variability import SimGpus

__all__ = [
    "LOOPS",
    "FaultPlan",
    "FaultPlanError",
    "fault_kind",
    "loop_summary",
    "parse_plan",
    "plan_note",
    "summary_line",
]

LOOPS = ("none", "detector", "remeasure", "oracle")
"""``none``: faults, nothing finds them; ``detector``: suspicion from job records steers;
``remeasure``: that plus the service's re-measurements; ``oracle``: told each fault at once."""
_FLOOR_ABOVE = 0.01  # as the service: a suspect scores above avoid_above (an outlier)


class FaultPlanError(SlurmPalError, ValueError):
    """A ``--faults`` option that cannot be run (one line for the user)."""


@dataclass(frozen=True)
class FaultPlan:
    """Faults to inject and the loop that meets them (see the module docstring)."""

    rate: float
    factors: tuple[float, ...] = (1.5, 2.0)
    visible: float = 0.5
    classes: tuple[str, ...] = ()
    repair_days: float = 14.0
    from_days: float = 0.0
    loop: str = "remeasure"

    def __post_init__(self) -> None:
        if not (self.rate >= 0 and math.isfinite(self.rate)):
            raise FaultPlanError(f"fault rate must be >= 0 per 1,000 GPU-days, got {self.rate!r}")
        if not self.factors or any(not (f > 1 and math.isfinite(f)) for f in self.factors):
            raise FaultPlanError(
                f"fault factors must be > 1 (2: twice as slow), got {self.factors}"
            )
        if not 0 <= self.visible <= 1:
            raise FaultPlanError(f"visible must be a share in [0, 1], got {self.visible!r}")
        if not self.repair_days > 0 or not self.from_days >= 0:
            raise FaultPlanError("repair-days must be > 0 (inf: never) and from-days >= 0")
        if self.loop not in LOOPS:
            raise FaultPlanError(f"unknown loop {self.loop!r}; valid: {', '.join(LOOPS)}")

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``key=value`` pairs, comma-separated; lists slash-separated (ValueError: bad)."""
        fields: dict[str, object] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in _FIELDS:
                raise FaultPlanError(
                    f"--faults: {part!r} is not one of {', '.join(k + '=' for k in _KEYS)}"
                )
            try:
                fields[key] = _FIELDS[key](value.strip())
            except ValueError as exc:
                raise FaultPlanError(f"--faults {key.replace('_', '-')}: {exc}") from None
        if "rate" not in fields:
            raise FaultPlanError("--faults needs rate= (faults per 1,000 GPU-days)")
        return cls(**fields)  # type: ignore[arg-type]

    def draw(self, gpus: SimGpus, jobs: Sequence[SimJob], seed: int) -> list[Fault]:
        """The faults of one seed over the trace's span (from its first submission)."""
        if not jobs:
            return []
        first = min(job.submit_time for job in jobs) / 86400.0
        last = max(job.submit_time for job in jobs) / 86400.0
        start = first + self.from_days
        if last <= start:
            raise FaultPlanError(
                f"the trace spans {last - first:.1f} day(s): no time for faults after "
                f"from-days={self.from_days:g}"
            )
        unknown = sorted(set(self.classes) - set(gpus.classes))
        if unknown:
            raise FaultPlanError(f"fault classes {unknown}: the GPUs have {list(gpus.classes)}")
        return fault_model(
            len(gpus.specs()),
            last - start,
            per_1000_gpu_days=self.rate,
            factors=self.factors,
            repair_days=self.repair_days,
            visible_share=self.visible,
            start_days=start,
            seed=seed,
            classes=self.classes,
        )

    def hooks(
        self,
        gpus: SimGpus,
        faults: Sequence[Fault],
        advisor: AdvisorConfig,
        seed: int,
        loop: str | None = None,
    ) -> FaultLoop:
        """One run's loop, as the service would run it (``loop``: another mode than the
        plan's, for a reference arm)."""
        mode = loop or self.loop
        if mode not in LOOPS:
            raise FaultPlanError(f"unknown loop {mode!r}; valid: {', '.join(LOOPS)}")
        found = mode in ("detector", "remeasure")
        return FaultLoop(
            gpus,
            faults,
            mode="detector" if found else mode,
            detector=SuspicionDetector() if found else None,
            floor=advisor.avoid_above + _FLOOR_ABOVE,
            seed=seed,
            remeasure=RemeasureLimits.of(advisor) if mode == "remeasure" else None,
        )


def _factors(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split("/") if v)


def _days(text: str) -> float:
    return math.inf if text in ("inf", "never") else float(text)


_FIELDS: dict[str, Callable[[str], object]] = {
    "rate": float,
    "factors": _factors,
    "visible": float,
    "classes": lambda text: tuple(c for c in text.split("/") if c),
    "repair_days": _days,
    "from_days": float,
    "loop": str,
}
_KEYS = [k.replace("_", "-") for k in _FIELDS]


def fault_kind(fault: Fault, hit: str) -> str:
    """How a fault is reported: factor, the class it hits, what NVML sees."""
    return f"{fault.factor:g}x {hit} " + ("NVML-visible" if fault.visible else "runtime-only")


def loop_summary(loop: FaultLoop) -> dict[str, object]:
    """One run's closed loop: per kind of fault (:func:`fault_kind`) the faults, how many were
    flagged before their repair, and the GPU-hours they added to the jobs they slowed by the
    loop's ``min_slowdown`` or more (what steering is for); suspicions of GPUs no fault
    touched, per 10k job records; the re-measurements run."""
    kinds: dict[str, dict[str, float]] = {}
    for outcome, hit in zip(loop.outcomes, loop.hits, strict=True):
        row = kinds.setdefault(
            fault_kind(outcome.fault, hit), {"faults": 0, "flagged": 0, "added_gpu_h": 0.0}
        )
        row["faults"] += 1
        flagged = outcome.suspected_s is not None and outcome.suspected_s < outcome.fault.repair_s
        row["flagged"] += flagged
        row["added_gpu_h"] += outcome.slowed_gpu_s / 3600.0
    records = max(loop.records, 1)
    return {
        "loop": loop.mode if loop.remeasure is None else "remeasure",
        "faults": dict(sorted(kinds.items())),
        "added_gpu_h": sum(row["added_gpu_h"] for row in kinds.values()),
        "records": loop.records,
        "false_suspicions": len(loop.false_suspicions),
        "false_per_10k": 1e4 * len(loop.false_suspicions) / records,
        "remeasures": loop.probes_run,
        "remeasure_gpu_h": loop.probe_s_spent / 3600.0,
    }


def plan_note(plan: FaultPlan) -> str:
    """One line on the faults a run injected."""
    hit = "/".join(plan.classes) or "the first class"
    return (
        f"faults: {plan.rate:g} per 1,000 GPU-days, {'/'.join(f'{f:g}x' for f in plan.factors)} "
        f"for {hit}, {plan.visible:.0%} seen by NVML, repaired after {plan.repair_days:g} days "
        f"on average; loop: {plan.loop}"
    )


def summary_line(summary: Mapping[str, object]) -> str:
    """One run's loop (a :meth:`SimResult.summary` with ``faults``) in one line."""
    loop = summary["faults"]
    assert isinstance(loop, Mapping)
    kinds = loop["faults"]
    assert isinstance(kinds, Mapping)
    parts = [
        f"{kind} {row['flagged']:.0f}/{row['faults']:.0f} flagged" for kind, row in kinds.items()
    ]
    return (
        f"{summary['placement']}/{summary['scheduler']} ({loop['loop']} loop): "
        + ("; ".join(parts) or "no fault drawn")
        + f"; the faults added {loop['added_gpu_h']:.1f} GPU-h to the jobs they slowed; "
        f"{loop['false_suspicions']} healthy GPU(s) suspected over {loop['records']} records"
        + (f"; {loop['remeasures']} re-measure(s)" if loop["remeasures"] else "")
    )


def parse_plan(text: str, mode: str) -> FaultPlan | None:
    """``--faults`` (empty: none) for a run in ``mode`` (ValueError: bad, or not Slurm's)."""
    if not text:
        return None
    if mode != "slurm":
        raise FaultPlanError("--faults needs --mode slurm (the loop hears Slurm's job ends)")
    return FaultPlan.parse(text)
