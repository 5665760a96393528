"""What the project's code wrote on a real H200 (``tests/fixtures/gpu-h200``, see its README):
the benchmarks' warm-up + measure window under the campaign runner with its windowed NVML
telemetry, the Prolog/Epilog hooks' busy-time sampler records, Nsight Compute on the same
benchmarks, per-second GPM readings, and the hooks' records under a real slurmd (``slurm/``).
Nothing here runs on a GPU: these tests hold the code that reads those files to what the GPU
wrote.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from slurm_pal.advisor.suspects import gpu_signals_from
from slurm_pal.core.suspicion import CAP_EXCUSES
from tests.helpers.ncu import ncu_features

H200 = Path(__file__).parent / "fixtures" / "gpu-h200"
UNDER_SLURM = H200 / "slurm"
NCU_POINTS = 5.0  # how close busy-time NVML figures must come to ncu's, in percent points


def records(campaign: str, job_class: str) -> list[dict]:
    paths = sorted((H200 / campaign / "results").glob(f"*__{job_class}__*.json"))
    return [json.loads(p.read_text()) for p in paths]


def epilog(job: int) -> dict:
    return json.loads((H200 / "hooks" / f"{job}.g1.epilog.json").read_text())


def ncu(kind: str, kernel_prefix: str | None = None):
    return ncu_features(H200 / "ncu" / f"ncu-{kind}.details.csv", kernel_prefix)


def test_the_runner_timed_the_window_and_read_telemetry_over_it_only() -> None:
    for job_class in "AC":
        for record in records("campaign-window", job_class):
            assert record["status"] == "ok" and record["telemetry_window"] == "measured"
            # sampled from PAL_MEASURE_START on: ~2 readings a second over the 20 s window
            assert 35 <= record["telemetry_samples"] <= 50
            assert record["measure_start_s"] > 10  # start-up and warm-up left out
    gemm, stream = records("campaign-window", "A"), records("campaign-window", "C")
    assert [r["clock_events"] for r in gemm] == [{"sw_power_cap": 1.0}] * 3
    assert [r["clock_events"] for r in stream] == [{}] * 3
    assert all(r["sm_clock_mhz"] < 1500 for r in gemm)  # at the power limit, not at 1980
    assert all(r["sm_clock_mhz"] == 1980 for r in stream)


def test_a_power_capped_gemm_campaign_collects_as_clean(run_cli, tmp_path: Path) -> None:
    root = tmp_path / "campaigns"
    shutil.copytree(H200 / "campaign-window", root / "check-window")
    report = json.loads(
        run_cli("campaign", "collect", "check-window", "--root", root, "--json").output
    )
    assert report["complete"] and report["ok_runs"] == 6
    # software power capping is the variability PM-scores measure, not a fault
    assert report["slowdowns"] == [] and report["clock_events_unknown"] == []
    assert report["disagreements"] == []


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.mean(values)


def test_the_window_is_steadier_than_a_short_run_and_measures_what_a_job_sees() -> None:
    window = [r["duration_s"] for r in records("campaign-window", "A")]
    short = [r["duration_s"] for r in records("campaign-short", "A")]
    assert cv(window) < cv(short)
    # a 0.3 s GEMM run catches the GPU before its power limit bites: faster than a job sees it
    assert statistics.mean(short) < statistics.mean(window)
    assert all(r["clock_events"]["sw_power_cap"] < 1 for r in records("campaign-short", "A"))


@pytest.mark.parametrize(("job", "kind", "kernel"), [(101, "gemm", None), (102, "stream", "void")])
def test_busy_time_figures_of_the_epilog_records_come_within_points_of_ncu(
    job: int, kind: str, kernel: str | None
) -> None:
    telemetry = epilog(job)["telemetry"]
    # the window held the job's start-up: a quarter of it idle
    assert 0.6 < telemetry["busy_fraction"] < 0.9
    assert "over busy time" in telemetry["dram_source"]
    # STREAM: the triad kernel only; the two random-number fills dominate ncu's short profile
    reference = ncu(kind, "void vectorized_elementwise_kernel" if kernel else None)
    assert abs(telemetry["dram_util"] - reference.dram_util) < NCU_POINTS
    assert abs(telemetry["fu_util"] - reference.fu_util) < NCU_POINTS


def test_the_epilog_signals_excuse_the_gemm_clock_and_not_the_stream_one() -> None:
    gemm = gpu_signals_from(epilog(101)["gpu_signals"]["0"])
    stream = gpu_signals_from(epilog(102)["gpu_signals"]["0"])
    assert gemm.power_capped >= CAP_EXCUSES and gemm.sm_clock_mhz < 1500
    assert stream.power_capped == 0 and stream.sm_clock_mhz == stream.sm_clock_max_mhz == 1980


def test_classes_fitted_on_the_epilog_records_split_gemm_from_stream(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "site.toml"
    config.write_text('[classes]\nnames = ["A", "B"]\ndefault = "A"\n')
    monkeypatch.setenv("SLURM_PAL_CONFIG", str(config))
    for job, app in ((101, "gemm"), (102, "stream"), (103, "idle"), (104, "gemm-fp32")):
        run_cli("apps", "classify", H200 / "hooks" / f"{job}.g1.epilog.json", "--app", app)
    fit = json.loads(run_cli("apps", "fit", "--json").output)
    classes = {row["class"]: row["apps"] for row in fit["classes"]}
    assert classes == {"A": ["gemm", "gemm-fp32"], "B": ["idle", "stream"]}


def test_gpm_reads_nothing_idle_and_the_busy_share_under_load() -> None:
    for kind in ("stream", "gemm"):
        doc = json.loads((H200 / "gpm" / f"gpm-{kind}.json").read_text())
        idle = [r for r in doc["readings"] if r["phase"] == "idle"]
        measured = [r for r in doc["readings"] if r["phase"] == "measure"][:-1]  # last: the end
        assert idle and all(r["GRAPHICS_UTIL"] == 0 and r["sm_clock_mhz"] < 500 for r in idle)
        assert measured and all(r["GRAPHICS_UTIL"] > 99 for r in measured)
    stream = json.loads((H200 / "gpm" / "gpm-stream.json").read_text())
    busy = [r for r in stream["readings"] if r["phase"] == "measure"][:-1]
    # what the sampler takes as STREAM's FU figure: INTEGER_UTIL, the largest unit metric
    assert all(3 < r["INTEGER_UTIL"] < 5 and r["ANY_TENSOR_UTIL"] < 1 for r in busy)


@pytest.mark.parametrize(("job", "alone"), [(1, 101), (2, 102)])
def test_under_slurm_the_hooks_read_what_they_read_without_it(job: int, alone: int) -> None:
    """The same benchmark, its sampler started by slurmd's Prolog instead of by hand: the same
    busy-time figures within a point, and the same clock signals."""
    under = json.loads((UNDER_SLURM / f"{job}.epilog.json").read_text())
    for key in ("dram_util", "fu_util"):
        assert abs(under["telemetry"][key] - epilog(alone)["telemetry"][key]) < 1.0
    signals = gpu_signals_from(under["gpu_signals"]["0"])
    reference = gpu_signals_from(epilog(alone)["gpu_signals"]["0"])
    assert (signals.power_capped >= CAP_EXCUSES) is (reference.power_capped >= CAP_EXCUSES)
    assert signals.sm_clock_mhz == pytest.approx(reference.sm_clock_mhz, abs=40)


def test_under_slurm_the_prolog_named_the_gpu_labels_json_maps_its_slurm_index_to() -> None:
    labels = json.loads((UNDER_SLURM / "labels.json").read_text())["nodes"]["n01"]
    environment = json.loads((UNDER_SLURM / "prolog-env.json").read_text())
    for job in (1, 2):
        prolog = json.loads((UNDER_SLURM / f"{job}.prolog.json").read_text())
        assert prolog["slurm_gpus"] == [labels[0]["slurm_index"]]
        assert prolog["uuids"] == [labels[0]["uuid"]] == [environment["gpu_uuid_nvml"]]
    assert "CUDA_VISIBLE_DEVICES=0" in environment["gemm_prolog_env"]
    decisions = json.loads((UNDER_SLURM / "decisions.json").read_text())
    assert [(d["job_id"], d["answer"]["action"], d["answer"]["class"]) for d in decisions] == [
        (1, "pass", "A"),
        (2, "pass", "C"),
    ]
