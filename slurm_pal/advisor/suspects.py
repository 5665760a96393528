"""Suspect GPUs in the running advisor: every Epilog record fed to one
:class:`~slurm_pal.core.suspicion.SuspicionDetector`, what it finds logged, kept in the store
and (``advisor.suspicion = "steer"``) handed to placement as outlier scores.

Why here and shaped like this: the detector is pure and judges finished runs (application,
class, GPUs, runtime); the service has the pieces apart. A job's runtime is its first Prolog to
its last Epilog (records in the store), its application key and class are its decision's (the
store, or the decide path's memory when the decision is not bound to the job yet), its GPUs
are Slurm's indices mapped through the labels (the ids the advisor's cluster uses). So a job is
fed once, at its first new Epilog record, on the store writer's thread, right after that record
is stored; at start the detector is warmed from the records the store kept over
``advisor.suspicion_days``, the very same way, so a restart does not start cold.

Placement sees suspicion only through scores (:func:`~slurm_pal.core.suspicion.outlier_scores`,
:meth:`Cluster.rescored`): the GPU's score for the classes it slows becomes at least
``avoid_above`` + 0.01, its score for the other classes stays.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_pal.adapters.config import AdvisorConfig
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.logtext import quoted
from slurm_pal.core.clocks import ModelClocks, with_clock_ratios
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.drift import runs_from_records
from slurm_pal.core.remeasure import (
    base_campaign,
    last_settled,
    same_campaign,
    settlements,
    unsettled,
)
from slurm_pal.core.suspicion import (
    Change,
    GpuSignals,
    JobRecord,
    Suspicion,
    SuspicionDetector,
    measured_faults,
    outlier_scores,
    replay,
)
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.engine.runs import jobs_from_decisions

if TYPE_CHECKING:
    from slurm_pal.advisor.view import Static, View
    from slurm_pal.engine.decide import LabelTable

__all__ = ["FLOOR_ABOVE", "SuspectBook", "decision_hint", "job_records_of"]

log = logging.getLogger("slurm_pal.advisor")

FLOOR_ABOVE = 0.01
"""A suspect (GPU, class) scores at least ``avoid_above`` + this: an outlier for the policy."""
MAX_FED = 100_000
"""Job ids remembered as fed (each job is judged once; oldest forgotten first)."""

GpuIds = Mapping[tuple[str, int], str]


def _signals(records: Iterable[Mapping[str, object]], gpu_ids: GpuIds) -> dict[str, GpuSignals]:
    """The NVML signals an Epilog record carries (``gpu_signals``: Slurm GPU index -> readings,
    PROTOCOL.md), by GPU id. A GPU whose readings are malformed is left out."""
    out: dict[str, GpuSignals] = {}
    for record in records:
        per_gpu = record.get("gpu_signals")
        if record.get("kind") != "epilog" or not isinstance(per_gpu, Mapping):
            continue
        node = str(record.get("node"))
        for index, raw in per_gpu.items():
            try:
                gpu = gpu_ids.get((node, int(index)))
                read = gpu_signals_from(raw)
            except (AttributeError, TypeError, ValueError):
                continue
            if gpu is not None:
                out[gpu] = read
    return out


def _number(raw: Mapping[str, object], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{key} = {value!r}")
    return number


def gpu_signals_from(raw: Mapping[str, object]) -> GpuSignals:
    """One GPU's readings from the record (ValueError/TypeError/AttributeError: malformed).
    Older records carry ``clock_events`` and ``sm_clock_ratio`` only; both stay valid."""
    events = raw.get("clock_events") or {}
    clock_events = {str(k): float(v) for k, v in events.items()}  # type: ignore[attr-defined]
    if not all(0.0 <= v <= 1.0 for v in clock_events.values()):
        raise ValueError("a clock-event share outside [0, 1]")
    faults = raw.get("memory_faults") or []
    links = raw.get("link_faults") or []
    if not isinstance(faults, list) or not isinstance(links, list):
        raise TypeError("memory_faults or link_faults is not a list")
    return GpuSignals(
        clock_events,
        _number(raw, "sm_clock_ratio"),
        event_samples=int(raw.get("event_samples") or 0),  # type: ignore[call-overload]
        sm_clock_mhz=_number(raw, "sm_clock_mhz"),
        sm_clock_max_mhz=_number(raw, "sm_clock_max_mhz"),
        memory_faults=tuple(str(f) for f in faults),
        link_faults=tuple(str(f) for f in links),
    )


def job_records_of(
    records: Iterable[Mapping[str, object]],
    decisions: Iterable[Mapping[str, object]],
    gpu_ids: GpuIds,
) -> list[JobRecord]:
    """The detector's records of the finished jobs among ``records`` (Prolog/Epilog payloads)
    that have a decision (application key and class), in order of their end. GPUs are Slurm's
    indices mapped through ``gpu_ids`` (the Prolog's NVML UUIDs are not used: the advisor's
    cluster names GPUs as the labels do). Failed jobs and jobs without both hooks' records are
    left out (:func:`~slurm_pal.core.drift.runs_from_records`)."""
    by_job: dict[str, list[Mapping[str, object]]] = {}
    for r in records:
        plain = {k: v for k, v in r.items() if k != "uuids"}
        by_job.setdefault(str(r.get("job_id", "")), []).append(plain)
    jobs, _ = jobs_from_decisions(decisions)
    runs, _ = runs_from_records([r for rs in by_job.values() for r in rs], jobs, gpu_ids)
    out = []
    for run in runs:
        mine = by_job[run.job_id]
        end = max(float(r["time"]) for r in mine if r.get("kind") == "epilog")  # type: ignore[arg-type]
        out.append(JobRecord(run, end, _signals(mine, gpu_ids)))
    return sorted(out, key=lambda record: (record.end_s, record.run.job_id))


def decision_hint(
    view: View | None, requests: Mapping[str, tuple[object, ...]], record: Mapping[str, object]
) -> dict[str, object] | None:
    """An Epilog record's job's decision as the decide path holds it (``requests``: token ->
    (request, class, ...)), found through the ``r=<token>`` of the job's admin comment in the
    last Slurm read: the store binds decisions to job ids at a later refresh, so a short job's
    Epilog can come first."""
    job_id = record.get("job_id")
    job = view.job(job_id) if view is not None and isinstance(job_id, int) else None
    fields = parse_admin_comment(job.admin_comment) if job is not None else None
    held = requests.get((fields or {}).get("r", ""))
    if held is None:
        return None
    request, job_class = held[0], held[1]
    stored = getattr(request, "stored", None)
    if not callable(stored):
        return None
    return {"job_id": job_id, "job": stored(), "answer": {"class": job_class}}


class SuspectBook:
    """The service's detector, its GPU map and what it found (thread-safe).

    :meth:`fit` (start, reload) starts over for the active campaign and warms up from the
    store; :meth:`feed` takes a stored Epilog record (the writer thread); :meth:`on_static` and
    :meth:`rescored` give placement the scores with the suspects as outliers (steer only);
    :meth:`snapshot` is what ``serve stats`` and the metrics show.
    """

    def __init__(self, advisor: AdvisorConfig, wall_clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self.wall_clock = wall_clock
        self.mode = advisor.suspicion
        self.days = advisor.suspicion_days
        self.floor = advisor.avoid_above + FLOOR_ABOVE
        self._detector: SuspicionDetector | None = None
        self._campaign: str | None = None
        self._base: dict[str, dict[str, float]] = {}
        self._gpu_ids: dict[tuple[str, int], str] = {}
        self._where: dict[str, str] = {}  # GPU id -> node:index
        self._models: dict[str, str] = {}  # GPU id -> model (whose busy clocks compare)
        self._clocks = ModelClocks()
        self._fed: dict[str, None] = {}
        # (GPU, class) -> when a re-measurement settled it: suspicions from before are hidden
        self._settled: dict[tuple[str, str], float] = {}
        self._faults: list[tuple[str, str]] = []  # re-measured slow: steered as suspects
        # the scores of the campaign the active one increments (empty: it increments none)
        self._campaign_scores: dict[str, dict[str, float]] = {}
        self.version = 0  # bumped whenever placement's scores must change
        self.warmed_jobs = 0
        self.jobs_fed = 0

    def configure(self, advisor: AdvisorConfig) -> None:
        """A reloaded config (the :meth:`fit` that follows applies it)."""
        self.mode = advisor.suspicion
        self.days = advisor.suspicion_days
        self.floor = advisor.avoid_above + FLOOR_ABOVE

    @property
    def steering(self) -> bool:
        return self.mode == "steer"

    # -- learning -----------------------------------------------------------------------------
    def fit(
        self, store_path: Path, campaign: str, specs: Sequence[GpuSpec], labels: LabelTable
    ) -> None:
        """Start over for ``campaign``: the detector on its scores, warmed from the finished
        jobs the store kept over ``suspicion_days`` and the re-measurements' verdicts (closed
        rows), each at its time; the store's open suspicions made these.
        A warm-up that fails (an unreadable store) is logged and the detector starts cold.
        A re-measure increment of the campaign in use (same GPUs and labels) is taken
        incrementally instead: the detector rescores the (GPU, class) pairs it changed and
        keeps everything else, nothing is replayed from the store."""
        if not self._rescored(campaign, specs, labels):
            try:
                self._fit(store_path, campaign, specs, labels, warm=True)
            except Exception:
                log.exception("suspicion warm-up failed; the detector starts cold")
                self._fit(store_path, campaign, specs, labels, warm=False)
        self._find_faults(store_path, campaign, specs)

    def _find_faults(self, store_path: Path, campaign: str, specs: Sequence[GpuSpec]) -> None:
        """The (GPU, class) pairs a re-measurement found ``min_slowdown`` or more times
        slower than the campaign it increments (:func:`~slurm_pal.core.suspicion.
        measured_faults`): steered as suspects are, until found recovered. A store that
        cannot say (the campaign gone) steers by the scores alone, as before."""
        detector, root = self._detector, base_campaign(campaign)
        slower = "" if detector is None else f"{detector.min_slowdown:g}x"
        faults: list[tuple[str, str]] = []
        before: dict[str, dict[str, float]] = {}
        if detector is not None and root != campaign:
            try:
                with Store(store_path) as store:
                    rows = store.gpu_scores(root)
                for row in rows.itertuples(index=False):
                    before.setdefault(str(row.uuid), {})[str(row.job_class)] = float(row.pm_score)
                now = {spec.uuid: dict(spec.scores) for spec in specs}
                faults = measured_faults(now, before, detector.min_slowdown)
            except Exception:
                log.exception("re-measured faults of campaign %s not read", campaign)
                before = {}
        with self._lock:
            self._campaign_scores = before
            new = [f for f in faults if f not in self._faults]
            if faults != self._faults:
                self._faults = faults
                self.version += 1
        for gpu, job_class in new:
            log.warning(
                "GPU %s (%s) kept off for class %s: re-measured %s or more its score in "
                "campaign %s (a fault), until a re-measurement finds it recovered",
                gpu, self._where.get(gpu, "?"), job_class, slower, root,
            )  # fmt: skip

    def _fit(
        self,
        store_path: Path,
        campaign: str,
        specs: Sequence[GpuSpec],
        labels: LabelTable,
        *,
        warm: bool,
    ) -> None:
        base = {s.uuid: dict(s.scores) for s in specs}
        gpu_ids = {(e.node, e.slurm_index): e.uuid for e in labels.entries}
        where = {e.uuid: f"{e.node}:{e.slurm_index}" for e in labels.entries}
        models, clocks = {s.uuid: s.model for s in specs}, ModelClocks()
        now = self.wall_clock()
        detector = None if self.mode == "off" else SuspicionDetector()
        done: list[JobRecord] = []
        found: list[Suspicion] = []
        if detector is not None:
            detector.fit(base)
        if warm:  # else (the store failed us) cold, and the store's rows as they are
            with Store(store_path) as store:
                # What re-measurements settled, kept in the store's closed rows: after a
                # restart as before it, a suspicion raised before its verdict stays settled.
                verdicts = settlements(store.suspicions(cleared=True))
                with self._lock:
                    self._merge_settled(last_settled(verdicts))
                if detector is not None and self.days > 0:
                    records = store.job_records(since=now - self.days * 86400)
                    ids = {int(r["job_id"]) for r in records if isinstance(r.get("job_id"), int)}  # type: ignore[call-overload]
                    done = job_records_of(records, store.decisions_for_jobs(ids), gpu_ids)
                    done = with_clock_ratios(done, models, clocks)
                    clears = [(v.gpu, v.job_class, v.at_s, v.why) for v in verdicts
                              if not v.confirmed]  # fmt: skip
                    replay(detector, base, done, clears)
                    found = self._unsettled(detector.suspects())
                why = "suspicion off" if detector is None else "not found again at start"
                store.sync_suspicions(campaign, [s.to_dict() for s in found], now, why)
        with self._lock:
            self._detector, self._campaign = detector, campaign
            self._base, self._gpu_ids, self._where = base, gpu_ids, where
            self._models, self._clocks = models, clocks
            self._fed = dict.fromkeys(r.run.job_id for r in done)
            self.warmed_jobs = len(done)
            self.jobs_fed = 0
            self.version += 1
        if detector is not None:
            log.info(
                "suspicion (%s): warmed from %d finished job(s) of the last %g day(s): %d "
                "suspect (GPU, class)", self.mode, len(done), self.days, len(found),
            )  # fmt: skip
            for s in found:
                log.warning("%s", self._line(s.gpu, s.job_class, True, s.cause, s))

    def _rescored(self, campaign: str, specs: Sequence[GpuSpec], labels: LabelTable) -> bool:
        """Take ``campaign``, an increment of the one in use, incrementally (False: not one)."""
        base = {s.uuid: dict(s.scores) for s in specs}
        gpu_ids = {(e.node, e.slurm_index): e.uuid for e in labels.entries}
        now = self.wall_clock()
        with self._lock:
            detector, current = self._detector, self._campaign
            if detector is None or current is None or not same_campaign(campaign, current):
                return False
            if gpu_ids != self._gpu_ids or base.keys() != self._base.keys():
                return False
            changed = [
                (gpu, job_class, score)
                for gpu, per in base.items()
                for job_class, score in per.items()
                if self._base[gpu].get(job_class) != score
            ]
            for gpu, job_class, score in changed:
                detector.rescore(gpu, job_class, score, now, f"campaign {campaign}'s score")
            self._base, self._campaign = base, campaign
            self.version += 1
        log.info("suspicion: campaign %s taken incrementally (%d score(s) changed, no refit)",
                 campaign, len(changed))  # fmt: skip
        return True

    def feed(
        self, store: Store, record: Mapping[str, object], hint: Mapping[str, object] | None
    ) -> list[Change]:
        """Judge the job of a newly stored Epilog ``record`` (once per job), on the writer's
        ``store``; ``hint``: its decision as the decide path knows it (used when the store has
        none bound to the job yet). Changes are stored and logged, and returned; when steering
        they bump :attr:`version`. Never raises (the record's own write must stand)."""
        try:
            return self._feed(store, record, hint)
        except Exception:
            log.exception("suspicion: job %s not judged", record.get("job_id"))
            return []

    def _feed(
        self, store: Store, record: Mapping[str, object], hint: Mapping[str, object] | None
    ) -> list[Change]:
        detector, clocks = self._detector, self._clocks
        if detector is None or record.get("kind") != "epilog":
            return []
        job_id = record.get("job_id")
        if not isinstance(job_id, int) or str(job_id) in self._fed:
            return []
        decision = store.decision_for_job(job_id) or hint
        records = store.job_records(job_id)
        made = job_records_of(records, [decision] if decision else [], self._gpu_ids)
        if not made:
            return []
        made = with_clock_ratios(made, self._models, clocks)  # the writer thread only
        with self._lock:
            if detector is not self._detector:
                return []  # a reload started over meanwhile
            self._fed[str(job_id)] = None
            while len(self._fed) > MAX_FED:
                self._fed.pop(next(iter(self._fed)))
            changes = detector.update(made[0])
            self.jobs_fed += 1
            current = {(s.gpu, s.job_class): s for s in detector.suspects()}
            if changes and self.steering:
                self.version += 1
        campaign = self._campaign or ""
        for change in changes:
            suspicion = current.get((change.gpu, change.job_class))
            if change.suspect and suspicion is not None:
                store.open_suspicion(campaign, suspicion.to_dict())
            elif not change.suspect:
                store.close_suspicion(
                    campaign, change.gpu, change.job_class, change.at_s, change.why
                )
            log.warning("%s", self._line(change.gpu, change.job_class, change.suspect,
                                         change.why, suspicion))  # fmt: skip
        return changes

    def _line(
        self, gpu: str, job_class: str, suspect: bool, why: str, suspicion: Suspicion | None
    ) -> str:
        """One log line (escaped by the service's formatter; user values quoted)."""
        where = self._where.get(gpu, "?")
        if not suspect:
            return f"GPU {gpu} ({where}) cleared for class {job_class}: {why}"
        acting = "kept off it from the next decision" if self.steering else "report only"
        text = f"GPU {gpu} ({where}) suspect for class {job_class} ({acting}): {why}"
        if suspicion is not None and suspicion.evidence:
            runs = ", ".join(
                f"job {e.job_id} app={quoted(e.app)} {e.observed_s:.0f}s/{e.expected_s:.0f}s"
                for e in suspicion.evidence
            )
            text += f"; evidence: {runs}"
        return text

    # -- placement ------------------------------------------------------------------------------
    def rescored(self, cluster: Cluster) -> Cluster:
        """``cluster`` with the campaign's scores and, when steering, each suspect (GPU, class)
        an outlier (unchanged when not steering: its scores are the campaign's)."""
        if not self.steering:
            return cluster
        with self._lock:
            found = [] if self._detector is None else self._unsettled(self._detector.suspects())
            base, faults = self._base, self._faults
        table = outlier_scores(base, found, self.floor, faults)
        scores = {
            c: [table.get(u, {}).get(c, float(cluster.classes[c].scores[g]))
                for g, u in enumerate(cluster.uuids)]
            for c in cluster.classes
        }  # fmt: skip
        return cluster.rescored(scores)

    def on_static(self, static: Static) -> Static:
        """A static view with :meth:`rescored` scores."""
        return (
            static if not self.steering else replace(static, cluster=self.rescored(static.cluster))
        )

    def on_view(self, view: View, static: Static) -> View:
        """``view`` (read on an older static) on ``static``, its scores :meth:`rescored`."""
        if not self.steering:
            return replace(view, static=static)
        return replace(view, static=static, base=self.rescored(view.base))

    # -- reading --------------------------------------------------------------------------------
    def suspects(self) -> list[Suspicion]:
        with self._lock:
            return [] if self._detector is None else self._unsettled(self._detector.suspects())

    def candidates(self) -> list[Suspicion]:
        """(GPU, class) pairs worth a re-measurement that are no suspicion (never steered by;
        :meth:`~slurm_pal.core.suspicion.SuspicionDetector.candidates`)."""
        with self._lock:
            return [] if self._detector is None else self._unsettled(self._detector.candidates())

    def campaign_scores(self) -> dict[str, dict[str, float]] | None:
        """GPU -> class -> score in the campaign the active one increments (None: it is no
        increment): what a re-measured score is judged against."""
        with self._lock:
            return self._campaign_scores or None

    def settled(self) -> dict[tuple[str, str], float]:
        """(GPU, class) -> when a re-measurement last settled it (confirmed or cleared)."""
        with self._lock:
            return dict(self._settled)

    def _merge_settled(self, settled: Mapping[tuple[str, str], float]) -> None:
        """Take the store's verdicts (under the lock): the later of each pair's two times."""
        for key, at in settled.items():
            self._settled[key] = max(at, self._settled.get(key, at))

    def _unsettled(self, found: list[Suspicion]) -> list[Suspicion]:
        """``found`` less the suspicions a re-measurement settled (made before it)."""
        return unsettled(found, self._settled)

    def settle(
        self, gpu: str, job_class: str, at_s: float, why: str, confirmed: bool = False
    ) -> None:
        """A re-measurement settled (GPU, class) at ``at_s`` (advisor/remeasure.py): the
        suspicion found before is no longer shown nor steered by, here or after a refit or a
        restart (the caller's closed row is what :meth:`fit` reads back); the
        detector drops it and its evidence, and a new one (raised later) is. ``confirmed``:
        found slow, so the increment's score (the reload that follows, :meth:`fit`) takes
        its evidence; else found healthy, and the detector clears it (its partners are then
        judged without it). Logged; the caller closes the store's row."""
        with self._lock:
            self._settled[(gpu, job_class)] = at_s
            if self._detector is not None and not confirmed:  # later runs judge afresh
                self._detector.clear(gpu, job_class, at_s, why)
            self.version += 1
        where = self._where.get(gpu, "?")
        log.warning("GPU %s (%s) for class %s settled: %s", gpu, where, job_class, why)

    def snapshot(self) -> dict[str, object]:
        """``serve stats``: the mode and each suspect GPU (since, cause, slowdown, evidence)."""
        rows: dict[str, dict[str, object]] = {}
        for s in self.suspects():
            row = rows.setdefault(s.gpu, {"gpu": s.gpu, "where": self._where.get(s.gpu),
                                          "classes": {}})  # fmt: skip
            row["classes"][s.job_class] = {  # type: ignore[index]
                "since_s": s.since_s,
                "cause": s.cause,
                "slowdown": None if math.isnan(s.slowdown) else round(s.slowdown, 3),
                "runs": s.runs,
                "evidence": [e.job_id for e in s.evidence],
            }
        return {
            "suspicion": self.mode,
            "suspicion_jobs_judged": self.jobs_fed + self.warmed_jobs,
            "suspect_gpus": list(rows.values()),
        }

    def per_class(self, classes: Iterable[str]) -> dict[str, int]:
        """Class -> how many GPUs are suspect for it (every class named, zeros included)."""
        counts = dict.fromkeys(classes, 0)
        for s in self.suspects():
            counts[s.job_class] = counts.get(s.job_class, 0) + 1
        return counts
