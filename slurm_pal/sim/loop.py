"""The closed loop in simulation: GPUs that turn slow between campaigns, found and steered around.

Pieces (pure, seeded):

- :func:`fault_model` draws faults (per 1,000 GPU-days, slowdown factors, repair times, the
  share NVML can see as thermal/hardware clock slowdowns); :class:`Fault` is one of them, so
  tests and benchmarks can also place faults by hand.
- :func:`application_workload` turns a trace into repeated runs of applications with a run-to-run
  noise (coefficient of variation), which is what the runtime evidence needs: the same work
  measured again on other GPUs.
- :class:`FaultLoop` is the engine's :class:`~slurm_pal.sim.engine.SimHooks`: it degrades and
  repairs GPUs in the simulated truth, turns each ended job into the record the Prolog/Epilog
  would send (runtime, GPUs, NVML clock-event shares), and, by ``mode``, leaves placement
  alone (``"none"``: the advisor without the loop), feeds the records to
  :class:`~slurm_pal.core.suspicion.SuspicionDetector` and hands placement its suspects as
  outliers (``"detector"``), or tells placement each fault the moment it happens
  (``"oracle"``). With ``remeasure`` limits it also re-measures as the service does
  (:mod:`slurm_pal.core.remeasure`: the same choice, verdicts and recovery checks). It keeps
  what the benchmark reports: per fault, the jobs and hours until the GPU was suspect for the
  fault's most sensitive class; every suspicion of a healthy GPU.

A fault slows a GPU by ``factor`` for the most compute-bound class and by ``sensitivity``
times as much for the others (as :func:`~slurm_pal.sim.variability.few_slow_gpus`); jobs
that started before it keep their pace (the engine fixes a job's rate when it starts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from slurm_pal.core.drift import JobRun
from slurm_pal.core.remeasure import (
    HOUR_S,
    Attempt,
    RemeasureLimits,
    Verdict,
    budget_left,
    idle_pins,
    recovered,
    routine,
    to_remeasure,
    unsettled,
    verdict,
    wanted,
)
from slurm_pal.core.suspicion import (
    Change,
    GpuSignals,
    JobRecord,
    Suspicion,
    SuspicionDetector,
    measured_faults,
    outlier_scores,
)
from slurm_pal.core.workload import SimJob
from slurm_pal.sim.engine import JobEnd
from slurm_pal.sim.variability import SimGpus

__all__ = [
    "DEFAULT_SENSITIVITY",
    "Fault",
    "FaultLoop",
    "FaultOutcome",
    "application_workload",
    "fault_model",
]

DEFAULT_SENSITIVITY: tuple[float, ...] = (1.0, 0.5, 0.1, 0.0)
"""How much of a fault each class feels, in class order (compute-bound first)."""
MODES = ("none", "detector", "oracle")


@dataclass(frozen=True)
class Fault:
    """GPU ``gpu`` (simulated index) turns ``factor`` x slower for class ``job_class`` (None:
    the first, most compute-bound one) at ``at_s`` until ``repair_s``; ``visible``: NVML
    reports thermal/hardware clock slowdowns. A degraded memory or link hurts other classes
    than a clock fault does, so the class it hits is the fault's own."""

    gpu: int
    at_s: float
    factor: float
    repair_s: float = math.inf
    visible: bool = False
    job_class: str | None = None

    def hit(self, classes: Sequence[str]) -> str:
        """The class the fault slows by ``factor``."""
        if self.job_class is None:
            return classes[0]
        if self.job_class not in classes:
            raise ValueError(f"fault of class {self.job_class!r}; the GPUs have {list(classes)}")
        return self.job_class

    def factors(self, classes: Sequence[str], sensitivity: Sequence[float]) -> dict[str, float]:
        """The slowdown per class: ``sensitivity[k]`` of the fault for the classes ``k`` places
        from the one it hits in the class order (the order runs from compute- to memory-bound)."""
        hit = list(classes).index(self.hit(classes))
        weights = list(sensitivity) + [0.0] * len(classes)
        return {c: 1.0 + (self.factor - 1.0) * weights[abs(i - hit)] for i, c in enumerate(classes)}


