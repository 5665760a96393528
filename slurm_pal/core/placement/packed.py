"""Packed placement, Blox's ``_consolidated_placement`` (the Tiresias / Gandiva baselines of the
PAL paper): ignore PM-scores, pack.

1. a node whose usable free GPUs number exactly N (first in node order);
2. else the node with the fewest usable free GPUs that still holds N;
3. else span nodes, taking from the node with the most usable free GPUs first.

Inside a node the lowest local indices go first. With ``--gpus-per-node`` the same best-fit order
picks the nodes; with a node list or node bounds, required nodes come first, then the fullest.
"""

from __future__ import annotations

import numpy as np

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import PlacementResult
from slurm_pal.core.placement.pmfirst import constraint_text
from slurm_pal.core.placement.view import (
    RequestView,
    build_allocation,
    placed,
    prepare,
    unplaced,
)
from slurm_pal.core.request import PlacementRequest

__all__ = ["PackedPolicy"]


class PackedPolicy:
    """Best-fit consolidation, blind to variability."""

    name = "packed"

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"Packed: {view}")
        picked = self._pick(view)
        if picked is None:
            return unplaced(request, f"Packed: no free GPUs satisfy {constraint_text(request)}")
        gpus, how = picked
        allocation = build_allocation(
            view,
            gpus,
            lambda level, worst, nodes: (
                f"Packed: {how}, {nodes} (V={worst:.3g} L={level.penalty:g})"
            ),
        )
        return placed(allocation, request)

    @staticmethod
    def _pick(view: RequestView) -> tuple[np.ndarray, str] | None:
        shape = view.shape
        top = view.n_bins - 1
        free = view.usable_counts()
        nodes = np.arange(free.size)
        if shape.per_node is not None:
            assert shape.node_count is not None
            required = np.zeros(free.size, dtype=bool)
            required[shape.required] = True
            if (free[required] < shape.per_node).any():
                return None
            fits = np.flatnonzero((free >= shape.per_node) & ~required)
            fits = fits[np.lexsort((fits, free[fits]))]
            wanted = shape.node_count - shape.required.size
            if fits.size < wanted:
                return None
            chosen = np.concatenate((shape.required, fits[:wanted]))
            counts = np.full(chosen.size, shape.per_node)
            return view.take(chosen, counts, 0, top, by_score=False), "best-fit nodes"
        if shape.simple:
            exact = np.flatnonzero(free == shape.n)
            if exact.size:
                return _on_node(view, int(exact[0]), shape.n), "exact-fit node"
            fits = np.flatnonzero(free > shape.n)
            if fits.size:
                node = int(fits[np.argmin(free[fits])])
                return _on_node(view, node, shape.n), "smallest node that fits"
            order = nodes[np.lexsort((nodes, -free))]
            taken = np.cumsum(free[order])
            last = int(np.searchsorted(taken, shape.n))
            chosen = order[: last + 1]
            counts = free[chosen].copy()
            counts[-1] -= taken[last] - shape.n
            return view.take(chosen, counts, 0, top, by_score=False), "spread from the fullest"
        if (free[shape.required] < 1).any():
            return None
        others = np.flatnonzero((free > 0) & ~np.isin(nodes, shape.required))
        others = others[np.lexsort((others, -free[others]))]
        chosen = list(shape.required)
        total = int(free[shape.required].sum())
        for node in others:
            if total >= shape.n and len(chosen) >= shape.min_nodes:
                break
            chosen.append(int(node))
            total += int(free[node])
        if total < shape.n or len(chosen) < shape.min_nodes:
            return None
        if shape.max_nodes is not None and len(chosen) > shape.max_nodes:
            return None
        gpus = view.spread_pick(np.array(chosen, dtype=np.intp), top, by_score=False)
        return gpus, "required nodes, then the fullest"

    def __repr__(self) -> str:
        return "PackedPolicy()"


def _on_node(view: RequestView, node: int, n: int) -> np.ndarray:
    nodes = np.array([node], dtype=np.intp)
    return view.take(nodes, np.array([n]), 0, view.n_bins - 1, by_score=False)
