"""Nsight Compute CSV reader: real samples, own fixtures in the real layouts, bad input."""

from __future__ import annotations

import csv
import pickle
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_pal.adapters.ncu import (
    DRAM_METRICS,
    SM_THROUGHPUT_METRIC,
    NcuMetricsMissingError,
    NcuParseError,
    application_features,
    fu_pipe_metric,
    parse_ncu_csv_text,
    parse_ncu_number,
    read_ncu_csv,
)
from tests.helpers.data import NCU, need_shared

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
SHARED_NCU = NCU

DETAILS15 = FIXTURES / "details15-two-processes.csv"
DETAILS21 = FIXTURES / "details21-rules-smsp.csv"
DETAILS12 = FIXTURES / "details12-old-preamble.csv"
RAW = FIXTURES / "raw-page.csv"
NO_TABLE = FIXTURES / "no-table-error.csv"


def shared_sample(name: str) -> Path:
    path = SHARED_NCU / name
    need_shared(path)
    return path


def write(tmp_path: Path, text: str, name: str = "case.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def line_number_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.split("\n"), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


# --------------------------------------------------------------------------------------------
# Real samples


def test_dropout_162_launches_matches_an_independent_hand_computation() -> None:
    path = shared_sample("dropout-162-launches.csv")

    # Hand computation with nothing but the csv module: key launches by (Process ID, ID).
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    column = {name: index for index, name in enumerate(rows[0])}
    launches: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    durations_by_name: dict[str, float] = {}
    for row in rows[1:]:
        key = (row[column["Process ID"]], row[column["ID"]])
        metric, unit = row[column["Metric Name"]], row[column["Metric Unit"]]
        value = float(row[column["Metric Value"]].replace(",", ""))
        launches[key][metric] = value
        if metric == "gpu__time_duration.sum":
            assert unit == "nsecond"
            durations_by_name[row[column["Kernel Name"]]] = value
    times = [m["gpu__time_duration.sum"] for m in launches.values()]
    hand_sm = sum(
        m["sm__throughput.avg.pct_of_peak_sustained_elapsed"] * t
        for m, t in zip(launches.values(), times, strict=True)
    ) / sum(times)
    hand_dram = sum(
        m["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] * t
        for m, t in zip(launches.values(), times, strict=True)
    ) / sum(times)
    assert len(launches) == 162
    assert round(hand_sm, 2) == 21.61
    assert round(hand_dram, 2) == 56.02

    # Minos keys durations by kernel name: one duration in the denominator, 162 numerators.
    (only_name_duration,) = durations_by_name.values()
    minos_sm = sum(
        float(r[column["Metric Value"]]) * only_name_duration
        for r in rows[1:]
        if r[column["Metric Name"]] == "sm__throughput.avg.pct_of_peak_sustained_elapsed"
    ) / sum(durations_by_name.values())
    assert round(minos_sm, 2) == 2429.73

    report = read_ncu_csv(path)
    features = application_features([report])
    assert len(report.kernels) == 162
    assert len({k.kernel_name for k in report.kernels}) == 1
    assert len({k.key for k in report.kernels}) == 162
    assert features.fu_util == pytest.approx(hand_sm, rel=1e-12)
    assert features.dram_util == pytest.approx(hand_dram, rel=1e-12)
    assert features.weight_total == pytest.approx(sum(times))
    assert features.measurements == 162
    assert features.dram_source == "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
    # sm__inst_executed_pipe_tensor.sum is an instruction count, not a pct-of-peak pipe metric
    assert features.fu_source == f"{SM_THROUGHPUT_METRIC} (fallback: no pipe metric)"


def test_llm_kernel_20_columns_us_duration_and_na_values() -> None:
    report = read_ncu_csv(shared_sample("llm-kernel-rtx5090.details.csv"))
    assert (report.layout, report.header_columns) == ("details", 20)
    (kernel,) = report.kernels
    assert kernel.duration_ns == pytest.approx(160_740.0)  # "160.74" "us"
    assert kernel.units["gpu__time_duration.sum"] == "ns"
    assert kernel.metrics["dram__bytes_read.sum"] == pytest.approx(99.63e6)  # Mbyte -> byte
    assert kernel.metrics["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] == 10_192_158_720
    assert "flop_count_hp.sum" in kernel.unavailable
    assert "flop_count_hp.sum" not in kernel.metrics
    assert "DRAM Throughput" not in kernel.metrics  # section display names are not raw metrics
    features = application_features([report])
    assert features.dram_util == pytest.approx(37.26)
    assert features.fu_util == pytest.approx(36.75)
    assert "fallback" in features.fu_source


def test_saxpy_bom_crlf_preamble_parses_but_has_no_dram_metric() -> None:
    path = shared_sample("saxpy-rtx5070.csv")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    report = read_ncu_csv(path)
    assert (report.layout, report.header_columns, report.header_line) == ("details", 15, 9)
    (kernel,) = report.kernels
    assert kernel.kernel_name.startswith("unnamed>::saxpy_kernel(float, const float *")
    assert kernel.duration_ns == 292_928.0
    assert kernel.metrics[SM_THROUGHPUT_METRIC] == pytest.approx(22.30)
    assert [line for line, _ in report.messages] == [1, 2]
    with pytest.raises(NcuMetricsMissingError) as excinfo:
        application_features([report])
    assert excinfo.value.path == str(path)
    assert excinfo.value.line == 9
    for metric in DRAM_METRICS:
        assert metric in str(excinfo.value)


# --------------------------------------------------------------------------------------------
# Own fixtures in the real layouts


def test_details15_keys_launches_by_process_and_id_not_by_name() -> None:
    report = read_ncu_csv(DETAILS15)
    assert [k.key for k in report.kernels] == [(4101, 0), (4101, 1), (4102, 0), (4102, 1)]
    assert len({k.kernel_name for k in report.kernels}) == 1
    assert [k.duration_ns for k in report.kernels] == [12_000.0, 8_000.0, 4_000.0, 16_000.0]
    assert len(report.messages) == 4  # ==PROF== lines; the app's own print is not kept
    assert report.errors == ()


def test_details15_features_by_hand() -> None:
    features = application_features([read_ncu_csv(DETAILS15)])
    # weights 12000, 8000, 4000, 16000 ns; launch 4 has DRAM n/a and is left out of DRAM
    assert features.dram_util == pytest.approx((80 * 12 + 20 * 8 + 50 * 4) / 24)
    assert features.dram_excluded_fraction == pytest.approx(16 / 40)
    # max over fma/alu/fp64/tensor (_active basis) per launch: 30, 70, 45, 90
    assert features.fu_util == pytest.approx((30 * 12 + 70 * 8 + 45 * 4 + 90 * 16) / 40)
    assert features.fu_excluded_fraction == 0.0
    assert features.fu_source.startswith("pipe:alu,fma,fp64,tensor")
    assert "pct_of_peak_sustained_active" in features.fu_source
    assert features.weight_total == 40_000.0
    assert features.source == "ncu"


def test_raw_page_units_row_text_cells_and_elapsed_basis() -> None:
    report = read_ncu_csv(RAW)
    assert (report.layout, report.header_columns, report.header_line) == ("raw", 19, 2)
    assert [k.key for k in report.kernels] == [(234883, 0), (234883, 1), (234883, 2)]
    first = report.kernels[0]
    assert first.metrics["dram__bytes_read.sum"] == 1_084_446_098
    assert first.text_metrics["device__attribute_display_name"] == "NVIDIA H100 80GB HBM3"
    assert "launch__kernel_name" in first.unavailable
    features = application_features([report])
    assert features.dram_util == pytest.approx((30 * 4 + 85 * 1 + 32 * 5) / 10)
    assert features.fu_util == pytest.approx((70 * 4 + 8 * 1 + 66 * 5) / 10)
    assert features.fu_source.startswith("pipe:fma,tensor")
    assert "pct_of_peak_sustained_elapsed" in features.fu_source


def test_details21_body_item_label_ragged_rows_rules_and_pal_metric() -> None:
    report = read_ncu_csv(DETAILS21)
    assert (report.layout, report.header_columns) == ("details", 21)
    assert [k.duration_ns for k in report.kernels] == [2_000.0, 6_000.0]
    features = application_features([report])
    assert features.dram_util == pytest.approx((10 * 2 + 40 * 6) / 8)
    assert features.fu_util == pytest.approx((90 * 2 + 50 * 6) / 8)
    assert features.fu_source.startswith("pipe:fma")


def test_details12_old_layout_with_preamble_falls_back_to_sm_throughput() -> None:
    report = read_ncu_csv(DETAILS12)
    assert report.header_line == 5
    features = application_features([report])
    assert features.dram_util == pytest.approx((0 * 7488 + 12.5 * 1024) / (7488 + 1024))
    assert features.fu_util == pytest.approx((0.17 * 7488 + 3.0 * 1024) / (7488 + 1024))
    assert features.fu_source == f"{SM_THROUGHPUT_METRIC} (fallback: no pipe metric)"


def test_two_files_of_one_application_are_weighted_together() -> None:
    features = application_features([read_ncu_csv(DETAILS15), read_ncu_csv(DETAILS21)])
    assert features.measurements == 6
    dram_numerator = (80 * 12 + 20 * 8 + 50 * 4) + (10 * 2 + 40 * 6)
    assert features.dram_util == pytest.approx(dram_numerator / (24 + 8))
    assert features.dram_excluded_fraction == pytest.approx(16 / 48)
    fu_numerator = (30 * 12 + 70 * 8 + 45 * 4 + 90 * 16) + (90 * 2 + 50 * 6)
    assert features.fu_util == pytest.approx(fu_numerator / 48)


def test_bom_and_crlf_give_the_same_result(tmp_path: Path) -> None:
    text = DETAILS15.read_text(encoding="utf-8")
    path = tmp_path / "windows.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    assert application_features([read_ncu_csv(path)]) == application_features(
        [read_ncu_csv(DETAILS15)]
    )


def test_repeated_header_resynchronises(tmp_path: Path) -> None:
    lines = DETAILS15.read_text(encoding="utf-8").split("\n")
    header = next(line for line in lines if line.startswith('"ID",'))
    split_at = next(i for i, line in enumerate(lines) if line.startswith('"0","4102"'))
    lines[split_at:split_at] = ["==PROF== Connected to process 4102", header]
    report = read_ncu_csv(write(tmp_path, "\n".join(lines)))
    assert [k.key for k in report.kernels] == [(4101, 0), (4101, 1), (4102, 0), (4102, 1)]


def test_quoted_newline_inside_a_field_is_one_record(tmp_path: Path) -> None:
    text = DETAILS21.read_text(encoding="utf-8").replace(
        "see the Compute Workload Analysis section,", "see the\nCompute Workload Analysis section,"
    )
    report = read_ncu_csv(write(tmp_path, text))
    assert len(report.kernels) == 2


def test_explicit_dram_metric_that_is_absent_lists_what_is_present() -> None:
    with pytest.raises(NcuMetricsMissingError, match=r"dram__throughput\.avg"):
        application_features(
            [read_ncu_csv(DETAILS15)],
            dram_metric="gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        )


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", ("fma", "active")),
        (
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            ("tensor", "active"),
        ),
        ("sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_elapsed", ("fp64", "elapsed")),
        ("sm__pipe_alu_cycles_active.max.pct_of_peak_sustained_active", None),  # not .avg
        ("sm__inst_executed_pipe_tensor.sum", None),  # a count
        ("sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", None),  # memory pipe
        (SM_THROUGHPUT_METRIC, None),
    ],
)
def test_fu_pipe_metric_names(metric: str, expected: tuple[str, str] | None) -> None:
    assert fu_pipe_metric(metric) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("292,928", 292928.0),
        ("1,009,150,443.18", 1009150443.18),
        ("5,318,969,728.00", 5318969728.0),
        ("37.26", 37.26),
        ("0", 0.0),
        ("1e-3", 0.001),
        ("n/a", None),
        ("N/A", None),
        ("", None),
    ],
)
def test_parse_ncu_number(text: str, expected: float | None) -> None:
    assert parse_ncu_number(text) == expected


