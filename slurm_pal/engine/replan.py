"""Re-planning pending GPU jobs: PAL's queue rule over the jobs the advisor steered.

Why: the GPUs chosen at submit time may be taken before the job starts, and a job passed at
submit because nothing was free waits as an untyped request that Slurm will place anywhere.
Every ``advisor.replan_s`` the pending jobs this advisor routed (or passed for lack of free
GPUs) and the user did not pin get PAL's queue cut and class order against the free GPUs
(:func:`plan_replan`, pure); a job whose GPUs changed is updated with ``scontrol update``
(:class:`~slurm_pal.adapters.slurm.update.ScontrolApplier`). Running jobs are never touched.

The round is the core's one queue loop (:func:`slurm_pal.core.queue.queue_round`, PAL's rule:
it stops at the first job that gets no GPUs): each job is placed by ``decide`` (the policy, plus
the encoding submit-time routing uses), and a job whose new request Slurm 22.05 would refuse or
mishandle (:func:`slurm_pal.core.jobchange.transition_problem`) is kept as it is; the updates
go out through ``adapters/slurm/update.py`` (the caller's applier: this module does no I/O and
imports no adapter; a Slurm job is read through :class:`SlurmJob`). A job the policy holds off
outlier GPUs (``wait``) keeps its request with its begin time at the wait's bound
(``since``/``until`` in its admin comment); routed before then, its begin time is lifted in the
same update. Slurm does not see a held job as eligible, so it neither ends the round nor holds
the jobs behind it. (An older advisor kept waiting jobs off nodes through ``exc_nodes``; routed
now, that exclusion is lifted.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Container, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.hostlist import compress, expand
from slurm_pal.core.jobchange import JobChange, ReleaseRules, transition_problem
from slurm_pal.core.placement import PlacementPolicy, PlacementResult
from slurm_pal.core.queue import (
    NodeBackfill,
    Outcome,
    SlurmBackfill,
    StartRule,
    StopAtMisfit,
    queue_round,
)
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.decide import (
    NO_FIT,
    Decision,
    LabelTable,
    decide,
    parse_admin_comment,
    parse_gpus_field,
    plannable_request,
)
from slurm_pal.engine.jobdesc import JobDescription, node_set

__all__ = [
    "SKIP_REASONS",
    "PendingJob",
    "ReplanResult",
    "RequestKey",
    "SimulatedSlurm",
    "SlurmJob",
    "Update",
    "current_gpus",
    "due_holds",
    "held",
    "kept_off",
    "pending_as_written",
    "plan_replan",
    "replannable",
    "requests_of",
    "round_cluster",
    "steered_job",
    "with_written",
]

log = logging.getLogger("slurm_pal.advisor")

#: Pending reasons of jobs the scheduler will not start anyway (held, waiting on others or
#: on a start time): re-planning them would only churn. "None" (not looked at since the last
#: change) is planned like any other: 24.11 resets a pending job's reason to None at every
#: update, the advisor's own included, so skipping it left the jobs it had just kept waiting
#: out of the next round.
SKIP_REASONS = ("JobHeld", "Dependency", "BeginTime")


def replannable(reason: str, held_by_us: bool = False) -> bool:
    """Is a pending job with this Slurm reason one the scheduler would start if it fit?
    ``held_by_us``: the begin time is this advisor's hold (a ``wait``), which a round lifts."""
    if held_by_us and reason.startswith("BeginTime"):
        return True
    return bool(reason) and not reason.startswith(SKIP_REASONS)


@dataclass(frozen=True)
class PendingJob:
    """One pending job the advisor steered: its original request and what it holds now."""

    job_id: int
    token: str
    job: JobDescription  # the user's request as submitted (advisor_decisions)
    job_class: str
    class_reason: str
    current: Mapping[str, tuple[str, ...]] | None  # node -> labels now; None: passed untyped
    tres_per_node: str = ""  # as Slurm holds them now
    tres_per_job: str = ""
    priority: int = 0
    kept_off: tuple[str, ...] = ()  # nodes an older advisor excluded while the job waited
    waiting: tuple[float, float] | None = None  # (since, until) while the advisor holds it
    # the placement request as a driver that models the job itself knows it (the simulator:
    # its run time where the trace has no limits); None: read from ``job``
    request: PlacementRequest | None = None


