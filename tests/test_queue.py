"""PAL's round: cut the queue where demand exceeds the free GPUs, sort the cut by class."""

from __future__ import annotations

import numpy as np
import pytest

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import get_policy
from slurm_pal.core.queue import (
    NodeBackfill,
    SlurmBackfill,
    backfill_reservation,
    placement_order,
    plan_round,
)
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology


def job(job_id: str, job_class: str, gpus: int) -> PlacementRequest:
    return PlacementRequest(job_id, job_class, gpus)


def cluster(nodes: int = 2, per_node: int = 4) -> Cluster:
    scores = [0.9, 1.0, 1.1, 1.3]
    gpus = [
        GpuSpec(f"n{n}-{i}", f"n{n}", i, "v100", {c: scores[(i + n) % 4] for c in ("A", "B", "C")})
        for n in range(nodes)
        for i in range(per_node)
    ]
    return Cluster.from_gpus(gpus, Topology.flat())


def test_placement_order_follows_the_papers_figure_4() -> None:
    """Six jobs, demand exceeds the GPUs after the fifth: the first five are sorted by class."""
    queue = [job("1", "B", 2), job("2", "C", 1), job("3", "A", 2), job("4", "B", 1)]
    queue += [job("5", "A", 2), job("6", "A", 2)]
    order = placement_order(queue, free_gpus=8, class_order=("A", "B", "C"))
    assert [r.job_id for r in order] == ["3", "5", "1", "4", "2", "6"]


def test_cut_excludes_the_job_that_crosses_and_keeps_the_tail_in_priority_order() -> None:
    queue = [job("1", "C", 3), job("2", "B", 3), job("3", "A", 1), job("4", "A", 1)]
    order = placement_order(queue, free_gpus=6, class_order=("A", "B", "C"))
    assert [r.job_id for r in order] == ["2", "1", "3", "4"]


def test_unknown_classes_sort_last_and_stably() -> None:
    queue = [job("1", "X", 1), job("2", "B", 1), job("3", "Y", 1), job("4", "A", 1)]
    order = placement_order(queue, free_gpus=4, class_order=("A", "B"))
    assert [r.job_id for r in order] == ["4", "2", "1", "3"]


def test_plan_round_places_class_a_first_on_the_best_gpus() -> None:
    state = cluster()
    queue = [job("c", "C", 1), job("a", "A", 1)]
    results = plan_round(queue, state, get_policy("pm-first"))
    assert [r.request.job_id for r in results] == ["a", "c"]
    a_gpu, c_gpu = (r.allocation.gpu_ids[0] for r in results if r.allocation)
    assert state.classes["A"].scores[a_gpu] == 0.9
    assert a_gpu != c_gpu


def test_plan_round_works_on_a_copy_unless_in_place() -> None:
    state = cluster()
    before = state.free.copy()
    results = plan_round([job("1", "A", 4), job("2", "B", 2)], state, get_policy("pal"))
    assert all(r.placed for r in results)
    np.testing.assert_array_equal(state.free, before)
    plan_round([job("1", "A", 4), job("2", "B", 2)], state, get_policy("pal"), in_place=True)
    assert state.n_free == 2


def test_stop_ends_the_round_at_the_first_misfit_and_skip_goes_on() -> None:
    state = cluster()
    queue = [job("1", "A", 6), job("2", "A", 4), job("3", "B", 2)]
    stopped = plan_round(queue, state, get_policy("pal"), on_misfit="stop")
    assert [(r.request.job_id, r.placed) for r in stopped] == [
        ("1", True),
        ("2", False),
        ("3", False),
    ]
    assert "did not fit" in stopped[2].reason
    skipped = plan_round(queue, state, get_policy("pal"), on_misfit="skip")
    assert [(r.request.job_id, r.placed) for r in skipped] == [
        ("1", True),
        ("2", False),
        ("3", True),
    ]


def test_allocations_in_a_round_never_overlap() -> None:
    state = cluster(nodes=4)
    queue = [job(str(i), "ABC"[i % 3], 1 + i % 4) for i in range(10)]
    results = plan_round(queue, state, get_policy("pal"), on_misfit="skip")
    used = [gpu for r in results if r.allocation for gpu in r.allocation.gpu_ids]
    assert len(used) == len(set(used)) == 16