@pytest.mark.parametrize("text", ["1.234,5", "12,5", "1,23", "1,2345", "NVIDIA B200"])
def test_parse_ncu_number_rejects_ambiguous_or_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ncu_number(text)


# --------------------------------------------------------------------------------------------
# Bad input: clear errors naming file and line


def test_no_table_only_prof_and_error_lines() -> None:
    with pytest.raises(NcuParseError) as excinfo:
        read_ncu_csv(NO_TABLE)
    error = excinfo.value
    assert (error.path, error.line) == (str(NO_TABLE), 3)
    assert "no Nsight Compute table" in str(error)
    assert "==ERROR== The application returned an error code (1)." in str(error)
    assert str(error).startswith(f"{NO_TABLE}:3: ")


def test_no_table_without_error_lines_suggests_the_export_pitfall(tmp_path: Path) -> None:
    path = write(tmp_path, "==PROF== Connected to process 1 (/usr/bin/nvidia-smi)\nhello\n")
    with pytest.raises(NcuParseError, match="--export") as excinfo:
        read_ncu_csv(path)
    assert excinfo.value.line is None


def test_table_with_error_line_is_parsed_and_the_error_reported(tmp_path: Path) -> None:
    text = DETAILS12.read_text(encoding="utf-8") + "==ERROR== The application returned an error\n"
    report = read_ncu_csv(write(tmp_path, text))
    assert len(report.kernels) == 2
    assert report.errors == ((14, "==ERROR== The application returned an error"),)


