"""What a job asks of the placement: its class, its GPU count and the user's constraints.

:class:`PlacementRequest` mirrors what a Slurm GPU job can say: ``--gpus`` (per job),
``--gpus-per-node`` / ``--gres=gpu:N`` (per node), ``-N min[-max]``, ``--nodelist``,
``--exclude``, ``--constraint`` (node features, all required) and a GPU model
(``--gpus=v100:4``). The constructor raises ValueError only for programming errors (wrong types,
negative counts); anything a user could write that cannot be satisfied (``--gpus=6
--gpus-per-node=4``, a node both required and excluded) is reported by :meth:`problem` and the
policies turn it into a result without an allocation. They never raise on user input.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["PlacementRequest"]


def _frozen_names(values: Iterable[str] | str) -> frozenset[str]:
    if isinstance(values, str):
        raise ValueError(f"expected a collection of names, got the string {values!r}")
    return frozenset(values)


def _check_count(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class PlacementRequest:
    """One job's placement request.

    ``gpus`` is the job's total; with ``gpus_per_node`` every node used gets exactly that many
    (so ``gpus / gpus_per_node`` nodes). ``min_nodes``/``max_nodes`` bound the number of nodes
    used. Every ``required_nodes`` node gets at least one GPU (``gpus_per_node`` if given), like
    Slurm's ``--nodelist``; other nodes may be added. ``gpu_model`` is matched case-insensitively.
    ``time_limit_s`` is the job's time limit (``inf``: UNLIMITED; None: not known);
    ``runtime_s`` what it is known to run, when that is known better than its limit (the
    simulator's perfect knowledge of a trace without limits).
    """

    job_id: str
    job_class: str
    gpus: int
    gpus_per_node: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    required_nodes: frozenset[str] = field(default_factory=frozenset)
    excluded_nodes: frozenset[str] = field(default_factory=frozenset)
    required_features: frozenset[str] = field(default_factory=frozenset)
    gpu_model: str | None = None
    runtime_s: float | None = None
    waited_s: float = 0.0
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        if self.runtime_s is not None and not self.runtime_s > 0:
            raise ValueError(f"runtime_s must be > 0 seconds or None, got {self.runtime_s!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(
                f"time_limit_s must be > 0 seconds, inf or None, got {self.time_limit_s!r}"
            )
        if not self.waited_s >= 0:
            raise ValueError(f"waited_s must be >= 0 seconds, got {self.waited_s!r}")
        _check_count("gpus", self.gpus, 0)
        _check_count("gpus_per_node", self.gpus_per_node, 0)
        _check_count("min_nodes", self.min_nodes, 0)
        _check_count("max_nodes", self.max_nodes, 0)
        object.__setattr__(self, "job_id", str(self.job_id))
        for name in ("required_nodes", "excluded_nodes", "required_features"):
            object.__setattr__(self, name, _frozen_names(getattr(self, name)))

    @classmethod
    def from_slurm(
        cls,
        job_id: str,
        job_class: str,
        *,
        gpus: int | None = None,
        gpus_per_node: int | None = None,
        nodes: int | tuple[int, int] | None = None,
        required_nodes: Iterable[str] = (),
        excluded_nodes: Iterable[str] = (),
        required_features: Iterable[str] = (),
        gpu_model: str | None = None,
    ) -> PlacementRequest:
        """Build from Slurm-style options, deriving the job total the way Slurm does.

        ``--gpus-per-node=g -N k`` means ``g * k`` GPUs (``-N min-max`` takes ``min``; no ``-N``
        means one node); ``--gpus=T`` is the total whatever the node count.
        """
        min_nodes, max_nodes = (nodes, nodes) if isinstance(nodes, int) else (nodes or (None, None))
        if gpus is None:
            gpus = (gpus_per_node or 0) * (min_nodes if min_nodes is not None else 1)
        return cls(
            job_id=job_id,
            job_class=job_class,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            required_nodes=frozenset(required_nodes),
            excluded_nodes=frozenset(excluded_nodes),
            required_features=frozenset(required_features),
            gpu_model=gpu_model,
        )

    @property
    def node_count(self) -> int | None:
        """The exact number of nodes implied by ``gpus_per_node``, else None (any count)."""
        if self.gpus_per_node:
            return self.gpus // self.gpus_per_node
        return None

    def problem(self) -> str | None:
        """Why no cluster could ever satisfy this request, or None if it is coherent."""
        if self.gpus == 0:
            return "the job asks for no GPUs"
        if self.gpus_per_node == 0:
            return "gpus_per_node is 0"
        if self.min_nodes == 0 or self.max_nodes == 0:
            return "a node count of 0"
        low = self.min_nodes or 1
        if self.max_nodes is not None and self.max_nodes < low:
            return f"min nodes {low} > max nodes {self.max_nodes}"
        clash = self.required_nodes & self.excluded_nodes
        if clash:
            return f"node(s) both required and excluded: {', '.join(sorted(clash))}"
        high = self.max_nodes
        if self.gpus_per_node:
            if self.gpus % self.gpus_per_node:
                return f"{self.gpus} GPUs cannot be split into {self.gpus_per_node} GPUs per node"
            count = self.gpus // self.gpus_per_node
            if count < low or (high is not None and count > high):
                bounds = f"{low}-{high}" if high is not None else f">= {low}"
                return (
                    f"{self.gpus} GPUs at {self.gpus_per_node} per node need {count} node(s), "
                    f"outside the node count {bounds}"
                )
            high = count
        elif low > self.gpus:
            return f"{low} nodes cannot each get a GPU out of {self.gpus}"
        if high is not None and len(self.required_nodes) > high:
            return f"{len(self.required_nodes)} required nodes but at most {high} node(s) allowed"
        if len(self.required_nodes) > self.gpus:
            return (
                f"{len(self.required_nodes)} required nodes cannot each get one of {self.gpus} GPUs"
            )
        return None
