"""GPU sharing in the simulator: at most two jobs per GPU, each slowed by its interference
factor while the other is there (event-driven, non-preemptive, gang-scheduled; pure).

A job's progress rate is ``solo rate / xi_eff``: ``solo rate`` the engine's
``1 / (max_g true slowdown x L)``, ``xi_eff`` from the factors on its GPUs (1.0 on a GPU it has
to itself). ``combine="max"`` (SJF-BSBF: synchronous data parallelism waits for the slowest
worker) or ``"liss"`` (GIMBAL's lossless input-sample stealing rebalances the batch, so the job
runs at the mean of its workers' speeds: ``xi_eff = G / sum_g 1 / xi_g``). Rates change only at
events (an arrival, a start, an end), so between events progress is linear and end times are
exact.

The policies (:mod:`slurm_pal.sim.peers.sjf`, ``gimbal``) only choose GPUs and the factors of a
new pair; this module owns time, occupancy and progress.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.topology import Topology
from slurm_pal.core.workload import SimJob
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.peers.base import EPSILON, PeerJob, PeerRun
from slurm_pal.sim.variability import SimGpus

__all__ = ["ShareDecision", "SharingPolicy", "SharingRun", "share_or_wait"]

COMBINES = ("max", "liss")


@dataclass(frozen=True)
class ShareDecision:
    """SJF-BSBF's Theorem 1 on one (running R, new N) pair, times from the decision instant:
    ``share`` when running both now gives a lower mean JCT than N waiting for R; ``t_share`` is
    the better of the two means (Algorithm 2's ranking key)."""

    share: bool
    t_share: float
    concurrent: tuple[float, float]  # (T_R, T_N) if they start sharing now
    sequential: tuple[float, float]  # (T_R, T_N) if N waits for R


def share_or_wait(
    running_left: float, new_time: float, xi_running: float, xi_new: float
) -> ShareDecision:
    """The practical rule of SJF-BSBF (notes 2.2, derived from its Eqs. (18)/(19)): compare the
    fully overlapped and the fully sequential schedules of the pair.

    ``running_left``: R's remaining solo time (t_R i_R); ``new_time``: N's solo time
    (t_N i_N); each is stretched by its ``xi`` while both run, and runs solo once the other ends.
    """
    sequential = (running_left, running_left + new_time)
    if xi_new * new_time >= xi_running * running_left:  # R ends first
        t_r = xi_running * running_left
        t_n = t_r + (new_time - t_r / xi_new)
    else:  # N ends first
        t_n = xi_new * new_time
        t_r = t_n + (running_left - t_n / xi_running)
    concurrent = (t_r, t_n)
    mean_con, mean_seq = sum(concurrent) / 2, sum(sequential) / 2
    return ShareDecision(mean_con < mean_seq, min(mean_con, mean_seq), concurrent, sequential)


class SharingPolicy(Protocol):
    """Chooses, at each event, which pending jobs start on which GPUs."""

    name: str
    scheduler: str
    combine: str

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        """Start jobs through ``run.start``; pending jobs left alone keep waiting."""
        ...


class SharingRun(PeerRun):
    """One event-driven run where a GPU holds up to two jobs."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        gpus: SimGpus,
        policy: SharingPolicy,
        *,
        locality_penalty: float,
        class_order: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            jobs,
            gpus,
            locality_penalty=locality_penalty,
            placement=policy.name,
            scheduler=policy.scheduler,
            mode="events",
        )
        if policy.combine not in COMBINES:
            raise ValueError(f"unknown combine {policy.combine!r}; valid: {', '.join(COMBINES)}")
        self.policy = policy
        self.class_order = tuple(class_order or gpus.classes)
        # occupants[g]: [(job, xi of that job on g while it shares g)]
        self.occupants: list[list[tuple[PeerJob, float]]] = [[] for _ in range(self.n_gpus)]
        self.running: list[PeerJob] = []
        self.guests: set[int] = set()  # orders of jobs that joined another job's GPUs
        self._cluster: Cluster | None = None

    # --- what policies read ------------------------------------------------------------------

    def free_gpus(self) -> list[int]:
        return [g for g, occ in enumerate(self.occupants) if not occ]

    def one_job_gpus(self) -> list[int]:
        return [g for g, occ in enumerate(self.occupants) if len(occ) == 1]

    def alone(self, job: PeerJob) -> bool:
        """True when ``job`` has each of its GPUs to itself (a sharing candidate)."""
        return all(len(self.occupants[g]) == 1 for g in job.gpus)

    def cluster(self) -> Cluster:
        """A core :class:`Cluster` whose free mask is the GPUs nobody holds (for the placement
        core's policies, e.g. PAL); built on first use and kept current by start/end."""
        if self._cluster is None:
            cluster = Cluster.from_gpus(
                self.sim_gpus.specs(), Topology.flat(self.penalty), class_order=self.class_order
            )
            busy = [g for g, occ in enumerate(self.occupants) if occ]
            if busy:
                cluster.allocate(busy)
            self._cluster = cluster
        return self._cluster

    # --- what policies do --------------------------------------------------------------------

    def start(
        self,
        job: PeerJob,
        gpus: Sequence[int],
        now: float,
        pair_xi: Callable[[PeerJob, PeerJob], tuple[float, float]] | None = None,
    ) -> None:
        """Start ``job`` on ``gpus``; on a GPU already held by R, ``pair_xi(job, R)`` gives
        (xi of job, xi of R) while they share it."""
        gpus = tuple(sorted(gpus))
        newly_busy = []
        for g in gpus:
            occ = self.occupants[g]
            if len(occ) >= 2:
                raise ValueError(f"GPU {g} already holds two jobs")
            if occ:
                if pair_xi is None:
                    raise ValueError("sharing a GPU needs the pair's interference factors")
                other, _ = occ[0]
                mine, theirs = pair_xi(job, other)
                occ[0] = (other, theirs)
                occ.append((job, mine))
                self.guests.add(job.order)
            else:
                occ.append((job, 1.0))
                newly_busy.append(g)
        if self._cluster is not None and newly_busy:
            self._cluster.allocate(newly_busy)
        self.note_gpus(job, gpus)
        if job.start is None:
            job.start = now
        self.running.append(job)

    def _end(self, job: PeerJob, now: float) -> None:
        job.end = now
        job.remaining = 0.0
        freed = []
        for g in job.gpus:
            occ = [(j, xi) for j, xi in self.occupants[g] if j is not job]
            self.occupants[g] = [(j, 1.0) for j, _ in occ]
            if not occ:
                freed.append(g)
        if self._cluster is not None and freed:
            self._cluster.release(freed)
        self.running.remove(job)

    def xi_eff(self, job: PeerJob) -> float:
        factors = []
        for g in job.gpus:
            occ = self.occupants[g]
            factors.append(next(xi for j, xi in occ if j is job) if len(occ) == 2 else 1.0)
        if self.policy.combine == "max":
            return max(factors)
        return len(factors) / sum(1.0 / f for f in factors)

    def _rates(self) -> None:
        for job in self.running:
            job.rate = self.solo_rate(job, job.gpus) / self.xi_eff(job)

    # --- the clock ----------------------------------------------------------------------------

    def run(self, max_time: float = math.inf) -> SimResult:
        arrivals = list(reversed(self.jobs))
        pending: list[PeerJob] = []
        now = 0.0
        while arrivals or pending or self.running:
            next_arrival = arrivals[-1].spec.submit_time if arrivals else math.inf
            first_end, ending = math.inf, None
            for job in self.running:
                end = now + job.remaining / job.rate
                if end < first_end:
                    first_end, ending = end, job
            t = min(next_arrival, first_end)
            if first_end > next_arrival:
                ending = None
            if not math.isfinite(t) or t > max_time:
                break
            for job in self.running:
                job.remaining -= (t - now) * job.rate
            now = t
            for job in list(self.running):
                if job is ending or job.remaining <= EPSILON * job.spec.work:
                    self._end(job, now)
            while arrivals and arrivals[-1].spec.submit_time <= now:
                pending.append(arrivals.pop())
            if pending:
                self.policy.schedule(self, pending, now)
                pending = [job for job in pending if job.start is None]
            self._rates()
            self.timeline.append((now, sum(1 for occ in self.occupants if occ)))
        return self.result()
