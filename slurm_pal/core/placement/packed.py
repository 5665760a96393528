"""Packed placement, Blox's ``_consolidated_placement`` (the Tiresias / Gandiva baselines of the
PAL paper): ignore PM-scores, pack.

1. a node whose usable free GPUs number exactly N (first in node order);
2. else the node with the fewest usable free GPUs that still holds N;
3. else span nodes, taking from the node with the most usable free GPUs first.

Inside a node the GPUs go in the node's order (``GpuSpec.order``: Slurm's numbering in the
advisor), as cons_tres gives the lowest free first. A job of GPUs per node (``--gres=gpu:g``
on one node or ``-N k``) gets cons_tres's nodes instead: the tightest block of consecutive
usable nodes, then the best fit inside it (:func:`consecutive_best_fit`); with a node list or
node bounds, required nodes come first, then the fullest.
"""

from __future__ import annotations

from collections.abc import Callable

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
    """Best-fit consolidation, blind to variability.

    ``shuffle_seed`` makes it the PM-blind null of the production benchmark: the same nodes and
    per-node counts, the GPUs inside them taken in a seeded random order. It shows how much a
    placement that changes only *which GPUs of a node* moves results by chance (the queue's own
    noise), next to which a PM-aware placement is judged.
    """

    name = "packed"

    def __init__(self, shuffle_seed: int | None = None) -> None:
        self.shuffle_seed = shuffle_seed
        self.rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        label = "Packed" if self.rng is None else "Packed (GPUs of a node shuffled)"
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"{label}: {view}")
        picked = pack_pick(view, rng=self.rng)
        if picked is None:
            return unplaced(request, f"{label}: no free GPUs satisfy {constraint_text(request)}")
        gpus, how = picked
        allocation = build_allocation(
            view,
            gpus,
            lambda level, worst, nodes: (
                f"{label}: {how}, {nodes} (V={worst:.3g} L={level.penalty:g})"
            ),
        )
        return placed(allocation, request, as_packing=self.rng is None)

    def __repr__(self) -> str:
        if self.shuffle_seed is None:
            return "PackedPolicy()"
        return f"PackedPolicy(shuffle_seed={self.shuffle_seed})"


NodeTake = Callable[[RequestView, np.ndarray, np.ndarray], np.ndarray]
"""Which GPUs to take inside chosen nodes: (view, nodes, per-node counts) -> GPU rows."""


def pack_pick(
    view: RequestView,
    *,
    by_score: bool = False,
    rng: np.random.Generator | None = None,
    node_take: NodeTake | None = None,
    node_rank: np.ndarray | None = None,
) -> tuple[np.ndarray, str] | None:
    """Packing's GPUs for the request (None: they do not fit) and how they were chosen.

    The nodes and per-node counts are always packing's; inside a node the GPUs go in the
    node's order, by score for the job's class (``by_score``), in ``rng``'s random order, or as
    ``node_take`` chooses. Only GPUs of bins up to ``view.top`` are used. ``node_rank`` (lower
    first) breaks ties between nodes packing finds equal (as many usable free GPUs) before node
    order does.
    """
    shape = view.shape
    top = view.top
    free = view.usable_counts()
    nodes = np.arange(free.size)
    rank = np.zeros(free.size, dtype=np.int64) if node_rank is None else node_rank

    def take(chosen: np.ndarray, counts: np.ndarray) -> np.ndarray:
        if node_take is not None:
            return node_take(view, chosen, counts)
        if rng is None:
            return view.take(chosen, counts, 0, top, by_score=by_score)
        usable = view.usable_gpus(chosen)
        return np.concatenate(
            [rng.permutation(gpus)[:count] for gpus, count in zip(usable, counts, strict=True)]
        )

    if shape.per_node is not None:
        assert shape.node_count is not None
        required = np.zeros(free.size, dtype=bool)
        required[shape.required] = True
        if (free[required] < shape.per_node).any():
            return None
        usable = (free >= shape.per_node) & ~required
        wanted = shape.node_count - shape.required.size
        if int(usable.sum()) < wanted:
            return None
        if node_rank is None and not shape.required.size:
            chosen = consecutive_best_fit(usable, free, wanted)
            counts = np.full(chosen.size, shape.per_node)
            how = "best-fit block of consecutive nodes" if wanted > 1 else "best-fit node"
            return take(chosen, counts), f"{how} of the tightest block"
        fits = np.flatnonzero(usable)
        fits = fits[np.lexsort((fits, rank[fits], free[fits]))]
        chosen = np.concatenate((shape.required, fits[:wanted]))
        counts = np.full(chosen.size, shape.per_node)
        return take(chosen, counts), "best-fit nodes"
    if shape.simple:
        exact = np.flatnonzero(free == shape.n)
        if exact.size:
            node = int(exact[np.argmin(rank[exact])])
            return take(np.array([node]), np.array([shape.n])), "exact-fit node"
        fits = np.flatnonzero(free > shape.n)
        if fits.size:
            fits = fits[free[fits] == free[fits].min()]
            node = int(fits[np.argmin(rank[fits])])
            return take(np.array([node]), np.array([shape.n])), "smallest node that fits"
        order = nodes[np.lexsort((nodes, rank, -free))]
        taken = np.cumsum(free[order])
        last = int(np.searchsorted(taken, shape.n))
        chosen = order[: last + 1]
        counts = free[chosen].copy()
        counts[-1] -= taken[last] - shape.n
        return take(chosen, counts), "spread from the fullest"
    if (free[shape.required] < 1).any():
        return None
    others = np.flatnonzero((free > 0) & ~np.isin(nodes, shape.required))
    others = others[np.lexsort((others, rank[others], -free[others]))]
    chosen_list = list(shape.required)
    total = int(free[shape.required].sum())
    for node in others:  # type: ignore[assignment]
        if total >= shape.n and len(chosen_list) >= shape.min_nodes:
            break
        chosen_list.append(int(node))
        total += int(free[node])
    if total < shape.n or len(chosen_list) < shape.min_nodes:
        return None
    if shape.max_nodes is not None and len(chosen_list) > shape.max_nodes:
        return None
    gpus = view.spread_pick(np.array(chosen_list, dtype=np.intp), top, by_score=by_score)
    return gpus, "required nodes, then the fullest"