def test_truncated_inside_a_quoted_field(tmp_path: Path) -> None:
    text = DETAILS15.read_text(encoding="utf-8")
    cut = text.rindex("sm__throughput") + 5
    with pytest.raises(NcuParseError, match="ends inside a quoted field") as excinfo:
        read_ncu_csv(write(tmp_path, text[:cut]))
    assert excinfo.value.line == len(text[:cut].split("\n"))


def test_truncated_at_a_line_boundary_inside_the_last_launch(tmp_path: Path) -> None:
    lines = DETAILS15.read_text(encoding="utf-8").rstrip("\n").split("\n")
    truncated = "\n".join(lines[:-4]) + "\n"
    with pytest.raises(NcuParseError, match="looks truncated") as excinfo:
        read_ncu_csv(write(tmp_path, truncated))
    assert excinfo.value.line == len(lines) - 4


def test_truncated_row_missing_fields(tmp_path: Path) -> None:
    text = DETAILS15.read_text(encoding="utf-8")
    cut = text.rindex(',"91.00"')
    with pytest.raises(NcuParseError, match="fewer than the 15 needed"):
        read_ncu_csv(write(tmp_path, text[:cut] + "\n"))


def test_header_only(tmp_path: Path) -> None:
    header = DETAILS15.read_text(encoding="utf-8").split("\n")[5]
    with pytest.raises(NcuParseError, match="no kernel rows") as excinfo:
        read_ncu_csv(write(tmp_path, "==PROF== Connected\n" + header + "\n"))
    assert excinfo.value.line == 2


