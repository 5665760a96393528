"""The advisor's view of the cluster, built from one Slurm read: which GPUs are busy, which
nodes are left out (down, drained, gres unlike labels.json), when busy GPUs free, and the steered
pending jobs a round re-plans.

Pure: Slurm's answers come in as data (``JobState``/``NodeState`` of ``adapters/slurm/state.py``,
read by attribute only), nothing here reads Slurm or the store (new steered jobs' requests are
looked up through a function passed in), and the time of the read is passed in. Log lines are
its only side effect. :class:`~slurm_pal.advisor.state.AdvisorState` reads Slurm and swaps
the views in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.gres import compare_gres
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology
from slurm_pal.engine.decide import LabelTable, parse_admin_comment
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import (
    PendingJob,
    RequestKey,
    replannable,
    requests_of,
    steered_job,
)

if TYPE_CHECKING:
    from slurm_pal.adapters.slurm.state import JobState, NodeState

__all__ = [
    "UNAVAILABLE_FLAGS",
    "UNAVAILABLE_STATES",
    "Static",
    "SteeredQueue",
    "View",
    "expect_ends",
    "node_unavailable",
    "static_from",
    "view_from",
]

log = logging.getLogger("slurm_pal.advisor")

UNAVAILABLE_STATES = frozenset({"down", "drained", "drain", "fail", "future", "unknown"})
UNAVAILABLE_FLAGS = frozenset(
    {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "MAINTENANCE"}
)


def node_unavailable(node: NodeState) -> str | None:
    """Why a node's GPUs cannot be given out now (down, drained, ...), or None."""
    if node.state in UNAVAILABLE_STATES:
        return f"state {node.state}"
    bad = sorted(set(node.flags) & UNAVAILABLE_FLAGS)
    return f"state {node.state}+{'+'.join(bad)}" if bad else None


@dataclass(frozen=True)
class Static:
    """What changes only on reload: campaign, labels, scores (the cluster with every GPU free)."""

    campaign: str
    labels: LabelTable
    specs: tuple[GpuSpec, ...]
    class_order: tuple[str, ...]
    features: Mapping[str, frozenset[str]]
    cluster: Cluster
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class View:
    """One refresh: the static part plus what Slurm said (``base``: Slurm's busy GPUs marked,
    no reservations)."""

    static: Static
    base: Cluster
    taken: float  # clock time of the Slurm read
    excluded: Mapping[str, str]  # node -> why its GPUs are not routed to
    partition_nodes: Mapping[str, tuple[str, ...]] | None
    default_partition: str | None
    jobs: tuple[JobState, ...]
    busy: frozenset[str] = frozenset()
    # The steered pending jobs Slurm would start, in priority order, and each one's placement
    # request, as this read shows them: worked out by the refresh thread, so that a job-end
    # round (an Epilog waits for it) does not walk every pending job again.
    pending: tuple[PendingJob, ...] = ()
    requests: Mapping[RequestKey, PlacementRequest | None] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # token -> the job carrying it in its admin comment (every state): parsed once per read,
    # off the lock decides take
    by_token: Mapping[str, JobState] = field(default_factory=lambda: MappingProxyType({}))
    # job id -> the job: an Epilog's record looks its job up (twice), 48 at once in a storm
    by_id: Mapping[int, JobState] = field(default_factory=lambda: MappingProxyType({}))

    def job(self, job_id: int) -> JobState | None:
        """The job with this id as this read shows it (None: not shown)."""
        if self.by_id or not self.jobs:
            return self.by_id.get(job_id)
        return next((j for j in self.jobs if j.job_id == job_id), None)


