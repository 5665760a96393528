"""The Slurm mode's round: the advisor engine's re-planning round (:meth:`AdvisorEngine.replan`,
the call the service's ``RoundCoordinator`` makes) over the simulated Slurm's pending jobs.

Why through ``replan``: the service re-plans its steered pending jobs at every job's end (and
at a held job's bound) with ``engine.replan``; a simulator that ran its own loop around
``engine.place`` could drift from it (which jobs a round considers, what a held job's wait
counts from, when a job is left to Slurm) without a test noticing. Here the round is the
engine's, and what it decides is written once, to the simulated Slurm (:class:`SlurmRound`,
the engine's :class:`~slurm_pal.engine.replan.SimulatedSlurm`): a routed job's GPUs, on which
that Slurm starts it, or a held job's begin time, before which it is not eligible.

What this Slurm adds around the round: it is the simulator's scheduling pass too, so the
round runs with its start rule (FIFO and EASY backfill with the jobs' time limits: a job that
does not fit gets a reservation and the round goes on, where the service's round stops at the
first misfit and its Slurm backfills the rest); a job the engine leaves to Slurm, and a job
the advisor does not steer now (decisions only at submit: a job that found no GPUs then), is
placed by its own packing; a pending job can always be moved (24.11's rule: an update
replaces the GPU request), since it starts the moment it is placed.

The simulated jobs are described to the engine as untyped per-job GPU requests, each GPU of
the simulated cluster carrying one label (its model's), with the simulator's own placement
request (``PendingJob.request``: its run time known where the trace has no limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.labels import LabelEntry, LabelTable
from slurm_pal.core.placement import Allocation, PlacementResult
from slurm_pal.core.queue import StartRule
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import PendingJob, ReplanResult, Update

if TYPE_CHECKING:
    from slurm_pal.sim.engine import _Job, _Simulation

__all__ = ["SlurmRound", "SlurmRounds", "pending_job", "sim_labels"]


@dataclass(frozen=True)
class _AnyUpdate:
    """The simulated Slurm's release rules: an update replaces a pending job's GPU request.
    Its backfill is the simulator's own (``SimConfig.slurm_release``), not the round's."""

    typed_gres_update_replaces: bool = True
    backfill_drops_jobs_past_limit: bool = False


def sim_labels(cluster: Cluster) -> LabelTable:
    """The label table of a simulated cluster: every GPU labelled as its model (``sim``-
    prefixed), Slurm's number its device index."""
    entries = tuple(
        LabelEntry(
            node=cluster.node_names[int(cluster.gpu_node[gpu])],
            index=int(cluster.gpu_local_index[gpu]),
            slurm_index=int(cluster.gpu_local_index[gpu]),
            label="sim",
            uuid=uuid,
        )
        for gpu, uuid in enumerate(cluster.uuids)
    )
    return LabelTable(campaign="sim", entries=entries)


def pending_job(job: _Job) -> PendingJob:
    """A simulated pending job as the engine's round reads it."""
    tres = f"gres:gpu:{job.spec.gpus}"
    order = job.order
    return PendingJob(
        job_id=order,
        token=f"sim{order}",
        job=JobDescription(tres_per_job=tres, job_id=order),
        job_class=job.request.job_class,
        class_reason="simulated",
        current=None,  # a routed job starts at once: none waits routed
        tres_per_job=tres,
        waiting=_waiting(job),
        request=job.request,
    )


def _waiting(job: _Job) -> tuple[float, float] | None:
    """(since, bound) of a job the engine holds (its begin time, as the admin comment says)."""
    if job.first_wait is None or job.bound is None:
        return None
    return job.first_wait, job.bound


class SlurmRound:
    """The simulated Slurm during one round (the engine's ``SimulatedSlurm``): its start rule,
    its packing, and the updates the round writes to its jobs."""

    def __init__(self, simulation: _Simulation, rule: StartRule, now: float) -> None:
        self.simulation = simulation
        self.rule = rule
        self.now = now
        self.pinned: dict[str, Allocation] = {}  # job -> the GPUs its update routed it to
        self.applied: list[Update] = []

    @property
    def start(self) -> StartRule:
        return self

    def steers(self, job_id: int) -> bool:
        simulation = self.simulation
        if not simulation.at_submit_only:
            return True
        return simulation.by_id[str(job_id)].spec.submit_time == self.now

    def packing(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        return self.simulation.slurm_packing.place(request, cluster)

    def apply(self, update: Update) -> None:
        self.applied.append(update)
        decision = update.decision
        job = self.simulation.by_id[str(update.job_id)]
        if decision.action == "route":
            assert decision.allocation is not None
            self.pinned[job.request.job_id] = decision.allocation
            return
        # wait: its begin time is the bound; Slurm neither starts nor reserves for it before
        if job.first_wait is None:
            until = decision.wait_until if decision.wait_until is not None else self.now
            self.simulation.hold(job, self.now, until)

    # the start rule: Slurm's, starting a routed job on the GPUs its update named
    def admits(self, request: PlacementRequest) -> bool:
        return self.rule.admits(request)

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        pinned = self.pinned.pop(request.job_id, None)
        if pinned is not None:  # the round took these GPUs for it: they are its update's
            assert result.allocation is not None and pinned.gpu_ids == result.allocation.gpu_ids
            result = replace(result, allocation=pinned)
        self.rule.placed(request, result)

    def blocked(self, request: PlacementRequest) -> bool:
        return self.rule.blocked(request)

    def fence(self, request: PlacementRequest) -> list[int] | None:
        return self.rule.fence(request)


class SlurmRounds:
    """The simulation's rounds through the engine: the simulated cluster's labels, and each
    pending job as the engine reads it (made again only when its hold changes)."""

    def __init__(self, simulation: _Simulation) -> None:
        self.simulation = simulation
        self.labels = sim_labels(simulation.cluster)
        self.pending: dict[int, PendingJob] = {}

    def _pending(self, job: _Job) -> PendingJob:
        known = self.pending.get(job.order)
        if known is None or known.waiting != _waiting(job):
            known = self.pending[job.order] = pending_job(job)
        return known

    def run(self, order: Sequence[_Job], rule: StartRule, now: float) -> ReplanResult:
        """One round of the advisor's engine over ``order`` (the pending jobs, in the
        simulated Slurm's priority order) at ``now``, on the simulation's cluster, which ends
        the round with the started jobs' GPUs taken."""
        simulation = self.simulation
        result = simulation.engine.replan(
            [self._pending(job) for job in order],
            simulation.cluster,
            labels=self.labels,
            class_order=simulation.cut_order,
            partition_nodes=None,
            default_partition=None,
            now=now,
            release=_AnyUpdate(),
            slurm=SlurmRound(simulation, rule, now),
        )
        for job in order:
            if job.alloc is not None:  # started: it is no longer pending
                del self.pending[job.order]
        return result
