"""`slurm-pal sim run`: table, JSON and plots on small traces."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.data import LONGHORN, need_shared

TRACE = """job_id,num_gpus,submit_time,duration,model
0,1,0,1000,vgg19
1,4,10,2000,resnet50
2,8,20,500,BERT
3,2,30,3000,PointNet
4,1,400,100,GPT2
"""


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return path


def test_json_has_one_object_per_placement_and_scheduler(
    run_cli: Callable[..., object], trace: Path
) -> None:
    result = run_cli(
        "sim", "run", "--trace", trace, "--cluster", "4x4", "--scheduler", "fifo,srtf", "--json"
    )
    rows = json.loads(result.output)
    assert len(rows) == 12
    assert {(r["placement"], r["scheduler"]) for r in rows} == {
        (p, s)
        for p in (
            "packed-sticky",
            "packed-nonsticky",
            "random-sticky",
            "random-nonsticky",
            "pm-first",
            "pal",
        )
        for s in ("fifo", "srtf")
    }
    for row in rows:
        for key in ("avg_jct", "p99_jct", "makespan", "utilization", "avg_wait"):
            assert isinstance(row[key], float) and row[key] > 0, key
        assert row["jobs"] == 5 and row["unfinished"] == 0


def test_table_and_plots(run_cli: Callable[..., object], trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    result = run_cli(
        "sim",
        "run",
        "--trace",
        trace,
        "--cluster",
        "2x4",
        "--placement",
        "pal,packed-sticky",
        "--mode",
        "slurm",
        "--plot",
        out,
    )
    assert "packed-sticky" in result.output and "slurm mode" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["gpus_in_use_fifo.png", "jct_cdf_fifo.png"]
    assert all(p.stat().st_size > 1000 for p in out.iterdir())


def test_timeline_in_json(run_cli: Callable[..., object], trace: Path) -> None:
    result = run_cli(
        "sim",
        "run",
        "--trace",
        trace,
        "--cluster",
        "2x4",
        "--placement",
        "pal",
        "--json",
        "--timeline",
    )
    (row,) = json.loads(result.output)
    times = [t for t, _ in row["gpus_in_use"]]
    assert times == sorted(times) and all(0 <= b <= 8 for _, b in row["gpus_in_use"])
    assert max(b for _, b in row["gpus_in_use"]) == 8  # the 8-GPU job fills the cluster


def test_same_seed_same_json(run_cli: Callable[..., object], trace: Path) -> None:
    args = ("sim", "run", "--trace", trace, "--cluster", "2x4", "--placement", "random-sticky")
    first = run_cli(*args, "--seed", "5", "--json").output
    assert run_cli(*args, "--seed", "5", "--json").output == first


def test_poisson_trace_and_longhorn_profiles(run_cli: Callable[..., object]) -> None:
    need_shared(LONGHORN)
    profiles = [
        arg
        for cls, name in (("A", "resnet"), ("B", "bert"), ("D", "pagerank"))
        for arg in ("--profile", f"{cls}={LONGHORN / f'{name}-longhorn-agg.csv'}")
    ]
    for extra in ((), ("--pal-artifact",)):
        result = run_cli(
            "sim",
            "run",
            "--poisson",
            "30",
            "--load",
            "20",
            "--cluster",
            "4x4",
            "--placement",
            "pal",
            *profiles,
            *extra,
            "--json",
        )
        (row,) = json.loads(result.output)
        assert row["unfinished"] == 0 and set(row["per_class"]) <= {"A", "B", "D"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--placement", "tiresias"), "unknown placement"),
        (("--scheduler", "sjf"), "unknown scheduler"),
        (("--cluster", "16by4"), "NODESxGPUS"),
        (("--mode", "batch"), "unknown mode"),
        (("--profile", "A"), "KEY=VALUE"),
    ],
)
def test_bad_options_exit_2(
    run_cli: Callable[..., object], trace: Path, args: tuple[str, ...], message: str
) -> None:
    result = run_cli("sim", "run", "--trace", trace, *args, ok=False)
    assert result.exit_code == 2
    assert message in result.output


def test_missing_trace(run_cli: Callable[..., object], tmp_path: Path) -> None:
    result = run_cli("sim", "run", "--trace", tmp_path / "nope.csv", ok=False)
    assert result.exit_code == 2 and "not found" in result.output


def test_config_advisor_is_the_engine_as_configured(
    run_cli: Callable[..., object], trace: Path, tmp_path: Path
) -> None:
    """`--placement advisor` simulates what serve runs with the same file: a config whose
    policy is plain packing gives packing's results to the second, and `--config` alone
    compares packing, the advisor and the PM-blind null."""

    def rows_for(config: str, *placement: str) -> dict[str, dict]:
        path = tmp_path / "site.toml"
        path.write_text(config)
        args = ["--trace", trace, "--cluster", "4x4", "--mode", "slurm", "--config", path]
        result = run_cli("sim", "run", *args, *placement, "--json")
        return {row["placement"]: row for row in json.loads(result.output)}

    rows = rows_for('[advisor]\npolicy = "packed"\n')
    assert list(rows) == ["packed-sticky", "advisor", "null"]
    assert rows["advisor"]["avg_jct"] == rows["packed-sticky"]["avg_jct"]
    assert rows["advisor"]["makespan"] == rows["packed-sticky"]["makespan"]
    rows = rows_for(
        '[advisor]\npolicy = "pal"\npack_tolerance = 0.0\n[locality]\nacross_switches = 2.0\n',
        "--placement",
        "advisor,pal",
    )
    # The config's locality penalty applies to every placement unless --locality-penalty says.
    assert rows["advisor"]["avg_jct"] == rows["pal"]["avg_jct"]

    # The table says what its short columns mean, and why the advisor equals packing here
    # (uniform GPUs: nothing is above avoid_above, so packed-pm changes no job).
    path = tmp_path / "default.toml"
    path.write_text("")
    args = ["--trace", trace, "--cluster", "4x4", "--mode", "slurm", "--config", path]
    text = run_cli("sim", "run", *args).output
    assert "FTF: finish-time fairness" in text and "mig: running jobs moved" in text
    assert "note: the advisor changes no job here: no GPU's PM-score is above" in text
    text = run_cli("sim", "run", *args, "--placement", "packed-sticky,pal").output
    assert "the advisor changes no job" not in text  # no advisor row, nothing to explain

    broken = tmp_path / "broken.toml"
    broken.write_text('[advisor]\npolicy = "best"\n')
    bad = run_cli("sim", "run", "--trace", trace, "--config", broken, ok=False)
    assert bad.exit_code == 2 and "valid values: packed-pm, pal" in bad.output


def test_faults_meet_the_served_loop_and_each_run_reports_them(
    run_cli: Callable[..., object],
) -> None:
    args = ["sim", "run", "--poisson", "300", "--load", "40", "--mode", "slurm",
            "--placement", "packed-sticky,advisor"]  # fmt: skip
    result = run_cli(*args, "--faults", "rate=200,factors=2,classes=A/B,loop=oracle", "--json")
    rows = json.loads(result.output)  # type: ignore[attr-defined]
    faults = [row["faults"] for row in rows]
    assert faults[0] == faults[1] or faults[0]["faults"].keys() == faults[1]["faults"].keys()
    assert all(f["loop"] == "oracle" and f["records"] == 300 for f in faults)
    kinds = faults[0]["faults"]
    assert kinds and all(k.startswith("2x ") and k.split()[1] in ("A", "B") for k in kinds)
    table = run_cli(*args, "--faults", "rate=200,factors=2,loop=none")
    assert "advisor/fifo (none loop): 2x A " in table.output  # type: ignore[attr-defined]
    rounds = run_cli("sim", "run", "--poisson", "20", "--faults", "rate=1", ok=False)
    assert rounds.exit_code == 2 and "--faults needs --mode slurm" in rounds.output  # type: ignore[attr-defined]
    bad = run_cli(*args, "--faults", "rate=1,speed=3", ok=False)
    assert bad.exit_code == 2 and "not one of" in bad.output  # type: ignore[attr-defined]


def test_enforced_limits_end_a_job_at_its_limit_and_say_so(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    history = tmp_path / "overrun.sacct"
    history.write_text(
        "JobID|Submit|Start|End|AllocTRES|Timelimit\n"
        "1|2026-01-01T00:00:00|2026-01-01T00:00:00|2026-01-01T02:00:00|gres/gpu=1|01:00:00\n"
        "2|2026-01-01T00:10:00|2026-01-01T00:10:00|2026-01-01T00:40:00|gres/gpu=1|01:00:00\n"
    )
    args = ["sim", "run", "--trace", history, "--cluster", "1x2", "--mode", "slurm",
            "--placement", "packed-sticky"]  # fmt: skip
    plain = json.loads(run_cli(*args, "--json").output)  # type: ignore[attr-defined]
    enforced = json.loads(run_cli(*args, "--enforce-limits", "--json").output)  # type: ignore[attr-defined]
    assert plain[0]["timed_out"] == 0 and enforced[0]["timed_out"] == 1
    assert enforced[0]["makespan"] == 3600.0 and plain[0]["makespan"] == 7200.0
    text = run_cli(*args, "--enforce-limits").output  # type: ignore[attr-defined]
    assert "time limits enforced" in text
    assert "packed-sticky: 1 of 2 jobs ended at their time limit" in text
    rounds = run_cli("sim", "run", "--trace", history, "--enforce-limits", ok=False)
    assert rounds.exit_code == 2 and "--enforce-limits needs --mode slurm" in rounds.output  # type: ignore[attr-defined]


def test_the_simulated_slurm_plans_a_job_past_its_limit_as_the_release_asked_for(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    """Job 1 runs 2 h past its 1 h limit; job 2 (both GPUs) waits for it; job 3 (20 min, its
    limit 30) arrives on the free GPU. 22.05 expects job 1 to run an hour more and starts job 3
    at once; 24.11 counts job 1 gone, plans job 2 now, and job 3 waits behind it."""
    history = tmp_path / "overrun.sacct"
    history.write_text(
        "JobID|Submit|Start|End|AllocTRES|Timelimit\n"
        "1|2026-01-01T00:00:00|2026-01-01T00:00:00|2026-01-01T03:00:00|gres/gpu=1|01:00:00\n"
        "2|2026-01-01T00:10:00|2026-01-01T03:00:00|2026-01-01T03:10:00|gres/gpu=2|01:00:00\n"
        "3|2026-01-01T01:30:00|2026-01-01T01:30:00|2026-01-01T01:50:00|gres/gpu=1|00:30:00\n"
    )
    args = ["sim", "run", "--trace", history, "--cluster", "1x2", "--mode", "slurm",
            "--placement", "packed-sticky", "--json"]  # fmt: skip
    as_2205 = json.loads(run_cli(*args).output)[0]  # type: ignore[attr-defined]
    as_2411 = json.loads(run_cli(*args, "--slurm-release", "24.11").output)[0]  # type: ignore[attr-defined]
    # job 3's JCT: 20 min, or until 3:30 (after job 2, from 3:00 to 3:10, then its 20 min)
    assert as_2411["avg_jct"] - as_2205["avg_jct"] == pytest.approx((120 - 20) * 60 / 3)
    text = run_cli(*args[:-1], "--slurm-release", "24.11").output  # type: ignore[attr-defined]
    assert "Slurm 24.11's backfill" in text
    bad = run_cli(*args, "--slurm-release", "latest", ok=False)
    assert bad.exit_code == 2 and "unknown Slurm release 'latest'" in bad.output  # type: ignore[attr-defined]


def test_the_simulated_backfill_reserves_as_asked(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    """Job 4 (10 h limit) takes the free GPU at once under EASY; reserving nodes for every
    waiting job, as Slurm does, it waits until jobs 2 and 3 have run (one node of four)."""
    history = tmp_path / "queue.sacct"
    history.write_text(
        "JobID|Submit|Start|End|AllocTRES|Timelimit\n"
        "1|2026-01-01T00:00:00|2026-01-01T00:00:00|2026-01-01T01:00:00|gres/gpu=3|02:00:00\n"
        "2|2026-01-01T00:01:00|2026-01-01T01:00:00|2026-01-01T01:05:00|gres/gpu=2|02:00:00\n"
        "3|2026-01-01T00:02:00|2026-01-01T01:00:00|2026-01-01T01:05:00|gres/gpu=2|02:00:00\n"
        "4|2026-01-01T00:03:00|2026-01-01T00:03:00|2026-01-01T00:08:00|gres/gpu=1|10:00:00\n"
    )
    args = ["sim", "run", "--trace", history, "--cluster", "1x4", "--mode", "slurm",
            "--placement", "packed-sticky", "--json"]  # fmt: skip
    easy = json.loads(run_cli(*args).output)[0]  # type: ignore[attr-defined]
    nodes = json.loads(run_cli(*args, "--backfill-reserves", "nodes").output)[0]  # type: ignore[attr-defined]
    # job 4: 5 min, or from 00:03 to 01:10 (after jobs 2 and 3, 01:00-01:05)
    assert nodes["avg_jct"] - easy["avg_jct"] == pytest.approx((67 - 5) * 60 / 4)
    text = run_cli(*args[:-1], "--backfill-reserves", "nodes").output  # type: ignore[attr-defined]
    assert "backfill reserves nodes for every waiting job" in text
    bad = run_cli(*args, "--backfill-reserves", "all", ok=False)
    assert bad.exit_code == 2 and "unknown backfill_reserves 'all'" in bad.output  # type: ignore[attr-defined]
