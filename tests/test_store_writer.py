"""The advisor's store writer: many queued writes share one commit, each still succeeds or
fails on its own, and nobody hears a write is stored before its commit."""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.state import StoreWriter
from slurm_pal.advisor.writer import WAITING, _Write, store_record, take_batch

JOB = {"user": "alice", "tres_per_node": "gres/gpu:2"}
ANSWER = {"action": "route", "gres": "gpu:v100_a:2"}


def _save(token: str):
    return lambda s: s.save_decision(token, JOB, ANSWER, state="reserved")


def _fail(store: Store) -> None:
    store.save_decision("doomed", JOB, ANSWER, state="reserved")
    raise ValueError("this write fails after writing")


@pytest.fixture
def blocked_writer(tmp_path: Path):
    """A writer whose thread is held on a first write, so the test can queue a batch."""
    writer = StoreWriter(tmp_path / "advisor.db")
    gate, running = threading.Event(), threading.Event()
    first = writer.submit(lambda s: running.set() or gate.wait(10))
    assert running.wait(10)  # the writer holds it: what is queued next forms one batch
    yield writer, gate, tmp_path / "advisor.db"
    gate.set()
    first.result(10)
    writer.close()


def test_queued_writes_drain_in_one_batch_and_a_failure_rolls_back_only_itself(blocked_writer):
    writer, gate, db = blocked_writer
    saves = [writer.submit(_save(f"t{i}")) for i in range(50)]
    failing = writer.submit(_fail)
    after = writer.submit(_save("after"))
    gate.set()
    for future in [*saves, after]:
        future.result(10)
    with pytest.raises(ValueError, match="fails after writing"):
        failing.result(10)
    writer.close()
    with Store(db) as store:
        tokens = {row["token"] for row in store.decisions()}
    assert tokens == {f"t{i}" for i in range(50)} | {"after"}  # "doomed" rolled back


def test_urgent_writes_go_first_within_what_is_queued(blocked_writer):
    writer, gate, _ = blocked_writer
    order: list[str] = []
    writer.submit(lambda s: order.append("decision"))
    writer.submit(lambda s: order.append("record"), urgent=True)
    gate.set()
    writer.call(lambda s: None)
    assert order == ["record", "decision"]


def test_results_are_handed_out_only_after_the_commit(tmp_path: Path):
    """A reader on another connection sees the write once its future resolves."""
    db = tmp_path / "advisor.db"
    writer = StoreWriter(db)
    try:
        writer.call(_save("seen"))
        with Store(db) as other:
            assert other.decision("seen") is not None
    finally:
        writer.close()


def test_a_failed_commit_fails_every_write_of_the_batch(blocked_writer):
    """A constraint checked only at commit (a deferred foreign key) fails the whole group:
    every write in it hears so, none is stored, and the writer goes on."""
    writer, gate, db = blocked_writer
    saved = writer.submit(_save("lost"))

    def orphan_source(store: Store) -> None:
        store._db.execute("PRAGMA defer_foreign_keys=ON")
        store._db.execute(
            "INSERT INTO sources (campaign_id, sha256, path, fmt, job_class, n_rows, ingested_at)"
            " VALUES ('no-such-campaign', 'x', 'x.csv', 'csv', 'A', 0, 'now')"
        )

    orphan = writer.submit(orphan_source)
    gate.set()
    for future in (saved, orphan):
        with pytest.raises(Exception, match="FOREIGN KEY"):
            future.result(10)
    writer.call(_save("next"))
    with Store(db) as other:
        assert other.decision("lost") is None
        assert other.decision("next") is not None


# -- a store locked by another process ------------------------------------------------------------


def _durable_save(writer: StoreWriter, token: str):
    args = {"token": token, "job": JOB, "answer": ANSWER, "state": "reserved"}
    return writer.submit(_save(token), durable=("save_decision", args))


