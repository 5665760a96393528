"""One placement round over a pending queue, with PAL's placement priority (paper, section III-B).

This is the project's one queue loop: the advisor's re-planning rounds, the simulator's Slurm
mode and the paper's round mode all run :func:`queue_round`; they differ only in how a job is
placed (a policy, or the advisor's decision around it), in whether a placement may be taken
(``review``: a pending job Slurm cannot move is kept) and in when jobs may start (the
:class:`StartRule`: PAL stops at the first job that does not fit; a simulated Slurm backfills).

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

import bisect
import math
from collections.abc import Callable, Container, Iterable, Sequence
from enum import StrEnum
from typing import Literal, NamedTuple, Protocol

import numpy as np

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement.base import PlacementPolicy, PlacementResult
from slurm_pal.core.request import PlacementRequest

__all__ = [
    "BACKFILL_RESERVES",
    "BF_WINDOW_S",
    "NodeBackfill",
    "Outcome",
    "SlurmBackfill",
    "StartRule",
    "Step",
    "StopAtMisfit",
    "backfill_reservation",
    "expected_end",
    "placement_order",
    "plan_round",
    "queue_round",
]

OnMisfit = Literal["stop", "skip"]


class Outcome(StrEnum):
    """What a round did with one pending job."""

    PLACED = "placed"
    """GPUs chosen and taken: the job starts there (simulator) or is routed there (advisor)."""
    UNCHANGED = "unchanged"
    """GPUs chosen equal what the job already holds: taken, nothing to send."""
    KEPT = "kept"
    """GPUs chosen, but the job cannot be moved there (Slurm would refuse or mishandle the
    change): it keeps its request and the GPUs stay free for the jobs after it."""
    WAITS = "waits"
    """The policy holds the job back although it could start (only outlier GPUs are free)."""
    NO_FIT = "no-fit"
    """No GPUs fit the job now."""
    HELD = "held"
    """The start rule does not let the job start now (it would delay a reserved job)."""
    NOT_CONSIDERED = "not-considered"
    """The round stopped before this job."""

    @property
    def takes_gpus(self) -> bool:
        return self in (Outcome.PLACED, Outcome.UNCHANGED)


class Step(NamedTuple):
    """One pending job's outcome in a round, with the policy's answer (None: not asked). A
    tuple: a round over 10,000 pending jobs makes one per job, most of them not considered."""

    request: PlacementRequest
    outcome: Outcome
    result: PlacementResult | None

    @property
    def reason(self) -> str:
        return self.result.reason if self.result is not None else self.outcome.value


class StartRule(Protocol):
    """When jobs may start, in priority order: the scheduler's part of a round."""

    def admits(self, request: PlacementRequest) -> bool:
        """May this job start now, if it fits?"""
        ...

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        """This job was placed and its GPUs taken (it starts now, where the rule starts jobs)."""
        ...

    def blocked(self, request: PlacementRequest) -> bool:
        """This job did not get GPUs now; True goes on with the next job (backfill)."""
        ...

    def fence(self, request: PlacementRequest) -> list[int] | None:
        """Free GPUs this job may not start on now (kept for jobs ahead of it); None: none."""
        ...


class StopAtMisfit:
    """PAL's rule: no backfilling, the round ends at the first job that does not fit, so the
    head of the queue is never overtaken (``go_on``: skip it and go on instead). ``held``: jobs
    held to a later begin time, which Slurm does not consider yet; one that does not fit is
    gone past, as Slurm goes past it."""

    def __init__(self, go_on: bool = False, held: Container[str] = ()) -> None:
        self.go_on = go_on
        self.held = held

    def admits(self, request: PlacementRequest) -> bool:
        return True

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        return None

    def fence(self, request: PlacementRequest) -> list[int] | None:
        return None

    def blocked(self, request: PlacementRequest) -> bool:
        return self.go_on or request.job_id in self.held


