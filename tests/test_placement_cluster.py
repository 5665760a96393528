"""The cluster model: construction checks, allocate/release bookkeeping, copies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology


def specs(nodes: int = 3, per_node: int = 4) -> list[GpuSpec]:
    return [
        GpuSpec(
            f"GPU-{n}-{i}",
            f"n{n}",
            i,
            "V100",
            {"A": [0.9, 1.0, 1.2][(n + i) % 3], "B": 1.0 + 0.1 * (i % 2)},
            frozenset({"ib"}) if n else frozenset(),
        )
        for n in range(nodes)
        for i in range(per_node)
    ]


def test_from_gpus_orders_gpus_by_node_and_index_and_bins_scores() -> None:
    gpus = list(reversed(specs(2, 2)))
    cluster = Cluster.from_gpus(gpus, busy=["GPU-1-0"])
    assert cluster.node_names == ("n1", "n0")  # first appearance
    assert cluster.uuids == ("GPU-1-0", "GPU-1-1", "GPU-0-0", "GPU-0-1")
    assert cluster.classes["A"].bin_scores.tolist() == [0.9, 1.0, 1.2]
    assert cluster.n_free == 3 and cluster.models == ("v100",)
    assert cluster.class_order == ("A", "B")
    assert cluster.max_gpus_per_node == 2


def test_a_nodes_gpus_follow_their_order_and_packing_takes_the_lowest_free_first() -> None:
    """Slurm numbers a node's GPUs grouped by type, so its index need not be the device's: a
    node's GPUs stand in their ``order`` (Slurm's index), and packing's pick, the GPUs Slurm
    gives, is the lowest free of them; a rescored cluster keeps the order."""
    slurm_index = {0: 0, 1: 2, 2: 1, 3: 3}  # devices 0, 2 of one type; 1, 3 of another
    gpus = [replace(g, order=slurm_index[g.index]) for g in specs(1, 4)]
    cluster = Cluster.from_gpus(gpus)
    assert cluster.gpu_local_index.tolist() == [0, 2, 1, 3]
    packed = get_policy("packed")
    picks = []
    for job in range(3):
        allocation = packed.place(PlacementRequest(str(job), "B", 1), cluster).allocation
        assert allocation is not None
        cluster.allocate(allocation)
        picks.append(allocation.local_indices)
    assert picks == [(0,), (2,), (1,)]
    rescored = cluster.rescored({"A": [1.0] * 4})
    assert rescored.uuids == cluster.uuids
    assert rescored.gpu_local_index.tolist() == [0, 2, 1, 3]
    with pytest.raises(ValueError, match="share a place"):
        Cluster.from_gpus([*gpus[:3], replace(gpus[3], order=0)])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g.append(g[0]), "duplicate GPU UUIDs"),
        (lambda g: g.append(GpuSpec("new", "n0", 0, "v100", {"A": 1.0, "B": 1.0})), "share"),
        (lambda g: g.append(GpuSpec("new", "n9", 0, "v100", {"A": 1.0})), "class 'B'"),
        (lambda g: g.append(GpuSpec("x", "n9", 0, "v100", {"A": float("nan"), "B": 1})), "'A'"),
        (lambda g: g.append(GpuSpec("x", "n9", 0, "v100", {"A": -1.0, "B": 1.0})), "<= 0"),
        (lambda g: g.append(GpuSpec("x", "n1", 9, "v100", {"A": 1.0, "B": 1.0})), "features"),
    ],
)
def test_from_gpus_rejects_inconsistent_data(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    gpus = specs()
    mutate(gpus)
    with pytest.raises(ValueError, match=message):
        Cluster.from_gpus(gpus)


def test_from_gpus_rejects_unbinned_scores_on_huge_clusters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("slurm_pal.core.cluster.MAX_COUNT_CELLS", 10)
    gpus = [GpuSpec(f"g{i}", f"n{i}", 0, "v100", {"A": 1.0 + i / 100}) for i in range(5)]
    with pytest.raises(ValueError, match="bin the scores"):
        Cluster.from_gpus(gpus)


def test_class_order_must_name_every_class() -> None:
    assert Cluster.from_gpus(specs(), class_order=["B", "A"]).class_order == ("B", "A")
    with pytest.raises(ValueError):
        Cluster.from_gpus(specs(), class_order=["A"])


def test_allocate_and_release_are_checked() -> None:
    cluster = Cluster.from_gpus(specs())
    cluster.allocate([0, 1])
    with pytest.raises(ValueError, match="already busy"):
        cluster.allocate([1, 2])
    assert cluster.free[2]  # nothing changed by the refused call
    with pytest.raises(ValueError, match="already free"):
        cluster.release([2])
    with pytest.raises(ValueError):
        cluster.allocate([99])
    with pytest.raises(ValueError):
        cluster.allocate([3, 3])
    cluster.release_uuids(["GPU-0-0"])
    assert cluster.n_free == 11
    with pytest.raises(KeyError, match="GPU-x"):
        cluster.allocate_uuids(["GPU-x"])


def test_copy_is_independent_and_shares_static_data() -> None:
    cluster = Cluster.from_gpus(specs())
    other = cluster.copy()
    other.allocate([0])
    assert cluster.free[0] and not other.free[0]
    assert cluster.free_counts("A").sum() == 12 and other.free_counts("A").sum() == 11
    assert other.node_gpus is cluster.node_gpus
    with pytest.raises(ValueError):
        cluster.node_gpus[0, 0] = 5  # static arrays are read-only


def test_allocate_accepts_an_allocation() -> None:
    cluster = Cluster.from_gpus(specs())
    result = get_policy("pal").place(PlacementRequest("j", "A", 3), cluster)
    assert result.allocation is not None
    cluster.allocate(result.allocation)
    assert cluster.n_free == 9
    cluster.release(result.allocation)
    assert cluster.n_free == 12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sets(st.integers(0, 11), max_size=4)), max_size=20))
def test_incremental_counts_match_a_recount(operations: list[tuple[bool, set[int]]]) -> None:
    cluster = Cluster.from_gpus(specs(), Topology({"n0": "s0", "n1": "s0", "n2": "s1"}))
    for allocate, gpus in operations:
        ids = sorted(gpus)
        if allocate and cluster.free[ids].all():
            cluster.allocate(ids)
        elif not allocate and not cluster.free[ids].any():
            cluster.release(ids)
    for name, klass in cluster.classes.items():
        expected = np.zeros((cluster.n_nodes, klass.n_bins), dtype=int)
        for gpu in np.flatnonzero(cluster.free):
            expected[cluster.gpu_node[gpu], klass.bin_of[gpu]] += 1
        np.testing.assert_array_equal(cluster.free_counts(name), expected)
    assert (
        cluster.node_free.tolist()
        == np.bincount(cluster.gpu_node[cluster.free], minlength=3).tolist()
    )


def test_nodes_unknown_to_the_topology_are_their_own_switch() -> None:
    cluster = Cluster.from_gpus(specs(), Topology({"n0": "s0", "n1": "s0"}))
    assert cluster.switch_names == ("s0", "n2")
    assert cluster.node_switch.tolist() == [0, 0, 1]


@settings(max_examples=200)
@given(
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.integers(0, 2),
    st.integers(0, 4),
    st.integers(0, 2),
    st.booleans(),
    st.sampled_from(["A", "B"]),
)
def test_taking_from_one_node_is_what_the_many_node_path_takes(
    free: list[bool], node: int, count: int, low: int, by_score: bool, job_class: str
) -> None:
    """One node's pick goes a plain-Python way (most jobs fit one node); it must be the
    numpy path's, which the same node with a second, empty-handed node beside it takes."""
    from slurm_pal.core.placement.view import prepare

    busy = [s.uuid for s, is_free in zip(specs(), free, strict=True) if not is_free]
    cluster = Cluster.from_gpus(specs(), busy=busy)
    view = prepare(PlacementRequest("j", job_class, 1), cluster)
    assume(not isinstance(view, str))  # nothing free: no view to take from
    assert not isinstance(view, str)
    other = (node + 1) % 3
    high = view.n_bins - 1
    alone = view.take(np.array([node]), np.array([count]), low, high, by_score=by_score)
    beside = view.take(np.array([node, other]), np.array([count, 0]), low, high, by_score=by_score)
    assert alone.tolist() == beside.tolist()
