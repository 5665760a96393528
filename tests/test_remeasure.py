"""The re-measure planner (core/remeasure.py): opt-in budget, one in flight per GPU (and per
label-mates: a job holds every GPU of the suspect's label on its node), idle GPUs only, a retry
delay per (GPU, class); the verdict; the campaign increment."""

from __future__ import annotations

import pandas as pd
import pytest

from slurm_pal.core.remeasure import (
    Attempt,
    Pin,
    RemeasureLimits,
    Wanted,
    idle_pins,
    increment_id,
    increment_rows,
    recovered,
    routine,
    to_remeasure,
    verdict,
    wanted,
)

LIMITS = RemeasureLimits(per_hour=2, retry_s=86400, slower=1.15)
# n1: g0 and g1 share a label, g4 has its own; n2, n3: one GPU each.
SITE = [("g0", "n1", "x"), ("g1", "n1", "x"), ("g4", "n1", "y"), ("g2", "n2", "x"),
        ("g3", "n3", "x")]  # fmt: skip
IDLE = idle_pins(SITE, {"g0", "g1", "g2", "g3", "g4"})


def test_a_gpu_is_idle_with_its_label_mates_on_its_node_whatever_the_rest_runs():
    assert IDLE["g0"] == IDLE["g1"] == Pin("n1", "x", ("g0", "g1"))
    assert IDLE["g4"] == Pin("n1", "y", ("g4",))
    busy_mate = idle_pins(SITE, {"g0", "g2", "g3", "g4"})  # g1 runs a job
    assert "g0" not in busy_mate and busy_mate["g4"] == Pin("n1", "y", ("g4",))
    assert "g0" in idle_pins(SITE, {"g0", "g1", "g2", "g3"})  # g4 (another label) runs one


def test_only_idle_gpus_oldest_suspicion_first():
    suspects = [Wanted("g2", "A", 20.0), Wanted("g9", "A", 5.0), Wanted("g3", "B", 10.0)]
    picked = to_remeasure(suspects, IDLE, [], 100.0, LIMITS)
    assert [(w.gpu, w.job_class) for w in picked] == [("g3", "B"), ("g2", "A")]


def test_per_hour_budget_counts_recent_submissions():
    suspects = [Wanted("g2", "A", 1.0), Wanted("g3", "A", 2.0)]
    one_recent = [Attempt("g0", "A", "n1", 4000.0, done=True)]
    assert len(to_remeasure(suspects, IDLE, one_recent, 4100.0, LIMITS)) == 1
    assert len(to_remeasure(suspects, IDLE, one_recent, 4000.0 + 3600, LIMITS)) == 2
    assert to_remeasure(suspects, IDLE, [], 0.0, RemeasureLimits(per_hour=0)) == []


def test_one_in_flight_per_gpu_and_its_label_mates():
    suspects = [Wanted("g0", "B", 1.0), Wanted("g1", "A", 2.0), Wanted("g4", "A", 2.5),
                Wanted("g2", "A", 3.0)]  # fmt: skip
    flying = [Attempt("g0", "A", "n1", 0.0, held=("g0", "g1"))]
    limits = RemeasureLimits(per_hour=10)
    # g1 is held by g0's job (same label); g4 (another label, same node) is not
    picked = to_remeasure(suspects, IDLE, flying, 10.0, limits)
    assert [w.gpu for w in picked] == ["g4", "g2"]
    # nothing flying: one per pin in one call too
    assert [w.gpu for w in to_remeasure(suspects, IDLE, [], 10.0, limits)] == ["g0", "g4", "g2"]
    # an attempt that names no held GPUs holds its own GPU only
    alone = [Attempt("g0", "A", "n1", 0.0)]
    assert [w.gpu for w in to_remeasure(suspects[1:2], IDLE, alone, 10.0, limits)] == []


