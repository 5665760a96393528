"""A request's view of the cluster, and the vectorized steps the policies are built from.

Everything here works on ``counts``: free GPUs the request may use, per (node, score bin) of its
class, and on their cumulative sums over bins (``cum[node, b]`` = usable GPUs of the node with a
score of at most ``bin_scores[b]``). Two facts make this enough:

- the best set of N GPUs inside any group of GPUs (a node, a switch, the cluster) under a score
  threshold is its N best GPUs: a set's slowest GPU is minimized by taking the smallest scores, so
  no combination is ever enumerated;
- feasibility is monotone in the threshold, so "the smallest bin at which a group can hold the
  job" is a count of bins where it cannot: ``(cum < N).sum(axis=1)``.

Groups are the units of a locality level: each node (rank 0), each leaf switch (rank 1), the
whole cluster (rank 2). A group's "first bin" is the smallest bin at which it can hold the job
(``n_bins`` when it never can).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from slurm_pal.core.cluster import ClassScores, Cluster
from slurm_pal.core.hostlist import compress
from slurm_pal.core.placement.base import Allocation, PlacementResult
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import CLUSTER_RANK, NODE_RANK, SWITCH_RANK

__all__ = [
    "RequestView",
    "Shape",
    "build_allocation",
    "describe_nodes",
    "placed",
    "prepare",
    "unplaced",
]

IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]
_EMPTY = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True, eq=False)
class Shape:
    """The request's GPU and node counts in cluster terms (``required`` are node ids)."""

    n: int
    per_node: int | None
    node_count: int | None
    min_nodes: int
    max_nodes: int | None
    required: IntArray

    @property
    def simple(self) -> bool:
        """Only a GPU count: PM-First's own tie-breaking applies."""
        return (
            self.per_node is None
            and not self.required.size
            and self.max_nodes is None
            and self.min_nodes <= 1
        )


def unplaced(request: PlacementRequest, reason: str) -> PlacementResult:
    return PlacementResult(request, None, reason)


def placed(allocation: Allocation, request: PlacementRequest) -> PlacementResult:
    return PlacementResult(request, allocation, allocation.reason)


