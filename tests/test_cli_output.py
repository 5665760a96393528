"""Output that works in logs and scripts: full values when piped, progress on slow steps, and
the plots (``profile bins --plot``, ``tune --plot``, the log-scale JCT CDF)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.table import Table

from slurm_pal.cli import common, plots
from slurm_pal.cli.common import FullWidthConsole
from slurm_pal.core.workload import poisson_workload
from slurm_pal.sim.engine import SimConfig
from slurm_pal.sim.experiments import run_grid
from slurm_pal.sim.variability import uniform_gpus

LONG = "GPU-" + "0123456789abcdef" * 6


def test_piped_console_prints_tables_in_full() -> None:
    out = io.StringIO()
    piped = FullWidthConsole(file=out)
    assert not piped.is_terminal
    table = Table(title="a long title " * 12)
    for column in ("uuid", "node", "value"):
        table.add_column(column, no_wrap=True)
    table.add_row(LONG, "node-with-a-long-name-0001", "33.3333333333")
    piped.print(table)
    piped.print("a message " * 20, highlight=False)
    text = out.getvalue()
    assert LONG in text and "33.3333333333" in text and "…" not in text
    assert ("a message " * 20).strip() in text  # one line, not wrapped at 80
    # On a terminal nothing changes: rich's own width applies.
    tty = FullWidthConsole(file=io.StringIO(), force_terminal=True, width=60)
    assert tty.size.width == 60


def test_piped_cli_table_keeps_full_values(
    tmp_path: Path, example_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real command into a pipe, as `slurm-pal profile gpus | tee log` runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_PAL_")}
    env.update({"SLURM_PAL_DB": str(tmp_path / "s.db"), "SLURM_PAL_PROGRESS_AFTER_S": "0"})
    env.pop("COLUMNS", None)

    def cli(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "slurm_pal.cli.main", *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=True,
        )

    ingest = cli("profile", "ingest", example_csv)
    # Every step of the ingest said what it was doing (threshold 0: every step is "slow").
    for text in ("reading", "storing", "binning", "done in"):
        assert text in ingest.stderr, ingest.stderr
    listing = cli("profile", "gpus")
    assert "…" not in listing.stdout
    uuids = [
        w for line in listing.stdout.splitlines() for w in line.split() if w.startswith("GPU-")
    ]
    assert len(uuids) == 64 and all(len(u) == 40 for u in uuids)
    assert max(len(line) for line in listing.stdout.splitlines()) > 80


def test_log_progress_lines_for_steps_and_bars(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(common.PROGRESS_AFTER_ENV, "0")
    with common.steps() as progress:
        progress("reading a.csv")
        progress("binning")
    with common.progress_bar("simulating", 3) as advance:
        for _ in range(3):
            advance()
    err = capsys.readouterr().err
    assert "reading a.csv ..." in err and "reading a.csv: done in" in err
    assert "binning: done in" in err
    assert "simulating: 1/3" in err and "simulating: 3/3 done in" in err
    # A large threshold keeps short steps out of the log.
    monkeypatch.setenv(common.PROGRESS_AFTER_ENV, "1e9")
    with common.step("quick"):
        pass
    assert capsys.readouterr().err == ""


def test_jct_cdf_has_a_log_time_axis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    jobs = poisson_workload(40, 20.0, seed=1)
    gpus = uniform_gpus(["A", "B", "C", "D"], 4, 4)
    results = run_grid(jobs, gpus, [SimConfig(placement="packed-sticky", mode="slurm")])
    scales: dict[str, str] = {}
    save = plots._save

    def spy(plt: Any, figure: Any, path: Path) -> Path:
        scales[path.name] = figure.axes[0].get_xscale()
        return save(plt, figure, path)

    monkeypatch.setattr(plots, "_save", spy)
    written = plots.sim_plots(results, tmp_path)
    assert [p.name for p in written] == ["jct_cdf_fifo.png", "gpus_in_use_fifo.png"]
    assert scales == {"jct_cdf_fifo.png": "log", "gpus_in_use_fifo.png": "linear"}
    assert all(p.stat().st_size > 10_000 for p in written)


def _png_size(path: Path) -> tuple[int, int]:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    return image.shape[1], image.shape[0]


def test_profile_bins_plot(run_cli: Callable[..., Any], example_csv: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run_cli("profile", "ingest", example_csv, "--campaign", "ex")
    result = run_cli("profile", "bins", "--plot", tmp_path / "plots")
    path = tmp_path / "plots" / "bins-ex.png"
    assert f"wrote {path}" in result.stdout
    width, height = _png_size(path)
    assert width > 600 and height > 4 * 200  # one panel per class (4 classes)


def test_tune_plot(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = run_cli(
        "tune",
        "--poisson",
        "30",
        "--cluster",
        "2x4",
        "--seeds",
        "2",
        "--placement",
        "pal",
        "--penalties",
        "1.7",
        "--workers",
        "1",
        "--plot",
        tmp_path / "plots",
    )
    path = tmp_path / "plots" / "tune.png"
    assert f"wrote {path}" in result.stdout
    width, height = _png_size(path)
    assert width > 600 and height > 150


def test_hint_of_site_render_names_a_command_that_lists_the_nodes(
    run_cli: Callable[..., Any], example_csv: Path, tmp_path: Path
) -> None:
    """`site render --nodes` with a node the campaign lacks points at `profile gpus`, which
    exists and lists that campaign's GPUs per node."""
    run_cli("profile", "ingest", example_csv, "--campaign", "ex")
    result = run_cli("site", "render", "--out", tmp_path / "site", "--nodes", "nope01", ok=False)
    assert result.exit_code == 2 and "'slurm-pal profile gpus'" in result.stderr
    listing = json.loads(run_cli("profile", "gpus", "--node", "node01", "--json").stdout)
    assert listing["campaign"] == "ex"
    assert [g["gpu_index"] for g in listing["gpus"]] == [0, 1, 2, 3]
    assert {g["node"] for g in listing["gpus"]} == {"node01"}
    assert all(g["label"] and g["measured"] == ["A", "B", "C", "D"] for g in listing["gpus"])
    result = run_cli("profile", "gpus", "--node", "nope01", ok=False)
    assert result.exit_code == 2 and "nope01 have no GPUs in campaign 'ex'" in result.stderr
