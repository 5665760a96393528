"""PAL and PM-First against a brute-force reference on small random clusters.

The reference enumerates every set of N usable free GPUs that honours the request (node list,
exclusions, features, model, GPUs per node, node count) and prices it by the paper's rule:
``penalty(level spanned) * max PM-score``. Then:

- PAL's LV product is the smallest any allocation has (ties allowed: any optimal set will do);
- PM-First's worst score is the smallest any allocation has, and without constraints it takes
  exactly the N lowest scores;
- every policy places the job exactly when some allocation exists, and only valid ones.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import get_policy
from slurm_pal.core.placement.base import Allocation
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology

SCORE_VALUES = (0.8, 0.9, 1.0, 1.1, 1.5, 2.5)
FEATURES = ("ib", "nvlink")


@dataclass(frozen=True)
class Case:
    cluster: Cluster
    request: PlacementRequest


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_nodes = draw(st.integers(1, 5))
    sizes = [draw(st.integers(1, 4)) for _ in range(n_nodes)]
    node_names = [f"n{i}" for i in range(n_nodes)]
    features = {name: frozenset(draw(st.sets(st.sampled_from(FEATURES)))) for name in node_names}
    models = {name: draw(st.sampled_from(["v100", "a100"])) for name in node_names}
    mixed_node = draw(st.booleans())
    gpus = []
    for name, size in zip(node_names, sizes, strict=True):
        for index in range(size):
            model = models[name]
            if mixed_node and name == "n0" and index == 0:
                model = "h100"
            scores = {
                "A": draw(st.sampled_from(SCORE_VALUES)),
                "B": draw(st.sampled_from(SCORE_VALUES[:3])),
            }
            gpus.append(GpuSpec(f"{name}-g{index}", name, index, model, scores, features[name]))

    across = draw(st.sampled_from([1.0, 1.3, 1.7, 1.7, 2.5]))
    if draw(st.booleans()):
        topology = Topology.flat(across_nodes=across)
    else:
        switch_of = {
            name: switch
            for name in node_names
            if (switch := draw(st.sampled_from(["s0", "s0", "s1", None]))) is not None
        }
        within_switch = draw(st.sampled_from([None, 1.0, (1.0 + across) / 2, (1.0 + across) / 2]))
        topology = Topology(switch_of, within_switch=within_switch, across_switches=across)

    busy = [g.uuid for g in gpus if draw(st.integers(0, 4)) == 0]
    cluster = Cluster.from_gpus(gpus, topology, busy=busy)

    total = len(gpus)
    n = draw(st.integers(1, min(total, 6)))
    constrained = draw(st.integers(0, 2)) == 0  # a third of the cases carry user constraints
    per_node = min_nodes = max_nodes = model = None
    required: set[str] = set()
    excluded: set[str] = set()
    features: set[str] = set()
    if constrained:
        per_node = draw(st.sampled_from([None, None, 1, 2, 3]))
        if per_node is not None and n % per_node:
            n = per_node * max(1, n // per_node)
        min_nodes = draw(st.sampled_from([None, None, 1, 2]))
        max_nodes = draw(st.sampled_from([None, None, 1, 2, 3]))
        required = draw(st.sets(st.sampled_from(node_names), max_size=2))
        excluded = draw(st.sets(st.sampled_from(node_names), max_size=1))
        features = draw(st.sets(st.sampled_from(FEATURES), max_size=1))
        model = draw(st.sampled_from([None, None, "V100", "h100"]))
    request = PlacementRequest(
        job_id="job",
        job_class=draw(st.sampled_from(["A", "B"])),
        gpus=n,
        gpus_per_node=per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        required_nodes=frozenset(required),
        excluded_nodes=frozenset(excluded),
        required_features=frozenset(features),
        gpu_model=model,
    )
    return Case(cluster, request)


def usable_gpus(case: Case) -> list[int]:
    """GPU ids the request may use, straight from the definitions."""
    cluster, request = case.cluster, case.request
    usable = []
    for gpu in range(cluster.n_gpus):
        node = cluster.node_names[cluster.gpu_node[gpu]]
        if not cluster.free[gpu] or node in request.excluded_nodes:
            continue
        if not request.required_features <= cluster.node_features[cluster.gpu_node[gpu]]:
            continue
        model = cluster.models[cluster.gpu_model[gpu]]
        if request.gpu_model is not None and model != request.gpu_model.lower():
            continue
        usable.append(gpu)
    return usable


def is_valid(case: Case, gpu_ids: tuple[int, ...]) -> bool:
    cluster, request = case.cluster, case.request
    if len(gpu_ids) != request.gpus or len(set(gpu_ids)) != len(gpu_ids):
        return False
    if not set(gpu_ids) <= set(usable_gpus(case)):
        return False
    per_node: dict[str, int] = {}
    for gpu in gpu_ids:
        node = cluster.node_names[cluster.gpu_node[gpu]]
        per_node[node] = per_node.get(node, 0) + 1
    if request.gpus_per_node is not None and set(per_node.values()) != {request.gpus_per_node}:
        return False
    if request.min_nodes is not None and len(per_node) < request.min_nodes:
        return False
    if request.max_nodes is not None and len(per_node) > request.max_nodes:
        return False
    return request.required_nodes <= per_node.keys()


def price(case: Case, gpu_ids: tuple[int, ...]) -> tuple[float, float]:
    """(LV product, max score) by the paper's rule."""
    cluster = case.cluster
    nodes = {cluster.node_names[cluster.gpu_node[gpu]] for gpu in gpu_ids}
    worst = max(cluster.classes[case.request.job_class].scores[gpu] for gpu in gpu_ids)
    return cluster.topology.level_of(frozenset(nodes)).penalty * worst, worst