def expect_ends(cluster: Cluster, jobs: Sequence[JobState], labels: LabelTable) -> None:
    """When each busy GPU is expected to free: its job's planned end (start + time limit, as
    Slurm reports it; never for an unlimited job). A GPU whose job is not known by index gets
    the latest planned end of the running jobs on its node; one with none stays unknown
    (``inf``), which never justifies a wait."""
    latest: dict[str, float] = {}
    unindexed: set[str] = set()
    for job in jobs:
        if job.state != "RUNNING" or not job.nodes:
            continue
        end = job.end_time if job.time_limit_s != math.inf else None
        when = end if end is not None else math.inf
        limit = job.time_limit_s
        since = when - limit if limit is not None and math.isfinite(limit) else math.nan
        indices = job.allocated_gpu_indices()
        for node in job.nodes:
            latest[node] = max(latest.get(node, -math.inf), when)
            if node not in job.allocated_gres:
                unindexed.add(node)
            if node not in cluster.node_index:
                continue
            for index in indices.get(node, ()):
                try:
                    gpu = cluster.uuid_index.get(labels.uuid_at_slurm_index(node, index))
                except KeyError:
                    continue
                if gpu is not None and not cluster.free[gpu]:
                    cluster.busy_until[gpu] = when
                    cluster.busy_since[gpu] = since
    for node in unindexed:
        row = cluster.node_index.get(node)
        if row is None:
            continue
        gpus = [g for g in cluster.node_gpus[row] if g >= 0 and not cluster.free[g]]
        unknown = [g for g in gpus if math.isinf(cluster.busy_until[g])]
        if unknown:
            cluster.busy_until[unknown] = latest[node]


def static_from(
    campaign: str,
    labels: LabelTable,
    specs: Iterable[GpuSpec],
    skipped: Iterable[str],
    features: Mapping[str, frozenset[str]],
    *,
    topology: Topology,
    class_names: Sequence[str],
) -> Static:
    """The static part of the view: the cluster with every GPU free, its classes in the
    configured order (``class_names`` first, then the others by name), each node's GPUs in
    Slurm's numbering (labels.json's ``slurm_index``): cons_tres gives a job the lowest free
    ones, so packing's own pick, a job left to Slurm, is where Slurm puts it."""
    specs = tuple(
        replace(
            s,
            node_features=features.get(s.node, frozenset()),
            order=labels.slurm_index(s.node, s.index),
        )
        for s in specs
    )
    classes = {c for s in specs for c in s.scores}
    order = tuple(c for c in class_names if c in classes) + tuple(
        sorted(classes - set(class_names))
    )
    cluster = Cluster.from_gpus(specs, topology, class_order=order)
    return Static(
        campaign,
        labels,
        specs,
        order,
        MappingProxyType(dict(features)),
        cluster,
        tuple(skipped),
    )


def view_from(
    static: Static,
    nodes: list[NodeState],
    jobs: list[JobState],
    taken: float,
    default_partition: str | None,
) -> tuple[View, tuple[str, ...]]:
    """One Slurm read (``nodes``, ``jobs``, taken at ``taken``) on ``static``: the view, and the
    nodes left out because their gres differs from labels.json (one text per node)."""
    cluster = static.cluster
    labels = static.labels
    excluded: dict[str, str] = {}
    live = {n.name: n for n in nodes}
    expected: dict[str, dict[str, int]] = {}
    for e in labels.entries:
        if e.node in cluster.node_index:
            counts = expected.setdefault(e.node, {})
            counts[e.label] = counts.get(e.label, 0) + 1
    _, diffs = compare_gres(expected, {n: live[n].gpu_types() for n in live})
    for d in diffs:
        excluded[d.node] = (
            "unknown to Slurm" if d.live is None else f"gres {d.live} != labels {d.expected}"
        )
    mismatched = tuple(f"{n}: {why}" for n, why in sorted(excluded.items()))
    for name, node in live.items():
        why = node_unavailable(node)
        if why is not None and name in cluster.node_index:
            excluded.setdefault(name, why)
    busy: set[str] = set()
    for name, node in live.items():
        if name not in cluster.node_index or name in excluded:
            continue
        for _type, indices in node.used_gpu_indices().items():
            for slurm_index in indices:
                try:
                    busy.add(labels.uuid_at_slurm_index(name, slurm_index))
                except KeyError as exc:
                    log.warning("busy GPU not in labels.json: %s", exc.args[0])
    for name in excluded:
        for gpu in cluster.node_gpus[cluster.node_index[name]]:
            if gpu >= 0:
                busy.add(cluster.uuids[gpu])
    base = cluster.copy()
    ids = sorted(cluster.uuid_index[u] for u in busy if u in cluster.uuid_index)
    if ids:
        base.allocate(ids)
    expect_ends(base, jobs, labels)
    partitions: dict[str, list[str]] = {}
    for node in nodes:
        for p in node.partitions:
            partitions.setdefault(p, []).append(node.name)
    view = View(
        static=static,
        base=base,
        taken=taken,
        excluded=MappingProxyType(excluded),
        partition_nodes=MappingProxyType({p: tuple(v) for p, v in partitions.items()})
        if partitions
        else None,
        default_partition=default_partition,
        jobs=tuple(jobs),
        busy=frozenset(busy),
    )
    return view, mismatched