def test_bad_misfit_option_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        plan_round([], cluster(), get_policy("pal"), on_misfit="backfill")  # type: ignore[arg-type]


@pytest.mark.parametrize("overtime_unlimited", [False, True])
def test_backfill_expects_a_job_past_its_limit_as_the_sites_slurm_does(
    overtime_unlimited: bool,
) -> None:
    """Three GPUs held by a job 50 s past its 100 s limit; the head wants all four. A Slurm
    that kills at the limit expects them now, so a 60 s job behind must not take the free
    GPU; one that lets jobs run on expects them a whole limit from now, so it may."""
    state = cluster(nodes=1)
    state.allocate([0, 1, 2])
    state.expect_free_at([0, 1, 2], 100.0, since=0.0)
    rule = SlurmBackfill(state, 150.0, overtime_unlimited=overtime_unlimited)
    assert rule.blocked(job("head", "A", 4))
    behind = PlacementRequest("short", "A", 1, time_limit_s=60.0)
    assert rule.admits(behind) is overtime_unlimited


def test_node_backfill_reserves_the_first_waiting_jobs_node_over_its_limit() -> None:
    """One node of four GPUs, three busy until 120 s: the first waiting job (2 GPUs, 120 s) is
    planned there at 120 s for its limit, so a 1-GPU job whose limit runs past 120 s may not
    take the free GPU now, one that ends by then may, and the second waiting job is planned
    only after the first (Slurm's reservations are whole nodes)."""
    state = cluster(nodes=1)
    state.allocate([0, 1, 2])
    state.expect_free_at([0, 1, 2], 120.0, since=0.0)
    rule = NodeBackfill(state, 10.0, held={"held"})
    first = PlacementRequest("first", "A", 2, time_limit_s=120.0)
    assert rule.fence(first) is None and rule.blocked(first)
    assert rule.reserved == [(120.0, 240.0, frozenset({0}))]
    assert rule.fence(PlacementRequest("long", "A", 1, time_limit_s=600.0)) == [3]
    assert rule.fence(PlacementRequest("short", "A", 1, time_limit_s=100.0)) == []
    rule.blocked(PlacementRequest("second", "A", 2, time_limit_s=120.0))
    assert rule.reserved[-1] == (240.0, 360.0, frozenset({0}))
    rule.blocked(PlacementRequest("held", "A", 4, time_limit_s=60.0))  # begin time later
    assert len(rule.reserved) == 2


def test_node_backfill_plans_a_job_of_several_nodes_where_none_is_reserved() -> None:
    """Two nodes of four: n0 busy until 100 s, n1 free. A 4-GPU job fits n1 now, so it is not
    waiting; an 8-GPU job is planned on both at 100 s, after which nothing else fits before its
    limit ends."""
    state = cluster(nodes=2)
    state.allocate([0, 1, 2, 3])
    state.expect_free_at([0, 1, 2, 3], 100.0, since=0.0)
    rule = NodeBackfill(state, 0.0)
    rule.blocked(PlacementRequest("wide", "A", 8, time_limit_s=50.0))
    assert rule.reserved == [(100.0, 150.0, frozenset({0, 1}))]
    assert rule.fence(PlacementRequest("x", "A", 1, time_limit_s=120.0)) == [4, 5, 6, 7]
    assert rule.fence(PlacementRequest("y", "A", 4, time_limit_s=90.0)) == []


def _brute_force_one_node(
    state: Cluster, now: float, reserved: list, need: int, span: float
) -> tuple[float, frozenset[int]] | None:
    """Slurm's plan for a one-node job by definition: every candidate time (now, a busy GPU's
    end, a reservation's end) on every node, the earliest where enough of the node's GPUs are
    free and none of its reservations overlaps the job's span, the fullest node then."""
    ends = [
        (float(state.busy_until[g]), int(state.gpu_node[g])) for g in np.flatnonzero(~state.free)
    ]
    times = sorted({now, *(e for e, _ in ends), *(e for _, e, _ in reserved)})
    found = []
    for node in range(len(state.node_names)):
        idle = int(np.sum(state.free & (state.gpu_node == node)))
        for t in times:
            available = idle + sum(1 for e, n in ends if n == node and e <= t)
            clash = any(node in nodes and s < t + span and e > t for s, e, nodes in reserved)
            if available >= need and not clash:
                found.append((t, available, node))
                break
    if not found:
        return None
    t, _, node = min(found)
    return t, frozenset({node})


