"""Campaigns in the store: ingest, re-bin and activate, and the data derived from them
(bins, per-GPU scores, labels) the advisor places by."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from slurm_pal.adapters.campaign_csv import MEASUREMENT_COLUMNS, CampaignFile
from slurm_pal.adapters.store.schema import DERIVED_TABLES, StoreConnection, StoreError, now_utc
from slurm_pal.core.binning import Bin, PMBinner
from slurm_pal.core.campaigns import RunClockEvents
from slurm_pal.core.variability import GPU_COLUMNS, ClassBins, VariabilityProfile, build_profile


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


class CampaignStore(StoreConnection):
    """Campaign measurements and everything derived from them."""

    def ingest(
        self,
        files: Sequence[CampaignFile],
        *,
        campaign_id: str | None,
        class_order: Sequence[str],
        binner: PMBinner,
        description: str = "",
        clock_events: Sequence[RunClockEvents] = (),
        on_step: Callable[[str], None] = lambda step: None,
    ) -> IngestResult:
        """Add measurement files to a campaign (new unless ``campaign_id`` names one) and re-bin.

        All or nothing: a file already in the campaign, or any failure while binning, leaves the
        store as it was. The first campaign of a store becomes the active one. ``clock_events``
        (a Slurm campaign's measured runs) land in the same transaction as the rows.
        ``on_step`` hears of each stage (a million rows take tens of seconds), for progress.
        """
        if not files:
            raise StoreError("nothing to ingest: no files given")
        seen: dict[str, str] = {}
        for f in files:
            if f.sha256 in seen:
                raise StoreError(f"{f.path} and {seen[f.sha256]} are the same file (same content)")
            seen[f.sha256] = f.path
        now = now_utc()
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
                on_step(f"storing {len(f.rows)} runs of {f.path}")
                self._insert_measurements(campaign_id, f)
            self._insert_clock_events(campaign_id, clock_events)
            on_step(f"binning campaign {campaign_id}")
            measurements = self._measurements(campaign_id)
            profile = build_profile(measurements, class_order, binner)
            on_step("storing bins, PM-scores and labels")
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

    def rebin(
        self,
        campaign_id: str,
        *,
        class_order: Sequence[str],
        binner: PMBinner,
        on_step: Callable[[str], None] = lambda step: None,
    ) -> None:
        """Recompute a campaign's bins with other binning parameters (raw rows stay as they are)."""
        with self._write() as db:
            self._require_campaign(campaign_id)
            on_step(f"binning campaign {campaign_id}")
            profile = build_profile(self._measurements(campaign_id), class_order, binner)
            on_step("storing bins, PM-scores and labels")
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
                "'slurm-pal profile ingest PATH --class CLASS', or to try slurm-pal first, the "
                "bundled example: 'slurm-pal profile example -o example.csv' then "
                "'slurm-pal profile ingest example.csv'"
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
