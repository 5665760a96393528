"""packed-pm (the production default) and the PM-blind null: packing's nodes always, outliers
only where leaving them costs nothing, waiting only when asked and never for ever."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import (
    PackedPMPolicy,
    PackedPolicy,
    configured_policy,
)
from slurm_pal.core.placement.packedpm import WAIT_REASON
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology


def cluster_of(
    layout: dict[str, list[float]],
    busy: tuple[str, ...] = (),
    other: dict[str, float] | None = None,
) -> Cluster:
    """node -> class-A score per GPU; class D scores 1.0 except ``other`` (uuid -> D score)."""
    gpus = [
        GpuSpec(
            f"{node}-{i}",
            node,
            i,
            "v100",
            {"A": score, "D": (other or {}).get(f"{node}-{i}", 1.0)},
        )
        for node, scores in layout.items()
        for i, score in enumerate(scores)
    ]
    return Cluster.from_gpus(gpus, Topology.flat(1.7), busy=busy)


def uuids(policy: object, cluster: Cluster, gpus: int, job_class: str = "A") -> list[str] | None:
    result = policy.place(PlacementRequest("j", job_class, gpus), cluster)  # type: ignore[attr-defined]
    return None if result.allocation is None else list(result.allocation.uuids)


def test_an_outlier_is_left_out_when_that_costs_no_node_and_no_larger_hole() -> None:
    # n0 has 2 free (one at 2.8x), n1 has 2 free: packing takes n0-0 (tightest, first).
    cluster = cluster_of({"n0": [2.8, 1.0, 1.0], "n1": [1.0, 1.0, 1.0]}, busy=("n0-2", "n1-2"))
    assert uuids(PackedPolicy(), cluster, 1) == ["n0-0"]
    assert uuids(PackedPMPolicy(), cluster, 1) == ["n0-1"]  # same node, no outlier
    # A 2-GPU job: packing's exact fit n0 holds the outlier; n1 is the same size, so no larger
    # hole is broken and the job goes there.
    assert uuids(PackedPMPolicy(), cluster, 2) == ["n1-0", "n1-1"]


def test_a_larger_hole_is_broken_rather_than_take_an_outlier_or_leave_gpus_idle() -> None:
    # Exact fit on n0 (2 free, one outlier); the only other place is a whole 4-GPU node. Idle
    # GPUs the job can use without an outlier are never left idle for its sake: it breaks n1.
    cluster = cluster_of({"n0": [2.8, 1.0, 1.0, 1.0], "n1": [1.0] * 4}, busy=("n0-2", "n0-3"))
    assert uuids(PackedPMPolicy(), cluster, 2) == ["n1-0", "n1-1"]
    assert uuids(PackedPMPolicy(wait=True), cluster, 2) == ["n1-0", "n1-1"]


def test_an_outlier_is_kept_when_leaving_it_out_would_span_more_nodes() -> None:
    # Leaving the outlier out would make a 3-GPU job span two nodes: the job keeps it (no
    # hole is in play: n1 has only one free GPU, so only the node count decides).
    cluster = cluster_of({"n0": [2.8, 1.0, 1.0], "n1": [1.0, 1.0, 1.0]}, busy=("n1-1", "n1-2"))
    assert uuids(PackedPMPolicy(), cluster, 3) == ["n0-0", "n0-1", "n0-2"]
    # A 2-GPU job on 2-GPU nodes: n0 holds an outlier, n1 and n2 one free GPU each. Dodging
    # the outlier means two nodes for the job: it stays on n0.
    cluster = cluster_of(
        {"n0": [2.8, 1.0], "n1": [1.0, 1.0], "n2": [1.0, 1.0]}, busy=("n1-1", "n2-1")
    )
    assert uuids(PackedPMPolicy(), cluster, 2) == ["n0-0", "n0-1"]


def _held(
    cluster: Cluster, *, runtime_s: float | None, waited_s: float = 0.0, max_wait_s: float = 3600
) -> object:
    request = PlacementRequest("j", "A", 1, runtime_s=runtime_s, waited_s=waited_s)
    return PackedPMPolicy(wait=True, max_wait_s=max_wait_s).place(request, cluster)


def test_wait_holds_a_job_only_while_the_expected_wait_is_shorter_than_the_outliers_cost() -> None:
    cluster = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]}, busy=("n0-1", "n1-0", "n1-1"))
    assert uuids(PackedPMPolicy(), cluster, 1) == ["n0-0"]  # last resort
    cluster.clock = 1000.0
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 1600.0)  # a good GPU frees in 600 s
    # 2 h of work at 2.8x costs 3.6 h more; 600 s of waiting is cheaper: it waits, at most
    # until the bound (an hour from when it could first start).
    result = _held(cluster, runtime_s=7200)
    assert result.allocation is None and WAIT_REASON in result.reason
    assert result.waits_off == (cluster.uuid_index["n0-0"],)
    assert result.wait_until == 1000.0 + 3600
    assert _held(cluster, runtime_s=7200, waited_s=1800).wait_until == 1000.0 - 1800 + 3600
    # 5 minutes of work lose 9 minutes on the outlier: not worth 10 minutes of waiting.
    short = _held(cluster, runtime_s=300)
    assert short.allocation is not None and "rather than wait" in short.reason
    # The bound: after an hour held, the job takes the outlier whatever the estimates say.
    assert _held(cluster, runtime_s=7200, waited_s=3600).allocation is not None
    # The good GPU is expected later than the bound allows: no wait.
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 1000.0 + 4000)
    assert _held(cluster, runtime_s=86400).allocation is not None
    # Its holder has no end (an UNLIMITED job): nothing justifies waiting for it.
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], float("inf"))
    assert _held(cluster, runtime_s=86400).allocation is not None
    # A job without a time limit is weighed as running assumed_runtime_s (an hour): a minute of
    # waiting is worth it, two hours are not (it would lose 1.8 h on the 2.8x GPU).
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 1060.0)
    assert _held(cluster, runtime_s=None).allocation is None
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 1000.0 + 7200)
    assert _held(cluster, runtime_s=None, max_wait_s=86400).allocation is not None
    assert _held(cluster, runtime_s=86400, max_wait_s=86400).allocation is None
    # max_wait_s = 0 never waits.
    assert _held(cluster, runtime_s=86400, max_wait_s=0).allocation is not None
    # A time limit is weighed at limit_share of it (half by default): 2 h asked is 1 h expected,
    # 1.8 h lost on the 2.8x GPU, less than the 1.9 h wait; at the whole limit, 3.6 h is more.
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 1000.0 + 7000)
    limited = PlacementRequest("j", "A", 1, time_limit_s=7200.0)
    assert PackedPMPolicy(wait=True, max_wait_s=86400).place(limited, cluster).allocation
    whole = PackedPMPolicy(wait=True, max_wait_s=86400, limit_share=1.0)
    assert whole.place(limited, cluster).allocation is None
    # An UNLIMITED limit says nothing of the length: weighed as assumed_runtime_s.
    unlimited = PlacementRequest("j", "A", 1, time_limit_s=float("inf"))
    assert whole.place(unlimited, cluster).allocation is not None
    with pytest.raises(ValueError, match="limit_share"):
        PackedPMPolicy(limit_share=0.0)


def test_a_job_that_cannot_avoid_the_outlier_or_names_nodes_never_waits() -> None:
    cluster = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]}, busy=("n0-1", "n1-0", "n1-1"))
    cluster.expect_free_at([cluster.uuid_index["n0-1"]], 60.0)
    # A job pinned to nodes takes what it gets rather than wait.
    pinned = PlacementRequest("j", "A", 1, required_nodes=frozenset({"n0"}), runtime_s=7200)
    assert PackedPMPolicy(wait=True).place(pinned, cluster).allocation is not None
    # A memory-bound job is not slowed there and takes it.
    assert uuids(PackedPMPolicy(wait=True), cluster, 1, "D") == ["n0-0"]
    # A job that needs every GPU of the cluster can never avoid the outlier: it does not wait.
    free = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]})
    assert uuids(PackedPMPolicy(wait=True), free, 4) is not None


def test_a_job_insensitive_to_an_outlier_takes_it_first_inside_packings_node() -> None:
    # n0-1 is an outlier for class A only; a class-D job on n0 takes it, leaving n0-0 for A.
    cluster = cluster_of({"n0": [1.0, 2.8, 1.0, 1.0]}, busy=("n0-2", "n0-3"))
    assert uuids(PackedPolicy(), cluster, 1, "D") == ["n0-0"]
    assert uuids(PackedPMPolicy(), cluster, 1, "D") == ["n0-1"]
    assert uuids(PackedPMPolicy(), cluster, 1, "A") == ["n0-0"]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 9),
    st.floats(0.9, 1.45),
)
def test_without_outliers_it_is_exactly_packing(seed: int, gpus: int, spread: float) -> None:
    """Every GPU within avoid_above: packed-pm decides what packing decides, GPU for GPU; the
    null (GPUs of a node shuffled) takes the same nodes and counts per node."""
    rng = np.random.default_rng(seed)
    layout = {f"n{n}": list(rng.uniform(0.9, spread, size=4)) for n in range(4)}
    everything = [f"{node}-{i}" for node in layout for i in range(4)]
    busy = tuple(g for g in everything if rng.random() < 0.4)
    cluster = cluster_of(layout, busy=busy)
    packed = uuids(PackedPolicy(), cluster, gpus)
    assert uuids(PackedPMPolicy(avoid_above=1.5), cluster, gpus) == packed
    shuffled = uuids(PackedPolicy(shuffle_seed=seed), cluster, gpus)
    if packed is None:
        assert shuffled is None
    else:
        assert shuffled is not None

        def per_node(names: list[str]) -> dict[str, int]:
            counts: dict[str, int] = {}
            for name in names:
                counts[name.split("-")[0]] = counts.get(name.split("-")[0], 0) + 1
            return counts

        assert per_node(shuffled) == per_node(packed)


def test_configured_policy_passes_only_the_settings_a_policy_takes() -> None:
    policy = configured_policy("packed-pm", pack_tolerance=0.05, avoid_above=2.0)
    assert isinstance(policy, PackedPMPolicy) and policy.avoid_above == 2.0
    pal = configured_policy("pal", pack_tolerance=0.05, avoid_above=2.0)
    assert pal.pack_tolerance == 0.05  # type: ignore[attr-defined]
    assert isinstance(configured_policy("packed", avoid_above=2.0), PackedPolicy)


def as_packing(policy: object, cluster: Cluster, gpus: int, job_class: str = "A") -> bool:
    result = policy.place(PlacementRequest("j", job_class, gpus), cluster)  # type: ignore[attr-defined]
    assert result.allocation is not None
    return result.as_packing


def test_a_pick_is_left_to_slurm_only_when_packing_would_choose_it_and_nothing_is_avoided() -> None:
    # No outlier anywhere: packed-pm is packing, and so is plain packing itself.
    flat = cluster_of({"n0": [1.0, 1.1], "n1": [1.0, 1.2]})
    assert as_packing(PackedPMPolicy(), flat, 1)
    assert as_packing(PackedPolicy(), flat, 1)
    assert not as_packing(PackedPolicy(shuffle_seed=3), flat, 1)  # not what Slurm would do
    # A free 2.8x GPU for class A: Slurm could give it to an A job, so A jobs stay pinned,
    # even where packing's own pick happens to avoid it.
    slow = cluster_of({"n0": [1.0, 1.0], "n1": [2.8, 1.0, 1.0]}, busy=("n1-2",))
    assert uuids(PackedPolicy(), slow, 2) == ["n0-0", "n0-1"]
    assert not as_packing(PackedPMPolicy(), slow, 2)
    # ... but once that GPU is taken there is nothing left to avoid.
    taken = cluster_of({"n0": [1.0, 1.0], "n1": [2.8, 1.0, 1.0]}, busy=("n1-0",))
    assert as_packing(PackedPMPolicy(), taken, 2)
    # Class D has no outliers, but inside the node it takes the GPU class A must not get:
    # not what Slurm (lowest index first) would do, so it is pinned.
    other = cluster_of({"n0": [1.0, 2.8, 1.0]}, busy=("n0-2",))
    assert uuids(PackedPMPolicy(), other, 1, "D") == ["n0-1"]
    assert not as_packing(PackedPMPolicy(), other, 1, "D")
    # Where packing's own order gives the same GPUs, the D job is left to Slurm.
    same = cluster_of({"n0": [2.8, 1.0, 1.0]}, busy=("n0-2",))
    assert uuids(PackedPMPolicy(), same, 1, "D") == ["n0-0"]
    assert as_packing(PackedPMPolicy(), same, 1, "D")


def test_the_expected_wait_is_for_gpus_on_as_few_nodes_as_packing_uses() -> None:
    from slurm_pal.core.waiting import expected_wait_s

    # 2-GPU nodes. One good GPU free on each of n1 and n2; n3's two GPUs end at 100 and 300.
    cluster = cluster_of(
        {"n0": [2.8, 1.0], "n1": [1.0, 1.0], "n2": [1.0, 1.0], "n3": [1.0, 1.0]},
        busy=("n0-1", "n1-1", "n2-1", "n3-0", "n3-1"),
    )
    cluster.clock = 0.0
    index = cluster.uuid_index
    cluster.expect_free_at([index["n1-1"]], 500.0)
    cluster.expect_free_at([index["n2-1"]], 900.0)
    cluster.expect_free_at([index["n3-0"]], 100.0)
    cluster.expect_free_at([index["n3-1"]], 300.0)
    good = cluster.classes["A"].scores <= 1.5
    # Two good GPUs are free now, but on two nodes: a 2-GPU job fits one node at 300 (n3).
    assert expected_wait_s(cluster, good, 2, None) == 300.0
    # A 4-GPU job needs two whole nodes: n3 at 300, then n1 at 500.
    assert expected_wait_s(cluster, good, 4, None) == 500.0
    assert expected_wait_s(cluster, good, 4, 2) == 500.0
    # A 1-GPU job: a good GPU is free now.
    assert expected_wait_s(cluster, good, 1, None) == 0.0
    # More nodes than the cluster has, or more GPUs per node than a node has: never.
    assert expected_wait_s(cluster, good, 10, None) == float("inf")
    assert expected_wait_s(cluster, good, 3, 3) == float("inf")


def test_holders_are_expected_to_end_after_the_share_of_their_limit_the_site_uses() -> None:
    """The holders are weighed as the waiting job is: a holder that started at 0 with a limit
    ending at 1000 is expected at 500 with a share of 0.5; once past that, at its limit; with
    no known start (a view not told), or unlimited, as before."""
    from slurm_pal.core.waiting import expected_ends, expected_wait_s

    cluster = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]}, busy=("n0-1", "n1-0", "n1-1"))
    index = cluster.uuid_index
    cluster.expect_free_at([index["n0-1"]], 1000.0, since=0.0)
    cluster.expect_free_at([index["n1-0"]], 1000.0, since=0.0)
    cluster.expect_free_at([index["n1-1"]], 2000.0)  # start not known
    good = cluster.classes["A"].scores <= 1.5
    cluster.clock = 100.0
    ends = expected_ends(cluster, 0.5)
    assert ends[index["n1-0"]] == 500.0 and ends[index["n1-1"]] == 2000.0
    assert expected_wait_s(cluster, good, 1, None, share=0.5) == 400.0
    assert expected_wait_s(cluster, good, 1, None) == 900.0  # the limits alone
    assert expected_wait_s(cluster, good, 2, None, share=0.5) == 1900.0
    cluster.clock = 600.0  # past the likely end: the limit's end stands
    assert expected_ends(cluster, 0.5)[index["n1-0"]] == 1000.0
    busy = [index["n0-1"], index["n1-0"], index["n1-1"]]
    cluster.expect_free_at(busy, float("inf"), since=0.0)  # unlimited: never
    assert expected_wait_s(cluster, good, 1, None, share=0.5) == float("inf")
    # a copy keeps the starts
    assert np.array_equal(cluster.copy().busy_since, cluster.busy_since, equal_nan=True)


def test_each_holder_is_expected_to_use_the_share_that_limits_like_its_own_used() -> None:
    """The site's 1-h jobs used a tenth of their hour, its 2-day jobs half of theirs: a 2-day
    holder is not expected to free its GPU 4.8 h in, so a job that would lose 2 h on the
    outlier takes it rather than wait; with a 1-h holder it waits."""
    from slurm_pal.core.runtimes import EndedJob, RuntimeModel
    from slurm_pal.core.waiting import expected_wait_s

    model = RuntimeModel(min_runs=4)
    for _ in range(20):
        model.partial_fit(EndedJob(1, 3600.0, 360.0))
    for _ in range(4):
        model.partial_fit(EndedJob(1, 172_800.0, 86_400.0))
    policy = PackedPMPolicy(wait=True, max_wait_s=86_400.0)
    policy.runtimes = model
    request = PlacementRequest("j", "A", 1, runtime_s=4000.0)  # 1.8 x 4000 s lost at 2.8x
    cluster = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]}, busy=("n0-1", "n1-0", "n1-1"))
    cluster.expect_free_at(
        [cluster.uuid_index[g] for g in ("n0-1", "n1-0", "n1-1")], 172_800.0, since=0.0
    )
    cluster.clock = 15_000.0
    # One site-wide share (0.1) expects these 2-day holders at 17,280 s: a 2,280 s wait, less
    # than the 7,200 s the outlier costs, so the job would be held. Half of two days to go at
    # the share limits like theirs used: it takes the outlier.
    good = cluster.classes["A"].scores <= 1.5
    assert model.limit_share == pytest.approx(0.1)
    assert expected_wait_s(cluster, good, 1, None, share=model.limit_share) == 2280.0
    assert policy.place(request, cluster).allocation is not None
    short = cluster_of({"n0": [2.8, 1.0], "n1": [1.0, 1.0]}, busy=("n0-1", "n1-0", "n1-1"))
    short.expect_free_at([short.uuid_index["n0-1"]], 3600.0, since=0.0)  # expected at 360 s
    short.expect_free_at([short.uuid_index[g] for g in ("n1-0", "n1-1")], 172_800.0, since=0.0)
    short.clock = 300.0
    held = policy.place(request, short)
    assert held.allocation is None and WAIT_REASON in held.reason


def test_among_nodes_packing_finds_equal_a_job_keeps_outliers_busy_or_fills_in_around_them() -> (
    None
):
    # Two 2-GPU nodes, both free; n1-0 is an outlier for class A only.
    cluster = cluster_of({"n0": [1.0, 1.0], "n1": [2.8, 1.0]})
    # Packing would take n0 (node order). A class-D job takes the GPU class A must not get.
    assert uuids(PackedPMPolicy(), cluster, 1, "D") == ["n1-0"]
    # A class-A job fills in beside the outlier, so n1 is not left whole with it for a
    # whole-node job later.
    assert uuids(PackedPMPolicy(), cluster, 1, "A") == ["n1-1"]
    # A whole-node job goes where no outlier is.
    assert uuids(PackedPMPolicy(), cluster, 2, "A") == ["n0-0", "n0-1"]
    # Best fit still comes first: a node with one free GPU beats the outlier's emptier node.
    fuller = cluster_of({"n0": [1.0, 1.0], "n1": [2.8, 1.0]}, busy=("n0-0",))
    assert uuids(PackedPMPolicy(), fuller, 1, "A") == ["n0-1"]
    # No outlier for any class: exactly packing.
    plain = cluster_of({"n0": [1.0, 1.0], "n1": [1.2, 1.0]})
    assert uuids(PackedPMPolicy(), plain, 1, "A") == ["n0-0"]
    assert uuids(PackedPMPolicy(), plain, 1, "D") == ["n0-0"]


def test_the_services_view_knows_when_each_limited_holder_started() -> None:
    """Slurm shows a running job's end (start + limit) and its limit: the view keeps the start
    (end - limit) so the holders are weighed as the simulator weighs them; an unlimited
    holder's start is not needed (it never frees in the estimate)."""
    from slurm_pal.adapters.slurm.parse import Gres
    from slurm_pal.adapters.slurm.state import JobState
    from slurm_pal.advisor.view import expect_ends
    from slurm_pal.core.labels import LabelEntry, LabelTable

    cluster = cluster_of({"n0": [1.0, 1.0]}, busy=("n0-0", "n0-1"))
    labels = LabelTable("c", tuple(LabelEntry("n0", i, i, "gpu-a", f"n0-{i}") for i in (0, 1)))

    def running(job_id: int, index: int, limit: float, end: float | None) -> JobState:
        gres = {"n0": (Gres("gpu", "gpu-a", 1, (index,)),)}
        return JobState(
            job_id, "RUNNING", "u", "p", ("n0",), allocated_gres=gres,
            time_limit_s=limit, end_time=end,
        )  # fmt: skip

    expect_ends(cluster, [running(1, 0, 3600.0, 5000.0), running(2, 1, math.inf, None)], labels)
    assert cluster.busy_until.tolist() == [5000.0, math.inf]
    assert cluster.busy_since[0] == 1400.0 and math.isnan(cluster.busy_since[1])


