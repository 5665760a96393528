"""The cluster model the policies read: every GPU's node, index, model and PM-scores, and which
GPUs are free.

Built once from plain data (:meth:`Cluster.from_gpus`), then mutated in place by
:meth:`Cluster.allocate` / :meth:`Cluster.release`, which the simulator calls millions of times, so
they only touch the GPUs concerned. :meth:`Cluster.copy` shares every static array and copies the
small mutable state.

Layout choices that make placement vectorizable:

- GPUs are stored sorted by node, then in the node's order (``GpuSpec.order``); ``node_gpus``
  is a padded node x slot matrix of GPU ids, so "the GPUs of these nodes" is one
  fancy-indexing step.
- Per job class, scores take few distinct values (the K-Means bins plus a few outliers).
  ``np.unique`` turns them into a sorted ``bin_scores`` vector and a ``bin_of`` GPU -> bin index.
- Per class the cluster keeps, up to date in place, ``sorted_free_bins``: for every node the bins
  of its free GPUs in ascending order, padded with ``n_bins`` (a nodes x GPUs-per-node matrix),
  and ``bin_totals``: free GPUs per bin. Column ``N - 1`` of the first is each node's best
  possible worst score for an N-GPU job; the cumulative sum of the second answers the same for
  the whole cluster. Neither depends on how many outliers add bins, and nothing enumerates GPUs
  or combinations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from slurm_pal.core.lxv import LxVMatrix
from slurm_pal.core.topology import Topology

if TYPE_CHECKING:
    from slurm_pal.core.placement.base import Allocation

__all__ = ["MAX_COUNT_CELLS", "ClassScores", "Cluster", "GpuSpec"]

MAX_COUNT_CELLS = 1 << 24
"""Upper bound on nodes x distinct scores per class: scores are meant to be binned."""

IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as the inputs describe it. ``scores`` maps job class -> PM-score (lower = faster,
    1.0 = the median GPU); ``node_features`` are its node's Slurm features.

    ``order``: where the GPU stands among its node's GPUs, lowest first: the order packing
    takes free GPUs in and ties are broken in. Slurm gives a job a node's lowest free indices
    in its own numbering (gres.conf grouped by type), which need not be the device ``index``
    (the campaign's): the advisor passes Slurm's index here, so that packing's pick is the
    GPUs Slurm would give. None: by ``index``."""

    uuid: str
    node: str
    index: int
    model: str
    scores: Mapping[str, float]
    node_features: frozenset[str] = field(default_factory=frozenset)
    order: int | None = None

    @property
    def position(self) -> int:
        """Its place among its node's GPUs: ``order``, else ``index``."""
        return self.index if self.order is None else self.order


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ClassScores:
    """One class's PM-scores in bin form: ``bin_scores[bin_of[gpu]] == scores[gpu]``."""

    name: str
    scores: NDArray[np.float64]
    bin_scores: NDArray[np.float64]
    bin_of: IntArray

    @property
    def n_bins(self) -> int:
        return int(self.bin_scores.size)


def _switch_layout(
    topology: Topology, node_names: tuple[str, ...]
) -> tuple[IntArray, tuple[str, ...], IntArray, IntArray]:
    """Per node its switch number; the switch names; the nodes ordered by switch and where each
    switch's run starts. A node the topology does not place is its own switch ("\0" keeps the
    name apart)."""
    switch_of_node = [
        (topology.switch_of(name) or f"\0{name}") if topology.has_switches else ""
        for name in node_names
    ]
    switch_ids: dict[str, int] = {}
    node_switch = _readonly(
        np.array([switch_ids.setdefault(s, len(switch_ids)) for s in switch_of_node], np.intp)
    )
    names = tuple(name.lstrip("\0") for name in switch_ids)
    order = _readonly(np.argsort(node_switch, kind="stable").astype(np.intp))
    group_sizes = np.bincount(node_switch, minlength=len(switch_ids))
    starts = _readonly(np.concatenate(([0], np.cumsum(group_sizes)[:-1])))
    return node_switch, names, order, starts