def consecutive_best_fit(usable: np.ndarray, weight: np.ndarray, wanted: int) -> np.ndarray:
    """The ``wanted`` nodes cons_tres gives a job of GPUs per node (``--gres=gpu:g``, on one
    node or ``-N k``): Slurm's ``_eval_nodes`` cuts the usable nodes into blocks of consecutive
    node indices, takes the block that fits the job most tightly (the least ``weight`` among
    blocks with enough nodes, the first on ties; while none has enough, the largest), fills the
    job from that block's first node, and repeats for what is left; when one node is left to
    find, it takes the block's best-fit node (the least ``weight``, the first on ties).

    Why it matters: with nodes 1 and 5-8 free, a 2-node job gets nodes 5 and 6, not 1 and 5;
    and with node 4 of 5 full, a one-node job goes to node 5 though nodes 1-3 are fuller (node
    5 alone is the tighter block). A model that took the fullest nodes put the testbed's jobs
    elsewhere than Slurm did, on other GPUs. ``weight`` stands for the free CPUs Slurm weighs
    (the free GPUs: on GPU nodes they go together); the caller checked that enough nodes are
    usable."""
    flags = np.concatenate(([False], usable.astype(bool), [False]))
    edges = np.flatnonzero(flags[1:] != flags[:-1])
    starts, ends = edges[0::2], edges[1::2]
    if not starts.size:
        return np.array([], dtype=np.intp)
    cumulative = np.concatenate(([0], np.cumsum(weight, dtype=np.int64)))
    totals = cumulative[ends] - cumulative[starts]
    if wanted == 1:  # every block suffices: the first tightest, then its best fit
        tightest = int(np.argmin(totals))
        first, last = int(starts[tightest]), int(ends[tightest])
        return np.array([first + int(np.argmin(weight[first:last]))], dtype=np.intp)
    blocks = [[s, e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    weights = totals.tolist()
    chosen: list[int] = []
    remaining = wanted
    while remaining > 0:
        best: list[int] | None = None
        best_weight, best_sufficient = 0, False
        for block, total in zip(blocks, weights, strict=True):
            size = block[1] - block[0]
            if size <= 0:
                continue
            sufficient = size >= remaining
            # Slurm's test as written: a later block that does not suffice replaces any best
            # with fewer free CPUs, even one that suffices
            if (
                best is None
                or (sufficient and not best_sufficient)
                or (sufficient and total < best_weight)
                or (not sufficient and total > best_weight)
            ):
                best, best_weight, best_sufficient = block, total, sufficient
        if best is None:
            break
        if remaining == 1:
            inside = weight[best[0] : best[1]]
            chosen.append(best[0] + int(np.argmin(inside)))
            break
        take = min(remaining, best[1] - best[0])
        chosen.extend(range(best[0], best[0] + take))
        remaining -= take
        best[0] = best[1]  # a block is used once, as Slurm empties it
    return np.array(chosen, dtype=np.intp)
