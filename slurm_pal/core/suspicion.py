"""Suspicion: which GPUs turned slow since their campaign, found from every job record (pure).

A campaign measures every GPU once; a fan that fails later, a hardware slowdown or a degraded
link makes a GPU slow until the next one. The advisor sees each finished job (Prolog/Epilog
records: GPUs, runtime, and what NVML read while it ran), so it can learn the change from
ordinary jobs, one record at a time, and steer the classes the GPU now hurts off it at once.

Two kinds of evidence, per (GPU, job class):

- **Runtime**: :mod:`slurm_pal.core.drift`'s leave-one-out residual, made incremental. A run is
  compared with its application's recent runs on *other* GPUs (normalized by their worst
  PM-score and the locality penalty of their spread), ``r = log(observed / expected)``, and
  accuses the GPUs a ``min_slowdown`` fault would make its bottleneck. A CUSUM of the
  log-likelihood ratio "slowed by ``min_slowdown``" vs "as the campaign says", with the
  residual scaled by the run-to-run noise pooled over recent runs, accumulates it; the GPU
  becomes suspect for that class once the sum reaches ``alarm`` over at least ``min_runs``
  runs and is clearly ahead of every GPU it shared slow runs with. One slow job does not do it
  (each run's weight is capped, and a multi-GPU run's is shared among the GPUs it accuses), a
  consistent slowdown does within a few runs, and noise that keeps runs within a few per cent
  of their baseline drives the sum back to zero. A run that used a GPU already suspect for its
  class is explained by it: it is no evidence against its partners and no one's baseline; when
  a GPU becomes suspect, the runs it shared stop counting against its partners (drift's greedy
  confirmation).
- **Direct signals** the hooks read through NVML: the share of busy time under thermal or
  hardware clock slowdowns (:data:`~slurm_pal.core.campaigns.COOLING_EVENTS`; power capping is
  the normal state of a busy GPU and is no fault), and the busy SM clock against the same
  model's median when power capping does not explain it (:mod:`slurm_pal.core.clocks`), and
  memory that awaits a reset or has failed (:data:`MEMORY_FAULTS`). One such record makes the
  GPU suspect for ``signal_classes`` (the clock-bound classes it hurts) at once.

Clearing is the mirror: a suspect GPU whose later runs of that class look normal (the reverse
CUSUM reaches ``clear_alarm``) or whose later records show clean signals (``clear_records``)
is cleared; a runtime suspicion no run has spoken to for ``recheck_s`` goes on probation; a
re-measurement that clears one (core/remeasure.py) drops it and its evidence (:meth:`clear`).
The clock is the records' own end times; nothing here reads a clock or a file.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from slurm_pal.core.campaigns import COOLING_EVENTS
from slurm_pal.core.drift import DEFAULT_MIN_BASELINE, JobRun, RunEvidence, bottleneck, run_problem

__all__ = [
    "CAP_EXCUSES",
    "LINK_FAULTS",
    "MEMORY_FAULTS",
    "POWER_CAP_EVENTS",
    "Change",
    "GpuSignals",
    "JobRecord",
    "Suspicion",
    "SuspicionDetector",
    "measured_faults",
    "outlier_scores",
    "replay",
]

POWER_CAP_EVENTS: tuple[str, ...] = ("sw_power_cap",)
"""Clock-event reasons that explain a low clock without a fault: a busy GPU at its power limit."""
CAP_EXCUSES = 0.5
"""Share of busy time at the power limit from which a low busy clock is no evidence."""
MEMORY_FAULTS: dict[str, str] = {
    "row_remap_failure": "row remapping failed (uncorrectable memory: replace or RMA)",
    "row_remap_pending": "row remapping pending (reset the GPU to apply it)",
    "retired_pages_pending": "page retirement pending (reset the GPU to apply it)",
}
"""NVML memory states that are a fault, by the name the hooks send: the GPU keeps running
jobs, but on memory that has failed or awaits a reset (Ampere+ remap rows, older GPUs retire
pages)."""
LINK_FAULTS: dict[str, str] = {
    "pcie_width_degraded": "PCIe link narrower than the GPU and its slot allow while busy "
    "(trained down: reseat or replace the card or riser)",
}
"""NVML link states that are a fault, by the name the hooks send: no clock reason shows them."""


@dataclass(frozen=True)
class GpuSignals:
    """What NVML read on one GPU while the job ran.

    ``clock_events``: reason -> share of the busy time it was active (the runner's reason
    names); ``event_samples``: the busy samples those shares are over (a clean reading has no
    reason but some samples, and only then does it count as clean); ``sm_clock_ratio``: busy
    SM clock over the median of the same model's GPUs (None: not read or no peers yet; the
    service computes it from ``sm_clock_mhz``, see :mod:`slurm_pal.core.clocks`);
    ``memory_faults``: what the GPU's memory reported that needs a reset or the vendor
    (:data:`MEMORY_FAULTS`); ``link_faults``: its links' (:data:`LINK_FAULTS`). An empty
    record says nothing, so it neither accuses nor clears.
    """

    clock_events: Mapping[str, float] = field(default_factory=dict)
    sm_clock_ratio: float | None = None
    event_samples: int = 0
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    memory_faults: tuple[str, ...] = ()
    link_faults: tuple[str, ...] = ()

    @property
    def read(self) -> bool:
        return (
            bool(self.clock_events)
            or self.event_samples > 0
            or self.sm_clock_ratio is not None
            or bool(self.memory_faults)
            or bool(self.link_faults)
        )

    @property
    def power_capped(self) -> float:
        """Share of the busy time at the power limit (what excuses a low clock)."""
        return sum(self.clock_events.get(name, 0.0) for name in POWER_CAP_EVENTS)

    def fault(self, share: float, clock_ratio: float) -> str:
        """Why these readings mean a fault ('' when they do not)."""
        memory = [MEMORY_FAULTS[name] for name in self.memory_faults if name in MEMORY_FAULTS]
        links = [LINK_FAULTS[name] for name in self.link_faults if name in LINK_FAULTS]
        if memory or links:
            return ", ".join(memory + links)
        cooling = {
            name: value
            for name, value in self.clock_events.items()
            if name in COOLING_EVENTS and value >= share
        }
        if cooling:
            worst = max(cooling, key=lambda name: (cooling[name], name))
            return f"{worst} {cooling[worst]:.0%} of busy time"
        ratio = self.sm_clock_ratio
        if ratio is not None and ratio <= clock_ratio and self.power_capped < CAP_EXCUSES:
            return f"busy SM clock {ratio:.2f}x the model's median, not power capped"
        return ""


@dataclass(frozen=True)
class JobRecord:
    """One finished job: the run drift detection judges, when it ended (the detector's clock),
    per GPU id the direct signals read while it ran, and the locality penalty of its spread
    in the advisor's topology (a job across nodes runs slower on healthy GPUs too)."""

    run: JobRun
    end_s: float
    signals: Mapping[str, GpuSignals] = field(default_factory=dict)
    penalty: float = 1.0


@dataclass(frozen=True)
class Suspicion:
    """A GPU suspect for one class: what the admin sees and placement acts on.

    ``since_s``: the record that made it suspect; ``onset_s``: when the evidence began (the
    start of the first run of the streak), the best guess of when the GPU changed;
    ``slowdown``: the median observed / expected of the streak (nan: a signal alone).
    """

    gpu: str
    job_class: str
    since_s: float
    onset_s: float
    cause: str
    slowdown: float
    runs: int
    evidence: tuple[RunEvidence, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "job_class": self.job_class,
            "since_s": self.since_s,
            "onset_s": self.onset_s,
            "cause": self.cause,
            "slowdown": self.slowdown,
            "runs": self.runs,
            "evidence": [
                {"job_id": e.job_id, "app": e.app, "expected_s": e.expected_s,
                 "observed_s": e.observed_s, "residual": e.residual}
                for e in self.evidence
            ],
        }  # fmt: skip


@dataclass(frozen=True)
class Change:
    """A GPU became suspect for a class (``suspect``), or was cleared, at ``at_s``."""

    gpu: str
    job_class: str
    suspect: bool
    at_s: float
    why: str


@dataclass(frozen=True)
class _Entry:
    """One run counted in a (GPU, class) streak."""

    evidence: RunEvidence
    gpus: frozenset[str]
    start_s: float
    log_residual: float
    llr: float
    accused: int = 1  # GPUs this run could accuse (1: its slowness is this GPU's alone)


@dataclass
class _Track:
    """The CUSUM state of one (GPU, class)."""

    score: float = 0.0
    entries: list[_Entry] = field(default_factory=list)
    suspicion: Suspicion | None = None
    runtime: bool = False  # the runtime evidence made it suspect
    signal: bool = False  # a fault signal made it suspect
    clear_score: float = 0.0
    clean_records: int = 0
    normal_runs: int = 0
    last_s: float = -math.inf  # end of the last run that counted here
    over_s: float | None = None  # when its sum reached remeasure_at of the alarm


@dataclass
class SuspicionDetector:
    """Turns job records into suspect GPUs, per class, one record at a time.

    Scikit-learn style: settings here, :meth:`fit` with the campaign's scores (and any
    records so far), :meth:`update` per finished job, :meth:`suspects` for the result.

    * ``min_slowdown``: the slowdown the runtime test looks for (1.3: 30 % slower); smaller
      ones are the campaign's business, not a fault to steer around. At 1.2, GPUs that were
      only 9-10 % off their campaign score (binning error) drifted into suspicion on noisy
      synthetic histories.
    * ``alarm``: the CUSUM sum (log-likelihood ratio) that makes a GPU suspect; ``min_runs``:
      never on fewer runs than this, and one run adds at most ``alarm / min_runs`` (shared
      among its bottleneck GPUs); ``z_cap``: one run counts at most this many noise sigmas.
    * ``min_baseline``: runs of the application on other GPUs needed to judge a run;
      ``window``: how many of its recent runs make the baseline.
    * ``noise``: the residuals' log spread assumed until ``min_noise_runs`` runs have been
      judged; then it is measured over the last ``noise_runs`` (never below ``noise_floor``).
    * ``signal_share``: share of busy time under a thermal/hardware slowdown that is a fault;
      ``clock_ratio``: busy SM clock ratio at or below which it is one (unless power capped);
      ``signal_classes``: the classes a clock fault hurts (None: every class).
    * ``clear_alarm``: the reverse sum that clears a runtime suspicion; ``clear_records``:
      records with clean signals that clear a signal suspicion.
    * ``recheck_s``: a runtime suspicion that has seen no run of its class for this long is
      lifted on probation (None: never). Placement keeps the class off a suspect GPU, so
      without it a repaired GPU would rarely get the runs that clear it; its evidence is
      kept, so one more slow run makes it suspect again.
    * ``remeasure_at``: the share of ``alarm`` from which a (GPU, class) is a candidate for a
      re-measurement (:meth:`candidates`): a benchmark settles what more runs would take
      days to, and a candidate is never steered by, so it costs a probe, not a false alarm.
    """

    min_slowdown: float = 1.3
    alarm: float = 12.0
    min_runs: int = 2
    z_cap: float = 6.0
    min_baseline: int = DEFAULT_MIN_BASELINE
    window: int = 50
    noise: float = 0.1
    noise_floor: float = 0.03
    min_noise_runs: int = 30
    noise_runs: int = 500
    signal_share: float = 0.2
    clock_ratio: float = 0.85
    signal_classes: tuple[str, ...] | None = None
    clear_alarm: float = 6.0
    clear_records: int = 2
    recheck_s: float | None = 72 * 3600.0
    remeasure_at: float = 0.5
    n_examples: int = 5
    skipped_: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    changes_: list[Change] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.min_slowdown > 1 and math.isfinite(self.min_slowdown)):
            raise ValueError(
                f"min_slowdown must be > 1 (1.2 = 20 % slower), got {self.min_slowdown!r}"
            )
        for name in ("alarm", "z_cap", "noise", "noise_floor", "clear_alarm", "signal_share"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name in ("min_runs", "min_baseline", "window", "clear_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if self.window < self.min_baseline:
            raise ValueError("window must hold at least min_baseline runs")
        if not 0 < self.remeasure_at <= 1:
            raise ValueError(f"remeasure_at must be in (0, 1], got {self.remeasure_at!r}")
        self._look = self.alarm * self.remeasure_at
        self._scores: dict[str, dict[str, float]] = {}
        self._apps = _Baselines(self.window)
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._residuals: deque[float] = deque(maxlen=self.noise_runs)
        self._suspect_keys: set[tuple[str, str]] = set()

    # -- public ----------------------------------------------------------------------------

    def fit(
        self, scores: Mapping[str, Mapping[str, float]], records: Iterable[JobRecord] = ()
    ) -> SuspicionDetector:
        """Start over with the active campaign's ``scores`` (GPU id -> class -> PM-score)."""
        self._scores = {gpu: {c: float(v) for c, v in per.items()} for gpu, per in scores.items()}
        self._apps = _Baselines(self.window)
        self._tracks = {}
        self._residuals = deque(maxlen=self.noise_runs)
        self._suspect_keys = set()
        self.skipped_ = {}
        self.changes_ = []
        for record in records:
            self.update(record)
        return self

    def update(self, record: JobRecord) -> list[Change]:
        """Take one finished job; returns the suspicions it started or cleared."""
        run = record.run
        problem = run_problem(run, self._scores)
        if problem:
            self.skipped_[run.job_id] = problem
            return []
        changes = self._recheck(record.end_s)
        changes += self._signals(record)
        changes += self._runtime(record)
        self.changes_ += changes
        return changes

    def suspects(self) -> list[Suspicion]:
        """Every current suspicion, by GPU then class."""
        found = [t.suspicion for t in self._tracks.values() if t.suspicion is not None]
        return sorted(found, key=lambda s: (s.gpu, s.job_class))

    def candidates(self) -> list[Suspicion]:
        """(GPU, class) pairs worth a re-measurement that are no suspicion: their sum is over
        ``remeasure_at`` of the alarm (or over it, but a partner they shared their slow runs
        with has about as much: the runs cannot say which is slow). Not steered by; a
        re-measurement settles them: confirmed, the GPU's score takes the slowdown
        (:meth:`rescore`); cleared (:meth:`clear`), its partners are judged again at once."""
        return [
            _tied(gpu, job_class, track, self.n_examples)
            for (gpu, job_class), track in sorted(self._tracks.items())
            if track.suspicion is None and track.over_s is not None and track.entries
            and track.score >= self._look and len(track.entries) >= self.min_runs
        ]  # fmt: skip

    def suspect_classes(self) -> dict[str, tuple[str, ...]]:
        """GPU id -> the classes it is suspect for."""
        out: dict[str, list[str]] = {}
        for s in self.suspects():
            out.setdefault(s.gpu, []).append(s.job_class)
        return {gpu: tuple(classes) for gpu, classes in out.items()}

    def clear(self, gpu: str, job_class: str, at_s: float, why: str) -> list[Change]:
        """A re-measurement found ``gpu`` as its campaign says for ``job_class``: the
        suspicion (if any) and its evidence go, so later runs judge it afresh."""
        track = self._tracks.get((gpu, job_class))
        if track is None:
            return []
        was = track.suspicion is not None
        self._tracks[(gpu, job_class)] = _Track(last_s=at_s)
        self._suspect_keys.discard((gpu, job_class))
        changes = [Change(gpu, job_class, False, at_s, why)] if was else []
        # Healthy, so the runs it shared were slow because of a partner: judge those now.
        changes += self._partners_judged(track, job_class, at_s)
        self.changes_ += changes
        return changes

    def rescore(
        self, gpu: str, job_class: str, score: float, at_s: float, why: str
    ) -> list[Change]:
        """A re-measurement found ``gpu`` slow for ``job_class``: ``score`` (its measured
        slowdown) is its PM-score for the class from now on. Incremental, as :meth:`update`:
        the runs it shared stop counting against its partners, its own evidence is spent
        (the score explains it now) and later runs are judged against the new score; nothing
        is replayed. Returns the suspicion lifted, if any (placement reads the score now)."""
        if not (score > 0 and math.isfinite(score)):
            raise ValueError(f"score must be > 0, got {score!r}")
        if gpu not in self._scores or job_class not in self._scores[gpu]:
            return []
        self._scores[gpu][job_class] = float(score)
        track = self._tracks.get((gpu, job_class))
        if track is None:
            return []
        self._explain_away(gpu, job_class, track)
        was = track.suspicion is not None
        self._tracks[(gpu, job_class)] = _Track(last_s=at_s)
        self._suspect_keys.discard((gpu, job_class))
        changes = [Change(gpu, job_class, False, at_s, why)] if was else []
        self.changes_ += changes
        return changes

    def _partners_judged(self, track: _Track, job_class: str, at_s: float) -> list[Change]:
        """Partners of a GPU just cleared that its evidence held back: flagged if over now."""
        partners = {g for e in track.entries if e.accused > 1 for g in e.gpus}
        changes: list[Change] = []
        for partner in sorted(partners):
            other = self._tracks.get((partner, job_class))
            if other is None or other.suspicion is not None or other.over_s is None:
                continue
            if self._alarmed(other, job_class):
                changes += self._flag(partner, job_class, other, at_s)
        return changes

    def _flag(self, gpu: str, job_class: str, track: _Track, now: float) -> list[Change]:
        """The runtime evidence makes ``gpu`` suspect; the runs it shared stop counting
        against its partners (drift's greedy confirmation)."""
        track.runtime = True
        track.clear_score = 0.0
        track.normal_runs = 0
        changes = self._suspect(gpu, job_class, track, now, track.entries[0].start_s, "runtime")
        self._explain_away(gpu, job_class, track)
        return changes

    def _recheck(self, now: float) -> list[Change]:
        """Lift runtime suspicions no run has spoken to for ``recheck_s``."""
        if self.recheck_s is None:
            return []
        wait = self.recheck_s
        changes: list[Change] = []
        for key in sorted(self._suspect_keys):
            track = self._tracks[key]
            suspicion = track.suspicion
            assert suspicion is not None
            quiet = now - max(track.last_s, suspicion.since_s)
            if not track.runtime or track.signal or quiet < wait:
                continue
            track.runtime = False
            track.suspicion = None
            self._suspect_keys.discard(key)
            # Kept just under the alarm: one clearly slow run of the class makes it suspect.
            track.score = self.alarm - self.alarm / self.min_runs / 2
            track.over_s = None
            why = f"no run of its class for {quiet / 3600:.0f} h: on probation"
            changes.append(Change(key[0], key[1], False, now, why))
        return changes

    # -- direct signals --------------------------------------------------------------------

    def _signal_classes(self, gpu: str) -> tuple[str, ...]:
        known = tuple(self._scores.get(gpu, {}))
        wanted = self.signal_classes if self.signal_classes is not None else known
        return tuple(c for c in wanted if c in known)

    def _signals(self, record: JobRecord) -> list[Change]:
        changes: list[Change] = []
        start = record.end_s - record.run.runtime_s
        for gpu in dict.fromkeys(record.run.gpus):
            signals = record.signals.get(gpu)
            if signals is None or not signals.read:
                continue
            why = signals.fault(self.signal_share, self.clock_ratio)
            for job_class in self._signal_classes(gpu):
                track = self._track(gpu, job_class)
                if why:
                    track.clean_records = 0
                    if not track.signal:
                        track.signal = True
                        changes += self._suspect(
                            gpu, job_class, track, record.end_s, start, f"signal: {why}"
                        )
                elif track.signal:
                    track.clean_records += 1
                    if track.clean_records >= self.clear_records:
                        track.signal = False
                        changes += self._maybe_clear(
                            gpu, job_class, track, record.end_s, "signals clean"
                        )
        return changes

    # -- runtime evidence ------------------------------------------------------------------

    def _runtime(self, record: JobRecord) -> list[Change]:
        run = record.run
        # A GPU that got min_slowdown slower becomes the bottleneck if its score was within
        # that factor of the worst: those are the GPUs this run can accuse.
        worst, necks = bottleneck(run, self._scores, within=self.min_slowdown)
        used = frozenset(run.gpus)
        suspect_here = {g for g in used if self._is_suspect(g, run.job_class)}
        others = self._apps.others(run, used, self.min_baseline)
        worst *= record.penalty if record.penalty > 0 else 1.0
        norm = run.runtime_s / worst
        if not suspect_here:  # only runs no suspect GPU explains are a baseline
            self._apps.add(run, norm, used)
        if len(others) < self.min_baseline:
            return []
        center = float(np.median(np.log(others)))
        expected = math.exp(center) * worst
        log_residual = math.log(run.runtime_s / expected)
        sigma = self._sigma()
        if not suspect_here:
            self._residuals.append(abs(log_residual))
        shift = math.log(self.min_slowdown) / sigma
        z = max(-self.z_cap, min(self.z_cap, log_residual / sigma))
        llr = shift * (z - shift / 2)
        cap = self.alarm / self.min_runs  # no single run, however slow, makes a suspect alone
        evidence = RunEvidence(run.job_id, run.app, expected, run.runtime_s)
        entry = _Entry(evidence, used, record.end_s - run.runtime_s, log_residual, llr)

        changes: list[Change] = []
        candidates: list[tuple[str, _Track]] = []
        judged = [g for g in necks if not suspect_here - {g}]  # else a suspect explains it
        # One slow GPU slows the whole gang, so a slow run is as likely under "GPU g is slow"
        # for each of its bottleneck GPUs: each gets the run's whole evidence (split, a 2x GPU
        # in 8-GPU jobs would need eight times the runs). What tells the slow one from its
        # partners is every other run: their normal runs apart, and the other gangs it was in.
        for gpu in judged:
            track = self._track(gpu, run.job_class)
            llr = min(cap, entry.llr)
            track.last_s = record.end_s
            if track.suspicion is not None and track.runtime:
                track.clear_score = max(0.0, track.clear_score - llr)
                track.normal_runs = track.normal_runs + 1 if llr < 0 else 0
                track.entries.append(replace(entry, llr=llr, accused=len(judged)))
                del track.entries[: -self.n_examples * 4]
                if track.clear_score >= self.clear_alarm and track.normal_runs >= self.min_runs:
                    track.runtime = False
                    changes += self._maybe_clear(
                        gpu, run.job_class, track, record.end_s, "later runs normal"
                    )
                continue
            track.score = max(0.0, track.score + llr)
            if track.score == 0.0:
                track.entries = []
                track.over_s = None
                continue
            track.entries.append(replace(entry, llr=llr, accused=len(judged)))
            candidates.append((gpu, track))
            if track.score < self._look:
                track.over_s = None
            elif track.over_s is None:
                track.over_s = record.end_s
        # Alarms only once every accused GPU's sum has this run: a partner must be compared
        # with its own sum after the run, not before it.
        candidates = [(g, t) for g, t in candidates if self._alarmed(t, run.job_class)]
        # Greedy, as drift's confirmation: the GPU with the most runs of its own first; the
        # runs it shared then stop counting against its partners.
        while candidates:
            candidates.sort(key=lambda pair: (-_own_runs(pair[1]), -pair[1].score, pair[0]))
            gpu, track = candidates.pop(0)
            changes += self._flag(gpu, run.job_class, track, record.end_s)
            candidates = [(o, t) for o, t in candidates if self._alarmed(t, run.job_class)]
        return changes

    def _alarmed(self, track: _Track, job_class: str) -> bool:
        """Enough evidence, and clearly more than any GPU it shared its slow runs with:
        partners that only ever ran together are indistinguishable, so they wait until one
        of them runs without the other (its own runs, or a partner's normal ones, decide)."""
        if track.score < self.alarm or len(track.entries) < self.min_runs:
            return False
        margin = self.alarm / self.min_runs / 2
        partners = {g for e in track.entries if e.accused > 1 and e.llr > 0 for g in e.gpus}
        for partner in partners:
            other = self._tracks.get((partner, job_class))
            if other is not None and other is not track and other.score > track.score - margin:
                return False
        return True

    def _explain_away(self, gpu: str, job_class: str, track: _Track) -> None:
        """The runs ``gpu`` (now suspect) shared stop counting against its partners."""
        partners = {g for e in track.entries for g in e.gpus} - {gpu}
        for partner in partners:
            other = self._tracks.get((partner, job_class))
            if other is None or other.suspicion is not None:
                continue
            kept = [e for e in other.entries if gpu not in e.gpus]
            if len(kept) != len(other.entries):
                other.entries = kept
                other.score = _cusum(kept)
                if other.score < self._look:
                    other.over_s = None

    # -- bookkeeping -------------------------------------------------------------------------

    def _track(self, gpu: str, job_class: str) -> _Track:
        return self._tracks.setdefault((gpu, job_class), _Track())

    def _sigma(self) -> float:
        """The residuals' noise, pooled over recent runs no suspect GPU explains: one
        application's few runs would make a noisy estimate, and a low one false alarms."""
        if len(self._residuals) < self.min_noise_runs:
            return max(self.noise, self.noise_floor)
        spread = 1.4826 * float(np.median(np.fromiter(self._residuals, dtype=float)))
        return max(spread, self.noise_floor)

    def _is_suspect(self, gpu: str, job_class: str) -> bool:
        track = self._tracks.get((gpu, job_class))
        return track is not None and track.suspicion is not None

    def _suspect(
        self, gpu: str, job_class: str, track: _Track, now: float, onset: float, cause: str
    ) -> list[Change]:
        entries = track.entries
        slowdown = _median_slowdown(entries)
        if track.suspicion is not None:  # already suspect for the other reason: add to it
            old = track.suspicion
            track.suspicion = Suspicion(
                gpu, job_class, old.since_s, min(old.onset_s, onset), f"{old.cause}; {cause}",
                slowdown if math.isfinite(slowdown) else old.slowdown,
                len(entries) or old.runs, tuple(e.evidence for e in entries[-self.n_examples :]),
            )  # fmt: skip
            return []
        track.suspicion = Suspicion(
            gpu, job_class, now, onset, cause, slowdown, len(entries),
            tuple(e.evidence for e in entries[-self.n_examples :]),
        )  # fmt: skip
        self._suspect_keys.add((gpu, job_class))
        why = cause if not entries else f"{cause}: {len(entries)} run(s), {slowdown:.2f}x expected"
        return [Change(gpu, job_class, True, now, why)]

    def _maybe_clear(
        self, gpu: str, job_class: str, track: _Track, now: float, why: str
    ) -> list[Change]:
        if track.runtime or track.signal or track.suspicion is None:
            return []
        track.suspicion = None
        track.score = 0.0
        track.entries = []
        track.over_s = None
        self._suspect_keys.discard((gpu, job_class))
        return [Change(gpu, job_class, False, now, why)]


def replay(
    detector: SuspicionDetector,
    scores: Mapping[str, Mapping[str, float]],
    records: Iterable[JobRecord],
    clears: Iterable[tuple[str, str, float, str]],
) -> SuspicionDetector:
    """``detector`` fitted on ``scores`` and ``records`` (by their end) with ``clears``: (GPU,
    class, when, why) a re-measurement found healthy, each :meth:`~SuspicionDetector.clear`-ed
    where the replay passes its time, as it was when it came. Why: a restart that replayed
    the runs without them would raise again the suspicions they settled, and keep the later
    runs from raising new ones."""
    detector.fit(scores)
    due = deque(sorted(clears, key=lambda c: c[2]))
    for record in records:
        while due and due[0][2] < record.end_s:
            detector.clear(*due.popleft())
        detector.update(record)
    for gpu, job_class, at_s, why in due:
        detector.clear(gpu, job_class, at_s, why)
    return detector


class _Baselines:
    """Each application's recent runs on their GPUs (runtime over the run's worst score and
    spread), by its key and by its family: a run is judged against its application's runs on
    other GPUs, or its family's while the application has too few (a script edited between
    submissions is a new key each time; its user and job name stay)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.runs: dict[tuple[str, str], deque[tuple[float, frozenset[str]]]] = {}

    def others(self, run: JobRun, used: frozenset[str], enough: int) -> np.ndarray:
        """The normalized runs of ``run``'s application (else family) on GPUs it did not use."""
        found = np.array([], dtype=float)
        for key in (("app", run.app), ("family", run.family)):
            if not key[1] or key not in self.runs:
                continue
            found = np.array([n for n, gpus in self.runs[key] if not gpus & used], dtype=float)
            if len(found) >= enough:
                break
        return found

    def add(self, run: JobRun, norm: float, used: frozenset[str]) -> None:
        for key in (("app", run.app), ("family", run.family)):
            if key[1]:
                self.runs.setdefault(key, deque(maxlen=self.window)).append((norm, used))


def _tied(gpu: str, job_class: str, track: _Track, n_examples: int) -> Suspicion:
    """A candidate (:meth:`SuspicionDetector.candidates`) as a suspicion would read."""
    assert track.over_s is not None
    return Suspicion(
        gpu, job_class, track.over_s, track.entries[0].start_s,
        "runtime, as slow as a partner it ran with", _median_slowdown(track.entries),
        len(track.entries), tuple(e.evidence for e in track.entries[-n_examples:]),
    )  # fmt: skip


def _median_slowdown(entries: list[_Entry]) -> float:
    """observed / expected of the median run (nan without runs)."""
    return math.exp(float(np.median([e.log_residual for e in entries]))) if entries else math.nan


def _own_runs(track: _Track) -> int:
    return sum(1 for e in track.entries if e.accused == 1 and e.llr > 0)


def _cusum(entries: list[_Entry]) -> float:
    score = 0.0
    for entry in entries:
        score = max(0.0, score + entry.llr)
    return score


def outlier_scores(
    scores: Mapping[str, Mapping[str, float]],
    suspects: Iterable[Suspicion],
    floor: float,
    faults: Iterable[tuple[str, str]] = (),
) -> dict[str, dict[str, float]]:
    """The campaign's scores with each suspect (GPU, class) made an outlier for placement:
    its score times the slowdown seen, and at least ``floor`` (pass one above the policy's
    ``avoid_above``), so the class is kept off it while the other classes still use it; each
    of ``faults`` (GPU, class: :func:`measured_faults`) at least ``floor`` too."""
    out = {gpu: dict(per) for gpu, per in scores.items()}
    for s in suspects:
        if s.gpu not in out or s.job_class not in out[s.gpu]:
            continue
        base = out[s.gpu][s.job_class]
        seen = base * s.slowdown if math.isfinite(s.slowdown) else base
        out[s.gpu][s.job_class] = max(seen, floor)
    for gpu, job_class in faults:
        if gpu in out and job_class in out[gpu]:
            out[gpu][job_class] = max(out[gpu][job_class], floor)
    return out


def measured_faults(
    scores: Mapping[str, Mapping[str, float]],
    campaign: Mapping[str, Mapping[str, float]],
    min_slowdown: float,
) -> list[tuple[str, str]]:
    """The (GPU, class) pairs whose score now (``scores``: a re-measurement's increment) is
    ``min_slowdown`` or more times their ``campaign`` score: faults, steered as suspects are
    until a re-measurement finds them recovered. A re-measurement that confirms a suspicion
    makes the measured time the GPU's score and lifts the suspicion; without this, a GPU
    confirmed 1.5x slow for a class whose median is 1.0 would be no outlier (the policy's
    ``avoid_above`` is 1.5) and the class would go back onto it, where an admin told of the
    fault keeps it off (and the oracle of the closed-loop benchmark does)."""
    out = []
    for gpu, per in sorted(scores.items()):
        before = campaign.get(gpu, {})
        for job_class, score in sorted(per.items()):
            was = before.get(job_class)
            if was is not None and was > 0 and score >= min_slowdown * was:
                out.append((gpu, job_class))
    return out
