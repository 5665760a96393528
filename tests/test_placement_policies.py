"""Each policy's own rules, the user's constraints, reasons, and the registry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import POLICIES, PALPolicy, PlacementPolicy, get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology


def make_cluster(
    layout: dict[str, list[float]],
    topology: Topology | None = None,
    busy: tuple[str, ...] = (),
    models: dict[str, str] | None = None,
    features: dict[str, set[str]] | None = None,
) -> Cluster:
    """``layout``: node -> class-A score of each GPU (index = position). UUIDs are node-index."""
    gpus = [
        GpuSpec(
            f"{node}-{i}",
            node,
            i,
            (models or {}).get(f"{node}-{i}", (models or {}).get(node, "v100")),
            {"A": score},
            frozenset((features or {}).get(node, set())),
        )
        for node, scores in layout.items()
        for i, score in enumerate(scores)
    ]
    return Cluster.from_gpus(gpus, topology or Topology.flat(), busy=busy)


def place(policy: str, cluster: Cluster, gpus: int, **constraints: object) -> list[str]:
    request = PlacementRequest("j", "A", gpus, **constraints)  # type: ignore[arg-type]
    result = get_policy(policy).place(request, cluster)
    assert result.allocation is not None, result.reason
    return list(result.allocation.uuids)


# --- PAL --------------------------------------------------------------------------------------


def test_pal_within_node_takes_the_nodes_best_gpus_and_the_best_fit_node() -> None:
    cluster = make_cluster(
        {"n0": [1.0, 0.9, 0.9, 1.0], "n1": [1.5, 0.9, 0.9, 1.0], "n2": [0.9, 1.0, 1.0, 1.5]},
        busy=("n1-3",),
    )
    # n0 and n1 both hold two 0.9 GPUs; n1 has fewer free GPUs left afterwards (best fit)
    assert place("pal", cluster, 2) == ["n1-1", "n1-2"]
    # three GPUs: n0 (0.9, 0.9, 1.0) beats n1 (0.9, 0.9, 1.5)
    assert place("pal", cluster, 3) == ["n0-0", "n0-1", "n0-2"]


def test_pal_uses_a_priced_switch_before_crossing_the_spine() -> None:
    layout = {"a1": [0.9, 0.9], "a2": [0.9, 0.9], "b1": [0.8, 0.8], "b2": [2.0, 2.0]}
    leaf = {"a1": "sa", "a2": "sa", "b1": "sb", "b2": "sb"}
    priced = make_cluster(layout, Topology(leaf, within_switch=1.2, across_switches=2.0))
    # 3 GPUs: no node holds them; switch sa gives 1.2 x 0.9 = 1.08 < 1.2 x 2.0 (sb) < 2.0 x 0.8
    result = get_policy("pal").place(PlacementRequest("j", "A", 3), priced)
    assert result.allocation is not None
    assert result.allocation.node_names == ("a1", "a2")
    assert result.allocation.level == "within-switch"
    assert result.allocation.lv_product == pytest.approx(1.08)
    assert "within-switch entry" in result.reason
    # PM-First only looks at scores: 0.8, 0.8, 0.9, across the spine (LV 2.0 x 0.9)
    assert place("pm-first", priced, 3) == ["a1-0", "b1-0", "b1-1"]


def test_pal_with_gpus_per_node_takes_each_nodes_best_gpus() -> None:
    cluster = make_cluster({"n0": [1.2, 0.9, 1.0, 1.0], "n1": [1.5, 1.5, 0.9, 0.9]})
    assert place("pal", cluster, 2, gpus_per_node=2) == ["n1-2", "n1-3"]
    # two nodes x 2: each node's two best (equal scores: lowest index)
    assert place("pal", cluster, 4, gpus_per_node=2) == ["n0-1", "n0-2", "n1-2", "n1-3"]


def test_pal_reason_names_the_entry_and_nodes() -> None:
    cluster = make_cluster({"n03": [0.94, 0.94]})
    result = get_policy("pal").place(PlacementRequest("j", "A", 2), cluster)
    assert result.reason == "PAL: within-node entry #1 V=0.94 L=1 (LV=0.94), node n03"
    assert result.allocation is not None and result.allocation.reason == result.reason


def test_pal_caches_one_matrix_per_layout_and_class() -> None:
    policy = PALPolicy()
    cluster = make_cluster({"n0": [1.0, 0.9]})
    assert policy.matrix(cluster, "A") is policy.matrix(cluster.copy(), "A")


# --- PM-First ---------------------------------------------------------------------------------


def test_pm_first_breaks_score_ties_toward_the_best_matching_node() -> None:
    """PAL's code: locality score |count of equal-score free GPUs on the node - N|."""
    cluster = make_cluster({"n0": [0.9, 0.9, 0.9, 0.9], "n1": [0.9, 0.9, 1.2, 1.2]})
    assert place("pm-first", cluster, 2) == ["n1-0", "n1-1"]
    assert place("pm-first", cluster, 4) == ["n0-0", "n0-1", "n0-2", "n0-3"]


