"""The testbed emulation's pure parts: profile draws, the slowdown rule, traces, report math,
and the job script's own arithmetic (run as a process with a faked Slurm environment)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import ClassesConfig, LocalityConfig, SiteConfig
from slurm_pal.adapters.store import Store
from slurm_pal.core.binning import PMBinner
from slurm_pal.core.workload import SimJob
from slurm_pal.sim import SimConfig, simulate
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.site.render import plan_from_store
from slurm_pal.testbed.emulate import (
    CLASSES,
    EmulationError,
    TraceJob,
    arm_metrics,
    campaign_frame,
    compare,
    emulated_gpus,
    job_slowdown,
    make_trace,
    p99,
    parse_gpus,
    score_table,
    source_profile,
)
from slurm_pal.testbed.emulate import LONGHORN_FILES as EMULATED_LONGHORN_FILES
from slurm_pal.testbed.run import RunSettings, sbatch_args
from tests.helpers.data import LONGHORN, need_shared

NODES = ["n01", "n02", "n03", "n04"]


@pytest.fixture(scope="module")
def example_profile():
    return source_profile("example", nodes=4, gpus_per_node=4)


def test_draw_is_seeded_without_repetition(example_profile) -> None:
    a = emulated_gpus(example_profile, NODES, 4, seed=3)
    b = emulated_gpus(example_profile, NODES, 4, seed=3)
    c = emulated_gpus(example_profile, NODES, 4, seed=4)
    assert [g.factors for g in a] == [g.factors for g in b]
    assert [g.factors for g in a] != [g.factors for g in c]
    # 16 slots from a 16-GPU campaign: every measured GPU exactly once
    drawn = sorted(round(g.factors["A"], 9) for g in a)
    truth = example_profile.gpus
    measured = sorted(round(v, 9) for v in truth[truth["job_class"] == "A"]["norm_value"])
    assert drawn == measured
    assert [(g.node, g.index) for g in a] == [(n, i) for n in NODES for i in range(4)]


def test_longhorn_absent_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmulationError, match="--profile example"):
        source_profile("longhorn", longhorn_dir=tmp_path)
    with pytest.raises(EmulationError, match="valid: example, longhorn"):
        source_profile("summit")


def test_the_longhorn_folder_follows_slurm_pal_shared_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_PAL_SHARED_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(EmulationError, match=str(tmp_path / "elsewhere" / "variability")):
        source_profile("longhorn")


def test_longhorn_draw_when_present() -> None:
    need_shared(*(LONGHORN / f for f in set(EMULATED_LONGHORN_FILES.values())))
    profile = source_profile("longhorn")
    gpus = emulated_gpus(profile, NODES, 4, seed=0)
    assert len({g.uuid for g in gpus}) == 16
    assert all(0.5 < f < 3 for g in gpus for f in g.factors.values())


def _ingested(tmp_path: Path, example_profile):
    gpus = emulated_gpus(example_profile, NODES, 4, seed=0)
    csv = tmp_path / "c.csv"
    campaign_frame(gpus).to_csv(csv, index=False)
    store = Store(tmp_path / "s.db")
    store.ingest(
        [read_campaign_csv(csv)], campaign_id="emu", class_order=CLASSES, binner=PMBinner()
    )
    plan = plan_from_store(store, "emu", device_pattern="/dev/tty{index}")
    labels = plan.to_dict()
    table = score_table(store.gpu_scores("emu"), labels, across_nodes=1.7)
    return gpus, store, plan, table


def test_campaign_round_trip_gives_the_drawn_medians(tmp_path: Path, example_profile) -> None:
    gpus, store, plan, table = _ingested(tmp_path, example_profile)
    scores = store.gpu_scores("emu")
    for gpu in gpus:
        rows = scores[scores["uuid"] == gpu.uuid]
        for row in rows.itertuples():
            assert row.norm_value == pytest.approx(
                gpu.factors[row.job_class] / _median(gpus, row.job_class), rel=1e-6
            )
    # the table is keyed by Slurm's index and carries the store's PM-scores
    for g in plan.gpus:
        entry = table["nodes"][g.node][str(g.slurm_index)]
        assert entry["label"] == g.label and entry["index"] == g.index
        stored = scores[scores["uuid"] == g.uuid].set_index("job_class")["pm_score"]
        assert entry["scores"] == pytest.approx(stored.to_dict())
    store.close()


def _median(gpus, job_class: str) -> float:
    return float(pd.Series([g.factors[job_class] for g in gpus]).median())


def test_slowdown_rule() -> None:
    table = {
        "within_node": 1.0,
        "across_nodes": 1.7,
        "nodes": {
            "n1": {
                "0": {"label": "a", "scores": {"A": 1.0, "D": 1.0}},
                "1": {"label": "b", "scores": {"A": 2.0, "D": 1.1}},
            },
            "n2": {"0": {"label": "a", "scores": {"A": 1.2, "D": 1.0}}},
        },
    }
    one = job_slowdown(table, "A", {"n1": [0]})
    assert (one.factor, one.penalty, one.gpus) == (1.0, 1.0, (("n1", 0, "a"),))
    assert job_slowdown(table, "A", {"n1": [0, 1]}).factor == 2.0
    assert job_slowdown(table, "D", {"n1": [1]}).factor == 1.1
    spread = job_slowdown(table, "A", {"n1": [0], "n2": [0]})
    assert spread.factor == pytest.approx(1.2 * 1.7) and spread.worst == 1.2
    # a node listed without GPUs does not make the job spread
    assert job_slowdown(table, "A", {"n1": [0], "n2": []}).penalty == 1.0
    with pytest.raises(EmulationError, match="no GPU 5"):
        job_slowdown(table, "A", {"n1": [5]})
    with pytest.raises(EmulationError, match="valid: A, D"):
        job_slowdown(table, "Z", {"n1": [0]})
    with pytest.raises(EmulationError, match="no GPUs"):
        job_slowdown(table, "A", {"n1": []})
    assert parse_gpus("0,2,3") == [0, 2, 3] and parse_gpus("") == []
    with pytest.raises(EmulationError):
        parse_gpus("0,x")


def test_job_script_applies_the_same_rule(tmp_path: Path, example_profile) -> None:
    """The stdlib job script, run with a faked single-node Slurm environment, records the
    GPUs and the slowdown job_slowdown computes, and sleeps base x slowdown."""
    _, store, plan, table = _ingested(tmp_path, example_profile)
    store.close()
    table_path = tmp_path / "scores.json"
    table_path.write_text(json.dumps(table))
    script = resources.files("slurm_pal.testbed").joinpath("templates/emulated_job.py")
    slow = max(plan.gpus, key=lambda g: table["nodes"][g.node][str(g.slurm_index)]["scores"]["A"])
    env = {
        **os.environ,
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": slow.node,
        "SLURM_JOB_GPUS": f"{slow.slurm_index}",
        "SLURM_JOB_NUM_NODES": "1",
    }
    args = ["class=A", "base=0.01", "gpus=1", f"table={table_path}"]
    args += [f"records={tmp_path}", "id=x1", "submit=100.0"]
    subprocess.run([sys.executable, str(script), *args], env=env, check=True)
    record = json.loads((tmp_path / "x1.json").read_text())
    expected = job_slowdown(table, "A", {slow.node: [slow.slurm_index]})
    assert record["slowdown"] == pytest.approx(expected.factor)
    assert record["gpus"] == [[slow.node, slow.slurm_index, slow.label]]
    assert record["end"] - record["sleep_start"] >= 0.01 * expected.factor
    # a GPU the table does not know: the job fails and says why
    env["SLURM_JOB_GPUS"] = "9"
    args[-2] = "id=x2"
    done = subprocess.run([sys.executable, str(script), *args], env=env, check=False)
    assert done.returncode == 1
    assert "KeyError" in json.loads((tmp_path / "x2.json").read_text())["error"]


def test_traces() -> None:
    a = make_trace("mixed48", seed=1)
    assert a == make_trace("mixed48", seed=1) != make_trace("mixed48", seed=2)
    assert 40 <= len(a) <= 48
    assert [j.submit for j in a] == sorted(j.submit for j in a)
    assert {j.gpus for j in a} <= {1, 2, 4, 8} and {j.job_class for j in a} <= set(CLASSES)
    assert all(3.0 <= j.base <= 15.0 for j in a)
    doubled = make_trace("mixed48", seed=1, scale=2.0)
    assert [j.base for j in doubled] == pytest.approx([2 * j.base for j in a], abs=2e-3)
    # sizes a 2 x 2 cluster cannot hold are left out
    small = make_trace("mixed48", seed=1, nodes=2, gpus_per_node=2)
    assert max(j.gpus for j in small) <= 4 and all(j.gpus != 8 for j in small)
    assert len(make_trace("tiny")) == 6
    demo = make_trace("demo16")
    assert len(demo) == 16 and max(j.gpus for j in demo) <= 4 and demo[-1].submit < 20
    with pytest.raises(EmulationError, match="valid: mixed48, demo16, demo32, tiny"):
        make_trace("philly")
    with pytest.raises(EmulationError, match="scale"):
        make_trace("tiny", scale=0)


def test_sbatch_args_ask_whole_nodes_above_one_node(tmp_path: Path) -> None:
    class Prep:
        settings = RunSettings(tmp_path)
        job_script = tmp_path / "job.py"
        table_path = tmp_path / "scores.json"

    eight = sbatch_args(TraceJob("j1", 0.0, 8, "B", 3.0), Prep, tmp_path, 5.0)  # type: ignore[arg-type]
    assert "--gres=gpu:4" in eight and eight[eight.index("-N") + 1] == "2"
    assert "--comment=pal:app=emu-b" in eight and "class=B" in eight
    two = sbatch_args(TraceJob("j2", 0.0, 2, "A", 3.0), Prep, tmp_path, 5.0)  # type: ignore[arg-type]
    assert "--gres=gpu:2" in two and "-N" not in two
    assert not any(a.startswith("--cpus-per-task") for a in two)  # the older traces: as before
    with pytest.raises(EmulationError, match="valid: stock, control, advisor"):
        RunSettings(tmp_path, arms=("stock", "magic"))


def _record(i: int, submit: float, start: float, end: float, gpus, asked: int = 1) -> dict:
    return {
        "trace_id": f"j{i}",
        "submit": submit,
        "start": start,
        "end": end,
        "gpus": gpus,
        "gpus_asked": asked,
        "slowdown": 1.0,
    }


def test_report_math() -> None:
    records = [
        _record(0, 0.0, 0.0, 10.0, [["n1", 0, "a"]]),
        _record(1, 1.0, 2.0, 5.0, [["n1", 1, "a"], ["n2", 0, "a"]], asked=2),
        _record(2, 2.0, 10.0, 32.0, [["n1", 0, "a"]] * 4 + [["n2", 0, "a"]] * 4, asked=8),
    ]
    m = arm_metrics("stock", records, gpus_per_node=4)
    assert m.avg_jct == pytest.approx((10 + 4 + 30) / 3)
    assert m.p99_jct == 30.0 and m.makespan == 32.0
    assert m.avg_wait == pytest.approx((0 + 1 + 8) / 3)
    assert m.spread_jobs == 1  # the 2-GPU job; the 8-GPU job must span
    faster = arm_metrics("advisor", [_record(0, 0.0, 0.0, 8.0, [["n1", 0, "a"]])], 4)
    single = arm_metrics("stock", [_record(0, 0.0, 0.0, 10.0, [["n1", 0, "a"]])], 4)
    assert compare(faster, single) == {
        "avg_jct_ratio": 0.8,
        "p99_jct_ratio": 0.8,
        "makespan_ratio": 0.8,
    }
    assert p99(list(range(1, 101))) == 100 and p99([3.0]) == 3.0 and math.isnan(p99([]))
    with pytest.raises(EmulationError, match="no job records"):
        arm_metrics("stock", [], 4)


def test_simulator_prediction(tmp_path: Path) -> None:
    """Both arms simulated on the emulated GPUs; when no job ever waits, deciding at submit is
    deciding at start, so the two advisor models agree."""
    from slurm_pal.testbed.run import prepare, simulate_prediction

    prep = prepare(RunSettings(tmp_path / "tb"))
    assert prep.table["across_nodes"] == 1.7 and len(prep.specs) == 4
    quiet = [TraceJob(f"q{i}", 20.0 * i, 1 + i % 4, "ABCD"[i % 4], 5.0) for i in range(6)]
    p = simulate_prediction(prep, quiet)
    assert p["stock"]["avg_wait"] == 0 and p["advisor"]["avg_wait"] == 0
    assert p["at_submit_avg_jct_ratio"] == p["avg_jct_ratio"]
    # the shipped default is what the testbed serves and predicts unless told otherwise
    assert (p["advisor_policy"], p["decisions"]) == ("packed-pm", "every-event")
    busy = simulate_prediction(prep, make_trace("mixed48"))
    for key in ("avg_jct_ratio", "p99_jct_ratio", "makespan_ratio", "at_submit_avg_jct_ratio"):
        assert 0.3 < busy[key] < 2.0
    assert busy["stock"]["placement"] == "packed-sticky"


def test_prediction_gives_jobs_the_limit_slurm_gives_them(tmp_path: Path) -> None:
    """Slurm gives the testbed's jobs no end (sbatch asks for no limit; the partition's MaxTime
    is INFINITE, with no DefaultTime), so the served advisor never expects a GPU to free and
    never holds a job for one. The simulated jobs carry the same limit, so the prediction holds
    none either: with the run times known exactly it held mixed48's 8-GPU job j27 (and j21) and
    let j28 pass it, a gain (0.775) that the testbed could not measure (1.002)."""
    from slurm_pal.testbed.run import (
        SLURM_TIME_LIMIT_S,
        prepare,
        sim_gpus,
        sim_jobs,
    )

    class Prep:
        settings = RunSettings(tmp_path)
        job_script = tmp_path / "job.py"
        table_path = tmp_path / "scores.json"

    trace = make_trace("mixed48")
    for job in trace:
        args = sbatch_args(job, Prep, tmp_path, 0.0)  # type: ignore[arg-type]
        assert not any(a.startswith(("--time", "-t")) for a in args)
    conf = (resources.files("slurm_pal.testbed") / "templates" / "slurm.conf.j2").read_text()
    assert "MaxTime=INFINITE" in conf and "DefaultTime" not in conf
    assert math.isinf(SLURM_TIME_LIMIT_S)
    assert {j.time_limit for j in sim_jobs(trace)} == {SLURM_TIME_LIMIT_S}
    assert [j.work for j in sim_jobs(trace, extra_s=0.5)] == [j.base + 0.5 for j in trace]
    prep = prepare(RunSettings(tmp_path / "tb"))
    assert _direct(prep, trace, prep.served_config())["held_jobs"] == 0
    exact = [dataclasses.replace(j, time_limit=None) for j in sim_jobs(trace)]
    held = simulate(exact, sim_gpus(prep), _testbed_sim(prep, prep.served_config())).jobs
    assert [j.job_id for j in held if j.held_s > 0] == ["j21", "j27"]


def _site(**advisor: object) -> SiteConfig:
    base = SiteConfig()
    return dataclasses.replace(base, advisor=dataclasses.replace(base.advisor, **advisor))


def _direct(prep, trace: list[TraceJob], config: SiteConfig, **override: object):
    """``simulate`` of the advisor exactly as ``advisor_sim_options`` sets ``config`` up, on
    the testbed's GPUs and trace, in the testbed's Slurm mode (strict FIFO)."""
    from slurm_pal.testbed.run import sim_gpus, sim_jobs

    return simulate(
        sim_jobs(trace), sim_gpus(prep), _testbed_sim(prep, config, **override)
    ).summary()


def _testbed_sim(prep, config: SiteConfig, **override: object) -> SimConfig:
    """The simulated advisor as ``advisor_sim_options`` sets ``config`` up, in the testbed's
    Slurm mode (strict FIFO), its jobs asked for as the testbed submits them (``--gres=gpu:N``
    on one node: cons_tres picks their nodes otherwise than a ``--gpus=N`` job's)."""
    from slurm_pal.testbed.run import testbed_release

    return SimConfig(
        **(
            {"requests": "gres-per-node", "slurm_release": testbed_release()}
            | advisor_sim_options(config)
            | override
        ),
        mode="slurm",
        backfill=False,
        site_locality_penalty=float(prep.table["across_nodes"]),
    )


def test_prediction_is_the_site_configs_advisor(tmp_path: Path) -> None:
    """The served config file carries the site's placement settings, so the advisor arm's
    prediction is a plain ``simulate`` of ``advisor_sim_options`` of the site's config, the
    settings matter, and the stock arm is Slurm's packing."""
    from slurm_pal.testbed.run import prepare, sim_gpus, simulate_prediction

    trace = make_trace("mixed48")
    predictions = {}
    for avoid_above in (1.2, 1.5):
        site = _site(policy="packed-pm", avoid_above=avoid_above, pack_tolerance=0.1)
        prep = prepare(RunSettings(tmp_path / f"tb{avoid_above}", config=site))
        served = prep.served_config()
        assert served.advisor.avoid_above == avoid_above and served.advisor.pack_tolerance == 0.1
        p = simulate_prediction(prep, trace)
        want = _direct(prep, trace, site)
        for key in ("avg_jct", "p99_jct", "makespan", "avg_wait"):
            assert p["advisor"][key] == round(float(want[key]), 3)
        late = _direct(prep, trace, site, decisions="at-submit")
        assert p["advisor_at_submit"]["avg_jct"] == round(float(late["avg_jct"]), 3)
        assert p["advisor_settings"]["avoid_above"] == avoid_above
        jobs = [SimJob(j.job_id, j.submit, j.gpus, j.base, j.job_class) for j in trace]
        stock = simulate(
            jobs,
            sim_gpus(prep),
            SimConfig(placement="packed-sticky", mode="slurm", backfill=False),
        ).summary()
        assert p["stock"]["avg_jct"] == round(float(stock["avg_jct"]), 3)
        predictions[avoid_above] = p["advisor"]["avg_jct"]
    # 1.2 makes the example GPUs' class-B outliers count: not a vacuous pass-through
    assert predictions[1.2] != predictions[1.5]


def test_served_config_keeps_the_sites_and_sets_the_testbeds(tmp_path: Path) -> None:
    """What serve reads: the site's [advisor] settings, classes and penalty; the testbed's
    socket, users, refresh and re-planning; ``policy`` and ``replan_on_epilog`` from the run
    when it names them, else from the site."""
    from slurm_pal.testbed.run import prepare

    site = dataclasses.replace(
        _site(policy="pm-first", pack_tolerance=0.2, submit_timeout_ms=450),
        classes=ClassesConfig(names=("A", "B", "C", "D"), default="C"),
        locality=LocalityConfig(across_switches=1.4),
    )
    own = {"socket", "allowed_users", "socket_group", "refresh_s", "replan_s", "labels_file"}
    own |= {"reservation_ttl_s", "listen", "munge_socket"}  # the multi-host testbed's TCP
    own |= {"slurm_backfill", "slurm_overtime_unlimited"}  # the testbed's slurm.conf
    prep = prepare(RunSettings(tmp_path / "a", config=site))
    served = prep.served_config()
    assert served.advisor.slurm_backfill is False
    assert served.advisor.slurm_overtime_unlimited is False
    for f in dataclasses.fields(site.advisor):
        if f.name not in own:
            assert getattr(served.advisor, f.name) == getattr(site.advisor, f.name), f.name
    assert served.advisor.socket == str(prep.socket_path)
    assert served.advisor.listen == served.hooks.advisor == "10.250.0.1:7001"
    assert served.advisor.allowed_users == ("root",) and served.advisor.replan_s == 0.0
    assert served.classes == site.classes and served.locality.across_switches == 1.4
    assert prep.table["across_nodes"] == 1.4
    prep = prepare(RunSettings(tmp_path / "b", config=site, policy="pal", replan_on_epilog=False))
    served = prep.served_config()
    assert (served.advisor.policy, served.advisor.replan_on_epilog) == ("pal", False)
    assert advisor_sim_options(served)["decisions"] == "at-submit"
    with pytest.raises(EmulationError, match="unknown policy 'magic'"):
        RunSettings(tmp_path, policy="magic")
    # site-like work: backfill, and the site's waits at the testbed's time scale (an hour a minute)
    served = prepare(RunSettings(tmp_path / "c", config=site, trace="dl", nodes=8)).served_config()
    assert served.advisor.slurm_backfill is True
    assert served.advisor.slurm_overtime_unlimited is True  # BACKFILL's OverTimeLimit
    assert served.advisor.max_wait_s == pytest.approx(site.advisor.max_wait_s / 60)
    assert served.advisor.assumed_runtime_s == pytest.approx(site.advisor.assumed_runtime_s / 60)


def test_at_submit_is_its_own_prediction(tmp_path: Path) -> None:
    """PAL deciding only at submit (Slurm places a job that waited) is a different advisor on
    a trace whose jobs queue; without the Epilog's re-planning it is the advisor's prediction."""
    from slurm_pal.testbed.run import prepare, simulate_prediction

    trace = make_trace("mixed48")
    every = simulate_prediction(prepare(RunSettings(tmp_path / "e", policy="pal")), trace)
    assert every["decisions"] == "every-event" and every["advisor_policy"] == "pal"
    assert every["at_submit_avg_jct_ratio"] != every["avg_jct_ratio"]
    settings = RunSettings(tmp_path / "s", policy="pal", replan_on_epilog=False)
    late = simulate_prediction(prepare(settings), trace)
    assert late["decisions"] == "at-submit"
    assert late["avg_jct_ratio"] == late["at_submit_avg_jct_ratio"]
    assert late["avg_jct_ratio"] == every["at_submit_avg_jct_ratio"]


@pytest.mark.parametrize(("release", "planned_as"), [("", "22.05"), ("24.11", "24.11")])
def test_the_prediction_plans_as_the_testbeds_slurm_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str, planned_as: str
) -> None:
    """The testbed's daemons are the host's Slurm (22.05) or ``$SLURM_PAL_SLURM_RELEASE``'s;
    every simulation of its prediction plans a job past its limit as that release does."""
    from slurm_pal.testbed.run import prediction_configs, prepare

    monkeypatch.setenv("SLURM_PAL_SLURM_RELEASE", release)
    configs = prediction_configs(prepare(RunSettings(tmp_path / "tb", trace="dl", nodes=8)))
    assert {c.slurm_release for c in configs.values()} == {planned_as}
    assert {c.backfill_reserves for c in configs.values()} == {"nodes"}  # as sched/backfill


