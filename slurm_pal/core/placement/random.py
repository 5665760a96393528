"""Random placement (the PAL paper's Random baseline): N usable free GPUs drawn uniformly.

Seeded through a numpy Generator, so a simulation replays exactly. Unlike Blox's version (which
wants strictly more than N free GPUs) a job fits when exactly N are free. Constraints are
respected: ``--gpus-per-node`` draws the nodes, then the GPUs on each; required nodes each get a
random GPU first.
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

__all__ = ["RandomPolicy"]


class RandomPolicy:
    """Uniformly random usable free GPUs, from a seeded generator."""

    name = "random"

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        view = prepare(request, cluster)
        if isinstance(view, str):
            return unplaced(request, f"Random: {view}")
        gpus = self._pick(view)
        if gpus is None:
            return unplaced(request, f"Random: no free GPUs satisfy {constraint_text(request)}")
        allocation = build_allocation(
            view,
            gpus,
            lambda level, worst, nodes: f"Random: {nodes} (V={worst:.3g} L={level.penalty:g})",
        )
        return placed(allocation, request)

    def _pick(self, view: RequestView) -> np.ndarray | None:
        shape, rng = view.shape, self.rng
        free = view.usable_counts()
        nodes = np.flatnonzero(free)
        if shape.per_node is not None:
            assert shape.node_count is not None
            if (free[shape.required] < shape.per_node).any():
                return None
            others = np.setdiff1d(np.flatnonzero(free >= shape.per_node), shape.required)
            wanted = shape.node_count - shape.required.size
            if others.size < wanted:
                return None
            chosen = np.concatenate((shape.required, rng.choice(others, wanted, replace=False)))
            per_node = view.usable_gpus(chosen)
            return np.concatenate([rng.choice(g, shape.per_node, replace=False) for g in per_node])
        if shape.simple:
            pool = np.concatenate(view.usable_gpus(nodes))
            return rng.choice(pool, shape.n, replace=False)
        if (free[shape.required] < 1).any():
            return None
        others = rng.permutation(np.setdiff1d(nodes, shape.required))
        chosen = self._grow(list(shape.required), others, free, shape.n, shape.min_nodes)  # type: ignore[assignment]
        if shape.max_nodes is not None and len(chosen) > shape.max_nodes:
            fullest = others[np.argsort(-free[others], kind="stable")]
            chosen = self._grow(list(shape.required), fullest, free, shape.n, shape.min_nodes)  # type: ignore[assignment]
        total = int(free[chosen].sum())
        if total < shape.n or len(chosen) < shape.min_nodes:
            return None
        if shape.max_nodes is not None and len(chosen) > shape.max_nodes:
            return None
        per_node = [rng.permutation(g) for g in view.usable_gpus(np.array(chosen, np.intp))]
        firsts = np.array([g[0] for g in per_node], dtype=np.intp)
        rest = rng.permutation(np.concatenate([g[1:] for g in per_node]))
        return np.concatenate((firsts, rest[: shape.n - firsts.size]))

    @staticmethod
    def _grow(
        chosen: list[int], candidates: np.ndarray, free: np.ndarray, n: int, min_nodes: int
    ) -> list[int]:
        total = int(free[chosen].sum()) if chosen else 0
        for node in candidates:
            if total >= n and len(chosen) >= min_nodes:
                break
            chosen.append(int(node))
            total += int(free[node])
        return chosen

    def __repr__(self) -> str:
        return f"RandomPolicy(seed={self.seed})"