def test_raw_page_truncated_row(tmp_path: Path) -> None:
    text = RAW.read_text(encoding="utf-8")
    cut = text.rindex(',"66.00"')
    with pytest.raises(NcuParseError, match=r"18 fields but the header has 19 \(truncated"):
        read_ncu_csv(write(tmp_path, text[:cut] + "\n"))


def test_raw_page_without_units_row(tmp_path: Path) -> None:
    lines = RAW.read_text(encoding="utf-8").split("\n")
    del lines[2]
    with pytest.raises(NcuParseError, match="no units row") as excinfo:
        read_ncu_csv(write(tmp_path, "\n".join(lines)))
    assert excinfo.value.line == 3


def test_mixed_units_duration_given_as_percent(tmp_path: Path) -> None:
    text = DETAILS15.read_text(encoding="utf-8").replace(
        '"gpu__time_duration.sum","us","8.00"', '"gpu__time_duration.sum","%","8.00"'
    )
    with pytest.raises(NcuParseError, match="must be a time") as excinfo:
        read_ncu_csv(write(tmp_path, text))
    assert excinfo.value.line == line_number_of(text, '"gpu__time_duration.sum","%"')
    assert "nsecond" in str(excinfo.value)  # lists the valid units


def test_mixed_units_percent_metric_in_ns(tmp_path: Path) -> None:
    needle = '"dram__throughput.avg.pct_of_peak_sustained_elapsed","%","20.00"'
    text = DETAILS15.read_text(encoding="utf-8").replace(needle, needle.replace('"%"', '"ns"'))
    with pytest.raises(NcuParseError, match="must be in '%'") as excinfo:
        read_ncu_csv(write(tmp_path, text))
    assert excinfo.value.line == line_number_of(text, '_elapsed","ns"')


