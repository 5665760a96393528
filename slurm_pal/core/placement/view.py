"""A request's view of the cluster, and the vectorized steps the policies are built from.

The view holds, for the request's class, ``sorted`` (per node: the bins of the free GPUs the request
may use, ascending, padded with ``n_bins``) and ``totals`` (usable free GPUs per bin). Two facts
make that enough:

- the best set of N GPUs inside any group (a node, a switch, the cluster) under a score threshold
  is its N best GPUs: a set's slowest GPU is minimized by taking the smallest scores, so no
  combination is ever enumerated. For one node that set's worst bin is ``sorted[node, N - 1]``;
- feasibility is monotone in the threshold, so "the smallest bin at which a group can hold the
  job" is a search in cumulative counts.

Groups are the units of a locality level: each node (rank 0), each leaf switch (rank 1), the
whole cluster (rank 2). A group's "first bin" is the smallest bin at which it can hold the job
(``n_bins`` when it never can).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from slurm_pal.core.cluster import ClassScores, Cluster
from slurm_pal.core.hostlist import compress
from slurm_pal.core.placement.base import Allocation, PlacementResult
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import CLUSTER_RANK, NODE_RANK, SWITCH_RANK, Level

__all__ = [
    "RequestView",
    "Shape",
    "build_allocation",
    "placed",
    "prepare",
    "span_level",
    "unplaced",
]

IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]
_EMPTY = np.zeros(0, dtype=np.intp)
_COLUMNS = np.arange(64, dtype=np.intp)
_UNUSABLE = np.iinfo(np.intp).max // 2
"""Sort key of a slot that cannot be taken (large, with room to add a column number)."""


class Shape:
    """The request's GPU and node counts in cluster terms (``required`` are node ids)."""

    __slots__ = ("max_nodes", "min_nodes", "n", "node_count", "per_node", "required", "simple")

    def __init__(
        self,
        n: int,
        per_node: int | None,
        node_count: int | None,
        min_nodes: int,
        max_nodes: int | None,
        required: IntArray,
    ) -> None:
        self.n = n
        self.per_node = per_node
        self.node_count = node_count
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.required = required
        self.simple = (
            per_node is None and not required.size and max_nodes is None and min_nodes <= 1
        )
        """Only a GPU count: PM-First's own tie-breaking applies."""


def unplaced(request: PlacementRequest, reason: str) -> PlacementResult:
    return PlacementResult(request, None, reason)


def placed(
    allocation: Allocation, request: PlacementRequest, *, as_packing: bool = False
) -> PlacementResult:
    return PlacementResult(request, allocation, allocation.reason, as_packing=as_packing)