@dataclass(frozen=True)
class Update:
    """A pending job's new placement (``decision.action`` "route"), or its hold while it waits
    for GPUs that are not outliers for it ("wait": ``chosen`` is empty, its begin time set)."""

    job_id: int
    token: str
    decision: Decision
    chosen: Mapping[str, tuple[str, ...]]
    before: Mapping[str, tuple[str, ...]] | None
    pending: PendingJob

    @property
    def change(self) -> JobChange:
        """What Slurm must be told: the fields, against the request it holds now."""
        decision, pending = self.decision, self.pending
        lift = None
        if decision.action == "route" and pending.kept_off:
            lift = compress(sorted(node_set(pending.job.exc_nodes, "exc_nodes")))
        fields = decision.set_fields
        if decision.action == "route" and pending.waiting is not None:
            fields = {**fields, "begin_time": 0}  # lift the hold with the new GPUs
        return JobChange(
            job_id=self.job_id,
            fields=fields,
            held_tres=pending.tres_per_node or pending.tres_per_job,
            n_gpus=decision.allocation.n_gpus if decision.allocation is not None else 0,
            only_exclusion=decision.action == "wait",
            lift_exclusion_to=lift,
        )


@dataclass
class ReplanResult:
    """What one round did: updates planned (and applied), jobs left as they are, notes."""

    considered: int = 0
    updates: list[Update] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    not_placed: list[int] = field(default_factory=list)
    kept: dict[int, str] = field(default_factory=dict)  # planned elsewhere, Slurm can't move it
    waiting: list[int] = field(default_factory=list)  # held off outlier GPUs, exclusion up to date
    # job id -> (token, GPU UUIDs) of the unchanged jobs whose GPUs the round counted taken
    # (left to Slurm where it would put them, or pinned already to the round's choice)
    in_place: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    applied: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        return {
            "considered": self.considered,
            "updates": [u.job_id for u in self.updates],
            "unchanged": self.unchanged,
            "not_placed": self.not_placed,
            "kept": {str(k): v for k, v in self.kept.items()},
            "waiting": self.waiting,
            "applied": self.applied,
            "failed": {str(k): v for k, v in self.failed.items()},
        }


def held(admin_comment: Mapping[str, str]) -> tuple[float, float] | None:
    """(since, until) of a job an admin comment says this advisor holds (``wait``)."""
    if admin_comment.get("action") != "wait":
        return None
    try:
        return float(admin_comment["since"]), float(admin_comment["until"])
    except (KeyError, ValueError):
        return None


def kept_off(admin_comment: Mapping[str, str]) -> tuple[str, ...]:
    """The nodes an admin comment's ``exc=`` says the advisor keeps a waiting job off."""
    value = admin_comment.get("exc")
    if admin_comment.get("action") != "wait" or not value:
        return ()
    try:
        return tuple(expand(value))
    except ValueError:
        return ()


def current_gpus(admin_comment: Mapping[str, str]) -> dict[str, tuple[str, ...]] | None:
    """The labels per node an admin comment's ``gpus=`` names (None when it names none)."""
    value = admin_comment.get("gpus")
    if not value:
        return None
    try:
        return {n: tuple(sorted(labels)) for n, labels in parse_gpus_field(value).items()}
    except ValueError:
        return None


def _chosen(decision: Decision, labels: LabelTable) -> dict[str, tuple[str, ...]]:
    allocation = decision.allocation
    assert allocation is not None
    out: dict[str, list[str]] = {}
    for node, index in zip(allocation.nodes, allocation.local_indices, strict=True):
        out.setdefault(node, []).append(labels.label(node, index))
    return {n: tuple(sorted(v)) for n, v in out.items()}


