"""The advisor's store writer: one thread that owns a store connection and runs the writes
(decisions after their answer, records while their hook waits, bindings, purges), and what
keeping one job record writes.

Why a thread: SQLite connections are per thread, and the decide path must never wait for the
store (PROTOCOL.md: the plugin waits with slurmctld's job-write lock held).

Why writes wait instead of failing while another process holds the store's write lock (an
admin's ``sqlite3`` shell, a backup, a long ``campaign collect``): a decision is what ties a
job's record to its class and placement, and a lost one is lost data. So a write that finds the
store locked is kept, in order, and written once the lock is released; decisions and records
(the *durable* writes) are also appended to a journal next to the store (``<store>.waiting``,
fsync'd) so that a stop or a crash meanwhile loses none of them: the next writer replays the
journal first. Replaying is safe to repeat: a decision is written once per token, a record
once per ``record_id``. Memory is bounded (``max_waiting``): past it, durable writes wait in
the journal only.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from slurm_pal.adapters.store import Store, StoreError
from slurm_pal.advisor.jobend import merge_telemetry
from slurm_pal.advisor.logtext import about, reason
from slurm_pal.core.resolve import JobRecord, claimed_app
from slurm_pal.engine.jobdesc import JobDescription

__all__ = ["WAITING", "StoreWriter", "bind_decision", "store_locked", "store_record", "take_batch"]

log = logging.getLogger("slurm_pal.advisor")

T = TypeVar("T")

Durable = tuple[str, Mapping[str, Any]]
"""A write that can be replayed from its journal line: (kind, arguments as JSON)."""


class _Waiting:
    """The result of a durable write kept for later: the store was locked, the write is safe
    in the journal and will be written once the lock is released. True: it is not a
    duplicate as far as anyone can tell yet."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "WAITING"


WAITING: Any = _Waiting()

SAVE_LINGER_S = 0.02
"""How long a batch of saves nobody waits for waits for more before its commit: a burst's
submissions come a few milliseconds apart; a decision reaches the store this much later at
most (the service keeps it in memory meanwhile, and a crash loses what is queued either way)."""


def store_locked(exc: BaseException) -> bool:
    """Whether ``exc`` says another connection holds the store's lock (SQLITE_BUSY/LOCKED):
    an expected, passing condition, not a failed write."""
    if isinstance(exc, StoreError) and isinstance(exc.__cause__, sqlite3.Error):
        exc = exc.__cause__
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return True
    text = str(exc)
    return "database is locked" in text or "database is busy" in text


@dataclass(eq=False)
class _Write:
    """One queued write: ``fn`` runs it (None for a journal line replayed from ``durable``),
    ``future`` hears its result."""

    seq: int
    fn: Callable[[Store], Any] | None
    future: Future[Any] | None
    durable: Durable | None = None
    journaled: bool = False
    started: bool = field(default=False, repr=False)


def take_batch(
    writes: queue.PriorityQueue[tuple[int, int, _Write | None]], max_batch: int, linger_s: float
) -> tuple[list[_Write], bool]:
    """What is queued now, up to ``max_batch``, in lane order (0: urgent); True when the
    writer's close() was queued. A commit costs an fsync (about 7 ms here) whatever it holds,
    so a burst of decision saves drains in one commit instead of queueing for seconds in
    front of the next Epilog's record. A batch of saves nobody waits for (decisions, binds)
    waits up to ``linger_s`` for more: submissions a few milliseconds apart then share a
    commit, whose CPU (a fifth of a millisecond, on the controller's cores) each would pay
    alone."""
    lane, _, write = writes.get()
    batch: list[_Write] = []
    deadline: float | None = None
    lingers = linger_s > 0
    while write is not None:
        batch.append(write)
        if len(batch) >= max_batch:
            break
        if lane != 1 or write.durable is None:
            lingers = False  # somebody waits for this one: commit what is here
        try:
            lane, _, write = writes.get_nowait()
            continue
        except queue.Empty:
            pass
        if not lingers:
            break
        now = time.monotonic()
        deadline = now + linger_s if deadline is None else deadline
        if now >= deadline:
            break
        try:
            lane, _, write = writes.get(timeout=deadline - now)
        except queue.Empty:
            break
    return batch, write is None


