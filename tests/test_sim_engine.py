"""The simulator engine on tiny traces whose outcome is worked out by hand in each test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slurm_pal.core.queue import expected_end
from slurm_pal.core.workload import SimJob, poisson_workload
from slurm_pal.sim import PLACEMENTS, SimConfig, SimGpus, simulate, uniform_gpus


def job(number: int, submit: float, gpus: int, work: float, job_class: str = "A") -> SimJob:
    return SimJob(str(number), submit, gpus, work, job_class)


def outcome(result, job_id: str):
    return next(j for j in result.jobs if j.job_id == job_id)


def two_gpus(scores: list[float], truth: list[float] | None = None) -> SimGpus:
    """One node, two GPUs, class A only."""
    values = np.array(scores, dtype=float)
    true = np.array(truth if truth is not None else scores, dtype=float)
    return SimGpus(1, 2, {"A": values}, {"A": true})


def test_one_job_ends_exactly_in_corrected_mode_and_on_the_boundary_in_artifact_mode() -> None:
    # 250 s of work, 100 s rounds, placed at t=0: done at 250 s, seen at the 300 s boundary.
    gpus = uniform_gpus(["A"], 1, 4)
    trace = [job(0, 0.0, 1, 250.0)]
    exact = simulate(trace, gpus, SimConfig(placement="pal", round_seconds=100))
    artifact_config = SimConfig(placement="pal", round_seconds=100, pal_artifact=True)
    artifact = simulate(trace, gpus, artifact_config)
    assert outcome(exact, "0").end == pytest.approx(250.0)
    assert outcome(artifact, "0").end == pytest.approx(300.0)
    assert exact.summary()["avg_jct"] == pytest.approx(250.0)


def test_a_job_spanning_nodes_pays_the_locality_penalty() -> None:
    # 4 GPUs on 2 nodes x 2: rate 1/2.0, so 105 s of work takes 210 s (artifact: boundary 240).
    gpus = uniform_gpus(["A"], 2, 2)
    trace = [job(0, 0.0, 4, 105.0)]
    for placement in PLACEMENTS:
        config = SimConfig(placement=placement, round_seconds=40, locality_penalty=2.0)
        assert outcome(simulate(trace, gpus, config), "0").end == pytest.approx(210.0)
    config = SimConfig(round_seconds=40, locality_penalty=2.0, pal_artifact=True)
    assert outcome(simulate(trace, gpus, config), "0").end == pytest.approx(240.0)


def test_a_job_inside_one_node_pays_no_locality_penalty() -> None:
    gpus = uniform_gpus(["A"], 2, 2)
    result = simulate([job(0, 0.0, 2, 100.0)], gpus, SimConfig(placement="packed-sticky"))
    assert outcome(result, "0").end == pytest.approx(100.0)
    assert outcome(result, "0").max_nodes == 1 and result.summary()["spread_jobs"] == 0


def test_fragmentation_spreads_a_job_that_fits_in_a_node() -> None:
    # 2 nodes x 2 GPUs in Slurm mode: two 1-GPU jobs land on different nodes when PM-First
    # follows the scores (node 0's GPU 1 and node 1's GPU 2 are the fast ones), so the 2-GPU
    # job that comes next must span nodes; packed placement fills node 0 first and keeps node 1.
    scores = {"A": np.array([1.2, 1.0, 1.0, 1.2])}
    gpus = SimGpus(2, 2, scores, scores)
    trace = [job(0, 0.0, 1, 1000.0), job(1, 0.0, 1, 1000.0), job(2, 1.0, 2, 100.0)]
    scattered = simulate(trace, gpus, SimConfig(placement="pm-first", mode="slurm"))
    packed = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert outcome(scattered, "2").max_nodes == 2 and scattered.summary()["spread_jobs"] == 1
    assert outcome(packed, "2").max_nodes == 1 and packed.summary()["spread_jobs"] == 0


def test_a_job_asked_with_gres_per_node_waits_for_one_node_rather_than_spreading() -> None:
    # The same fragmentation, with the 2-GPU job asked as --gres=gpu:2 (one node, as the
    # testbed and most users submit it): it waits for a whole node and never spans two.
    scores = {"A": np.array([1.2, 1.0, 1.0, 1.2])}
    gpus = SimGpus(2, 2, scores, scores)
    trace = [job(0, 0.0, 1, 1000.0), job(1, 0.0, 1, 1000.0), job(2, 1.0, 2, 100.0)]
    config = SimConfig(placement="pm-first", mode="slurm", requests="gres-per-node")
    one_node = outcome(simulate(trace, gpus, config), "2")
    assert one_node.max_nodes == 1 and one_node.start == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="valid: gpus, gres-per-node"):
        SimConfig(requests="per-gpu")


@pytest.mark.parametrize("mode", ["rounds", "slurm"])
def test_pm_first_avoids_the_slow_gpu_that_packing_takes(mode: str) -> None:
    # GPU 0 is 2x slow, GPU 1 fast. Packed takes the lowest index (GPU 0): 100 s of work take
    # 200 s. PM-First and PAL take GPU 1: 100 s.
    gpus = two_gpus([2.0, 1.0])
    trace = [job(0, 0.0, 1, 100.0)]
    jct = {
        p: simulate(trace, gpus, SimConfig(placement=p, mode=mode, round_seconds=50)).summary()[
            "avg_jct"
        ]
        for p in ("packed-sticky", "pm-first", "pal")
    }
    assert jct == pytest.approx({"packed-sticky": 200.0, "pm-first": 100.0, "pal": 100.0})


def test_progress_uses_the_true_slowdown_not_the_bin() -> None:
    # Both GPUs are in one bin (score 1.0) for placement; GPU 0 really is 1.5x slow.
    gpus = two_gpus([1.0, 1.0], truth=[1.5, 1.0])
    result = simulate([job(0, 0.0, 1, 100.0)], gpus, SimConfig(placement="pm-first"))
    assert outcome(result, "0").end == pytest.approx(150.0)


def test_multi_gpu_job_runs_at_its_slowest_gpu() -> None:
    gpus = two_gpus([1.2, 1.0])
    result = simulate([job(0, 0.0, 2, 100.0)], gpus, SimConfig(placement="pal"))
    assert outcome(result, "0").end == pytest.approx(120.0)


def test_fifo_queueing_wait_makespan_and_utilization() -> None:
    # 2 GPUs, 50 s rounds. Job 0 (2 GPUs, 100 s) runs 0-100; job 1 (1 GPU, 50 s) cannot fit
    # and FIFO stops there; it starts at the 100 s boundary and ends at 150 s.
    gpus = uniform_gpus(["A"], 1, 2)
    trace = [job(0, 0.0, 2, 100.0), job(1, 0.0, 1, 50.0)]
    config = SimConfig(placement="packed-sticky", round_seconds=50)
    summary = simulate(trace, gpus, config).summary()
    assert summary["avg_jct"] == pytest.approx(125.0)
    assert summary["avg_wait"] == pytest.approx(50.0)
    assert summary["makespan"] == pytest.approx(150.0)
    # 2 GPUs x 100 s + 1 GPU x 50 s used out of 2 GPUs x 150 s.
    assert summary["utilization"] == pytest.approx(250.0 / 300.0)
    assert summary["p99_jct"] == pytest.approx(150.0)


def test_jobs_arrive_at_the_next_round_boundary() -> None:
    gpus = uniform_gpus(["A"], 1, 1)
    result = simulate([job(0, 130.0, 1, 10.0)], gpus, SimConfig(round_seconds=100))
    assert outcome(result, "0").start == pytest.approx(200.0)
    assert outcome(result, "0").wait == pytest.approx(70.0)


@pytest.mark.parametrize("placement", ["packed-sticky", "packed-nonsticky"])
def test_las_preempts_the_running_job_for_a_newcomer(placement: str) -> None:
    # One GPU, 10 s rounds. Job 0 (100 s) runs from 0; job 1 (10 s) arrives at 15 s and is seen
    # at 20 s with no attained service, so LAS ranks it first: job 0 is preempted at 20 s with
    # 80 s left, job 1 runs 20-30, job 0 resumes at 30 and ends at 110.
    gpus = uniform_gpus(["A"], 1, 1)
    trace = [job(0, 0.0, 1, 100.0), job(1, 15.0, 1, 10.0)]
    config = SimConfig(placement=placement, scheduler="las", round_seconds=10)
    result = simulate(trace, gpus, config)
    assert outcome(result, "1").end == pytest.approx(30.0)
    assert outcome(result, "0").end == pytest.approx(110.0)
    assert result.summary()["preemptions"] == 1
    assert result.summary()["migrations"] == 0


def test_srtf_runs_the_shortest_remaining_job_first() -> None:
    gpus = uniform_gpus(["A"], 1, 1)
    trace = [job(0, 0.0, 1, 100.0), job(1, 0.0, 1, 10.0)]
    result = simulate(trace, gpus, SimConfig(scheduler="srtf", round_seconds=10))
    assert outcome(result, "1").end == pytest.approx(10.0)
    assert outcome(result, "0").end == pytest.approx(110.0)


def test_fifo_places_the_older_big_job_first_and_stops() -> None:
    # 2 GPUs, 10 s rounds: job 0 (2 GPUs) comes first in FIFO order and takes both GPUs; the
    # round stops at job 1 (no backfilling in PAL's round mode) and jobs 1 and 2 start at 20 s.
    gpus = uniform_gpus(["A"], 1, 2)
    trace = [job(0, 0.0, 2, 20.0), job(1, 0.0, 1, 10.0), job(2, 0.0, 1, 10.0)]
    for placement in PLACEMENTS:
        result = simulate(trace, gpus, SimConfig(placement=placement, round_seconds=10))
        assert [outcome(result, i).start for i in "012"] == [0.0, 20.0, 20.0]
        assert result.summary()["preemptions"] == 0


def test_failed_preemption_is_undone_in_corrected_mode_only() -> None:
    # 2 GPUs, SRTF, 10 s rounds. X (1 GPU, 50 s) and Y (1 GPU, 1000 s) run from t=0. C (2 GPUs,
    # 100 s) is seen at t=10; the order is X (40 s left), C (100), Y (990). C preempts Y, still
    # does not fit (X is ahead of it), and the round stops. Corrected: Y gets its GPU back and
    # runs until C starts at t=50 (C runs 50-150, Y ends at 150 + 950 = 1100). PAL's code leaves
    # Y preempted from t=10 (it ends at 150 + 990 = 1140).
    gpus = uniform_gpus(["A"], 1, 2)
    trace = [job(0, 0.0, 1, 50.0), job(1, 0.0, 1, 1000.0), job(2, 5.0, 2, 100.0)]
    corrected = simulate(trace, gpus, SimConfig("packed-sticky", "srtf", round_seconds=10))
    artifact = simulate(
        trace, gpus, SimConfig("packed-sticky", "srtf", round_seconds=10, pal_artifact=True)
    )
    assert outcome(corrected, "2").start == outcome(artifact, "2").start == pytest.approx(50.0)
    assert outcome(corrected, "1").end == pytest.approx(1100.0)
    assert outcome(artifact, "1").end == pytest.approx(1140.0)
    assert corrected.summary()["preemptions"] == artifact.summary()["preemptions"] == 1


def test_nonsticky_keeps_a_job_on_its_gpus_without_counting_migrations() -> None:
    gpus = uniform_gpus(["A", "B"], 2, 4)
    trace = [job(0, 0.0, 3, 1000.0), job(1, 0.0, 1, 1000.0, "B")]
    for placement in ("pal", "pm-first", "packed-nonsticky"):
        summary = simulate(trace, gpus, SimConfig(placement, round_seconds=100)).summary()
        assert summary["migrations"] == 0
        assert summary["preemptions"] == 0


def test_slurm_mode_backfills_only_jobs_that_do_not_delay_the_blocked_job() -> None:
    # 4 GPUs. Job 0 (2 GPUs) runs 0-100. Job 1 (4 GPUs) is blocked: reservation at t=100.
    # Job 2 (2 GPUs, 50 s) ends by 100: it backfills at t=2. Job 3 (2 GPUs, 500 s) would delay
    # job 1: it waits until job 1 ends at 110.
    gpus = uniform_gpus(["A"], 1, 4)
    trace = [
        job(0, 0.0, 2, 100.0),
        job(1, 1.0, 4, 10.0),
        job(2, 2.0, 2, 50.0),
        job(3, 3.0, 2, 500.0),
    ]
    result = simulate(trace, gpus, SimConfig(placement="pal", mode="slurm"))
    starts = {j.job_id: j.start for j in result.jobs}
    assert starts == {"0": 0.0, "1": 100.0, "2": 2.0, "3": 110.0}
    plain = simulate(trace, gpus, SimConfig(placement="pal", mode="slurm", backfill=False))
    assert {j.job_id: j.start for j in plain.jobs} == {"0": 0.0, "1": 100.0, "2": 110.0, "3": 110.0}
    assert result.summary()["preemptions"] == 0


def test_slurm_mode_is_exact_and_non_preemptive() -> None:
    gpus = uniform_gpus(["A"], 1, 2)
    trace = [job(0, 5.0, 1, 33.0), job(1, 6.0, 2, 10.0)]
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert outcome(result, "0").end == pytest.approx(38.0)
    assert outcome(result, "1").start == pytest.approx(38.0)
    assert outcome(result, "1").end == pytest.approx(48.0)


@pytest.mark.parametrize("enforce", [False, True])
def test_a_job_slowed_past_its_limit_ends_there_only_when_limits_are_enforced(
    enforce: bool,
) -> None:
    """Slurm ends a job at its time limit; the simulator does so only when asked, and the
    GPUs are free for the next job from then on."""
    gpus = uniform_gpus(["A"], 1, 1)
    slow = SimGpus(1, 1, gpus.placement_scores, {"A": np.array([2.0])})
    trace = [
        SimJob("0", 0.0, 1, 100.0, "A", time_limit=150.0),  # 200 s on the 2x GPU
        SimJob("1", 1.0, 1, 10.0, "A", time_limit=150.0),  # 20 s: within its limit
    ]
    config = SimConfig(placement="packed-sticky", mode="slurm", enforce_limits=enforce)
    result = simulate(trace, slow, config)
    first, second = outcome(result, "0"), outcome(result, "1")
    assert first.end == pytest.approx(150.0 if enforce else 200.0)
    assert first.timed_out is enforce
    assert second.start == pytest.approx(first.end) and not second.timed_out
    assert second.end == pytest.approx(first.end + 20.0)


def test_a_job_past_its_limit_is_planned_as_slurm_guesses_and_jobs_backfill_around_it() -> None:
    """A Slurm that kills no job past its limit (``OverTimeLimit=UNLIMITED``, the simulator
    without ``enforce_limits``) plans such a job to run a whole limit more, so the queue head's
    reservation lies ahead and a short job takes the idle GPU, as Slurm would start it. Planned
    at its limit's end (in the past), nothing ended by the reservation and the GPU idled."""
    gpus = uniform_gpus(["A"], 1, 2)
    trace = [
        SimJob("0", 0.0, 1, 1000.0, "A", time_limit=100.0),  # runs 900 s past its limit
        SimJob("1", 1.0, 2, 10.0, "A", time_limit=100.0),  # the head: waits for job 0
        SimJob("2", 150.0, 1, 30.0, "A", time_limit=60.0),  # ends by now + 100 s: backfills
    ]
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert outcome(result, "2").start == pytest.approx(150.0)
    assert outcome(result, "1").start == pytest.approx(1000.0)
    # 24.11 counts job 0 gone once past its limit: the head is planned now, nothing backfills
    as_2411 = SimConfig(placement="packed-sticky", mode="slurm", slurm_release="24.11")
    result = simulate(trace, gpus, as_2411)
    assert outcome(result, "1").start == pytest.approx(1000.0)
    assert outcome(result, "2").start == pytest.approx(1000.0 + 10.0)


