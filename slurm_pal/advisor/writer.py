"""The advisor's store writer: one thread that owns a store connection and runs the writes
(decisions after their answer, records while their hook waits, bindings, purges), and what
keeping one job record writes.

Why a thread: SQLite connections are per thread, and the decide path must never wait for the
store (PROTOCOL.md: the plugin waits with slurmctld's job-write lock held).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from slurm_pal.adapters.store import Store, StoreError
from slurm_pal.advisor.jobend import merge_telemetry
from slurm_pal.core.resolve import JobRecord, claimed_app
from slurm_pal.engine.jobdesc import JobDescription

__all__ = ["StoreWriter", "store_record"]

log = logging.getLogger("slurm_pal.advisor")

T = TypeVar("T")


class StoreWriter:
    """One thread that owns a store connection and runs writes (SQLite connections are per
    thread; decisions are written after the answer, records are waited for).

    Two lanes, each in order: ``urgent`` writes (an Epilog's record, which its hook waits for)
    go before the others (decision saves, which nobody waits for: under a burst of submits
    thousands can queue, and an Epilog behind them would miss its wait and spool). A record
    whose job's decision is still queued then finds no claim to compare with; its measured
    class is kept all the same."""

    def __init__(self, store_path: Path, *, max_batch: int = 256) -> None:
        self.store_path = store_path
        self.max_batch = max_batch
        self._queue: queue.PriorityQueue[
            tuple[int, int, Callable[[Store], Any] | None, Future[Any] | None]
        ] = queue.PriorityQueue()
        self._order = itertools.count()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Store], T], *, urgent: bool = False) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((0 if urgent else 1, next(self._order), fn, future))
        return future

    def call(self, fn: Callable[[Store], T], timeout_s: float = 30.0) -> T:
        return self.submit(fn).result(timeout=timeout_s)

    def backlog(self) -> int:
        return self._queue.qsize()

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing.set()
        self._queue.put((2, next(self._order), None, None))
        self._thread.join(timeout=timeout_s)

    def _open(self) -> Store | None:
        """The writer's connection; while another process holds the store locked (a service
        started beside a long write), writes queue and opening is tried again."""
        while True:
            try:
                return Store(self.store_path, timeout_s=1.0)
            except StoreError as exc:
                if "locked" not in str(exc):
                    raise
            if self._closing.wait(0.2):
                return None

    def _run(self) -> None:
        store = self._open()
        if store is None:
            return
        try:
            while True:
                batch = self._next_batch()
                self._run_batch(store, [(fn, fut) for fn, fut in batch if fn and fut])
                if any(fn is None for fn, _ in batch):
                    return
        finally:
            store.close()

    def _next_batch(self) -> list[tuple[Callable[[Store], Any] | None, Future[Any] | None]]:
        """What is queued now, up to ``max_batch``, in lane order. A commit costs an fsync
        (about 7 ms here) whatever it holds, so a burst of decision saves drains in one
        commit instead of queueing for seconds in front of the next Epilog's record."""
        _, _, fn, future = self._queue.get()
        batch = [(fn, future)]
        while fn is not None and len(batch) < self.max_batch:
            try:
                _, _, fn, future = self._queue.get_nowait()
            except queue.Empty:
                break
            batch.append((fn, future))
        return batch

    def _run_batch(
        self, store: Store, batch: list[tuple[Callable[[Store], Any], Future[Any]]]
    ) -> None:
        """Run each write in its own savepoint and the lot in one transaction; results are
        handed out only after the commit, so nobody is told a write is stored before it is."""
        done: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            with store.group():
                for fn, future in batch:
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        with store.atomic():
                            result = fn(store)
                        done.append((future, result, None))
                    except Exception as exc:  # this write only: its savepoint is rolled back
                        done.append((future, None, exc))
        except Exception as exc:  # the commit itself failed: nothing in the batch is stored
            log.warning("store write failed: %s", exc)
            done = [(future, None, exc) for future, _, _ in done]
        for future, result, error in done:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
                log.warning("store write failed: %s", error)


def store_record(store: Store, record: dict[str, object], classifier: Any) -> bool:
    """Keep a Prolog/Epilog record (at most once; True when it was new); an epilog with
    telemetry also feeds the job history (its measured class by ``classifier``)."""
    added = store.add_job_record(record)
    telemetry = record.get("telemetry")
    if not added or record.get("kind") != "epilog" or not isinstance(telemetry, dict):
        return added
    job_id = int(record["job_id"])  # type: ignore[call-overload]
    # A multi-node job: one history row from every node's summary so far (merged, not the
    # last node's alone); each later node's record replaces it with the fuller merge.
    telemetry = merge_telemetry(store.job_records(job_id)) or telemetry
    row = store.decision_for_job(job_id)
    if row is None:
        log.info("epilog of job %d: no advisor decision for it, history not updated", job_id)
        return added
    try:
        dram = float(telemetry["dram_util"])  # type: ignore[arg-type]
        fu = float(telemetry["fu_util"])  # type: ignore[arg-type]
        job = JobDescription.from_wire(row["job"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("epilog of job %d: telemetry unusable: %s", job_id, exc)
        return added
    request = job.job_request()
    app, _ = claimed_app(request)
    claimed_class = None
    if app is not None:
        known = store.application(app)
        claimed_class = None if known is None else known.job_class
    measured = None
    if classifier is not None:
        measured = str(classifier.predict([[dram, fu]])[0])
    store.record_job(
        JobRecord(
            job_id=str(job_id),
            user=request.user,
            job_name=request.job_name,
            script_sha256=request.script_sha256 or "",
            claimed_app=app,
            claimed_class=claimed_class,
            measured_class=measured,
            dram_util=dram,
            fu_util=fu,
            source=str(telemetry.get("source")) if telemetry.get("source") else None,
        )
    )
    log.info("job %d measured class %s (dram %.1f, fu %.1f)", job_id, measured, dram, fu)
    return added