class RequestView:
    """Usable free GPUs of one request's class, summarized per node and per bin."""

    __slots__ = (
        "cluster",
        "columns",
        "counts",
        "gpu_model",
        "klass",
        "n_bins",
        "request",
        "shape",
        "sorted",
        "top",
        "totals",
        "width",
    )

    def __init__(
        self,
        request: PlacementRequest,
        cluster: Cluster,
        shape: Shape,
        sorted_bins: NDArray[np.int32],
        totals: NDArray[np.int64],
        gpu_model: int | None,
    ) -> None:
        self.request = request
        self.cluster = cluster
        self.klass: ClassScores = cluster.classes[request.job_class]
        self.shape = shape
        self.sorted = sorted_bins
        self.totals = totals
        self.n_bins = self.klass.n_bins
        self.counts: IntArray | None = None  # usable free GPUs per node, once asked
        self.top = self.n_bins - 1
        """The highest bin the request may use (lower when a policy leaves slow GPUs out)."""
        self.width = width = sorted_bins.shape[1]
        self.columns = _COLUMNS[:width] if width <= _COLUMNS.size else np.arange(width)
        self.gpu_model = gpu_model

    # --- per-node summaries --------------------------------------------------------------------

    def node_first(self, count: int, rows: IntArray | None = None) -> IntArray:
        """Per node: the bin of its ``count``-th best usable GPU (``n_bins`` if it has fewer)."""
        if count > self.width:
            size = self.cluster.n_nodes if rows is None else rows.size
            return np.full(size, self.n_bins, dtype=np.int32)
        column = self.sorted[:, count - 1]
        return column if rows is None else column[rows]  # type: ignore[return-value]

    def at_most(self, rows: IntArray, bin_index: int) -> IntArray:
        """Per node of ``rows``: usable GPUs with a bin <= ``bin_index``."""
        return (self.sorted[rows] <= bin_index).sum(axis=1)

    def usable_counts(self) -> IntArray:
        """Per node: usable free GPUs (any score). Computed once per view; without node or model
        filters it is the cluster's own per-node free count (kept up to date by allocate)."""
        if self.counts is None:
            self.counts = (self.sorted < self.n_bins).sum(axis=1)
        return self.counts

    def cumulative(self, rows: IntArray) -> IntArray:
        """Per node of ``rows`` and bin: usable GPUs at or under that bin (rows x bins)."""
        n_bins = self.n_bins
        cells = np.arange(rows.size)[:, None] * (n_bins + 1) + self.sorted[rows]
        flat = np.bincount(cells.ravel(), minlength=rows.size * (n_bins + 1))
        return np.cumsum(flat.reshape(rows.size, n_bins + 1)[:, :n_bins], axis=1)

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
        """Sum a per-node array over the groups of a level."""
        if rank == NODE_RANK:
            return per_node
        if rank == SWITCH_RANK:
            cluster = self.cluster
            ordered = per_node[cluster.switch_node_order]
            return np.add.reduceat(ordered, cluster.switch_starts, axis=0)
        return per_node.sum(axis=0, keepdims=True)

    def _switch_cumulative(self) -> IntArray:
        """Per switch and bin: usable GPUs at or under that bin."""
        n_bins, cluster = self.n_bins, self.cluster
        cells = cluster.node_switch[:, None] * (n_bins + 1) + self.sorted
        n_switches = len(cluster.switch_names)
        flat = np.bincount(cells.ravel(), minlength=n_switches * (n_bins + 1))
        return np.cumsum(flat.reshape(n_switches, n_bins + 1)[:, :n_bins], axis=1)

    # --- feasibility -------------------------------------------------------------------------

    def first_bins(self, rank: int) -> IntArray:
        """Per group of the level: the smallest bin at which it can hold the job, or n_bins."""
        shape, n_bins = self.shape, self.n_bins
        if shape.required.size:
            never = np.full(self.n_groups(rank), n_bins, dtype=np.intp)
            groups = np.unique(self.group_of_nodes(rank, shape.required))
            if groups.size == 1:
                never[groups[0]] = self._general_first(self.group_rows(rank, int(groups[0])))
            return never
        if shape.per_node is not None:
            assert shape.node_count is not None
            return self._kth_cost(rank, self.node_first(shape.per_node), shape.node_count)
        if rank == NODE_RANK:
            if shape.min_nodes > 1:
                return np.full(self.n_groups(rank), n_bins, dtype=np.intp)
            return self.node_first(shape.n)
        if rank == CLUSTER_RANK:
            cumulative = np.cumsum(self.totals)
            first = np.array([np.searchsorted(cumulative, shape.n)], dtype=np.intp)
        else:
            first = (self._switch_cumulative() < shape.n).sum(axis=1)
        if shape.simple:
            return first
        for group in np.flatnonzero(first < n_bins):
            first[group] = self._general_first(self.group_rows(rank, int(group)))
        return first

    def _kth_cost(self, rank: int, cost: IntArray, k: int) -> IntArray:
        """Per group: the k-th smallest node cost (the first bin with k usable nodes)."""
        n_bins = self.n_bins
        if rank == NODE_RANK:
            return cost if k == 1 else np.full(cost.size, n_bins, dtype=np.intp)
        if rank == CLUSTER_RANK:
            if cost.size < k:
                return np.array([n_bins], dtype=np.intp)
            return np.array([np.partition(cost, k - 1)[k - 1]], dtype=np.intp)
        cluster = self.cluster
        order = np.lexsort((cost, cluster.node_switch))
        sizes = np.diff(np.append(cluster.switch_starts, cost.size))
        result = np.full(sizes.size, n_bins, dtype=np.intp)
        big_enough = sizes >= k
        result[big_enough] = cost[order][cluster.switch_starts[big_enough] + k - 1]
        return result

    def _general_first(self, rows: IntArray) -> int:
        """First bin for one group under every constraint (required nodes, node bounds)."""
        shape = self.shape
        required = np.isin(rows, shape.required)
        if shape.required.size and required.sum() != shape.required.size:
            return self.n_bins
        cum = self.cumulative(rows)
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
        free_left = self.group_sum(rank, self.cluster._node_free)[candidates]
        return int(candidates[np.argmin(free_left)])

    # --- picking GPUs --------------------------------------------------------------------------

    def take(
        self, nodes: IntArray, counts: IntArray, low_bin: int, high_bin: int, *, by_score: bool
    ) -> IntArray:
        """From each node, its first ``counts[i]`` usable GPUs with a bin in [low, high]:
        best score first (``by_score``) or first in the node's order."""
        if not nodes.size:
            return _EMPTY
        if nodes.size == 1:
            return self._take_one(int(nodes[0]), int(counts[0]), low_bin, high_bin, by_score)
        cluster = self.cluster
        slots = cluster.node_gpus[nodes]
        valid = slots >= 0
        safe = np.where(valid, slots, 0)
        bins = self.klass.bin_of[safe]
        usable = valid & cluster.free[safe] & (bins >= low_bin) & (bins <= high_bin)
        if self.gpu_model is not None:
            usable &= cluster.gpu_model[safe] == self.gpu_model
        width = self.width
        key = np.where(usable, bins * width if by_score else 0, _UNUSABLE) + self.columns
        order = np.argsort(key, axis=1, kind="stable")
        picked = safe[np.arange(nodes.size)[:, None], order]
        return picked[self.columns < np.asarray(counts)[:, None]]

    def _take_one(self, node: int, count: int, low: int, high: int, by_score: bool) -> IntArray:
        """:meth:`take` for one node (most jobs fit one): plain Python over its handful of
        GPUs, the same order (usable ones by bin when ``by_score``, then by position; the
        unusable last), without a dozen numpy calls on arrays of four or eight."""
        cluster = self.cluster
        lists = cluster._gpu_lists
        bins, free = lists[f"bin:{self.request.job_class}"], cluster.free
        models, wanted = lists["model"], self.gpu_model
        usable: list[tuple[int, int, int]] = []
        unusable: list[int] = []
        for column, gpu in enumerate(lists["node_gpus"][node]):
            if free[gpu] and low <= bins[gpu] <= high and (wanted is None or models[gpu] == wanted):
                usable.append((bins[gpu] if by_score else 0, column, gpu))
            else:
                unusable.append(gpu)
        usable.sort()
        picked = [gpu for _, _, gpu in usable[:count]] + unusable[: max(0, count - len(usable))]
        return np.array(picked, dtype=np.intp)

    def node_pick(self, node: int, n: int) -> list[int]:
        """One node's ``n`` best usable GPUs (lowest scores, then lowest local index). Plain
        Python: a node holds a handful of GPUs, fewer than numpy's per-call overhead is worth."""
        cluster = self.cluster
        lists = cluster._gpu_lists
        bins, free = lists[f"bin:{self.request.job_class}"], cluster.free
        slots = lists["node_gpus"][node]
        if self.gpu_model is not None:
            models, wanted = lists["model"], self.gpu_model
            slots = [gpu for gpu in slots if models[gpu] == wanted]
        ranked = sorted([(bins[gpu], gpu) for gpu in slots if free[gpu]])
        return [gpu for _, gpu in ranked[:n]]

    def usable_gpus(self, nodes: IntArray) -> list[IntArray]:
        """Per node, its usable GPUs (any bin) by local index."""
        counts = (self.sorted[nodes] < self.n_bins).sum(axis=1)
        taken = self.take(nodes, counts, 0, self.n_bins - 1, by_score=False)
        return np.split(taken, np.cumsum(counts)[:-1])

    def select(self, rank: int, group: int, bin_index: int) -> IntArray | list[int]:
        """The best GPUs for the job inside one group, none scoring above ``bin_index``."""
        if self.shape.simple:
            if rank == NODE_RANK:
                return self.node_pick(group, self.shape.n)
            if rank == CLUSTER_RANK:
                return self.pmfirst_pick(None, bin_index)
            return self.pmfirst_pick(self.group_rows(rank, group), bin_index)
        rows = self.group_rows(rank, group)
        if self.shape.per_node is not None:
            return self._select_per_node(rows, bin_index)
        return self._select_bounded(rows, bin_index)

    def pmfirst_pick(self, rows: IntArray | None, bin_index: int) -> IntArray:
        """PM-First as PAL's code does it, among ``rows`` (None: every node): every usable GPU
        below the threshold bin, then the rest from the threshold bin, nodes ranked by
        ``|usable GPUs of that bin on the node - N|`` (best-match packing), then node id; GPUs by
        local index."""
        n = self.shape.n
        keys = self.sorted if rows is None else self.sorted[rows]
        holders = np.flatnonzero(keys[:, 0] <= bin_index)
        nodes = holders if rows is None else rows[holders]
        keys = keys[holders]
        below = (keys < bin_index).sum(axis=1)
        at_bin = (keys <= bin_index).sum(axis=1) - below
        has_below = np.flatnonzero(below)
        lower = self.take(nodes[has_below], below[has_below], 0, bin_index - 1, by_score=True)
        missing = n - lower.size
        with_bin = np.flatnonzero(at_bin)
        # |at_bin - n| then node id: nodes are ascending, so a stable sort on the locality score
        # keeps node order among ties (16-bit keys make numpy use a linear-time radix sort).
        locality = np.minimum(np.abs(at_bin[with_bin] - n), 65535).astype(np.uint16)
        order = with_bin[np.argsort(locality, kind="stable")]
        taken = np.cumsum(at_bin[order])
        last = int(np.searchsorted(taken, missing))
        chosen = order[: last + 1]
        counts = at_bin[chosen].copy()
        counts[-1] -= taken[last] - missing
        upper = self.take(nodes[chosen], counts, bin_index, bin_index, by_score=True)
        return np.concatenate((lower, upper))

    def _select_per_node(self, rows: IntArray, bin_index: int) -> IntArray:
        """``gpus_per_node`` jobs: required nodes, then the nodes whose ``g`` best GPUs are best,
        best fit (fewest free left) among equals."""
        shape = self.shape
        assert shape.per_node is not None and shape.node_count is not None
        cost = self.node_first(shape.per_node, rows)
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
        cap = self.at_most(rows, bin_index)
        is_required = np.isin(rows, shape.required)
        required = np.flatnonzero(is_required)
        others = np.flatnonzero((cap > 0) & ~is_required)
        others = others[np.lexsort((others, -cap[others]))]
        chosen: list[int] = required.tolist()
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
        counts = self.at_most(nodes, bin_index)
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
    unknown = sorted(n for n in request.required_nodes if n not in cluster.node_index)
    if unknown:
        return f"unknown required node(s): {_names_text(unknown)}"

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

    required = _EMPTY
    if request.required_nodes:
        required = np.array(sorted(cluster.node_index[n] for n in request.required_nodes), np.intp)
    if node_ok is not None and required.size and not node_ok[required].all():
        bad = [cluster.node_names[node] for node in required[~node_ok[required]]]
        return f"required node(s) {_names_text(bad)} lack the requested features or GPU model"

    klass = cluster.classes[request.job_class]
    # The cluster's own arrays, not read-only views: cheaper, and the view never writes to them.
    row = cluster._class_row[request.job_class]
    sorted_bins = cluster._sorted_bins[row]
    totals = cluster._bin_totals[row, : klass.n_bins]
    if gpu_model is not None or node_ok is not None:
        slots = cluster.node_gpus
        if gpu_model is not None:
            safe = np.where(slots >= 0, slots, 0)
            usable = (slots >= 0) & cluster.free[safe] & (cluster.gpu_model[safe] == gpu_model)
            if node_ok is not None:
                usable &= node_ok[:, None]
            sorted_bins = np.where(usable, klass.bin_of[safe], klass.n_bins).astype(np.int32)
            sorted_bins.sort(axis=1)
        else:
            assert node_ok is not None
            sorted_bins = np.where(node_ok[:, None], sorted_bins, np.int32(klass.n_bins))
        totals = np.bincount(sorted_bins.ravel(), minlength=klass.n_bins + 1)[: klass.n_bins]

    shape = Shape(
        n=request.gpus,
        per_node=request.gpus_per_node,
        node_count=request.node_count,
        min_nodes=request.min_nodes or 1,
        max_nodes=request.node_count if request.gpus_per_node else request.max_nodes,
        required=required,
    )
    view = RequestView(request, cluster, shape, sorted_bins, totals, gpu_model)
    if gpu_model is None and node_ok is None:
        view.counts = cluster.node_free
    usable_total = int(totals.sum())
    if usable_total < shape.n:
        return (
            f"needs {shape.n} GPUs, {usable_total} usable free "
            f"({cluster.n_free} free in the cluster)"
        )
    return view