def test_pm_first_takes_lower_bins_whole_then_packs_the_last_bin() -> None:
    cluster = make_cluster({"n0": [0.8, 1.0, 1.0, 1.5], "n1": [1.0, 1.0, 1.0, 1.5]})
    assert place("pm-first", cluster, 4) == ["n0-0", "n1-0", "n1-1", "n1-2"]


# --- Packed -----------------------------------------------------------------------------------


def test_packed_follows_bloxs_three_steps() -> None:
    cluster = make_cluster(
        {"n0": [1.0] * 4, "n1": [1.0] * 4, "n2": [1.0] * 4},
        busy=("n0-0", "n0-1", "n1-0"),
    )
    assert place("packed", cluster, 2) == ["n0-2", "n0-3"]  # exact fit
    assert place("packed", cluster, 3) == ["n1-1", "n1-2", "n1-3"]  # exact fit
    assert place("packed", cluster, 1) == ["n0-2"]  # smallest node that fits (2 free)
    # 6 GPUs: no node holds them; n2 (4 free) then n1 (3 free)
    assert place("packed", cluster, 6) == ["n1-1", "n1-2", "n2-0", "n2-1", "n2-2", "n2-3"]


def test_packed_gives_a_job_of_gpus_per_node_the_nodes_cons_tres_gives() -> None:
    """The tightest block of consecutive usable nodes, then the best fit inside it
    (tests/slurm/test_packing_picks.py holds a real Slurm to the same picks)."""
    layout = {f"n{i}": [1.0] * 4 for i in range(5)}
    cluster = make_cluster(
        layout, busy=("n0-0", "n1-0", "n1-1", "n2-0", *(f"n3-{i}" for i in range(4)))
    )
    # blocks n0-n2 (3, 2, 3 free) and n4 (4 free): n4 alone is the tighter block
    assert place("packed", cluster, 1, gpus_per_node=1) == ["n4-0"]
    assert place("packed", cluster, 2, gpus_per_node=2) == ["n4-0", "n4-1"]
    # a job of GPUs anywhere (--gpus) still goes to the fewest free GPUs that hold it
    assert place("packed", cluster, 1) == ["n1-2"]
    cluster = make_cluster(layout, busy=(*(f"n2-{i}" for i in range(4)), "n4-0", "n4-1"))
    # blocks n0-n1 (8 free) and n3-n4 (4 + 2): the tighter block's best-fit node
    assert place("packed", cluster, 1, gpus_per_node=1) == ["n4-2"]
    # three nodes of 2: no block has three, so the larger one whole, then the other's best fit
    assert place("packed", cluster, 6, gpus_per_node=2) == [
        "n0-0", "n0-1", "n1-0", "n1-1", "n4-2", "n4-3",
    ]  # fmt: skip


def test_packed_ignores_scores() -> None:
    cluster = make_cluster({"n0": [2.5, 2.5], "n1": [0.8, 0.8, 0.8]})
    assert place("packed", cluster, 2) == ["n0-0", "n0-1"]


# --- Random -----------------------------------------------------------------------------------


def test_random_is_reproducible_with_a_seed_and_fits_exactly_n_free() -> None:
    layout = {f"n{i}": [1.0] * 4 for i in range(8)}
    cluster = make_cluster(layout)
    request = PlacementRequest("j", "A", 3)
    draws = [get_policy("random", seed=5).place(request, cluster).allocation for _ in range(2)]
    assert draws[0] == draws[1]
    other = get_policy("random", seed=6).place(request, cluster).allocation
    assert other != draws[0]
    tiny = make_cluster({"n0": [1.0, 1.0]})
    assert sorted(place("random", tiny, 2)) == ["n0-0", "n0-1"]  # Blox needed > N free


# --- user constraints, the same for every policy ------------------------------------------------

ALL = sorted(POLICIES)


