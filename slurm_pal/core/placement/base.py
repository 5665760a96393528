"""What every placement policy returns, and the interface they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.request import PlacementRequest

__all__ = ["Allocation", "PlacementPolicy", "PlacementResult"]


@dataclass(frozen=True)
class Allocation:
    """The GPUs chosen for a job, and what the choice costs it.

    ``gpu_ids`` are the cluster's internal GPU rows (what :meth:`Cluster.allocate` takes), sorted
    by (node, the node's order); ``uuids``, ``nodes`` and ``local_indices`` describe the same GPUs.
    ``max_score`` is V (the slowest GPU for the job's class), ``penalty`` is L of the ``level``
    the GPUs span, and ``lv_product = penalty * max_score`` is the job's predicted slowdown.
    """

    job_id: str
    job_class: str
    gpu_ids: tuple[int, ...]
    uuids: tuple[str, ...]
    nodes: tuple[str, ...]
    local_indices: tuple[int, ...]
    max_score: float
    level: str
    penalty: float
    lv_product: float
    reason: str

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_ids)

    @property
    def node_names(self) -> tuple[str, ...]:
        """The distinct nodes used, in allocation order."""
        return tuple(dict.fromkeys(self.nodes))

    def gpus_by_node(self) -> dict[str, tuple[int, ...]]:
        """``{node: local GPU indices}``: what a Slurm ``--gres``/``CUDA_VISIBLE_DEVICES`` needs."""
        by_node: dict[str, list[int]] = {}
        for node, index in zip(self.nodes, self.local_indices, strict=True):
            by_node.setdefault(node, []).append(index)
        return {node: tuple(indices) for node, indices in by_node.items()}


@dataclass(frozen=True)
class PlacementResult:
    """A policy's answer: an allocation, or None with the reason it could not place the job.

    ``waits_off``: the policy holds the job back although it could start now, because the only
    GPUs it fits on are these (internal GPU rows; e.g. outliers for its class). Whoever drives
    the policy must keep the job off them until others free up.

    ``as_packing``: the allocation is packing's own pick (Slurm's best fit would choose the
    same nodes and GPUs) and no free GPU the job could get is one the policy avoids for it, so
    whatever Slurm picks now is as good: a driver may leave the job to Slurm instead of pinning
    it to these GPUs (a pin held by a stale view only ever costs).

    ``wait_until``: with ``waits_off``, the latest time (the cluster's clock) the job may be held
    to; by then it starts wherever it fits (a driver tells Slurm, e.g. as the job's begin time)."""

    request: PlacementRequest
    allocation: Allocation | None
    reason: str
    waits_off: tuple[int, ...] = ()
    as_packing: bool = False
    wait_until: float | None = None

    @property
    def waits(self) -> bool:
        return self.allocation is None and bool(self.waits_off)

    @property
    def placed(self) -> bool:
        return self.allocation is not None


@runtime_checkable
class PlacementPolicy(Protocol):
    """A placement policy. ``place`` must not mutate the cluster nor raise on user input."""

    name: str

    def place(self, request: PlacementRequest, cluster: Cluster) -> PlacementResult:
        """Choose GPUs for ``request`` among the cluster's free GPUs."""
        ...