class RequestView:
    """Eligible free GPUs of one request's class, as per-(node, bin) counts."""

    __slots__ = ("cluster", "counts", "cum", "gpu_model", "klass", "n_bins", "request", "shape")

    def __init__(
        self,
        request: PlacementRequest,
        cluster: Cluster,
        shape: Shape,
        counts: NDArray[np.int32],
        gpu_model: int | None,
    ) -> None:
        self.request = request
        self.cluster = cluster
        self.klass: ClassScores = cluster.classes[request.job_class]
        self.shape = shape
        self.counts = counts
        self.cum = np.cumsum(counts, axis=1)
        self.n_bins = self.klass.n_bins
        self.gpu_model = gpu_model

    # --- groups ----------------------------------------------------------------------------

    def n_groups(self, rank: int) -> int:
        if rank == NODE_RANK:
            return self.cluster.n_nodes
        if rank == SWITCH_RANK:
            return len(self.cluster.switch_names)
        return 1

    def group_of_nodes(self, rank: int, nodes: IntArray) -> IntArray:
        if rank == NODE_RANK:
            return nodes
        if rank == SWITCH_RANK:
            return self.cluster.node_switch[nodes]
        return np.zeros(nodes.size, dtype=np.intp)

    def group_rows(self, rank: int, group: int) -> IntArray:
        """The node ids of one group, ascending."""
        if rank == NODE_RANK:
            return np.array([group], dtype=np.intp)
        if rank == SWITCH_RANK:
            return np.flatnonzero(self.cluster.node_switch == group)
        return np.arange(self.cluster.n_nodes, dtype=np.intp)

    def group_sum(self, rank: int, per_node: np.ndarray) -> np.ndarray:
        """Sum a per-node array (1-D or nodes x bins) over the groups of a level."""
        if rank == NODE_RANK:
            return per_node
        if rank == SWITCH_RANK:
            cluster = self.cluster
            return np.add.reduceat(
                per_node[cluster.switch_node_order], cluster.switch_starts, axis=0
            )
        return per_node.sum(axis=0, keepdims=True)

    # --- feasibility -------------------------------------------------------------------------

    def first_bins(self, rank: int) -> IntArray:
        """Per group of the level: the smallest bin at which it can hold the job, or n_bins."""
        shape, cum, n_bins = self.shape, self.cum, self.n_bins
        never = np.full(self.n_groups(rank), n_bins, dtype=np.intp)
        if shape.required.size:
            groups = np.unique(self.group_of_nodes(rank, shape.required))
            if groups.size == 1:
                never[groups[0]] = self._general_first(self.group_rows(rank, int(groups[0])))
            return never
        if shape.per_node is not None:
            assert shape.node_count is not None
            if rank == NODE_RANK and shape.node_count > 1:
                return never
            usable = (cum >= shape.per_node).astype(np.int32)
            return (self.group_sum(rank, usable) < shape.node_count).sum(axis=1)
        if rank == NODE_RANK:
            return never if shape.min_nodes > 1 else (cum < shape.n).sum(axis=1)
        first = (self.group_sum(rank, cum) < shape.n).sum(axis=1)
        if shape.simple:
            return first
        for group in np.flatnonzero(first < n_bins):
            first[group] = self._general_first(self.group_rows(rank, int(group)))
        return first

    def _general_first(self, rows: IntArray) -> int:
        """First bin for one group under every constraint (required nodes, node bounds)."""
        shape = self.shape
        cum = self.cum[rows]
        required = np.isin(rows, shape.required)
        if shape.required.size and required.sum() != shape.required.size:
            return self.n_bins
        if shape.per_node is not None:
            assert shape.node_count is not None
            usable = cum >= shape.per_node
            feasible = usable[required].all(axis=0) & (usable.sum(axis=0) >= shape.node_count)
        else:
            nonzero = cum >= 1
            if shape.max_nodes is None:
                capacity = cum.sum(axis=0)
            else:
                slots = shape.max_nodes - int(required.sum())
                others = -np.sort(-cum[~required], axis=0)[:slots].sum(axis=0)
                capacity = cum[required].sum(axis=0) + others
            feasible = (
                nonzero[required].all(axis=0)
                & (capacity >= shape.n)
                & (nonzero.sum(axis=0) >= shape.min_nodes)
            )
        return int(np.argmax(feasible)) if feasible.any() else self.n_bins

    def best_group(self, rank: int, first: IntArray, bin_index: int) -> int:
        """Among groups that can hold the job at ``bin_index``, the best fit: fewest free GPUs
        left after placing it, then the lowest id."""
        candidates = np.flatnonzero(first <= bin_index)
        if candidates.size == 1:
            return int(candidates[0])
        free_left = self.group_sum(rank, self.cluster.node_free)[candidates]
        return int(candidates[np.argmin(free_left)])

    # --- picking GPUs --------------------------------------------------------------------------

    def take(
        self, nodes: IntArray, counts: IntArray, low_bin: int, high_bin: int, *, by_score: bool
    ) -> IntArray:
        """From each node, its first ``counts[i]`` usable GPUs with a bin in [low, high]:
        best score first (``by_score``) or lowest local index first."""
        if not nodes.size:
            return _EMPTY
        cluster = self.cluster
        slots = cluster.node_gpus[nodes]
        valid = slots >= 0
        safe = np.where(valid, slots, 0)
        bins = self.klass.bin_of[safe]
        usable = valid & cluster.free[safe] & (bins >= low_bin) & (bins <= high_bin)
        if self.gpu_model is not None:
            usable &= cluster.gpu_model[safe] == self.gpu_model
        width = slots.shape[1]
        key = np.arange(width) + (bins * width if by_score else 0)
        key = np.where(usable, key, np.iinfo(np.intp).max)
        order = np.argsort(key, axis=1, kind="stable")
        picked = np.take_along_axis(safe, order, axis=1)
        keep = np.arange(width) < np.asarray(counts)[:, None]
        return picked[keep]

    def usable_gpus(self, nodes: IntArray) -> list[IntArray]:
        """Per node, its usable GPUs (any bin) by local index."""
        counts = self.cum[nodes, -1]
        taken = self.take(nodes, counts, 0, self.n_bins - 1, by_score=False)
        return np.split(taken, np.cumsum(counts)[:-1])

    def select(self, rank: int, group: int, bin_index: int) -> IntArray:
        """The best GPUs for the job inside one group, none scoring above ``bin_index``."""
        rows = self.group_rows(rank, group)
        if self.shape.per_node is not None:
            return self._select_per_node(rows, bin_index)
        if self.shape.simple:
            return self.pmfirst_pick(rows, bin_index)
        return self._select_bounded(rows, bin_index)

    def pmfirst_pick(self, rows: IntArray, bin_index: int) -> IntArray:
        """PM-First as PAL's code does it: every usable GPU below the threshold bin, then the rest
        from the threshold bin, nodes ranked by ``|free GPUs of that bin on the node - N|``
        (best-match packing), then node id, GPUs by local index."""
        n = self.shape.n
        below = self.cum[rows, bin_index - 1] if bin_index else np.zeros(rows.size, np.intp)
        below_nodes = np.flatnonzero(below)
        lower = self.take(rows[below_nodes], below[below_nodes], 0, bin_index - 1, by_score=True)
        missing = n - lower.size
        at_bin = self.counts[rows, bin_index]
        holders = np.flatnonzero(at_bin)
        order = holders[np.lexsort((holders, np.abs(at_bin[holders] - n)))]
        taken = np.cumsum(at_bin[order])
        last = int(np.searchsorted(taken, missing))
        chosen = order[: last + 1]
        counts = at_bin[chosen].copy()
        counts[-1] -= taken[last] - missing
        upper = self.take(rows[chosen], counts, bin_index, bin_index, by_score=True)
        return np.concatenate((lower, upper))

    def _node_costs(self, rows: IntArray, per_node: int) -> IntArray:
        return (self.cum[rows] < per_node).sum(axis=1)

    def _select_per_node(self, rows: IntArray, bin_index: int) -> IntArray:
        """``gpus_per_node`` jobs: required nodes, then the nodes whose ``g`` best GPUs are best,
        best fit (fewest free left) among equals."""
        shape = self.shape
        assert shape.per_node is not None and shape.node_count is not None
        cost = self._node_costs(rows, shape.per_node)
        required = np.isin(rows, shape.required)
        others = np.flatnonzero((cost <= bin_index) & ~required)
        free_left = self.cluster.node_free[rows[others]]
        others = others[np.lexsort((others, free_left, cost[others]))]
        wanted = shape.node_count - int(required.sum())
        chosen = rows[np.concatenate((np.flatnonzero(required), others[:wanted]))]
        counts = np.full(chosen.size, shape.per_node)
        return self.take(chosen, counts, 0, bin_index, by_score=True)

    def _select_bounded(self, rows: IntArray, bin_index: int) -> IntArray:
        """Required nodes and/or node-count bounds: required nodes first, then the nodes with the
        most usable GPUs (fewest nodes), at least ``min_nodes`` of them; every chosen node gets its
        best GPU, the rest go to the best remaining GPUs."""
        shape = self.shape
        cap = self.cum[rows, bin_index]
        required = np.flatnonzero(np.isin(rows, shape.required))
        others = np.flatnonzero((cap > 0) & ~np.isin(rows, shape.required))
        others = others[np.lexsort((others, -cap[others]))]
        chosen = list(required)
        total = int(cap[required].sum())
        for position in others:
            if total >= shape.n and len(chosen) >= shape.min_nodes:
                break
            chosen.append(int(position))
            total += int(cap[position])
        return self.spread_pick(rows[np.array(chosen, dtype=np.intp)], bin_index, by_score=True)

    def spread_pick(self, nodes: IntArray, bin_index: int, *, by_score: bool) -> IntArray:
        """N GPUs from ``nodes`` with at least one on each: each node's first GPU, then the best
        of the rest (by score or by node order and local index)."""
        counts = self.cum[nodes, bin_index]
        ranked = self.take(nodes, counts, 0, bin_index, by_score=by_score)
        owner = np.repeat(np.arange(nodes.size), counts)
        first_of_node = np.concatenate(([True], owner[1:] != owner[:-1]))
        rest = ranked[~first_of_node]
        if by_score:
            rest = rest[np.argsort(self.klass.bin_of[rest], kind="stable")]
        return np.concatenate((ranked[first_of_node], rest[: self.shape.n - nodes.size]))


