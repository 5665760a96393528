"""What a real Slurm's backfill keeps free for the jobs that wait, beside the simulated Slurm.

Slurm's sched/backfill plans every waiting job it tests, in priority order, and reserves the
*nodes* it plans one on for that job's whole time limit (``_add_reservation`` records node
bitmaps); a later job starts now only on nodes no earlier job has reserved over its own
limit. The simulator's Slurm (``sim/engine._EasyBackfill``) and the service's round
(``core/queue.SlurmBackfill``) reserve for the first waiting job only, by GPU count (EASY).
On one node of four GPUs, three held by a job for two more minutes, the two differ: Slurm
plans the second waiting job after the first one's limit, though two GPUs stand free beside
the first then, and keeps a one-GPU job with a long limit off the GPU that is free now;
the simulator starts that job at once, unless told to reserve as Slurm does
(``backfill_reserves="nodes"``). The test holds each to what it does.
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

pytestmark = pytest.mark.slurm

LIMIT_MIN = 2


def test_backfill_reserves_whole_nodes_for_every_waiting_job(testbed_root: Path) -> None:
    tb = LocalSlurm(testbed_root, [NodeSpec("r1", ("a",) * 4)], extra_conf=BACKFILL)
    tb.start()
    try:
        holder = tb.submit(f"--time={LIMIT_MIN}", "--gres=gpu:3", "--wrap", "sleep 60")
        tb.wait_job(holder, 30, state="RUNNING")
        first = tb.submit(f"--time={LIMIT_MIN}", "--gres=gpu:2", "--wrap", "sleep 5")
        second = tb.submit(f"--time={LIMIT_MIN}", "--gres=gpu:2", "--wrap", "sleep 5")
        small = tb.submit("--time=10", "--gres=gpu:1", "--wrap", "sleep 5")
        time.sleep(6)  # several backfill passes (bf_interval=1)
        fields = {job: tb.job_fields(job) for job in (holder, first, second, small)}
        assert fields[holder]["JobState"] == "RUNNING"
        assert all(fields[job]["JobState"] == "PENDING" for job in (first, second, small))
        planned = {
            job: datetime.fromisoformat(fields[job]["StartTime"]).timestamp()
            for job in (holder, first, second)
        }
        # The first waiting job is planned at the holder's limit, on node r1 for its own limit;
        # the second, which would fit beside it then (2 + 2 of 4 GPUs), only after that.
        assert planned[first] == pytest.approx(planned[holder] + LIMIT_MIN * 60, abs=2)
        assert planned[second] >= planned[first] + LIMIT_MIN * 60 - 2
        # A GPU stands free, but r1 is reserved from the holder's limit on: the 10-minute job
        # waits (by GPU count it fits in the two GPUs left beside the first job's reservation).
        assert fields[small]["Reason"] in ("Priority", "Resources")
        # submit times from the holder's start, in submission order (Slurm keeps seconds)
        submitted = [
            datetime.fromisoformat(fields[job]["SubmitTime"]).timestamp() - planned[holder]
            for job in (first, second, small)
        ]
        first_at, second_at, small_at = (max(t, 0.0) + 0.01 * k for k, t in enumerate(submitted))
    finally:
        for job in (holder, first, second, small):
            tb.run(["scancel", str(job)], check=False)
        tb.stop()

    # The simulated Slurm on the same jobs (times from the holder's start): EASY by GPU count
    # reserves two GPUs for the first job only, and starts the 10-minute job at once.
    limit = LIMIT_MIN * 60.0
    trace = [
        SimJob("holder", 0.0, 3, 60.0, "A", time_limit=limit),
        SimJob("first", first_at, 2, 5.0, "A", time_limit=limit),
        SimJob("second", second_at, 2, 5.0, "A", time_limit=limit),
        SimJob("small", small_at, 1, 5.0, "A", time_limit=600.0),
    ]
    as_simulated = SimConfig(placement="packed-sticky", mode="slurm")
    result = simulate(trace, uniform_gpus(["A"], 1, 4), as_simulated)
    simulated = {job.job_id: job for job in result.jobs}
    assert simulated["small"].start == pytest.approx(small_at)
    # Reserving nodes for every waiting job, as Slurm: the 10-minute job waits for a GPU that
    # no reservation covers (once the first two have run).
    as_slurm = SimConfig(placement="packed-sticky", mode="slurm", backfill_reserves="nodes")
    result = simulate(trace, uniform_gpus(["A"], 1, 4), as_slurm)
    simulated = {job.job_id: job for job in result.jobs}
    assert simulated["small"].start >= simulated["first"].start + 5.0
