"""Bounded waiting on a real Slurm, end to end: the rendered job_submit.lua, Prolog and Epilog,
and a real ``slurm-pal serve`` on 3 nodes x 2 fake GPUs, one of them 2.3x slower for class A.

What the simulator simulates is what Slurm does: a job the advisor holds for a GPU that is
not an outlier for it gets its bound as its begin time, so Slurm starts it nowhere before
(not elsewhere at once, as an exclusion let it) and holds nobody behind it; it starts when a
round routes it to the freed GPU, or, with the advisor gone, by its bound on Slurm's own.
The measured wait is compared with the simulator's on the same trace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from slurm_pal.core.workload import SimJob
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.sim import SimConfig, SimGpus, simulate
from tests.helpers.slurm_lab import (
    AdvisorLab,
    host_release_only,
    lab_paths,
    render_site,
    require_slurm,
    write_campaign,
)

pytestmark = pytest.mark.slurm

MAX_WAIT_S = 30
SLOW = 2.3  # the outlier's slowdown for class A
NODES = ("n01", "n02", "n03")
# From a round's update to Slurm's start of the job it routes: short against the bound.
SLURM_START_S = 5


def _campaign(path: Path) -> None:
    """n01's second GPU is 2.3x slower for class A only."""
    write_campaign(
        path, NODES, lambda node, index, cls: SLOW if (node, index, cls) == ("n01", 1, "A") else 1.0
    )


@dataclass(kw_only=True)
class WaitLab(AdvisorLab):
    labels: dict

    def label(self, node: str, slow: bool) -> str:
        """The PM label of ``node``'s GPU that is (not) the outlier."""
        outlier = self.outlier_uuid()
        (label,) = {
            g["label"] for g in self.labels["nodes"][node] if (g["uuid"] == outlier) == slow
        }
        return label

    def outlier_uuid(self) -> str:
        return next(g["uuid"] for g in self.labels["nodes"]["n01"] if g["index"] == 1)

    def fields(self, job_id: int) -> dict[str, str]:
        return self.tb.job_fields(job_id)

    def when(self, job_id: int, key: str) -> float:
        """A job's SubmitTime/StartTime/EligibleTime as epoch seconds."""
        return datetime.fromisoformat(self.fields(job_id)[key]).timestamp()

    def wait_state(self, job_id: int, state: str, timeout_s: float = 120) -> None:
        self.tb.wait_job(job_id, timeout_s, state=state)

    def gpu_uuid(self, job_id: int) -> str:
        """The one GPU the job holds, by Slurm's index on its node."""
        job = self.jobs()[job_id]
        ((node, (index,)),) = job.allocated_gpu_indices().items()
        return next(g["uuid"] for g in self.labels["nodes"][node] if g["slurm_index"] == index)


@pytest.fixture(scope="module")
def lab() -> Iterator[WaitLab]:
    require_slurm()
    paths = lab_paths()
    paths.config.write_text(
        paths.site_toml(
            'policy = "packed-pm"\noutliers = "wait"\n'
            f"max_wait_s = {MAX_WAIT_S}\nrefresh_s = 1.0\nreplan_s = 0\n"
        )
    )
    csv = paths.work / "campaign.csv"
    _campaign(csv)
    labels = render_site(
        paths.db, csv, paths.site, config=paths.config, apps={"resnet": "A", "pagerank": "D"}
    )
    the_lab = WaitLab(**paths.lab_fields(labels), labels=labels)
    with the_lab.running():
        yield the_lab


@pytest.fixture
def clean(lab: WaitLab) -> Iterator[WaitLab]:
    lab.ensure_advisor()
    lab.cancel_all()
    lab.wait_advisor_sees_all_free(6)
    try:
        yield lab
    finally:
        lab.ensure_advisor()
        lab.cancel_all()


