"""The submit-time advice for one job, given the view: the label rule, ``decide``, and the pass
that waits for GPUs to free (PROTOCOL.md ``decide``).

Pure: no lock, no store, no Slurm; the clock (``now``, epoch seconds) and the token are passed
in. :meth:`~slurm_pal.engine.engine.AdvisorEngine.submit` calls it; the service resolves the
class, asks the engine under its lock, reserves what a route holds and queues the store write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement import PlacementPolicy
from slurm_pal.engine.decide import (
    Decision,
    LabelTable,
    decide,
    format_admin_comment,
    labels_as_models,
)
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.settings import EngineSettings

__all__ = ["Advice", "advise", "label_policy", "plain_pass", "waiting_pass"]


@dataclass(frozen=True)
class Advice:
    """A decision, the job as decided on (a PM label translated to its model), and the state
    its stored decision starts in: ``reserved`` (its GPUs are held), ``waiting`` (re-planning
    routes it), or None (nothing to keep: a deny, a plain pass)."""

    decision: Decision
    job: JobDescription
    state: str | None


def advise(
    job: JobDescription,
    *,
    job_class: str | None,
    class_reason: str,
    cluster: Cluster,
    labels: LabelTable,
    partition_nodes: Mapping[str, Iterable[str]] | None,
    default_partition: str | None,
    settings: EngineSettings,
    policy: PlacementPolicy,
    version: str,
    token: str,
    now: float,
) -> Advice:
    """The advice for ``job`` on ``cluster`` (the view's free GPUs less the reservations; not
    changed here: the caller takes a route's GPUs)."""
    job, denied = label_policy(job, labels, settings)
    if denied is not None:
        return Advice(Decision("deny", MappingProxyType({}), job_class, denied), job, None)
    decision = decide(
        job,
        job_class=job_class,  # type: ignore[arg-type]
        class_reason=class_reason,
        cluster=cluster,
        labels=labels,
        policy=policy,
        version=version,
        token=token,
        partition_nodes=partition_nodes,
        default_partition=default_partition,
        leave_packing=settings.leave_packing,
        now=now,
    )
    if decision.allocation is not None:  # routed, or left to Slurm where it would go
        return Advice(decision, job, "reserved")
    if decision.action == "wait":
        return Advice(decision, job, "waiting")  # kept off GPUs the policy avoids
    if decision.retry and decision.request is not None:
        return Advice(waiting_pass(decision, token, version), job, "waiting")
    return Advice(decision, job, None)


def label_policy(
    job: JobDescription, labels: LabelTable, settings: EngineSettings
) -> tuple[JobDescription, str | None]:
    """``advisor.label_requests`` for a job that names a PM label itself (a user could
    otherwise pick the fastest bin): allow it, translate it to the label's GPU model (the
    job is then placed like any other; what is stored is the translated request), or deny
    it. The advisor's own users (``allowed_users``, root) are always allowed."""
    rule = settings.label_requests
    if rule == "allow" or job.user in settings.allowed_users or job.uid == 0:
        return job, None
    fields = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")
    named = {f: getattr(job, f) for f in fields if getattr(job, f)}
    translated = {f: labels_as_models(v, labels) for f, v in named.items()}
    if translated == named:
        return job, None
    if rule == "deny":
        return job, (
            "GPU types here are PM labels the advisor assigns; ask for the GPU model "
            f"instead ({', '.join(sorted(set(translated.values())))})"
        )
    return replace(job, **translated), None  # type: ignore[arg-type]


def waiting_pass(decision: Decision, token: str, version: str) -> Decision:
    """A pass because nothing fits now: its admin comment carries ``r=<token>`` so the
    re-planner finds the original request when GPUs free up (PROTOCOL.md deviation)."""
    fields = dict(decision.set_fields)
    fields["admin_comment"] = format_admin_comment(
        version=version,
        action="pass",
        token=token,
        job_class=decision.job_class,
        why=decision.reason,
    )
    return replace(decision, set_fields=MappingProxyType(fields), token=token)


def plain_pass(why: str, job_class: str | None, version: str) -> Decision:
    """A pass with nothing to advise with (no view yet, no campaign): the reason in its
    admin comment."""
    fields = {"admin_comment": format_admin_comment(version=version, action="pass", why=why)}
    return Decision("pass", MappingProxyType(fields), job_class, why)
