"""`slurm-pal profile ...` end to end: real SQLite store, the example and the Longhorn data."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.cli.main import app
from tests.helpers.data import LONGHORN, LONGHORN_FILES, need_shared


def test_demo_runs_on_embedded_defaults(run_cli) -> None:
    # The live part runs in tests/slurm/test_demo_live.py.
    out = run_cli("demo", "--nodes", "4", "--offline").output
    assert "class A: K=" in out and "PM signatures" in out


def test_the_demo_keeps_its_campaign_in_the_store_slurm_pal_db_names(run_cli) -> None:
    # run_cli sets SLURM_PAL_DB; like --db, it replaces the demo's throw-away store.
    run_cli("demo", "--nodes", "4", "--offline")
    campaigns = json.loads(run_cli("profile", "campaigns", "--json").output)
    assert [c["id"] for c in campaigns] == ["example"]


def test_ingest_bins_show_labels_on_the_example(run_cli, example_csv: Path) -> None:
    out = run_cli("profile", "ingest", example_csv, "--campaign", "ex").output
    assert "created campaign ex" in out and "(now active)" in out
    bins = json.loads(run_cli("profile", "bins", "--json").output)
    assert list(bins) == ["A", "B", "C", "D"]
    for cls, b in bins.items():
        assert set(b) >= {"k", "silhouette", "bins", "outliers"}
        assert sum(x["gpus"] for x in b["bins"]) + len(b["outliers"]) == 64, cls
        scores = [x["score"] for x in b["bins"]]
        assert scores == sorted(scores)
    # The example has two throttled GPUs, the outliers of the compute-bound class.
    assert len(bins["A"]["outliers"]) == 2
    slow = bins["A"]["outliers"][-1]["uuid"]
    shown = json.loads(run_cli("profile", "show", slow, "--json").output)
    assert shown["classes"]["A"]["bin"] == "outlier"
    assert shown["classes"]["A"]["pm_score"] > 2.0
    labels = json.loads(run_cli("profile", "labels", "--json").output)
    assert sum(r["gpus"] for r in labels["labels"]) == 64
    assert shown["label"] in {r["label"] for r in labels["labels"]}
    table = run_cli("profile", "bins").output
    assert "class A: K=" in table and "outlier" in table


def test_pal_artifact_flag_is_recorded(run_cli, example_csv: Path) -> None:
    run_cli("profile", "ingest", example_csv, "--campaign", "art", "--pal-artifact")
    bins = json.loads(run_cli("profile", "bins", "--json").output)
    assert all(b["mode"] == "pal-artifact" for b in bins.values())
    assert "pal-artifact" in run_cli("profile", "campaigns").output


def test_errors_are_one_clear_line_and_exit_2(run_cli, tmp_path: Path, example_csv: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("uuid,node,seconds\nGPU-1,n1,2\n")
    result = run_cli("profile", "ingest", bad, "--class", "A", ok=False)
    assert result.exit_code == 2 and "no duration column" in result.output
    result = run_cli("profile", "ingest", example_csv, "--class", "Q", ok=False)
    assert result.exit_code == 2 and "valid classes: A, B, C, D" in result.output
    result = run_cli("profile", "bins", "--campaign", "c0", ok=False)
    assert result.exit_code == 2 and "no campaign 'c0'" in result.output
    run_cli("profile", "ingest", example_csv, "--campaign", "c1")
    result = run_cli("profile", "ingest", example_csv, "--campaign", "c1", ok=False)
    assert result.exit_code == 2 and "already in campaign 'c1'" in result.output
    result = run_cli("profile", "show", "GPU-nope", ok=False)
    assert result.exit_code == 2 and "not in campaign" in result.output
    result = run_cli("profile", "activate", "zzz", ok=False)
    assert "campaigns: c1" in result.output


@pytest.fixture(scope="module")
def longhorn_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The four Longhorn files ingested once through the CLI; returns the env to reach them."""
    need_shared(*(LONGHORN / f for f in LONGHORN_FILES.values()))
    tmp = tmp_path_factory.mktemp("longhorn")
    config = tmp / "longhorn.toml"
    config.write_text('[classes]\nnames = ["A", "B", "C", "D", "S"]\n')
    env = {"SLURM_PAL_DB": str(tmp / "store.db"), "SLURM_PAL_CONFIG": str(config)}
    runner = CliRunner()
    for cls, name in LONGHORN_FILES.items():
        args = ["profile", "ingest", str(LONGHORN / name), "--class", cls, "--campaign", "lh"]
        result = runner.invoke(app, [*args, "--gpu-model", "v100"], env=env)
        assert result.exit_code == 0, result.output
    return env


