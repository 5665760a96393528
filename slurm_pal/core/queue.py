"""One placement round over a pending queue, with PAL's placement priority (paper, section III-B).

The scheduler decides *which* jobs run (its priority order); the placement decides *where*. PAL
keeps the two apart: it cuts the queue at the longest prefix whose total GPU demand fits in the
free GPUs (those jobs are due this round whatever their class), sorts that prefix by class, most
variability-sensitive first, so class A jobs pick the best GPUs, and leaves the rest of the
queue in priority order behind it. Jobs are then placed one by one, each seeing the GPUs the
earlier ones took.

On a job that does not fit, ``on_misfit="stop"`` ends the round there (PAL's code: no
backfilling, so the head of the queue is never overtaken) and ``"skip"`` goes on with the next
job (backfill-like; it can delay the job that did not fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import PlacementPolicy, PlacementResult
from slurm_pal.core.request import PlacementRequest

__all__ = ["placement_order", "plan_round"]

OnMisfit = Literal["stop", "skip"]


def placement_order(
    requests: Sequence[PlacementRequest], free_gpus: int, class_order: Sequence[str]
) -> list[PlacementRequest]:
    """PAL's cut-and-sort: the longest priority-order prefix whose cumulative demand is at most
    ``free_gpus``, stably sorted by ``class_order`` (unknown classes last), then the rest of the
    queue unchanged."""
    cut = 0
    demand = 0
    for request in requests:
        if demand + request.gpus > free_gpus:
            break
        demand += request.gpus
        cut += 1
    rank = {name: position for position, name in enumerate(class_order)}
    head = sorted(requests[:cut], key=lambda request: rank.get(request.job_class, len(rank)))
    return [*head, *requests[cut:]]


def plan_round(
    requests: Sequence[PlacementRequest],
    cluster: Cluster,
    policy: PlacementPolicy,
    *,
    on_misfit: OnMisfit = "stop",
    class_order: Sequence[str] | None = None,
    in_place: bool = False,
) -> list[PlacementResult]:
    """Place ``requests`` (given in the scheduler's priority order) for one round.

    Returns one result per request, in the order they were considered (see
    :func:`placement_order`); with ``on_misfit="stop"`` the jobs after the first misfit get a
    result without allocation saying so. Allocations are made on a copy of ``cluster`` unless
    ``in_place`` (then the caller's cluster ends the round with every allocation applied).
    ``class_order`` defaults to the cluster's.
    """
    if on_misfit not in ("stop", "skip"):
        raise ValueError(f"on_misfit must be 'stop' or 'skip', got {on_misfit!r}")
    state = cluster if in_place else cluster.copy()
    order = placement_order(
        requests, state.n_free, class_order if class_order is not None else state.class_order
    )
    results: list[PlacementResult] = []
    for position, request in enumerate(order):
        result = policy.place(request, state)
        results.append(result)
        if result.allocation is not None:
            state.allocate(result.allocation)
        elif on_misfit == "stop":
            note = f"not considered: the round stopped at job {request.job_id}, which did not fit"
            results.extend(PlacementResult(later, None, note) for later in order[position + 1 :])
            break
    return results