def test_packing_advisor_is_timed_as_stock(tmp_path: Path) -> None:
    """An advisor that places as Slurm packs predicts a ratio of exactly 1, and says so."""
    from slurm_pal.testbed.run import prepare, simulate_prediction

    trace = make_trace("mixed48")
    p = simulate_prediction(prepare(RunSettings(tmp_path / "tb", policy="packed")), trace)
    assert p["jobs_as_stock"] == len(trace)
    assert p["avg_jct_ratio"] == p["makespan_ratio"] == p["at_submit_avg_jct_ratio"] == 1.0
    pal = simulate_prediction(prepare(RunSettings(tmp_path / "pal", policy="pal")), trace)
    assert pal["jobs_as_stock"] < len(trace)


def test_testbed_run_cli_passes_policy_and_config(tmp_path: Path, monkeypatch) -> None:
    """`testbed run` serves the global config's policy unless --policy names one, and leaves
    the Epilog's re-planning to the config unless told."""
    from typer.testing import CliRunner

    import slurm_pal.testbed.run as run
    from slurm_pal.cli.main import app

    seen: list[RunSettings] = []

    def fake(settings: RunSettings, progress) -> dict:
        seen.append(settings)
        raise EmulationError("stopped by the test")

    monkeypatch.setattr(run, "run_testbed", fake)
    config = tmp_path / "site.toml"
    config.write_text('[advisor]\npolicy = "pm-first"\nreplan_on_epilog = false\n')
    cases = (
        ([], "packed-pm", True),
        (["--policy", "pal"], "pal", True),
        (["--no-replan-on-epilog"], "packed-pm", False),
        (["--config", str(config)], "pm-first", False),
        (["--config", str(config), "--policy", "pal", "--replan-on-epilog"], "pal", True),
    )
    for args, policy, replans in cases:
        glob = args[:2] if args[:1] == ["--config"] else []
        result = CliRunner().invoke(
            app,
            [*glob, "testbed", "run", "--dir", str(tmp_path / "tb"), *args[len(glob) :]],
            env={"SLURM_PAL_CONFIG": None},
        )
        assert result.exit_code == 2 and "stopped by the test" in result.output, result.output
        assert (seen[-1].advisor_policy, seen[-1].replans_on_epilog) == (policy, replans), args
    result = CliRunner().invoke(app, ["testbed", "run", "--policy", "magic"])
    assert result.exit_code == 2 and "unknown policy 'magic'" in result.output