def test_an_unknown_slurm_release_is_one_line_listing_the_measured_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown Slurm release 'latest'.*22\.05, 24\.11"):
        SimConfig(mode="slurm", slurm_release="latest")


@pytest.mark.parametrize(
    ("limit_end", "limit", "killed", "expected"),
    [
        (500.0, 100.0, False, 500.0),  # ahead: the limit's end
        (500.0, 100.0, True, 500.0),
        (90.0, 100.0, False, 300.0),  # past it, not killed: a whole limit from now
        (90.0, 100.0, True, 201.0),  # past it, killed: a second from now
        (math.inf, math.inf, False, math.inf),  # unlimited: never
        (120.0, None, False, 120.0),  # no limit (the trace's run time): as given
    ],
)
def test_expected_end_follows_slurms_guess(
    limit_end: float, limit: float | None, killed: bool, expected: float
) -> None:
    assert expected_end(limit_end, limit, 200.0, killed=killed) == expected


def test_limits_are_enforced_only_in_slurm_mode() -> None:
    with pytest.raises(ValueError, match="slurm"):
        SimConfig(mode="rounds", enforce_limits=True)


def test_jobs_larger_than_the_cluster_are_reported_not_simulated() -> None:
    gpus = uniform_gpus(["A"], 1, 2)
    result = simulate([job(0, 0.0, 3, 10.0), job(1, 0.0, 1, 10.0)], gpus, SimConfig())
    assert result.unplaceable == ("0",)
    assert result.summary()["jobs"] == 1


