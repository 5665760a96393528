"""The store's schema, its migrations and the connection every part of the store shares.

One file, stdlib ``sqlite3`` in WAL mode so the advisor can read while a campaign is ingested.
Writers take ``BEGIN IMMEDIATE`` so concurrent writers queue (``busy_timeout``) instead of
failing half-way, and every public write is one transaction: it lands whole or not at all.
The schema is versioned through ``PRAGMA user_version`` and upgraded by :data:`MIGRATIONS` on
open.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

from slurm_pal.errors import SlurmPalError

MIGRATIONS: tuple[str, ...] = (
    # 1: campaigns, their raw measurements and everything derived from them.
    """
    CREATE TABLE campaigns (
        id TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        active INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1)),
        binning TEXT NOT NULL DEFAULT '{}'
    );
    CREATE UNIQUE INDEX campaigns_one_active ON campaigns(active) WHERE active = 1;
    CREATE TABLE sources (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        sha256 TEXT NOT NULL,
        path TEXT NOT NULL,
        fmt TEXT NOT NULL,
        job_class TEXT NOT NULL,
        n_rows INTEGER NOT NULL,
        ingested_at TEXT NOT NULL,
        PRIMARY KEY (campaign_id, sha256)
    );
    CREATE TABLE measurements (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        source_sha256 TEXT NOT NULL,
        source_line INTEGER NOT NULL,
        job_class TEXT NOT NULL,
        uuid TEXT NOT NULL,
        node TEXT NOT NULL DEFAULT '',
        gpu_index INTEGER,
        gpu_model TEXT NOT NULL DEFAULT 'gpu',
        benchmark TEXT NOT NULL DEFAULT '',
        duration REAL NOT NULL CHECK (duration > 0),
        sm_clock_mhz REAL,
        temperature_c REAL,
        power_w REAL,
        started_at REAL
    );
    CREATE INDEX measurements_by_campaign ON measurements(campaign_id, job_class);
    CREATE TABLE class_bins (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        job_class TEXT NOT NULL,
        summary TEXT NOT NULL,
        PRIMARY KEY (campaign_id, job_class)
    );
    CREATE TABLE gpu_scores (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        job_class TEXT NOT NULL,
        uuid TEXT NOT NULL,
        node TEXT NOT NULL,
        gpu_index INTEGER,
        gpu_model TEXT NOT NULL,
        n_runs INTEGER NOT NULL,
        raw_median REAL,
        norm_value REAL,
        pm_score REAL NOT NULL,
        bin INTEGER NOT NULL,
        outlier_rank INTEGER,
        measured INTEGER NOT NULL,
        PRIMARY KEY (campaign_id, job_class, uuid)
    );
    CREATE TABLE labels (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        label TEXT NOT NULL,
        gpu_model TEXT NOT NULL,
        bins TEXT NOT NULL,
        scores TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        PRIMARY KEY (campaign_id, label)
    );
    CREATE TABLE gpu_labels (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        uuid TEXT NOT NULL,
        label TEXT NOT NULL,
        PRIMARY KEY (campaign_id, uuid)
    );
    CREATE TABLE gpu_aliases (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        alias TEXT NOT NULL,
        uuid TEXT NOT NULL,
        PRIMARY KEY (campaign_id, alias)
    );
    """,
    # 2: applications and their classes, classifier models, job history, claim mismatches.
    """
    CREATE TABLE classifier_models (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at TEXT NOT NULL,
        active INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1)),
        model TEXT NOT NULL,
        n_apps INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX classifier_models_one_active ON classifier_models(active)
        WHERE active = 1;
    CREATE TABLE applications (
        name TEXT PRIMARY KEY,
        dram_util REAL,
        fu_util REAL,
        source TEXT,
        fu_source TEXT,
        features TEXT,
        files TEXT NOT NULL DEFAULT '[]',
        class TEXT,
        class_origin TEXT CHECK (class_origin IN ('fit', 'admin')),
        model_id INTEGER REFERENCES classifier_models(id),
        updated_at TEXT NOT NULL,
        CHECK ((class IS NULL) = (class_origin IS NULL)),
        CHECK ((features IS NULL) = (dram_util IS NULL))
    );
    CREATE TABLE job_history (
        job_id TEXT PRIMARY KEY,
        user TEXT NOT NULL,
        job_name TEXT NOT NULL,
        script_sha256 TEXT NOT NULL,
        app TEXT,
        class TEXT,
        claimed_class TEXT,
        dram_util REAL,
        fu_util REAL,
        source TEXT,
        recorded_at TEXT NOT NULL
    );
    CREATE INDEX job_history_by_key ON job_history(user, job_name, script_sha256, recorded_at);
    CREATE TABLE class_mismatches (
        job_id TEXT PRIMARY KEY,
        user TEXT NOT NULL,
        job_name TEXT NOT NULL,
        claimed_app TEXT NOT NULL,
        claimed_class TEXT NOT NULL,
        measured_class TEXT NOT NULL,
        recorded_at TEXT NOT NULL
    );
    """,
    # 3: the advisor service's decisions (token -> the user's original request) and the
    # Prolog/Epilog records it received (applied at most once per record_id).
    """
    CREATE TABLE advisor_decisions (
        token TEXT PRIMARY KEY,
        job_id INTEGER,
        created TEXT NOT NULL,
        job TEXT NOT NULL,
        answer TEXT NOT NULL,
        state TEXT NOT NULL
    );
    CREATE INDEX advisor_decisions_by_job ON advisor_decisions(job_id);
    CREATE TABLE job_records (
        record_id TEXT PRIMARY KEY,
        job_id INTEGER NOT NULL,
        node TEXT NOT NULL,
        kind TEXT NOT NULL,
        time REAL,
        payload TEXT NOT NULL,
        received TEXT NOT NULL
    );
    CREATE INDEX job_records_by_job ON job_records(job_id);
    """,
    # 4: per measured run of a Slurm campaign, the NVML clock-event reasons it saw (JSON
    # {reason: share of readings}; NULL: the record had no readings). A campaign without rows
    # (ingested before this table, or from a CSV) is unknown, not free of slowdowns.
    """
    CREATE TABLE run_clock_events (
        campaign_id TEXT NOT NULL REFERENCES campaigns(id),
        node TEXT NOT NULL,
        gpu_index INTEGER NOT NULL,
        job_class TEXT NOT NULL,
        repeat INTEGER NOT NULL,
        uuid TEXT NOT NULL,
        events TEXT,
        PRIMARY KEY (campaign_id, node, gpu_index, job_class, repeat)
    );
    """,
    # 5: GPUs the advisor found slow for a class since their campaign (core/suspicion.py), one
    # row per suspicion: open while cleared_s is NULL. Times are the job records' epoch
    # seconds; evidence is the Suspicion's JSON (its recent runs).
    """
    CREATE TABLE gpu_suspicions (
        campaign_id TEXT NOT NULL,
        uuid TEXT NOT NULL,
        job_class TEXT NOT NULL,
        since_s REAL NOT NULL,
        onset_s REAL NOT NULL,
        cause TEXT NOT NULL,
        slowdown REAL,
        runs INTEGER NOT NULL,
        evidence TEXT NOT NULL,
        cleared_s REAL,
        cleared_why TEXT,
        PRIMARY KEY (campaign_id, uuid, job_class, since_s)
    );
    CREATE INDEX gpu_suspicions_open ON gpu_suspicions(campaign_id, cleared_s);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
