"""Simulated GPUs: PAL's artifact draws (reproduced draw for draw) and measured-GPU sampling."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.core.variability import build_profile
from slurm_pal.sim import SimGpus, artifact_gpus, measured_gpus, uniform_gpus


def test_artifact_draws_replay_python_random_gpu_by_gpu_class_by_class() -> None:
    raw = {"A": [1.0, 2.0, 3.0, 4.0, 50.0], "B": [10.0, 10.0, 20.0]}
    gpus = artifact_gpus(raw, 2, 2, seed=42)
    rng = random.Random(42)
    expected: dict[str, list[float]] = {"A": [], "B": []}
    normalized = {"A": [v / 3.0 for v in raw["A"]], "B": [v / 10.0 for v in raw["B"]]}
    for _ in range(4):
        for name in ("A", "B"):
            expected[name].append(rng.choice(normalized[name]))
    for name in ("A", "B"):
        assert gpus.true_slowdown[name].tolist() == pytest.approx(expected[name])
        # Placement sees few distinct values (K = 2 plus outliers), median bin = 1.0.
        assert len(set(gpus.placement_scores[name].tolist())) <= 3
    assert artifact_gpus(raw, 2, 2, seed=42).true_slowdown["A"].tolist() == (
        gpus.true_slowdown["A"].tolist()
    )


def test_artifact_draws_on_longhorn_put_gpu_35_at_2_83(longhorn: Path) -> None:
    # What pal-artifact-measured.md reports for PAL's simulator (seed 42, profiles.json order).
    files = {"A": "resnet", "B": "bert", "C": "bert", "D": "pagerank"}
    raw = {c: pd.read_csv(longhorn / f"{f}-longhorn-agg.csv")["perf"] for c, f in files.items()}
    gpus = artifact_gpus(raw, 16, 4, seed=42)
    slowest = int(np.argmax(gpus.true_slowdown["A"]))
    assert slowest == 35
    assert gpus.true_slowdown["A"][35] == pytest.approx(2.83, abs=0.005)
    assert gpus.placement_scores["A"][35] == max(gpus.placement_scores["A"])
    # B and C share the BERT file but are independent draws, as in PAL's code.
    assert gpus.true_slowdown["B"].tolist() != gpus.true_slowdown["C"].tolist()


def test_measured_gpus_are_distinct_real_gpus(example_csv: Path) -> None:
    rows = read_campaign_csv(example_csv).rows
    profile = build_profile(rows, ["A", "B", "C", "D"])
    gpus = measured_gpus(profile, 4, 4, seed=3)
    table = profile.gpus
    a_truth = table[table["job_class"] == "A"].set_index("uuid")["norm_value"]
    a_score = table[table["job_class"] == "A"].set_index("uuid")["pm_score"]
    # Every simulated GPU is one campaign GPU: its (truth, score) pair exists, no pair twice.
    pairs = set(zip(a_truth.round(12), a_score.round(12), strict=True))
    drawn = list(
        zip(gpus.true_slowdown["A"].round(12), gpus.placement_scores["A"].round(12), strict=True)
    )
    assert set(drawn) <= pairs
    assert len(set(drawn)) == 16
    again = measured_gpus(profile, 4, 4, seed=3)
    assert again.true_slowdown["B"].tolist() == gpus.true_slowdown["B"].tolist()
    other = measured_gpus(profile, 4, 4, seed=4)
    assert other.true_slowdown["A"].tolist() != gpus.true_slowdown["A"].tolist()
    bigger = measured_gpus(profile, 20, 4, seed=3)  # 80 > 64 measured GPUs: reused
    assert bigger.n_gpus == 80 and "reused" in bigger.source


def test_simgpus_checks_its_tables() -> None:
    with pytest.raises(ValueError, match="need 4"):
        SimGpus(1, 4, {"A": np.ones(3)}, {"A": np.ones(3)})
    with pytest.raises(ValueError, match="same classes"):
        SimGpus(1, 1, {"A": np.ones(1)}, {"B": np.ones(1)})
    specs = uniform_gpus(["A"], 2, 2).specs()
    assert [(s.node, s.index) for s in specs] == [
        ("sim0000", 0),
        ("sim0000", 1),
        ("sim0001", 0),
        ("sim0001", 1),
    ]


def test_artifact_mode_matches_pal_simulators_own_numbers(longhorn: Path) -> None:
    # pal-artifact-measured.md: PAL's simulator gives Packed-Sticky 8.40 h on Sia-Philly
    # workload 1 and Packed-Non-Sticky 0.7 % better (w3: 9.1 % worse, w4: 5.2 % better).
    from slurm_pal.adapters.traces import read_sia_trace
    from slurm_pal.sim import SimConfig, simulate
    from tests.helpers.data import SHARED_DATA, need_shared

    sia = SHARED_DATA / "traces" / "sia-philly"
    need_shared(*(sia / f"workload-{w}.csv" for w in (1, 3, 4)))
    files = {"A": "resnet", "B": "bert", "C": "bert", "D": "pagerank"}
    raw = {c: pd.read_csv(longhorn / f"{f}-longhorn-agg.csv")["perf"] for c, f in files.items()}
    gpus = artifact_gpus(raw, 16, 4, seed=42)
    measured = {1: 0.007, 3: -0.091, 4: 0.052}
    for workload, gain in measured.items():
        jobs = read_sia_trace(sia / f"workload-{workload}.csv")
        jct = {
            p: simulate(jobs, gpus, SimConfig(placement=p, pal_artifact=True)).summary()["avg_jct"]
            for p in ("packed-sticky", "packed-nonsticky")
        }
        if workload == 1:
            assert jct["packed-sticky"] / 3600 == pytest.approx(8.40, abs=0.005)
        assert 1 - jct["packed-nonsticky"] / jct["packed-sticky"] == pytest.approx(gain, abs=5e-4)
