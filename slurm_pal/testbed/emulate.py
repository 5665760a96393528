"""Emulated GPU variability for the Slurm testbed (pure: no Slurm, no store writes).

Why: the testbed's GPUs are tty devices, so nothing runs faster or slower on any of them. To
measure what the advisor buys on a real scheduler, every fake GPU is given the per-class speed
of one measured GPU (a seeded draw without repetition from a real profile: the Longhorn data or
the bundled example campaign), that draw is ingested as the campaign (so `site render`, the
labels and the advisor see exactly these scores), and every job sleeps for

    base seconds x max PM-score (its class) over the GPUs it actually got x locality penalty

where the GPUs are what Slurm says (``SLURM_JOB_GPUS`` on each node of the job, mapped through
labels.json's ``slurm_index``). The job script (``templates/emulated_job.py``, stdlib only)
reads the :func:`score_table` JSON written next to the testbed; :func:`job_slowdown` is the same
rule in Python, used by tests and reports to check the jobs.

Traces are seeded and time-compressed (seconds instead of hours) so a run takes minutes;
:func:`arm_metrics` and :func:`compare` turn job records into the figures the issue asks for.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_pal.core.binning import PMBinner
from slurm_pal.core.variability import VariabilityProfile, build_profile
from slurm_pal.core.workload import SITE_TIME_LIMITS, user_time_limit
from slurm_pal.errors import SlurmPalError
from slurm_pal.example_campaign import DEFAULT_SHAPES, generate_example_campaign
from slurm_pal.sim.variability import few_slow_gpus, measured_gpus

__all__ = [
    "CLASSES",
    "PROFILES",
    "TRACES",
    "ArmMetrics",
    "EmulatedGpu",
    "EmulationError",
    "TraceJob",
    "arm_metrics",
    "campaign_frame",
    "compare",
    "drawn_gpus",
    "emulated_gpus",
    "job_slowdown",
    "make_trace",
    "p99",
    "score_table",
    "source_profile",
]

CLASSES = ("A", "B", "C", "D")
PROFILES = ("example", "longhorn", "few-slow")
FEW_SLOW_SHARE = 0.05
"""``few-slow`` on the testbed: about 5 % of the GPUs (at least one) 2-3x slower for class A,
the simulator's few-slow profile (:func:`slurm_pal.sim.variability.few_slow_gpus`) at the share
a 32-GPU testbed can show (the matrix's 3 % would be a single GPU)."""
LONGHORN_FILES: Mapping[str, str] = {
    "A": "resnet-longhorn-agg.csv",
    "B": "bert-longhorn-agg.csv",
    "C": "bert-longhorn-agg.csv",
    "D": "pagerank-longhorn-agg.csv",
}
"""PAL's profiles.json: class -> Longhorn file (B and C share BERT's)."""
SHARED_DATA_ENV = "SLURM_PAL_SHARED_DATA"
"""Where the project's reference data lives when it is not ``../shared/data`` of the clone."""


def default_longhorn_dir() -> Path:
    """Longhorn's files under ``$SLURM_PAL_SHARED_DATA``, else ``../shared/data`` beside the
    clone (read at each call, so the variable the tests and benchmarks honour counts here too)."""
    shared = os.environ.get(SHARED_DATA_ENV) or Path(__file__).resolve().parents[3] / "shared/data"
    return Path(shared) / "variability" / "longhorn"


BASE_SECONDS = {name: shape.base_seconds for name, shape in DEFAULT_SHAPES.items()}
"""Benchmark seconds on the median GPU, per class, for the emulated campaign's rows."""


class EmulationError(SlurmPalError, ValueError):
    """An emulation input is missing or invalid; the message says what to use instead."""


@dataclass(frozen=True)
class EmulatedGpu:
    """One fake GPU of the testbed and the per-class slowdown it emulates."""

    node: str
    index: int
    uuid: str
    factors: Mapping[str, float]


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: submitted ``submit`` s after the start, ``base`` s on median GPUs
    within one node."""

    job_id: str
    submit: float
    gpus: int
    job_class: str
    base: float
    time_limit: float | None = None
    """Slurm's ``--time`` in seconds (whole minutes, as Slurm takes it); None: UNLIMITED."""

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes the job asks for: one if it fits a node, else whole nodes."""
        return max(1, math.ceil(self.gpus / gpus_per_node))

    def per_node(self, gpus_per_node: int) -> int:
        return self.gpus // self.nodes(gpus_per_node)


# --- profiles -----------------------------------------------------------------------------------


def source_profile(
    name: str,
    *,
    nodes: int = 4,
    gpus_per_node: int = 4,
    longhorn_dir: Path | None = None,
    class_order: Sequence[str] = CLASSES,
) -> VariabilityProfile:
    """The measured profile the fake GPUs are drawn from.

    ``example``: the bundled example campaign generated at the testbed's size (the campaign
    `slurm-pal demo` shows, with its two throttled GPUs). ``longhorn``: PAL's Longhorn files
    (resnet = A, bert = B and C, pagerank = D), per-GPU medians.
    """
    from slurm_pal.adapters.campaign_csv import read_campaign_csv

    order = list(class_order)
    if name == "example":
        frame = generate_example_campaign(nodes=nodes, gpus_per_node=gpus_per_node)
        frame = frame[frame["job_class"].isin(order)]
        rows = frame.rename(columns={"duration_s": "duration"})
        rows = rows.assign(source_line=np.arange(len(rows)) + 2)
        return build_profile(rows, order, PMBinner())
    if name == "longhorn":
        folder = Path(longhorn_dir) if longhorn_dir is not None else default_longhorn_dir()
        missing = [f for f in set(LONGHORN_FILES.values()) if not (folder / f).is_file()]
        if missing:
            raise EmulationError(
                f"Longhorn profile files not found in {folder} ({', '.join(sorted(missing))}); "
                f"use --profile example, --longhorn-dir DIR or {SHARED_DATA_ENV}"
            )
        frames = [
            read_campaign_csv(folder / LONGHORN_FILES[c], job_class=c).rows
            for c in order
            if c in LONGHORN_FILES
        ]
        return build_profile(pd.concat(frames, ignore_index=True), order, PMBinner())
    raise EmulationError(f"unknown profile {name!r}; valid: {', '.join(PROFILES)}")


def emulated_gpus(
    profile: VariabilityProfile,
    node_names: Sequence[str],
    gpus_per_node: int,
    *,
    seed: int = 0,
    classes: Sequence[str] = CLASSES,
) -> list[EmulatedGpu]:
    """Give every fake GPU (node by node, index by index) one measured GPU's per-class values:
    a seeded draw without repetition (the simulator's :func:`measured_gpus`, so the same seed
    draws the same GPUs there)."""
    drawn = measured_gpus(profile, len(node_names), gpus_per_node, seed=seed, classes=classes)
    out = []
    for g in range(drawn.n_gpus):
        node, index = node_names[g // gpus_per_node], g % gpus_per_node
        factors = {c: float(drawn.true_slowdown[c][g]) for c in classes}
        out.append(EmulatedGpu(node, index, f"EMU-{node}-{index}", factors))
    return out


def drawn_gpus(
    name: str,
    node_names: Sequence[str],
    gpus_per_node: int,
    *,
    seed: int = 0,
    classes: Sequence[str] = CLASSES,
    longhorn_dir: Path | None = None,
) -> list[EmulatedGpu]:
    """The fake GPUs' per-class slowdowns for profile ``name``: a draw from a measured profile
    (``example``, ``longhorn``: :func:`emulated_gpus`) or the simulator's ``few-slow`` site
    (:data:`FEW_SLOW_SHARE` of the GPUs 2-3x slower for the first class), so the testbed and
    the simulator's matrix run on the same kind of cluster."""
    if name != "few-slow":
        profile = source_profile(
            name,
            nodes=len(node_names),
            gpus_per_node=gpus_per_node,
            longhorn_dir=longhorn_dir,
            class_order=classes,
        )
        return emulated_gpus(profile, node_names, gpus_per_node, seed=seed, classes=classes)
    drawn = few_slow_gpus(
        tuple(classes), len(node_names), gpus_per_node, seed=seed, share=FEW_SLOW_SHARE
    )
    out = []
    for g in range(drawn.n_gpus):
        node, index = node_names[g // gpus_per_node], g % gpus_per_node
        factors = {c: round(float(drawn.true_slowdown[c][g]), 6) for c in classes}
        out.append(EmulatedGpu(node, index, f"EMU-{node}-{index}", factors))
    return out


def campaign_frame(
    gpus: Sequence[EmulatedGpu], *, gpu_model: str = "v100", repeats: int = 3
) -> pd.DataFrame:
    """The emulated GPUs as a campaign in the slurm-pal CSV format (``repeats`` equal runs per
    GPU and class, so the per-GPU median is exactly the drawn value)."""
    rows = []
    t0 = 1_764_000_000.0
    for n, gpu in enumerate(gpus):
        for job_class, factor in gpu.factors.items():
            base = BASE_SECONDS.get(job_class, 1.0)
            for rep in range(repeats):
                rows.append(
                    {
                        "uuid": gpu.uuid,
                        "node": gpu.node,
                        "gpu_index": gpu.index,
                        "gpu_model": gpu_model,
                        "job_class": job_class,
                        "benchmark": f"emulated-{job_class}",
                        "duration_s": round(base * factor, 9),
                        "started_at": t0 + rep * 600 + n,
                    }
                )
    return pd.DataFrame(rows)


def score_table(
    gpu_scores: pd.DataFrame,
    labels: Mapping[str, object],
    *,
    across_nodes: float,
    within_node: float = 1.0,
) -> dict[str, object]:
    """The JSON the job script reads: per node and *Slurm* GPU index, its label and PM-score
    per class (``gpu_scores`` as the store has it, ``labels`` the rendered labels.json)."""
    scores: dict[str, dict[str, float]] = {}
    for row in gpu_scores.itertuples(index=False):
        scores.setdefault(str(row.uuid), {})[str(row.job_class)] = float(row.pm_score)
    nodes: dict[str, dict[str, object]] = {}
    for node, gpus in labels["nodes"].items():  # type: ignore[attr-defined]
        for gpu in gpus:
            uuid = str(gpu["uuid"])
            if uuid not in scores:
                raise EmulationError(f"GPU {uuid} on {node} has no scores in the campaign")
            nodes.setdefault(node, {})[str(gpu["slurm_index"])] = {
                "label": gpu["label"],
                "index": gpu["index"],
                "uuid": uuid,
                "scores": scores[uuid],
            }
    return {"within_node": within_node, "across_nodes": across_nodes, "nodes": nodes}


@dataclass(frozen=True)
class Slowdown:
    """What a job on some GPUs feels: worst PM-score x locality penalty."""

    factor: float
    worst: float
    penalty: float
    gpus: tuple[tuple[str, int, str], ...]  # (node, Slurm index, label)


def parse_gpus(value: str) -> list[int]:
    """``SLURM_JOB_GPUS`` ("0,2,3") -> [0, 2, 3]."""
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise EmulationError(f"SLURM_JOB_GPUS {value!r} is not a list of indices") from None


def job_slowdown(
    table: Mapping[str, object], job_class: str, per_node: Mapping[str, Sequence[int]]
) -> Slowdown:
    """The rule the job script applies: ``per_node`` = node -> its SLURM_JOB_GPUS indices."""
    nodes = table["nodes"]
    gpus: list[tuple[str, int, str]] = []
    worst = 0.0
    for node, indices in sorted(per_node.items()):
        for index in indices:
            try:
                gpu = nodes[node][str(index)]  # type: ignore[index]
            except KeyError:
                raise EmulationError(f"no GPU {index} on node {node!r} in the table") from None
            try:
                worst = max(worst, float(gpu["scores"][job_class]))
            except KeyError:
                valid = ", ".join(sorted(gpu["scores"]))
                raise EmulationError(f"no class {job_class!r}; valid: {valid}") from None
            gpus.append((node, index, str(gpu["label"])))
    if not gpus:
        raise EmulationError("the job got no GPUs")
    used = [n for n, idx in per_node.items() if idx]
    penalty = float(table["within_node" if len(used) <= 1 else "across_nodes"])  # type: ignore[arg-type]
    return Slowdown(worst * penalty, worst, penalty, tuple(gpus))


# --- traces -------------------------------------------------------------------------------------

TRACES: Mapping[str, str] = {
    "mixed48": "48 jobs, Poisson arrivals over ~90 s, 1/2/4/8 GPUs (50/20/20/10 %), classes "
    "A-D alike, 3-15 s on median GPUs (log-uniform): ~3 min per arm on 4 x 4 GPUs",
    "demo16": "16 jobs in ~8 s, 1/2/4 GPUs (50/25/25 %), mostly compute-bound A and "
    "memory-bound D (40/10/10/40 %), 3-10 s each: more work than the GPUs, so placement shows",
    "demo32": "32 jobs in ~16 s, 1/2/4 GPUs (50/30/20 %), compute-bound A and memory-bound D "
    "(40/10/10/40 %), 3-10 s (log-uniform): ~1.4x the work the GPUs can do while it arrives, "
    "so jobs queue and every free GPU gets used, the slow ones too (the demo's trace)",
    "tiny": "6 jobs in 3 s: 1, 2, 4 and 8 GPUs of classes A-D, 2-4 s each (tests)",
    "dl": "a deep-learning cluster's work (Sia-Philly-like): 16 jobs of 1/2/4/8/16 GPUs "
    "(40/15/25/15/5 %, gangs over whole nodes), classes A-D 40/20/20/20 %, 20-200 s "
    "(log-uniform) with --time set as users set it; a site's hour is a testbed minute",
    "campus": "a university site's work: 32 jobs, 1/2/4/8 GPUs (75/10/10/5 %), classes A-D "
    "40/10/10/40 %, 20-200 s (log-uniform) with --time set as users set it; a site's hour is "
    "a testbed minute",
}
SITE_HOUR_S = 60.0
"""A site's hour on the testbed (``dl``, ``campus``): one minute, so the whole hours and days
of users' limits stay whole minutes, the unit Slurm takes ``--time`` in."""
SITE_TRACES: Mapping[str, dict[str, object]] = {
    "dl": {
        "jobs": 16,
        "mix": {1: 0.4, 2: 0.15, 4: 0.25, 8: 0.15, 16: 0.05},
        "classes": (0.4, 0.2, 0.2, 0.2),
        "load": 1.2,
    },
    "campus": {
        "jobs": 32,
        "mix": {1: 0.75, 2: 0.1, 4: 0.1, 8: 0.05},
        "classes": (0.4, 0.1, 0.1, 0.4),
        "load": 1.2,
    },
}
"""The site-like families: jobs, GPU mix, class shares and offered load while they arrive
(above 1: a queue forms, so where a job goes and when it waits both matter)."""
SITE_RUN_S = (20.0, 200.0)
"""Run times on median GPUs (log-uniform): over a decade, the shortest long against Slurm's
start latency on the testbed (well under a second)."""


def make_trace(
    name: str = "mixed48",
    *,
    seed: int = 0,
    scale: float = 1.0,
    gpus_per_node: int = 4,
    nodes: int = 4,
) -> list[TraceJob]:
    """A named, seeded trace; ``scale`` stretches arrivals and durations alike. Sizes above
    the cluster are left out (a job Slurm would refuse)."""
    if not (math.isfinite(scale) and scale > 0):
        raise EmulationError(f"scale must be > 0, got {scale}")
    total = nodes * gpus_per_node
    if name == "tiny":
        jobs = [
            TraceJob("t0", 0.0, 1, "A", 3.0),
            TraceJob("t1", 0.2, 2, "B", 2.5),
            TraceJob("t2", 0.4, 1, "D", 2.0),
            TraceJob("t3", 0.6, 4, "C", 2.0),
            TraceJob("t4", 1.0, 2 * gpus_per_node, "A", 2.5),
            TraceJob("t5", 3.0, 1, "A", 2.0),
        ]
    elif name == "mixed48":
        rng = np.random.default_rng(seed)
        n = 48
        gaps = rng.exponential(90.0 / n, size=n)
        submits = np.concatenate([[0.0], np.cumsum(gaps[1:])])
        sizes = rng.choice([1, 2, 4, 8], size=n, p=[0.5, 0.2, 0.2, 0.1])
        classes = rng.choice(list(CLASSES), size=n)
        bases = np.exp(rng.uniform(math.log(3.0), math.log(15.0), size=n))
        jobs = [
            TraceJob(f"j{i:02d}", float(submits[i]), int(sizes[i]), str(classes[i]), float(b))
            for i, b in enumerate(bases)
        ]
    elif name == "demo16":
        rng = np.random.default_rng(seed)
        n = 16
        submits = np.concatenate([[0.0], np.cumsum(rng.exponential(8.0 / n, size=n - 1))])
        sizes = rng.choice([1, 2, 4], size=n, p=[0.5, 0.25, 0.25])
        classes = rng.choice(list(CLASSES), size=n, p=[0.4, 0.1, 0.1, 0.4])
        bases = rng.uniform(3.0, 10.0, size=n)
        jobs = [
            TraceJob(f"d{i:02d}", float(submits[i]), int(sizes[i]), str(classes[i]), float(b))
            for i, b in enumerate(bases)
        ]
    elif name == "demo32":
        # Contention is the point: a job placed on a free GPU or made to wait only matters when
        # the GPUs are short, and the slow GPUs only get used when the others are busy.
        rng = np.random.default_rng(seed)
        n = 32
        submits = np.concatenate([[0.0], np.cumsum(rng.exponential(16.0 / n, size=n - 1))])
        sizes = rng.choice([1, 2, 4], size=n, p=[0.5, 0.3, 0.2])
        classes = rng.choice(list(CLASSES), size=n, p=[0.4, 0.1, 0.1, 0.4])
        bases = np.exp(rng.uniform(math.log(3.0), math.log(10.0), size=n))
        jobs = [
            TraceJob(f"c{i:02d}", float(submits[i]), int(sizes[i]), str(classes[i]), float(b))
            for i, b in enumerate(bases)
        ]
    elif name in SITE_TRACES:
        jobs = site_trace(name, seed=seed, gpus_per_node=gpus_per_node, nodes=nodes)
    else:
        raise EmulationError(f"unknown trace {name!r}; valid: {', '.join(TRACES)}")
    out = []
    for job in jobs:
        if job.gpus > total or (job.gpus > gpus_per_node and job.gpus % gpus_per_node):
            continue
        limit = job.time_limit
        if limit is not None:
            limit = slurm_minutes(limit * scale)
        out.append(
            TraceJob(
                job.job_id,
                round(job.submit * scale, 3),
                job.gpus,
                job.job_class,
                round(job.base * scale, 3),
                limit,
            )
        )
    return out


def slurm_minutes(seconds: float) -> float | None:
    """A limit as Slurm keeps it: whole minutes, rounded up; None for UNLIMITED."""
    if not math.isfinite(seconds):
        return None
    return max(1, math.ceil(seconds / 60.0 - 1e-9)) * 60.0


def site_trace(name: str, *, seed: int, gpus_per_node: int, nodes: int) -> list[TraceJob]:
    """A site-like family (:data:`SITE_TRACES`) drawn anew from ``seed``: Poisson arrivals at
    the family's offered load on this cluster, sizes that fit it (above one node: whole nodes),
    log-uniform run times (:data:`SITE_RUN_S`), and every job with the ``--time`` a user sets
    (:func:`slurm_pal.core.workload.user_time_limit`: tight, loose or the site's round default,
    in the shares :data:`SITE_TIME_LIMITS` gives them; no UNLIMITED job) computed at the site's
    scale (:data:`SITE_HOUR_S`) and kept in whole minutes."""
    spec = SITE_TRACES[name]
    total = nodes * gpus_per_node
    mix = {
        size: share
        for size, share in spec["mix"].items()  # type: ignore[attr-defined]
        if size <= total and (size <= gpus_per_node or size % gpus_per_node == 0)
    }
    rng = np.random.default_rng(seed)
    n = int(spec["jobs"])  # type: ignore[call-overload]
    sizes = np.array(sorted(mix), dtype=int)
    weights = np.array([mix[int(s)] for s in sizes], dtype=float)
    gpus = rng.choice(sizes, n, p=weights / weights.sum())
    shares = np.array(spec["classes"], dtype=float)
    classes = rng.choice(list(CLASSES), n, p=shares / shares.sum())
    low, high = SITE_RUN_S
    bases = np.exp(rng.uniform(math.log(low), math.log(high), n))
    gap = float((gpus * bases).mean()) / (float(spec["load"]) * total)  # type: ignore[arg-type]
    submits = np.concatenate([[0.0], np.cumsum(rng.exponential(gap, n - 1))])
    kinds = [k for k in SITE_TIME_LIMITS if k != "unlimited"]
    kind_shares = np.array([SITE_TIME_LIMITS[k] for k in kinds], dtype=float)
    picks = rng.choice(len(kinds), n, p=kind_shares / kind_shares.sum())
    stretch = rng.uniform(0.0, 1.0, n)
    defaults = rng.choice([1.0, 2.0, 7.0], n) * 24 * 3600
    to_site = 3600.0 / SITE_HOUR_S
    jobs = []
    for i in range(n):
        base = round(float(bases[i]), 3)
        site_limit = user_time_limit(
            base * to_site, kinds[int(picks[i])], float(stretch[i]), float(defaults[i])
        )
        jobs.append(
            TraceJob(
                f"{name[0]}{i:02d}",
                round(float(submits[i]), 3),
                int(gpus[i]),
                str(classes[i]),
                base,
                slurm_minutes(site_limit / to_site),
            )
        )
    return jobs


# --- figures ------------------------------------------------------------------------------------


def p99(values: Sequence[float]) -> float:
    """PAL's p99: the sorted values at index int(0.99 n) (the simulator's definition)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return float(ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)])


@dataclass(frozen=True)
class ArmMetrics:
    """One arm's figures (seconds) from its job records."""

    arm: str
    jobs: int
    avg_jct: float
    p99_jct: float
    makespan: float
    avg_wait: float
    avg_slowdown: float
    spread_jobs: int
    extra: dict[str, object] = field(default_factory=dict)
    slow_gpu_s: float = 0.0
    """GPU-seconds the cluster lost to slow GPUs: per job, its GPUs x the seconds its slowest
    GPU added over a median one (base x penalty x (worst - 1), where worst > 1)."""
    busy_gpu_s: float = 0.0
    """GPU-seconds the jobs held their GPUs (GPUs x run time)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "avg_jct_s": round(self.avg_jct, 3),
            "p99_jct_s": round(self.p99_jct, 3),
            "makespan_s": round(self.makespan, 3),
            "avg_wait_s": round(self.avg_wait, 3),
            "avg_slowdown": round(self.avg_slowdown, 4),
            "spread_jobs": self.spread_jobs,
            "slow_gpu_s": round(self.slow_gpu_s, 1),
            "busy_gpu_s": round(self.busy_gpu_s, 1),
            **self.extra,
        }


def arm_metrics(
    arm: str, records: Sequence[Mapping[str, object]], gpus_per_node: int
) -> ArmMetrics:
    """Average and p99 JCT (end - submit), makespan (last end - first submit), average wait
    (start - submit), average emulated slowdown, and jobs that fit a node but spanned nodes."""
    if not records:
        raise EmulationError(f"arm {arm}: no job records")
    jcts = [float(r["end"]) - float(r["submit"]) for r in records]  # type: ignore[arg-type]
    waits = [float(r["start"]) - float(r["submit"]) for r in records]  # type: ignore[arg-type]
    first = min(float(r["submit"]) for r in records)  # type: ignore[arg-type]
    last = max(float(r["end"]) for r in records)  # type: ignore[arg-type]
    spread = sum(
        1  # type: ignore[misc]
        for r in records
        if int(r["gpus_asked"]) <= gpus_per_node  # type: ignore[call-overload]
        and len({g[0] for g in r["gpus"]}) > 1  # type: ignore[attr-defined]
    )
    slow = busy = 0.0
    for r in records:
        if "base" not in r or "gpus" not in r:
            continue
        gpus, base = len(r["gpus"]), float(r["base"])  # type: ignore[arg-type]
        factor = float(r["slowdown"])  # type: ignore[arg-type]
        penalty = float(r.get("penalty", 1.0))  # type: ignore[arg-type]
        worst = float(r.get("worst", factor / penalty))  # type: ignore[arg-type]
        slow += gpus * base * penalty * max(worst - 1.0, 0.0)
        busy += gpus * base * factor
    return ArmMetrics(
        arm,
        len(records),
        float(np.mean(jcts)),
        p99(jcts),
        last - first,
        float(np.mean(waits)),
        float(np.mean([float(r["slowdown"]) for r in records])),  # type: ignore[arg-type]
        spread,
        slow_gpu_s=slow,
        busy_gpu_s=busy,
    )


def compare(advisor: ArmMetrics, stock: ArmMetrics) -> dict[str, float]:
    """Ratios advisor / stock (lower is better for the advisor)."""
    return {
        "avg_jct_ratio": round(advisor.avg_jct / stock.avg_jct, 4),
        "p99_jct_ratio": round(advisor.p99_jct / stock.p99_jct, 4),
        "makespan_ratio": round(advisor.makespan / stock.makespan, 4),
    }