def prepare(request: PlacementRequest, cluster: Cluster) -> RequestView | str:
    """Check the request against the cluster and build its view, or say why it cannot fit."""
    problem = request.problem()
    if problem is not None:
        return problem
    if request.job_class not in cluster.classes:
        return (
            f"unknown job class {request.job_class!r} (cluster has "
            f"{', '.join(cluster.class_order)})"
        )
    unknown = sorted(request.required_nodes - cluster.node_index.keys())
    if unknown:
        return f"unknown required node(s): {compress(unknown)}"

    node_ok: BoolArray | None = None
    if request.excluded_nodes:
        node_ok = np.ones(cluster.n_nodes, dtype=bool)
        excluded = [
            cluster.node_index[n] for n in request.excluded_nodes if n in cluster.node_index
        ]
        node_ok[excluded] = False
    if request.required_features:
        features = cluster.nodes_with_features(request.required_features)
        node_ok = features if node_ok is None else node_ok & features
    gpu_model: int | None = None
    if request.gpu_model is not None:
        model = request.gpu_model.lower()
        if model not in cluster.models:
            return (
                f"no {request.gpu_model} GPUs in the cluster (models: {', '.join(cluster.models)})"
            )
        gpu_model = cluster.models.index(model)
        if (cluster.node_model >= 0).all():
            model_nodes = cluster.node_model == gpu_model
            node_ok = model_nodes if node_ok is None else node_ok & model_nodes
            gpu_model = None  # whole nodes are filtered; no per-GPU test needed

    required = np.array(sorted(cluster.node_index[n] for n in request.required_nodes), np.intp)
    if node_ok is not None and required.size and not node_ok[required].all():
        bad = [cluster.node_names[node] for node in required[~node_ok[required]]]
        return f"required node(s) {compress(bad)} lack the requested features or GPU model"

    counts = cluster.free_counts(request.job_class)
    if gpu_model is not None:
        klass = cluster.classes[request.job_class]
        usable = cluster.free & (cluster.gpu_model == gpu_model)
        if node_ok is not None:
            usable &= node_ok[cluster.gpu_node]
        cells = cluster.gpu_node[usable] * klass.n_bins + klass.bin_of[usable]
        flat = np.bincount(cells, minlength=cluster.n_nodes * klass.n_bins)
        counts = flat.reshape(cluster.n_nodes, klass.n_bins).astype(np.int32)
    elif node_ok is not None:
        counts = counts * node_ok[:, None].astype(np.int32)

    shape = Shape(
        n=request.gpus,
        per_node=request.gpus_per_node,
        node_count=request.node_count,
        min_nodes=request.min_nodes or 1,
        max_nodes=request.node_count if request.gpus_per_node else request.max_nodes,
        required=required,
    )
    view = RequestView(request, cluster, shape, counts, gpu_model)
    usable_total = int(view.cum[:, -1].sum())
    if usable_total < shape.n:
        return (
            f"needs {shape.n} GPUs, {usable_total} usable free "
            f"({cluster.n_free} free in the cluster)"
        )
    return view


