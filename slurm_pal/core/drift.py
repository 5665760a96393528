"""Drift detection from production jobs: which GPUs got slower since their campaign (pure).

A campaign's PM-scores say how fast every GPU is per class. In production the Prolog/Epilog
records say which GPUs each job used and how long it ran (``advisor/PROTOCOL.md``, op
``record``). PAL's model makes a job's runtime proportional to its application's base time
times the *worst* PM-score of its GPUs for its class (the slowest GPU holds the others back),
so one application's runs on different GPUs are comparable once divided by that score.

For each GPU, every run that used it is compared with the same application's runs on *other*
GPUs (leave-the-GPU-out, so a GPU never serves as its own baseline)::

    expected = median(runtime / worst score, other runs of the app) x worst score of this run
    residual = observed / expected - 1

A run is evidence about its bottleneck GPUs only (those with its worst score): a GPU faster
than its partners can slow down a few percent without the job noticing. A GPU is listed when
it has enough runs, their median residual is above the threshold and most
of them agree (a consistent slowdown, not one slow job). A slow GPU slows every multi-GPU job
it is part of, so its partners look slow too: GPUs are confirmed greedily, worst first, and
the runs of a confirmed GPU no longer count as evidence against its partners nor as anyone's
baseline. The listed GPUs are candidates for a targeted re-measurement
(``slurm-pal campaign suggest``), not a verdict: the campaign decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

DEFAULT_THRESHOLD = 0.05
"""A GPU whose runs take 5 % longer than expected (median) is a candidate."""
DEFAULT_MIN_RUNS = 5
DEFAULT_MIN_BASELINE = 3
DEFAULT_CONSISTENCY = 0.6


@dataclass(frozen=True)
class JobRun:
    """One finished job as drift detection sees it.

    ``app`` is what makes runs comparable: the job's history key (user, job name, script
    sha256, joined) or the application it was resolved to. ``gpus`` are GPU ids as the
    campaign names them (NVML UUIDs, or ``node/gpuN`` where NVML was missing).
    """

    job_id: str
    app: str
    job_class: str
    gpus: tuple[str, ...]
    runtime_s: float
    family: str = ""
    """A coarser key of the same work (the user and job name: a script edited between
    submissions changes ``app`` but not this); '' when there is none."""


@dataclass(frozen=True)
class RunEvidence:
    """One run of a GPU against its expectation."""

    job_id: str
    app: str
    expected_s: float
    observed_s: float

    @property
    def residual(self) -> float:
        return self.observed_s / self.expected_s - 1.0


@dataclass(frozen=True)
class GpuDrift:
    """What production says about one GPU (listed or not)."""

    gpu: str
    runs: int
    apps: int
    median_residual: float
    share_slower: float  # share of its runs slower than expected by more than the threshold
    expected_s: float  # median expected runtime of its runs
    observed_s: float  # median observed runtime of its runs
    drifting: bool
    classes: tuple[str, ...] = ()
    examples: tuple[RunEvidence, ...] = ()  # the runs with the largest residuals
    note: str = ""

    @property
    def node(self) -> str:
        """The node part of a ``node/gpuN`` id ('' for NVML UUIDs)."""
        return self.gpu.split("/", 1)[0] if "/" in self.gpu else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "runs": self.runs,
            "apps": self.apps,
            "median_residual": self.median_residual,
            "share_slower": self.share_slower,
            "expected_s": self.expected_s,
            "observed_s": self.observed_s,
            "drifting": self.drifting,
            "classes": list(self.classes),
            "examples": [
                {
                    "job_id": e.job_id,
                    "app": e.app,
                    "expected_s": e.expected_s,
                    "observed_s": e.observed_s,
                    "residual": e.residual,
                }
                for e in self.examples
            ],
            "note": self.note,
        }


@dataclass
class DriftDetector:
    """Finds GPUs whose production runs are consistently slower than their PM-scores say.

    Scikit-learn style: settings here, data in :meth:`fit`, results in attributes ending in
    ``_`` and :meth:`drifting_gpus`.

    * ``threshold``: the median residual (observed / expected - 1) above which a GPU drifts.
    * ``min_runs``: fewer runs with a baseline than this and a GPU is never listed.
    * ``min_baseline``: runs of the same application on other GPUs needed for an expectation.
    * ``consistency``: share of a GPU's runs that must be slower than ``threshold / 2``.
    """

    threshold: float = DEFAULT_THRESHOLD
    min_runs: int = DEFAULT_MIN_RUNS
    min_baseline: int = DEFAULT_MIN_BASELINE
    consistency: float = DEFAULT_CONSISTENCY
    n_examples: int = 3
    gpus_: dict[str, GpuDrift] = field(default_factory=dict, init=False, repr=False)
    skipped_: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold must be > 0 (0.05 = 5 % slower), got {self.threshold!r}")
        if self.min_runs < 1:
            raise ValueError(f"min_runs must be at least 1, got {self.min_runs!r}")
        if self.min_baseline < 1:
            raise ValueError(f"min_baseline must be at least 1, got {self.min_baseline!r}")
        if not 0 <= self.consistency <= 1:
            raise ValueError(f"consistency must be in [0, 1], got {self.consistency!r}")

    def fit(
        self, runs: Iterable[JobRun], scores: Mapping[str, Mapping[str, float]]
    ) -> DriftDetector:
        """``scores``: GPU id -> class -> PM-score of the active campaign."""
        usable: list[JobRun] = []
        self.skipped_ = {}
        for run in runs:
            problem = run_problem(run, scores)
            if problem:
                self.skipped_[run.job_id] = problem
                continue
            usable.append(run)
        data = _Runs(usable, scores)

        confirmed: set[str] = set()
        alive = np.ones(len(usable), dtype=bool)  # runs no confirmed GPU explains
        results: dict[str, GpuDrift] = {}
        while True:
            best: GpuDrift | None = None
            for gpu in data.gpu_runs:
                if gpu in confirmed:
                    continue
                drift = self._judge(gpu, data, alive)
                results[gpu] = drift
                if drift.drifting and (
                    best is None or drift.median_residual > best.median_residual
                ):
                    best = drift
            if best is None:
                break
            confirmed.add(best.gpu)
            results[best.gpu] = best
            alive[data.gpu_runs[best.gpu]] = False
            if not alive.any():
                break
        self.gpus_ = dict(sorted(results.items()))
        return self

    def drifting_gpus(self) -> list[GpuDrift]:
        """The listed GPUs, slowest first."""
        listed = [d for d in self.gpus_.values() if d.drifting]
        return sorted(listed, key=lambda d: (-d.median_residual, d.gpu))

    def _judge(self, gpu: str, data: _Runs, alive: np.ndarray) -> GpuDrift:
        own = data.gpu_runs[gpu]
        neck = data.bottleneck_runs.get(gpu, np.zeros(0, dtype=int))
        mine = neck[alive[neck]]
        uses = np.zeros(len(data.runs), dtype=bool)
        uses[own] = True
        evidence: list[RunEvidence] = []
        classes: set[str] = set()
        for app in sorted({data.runs[i].app for i in mine}):
            idx = data.app_runs[app]
            base = data.norm[idx[alive[idx] & ~uses[idx]]]
            if len(base) < self.min_baseline:
                continue
            median = float(np.median(base))
            for i in mine:
                run = data.runs[i]
                if run.app == app:
                    evidence.append(
                        RunEvidence(run.job_id, app, median * data.worst[i], run.runtime_s)
                    )
                    classes.add(run.job_class)
        if not evidence:
            note = (
                f"no run with {self.min_baseline}+ runs of its application on other GPUs"
                if len(mine)
                else "no runs"
            )
            return GpuDrift(gpu, 0, 0, math.nan, 0.0, math.nan, math.nan, False, note=note)
        residuals = np.array([e.residual for e in evidence])
        median = float(np.median(residuals))
        share = float(np.mean(residuals > self.threshold / 2))
        enough = len(evidence) >= self.min_runs
        drifting = enough and median > self.threshold and share >= self.consistency
        note = "" if enough else f"only {len(evidence)} run(s) with a baseline (< {self.min_runs})"
        examples = sorted(evidence, key=lambda e: (-e.residual, e.job_id))[: self.n_examples]
        return GpuDrift(
            gpu=gpu,
            runs=len(evidence),
            apps=len({e.app for e in evidence}),
            median_residual=median,
            share_slower=share,
            expected_s=float(np.median([e.expected_s for e in evidence])),
            observed_s=float(np.median([e.observed_s for e in evidence])),
            drifting=drifting,
            classes=tuple(sorted(classes)),
            examples=tuple(examples),
            note=note,
        )


class _Runs:
    """The usable runs, indexed by application and by GPU (numpy index arrays).

    A run is evidence about its *bottleneck* GPUs only (those with its worst score): a GPU
    with a better score than its partners may slow down by a few percent unseen, since the
    job waits for the slowest one anyway. It is kept out of the baseline of every GPU it used.
    """

    def __init__(self, runs: list[JobRun], scores: Mapping[str, Mapping[str, float]]) -> None:
        self.runs = runs
        worst = []
        apps: dict[str, list[int]] = {}
        gpus: dict[str, list[int]] = {}
        necks: dict[str, list[int]] = {}
        for i, run in enumerate(runs):
            slowest, bottlenecks = bottleneck(run, scores)
            worst.append(slowest)
            apps.setdefault(run.app, []).append(i)
            for g in dict.fromkeys(run.gpus):
                gpus.setdefault(g, []).append(i)
            for g in bottlenecks:
                necks.setdefault(g, []).append(i)
        self.worst = np.array(worst, dtype=float)
        self.norm = np.array([r.runtime_s for r in runs], dtype=float) / self.worst
        self.app_runs = {a: np.array(v, dtype=int) for a, v in apps.items()}
        self.gpu_runs = {g: np.array(v, dtype=int) for g, v in sorted(gpus.items())}
        self.bottleneck_runs = {g: np.array(v, dtype=int) for g, v in necks.items()}


def bottleneck(
    run: JobRun, scores: Mapping[str, Mapping[str, float]], within: float = 1.0
) -> tuple[float, tuple[str, ...]]:
    """The run's worst PM-score for its class and the GPUs that have it: the job waits for the
    slowest GPU, so only those can be judged by its runtime (a usable run, see
    :func:`run_problem`). ``within`` > 1 also names the GPUs whose score is within that factor
    of the worst: slowed by that much, any of them would hold the job back instead."""
    per_gpu = {g: float(scores[g][run.job_class]) for g in run.gpus}
    slowest = max(per_gpu.values())
    floor = slowest / within * (1 - 1e-9)
    return slowest, tuple(g for g, score in per_gpu.items() if score >= floor)


def run_problem(run: JobRun, scores: Mapping[str, Mapping[str, float]]) -> str:
    """Why ``run`` cannot be judged against the campaign ('' when it can)."""
    if not run.gpus:
        return "no GPUs recorded"
    if not (run.runtime_s > 0 and math.isfinite(run.runtime_s)):
        return f"runtime {run.runtime_s!r} s is not a positive duration"
    unknown = [g for g in run.gpus if g not in scores]
    if unknown:
        return f"GPU(s) {', '.join(unknown)} not in the campaign"
    missing = [g for g in run.gpus if run.job_class not in scores[g]]
    if missing:
        return f"class {run.job_class!r} has no score on {', '.join(missing)}"
    if not all(float(scores[g][run.job_class]) > 0 for g in run.gpus):
        return "a PM-score <= 0 in the campaign"
    return ""


# -- from the hooks' records -----------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """What the advisor knew of a job: its application key and its class (``family``: the
    coarser key, :attr:`JobRun.family`)."""

    app: str
    job_class: str
    family: str = ""


def job_span(records: Iterable[Mapping[str, object]]) -> tuple[float, float] | None:
    """When a job ran, from its Prolog/Epilog records (PROTOCOL.md op ``record``; one job's,
    over all its nodes): its first Prolog's ``time`` and its last Epilog's. None without a
    Prolog or an Epilog record, or with a record whose ``time`` is not a number."""
    starts: list[float] = []
    ends: list[float] = []
    try:
        for rec in records:
            kind = rec.get("kind")
            if kind == "prolog":
                starts.append(float(rec["time"]))  # type: ignore[arg-type]
            elif kind == "epilog":
                ends.append(float(rec["time"]))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    return (min(starts), max(ends)) if starts and ends else None


def runs_from_records(
    records: Iterable[Mapping[str, object]],
    jobs: Mapping[str, JobInfo],
    gpu_ids: Mapping[tuple[str, int], str],
) -> tuple[list[JobRun], dict[str, str]]:
    """Pair Prolog and Epilog records (PROTOCOL.md op ``record``) into finished runs.

    Runtime is the last Epilog time minus the first Prolog time over the job's nodes. GPUs
    are the Prolog's NVML ``uuids`` when it has them, else its ``slurm_gpus`` mapped through
    ``gpu_ids`` ((node, Slurm index) -> GPU id, from labels.json's ``slurm_index``). Returns
    the runs and, per job id left out, why (still running, unknown job, unmapped GPU).
    """
    by_job: dict[str, dict[str, list[Mapping[str, object]]]] = {}
    for rec in records:
        job = str(rec.get("job_id", ""))
        by_job.setdefault(job, {}).setdefault(str(rec.get("kind", "")), []).append(rec)
    runs: list[JobRun] = []
    skipped: dict[str, str] = {}
    for job_id in sorted(by_job):
        kinds = by_job[job_id]
        pro, epi = kinds.get("prolog", []), kinds.get("epilog", [])
        if not pro or not epi:
            skipped[job_id] = "no epilog record yet" if pro else "no prolog record"
            continue
        codes = [r.get("exit_code") for r in epi if r.get("exit_code") not in (None, 0)]
        if codes:
            skipped[job_id] = f"the job failed (exit code {codes[0]}): its runtime says nothing"
            continue
        info = jobs.get(job_id)
        if info is None:
            skipped[job_id] = "no advisor decision (application and class unknown)"
            continue
        gpus: list[str] = []
        problem = ""
        for rec in sorted(pro, key=lambda r: str(r.get("node", ""))):
            node = str(rec.get("node", ""))
            uuids = rec.get("uuids")
            if isinstance(uuids, list) and uuids:
                gpus += [str(u) for u in uuids]
                continue
            for index in rec.get("slurm_gpus") or []:  # type: ignore[attr-defined]
                gpu = gpu_ids.get((node, int(index)))
                if gpu is None:
                    problem = f"{node} Slurm GPU {index} is not in the labels"
                    break
                gpus.append(gpu)
        if problem:
            skipped[job_id] = problem
            continue
        span = job_span(pro + epi)
        if span is None:
            skipped[job_id] = "a record without a numeric 'time'"
            continue
        start, end = span
        runs.append(JobRun(job_id, info.app, info.job_class, tuple(gpus), end - start, info.family))
    return runs, skipped