@pytest.mark.parametrize("family", ["dl", "campus"])
def test_site_like_traces_carry_limits_and_long_jobs(family: str) -> None:
    from slurm_pal.testbed.emulate import SITE_RUN_S, make_trace

    jobs = make_trace(family, seed=3, gpus_per_node=4, nodes=8)
    assert jobs == make_trace(family, seed=3, gpus_per_node=4, nodes=8)
    assert jobs != make_trace(family, seed=4, gpus_per_node=4, nodes=8)
    assert all(j.time_limit is not None and j.time_limit % 60 == 0 for j in jobs)
    # a user's limit is never below what the job runs on median GPUs
    assert all(j.time_limit >= j.base for j in jobs)  # type: ignore[operator]
    assert min(j.base for j in jobs) >= SITE_RUN_S[0]
    assert max(j.base for j in jobs) / min(j.base for j in jobs) >= 5
    assert all(j.gpus <= 4 or j.gpus % 4 == 0 for j in jobs)  # gangs over whole nodes
    single = sum(j.gpus == 1 for j in jobs) / len(jobs)
    if family == "campus":
        assert single >= 0.5
    else:
        assert any(j.gpus > 4 for j in jobs)
    stretched = make_trace(family, seed=3, gpus_per_node=4, nodes=8, scale=2.0)
    assert [j.base for j in stretched] == [round(2 * j.base, 3) for j in jobs]
    assert all(j.time_limit % 60 == 0 for j in stretched)  # type: ignore[operator]