@contextlib.contextmanager
def locked(db: Path):
    """What an admin's ``sqlite3`` shell does with ``BEGIN EXCLUSIVE``: hold the write lock."""
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield holder
    finally:
        holder.execute("COMMIT")
        holder.close()


def _tokens_in_order(db: Path) -> list[str]:
    """Read as a reader beside the lock does (a Store would migrate first: a write)."""
    reader = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] for r in reader.execute("SELECT token FROM advisor_decisions ORDER BY rowid")]
    finally:
        reader.close()


def test_writes_wait_for_a_locked_store_and_land_once_in_order(tmp_path: Path, caplog):
    db = tmp_path / "advisor.db"
    writer = StoreWriter(db)
    writer.call(lambda s: None)  # opened before the lock
    caplog.set_level(logging.INFO, logger="slurm_pal.advisor")
    try:
        with locked(db):
            saves = [_durable_save(writer, f"t{i}") for i in range(30)]
            record = {"record_id": "7:n1:prolog", "job_id": 7, "node": "n1", "kind": "prolog"}
            stored = writer.submit(
                lambda s: store_record(s, record, None),
                urgent=True,
                durable=("record", {"record": record}),
            )
            # the hook waiting for its record hears it is safe, while the lock is held
            assert stored.result(10) is WAITING
            assert all(f.result(10) is WAITING for f in saves)
            assert writer.journal_path.exists()
            assert writer.snapshot()["store_writes_waiting"] == 31
            assert _tokens_in_order(db) == []  # readers still read (WAL): nothing written yet
        writer.call(lambda s: None)
        assert _tokens_in_order(db) == [f"t{i}" for i in range(30)]
        with Store(db) as store:
            assert [r["record_id"] for r in store.job_records()] == ["7:n1:prolog"]
        assert not writer.journal_path.exists()
        assert writer.snapshot()["store_writes_waiting"] == 0
        assert writer.snapshot()["store_locked_episodes"] == 1
    finally:
        writer.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings  # one when it starts, one when it ends
    assert "locked by another process since" in warnings[0]
    assert "writes waiting" in warnings[0]
    assert "writable again after" in warnings[1]
    assert "31 writes that waited are written" in warnings[1]
    assert not any(r.exc_info for r in caplog.records)  # no traceback: an expected condition


def test_past_its_memory_bound_a_locked_writer_keeps_writes_on_disk_only(tmp_path: Path, caplog):
    db = tmp_path / "advisor.db"
    writer = StoreWriter(db, max_waiting=5, max_batch=4)
    writer.call(lambda s: None)
    caplog.set_level(logging.WARNING, logger="slurm_pal.advisor")
    try:
        with locked(db):
            saves = [_durable_save(writer, f"t{i:02d}") for i in range(40)]
            assert all(f.result(10) is WAITING for f in saves)
            snap = writer.snapshot()
            assert snap["store_writes_waiting"] == 40
            assert snap["store_writes_on_disk_only"] == 35  # in memory: the bound
            assert len(writer._held) == 5
        writer.call(lambda s: None)
        assert _tokens_in_order(db) == [f"t{i:02d}" for i in range(40)]
        assert writer.snapshot()["store_writes_on_disk_only"] == 0
    finally:
        writer.close()
    full = [r.getMessage() for r in caplog.records if "wait in memory" in r.getMessage()]
    assert len(full) == 1, full  # one warning when it fills


