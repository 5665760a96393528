"""SJF-BSBF, its SJF-FFS baseline, plain SJF, and PM-aware sharing under PAL (pure).

All are non-preemptive and gang-scheduled with at most two jobs per GPU (SJF-BSBF's C = 2),
on :class:`~slurm_pal.sim.peers.sharing.SharingRun`. Pending jobs are tried at every event in
order; a job that cannot start keeps waiting and later jobs are still tried (Algorithm 1 loops
over the whole pending list: no reservation).

SJF-BSBF (Algorithm 1), choices where the paper is ambiguous (notes 2.2):

- SJF key ``L_k``: the job's work (oracle, as the paper's SJF), not its GPU count;
- enough free GPUs: the job takes them, on the fewest nodes;
- otherwise, if free + one-job GPUs suffice: every running job R holding only one-job GPUs is a
  candidate (the unit is the running job, not the GPU); Theorem 1's practical rule
  (:func:`share_or_wait`) on (R's remaining solo time, N's solo time on R's GPUs, the pair's
  xi) keeps the R where sharing beats waiting; candidates sorted by their ``t_share``; their
  whole GPU sets are added in that order and the last one is truncated to what N needs; free
  GPUs only top up when the candidates' GPUs do not suffice (the paper takes shared GPUs first:
  N's end is set by them anyway);
- times the policy compares are what it can know: work over the *binned* scores and L;
- Algorithm 2's sub-batch search is not modeled: our interference is per class pair, not per
  batch size, so b = B and the memory fit is assumed.

SJF-FFS: same order, free GPUs first, then any one-job GPUs first-fit (GPU order), no
benefit check. SJF: same order, never shares (the control that isolates sharing's effect).

``pal-share`` (PM-aware sharing, none of the papers): the scheduler's order (FIFO/SRTF by work),
free GPUs chosen by the core PAL policy (L x V, the live advisor's), and only *memory-bound*
jobs (the last half of the class order) may share: they join a running job whose GPUs are the
slowest for the most compute-bound class (slow for compute, so a compute-bound host loses least
there, and a memory-bound guest barely notices the GPU's compute slowness), when share-or-wait
says it pays. Compute-bound jobs never share.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_pal.core.placement import get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.sim.peers.base import PeerJob, pack_gpus
from slurm_pal.sim.peers.interference import InterferenceTable
from slurm_pal.sim.peers.sharing import SharingRun, share_or_wait

__all__ = ["PalShare", "SjfBsbf", "SjfExclusive", "SjfFfs", "order_jobs"]


def order_jobs(pending: list[PeerJob], scheduler: str) -> list[PeerJob]:
    """SJF/SRTF by work (pending jobs never ran: remaining = work), else FIFO."""
    if scheduler in ("sjf", "srtf"):
        return sorted(pending, key=lambda j: (j.spec.work, j.spec.submit_time, j.order))
    return sorted(pending, key=lambda j: (j.spec.submit_time, j.order))


class _Base:
    combine = "max"

    def __init__(self, name: str, table: InterferenceTable, scheduler: str = "sjf") -> None:
        self.name = name
        self.table = table
        self.scheduler = scheduler

    def pair_xi(self, new: PeerJob, other: PeerJob) -> tuple[float, float]:
        return self.table(new.job_class, other.job_class), self.table(
            other.job_class, new.job_class
        )

    def candidates(
        self, run: SharingRun, job: PeerJob, allowed: set[int] | None = None
    ) -> list[tuple[float, PeerJob]]:
        """Running jobs alone on their GPUs with which sharing beats waiting, by t_share."""
        found = []
        for other in run.running:
            if not run.alone(other) or (allowed is not None and other.order not in allowed):
                continue
            left = other.remaining / run.solo_rate(other, other.gpus, believed=True)
            mine = job.spec.work / run.solo_rate(job, other.gpus, believed=True)
            xi_new, xi_other = self.pair_xi(job, other)
            decision = share_or_wait(left, mine, xi_other, xi_new)
            if decision.share:
                found.append((decision.t_share, other))
        found.sort(key=lambda pair: (pair[0], pair[1].order))
        return found


class SjfExclusive(_Base):
    """Non-preemptive SJF, one job per GPU."""

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        for job in order_jobs(pending, self.scheduler):
            gpus = pack_gpus(run.free_gpus(), job.spec.gpus, run.per_node)
            if gpus is not None:
                run.start(job, gpus, now)


class SjfFfs(_Base):
    """SJF with first-fit sharing of any one-job GPU."""

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        for job in order_jobs(pending, self.scheduler):
            free = run.free_gpus()
            need = job.spec.gpus
            gpus = pack_gpus(free, need, run.per_node)
            if gpus is None:
                one = run.one_job_gpus()
                if len(free) + len(one) < need:
                    continue
                gpus = tuple(free) + tuple(one[: need - len(free)])
            run.start(job, gpus, now, self.pair_xi)


class SjfBsbf(_Base):
    """SJF with Best Sharing Benefit First (share-or-wait per running job)."""

    def shared_gpus(
        self, run: SharingRun, job: PeerJob, free: Sequence[int], allowed: set[int] | None = None
    ) -> tuple[int, ...] | None:
        need = job.spec.gpus
        chosen: list[int] = []
        for _, other in self.candidates(run, job, allowed):
            chosen.extend(other.gpus[: need - len(chosen)])
            if len(chosen) >= need:
                break
        if not chosen:
            return None
        if len(chosen) < need:
            top_up = pack_gpus(free, need - len(chosen), run.per_node)
            if top_up is None:
                return None
            chosen.extend(top_up)
        return tuple(chosen)

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        for job in order_jobs(pending, self.scheduler):
            free = run.free_gpus()
            gpus = pack_gpus(free, job.spec.gpus, run.per_node)
            if gpus is None:
                if len(free) + len(run.one_job_gpus()) < job.spec.gpus:
                    continue
                gpus = self.shared_gpus(run, job, free)
                if gpus is None:
                    continue
            run.start(job, gpus, now, self.pair_xi)


class PalShare(SjfBsbf):
    """PAL placement on free GPUs; memory-bound jobs may share GPUs slow for compute."""

    def __init__(self, name: str, table: InterferenceTable, scheduler: str = "fifo") -> None:
        super().__init__(name, table, scheduler)
        self.pal = get_policy("pal")

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        order = run.class_order
        memory_bound = set(order[(len(order) + 1) // 2 :]) if len(order) > 1 else set()
        compute = run.scores[order[0]]
        for job in order_jobs(pending, self.scheduler):
            request = PlacementRequest(
                job_id=str(job.order), job_class=job.job_class, gpus=job.spec.gpus
            )
            placed = self.pal.place(request, run.cluster())
            if placed.allocation is not None:
                run.start(job, placed.allocation.gpu_ids, now)
                continue
            if job.job_class not in memory_bound:
                continue
            free = run.free_gpus()
            if len(free) + len(run.one_job_gpus()) < job.spec.gpus:
                continue
            ranked = self.candidates(run, job)
            # slowest-for-compute hosts first; share-or-wait's t_share breaks ties
            ranked.sort(key=lambda p: (-max(compute[g] for g in p[1].gpus), p[0], p[1].order))
            chosen: list[int] = []
            for _, other in ranked:
                chosen.extend(other.gpus[: job.spec.gpus - len(chosen)])
                if len(chosen) >= job.spec.gpus:
                    break
            if len(chosen) < job.spec.gpus:
                continue
            run.start(job, chosen, now, self.pair_xi)