def test_a_pair_is_retried_only_after_retry_s():
    suspects = [Wanted("g2", "A", 1.0)]
    tried = [Attempt("g2", "A", "n2", 100.0, done=True)]
    limits = RemeasureLimits(per_hour=10, retry_s=1000)
    assert to_remeasure(suspects, IDLE, tried, 1099.0, limits) == []
    assert len(to_remeasure(suspects, IDLE, tried, 1100.0, limits)) == 1
    # another class of the same GPU is not held back
    assert len(to_remeasure([Wanted("g2", "B", 1.0)], IDLE, tried, 200.0, limits)) == 1


def test_verdict_confirms_at_slower_and_clears_below():
    assert verdict(2.0, 1.0, 1.15).confirmed
    assert verdict(1.15, 1.0, 1.15).confirmed
    cleared = verdict(1.05, 1.0, 1.15)
    assert not cleared.confirmed and cleared.ratio == pytest.approx(1.05)
    assert "as the campaign says" in cleared.why
    with pytest.raises(ValueError):
        verdict(0.0, 1.0, 1.15)


def test_increment_id_numbers_after_the_known_ones():
    assert increment_id("c1", ["c1"]) == "c1-r1"
    assert increment_id("c1-r1", ["c1", "c1-r1"]) == "c1-r2"
    assert increment_id("c1", ["c1", "c1-r1", "c1-r3", "c2-r7"]) == "c1-r4"
    assert len(increment_id("x" * 64, [])) == 64


def test_increment_rows_replace_only_that_gpu_and_class():
    cols = ["job_class", "uuid", "benchmark", "duration"]
    old = pd.DataFrame(
        [["A", "g0", "gemm", 1.0], ["A", "g0", "gemm", 1.1], ["B", "g0", "stream", 2.0],
         ["A", "g1", "gemm", 1.0]],
        columns=cols,
    )  # fmt: skip
    new = pd.DataFrame([["A", "g0", "gemm", 2.0, "extra"]], columns=[*cols, "x"])
    out = increment_rows(old, "g0", "A", new)
    assert list(out.columns) == cols
    assert sorted(map(tuple, out.values.tolist())) == [
        ("A", "g0", "gemm", 2.0), ("A", "g1", "gemm", 1.0), ("B", "g0", "stream", 2.0),
    ]  # fmt: skip


def test_rechecks_come_after_every_suspect():
    wanted = [Wanted("g3", "A", 1.0, recheck=True), Wanted("g2", "A", 50.0)]
    limits = RemeasureLimits(per_hour=1)
    assert [w.gpu for w in to_remeasure(wanted, IDLE, [], 100.0, limits)] == ["g2"]


def test_wanted_measures_the_other_classes_of_a_gpu_found_slow():
    from slurm_pal.core.suspicion import Suspicion

    suspects = [Suspicion("g2", "B", 50.0, 40.0, "runtime", 2.0, 3)]
    confirmed = {
        ("g1", "A"): 100.0, ("g1", "C"): 90.0, ("g1", "E"): 50.0, ("g2", "A"): 100.0,
        ("g3", "A"): 100.0,
    }  # fmt: skip
    scores = {
        "g1": {"A": 2.0, "B": 1.0, "C": 1.5, "D": 1.0, "E": 1.0},  # E: found slow, recovered
        "g2": {"A": 2.0, "B": 1.0},
        "g3": {"A": 1.1, "B": 1.0},  # recovered (under `slower`): nothing for it
    }
    settled = {("g1", "D"): 150.0, ("g1", "B"): 80.0}  # D cleared since, B before
    got = wanted(suspects, confirmed, scores, 200.0, LIMITS, settled)
    # g2's B is a suspect already; g1's C is found slow itself; g1's D was settled since.
    assert got == [
        Wanted("g2", "B", 50.0),
        Wanted("g1", "B", 100.0, other_class=True),
        Wanted("g1", "E", 100.0, other_class=True),
    ]
    assert [w.why for w in got[:2]] == ["suspect", "found slow for another class, measured"]


def test_other_classes_come_after_suspects_and_before_rechecks():
    found = [
        Wanted("g1", "A", 1.0, recheck=True),
        Wanted("g2", "B", 5.0, other_class=True),
        Wanted("g3", "A", 50.0),
    ]
    limits = RemeasureLimits(per_hour=3)
    picks = to_remeasure(found, IDLE, [], 100.0, limits)
    assert [(w.gpu, w.job_class) for w in picks] == [("g3", "A"), ("g2", "B"), ("g1", "A")]