def test_locale_formatted_number_is_rejected_with_its_line(tmp_path: Path) -> None:
    text = DETAILS15.read_text(encoding="utf-8").replace('"8.00"', '"8,5"')
    with pytest.raises(NcuParseError, match="ambiguous number") as excinfo:
        read_ncu_csv(write(tmp_path, text))
    assert excinfo.value.line == line_number_of(text, '"8,5"')


def test_conflicting_duplicate_metric_in_one_launch(tmp_path: Path) -> None:
    lines = DETAILS21.read_text(encoding="utf-8").split("\n")
    dup = lines[1].replace('"10.00"', '"11.00"')
    lines.insert(2, dup)
    with pytest.raises(NcuParseError, match="two values for dram__throughput") as excinfo:
        read_ncu_csv(write(tmp_path, "\n".join(lines)))
    assert excinfo.value.line == 3


def test_summary_layout_is_refused_with_guidance(tmp_path: Path) -> None:
    text = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Invocations",'
        '"Metric Name","Metric Unit","Minimum","Maximum","Average"\n'
    )
    with pytest.raises(NcuParseError, match="--page details"):
        read_ncu_csv(write(tmp_path, text))


def test_missing_dram_metric(tmp_path: Path) -> None:
    lines = DETAILS21.read_text(encoding="utf-8").split("\n")
    text = "\n".join(line for line in lines if "DRAM" not in line and "dram__" not in line)
    path = write(tmp_path, text)
    with pytest.raises(NcuMetricsMissingError) as excinfo:
        application_features([read_ncu_csv(path)])
    assert (excinfo.value.path, excinfo.value.line) == (str(path), 1)
    assert all(metric in str(excinfo.value) for metric in DRAM_METRICS)


def test_a_section_duration_row_stands_in_for_the_raw_metric(tmp_path: Path) -> None:
    lines = DETAILS21.read_text(encoding="utf-8").split("\n")
    full = application_features([read_ncu_csv(DETAILS21)])
    text = "\n".join(line for line in lines if "time_duration" not in line)
    report = read_ncu_csv(write(tmp_path, text))
    assert all(k.from_display == {"gpu__time_duration.sum"} for k in report.kernels)
    assert application_features([report]).dram_util == pytest.approx(full.dram_util)


def test_missing_duration_names_the_launch_line(tmp_path: Path) -> None:
    lines = DETAILS21.read_text(encoding="utf-8").split("\n")
    text = "\n".join(
        line for line in lines if "time_duration" not in line and '"Duration"' not in line
    )
    path = write(tmp_path, text)
    with pytest.raises(NcuMetricsMissingError, match=r"gpu__time_duration\.sum") as excinfo:
        application_features([read_ncu_csv(path)])
    assert excinfo.value.line == 2


def test_missing_every_fu_metric(tmp_path: Path) -> None:
    lines = DETAILS15.read_text(encoding="utf-8").split("\n")
    text = "\n".join(line for line in lines if "sm__" not in line)
    with pytest.raises(NcuMetricsMissingError, match="no functional-unit metric") as excinfo:
        application_features([read_ncu_csv(write(tmp_path, text))])
    assert SM_THROUGHPUT_METRIC in str(excinfo.value)


def test_error_pickles_and_formats() -> None:
    error = NcuParseError("a.csv", 7, "bad")
    assert str(error) == "a.csv:7: bad"
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.path, clone.line, clone.message) == ("a.csv", 7, "bad")
    assert str(NcuParseError("a.csv", None, "bad")) == "a.csv: bad"


FULL_DETAILS15 = DETAILS15.read_text(encoding="utf-8")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=0, max_value=len(FULL_DETAILS15)))
def test_any_truncation_errors_clearly_or_yields_a_consistent_prefix(cut: int) -> None:
    """Cut anywhere: either an NcuParseError, or launches and values that the full file has."""
    full = {k.key: k for k in parse_ncu_csv_text(FULL_DETAILS15).kernels}
    try:
        report = parse_ncu_csv_text(FULL_DETAILS15[:cut], "cut.csv")
    except NcuParseError as error:
        assert error.path == "cut.csv"
        return
    for kernel in report.kernels:
        assert kernel.key in full
        for metric, value in kernel.metrics.items():
            assert full[kernel.key].metrics[metric] == value
