"""Re-planning pending GPU jobs: PAL's queue rule over the jobs the advisor steered.

Why: the GPUs chosen at submit time may be taken before the job starts, and a job passed at
submit because nothing was free waits as an untyped request that Slurm will place anywhere.
Every ``advisor.replan_s`` the pending jobs this advisor routed (or passed for lack of free
GPUs) and the user did not pin get PAL's queue cut and class order against the free GPUs
(:func:`plan_replan`, pure); a job whose GPUs changed is updated with ``scontrol update``
(:class:`ScontrolApplier`). Running jobs are never touched.

The round is the core's one queue loop (:func:`slurm_pal.core.queue.queue_round`, PAL's rule:
it stops at the first job that gets no GPUs): each job is placed by ``decide`` (the policy, plus
the encoding submit-time routing uses), and a job whose new request Slurm 22.05 would refuse or
mishandle is kept as it is. A job the policy holds off outlier GPUs (``wait``) keeps its request
and gets its ``exc_nodes`` brought up to date; routed later, the advisor's exclusion is lifted.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_pal.advisor.decide import Decision, LabelTable, decide, parse_gpus_field
from slurm_pal.advisor.jobdesc import JobDescription, node_set
from slurm_pal.core.cluster import Cluster
from slurm_pal.core.hostlist import compress, expand
from slurm_pal.core.placement import PlacementPolicy, PlacementResult
from slurm_pal.core.queue import Outcome, StopAtMisfit, queue_round
from slurm_pal.core.request import PlacementRequest

__all__ = [
    "SKIP_REASONS",
    "PendingJob",
    "ReplanResult",
    "ScontrolApplier",
    "Update",
    "gpu_types",
    "kept_off",
    "plan_replan",
    "replannable",
    "scontrol_steps",
    "transition_problem",
]

log = logging.getLogger("slurm_pal.advisor")

#: Pending reasons of jobs the scheduler will not start anyway (held, waiting on others,
#: not yet looked at): re-planning them would only churn.
SKIP_REASONS = ("JobHeld", "Dependency", "BeginTime", "None")


def replannable(reason: str) -> bool:
    """Is a pending job with this Slurm reason one the scheduler would start if it fit?"""
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
    kept_off: tuple[str, ...] = ()  # nodes the advisor excludes while the job waits


@dataclass(frozen=True)
class Update:
    """A pending job's new placement (``decision.action`` "route"), or its new exclusion while
    it waits for GPUs that are not outliers for it ("wait": ``chosen`` is empty)."""

    job_id: int
    token: str
    decision: Decision
    chosen: Mapping[str, tuple[str, ...]]
    before: Mapping[str, tuple[str, ...]] | None
    pending: PendingJob


@dataclass
class ReplanResult:
    """What one round did: updates planned (and applied), jobs left as they are, notes."""

    considered: int = 0
    updates: list[Update] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    not_placed: list[int] = field(default_factory=list)
    kept: dict[int, str] = field(default_factory=dict)  # planned elsewhere, Slurm can't move it
    waiting: list[int] = field(default_factory=list)  # held off outlier GPUs, exclusion up to date
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
) -> ReplanResult:
    """PAL's round over ``pending`` (given in Slurm's priority order) on ``cluster``'s free
    GPUs (the pending jobs' own reservations already released). Pure: ``cluster`` is copied.

    A job whose chosen labels per node equal what it holds gets no update; the round stops at
    the first job that does not fit (PAL: the head of the queue is never overtaken). A job
    whose new request Slurm 22.05 would mishandle (:func:`transition_problem`) keeps its
    request (``kept``) and the GPUs planned for it stay free for the jobs after it."""
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
    for p in pending:
        job = replace(p.job, job_id=p.job_id)
        probe = decide(
            job,
            job_class=p.job_class,
            class_reason=p.class_reason,
            cluster=cluster,
            token=p.token,
            **common,  # type: ignore[arg-type]
        )
        if probe.request is None:
            result.not_placed.append(p.job_id)
            continue
        jobs[probe.request.job_id] = replace(p, job=job)
        requests.append(probe.request)
    decisions: dict[str, Decision] = {}

    def place(request: PlacementRequest, state: Cluster) -> PlacementResult:
        p = jobs[request.job_id]
        decision = decide(
            p.job,
            job_class=p.job_class,
            class_reason=p.class_reason,
            cluster=state,
            token=p.token,
            **common,  # type: ignore[arg-type]
        )
        decisions[request.job_id] = decision
        if decision.action == "route" and decision.allocation is not None:
            return PlacementResult(request, decision.allocation, decision.reason)
        return PlacementResult(request, None, decision.reason, waits_off=decision.waits_off)

    def review(request: PlacementRequest, placement: PlacementResult) -> Outcome:
        p, decision = jobs[request.job_id], decisions[request.job_id]
        chosen = _chosen(decision, labels)
        if p.current is not None and dict(p.current) == chosen and not p.kept_off:
            result.unchanged.append(p.job_id)
            return Outcome.UNCHANGED
        update = Update(p.job_id, p.token, decision, chosen, p.current, p)
        problem = transition_problem(update)
        if problem is not None:
            result.kept[p.job_id] = problem
            return Outcome.KEPT
        result.updates.append(update)
        return Outcome.PLACED

    steps = queue_round(
        requests,
        cluster.copy(),
        place,
        class_order=class_order,
        start=StopAtMisfit(),
        review=review,
    )
    for step in steps:
        p = jobs[step.request.job_id]
        if step.outcome is Outcome.WAITS:
            decision = decisions[step.request.job_id]
            result.waiting.append(p.job_id)
            if set(decision.kept_off) != set(p.kept_off):
                result.updates.append(Update(p.job_id, p.token, decision, {}, p.current, p))
        elif step.outcome in (Outcome.NO_FIT, Outcome.NOT_CONSIDERED):
            result.not_placed.append(p.job_id)
    return result


# -- applying ---------------------------------------------------------------------------------
_KEYS = {
    "exc_nodes": "ExcNodeList",
    "req_nodes": "ReqNodeList",
    "tres_per_node": "TresPerNode",
    "tres_per_job": "TresPerJob",
    "admin_comment": "AdminComment",
}


def gpu_types(tres: str) -> frozenset[str]:
    """The GPU types a Slurm tres string asks for (``gres:gpu:T:n`` -> ``{T}``; ``T:0`` asks for
    none, and does not clear ``T`` on 22.05 either)."""
    types = set()
    for item in tres.split(","):
        parts = item.strip().removeprefix("gres:").removeprefix("gres/").split(":")
        if parts[0] == "gpu" and len(parts) == 3 and parts[2] != "0":
            types.add(parts[1])
    return frozenset(types)


def _is_gpu_typed(tres: str) -> bool:
    """Does a Slurm tres string name a GPU type (``gres:gpu:T:n``)?"""
    return bool(gpu_types(tres))


def transition_problem(update: Update) -> str | None:
    """Why Slurm 22.05 would refuse or mishandle this change of GPU request (checked on the
    testbed, ``tests/slurm/test_advisor_service.py``), or None.

    Refused outright: typed -> untyped in every form tried, and an untyped request turned into
    a typed *per-job* one. Accepted but wrong: an update that drops a GPU type. Slurm merges
    the new typed entries into the job's GRES request and keeps the dropped type's entry with
    its old count (also with an explicit ``T:0``), so ``ta:2 -> tb:2`` runs on 4 GPUs and
    ``ta:3,tb:1 -> ta:4`` is held with BadConstraints on a node without ``tb``. Updates that
    keep every type (new counts, other nodes, added types) are exact."""
    fields = update.decision.set_fields
    now = update.pending.tres_per_node or update.pending.tres_per_job
    if update.decision.action == "wait" or not now:
        return None
    gpu_fields = [str(fields[k]) for k in ("tres_per_node", "tres_per_job") if fields.get(k)]
    new_types = frozenset().union(*(gpu_types(v) for v in gpu_fields))
    old_types = gpu_types(now)
    if old_types and gpu_fields and not new_types:
        return "Slurm 22.05 cannot turn a typed GPU request into an untyped one"
    if not old_types and _is_gpu_typed(str(fields.get("tres_per_job", ""))):
        return "Slurm 22.05 cannot turn an untyped GPU request into a typed per-job one"
    dropped = old_types - new_types
    if old_types and new_types and dropped:
        return (
            "Slurm 22.05 keeps a dropped GPU type in the job's request "
            f"({', '.join(sorted(dropped))}): the job would get more GPUs or never start"
        )
    return None


def scontrol_steps(update: Update) -> list[list[str]]:
    """The ``scontrol update`` argument lists for one update, in order (testbed findings in
    PROTOCOL.md "Reservations and re-planning"): Slurm 22.05 refuses to turn an untyped GPU
    request into a typed one in one update ("Invalid GRES specification (with and without type
    identification)"), so such a job first moves its GPU count to an untyped per-job request
    (the count is never dropped, so the job can not start without GPUs), then gets the typed one.
    """
    fields = update.decision.set_fields
    head = ["update", f"JobId={update.job_id}"]
    final: list[str] = []
    for key, name in _KEYS.items():
        if key in fields:
            final.append(f"{name}={fields[key]}")
    low, high = fields.get("min_nodes"), fields.get("max_nodes")
    if low is not None:
        final.append(f"NumNodes={low}-{high}" if high not in (None, low) else f"NumNodes={low}")
    steps: list[list[str]] = []
    if update.decision.action == "route" and update.pending.kept_off:
        # Lift the advisor's exclusion first: the chosen nodes may be among the excluded ones.
        user = compress(sorted(node_set(update.pending.job.exc_nodes, "exc_nodes")))
        steps.append([*head, f"ExcNodeList={user}"])
    now = update.pending.tres_per_node or update.pending.tres_per_job
    new_typed = any(
        _is_gpu_typed(str(fields.get(k, ""))) for k in ("tres_per_node", "tres_per_job")
    )
    if transition_problem(update) is not None:
        return []
    if update.decision.action == "wait":
        return [*steps, [*head, *final]]
    if new_typed and now and not _is_gpu_typed(now):
        count = update.decision.allocation.n_gpus if update.decision.allocation else 1
        steps.append([*head, "TresPerNode=", f"TresPerJob=gres:gpu:{count}"])
        if "tres_per_job" not in fields:
            final.insert(0, "TresPerJob=")
    steps.append([*head, *final])
    return steps


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class ScontrolApplier:
    """Applies updates with ``scontrol`` (SLURM_CONF from ``env``); one failed job does not
    stop the others."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self.env = None if env is None else dict(env)
        self.timeout_s = timeout_s

    def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["scontrol", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    def apply(self, update: Update) -> str | None:
        """Run the steps; None on success, else the error text."""
        problem = transition_problem(update)
        if problem is not None:
            return problem
        for step in scontrol_steps(update):
            try:
                proc = self.run(step)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"scontrol {' '.join(step)}: {exc}"
            if proc.returncode != 0:
                return f"scontrol {' '.join(step)}: {proc.stderr.strip() or proc.returncode}"
        return None