def test_recovered_when_faster_by_the_factor():
    assert recovered(1.0, 2.0, 1.15).confirmed
    assert not recovered(1.9, 2.0, 1.15).confirmed
    assert "still as slow" in recovered(2.0, 2.0, 1.15).why


def test_wanted_puts_suspects_then_gpus_found_slow_once_retry_s_has_passed():
    from slurm_pal.adapters.config import SiteConfig
    from slurm_pal.core.suspicion import Suspicion

    assert RemeasureLimits.of(SiteConfig().advisor) == RemeasureLimits()
    suspects = [Suspicion("g1", "A", 50.0, 40.0, "runtime", 2.0, 3)]
    confirmed = {("g1", "A"): 0.0, ("g2", "A"): 0.0, ("g3", "A"): 0.0, ("g4", "A"): 90000.0}
    scores = {"g1": {"A": 2.0}, "g2": {"A": 2.0}, "g3": {"A": 1.1}, "g4": {"A": 2.0}}
    got = wanted(suspects, confirmed, scores, 86400.0 + 10.0, LIMITS)
    # g1: a suspect again (measured as one); g3: back under `slower`; g4: confirmed too lately.
    assert got == [Wanted("g1", "A", 50.0), Wanted("g2", "A", 0.0, recheck=True)]


def test_a_gpu_found_slow_is_judged_against_its_own_campaign_score():
    """A fast GPU (0.8) found 1.3x slow scores 1.04: under `slower` as a score, but still
    slow against its campaign's, so measured again to see it recover (and no other class
    measured twice)."""
    confirmed = {("g1", "A"): 0.0}
    scores = {"g1": {"A": 1.04}}
    later = LIMITS.retry_s + 1.0
    assert wanted([], confirmed, scores, later, LIMITS) == []
    got = wanted([], confirmed, scores, later, LIMITS, campaign={"g1": {"A": 0.8}})
    assert got == [Wanted("g1", "A", 0.0, recheck=True)]
    back = wanted([], confirmed, {"g1": {"A": 0.82}}, later, LIMITS, campaign={"g1": {"A": 0.8}})
    assert back == []


def test_routine_takes_idle_gpus_not_measured_for_routine_s_oldest_first():
    limits = RemeasureLimits(per_hour=2, routine_s=1000.0)
    measured = {("g1", "A"): 500.0, ("g2", "A"): 50.0, ("g2", "B"): 1900.0, ("g3", "A"): 1500.0}
    got = routine(["g1", "g2", "g3", "g4"], "A", measured, 100.0, 2000.0, limits)
    # g3 measured 500 s ago: not yet; g4 never re-measured: the campaign's time (100) counts.
    assert got == [
        Wanted("g1", "A", 500.0, routine=True),
        Wanted("g2", "A", 50.0, routine=True),
        Wanted("g4", "A", 100.0, routine=True),
    ]
    assert got[0].why == "not measured for a while, measured routinely"
    picks = to_remeasure(got, IDLE, [], 2000.0, limits)
    assert [w.gpu for w in picks] == ["g2", "g4"]  # oldest first, within the budget
    assert routine(["g1"], "A", {}, 0.0, 2000.0, RemeasureLimits(routine_s=0.0)) == []


def test_routine_measurements_come_after_everything_else():
    found = [
        Wanted("g0", "A", 0.0, routine=True),
        Wanted("g1", "A", 1.0, recheck=True),
        Wanted("g2", "B", 5.0, other_class=True),
        Wanted("g3", "A", 50.0),
    ]
    limits = RemeasureLimits(per_hour=3)
    picks = to_remeasure(found, IDLE, [], 100.0, limits)
    assert [w.gpu for w in picks] == ["g3", "g2", "g1"]
    spent = [Attempt("g4", "A", "n1", 99.0)]  # the hour's budget is shared: one left
    assert [w.gpu for w in to_remeasure(found, IDLE, spent, 100.0, limits)] == ["g3", "g2"]