def cli(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_longhorn_bins_hold_the_properties_placement_needs(longhorn_store: dict) -> None:
    bins = json.loads(cli(longhorn_store, "profile", "bins", "--json"))
    assert list(bins) == ["A", "B", "D", "S"]
    gpus_per_file = {"A": 336, "B": 136, "D": 172, "S": 392}
    for cls, b in bins.items():
        assert 2 <= b["k"] <= 11, cls
        assert 0 < b["silhouette"] <= 1, cls
        scores = [x["score"] for x in b["bins"]]
        assert scores == sorted(scores) and len(scores) == b["k"]
        assert min(scores) < 1.0 < max(scores), "bins straddle the median GPU"
        assert sum(x["gpus"] for x in b["bins"]) + len(b["outliers"]) == gpus_per_file[cls]
        assert b["measured_gpus"] == gpus_per_file[cls]
        for o in b["outliers"]:  # Longhorn's outliers are slow GPUs, beyond every bin
            assert o["score"] > max(scores)
    # The compute-bound class varies most, the memory-bound one least (PAL paper, Fig. 1).
    spread = {c: b["bins"][-1]["score"] / b["bins"][0]["score"] for c, b in bins.items()}
    assert spread["A"] > spread["B"] and spread["A"] > spread["D"]
    assert len(bins["A"]["outliers"]) >= 3
    # A location id from the resnet file resolves to the GPU, which also has a pagerank score.
    shown = json.loads(cli(longhorn_store, "profile", "show", "c005-4-3", "--json"))
    assert shown["uuid"].startswith("GPU-")
    assert shown["classes"]["A"]["measured"] and shown["classes"]["D"]["measured"]
    labels = json.loads(cli(longhorn_store, "profile", "labels", "--json"))["labels"]
    all_gpus = 608  # the four files' GPUs, once identities are merged across files
    assert sum(r["gpus"] for r in labels) == all_gpus
    assert all(r["label"].startswith("v100-") for r in labels)
    assert set(labels[0]["scores"]) == {"A", "B", "D", "S"}


def test_longhorn_pal_artifact_mode(longhorn_store: dict, tmp_path: Path) -> None:
    env = dict(longhorn_store)
    copy = tmp_path / "artifact.db"
    shutil.copy(env["SLURM_PAL_DB"], copy)
    env["SLURM_PAL_DB"] = str(copy)
    cli(env, "profile", "rebin", "--pal-artifact")
    bins = json.loads(cli(env, "profile", "bins", "--json"))
    for b in bins.values():
        assert b["mode"] == "pal-artifact"
        # K = 2 + one per one-sided outlier, and scores are centroids / median centroid.
        assert b["k"] == 2 + len(b["outliers"])
        assert sum(x["gpus"] for x in b["bins"]) == b["measured_gpus"]
        if b["k"] % 2:
            assert any(abs(x["score"] - 1.0) < 1e-12 for x in b["bins"])


@pytest.mark.parametrize("terminal_columns", [None, 100])
def test_bins_summary_is_one_line_and_gpus_are_counts(
    run_cli, example_csv: Path, monkeypatch: pytest.MonkeyPatch, terminal_columns: int | None
) -> None:
    """In a log and on a 100-column terminal each class's summary stays on one line (it was
    a table title, wrapped to the table's width), and the GPUs column holds only counts: an
    outlier's GPU id has its own column."""
    from rich.console import Console

    from slurm_pal.cli import profile

    run_cli("profile", "ingest", example_csv, "--campaign", "ex")
    if terminal_columns is None:
        out = run_cli("profile", "bins").output
    else:
        terminal = Console(width=terminal_columns, force_terminal=True, record=True)
        monkeypatch.setattr(profile, "console", terminal)
        run_cli("profile", "bins")
        out = terminal.export_text()
    summaries = [line for line in out.splitlines() if line.startswith("class ")]
    assert [s.split(":")[0] for s in summaries] == ["class A", "class B", "class C", "class D"]
    assert all("GPUs measured" in s for s in summaries)
    assert "64 GPUs measured, 2 outlier(s)" in summaries[0]
    rows = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    assert rows and all(cells[2].strip().isdigit() for cells in rows)
    outlier_rows = [cells for cells in rows if cells[0].strip() == "outlier"]
    assert len(outlier_rows) >= 2 and all(c[3].strip().startswith("GPU-") for c in outlier_rows)


def test_gpus_and_show_name_the_gpus_the_advisor_suspects(run_cli, example_csv: Path) -> None:
    from slurm_pal.adapters.store import Store

    run_cli("profile", "ingest", example_csv, "--campaign", "ex")
    gpus = json.loads(run_cli("profile", "gpus", "--json").output)["gpus"]
    uuid = gpus[3]["uuid"]
    assert all(g["suspect"] == [] for g in gpus)
    evidence = [{"job_id": "41", "app": "a", "expected_s": 1.0, "observed_s": 2.0, "residual": 2}]
    with Store(os.environ["SLURM_PAL_DB"]) as store:
        store.open_suspicion(
            "ex",
            {"gpu": uuid, "job_class": "A", "since_s": 1.8e9, "onset_s": 1.8e9 - 60,
             "cause": "runtime", "slowdown": 2.0, "runs": 2, "evidence": evidence},
        )  # fmt: skip
    gpus = json.loads(run_cli("profile", "gpus", "--json").output)["gpus"]
    assert {g["uuid"]: g["suspect"] for g in gpus if g["suspect"]} == {uuid: ["A"]}
    assert "suspect for" in run_cli("profile", "gpus").output
    shown = json.loads(run_cli("profile", "show", uuid, "--json").output)
    assert [(s["job_class"], s["cause"]) for s in shown["suspect"]] == [("A", "runtime")]
    text = run_cli("profile", "show", uuid).output
    assert "suspect for class A since 2027-01-15" in text and "jobs 41" in text
