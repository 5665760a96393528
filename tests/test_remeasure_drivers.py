"""The service's re-measurements (advisor/remeasure.py) and the simulator's (sim/loop.py) are
one decision (core/remeasure.py): for the same suspects, free GPUs, labels, attempts and scores
both pick the same (GPU, class), each from its own view of the GPUs (the service from Slurm's
busy GPUs and labels.json, the simulator from its free mask and its labels), and for the same
times both give the same verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from slurm_pal.advisor.remeasure import idle_gpus
from slurm_pal.core.labels import LabelEntry, LabelTable
from slurm_pal.core.remeasure import (
    RemeasureLimits,
    Verdict,
    to_remeasure,
    unsettled,
    verdict,
    wanted,
)
from slurm_pal.core.suspicion import Suspicion, SuspicionDetector
from slurm_pal.sim import SimGpus, uniform_gpus
from slurm_pal.sim.loop import FaultLoop
from tests.helpers.advisor import Env
from tests.test_advisor_remeasure import FakeSlurm, env, remeasurer, suspect  # noqa: F401

CLASSES = ("A", "B", "C", "D")
LIMITS = RemeasureLimits(routine_s=0.0)  # the suspects alone; routine ones: their own test


def _suspicion(gpu: str, job_class: str, since_s: float) -> Suspicion:
    return Suspicion(gpu, job_class, since_s, since_s, "runtime", math.nan, 2)


def _sim(
    suspects: Sequence[Suspicion],
    slow: dict[tuple[int, str], float],
    gpus: SimGpus | None = None,
) -> FaultLoop:
    """A simulated site (default 3 nodes x 2 GPUs, all alike) whose detector suspects
    ``suspects``; ``slow``: (GPU, class) -> its true slowdown now."""
    gpus = gpus or uniform_gpus(CLASSES, 3, 2)
    detector = SuspicionDetector()
    loop = FaultLoop(gpus, [], mode="detector", detector=detector, remeasure=LIMITS)
    detector.suspects = lambda: list(suspects)  # type: ignore[method-assign]
    truth = {c: [1.0] * gpus.n_gpus for c in CLASSES}
    for (gpu, job_class), factor in slow.items():
        truth[job_class][gpu] = factor
    loop.advance(0.0, truth)
    return loop


def _service_view(loop: FaultLoop, labels: Sequence[str], free: Sequence[bool]) -> Any:
    """What the service's ``idle_gpus`` reads of a refresh, for the simulated site: Slurm's
    free GPUs and labels.json (``labels``: each GPU's, as ``site render`` names them)."""
    specs = loop.gpus.specs()
    entries = tuple(
        LabelEntry(g.node, g.index, g.index, label, g.uuid)
        for g, label in zip(specs, labels, strict=True)
    )
    base = SimpleNamespace(uuid_index={g.uuid: i for i, g in enumerate(specs)}, free=free)
    return SimpleNamespace(
        base=base, static=SimpleNamespace(labels=LabelTable("c", entries)), excluded={}
    )


def _service_picks(
    loop: FaultLoop, labels: Sequence[str], free: Sequence[bool], now: float
) -> list[tuple[str, str]]:
    idle = {g: pin for g, (pin, _) in idle_gpus(_service_view(loop, labels, free)).items()}
    found = wanted(loop._suspects(), {}, loop.base_scores, now, LIMITS)
    return [(w.gpu, w.job_class) for w in to_remeasure(found, idle, [], now, LIMITS)]


def test_the_simulator_picks_and_judges_with_the_services_rule() -> None:
    suspects = [
        _suspicion("sim-gpu-00004", "A", 5.0),  # oldest, but its node is busy
        _suspicion("sim-gpu-00002", "A", 10.0),
        _suspicion("sim-gpu-00003", "B", 15.0),  # same node as the pick before: waits
        _suspicion("sim-gpu-00000", "B", 20.0),
    ]
    loop = _sim(suspects, {(2, "A"): 2.0})
    now = 1000.0
    free = [True, True, True, True, True, False]
    alike = ["v100-a0b0c0d0"] * 6  # all alike: one label, every node's GPUs are label-mates
    service = _service_picks(loop, alike, free, now)
    assert service == [("sim-gpu-00002", "A"), ("sim-gpu-00000", "B")]
    held = loop.probes(now, free)
    assert sorted(g for g, _ in held) == [0, 1, 2, 3]  # both nodes, whole: one label each
    for gpu, seconds in held:
        loop.probe_ended(gpu, now, now + seconds)
    judged = {(g, c): v for g, c, _, _, v in loop.verdicts}
    assert sorted(judged) == [("sim-gpu-00000", "B"), ("sim-gpu-00002", "A")]
    probe = loop.probe_s
    assert judged[("sim-gpu-00002", "A")] == verdict(2.0 * probe, probe, LIMITS.slower)
    assert judged[("sim-gpu-00000", "B")] == verdict(probe, probe, LIMITS.slower)
    # Confirmed: the measured time is the GPU's score (the increment); cleared: the
    # suspicion is no longer one, as the service's settlement hides it.
    assert loop.base_scores["sim-gpu-00002"]["A"] == pytest.approx(2.0)
    assert ("sim-gpu-00000", "B") not in {(s.gpu, s.job_class) for s in loop._suspects()}
    # The budget (2 an hour) is spent: nothing more this hour, as the service would say.
    assert loop.probes(now + 60.0, [True] * 6) == []


def test_a_gpu_found_slow_is_measured_again_and_recovers_as_in_the_service() -> None:
    loop = _sim([_suspicion("sim-gpu-00002", "A", 10.0)], {(2, "A"): 2.0})
    ((gpu, seconds),) = [(g, s) for g, s in loop.probes(0.0, [True] * 6) if g == 2]
    loop.probe_ended(gpu, 0.0, seconds)
    loop.detector.suspects = lambda: []  # type: ignore[method-assign, union-attr]
    # Its other classes next, one an hour here (one pin): each as its campaign says, cleared.
    for hour, job_class in enumerate("BCD", start=1):
        held = loop.probes(3600.0 * hour, [True] * 6)
        assert [g for g, _ in held] == [2, 3]
        for g, s in held:
            loop.probe_ended(g, 3600.0 * hour, 3600.0 * hour + s)
        *_, (measured, measured_class, _, again, result) = loop.verdicts
        assert (measured, measured_class, again, result.confirmed) == (
            "sim-gpu-00002", job_class, False, False,
        )  # fmt: skip
    assert loop.probes(4 * 3600.0, [True] * 6) == []  # found slow, not yet retry_s ago
    loop._truth["A"][2] = 1.0  # type: ignore[index]  # repaired
    later = seconds + LIMITS.retry_s
    expect = wanted(
        [], {("sim-gpu-00002", "A"): seconds}, loop.base_scores, later, LIMITS, loop._settled
    )
    assert [(w.gpu, w.job_class, w.recheck) for w in expect] == [("sim-gpu-00002", "A", True)]
    held = loop.probes(later, [True] * 6)
    assert [g for g, _ in held] == [2, 3]
    for g, s in held:
        loop.probe_ended(g, later, later + s)
    *_, (_, _, _, again, result) = loop.verdicts
    assert again and result.confirmed and result.ratio == pytest.approx(0.5)
    assert loop.base_scores["sim-gpu-00002"]["A"] == pytest.approx(1.0)


def test_a_fault_found_for_one_class_is_measured_for_the_next_and_steers_it() -> None:
    """A fault that slows class A 2x slows class B 1.5x: once A is confirmed, B's benchmark
    runs too and its measured time becomes B's score, with no runtime evidence for B."""
    loop = _sim([_suspicion("sim-gpu-00002", "A", 10.0)], {(2, "A"): 2.0, (2, "B"): 1.5})
    ((gpu, seconds),) = [(g, s) for g, s in loop.probes(0.0, [True] * 6) if g == 2]
    loop.probe_ended(gpu, 0.0, seconds)
    loop.detector.suspects = lambda: []  # type: ignore[method-assign, union-attr]
    held = loop.probes(3600.0, [True] * 6)
    for g, s in held:
        loop.probe_ended(g, 3600.0, 3600.0 + s)
    *_, (measured, job_class, _, again, result) = loop.verdicts
    assert (measured, job_class, again) == ("sim-gpu-00002", "B", False)
    assert result.confirmed and result.ratio == pytest.approx(1.5)
    assert loop.base_scores["sim-gpu-00002"]["B"] == pytest.approx(1.5)
    # 1.5 is no outlier by the policy's `avoid_above` alone; a fault, it is steered as one.
    scores = loop.scores()
    assert scores is not None and scores["B"][2] >= loop.floor
    assert scores["B"][:2] == [1.0, 1.0] and scores["C"][2] == 1.0
    # Confirmed for B too: not measured for B again as another class, only rechecked later.
    found = wanted([], loop._confirmed, loop.base_scores, 7200.0, LIMITS, loop._settled)
    assert [(w.job_class, w.other_class) for w in found] == [("C", True), ("D", True)]


def test_the_service_and_the_simulator_agree_on_one_suspect(env: Env) -> None:  # noqa: F811
    st, target, seconds, bench = suspect(env)
    (found,) = st.suspects.suspects()
    rm = remeasurer(env, st, FakeSlurm(seconds, bench, factor=2.0))
    (flight,) = rm.submit_due()
    ((_, service),) = rm.settle()
    assert (flight.attempt.gpu, flight.attempt.job_class) == (target, "A")
    # The same suspicion, in the simulator, of a GPU now 2x slower for the class.
    loop = _sim([_suspicion("sim-gpu-00002", found.job_class, found.since_s)], {(2, "A"): 2.0})
    held = loop.probes(found.since_s + 60.0, [True] * 6)
    for gpu, s in held:
        loop.probe_ended(gpu, found.since_s + 60.0, found.since_s + 60.0 + s)
    ((gpu, job_class, _, again, sim),) = loop.verdicts
    assert (gpu, job_class, again) == ("sim-gpu-00002", "A", False)
    assert isinstance(service, Verdict)
    assert (sim.confirmed, sim.ratio) == (service.confirmed, pytest.approx(service.ratio))
    assert sim.confirmed and sim.ratio == pytest.approx(2.0)


def test_unsettled_hides_only_suspicions_raised_before_the_clearing() -> None:
    found = [_suspicion("g0", "A", 10.0), _suspicion("g0", "B", 10.0), _suspicion("g1", "A", 30.0)]
    kept = unsettled(found, {("g0", "A"): 20.0, ("g1", "A"): 20.0})
    assert [(s.gpu, s.job_class) for s in kept] == [("g0", "B"), ("g1", "A")]


def test_both_drivers_measure_a_gpu_whose_node_mate_of_another_label_is_busy() -> None:
    """GPU 3 is slower for class D than its node-mate GPU 2 (its own PM signature, so its own
    gres label); GPU 4 and 5 share one. A job on GPU 3 leaves GPU 2 measurable, one on GPU 5
    does not leave GPU 4: the same in both drivers, each labelling by the site's rule."""
    scores = {c: np.ones(6) for c in CLASSES}
    scores["D"][3] = 1.3
    gpus = SimGpus(3, 2, scores, {c: v.copy() for c, v in scores.items()})
    suspects = [_suspicion("sim-gpu-00004", "A", 5.0), _suspicion("sim-gpu-00002", "A", 10.0)]
    loop = _sim(suspects, {(2, "A"): 2.0}, gpus)
    labels = ["v100-a0b0c0d0"] * 6
    labels[3] = "v100-a0b0c0d1"
    free = [True, True, True, False, True, False]
    assert _service_picks(loop, labels, free, 1000.0) == [("sim-gpu-00002", "A")]
    held = loop.probes(1000.0, free)
    assert [g for g, _ in held] == [2]  # GPU 2 alone: GPU 3 keeps its job
    ((_, seconds),) = held
    loop.probe_ended(2, 1000.0, 1000.0 + seconds)
    ((gpu, job_class, _, _, result),) = loop.verdicts
    assert (gpu, job_class, result.confirmed) == ("sim-gpu-00002", "A", True)


def test_the_simulator_measures_idle_gpus_routinely_and_finds_an_unsuspected_fault() -> None:
    """No suspect: every idle GPU is measured for the first class once ``routine_s`` has
    passed since the campaign (time 0), not again before it passes once more; GPU 2, 2x
    slow for A with no job evidence, is found and kept off for A. (Each node's two GPUs
    share one label: a measurement holds both.)"""
    loop = _sim([], {(2, "A"): 2.0})
    loop.remeasure = RemeasureLimits(per_hour=6, routine_s=7 * 86400.0)

    def measure(now: float) -> list[tuple[str, str]]:
        for gpu, seconds in loop.probes(now, [True] * 6):
            loop.probe_ended(gpu, now, now + seconds)
        return [(a.gpu[-1], a.job_class) for a in loop._attempts if a.submitted_s == now]

    week, hour = 7 * 86400.0, 3600.0
    assert measure(week - 60.0) == []
    assert measure(week) == [("0", "A"), ("2", "A"), ("4", "A")]  # one per node at once
    assert [(v[0], v[1]) for v in loop.verdicts if v[4].confirmed] == [("sim-gpu-00002", "A")]
    scores = loop.scores()
    assert scores is not None and scores["A"][2] >= loop.floor and scores["A"][0] == 1.0
    # GPU 2's other classes first (found slow for A), routine ones with the budget left
    assert measure(week + hour) == [("2", "B"), ("1", "A"), ("5", "A")]
    assert measure(week + 2 * hour) == [("2", "C")]
    assert measure(week + 3 * hour) == [("2", "D")]
    assert measure(week + 4 * hour) == [("3", "A")]
    assert measure(week + 5 * hour) == []  # every GPU measured this week
    assert measure(week + 2 * 86400.0) == [("2", "A")]  # a day on: rechecked, still slow
    assert measure(2 * week) == [("2", "A"), ("0", "A"), ("4", "A")]
