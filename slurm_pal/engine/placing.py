"""The engine's one decision entry point: where a job's placement request goes now.

Why one function: the service's submit decision (``decide``), its re-planning rounds (through
``decide``) and the simulator's Slurm mode must ask the policy the same question in the same
way (the clock set, the time a held job has waited counted, each of its partitions tried, the
held jobs' bound, and whether Slurm's own packing may be left to place it), or the simulator's
verdict says nothing about the service. Pure: ``cluster`` is read, never changed, except for
its clock, which is set to ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import Allocation, PlacementPolicy, PlacementResult
from slurm_pal.core.request import PlacementRequest

__all__ = ["ANYWHERE", "Placement", "place"]

#: No partition restriction: one candidate, no node left out.
ANYWHERE: tuple[tuple[str | None, frozenset[str]], ...] = ((None, frozenset()),)


@dataclass(frozen=True)
class Placement:
    """What the policy answered for one request on its partitions.

    ``best``: the placed result with the smallest LV product (the first partition listed on a
    tie), None when no partition fits it now. ``results``: every partition's answer, in order.
    ``wait_until``: the earliest bound a partition's policy holds the job to (None: not held);
    ``waits_off``: the free GPUs it is held off. ``left_to_slurm``: the pick is packing's own
    with nothing to avoid and the driver leaves such jobs to Slurm (``pin = "steered"``)."""

    request: PlacementRequest
    best: PlacementResult | None
    results: tuple[PlacementResult, ...]
    reasons: tuple[str, ...]
    waits_off: tuple[int, ...] = ()
    wait_until: float | None = None
    left_to_slurm: bool = False

    @property
    def allocation(self) -> Allocation | None:
        return None if self.best is None else self.best.allocation

    @property
    def waits(self) -> bool:
        """Held back although it could start (not placed, a bound set)."""
        return self.best is None and self.wait_until is not None

    def result(self) -> PlacementResult:
        """One ``PlacementResult`` for a queue loop: the best placed one, else the only
        partition's own answer, else the partitions' reasons joined (held when one held it)."""
        if self.best is not None:
            return self.best
        if len(self.results) == 1:
            return self.results[0]
        return PlacementResult(
            self.request,
            None,
            "; ".join(self.reasons),
            waits_off=self.waits_off,
            wait_until=self.wait_until,
        )


def place(
    policy: PlacementPolicy,
    request: PlacementRequest,
    cluster: Cluster,
    *,
    now: float | None = None,
    waiting_since: float | None = None,
    candidates: Iterable[tuple[str | None, frozenset[str]]] = ANYWHERE,
    leave_packing: bool = False,
) -> Placement:
    """Ask ``policy`` where ``request`` goes among ``cluster``'s free GPUs.

    ``now`` (the driver's clock) becomes the cluster's clock, which a policy that weighs
    waiting reads ``busy_until`` against; ``waiting_since``: the job has been held since then,
    so its wait counts against the bound from there. ``candidates``: (partition, nodes outside
    it) to try in order. ``leave_packing``: a pick that is packing's own with nothing to avoid
    (``PlacementResult.as_packing``) is marked ``left_to_slurm``."""
    if now is not None:
        cluster.clock = now
        if waiting_since is not None:
            request = replace(request, waited_s=max(0.0, now - waiting_since))
    best: PlacementResult | None = None
    results: list[PlacementResult] = []
    reasons: list[str] = []
    waits_off: set[int] = set()
    wait_until: float | None = None
    for partition, outside in candidates:
        attempt = request
        if outside:
            attempt = replace(request, excluded_nodes=request.excluded_nodes | outside)
        result = policy.place(attempt, cluster)
        results.append(result)
        if result.allocation is None:
            reasons.append(f"{partition}: {result.reason}" if partition else result.reason)
            if result.waits:
                waits_off.update(result.waits_off)
                until = result.wait_until if result.wait_until is not None else cluster.clock
                wait_until = until if wait_until is None else min(wait_until, until)
        elif best is None or result.allocation.lv_product < best.allocation.lv_product:  # type: ignore[union-attr]
            best = result
    return Placement(
        request,
        best,
        tuple(results),
        tuple(reasons),
        waits_off=tuple(sorted(waits_off)),
        wait_until=wait_until if best is None else None,
        left_to_slurm=leave_packing and best is not None and best.as_packing,
    )
