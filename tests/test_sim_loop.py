"""The simulator's closed loop: GPUs degraded and repaired through the engine's hooks, the
records the hooks hear, the oracle and the detector steering placement, the fault model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slurm_pal.adapters.config import AdvisorConfig
from slurm_pal.core.cluster import Cluster
from slurm_pal.core.remeasure import RemeasureLimits
from slurm_pal.core.suspicion import SuspicionDetector
from slurm_pal.core.workload import SimJob, site_like_workload
from slurm_pal.sim import SimConfig, SimGpus, simulate, uniform_gpus
from slurm_pal.sim.engine import JobEnd
from slurm_pal.sim.faults import FaultPlan
from slurm_pal.sim.loop import Fault, FaultLoop, application_workload, fault_model

CLASSES = ("A", "B", "C", "D")


def job(number: int, submit: float, work: float, job_class: str = "A") -> SimJob:
    return SimJob(str(number), submit, 1, work, job_class, model=f"{job_class}-app")


def ends(result) -> dict[str, float | None]:
    return {j.job_id: j.end for j in result.jobs}


class Recorder:
    """Hooks that change nothing and keep what they hear."""

    def __init__(self) -> None:
        self.ended: list[JobEnd] = []
        self.times: list[float] = []

    def advance(self, now: float, truth: dict[str, list[float]]) -> None:
        self.times.append(now)

    def job_ended(self, job: JobEnd) -> None:
        self.ended.append(job)

    def scores(self) -> None:
        return None


def test_the_hooks_hear_every_ended_job_with_its_gpus_and_times() -> None:
    gpus = uniform_gpus(CLASSES, 2, 2)
    trace = [job(0, 0, 100), SimJob("1", 5, 4, 50, "B", model="B-app")]
    recorder = Recorder()
    result = simulate(
        trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"), hooks=recorder
    )
    plain = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"))
    assert ends(result) == ends(plain)  # hooks that change nothing change nothing
    by_id = {e.job_id: e for e in recorder.ended}
    assert by_id["0"] == JobEnd("0", "A-app", "A", ("sim-gpu-00000",), 0.0, 100.0, 1.0, "A")
    assert len(by_id["1"].gpus) == 4 and by_id["1"].penalty > 1.0  # across the two nodes
    assert recorder.times == sorted(recorder.times)


def test_hooks_need_the_slurm_mode() -> None:
    with pytest.raises(ValueError, match="Slurm mode"):
        simulate([job(0, 0, 10)], uniform_gpus(CLASSES, 1, 2), SimConfig(), hooks=Recorder())


def test_a_fault_slows_jobs_started_after_it_until_the_repair() -> None:
    gpus = uniform_gpus(CLASSES, 1, 1)
    fault = Fault(gpu=0, at_s=50.0, factor=2.0, repair_s=1000.0)
    trace = [job(0, 0, 100), job(1, 200, 100), job(2, 300, 100, "D"), job(3, 1100, 100)]
    loop = FaultLoop(gpus, [fault], mode="none")
    result = simulate(trace, gpus, SimConfig(placement="packed-sticky", mode="slurm"), hooks=loop)
    # Job 0 started before the fault (keeps its pace); job 1 runs 2x; class D does not feel
    # it (sensitivity 0); job 3 starts after the repair.
    assert ends(result) == {"0": 100.0, "1": 400.0, "2": 500.0, "3": 1200.0}
    assert loop.outcomes[0].jobs == 2 and loop.outcomes[0].sensitive_jobs == 1


def test_the_oracle_keeps_the_class_a_fault_hurts_off_the_gpu_and_others_on_it() -> None:
    gpus = uniform_gpus(CLASSES, 1, 2)
    faults = [Fault(gpu=0, at_s=0.0, factor=2.0)]
    trace = [job(0, 10, 100), job(1, 20, 100, "D"), job(2, 500, 100)]
    config = SimConfig(placement="advisor", mode="slurm", advisor_settings=(("avoid_above", 1.5),))
    blind = simulate(trace, gpus, config, hooks=FaultLoop(gpus, faults, mode="none"))
    oracle = simulate(trace, gpus, config, hooks=FaultLoop(gpus, faults, mode="oracle"))
    assert ends(blind)["0"] == 210.0  # packing's first GPU, now 2x for class A
    assert ends(oracle)["0"] == 110.0  # kept off it
    assert ends(oracle)["1"] == 120.0  # class D takes the faulty GPU, at full speed
    assert ends(oracle)["2"] == 600.0


def test_rescored_keeps_the_free_state_and_expected_ends() -> None:
    cluster = Cluster.from_gpus(uniform_gpus(CLASSES, 2, 2).specs())
    cluster.allocate([1, 2])
    cluster.expect_free_at([1, 2], 500.0)
    cluster.clock = 42.0
    other = cluster.rescored({"A": [3.0, 1.0, 1.0, 1.0]})
    assert other.free.tolist() == cluster.free.tolist()
    assert other.busy_until.tolist() == cluster.busy_until.tolist() and other.clock == 42.0
    assert other.classes["A"].scores.tolist() == [3.0, 1.0, 1.0, 1.0]
    assert other.classes["B"].scores.tolist() == [1.0] * 4
    other.release([1])  # its own state
    assert not cluster.free[1]
    with pytest.raises(ValueError, match="class"):
        cluster.rescored({"Z": [1.0] * 4})


def _site(n_gpus: int, n_jobs: int, seed: int) -> tuple[list[SimJob], SimGpus]:
    jobs = site_like_workload(n_gpus, n_jobs=n_jobs, seed=seed)
    return application_workload(jobs, cv=0.07, seed=seed), uniform_gpus(CLASSES, n_gpus // 4, 4)


def test_the_loop_finds_a_slow_gpu_from_ordinary_jobs_and_suspects_no_healthy_one() -> None:
    jobs, gpus = _site(16, 2500, seed=1)
    # After the first weeks: the detector needs a few runs per application as a baseline (a
    # site's store has them from before).
    faults = [Fault(gpu=5, at_s=86400.0 * 40, factor=2.0)]
    detector = SuspicionDetector(signal_classes=("A", "B"))
    loop = FaultLoop(gpus, faults, mode="detector", detector=detector)
    config = SimConfig(placement="advisor", mode="slurm", default_class="A")
    simulate(jobs, gpus, config, hooks=loop)
    outcome = loop.outcomes[0]
    assert outcome.suspected_s is not None and outcome.sensitive_jobs <= 4
    assert loop.false_suspicions == [] and loop.records == len(jobs)
    assert ("sim-gpu-00005", "A", True) in {
        (c.gpu, c.job_class, c.suspect) for c in detector.changes_
    }


def test_a_visible_fault_is_suspected_at_its_first_job() -> None:
    jobs, gpus = _site(16, 800, seed=2)
    faults = [Fault(gpu=3, at_s=86400.0, factor=1.5, visible=True)]
    loop = FaultLoop(
        gpus, faults, mode="detector", detector=SuspicionDetector(signal_classes=("A",))
    )
    simulate(jobs, gpus, SimConfig(placement="advisor", mode="slurm"), hooks=loop)
    assert loop.outcomes[0].jobs == 1 and loop.outcomes[0].suspected_s is not None


def test_the_fault_model_follows_its_rate_and_seed() -> None:
    faults = fault_model(1000, 30.0, per_1000_gpu_days=2.0, repair_days=math.inf, seed=3)
    assert 40 <= len(faults) <= 85  # Poisson(60)
    assert faults == fault_model(1000, 30.0, per_1000_gpu_days=2.0, repair_days=math.inf, seed=3)
    assert len({f.gpu for f in faults}) == len(faults)
    assert {f.factor for f in faults} == {1.5, 2.0}
    assert all(0 <= f.at_s <= 30 * 86400 and f.repair_s == math.inf for f in faults)
    assert fault_model(100, 30.0, per_1000_gpu_days=0.0) == []


def test_applications_repeat_with_the_noise_asked_for() -> None:
    jobs = site_like_workload(64, n_jobs=2000, seed=0)
    apps = application_workload(jobs, runs_per_app=20, cv=0.1, seed=0)
    assert [(j.job_id, j.gpus, j.job_class, j.submit_time) for j in apps] == [
        (j.job_id, j.gpus, j.job_class, j.submit_time) for j in jobs
    ]
    by_app: dict[str, list[float]] = {}
    for j in apps:
        assert j.model.startswith(j.job_class)
        by_app.setdefault(j.model, []).append(math.log(j.work))
    spreads = [np.std(v) for v in by_app.values() if len(v) >= 10]
    assert 0.07 < float(np.median(spreads)) < 0.13


class Prober(Recorder):
    """Hooks that hold GPU 0 for 50 s once, at the first round that leaves it idle."""

    def __init__(self) -> None:
        super().__init__()
        self.started = False
        self.done: list[tuple[int, float, float]] = []

    def probes(self, now: float, free) -> list[tuple[int, float]]:
        if self.started or not free[0]:
            return []
        self.started = True
        return [(0, 50.0)]

    def probe_ended(self, gpu: int, start: float, end: float) -> None:
        self.done.append((gpu, start, end))


@pytest.mark.parametrize(
    ("second_submit", "expected_ends", "probe"),
    [
        # Job 1 arrives while the probe holds the GPU: it waits for the probe's end.
        (120.0, {"0": 100.0, "1": 250.0}, (0, 100.0, 150.0)),
        # Job 1 is pending when job 0 ends: the round gives it the GPU (the probe is low
        # priority) and the probe runs after it.
        (50.0, {"0": 100.0, "1": 200.0}, (0, 200.0, 250.0)),
    ],
)
def test_a_probe_takes_an_idle_gpu_after_the_round(
    second_submit: float, expected_ends: dict[str, float], probe: tuple[int, float, float]
) -> None:
    gpus = uniform_gpus(CLASSES, 1, 1)
    trace = [job(0, 0, 100), job(1, second_submit, 100)]
    prober = Prober()
    config = SimConfig(placement="packed-sticky", mode="slurm")
    result = simulate(trace, gpus, config, hooks=prober)
    assert ends(result) == expected_ends
    assert prober.done == [probe]


def test_remeasures_confirm_a_slow_gpu_and_its_score_becomes_the_measured_time() -> None:
    jobs, gpus = _site(16, 2500, seed=1)
    faults = [Fault(gpu=5, at_s=86400.0 * 40, factor=2.0)]
    detector = SuspicionDetector(signal_classes=("A", "B"))
    loop = FaultLoop(gpus, faults, mode="detector", detector=detector, remeasure=RemeasureLimits())
    config = SimConfig(placement="advisor", mode="slurm", default_class="A")
    simulate(jobs, gpus, config, hooks=loop)
    outcome = loop.outcomes[0]
    # How soon it is suspected is the test above's; here what the re-measure does with it.
    assert outcome.suspected_s is not None
    # The suspect's class-A benchmark ran on its idle node and confirmed the fault: the
    # measured time is its class-A score from then on (the service's increment).
    # Before the fault, routine measurements found it as the campaign says.
    mine = [
        (at, v, again) for g, c, at, again, v in loop.verdicts if (g, c) == ("sim-gpu-00005", "A")
    ]
    before = [v for at, v, _ in mine if at < faults[0].at_s]
    assert before
    assert all(not v.confirmed and v.ratio == pytest.approx(1.0) for v in before)
    (first, *_) = [(v, again) for at, v, again in mine if at >= faults[0].at_s]
    assert first[0].confirmed and not first[1]
    assert first[0].ratio == pytest.approx(2.0)
    assert loop.base_scores["sim-gpu-00005"]["A"] == pytest.approx(2.0)
    # Each re-measure held the GPU's label-mates on its node (the GPUs of its PM signature
    # there, as the site's labels are) for the benchmark's length: here all alike, the node.
    site = {gpu: (node, label) for gpu, node, label in loop._site}
    mates = [g for g, where in site.items() if where == site["sim-gpu-00005"]]
    assert len(mates) == 4
    assert loop.probe_s_spent >= loop.probes_run * len(mates) * loop.probe_s
    assert loop.false_suspicions == []


def test_a_fault_slows_the_class_it_hits_most_and_its_neighbours_less() -> None:
    default = Fault(gpu=0, at_s=0.0, factor=2.0)
    assert default.factors(CLASSES, (1.0, 0.5, 0.1, 0.0)) == {
        "A": 2.0, "B": 1.5, "C": 1.1, "D": 1.0
    }  # fmt: skip
    memory = Fault(gpu=0, at_s=0.0, factor=2.0, job_class="D")
    assert memory.factors(CLASSES, (1.0, 0.5, 0.1, 0.0)) == {
        "A": 1.0, "B": 1.1, "C": 1.5, "D": 2.0
    }  # fmt: skip
    with pytest.raises(ValueError, match="class 'Z'"):
        Fault(gpu=0, at_s=0.0, factor=2.0, job_class="Z").factors(CLASSES, (1.0,))
    drawn = fault_model(1000, 30.0, per_1000_gpu_days=2.0, seed=3, classes=("A", "D"))
    plain = fault_model(1000, 30.0, per_1000_gpu_days=2.0, seed=3)
    assert [f.gpu for f in drawn] == [f.gpu for f in plain]  # the same faults, now classed
    assert {f.job_class for f in drawn} == {"A", "D"} and {f.job_class for f in plain} == {None}
    with pytest.raises(ValueError, match="factors must be > 1"):
        fault_model(10, 1.0, factors=(0.5,))


class Heard(SuspicionDetector):
    """A detector that keeps the records it was given."""

    def update(self, record):  # type: ignore[no-untyped-def]
        self.heard = [*getattr(self, "heard", []), record]
        return super().update(record)


def test_the_detector_hears_the_class_the_advisor_placed_the_job_as() -> None:
    # A class-D job the advisor could not identify runs as its default class A: the
    # service's records say A, so the simulated detector must hear A too.
    gpus = uniform_gpus(CLASSES, 1, 1)
    trace = [SimJob("0", 0, 1, 100, "D", model="D-app", known=False)]
    detector = Heard()
    loop = FaultLoop(gpus, [], mode="detector", detector=detector)
    config = SimConfig(placement="advisor", mode="slurm", default_class="A")
    simulate(trace, gpus, config, hooks=loop)
    assert [(r.run.job_id, r.run.app, r.run.job_class) for r in detector.heard] == [
        ("0", "D-app", "A")
    ]


def test_a_fault_plan_parses_and_builds_the_served_loop() -> None:
    plan = FaultPlan.parse("rate=3, factors=1.5/2, visible=0, classes=A/D, repair-days=inf")
    assert plan == FaultPlan(3.0, (1.5, 2.0), 0.0, ("A", "D"), math.inf, 0.0, "remeasure")
    for bad, why in (
        ("factors=2", "needs rate="),
        ("rate=3,speed=2", "not one of"),
        ("rate=x", "rate"),
        ("rate=3,factors=0.9", "factors must be > 1"),
        ("rate=3,loop=magic", "unknown loop"),
        ("rate=3,visible=2", "visible"),
    ):
        with pytest.raises(ValueError, match=why):
            FaultPlan.parse(bad)
    gpus = uniform_gpus(CLASSES, 4, 4)
    jobs = [job(n, 3600.0 * n, 100) for n in range(24 * 20)]
    faults = plan.draw(gpus, jobs, seed=1)
    assert faults == plan.draw(gpus, jobs, seed=1)
    assert all(f.job_class in ("A", "D") and 0 <= f.at_s <= jobs[-1].submit_time for f in faults)
    loop = plan.hooks(gpus, faults, AdvisorConfig(), seed=1)
    assert loop.mode == "detector" and loop.remeasure is not None
    assert loop.detector is not None and loop.detector.signal_classes is None  # every class
    assert plan.hooks(gpus, faults, AdvisorConfig(), seed=1, loop="oracle").mode == "oracle"
    with pytest.raises(ValueError, match="fault classes"):
        FaultPlan(3.0, classes=("Z",)).draw(gpus, jobs, seed=1)
