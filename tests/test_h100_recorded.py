"""The classification path on what the project's code recorded on real H100s.

Files: ``shared/data/gpu-h100/`` (see its README): ncu CSVs of ``gemm.py``/``stream.py``,
the NVML sampler's summaries and the hooks' records, and per-second GPM readings of
minutes of sustained GEMM/STREAM. Nothing here runs on a GPU: the sampler is fed the
recorded per-second readings through the fake at the pynvml boundary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.fake_pynvml import FakeClock, FakeGpu, FakePynvml

from slurm_pal.adapters.ncu import application_features, read_ncu_csv
from slurm_pal.adapters.nvml import NvmlSampler
from tests.helpers.data import SHARED_DATA, need_shared
from tests.helpers.ncu import ncu_features as ncu_of

H100 = SHARED_DATA / "gpu-h100"
NCU_POINTS = 5.0  # how close busy-time NVML figures must come to ncu's, in percent points


@pytest.fixture(scope="module")
def h100() -> Path:
    need_shared(H100 / "README.md")
    return H100


def ncu_features(h100: Path, kind: str, kernel_prefix: str | None = None):
    return ncu_of(h100 / "ncu" / f"ncu-{kind}-h100.details.csv", kernel_prefix)


# --------------------------------------------------------------------------------------------
# The ncu reader on all six recorded CSVs


README_FIGURES = {  # file -> (layout, DRAM %, FU %) as the README gives them (one decimal)
    "ncu-gemm-h100.details.csv": ("details", 24.2, 93.0),
    "ncu-gemm-h100.raw.csv": ("raw", 24.2, 93.0),
    "ncu-stream-h100.details.csv": ("details", 87.6, 9.0),
    "ncu-stream-h100.raw.csv": ("raw", 87.6, 9.0),
}


@pytest.mark.parametrize("name", sorted(README_FIGURES))
def test_metric_pages_give_the_readme_figures(h100, name) -> None:
    layout, dram, fu = README_FIGURES[name]
    report = read_ncu_csv(h100 / "ncu" / name)
    assert report.layout == layout and report.errors == ()
    assert [k.launch_id for k in report.kernels] == list(range(10))
    assert len({k.process_id for k in report.kernels}) == 1
    features = application_features([report])
    assert features.dram_util == pytest.approx(dram, abs=0.06)
    assert features.fu_util == pytest.approx(fu, abs=0.06)
    assert features.fu_source.startswith("pipe:")  # a real FU pipe figure, not SM throughput
    assert features.dram_source == "dram__throughput.avg.pct_of_peak_sustained_elapsed"


def test_speed_of_light_section_maps_display_names_and_converts_ns(h100) -> None:
    report = read_ncu_csv(h100 / "ncu" / "ncu-gemm-h100.speedoflight-section.csv")
    assert report.layout == "details" and [k.launch_id for k in report.kernels] == list(range(6))
    for kernel in report.kernels:  # every figure came from a display name, none from a raw row
        assert kernel.from_display == {
            "gpu__time_duration.sum",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        }
    # "Duration","ns","212,576": thousands separators read, kept in ns; the same GEMM kernel
    # (4096^3 fp16) took the same time under the details run's --metrics.
    details = read_ncu_csv(h100 / "ncu" / "ncu-gemm-h100.details.csv")

    def gemm_ns(r) -> list[float]:  # type: ignore[no-untyped-def]
        return sorted(k.duration_ns for k in r.kernels if k.kernel_name.startswith("nvjet"))

    section = gemm_ns(report)
    assert section[-1] == 212576.0
    assert abs(section[len(section) // 2] / gemm_ns(details)[4] - 1) < 0.02
    features = application_features([report])
    assert "SM throughput only" in features.fu_source
    assert abs(features.dram_util - application_features([details]).dram_util) < NCU_POINTS


def test_two_process_profile_keeps_both_processes_and_their_launch_ids(h100) -> None:
    path = h100 / "ncu" / "ncu-two-processes-h100.details.csv"
    assert sum(line.startswith('"ID",') for line in path.read_text().splitlines()) == 1
    report = read_ncu_csv(path)
    by_process: dict[int, list[int]] = {}
    for kernel in report.kernels:
        by_process.setdefault(kernel.process_id, []).append(kernel.launch_id)
    assert sorted(by_process.values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # continued, not restarted
    assert len({k.key for k in report.kernels}) == 8
    features = application_features([report])
    assert features.measurements == 8  # both processes' launches weighted together
    assert features.weight_total == pytest.approx(sum(k.duration_ns for k in report.kernels))


# --------------------------------------------------------------------------------------------
# Busy-time telemetry: idle seconds must not dilute the figures


def _gpm(row: dict) -> dict[str, float]:
    """One recorded second as the GPM metrics the sampler asks for (INTEGER/FP64 were not
    recorded: the fake reports them NOT_SUPPORTED, as NVML does for a missing metric)."""
    return {
        "NVML_GPM_METRIC_DRAM_BW_UTIL": row["dram"],
        "NVML_GPM_METRIC_FP16_UTIL": row["fp16"],
        "NVML_GPM_METRIC_FP32_UTIL": row["fp32"],
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": row["tensor"],
        "NVML_GPM_METRIC_GRAPHICS_UTIL": row["gr"],
    }


def _idle_second(h100: Path) -> dict[str, float]:
    """A second of the idle job 103. Its summary keeps only the means (DRAM 0.0006 %, FU 0);
    the graphics engine of a GPU that ran nothing is taken as 0 % busy."""
    idle = json.loads((h100 / "nvml" / "sampler-job103.json").read_text())
    assert idle["fu_util"] == 0.0 and idle["dram_util"] < 0.01
    return {
        "NVML_GPM_METRIC_DRAM_BW_UTIL": idle["dram_util"],
        "NVML_GPM_METRIC_FP16_UTIL": 0.0,
        "NVML_GPM_METRIC_FP32_UTIL": 0.0,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 0.0,
        "NVML_GPM_METRIC_GRAPHICS_UTIL": 0.0,
    }


def sample_job(h100: Path, kind: str, idle_share: float, *, busy_weighting: bool = True):
    """The sampler over a job of idle seconds around the recorded busy seconds."""
    rows = json.loads((h100 / "sustained" / f"{kind}-per-second.json").read_text())["rows"]
    busy = [_gpm(r) for r in rows]
    if not busy_weighting:  # what the sampler did before: no busy share measured
        busy = [{k: v for k, v in s.items() if "GRAPHICS" not in k} for s in busy]
    idle = _idle_second(h100)
    if not busy_weighting:
        idle = {k: v for k, v in idle.items() if "GRAPHICS" not in k}
    n_idle = round(len(busy) * idle_share / (1 - idle_share))
    seconds = [idle] * (n_idle // 2) + busy + [idle] * (n_idle - n_idle // 2)
    clock = FakeClock()
    fake = FakePynvml([FakeGpu(index=0, uuid="GPU-h100", gpm_intervals=seconds)])
    sampler = NvmlSampler(fake, sleep=clock.sleep, monotonic=clock.monotonic)
    job = sampler.sample_job([0], duration_s=len(seconds), interval_s=1.0)
    assert job.ok, job.all_errors()
    assert job.features is not None
    return job.features


IDLE_SHARES = (0.0, 0.3, 0.6, 0.9)


@pytest.mark.parametrize("idle_share", IDLE_SHARES)
def test_gemm_busy_time_figures_match_ncu_whatever_the_idle_share(h100, idle_share) -> None:
    ncu = ncu_features(h100, "gemm")
    nvml = sample_job(h100, "gemm", idle_share)
    assert abs(nvml.dram_util - ncu.dram_util) < NCU_POINTS
    assert abs(nvml.fu_util - ncu.fu_util) < NCU_POINTS
    assert nvml.busy_fraction == pytest.approx(1 - idle_share, abs=0.02)
    assert "over busy time" in nvml.dram_source


@pytest.mark.parametrize("idle_share", IDLE_SHARES)
def test_stream_busy_time_figures_match_ncu_whatever_the_idle_share(h100, idle_share) -> None:
    nvml = sample_job(h100, "stream", idle_share)
    assert abs(nvml.dram_util - ncu_features(h100, "stream").dram_util) < NCU_POINTS
    # ncu's whole-profile FU (9.0 %) is set by the two random-number kernels that fill the
    # arrays (62 % ALU, 11 % of a 5-triad profile's kernel time); minutes of triads are the
    # triad kernel only, so its FU is the one to compare (ncu: 2.4 % FMA).
    triad = ncu_features(h100, "stream", "void vectorized_elementwise_kernel")
    assert abs(nvml.fu_util - triad.fu_util) < NCU_POINTS
    assert nvml.busy_fraction == pytest.approx(1 - idle_share, abs=0.02)


@pytest.mark.parametrize("kind", ["gemm", "stream"])
def test_whole_window_means_miss_ncu_once_a_third_is_idle(h100, kind) -> None:
    """The comparison above can fail: without the busy share, idle time drags figures down."""
    ncu = ncu_features(h100, kind)
    diluted = sample_job(h100, kind, 0.3, busy_weighting=False)
    assert diluted.busy_fraction is None
    assert "whole window" in diluted.dram_source
    assert max(ncu.dram_util - diluted.dram_util, ncu.fu_util - diluted.fu_util) > NCU_POINTS


def test_an_idle_job_keeps_its_whole_window_figures(h100) -> None:
    idle = _idle_second(h100)
    clock = FakeClock()
    fake = FakePynvml([FakeGpu(index=0, uuid="GPU-h100", gpm_intervals=[idle])])
    job = NvmlSampler(fake, sleep=clock.sleep, monotonic=clock.monotonic).sample_job(
        [0], duration_s=5, interval_s=1.0
    )
    assert job.features is not None
    assert job.features.busy_fraction == 0.0
    assert job.features.fu_util == 0.0
    assert "idle throughout" in job.features.fu_source


# --------------------------------------------------------------------------------------------
# apps classify / fit on the recorded files


@pytest.fixture
def two_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "site.toml"
    config.write_text('[classes]\nnames = ["A", "B"]\ndefault = "A"\n')
    monkeypatch.setenv("SLURM_PAL_CONFIG", str(config))
    return config


def classify(run_cli, path: Path, app: str) -> dict:
    return json.loads(run_cli("apps", "classify", path, "--app", app, "--json").output)


@pytest.mark.parametrize(
    "name",
    [
        "nvml/sampler-job101.json",
        "nvml/epilog-record.json",
        "ncu/ncu-gemm-h100.speedoflight-section.csv",
    ],
)
def test_classify_accepts_what_the_project_wrote_on_the_h100(run_cli, h100, name) -> None:
    result = run_cli("apps", "classify", h100 / name, "--app", "job")
    assert result.exit_code == 0
    assert "DRAM" in result.output


def test_section_csv_reads_display_names_and_says_fu_is_sm_throughput(run_cli, h100) -> None:
    out = classify(run_cli, h100 / "ncu" / "ncu-gemm-h100.speedoflight-section.csv", "gemm")
    assert out["measurements"] == 6  # launches, each with Duration in ns
    assert "SM throughput only" in out["fu_source"]
    assert "'DRAM Throughput'" in out["dram_source"]
    # same program as the details page's 8192^3-free profile: compute-bound, DRAM ~ a quarter
    assert out["fu_util"] > 80 and 15 < out["dram_util"] < 35


def test_prolog_record_is_refused_with_a_pointer_to_the_epilog(run_cli, h100) -> None:
    result = run_cli(
        "apps", "classify", h100 / "nvml" / "prolog-record.json", "--app", "x", ok=False
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "prolog-record.json" in lines[0] and "Epilog" in lines[0]


def test_two_site_classes_gemm_a_stream_b_and_other_files_follow(
    run_cli, h100, two_classes
) -> None:
    classify(run_cli, h100 / "ncu" / "ncu-gemm-h100.details.csv", "gemm")
    classify(run_cli, h100 / "ncu" / "ncu-stream-h100.details.csv", "stream")
    fit = json.loads(run_cli("apps", "fit", "--json").output)
    classes = {row["class"]: row["apps"] for row in fit["classes"]}
    assert classes == {"A": ["gemm"], "B": ["stream"]}

    same_programs = {
        "nvml/sampler-job101.json": "A",  # gemm.py fp16
        "nvml/sampler-job104.json": "A",  # gemm.py fp32
        "nvml/sampler-job102.json": "B",  # stream.py
        "ncu/ncu-gemm-h100.speedoflight-section.csv": "A",
        "ncu/ncu-stream-h100.raw.csv": "B",
        "ncu/ncu-gemm-h100.raw.csv": "A",
    }
    for name, expected in same_programs.items():
        out = classify(run_cli, h100 / name, name.replace("/", "-").replace(".", "-"))
        assert out["class"] == expected, (name, out)
    # The Epilog record's telemetry (DRAM 14.6 / FU 55.0 over its window) is GEMM-like; it
    # lands with the GEMM sampler file.
    epilog = classify(run_cli, h100 / "nvml" / "epilog-record.json", "epilog-job")
    gemm_sampler = classify(run_cli, h100 / "nvml" / "sampler-job101.json", "gemm-sampler")
    assert epilog["class"] == gemm_sampler["class"] == "A"


def test_fit_makes_one_class_of_one_measurement_stored_twice_and_says_so(
    run_cli, h100, two_classes
) -> None:
    # the same GEMM profile stored under two names is one behaviour, not two
    classify(run_cli, h100 / "ncu" / "ncu-gemm-h100.details.csv", "gemm")
    classify(run_cli, h100 / "ncu" / "ncu-gemm-h100.details.csv", "gemm-again")
    result = run_cli("apps", "fit", "--json")
    fitted = json.loads(result.stdout)
    assert [c["class"] for c in fitted["classes"]] == ["A"]
    assert fitted["classes"][0]["apps"] == ["gemm", "gemm-again"]
    assert "2 classes asked, but the 2 application(s) show 1 distinct behaviour(s)" in (
        result.stderr
    )


# --------------------------------------------------------------------------------------------
# campaign collect, profile bins and diff on the recorded H100 campaign


def _recorded_campaign(h100: Path, root: Path) -> Path:
    import shutil

    directory = root / "h100x"
    shutil.copytree(h100 / "campaign-h100x", directory)
    return directory


def test_recorded_campaign_collects_and_bins_as_measured(run_cli, h100, tmp_path) -> None:
    root = tmp_path / "campaigns"
    _recorded_campaign(h100, root)
    report = json.loads(run_cli("campaign", "collect", "h100x", "--root", root, "--json").output)
    assert report["complete"] and report["ok_runs"] == 36 and report["disagreements"] == []
    # The runner that recorded these wrote no clock-event readings: unknown, not clean.
    assert report["slowdowns"] == []
    assert [(u["node"], u["runs"]) for u in report["clock_events_unknown"]] == [
        (f"g{i}", 6) for i in range(1, 7)
    ]
    bins = json.loads(run_cli("profile", "bins", "--json").output)
    gemm, stream = bins["A"], bins["C"]
    assert (gemm["k"], gemm["measured_gpus"], gemm["outliers"]) == (2, 6, [])
    assert gemm["silhouette"] == pytest.approx(0.71, abs=0.005)
    assert [(b["score"], b["gpus"]) for b in gemm["bins"]] == [
        (pytest.approx(0.9938, abs=5e-5), 3),
        (pytest.approx(1.0099, abs=5e-5), 3),
    ]
    assert (stream["k"], [b["gpus"] for b in stream["bins"]], stream["outliers"]) == (1, [6], [])


def _as_the_current_runner_writes(directory: Path, hot: str, events: dict[str, float]) -> None:
    """Give every record the clock-event readings today's runner writes (GEMM power-capped
    throughout, STREAM unthrottled, as ``sustained/`` shows) and one run a cooling fault."""
    for path in sorted((directory / "results").glob("*.json")):
        record = json.loads(path.read_text())
        record["clock_events"] = {"sw_power_cap": 1.0} if record["job_class"] == "A" else {}
        record["clock_event_samples"] = 20
        if path.name == hot:
            record["clock_events"] = events
        path.write_text(json.dumps(record))


def test_a_gpu_that_ran_hot_is_reported_by_collect_diff_and_suggest(
    run_cli, h100, tmp_path
) -> None:
    root = tmp_path / "campaigns"
    directory = _recorded_campaign(h100, root)
    run_cli("campaign", "collect", "h100x", "--root", root)  # as recorded: no readings
    _as_the_current_runner_writes(
        directory,
        "g3__gpu0__A__r1.json",
        {"sw_power_cap": 1.0, "sw_thermal": 0.4, "hw_slowdown": 0.1},
    )
    out = run_cli("campaign", "collect", "h100x", "--root", root, "--as", "hot")
    assert out.exit_code == 0  # ingested as measured; the fault is reported
    text = " ".join(out.output.split())
    assert "thermal or hardware clock slowdowns" in text
    assert "campaign plan --only g3:0" in text
    again = run_cli("campaign", "collect", "h100x", "--root", root, "--as", "hot", "--json")
    report = json.loads(again.output)
    assert report["unchanged"] and report["clock_events_unknown"] == []
    (slow,) = report["slowdowns"]
    assert (slow["node"], slow["gpu_index"], slow["events"]) == (
        "g3",
        0,
        ["hw_slowdown", "sw_thermal"],
    )
    assert (slow["runs"], slow["of_runs"], slow["classes"]) == (1, 6, ["A"])

    diff = json.loads(run_cli("campaign", "diff", "h100x", "hot", "--json").output)
    old, new = diff["clock_events"]["old"], diff["clock_events"]["new"]
    assert (old["status"], old["slowdowns"], len(old["unknown_gpus"])) == ("unknown", [], 6)
    assert (new["status"], new["unknown_gpus"], new["runs"]) == ("known", [], 36)
    assert len(new["clean_gpus"]) == 5  # power-capped GEMM and unthrottled STREAM: clean
    (hot,) = new["slowdowns"]
    assert (hot["node"], hot["uuid"], hot["events"], hot["max_share"]) == (
        "g3",
        slow["uuid"],
        ["hw_slowdown", "sw_thermal"],
        0.4,
    )
    assert diff["bin_changes"] == [] and diff["label_changes"] == []  # same durations
    shown = " ".join(run_cli("campaign", "diff", "h100x", "hot").output.split())
    assert "1 GPU(s) hit thermal or hardware clock slowdowns" in shown
    assert "slowdowns in h100x: unknown" in shown  # not shown as clean
    assert "slowdowns in hot: 1 GPU(s)" in shown
    row = next(line for line in run_cli("campaign", "diff", "h100x", "hot").output.splitlines()
               if "g3" in line)  # fmt: skip
    assert "unknown" in row and row.index("unknown") < row.index("hw_slowdown")  # old, new

    suggest = json.loads(run_cli("campaign", "suggest", "--campaign", "hot", "--json").output)
    assert [s["uuid"] for s in suggest["clock_events"]["slowdowns"]] == [slow["uuid"]]
    assert "--only g3:0" in suggest["slowdown_plan"]
    old_suggest = run_cli("campaign", "suggest", "--campaign", "h100x", "--json").output
    assert json.loads(old_suggest)["clock_events"]["status"] == "unknown"
    assert json.loads(old_suggest)["slowdown_plan"] is None