@pytest.mark.parametrize("seed", range(12))
def test_node_backfill_plans_one_node_jobs_as_the_definition_does(seed: int) -> None:
    """Random busy clusters and queues: the planner's reservations for one-node jobs equal a
    brute-force search over every candidate time and node (its shortcuts skip only times and
    nodes that cannot win)."""
    rng = np.random.default_rng(seed)
    state = cluster(nodes=int(rng.integers(2, 7)), per_node=4)
    busy = [g for g in range(state.n_gpus) if rng.random() < 0.7]
    state.allocate(busy)
    for gpu in busy:
        state.expect_free_at([gpu], float(rng.integers(1, 40)) * 30.0, since=0.0)
    rule = NodeBackfill(state, 0.0)
    expected: list = []
    for number in range(int(rng.integers(3, 12))):
        need, span = int(rng.integers(1, 5)), float(rng.integers(1, 20)) * 45.0
        plan = _brute_force_one_node(state, 0.0, expected, need, span)
        if plan is not None:
            expected.append((plan[0], plan[0] + span, plan[1]))
        rule.blocked(PlacementRequest(f"j{number}", "A", need, time_limit_s=span))
        assert rule.reserved == expected


def test_node_backfill_sees_a_job_placed_during_the_pass() -> None:
    """The running jobs' ends are read once a pass, and again after a job is placed: the job
    started in the pass ends later than the GPU was free, and the next plan counts it."""
    state = cluster(nodes=1)
    state.allocate([0, 1, 2])
    state.expect_free_at([0, 1, 2], 100.0, since=0.0)
    rule = NodeBackfill(state, 0.0)
    rule.blocked(PlacementRequest("wide", "A", 4, time_limit_s=50.0))
    assert rule.reserved == [(100.0, 150.0, frozenset({0}))]
    short = PlacementRequest("short", "A", 1, time_limit_s=80.0)
    state.allocate([3])
    state.expect_free_at([3], 80.0, since=0.0)
    rule.placed(short, get_policy("packed").place(short, cluster(nodes=1)))
    rule.blocked(PlacementRequest("next", "A", 4, time_limit_s=10.0))
    assert rule.reserved[-1] == (150.0, 160.0, frozenset({0}))


def test_easy_reservation_counts_every_gpu_free_at_its_time() -> None:
    """A 4-GPU job listed GPU by GPU (as the service's view lists them) ends at 100 s: a
    2-GPU head is reserved then, and the two other GPUs that free with it are spare, as one
    4-GPU entry gives."""
    per_gpu = backfill_reservation(0, [(100.0, 1)] * 4 + [(300.0, 1)], 2)
    assert per_gpu == backfill_reservation(0, [(100.0, 4), (300.0, 1)], 2) == (100.0, 2)
    assert backfill_reservation(1, [(50.0, 1), (100.0, 2)], 2) == (50.0, 0)


def test_node_backfill_tries_no_job_past_its_test_limit() -> None:
    """sched/backfill plans at most ``bf_max_job_test`` waiting jobs a cycle; the jobs after
    them are neither planned nor started, even one that would fit (here: after two)."""
    state = cluster(nodes=1)
    state.allocate([0, 1, 2])
    state.expect_free_at([0, 1, 2], 120.0, since=0.0)
    rule = NodeBackfill(state, 0.0, max_job_test=2)
    for number in range(2):
        waiting = PlacementRequest(f"w{number}", "A", 4, time_limit_s=60.0)
        assert rule.admits(waiting) and rule.blocked(waiting)
    assert len(rule.reserved) == 2
    assert not rule.admits(PlacementRequest("fits", "A", 1, time_limit_s=10.0))
