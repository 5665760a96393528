"""`slurm-pal demo` end to end on the real Slurm: both arms run, the verdict line and the PNG.
No assertion on which arm wins (one run; the README gives the measured spread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.cli.main import app
from tests.helpers.slurm_lab import host_release_only, require_slurm

pytestmark = pytest.mark.slurm


def test_demo_runs_both_arms_and_writes_the_png(tmp_path: Path) -> None:
    host_release_only("the demo runs the host's Slurm")
    require_slurm()
    png = tmp_path / "demo.png"
    result = CliRunner().invoke(
        app, ["demo", "--png", str(png)], env={"SLURM_PAL_CONFIG": None, "SLURM_PAL_DB": None}
    )
    out = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "trace dl, seed 18" in out and "all 16 jobs ended" in out
    # the baseline is the control: the same plugin, hooks and service, serving plain packing
    assert "the control serving policy packed" in out and "policy packed, 32 GPUs" in out
    assert "measured average JCT advisor (packed-pm) / control:" in out
    assert "advisor beat control:" in out or "advisor did not beat control on this run:" in out
    assert "GPU time lost to slow GPUs" in out
    # the tables fit 120 columns; every job in full goes to the file the demo names
    table_lines = [line for line in result.output.splitlines() if "│" in line or "┃" in line]
    assert table_lines and max(len(line) for line in table_lines) <= 120
    details = tmp_path / "slurm-pal-demo-jobs.json"
    assert str(details) in out and {"control", "advisor"} <= set(json.loads(details.read_text()))
    pytest.importorskip("matplotlib")
    assert "(the two arms compared)" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "stopped everything the demo started" in out