class SlurmBackfill:
    """Slurm's EASY backfill (``sched/backfill``) as a real Slurm's round predicts it: jobs
    start in priority order; the first job that does not fit gets a reservation, at the time
    enough GPUs free up by the running jobs' limits (``cluster.busy_until``) with the GPUs
    left over then, and a later job starts before it only if its own limit ends by then or it
    fits in those left over (by GPU count, as the simulator's Slurm counts them). A job held
    to a later begin time (``held``) is gone past without a reservation, as Slurm does. A job
    past its limit is expected as Slurm expects it (:func:`expected_end`; ``overtime_unlimited``:
    the site's ``OverTimeLimit=UNLIMITED``).

    Why: going past a misfit alone (``StopAtMisfit(go_on=True)``) routed a 4-GPU job to a
    node Slurm kept for the 8-GPU job ahead of it; the job waited there for a minute while
    the round planned the next job on the same GPUs (testbed, ``dl`` seed 1)."""

    def __init__(
        self,
        cluster: Cluster,
        now: float,
        held: Container[str] = (),
        *,
        overtime_unlimited: bool = False,
    ) -> None:
        self.cluster = cluster
        self.now = now
        self.held = held
        self.overtime_unlimited = overtime_unlimited
        self.shadow: float | None = None
        self.spare = 0

    def _ends_in_time(self, request: PlacementRequest) -> bool:
        if self.shadow is None:
            return False
        if math.isinf(self.shadow):
            return True  # no start can be planned for the head: nothing behind it delays it
        limit = request.time_limit_s
        return limit is not None and self.now + limit <= self.shadow

    def admits(self, request: PlacementRequest) -> bool:
        if self.shadow is None:
            return True
        return self._ends_in_time(request) or request.gpus <= self.spare

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        if self.shadow is not None and not self._ends_in_time(request):
            self.spare -= request.gpus

    def fence(self, request: PlacementRequest) -> list[int] | None:
        return None  # EASY by GPU count: a job's place is never fenced, only its start

    def blocked(self, request: PlacementRequest) -> bool:
        if self.shadow is not None or request.job_id in self.held:
            return True
        cluster = self.cluster
        busy = ~cluster.free
        killed = not self.overtime_unlimited
        ends = (
            (expected_end(until, until - since, self.now, killed=killed), 1)
            for until, since in zip(
                cluster.busy_until[busy].tolist(), cluster.busy_since[busy].tolist(), strict=True
            )
        )
        self.shadow, self.spare = backfill_reservation(cluster.n_free, ends, request.gpus)
        return True


BACKFILL_RESERVES = ("head", "nodes")
"""What a backfilling Slurm keeps free for the jobs that wait, as modelled: ``head``, EASY
(:class:`SlurmBackfill`); ``nodes``, sched/backfill's own plan (:class:`NodeBackfill`)."""
BF_WINDOW_S = 86400.0
"""sched/backfill's default ``bf_window`` (1440 min): a job whose start it cannot plan within
a day of now gets no reservation."""
BF_MAX_JOB_TEST = 500
"""sched/backfill's default ``bf_max_job_test``: the waiting jobs it plans in one cycle; the
jobs after them in priority order are not tried at all (neither started nor reserved for)."""


