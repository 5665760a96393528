"""Routes Slurm does not start: a routed job left pending while the GPUs it was pinned to stand
free is handed back to Slurm as its user wrote it (pure: the service runs it after each read).

Why: a route is a promise that the job starts on those GPUs as soon as they are free, and the
advisor bounds every wait it causes. Slurm can refuse that promise for reasons the advisor does
not model: 24.11 with ``DefCpuPerGPU`` never starts a job whose per-node request names several
GPU types (``Reason=Resources`` on an idle node; found on the testbed), and CPUs, memory,
licences or a reservation can keep a job off GPUs that are free. Without this the job would
wait, pinned, for ever. A route pending for resources (:func:`waits_for_resources`) on free GPUs
for ``advisor.route_stall_s`` is released: its GPU request, node list and node count go back to
the user's, its admin comment becomes a ``pass`` marked ``released=`` (no round routes it
again), and Slurm places it as it would have without the advisor. Slurm 22.05 cannot turn a
typed GPU request back into an untyped one (:func:`slurm_pal.core.jobchange.transition_problem`):
there the service can only log it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_pal.core.jobchange import JobChange
from slurm_pal.core.labels import LabelTable
from slurm_pal.engine.decide import format_admin_comment, translate_model_types
from slurm_pal.engine.replan import PendingJob

__all__ = ["StallClock", "free_labels", "release_change", "stands_free", "waits_for_resources"]

#: Pending reasons that say Slurm looked for resources and found none: a route pending with one
#: of these while its GPUs stand free is one Slurm will not start. Other reasons (a QOS or
#: association limit, a down node, a partition's limit) keep the job back wherever it is routed.
#: 24.11 resets a pending job's reason to None at each update, the advisor's own included.
RESOURCE_REASONS = frozenset({"Resources", "Priority", "None", ""})


def waits_for_resources(reason: str) -> bool:
    """Is a pending job with this Slurm reason waiting for resources (not for a limit)?"""
    return reason in RESOURCE_REASONS


def free_labels(labels: LabelTable, busy: Iterable[str]) -> dict[str, Counter[str]]:
    """Per node, how many GPUs of each label Slurm shows free (``busy``: the UUIDs in use, or
    on nodes the advisor does not route to)."""
    taken = frozenset(busy)
    free: dict[str, Counter[str]] = {}
    for entry in labels.entries:
        if entry.uuid not in taken:
            free.setdefault(entry.node, Counter())[entry.label] += 1
    return free


def stands_free(route: Mapping[str, tuple[str, ...]], free: Mapping[str, Counter[str]]) -> bool:
    """Are all the GPUs a route pins the job to free (each node's labels, with their counts)?"""
    if not route:
        return False
    for node, wanted in route.items():
        have = free.get(node, Counter())
        if any(have[label] < n for label, n in Counter(wanted).items()):
            return False
    return True


@dataclass
class StallClock:
    """Since when each routed pending job has stood on free GPUs, across reads: a job that
    starts, leaves the queue, is re-routed or finds its GPUs taken starts over."""

    after_s: float
    _since: dict[tuple[int, str], float]

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since = {}

    def due(
        self, pending: Iterable[PendingJob], free: Mapping[str, Counter[str]], now: float
    ) -> list[tuple[PendingJob, float]]:
        """The routed jobs of ``pending`` (one read's steered queue) that have stood on free
        GPUs for ``after_s`` or more by ``now``, with how long; none when ``after_s`` is 0
        (off)."""
        if self.after_s <= 0:
            self._since = {}
            return []
        seen: dict[tuple[int, str], float] = {}
        due = []
        for job in pending:
            if job.current is None or job.waiting is not None:
                continue  # passed untyped or held: nothing of the advisor's to stand on
            if not stands_free(job.current, free):
                continue
            key = (job.job_id, repr(sorted(job.current.items())))
            since = self._since.get(key, now)
            seen[key] = since
            if now - since >= self.after_s:
                due.append((job, now - since))
        self._since = seen
        return due


def release_change(
    job: PendingJob, labels: LabelTable, *, version: str, stood_s: float, now: float
) -> JobChange:
    """The update that hands ``job`` back to Slurm: the user's GPU request (model types dropped,
    as a pass writes it) and node list, the node count where the user gave one (else the
    route's, which the request fits), and a ``pass`` comment that keeps the job's token and
    class (its records still find its decision) and says why."""
    user = job.job
    fields: dict[str, str | int] = {
        "tres_per_node": translate_model_types(user.tres_per_node or "", labels),
        "tres_per_job": translate_model_types(user.tres_per_job or "", labels),
        "req_nodes": user.req_nodes or "",
    }
    if user.min_nodes is not None:
        fields["min_nodes"] = user.min_nodes
        fields["max_nodes"] = user.max_nodes if user.max_nodes is not None else user.min_nodes
    fields["admin_comment"] = format_admin_comment(
        version=version,
        action="pass",
        why=(
            f"routed, but Slurm left it pending {stood_s:.0f} s while its GPUs were free: "
            "released to Slurm as written"
        ),
        token=job.token,
        job_class=job.job_class,
        released=now,
    )
    return JobChange(
        job_id=job.job_id,
        fields=fields,
        held_tres=job.tres_per_node or job.tres_per_job,
    )
