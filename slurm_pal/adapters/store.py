"""The SQLite store on the controller: campaigns, raw measurements, bins, scores and labels;
applications, their classes and the classifier models; finished jobs' history.

One file, stdlib ``sqlite3`` in WAL mode so the advisor can read while a campaign is ingested.
Writers take ``BEGIN IMMEDIATE`` so concurrent writers queue (``busy_timeout``) instead of
failing half-way, and every public write is one transaction: it lands whole or not at all.
The schema is versioned through ``PRAGMA user_version`` and upgraded by :data:`MIGRATIONS` on
open. Compute nodes never open this file (no SQLite over NFS); they talk to the advisor.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_pal.adapters.campaign_csv import MEASUREMENT_COLUMNS, CampaignFile
from slurm_pal.core.binning import Bin, PMBinner
from slurm_pal.core.campaigns import RunClockEvents
from slurm_pal.core.features import UtilizationFeatures
from slurm_pal.core.resolve import (
    HistoryRow,
    JobRecord,
    StoreView,
    contradicted_claims,
    summarize_history,
)
from slurm_pal.core.variability import GPU_COLUMNS, ClassBins, VariabilityProfile, build_profile

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
)
SCHEMA_VERSION = len(MIGRATIONS)
DERIVED_TABLES = ("class_bins", "gpu_scores", "labels", "gpu_labels", "gpu_aliases")


class StoreError(RuntimeError):
    """A store operation that was refused; nothing was written."""


@dataclass(frozen=True)
class Campaign:
    id: str
    created_at: str
    description: str
    active: bool
    binning: dict[str, object]
    classes: tuple[str, ...]
    sources: int
    measurements: int


@dataclass(frozen=True)
class IngestResult:
    campaign_id: str
    created: bool
    activated: bool
    files: int
    rows: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class Application:
    """A profiled (or admin-declared) application and its class.

    ``features`` is None for an application an admin declared with ``apps set`` without
    profiling it; ``job_class`` is None until a classifier model exists (``apps fit``);
    ``class_origin`` is "fit" (the model's label) or "admin" (an override, kept by refits).
    """

    name: str
    features: UtilizationFeatures | None
    files: tuple[dict[str, str], ...]
    job_class: str | None
    class_origin: str | None
    model_id: int | None
    updated_at: str

    @property
    def dram_util(self) -> float | None:
        return None if self.features is None else self.features.dram_util

    @property
    def fu_util(self) -> float | None:
        return None if self.features is None else self.features.fu_util


@dataclass(frozen=True)
class ClassifierModel:
    id: int
    created_at: str
    model: dict[str, object]
    n_apps: int


class Store:
    """A handle on the slurm-pal SQLite database. Use as a context manager or call close()."""

    def __init__(self, path: Path | str, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
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

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: concurrent writers wait; any error rolls everything back."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    # -- campaigns -----------------------------------------------------------------------------
    def ingest(
        self,
        files: Sequence[CampaignFile],
        *,
        campaign_id: str | None,
        class_order: Sequence[str],
        binner: PMBinner,
        description: str = "",
        clock_events: Sequence[RunClockEvents] = (),
    ) -> IngestResult:
        """Add measurement files to a campaign (new unless ``campaign_id`` names one) and re-bin.

        All or nothing: a file already in the campaign, or any failure while binning, leaves the
        store as it was. The first campaign of a store becomes the active one. ``clock_events``
        (a Slurm campaign's measured runs) land in the same transaction as the rows.
        """
        if not files:
            raise StoreError("nothing to ingest: no files given")
        seen: dict[str, str] = {}
        for f in files:
            if f.sha256 in seen:
                raise StoreError(f"{f.path} and {seen[f.sha256]} are the same file (same content)")
            seen[f.sha256] = f.path
        now = _now()
        with self._write() as db:
            created = False
            if campaign_id is None:
                campaign_id = self._new_campaign_id(now)
            row = db.execute(
                "SELECT binning FROM campaigns WHERE id = ?", (campaign_id,)
            ).fetchone()
            if row is None:
                created = True
                db.execute(
                    "INSERT INTO campaigns (id, created_at, description, binning) VALUES (?,?,?,?)",
                    (campaign_id, now, description, json.dumps(binner.get_params())),
                )
            else:
                binner = PMBinner(**json.loads(row[0]))
            for f in files:
                old = db.execute(
                    "SELECT path, job_class, ingested_at FROM sources "
                    "WHERE campaign_id = ? AND sha256 = ?",
                    (campaign_id, f.sha256),
                ).fetchone()
                if old is not None:
                    raise StoreError(
                        f"{f.path} is already in campaign {campaign_id!r}: ingested as class "
                        f"{old[1]!r} from {old[0]} at {old[2]}; nothing was written"
                    )
                classes = sorted(set(f.rows["job_class"]))
                db.execute(
                    "INSERT INTO sources VALUES (?,?,?,?,?,?,?)",
                    (campaign_id, f.sha256, f.path, f.fmt, ",".join(classes), len(f.rows), now),
                )
                self._insert_measurements(campaign_id, f)
            self._insert_clock_events(campaign_id, clock_events)
            measurements = self._measurements(campaign_id)
            profile = build_profile(measurements, class_order, binner)
            self._replace_derived(campaign_id, profile)
            has_active = db.execute("SELECT 1 FROM campaigns WHERE active = 1").fetchone()
            activated = has_active is None
            if activated:
                db.execute("UPDATE campaigns SET active = 1 WHERE id = ?", (campaign_id,))
        return IngestResult(
            campaign_id=campaign_id,
            created=created,
            activated=activated,
            files=len(files),
            rows=sum(len(f.rows) for f in files),
            classes=tuple(sorted({c for f in files for c in f.rows["job_class"]})),
        )

    def rebin(self, campaign_id: str, *, class_order: Sequence[str], binner: PMBinner) -> None:
        """Recompute a campaign's bins with other binning parameters (raw rows stay as they are)."""
        with self._write() as db:
            self._require_campaign(campaign_id)
            profile = build_profile(self._measurements(campaign_id), class_order, binner)
            self._replace_derived(campaign_id, profile)
            db.execute(
                "UPDATE campaigns SET binning = ? WHERE id = ?",
                (json.dumps(binner.get_params()), campaign_id),
            )

    def activate(self, campaign_id: str) -> None:
        """Make this campaign the one the advisor places by."""
        with self._write() as db:
            self._require_campaign(campaign_id)
            db.execute("UPDATE campaigns SET active = 0 WHERE active = 1")
            db.execute("UPDATE campaigns SET active = 1 WHERE id = ?", (campaign_id,))

    def campaigns(self) -> list[Campaign]:
        rows = self._db.execute(
            """
            SELECT c.id, c.created_at, c.description, c.active, c.binning,
                   (SELECT group_concat(DISTINCT job_class) FROM class_bins b
                     WHERE b.campaign_id = c.id),
                   (SELECT count(*) FROM sources s WHERE s.campaign_id = c.id),
                   (SELECT count(*) FROM measurements m WHERE m.campaign_id = c.id)
            FROM campaigns c ORDER BY c.rowid
            """
        ).fetchall()
        return [
            Campaign(
                id=r[0],
                created_at=r[1],
                description=r[2],
                active=bool(r[3]),
                binning=json.loads(r[4]),
                classes=tuple(sorted((r[5] or "").split(",")) if r[5] else ()),
                sources=r[6],
                measurements=r[7],
            )
            for r in rows
        ]

    def active_campaign_id(self) -> str | None:
        row = self._db.execute("SELECT id FROM campaigns WHERE active = 1").fetchone()
        return None if row is None else str(row[0])

    def resolve_campaign(self, campaign_id: str | None) -> str:
        """The given campaign (checked to exist), or the active one; a clear error otherwise."""
        if campaign_id is not None:
            self._require_campaign(campaign_id)
            return campaign_id
        active = self.active_campaign_id()
        if active is None:
            raise StoreError(
                f"store {self.path} has no active campaign: ingest one with "
                "'slurm-pal profile ingest PATH --class CLASS'"
            )
        return active

    # -- reading derived data ------------------------------------------------------------------
    def class_bins(self, campaign_id: str) -> dict[str, ClassBins]:
        rows = self._db.execute(
            "SELECT job_class, summary FROM class_bins WHERE campaign_id = ? ORDER BY rowid",
            (campaign_id,),
        ).fetchall()
        return {cls: _class_bins_from_json(cls, summary) for cls, summary in rows}

    def gpu_scores(self, campaign_id: str, uuid: str | None = None) -> pd.DataFrame:
        query = f"SELECT {', '.join(GPU_COLUMNS)} FROM gpu_scores WHERE campaign_id = ?"
        params: tuple[str, ...] = (campaign_id,)
        if uuid is not None:
            query += " AND uuid = ?"
            params += (uuid,)
        frame = pd.read_sql_query(query + " ORDER BY rowid", self._db, params=params)
        frame["measured"] = frame["measured"].astype(bool)
        frame["gpu_index"] = frame["gpu_index"].astype("Int64")
        frame["outlier_rank"] = frame["outlier_rank"].astype("Int64")
        return frame

    def canonical_uuid(self, campaign_id: str, gpu_id: str) -> str:
        row = self._db.execute(
            "SELECT uuid FROM gpu_aliases WHERE campaign_id = ? AND alias = ?",
            (campaign_id, gpu_id),
        ).fetchone()
        return gpu_id if row is None else str(row[0])

    def labels(self, campaign_id: str) -> list[dict[str, object]]:
        rows = self._db.execute(
            "SELECT label, gpu_model, bins, scores, gpus FROM labels WHERE campaign_id = ? "
            "ORDER BY label",
            (campaign_id,),
        ).fetchall()
        return [
            {
                "label": r[0],
                "gpu_model": r[1],
                "bins": dict(json.loads(r[2])),
                "scores": dict(json.loads(r[3])),
                "gpus": r[4],
            }
            for r in rows
        ]

    def gpu_labels(self, campaign_id: str) -> dict[str, str]:
        rows = self._db.execute(
            "SELECT uuid, label FROM gpu_labels WHERE campaign_id = ? ORDER BY uuid", (campaign_id,)
        ).fetchall()
        return dict(rows)

    def measurements(self, campaign_id: str) -> pd.DataFrame:
        """The campaign's raw rows, in the canonical measurement columns."""
        self._require_campaign(campaign_id)
        return self._measurements(campaign_id)

    def clock_events(self, campaign_id: str) -> list[RunClockEvents]:
        """The campaign's measured runs' clock-event reasons ([]: never kept for it)."""
        self._require_campaign(campaign_id)
        rows = self._db.execute(
            "SELECT node, gpu_index, job_class, repeat, uuid, events FROM run_clock_events "
            "WHERE campaign_id = ? ORDER BY node, gpu_index, job_class, repeat",
            (campaign_id,),
        ).fetchall()
        return [
            RunClockEvents(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                None
                if r[5] is None
                else tuple(sorted((str(k), float(v)) for k, v in json.loads(r[5]).items())),
            )
            for r in rows
        ]

    # -- applications and classes ----------------------------------------------------------
    def save_application(
        self,
        name: str,
        features: UtilizationFeatures,
        *,
        files: Sequence[dict[str, str]] = (),
        predicted_class: str | None = None,
        model_id: int | None = None,
    ) -> Application:
        """Store an application's measured features and its class under ``model_id``.

        Replaces earlier features of the same name. An admin override stays as it is: the
        new measurement is kept, the admin's class is not replaced by the model's.
        """
        now = _now()
        with self._write() as db:
            row = db.execute(
                "SELECT class, class_origin, model_id FROM applications WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[1] == "admin":
                job_class, origin, model = row[0], "admin", row[2]
            elif predicted_class is not None:
                job_class, origin, model = predicted_class, "fit", model_id
            else:
                job_class, origin, model = None, None, None
            db.execute(
                "INSERT OR REPLACE INTO applications (name, dram_util, fu_util, source, "
                "fu_source, features, files, class, class_origin, model_id, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name,
                    features.dram_util,
                    features.fu_util,
                    features.source,
                    features.fu_source,
                    json.dumps(features.to_dict()),
                    json.dumps(list(files)),
                    job_class,
                    origin,
                    model,
                    now,
                ),
            )
        app = self.application(name)
        assert app is not None
        return app

    def set_application_class(self, name: str, job_class: str) -> Application:
        """Admin override: ``name`` is ``job_class`` whatever the model says (creates it if new).

        The caller checks ``job_class`` against the site's class names.
        """
        now = _now()
        with self._write() as db:
            updated = db.execute(
                "UPDATE applications SET class = ?, class_origin = 'admin', updated_at = ? "
                "WHERE name = ?",
                (job_class, now, name),
            ).rowcount
            if not updated:
                db.execute(
                    "INSERT INTO applications (name, class, class_origin, updated_at) "
                    "VALUES (?, ?, 'admin', ?)",
                    (name, job_class, now),
                )
        app = self.application(name)
        assert app is not None
        return app

    def clear_application_override(
        self, name: str, *, predicted_class: str | None, model_id: int | None
    ) -> Application:
        """Undo an admin override: the class goes back to the model's (None without one).

        An application that exists only because of the override (no features) is removed.
        """
        with self._write() as db:
            row = db.execute(
                "SELECT class_origin, features FROM applications WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise StoreError(self._unknown_app_message(name))
            if row[0] != "admin":
                raise StoreError(f"application {name!r} has no admin override to clear")
            if row[1] is None:
                db.execute("DELETE FROM applications WHERE name = ?", (name,))
            else:
                origin = None if predicted_class is None else "fit"
                db.execute(
                    "UPDATE applications SET class = ?, class_origin = ?, model_id = ?, "
                    "updated_at = ? WHERE name = ?",
                    (predicted_class, origin, model_id if origin else None, _now(), name),
                )
        app = self.application(name)
        return app if app is not None else Application(name, None, (), None, None, None, _now())

    def application(self, name: str) -> Application | None:
        rows = self._application_rows("WHERE name = ?", (name,))
        return rows[0] if rows else None

    def applications(self) -> list[Application]:
        """All applications, by name."""
        return self._application_rows("", ())

    def _application_rows(self, where: str, params: tuple[object, ...]) -> list[Application]:
        rows = self._db.execute(
            "SELECT name, features, files, class, class_origin, model_id, updated_at "
            f"FROM applications {where} ORDER BY name",
            params,
        ).fetchall()
        return [
            Application(
                name=r[0],
                features=None if r[1] is None else UtilizationFeatures.from_dict(json.loads(r[1])),
                files=tuple(json.loads(r[2])),
                job_class=r[3],
                class_origin=r[4],
                model_id=r[5],
                updated_at=r[6],
            )
            for r in rows
        ]

    def _unknown_app_message(self, name: str) -> str:
        known = [r[0] for r in self._db.execute("SELECT name FROM applications ORDER BY name")]
        return f"no application {name!r} in {self.path}; known: {', '.join(known) or 'none yet'}"

    def save_classifier(
        self, model: dict[str, object], labels: dict[str, str], *, n_apps: int
    ) -> int:
        """Store a fitted model as the active one and label the applications with it.

        ``labels`` maps application -> class; admin overrides are left as they are. One
        transaction: the new model and every new label land together, or nothing does.
        """
        with self._write() as db:
            db.execute("UPDATE classifier_models SET active = 0 WHERE active = 1")
            cursor = db.execute(
                "INSERT INTO classifier_models (created_at, active, model, n_apps) "
                "VALUES (?, 1, ?, ?)",
                (_now(), json.dumps(model), n_apps),
            )
            model_id = int(cursor.lastrowid or 0)
            now = _now()
            for name, job_class in labels.items():
                changed = db.execute(
                    "UPDATE applications SET class = ?, class_origin = 'fit', model_id = ?, "
                    "updated_at = ? WHERE name = ? AND features IS NOT NULL "
                    "AND (class_origin IS NULL OR class_origin = 'fit')",
                    (job_class, model_id, now, name),
                ).rowcount
                if not changed and self.application(name) is None:
                    raise StoreError(self._unknown_app_message(name))
        return model_id

    def active_classifier(self) -> ClassifierModel | None:
        """The model new applications are classified with (None before the first fit)."""
        row = self._db.execute(
            "SELECT id, created_at, model, n_apps FROM classifier_models WHERE active = 1"
        ).fetchone()
        if row is None:
            return None
        return ClassifierModel(
            id=row[0], created_at=row[1], model=json.loads(row[2]), n_apps=row[3]
        )

    # -- job history -----------------------------------------------------------------------
    def record_job(self, record: JobRecord) -> bool:
        """Keep a finished job's measured class; log a claim it contradicts. True if it did.

        Idempotent per job id (a spooled record sent twice replaces itself), and one
        transaction for the history row and the mismatch row.
        """
        now = _now()
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO job_history (job_id, user, job_name, script_sha256, app, "
                "class, claimed_class, dram_util, fu_util, source, recorded_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    record.job_id,
                    record.user,
                    record.job_name,
                    record.script_sha256,
                    record.claimed_app,
                    record.measured_class,
                    record.claimed_class,
                    record.dram_util,
                    record.fu_util,
                    record.source,
                    now,
                ),
            )
            db.execute("DELETE FROM class_mismatches WHERE job_id = ?", (record.job_id,))
            if record.mismatch:
                db.execute(
                    "INSERT INTO class_mismatches VALUES (?,?,?,?,?,?,?)",
                    (
                        record.job_id,
                        record.user,
                        record.job_name,
                        record.claimed_app,
                        record.claimed_class,
                        record.measured_class,
                        now,
                    ),
                )
        return record.mismatch

    def history_rows(self, per_key: int = 20) -> list[HistoryRow]:
        """The latest ``per_key`` runs of every (user, job name, script sha256), oldest first."""
        rows = self._db.execute(
            """
            SELECT user, job_name, script_sha256, app, class, recorded_at FROM (
                SELECT *, rowid AS seq, row_number() OVER (
                    PARTITION BY user, job_name, script_sha256
                    ORDER BY recorded_at DESC, rowid DESC) AS n
                FROM job_history)
            WHERE n <= ? ORDER BY recorded_at, seq
            """,
            (per_key,),
        ).fetchall()
        return [HistoryRow((r[0], r[1], r[2]), r[3], r[4], r[5]) for r in rows]

    def class_mismatches(self) -> list[dict[str, str]]:
        """Jobs whose named application's class differs from what they measured (for admins)."""
        cursor = self._db.execute(
            "SELECT job_id, user, job_name, claimed_app, claimed_class, measured_class, "
            "recorded_at FROM class_mismatches ORDER BY recorded_at, rowid"
        )
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]

    def store_view(self, history_per_key: int = 20, class_names: Sequence[str] = ()) -> StoreView:
        """The snapshot the submit path resolves classes with (load once, refresh now and then).

        ``class_names`` (most compute-bound first) tells which recorded mismatches were claims
        that would have won better GPUs; without it no claim is distrusted.
        """
        apps = dict(self._db.execute("SELECT name, class FROM applications").fetchall())
        mismatches = self._db.execute(
            "SELECT user, claimed_app, claimed_class, measured_class FROM class_mismatches"
        ).fetchall()
        return StoreView(
            apps=apps,
            history=summarize_history(self.history_rows(history_per_key)),
            contradicted=contradicted_claims(mismatches, class_names),
        )

    # -- the advisor service -----------------------------------------------------------------
    def purge_advisor_history(self, older_than_days: float) -> dict[str, int]:
        """Delete the advisor's decisions, job records, job history and class mismatches older
        than ``older_than_days`` (by when they were written), in one transaction; how many of
        each. What users submitted stays only as long as the site keeps it. A spooled record
        delivered after its twin was purged would be applied again: keep far longer than
        spool delays."""
        cutoff = (datetime.now(UTC) - timedelta(days=older_than_days)).strftime("%Y-%m-%dT%H:%M:%S")
        tables = {
            "advisor_decisions": "created",
            "job_records": "received",
            "job_history": "recorded_at",
            "class_mismatches": "recorded_at",
        }
        counts: dict[str, int] = {}
        with self._write() as db:
            for table, column in tables.items():
                cursor = db.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,))
                counts[table] = cursor.rowcount
        return counts

    def save_decision(
        self,
        token: str,
        job: dict[str, object],
        answer: dict[str, object],
        *,
        state: str = "reserved",
        job_id: int | None = None,
    ) -> None:
        """Keep a decide answer and the request it answered (the re-planner and the job records
        need the user's original request after a restart). A token is written once."""
        with self._write() as db:
            db.execute(
                "INSERT OR IGNORE INTO advisor_decisions (token, job_id, created, job, answer, "
                "state) VALUES (?,?,?,?,?,?)",
                (token, job_id, _now(), json.dumps(job), json.dumps(answer), state),
            )

    def update_decision(
        self,
        token: str,
        *,
        job_id: int | None = None,
        state: str | None = None,
        answer: dict[str, object] | None = None,
    ) -> bool:
        """Bind a decision to its Slurm job id, change its state or its answer (re-planned).
        False when the token is unknown."""
        sets: list[str] = []
        params: list[object] = []
        for column, value in (("job_id", job_id), ("state", state)):
            if value is not None:
                sets.append(f"{column} = ?")
                params.append(value)
        if answer is not None:
            sets.append("answer = ?")
            params.append(json.dumps(answer))
        if not sets:
            return self.decision(token) is not None
        with self._write() as db:
            changed = db.execute(
                f"UPDATE advisor_decisions SET {', '.join(sets)} WHERE token = ?",
                (*params, token),
            ).rowcount
        return bool(changed)

    def decision(self, token: str) -> dict[str, object] | None:
        """One stored decision (token, job_id, created, job, answer, state) or None."""
        rows = self._decision_rows("WHERE token = ?", (token,))
        return rows[0] if rows else None

    def decision_for_job(self, job_id: int) -> dict[str, object] | None:
        """The latest decision bound to a Slurm job id, or None."""
        rows = self._decision_rows("WHERE job_id = ? ORDER BY rowid DESC LIMIT 1", (job_id,))
        return rows[0] if rows else None

    def decisions(self, state: str | None = None) -> list[dict[str, object]]:
        """Stored decisions, oldest first (all, or those in ``state``)."""
        if state is None:
            return self._decision_rows("ORDER BY rowid", ())
        return self._decision_rows("WHERE state = ? ORDER BY rowid", (state,))

    def _decision_rows(self, where: str, params: tuple[object, ...]) -> list[dict[str, object]]:
        rows = self._db.execute(
            f"SELECT token, job_id, created, job, answer, state FROM advisor_decisions {where}",
            params,
        ).fetchall()
        return [
            {
                "token": r[0],
                "job_id": r[1],
                "created": r[2],
                "job": json.loads(r[3]),
                "answer": json.loads(r[4]),
                "state": r[5],
            }
            for r in rows
        ]

    def add_job_record(self, record: dict[str, object]) -> bool:
        """Keep a Prolog/Epilog record; False when its ``record_id`` was already kept (a record
        is applied at most once, whichever way it arrived: socket or spool sweep)."""
        try:
            record_id = str(record["record_id"])
            job_id = int(record["job_id"])  # type: ignore[call-overload]
            node = str(record["node"])
            kind = str(record["kind"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"job record lacks record_id/job_id/node/kind: {exc}") from None
        when = record.get("time")
        with self._write() as db:
            added = db.execute(
                "INSERT OR IGNORE INTO job_records (record_id, job_id, node, kind, time, payload, "
                "received) VALUES (?,?,?,?,?,?,?)",
                (
                    record_id,
                    job_id,
                    node,
                    kind,
                    float(when) if isinstance(when, int | float) else None,
                    json.dumps(record),
                    _now(),
                ),
            ).rowcount
        return bool(added)

    def job_records(self, job_id: int | None = None) -> list[dict[str, object]]:
        """Kept records (their payloads), in arrival order; all or one job's."""
        query = "SELECT payload FROM job_records"
        params: tuple[object, ...] = ()
        if job_id is not None:
            query += " WHERE job_id = ?"
            params = (job_id,)
        return [json.loads(r[0]) for r in self._db.execute(query + " ORDER BY rowid", params)]

    # -- internals -----------------------------------------------------------------------------
    def _require_campaign(self, campaign_id: str) -> None:
        row = self._db.execute("SELECT 1 FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
        if row is None:
            known = [r[0] for r in self._db.execute("SELECT id FROM campaigns ORDER BY id")]
            choices = ", ".join(known) if known else "none yet"
            raise StoreError(f"no campaign {campaign_id!r} in {self.path}; campaigns: {choices}")

    def _new_campaign_id(self, now: str) -> str:
        base = "c" + now.replace("-", "").replace(":", "").replace("T", "-")[:15]
        candidate, n = base, 1
        while self._db.execute("SELECT 1 FROM campaigns WHERE id = ?", (candidate,)).fetchone():
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    def _insert_measurements(self, campaign_id: str, f: CampaignFile) -> None:
        rows = f.rows
        gpu_index = rows["gpu_index"].astype(object).where(rows["gpu_index"].notna(), None)
        records = zip(
            [campaign_id] * len(rows),
            [f.sha256] * len(rows),
            rows["source_line"].astype(int).tolist(),
            rows["job_class"].tolist(),
            rows["uuid"].tolist(),
            rows["node"].tolist(),
            [None if v is None else int(v) for v in gpu_index.tolist()],
            rows["gpu_model"].tolist(),
            rows["benchmark"].tolist(),
            rows["duration"].astype(float).tolist(),
            *(
                _nullable(rows[c])
                for c in ("sm_clock_mhz", "temperature_c", "power_w", "started_at")
            ),
            strict=True,
        )
        self._db.executemany(
            "INSERT INTO measurements (campaign_id, source_sha256, source_line, job_class, uuid, "
            "node, gpu_index, gpu_model, benchmark, duration, sm_clock_mhz, temperature_c, "
            "power_w, started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            records,
        )

    def _insert_clock_events(self, campaign_id: str, runs: Sequence[RunClockEvents]) -> None:
        try:
            self._db.executemany(
                "INSERT INTO run_clock_events (campaign_id, node, gpu_index, job_class, repeat, "
                "uuid, events) VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        campaign_id,
                        r.node,
                        r.gpu_index,
                        r.job_class,
                        r.repeat,
                        r.uuid,
                        None if r.clock_events is None else json.dumps(dict(r.clock_events)),
                    )
                    for r in runs
                ],
            )
        except sqlite3.IntegrityError as exc:
            raise StoreError(
                f"campaign {campaign_id!r} already keeps clock events for one of these runs "
                f"({exc}); nothing was written"
            ) from None

    def _measurements(self, campaign_id: str) -> pd.DataFrame:
        cols = [c for c in MEASUREMENT_COLUMNS]
        frame = pd.read_sql_query(
            f"SELECT {', '.join(cols)} FROM measurements WHERE campaign_id = ? ORDER BY rowid",
            self._db,
            params=(campaign_id,),
        )
        frame["gpu_index"] = frame["gpu_index"].astype("Int64")
        for c in ("node", "gpu_model", "benchmark", "job_class", "uuid"):
            frame[c] = frame[c].fillna("").astype(object)
        return frame

    def _replace_derived(self, campaign_id: str, profile: VariabilityProfile) -> None:
        db = self._db
        for table in DERIVED_TABLES:
            db.execute(f"DELETE FROM {table} WHERE campaign_id = ?", (campaign_id,))
        db.executemany(
            "INSERT INTO class_bins VALUES (?,?,?)",
            [(campaign_id, c, json.dumps(b.to_dict())) for c, b in profile.classes.items()],
        )
        g = profile.gpus
        db.executemany(
            f"INSERT INTO gpu_scores (campaign_id, {', '.join(GPU_COLUMNS)}) "
            f"VALUES (?{', ?' * len(GPU_COLUMNS)})",
            zip(
                [campaign_id] * len(g),
                g["job_class"].tolist(),
                g["uuid"].tolist(),
                g["node"].tolist(),
                [None if pd.isna(v) else int(v) for v in g["gpu_index"]],
                g["gpu_model"].tolist(),
                g["n_runs"].astype(int).tolist(),
                _nullable(g["raw_median"]),
                _nullable(g["norm_value"]),
                g["pm_score"].astype(float).tolist(),
                g["bin"].astype(int).tolist(),
                [None if pd.isna(v) else int(v) for v in g["outlier_rank"]],
                g["measured"].astype(int).tolist(),
                strict=True,
            ),
        )
        db.executemany(
            "INSERT INTO labels VALUES (?,?,?,?,?,?)",
            [
                (
                    campaign_id,
                    s.label,
                    s.gpu_model,
                    json.dumps(s.bins),
                    json.dumps(s.scores),
                    s.gpus,
                )
                for s in profile.labels
            ],
        )
        db.executemany(
            "INSERT INTO gpu_labels VALUES (?,?,?)",
            [(campaign_id, u, label) for u, label in profile.gpu_labels.items()],
        )
        db.executemany(
            "INSERT INTO gpu_aliases VALUES (?,?,?)",
            [(campaign_id, a, u) for a, u in profile.aliases.items()],
        )


def _class_bins_from_json(job_class: str, summary: str) -> ClassBins:
    d = json.loads(summary)
    return ClassBins(
        job_class=job_class,
        mode=d["mode"],
        k=d["k"],
        silhouette=d["silhouette"],
        median_raw=d["median_raw"],
        bins=tuple(Bin(b["score"], b["gpus"]) for b in d["bins"]),
        outliers=tuple((o["uuid"], o["score"]) for o in d["outliers"]),
        measured_gpus=d["measured_gpus"],
        unmeasured_gpus=d["unmeasured_gpus"],
    )


def _nullable(series: pd.Series) -> list[float | None]:
    values = series.astype(float).to_numpy()
    return [None if np.isnan(v) else float(v) for v in values]


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