def consolidate(view: RequestView, allocation: Allocation, tolerance: float) -> IntArray | None:
    """GPUs that cost at most ``tolerance`` more than ``allocation`` and pack better, or None to
    keep ``allocation``.

    Why: PM-First and PAL minimize this job's LV product and nothing else. Without migrations
    (Slurm never moves a running job) small jobs then take the best GPU wherever it is, jobs
    larger than a node take the best GPUs over many nodes (the across-nodes penalty is the same
    for 2 nodes or 6), no node stays whole, and later jobs must span nodes (measured in the
    simulator's Slurm mode: PAL lost to plain packing on 3 of 4 Sia-Philly workloads). Accepting
    an LV product within ``tolerance`` (0.02 = 2 %) of the best one buys best-fit packing:

    * a job that fits a node goes to the fullest node (fewest free GPUs left) whose ``n`` best
      usable GPUs stay within the bound, then the smaller worst score, then node order;
    * a job that spans nodes anyway (flat topologies) takes the fewest nodes: exact fit for the
      remainder, else the smallest node holding it, else the node with most usable GPUs under
      the bound, repeated; the best GPUs of each node.

    Only for plain GPU counts (no per-node counts, node bounds or node lists).
    """
    shape, cluster = view.shape, view.cluster
    if tolerance <= 0 or not shape.simple:
        return None
    bound = allocation.lv_product * (1.0 + tolerance)
    current = allocation.node_names
    if shape.n <= view.width:
        top_bin = _bin_under(view, bound / cluster.topology.level(NODE_RANK).penalty)
        cost = view.node_first(shape.n)
        candidates = np.flatnonzero(cost <= top_bin) if top_bin >= 0 else _EMPTY
        if candidates.size:
            free_left = cluster.node_free[candidates] - shape.n
            pick = int(np.lexsort((candidates, cost[candidates], free_left))[0])
            if len(current) == 1:
                current_left = int(cluster.node_free[cluster.node_index[current[0]]]) - shape.n
                if free_left[pick] >= current_left:
                    return None  # no fuller node within the bound: keep the LV-optimal choice
            return np.asarray(view.node_pick(int(candidates[pick]), shape.n), dtype=np.intp)
    if len(current) == 1 or cluster.topology.has_switches:
        return None
    top_bin = _bin_under(view, bound / allocation.penalty)
    if top_bin < 0:
        return None
    nodes = np.arange(cluster.n_nodes, dtype=np.intp)
    cap = view.at_most(nodes, top_bin)
    if int(cap.sum()) < shape.n:
        return None
    chosen: list[int] = []
    counts: list[int] = []
    remaining = shape.n
    while remaining:
        exact = np.flatnonzero(cap == remaining)
        bigger = np.flatnonzero(cap > remaining)
        if exact.size:
            node, take = int(exact[0]), remaining
        elif bigger.size:
            node, take = int(bigger[np.argmin(cap[bigger])]), remaining
        else:
            node = int(np.argmax(cap))
            take = int(cap[node])
        chosen.append(node)
        counts.append(take)
        cap[node] = 0
        remaining -= take
    return view.take(np.array(chosen, dtype=np.intp), np.array(counts), 0, top_bin, by_score=True)