def fault_model(
    n_gpus: int,
    days: float,
    *,
    per_1000_gpu_days: float = 2.0,
    factors: Sequence[float] = (1.5, 2.0),
    repair_days: float = 14.0,
    visible_share: float = 0.5,
    start_days: float = 0.0,
    seed: int = 0,
    classes: Sequence[str] = (),
) -> list[Fault]:
    """Faults over ``days`` from ``start_days`` on ``n_gpus``: a Poisson count at
    ``per_1000_gpu_days``, uniform times and GPUs (a GPU faults at most once), a factor drawn
    from ``factors``, repaired after an exponential time of mean ``repair_days`` (inf: never),
    visible to NVML with probability ``visible_share``, hitting a class drawn from ``classes``
    (empty: the first class of the GPUs, :attr:`Fault.job_class` None)."""
    if per_1000_gpu_days < 0 or not factors or days <= 0 or n_gpus < 1:
        raise ValueError("need a rate >= 0, at least one factor, days > 0 and GPUs")
    if any(not (f > 1 and math.isfinite(f)) for f in factors):
        raise ValueError(f"fault factors must be > 1 (2.0: twice as slow), got {list(factors)}")
    if not 0 <= visible_share <= 1:
        raise ValueError(f"the visible share must be in [0, 1], got {visible_share!r}")
    rng = np.random.default_rng(seed)
    count = min(n_gpus, int(rng.poisson(per_1000_gpu_days * n_gpus * days / 1000.0)))
    gpus = rng.choice(n_gpus, count, replace=False)
    times = rng.uniform(start_days * 86400.0, (start_days + days) * 86400.0, count)
    picks = rng.integers(0, len(factors), count)
    repairs = (
        rng.exponential(repair_days * 86400.0, count)
        if math.isfinite(repair_days)
        else np.full(count, math.inf)
    )
    visible = rng.uniform(0, 1, count) < visible_share
    # Drawn last, so the same seed places the same faults whatever the classes.
    hits = [classes[int(k)] for k in rng.integers(0, len(classes), count)] if classes else []
    faults = [
        Fault(int(g), float(t), float(factors[int(k)]), float(t + r), bool(v))
        for g, t, k, r, v in zip(gpus, times, picks, repairs, visible, strict=True)
    ]
    if hits:
        faults = [replace(f, job_class=c) for f, c in zip(faults, hits, strict=True)]
    return sorted(faults, key=lambda f: (f.at_s, f.gpu))


def application_workload(
    jobs: Sequence[SimJob],
    *,
    runs_per_app: int = 20,
    cv: float = 0.07,
    seed: int = 0,
    max_work_s: float = 7 * 24 * 3600.0,
) -> list[SimJob]:
    """The same jobs as repeated runs of applications: per class, jobs ranked by work are cut
    into groups of ``runs_per_app`` (an application's runs last about as long); each job's work
    becomes its group's geometric mean times a log-normal noise of coefficient of variation
    ``cv``. ``SimJob.model`` names the application. The trace's sizes, times, classes and
    limits stay (a tight limit may now be a little short: the simulator does not kill)."""
    if runs_per_app < 2 or not 0 <= cv < 1:
        raise ValueError("need runs_per_app >= 2 and 0 <= cv < 1")
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    noise = rng.lognormal(-sigma * sigma / 2, sigma, len(jobs)) if cv else np.ones(len(jobs))
    out = list(jobs)
    by_class: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_class.setdefault(job.job_class, []).append(i)
    for job_class, members in sorted(by_class.items()):
        ranked = sorted(members, key=lambda i: (jobs[i].work, i))
        for start in range(0, len(ranked), runs_per_app):
            group = ranked[start : start + runs_per_app]
            base = math.exp(float(np.mean([math.log(jobs[i].work) for i in group])))
            app = f"{job_class}-app{start // runs_per_app:04d}"
            for i in group:
                work = float(min(max(base * noise[i], 1.0), max_work_s))
                out[i] = replace(jobs[i], work=round(work, 3), model=app)
    return out