def _class_scores(specs: Sequence[GpuSpec], name: str, n_nodes: int) -> ClassScores:
    """Class ``name``'s PM-score per GPU, binned by distinct value; refuses a missing, non-finite
    or non-positive score (the scoring pipeline fills fallbacks; the cluster refuses to guess)
    and more distinct scores than the count tables hold."""
    values = []
    for spec in specs:
        try:
            score = float(spec.scores[name])
        except (KeyError, TypeError, ValueError):
            score = math.nan
        if not math.isfinite(score):
            raise ValueError(f"GPU {spec.uuid} has no finite PM-score for class {name!r}")
        if score <= 0:
            raise ValueError(f"GPU {spec.uuid} has a PM-score <= 0 for class {name!r}")
        values.append(score)
    scores = np.array(values)
    bin_scores, bin_of = np.unique(scores, return_inverse=True)
    if n_nodes * bin_scores.size > MAX_COUNT_CELLS:
        raise ValueError(
            f"class {name!r} has {bin_scores.size} distinct PM-scores on {n_nodes} nodes; "
            "bin the scores first (see slurm_pal.core.binning)"
        )
    return ClassScores(
        name, _readonly(scores), _readonly(bin_scores), _readonly(bin_of.astype(np.intp))
    )


class Cluster:
    """GPUs, their scores and topology (static, shared by copies) plus the free mask (mutable).

    Contract: ``allocate``/``release`` mutate this object in place and raise ValueError when asked
    to allocate a busy GPU or release a free one (a caller bug). Policies never mutate it.
    """

    __slots__ = (
        "_bin_totals",
        "_class_bins",
        "_class_row",
        "_class_sentinel",
        "_feature_masks",
        "_gpu_lists",
        "_lxv_cache",
        "_node_free",
        "_padded",
        "_sorted_bins",
        "_total_offsets",
        "busy_since",
        "busy_until",
        "class_order",
        "classes",
        "clock",
        "free",
        "gpu_local_index",
        "gpu_model",
        "gpu_node",
        "models",
        "node_features",
        "node_gpus",
        "node_index",
        "node_model",
        "node_names",
        "node_size",
        "node_switch",
        "switch_names",
        "switch_node_order",
        "switch_starts",
        "topology",
        "uuid_index",
        "uuids",
    )

    uuids: tuple[str, ...]
    uuid_index: dict[str, int]
    gpu_node: IntArray
    gpu_local_index: IntArray
    gpu_model: IntArray
    models: tuple[str, ...]
    node_names: tuple[str, ...]
    node_index: dict[str, int]
    node_features: tuple[frozenset[str], ...]
    node_gpus: IntArray
    node_size: IntArray
    node_model: IntArray
    node_switch: IntArray
    switch_names: tuple[str, ...]
    switch_node_order: IntArray
    switch_starts: IntArray
    classes: dict[str, ClassScores]
    class_order: tuple[str, ...]
    topology: Topology
    free: BoolArray
    busy_until: NDArray[np.float64]
    """Per GPU, when the job holding it is expected to end, on the driver's clock (its time
    limit, or a learned runtime): what a job waiting for other GPUs can expect. ``inf``:
    unknown (an unlimited job, or a view that was not told)."""
    busy_since: NDArray[np.float64]
    """Per GPU, when the job holding it started (``nan``: not known), so that a learned share
    of its limit can say when it will likely end."""
    clock: float
    """The driver's time of this state (seconds, same clock as ``busy_until``)."""
    _class_row: dict[str, int]
    _class_bins: NDArray[np.int32]
    _class_sentinel: NDArray[np.int32]
    _sorted_bins: NDArray[np.int32]
    _bin_totals: NDArray[np.int64]
    _total_offsets: IntArray
    _padded: bool
    _gpu_lists: dict[str, list]
    _lxv_cache: dict[str, LxVMatrix]
    _node_free: IntArray
    _feature_masks: dict[str, BoolArray]

    @classmethod
    def from_gpus(
        cls,
        gpus: Iterable[GpuSpec],
        topology: Topology | None = None,
        *,
        busy: Iterable[str] = (),
        class_order: Sequence[str] | None = None,
    ) -> Cluster:
        """Build the model. ``busy`` lists UUIDs already in use. ``class_order`` ranks classes
        from most variability-sensitive (placed first by the queue) down; default: sorted names.
        Nodes in order of first appearance, each node's GPUs in their ``GpuSpec.order``.

        Raises ValueError on inconsistent data: duplicate UUIDs or (node, index) pairs, a node
        whose GPUs disagree on features, or a GPU lacking a finite positive score for a class
        (the scoring pipeline fills fallbacks; the cluster refuses to guess).
        """
        specs = list(gpus)
        if not specs:
            raise ValueError("a cluster needs at least one GPU")
        topology = topology if topology is not None else Topology.flat()
        node_order: dict[str, int] = {}
        features: dict[str, frozenset[str]] = {}
        for spec in specs:
            node_order.setdefault(spec.node, len(node_order))
            known = features.setdefault(spec.node, frozenset(spec.node_features))
            if known != frozenset(spec.node_features):
                raise ValueError(f"GPUs of node {spec.node} disagree on its features")
        specs.sort(key=lambda spec: (node_order[spec.node], spec.position, spec.index))

        uuids = tuple(spec.uuid for spec in specs)
        if len(set(uuids)) != len(uuids):
            raise ValueError("duplicate GPU UUIDs")
        slots = {(spec.node, spec.index) for spec in specs}
        if len(slots) != len(specs):
            raise ValueError("two GPUs share a (node, index)")
        if len({(spec.node, spec.position) for spec in specs}) != len(specs):
            raise ValueError("two GPUs share a place in their node's order")
        class_names = sorted({name for spec in specs for name in spec.scores})
        if not class_names:
            raise ValueError("no job class scores given")

        self = object.__new__(cls)
        self.topology = topology
        self.uuids = uuids
        self.uuid_index = {uuid: gpu for gpu, uuid in enumerate(uuids)}
        self.node_names = tuple(node_order)
        self.node_index = dict(node_order)
        self.node_features = tuple(features[name] for name in self.node_names)
        self.gpu_node = _readonly(np.array([node_order[s.node] for s in specs], dtype=np.intp))
        self.gpu_local_index = _readonly(np.array([s.index for s in specs], dtype=np.intp))
        models = sorted({spec.model.lower() for spec in specs})
        self.models = tuple(models)
        model_id = {model: number for number, model in enumerate(models)}
        self.gpu_model = _readonly(
            np.array([model_id[s.model.lower()] for s in specs], dtype=np.intp)
        )

        n_nodes = len(self.node_names)
        self.node_size = _readonly(np.bincount(self.gpu_node, minlength=n_nodes).astype(np.intp))
        width = int(self.node_size.max())
        starts = np.concatenate(([0], np.cumsum(self.node_size)[:-1]))
        slot = np.arange(len(specs)) - starts[self.gpu_node]
        node_gpus = np.full((n_nodes, width), -1, dtype=np.intp)
        node_gpus[self.gpu_node, slot] = np.arange(len(specs))
        self.node_gpus = _readonly(node_gpus)
        node_model = np.full(n_nodes, -1, dtype=np.intp)  # -1: the node mixes GPU models
        first_model = self.gpu_model[starts]
        uniform = np.ones(n_nodes, dtype=bool)
        np.logical_and.at(uniform, self.gpu_node, self.gpu_model == first_model[self.gpu_node])
        node_model[uniform] = first_model[uniform]
        self.node_model = _readonly(node_model)

        (
            self.node_switch,
            self.switch_names,
            self.switch_node_order,
            self.switch_starts,
        ) = _switch_layout(topology, self.node_names)

        self.classes = {name: _class_scores(specs, name, n_nodes) for name in class_names}
        if class_order is None:
            self.class_order = tuple(class_names)
        else:
            unknown = set(class_order) - set(class_names)
            missing = set(class_names) - set(class_order)
            if unknown or missing:
                raise ValueError(
                    f"class_order must list exactly the classes {class_names}, got {class_order}"
                )
            self.class_order = tuple(class_order)

        self._class_row = {name: row for row, name in enumerate(class_names)}
        self._class_bins = _readonly(
            np.stack([self.classes[name].bin_of for name in class_names]).astype(np.int32)
        )
        self._class_sentinel = _readonly(
            np.array([self.classes[name].n_bins for name in class_names], dtype=np.int32)
        )
        # Plain-list mirrors for describing a handful of GPUs without numpy call overhead.
        self._gpu_lists = {
            "node": self.gpu_node.tolist(),
            "local_index": self.gpu_local_index.tolist(),
            "model": self.gpu_model.tolist(),
            "node_gpus": [[g for g in row if g >= 0] for row in self.node_gpus.tolist()],
            **{f"score:{name}": klass.scores.tolist() for name, klass in self.classes.items()},
            **{f"bin:{name}": klass.bin_of.tolist() for name, klass in self.classes.items()},
        }
        self._lxv_cache = {}  # shared by copies: bins and topology never change
        self.free = np.ones(len(specs), dtype=bool)
        self.busy_until = np.full(len(specs), np.inf)
        self.busy_since = np.full(len(specs), np.nan)
        self.clock = 0.0
        self._feature_masks = {}
        self._recount()
        busy_ids = [self.gpu_id(uuid) for uuid in busy]
        if busy_ids:
            self.allocate(busy_ids)
        return self

    def _recount(self) -> None:
        """Rebuild the free-state summaries from ``free`` (construction only)."""
        n_nodes = len(self.node_names)
        self._node_free = np.bincount(self.gpu_node[self.free], minlength=n_nodes).astype(np.intp)
        width = int(self._class_sentinel.max()) + 1
        self._bin_totals = np.zeros((len(self.classes), width), dtype=np.int64)
        self._total_offsets = _readonly(np.arange(len(self.classes))[:, None] * width)
        self._padded = bool((self.node_gpus < 0).any())
        for row in range(len(self.classes)):
            self._bin_totals[row] = np.bincount(self._class_bins[row][self.free], minlength=width)[
                :width
            ]
        self._sorted_bins = np.empty(
            (len(self.classes), n_nodes, self.node_gpus.shape[1]), np.int32
        )
        self._resort(np.arange(n_nodes))

    def _resort(self, nodes: IntArray) -> None:
        """Recompute ``sorted_free_bins`` rows of ``nodes`` for every class at once."""
        slots = self.node_gpus[nodes]
        if self._padded:
            safe = np.where(slots >= 0, slots, 0)
            usable = (slots >= 0) & self.free[safe]
        else:
            safe, usable = slots, self.free[slots]
        keys = np.where(usable, self._class_bins[:, safe], self._class_sentinel[:, None, None])
        keys.sort(axis=-1)
        self._sorted_bins[:, nodes, :] = keys

    # --- sizes and lookups -------------------------------------------------------------------

    @property
    def n_gpus(self) -> int:
        return len(self.uuids)

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def n_free(self) -> int:
        return int(self._node_free.sum())

    @property
    def max_gpus_per_node(self) -> int:
        return int(self.node_size.max())

    @property
    def node_free(self) -> IntArray:
        """Free GPUs per node (a read-only view; it changes with allocate/release)."""
        view = self._node_free.view()
        view.flags.writeable = False
        return view

    def sorted_free_bins(self, job_class: str) -> NDArray[np.int32]:
        """Per node, the class bins of its free GPUs ascending, padded with ``n_bins``
        (read-only view, kept current in place)."""
        view = self._sorted_bins[self._class_row[job_class]].view()
        view.flags.writeable = False
        return view

    def bin_totals(self, job_class: str) -> NDArray[np.int64]:
        """Free GPUs per bin of the class (read-only view, kept current in place)."""
        klass = self.classes[job_class]
        view = self._bin_totals[self._class_row[job_class], : klass.n_bins].view()
        view.flags.writeable = False
        return view

    def free_counts(self, job_class: str) -> NDArray[np.int64]:
        """Free GPUs per (node, bin) of the class (computed on demand: nodes x bins)."""
        n_bins = self.classes[job_class].n_bins
        keys = self.sorted_free_bins(job_class)
        cells = np.arange(self.n_nodes)[:, None] * (n_bins + 1) + keys
        flat = np.bincount(cells.ravel(), minlength=self.n_nodes * (n_bins + 1))
        return flat.reshape(self.n_nodes, n_bins + 1)[:, :n_bins]

    def gpu_id(self, uuid: str) -> int:
        """The internal GPU id (row) of a UUID; KeyError names the unknown UUID."""
        try:
            return self.uuid_index[uuid]
        except KeyError:
            raise KeyError(f"unknown GPU UUID {uuid!r}") from None

    def nodes_with_features(self, features: Iterable[str]) -> BoolArray:
        """Boolean mask of nodes that have every one of ``features`` (cached per feature)."""
        mask = np.ones(self.n_nodes, dtype=bool)
        for feature in features:
            cached = self._feature_masks.get(feature)
            if cached is None:
                cached = np.array([feature in f for f in self.node_features], dtype=bool)
                self._feature_masks[feature] = cached
            mask &= cached
        return mask

    def lxv(self, job_class: str) -> LxVMatrix:
        """The class's L x V matrix from its bins and this cluster's locality levels (built once
        per layout; copies share it)."""
        matrix = self._lxv_cache.get(job_class)
        if matrix is None:
            if job_class not in self.classes:
                known = ", ".join(self.class_order)
                raise KeyError(f"unknown job class {job_class!r}; known: {known}")
            klass = self.classes[job_class]
            matrix = LxVMatrix.build(job_class, tuple(klass.bin_scores), self.topology.levels)
            self._lxv_cache[job_class] = matrix
        return matrix

    # --- state ---------------------------------------------------------------------------------

    def copy(self) -> Cluster:
        """A copy with its own free state; static arrays are shared (they are read-only)."""
        other = object.__new__(Cluster)
        for name in Cluster.__slots__:
            setattr(other, name, getattr(self, name))
        other.free = self.free.copy()
        other.busy_until = self.busy_until.copy()
        other.busy_since = self.busy_since.copy()
        other._node_free = self._node_free.copy()
        other._sorted_bins = self._sorted_bins.copy()
        other._bin_totals = self._bin_totals.copy()
        return other

    def rescored(self, scores: Mapping[str, Sequence[float] | NDArray[np.float64]]) -> Cluster:
        """This cluster with new PM-scores for some classes (:func:`rescore`)."""
        return rescore(self, scores)

    def _gpu_ids(self, gpus: Allocation | Iterable[int] | NDArray[np.integer]) -> IntArray:
        ids = getattr(gpus, "gpu_ids", gpus)
        array = np.asarray(ids if isinstance(ids, np.ndarray | tuple | list) else list(ids))  # type: ignore[arg-type]
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise ValueError("GPU ids must be a flat sequence of ints")
        values = array.tolist()
        if values and (min(values) < 0 or max(values) >= self.n_gpus):
            raise ValueError("GPU id out of range")
        if len(set(values)) != len(values):
            raise ValueError("duplicate GPU ids")
        return array.astype(np.intp, copy=False)

    def _apply(self, ids: IntArray, delta: int) -> None:
        """Update the summaries for GPUs whose free flag just flipped (small ``ids``: plain
        Python and one vectorized re-sort beat ``np.add.at``)."""
        node_free = self._node_free
        nodes = self.gpu_node[ids].tolist()
        for node in nodes:
            node_free[node] += delta
        totals = self._bin_totals
        cells = self._class_bins[:, ids] + self._total_offsets
        np.add.at(totals.reshape(-1), cells.ravel(), delta)
        self._resort(np.array(sorted(set(nodes)), dtype=np.intp))

    def allocate(self, gpus: Allocation | Iterable[int] | NDArray[np.integer]) -> None:
        """Mark GPUs (ids, or an Allocation) busy, in place. ValueError if one is already busy."""
        ids = self._gpu_ids(gpus)
        if not self.free[ids].all():
            busy = [self.uuids[gpu] for gpu in ids[~self.free[ids]]]
            raise ValueError(f"GPU(s) already busy: {', '.join(busy)}")
        self.free[ids] = False
        self._apply(ids, -1)

    def release(self, gpus: Allocation | Iterable[int] | NDArray[np.integer]) -> None:
        """Mark GPUs (ids, or an Allocation) free, in place. ValueError if one is already free."""
        ids = self._gpu_ids(gpus)
        if self.free[ids].any():
            idle = [self.uuids[gpu] for gpu in ids[self.free[ids]]]
            raise ValueError(f"GPU(s) already free: {', '.join(idle)}")
        self.free[ids] = True
        self._apply(ids, +1)

    def expect_free_at(
        self,
        gpus: Allocation | Iterable[int] | NDArray[np.integer],
        when: float,
        since: float = math.nan,
    ) -> None:
        """The job holding ``gpus`` ends by ``when`` (``inf``: unknown); it started ``since``."""
        ids = self._gpu_ids(gpus)
        self.busy_until[ids] = when
        self.busy_since[ids] = since

    def allocate_uuids(self, uuids: Iterable[str]) -> None:
        """:meth:`allocate` by UUID (for state read from Slurm)."""
        self.allocate([self.gpu_id(uuid) for uuid in uuids])

    def release_uuids(self, uuids: Iterable[str]) -> None:
        """:meth:`release` by UUID."""
        self.release([self.gpu_id(uuid) for uuid in uuids])

    def __repr__(self) -> str:
        return (
            f"Cluster({self.n_gpus} GPUs on {self.n_nodes} nodes, {self.n_free} free, "
            f"classes {list(self.class_order)})"
        )