def test_a_stop_while_locked_keeps_the_writes_for_the_next_start(tmp_path: Path):
    db = tmp_path / "advisor.db"
    writer = StoreWriter(db)
    writer.call(lambda s: None)
    with locked(db):
        saves = [_durable_save(writer, f"t{i}") for i in range(10)]
        assert all(f.result(10) is WAITING for f in saves)
        writer.close(timeout_s=10)
        assert not writer._thread.is_alive()
        journal = writer.journal_path
        assert len(journal.read_text().splitlines()) == 10
    assert _tokens_in_order(db) == []
    again = StoreWriter(db)
    try:
        again.call(_save("after-restart"))  # the journal is written before the first write
        again.call(lambda s: None)
        assert _tokens_in_order(db) == [*(f"t{i}" for i in range(10)), "after-restart"]
        assert not journal.exists()
    finally:
        again.close()
    third = StoreWriter(db)  # replaying twice would change nothing: each token is written once
    try:
        third.call(lambda s: None)
        assert len(_tokens_in_order(db)) == 11
    finally:
        third.close()


def test_a_broken_write_still_fails_at_once(tmp_path: Path):
    """Only a lock held by another process is waited out: any other error is the write's."""
    db = tmp_path / "advisor.db"
    writer = StoreWriter(db)
    try:
        failing = writer.submit(_fail)
        with pytest.raises(ValueError):
            failing.result(10)
        assert writer.snapshot()["store_locked_episodes"] == 0
    finally:
        writer.close()


def test_a_failed_record_write_names_its_job(tmp_path: Path, caplog) -> None:
    writer = StoreWriter(tmp_path / "advisor.db")
    record = {"record_id": "9:n1:epilog", "job_id": 9, "node": "n1", "kind": "epilog"}

    def broken(store: Store) -> None:
        raise ValueError("telemetry unusable")

    caplog.set_level(logging.WARNING, logger="slurm_pal.advisor")
    try:
        failing = writer.submit(broken, urgent=True, durable=("record", {"record": record}))
        with pytest.raises(ValueError):
            failing.result(10)
    finally:
        writer.close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "job 9's epilog record from n1" in line and "telemetry unusable" in line


class _Waits(queue.PriorityQueue):  # type: ignore[type-arg]
    """A queue whose timed waits are noted and hand over the next of ``later`` at once (what
    arrives while the writer lingers), or time out."""

    def __init__(self, later: list[tuple[int, int, _Write | None]]) -> None:
        super().__init__()
        self.later, self.waits = later, 0

    def get(self, block: bool = True, timeout: float | None = None):  # type: ignore[no-untyped-def]
        if timeout is None:
            return super().get(block)
        self.waits += 1
        if not self.later:
            raise queue.Empty
        return self.later.pop(0)


def _queued_save(seq: int) -> _Write:
    return _Write(seq, None, None, ("save_decision", {"token": f"t{seq}"}))


def test_saves_nobody_waits_for_linger_for_the_next_and_a_waited_write_ends_it() -> None:
    call = _Write(3, lambda s: None, None)  # writer.call(): somebody waits for it
    writes = _Waits([(1, 2, _queued_save(2)), (1, 3, call), (1, 4, _queued_save(4))])
    writes.put((1, 1, _queued_save(1)))
    batch, closed = take_batch(writes, max_batch=256, linger_s=30.0)
    assert [w.seq for w in batch] == [1, 2, 3] and not closed
    assert writes.waits == 2  # waited after each save, not after the call


def test_an_urgent_write_is_committed_without_lingering() -> None:
    record = _Write(1, None, None, ("record", {"record": {}}))
    writes = _Waits([(1, 2, _queued_save(2))])
    writes.put((0, 1, record))
    batch, _ = take_batch(writes, max_batch=256, linger_s=30.0)
    assert [w.seq for w in batch] == [1] and writes.waits == 0
    unlingered = _Waits([(1, 2, _queued_save(2))])
    unlingered.put((1, 1, _queued_save(1)))
    assert [w.seq for w in take_batch(unlingered, 256, linger_s=0)[0]] == [1]
    assert unlingered.waits == 0


def test_close_ends_a_linger() -> None:
    writes = _Waits([(2, 9, None)])
    writes.put((1, 1, _queued_save(1)))
    batch, closed = take_batch(writes, max_batch=256, linger_s=30.0)
    assert [w.seq for w in batch] == [1] and closed