def test_site_like_jobs_ask_slurm_for_their_limit(tmp_path: Path) -> None:
    from slurm_pal.testbed.emulate import TraceJob
    from slurm_pal.testbed.run import BACKFILL, FIFO

    settings = RunSettings(root=tmp_path, trace="dl", nodes=8)
    assert settings.scheduler == BACKFILL
    assert settings.time_scale == pytest.approx(1 / 60)
    assert RunSettings(root=tmp_path).scheduler == FIFO
    assert RunSettings(root=tmp_path).time_scale == 1.0
    prep = type("P", (), {"settings": settings, "job_script": tmp_path / "job", "table_path": "t"})
    args = sbatch_args(TraceJob("x1", 0.0, 8, "A", 30.0, 180.0), prep, tmp_path, 0.0)  # type: ignore[arg-type]
    assert "--time=3" in args and args[args.index("-N") + 1] == "2"
    assert "--cpus-per-task=8" in args  # free CPUs follow free GPUs: 2 a GPU, 4 GPUs a node


def test_few_slow_profile_draws_a_few_far_slower_gpus() -> None:
    from slurm_pal.testbed.emulate import drawn_gpus

    nodes = [f"n{i:02d}" for i in range(1, 9)]
    gpus = drawn_gpus("few-slow", nodes, 4, seed=0)
    assert len(gpus) == 32 and gpus == drawn_gpus("few-slow", nodes, 4, seed=0)
    slow = [g for g in gpus if g.factors["A"] >= 2.0]
    assert 1 <= len(slow) <= 3 and all(g.factors["A"] <= 3.1 for g in slow)
    assert all(g.factors["D"] < 1.1 for g in gpus)  # the memory-bound class does not feel it


