"""The suspicion rule on synthetic job records: detection, no false alarm, clearing, signals."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from slurm_pal.core.drift import JobRun
from slurm_pal.core.suspicion import (
    GpuSignals,
    JobRecord,
    SuspicionDetector,
    measured_faults,
    outlier_scores,
    replay,
)

CLASSES = "ABCD"


def _scores(n_gpus: int) -> dict[str, dict[str, float]]:
    return {f"g{i}": dict.fromkeys(CLASSES, 1.0) for i in range(n_gpus)}


def _stream(
    n_jobs: int,
    *,
    n_gpus: int = 64,
    cv: float = 0.1,
    seed: int = 0,
    slow: dict[int, float] | None = None,
    slow_from: int = 0,
    slow_until: int = 1 << 30,
    multi: float = 0.15,
    n_apps: int = 30,
) -> Iterator[tuple[JobRecord, bool]]:
    """Records of a noisy site: per class ``n_apps`` applications, log-normal noise of ``cv``,
    ``multi`` of the jobs on 2-8 GPUs. ``slow`` GPUs run class A ``factor`` x slower between
    jobs ``slow_from`` and ``slow_until``. Yields (record, it ran class A on g0 while slow)."""
    rng = np.random.default_rng(seed)
    base = {
        f"{c}{a}": float(rng.lognormal(math.log(3600), 1.0)) for c in CLASSES for a in range(n_apps)
    }
    sigma = math.sqrt(math.log(1 + cv * cv))
    slow = slow or {}
    for j in range(n_jobs):
        job_class = CLASSES[int(rng.integers(4))]
        app = f"{job_class}{int(rng.integers(n_apps))}"
        size = 1 if rng.random() > multi else int(rng.choice([2, 4, 8]))
        gpus = [int(g) for g in rng.choice(n_gpus, size, replace=False)]
        faulty = slow_from <= j < slow_until and job_class == "A"
        factor = max((slow.get(g, 1.0) if faulty else 1.0) for g in gpus)
        runtime = base[app] * float(rng.lognormal(0.0, sigma)) * factor
        run = JobRun(str(j), app, job_class, tuple(f"g{g}" for g in gpus), runtime)
        yield JobRecord(run, 300.0 * (j + 1)), faulty and 0 in gpus


def _runs_to_suspect(factor: float, seed: int, cv: float = 0.1) -> int | None:
    detector = SuspicionDetector().fit(_scores(64))
    count = 0
    for record, on_faulty in _stream(6000, seed=seed, cv=cv, slow={0: factor}, slow_from=2000):
        changes = detector.update(record)
        count += on_faulty
        if any(c.gpu == "g0" and c.job_class == "A" and c.suspect for c in changes):
            return count
    return None


@pytest.mark.parametrize(("factor", "target"), [(1.5, 5), (2.0, 3)])
def test_a_slow_gpu_is_suspected_within_a_few_of_its_runs(factor: float, target: int) -> None:
    counts = [_runs_to_suspect(factor, seed) for seed in range(7)]
    assert None not in counts
    assert float(np.median(counts)) <= target


def test_no_healthy_gpu_is_suspected_over_10000_noisy_jobs() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(10_000, seed=3, cv=0.1):
        detector.update(record)
    assert detector.suspects() == []
    assert not [c for c in detector.changes_ if c.suspect]


def test_one_very_slow_job_is_not_enough() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(3000, seed=4, cv=0.05, multi=0.0):
        detector.update(record)
    run = JobRun("slow", "A0", "A", ("g5",), 1e9)  # a run 10^5 x its application's
    assert detector.update(JobRecord(run, 1e7)) == []
    assert detector.suspects() == []


def test_the_suspicion_names_class_time_and_evidence() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000):
        detector.update(record)
    found = {(s.gpu, s.job_class): s for s in detector.suspects()}
    assert set(found) == {("g0", "A")}  # the other classes do not feel it
    suspicion = found[("g0", "A")]
    assert suspicion.cause == "runtime"
    assert 300.0 * 2000 <= suspicion.onset_s <= suspicion.since_s
    assert 1.6 < suspicion.slowdown < 2.5
    assert suspicion.evidence and all(e.residual > 0.3 for e in suspicion.evidence)
    assert suspicion.to_dict()["job_class"] == "A"


def test_a_repaired_gpu_is_cleared_by_its_normal_runs() -> None:
    detector = SuspicionDetector().fit(_scores(16))
    repaired_at = None
    for record, _ in _stream(
        8000, n_gpus=16, seed=2, slow={0: 2.0}, slow_from=1000, slow_until=3000
    ):
        detector.update(record)
        if int(record.run.job_id) == 2999:
            assert [(s.gpu, s.job_class) for s in detector.suspects()] == [("g0", "A")]
            repaired_at = record.end_s
    assert repaired_at is not None
    assert detector.suspects() == []
    cleared = [c for c in detector.changes_ if not c.suspect]
    assert [(c.gpu, c.job_class) for c in cleared] == [("g0", "A")]
    assert cleared[0].at_s > repaired_at and cleared[0].why == "later runs normal"


def test_a_partner_in_shared_runs_is_not_blamed() -> None:
    # g1 only ever runs alongside the slow g0 (2-GPU jobs) and alone at normal speed.
    detector = SuspicionDetector().fit(_scores(8))
    rng = np.random.default_rng(0)
    t = 0.0
    for j in range(400):
        t += 300
        app = f"A{j % 5}"
        if j % 3 == 0:
            gpus, slow = ("g0", "g1"), 2.0
        elif j % 3 == 1:
            gpus, slow = (f"g{2 + j % 6}",), 1.0
        else:
            gpus, slow = ("g1",), 1.0
        runtime = 1000.0 * (1 + j % 5) * slow * float(rng.lognormal(0, 0.07))
        detector.update(JobRecord(JobRun(str(j), app, "A", gpus, runtime), t))
    assert [s.gpu for s in detector.suspects()] == ["g0"]


def test_a_hardware_slowdown_signal_makes_a_suspect_at_once_and_clean_ones_clear_it() -> None:
    detector = SuspicionDetector(signal_classes=("A", "B")).fit(_scores(4))
    bad = GpuSignals(clock_events={"hw_slowdown": 0.5, "sw_power_cap": 0.4})
    clean = GpuSignals(clock_events={"sw_power_cap": 0.9})
    run = JobRun("1", "D0", "D", ("g2",), 100.0)
    changes = detector.update(JobRecord(run, 1000.0, {"g2": bad}))
    assert {(c.gpu, c.job_class, c.suspect) for c in changes} == {
        ("g2", "A", True),
        ("g2", "B", True),
    }
    assert "hw_slowdown" in detector.suspects()[0].cause
    assert math.isnan(detector.suspects()[0].slowdown)
    for n in range(2):
        detector.update(
            JobRecord(JobRun(f"c{n}", "D0", "D", ("g2",), 100.0), 2000.0 + n, {"g2": clean})
        )
    assert detector.suspects() == []


@pytest.mark.parametrize(
    ("signals", "fault"),
    [
        (GpuSignals(clock_events={"sw_power_cap": 1.0}), False),  # a busy GPU at its limit
        (GpuSignals(clock_events={"sw_power_cap": 0.9}, sm_clock_ratio=0.7), False),
        (GpuSignals(clock_events={"sw_power_cap": 0.1}, sm_clock_ratio=0.7), True),
        (GpuSignals(clock_events={"sw_thermal": 0.05}), False),  # a brief excursion
        (GpuSignals(clock_events={"hw_thermal": 0.3}), True),
        (GpuSignals(), False),
    ],
)
def test_power_capping_is_no_fault(signals: GpuSignals, fault: bool) -> None:
    assert bool(signals.fault(0.2, 0.85)) is fault


def test_records_it_cannot_judge_are_skipped() -> None:
    detector = SuspicionDetector().fit(_scores(2))
    assert detector.update(JobRecord(JobRun("x", "A0", "A", ("nope",), 10.0), 1.0)) == []
    assert "not in the campaign" in detector.skipped_["x"]


def test_outlier_scores_keep_the_gpu_for_other_classes() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000):
        detector.update(record)
    table = outlier_scores(_scores(64), detector.suspects(), floor=1.51)
    assert table["g0"]["A"] >= 1.6  # the slowdown seen, above the floor here
    assert table["g0"]["D"] == 1.0 and table["g1"]["A"] == 1.0
    assert outlier_scores(_scores(2), [], 1.51) == _scores(2)


def test_measured_faults_are_slowdowns_against_the_campaign_and_kept_off() -> None:
    campaign = {"g0": {"A": 1.0, "B": 0.8}, "g1": {"A": 1.0, "B": 1.0}, "g2": {"A": 2.0}}
    now = {
        "g0": {"A": 2.0, "B": 1.04},  # A 2x, B 1.3x of a fast GPU's score
        "g1": {"A": 1.2, "B": 1.0},  # 1.2x: the campaign's business, no fault
        "g2": {"A": 2.0},  # slow in the campaign already: an outlier by its score
        "g3": {"A": 3.0},  # not in the campaign: nothing to judge it by
    }
    faults = measured_faults(now, campaign, 1.3)
    assert faults == [("g0", "A"), ("g0", "B")]
    table = outlier_scores(now, [], 1.51, faults)
    assert table["g0"] == {"A": 2.0, "B": 1.51}
    assert table["g1"] == now["g1"] and table["g2"] == now["g2"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_slowdown"):
        SuspicionDetector(min_slowdown=1.0)
    with pytest.raises(ValueError, match="window"):
        SuspicionDetector(window=2, min_baseline=3)


def test_a_slow_gpu_in_a_better_bin_does_not_pass_its_slowdown_to_a_partner() -> None:
    # g0 (campaign 1.00) turns 2x slow; g1 (campaign 1.05, the run's worst score) is healthy.
    scores = _scores(8)
    scores["g1"] = dict.fromkeys(CLASSES, 1.05)
    detector = SuspicionDetector().fit(scores)
    rng = np.random.default_rng(1)
    for j in range(300):
        number = (j // 4) % 3  # every application runs on every kind of placement
        app = f"A{number}"
        slow = j >= 100
        if j % 4 == 0:
            gpus, factor = ("g0", "g1"), (2.0 if slow else 1.05)
        elif j % 4 == 1:
            gpus, factor = ("g0",), (2.0 if slow else 1.0)
        else:
            gpus, factor = (f"g{2 + j % 6}",), 1.0
        runtime = 1000.0 * (1 + number) * factor * float(rng.lognormal(0, 0.07))
        detector.update(JobRecord(JobRun(str(j), app, "A", gpus, runtime), 300.0 * (j + 1)))
    assert [s.gpu for s in detector.suspects()] == ["g0"]
    assert not [c for c in detector.changes_ if c.gpu == "g1"]


def test_a_suspect_with_no_run_of_its_class_is_rechecked_and_one_slow_run_confirms_it() -> None:
    detector = SuspicionDetector(recheck_s=3600.0 * 72).fit(_scores(64))
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000):
        detector.update(record)
    assert [(s.gpu, s.job_class) for s in detector.suspects()] == [("g0", "A")]
    end = 300.0 * 6000
    # Three quiet days (class A kept off g0): lifted, so the class may try it again.
    other = JobRun("q", "D0", "D", ("g9",), 100.0)
    changes = detector.update(JobRecord(other, end + 73 * 3600.0))
    assert [(c.gpu, c.job_class, c.suspect) for c in changes] == [("g0", "A", False)]
    assert "probation" in changes[0].why and detector.suspects() == []
    # Its next class-A run is as slow as before: suspect again at once.
    past = [r for r, _ in _stream(6000, seed=1) if r.run.app == "A0" and len(r.run.gpus) == 1]
    slow = JobRun("s", "A0", "A", ("g0",), 2.0 * past[-1].run.runtime_s)
    changes = detector.update(JobRecord(slow, end + 80 * 3600.0))
    assert [(c.gpu, c.job_class, c.suspect) for c in changes] == [("g0", "A", True)]


def test_partners_that_only_ran_together_are_not_told_apart_by_name() -> None:
    detector = SuspicionDetector().fit(_scores(8))
    rng = np.random.default_rng(2)
    for j in range(200):
        app = f"A{j % 3}"
        together = j >= 100 and j % 5 == 0  # g0 and g1, slow, never one without the other
        gpus = ("g0", "g1") if together else (f"g{2 + j % 6}",)
        runtime = 1000.0 * (1 + j % 3) * (2.0 if together else 1.0) * float(rng.lognormal(0, 0.07))
        detector.update(JobRecord(JobRun(str(j), app, "A", gpus, runtime), 300.0 * (j + 1)))
    assert detector.suspects() == []


def _one_slow_run(detector: SuspicionDetector, factor: float = 2.0) -> float:
    """A quiet history, then one class-A run on g0 ``factor`` x its application's: returns
    when it ended."""
    for record, _ in _stream(3000, seed=4, cv=0.05, multi=0.0):
        detector.update(record)
    past = [r for r, _ in _stream(3000, seed=4, cv=0.05, multi=0.0) if r.run.app == "A0"]
    end = 300.0 * 3001
    slow = JobRun("slow", "A0", "A", ("g0",), factor * past[-1].run.runtime_s)
    assert detector.update(JobRecord(slow, end)) == []  # one run is never a suspicion
    return end


def test_one_slow_run_is_no_suspicion() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    _one_slow_run(detector)
    assert detector.suspects() == []


def test_a_cleared_suspicion_drops_its_evidence_and_a_new_one_can_follow() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000):
        detector.update(record)
    assert ("g0", "A") in {(s.gpu, s.job_class) for s in detector.suspects()}
    cleared_s = 300.0 * 6001
    changes = detector.clear("g0", "A", cleared_s, "re-measured 1.02x")
    assert [(c.gpu, c.job_class, c.suspect) for c in changes] == [("g0", "A", False)]
    assert ("g0", "A") not in {(s.gpu, s.job_class) for s in detector.suspects()}
    assert detector.clear("g0", "A", cleared_s, "again") == []  # nothing left to clear
    # Still slow: its later runs make it suspect again, from their own evidence only.
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=0):
        detector.update(JobRecord(record.run, cleared_s + record.end_s))
    (again,) = [s for s in detector.suspects() if (s.gpu, s.job_class) == ("g0", "A")]
    assert again.since_s > cleared_s and again.onset_s > cleared_s


def test_a_replay_with_the_clearings_ends_where_the_live_detector_did() -> None:
    """A restart replays the stored runs; a re-measurement's clearing, replayed at its time,
    gives the suspicions, their times and the changes the live detector had."""
    before = [r for r, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000)]
    cleared_s = 300.0 * 6001
    after = [
        JobRecord(r.run, cleared_s + r.end_s)
        for r, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=0)
    ]
    live = SuspicionDetector().fit(_scores(64), before)
    live.clear("g0", "A", cleared_s, "re-measured 1.02x")
    for record in after:
        live.update(record)
    clearing = ("g0", "A", cleared_s, "re-measured 1.02x")
    replayed = replay(SuspicionDetector(), _scores(64), before + after, [clearing])
    assert replayed.suspects() == live.suspects()
    assert replayed.changes_ == live.changes_
    (again,) = [s for s in replayed.suspects() if (s.gpu, s.job_class) == ("g0", "A")]
    assert again.since_s > cleared_s
    # without the clearing the first suspicion would stand, and hide the second
    blind = SuspicionDetector().fit(_scores(64), before + after)
    (old,) = [s for s in blind.suspects() if (s.gpu, s.job_class) == ("g0", "A")]
    assert old.since_s < cleared_s


def _gang_history(slow_gpu: str, gangs: list[tuple[str, ...]], seed: int = 3):
    """Class-A records on 16 GPUs: single runs everywhere, then 4-GPU gangs (``gangs``, in
    turn) with ``slow_gpu`` 2x slow from job 200; every GPU but ``slow_gpu`` also runs alone
    at normal speed. Yields records."""
    rng = np.random.default_rng(seed)
    t = 0.0
    for j in range(400):
        t += 300.0
        app = f"A{j % 4}"
        base = 1000.0 * (1 + j % 4)
        if j >= 200 and j % 4 == 0:
            gpus = gangs[(j // 4) % len(gangs)]
        else:
            gpus = (f"g{(j * 7) % 16}",)
            if gpus == (slow_gpu,):
                gpus = ("g15",)
        factor = 2.0 if j >= 200 and slow_gpu in gpus else 1.0
        runtime = base * factor * float(rng.lognormal(0, 0.1))
        yield JobRecord(JobRun(str(j), app, "A", gpus, runtime), t)


def test_gangs_that_share_one_gpu_name_it() -> None:
    # g0 is 2x slow and only ever runs in 8-GPU gangs, each with other partners: each slow
    # gang is whole evidence against every member, so three gangs name g0 (shared among
    # eight, it took 5-12).
    members = ((0, 1, 2, 3, 4, 5, 6, 7), (0, 8, 9, 10, 11, 12, 13, 14), (0, 1, 3, 5, 9, 11, 13, 15))
    gangs = [tuple(f"g{i}" for i in gang) for gang in members]
    detector = SuspicionDetector().fit(_scores(16))
    slow_gangs, found_after = 0, None
    for record in _gang_history("g0", gangs):
        slow_gangs += "g0" in record.run.gpus and int(record.run.job_id) >= 200
        if any(c.suspect for c in detector.update(record)) and found_after is None:
            found_after = slow_gangs
    assert found_after is not None and found_after <= 3
    assert [(s.gpu, s.job_class) for s in detector.suspects()] == [("g0", "A")]
    assert not [c for c in detector.changes_ if c.gpu != "g0"]


def test_partners_over_the_alarm_are_candidates_and_a_clear_names_the_other() -> None:
    detector = SuspicionDetector().fit(_scores(8))
    rng = np.random.default_rng(2)
    for j in range(200):
        app = f"A{j % 3}"
        together = j >= 100 and j % 5 == 0  # g0 and g1, slow, never one without the other
        gpus = ("g0", "g1") if together else (f"g{2 + j % 6}",)
        runtime = 1000.0 * (1 + j % 3) * (2.0 if together else 1.0) * float(rng.lognormal(0, 0.07))
        detector.update(JobRecord(JobRun(str(j), app, "A", gpus, runtime), 300.0 * (j + 1)))
    assert detector.suspects() == []  # the runs cannot tell them apart...
    assert {(c.gpu, c.job_class) for c in detector.candidates()} == {("g0", "A"), ("g1", "A")}
    # ... a re-measurement can: g1 measures as its campaign says, so g0 is the slow one.
    changes = detector.clear("g1", "A", 300.0 * 201, "re-measured normal")
    assert [(c.gpu, c.job_class, c.suspect) for c in changes] == [("g0", "A", True)]
    assert detector.candidates() == []


def test_a_confirmed_score_is_taken_without_a_refit() -> None:
    detector = SuspicionDetector().fit(_scores(64))
    for record, _ in _stream(6000, seed=1, slow={0: 2.0}, slow_from=2000):
        detector.update(record)
    assert ("g0", "A") in {(s.gpu, s.job_class) for s in detector.suspects()}
    end = 300.0 * 6000
    changes = detector.rescore("g0", "A", 2.0, end, "re-measured 2x")
    assert [(c.gpu, c.suspect) for c in changes] == [("g0", False)]
    # Judged against its new score, later 2x runs are what it is expected to do now.
    for record, _ in _stream(3000, seed=5, slow={0: 2.0}):
        shifted = JobRecord(record.run, end + record.end_s)
        detector.update(shifted)
    assert ("g0", "A") not in {(s.gpu, s.job_class) for s in detector.suspects()}
    assert ("g0", "A") not in {(c.gpu, c.job_class) for c in detector.candidates()}
    with pytest.raises(ValueError, match="score"):
        detector.rescore("g0", "A", 0.0, end, "bad")


def test_runs_of_an_edited_script_are_judged_against_their_user_and_job_name() -> None:
    # Every submission's script differs (a new application key each time); the user and job
    # name stay: the family is the baseline, and a slow GPU is found from it.
    def records(family: str) -> Iterator[JobRecord]:
        rng = np.random.default_rng(7)
        for j in range(300):
            gpu = f"g{j % 8}"
            slow = 2.0 if gpu == "g0" and j >= 150 else 1.0
            runtime = 1000.0 * slow * float(rng.lognormal(0, 0.1))
            run = JobRun(str(j), f"alice|train|sha{j}", "A", (gpu,), runtime, family)
            yield JobRecord(run, 300.0 * (j + 1))

    with_family = SuspicionDetector().fit(_scores(8))
    for record in records("alice|train"):
        with_family.update(record)
    assert [(s.gpu, s.job_class) for s in with_family.suspects()] == [("g0", "A")]
    without = SuspicionDetector().fit(_scores(8))
    for record in records(""):
        without.update(record)
    assert without.suspects() == []  # no key ever had a baseline
