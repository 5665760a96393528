"""Packing first, PM-scores for outliers: the placement that is safe where jobs never move.

Under Slurm a running job keeps its GPUs to the end, so whatever a placement does to the shape
of the free GPUs stays until jobs end. Measured in the simulator's Slurm mode (benchmarks/README,
"Production"): the paper's PM-First and PAL lose to plain packing on measured variability,
because single-GPU jobs take the best GPUs wherever they are and no node stays whole. Choosing
GPUs by PM-score even *inside* the node packing picks gained nothing over 40 paired runs and
added noise (p90 run ratio 1.04 against 1.00): a few per cent of GPU speed is below what
FIFO + backfill's chaos hides. What pays is keeping jobs off GPUs that are far slower for them
(a GPU at 2.8x for compute-bound jobs, as PAL's artifact draws have). So:

1. the nodes and per-node counts are packing's (:func:`pack_pick`: exact fit, else the tightest
   node that fits, else spread from the fullest); among nodes packing finds equal, the job goes
   where it keeps another class's outlier busy, or fills in around its own outliers
   (:meth:`PackedPMPolicy._node_rank`), else in node order;
2. a GPU whose PM-score for the job's class is above ``avoid_above`` is left out when packing
   can place the job on the others without spanning more nodes, for a smaller LV product. A
   larger hole broken that way is a cost taken, not a veto: idle GPUs the job could use
   without an outlier are never left idle for its sake. Without the node guard, single runs
   lost up to 1.41x;
3. inside a node, GPUs that are outliers for another class but not for this job's go first
   (a memory-bound job takes the GPU a compute-bound one must not get), then in the node's order;
4. otherwise, with ``wait``, the job may be held back for other GPUs (unless it could never
   fit without the outliers), but only while the wait it can expect is shorter than what the
   outlier would cost it, and never past ``max_wait_s`` from when it could first have started
   (:mod:`slurm_pal.core.waiting`); else it takes packing's pick, outlier included. Not the
   least slow outliers that fit on as many nodes: where a gang cannot avoid them, whichever it
   leaves goes to the next gang (Philly VC on 2-GPU nodes, a few GPUs at 2-3x, 12 runs: 0.87
   -> 0.96 of packing's average JCT). Without ``wait``, the outlier is the last resort. An
   unbounded wait (the rule before) stalled a cluster of long unlimited jobs: average JCT up
   to ~100x packing.

On a site whose GPUs are all within ``avoid_above`` (Longhorn's V100s: 1.12x at most; H100s:
2.2 %) this is exactly packing.
"""

from __future__ import annotations

import math

import numpy as np

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import Allocation, PlacementResult
from slurm_pal.core.placement.packed import pack_pick
from slurm_pal.core.placement.pmfirst import constraint_text
from slurm_pal.core.placement.view import (
    RequestView,
    build_allocation,
    placed,
    prepare,
    span_level,
    unplaced,
)
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.runtimes import RunningJob, RuntimeModel
from slurm_pal.core.waiting import WaitVerdict, expected_wait_s, running_jobs, weigh_wait

__all__ = ["WAIT_REASON", "PackedPMPolicy"]

WAIT_REASON = "waits for GPUs that are not outliers for its class"
"""The reason of a ``wait`` result (the job fits now only on outlier GPUs)."""