def test_timing_band_is_the_prediction_with_submissions_moved(tmp_path: Path) -> None:
    """Unmoved, every draw is the calibrated prediction itself; moved by half a second, the
    demo's draw of short jobs spreads (a job that starts a moment earlier finds other nodes),
    which is what a single run of it is judged against."""
    from slurm_pal.testbed.demo import DEMO_NODES, DEMO_PROFILE, DEMO_SCALE, DEMO_SEED
    from slurm_pal.testbed.run import latency_figures, prepare, timing_band

    settings = RunSettings(
        tmp_path / "tb",
        trace="dl",
        trace_seed=DEMO_SEED,
        scale=DEMO_SCALE,
        nodes=DEMO_NODES,
        profile=DEMO_PROFILE,
    )
    prep = prepare(settings)
    trace = settings.make_trace(0)
    figures = latency_figures(prep, trace, 0.5, ("advisor", "stock"))
    exact = figures["advisor"]["avg_jct"] / figures["stock"]["avg_jct"]
    still = timing_band(prep, trace, "stock", 0.5, jitter_s=0.0, draws=3)
    assert still["n"] == 3 and still["min"] == still["max"] == round(exact, 4)
    moved = timing_band(prep, trace, "stock", 0.5, draws=6)
    assert moved["n"] == 6 and moved["jitter_s"] == 0.5
    assert moved["min"] < moved["max"]
    assert moved == timing_band(prep, trace, "stock", 0.5, draws=6)  # seeded