class SteeredQueue:
    """The steered pending jobs of each read, with what the last read parsed kept for the jobs
    Slurm shows unchanged (used by the refresh thread only)."""

    def __init__(self) -> None:
        # The last read's parsed admin comments and steered pending jobs
        self._cache: tuple[
            dict[str, dict[str, str] | None], dict[tuple[object, ...], PendingJob]
        ] = ({}, {})

    def with_queue(
        self,
        view: View,
        previous: View | None,
        lookup: Callable[[list[str]], Mapping[str, tuple[JobDescription, str]]],
    ) -> View:
        """``view`` with its steered pending queue and their placement requests (each job's GPU
        ask is read once: the previous view's requests are reused while the campaign is the
        same). ``lookup(tokens)``: the decided request and class of each new steered job."""
        # What the last read worked out is reused for every job Slurm shows unchanged: at
        # 10,000 pending jobs, parsing each admin comment and building each job again cost
        # 0.14 s per read, most of a read's own work.
        comments, known_jobs = self._cache
        parsed_now: dict[str, dict[str, str] | None] = {}
        jobs_now: dict[tuple[object, ...], PendingJob] = {}
        steered: list[tuple[JobState, dict[str, str], tuple[object, ...]]] = []
        by_token: dict[str, JobState] = {}
        for job in view.jobs:
            text = job.admin_comment
            if not text:
                continue
            if text in parsed_now:
                parsed = parsed_now[text]
            else:
                parsed = comments[text] if text in comments else parse_admin_comment(text)
                parsed_now[text] = parsed
            if parsed is None or not parsed.get("r"):
                continue
            by_token[parsed["r"]] = job
            released = "released" in parsed  # handed back to Slurm: no round routes it again
            if (
                job.state == "PENDING"
                and not released
                and replannable(job.reason, parsed["action"] == "wait")
            ):
                key = (
                    job.job_id,
                    text,
                    job.tres_per_node,
                    job.tres_per_job,
                    job.priority,
                    job.time_limit_s,
                )
                steered.append((job, parsed, key))
        by_id = MappingProxyType({job.job_id: job for job in view.jobs})
        view = replace(view, by_token=MappingProxyType(by_token), by_id=by_id)
        if not steered:
            self._cache = (parsed_now, jobs_now)
            return view
        new = [p["r"] for _, p, key in steered if key not in known_jobs]
        known = lookup(new) if new else {}
        pending = []
        for job, parsed, key in steered:  # type: ignore[assignment]
            same = known_jobs.get(key)
            if same is None:
                found = known.get(parsed["r"])
                if found is None:
                    continue
                original, job_class = found
                same = steered_job(job, parsed, original, job_class)
            jobs_now[key] = same
            pending.append(same)
        self._cache = (parsed_now, jobs_now)
        pending.sort(key=lambda p: (-p.priority, p.job_id))
        reuse = previous is not None and previous.static.campaign == view.static.campaign
        cache: dict[RequestKey, PlacementRequest | None] = {}
        if reuse:
            assert previous is not None
            old = previous.requests
            for p in pending:
                request_key = (p.token, p.job_id, p.job_class)
                if request_key in old:
                    cache[request_key] = old[request_key]
        requests_of(pending, labels=view.static.labels, cluster=view.base, known=cache)
        return replace(view, pending=tuple(pending), requests=MappingProxyType(cache))