def test_unknown_class_is_refused() -> None:
    with pytest.raises(ValueError, match="class"):
        simulate([job(0, 0.0, 1, 10.0, "Z")], uniform_gpus(["A"], 1, 1), SimConfig())


@pytest.mark.parametrize("bad", [{"placement": "tiresias"}, {"scheduler": "sjf"}, {"mode": "x"}])
def test_config_names_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError, match="valid"):
        SimConfig(**bad)


def random_cluster(seed: int) -> SimGpus:
    rng = np.random.default_rng(seed)
    values = {c: np.round(rng.choice([0.9, 1.0, 1.3], 16), 2) for c in "AB"}
    return SimGpus(4, 4, values, values)


@pytest.mark.parametrize("mode", ["rounds", "slurm"])
def test_same_seed_same_numbers(mode: str) -> None:
    trace = poisson_workload(40, 20.0, seed=3, classes=("A", "B"), median_work_s=1200)
    gpus = random_cluster(1)
    for placement in ("random-nonsticky", "pal"):
        config = SimConfig(placement=placement, mode=mode, seed=7, round_seconds=300)
        first = simulate(trace, gpus, config).summary()
        assert simulate(trace, gpus, config).summary() == first
    seeded = SimConfig(placement="random-nonsticky", mode=mode, seed=7, round_seconds=300)
    other = SimConfig(placement="random-nonsticky", mode=mode, seed=8, round_seconds=300)
    assert simulate(trace, gpus, other).summary() != simulate(trace, gpus, seeded).summary()