def _fill_and_neighbour(lab: WaitLab, neighbour_s: int) -> int:
    """Long jobs on n02 and n03, and on n01's good GPU a job with a one-minute limit that
    runs ``neighbour_s``: the outlier is the only free GPU. Returns the neighbour's id."""
    for node in ("n02", "n03"):
        for _ in range(2):
            lab.sbatch("--gres=gpu:1", "-w", node, "-t", "10", "--wrap", "sleep 600")
    good = lab.label("n01", slow=False)
    neighbour = lab.sbatch(f"--gres=gpu:{good}:1", "-t", "1", "--wrap", f"sleep {neighbour_s}")
    lab.wait_state(neighbour, "RUNNING")
    deadline = time.monotonic() + 60
    while len([j for j in lab.jobs().values() if j.state == "RUNNING"]) < 5:
        assert time.monotonic() < deadline, lab.jobs()
        time.sleep(0.2)
    return neighbour


def _held(lab: WaitLab, job_id: int) -> dict[str, str]:
    comment = parse_admin_comment(lab.jobs()[job_id].admin_comment)
    assert comment is not None and comment["action"] == "wait", lab.jobs()[job_id]
    return comment


def _predicted_start(held_submit: float, memory_submit: float) -> tuple[float, float]:
    """The simulator on the same trace (seconds from the neighbour's start): when the held
    job and the memory-bound job start, the advisor configured as the lab's."""
    # The neighbour first: packing puts it on n01's good GPU; the fillers then go to n02 and
    # n03 (the outlier is left out at no cost), as the testbed's fillers were put there.
    trace = [SimJob("neighbour", 0.0, 1, 50.0, "A", time_limit=60.0)]
    trace += [SimJob(f"f{i}", 0.0, 1, 600.0, "A", time_limit=600.0) for i in range(4)]
    trace.append(SimJob("held", held_submit, 1, 20.0, "A", time_limit=600.0))
    trace.append(SimJob("memory", memory_submit, 1, 20.0, "D", time_limit=300.0))
    starts = _simulated_starts(trace)
    return starts["held"], starts["memory"]


def _simulated_starts(trace: list[SimJob]) -> dict[str, float]:
    """Each job's start in the simulator's Slurm mode on the lab's GPUs (n01's second one
    2.3x slower for class A), the advisor configured as the lab's."""
    values_a = np.array([1.0, SLOW, 1.0, 1.0, 1.0, 1.0])
    ones = np.ones(6)
    gpus = SimGpus(3, 2, {"A": values_a, "D": ones}, {"A": values_a.copy(), "D": ones.copy()})
    settings = (("avoid_above", 1.5), ("wait", True), ("max_wait_s", float(MAX_WAIT_S)))
    config = SimConfig(placement="advisor", mode="slurm", advisor_settings=settings)
    return {job.job_id: float(job.start) for job in simulate(trace, gpus, config).jobs}


