"""The advisor's store writer: many queued writes share one commit, each still succeeds or
fails on its own, and nobody hears a write is stored before its commit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.state import StoreWriter

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
