"""The control arm and the repeats of `testbed run`, without Slurm: which arm is the baseline,
the order the arms run in, the ratios per repeat and their summary, the control's config and
the simulator's prediction of each pair."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.testbed.emulate import EmulationError, make_trace
from slurm_pal.testbed.evidence import (
    arm_order,
    baseline_arm,
    pair_ratios,
    spread,
    summarize_pair,
)
from slurm_pal.testbed.run import (
    CONTROL_POLICY,
    DEFAULT_ARMS,
    AdvisorArm,
    RunSettings,
    make_arm,
    prepare,
    simulate_prediction,
)


def test_the_baseline_is_the_control_when_it_runs() -> None:
    assert baseline_arm(("control", "advisor")) == "control"
    assert baseline_arm(("stock", "control", "advisor")) == "control"
    assert baseline_arm(("stock", "advisor")) == "stock"
    assert baseline_arm(("stock", "control")) is None  # nothing to compare the advisor with
    assert baseline_arm(("advisor",)) is None
    assert RunSettings(Path("/x")).baseline == "control" and DEFAULT_ARMS == ("control", "advisor")


def test_arms_alternate_which_goes_first() -> None:
    arms = ("control", "advisor")
    orders = [arm_order(arms, r) for r in range(4)]
    assert orders == [arms, arms[::-1], arms, arms[::-1]]
    firsts = [o[0] for o in orders]
    assert firsts.count("control") == firsts.count("advisor")
    assert arm_order(("stock", "control", "advisor"), 1) == ("advisor", "control", "stock")


def test_pair_ratios_from_arm_figures() -> None:
    advisor = {"avg_jct_s": 8.0, "p99_jct_s": 30.0, "makespan_s": 60.0}
    control = {"avg_jct_s": 10.0, "p99_jct_s": 30.0, "makespan_s": 0.0}
    assert pair_ratios(advisor, control) == {
        "avg_jct_ratio": 0.8,
        "p99_jct_ratio": 1.0,
        "makespan_ratio": None,  # a zero baseline gives no ratio rather than a division error
    }


def test_spread_keeps_every_run_and_its_median_and_range() -> None:
    s = spread([0.9, None, 0.7, 0.8, 1.1])
    assert s == {"runs": [0.9, 0.7, 0.8, 1.1], "n": 4, "median": 0.85, "min": 0.7, "max": 1.1}
    assert spread([]) == {"runs": [], "n": 0, "median": None, "min": None, "max": None}


def test_summary_puts_the_prediction_beside_the_median() -> None:
    runs = [
        {"avg_jct_ratio": r, "p99_jct_ratio": 1.0, "makespan_ratio": None} for r in (0.8, 0.7, 0.9)
    ]
    out = summarize_pair(runs, {"avg_jct_ratio": 0.75, "p99_jct_ratio": 0.8})
    avg = out["avg_jct_ratio"]
    assert (avg["median"], avg["min"], avg["max"], avg["sim"]) == (0.8, 0.7, 0.9, 0.75)
    assert avg["vs_sim"] == pytest.approx(0.8 / 0.75 - 1, abs=1e-4)  # measured vs predicted
    assert out["p99_jct_ratio"]["vs_sim"] == 0.25
    assert out["makespan_ratio"]["n"] == 0 and out["makespan_ratio"]["vs_sim"] is None


def test_settings_refuse_bad_repeats_and_arms() -> None:
    with pytest.raises(EmulationError, match="repeats must be >= 1"):
        RunSettings(Path("/x"), repeats=0)
    with pytest.raises(EmulationError, match="named twice"):
        RunSettings(Path("/x"), arms=("control", "control"))
    with pytest.raises(EmulationError, match="unknown arm"):
        RunSettings(Path("/x"), arms=("packing",))


def test_control_arm_is_the_advisor_arm_serving_packing(tmp_path: Path) -> None:
    """The control's service reads a config equal to the advisor's but for the policy, and the
    simulator predicts each pair from those two files."""
    base = SiteConfig()
    site = dataclasses.replace(base, advisor=dataclasses.replace(base.advisor, avoid_above=1.4))
    prep = prepare(RunSettings(tmp_path / "tb", config=site))
    advisor, control = prep.served_config(), prep.served_config("control")
    assert control.advisor.policy == CONTROL_POLICY != advisor.advisor.policy
    assert dataclasses.replace(control.advisor, policy=advisor.advisor.policy) == advisor.advisor
    assert (control.hooks, control.classes, control.locality) == (
        advisor.hooks,
        advisor.classes,
        advisor.locality,
    )
    arm = make_arm("control")
    assert isinstance(arm, AdvisorArm) and arm.name == "control"
    assert prep.arm_config_path("control") != prep.arm_config_path("advisor")

    p = simulate_prediction(prep, make_trace("demo32"))
    assert p["control"]["placement"] == "advisor (packed, every-event)"
    # packing through the advisor's machinery is packing in the simulator: every job timed alike
    assert p["control_jobs_as_stock"] == 32
    assert p["pairs"]["control/stock"] == {
        "avg_jct_ratio": 1.0,
        "p99_jct_ratio": 1.0,
        "makespan_ratio": 1.0,
    }
    assert p["pairs"]["advisor/control"] == p["pairs"]["advisor/stock"]
    assert p["pairs"]["advisor/stock"]["avg_jct_ratio"] == p["avg_jct_ratio"]


def test_simulated_gpus_are_in_slurms_order(tmp_path: Path) -> None:
    """cons_tres gives a job a node's lowest free Slurm indices, and Slurm numbers a node's GPUs
    by type: the simulator's packing (lowest local index first) must see them in that order,
    or it packs jobs onto other GPUs than Slurm does (the example profile's 2.31x GPU is n02's
    second in the campaign and its last in Slurm)."""
    import json

    from slurm_pal.testbed.run import sim_gpus, slurm_order

    prep = prepare(RunSettings(tmp_path / "tb"))
    gpus = sim_gpus(prep)
    labels = json.loads((prep.site_dir / "labels.json").read_text())["nodes"]
    table = prep.table["nodes"]
    for n, node in enumerate(prep.settings.node_names):
        by_slurm = {int(g["slurm_index"]): int(g["index"]) for g in labels[node]}
        assert slurm_order(prep, node) == [by_slurm[i] for i in sorted(by_slurm)]
        for position, slurm_index in enumerate(sorted(by_slurm)):
            gpu = next(g for g in table[node].values() if g["index"] == by_slurm[slurm_index])
            assert gpus.placement_scores["A"][4 * n + position] == gpu["scores"]["A"]
    n02 = list(gpus.placement_scores["A"][4:8])
    assert n02.index(max(n02)) == 3 and max(n02) > 2.0  # the slow GPU is the one Slurm gives last


def test_calibrated_latency_is_the_one_that_reproduces_the_control() -> None:
    from slurm_pal.testbed.evidence import calibrated_latency

    simulated = {0.0: 15.4, 0.5: 16.2, 1.0: 17.0, 1.5: 19.5}
    assert calibrated_latency(simulated, 17.6) == 1.0
    assert calibrated_latency(simulated, 3.0) == 0.0
    assert calibrated_latency({0.0: 10.0, 1.0: 12.0}, 11.0) == 0.0  # a tie: the smaller
    with pytest.raises(ValueError, match="no simulated latencies"):
        calibrated_latency({}, 1.0)


def test_latency_model_without_latency_is_the_prediction(tmp_path: Path) -> None:
    """At no latency the latency model is the plain prediction; with latency every job holds
    its GPUs longer, so the arms wait longer, and the calibrated latency is one of the grid's."""
    from slurm_pal.testbed.run import latency_figures, latency_prediction

    prep = prepare(RunSettings(tmp_path / "tb"))
    trace = make_trace("demo32")
    plain = simulate_prediction(prep, trace)
    none = latency_figures(prep, trace, 0.0, ("control", "advisor"))
    for arm in ("control", "advisor"):
        for key in ("avg_jct", "p99_jct", "makespan", "avg_wait"):
            assert none[arm][key] == pytest.approx(plain[arm][key], abs=2e-3)
    slow = latency_figures(prep, trace, 2.0, ("control",))
    assert slow["control"]["avg_wait"] > none["control"]["avg_wait"]
    model = latency_prediction(prep, trace, "control", measured_baseline_avg_jct_s=9.0)
    assert [g["latency_s"] for g in model["grid"]] == [0.25 * i for i in range(9)]
    first = model["grid"][0]
    assert first["avg_jct_ratio"] == plain["pairs"]["advisor/control"]["avg_jct_ratio"]
    assert model["calibrated"] in model["grid"]
    band = model["avg_jct_ratio_band"]
    assert band["min"] <= first["avg_jct_ratio"] <= band["max"]