DERIVED_TABLES = ("class_bins", "gpu_scores", "labels", "gpu_labels", "gpu_aliases")


class StoreError(SlurmPalError, RuntimeError):
    """A store operation that was refused; nothing was written."""


class StoreConnection:
    """The open database, its migration on open and the one-transaction write helper."""

    def __init__(self, path: Path | str, *, timeout_s: float = 30.0, create: bool = True) -> None:
        self.path = Path(path)
        if not create and str(path) != ":memory:" and not self.path.is_file():
            # Commands that only read must not leave an empty store (and its folders) behind.
            raise StoreError(
                f"no store at {self.path} (nothing stored there yet: 'slurm-pal profile ingest' "
                "or 'slurm-pal apps classify' create it; or check --db / $SLURM_PAL_DB)"
            )
        if str(path) != ":memory:":
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the store's folder {self.path.parent}: {exc}"
                ) from exc
        try:
            self._db = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        if self.schema_version == SCHEMA_VERSION:
            # Current already (a read): a reader never waits for another process's write lock.
            return
        with self._write():
            version = self.schema_version
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path} has schema version {version}, newer than this slurm-pal "
                    f"knows ({SCHEMA_VERSION}); upgrade slurm-pal"
                )
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in _statements(script):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={number}")

    def write_lock_free(self) -> bool:
        """Whether the write lock can be had within the busy timeout (taken, then released
        at once): False while another process holds it (an open ``BEGIN EXCLUSIVE``)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return False
            raise StoreError(f"store {self.path}: {exc}") from exc
        self._db.execute("ROLLBACK")
        return True

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: concurrent writers wait; any error rolls everything back.
        Inside :meth:`group` it is a savepoint: the write still succeeds or fails whole, and
        the group's single commit makes it durable."""
        if self._grouped:
            self._db.execute("SAVEPOINT write")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK TO write")
                self._db.execute("RELEASE write")
                raise
            else:
                self._db.execute("RELEASE write")
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    _grouped = False

    def atomic(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write of the caller's that succeeds or fails whole (a savepoint inside a group)."""
        return self._write()

    @contextmanager
    def group(self) -> Iterator[None]:
        """Many writes, one commit. Each commit waits for the disk (an fsync, milliseconds),
        so a burst of small writes done one commit each queues for seconds; grouped, the
        burst costs one. A failing write inside still rolls back only itself."""
        if self._grouped:
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._grouped = True
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        finally:
            self._grouped = False


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