def rescore(
    cluster: Cluster, scores: Mapping[str, Sequence[float] | NDArray[np.float64]]
) -> Cluster:
    """``cluster`` with new PM-scores for some classes (class -> one score per GPU, in its GPU
    order), its free GPUs, expected ends and clock kept.

    How what is learnt between campaigns (a GPU suspect for a class) reaches placement:
    the policies read only scores, so a changed view is a rescored cluster, not a new
    rule in every policy. Costs one :meth:`from_gpus` (milliseconds at a few hundred GPUs);
    meant for rare changes, not per decision."""
    unknown = sorted(set(scores) - set(cluster.classes))
    if unknown:
        raise ValueError(f"no class {', '.join(unknown)} in this cluster")
    table = {
        name: [float(v) for v in scores[name]] if name in scores else klass.scores.tolist()
        for name, klass in cluster.classes.items()
    }
    for name, values in table.items():
        if len(values) != cluster.n_gpus:
            raise ValueError(f"class {name!r}: need {cluster.n_gpus} scores, got {len(values)}")
    specs = [
        GpuSpec(
            uuid=uuid,
            node=cluster.node_names[int(cluster.gpu_node[gpu])],
            index=int(cluster.gpu_local_index[gpu]),
            model=cluster.models[int(cluster.gpu_model[gpu])],
            scores={name: values[gpu] for name, values in table.items()},
            node_features=cluster.node_features[int(cluster.gpu_node[gpu])],
            order=gpu,  # the GPUs keep their order
        )
        for gpu, uuid in enumerate(cluster.uuids)
    ]
    busy = [cluster.uuids[gpu] for gpu in np.flatnonzero(~cluster.free).tolist()]
    other = Cluster.from_gpus(specs, cluster.topology, busy=busy, class_order=cluster.class_order)
    other.busy_until = cluster.busy_until.copy()
    other.busy_since = cluster.busy_since.copy()
    other.clock = cluster.clock
    return other