def _run(seed: int, measured: float, predicted: float, held: int) -> dict[str, object]:
    return {
        "trace_seed": seed,
        "advisor/control": {"avg_jct_ratio": measured},
        "predicted": {
            "avg_jct_ratio": predicted - 0.01,
            "latency_avg_jct_ratio": predicted,
            "held_jobs": held,
            "held_total_s": 30.0 * held,
        },
        "arms": {
            "control": {"slow_gpu_s": 400.0},
            "advisor": {
                "slow_gpu_s": 10.0,
                "holds": {"held_jobs": held + 1, "held_total_s": 31.0 * held},
            },
        },
    }


def test_repeat_summary_sets_each_measurement_beside_its_prediction() -> None:
    from slurm_pal.testbed.evidence import repeat_summary

    runs = [_run(0, 0.8, 0.85, 1), _run(1, 0.9, 0.88, 2), _run(2, 1.0, 0.95, 0)]
    out = repeat_summary(runs, "control")
    assert [r["measured"] for r in out["repeats"]] == [0.8, 0.9, 1.0]
    assert [r["predicted"] for r in out["repeats"]] == [0.85, 0.88, 0.95]
    assert out["repeats"][1]["predicted_plain"] == 0.87
    assert out["repeats"][1]["predicted_band"] is None  # a report from before the band
    runs[1]["predicted"]["timing_band"] = {"n": 12, "min": 0.8, "max": 0.95, "median": 0.88}  # type: ignore[index]
    assert repeat_summary(runs, "control")["repeats"][1]["predicted_band"] == [0.8, 0.95]
    del runs[1]["predicted"]["timing_band"]  # type: ignore[attr-defined]
    assert out["median_measured"] == 0.9 and out["median_predicted"] == 0.88
    assert out["measured_range"] == [0.8, 1.0]
    low, high = out["measured_ci95"]
    assert 0.8 <= low <= out["geomean_measured"] <= high <= 1.0
    assert out["holds_measured"] == {"jobs": 6, "total_s": 93.0}
    assert out["holds_simulated"] == {"jobs": 3, "total_s": 90.0}
    assert out["repeats"][0]["slow_gpu_s"] == {"control": 400.0, "advisor": 10.0}
    assert repeat_summary(runs, "control") == out  # the bootstrap is seeded
    assert repeat_summary([{"arms": {}}], "control") == {"repeats": []}


def test_a_repeat_off_its_prediction_lists_the_jobs_that_moved() -> None:
    from slurm_pal.testbed.evidence import jobs_apart, repeat_summary

    run = _run(0, 0.8, 0.95, 0)
    run["measured_jobs"] = {
        "control": {"d05": [18.0, 160.0, 3.4], "d06": [18.5, 53.0, 1.0]},
        "advisor": {"d05": [18.0, 81.0, 1.7], "d06": [18.5, 57.0, 1.09]},
    }
    run["predicted"]["jobs"] = {  # type: ignore[index]
        "control": {"d05": [18.0, 80.0, 1.7], "d06": [18.5, 52.0, 1.0]},
        "advisor": {"d05": [18.0, 80.0, 1.7], "d06": [18.5, 52.0, 1.0]},
    }
    apart = jobs_apart(run, "control")
    assert apart == {
        "d05": {"control": {"measured": [18.0, 160.0, 3.4], "simulated": [18.0, 80.0, 1.7]}}
    }
    assert repeat_summary([run], "control")["repeats"][0]["jobs_apart"] == apart
    close = _run(1, 0.9, 0.91, 0)
    assert "jobs_apart" not in repeat_summary([close], "control")["repeats"][0]