class StoreWriter:
    """One thread that owns a store connection and runs writes (SQLite connections are per
    thread; decisions are written after the answer, records are waited for).

    Two lanes, each in order: ``urgent`` writes (an Epilog's record, which its hook waits for)
    go before the others (decision saves, which nobody waits for: under a burst of submits
    thousands can queue, and an Epilog behind them would miss its wait and spool). A record
    whose job's decision is still queued then finds no claim to compare with; its measured
    class is kept all the same.

    While the store is locked by another process, writes wait (module docstring): one warning
    when that starts, one when it ends; a durable write's future resolves to :data:`WAITING`
    once it is in the journal."""

    def __init__(
        self,
        store_path: Path,
        *,
        max_batch: int = 256,
        max_waiting: int = 20_000,
        journal: Path | None = None,
        clock: Callable[[], float] = time.time,
        linger_s: float = SAVE_LINGER_S,
    ) -> None:
        self.store_path = Path(store_path)
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.max_waiting = max_waiting
        self.journal_path = journal or Path(f"{self.store_path}.waiting")
        self.clock = clock
        self.replayers: dict[str, Callable[[Store, Mapping[str, Any]], Any]] = {
            "save_decision": lambda s, a: s.save_decision(**a),
            "update_decision": lambda s, a: s.update_decision(**a),
            "record": lambda s, a: store_record(s, dict(a["record"]), None),
            "bind": lambda s, a: bind_decision(s, str(a["token"]), int(a["job_id"])),
        }
        """How a journal line is written (AdvisorState sets ``record`` to its full path)."""
        self._queue: queue.PriorityQueue[tuple[int, int, _Write | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._run_id = f"{os.getpid()}.{time.time_ns()}"  # this writer's journal lines
        self._closing = threading.Event()
        self._lock = threading.Lock()  # what snapshot() reads from other threads
        self._journal_lock = threading.Lock()  # appends from the writer and from submit()
        self._held: list[_Write] = []  # taken off the queue, waiting for the lock's release
        self._disk_seqs: set[int] = set()  # durable writes past max_waiting: journal only
        self._locked_since: float | None = None
        self._full_warned = False
        self.stats = {"store_locked_episodes": 0, "store_writes_waited": 0}
        self._replayed_at_start = False
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    # -- the API -----------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[Store], T],
        *,
        urgent: bool = False,
        durable: Durable | None = None,
    ) -> Future[T]:
        """Queue a write. ``durable``: how to replay it from the journal (decisions and
        records: kept on disk while the store is locked)."""
        future: Future[T] = Future()
        seq = next(self._order)
        write = _Write(seq, fn, future, durable)
        if durable is not None and self._locked_since is not None:
            # The store is locked: into the journal now, so a hook waiting for its record
            # hears at once that it is safe (not after the writer's next try for the lock).
            self._journal([write])
            if write.journaled:
                write.started = True
                future.set_running_or_notify_cancel()
                future.set_result(WAITING)
        self._queue.put((0 if urgent else 1, seq, write))
        return future

    def submit_durable(
        self, kind: str, args: Mapping[str, Any], *, urgent: bool = False
    ) -> Future[Any]:
        """Queue a write that its journal line describes whole (``replayers[kind]``)."""
        replay = self.replayers[kind]
        return self.submit(lambda s: replay(s, args), urgent=urgent, durable=(kind, args))

    def call(self, fn: Callable[[Store], T], timeout_s: float = 30.0) -> T:
        return self.submit(fn).result(timeout=timeout_s)

    def backlog(self) -> int:
        """Writes not yet written: queued, and waiting for a locked store (memory and disk)."""
        with self._lock:
            return self._queue.qsize() + len(self._held) + len(self._disk_seqs)

    def locked_for(self) -> float:
        """Seconds the store has been locked by another process (0 when it is not)."""
        since = self._locked_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def snapshot(self) -> dict[str, object]:
        """For ``serve stats``: writes waiting (all, journal only) and the lock episodes."""
        with self._lock:
            on_disk = len(self._disk_seqs)
            waiting = self._queue.qsize() + len(self._held) + on_disk
        return {
            **self.stats,
            "store_writes_waiting": waiting,
            "store_writes_on_disk_only": on_disk,
            "store_locked_s": round(self.locked_for(), 1),
        }

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing.set()
        self._queue.put((2, next(self._order), None))
        self._thread.join(timeout=timeout_s)

    # -- the thread ----------------------------------------------------------------------------
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
                batch, last = self._next_batch()
                if not self._replayed_at_start:
                    # With the first write, not at start: whoever built the writer has set
                    # its replayers by then.
                    self._replayed_at_start = True
                    self._replay_journal(store, only_disk=False)
                if batch:
                    self._run_batch(store, batch)
                if self._held and not self._wait_out_the_lock(store):
                    return
                if last:
                    return
        finally:
            store.close()

    def _next_batch(self) -> tuple[list[_Write], bool]:
        """What is queued now (:func:`take_batch`); True when close() was called."""
        return take_batch(self._queue, self.max_batch, self.linger_s)

    def _run_batch(self, store: Store, batch: list[_Write]) -> None:
        """Run each write in its own savepoint and the lot in one transaction; results are
        handed out only after the commit, so nobody is told a write is stored before it is.
        A store locked by another process keeps the batch for later (:meth:`_hold`)."""
        done: list[tuple[_Write, Any, BaseException | None]] = []
        try:
            with store.group():
                for write in batch:
                    if write.future is not None and not write.started:
                        write.started = True
                        if not write.future.set_running_or_notify_cancel():
                            continue
                    try:
                        with store.atomic():
                            result = self._execute(store, write)
                        done.append((write, result, None))
                    except Exception as exc:  # this write only: its savepoint is rolled back
                        done.append((write, None, exc))
        except Exception as exc:
            if store_locked(exc):
                self._hold(batch)
                return
            # the commit itself failed: nothing in the batch is stored
            log.warning("store write of %d writes failed, none stored: %s", len(batch), reason(exc))
            done = [(write, None, exc) for write, _, _ in done]
        for write, result, error in done:
            future = write.future
            if future is None or future.done():  # told WAITING before: it is written now
                if error is not None:
                    log.warning("store write of %s (it waited for the lock) failed: %s",
                                _what(write), reason(error))  # fmt: skip
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
                log.warning("store write of %s failed: %s", _what(write), reason(error))

    def _execute(self, store: Store, write: _Write) -> Any:
        if write.fn is not None:
            return write.fn(store)
        assert write.durable is not None
        kind, args = write.durable
        return self.replayers[kind](store, args)

    # -- a locked store ------------------------------------------------------------------------
    def _hold(self, writes: list[_Write]) -> None:
        """Keep ``writes`` (in order) until the lock is released: durable ones go to the
        journal too (their futures hear WAITING); past ``max_waiting`` writes in memory, a
        journaled write is kept on disk only."""
        if self._locked_since is None:
            self._locked_since = self.clock()
            self.stats["store_locked_episodes"] += 1
        self._journal([w for w in writes if w.durable is not None and not w.journaled])
        with self._lock:
            room = self.max_waiting - len(self._held)
            for write in writes:
                self.stats["store_writes_waited"] += 1
                if write.journaled and write.fn is not None and room <= 0:
                    self._disk_seqs.add(write.seq)  # its journal line is what gets written
                else:
                    self._held.append(write)
                    room -= 1
            full = room <= 0
        for write in writes:
            future = write.future
            if write.journaled and future is not None and not future.done():
                if not write.started:
                    write.started = True
                    if not future.set_running_or_notify_cancel():
                        continue
                future.set_result(WAITING)
        if full and not self._full_warned:
            self._full_warned = True
            log.warning(
                "store %s: %d writes wait in memory, the most kept there: further decisions "
                "and records wait in %s only",
                self.store_path,
                self.max_waiting,
                self.journal_path,
            )

    def _wait_out_the_lock(self, store: Store) -> bool:
        """Retry the held writes until the lock is released (each try waits up to the
        connection's busy timeout, a second), taking in what is queued meanwhile; then write
        them in order, those kept on disk only last, and clear the journal. False when the
        writer was closed first (the journal keeps the decisions and records)."""
        since = self._locked_since or self.clock()
        log.warning(
            "store %s locked by another process since %s, %d writes waiting: kept in memory "
            "and in %s, written in order once the lock is released",
            self.store_path,
            time.strftime("%H:%M:%S", time.localtime(since)),
            self.backlog(),
            self.journal_path,
        )
        written = 0
        while self._held or self._disk_seqs:
            if not self._try_begin(store):
                if self._closing.is_set():
                    self._give_up_at_stop()
                    return False
                self._drain_into_held()
                continue
            with self._lock:
                held, self._held = self._held, []
            for start in range(0, len(held), self.max_batch):
                chunk = held[start : start + self.max_batch]
                self._run_batch(store, chunk)
                if self._held:  # locked again before all were written: wait that out too
                    with self._lock:
                        self._held.extend(held[start + self.max_batch :])
                    break
                written += len(chunk)
            else:
                written += self._replay_journal(store, only_disk=True)
        self._locked_since = None
        self._full_warned = False
        with contextlib.suppress(OSError):
            self.journal_path.unlink()
        log.warning(
            "store %s writable again after %.1f s: the %d writes that waited are written",
            self.store_path,
            self.clock() - since,
            written,
        )
        return True

    def _give_up_at_stop(self) -> None:
        """Closed while the store is still locked: decisions and records stay in the journal
        for the next start; whoever waits on another write hears why."""
        self._drain_into_held()
        with self._lock:
            held, self._held = self._held, []
        log.warning(
            "store %s still locked at stop: %d decisions and records wait in %s for the next start",
            self.store_path,
            sum(1 for w in held if w.journaled) + len(self._disk_seqs),
            self.journal_path,
        )
        for write in held:
            if write.future is not None and not write.future.done():
                write.future.set_exception(
                    StoreError(f"store {self.store_path} still locked when the service stopped")
                )

    def _try_begin(self, store: Store) -> bool:
        """Whether the write lock can be had now (waits up to the busy timeout)."""
        return store.write_lock_free()

    def _drain_into_held(self) -> None:
        """Take what was queued meanwhile (in submission order) into the held writes."""
        writes: list[_Write] = []
        closing = False
        while True:
            try:
                _, _, write = self._queue.get_nowait()
            except queue.Empty:
                break
            if write is None:
                closing = True
            else:
                writes.append(write)
        writes.sort(key=lambda w: w.seq)
        self._hold(writes)
        if closing:  # seen again by the loop once the held writes are written
            self._queue.put((2, next(self._order), None))

    def _journal(self, writes: list[_Write]) -> None:
        """Append the writes' journal lines (one fsync); one not written waits in memory."""
        if not writes:
            return
        try:
            lines = [  # type: ignore[misc]
                json.dumps({"run": self._run_id, "seq": w.seq, "kind": k, "args": a}) + "\n"
                for w in writes
                for k, a in [w.durable]
            ]
            with self._journal_lock:
                fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    data = memoryview("".join(lines).encode())
                    while data:
                        data = data[os.write(fd, data) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except (OSError, TypeError, ValueError) as exc:
            log.warning(
                "cannot keep %d waiting writes in %s (they wait in memory only): %s",
                len(writes),
                self.journal_path,
                exc,
            )
            return
        for write in writes:
            write.journaled = True

    def _replay_journal(self, store: Store, *, only_disk: bool) -> int:
        """Write the journal's lines: at start all of them (a stop or crash while the store
        was locked; writing one twice is harmless), else this writer's kept on disk only.
        How many it wrote (or held again, the store locked once more)."""
        try:
            text = self.journal_path.read_text()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.warning("cannot read the waiting writes in %s: %s", self.journal_path, exc)
            return 0
        writes = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                entry = json.loads(line)
                kind, args, seq = str(entry["kind"]), dict(entry["args"]), int(entry["seq"])
                mine = entry.get("run") == self._run_id
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s line %d is no waiting write (skipped): %s",
                            self.journal_path, number, exc)  # fmt: skip
                continue
            if kind not in self.replayers:
                log.warning("%s line %d: unknown write %r (skipped)",
                            self.journal_path, number, kind)  # fmt: skip
                continue
            if only_disk and not (mine and seq in self._disk_seqs):
                continue
            writes.append(_Write(seq, None, None, (kind, args), journaled=True))
        if only_disk:
            with self._lock:
                self._disk_seqs.clear()  # in memory now: written or held
        for start in range(0, len(writes), self.max_batch):
            self._run_batch(store, writes[start : start + self.max_batch])
        if not only_disk and writes:
            if not self._held:
                with contextlib.suppress(OSError):
                    self.journal_path.unlink()
            log.info("%d decisions and records kept in %s at the last stop: written",
                     len(writes), self.journal_path)  # fmt: skip
        return len(writes)


def _what(write: _Write) -> str:
    """A write as an admin looks it up: the job record (Slurm's job id, hook, node) or the
    decision (its token: ``r=`` in the job's admin comment)."""
    if write.durable is None:
        return "an advisor write"
    kind, args = write.durable
    if kind == "record" and isinstance(args.get("record"), Mapping):
        return about(args["record"])
    if kind == "bind":
        return f"decision r={args.get('token')}'s job id {args.get('job_id')}"
    return f"decision r={args.get('token')} ({kind.replace('_', ' ')})"


def bind_decision(store: Store, token: str, job_id: int) -> bool:
    """Note a decision's Slurm job id (state ``bound`` unless it was re-planned already);
    False when no decision has that token (yet)."""
    row = store.decision(token)
    if row is None:
        return False
    fresh = row["state"] in ("reserved", "waiting")
    store.update_decision(token, job_id=job_id, state="bound" if fresh else None)
    return True


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
