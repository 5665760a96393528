"""How a real Slurm plans around a job that has run past its time limit, and the simulator
beside it on the same jobs.

The simulator kills no job at its limit (unless ``enforce_limits``), as a Slurm with
``OverTimeLimit=UNLIMITED`` (the testbed's site-like scheduler, ``testbed.run.BACKFILL``).
Such a Slurm's backfill expects a job past its limit to run a whole limit more, so a short job
starts on a free GPU behind a head that waits for the overrunning job's GPUs. Planned at the
limit's end already past (the simulator's model before), the head's reservation lay in the
past and the short job waited for the overrunning job's end.

Measured: 22.05 does as its select/cons_tres code says (``_guess_job_end``: a whole limit
from now) and the simulator now gives its starts. 24.11, with the same slurm.conf, plans the
head now (``squeue --start``), so the short job waits for the long one's end: its
``_future_run_test`` counts a running job whose end is already past as gone before it
simulates any end (``_build_cr_job_list``), whatever ``OverTimeLimit`` says. The test holds
each release to what it does, and the simulator, told the release (``slurm_release``), to
the same starts.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from slurm_pal.core.workload import SimJob
from slurm_pal.sim import SimConfig, simulate, uniform_gpus
from slurm_pal.testbed import LocalSlurm
from slurm_pal.testbed.cluster import NodeSpec
from slurm_pal.testbed.run import BACKFILL
from tests.helpers.slurm_lab import release_of

pytestmark = pytest.mark.slurm

LIMIT_MIN = 2
OVERRUN_S = 150  # the long job's run time: 30 s past its 2-minute limit
SHORT_AT_S = 128  # when the short job is submitted: past the long job's limit
CHECK_AT_S = 20  # a job too long to end by the head's reservation: shows there is one


def _epoch(tb: LocalSlurm, job_id: int, key: str) -> float:
    return datetime.fromisoformat(tb.job_fields(job_id)[key]).timestamp()


def test_a_short_job_backfills_beside_a_job_past_its_limit(testbed_root: Path) -> None:
    tb = LocalSlurm(testbed_root, [NodeSpec("o1", ("a",) * 4)], extra_conf=BACKFILL)
    tb.start()
    long = tb.submit(f"--time={LIMIT_MIN}", "--gres=gpu:3", "--wrap", f"sleep {OVERRUN_S}")
    tb.wait_job(long, 30, state="RUNNING")
    began = _epoch(tb, long, "StartTime")
    head = tb.submit(f"--time={LIMIT_MIN}", "--gres=gpu:4", "--wrap", "sleep 1")
    time.sleep(max(0.0, began + CHECK_AT_S - time.time()))
    check = tb.submit("--time=3", "--gres=gpu:1", "--wrap", "sleep 5")
    check_at = _epoch(tb, check, "SubmitTime")
    time.sleep(max(0.0, began + SHORT_AT_S - time.time()))
    assert tb.job_fields(long)["JobState"] == "RUNNING"  # past its limit, not killed
    # A GPU stood free all along: the head's reservation kept the 3-minute job off it.
    assert tb.job_fields(check)["JobState"] == "PENDING"
    short = tb.submit("--time=1", "--gres=gpu:1", "--wrap", "sleep 5")
    submitted = _epoch(tb, short, "SubmitTime")
    tb.wait_job(short, OVERRUN_S, state="RUNNING")
    started = _epoch(tb, short, "StartTime")
    long_end = began + OVERRUN_S
    release = release_of(tb)
    expects_a_limit_more = not release.backfill_drops_jobs_past_limit
    if expects_a_limit_more:
        assert started < long_end - 10, "Slurm kept the free GPU idle for the head's reservation"
    else:
        assert started >= long_end - 2, "24.11 backfilled beside a job past its limit"
    tb.wait_job(head, OVERRUN_S + 60)
    assert _epoch(tb, head, "StartTime") >= long_end - 1
    tb.wait_job(check, 60, state="RUNNING")
    assert _epoch(tb, check, "StartTime") >= _epoch(tb, head, "StartTime")

    # The simulator on the same jobs (one node of four GPUs, times from the long job's start).
    trace = [
        SimJob("long", 0.0, 3, float(OVERRUN_S), "A", time_limit=LIMIT_MIN * 60.0),
        SimJob("head", 1.0, 4, 1.0, "A", time_limit=LIMIT_MIN * 60.0),
        SimJob("check", check_at - began, 1, 5.0, "A", time_limit=180.0),
        SimJob("short", submitted - began, 1, 5.0, "A", time_limit=60.0),
    ]
    as_this_slurm = SimConfig(placement="packed-sticky", mode="slurm", slurm_release=release.series)
    result = simulate(trace, uniform_gpus(["A"], 1, 4), as_this_slurm)
    simulated = {job.job_id: job for job in result.jobs}
    assert simulated["head"].start == pytest.approx(OVERRUN_S)
    assert simulated["check"].start >= simulated["head"].start
    if expects_a_limit_more:
        assert simulated["short"].start == pytest.approx(submitted - began)
        # Slurm starts it on its next backfill pass (bf_interval=1), the simulator at once.
        assert started - submitted <= 5
    else:  # after the long job, as measured
        assert simulated["short"].start >= simulated["head"].start
    tb.stop()
