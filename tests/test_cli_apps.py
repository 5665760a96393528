"""`slurm-pal apps ...` end to end: real store, real ncu samples; bad input stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_pal.adapters.ncu import application_features, read_ncu_csv
from slurm_pal.adapters.store import Store
from slurm_pal.cli.apps import detect_source, short_fu_source
from slurm_pal.core.resolve import JobRecord
from tests.helpers.data import NCU, need_shared

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
SHARED_NCU = NCU

DETAILS15 = FIXTURES / "details15-two-processes.csv"
DETAILS21 = FIXTURES / "details21-rules-smsp.csv"
DETAILS12 = FIXTURES / "details12-old-preamble.csv"
RAW = FIXTURES / "raw-page.csv"
NO_TABLE = FIXTURES / "no-table-error.csv"

DMON = """\
#Entity   TENSO  DRAMA  FP64A  FP32A  FP16A
ID
GPU 0     0.100  0.600  0.000  0.300  0.000
GPU 0     0.700  0.400  0.000  0.200  0.000
"""
EXPORTER = """\
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-aaaa",Hostname="node01"} 0.8
DCGM_FI_PROF_PIPE_FP32_ACTIVE{gpu="0",UUID="GPU-aaaa",Hostname="node01"} 0.1
"""


def shared_sample(name: str) -> Path:
    path = SHARED_NCU / name
    need_shared(path)
    return path


def classify(run_cli, path: Path, app: str, *extra: str, ok: bool = True):
    result = run_cli("apps", "classify", path, "--app", app, "--json", *extra, ok=ok)
    return json.loads(result.output) if ok else result


def stored(run_cli) -> list[dict]:
    return json.loads(run_cli("apps", "list", "--json").stdout)


def nvml_record(dram: float, fu: float, seconds: float) -> dict:
    return {
        "dram_util": dram,
        "fu_util": fu,
        "source": "nvml",
        "dram_source": "nvml-gpm DRAM_BW_UTIL",
        "fu_source": "nvml-gpm max(FP16,FP32,FP64,INTEGER,ANY_TENSOR)_UTIL",
        "measurements": int(seconds),
        "weight_total": seconds,
        "weight_unit": "s",
    }


# --------------------------------------------------------------------------------------------
# The happy path on real samples and the fixtures


def test_classify_real_samples_then_fit_then_classify_with_the_model(run_cli) -> None:
    dropout = shared_sample("dropout-162-launches.csv")
    llm = shared_sample("llm-kernel-rtx5090.details.csv")

    first = classify(run_cli, dropout, "dropout")
    expected = application_features([read_ncu_csv(dropout)])
    assert first["app"] == "dropout" and first["source"] == "ncu"
    assert first["dram_util"] == pytest.approx(expected.dram_util)
    assert first["fu_util"] == pytest.approx(expected.fu_util)
    assert 0 <= first["fu_util"] <= 100 and first["measurements"] == 162  # not 2429 %
    assert first["fu_source"].startswith("sm__throughput") and "fallback" in first["fu_source"]
    assert first["class"] is None and "apps fit" in first["message"]

    classify(run_cli, llm, "llm-attn")
    classify(run_cli, DETAILS15, "gemm-2rank")
    classify(run_cli, DETAILS12, "sgemm-old")
    fitted = json.loads(run_cli("apps", "fit", "--n-classes", "3", "--json").output)
    assert [c["class"] for c in fitted["classes"]] == ["A", "B", "C"]
    scores = [c["fu_util"] - c["dram_util"] for c in fitted["classes"]]
    assert scores == sorted(scores, reverse=True)  # A is the most compute-bound
    assert sorted(a for c in fitted["classes"] for a in c["apps"]) == sorted(
        ["dropout", "llm-attn", "gemm-2rank", "sgemm-old"]
    )
    classes = {a["app"]: a["class"] for a in stored(run_cli)}
    assert classes["gemm-2rank"] == "A"  # FU 63.5 % vs DRAM 55 %: the most compute-bound
    assert all(a["class_origin"] == "fit" for a in stored(run_cli))

    # A new application is classified by the active model as it is stored.
    raw = classify(run_cli, RAW, "raw-gemm")
    assert raw["class"] == "A" and raw["model_id"] == fitted["model_id"]
    assert raw["fu_source"].startswith("pipe:fma,tensor")
    table = run_cli("apps", "list").output
    assert "raw-gemm" in table and "pipe:fma,tensor" in table and "classifier model" in table


def test_fit_with_fewer_behaviours_than_classes_fits_fewer_and_says_so(run_cli) -> None:
    classify(run_cli, DETAILS15, "a")
    classify(run_cli, DETAILS21, "b")
    result = run_cli("apps", "fit", "--json")
    fitted = json.loads(result.stdout)
    assert (fitted["n_classes_asked"], fitted["n_behaviours"]) == (4, 2)
    assert [c["class"] for c in fitted["classes"]] == ["A", "B"]
    assert "note: 4 classes asked, but the 2 application(s) show 2 distinct behaviour(s)" in (
        result.stderr
    )
    assert "fitted 2 classes (A, B)" in result.stderr
    result = run_cli("apps", "fit", "-k", "9", ok=False)
    assert "--n-classes must be within 1..4" in result.output
    fitted = json.loads(run_cli("apps", "fit", "-k", "2", "--json").output)
    assert fitted["n_apps"] == 2


def dcgm_dmon(tmp_path: Path, name: str, dram: float, fp32: float) -> Path:
    """A one-sample `dcgmi dmon` file: DRAM and FP32 pipe activity as fractions."""
    path = tmp_path / f"{name}.txt"
    path.write_text(
        "#Entity   TENSO  DRAMA  FP64A  FP32A  FP16A\nID\n"
        f"GPU 0     0.000  {dram:.3f}  0.000  {fp32:.3f}  0.000\n"
    )
    return path


def test_two_kernels_measured_twice_are_not_split_on_noise(run_cli, tmp_path: Path) -> None:
    """GEMM and STREAM measured twice each, the site's four classes: each kernel's two
    measurements land in one class, and the model has the two classes the data supports."""
    kernels = {
        "gemm-1": (0.242, 0.930),
        "gemm-2": (0.243, 0.930),
        "stream-1": (0.876, 0.090),
        "stream-2": (0.877, 0.090),
    }
    for name, (dram, fp32) in kernels.items():
        run_cli(
            "apps",
            "classify",
            "--app",
            name,
            "--source",
            "dcgm",
            dcgm_dmon(tmp_path, name, dram, fp32),
        )
    result = run_cli("apps", "fit", "--json")
    fitted = json.loads(result.stdout)
    assert {c["class"]: c["apps"] for c in fitted["classes"]} == {
        "A": ["gemm-1", "gemm-2"],
        "B": ["stream-1", "stream-2"],
    }
    assert "4 classes asked" in result.stderr and "fitted 2 classes (A, B)" in result.stderr
    classes = {a["app"]: a["class"] for a in stored(run_cli)}
    assert classes == {"gemm-1": "A", "gemm-2": "A", "stream-1": "B", "stream-2": "B"}


def test_several_files_of_one_application_are_pooled(run_cli) -> None:
    both = json.loads(
        run_cli("apps", "classify", DETAILS15, DETAILS21, "--app", "pooled", "--json").output
    )
    expected = application_features([read_ncu_csv(DETAILS15), read_ncu_csv(DETAILS21)])
    assert both["dram_util"] == pytest.approx(expected.dram_util)
    assert both["measurements"] == 6 and len(both["files"]) == 2
    assert all(len(f["sha256"]) == 64 for f in both["files"])


def test_time_without_a_metric_is_reported_not_counted_as_zero(run_cli, tmp_path: Path) -> None:
    lines = DETAILS15.read_text(encoding="utf-8").split("\n")
    fu_only = tmp_path / "fu-run.csv"
    fu_only.write_text("\n".join(x for x in lines if "dram__" not in x), encoding="utf-8")
    out = run_cli("apps", "classify", DETAILS21, fu_only, "--app", "split").output
    assert "no DRAM value and was left out" in " ".join(out.split())
    app = stored(run_cli)[0]
    expected = application_features([read_ncu_csv(DETAILS21), read_ncu_csv(fu_only)])
    assert 0 < expected.dram_excluded_fraction < 1
    assert app["dram_util"] == pytest.approx(expected.dram_util)


# --------------------------------------------------------------------------------------------
# Bad input: a clear error naming file and line, and nothing stored


def _cut_in_last_launch(tmp_path: Path) -> Path:
    lines = DETAILS15.read_text(encoding="utf-8").rstrip("\n").split("\n")
    path = tmp_path / "truncated.csv"
    path.write_text("\n".join(lines[:-4]) + "\n", encoding="utf-8")
    return path


def _cut_in_a_field(tmp_path: Path) -> Path:
    text = DETAILS15.read_text(encoding="utf-8")
    path = tmp_path / "cut.csv"
    path.write_text(text[: text.rindex("sm__throughput") + 5], encoding="utf-8")
    return path


def _mixed_units(tmp_path: Path) -> Path:
    text = DETAILS15.read_text(encoding="utf-8")
    old = '"dram__throughput.avg.pct_of_peak_sustained_elapsed","%","80.00"'
    assert old in text
    path = tmp_path / "mixed.csv"
    new = '"dram__throughput.avg.pct_of_peak_sustained_elapsed","Gbyte/second","80.00"'
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def _no_dram_metric(tmp_path: Path) -> Path:
    lines = DETAILS15.read_text(encoding="utf-8").split("\n")
    path = tmp_path / "nodram.csv"
    path.write_text("\n".join(x for x in lines if "dram__throughput" not in x), encoding="utf-8")
    return path


def _error_after_table(tmp_path: Path) -> Path:
    path = tmp_path / "failed-run.csv"
    text = DETAILS12.read_text(encoding="utf-8") + "==ERROR== The application returned an error\n"
    path.write_text(text, encoding="utf-8")
    return path


def _bad_json(tmp_path: Path) -> Path:
    path = tmp_path / "record.json"
    path.write_text('{\n  "dram_util": 10,\n  "fu_util": \n}\n')
    return path


def _dmon_ragged(tmp_path: Path) -> Path:
    path = tmp_path / "dmon.txt"
    path.write_text(DMON + "GPU 0     0.100  0.600\n")
    return path


@pytest.mark.parametrize(
    ("make", "line", "message"),
    [
        (_cut_in_last_launch, 38, "the file looks truncated"),
        (_cut_in_a_field, 42, "ends inside a quoted field"),
        (lambda _: NO_TABLE, 3, "no Nsight Compute table"),
        (_mixed_units, 8, "must be in '%', got unit 'Gbyte/second'"),
        (_no_dram_metric, 6, "no DRAM throughput metric; need one of"),
        (_error_after_table, 14, "ncu reported an error"),
        (_bad_json, 4, "not valid JSON"),
        (_dmon_ragged, 5, "row has 2 values but the header names 5 columns"),
    ],
)
def test_bad_input_names_file_and_line_and_stores_nothing(
    run_cli, tmp_path: Path, make, line: int, message: str
) -> None:
    classify(run_cli, DETAILS21, "existing")
    before = stored(run_cli)
    bad = make(tmp_path)
    calls = [[bad]]
    if make not in (_no_dram_metric, _bad_json, _dmon_ragged):
        # Next to a good file, in one call: all or nothing. (An ncu file without the DRAM
        # metric is fine next to one that has it: PAL profiles DRAM and FU in separate runs.)
        calls.append([DETAILS15, bad])
    for files in calls:
        result = run_cli("apps", "classify", *files, "--app", "newapp", ok=False)
        assert result.exit_code == 2, result.output
        flat = " ".join(result.output.split())
        assert f"error: {bad}:{line}: " in flat
        assert message in flat
        assert stored(run_cli) == before


def test_real_sample_without_a_dram_metric_is_refused(run_cli) -> None:
    saxpy = shared_sample("saxpy-rtx5070.csv")
    result = classify(run_cli, saxpy, "saxpy", ok=False)
    assert result.exit_code == 2
    assert f"{saxpy}:9: no DRAM throughput metric" in " ".join(result.output.split())
    assert stored(run_cli) == []


def test_usage_errors_list_the_valid_choices(run_cli, tmp_path: Path) -> None:
    result = classify(run_cli, DETAILS15, "x", "--source", "csv", ok=False)
    assert "valid values: auto, ncu, nvml, dcgm" in result.output
    result = classify(run_cli, DETAILS15, "bad name", ok=False)
    assert "invalid application name" in result.output
    copy = tmp_path / "copy.csv"
    copy.write_bytes(DETAILS15.read_bytes())
    result = run_cli("apps", "classify", DETAILS15, copy, "--app", "x", ok=False)
    assert "are the same file (same content)" in " ".join(result.output.split())
    result = run_cli("apps", "classify", tmp_path / "nope.csv", "--app", "x", ok=False)
    # rich wraps click's usage error in a box whose width depends on the tmp path's length
    words = " ".join(result.output.replace("\u2502", " ").split())
    assert result.exit_code == 2 and "does not exist" in words
    assert stored(run_cli) == []


# --------------------------------------------------------------------------------------------
# Other telemetry sources


def test_dcgm_and_nvml_files_are_detected_and_read(run_cli, tmp_path: Path) -> None:
    dmon = tmp_path / "job.dmon"
    dmon.write_text(DMON)
    prom = tmp_path / "scrape.prom"
    prom.write_text(EXPORTER)
    rec = tmp_path / "job.json"
    rec.write_text(json.dumps([nvml_record(20, 80, 30), nvml_record(60, 20, 10)]))
    assert [detect_source(p) for p in (dmon, prom, rec, DETAILS15)] == [
        "dcgm",
        "dcgm",
        "nvml",
        "ncu",
    ]

    d = classify(run_cli, dmon, "dmon-app")
    assert (d["source"], d["dram_util"], d["measurements"]) == ("dcgm", pytest.approx(50.0), 2)
    assert d["fu_util"] == pytest.approx(50.0)  # mean of max(TENSO, FP32A...) = (30 + 70) / 2
    assert d["fu_source"].startswith("dcgm max(")
    p = classify(run_cli, prom, "prom-app", "--source", "dcgm")
    assert (p["dram_util"], p["fu_util"]) == (pytest.approx(80.0), pytest.approx(10.0))
    n = classify(run_cli, rec, "nvml-app")
    assert n["source"] == "nvml"
    assert n["dram_util"] == pytest.approx((20 * 30 + 60 * 10) / 40)  # time-weighted
    assert n["fu_util"] == pytest.approx((80 * 30 + 20 * 10) / 40)

    result = run_cli("apps", "classify", dmon, DETAILS15, "--app", "mixed", ok=False)
    assert "different formats" in result.output
    wrong = tmp_path / "ncu-record.json"
    wrong.write_text(json.dumps({**nvml_record(1, 2, 3), "source": "ncu"}))
    result = classify(run_cli, wrong, "w", ok=False)
    assert "source is 'ncu', not 'nvml'" in result.output
    assert len(stored(run_cli)) == 3


# --------------------------------------------------------------------------------------------
# Admin overrides


def test_admin_override_is_recorded_and_survives_refits(run_cli) -> None:
    for path, name in ((DETAILS15, "a"), (DETAILS21, "b"), (RAW, "c"), (DETAILS12, "d")):
        classify(run_cli, path, name)
    result = run_cli("apps", "set", "a", "--class", "Q", ok=False)
    assert result.exit_code == 2 and "valid classes: A, B, C, D" in result.output
    run_cli("apps", "set", "a", "--class", "D")
    run_cli("apps", "fit")
    apps = {a["app"]: a for a in stored(run_cli)}
    assert (apps["a"]["class"], apps["a"]["class_origin"]) == ("D", "admin")
    again = classify(run_cli, DETAILS15, "a")
    assert (again["class"], again["class_origin"]) == ("D", "admin")
    assert again["model_class"] in {"A", "B", "C", "D"} and "admin override" in again["message"]
    assert "D (admin)" in run_cli("apps", "list").output

    run_cli("apps", "set", "a", "--clear")
    cleared = {a["app"]: a for a in stored(run_cli)}["a"]
    assert (cleared["class"], cleared["class_origin"]) == (again["model_class"], "fit")
    assert "exactly one of" in run_cli("apps", "set", "a", ok=False).output
    # An admin may declare an application nobody profiled.
    run_cli("apps", "set", "vendor-app", "--class", "B")
    vendor = {a["app"]: a for a in stored(run_cli)}["vendor-app"]
    assert (vendor["class"], vendor["dram_util"]) == ("B", None)


def test_a_model_fitted_for_other_class_names_is_not_used(run_cli, tmp_path: Path) -> None:
    for path, name in ((DETAILS15, "a"), (DETAILS21, "b")):
        classify(run_cli, path, name)
    run_cli("apps", "fit", "-k", "2")
    config = tmp_path / "site.toml"
    config.write_text('[classes]\nnames = ["X", "Y"]\ndefault = "X"\n')
    result = run_cli("--config", config, "apps", "classify", RAW, "--app", "c", ok=False)
    assert "has classes A, B, but classes.names" in " ".join(result.output.split())
    assert "apps fit" in result.output
    assert [a["app"] for a in stored(run_cli)] == ["a", "b"]


# --------------------------------------------------------------------------------------------
# Resolution through the CLI: rules, names, history, mismatches


def test_resolve_uses_rules_names_and_measured_history(run_cli, tmp_path: Path) -> None:
    run_cli("apps", "set", "resnet50", "--class", "A")
    run_cli("apps", "set", "pagerank", "--class", "D")
    config = tmp_path / "site.toml"
    config.write_text(
        '[classes]\ndefault = "B"\n[[classification.rules]]\npartition = "debug"\nclass = "C"\n'
    )
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=1\n#PAL app=resnet50\npython train.py\n")

    def resolve(*args: str) -> dict:
        out = run_cli("--config", config, "apps", "resolve", "--user", "alice", *args, "--json")
        return json.loads(out.output)

    assert resolve("-p", "gpu,debug", "--comment", "pal:app=resnet50")["reason"] == (
        "admin rule 1 (partition=debug)"
    )
    named = resolve("--script", str(script), "-J", "train")
    assert (named["class"], named["origin"]) == ("A", "app")
    assert resolve("--comment", "pal:app=unknown")["reason"] == (
        "default class B; named app unknown is unknown"
    )

    # Earlier runs of this (user, job name, script) measured class D: the claim is ignored.
    import hashlib

    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    with Store(tmp_path / "store.db") as store:
        for job_id in ("1", "2"):
            record = JobRecord(
                job_id=job_id,
                user="alice",
                job_name="train",
                script_sha256=sha,
                claimed_app="resnet50",
                claimed_class="A",
                measured_class="D",
            )
            assert store.record_job(record)
    history = resolve("--script", str(script), "-J", "train")
    assert (history["class"], history["origin"], history["mismatch"]) == ("D", "history", True)
    assert "(claimed resnet50 -> A ignored)" in history["reason"]
    mismatches = json.loads(run_cli("apps", "mismatches", "--json").stdout)
    assert [(m["job_id"], m["claimed_app"], m["measured_class"]) for m in mismatches] == [
        ("1", "resnet50", "D"),
        ("2", "resnet50", "D"),
    ]
    assert "claimed app" in run_cli("apps", "mismatches").output
    # A new job name escapes the history, not the distrust: the claim is still not believed.
    renamed = resolve("--script", str(script), "-J", "train-renamed")
    assert (renamed["class"], renamed["origin"]) == ("B", "default")
    assert "named app resnet50 not believed: 2 earlier job(s) of alice" in renamed["reason"]


def test_empty_store_messages(run_cli) -> None:
    assert "no applications yet" in run_cli("apps", "list").output
    assert "no mismatches recorded" in run_cli("apps", "mismatches").output
    assert "no profiled applications" in run_cli("apps", "fit", ok=False).output


@pytest.mark.parametrize(
    ("fu_source", "short"),
    [
        (
            "pipe:fma,tensor (max per launch of 3 .avg.pct_of_peak_sustained_elapsed metrics)",
            "pipe:fma,tensor",
        ),
        (
            "sm__throughput.avg.pct_of_peak_sustained_elapsed (fallback: no pipe metric)",
            "sm__throughput (fallback)",
        ),
        (
            "dcgm max(PIPE_TENSOR_ACTIVE,PIPE_FP32_ACTIVE)",
            "dcgm max(PIPE_TENSOR_ACTIVE,PIPE_FP32_ACTIVE)",
        ),
    ],
)
def test_short_fu_source(fu_source: str, short: str) -> None:
    assert short_fu_source(fu_source) == short