def test_a_held_job_is_routed_at_its_neighbours_end_and_holds_nobody_behind_it(
    clean: WaitLab,
) -> None:
    lab = clean
    neighbour = _fill_and_neighbour(lab, neighbour_s=50)
    t0 = lab.when(neighbour, "StartTime")
    # 32 s into the neighbour's minute the good GPU is expected free in under 28 s: shorter
    # than the bound and than the 13 minutes the 2.3x GPU would cost a 10-minute job.
    time.sleep(max(0.0, t0 + 32 - time.time()))
    held = lab.sbatch("--gres=gpu:1", "-t", "10", "--comment=pal:app=resnet", "--wrap", "sleep 20")
    comment = _held(lab, held)
    fields = lab.fields(held)
    submitted = lab.when(held, "SubmitTime")
    assert fields["JobState"] == "PENDING", fields
    assert lab.when(held, "EligibleTime") >= submitted + MAX_WAIT_S - 1, fields
    assert abs(float(comment["until"]) - (submitted + MAX_WAIT_S)) <= 2
    # A memory-bound job behind it is not held: the outlier is no outlier for it.
    memory = lab.sbatch(
        "--gres=gpu:1", "-t", "5", "--comment=pal:app=pagerank", "--wrap", "sleep 20"
    )
    lab.wait_state(memory, "RUNNING", timeout_s=30)
    assert lab.gpu_uuid(memory) == lab.outlier_uuid()
    # The neighbour ends; its Epilog's round routes the held job to the freed good GPU.
    lab.wait_state(held, "RUNNING", timeout_s=90)
    started = lab.when(held, "StartTime")
    assert lab.gpu_uuid(held) != lab.outlier_uuid()
    assert started <= submitted + MAX_WAIT_S  # before its bound
    assert parse_admin_comment(lab.jobs()[held].admin_comment)["action"] == "route"
    # The simulator on the same trace: the measured starts match its prediction within
    # Slurm's own latencies (1-second timestamps, the Epilog, the round, a scheduling pass).
    predicted_held, predicted_memory = _predicted_start(
        submitted - t0, lab.when(memory, "SubmitTime") - t0
    )
    measured_held = started - t0
    measured_memory = lab.when(memory, "StartTime") - t0
    print(
        f"held job: measured start {measured_held:.0f} s, simulated {predicted_held:.0f} s; "
        f"memory-bound job: {measured_memory:.0f} s vs {predicted_memory:.0f} s"
    )
    assert abs(measured_held - predicted_held) <= 6
    assert abs(measured_memory - predicted_memory) <= 3


def test_the_bound_holds_without_the_advisor_slurm_starts_the_job_by_its_begin_time(
    clean: WaitLab,
) -> None:
    """Killed right after it held a job, the advisor routes nothing; Slurm itself starts the
    job at its begin time (its next scheduling pass after it), and not before, although a
    GPU the job fits on was free all along."""
    host_release_only("a begin time is Slurm's oldest hold; the routed waits above run on each")
    lab = clean
    neighbour = _fill_and_neighbour(lab, neighbour_s=45)
    t0 = lab.when(neighbour, "StartTime")
    time.sleep(max(0.0, t0 + 32 - time.time()))
    held = lab.sbatch("--gres=gpu:1", "-t", "10", "--comment=pal:app=resnet", "--wrap", "sleep 5")
    comment = _held(lab, held)
    lab.stop_advisor(kill=True)
    until = float(comment["until"])
    deadline = until + 90  # the begin time plus Slurm's scheduling passes (bf_interval 30 s)
    while lab.fields(held)["JobState"] == "PENDING":
        assert time.time() < deadline, lab.fields(held)
        time.sleep(0.5)
    started = lab.when(held, "StartTime")
    print(f"held until {until:.0f}: Slurm started it {started - until:+.0f} s from then")
    assert started >= until - 1  # never before its bound, though a GPU was free


def _predicted_unfit(held_s: float, memory_s: float, behind_s: float) -> dict[str, float]:
    """The simulator on the trace of the test below (seconds from the neighbour's start):
    when the held 2-GPU job, the memory-bound job and the job behind them start."""
    # Packing puts the three fillers on n01's good GPU and on n02, the neighbour on n03, as
    # the testbed's were put there.
    trace = [SimJob(f"f{i}", 0.0, 1, 600.0, "A", time_limit=600.0) for i in range(3)]
    trace.append(SimJob("neighbour", 0.0, 1, 50.0, "A", time_limit=60.0))
    trace.append(SimJob("held", held_s, 2, 20.0, "A", time_limit=600.0))
    trace.append(SimJob("memory", memory_s, 1, 20.0, "D", time_limit=300.0))
    trace.append(SimJob("behind", behind_s, 1, 20.0, "D", time_limit=3600.0))
    return _simulated_starts(trace)


