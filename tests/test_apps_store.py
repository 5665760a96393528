"""The store's classification tables: migration 2, applications, models, job history."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from slurm_pal.adapters.ncu import application_features, read_ncu_csv
from slurm_pal.adapters.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError
from slurm_pal.core.classifier import JobClassifier
from slurm_pal.core.features import UtilizationFeatures
from slurm_pal.core.resolve import JobRecord, JobRequest, ResolveConfig, resolve

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
SHA = "ab" * 32


def features(dram: float, fu: float) -> UtilizationFeatures:
    return UtilizationFeatures(
        dram_util=dram,
        fu_util=fu,
        source="ncu",
        dram_source="dram__throughput.avg.pct_of_peak_sustained_elapsed",
        fu_source="pipe:fma",
        measurements=3,
        weight_total=1000.0,
        weight_unit="ns",
    )


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "s.db") as s:
        yield s


def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO campaigns (id, created_at) VALUES ('c1', '2026-01-01T00:00:00')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION >= 2
        assert [c.id for c in store.campaigns()] == ["c1"]  # old data untouched
        assert store.applications() == [] and store.active_classifier() is None
        tables = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master")}
        assert {"applications", "classifier_models", "job_history", "class_mismatches"} <= tables


def test_application_features_round_trip_from_a_real_layout(store: Store) -> None:
    path = FIXTURES / "details15-two-processes.csv"
    measured = application_features([read_ncu_csv(path)])
    app = store.save_application("twoproc", measured, files=[{"path": str(path), "sha256": "x"}])
    assert app.features == measured
    assert (app.job_class, app.class_origin, app.model_id) == (None, None, None)
    assert store.application("twoproc") == app
    assert app.files == ({"path": str(path), "sha256": "x"},)
    assert store.application("nope") is None


def test_saving_again_replaces_the_measurement(store: Store) -> None:
    store.save_application("a", features(10, 90), predicted_class="A", model_id=None)
    again = store.save_application("a", features(80, 10), predicted_class="D")
    assert (again.dram_util, again.fu_util, again.job_class, again.class_origin) == (
        80,
        10,
        "D",
        "fit",
    )
    assert len(store.applications()) == 1


def test_admin_override_survives_new_measurements_and_refits(store: Store) -> None:
    store.save_application("a", features(10, 90), predicted_class="A")
    store.save_application("b", features(80, 10), predicted_class="D")
    store.set_application_class("a", "C")
    assert store.save_application("a", features(11, 91), predicted_class="A").job_class == "C"
    store.save_classifier({"m": 1}, {"a": "A", "b": "B"}, n_apps=2)
    apps = {a.name: a for a in store.applications()}
    assert (apps["a"].job_class, apps["a"].class_origin, apps["a"].fu_util) == ("C", "admin", 91)
    assert (apps["b"].job_class, apps["b"].class_origin) == ("B", "fit")
    # Undoing the override gives the model's class back.
    model = store.active_classifier()
    assert model is not None
    cleared = store.clear_application_override("a", predicted_class="A", model_id=model.id)
    assert (cleared.job_class, cleared.class_origin, cleared.model_id) == ("A", "fit", model.id)
    with pytest.raises(StoreError, match="no admin override"):
        store.clear_application_override("a", predicted_class="A", model_id=model.id)


def test_admin_may_declare_an_application_without_a_profile(store: Store) -> None:
    app = store.set_application_class("vendor-code", "B")
    assert (app.features, app.job_class, app.class_origin) == (None, "B", "admin")
    store.clear_application_override("vendor-code", predicted_class=None, model_id=None)
    assert store.application("vendor-code") is None
    with pytest.raises(StoreError, match="no application 'ghost'.*known: none yet"):
        store.clear_application_override("ghost", predicted_class=None, model_id=None)


def test_models_one_active_and_the_model_round_trips(store: Store) -> None:
    store.save_application("a", features(5, 95))
    store.save_application("b", features(50, 50))
    store.save_application("c", features(95, 5))
    model = JobClassifier(n_classes=3, class_names=["A", "B", "C"]).fit(
        [a.features for a in store.applications()]
    )
    first = store.save_classifier(model.to_dict(), {"a": "A", "b": "B", "c": "C"}, n_apps=3)
    second = store.save_classifier(model.to_dict(), {"a": "A", "b": "B", "c": "C"}, n_apps=3)
    active = store.active_classifier()
    assert active is not None and active.id == second != first and active.n_apps == 3
    rebuilt = JobClassifier.from_dict(active.model)
    assert rebuilt.predict([[90.0, 10.0]]).tolist() == ["C"]
    count = store._db.execute("SELECT sum(active), count(*) FROM classifier_models").fetchone()
    assert count == (1, 2)
    assert {a.model_id for a in store.applications()} == {second}


def test_a_failed_fit_save_writes_nothing(store: Store) -> None:
    store.save_application("a", features(5, 95))
    store.save_classifier({"m": 1}, {"a": "A"}, n_apps=1)
    before = store.active_classifier()
    with pytest.raises(StoreError, match="no application 'ghost'.*known: a"):
        store.save_classifier({"m": 2}, {"a": "B", "ghost": "C"}, n_apps=2)
    assert store.active_classifier() == before
    assert store.application("a").job_class == "A"  # type: ignore[union-attr]


def test_the_schema_refuses_inconsistent_rows(store: Store) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        store._db.execute(
            "INSERT INTO applications (name, class, class_origin, updated_at) "
            "VALUES ('x', 'A', 'guess', 'now')"
        )
    with pytest.raises(sqlite3.IntegrityError):
        store._db.execute(
            "INSERT INTO applications (name, class, updated_at) VALUES ('x', 'A', 'now')"
        )


def record(job_id: str, measured: str | None, **kwargs: object) -> JobRecord:
    base = JobRecord(
        job_id=job_id, user="alice", job_name="train", script_sha256=SHA, measured_class=measured
    )
    return dataclasses.replace(base, **kwargs)


def test_job_history_mismatches_and_the_store_view(store: Store) -> None:
    store.save_application("resnet50", features(10, 90), predicted_class="A")
    store.save_application("pagerank", features(90, 10), predicted_class="D")
    claim = {"claimed_app": "resnet50", "claimed_class": "A", "dram_util": 88.0, "fu_util": 9.0}
    assert store.record_job(record("100", "D", **claim)) is True
    assert store.record_job(record("101", "D", **claim)) is True
    assert store.record_job(record("102", None, **claim)) is False  # telemetry failed
    assert store.record_job(record("103", "A", user="bob", **claim)) is False
    mismatches = store.class_mismatches()
    assert [(m["job_id"], m["claimed_class"], m["measured_class"]) for m in mismatches] == [
        ("100", "A", "D"),
        ("101", "A", "D"),
    ]
    # A spooled record sent twice replaces itself, mismatch included.
    store.record_job(record("101", "A", **claim))
    assert [m["job_id"] for m in store.class_mismatches()] == ["100"]

    view = store.store_view()
    assert view.apps == {"resnet50": "A", "pagerank": "D"}
    summary = view.history[("alice", "train", SHA)]
    assert (summary.runs, summary.measured_runs, summary.app) == (3, 2, "resnet50")
    # The advisor resolves the next submission from the snapshot, without the store.
    job = JobRequest(user="alice", job_name="train", script_sha256=SHA, comment="pal:app=resnet50")
    result = resolve(job, view, ResolveConfig())
    # One D, then (re-sent) one A: a tie goes to the most recent run, which agrees with the name.
    assert (result.job_class, result.origin, result.mismatch) == ("A", "history", False)
    # Job 100 named resnet50 (A) and measured D: alice's claims of resnet50 are not believed.
    assert view.contradicted == {}  # without the class order nothing is distrusted
    ranked = store.store_view(class_names=("A", "B", "C", "D"))
    assert ranked.contradicted == {("alice", "resnet50"): 1}
    renamed = dataclasses.replace(job, job_name="dodge")
    assert resolve(renamed, ranked, ResolveConfig(default_class="B")).job_class == "B"


def test_history_keeps_the_latest_runs_per_key(store: Store) -> None:
    for n in range(6):
        store.record_job(record(str(n), "C" if n < 3 else "B"))
    store.record_job(record("x", "D", job_name="other"))
    rows = store.history_rows(per_key=3)
    assert [r.measured_class for r in rows if r.key[1] == "train"] == ["B", "B", "B"]
    assert len(rows) == 4
    assert store.store_view(history_per_key=3).history[("alice", "train", SHA)].measured_runs == 3