class NodeBackfill:
    """Slurm's sched/backfill as it plans: every waiting job it tests, in priority order, is
    planned at the earliest time enough GPUs free up (the running jobs' expected ends,
    ``cluster.busy_until``) on nodes no earlier job has reserved over this job's limit, and
    those *nodes* are reserved for it over its limit (``_add_reservation`` keeps node
    bitmaps, so two waiting jobs never share a node in the plan); a later job starts now only
    on nodes no reservation covers over its own limit (:meth:`fence`). A job held to a later
    begin time (``held``) gets none. Nodes are chosen as cons_tres best-fits: the fullest one
    a one-node job fits on, else the emptiest first. After ``max_job_test`` planned jobs (its
    ``bf_max_job_test``) no later job is tried in the pass: neither started nor planned, which
    also keeps a round over 10,000 pending jobs within an Epilog's wait.

    Why: EASY by GPU count (:class:`SlurmBackfill`, the simulator's default) starts jobs a
    real Slurm keeps waiting: on one node of four GPUs, the second waiting job is planned
    after the first one's limit though both fit, and a long 1-GPU job stays off the free GPU
    (22.05 and 24.11, tests/slurm/test_backfill_reservations.py)."""

    def __init__(
        self,
        cluster: Cluster,
        now: float,
        held: Container[str] = (),
        *,
        overtime_unlimited: bool = False,
        window_s: float = BF_WINDOW_S,
        max_job_test: int = BF_MAX_JOB_TEST,
    ) -> None:
        self.cluster = cluster
        self.now = now
        self.held = held
        self.killed = not overtime_unlimited
        self.window_s = window_s
        self.max_job_test = max_job_test
        self.tested = 0
        self.reserved: list[tuple[float, float, frozenset[int]]] = []  # (start, end, nodes)
        self._ends: tuple[list[tuple[float, int]], dict[int, list[float]]] | None = None
        self._blocks: dict[int, list[tuple[float, float]]] = {}  # node -> (end, start), by end

    @staticmethod
    def span(request: PlacementRequest) -> float:
        """How long Slurm plans the job to hold its nodes: its limit (its known run time
        without one; without either, for ever)."""
        if request.time_limit_s is not None:
            return request.time_limit_s
        return request.runtime_s if request.runtime_s is not None else math.inf

    def _covered(self, start: float, end: float) -> set[int]:
        return {n for s, e, nodes in self.reserved if s < end and e > start for n in nodes}

    def admits(self, request: PlacementRequest) -> bool:
        return self.tested < self.max_job_test  # past that, Slurm tries no job this cycle

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        self._ends = None  # its GPUs are busy now: the expected ends are read anew

    def fence(self, request: PlacementRequest) -> list[int] | None:
        if not self.reserved:
            return None
        nodes = self._covered(self.now, self.now + self.span(request))
        cluster = self.cluster
        return [
            int(gpu)
            for node in sorted(nodes)
            for gpu in cluster.node_gpus[node]
            if gpu >= 0 and cluster.free[gpu]
        ]

    def blocked(self, request: PlacementRequest) -> bool:
        if request.job_id in self.held:
            return True  # not eligible yet: Slurm plans nothing for it
        self.tested += 1
        cluster = self.cluster
        free = np.bincount(cluster.gpu_node[cluster.free], minlength=len(cluster.node_names))
        span = self.span(request)
        # a job of one whole node's worth (--gres=gpu:N, one node) plans as any one-node job
        per_node = request.gpus_per_node
        one_node = request.gpus == per_node or (
            per_node is None and request.gpus <= cluster.max_gpus_per_node
        )
        plan = self._on_one_node if one_node else self._on_nodes
        planned = plan(request, span, free.tolist())
        if planned is not None:
            start, end = planned[0], planned[0] + span
            self.reserved.append((start, end, frozenset(planned[1])))
            for node in planned[1]:
                bisect.insort(self._blocks.setdefault(node, []), (end, start))
        return True

    def _frees(self) -> tuple[list[tuple[float, int]], dict[int, list[float]]]:
        """(when Slurm expects it free, its node) for each busy GPU, soonest first, and each
        node's ends in order. Read once a pass until a job is placed: a pass plans every
        waiting job against the same running ones."""
        if self._ends is None:
            cluster, now = self.cluster, self.now
            busy = np.flatnonzero(~cluster.free)
            until, since = cluster.busy_until[busy].tolist(), cluster.busy_since[busy].tolist()
            nodes = cluster.gpu_node[busy].tolist()
            frees = sorted(
                (expected_end(u, u - s, now, killed=self.killed), n)
                for u, s, n in zip(until, since, nodes, strict=True)
            )
            by_node: dict[int, list[float]] = {}
            for end, node in frees:
                by_node.setdefault(node, []).append(end)
            self._ends = frees, by_node
        return self._ends

    def _on_one_node(
        self, request: PlacementRequest, span: float, free: list[int]
    ) -> tuple[float, list[int]] | None:
        """The earliest start on one node (its own GPUs' ends and reservations only), the
        fullest node at that time."""
        now, need = self.now, request.gpus
        ends = self._frees()[1]
        # Before its (need - count)-th end a node cannot hold the job; nodes are tried from
        # the soonest such time, and none that cannot start it before the best found is tried.
        candidates = []
        for node, count in enumerate(free):
            node_ends = ends.get(node, [])
            if count + len(node_ends) >= need:
                first = -math.inf if count >= need else node_ends[need - count - 1]
                candidates.append((first, node, count, node_ends))
        candidates.sort()
        best: tuple[float, int, int] | None = None  # (start, free GPUs then, node)
        for first, node, count, node_ends in candidates:
            if best is not None and first > best[0]:
                break
            blocks = self._blocks.get(node, [])
            # The earliest of Slurm's candidate times (now, an end, a reservation's end) from
            # ``first`` on that no reservation of the node overlaps over the job's span. Past a
            # clash the next candidate that can be clear is the soonest clashing end, so one
            # walk through the node's reservations by end finds it: one passed over for
            # starting after the span ends before any later candidate.
            earliest = max(first, now)  # Slurm plans no start before now
            t = min(x for x in (now, *node_ends, *(e for e, _ in blocks)) if x >= earliest)
            for e, s in blocks:
                if e > t and s < t + span:
                    t = e
            if t <= now + self.window_s and (best is None or t <= best[0]):
                here = (t, count + bisect.bisect_right(node_ends, t), node)
                best = here if best is None else min(best, here)
        return None if best is None else (best[0], [best[2]])

    def _on_nodes(
        self, request: PlacementRequest, span: float, free: list[int]
    ) -> tuple[float, list[int]] | None:
        """The earliest time enough GPUs are free on nodes no reservation covers over the
        job's limit (a job of whole nodes, or one that spreads)."""
        now = self.now
        frees = self._frees()[0]
        times = {now, *(t for t, _ in frees), *(e for _, e, _ in self.reserved)}
        freed, total = 0, sum(free)
        for t in sorted(t for t in times if now <= t <= now + self.window_s):
            while freed < len(frees) and frees[freed][0] <= t:
                free[frees[freed][1]] += 1
                freed += 1
                total += 1
            if total < request.gpus:
                continue  # too few GPUs free then on all nodes together
            covered = self._covered(t, t + span)
            nodes = [n for n, k in enumerate(free) if k > 0 and n not in covered]
            chosen = _fit_nodes(request, nodes, free)
            if chosen is not None:
                return t, chosen
        return None


