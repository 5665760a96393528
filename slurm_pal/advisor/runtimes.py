"""The wait rule's runtime model in the running advisor: what every finished job ran taught to
the engine's :class:`~slurm_pal.core.runtimes.RuntimeModel`, as the simulator's Slurm mode
teaches it at every job end, so the service weighs a wait as ``sim run --config`` does.

Why here and shaped like this: a job's end reaches the service as its Epilog record. Its
runtime is its first Prolog to its last Epilog (:func:`~slurm_pal.core.drift.job_span`, as the
suspicion detector and drift measure it), its GPUs are the Slurm indices its records name, its
time limit is its decision's (the request as Slurm sent it at submit: the store's, or the
decide path's memory when the decision is not bound to the job yet). So a job is learned once,
at its first new Epilog record, on the store writer's thread right after that record is
stored; at start the model is warmed from the finished jobs the store kept over
``advisor.suspicion_days``, the same records the suspicion detector warms from. A reload
rebuilds the engine, which is handed the model as it stands (nothing is re-read).

Every job that ended counts, whatever its exit code: a job killed at its time limit, or
cancelled, ends with a non-zero code or a signal, and leaving those out would take the jobs
that used their whole limit out of the limit share (and bias it low); a job that failed early
held its GPUs only that long too, which is what a wait is weighed against.

Threads: the model learns on the writer's thread while decides (under the state's lock) and
re-planning rounds (outside it) predict. So the engine never predicts with the model that
learns: each job's end hands it a copy (:meth:`RuntimeBook.install`, under the state's lock),
which nobody changes after.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_pal.adapters.store import Store
from slurm_pal.core.drift import job_span
from slurm_pal.core.runtimes import EndedJob, RuntimeModel
from slurm_pal.engine.jobdesc import JobDescription

if TYPE_CHECKING:
    from slurm_pal.engine.engine import AdvisorEngine

__all__ = ["RuntimeBook", "ended_job", "ended_jobs"]

log = logging.getLogger("slurm_pal.advisor")

MAX_FED = 100_000
"""Job ids remembered as learned (each job is learned once; oldest forgotten first)."""


def ended_job(
    records: Iterable[Mapping[str, object]], decision: Mapping[str, object] | None
) -> EndedJob | None:
    """What one finished job ran (``records``: its Prolog/Epilog payloads; ``decision``: its
    stored decision, whose ``job`` is the request as Slurm sent it): its GPUs (the distinct
    Slurm indices its records name on each node, else the Prolog's NVML UUIDs), its time
    limit (not given or UNLIMITED: none, as the policy predicts such a job) and first Prolog
    to last Epilog. None without both hooks' records, GPUs or a readable request."""
    ended = _ended(list(records), decision)
    return None if ended is None else ended[1]


def _ended(
    mine: list[Mapping[str, object]], decision: Mapping[str, object] | None
) -> tuple[float, EndedJob] | None:
    """:func:`ended_job`, with when the job ended."""
    span = job_span(mine)
    job = decision.get("job") if decision is not None else None
    if span is None or not isinstance(job, Mapping):
        return None
    indices: dict[str, set[object]] = {}  # node -> Slurm indices
    uuids: dict[str, set[object]] = {}  # node -> NVML UUIDs (a Prolog without the indices)
    for record in mine:
        node = str(record.get("node"))
        for key, found in (("slurm_gpus", indices), ("uuids", uuids)):
            named = record.get(key)
            if isinstance(named, list):
                found.setdefault(node, set()).update(named)
    gpus = sum(len(indices.get(n) or uuids.get(n) or ()) for n in indices.keys() | uuids.keys())
    try:
        limit_s = JobDescription.from_wire(job).time_limit_s
    except (ValueError, TypeError):
        return None
    return (span[1], EndedJob(gpus, limit_s, span[1] - span[0])) if gpus else None


def ended_jobs(
    records: Iterable[Mapping[str, object]], decisions: Iterable[Mapping[str, object]]
) -> list[tuple[int, EndedJob]]:
    """(job id, what it ran) for each finished job among ``records`` that has a decision in
    ``decisions`` (bound to its job id), in order of their end."""
    by_job: dict[int, list[Mapping[str, object]]] = {}
    for record in records:
        job_id = record.get("job_id")
        if isinstance(job_id, int):
            by_job.setdefault(job_id, []).append(record)
    found = {d.get("job_id"): d for d in decisions}
    ended: list[tuple[float, int, EndedJob]] = []
    for job_id, mine in by_job.items():
        done = _ended(mine, found.get(job_id))
        if done is not None:
            ended.append((done[0], job_id, done[1]))
    return [(job_id, job) for _, job_id, job in sorted(ended, key=lambda e: e[:2])]


class RuntimeBook:
    """The service's runtime model: learned from the store at start (:meth:`warm`) and at
    each job's end (:meth:`feed`, the writer's thread); :attr:`current` is the copy the
    engine predicts with (:meth:`install`); :meth:`snapshot` is what ``serve stats`` and the
    metrics show. Thread-safe.

    ``engine``: the service's engine now (a reload replaces it); ``engine_lock``: the lock it
    is replaced under (the state's), taken to hand it a new fit, so a rebuilt engine and a
    job's end cannot cross."""

    def __init__(
        self,
        engine: Callable[[], AdvisorEngine],
        engine_lock: threading.Lock,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._engine, self._engine_lock = engine, engine_lock
        self.wall_clock = wall_clock
        self._model = RuntimeModel()
        self.current = self._model.copy()
        """What the engine predicts with: a copy nobody changes (replaced at each end)."""
        self._fed: dict[int, None] = {}
        self._during: dict[int, EndedJob] | None = None  # learned while a warm-up reads
        self.warmed = False
        self.warmed_jobs = 0
        self.jobs_fed = 0

    def install(self, engine: AdvisorEngine) -> None:
        """Hand ``engine`` (a new one: the caller holds ``engine_lock``) the model as it
        stands."""
        engine.use_runtimes(self.current)

    def _publish(self) -> None:
        """The service's engine predicts with the model as it stands from now on."""
        with self._engine_lock:
            self.install(self._engine())

    # -- learning -------------------------------------------------------------------------------
    def warm(self, store_path: Path, days: float) -> bool:
        """Learn from the finished jobs the store kept over the last ``days`` (the config's
        ``suspicion_days``; 0: start cold), once: later calls (a reload) keep what was learned
        since. True when it learned now. A store it cannot read is logged and the model goes
        on as it is (tried again at the next call)."""
        if self.warmed:
            return False
        with self._lock:
            self._during = {}
        try:
            learned = self._read(store_path, days)
        except Exception:
            log.exception("runtime model warm-up failed; it learns from the next job ends")
            with self._lock:
                self._during = None
            return False
        with self._lock:
            during, self._during = self._during or {}, None
            known = {job_id for job_id, _ in learned}
            learned += [(j, e) for j, e in during.items() if j not in known]
            self._model = RuntimeModel().fit(e for _, e in learned)
            self.current = self._model.copy()
            self._fed = dict.fromkeys(j for j, _ in learned[-MAX_FED:])
            self.warmed, self.warmed_jobs, self.jobs_fed = True, len(learned), 0
            learned_now = self._model.learned()
        self._publish()
        share = learned_now["limited"]["limit_share"]
        typical = ", ".join(
            f"{float(row['limit_s'] or 0) / 3600:.3g} h: {float(row['limit_share'] or 0):.2f}"
            for row in learned_now.values()
            if "limit_s" in row
        )
        log.info(
            "runtime model: warmed from %d finished job(s) of the last %g day(s): limit share "
            "%s%s", len(learned), days, "unknown yet" if share is None else f"{share:.2f}",
            f" (at typical limits {typical})" if typical else "",
        )  # fmt: skip
        return True

    def _read(self, store_path: Path, days: float) -> list[tuple[int, EndedJob]]:
        if days <= 0:
            return []
        with Store(store_path) as store:
            records = store.job_records(since=self.wall_clock() - days * 86400)
            ids = {r["job_id"] for r in records if isinstance(r.get("job_id"), int)}
            decisions = store.decisions_for_jobs(ids)  # type: ignore[arg-type]
        return ended_jobs(records, decisions)

    def feed(
        self, store: Store, record: Mapping[str, object], hint: Mapping[str, object] | None
    ) -> bool:
        """Learn the job of a newly stored Epilog ``record`` (once per job), on the writer's
        ``store``; ``hint``: its decision as the decide path knows it (used when the store has
        none bound to the job yet). True when it was learned: the service's engine predicts
        with it from the next decision. Never raises (the record's own write must stand)."""
        try:
            return self._feed(store, record, hint)
        except Exception:
            log.exception("runtime model: job %s not learned", record.get("job_id"))
            return False

    def _feed(
        self, store: Store, record: Mapping[str, object], hint: Mapping[str, object] | None
    ) -> bool:
        job_id = record.get("job_id")
        if record.get("kind") != "epilog" or not isinstance(job_id, int) or job_id in self._fed:
            return False
        job = ended_job(store.job_records(job_id), store.decision_for_job(job_id) or hint)
        if job is None:
            return False  # no decision (yet): a later Epilog of the job may find it
        with self._lock:
            if job_id in self._fed:
                return False
            self._fed[job_id] = None
            while len(self._fed) > MAX_FED:
                self._fed.pop(next(iter(self._fed)))
            if self._during is not None:
                self._during[job_id] = job
            self._model.partial_fit(job)
            self.current = self._model.copy()
            self.jobs_fed += 1
        self._publish()
        return True

    # -- reading --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        """``serve stats``: the jobs learned, and what the model predicts from them (the limit
        share, the unlimited medians by size), each with the jobs it rests on."""
        return {
            "runtime_jobs_learned": self.warmed_jobs + self.jobs_fed,
            "runtimes": self.current.learned(),
        }