@pytest.mark.parametrize("policy", ALL)
def test_constraints_are_respected(policy: str) -> None:
    cluster = make_cluster(
        {"n0": [0.8] * 4, "n1": [0.9] * 4, "n2": [1.0] * 4, "n3": [1.1] * 4},
        models={"n3": "a100"},
        features={"n1": {"ib"}, "n2": {"ib"}},
    )
    nodes = lambda uuids: {u.split("-")[0] for u in uuids}  # noqa: E731
    assert nodes(place(policy, cluster, 2, excluded_nodes={"n0"})) <= {"n1", "n2", "n3"}
    assert nodes(place(policy, cluster, 5, required_features={"ib"})) == {"n1", "n2"}
    assert nodes(place(policy, cluster, 2, gpu_model="A100")) == {"n3"}
    assert nodes(place(policy, cluster, 3, required_nodes={"n2"})) >= {"n2"}
    assert len(nodes(place(policy, cluster, 4, min_nodes=4))) == 4
    assert len(nodes(place(policy, cluster, 8, max_nodes=2))) == 2
    per_node = place(policy, cluster, 6, gpus_per_node=2)
    assert len(nodes(per_node)) == 3


@pytest.mark.parametrize("policy", ALL)
def test_a_mixed_model_node_is_filtered_gpu_by_gpu(policy: str) -> None:
    cluster = make_cluster({"n0": [1.0, 0.8, 1.0], "n1": [1.0]}, models={"n0-1": "h100"})
    assert place(policy, cluster, 1, gpu_model="h100") == ["n0-1"]
    assert "n0-1" not in place(policy, cluster, 3, gpu_model="v100")


@pytest.mark.parametrize("policy", ALL)
@pytest.mark.parametrize(
    ("request_args", "reason"),
    [
        ({"job_class": "Z"}, "unknown job class 'Z'"),
        ({"gpus": 9}, "needs 9 GPUs, 4 usable free"),
        ({"gpus": 0}, "no GPUs"),
        ({"gpus": 3, "gpus_per_node": 2}, "cannot be split"),
        ({"required_nodes": {"nX"}}, "unknown required node(s): nX"),
        ({"required_nodes": {"n0"}, "excluded_nodes": {"n0"}}, "both required and excluded"),
        ({"gpu_model": "h100"}, "no h100 GPUs"),
        ({"required_features": {"ib"}}, "needs 2 GPUs, 0 usable free"),
        ({"gpus": 4, "max_nodes": 1}, "no free GPUs satisfy 4 GPU(s), nodes 1-1"),
        ({"gpus": 3, "gpus_per_node": 3}, "no free GPUs satisfy"),
    ],
)
def test_unsatisfiable_requests_get_a_reason(
    policy: str, request_args: dict[str, object], reason: str
) -> None:
    cluster = make_cluster({"n0": [1.0, 1.0], "n1": [1.0, 1.0]})
    args: dict[str, object] = {"job_id": "j", "job_class": "A", "gpus": 2, **request_args}
    result = get_policy(policy).place(PlacementRequest(**args), cluster)  # type: ignore[arg-type]
    assert result.allocation is None
    assert reason in result.reason


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(ALL),
    gpus=st.integers(0, 12),
    per_node=st.none() | st.integers(0, 5),
    nodes=st.none() | st.tuples(st.integers(0, 4), st.integers(0, 4)),
    required=st.sets(st.sampled_from(["n0", "n1", "n2", "zz", "n[1", ""]), max_size=3),
    excluded=st.sets(st.sampled_from(["n0", "n1", "zz", "a,b"]), max_size=2),
    features=st.sets(st.sampled_from(["ib", "?"]), max_size=2),
    model=st.none() | st.sampled_from(["v100", "A100", ""]),
    job_class=st.sampled_from(["A", "B", ""]),
)
def test_place_never_raises_on_user_input(
    policy: str,
    gpus: int,
    per_node: int | None,
    nodes: tuple[int, int] | None,
    required: set[str],
    excluded: set[str],
    features: set[str],
    model: str | None,
    job_class: str,
) -> None:
    cluster = make_cluster(
        {"n0": [0.9, 1.0, 1.0], "n1": [1.0, 1.2], "n2": [0.9]},
        busy=("n1-0",),
        models={"n0-2": "a100"},
        features={"n0": {"ib"}},
    )
    request = PlacementRequest.from_slurm(
        "j",
        job_class,
        gpus=gpus,
        gpus_per_node=per_node,
        nodes=nodes,
        required_nodes=required,
        excluded_nodes=excluded,
        required_features=features,
        gpu_model=model,
    )
    result = get_policy(policy).place(request, cluster)
    assert result.reason
    if result.allocation is not None:
        assert len(result.allocation.gpu_ids) == gpus
        assert all(cluster.free[list(result.allocation.gpu_ids)])


# --- requests and registry --------------------------------------------------------------------


def test_request_from_slurm_derives_the_total_like_slurm() -> None:
    assert PlacementRequest.from_slurm("j", "A", gpus_per_node=4, nodes=2).gpus == 8
    assert PlacementRequest.from_slurm("j", "A", gpus_per_node=4).gpus == 4
    ranged = PlacementRequest.from_slurm("j", "A", gpus_per_node=2, nodes=(2, 3))
    assert (ranged.gpus, ranged.min_nodes, ranged.max_nodes) == (4, 2, 3)
    assert PlacementRequest.from_slurm("j", "A", gpus=8, gpus_per_node=4).node_count == 2


