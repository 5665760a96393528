"""What a job's end means for the advisor when the job spanned several nodes.

Why: each node runs its own Epilog and sends its own record, naming only its node's GPUs.
The first of them to arrive starts the job-end round; that round must count every node the job
held as free (Slurm holds each node's GPUs until that node's Epilog ends, so planning them now
is as safe as planning the record's own node), and the records that follow need no round of
their own. The job's telemetry is one measurement of one job: the nodes' summaries are merged
into one, weighted by the busy time each node sampled, and the job history keeps that one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("slurm_pal.advisor")

__all__ = ["job_gpus", "merge_telemetry"]


def job_gpus(
    view: Any, job_id: int, recorded: Mapping[str, tuple[int, ...]] | None = None
) -> list[str] | None:
    """The UUIDs of every GPU ``job_id`` holds on any node, mapped through labels.json: as the
    view's last Slurm read shows them (``squeue --json``), else as the job's own records said
    for every node the read shows it on (``recorded``: node -> Slurm GPU indices, from its
    Prologs; the brief read has no indices). None when the view does not show the job (it
    started and ended between two reads) or its nodes' GPUs are not all known: then only each
    record's own node is known."""
    if view is None:
        return None
    job = view.job(job_id)
    if job is None:
        return None
    if job.allocated_gres:
        per_node: Mapping[str, tuple[int, ...]] = job.allocated_gpu_indices()
    elif job.nodes and set(job.nodes) <= set(recorded or {}):
        # every node the job holds, or none: a record of one node alone (its Epilog) must
        # not make this one end look like the whole job's
        per_node = {node: tuple((recorded or {})[node]) for node in job.nodes}
        if not _as_many_as_asked(job, per_node):
            return None
    else:
        return None
    if not per_node:
        return None
    labels = view.static.labels
    uuids = []
    for node, indices in per_node.items():
        for index in indices:
            try:
                uuids.append(labels.uuid_at_slurm_index(node, index))
            except KeyError:
                log.warning("job %d: GPU %d on %s not in labels.json", job_id, index, node)
    return uuids or None


def _as_many_as_asked(job: Any, per_node: Mapping[str, tuple[int, ...]]) -> bool:
    """Do the recorded indices add up to the GPUs the job asked for (per node, or in all)?
    A record naming fewer (Slurm 24.11's Prolog/Epilog environment on a multi-node job's
    other nodes) must not stand for the job's GPUs."""
    per_node_ask = sum(g.count for g in job.tres_per_node if g.name == "gpu")
    if per_node_ask:
        return all(len(ix) == per_node_ask for ix in per_node.values())
    per_job_ask = sum(g.count for g in job.tres_per_job if g.name == "gpu")
    return not per_job_ask or sum(len(ix) for ix in per_node.values()) == per_job_ask


def _weight(summary: Mapping[str, object]) -> float:
    """The busy time the summary stands for (sampled time x busy share), else its samples."""
    total = summary.get("weight_total")
    busy = summary.get("busy_fraction")
    if isinstance(total, int | float) and total > 0:
        share = float(busy) if isinstance(busy, int | float) else 1.0
        return float(total) * share
    samples = summary.get("samples", summary.get("measurements"))
    return float(samples) if isinstance(samples, int | float) and samples > 0 else 0.0


def merge_telemetry(records: Iterable[Mapping[str, object]]) -> dict[str, object] | None:
    """One job's telemetry from its Epilog records on every node: DRAM and FU utilization
    weighted by each node's busy time (equal weights when none has any), samples summed, the
    nodes listed. None when no record carries usable figures."""
    parts: list[tuple[str, Mapping[str, object]]] = []
    for record in records:
        summary = record.get("telemetry")
        if record.get("kind") != "epilog" or not isinstance(summary, Mapping):
            continue
        if not all(isinstance(summary.get(k), int | float) for k in ("dram_util", "fu_util")):
            continue
        parts.append((str(record.get("node")), summary))
    if not parts:
        return None
    if len(parts) == 1:
        return dict(parts[0][1])
    weights = [_weight(s) for _, s in parts]
    if sum(weights) <= 0:
        weights = [1.0] * len(parts)
    total = sum(weights)
    merged: dict[str, object] = dict(parts[0][1])
    for key in ("dram_util", "fu_util"):
        merged[key] = sum(w * float(s[key]) for w, (_, s) in zip(weights, parts, strict=True))  # type: ignore[arg-type,misc]
        merged[key] = round(float(merged[key]) / total, 6)  # type: ignore[arg-type]
    for key in ("samples", "measurements"):
        counts = [s.get(key) for _, s in parts]
        if all(isinstance(c, int) for c in counts):
            merged[key] = sum(counts)  # type: ignore[arg-type]
    times = [s.get("weight_total") for _, s in parts]
    if all(isinstance(t, int | float) for t in times):
        merged["weight_total"] = sum(times)  # type: ignore[arg-type]
    sources = {str(s.get("source")) for _, s in parts}
    merged["source"] = sources.pop() if len(sources) == 1 else "+".join(sorted(sources))
    merged.pop("busy_fraction", None)  # per node; the merged figures are already over busy time
    merged["nodes"] = sorted(node for node, _ in parts)
    return merged