def _fit_nodes(
    request: PlacementRequest, nodes: Sequence[int], free: Sequence[int]
) -> list[int] | None:
    """Nodes (of ``nodes``, ``free`` GPUs each) a job of ``request`` fits on, as cons_tres
    picks them: one node, the fullest that fits; else (a job that may spread) the emptiest
    first; a job of whole nodes, ``gpus / gpus_per_node`` nodes with that many free."""
    per_node = request.gpus_per_node
    if per_node is not None:
        fitting = sorted((n for n in nodes if free[n] >= per_node), key=lambda n: (free[n], n))
        count = request.gpus // per_node
        return fitting[:count] if len(fitting) >= count else None
    one = [n for n in nodes if free[n] >= request.gpus]
    if one:
        return [min(one, key=lambda n: (free[n], n))]
    if request.max_nodes == 1:
        return None
    chosen, total = [], 0
    for n in sorted(nodes, key=lambda n: (-free[n], n)):
        chosen.append(n)
        total += free[n]
        if total >= request.gpus:
            return chosen
    return None


def expected_end(limit_end: float, limit_s: float | None, now: float, *, killed: bool) -> float:
    """When Slurm's backfill expects a running job to end (select/cons_tres ``_guess_job_end``):
    at its limit's end while that is ahead; once the job has run past it, in a second when
    Slurm kills it there (``killed``: ``OverTimeLimit=0``), else a whole limit from now
    (``OverTimeLimit=UNLIMITED``: Slurm has no idea, and guesses the job runs its limit again).

    Why: planned at a limit's end already past, a queue head's reservation lay in the past, so
    no job ended by it, and GPUs idled for hours behind jobs far past their limits that Slurm
    22.05 backfills around (site-like week, 1-GPU nodes, a 16-GPU job at its bound). Slurm
    24.11 does not: its cons_tres counts such a job gone at once, whatever ``OverTimeLimit``
    (``killed``'s answer; tests/slurm/test_overtime_backfill.py measures both)."""
    if limit_end > now or limit_s is None or not math.isfinite(limit_s):
        return limit_end
    return now + 1.0 if killed else now + limit_s