def _bin_under(view: RequestView, score: float) -> int:
    """The highest bin whose score is <= ``score`` (-1 if none)."""
    return int(np.searchsorted(view.klass.bin_scores, score * (1 + 1e-12), side="right")) - 1


def packed_within(
    view: RequestView, result: PlacementResult, tolerance: float, label: str
) -> PlacementResult:
    """``result``, or the :func:`consolidate` choice when one exists (the reason says both)."""
    allocation = result.allocation
    if allocation is None or tolerance <= 0:
        return result
    gpus = consolidate(view, allocation, tolerance)
    if gpus is None:
        return result
    best = allocation.lv_product
    packed = build_allocation(
        view,
        gpus,
        lambda level, worst, nodes: (
            f"{label}: packed on the fullest node within {tolerance:.1%} of the best LV "
            f"{best:.4g}: V={worst:.3g} L={level.penalty:g}, {nodes}"
        ),
    )
    return placed(packed, view.request)


def span_level(cluster: Cluster, distinct_nodes: list[int]) -> Level:
    """The locality level a set of (distinct) nodes spans: one node, one leaf switch, or more."""
    if len(distinct_nodes) == 1:
        rank = NODE_RANK
    elif (
        cluster.topology.has_switches
        and len(set(cluster.node_switch[distinct_nodes].tolist())) == 1
    ):
        rank = SWITCH_RANK
    else:
        rank = CLUSTER_RANK
    return cluster.topology.level(rank)


