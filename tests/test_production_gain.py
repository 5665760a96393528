"""The production matrix's own pieces that need no shared data: the gang family's gangs and the
tail rule against the controls."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

from slurm_pal.core.workload import SimJob
from slurm_pal.sim.metrics import JobOutcome

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import production_gain


def _short_jobs() -> list[SimJob]:
    return [
        SimJob(str(i), 60.0 * i, 1 + (i % 3) * 3, 600.0, "AB"[i % 2], time_limit=3600.0)
        for i in range(50)
    ]


def test_the_gang_family_adds_large_long_gangs_among_the_short_jobs() -> None:
    jobs = production_gain.with_gangs(_short_jobs(), 3)
    gangs = [j for j in jobs if j.job_id.startswith("gang")]
    assert len(gangs) == production_gain.GANGS and len(jobs) == 50 + production_gain.GANGS
    assert all(j.gpus in production_gain.GANG_SIZES for j in gangs)
    assert all(3600.0 <= j.work <= 12 * 3600.0 for j in gangs)
    assert all(j.time_limit == production_gain.padded_limit(j.work) for j in gangs)
    assert all(j.submit_time <= 0.8 * 49 * 60.0 for j in gangs)
    assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
    # a gang is a model of one of the trace's multi-GPU jobs, with its class
    assert {j.job_class for j in gangs} <= {"A", "B"}
    # the same gangs for every placement of a run, others for another run
    assert production_gain.with_gangs(_short_jobs(), 3) == jobs
    assert production_gain.with_gangs(_short_jobs(), 4) != jobs


def test_the_tail_rule_holds_the_advisor_to_the_worse_control_plus_the_slack() -> None:
    def row(p90: float, worst: float) -> dict[str, float]:
        return {"p90_ratio": p90, "worst_ratio": worst}

    within = production_gain.tail_rule(
        {"advisor": row(1.05, 1.30), "null": row(1.03, 1.20), "faster": row(1.01, 1.29)}
    )
    assert within is not None and within["within"] is True
    assert within["worst_ratio"] == {"advisor": 1.30, "worse_control": 1.29}
    missed = production_gain.tail_rule(
        {"advisor": row(1.00, 1.40), "null": row(1.03, 1.20), "faster": row(1.01, 1.29)}
    )
    assert missed is not None and missed["within"] is False
    # without both controls there is nothing to judge against
    assert production_gain.tail_rule({"advisor": row(1.0, 1.0), "null": row(1.0, 1.0)}) is None
    cell = (4, "sia", "few-slow")
    assert production_gain.missing_tail_rule({cell: missed}) == ["4xsiaxfew-slow"]
    assert production_gain.missing_tail_rule({cell: within}) == []
    assert production_gain.missing_tail_rule({cell: None}) is None  # not judged: not "met"


def test_a_job_started_past_its_bound_is_listed_with_its_hold_and_start() -> None:
    from slurm_pal.sim.metrics import JobOutcome

    # held at 8 h (it could have started then), bound 24 h later, started at 34.5 h
    job = JobOutcome(
        job_id="86",
        job_class="A",
        gpus=24,
        submit=3.0 * 3600,
        start=34.5 * 3600,
        end=90.0 * 3600,
        work=58.0 * 3600,
        tracked=True,
        preemptions=0,
        migrations=0,
        max_nodes=24,
        held_s=26.5 * 3600,
    )
    row = production_gain.past_bound_row(job, 86400.0)
    assert row == {
        "job": "86",
        "gpus": 24,
        "class": "A",
        "held_at_h": 8.0,
        "bound_h": 32.0,
        "start_h": 34.5,
        "late_h": 2.5,
        "nodes": 24,
    }


def test_jobs_past_their_limit_are_counted_with_their_gpu_hours_past_it() -> None:
    def outcome(job_id: str, gpus: int, start: float | None, end: float | None) -> JobOutcome:
        return JobOutcome(job_id, "A", gpus, 0.0, start, end, 0.0, True, 0, 0)

    outcomes = [
        outcome("over", 4, 0.0, 5000.0),  # limit 3600: 1,400 s past on 4 GPUs
        outcome("within", 2, 0.0, 3600.0),
        outcome("unlimited", 1, 0.0, 10_000.0),
        outcome("no-limit", 1, 0.0, 10_000.0),
        outcome("never-ran", 8, None, None),
    ]
    limits = {"over": 3600.0, "within": 3600.0, "unlimited": math.inf, "no-limit": None}
    figures = production_gain.past_limits(outcomes, limits)
    assert figures["past_limit"] == 1
    total = 4 * 5000.0 + 2 * 3600.0 + 10_000.0 + 10_000.0
    assert figures["past_limit_gpu_share"] == pytest.approx(4 * 1400.0 / total)
    assert figures["timed_out"] == 0

    killed = dataclasses.replace(outcome("within", 2, 0.0, 3600.0), timed_out=True)
    figures = production_gain.past_limits([*outcomes[:1], killed, *outcomes[2:]], limits)
    assert figures["timed_out"] == 1  # ended at its limit: lost, not past it
    assert figures["timed_out_gpu_share"] == pytest.approx(2 * 3600.0 / total)
    assert figures["past_limit"] == 1


def test_a_job_past_its_bound_is_read_beside_its_start_under_packing() -> None:
    cell = (1, "sia", "few-slow")
    ref = production_gain.REFERENCE

    def late(job: str, start_h: float) -> dict[str, object]:
        return {"job": job, "start_h": start_h}

    results = {
        # run 0: job 100 starts at 119 h, packing started it at 118.4 h: later
        (cell, 0, "advisor"): {"past_bound_jobs": [late("100", 119.0)]},
        (cell, 0, ref): {"starts": {"100": 118.4 * 3600, "7": 0.0}},
        # run 1: job 100 starts at 118.6 h, packing only at 130.7 h: the hold is not why
        (cell, 1, "advisor"): {"past_bound_jobs": [late("100", 118.6)]},
        (cell, 1, ref): {"starts": {"100": 130.7 * 3600}},
        # run 2: a job packing never started counts as later
        (cell, 2, "advisor"): {"past_bound_jobs": [late("93", 50.0)]},
        (cell, 2, ref): {"starts": {"93": None}},
    }
    summary = production_gain.past_bound_summary(results, cell, 3, "advisor")
    rows = summary["past_bound_jobs"]
    assert [(r["run"], r["reference_start_h"], r["later"]) for r in rows] == [
        (0, 118.4, True),
        (1, 130.7, False),
        (2, None, True),
    ]
    assert summary["held_past_bound_later_than_reference"] == 2