def test_every_placement_finishes_every_job_and_never_overbooks() -> None:
    trace = poisson_workload(80, 40.0, seed=5, classes=("A", "B"), median_work_s=1200)
    gpus = random_cluster(2)
    for mode in ("rounds", "slurm"):
        for placement in PLACEMENTS:
            result = simulate(trace, gpus, SimConfig(placement=placement, mode=mode))
            summary = result.summary()
            assert summary["unfinished"] == 0, (mode, placement)
            assert all(0 <= busy <= 16 for _, busy in result.timeline)
            assert 0 < summary["utilization"] <= 1
            for j in result.jobs:
                assert j.start is not None and j.end is not None
                assert j.submit <= j.start < j.end


@pytest.mark.parametrize("placement", ["pal", "pm-first", "packed-nonsticky"])
@pytest.mark.parametrize("scheduler", ["fifo", "las", "srtf"])
def test_reusing_the_repeated_part_of_last_plan_changes_nothing(
    placement: str, scheduler: str
) -> None:
    # The engine skips asking the policy again for the prefix of the queue that repeats last
    # round's plan; the outcome must equal re-placing every job every round.
    from slurm_pal.sim.engine import _Simulation

    trace = poisson_workload(30, 30.0, seed=11, classes=("A", "B"), median_work_s=1200)
    gpus = random_cluster(4)
    config = SimConfig(placement=placement, scheduler=scheduler, round_seconds=300)
    full = _Simulation(trace, gpus, config)
    full.replayable = False
    assert full.run_rounds().summary() == simulate(trace, gpus, config).summary()