@pytest.mark.parametrize(
    "args", [{"gpus": -1}, {"gpus": 1.5}, {"gpus": True}, {"gpus": 2, "required_nodes": "n0"}]
)
def test_request_constructor_rejects_programming_errors(args: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PlacementRequest("j", "A", **args)  # type: ignore[arg-type]


def test_registry_builds_policies_and_lists_names_on_error() -> None:
    assert set(POLICIES) == {"pm-first", "pal", "packed", "packed-pm", "random"}
    for name in POLICIES:
        policy = get_policy(name)
        assert isinstance(policy, PlacementPolicy) and policy.name == name
    with pytest.raises(ValueError, match="valid: pm-first, pal, packed, packed-pm, random"):
        get_policy("tetris")
    with pytest.raises(ValueError, match="bad parameters"):
        get_policy("pal", seed=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(5, 12))
def test_pal_is_pm_first_for_jobs_larger_than_a_node_on_a_flat_topology(
    seed: int, gpus: int
) -> None:
    """The paper sends such jobs to PM-First; walking the matrix gives the very same answer."""
    rng = np.random.default_rng(seed)
    layout = {f"n{i}": rng.choice([0.9, 1.0, 1.1, 2.0], size=4).tolist() for i in range(5)}
    busy = tuple(f"n{i}-{j}" for i in range(5) for j in range(4) if rng.random() < 0.3)
    cluster = make_cluster(layout, busy=busy)
    request = PlacementRequest("j", "A", gpus)
    pal = get_policy("pal").place(request, cluster).allocation
    pm_first = get_policy("pm-first").place(request, cluster).allocation
    assert (pal is None) == (pm_first is None)
    if pal is not None and pm_first is not None:
        assert pal.gpu_ids == pm_first.gpu_ids


# --- pack tolerance (Slurm cannot migrate: trade a little LV for packing) ----------------------


def test_pack_tolerance_sends_a_small_job_to_the_fullest_node_within_the_bound() -> None:
    cluster = make_cluster(
        {"n0": [0.95, 1.0, 1.0, 1.0], "n1": [0.96, 1.0, 1.0, 1.0], "n2": [1.2, 1.0, 1.0, 1.0]},
        busy=("n1-1", "n1-2", "n2-1", "n2-2", "n2-3"),
    )
    # the paper: the best GPU anywhere (n0, a whole free node)
    assert place("pal", cluster, 1) == ["n0-0"]
    # 2 %: n1's 0.96 is within 0.95 x 1.02, and n1 has fewer free GPUs left
    result = PALPolicy(pack_tolerance=0.02).place(PlacementRequest("j", "A", 1), cluster)
    assert result.allocation is not None and list(result.allocation.uuids) == ["n1-0"]
    assert "fullest node within 2.0%" in result.reason
    # n2's 1.2 is beyond 5 % of 0.95, although n2 is the fullest
    result = PALPolicy(pack_tolerance=0.05).place(PlacementRequest("j", "A", 1), cluster)
    assert result.allocation is not None and list(result.allocation.uuids) == ["n1-0"]
    # a big tolerance packs like best fit
    result = PALPolicy(pack_tolerance=0.5).place(PlacementRequest("j", "A", 1), cluster)
    assert result.allocation is not None and list(result.allocation.uuids) == ["n2-0"]


def test_pack_tolerance_spans_the_fewest_nodes() -> None:
    # 6 GPUs on 4-GPU nodes: PM-First takes the six 0.9s over three nodes; packed: 4 + 2
    layout = {
        "n0": [0.9, 0.9, 1.0, 1.0],
        "n1": [0.9, 0.9, 1.0, 1.0],
        "n2": [0.9, 0.9, 1.0, 1.0],
        "n3": [1.0, 1.0, 0.5, 0.5],
    }
    cluster = make_cluster(layout, busy=("n3-2", "n3-3"))
    paper = get_policy("pm-first").place(PlacementRequest("j", "A", 6), cluster)
    assert paper.allocation is not None and len(paper.allocation.node_names) == 3
    packed = get_policy("pm-first", pack_tolerance=0.2).place(
        PlacementRequest("j", "A", 6), cluster
    )
    assert packed.allocation is not None
    assert packed.allocation.node_names == ("n0", "n3")  # a whole node, then the exact fit
    assert packed.allocation.lv_product == pytest.approx(1.7)


def test_pack_tolerance_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="pack_tolerance must be >= 0"):
        get_policy("pal", pack_tolerance=-0.1)