@dataclass
class FaultOutcome:
    """What happened to one fault: when (and after how many jobs) its GPU became suspect for
    the class the fault hits (or a re-measurement found it slow for it); None while not."""

    fault: Fault
    suspected_s: float | None = None
    jobs: int = 0  # jobs that ran on the faulty GPU (started after the fault) until then
    sensitive_jobs: int = 0  # those of the class it hits
    slowed_jobs: int = 0  # jobs it slowed >= min_slowdown (what steering is for)
    slowed_s: float = 0.0  # the run time it added to them
    slowed_gpu_s: float = 0.0  # and the GPU time (run time added times the job's GPUs)
    late_jobs: int = 0  # of those, jobs that started after the GPU was suspect (class A)
    late_s: float = 0.0  # and the run time it added to those
    mild_s: float = 0.0  # the run time it added to jobs it slowed less (no one steers those)

    @property
    def delay_s(self) -> float | None:
        return None if self.suspected_s is None else self.suspected_s - self.fault.at_s


@dataclass
class FaultLoop:
    """The engine's hooks for one simulated run (see the module docstring).

    ``floor``: the score a suspect (GPU, class) gets at least, above the policy's
    ``avoid_above`` so it is an outlier; ``min_slowdown``: a class the fault slows less than
    this is not steered by the oracle (the detector's own ``min_slowdown`` says it for the
    loop). ``signal_share``: the share of busy time a visible fault shows as hardware slowdown.

    Re-measures (opt-in: ``remeasure``, the site's ``advisor.remeasure_*`` limits), decided by
    the service's own code (:mod:`slurm_pal.core.remeasure`): after each round the hooks
    take the pairs :func:`~slurm_pal.core.remeasure.wanted` names (the detector's suspects,
    then the GPUs a re-measurement found slow) and :func:`~slurm_pal.core.remeasure.
    to_remeasure` picks among the GPUs idle with their label-mates, and hold those (as the
    service's job does: every GPU of the suspect's gres label on its node) for the class's
    benchmark, other jobs running on the node's other GPUs meanwhile. Labels are the site
    render's rule: one per PM signature (the GPU's placement score in every class, fixed at
    the start as the rendered gres.conf is; an increment does not relabel). ``probe_s`` at the
    campaign's pace times the GPU's true slowdown when it starts (the engine gives jobs no
    runtime noise, so neither has it). Its campaign time is ``probe_s`` times the GPU's score
    for the class. The detector's candidates (GPUs over its alarm that a partner ties) are
    measured as suspects are. A confirmed :func:`~slurm_pal.core.remeasure.verdict` makes the
    measured time the GPU's score for the class (the service's increment) and the detector
    takes the new score incrementally
    (:meth:`~slurm_pal.core.suspicion.SuspicionDetector.rescore`); a confirmed candidate
    counts as found then. A cleared one clears the detector's suspicion (and keeps it hidden,
    as the service's settlement). A GPU found slow is measured again and its score restored
    once it :func:`~slurm_pal.core.remeasure.recovered`. GPU time spent: ``probe_s_spent``.

    The detector hears each job as the service does: the class the advisor placed it as
    (``JobEnd.advised_class``), not its true class.
    """

    gpus: SimGpus
    faults: Sequence[Fault]
    mode: str = "none"
    detector: SuspicionDetector | None = None
    sensitivity: Sequence[float] = DEFAULT_SENSITIVITY
    floor: float = 1.51
    min_slowdown: float = 1.3
    signal_share: float = 0.6
    seed: int = 0
    probe_s: float = 900.0
    remeasure: RemeasureLimits | None = None
    outcomes: list[FaultOutcome] = field(default_factory=list, init=False)
    false_suspicions: list[tuple[str, str, float]] = field(default_factory=list, init=False)
    """(GPU, class, when) of every suspicion of a GPU no fault had slowed at all."""
    late_suspicions: list[tuple[str, str, float]] = field(default_factory=list, init=False)
    """Suspicions of a GPU after its fault was repaired."""
    weak_suspicions: list[tuple[str, str, float]] = field(default_factory=list, init=False)
    """Suspicions of a faulty GPU for a class the fault slows less than ``min_slowdown``."""
    records: int = field(default=0, init=False)
    probes_run: int = field(default=0, init=False)
    probe_s_spent: float = field(default=0.0, init=False)
    verdicts: list[tuple[str, str, float, bool, Verdict]] = field(default_factory=list, init=False)
    """(GPU, class, when, recheck, verdict) of every re-measurement judged."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.mode == "detector" and self.detector is None:
            self.detector = SuspicionDetector(min_slowdown=self.min_slowdown)
        self.classes = self.gpus.classes
        self.uuids = [spec.uuid for spec in self.gpus.specs()]
        self.index = {uuid: gpu for gpu, uuid in enumerate(self.uuids)}
        self.base_truth = {
            c: np.asarray(v, dtype=float) for c, v in self.gpus.true_slowdown.items()
        }
        self.base_scores = {
            uuid: {c: float(self.gpus.placement_scores[c][gpu]) for c in self.classes}
            for gpu, uuid in enumerate(self.uuids)
        }
        self.campaign_scores = {uuid: dict(per) for uuid, per in self.base_scores.items()}
        if self.detector is not None:
            self.detector.fit(self.base_scores)
        self.outcomes = [FaultOutcome(f) for f in self.faults]
        self.hits = [f.hit(self.classes) for f in self.faults]
        self._events = sorted(
            [(f.at_s, 1, n) for n, f in enumerate(self.faults)]
            + [(f.repair_s, 0, n) for n, f in enumerate(self.faults) if math.isfinite(f.repair_s)]
        )
        self._next = 0
        self._active: dict[int, int] = {}  # GPU -> index of its active fault
        self._dirty = False
        self._rng = np.random.default_rng(self.seed)
        self._truth: dict[str, list[float]] | None = None
        signatures: dict[tuple[float, ...], str] = {}
        self._site: list[tuple[str, str, str]] = []  # (GPU, node, gres label)
        for gpu, spec in enumerate(self.gpus.specs()):
            signature = tuple(float(self.gpus.placement_scores[c][gpu]) for c in self.classes)
            label = signatures.setdefault(signature, f"sig{len(signatures)}")
            self._site.append((spec.uuid, spec.node, label))
        self._attempts: list[Attempt] = []
        self._flights: dict[int, tuple[Attempt, bool]] = {}  # measured GPU -> (it, recheck)
        self._confirmed: dict[tuple[str, str], float] = {}  # found slow -> when
        self._settled: dict[tuple[str, str], float] = {}  # cleared -> when
        self._measured: dict[tuple[str, str], float] = {}  # last picked (campaign: time 0)

    # -- SimHooks -------------------------------------------------------------------------

    def advance(self, now: float, truth: dict[str, list[float]]) -> None:
        self._truth = truth
        while self._next < len(self._events) and self._events[self._next][0] <= now:
            _, starts, n = self._events[self._next]
            self._next += 1
            fault = self.faults[n]
            if starts:
                self._active[fault.gpu] = n
            elif self._active.get(fault.gpu) == n:
                del self._active[fault.gpu]
            per_class = fault.factors(self.classes, self.sensitivity) if starts else {}
            for c in self.classes:
                truth[c][fault.gpu] = float(self.base_truth[c][fault.gpu]) * per_class.get(c, 1.0)
            if self.mode == "oracle":
                self._dirty = True

    def job_ended(self, job: JobEnd) -> None:
        self.records += 1
        gpu_ids = [self.index[uuid] for uuid in job.gpus]
        self._count_cost(job, gpu_ids)
        signals: dict[str, GpuSignals] = {}
        for uuid, gpu in zip(job.gpus, gpu_ids, strict=True):
            fault = self._fault_during(gpu, job.start)
            if fault is not None:
                outcome = self.outcomes[fault]
                if outcome.suspected_s is None:
                    outcome.jobs += 1
                    outcome.sensitive_jobs += job.job_class == self.hits[fault]
            capped = float(self._rng.uniform(0.0, 0.9))  # power capping: normal, no fault
            events = {"sw_power_cap": capped}
            if fault is not None and self.faults[fault].visible:
                events["hw_slowdown"] = self.signal_share
            signals[uuid] = GpuSignals(clock_events=events)
        if self.detector is None:
            return
        run = JobRun(
            job.job_id, job.app or job.job_id, job.placed_class, job.gpus, job.end - job.start
        )
        self._apply(self.detector.update(JobRecord(run, job.end, signals, job.penalty)))

    def probes(self, now: float, free: Sequence[bool]) -> list[tuple[int, float]]:
        """Re-measures to start now (see the class docstring): (GPU, seconds) for each GPU
        each one holds (the measured GPU and its label-mates on its node)."""
        limits, truth = self.remeasure, self._truth
        if limits is None or self.detector is None or truth is None:
            return []
        keep_s = max(HOUR_S, limits.retry_s)  # what the budget and the retry delay read
        self._attempts = [a for a in self._attempts if not a.done or now - a.submitted_s < keep_s]
        idle = idle_pins(self._site, {self.uuids[g] for g, ok in enumerate(free) if ok})
        pending = self._suspects() + unsettled(self.detector.candidates(), self._settled)
        found = wanted(
            pending, self._confirmed, self.base_scores, now, limits, self._settled,
            self.campaign_scores,
        )  # fmt: skip
        if budget_left(self._attempts, now, limits):
            found += routine(idle, self.classes[0], self._measured, 0.0, now, limits)
        out: list[tuple[int, float]] = []
        for pick in to_remeasure(found, idle, self._attempts, now, limits):
            gpu, pin = self.index[pick.gpu], idle[pick.gpu]
            attempt = Attempt(pick.gpu, pick.job_class, pin.node, now, held=pin.gpus)
            self._attempts.append(attempt)
            self._measured[(pick.gpu, pick.job_class)] = now
            self._flights[gpu] = (attempt, pick.recheck)
            seconds = self.probe_s * truth[pick.job_class][gpu]
            out += [(self.index[member], seconds) for member in pin.gpus]
        return out

    def probe_ended(self, gpu: int, start: float, end: float) -> None:
        """Judge the re-measure on ``gpu`` as the service does (its label-mates were only
        held)."""
        self.probe_s_spent += end - start
        flight = self._flights.pop(gpu, None)
        if flight is None:
            return
        attempt, recheck = flight
        assert self.remeasure is not None and self.detector is not None
        self.probes_run += 1
        self._attempts = [replace(a, done=True) if a is attempt else a for a in self._attempts]
        key = (attempt.gpu, attempt.job_class)
        campaign_s = self.probe_s * self.base_scores[key[0]][key[1]]
        judge = recovered if recheck else verdict
        result = judge(end - start, campaign_s, self.remeasure.slower)
        self.verdicts.append((*key, end, recheck, result))
        if result.confirmed:  # an increment: the measured time is the GPU's score now
            if not recheck:
                self._confirmed[key] = end
                if key not in {(s.gpu, s.job_class) for s in self.detector.suspects()}:
                    self._judge(*key, end)  # a candidate: found by the re-measurement
            score = (end - start) / self.probe_s
            self.base_scores[key[0]][key[1]] = score
            self._apply(self.detector.rescore(*key, score, end, result.why))
            self._dirty = True
        elif not recheck:
            self._settled[key] = end
            self.detector.clear(*key, end, result.why)
            self._dirty = True

    def _suspects(self) -> list[Suspicion]:
        """The detector's suspects less those a re-measurement cleared."""
        assert self.detector is not None
        return unsettled(self.detector.suspects(), self._settled)

    def _apply(self, changes: Sequence[Change]) -> None:
        for change in changes:
            self._dirty = True
            if change.suspect:
                self._judge(change.gpu, change.job_class, change.at_s)

    def scores(self) -> Mapping[str, Sequence[float]] | None:
        if not self._dirty:
            return None
        self._dirty = False
        if self.mode == "oracle":
            suspects = [
                Suspicion(self.uuids[gpu], c, f.at_s, f.at_s, "oracle", factor, 0)
                for gpu, n in self._active.items()
                for f in [self.faults[n]]
                for c, factor in f.factors(self.classes, self.sensitivity).items()
                if factor >= self.min_slowdown
            ]
            faults: list[tuple[str, str]] = []
        else:
            suspects = self._suspects()
            assert self.detector is not None
            # Confirmed by re-measurement: steered as a suspect until found recovered.
            faults = measured_faults(
                self.base_scores, self.campaign_scores, self.detector.min_slowdown
            )
        table = outlier_scores(self.base_scores, suspects, self.floor, faults)
        return {c: [table[uuid][c] for uuid in self.uuids] for c in self.classes}

    # -- bookkeeping ------------------------------------------------------------------------

    def _fault_during(self, gpu: int, start: float) -> int | None:
        """The fault that slowed a job started at ``start`` on ``gpu`` (None: healthy then)."""
        n = self._active.get(gpu)
        if n is None or self.faults[n].at_s > start:
            return None
        return n

    def _count_cost(self, job: JobEnd, gpu_ids: Sequence[int]) -> None:
        """The run time a fault added to ``job`` (jobs keep the pace they started with: the
        slowest of its GPUs at its start against the same GPUs unfaulted), charged to the
        fault of its slowest GPU: jobs slowed ``min_slowdown`` or more (those the oracle keeps
        off) split by whether they started after the GPU was suspect, the others apart."""
        base = self.base_truth[job.job_class]
        worst_base = max(float(base[g]) for g in gpu_ids)
        worst, culprit = worst_base, None
        for gpu in gpu_ids:
            n = self._fault_during(gpu, job.start)
            if n is None:
                continue
            factor = self.faults[n].factors(self.classes, self.sensitivity)[job.job_class]
            value = float(base[gpu]) * factor
            if value > worst:
                worst, culprit = value, n
        if culprit is None:
            return
        added = (job.end - job.start) * (1.0 - worst_base / worst)
        outcome = self.outcomes[culprit]
        if worst / worst_base < self.min_slowdown:
            outcome.mild_s += added
            return
        outcome.slowed_jobs += 1
        outcome.slowed_s += added
        outcome.slowed_gpu_s += added * len(gpu_ids)
        if outcome.suspected_s is not None and job.start >= outcome.suspected_s:
            outcome.late_jobs += 1
            outcome.late_s += added

    def _judge(self, uuid: str, job_class: str, at: float) -> None:
        gpu = self.index[uuid]
        n = self._active.get(gpu)
        if n is None:
            repaired = any(f.gpu == gpu and f.at_s <= at for f in self.faults)
            # Evidence from runs made before a repair can still arrive after it.
            (self.late_suspicions if repaired else self.false_suspicions).append(
                (uuid, job_class, at)
            )
            return
        fault = self.faults[n]
        if fault.factors(self.classes, self.sensitivity)[job_class] < self.min_slowdown:
            self.weak_suspicions.append((uuid, job_class, at))
        outcome = self.outcomes[n]
        if job_class == self.hits[n] and outcome.suspected_s is None:
            outcome.suspected_s = at