def all_allocations(case: Case) -> list[tuple[int, ...]]:
    if case.request.problem() is not None:
        return []
    if not case.request.required_nodes <= set(case.cluster.node_names):
        return []
    return [
        combo
        for combo in itertools.combinations(usable_gpus(case), case.request.gpus)
        if is_valid(case, combo)
    ]


def check_allocation_is_consistent(case: Case, allocation: Allocation) -> None:
    assert is_valid(case, allocation.gpu_ids)
    lv, worst = price(case, allocation.gpu_ids)
    assert math.isclose(allocation.lv_product, lv)
    assert math.isclose(allocation.max_score, worst)
    assert allocation.uuids == tuple(case.cluster.uuids[g] for g in allocation.gpu_ids)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases())
def test_pal_reaches_the_smallest_lv_product_of_any_allocation(case: Case) -> None:
    free_before = case.cluster.free.copy()
    result = get_policy("pal").place(case.request, case.cluster)
    np.testing.assert_array_equal(case.cluster.free, free_before)
    allocations = all_allocations(case)
    if not allocations:
        assert result.allocation is None and result.reason
        return
    assert result.allocation is not None, result.reason
    check_allocation_is_consistent(case, result.allocation)
    best = min(price(case, combo)[0] for combo in allocations)
    assert math.isclose(result.allocation.lv_product, best), (result.reason, best)


@SETTINGS
@given(cases())
def test_pm_first_reaches_the_smallest_worst_score(case: Case) -> None:
    result = get_policy("pm-first").place(case.request, case.cluster)
    allocations = all_allocations(case)
    if not allocations:
        assert result.allocation is None and result.reason
        return
    assert result.allocation is not None, result.reason
    check_allocation_is_consistent(case, result.allocation)
    best = min(price(case, combo)[1] for combo in allocations)
    assert math.isclose(result.allocation.max_score, best)
    request = case.request
    unconstrained = not (
        request.gpus_per_node or request.required_nodes or request.min_nodes or request.max_nodes
    )
    if unconstrained:
        scores = case.cluster.classes[request.job_class].scores
        lowest = sorted(scores[g] for g in usable_gpus(case))[: request.gpus]
        assert sorted(scores[g] for g in result.allocation.gpu_ids) == lowest


@SETTINGS
@given(cases(), st.sampled_from(["packed", "random"]))
def test_baselines_place_exactly_when_an_allocation_exists(case: Case, name: str) -> None:
    result = get_policy(name).place(case.request, case.cluster)
    if all_allocations(case):
        assert result.allocation is not None, result.reason
        check_allocation_is_consistent(case, result.allocation)
    else:
        assert result.allocation is None and result.reason