def test_site_penalty_drives_progress_while_the_advisor_assumes_another() -> None:
    # The advisor's L x V matrix believes spanning costs 1.2; the site really pays 2.0.
    gpus = uniform_gpus(["A"], 2, 2)
    config = SimConfig(placement="pal", locality_penalty=1.2, site_locality_penalty=2.0)
    assert outcome(simulate([job(0, 0.0, 4, 100.0)], gpus, config), "0").end == pytest.approx(200)
    inside = simulate([job(0, 0.0, 2, 100.0)], gpus, config)
    assert outcome(inside, "0").end == pytest.approx(100.0)


def test_advised_class_places_by_another_class_but_runs_at_the_true_one() -> None:
    # Class B jobs placed as class A: A's scores say GPU 1 is fast, but for B GPU 1 is slow.
    scores = {"A": np.array([2.0, 1.0]), "B": np.array([1.0, 2.0])}
    gpus = SimGpus(1, 2, scores, scores)
    trace = [job(0, 0.0, 1, 100.0, "B")]
    own = simulate(trace, gpus, SimConfig(placement="pm-first"))
    merged = simulate(trace, gpus, SimConfig(placement="pm-first", advised_classes=(("B", "A"),)))
    assert outcome(own, "0").end == pytest.approx(100.0)
    assert outcome(merged, "0").end == pytest.approx(200.0)
    assert merged.jobs[0].job_class == "B"


