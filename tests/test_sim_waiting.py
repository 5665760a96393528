"""Bounded waiting in the simulator's Slurm mode, worked out by hand: Slurm plans with time
limits (never around an unlimited job), a held job is not eligible until its begin time (no
reservation, nothing held behind it), and the advisor's wait ends by its bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slurm_pal.adapters.traces import read_sacct_trace, sacct_time_limit
from slurm_pal.core.workload import SimJob, site_like_workload
from slurm_pal.sim import SimConfig, SimGpus, simulate, uniform_gpus
from slurm_pal.sim.variability import few_slow_gpus

INF = math.inf


def job(number: int, submit: float, gpus: int, work: float, limit: float | None = None) -> SimJob:
    return SimJob(str(number), submit, gpus, work, "A", time_limit=limit)


def starts(result) -> dict[str, float | None]:
    return {j.job_id: j.start for j in result.jobs}


def one_slow_node(truth: float = 2.5) -> SimGpus:
    """Two nodes of two GPUs; GPU 0 of node 0 is ``truth`` times slower for class A."""
    values = np.array([truth, 1.0, 1.0, 1.0])
    return SimGpus(2, 2, {"A": values}, {"A": values.copy()})


def advisor(max_wait_s: float = 3600.0, wait: bool = True, **more: float) -> SimConfig:
    settings = (("avoid_above", 1.5), ("wait", wait), ("max_wait_s", max_wait_s), *more.items())
    return SimConfig(placement="advisor", mode="slurm", advisor_settings=settings)


def test_backfill_plans_with_time_limits_and_never_around_an_unlimited_job() -> None:
    # 4 GPUs. Job 0 (2 GPUs) runs 0-100 with a 1000 s limit: Slurm reserves for job 1 (4 GPUs)
    # at 1000, so job 2 (2 GPUs, limit 500) backfills and runs 2-302; with perfect limits (the
    # paper's simulation) the reservation would be at 100 and job 2 would wait for job 1.
    gpus = uniform_gpus(["A"], 1, 4)
    trace = [job(0, 0, 2, 100, 1000), job(1, 1, 4, 10, 100), job(2, 2, 2, 300, 500)]
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert starts(result) == {"0": 0.0, "1": 302.0, "2": 2.0}
    perfect = [job(0, 0, 2, 100), job(1, 1, 4, 10), job(2, 2, 2, 300)]
    result = simulate(perfect, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert starts(result) == {"0": 0.0, "1": 100.0, "2": 110.0}
    # Job 0 unlimited: no reservation can be planned, job 2's limit fits anywhere before never.
    trace[0] = job(0, 0, 2, 100, INF)
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert starts(result)["2"] == 2.0
    # An unlimited job itself never backfills in front of a reservation.
    trace = [job(0, 0, 2, 100, 200), job(1, 1, 4, 10, 100), job(2, 2, 2, 50, INF)]
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert starts(result) == {"0": 0.0, "1": 100.0, "2": 110.0}


def test_a_held_job_waits_for_a_good_gpu_that_frees_soon_and_holds_nobody_behind_it() -> None:
    # Jobs 0-2 take GPUs 1-3 (limits 600 s, job 0's GPU frees at 500). Job 3 (class A, 2 h)
    # could start at once on the 2.5x outlier: 500 s of waiting beats 3 h lost, so it is held;
    # job 4 (memory-bound, class D) behind it is not held and takes the outlier at once.
    values = np.array([2.5, 1.0, 1.0, 1.0])
    gpus = SimGpus(2, 2, {"A": values, "D": np.ones(4)}, {"A": values, "D": np.ones(4)})
    trace = [
        job(0, 0, 1, 500, 600),
        SimJob("1", 0, 1, 5000, "A", time_limit=6000),
        SimJob("2", 0, 1, 5000, "A", time_limit=6000),
        SimJob("3", 10, 1, 7200, "A", time_limit=7200),
        SimJob("4", 20, 1, 100, "D", time_limit=200),
    ]
    result = simulate(trace, gpus, advisor())
    assert starts(result) == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 500.0, "4": 20.0}
    assert next(j for j in result.jobs if j.job_id == "3").end == pytest.approx(500 + 7200)
    # Without waiting it takes the outlier at once and runs 2.5x as long.
    last = simulate(trace, gpus, advisor(wait=False))
    assert next(j for j in last.jobs if j.job_id == "3").end == pytest.approx(10 + 7200 * 2.5)


def test_a_held_job_that_no_longer_fits_gets_no_reservation_and_holds_nobody() -> None:
    # Job 2 (2 GPUs, class A) is held at 10 for two good GPUs on node 1 (job 1's ends there
    # first). Job 3 (memory-bound) takes the outlier at 20, so from then on job 2 does not
    # fit even by count. Slurm does not consider a job before its begin time: job 4 behind it
    # starts at once, though its 5000 s limit would not end before a reservation for job 2
    # (at 220, when job 3's limit ends) and backfill would keep it back for an eligible job.
    values = np.array([2.5, 1.0, 1.0, 1.0])
    gpus = SimGpus(2, 2, {"A": values, "D": np.ones(4)}, {"A": values, "D": np.ones(4)})
    trace = [
        job(0, 0, 1, 500, 600),
        job(1, 0, 1, 5000, 6000),
        job(2, 10, 2, 7200, 7200),
        SimJob("3", 20, 1, 100, "D", time_limit=200),
        SimJob("4", 30, 1, 100, "D", time_limit=5000),
    ]
    result = simulate(trace, gpus, advisor(max_wait_s=86400))
    held = next(j for j in result.jobs if j.job_id == "2")
    assert held.held_s > 0 and held.start > 30
    assert starts(result)["4"] == 30.0


def test_the_bound_ends_a_wait_that_the_estimates_said_was_short() -> None:
    # The good GPU's holder has a 600 s limit but really runs 3 h (a limit is an estimate
    # from outside): the held job starts at its bound on the outlier, not when the GPU frees.
    trace = [
        job(0, 0, 1, 10800, 20000),
        job(1, 0, 1, 10800, 20000),
        job(2, 0, 1, 10800, 20000),
        job(3, 10, 1, 7200, 7200),
    ]
    # Job 0's limit says 600 s; it is a simulated Slurm, so the limit does not kill it here.
    trace[0] = SimJob("0", 0, 1, 10800, "A", time_limit=600)
    result = simulate(trace, one_slow_node(), advisor(max_wait_s=1800))
    assert starts(result)["3"] == pytest.approx(10 + 1800)


def test_unlimited_neighbours_never_justify_a_wait_that_stalls_the_cluster() -> None:
    # The stall seen on a real site's history: long unlimited jobs on the good GPUs, a stream
    # of single-GPU jobs, one outlier free. Nothing waits: no end is expected for those GPUs.
    trace = [job(i, 0, 1, 86400, INF) for i in range(3)]
    trace += [job(3 + i, 60 * (i + 1), 1, 600, INF) for i in range(5)]
    held = simulate(trace, one_slow_node(), advisor(max_wait_s=86400))
    never = simulate(trace, one_slow_node(), advisor(wait=False))
    assert starts(held) == starts(never)
    assert max(j.start for j in held.jobs) < 4 * 3600


def test_last_resort_and_a_zero_bound_never_hold_a_job() -> None:
    trace = [job(0, 0, 1, 500, 600), job(1, 0, 1, 5000, 6000), job(2, 0, 1, 5000, 6000)]
    trace.append(job(3, 10, 1, 7200, 7200))
    for config in (advisor(wait=False), advisor(max_wait_s=0)):
        assert starts(simulate(trace, one_slow_node(), config))["3"] == 10.0


def test_sacct_time_limits_are_read_as_slurm_writes_them(tmp_path) -> None:
    assert sacct_time_limit("UNLIMITED") == INF
    assert sacct_time_limit("Partition_Limit") == INF
    assert sacct_time_limit("2-00:00:00") == 172800
    assert sacct_time_limit("1-12:00") == 129600
    assert sacct_time_limit("12:00:00") == 43200
    assert sacct_time_limit("30:00") == 1800
    assert sacct_time_limit("90") == 5400
    assert sacct_time_limit("") is None
    with pytest.raises(ValueError, match="Timelimit"):
        sacct_time_limit("soon")
    history = tmp_path / "week.sacct"
    history.write_text(
        "JobID|Submit|Start|End|AllocTRES|Timelimit\n"
        "1|2026-01-01T00:00:00|2026-01-01T00:00:00|2026-01-01T01:00:00|gres/gpu=1|UNLIMITED\n"
        "2|2026-01-01T00:10:00|2026-01-01T00:10:00|2026-01-01T00:40:00|gres/gpu=2|01:00:00\n"
        "3|2026-01-01T00:20:00|2026-01-01T00:20:00|2026-01-01T00:30:00|gres/gpu=1|later\n"
    )
    with pytest.raises(ValueError, match="line 4.*Timelimit"):
        read_sacct_trace(history)
    history.write_text("\n".join(history.read_text().splitlines()[:3]) + "\n")
    limits = [j.time_limit for j in read_sacct_trace(history).jobs]
    assert limits == [INF, 3600.0]


def test_site_like_histories_look_like_a_site() -> None:
    jobs = site_like_workload(64, load=0.8, n_jobs=2000, seed=3)
    assert jobs == site_like_workload(64, load=0.8, n_jobs=2000, seed=3)
    single = sum(j.gpus == 1 for j in jobs) / len(jobs)
    unlimited = sum(j.time_limit == INF for j in jobs) / len(jobs)
    assert 0.8 < single < 0.9 and 0.25 < unlimited < 0.35
    assert all(j.time_limit >= j.work for j in jobs if j.time_limit is not None)
    span = jobs[-1].submit_time - jobs[0].submit_time
    offered = sum(j.gpus * j.work for j in jobs) / (span * 64)
    assert 0.6 < offered < 1.0  # Poisson arrivals around the asked load
    assert max(j.work for j in jobs) > 86400 > 600 > min(j.work for j in jobs)
    with pytest.raises(ValueError, match="valid"):
        site_like_workload(64, time_limits={"never": 1.0})


def test_few_slow_gpus_are_far_slower_for_the_sensitive_class_only() -> None:
    gpus = few_slow_gpus("ABCD", 16, 4, seed=2)
    slow = gpus.true_slowdown["A"] > 1.5
    assert 1 <= slow.sum() <= 3
    assert (gpus.placement_scores["A"][slow] > 1.5).all()
    assert (gpus.true_slowdown["D"] < 1.1).all()


def test_a_replay_of_profiles_from_two_clusters_is_refused(tmp_path) -> None:
    from slurm_pal.sim.inputs import load_gpus

    def campaign(name: str, prefix: str, values: list[float]) -> str:
        path = tmp_path / name
        rows = [f"{prefix}{i},{value}" for i, value in enumerate(values)]
        path.write_text("uuid,duration_s\n" + "\n".join(rows) + "\n")
        return str(path)

    values = [1.0, 1.01, 0.99, 1.02, 0.98, 2.5, 1.0, 1.0]
    a = campaign("a.csv", "GPU-aaaa-", values)
    other = campaign("c.csv", "GPU-cccc-", values)
    same = campaign("c-same.csv", "GPU-aaaa-", values)
    with pytest.raises(ValueError, match="a.csv measures no GPU that .*c.csv measures"):
        load_gpus({"A": a, "C": other}, 2, 2)
    assert load_gpus({"A": a, "C": same}, 2, 2).n_gpus == 4


def test_the_admin_is_told_what_limits_and_holds_mean_for_waiting() -> None:
    from slurm_pal.sim.experiments import limits_note, waiting_note

    assert limits_note([job(0, 0, 1, 10)]) is None  # no limits in the trace: nothing to say
    mostly = [job(i, 0, 1, 10, INF) for i in range(3)] + [job(3, 0, 1, 10, 60)]
    assert "75% of the history's jobs have no time limit" in (limits_note(mostly) or "")
    assert "only where other GPUs are free" in (limits_note(mostly) or "")
    # A run that held job 3 until its bound, and lost: the note says so, and what to do.
    trace = [job(0, 0, 1, 10800, 20000), job(1, 0, 1, 10800, 20000), job(2, 0, 1, 10800, 20000)]
    trace[0] = SimJob("0", 0, 1, 10800, "A", time_limit=600)
    trace.append(job(3, 10, 1, 7200, 7200))
    summary = simulate(trace, one_slow_node(), advisor(max_wait_s=1800)).summary()
    assert (summary["held_jobs"], summary["held_to_bound"]) == (1, 1)
    assert summary["held_max_s"] == pytest.approx(1800)
    note = waiting_note("advisor", [summary], [1.2, 0.9]) or ""
    assert "held 1 of 4 jobs" in note and "1 per run until the bound" in note
    assert "lost to packing by more than 3 % in 1 of 2 runs (worst 1.20x)" in note
    never = simulate(trace, one_slow_node(), advisor(wait=False)).summary()
    assert waiting_note("advisor", [never], [1.0]) is None


def test_what_the_sites_unlimited_jobs_ran_is_what_an_unlimited_job_is_weighed_at() -> None:
    # Jobs 0-2 (class A, 2 h limits) hold the good GPUs; job X (class A, UNLIMITED, 4 h of
    # work) could start at once on the 2.5x outlier. Weighed at the fixed hour an unknown
    # runtime stands for, 1.5 h lost beats a 2 h wait: it takes the outlier. Once 20 unlimited
    # 1-GPU jobs of 4 h have ended (class D, which the outlier does not slow), the engine
    # weighs it at 4 h: 6 h lost, so it waits the 2 h for a good GPU. The holders are weighed
    # at their whole limits (limit_share 1: their ends are the 2 h the wait is weighed at).
    values = np.array([2.5, 1.0, 1.0, 1.0])
    gpus = SimGpus(2, 2, {"A": values, "D": np.ones(4)}, {"A": values, "D": np.ones(4)})
    day = 21 * 3600.0
    holders = [SimJob(str(i), day, 1, 7200, "A", time_limit=7200) for i in range(3)]
    late = SimJob("X", day + 10, 1, 4 * 3600, "A", time_limit=INF)
    history = [SimJob(f"h{i}", 0, 1, 4 * 3600, "D", time_limit=INF) for i in range(20)]
    config = advisor(max_wait_s=86400, limit_share=1.0)
    learned = {j.job_id: j for j in simulate([*history, *holders, late], gpus, config).jobs}
    assert learned["X"].start == pytest.approx(day + 7200)
    assert learned["X"].end == pytest.approx(day + 7200 + 4 * 3600)
    cold = {j.job_id: j for j in simulate([*holders, late], gpus, config).jobs}
    assert cold["X"].start == pytest.approx(day + 10)
    assert cold["X"].end == pytest.approx(day + 10 + 4 * 3600 * 2.5)
