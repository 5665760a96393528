"""Repeated, paired runs of the testbed's arms and what they add up to (pure: no Slurm, no clock).

Why: one run of two arms on a loaded 2-core machine moves by several per cent, and an arm that
differs from another in more than its policy (hooks, job_submit.lua, the service) measures that
difference too. So ``testbed run`` compares the advisor with a *control* arm that runs the same
plugin, hooks and service serving plain packing, repeats the pair, alternates which arm goes
first in each repeat (the machine's load then falls on both alike), and reports every repeat's
ratio with its median and range next to the simulator's prediction of the same pair.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

__all__ = [
    "BASELINES",
    "LATENCIES_S",
    "RATIO_KEYS",
    "arm_order",
    "baseline_arm",
    "calibrated_latency",
    "jobs_apart",
    "pair_ratios",
    "repeat_summary",
    "spread",
    "summarize_pair",
]

RATIO_KEYS = ("avg_jct", "p99_jct", "makespan")
LATENCIES_S = tuple(0.25 * i for i in range(9))
"""Slurm's scheduling latency the prediction is also simulated with (0-2 s per job start):
on the testbed a job's GPUs are taken again only after its Epilog and the next scheduling
pass, which the simulator does not model."""
TIMING_JITTER_S = 0.5
"""How far the timing band moves each job's submission, either way: about one of Slurm's
scheduling ticks on the testbed (``bf_interval=1``, a start latency of 0.5-1.5 s)."""
TIMING_DRAWS = 12
BASELINES = ("control", "stock")
"""What the advisor is compared with, best first: the control differs from it only in the
policy; stock also lacks the plugin, the hooks and the service."""


def baseline_arm(arms: Sequence[str]) -> str | None:
    """The arm the advisor's ratios are taken against: the control when it runs, else stock;
    None when the advisor or every baseline is missing."""
    if "advisor" not in arms:
        return None
    return next((b for b in BASELINES if b in arms), None)


def arm_order(arms: Sequence[str], repeat: int) -> tuple[str, ...]:
    """The order the arms run in repeat ``repeat`` (0-based): as given in even repeats, reversed
    in odd ones, so that over an even number of repeats each arm goes first as often, and a
    drift in the machine's load does not favour the arm that always runs second."""
    ordered = tuple(arms)
    return ordered if repeat % 2 == 0 else ordered[::-1]


def pair_ratios(arm: Mapping[str, float], baseline: Mapping[str, float]) -> dict[str, float | None]:
    """``arm / baseline`` for each of :data:`RATIO_KEYS` from two arms' figures (keys
    ``avg_jct_s``, ``p99_jct_s``, ``makespan_s``, as :meth:`ArmMetrics.to_dict` gives them);
    None where the baseline's figure is missing or zero."""
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        a, b = arm.get(f"{key}_s"), baseline.get(f"{key}_s")
        out[f"{key}_ratio"] = None if a is None or not b else round(float(a) / float(b), 4)
    return out


def spread(values: Sequence[float | None]) -> dict[str, object]:
    """Every value (in run order), and their median, minimum and maximum (None without any).
    No confidence interval: at five repeats the range says as much and assumes nothing."""
    runs = [float(v) for v in values if v is not None]
    if not runs:
        return {"runs": [], "n": 0, "median": None, "min": None, "max": None}
    return {
        "runs": [round(v, 4) for v in runs],
        "n": len(runs),
        "median": round(statistics.median(runs), 4),
        "min": round(min(runs), 4),
        "max": round(max(runs), 4),
    }


def summarize_pair(
    per_repeat: Sequence[Mapping[str, float | None]], predicted: Mapping[str, float]
) -> dict[str, object]:
    """One pair over the repeats: for each ratio its :func:`spread`, the simulator's
    ``predicted`` ratio beside it, and ``vs_sim``: measured median / predicted - 1 (how far the
    real Slurm is from the simulator, relative to the prediction)."""
    out: dict[str, object] = {}
    for key in RATIO_KEYS:
        name = f"{key}_ratio"
        figures = spread([r.get(name) for r in per_repeat])
        sim = predicted.get(name)
        median = figures["median"]
        figures["sim"] = sim
        figures["vs_sim"] = (
            None if sim is None or median is None else round(float(median) / float(sim) - 1.0, 4)  # type: ignore[arg-type]
        )
        out[name] = figures
    return out


def calibrated_latency(control_avg_jct_s: Mapping[float, float], measured_s: float) -> float:
    """The latency whose simulated control arm's average JCT is nearest the measured control's
    (the smaller latency on a tie). Calibrated on the control only, which changes no job: the
    advisor's figures play no part in it."""
    if not control_avg_jct_s:
        raise ValueError("no simulated latencies to calibrate on")
    return min(sorted(control_avg_jct_s), key=lambda d: abs(control_avg_jct_s[d] - measured_s))


