"""PM-First (PAL paper, Algorithm 1): the job's class gets the free GPUs with the lowest PM-scores.

Ties between equally scored GPUs go toward packing the way PAL's code breaks them: prefer the node
whose free GPUs of that score number closest to the job's size (``|count - N|``). A multi-GPU
allocation that spans nodes pays the penalty of the level it reaches in its LV product.

With user constraints the rule stays "lowest worst score first": the smallest score threshold
under which the constraints can be met, then packing (``--gpus-per-node``: the nodes whose best
GPUs are best; node bounds or a node list: the nodes with most usable GPUs).
"""

from __future__ import annotations

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import PlacementResult
from slurm_pal.core.placement.view import (
    RequestView,
    build_allocation,
    packed_within,
    placed,
    prepare,
    unplaced,
)
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import CLUSTER_RANK

__all__ = ["PMFirstPolicy", "PackTolerant", "constraint_text"]


def constraint_text(request: PlacementRequest) -> str:
    """The request's shape in Slurm words, for reasons."""
    parts = [f"{request.gpus} GPU(s)"]
    if request.gpus_per_node:
        parts.append(f"{request.gpus_per_node} per node")
    if request.min_nodes or request.max_nodes:
        parts.append(f"nodes {request.min_nodes or 1}-{request.max_nodes or ''}".rstrip("-"))
    if request.required_nodes:
        parts.append(f"on {', '.join(sorted(request.required_nodes))}")
    return ", ".join(parts)


def pmfirst_place(view: RequestView, label: str) -> PlacementResult:
    """The PM-First decision on a prepared view (shared with PAL for N == 1)."""
    first = view.first_bins(CLUSTER_RANK)
    bin_index = int(first[0])
    if bin_index >= view.n_bins:
        return unplaced(
            view.request,
            f"{label}: no free GPUs satisfy {constraint_text(view.request)}",
        )
    gpus = view.select(CLUSTER_RANK, 0, bin_index)
    allocation = build_allocation(
        view,
        gpus,
        lambda level, worst, nodes: (
            f"{label}: best {view.shape.n} free GPU(s) for class {view.request.job_class}, "
            f"V={worst:.3g} L={level.penalty:g} ({level.name}), {nodes}"
        ),
    )
    return placed(allocation, view.request)


class PackTolerant:
    """A policy with a ``pack_tolerance``: the LV product it accepts worse than the best (0.02
    = 2 %) to pack the job on the fullest node that allows it (PM-First and PAL share it)."""

    def __init__(self, pack_tolerance: float = 0.0) -> None:
        if not pack_tolerance >= 0:
            raise ValueError(f"pack_tolerance must be >= 0, got {pack_tolerance}")
        self.pack_tolerance = float(pack_tolerance)


class PMFirstPolicy(PackTolerant):
    """PM-First placement: variability first, packing only to break ties.

    ``pack_tolerance`` (default 0: the paper) accepts an LV product that much worse than the
    best (0.02 = 2 %) to pack the job on the fullest node that allows it; see
    :func:`slurm_pal.core.placement.view.consolidate` for why Slurm needs it.
    """

    name = "pm-first"

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"PM-First: {view}")
        return packed_within(view, pmfirst_place(view, "PM-First"), self.pack_tolerance, "PM-First")

    def __repr__(self) -> str:
        return f"PMFirstPolicy(pack_tolerance={self.pack_tolerance:g})"
