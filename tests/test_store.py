"""The SQLite store: schema versioning, all-or-nothing ingest, campaigns, concurrent writers."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from slurm_pal.adapters import store as store_module
from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.store import SCHEMA_VERSION, Store, StoreError
from slurm_pal.adapters.store import campaigns as store_campaigns
from slurm_pal.core.binning import PMBinner
from slurm_pal.core.campaigns import RunClockEvents
from slurm_pal.example_campaign import generate_example_campaign

CLASSES = ("A", "B", "C", "D")


def campaign_file(tmp_path: Path, seed: int, name: str | None = None, **kwargs: object):
    path = tmp_path / (name or f"campaign-{seed}.csv")
    generate_example_campaign(nodes=4, gpus_per_node=4, seed=seed, **kwargs).to_csv(
        path, index=False
    )
    return read_campaign_csv(path)


def ingest(store: Store, files: list, campaign_id: str | None = None):
    return store.ingest(files, campaign_id=campaign_id, class_order=CLASSES, binner=PMBinner())


def table_counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    db.close()
    return counts


def test_new_store_is_migrated_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "s.db"
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    with Store(path) as store:  # reopening does not re-run migrations
        assert store.schema_version == SCHEMA_VERSION


def test_store_from_a_newer_slurm_pal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer than this slurm-pal"):
        Store(path)


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_text("this is not sqlite " * 100)
    with pytest.raises(StoreError, match="cannot open store"):
        Store(path)


def test_ingest_creates_activates_and_keeps_raw_rows(tmp_path: Path) -> None:
    f = campaign_file(tmp_path, 1)
    with Store(tmp_path / "s.db") as store:
        result = ingest(store, [f])
        assert result.created and result.activated
        assert store.active_campaign_id() == result.campaign_id
        assert len(store.measurements(result.campaign_id)) == len(f.rows)
        assert set(store.class_bins(result.campaign_id)) == set(CLASSES)
        scores = store.gpu_scores(result.campaign_id)
        assert len(scores) == 16 * 4
        assert len(store.gpu_labels(result.campaign_id)) == 16


def test_a_new_campaign_never_overwrites_an_old_one(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        first = ingest(store, [campaign_file(tmp_path, 1)], "jan")
        second = ingest(store, [campaign_file(tmp_path, 2)], "feb")
        assert not second.activated and store.active_campaign_id() == "jan"
        jan = store.gpu_scores("jan")
        store.activate("feb")
        assert store.active_campaign_id() == "feb"
        assert store.gpu_scores("jan").equals(jan)
        assert [c.id for c in store.campaigns()] == ["jan", "feb"]
        assert [c.active for c in store.campaigns()] == [False, True]
        assert first.campaign_id == "jan"


def test_same_file_twice_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    f1 = campaign_file(tmp_path, 1)
    with Store(path) as store:
        ingest(store, [f1], "c1")
    before = table_counts(path)
    f2 = campaign_file(tmp_path, 2)
    with Store(path) as store, pytest.raises(StoreError, match="already in campaign 'c1'.*class"):
        ingest(store, [f2, f1], "c1")
    assert table_counts(path) == before


def test_failure_while_binning_rolls_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    before = table_counts(path)

    def broken(*args: object, **kwargs: object):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store_campaigns, "build_profile", broken)
    with Store(path) as store, pytest.raises(RuntimeError, match="disk on fire"):
        ingest(store, [campaign_file(tmp_path, 1)])
    assert table_counts(path) == before


def test_unknown_campaign_lists_the_known_ones(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(StoreError, match="no active campaign"):
            store.resolve_campaign(None)
        ingest(store, [campaign_file(tmp_path, 1)], "jan")
        with pytest.raises(StoreError, match="no campaign 'dec'.*campaigns: jan"):
            store.activate("dec")


def test_rebin_changes_bins_not_raw_rows(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        ingest(store, [campaign_file(tmp_path, 1)], "c")
        raw = store.measurements("c")
        store.rebin("c", class_order=CLASSES, binner=PMBinner(pal_artifact=True))
        assert store.class_bins("c")["A"].mode == "pal-artifact"
        assert store.measurements("c").equals(raw)
        assert store.campaigns()[0].binning["pal_artifact"] is True


def _ingest_in_process(db: str, csv: str, campaign: str, queue: multiprocessing.Queue) -> None:
    try:
        with Store(db) as store:
            ingest(store, [read_campaign_csv(csv)], campaign)
        queue.put((campaign, "ok"))
    except Exception as exc:  # report to the parent instead of dying silently
        queue.put((campaign, repr(exc)))


def test_concurrent_writers_queue_instead_of_failing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    Store(db).close()
    csvs = []
    for seed in range(4):
        path = tmp_path / f"w{seed}.csv"
        generate_example_campaign(nodes=8, gpus_per_node=4, seed=seed).to_csv(path, index=False)
        csvs.append(path)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_ingest_in_process, args=(str(db), str(p), f"w{i}", queue))
        for i, p in enumerate(csvs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results = dict(queue.get(timeout=5) for _ in procs)
    assert results == {f"w{i}": "ok" for i in range(4)}
    with Store(db) as store:
        campaigns = store.campaigns()
        assert sorted(c.id for c in campaigns) == ["w0", "w1", "w2", "w3"]
        assert sum(c.active for c in campaigns) == 1
        for c in campaigns:
            assert c.measurements == 8 * 4 * 4 * 3


def test_a_version_3_store_gains_clock_events_and_old_campaigns_have_none(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for number, script in enumerate(store_module.MIGRATIONS[:3], start=1):
        db.executescript(script)
        db.execute(f"PRAGMA user_version={number}")
    db.execute("INSERT INTO campaigns (id, created_at) VALUES ('jan', '2026-01-01T00:00:00')")
    db.execute(
        "INSERT INTO measurements (campaign_id, source_sha256, source_line, job_class, uuid, "
        "duration) VALUES ('jan', 'x', 2, 'A', 'GPU-1', 1.5)"
    )
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION >= 4
        assert store.clock_events("jan") == []  # unknown: the caller must not read it as clean
        assert store.measurements("jan")["duration"].tolist() == [1.5]  # old rows untouched


def _runs(f, events: dict) -> list[RunClockEvents]:  # type: ignore[no-untyped-def]
    """One clock-event row per measured row of an example campaign file."""
    rows = f.rows.sort_values(["node", "gpu_index", "job_class"], kind="stable")
    seen: dict[tuple[str, int, str], int] = {}
    out = []
    for r in rows.itertuples(index=False):
        key = (r.node, int(r.gpu_index), r.job_class)
        seen[key] = seen.get(key, -1) + 1
        out.append(RunClockEvents(*key, seen[key], r.uuid, events.get(key)))
    return out


def test_clock_events_land_with_the_rows_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    f = campaign_file(tmp_path, 1)
    first = f.rows.iloc[0]
    hot_key = (first["node"], int(first["gpu_index"]), first["job_class"])
    runs = _runs(f, {hot_key: (("hw_slowdown", 0.1), ("sw_power_cap", 1.0))})
    with Store(path) as store:
        store.ingest(
            [f], campaign_id="c", class_order=CLASSES, binner=PMBinner(), clock_events=runs
        )
        kept = store.clock_events("c")
        assert len(kept) == len(f.rows)
        assert {r.clock_events for r in kept} == {
            None,
            (("hw_slowdown", 0.1), ("sw_power_cap", 1.0)),
        }
        with pytest.raises(StoreError, match="no campaign 'x'"):
            store.clock_events("x")
    before = table_counts(path)
    g = campaign_file(tmp_path, 2)
    with Store(path) as store, pytest.raises(StoreError, match="already keeps clock events"):
        store.ingest(
            [g], campaign_id="c", class_order=CLASSES, binner=PMBinner(), clock_events=runs[:1]
        )
    assert table_counts(path) == before  # the second file's rows were rolled back too


def test_opening_a_current_store_needs_no_write_lock(tmp_path: Path) -> None:
    """A reader (the advisor's class snapshot, ``serve stats``) opens a store another process
    holds locked at once: only a store that must be migrated waits for the lock."""
    path = tmp_path / "s.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with Store(path, timeout_s=0.05) as store:
            assert store.decisions() == []
            assert store.write_lock_free() is False
    finally:
        holder.execute("COMMIT")
        holder.close()
    with Store(path, timeout_s=0.05) as store:
        assert store.write_lock_free() is True