def build_allocation(
    view: RequestView, gpu_ids: IntArray, explain: Callable[[Allocation], str]
) -> Allocation:
    """Describe chosen GPUs: sorted ids, the level they span, V, L, the LV product, and the
    reason ``explain`` writes from all that."""
    cluster = view.cluster
    ids = np.sort(gpu_ids)
    nodes = cluster.gpu_node[ids]
    distinct = np.unique(nodes)
    if distinct.size == 1:
        rank = NODE_RANK
    elif cluster.topology.has_switches and np.unique(cluster.node_switch[distinct]).size == 1:
        rank = SWITCH_RANK
    else:
        rank = CLUSTER_RANK
    level = cluster.topology.level(rank)
    max_score = float(view.klass.scores[ids].max())
    id_list = ids.tolist()
    draft = Allocation(
        job_id=view.request.job_id,
        job_class=view.request.job_class,
        gpu_ids=tuple(id_list),
        uuids=tuple(cluster.uuids[gpu] for gpu in id_list),
        nodes=tuple(cluster.node_names[node] for node in nodes.tolist()),
        local_indices=tuple(cluster.gpu_local_index[ids].tolist()),
        max_score=max_score,
        level=level.name,
        penalty=level.penalty,
        lv_product=level.penalty * max_score,
        reason="",
    )
    return replace(draft, reason=explain(draft))


def describe_nodes(allocation: Allocation) -> str:
    """``node n03`` or ``nodes n[01-02]`` for reasons."""
    names = allocation.node_names
    return f"node {names[0]}" if len(names) == 1 else f"nodes {compress(names)}"