@SETTINGS
@given(cases(), st.sampled_from(["pal", "pm-first"]), st.sampled_from([0.01, 0.05, 0.3]))
def test_pack_tolerance_stays_within_its_bound_of_the_paper_choice(
    case: Case, name: str, tolerance: float
) -> None:
    """With ``pack_tolerance`` the policies may trade LV for packing, never more than asked,
    never an invalid allocation, and they place exactly when the paper's policy places."""
    paper = get_policy(name).place(case.request, case.cluster)
    packed = get_policy(name, pack_tolerance=tolerance).place(case.request, case.cluster)
    assert (paper.allocation is None) == (packed.allocation is None)
    if paper.allocation is None or packed.allocation is None:
        return
    check_allocation_is_consistent(case, packed.allocation)
    bound = paper.allocation.lv_product * (1 + tolerance)
    assert packed.allocation.lv_product <= bound * (1 + 1e-9), (packed.reason, bound)
    # never more nodes than the paper's choice
    assert len(packed.allocation.node_names) <= len(paper.allocation.node_names)


@SETTINGS
@given(
    cases(),
    st.sampled_from([1.05, 1.2, 2.0]),
    st.booleans(),
    st.sampled_from([None, 60.0, 7200.0]),
    st.sampled_from([0.0, 30.0, 600.0, math.inf]),
)
def test_packed_pm_with_outliers_against_every_allocation(
    case: Case, avoid_above: float, wait: bool, runtime_s: float | None, frees_in: float
) -> None:
    """packed-pm never spans more nodes than packing, takes an outlier only when no allocation
    on as few nodes avoids it (or when waiting does not pay), holds a job back only when some
    allocation exists, none avoids the outliers on as few nodes, and the wait ends by its
    bound; otherwise it places exactly when an allocation exists."""
    cluster = case.cluster
    cluster.clock = 1000.0
    busy = np.flatnonzero(~cluster.free)
    if busy.size:
        cluster.expect_free_at(busy, 1000.0 + frees_in)
    request = PlacementRequest(
        **{
            **{f: getattr(case.request, f) for f in case.request.__dataclass_fields__},
            "runtime_s": runtime_s,
        }
    )
    case = Case(cluster, request)
    policy = get_policy("packed-pm", avoid_above=avoid_above, wait=wait, max_wait_s=3600.0)
    result = policy.place(request, cluster)
    allocations = all_allocations(case)
    packing = get_policy("packed").place(request, cluster).allocation
    scores = cluster.classes[request.job_class].scores
    if not allocations:
        assert result.allocation is None and not result.waits
        return
    assert packing is not None
    if result.allocation is None:
        assert wait and result.waits, result.reason
        assert result.wait_until is not None and result.wait_until <= 1000.0 + 3600.0
        outlier_free = [
            combo
            for combo in allocations
            if max(scores[g] for g in combo) <= avoid_above
            and len({cluster.gpu_node[g] for g in combo}) <= len(packing.node_names)
        ]
        assert not outlier_free
        assert all(scores[g] > avoid_above for g in result.waits_off)
        return
    check_allocation_is_consistent(case, result.allocation)
    assert len(result.allocation.node_names) <= len(packing.node_names)
    if result.allocation.max_score > avoid_above and packing.max_score > avoid_above:
        # It kept an outlier: no allocation on as few nodes avoids every outlier and is
        # cheaper for the job, else packed-pm would have taken one like it.
        cheaper = [
            combo
            for combo in allocations
            if max(scores[g] for g in combo) <= avoid_above
            and len({cluster.gpu_node[g] for g in combo}) <= len(packing.node_names)
            and price(case, combo)[0] < packing.lv_product
            and _packable(case, combo, packing)
        ]
        assert not cheaper, (result.reason, cheaper)


def _packable(case: Case, combo: tuple[int, ...], packing: Allocation) -> bool:
    """Could packing's own node choice rule have picked ``combo``'s nodes once the outliers
    are gone? Only when the job fits each node it uses as packing fills them: packed-pm
    re-runs packing without the outliers, so it only finds allocations of that shape."""
    return len({case.cluster.gpu_node[g] for g in combo}) == 1 or len(packing.node_names) > 1