def _band(band: object) -> list[float] | None:
    """``[min, max]`` of a prediction's timing band (None: a report from before it)."""
    if not isinstance(band, Mapping) or not band.get("n"):
        return None
    return [band["min"], band["max"]]


def repeat_summary(runs: Sequence[Mapping[str, object]], baseline: str) -> dict[str, object]:
    """Per repeat the measured average-JCT ratio advisor / ``baseline`` beside the simulator's
    prediction of the same pair (with Slurm's latency modelled, and the range Slurm's ticks
    move it in: ``predicted_band``), the holds both made and the
    GPU-seconds each arm lost to slow GPUs; over the repeats the medians, range, the geomean
    with a 95 % bootstrap interval (seeded), and the holds added up."""
    repeats = []
    for run in runs:
        pair = run.get(f"advisor/{baseline}")
        predicted = run.get("predicted")
        if not isinstance(pair, Mapping) or not isinstance(predicted, Mapping):
            continue
        arms: Mapping[str, Mapping[str, object]] = run["arms"]  # type: ignore[assignment]
        held: Mapping[str, object] = arms["advisor"].get("holds") or {}  # type: ignore[assignment]
        repeats.append(
            {
                "trace_seed": run.get("trace_seed"),
                "measured": pair["avg_jct_ratio"],
                "predicted": predicted["latency_avg_jct_ratio"],
                "predicted_plain": predicted["avg_jct_ratio"],
                "predicted_band": _band(predicted.get("timing_band")),
                "holds": {
                    "measured": {
                        "jobs": held.get("held_jobs", 0),
                        "total_s": held.get("held_total_s", 0.0),
                    },
                    "simulated": {
                        "jobs": predicted.get("held_jobs"),
                        "total_s": predicted.get("held_total_s"),
                    },
                },
                "slow_gpu_s": {name: arm.get("slow_gpu_s") for name, arm in arms.items()},
            }
        )
        measured_ratio, predicted_ratio = pair["avg_jct_ratio"], predicted["latency_avg_jct_ratio"]
        if measured_ratio and predicted_ratio and abs(measured_ratio / predicted_ratio - 1) > 0.05:
            repeats[-1]["jobs_apart"] = jobs_apart(run, baseline)
    measured = [float(r["measured"]) for r in repeats if r["measured"] is not None]
    predicted_ratios = [float(r["predicted"]) for r in repeats if r["predicted"] is not None]
    out: dict[str, object] = {"repeats": repeats}
    if not measured:
        return out
    logs = [math.log(v) for v in measured]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(4000))
    low, high = means[int(0.025 * len(means))], means[int(0.975 * len(means)) - 1]

    def total(kind: str, key: str) -> float:
        return round(sum(float(r["holds"][kind][key] or 0) for r in repeats), 1)

    out |= {
        "median_measured": round(statistics.median(measured), 4),
        "measured_range": [round(min(measured), 4), round(max(measured), 4)],
        "geomean_measured": round(math.exp(statistics.fmean(logs)), 4),
        "measured_ci95": [round(math.exp(low), 4), round(math.exp(high), 4)],
        "median_predicted": (
            round(statistics.median(predicted_ratios), 4) if predicted_ratios else None
        ),
        "holds_measured": {
            "jobs": total("measured", "jobs"),
            "total_s": total("measured", "total_s"),
        },
        "holds_simulated": {
            "jobs": total("simulated", "jobs"),
            "total_s": total("simulated", "total_s"),
        },
    }
    return out


def jobs_apart(
    run: Mapping[str, object], baseline: str, share: float = 0.25
) -> dict[str, dict[str, object]]:
    """The jobs of one repeat whose measured JCT differs from the simulated one by more than
    ``share`` in either arm: per job and arm, [start, JCT, slowdown] measured and simulated,
    for finding out job by job why a repeat's ratio missed its prediction."""
    measured: Mapping[str, Mapping[str, list[float]]] = run.get("measured_jobs") or {}  # type: ignore[assignment]
    predicted_all: Mapping[str, object] = run.get("predicted") or {}  # type: ignore[assignment]
    simulated: Mapping[str, Mapping[str, list[float]]] = predicted_all.get("jobs") or {}  # type: ignore[assignment]
    out: dict[str, dict[str, object]] = {}
    for arm in ("advisor", baseline):
        for job, real in (measured.get(arm) or {}).items():
            sim = (simulated.get(arm) or {}).get(job)
            if sim is None or not sim[1]:
                continue
            if abs(real[1] / sim[1] - 1.0) > share:
                out.setdefault(job, {})[arm] = {"measured": real, "simulated": sim}
    return out
