"""benchmarks/decide_path.py builds the cluster as the service loads it and decides on it: a
short run must route the job (every GPU is free) and print every figure it documents."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import decide_path


def test_a_short_run_routes_and_prints_each_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert decide_path.main(["-n", "30", "--gapped", "3", "--gap-ms", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["action"] == "route"
    for key in ("back_to_back_us", "gapped_us"):
        assert 0 < out[f"{key}_p50"] <= out[f"{key}_p90"]
    assert out["gapped_over_back_to_back"] > 0
