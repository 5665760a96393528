"""The advisor's tables (migration 3): decisions by token and job records applied at most once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from slurm_pal.adapters.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError


def test_a_version_2_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:2], start=1):
        db.executescript(script)
        db.execute(f"PRAGMA user_version={number}")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION >= 3
        store.save_decision("t1", {"name": "x"}, {"action": "route"})
        assert store.decision("t1")["job"] == {"name": "x"}  # type: ignore[index]


def test_decisions_bind_to_jobs_and_change_state(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        store.save_decision("tok", {"name": "a", "tres_per_node": "gres:gpu:1"}, {"ok": True})
        store.save_decision("tok", {"name": "other"}, {"ok": False})  # a token is written once
        assert store.decision("tok")["job"]["name"] == "a"  # type: ignore[index]
        assert store.decision_for_job(7) is None
        assert store.update_decision("tok", job_id=7, state="bound")
        row = store.decision_for_job(7)
        assert row is not None and row["token"] == "tok" and row["state"] == "bound"
        assert store.update_decision("tok", answer={"ok": True, "set": {"req_nodes": "n2"}})
        assert store.decision("tok")["answer"]["set"] == {"req_nodes": "n2"}  # type: ignore[index]
        assert not store.update_decision("nope", state="x")
        assert [d["token"] for d in store.decisions("bound")] == ["tok"]
        assert store.decisions("reserved") == []


def test_job_records_are_kept_once(tmp_path: Path) -> None:
    record = {"record_id": "5:n1:epilog", "job_id": 5, "node": "n1", "kind": "epilog", "time": 1.5}
    with Store(tmp_path / "s.db") as store:
        assert store.add_job_record(record) is True
        assert store.add_job_record({**record, "time": 9.0}) is False
        assert store.job_records(5) == [record]
        assert store.job_records(6) == []
        with pytest.raises(StoreError, match="record_id"):
            store.add_job_record({"job_id": 5})


def test_purge_deletes_what_is_older_than_the_retention(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        for token in ("old", "new"):
            store.save_decision(token, {"user": "u"}, {"ok": True})
        for record_id in ("1:n1:epilog", "2:n1:epilog"):
            store.add_job_record(
                {"record_id": record_id, "job_id": 1, "node": "n1", "kind": "epilog"}
            )
    db = sqlite3.connect(path)
    db.execute("UPDATE advisor_decisions SET created = '2020-01-01T00:00:00' WHERE token = 'old'")
    db.execute(
        "UPDATE job_records SET received = '2020-01-01T00:00:00' WHERE record_id = '1:n1:epilog'"
    )
    db.commit()
    db.close()
    with Store(path) as store:
        counts = store.purge_advisor_history(90)
        assert counts["advisor_decisions"] == 1 and counts["job_records"] == 1
        assert store.decision("old") is None and store.decision("new") is not None
        assert [r["record_id"] for r in store.job_records(1)] == ["2:n1:epilog"]
        assert store.purge_advisor_history(90)["advisor_decisions"] == 0