def test_a_job_that_spreads_goes_to_nodes_without_its_outliers_first() -> None:
    """Every node has one free GPU; two of them are outliers for class A, one is good. A
    2-GPU class-A job must take an outlier (one good GPU is all there is), but only one: the
    spread starts on the node without. Filling in around outliers is for a job that fits a
    node."""
    cluster = cluster_of(
        {"n0": [2.4, 1.0], "n1": [2.4, 1.0], "n2": [1.0, 1.0]},
        busy=("n0-1", "n1-1", "n2-1"),
    )
    assert uuids(PackedPolicy(), cluster, 2) == ["n0-0", "n1-0"]  # node order
    assert uuids(PackedPMPolicy(), cluster, 2) == ["n0-0", "n2-0"]
    # a class-D job, for which they are not outliers, keeps them busy as before
    assert uuids(PackedPMPolicy(), cluster, 2, "D") == ["n0-0", "n1-0"]
    # a job that fits a node still fills in beside its outlier
    beside = cluster_of({"n0": [1.0, 1.0], "n1": [2.4, 1.0]})
    assert uuids(PackedPMPolicy(), beside, 1) == ["n1-1"]


def test_a_spread_without_outliers_on_as_many_nodes_is_always_taken() -> None:
    """Property: when packing spreads a job and some spread on as many nodes avoids every
    outlier for its class, packed-pm's pick has none."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        layout = {f"n{i}": [2.4 if rng.random() < 0.2 else 1.0 for _ in range(4)] for i in range(6)}
        busy = tuple(f"n{i}-{j}" for i in range(6) for j in range(4) if rng.random() < 0.6)
        cluster = cluster_of(layout, busy=busy)
        gpus = int(rng.integers(2, 9))
        packed = PackedPolicy().place(PlacementRequest("j", "A", gpus), cluster)
        if packed.allocation is None or len(set(packed.allocation.node_names)) < 2:
            continue
        nodes_used = len(set(packed.allocation.node_names))
        good_free = sorted(
            (
                sum(
                    1
                    for j, score in enumerate(scores)
                    if f"{node}-{j}" not in busy and score <= 1.5
                )
                for node, scores in layout.items()
            ),
            reverse=True,
        )
        if sum(good_free[:nodes_used]) < gpus:
            continue  # no spread without outliers on as many nodes
        checked += 1
        picked = PackedPMPolicy().place(PlacementRequest("j", "A", gpus), cluster).allocation
        assert picked is not None
        assert len(set(picked.node_names)) <= nodes_used
        assert max(cluster.classes["A"].scores[list(picked.gpu_ids)]) <= 1.5
    assert checked > 20


def test_the_outliers_cost_counts_the_span_of_the_pick_it_would_take() -> None:
    """A 2-GPU job on 2-GPU nodes: the only free GPUs are two 2.4x ones on two nodes; a good
    node frees in 8,000 s. An hour of work loses 1.4 h on the outliers alone, but spread over
    two nodes (penalty 1.7) it runs at 4.08x against 1x on the good node: 3.08 h lost, more
    than the wait, so it waits."""
    cluster = cluster_of(
        {"n0": [2.4, 1.0], "n1": [2.4, 1.0], "n2": [1.0, 1.0]},
        busy=("n0-1", "n1-1", "n2-0", "n2-1"),
    )
    cluster.clock = 1000.0
    cluster.expect_free_at([cluster.uuid_index[g] for g in ("n2-0", "n2-1")], 9000.0)
    request = PlacementRequest("j", "A", 2, runtime_s=3600.0)
    held = PackedPMPolicy(wait=True, max_wait_s=86_400.0).place(request, cluster)
    assert held.allocation is None and WAIT_REASON in held.reason
    assert "11088 s lost" in held.reason  # 3600 x (2.4 x 1.7 - 1)
    # The same job on one node's outlier pair loses only the outliers' 1.4 h: it takes them.
    one_node = cluster_of({"n0": [2.4, 2.4], "n2": [1.0, 1.0]}, busy=("n2-0", "n2-1"))
    one_node.clock = 1000.0
    one_node.expect_free_at([one_node.uuid_index[g] for g in ("n2-0", "n2-1")], 9000.0)
    taken = PackedPMPolicy(wait=True, max_wait_s=86_400.0).place(request, one_node)
    assert taken.allocation is not None and "5040 s lost" in taken.reason