class PackedPMPolicy:
    """Packing's nodes, outlier GPUs only where they cost nothing else, or as a last resort.

    ``avoid_above``: a PM-score (1.0 = the median GPU) above which a GPU is an outlier for the
    job's class; ``inf`` never avoids (plain packing). ``wait``: a job that cannot leave the
    outliers out now may be held back for other GPUs, while that pays and for ``max_wait_s``
    at most. A job with a time limit is weighed as running ``limit_share`` of it (users ask for
    more than they use), and so are its holders; one without as running
    ``assumed_runtime_s``; once ``runtimes`` (the site's finished jobs, given by the engine
    that drives the policy) knows such jobs, as what it predicts for such limits.
    """

    name = "packed-pm"

    def __init__(
        self,
        avoid_above: float = 1.5,
        wait: bool = False,
        max_wait_s: float = 86400.0,
        assumed_runtime_s: float = 3600.0,
        limit_share: float = 0.5,
    ) -> None:
        if not avoid_above >= 1.0:
            raise ValueError(f"avoid_above must be a PM-score >= 1.0, got {avoid_above}")
        if not (math.isfinite(max_wait_s) and max_wait_s >= 0):
            raise ValueError(
                f"max_wait_s must be a finite number of seconds >= 0, got {max_wait_s}"
            )
        self.avoid_above = float(avoid_above)
        self.wait = bool(wait)
        if not (math.isfinite(assumed_runtime_s) and assumed_runtime_s > 0):
            raise ValueError(f"assumed_runtime_s must be > 0 seconds, got {assumed_runtime_s}")
        if not 0 < limit_share <= 1:
            raise ValueError(f"limit_share must be in (0, 1], got {limit_share}")
        self.max_wait_s = float(max_wait_s)
        self.assumed_runtime_s = float(assumed_runtime_s)
        self.limit_share = float(limit_share)
        self.runtimes: RuntimeModel | None = None
        # (scores array kept alive, so its id is not reused) -> mask
        self._outlying: dict[
            tuple[int, str], tuple[np.ndarray, tuple[np.ndarray, list[bool]] | None]
        ] = {}
        self._slow: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"Packed-PM: {view}")
        slow = self._first_slow_bin(view)
        rank = self._node_rank(view, slow)
        picked = pack_pick(view, node_take=self._node_take, node_rank=rank)
        if picked is None:
            return unplaced(request, f"Packed-PM: no free GPUs satisfy {constraint_text(request)}")
        if slow >= view.n_bins or view.klass.bin_of[picked[0]].max() < slow:
            return placed(
                _describe(view, *picked),
                request,
                as_packing=self._as_packing(view, picked[0], slow),
            )
        capped = _without_bins_from(view, slow, self._slow_nodes(view, slow))
        alternative = (
            None if capped is None else pack_pick(capped, node_take=self._node_take, node_rank=rank)
        )
        if alternative is not None and _no_wider_and_faster(view, picked[0], alternative[0]):
            how = f"{alternative[1]}, GPUs above {self.avoid_above:g} left out"
            return placed(_describe(view, alternative[0], how), request)
        if self.wait and _fits_without(view, slow):
            verdict = self._weigh(view, picked[0], slow)
            if verdict.waits:
                return PlacementResult(
                    request,
                    None,
                    f"Packed-PM: {WAIT_REASON} (above {self.avoid_above:g}): {verdict.why}",
                    waits_off=tuple(_free_gpus_from_bin(view, slow)),
                    wait_until=verdict.until,
                )
            how = f"{picked[1]}, GPUs above {self.avoid_above:g} taken rather than wait: "
            return placed(_describe(view, picked[0], how + verdict.why), request)
        return placed(_describe(view, *picked), request)

    def _weigh(self, view: RequestView, picked: np.ndarray, slow: int) -> WaitVerdict:
        """Hold the job for other GPUs, or take packing's pick with its outliers?"""
        request, cluster = view.request, view.cluster
        good = _usable_mask(view) & (view.klass.bin_of < slow)
        running = running_jobs(cluster) if self.runtimes is not None else ()
        wait = expected_wait_s(
            cluster,
            good,
            request.gpus,
            view.shape.per_node,
            share=self._holder_shares(cluster, running),
        )
        slowdown, scale = _span_slowdown(view, picked)
        return weigh_wait(
            slowdown=slowdown,
            runtime_s=self._expected_runtime_s(request, running) * scale,
            waited_s=request.waited_s,
            wait_s=wait,
            max_wait_s=self.max_wait_s,
            now=cluster.clock,
        )

    def _holder_shares(
        self, cluster: Cluster, running: tuple[RunningJob, ...] = ()
    ) -> float | np.ndarray:
        """Per GPU, the share of its holder's limit the holder is expected to use, as the
        waiting job's own runtime is weighed: learned for limits like the holder's (the jobs
        of that class still ``running`` counted at what they have used so far), given what
        the holder has run already; else the configured ``limit_share``."""
        if self.runtimes is None or self.runtimes.limit_share is None:
            return self.limit_share
        with np.errstate(invalid="ignore"):
            limits = cluster.busy_until - cluster.busy_since
        known = np.isfinite(limits) & (limits > 0)
        shares = np.full(cluster.n_gpus, self.limit_share)
        if known.any():
            # one holder: one limit and one start; its median end given what it has run
            pairs = np.stack((limits[known], cluster.busy_since[known]), axis=1)
            distinct, where = np.unique(pairs, axis=0, return_inverse=True)
            learned = []
            for limit, since in distinct.tolist():
                used = max(0.0, (cluster.clock - since) / limit)
                learned.append(self.runtimes.share_of(limit, running, used))
            shares[known] = np.array(learned, dtype=float)[where.reshape(-1)]
        return shares

    def _expected_runtime_s(
        self, request: PlacementRequest, running: tuple[RunningJob, ...] = ()
    ) -> float:
        """What the job is weighed as running: what it is known to run; else what the site's
        finished jobs predict (``runtimes``: the share of their limits that jobs with limits
        like its own used, what unlimited jobs of its size ran); else ``limit_share`` of its
        time limit (weighed at the whole limit, a 16-GPU job that ran a third of it was held
        41 h and the queue drained behind it at its bound); else, with no limit or an
        unlimited one, ``assumed_runtime_s``. A limited job is never weighed as running less
        than a ``running`` job of its limit class has run already (what the site's jobs of
        that class ran so far is known even while none of the long ones has ended). Whatever
        it says, the wait it buys is bounded (:func:`~slurm_pal.core.waiting.weigh_wait`)."""
        if request.runtime_s is not None:
            return request.runtime_s
        limit = request.time_limit_s
        if self.runtimes is not None:
            learned = self.runtimes.predict(request.gpus, limit, running)
            if learned is not None and learned > 0:
                return learned
        if limit is not None and math.isfinite(limit):
            floor = 0.0
            if self.runtimes is not None:
                floor = self.runtimes.running_floor_s(limit, running)
            return max(limit * self.limit_share, floor)
        return min(self.assumed_runtime_s, self.max_wait_s)

    def _node_take(self, view: RequestView, nodes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Inside each chosen node: first the GPUs that are outliers for another class (but
        usable for this job), then in the node's order as packing does."""
        outlying = self._others_outlying(view)
        if outlying is None:
            return view.take(nodes, counts, 0, view.top, by_score=False)
        others, prefer = outlying
        slots = view.cluster.node_gpus[nodes]
        if not others[slots[slots >= 0]].any():
            return view.take(nodes, counts, 0, view.top, by_score=False)
        # A few nodes: plain Python over their handful of GPUs.
        cluster = view.cluster
        lists = cluster._gpu_lists
        bins = lists[f"bin:{view.request.job_class}"]
        models, wanted = lists["model"], view.gpu_model
        free, top = cluster.free, view.top
        picked: list[int] = []
        for node, count in zip(nodes.tolist(), counts.tolist(), strict=True):
            usable = [
                gpu
                for gpu in lists["node_gpus"][node]
                if free[gpu] and bins[gpu] <= top and (wanted is None or models[gpu] == wanted)
            ]
            usable.sort(key=lambda gpu: not prefer[gpu])
            picked.extend(usable[:count])
        return np.array(picked, dtype=np.intp)

    def _node_rank(self, view: RequestView, slow: int) -> np.ndarray | None:
        """Per node, a tie-break among nodes packing finds equal (lower first): nodes with free
        GPUs that are outliers for another class but not for this job first (it keeps them
        busy), then, for a job smaller than a node, nodes with free GPUs that are outliers for
        it (it fills in around them). A job that spreads over nodes goes the other way: nodes
        without free GPUs that are outliers for it first, so it never spreads onto outliers
        where a spread without them takes as many nodes. None: no such GPU is free.

        Left idle, a GPU the sensitive jobs avoid ends up under whoever comes when nothing else
        is free, and its node, emptied by the jobs that dodged it, under a whole-node job: in
        the worst replays a long 8- or 16-GPU job, slowed as a whole (a gang runs at its
        slowest GPU) for days."""
        if slow >= view.n_bins and self._others_outlying(view) is None:
            return None
        cluster = view.cluster
        mine = view.klass.bin_of >= slow
        outlying = self._others_outlying(view)
        soak = cluster.free & ~mine
        soak &= outlying[0] if outlying is not None else False
        around = cluster.free & mine
        spreads = _spreads(view)
        if view.request.gpus >= cluster.max_gpus_per_node and not spreads:
            around[:] = False
        if not (soak.any() or around.any()):
            return None
        nodes = cluster.n_nodes
        weight = cluster.max_gpus_per_node + 1
        kept_busy = np.bincount(cluster.gpu_node[soak], minlength=nodes) * weight
        outliers = np.bincount(cluster.gpu_node[around], minlength=nodes)
        if spreads:
            # A job spread over nodes takes every usable free GPU of all but its last node:
            # among nodes as full, those without its outliers first.
            return outliers * weight * weight - kept_busy
        return -(kept_busy + outliers)

    def _as_packing(self, view: RequestView, gpus: np.ndarray, slow: int) -> bool:
        """Is ``gpus`` plain packing's pick, with no free GPU the job could get an outlier for
        it? Then Slurm, wherever its best fit lands, gives the job nothing this policy avoids."""
        if slow < view.n_bins and _free_gpus_from_bin(view, slow):
            return False
        if self._others_outlying(view) is not None:
            plain = pack_pick(view)
            if plain is None or not np.array_equal(np.sort(plain[0]), np.sort(gpus)):
                return False
        return True

    def _slow_nodes(self, view: RequestView, first: int) -> np.ndarray:
        """The nodes holding a GPU of the job's class in bin ``first`` or above (cached)."""
        cluster, job_class = view.cluster, view.request.job_class
        key = (id(cluster.classes[job_class].scores), f"{job_class}:{first}")
        if key not in self._slow:
            rows = np.unique(cluster.gpu_node[view.klass.bin_of >= first])
            self._slow[key] = (cluster.classes[job_class].scores, rows)
        return self._slow[key][1]

    def _others_outlying(self, view: RequestView) -> tuple[np.ndarray, list[bool]] | None:
        """Per GPU: is it an outlier for some other class (as an array and a list)? None when
        no GPU is. Cached per cluster layout (scores never change; copies share them)."""
        cluster, job_class = view.cluster, view.request.job_class
        key = (id(cluster.classes[job_class].scores), job_class)
        if key not in self._outlying:
            mask = np.zeros(cluster.n_gpus, dtype=bool)
            for name in cluster.class_order:
                if name != job_class and math.isfinite(self.avoid_above):
                    mask |= cluster.classes[name].scores > self.avoid_above
            found = (mask, mask.tolist()) if mask.any() else None
            self._outlying[key] = (cluster.classes[job_class].scores, found)
        return self._outlying[key][1]

    def _first_slow_bin(self, view: RequestView) -> int:
        """The first bin of the job's class scoring above ``avoid_above`` (``n_bins``: none)."""
        if not math.isfinite(self.avoid_above):
            return view.n_bins
        return int(np.searchsorted(view.klass.bin_scores, self.avoid_above, side="right"))

    def __repr__(self) -> str:
        return (
            f"PackedPMPolicy(avoid_above={self.avoid_above:g}, wait={self.wait}, "
            f"max_wait_s={self.max_wait_s:g}, assumed_runtime_s={self.assumed_runtime_s:g}, "
            f"limit_share={self.limit_share:g})"
        )


def _describe(view: RequestView, gpus: np.ndarray, how: str) -> Allocation:
    return build_allocation(
        view,
        gpus,
        lambda level, worst, nodes: (
            f"Packed-PM: {how}, {nodes} (V={worst:.3g} L={level.penalty:g})"
        ),
    )


def _span_slowdown(view: RequestView, picked: np.ndarray) -> tuple[float, float]:
    """What taking ``picked`` slows the job by against the placement it waits for, and the
    locality penalty it would run at there: (V x L of the pick / L waited for, L waited for).
    The wait is for good GPUs on as few nodes as packing uses (one node for a job that fits
    one: no penalty), so a pick spread over nodes costs its span penalty too. Weighed at its
    outliers' score alone, a 2-GPU job took two 2.4x GPUs on two nodes (4.1x with the span)
    rather than wait for one node's good pair."""
    cluster = view.cluster
    nodes = np.unique(cluster.gpu_node[picked]).tolist()
    taken = float(view.klass.scores[picked].max()) * span_level(cluster, nodes).penalty
    shape = view.shape
    if shape.per_node is not None:
        one_node = (shape.node_count or 1) == 1
    else:
        one_node = view.request.gpus <= cluster.max_gpus_per_node
    waited = 1.0 if one_node or len(nodes) == 1 else span_level(cluster, nodes).penalty
    return taken / waited, waited


def _no_wider_and_faster(view: RequestView, packed: np.ndarray, alternative: np.ndarray) -> bool:
    """Are the ``alternative`` GPUs faster for the job (LV product) than packing's, without
    spanning more nodes? A job split over more nodes to dodge an outlier slows itself by the
    locality penalty and scatters the free GPUs for every multi-GPU job after it; a larger hole
    broken on no more nodes is a cost taken rather than leave usable GPUs idle."""
    cluster = view.cluster
    nodes_a = np.unique(cluster.gpu_node[packed])
    nodes_b = np.unique(cluster.gpu_node[alternative])
    if nodes_b.size > nodes_a.size:
        return False
    scores = view.klass.scores
    lv_a = float(scores[packed].max()) * span_level(cluster, nodes_a.tolist()).penalty
    lv_b = float(scores[alternative].max()) * span_level(cluster, nodes_b.tolist()).penalty
    return lv_b < lv_a


def _spreads(view: RequestView) -> bool:
    """Will packing spread the job over nodes (a GPU count no node holds free)?"""
    shape = view.shape
    if not shape.simple:
        return False
    return int(view.usable_counts().max(initial=0)) < shape.n


def _without_bins_from(
    view: RequestView, first_unusable: int, rows: np.ndarray
) -> RequestView | None:
    """The same view without the GPUs in bins >= ``first_unusable`` (None: too few left).
    ``rows``: the nodes holding such GPUs (few: only they change)."""
    totals = view.totals.copy()
    totals[first_unusable:] = 0
    if int(totals.sum()) < view.shape.n:
        return None
    n_bins = view.n_bins
    sorted_bins = view.sorted.copy()
    part = sorted_bins[rows]
    # Rows are sorted ascending, so the dropped bins are each row's tail: still sorted.
    part[part >= first_unusable] = n_bins
    sorted_bins[rows] = part
    counts = view.usable_counts().copy()
    counts[rows] = (part < n_bins).sum(axis=1)
    capped = RequestView(
        view.request, view.cluster, view.shape, sorted_bins, totals, view.gpu_model
    )
    capped.counts = counts
    capped.top = first_unusable - 1
    return capped


def _usable_mask(view: RequestView) -> np.ndarray:
    """Per GPU of the cluster, free or not: may this request ever run on it (its nodes'
    exclusions, features and GPU model)?"""
    cluster, request = view.cluster, view.request
    allowed = np.ones(cluster.n_nodes, dtype=bool)
    for name in request.excluded_nodes:
        if name in cluster.node_index:
            allowed[cluster.node_index[name]] = False
    if request.required_features:
        allowed &= cluster.nodes_with_features(request.required_features)
    usable = allowed[cluster.gpu_node]
    if request.gpu_model is not None and request.gpu_model.lower() in cluster.models:
        usable &= cluster.gpu_model == cluster.models.index(request.gpu_model.lower())
    return usable


def _fits_without(view: RequestView, first_unusable: int) -> bool:
    """Could the job ever run without the outliers, once GPUs free up? Counted on the GPUs its
    exclusions, features and model allow: a GPU count needs that many, GPUs per node need that
    many nodes with that many. A job pinned to nodes or node bounds takes what it can get
    rather than risk waiting for ever."""
    shape = view.shape
    good = _usable_mask(view) & (view.klass.bin_of < first_unusable)
    if shape.simple:
        return int(good.sum()) >= shape.n
    if shape.per_node is None or shape.required.size or shape.node_count is None:
        return False
    per_node = np.bincount(view.cluster.gpu_node[good], minlength=view.cluster.n_nodes)
    return int((per_node >= shape.per_node).sum()) >= shape.node_count


def _free_gpus_from_bin(view: RequestView, first: int) -> list[int]:
    """The free GPUs the request could use whose bin for its class is ``first`` or above."""
    mask = view.cluster.free & _usable_mask(view) & (view.klass.bin_of >= first)
    return np.flatnonzero(mask).tolist()