def build_allocation(
    view: RequestView, gpu_ids: IntArray | list[int], explain: Callable[[Level, float, str], str]
) -> Allocation:
    """Describe chosen GPUs: sorted ids, the level they span, V, L and the LV product. The
    reason is ``explain(level, max score, "node n01" / "nodes n[01-02]")``."""
    cluster = view.cluster
    id_list = sorted(gpu_ids.tolist() if isinstance(gpu_ids, np.ndarray) else gpu_ids)
    lists = cluster._gpu_lists
    node_of, scores = lists["node"], lists[f"score:{view.request.job_class}"]
    node_ids = [node_of[gpu] for gpu in id_list]
    distinct = list(dict.fromkeys(node_ids))
    level = span_level(cluster, distinct)
    max_score = max([scores[gpu] for gpu in id_list])
    names = [cluster.node_names[node] for node in distinct]
    node_text = f"node {names[0]}" if len(names) == 1 else f"nodes {_names_text(names)}"
    return Allocation(
        job_id=view.request.job_id,
        job_class=view.request.job_class,
        gpu_ids=tuple(id_list),
        uuids=tuple([cluster.uuids[gpu] for gpu in id_list]),
        nodes=tuple([cluster.node_names[node] for node in node_ids]),
        local_indices=tuple([lists["local_index"][gpu] for gpu in id_list]),
        max_score=max_score,
        level=level.name,
        penalty=level.penalty,
        lv_product=level.penalty * max_score,
        reason=explain(level, max_score, node_text),
    )


def _names_text(names: list[str]) -> str:
    """Node names as a hostlist (``n[01-03]``), or listed when they do not fold."""
    try:
        return compress(names)
    except ValueError:
        return ", ".join(names)