def backfill_reservation(
    free: int, ends: Iterable[tuple[float, int]], needed: int
) -> tuple[float, int]:
    """EASY backfill's reservation for a job of ``needed`` GPUs: when enough GPUs are free (by
    GPU count: ``free`` now, and each ``(end, gpus)`` of the running jobs as it ends) and how
    many are left over then. Never (inf, 0) when unlimited holders (an ``inf`` end) stand in
    the way: Slurm cannot plan past them either. The simulated Slurm and the service's
    prediction of a real one reserve alike. Everything that ends at the reservation's time is
    free then, and left over: the service lists a job's GPUs one by one, and stopping at the
    first GPU that made enough left its GPUs that end with it out of the spare."""
    ordered = sorted(ends)
    for position, (end, gpus) in enumerate(ordered):
        if not math.isfinite(end):
            break
        free += gpus
        if free >= needed:
            free += sum(more for when, more in ordered[position + 1 :] if when == end)
            return end, free - needed
    return math.inf, 0


Review = Callable[[PlacementRequest, PlacementResult], Outcome]
"""Whether a placed job's GPUs are taken: PLACED, UNCHANGED (taken) or KEPT (not taken)."""


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


def queue_round(
    requests: Sequence[PlacementRequest],
    cluster: Cluster,
    place: Callable[[PlacementRequest, Cluster], PlacementResult],
    *,
    class_order: Sequence[str] | None = None,
    start: StartRule | None = None,
    review: Review | None = None,
) -> list[Step]:
    """One round over ``requests`` (in the scheduler's priority order) on ``cluster``, which is
    changed in place: every job whose GPUs are taken is allocated on it.

    1. PAL's cut and class sort (:func:`placement_order`; ``class_order=()`` keeps the
       scheduler's order);
    2. each job in that order: the start rule may hold it; ``place`` chooses its GPUs among the
       free ones; ``review`` says whether they are taken (default: yes);
    3. a job that finds no GPUs asks the start rule whether to go on; a job the policy holds
       back (``WAITS``) is not eligible yet (Slurm sees its begin time), so it neither ends the
       round nor gets a reservation: the round goes on without it.
    """
    rule = start if start is not None else StopAtMisfit()
    order = placement_order(
        requests, cluster.n_free, class_order if class_order is not None else cluster.class_order
    )
    steps: list[Step] = []
    for position, request in enumerate(order):
        if not rule.admits(request):
            steps.append(Step(request, Outcome.HELD, None))
            continue
        hidden = rule.fence(request)
        if hidden:  # kept for jobs ahead of it: out of the placement's sight
            cluster.allocate(hidden)
            try:
                result = place(request, cluster)
            finally:
                cluster.release(hidden)
        else:
            result = place(request, cluster)
        if result.allocation is None:
            outcome = Outcome.WAITS if result.waits else Outcome.NO_FIT
            steps.append(Step(request, outcome, result))
            if outcome is Outcome.WAITS:
                continue
            if not rule.blocked(request):
                skipped = Outcome.NOT_CONSIDERED
                steps.extend([Step(later, skipped, None) for later in order[position + 1 :]])
                break
            continue
        outcome = review(request, result) if review is not None else Outcome.PLACED
        if outcome.takes_gpus:
            cluster.allocate(result.allocation)
            rule.placed(request, result)
        steps.append(Step(request, outcome, result))
    return steps


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
    steps = queue_round(
        requests,
        state,
        policy.place,
        class_order=class_order,
        start=StopAtMisfit(go_on=on_misfit == "skip"),
    )
    results: list[PlacementResult] = []
    stopped_at: str | None = None
    for step in steps:
        if step.result is not None:
            results.append(step.result)
            if step.result.allocation is None and on_misfit == "stop":
                stopped_at = step.request.job_id
        else:
            note = f"not considered: the round stopped at job {stopped_at}, which did not fit"
            results.append(PlacementResult(step.request, None, note))
    return results
