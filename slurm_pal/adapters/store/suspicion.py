"""GPUs the advisor service found slow for a class since their campaign (``gpu_suspicions``).

The service writes a row when a GPU becomes suspect for a class and closes it when the GPU is
cleared; ``profile gpus`` and ``profile show`` read the open ones. The detector's own state is
rebuilt from the stored job records at each start (the service's warm-up); these rows are what
the admin reads, and what a restart compares its warm-up with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from slurm_pal.adapters.store.schema import StoreConnection

_COLUMNS = (
    "campaign_id, uuid, job_class, since_s, onset_s, cause, slowdown, runs, evidence, "
    "cleared_s, cleared_why"
)


class SuspicionStore(StoreConnection):
    """Suspect (GPU, class) rows, per campaign."""

    def open_suspicion(self, campaign_id: str, suspicion: Mapping[str, object]) -> None:
        """Keep a new suspicion (``Suspicion.to_dict()``); a (GPU, class) has one open row:
        an older open one is closed first."""
        slowdown = float(suspicion.get("slowdown", math.nan))  # type: ignore[arg-type]
        since = float(suspicion["since_s"])  # type: ignore[arg-type]
        with self._write() as db:
            db.execute(
                "UPDATE gpu_suspicions SET cleared_s = ?, cleared_why = 'suspect again' "
                "WHERE campaign_id = ? AND uuid = ? AND job_class = ? AND cleared_s IS NULL",
                (since, campaign_id, suspicion["gpu"], suspicion["job_class"]),
            )
            db.execute(
                f"INSERT OR REPLACE INTO gpu_suspicions ({_COLUMNS}) "
                "VALUES (?,?,?,?,?,?,?,?,?,NULL,NULL)",
                (
                    campaign_id,
                    str(suspicion["gpu"]),
                    str(suspicion["job_class"]),
                    since,
                    float(suspicion["onset_s"]),  # type: ignore[arg-type]
                    str(suspicion["cause"]),
                    slowdown if math.isfinite(slowdown) else None,
                    int(suspicion["runs"]),  # type: ignore[call-overload]
                    json.dumps(suspicion.get("evidence", [])),
                ),
            )

    def close_suspicion(
        self, campaign_id: str, uuid: str, job_class: str, at_s: float, why: str
    ) -> bool:
        """Close the open suspicion of (GPU, class); False when none was open."""
        with self._write() as db:
            changed = db.execute(
                "UPDATE gpu_suspicions SET cleared_s = ?, cleared_why = ? WHERE campaign_id = ? "
                "AND uuid = ? AND job_class = ? AND cleared_s IS NULL",
                (at_s, why, campaign_id, uuid, job_class),
            ).rowcount
        return bool(changed)

    def sync_suspicions(
        self, campaign_id: str, current: Iterable[Mapping[str, object]], at_s: float, why: str
    ) -> tuple[int, int]:
        """Make the open rows of ``campaign_id`` the ``current`` suspicions (a warm-up's):
        rows no longer current are closed with ``why``, new ones opened; an open row of the
        same (GPU, class) stays as it is (its first ``since_s`` kept). (opened, closed)."""
        wanted = {(str(s["gpu"]), str(s["job_class"])): s for s in current}
        opened = closed = 0
        with self.group():  # one commit; each write inside is a savepoint
            held = {(str(r["gpu"]), str(r["job_class"])) for r in self.suspicions(campaign_id)}
            for key in sorted(held - set(wanted)):
                closed += self.close_suspicion(campaign_id, key[0], key[1], at_s, why)
            for key in sorted(set(wanted) - held):
                self.open_suspicion(campaign_id, wanted[key])
                opened += 1
        return opened, closed

    def suspicions(
        self, campaign_id: str | None = None, *, cleared: bool = False
    ) -> list[dict[str, object]]:
        """Open suspicions (``cleared``: every row), by GPU then class; all campaigns or one."""
        where = [] if cleared else ["cleared_s IS NULL"]
        params: tuple[object, ...] = ()
        if campaign_id is not None:
            where.append("campaign_id = ?")
            params = (campaign_id,)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM gpu_suspicions{clause} ORDER BY uuid, job_class, since_s",
            params,
        ).fetchall()
        return [
            {
                "campaign": r[0],
                "gpu": r[1],
                "job_class": r[2],
                "since_s": r[3],
                "onset_s": r[4],
                "cause": r[5],
                "slowdown": r[6],
                "runs": r[7],
                "evidence": json.loads(r[8]),
                "cleared_s": r[9],
                "cleared_why": r[10],
            }
            for r in rows
        ]