def test_unidentified_jobs_are_placed_as_the_default_class() -> None:
    # Same GPUs as above: the job truly is class B; unidentified, it is placed as class A.
    scores = {"A": np.array([2.0, 1.0]), "B": np.array([1.0, 2.0])}
    gpus = SimGpus(1, 2, scores, scores)
    hidden = [SimJob("0", 0.0, 1, 100.0, "B", known=False)]
    as_a = simulate(hidden, gpus, SimConfig(placement="pm-first", default_class="A"))
    as_b = simulate(hidden, gpus, SimConfig(placement="pm-first", default_class="B"))
    own = simulate(hidden, gpus, SimConfig(placement="pm-first"))
    assert [outcome(r, "0").end for r in (as_a, as_b, own)] == pytest.approx([200.0, 100.0, 100.0])
    known = [SimJob("0", 0.0, 1, 100.0, "B")]
    assert outcome(simulate(known, gpus, SimConfig("pm-first", default_class="A")), "0").end == (
        pytest.approx(100.0)
    )


def _starts(trace: list[SimJob], gpus: SimGpus, reserves: str) -> dict[str, float | None]:
    config = SimConfig(placement="packed-sticky", mode="slurm", backfill_reserves=reserves)
    return {job.job_id: job.start for job in simulate(trace, gpus, config).jobs}


def test_backfill_reserving_nodes_keeps_a_node_for_every_waiting_job_over_its_limit() -> None:
    """One node of four GPUs, three held until 60 s (limit 120 s). The first waiting job is
    planned there at the holder's limit; the second, which would fit beside it, after it; a
    1-GPU job with a 600 s limit takes the free GPU at once only under EASY (by GPU count, two
    are left beside the first job's reservation). Slurm keeps it waiting
    (tests/slurm/test_backfill_reservations.py), as ``nodes`` does."""
    gpus = uniform_gpus(["A"], 1, 4)
    trace = [
        SimJob("holder", 0.0, 3, 60.0, "A", time_limit=120.0),
        SimJob("first", 1.0, 2, 5.0, "A", time_limit=120.0),
        SimJob("second", 2.0, 2, 5.0, "A", time_limit=120.0),
        SimJob("small", 3.0, 1, 5.0, "A", time_limit=600.0),
    ]
    assert _starts(trace, gpus, "head")["small"] == pytest.approx(3.0)
    nodes = _starts(trace, gpus, "nodes")
    assert nodes["first"] == nodes["second"] == pytest.approx(60.0)  # both fit when it ends
    assert nodes["small"] == pytest.approx(65.0)


def test_a_job_that_ends_before_a_nodes_reservation_starts_backfills_on_that_node() -> None:
    """The first waiting job's node is reserved from the holder's limit (120 s) on; a job whose
    own limit (100 s) ends before then starts on it now; one whose limit does not, waits."""
    gpus = uniform_gpus(["A"], 1, 4)
    trace = [
        SimJob("holder", 0.0, 3, 60.0, "A", time_limit=120.0),
        SimJob("first", 1.0, 2, 5.0, "A", time_limit=120.0),
        SimJob("short", 2.0, 1, 5.0, "A", time_limit=100.0),
        SimJob("long", 3.0, 1, 5.0, "A", time_limit=300.0),
    ]
    starts = _starts(trace, gpus, "nodes")
    assert starts["short"] == pytest.approx(2.0)
    assert starts["long"] == pytest.approx(60.0)  # when the holder ends: room beside first


def test_backfill_reserves_is_one_of_the_known_rules() -> None:
    with pytest.raises(ValueError, match="unknown backfill_reserves 'all'; valid: head, nodes"):
        SimConfig(mode="slurm", backfill_reserves="all")
