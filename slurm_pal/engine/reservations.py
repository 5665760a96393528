"""The GPUs the advisor handed out itself and Slurm does not show used yet (PROTOCOL.md
"Reservations and re-planning"): a route holds its GPUs under its token until Slurm shows the
job (``r=<token>`` in its admin comment) running or gone, or until ``advisor.reservation_ttl_s``
passes.

Pure and not locked: the clock is passed to each call, and
its owner (the service's ``AdvisorState``) holds its lock around every use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from slurm_pal.core.cluster import Cluster

__all__ = ["Reservation", "Reservations", "SeenJob"]

log = logging.getLogger("slurm_pal.advisor")


@dataclass
class Reservation:
    """GPUs handed to a routed job that Slurm does not run yet."""

    token: str
    uuids: tuple[str, ...]
    expires: float  # on the state's clock
    job_id: int | None = None
    made: float = 0.0  # on the state's clock: when the answer was made


class SeenJob(Protocol):
    """What reconciling reads of a job Slurm shows (``adapters.slurm.state.JobState`` is one)."""

    @property
    def job_id(self) -> int: ...
    @property
    def state(self) -> str: ...


class Reservations:
    """The open reservations by token."""

    def __init__(self) -> None:
        self._open: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[Reservation]:
        return iter(self._open.values())

    def hold(
        self,
        token: str,
        uuids: Iterable[str],
        *,
        now: float,
        ttl_s: float,
        job_id: int | None = None,
    ) -> None:
        """Hold ``uuids`` under ``token`` from ``now`` for ``ttl_s`` (a route's answer, a
        re-planned job)."""
        self._open[token] = Reservation(token, tuple(uuids), now + ttl_s, job_id, now)

    def release(self, token: str) -> bool:
        """Forget ``token``'s reservation; True when there was one."""
        return self._open.pop(token, None) is not None

    def copies(self) -> dict[str, Reservation]:
        return {t: replace(r) for t, r in self._open.items()}

    def expire(self, now: float) -> list[str]:
        """Drop the reservations past their TTL at ``now``; their tokens."""
        gone = [t for t, r in self._open.items() if now >= r.expires]
        for token in gone:
            del self._open[token]
            log.info("reservation %s expired", token)
        return gone

    def reconcile(
        self, seen: Mapping[str, SeenJob], now: float, orphan_before: float | None
    ) -> None:
        """Bind reservations to the jobs Slurm shows (``seen``: token -> job); drop those
        running, gone or expired at ``now``, and those no job carries although made before
        ``orphan_before`` (an answer nobody received: its job went through as written, or was
        never submitted)."""
        for token, res in list(self._open.items()):
            job = seen.get(token)
            if job is not None:
                if job.state != "PENDING":
                    del self._open[token]  # running: Slurm counts it; ended: free
                    log.info("reservation %s released: job %d %s", token, job.job_id, job.state)
                    continue
                res.job_id = job.job_id
            elif res.job_id is not None:
                del self._open[token]  # the job left squeue
                continue
            elif orphan_before is not None and res.made < orphan_before:
                del self._open[token]
                log.info("reservation %s dropped: no job carries it", token)
                continue
            if now >= res.expires:
                del self._open[token]
                log.info("reservation %s expired (job %s)", token, res.job_id)

    def applied_to(self, base: Cluster) -> Cluster:
        """A copy of ``base`` with every reserved GPU it shows free taken."""
        cluster = base.copy()
        for res in self._open.values():
            ids = [
                cluster.uuid_index[u]
                for u in res.uuids
                if u in cluster.uuid_index and cluster.free[cluster.uuid_index[u]]
            ]
            if ids:
                cluster.allocate(ids)
        return cluster
