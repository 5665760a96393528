"""Finished jobs' measured classes, the claims they contradicted, and the snapshot the
submit path resolves classes with."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_pal.adapters.store.schema import StoreConnection, now_utc
from slurm_pal.core.resolve import (
    HistoryRow,
    JobRecord,
    StoreView,
    contradicted_claims,
    summarize_history,
)


class HistoryStore(StoreConnection):
    """Job history and class mismatches."""

    def record_job(self, record: JobRecord) -> bool:
        """Keep a finished job's measured class; log a claim it contradicts. True if it did.

        Idempotent per job id (a spooled record sent twice replaces itself), and one
        transaction for the history row and the mismatch row.
        """
        now = now_utc()
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