def test_a_held_job_that_fits_nowhere_holds_nobody_a_reservation_would_keep_back(
    clean: WaitLab,
) -> None:
    """A 2-GPU job is held for two good GPUs on n03; a memory-bound job then takes the
    outlier, so it fits nowhere even by count. A job behind it whose hour-long limit would
    delay a reservation for it (at n03's neighbour's limit) starts at once: Slurm considers no
    job before its begin time, so it reserves nothing for the held one. The simulator, which
    reserved for such a job until 2026-11-27, now predicts the same. The held job still starts
    by its bound: once the two jobs that took its GPUs end, a round routes it (on the outlier
    and n03's GPU, in the simulator at the bound itself)."""
    lab = clean
    good = lab.label("n01", slow=False)
    lab.sbatch(f"--gres=gpu:{good}:1", "-w", "n01", "-t", "10", "--wrap", "sleep 600")
    for _ in range(2):
        lab.sbatch("--gres=gpu:1", "-w", "n02", "-t", "10", "--wrap", "sleep 600")
    neighbour = lab.sbatch("--gres=gpu:1", "-w", "n03", "-t", "1", "--wrap", "sleep 50")
    lab.wait_state(neighbour, "RUNNING")
    deadline = time.monotonic() + 60
    while len([j for j in lab.jobs().values() if j.state == "RUNNING"]) < 4:
        assert time.monotonic() < deadline, lab.jobs()
        time.sleep(0.2)
    t0 = lab.when(neighbour, "StartTime")
    # 8 s in, n03's two GPUs are expected free within the 30 s bound (the neighbour at half
    # its minute), far sooner than the 6.5 minutes the outlier would cost a 10-minute job.
    time.sleep(max(0.0, t0 + 8 - time.time()))
    held = lab.sbatch("--gpus=2", "-t", "10", "--comment=pal:app=resnet", "--wrap", "sleep 20")
    _held(lab, held)
    memory = lab.sbatch(
        "--gres=gpu:1", "-t", "5", "--comment=pal:app=pagerank", "--wrap", "sleep 20"
    )
    lab.wait_state(memory, "RUNNING", timeout_s=30)
    assert lab.gpu_uuid(memory) == lab.outlier_uuid()
    behind = lab.sbatch(
        "--gres=gpu:1", "-t", "60", "--comment=pal:app=pagerank", "--wrap", "sleep 20"
    )
    lab.wait_state(behind, "RUNNING", timeout_s=30)
    assert lab.fields(held)["JobState"] == "PENDING"
    until = float(_held(lab, held)["until"])
    # Its bound holds: once the two jobs that took its GPUs end, a round routes it (the
    # outlier and n03's GPU, before n03's neighbour ends: waiting longer would pass the bound).
    lab.wait_state(held, "RUNNING", timeout_s=60)
    started = lab.when(held, "StartTime")
    # A round at the bound itself (as the simulator routes it) reaches Slurm a moment later:
    # the update, a scheduling pass, 1-second timestamps; a loaded machine measured +1 s.
    assert started <= until + SLURM_START_S, (started, until)
    measured = {
        name: lab.when(job_id, key) - t0
        for name, job_id, key in (
            ("held", held, "SubmitTime"),
            ("memory", memory, "StartTime"),
            ("behind", behind, "StartTime"),
        )
    }
    predicted = _predicted_unfit(
        measured["held"],
        lab.when(memory, "SubmitTime") - t0,
        lab.when(behind, "SubmitTime") - t0,
    )
    print(f"measured {measured}, held job started {started - t0:.0f} s; simulated {predicted}")
    assert predicted["held"] > predicted["behind"]  # held past the job behind it, as Slurm did
    assert predicted["held"] <= until - t0  # and started by its bound there too
    # Within Slurm's and the advisor's latencies; a reservation for the held job would have
    # kept the job behind back until the memory-bound one ended, 20 s later.
    assert abs(measured["memory"] - predicted["memory"]) <= 6
    assert abs(measured["behind"] - predicted["behind"]) <= 6