class SlurmJob(Protocol):
    """What :func:`steered_job` reads of a pending job as Slurm shows it
    (:class:`slurm_pal.adapters.slurm.state.JobState` is one)."""

    @property
    def job_id(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def tres_per_node(self) -> Sequence[object]: ...
    @property
    def tres_per_job(self) -> Sequence[object]: ...
    @property
    def time_limit_s(self) -> float | None: ...


#: A pending job's request is cached under (token, job id, class): what it is computed from.
RequestKey = tuple[str, int, str]


def steered_job(
    job: SlurmJob, comment: Mapping[str, str], original: JobDescription, job_class: str
) -> PendingJob:
    """A pending job the advisor steered, as Slurm shows it (``comment``: its admin comment,
    parsed; ``original``: the request as the user submitted it; its time limit as Slurm holds
    it now, which an admin or the user may have changed)."""
    limit = job.time_limit_s
    if limit is not None:
        minutes = 4294967295 if math.isinf(limit) else max(1, round(limit / 60))
        original = replace(original, time_limit=minutes)
    return PendingJob(
        job_id=job.job_id,
        token=comment["r"],
        job=original,
        job_class=job_class,
        class_reason=f"re-planned; class {job_class} at submit",
        current=current_gpus(comment) if comment["action"] == "route" else None,
        kept_off=kept_off(comment),
        waiting=held(comment),
        tres_per_node=",".join(f"gres:{g}" for g in job.tres_per_node),
        tres_per_job=",".join(f"gres:{g}" for g in job.tres_per_job),
        priority=job.priority,
    )


def with_written(
    pending: PendingJob, comment: Mapping[str, str] | None, tres_per_node: str, tres_per_job: str
) -> PendingJob | None:
    """``pending`` as this service last updated it (its admin comment, parsed, and GPU
    request), for a round that runs before Slurm's next read shows the update; None when the
    comment no longer steers it."""
    if comment is None or comment.get("r") != pending.token:
        return None
    return replace(
        pending,
        current=current_gpus(comment) if comment["action"] == "route" else None,
        kept_off=kept_off(comment),
        waiting=held(comment),
        tres_per_node=tres_per_node,
        tres_per_job=tres_per_job,
    )


def requests_of(
    pending: Sequence[PendingJob],
    *,
    labels: LabelTable,
    cluster: Cluster,
    known: MutableMapping[RequestKey, PlacementRequest | None] | None = None,
) -> list[PlacementRequest | None]:
    """Each pending job's placement request (None: the round would pass it), from ``known``
    when it holds it (filled in as it goes): a job's GPU ask is read once, not every round."""
    out: list[PlacementRequest | None] = []
    for p in pending:
        if p.request is not None:
            out.append(p.request)
            continue
        key = (p.token, p.job_id, p.job_class)
        if known is not None and key in known:
            out.append(known[key])
            continue
        request = plannable_request(
            p.job, job_class=p.job_class, labels=labels, cluster=cluster, job_id=str(p.job_id)
        )
        if known is not None:
            known[key] = request
        out.append(request)
    return out


class SimulatedSlurm(Protocol):
    """A Slurm that a driver simulates inside the round (the simulator's Slurm mode): its
    scheduling pass runs with the round, so a job starts the moment the round places it, and
    the round's updates are written to it as they are decided. The service's Slurm is real:
    its round plans on a copy of the cluster and its applier sends the updates afterwards."""

    @property
    def start(self) -> StartRule:
        """When jobs may start (the simulated Slurm's FIFO and EASY backfill)."""
        ...

    def steers(self, job_id: int) -> bool:
        """Does the advisor decide this pending job now? (False: Slurm places it, as a job
        that found no GPUs at its submission when no round runs at job ends.)"""
        ...

    def packing(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        """Where Slurm's own packing puts a job the advisor leaves to it."""
        ...

    def apply(self, update: Update) -> None:
        """Write one update to the job: its GPUs (route), or its begin time (wait)."""
        ...


def plan_replan(
    pending: Sequence[PendingJob],
    cluster: Cluster,
    *,
    labels: LabelTable,
    policy: PlacementPolicy,
    version: str,
    class_order: Sequence[str] | None = None,
    partition_nodes: Mapping[str, Sequence[str]] | None = None,
    default_partition: str | None = None,
    known: MutableMapping[RequestKey, PlacementRequest | None] | None = None,
    release: ReleaseRules | None = None,
    leave_packing: bool = False,
    now: float | None = None,
    slurm: SimulatedSlurm | None = None,
    backfill: bool = False,
    overtime_unlimited: bool = False,
    backfill_reserves: str = "head",
) -> ReplanResult:
    """PAL's round over ``pending`` (given in Slurm's priority order) on ``cluster``'s free
    GPUs (the pending jobs' own reservations already released). Pure: ``cluster`` is copied.

    A job whose chosen labels per node equal what it holds gets no update; the round stops at
    the first job that does not fit (PAL: the head of the queue is never overtaken). A job
    whose new request Slurm 22.05 would mishandle (:func:`transition_problem`, by the
    ``release`` the applier's scontrol reports; None: 22.05's rules) keeps its request
    (``kept``) and the GPUs planned for it stay free for the jobs after it.
    ``known`` caches each pending job's request across rounds (its GPU ask is read once).
    ``leave_packing``: a job that holds no pin and whose new place is packing's own with
    nothing to avoid is left as it is (Slurm packs it; ``decide``'s ``leave_packing``).
    ``now``: the clock (epoch seconds) a policy that weighs waiting reads ``busy_until``
    against; a held job's wait counts from its ``since``.

    ``backfill``: the real Slurm backfills (``sched/backfill``), so a job that fits nowhere
    yet does not end the round: Slurm starts the jobs behind it in the holes its reservation
    leaves (:class:`~slurm_pal.core.queue.SlurmBackfill`, from the running jobs' limits), and a
    job routed at its submit to GPUs since taken is routed again rather than left waiting for
    them; a job Slurm would not start before that reservation is left as it is.
    ``overtime_unlimited``: that Slurm lets jobs run past their limits, and expects one that
    has to run a whole limit more (else to end now, as it kills it); a ``release`` whose
    backfill counts such a job gone (24.11) plans it ending now either way.
    ``backfill_reserves``: ``head``, EASY (:class:`~slurm_pal.core.queue.SlurmBackfill`);
    ``nodes``, Slurm's whole-node reservation for every waiting job
    (:class:`~slurm_pal.core.queue.NodeBackfill`): a job is placed only off the nodes
    reserved over its limit.

    ``slurm``: the Slurm the driver simulates (:class:`SimulatedSlurm`; None: a real one, as
    the service's). The round then runs on ``cluster`` itself with that Slurm's start rule (a
    job that does not fit does not end it where Slurm backfills), Slurm's packing places the
    jobs left to it and the jobs it does not let the advisor steer, and each update is
    applied to it as it is decided (a routed job's before it starts)."""
    result = ReplanResult(considered=len(pending))
    common = {
        "labels": labels,
        "policy": policy,
        "version": version,
        "partition_nodes": partition_nodes,
        "default_partition": default_partition,
    }
    jobs: dict[str, PendingJob] = {}
    requests: list[PlacementRequest] = []
    found = requests_of(pending, labels=labels, cluster=cluster, known=known)
    for p, request in zip(pending, found, strict=True):
        if request is None:
            result.not_placed.append(p.job_id)
            continue
        jobs[request.job_id] = p
        requests.append(request)
    decisions: dict[str, Decision] = {}
    slurms: set[str] = set()  # the jobs the simulated Slurm places itself

    def place(request: PlacementRequest, state: Cluster) -> PlacementResult:
        p = jobs[request.job_id]
        if slurm is not None and not slurm.steers(p.job_id):
            slurms.add(request.job_id)
            return slurm.packing(request, state)
        if state.n_free < request.gpus:
            # Fits nowhere, so no policy places or holds it: most of a full cluster's queue,
            # every round; building each one's pass decision doubled a simulation's time.
            return PlacementResult(request, None, NO_FIT)
        if p.job.job_id != p.job_id:
            p = jobs[request.job_id] = replace(p, job=replace(p.job, job_id=p.job_id))
        decision = decide(
            p.job,
            job_class=p.job_class,
            class_reason=p.class_reason,
            cluster=state,
            token=p.token,
            leave_packing=leave_packing
            and p.current is None
            and not p.kept_off
            and p.waiting is None,
            now=now,
            waiting_since=p.waiting[0] if p.waiting is not None else None,
            request=p.request,
            **common,  # type: ignore[arg-type]
        )
        decisions[request.job_id] = decision
        if decision.allocation is not None:  # routed, or left to Slurm where it would go
            if slurm is not None and decision.left_to_slurm:
                return slurm.packing(request, state)
            return PlacementResult(request, decision.allocation, decision.reason)
        return PlacementResult(
            request,
            None,
            decision.reason,
            waits_off=decision.waits_off,
            wait_until=decision.wait_until,
        )

    def review(request: PlacementRequest, placement: PlacementResult) -> Outcome:
        p = jobs[request.job_id]
        assert placement.allocation is not None
        if request.job_id in slurms:
            result.unchanged.append(p.job_id)
            return Outcome.UNCHANGED
        decision = decisions[request.job_id]
        if decision.left_to_slurm:
            result.unchanged.append(p.job_id)
            result.in_place[p.job_id] = (p.token, placement.allocation.uuids)
            return Outcome.UNCHANGED
        chosen = _chosen(decision, labels)
        if (
            p.current is not None
            and dict(p.current) == chosen
            and not p.kept_off
            and p.waiting is None
        ):
            result.unchanged.append(p.job_id)
            result.in_place[p.job_id] = (p.token, placement.allocation.uuids)
            return Outcome.UNCHANGED
        update = Update(p.job_id, p.token, decision, chosen, p.current, p)
        problem = transition_problem(update.change, release)
        if problem is not None:
            result.kept[p.job_id] = problem
            return Outcome.KEPT
        result.updates.append(update)
        if slurm is not None:
            slurm.apply(update)
        return Outcome.PLACED

    held_now = {
        request_id
        for request_id, p in jobs.items()
        if p.waiting is not None and (now is None or p.waiting[1] > now)
    }
    planned = cluster if slurm is not None else cluster.copy()
    start: StartRule
    if slurm is not None:
        start = slurm.start
    elif backfill:
        rule = NodeBackfill if backfill_reserves == "nodes" else SlurmBackfill
        start = rule(
            planned,
            now if now is not None else planned.clock,
            held_now,
            overtime_unlimited=overtime_unlimited
            and not (release is not None and release.backfill_drops_jobs_past_limit),
        )
    else:
        start = StopAtMisfit(held=held_now)
    steps = queue_round(
        requests, planned, place, class_order=class_order, start=start, review=review
    )
    for step in steps:
        p = jobs[step.request.job_id]
        if step.outcome is Outcome.WAITS:
            decision = decisions[step.request.job_id]
            if p.current is not None:
                # Routed already (typed, on its nodes): it waits for those GPUs as Slurm
                # holds them; turning it back into a held untyped request is what 22.05
                # cannot do. It keeps its GPUs' request.
                result.kept[p.job_id] = "routed; it waits for the GPUs it was routed to"
                continue
            result.waiting.append(p.job_id)
            until = decision.wait_until
            if p.waiting is None or until is None or abs(p.waiting[1] - until) > 1:
                update = Update(p.job_id, p.token, decision, {}, p.current, p)
                result.updates.append(update)
                if slurm is not None:
                    slurm.apply(update)
        elif step.outcome in (Outcome.NO_FIT, Outcome.NOT_CONSIDERED):
            result.not_placed.append(p.job_id)
    return result


def due_holds(pending: Iterable[PendingJob], now: float) -> set[int]:
    """The held jobs among ``pending`` whose bound has come at ``now`` (epoch seconds)."""
    return {p.job_id for p in pending if p.waiting is not None and p.waiting[1] <= now}


def pending_as_written(
    pending: Iterable[PendingJob],
    written: Mapping[int, tuple[float, str, str, str]],
    placed: Container[int],
) -> list[PendingJob]:
    """The pending jobs a round plans: ``pending`` (as Slurm's last read shows them) less the
    jobs an earlier round placed (``placed``: they are starting), each as this service last
    wrote it (``written``: job id -> (when, admin comment, tres_per_node, tres_per_job)) when
    it did since that read."""
    out: list[PendingJob] = []
    for p in pending:
        if p.job_id in placed:
            continue
        w = written.get(p.job_id)
        if w is None:
            out.append(p)
            continue
        updated = with_written(p, parse_admin_comment(w[1]), w[2], w[3])
        if updated is not None:
            out.append(updated)
    return out


def round_cluster(
    base: Cluster, freed: Iterable[str], reserved: Iterable[Iterable[str]]
) -> Cluster:
    """The GPUs a round plans on: a copy of ``base`` (Slurm's busy GPUs marked) with ``freed``
    (GPU UUIDs job ends gave back that the read still shows used) free and each of ``reserved``
    (the GPUs of reservations the round does not re-plan) taken."""
    cluster = base.copy()
    index = cluster.uuid_index
    cluster.release_uuids(u for u in freed if u in index and not cluster.free[index[u]])
    for uuids in reserved:
        ids = [
            cluster.uuid_index[u]
            for u in uuids
            if u in cluster.uuid_index and cluster.free[cluster.uuid_index[u]]
        ]
        if ids:
            cluster.allocate(ids)
    return cluster
