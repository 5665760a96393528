"""The store's suspect GPUs (``gpu_suspicions``, migration 5) and the reads the advisor's
warm-up makes (job records since a time, decisions of many jobs)."""

from __future__ import annotations

from pathlib import Path

from slurm_pal.adapters.store import SCHEMA_VERSION, Store


def suspicion(gpu: str, job_class: str = "A", since: float = 100.0) -> dict[str, object]:
    return {
        "gpu": gpu, "job_class": job_class, "since_s": since, "onset_s": since - 50,
        "cause": "runtime", "slowdown": 2.0, "runs": 2,
        "evidence": [{"job_id": "7", "app": "a", "expected_s": 1.0, "observed_s": 2.0,
                      "residual": 2.0}],
    }  # fmt: skip


def test_open_close_and_sync(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        assert store.schema_version == SCHEMA_VERSION
        store.open_suspicion("c1", suspicion("g1"))
        store.open_suspicion("c1", suspicion("g2", "D"))
        store.open_suspicion("c2", suspicion("g1"))
        assert [(r["gpu"], r["job_class"]) for r in store.suspicions("c1")] == [
            ("g1", "A"),
            ("g2", "D"),
        ]
        assert store.suspicions("c1")[0]["evidence"][0]["job_id"] == "7"  # type: ignore[index]
        assert store.close_suspicion("c1", "g2", "D", 200.0, "later runs normal")
        assert not store.close_suspicion("c1", "g2", "D", 201.0, "again")
        assert [r["gpu"] for r in store.suspicions("c1")] == ["g1"]
        # a warm-up that finds g3 and no longer g1: g1 closed, g3 opened, c2 untouched
        opened, closed = store.sync_suspicions("c1", [suspicion("g3")], 300.0, "not found")
        assert (opened, closed) == (1, 1)
        assert [r["gpu"] for r in store.suspicions("c1")] == ["g3"]
        assert [r["gpu"] for r in store.suspicions("c2")] == ["g1"]
        rows = {(r["gpu"], r["cleared_why"]) for r in store.suspicions("c1", cleared=True)}
        assert rows == {("g1", "not found"), ("g2", "later runs normal"), ("g3", None)}
        # the same suspicion found again keeps its row (and its first since)
        assert store.sync_suspicions("c1", [suspicion("g3", since=400.0)], 500.0, "x") == (0, 0)
        assert store.suspicions("c1")[0]["since_s"] == 100.0


def test_records_since_and_decisions_of_many_jobs(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        for job_id, start in ((1, 10.0), (2, 1000.0)):
            for kind, when in (("prolog", start), ("epilog", start + 5)):
                store.add_job_record({"record_id": f"{job_id}:{kind}", "job_id": job_id,
                                      "node": "n1", "kind": kind, "time": when})  # fmt: skip
            store.save_decision(f"t{job_id}", {"user": "u"}, {"class": "A"}, job_id=job_id)
        store.save_decision("t2b", {"user": "u"}, {"class": "B"}, job_id=2)
        recent = store.job_records(since=1002.0)  # job 2's epilog: every record of job 2
        assert [r["record_id"] for r in recent] == ["2:prolog", "2:epilog"]
        assert len(store.job_records()) == 4
        rows = store.decisions_for_jobs([1, 2, 3])
        assert [(r["job_id"], r["answer"]["class"]) for r in rows] == [(1, "A"), (2, "B")]  # type: ignore[index]
