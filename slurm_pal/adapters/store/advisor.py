"""The advisor service's decisions, the Prolog/Epilog records it received, and retention."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from slurm_pal.adapters.store.schema import StoreConnection, StoreError, now_utc


class AdvisorStore(StoreConnection):
    """Advisor decisions and job records."""

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
                (token, job_id, now_utc(), json.dumps(job), json.dumps(answer), state),
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
                    now_utc(),
                ),
            ).rowcount
        return bool(added)

    def job_records(
        self, job_id: int | None = None, *, since: float | None = None
    ) -> list[dict[str, object]]:
        """Kept records (their payloads), in arrival order; all or one job's; ``since``: only
        jobs with a record whose hook ``time`` is at or after it (epoch seconds), every record
        of those."""
        query = "SELECT payload FROM job_records"
        params: tuple[object, ...] = ()
        if job_id is not None:
            query += " WHERE job_id = ?"
            params = (job_id,)
        elif since is not None:
            query += " WHERE job_id IN (SELECT job_id FROM job_records WHERE time >= ?)"
            params = (since,)
        return [json.loads(r[0]) for r in self._db.execute(query + " ORDER BY rowid", params)]

    def decisions_for_jobs(self, job_ids: Iterable[int]) -> list[dict[str, object]]:
        """The latest decision bound to each of these Slurm job ids (those that have one)."""
        ids = sorted(set(job_ids))
        out: list[dict[str, object]] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            out += self._decision_rows(
                f"WHERE rowid IN (SELECT MAX(rowid) FROM advisor_decisions "
                f"WHERE job_id IN ({marks}) GROUP BY job_id) ORDER BY rowid",
                tuple(chunk),
            )
        return out
