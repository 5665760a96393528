"""PAL (PAL paper, Algorithm 2): walk the class's L x V matrix from the smallest LV product and
take the first entry the free GPUs can satisfy.

- within-node entry (1.0, V_i): one node whose N best usable GPUs all score <= V_i. Among such
  nodes: the smallest worst score, then best fit (fewest free GPUs left), then node order.
  (PAL's code enumerates every N-combination of every such node; the N best GPUs of a node are the
  combination with the smallest maximum, so nothing is enumerated here. PAL's code breaks ties
  toward the node with the most such GPUs; best fit keeps large holes for large jobs.)
- within-switch entry (L_switch, V_i): the same inside one leaf switch, taking the switch's GPUs
  PM-First (best scores, ties toward packing).
- across entry (L_across, V_i): PM-First among GPUs scoring <= V_i.

Because feasibility only grows with V_i, each level's first feasible entry is found from per-node
(or per-switch) cumulative bin counts in one vectorized step; the walk then just compares. The
first entry reached has the smallest LV product any allocation can have.

Single-GPU jobs go to PM-First (as in the paper). Jobs larger than a node are not sent to
PM-First wholesale as the paper does: they walk the same matrix, where within-node entries are
simply infeasible. On a topology without switches that is exactly PM-First; with switches it
prefers one switch when that pays.
"""

from __future__ import annotations

import numpy as np

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.lxv import LxVMatrix
from slurm_pal.core.placement.base import PlacementResult
from slurm_pal.core.placement.pmfirst import PackTolerant, constraint_text, pmfirst_place
from slurm_pal.core.placement.view import (
    build_allocation,
    packed_within,
    placed,
    prepare,
    unplaced,
)
from slurm_pal.core.request import PlacementRequest

__all__ = ["PALPolicy"]


class PALPolicy(PackTolerant):
    """PAL placement: minimize locality penalty x worst PM-score through the L x V traversal.

    ``pack_tolerance`` (default 0: the paper) accepts an LV product that much worse than the
    best (0.02 = 2 %) to pack the job on the fullest node that allows it; see
    :func:`slurm_pal.core.placement.view.consolidate` for why Slurm needs it.
    """

    name = "pal"

    def matrix(self, cluster: Cluster, job_class: str) -> LxVMatrix:
        """The class's L x V matrix (the cluster caches it per layout)."""
        return cluster.lxv(job_class)

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"PAL: {view}")
        if request.gpus == 1:
            label = "PAL (1 GPU: PM-First)"
            return packed_within(view, pmfirst_place(view, label), self.pack_tolerance, label)
        matrix = self.matrix(cluster, request.job_class)
        first_by_rank: dict[int, tuple[np.ndarray, int]] = {}
        for entry in matrix.traversal:
            rank = entry.level.rank
            known = first_by_rank.get(rank)
            if known is None:
                first = view.first_bins(rank)
                known = first_by_rank[rank] = (first, int(first.min()))
            first, earliest = known
            if earliest > entry.bin:
                continue
            group = view.best_group(rank, first, entry.bin)
            gpus = view.select(rank, group, entry.bin)
            allocation = build_allocation(
                view,
                gpus,
                lambda level, worst, nodes, e=entry: (  # type: ignore[misc]
                    f"PAL: {e.level.name} entry #{e.rank} V={e.score:.3g} L={e.level.penalty:g} "
                    f"(LV={e.lv_product:.3g}), {nodes}"
                ),
            )
            return packed_within(view, placed(allocation, request), self.pack_tolerance, "PAL")
        return unplaced(request, f"PAL: no free GPUs satisfy {constraint_text(request)}")

    def __repr__(self) -> str:
        return f"PALPolicy(pack_tolerance={self.pack_tolerance:g})"
