"""DCGM profiling fields from `dcgmi dmon` text and dcgm-exporter Prometheus text."""

from __future__ import annotations

import pytest

from slurm_pal.adapters.dcgm import (
    DcgmMissingFieldError,
    DcgmParseError,
    dcgm_features,
    dcgm_features_by_entity,
    parse_dmon,
    parse_prometheus,
)

# Layout of `dcgmi dmon -e 1004,1005,1006,1007,1008` (ratios, N/A when unavailable).
DMON = """\
#Entity   TENSO  DRAMA  FP64A  FP32A  FP16A
ID
GPU 0     0.100  0.600  0.000  0.300  0.000
GPU 1     0.500  0.200  0.000  0.100  0.000
GPU 0     0.700  0.400  0.000  0.200  0.000
GPU 1     N/A    N/A    N/A    N/A    N/A
"""

# `dcgmi dmon -e 1001,1002,1003,1004,1005 -g <group>` on a MIG-partitioned GPU.
DMON_MIG = """\
  # Entity  GRACT  SMACT  SMOCC  TENSO  DRAMA
      Id
   GPU 0  0.429  0.429  0.364  0.011  0.400
   GPU-I 0  0.000  0.000  0.000  0.000  0.000
   GPU-I 1  0.750  0.750  0.637  0.020  0.800
"""

# Device-level columns (GPUTL, MCUTL in percent; PCITX/PCIRX in bytes) mixed in.
DMON_MIXED = """\
# EntityId      GPUTL       MCUTL  DRAMA  SMACT  SMOCC  TENSO                 PCITX                 PCIRX
    GPU 2          79          43  0.382  0.652  0.206  0.267             273834455            2258816847
    GPU 2          92          50  0.333  0.553  0.175  0.227             241553009            1988613613
"""  # noqa: E501

LABELS0 = (
    'gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",'
    'modelName="NVIDIA \\"A100\\", SXM4",Hostname="node01",container="",namespace="",pod=""'
)
LABELS1 = 'gpu="1",UUID="GPU-bbbb",device="nvidia1",modelName="NVIDIA A100",Hostname="node01"'
EXPORTER = f"""\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{LABELS0}}} 1410
DCGM_FI_DEV_SM_CLOCK{{{LABELS1}}} 1410
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{{{LABELS0}}} 0.452
DCGM_FI_PROF_DRAM_ACTIVE{{{LABELS1}}} 0.1 1718000000000
# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles any tensor pipe is active.
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{LABELS0}}} 0.61
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{LABELS1}}} 0.05
DCGM_FI_PROF_PIPE_FP32_ACTIVE{{{LABELS0}}} 0.2
DCGM_FI_PROF_PIPE_FP32_ACTIVE{{{LABELS1}}} 0.3
"""


def test_dmon_samples_are_percent_with_na_absent() -> None:
    samples = parse_dmon(DMON)
    assert [s.entity for s in samples] == ["GPU 0", "GPU 1", "GPU 0", "GPU 1"]
    assert samples[0].values == {1004: 10.0, 1005: 60.0, 1006: 0.0, 1007: 30.0, 1008: 0.0}
    assert samples[3].values == {}
    assert samples[2].line == 5


def test_dmon_features_pool_whole_gpus() -> None:
    features = dcgm_features(parse_dmon(DMON))
    assert features.dram_util == pytest.approx((60 + 20 + 40) / 3)
    assert features.dram_excluded_fraction == pytest.approx(1 / 4)
    assert features.fu_util == pytest.approx((30 + 50 + 70) / 3)  # per-sample max of pipes
    assert (
        features.fu_source
        == "dcgm max(PIPE_TENSOR_ACTIVE,PIPE_FP64_ACTIVE,PIPE_FP32_ACTIVE,PIPE_FP16_ACTIVE)"
    )
    assert (features.source, features.weight_unit, features.measurements) == ("dcgm", "samples", 4)


def test_dmon_features_by_entity() -> None:
    per_gpu = dcgm_features_by_entity(parse_dmon(DMON))
    assert per_gpu["GPU 0"].as_point() == pytest.approx((50.0, 50.0))
    assert per_gpu["GPU 1"].as_point() == pytest.approx((20.0, 50.0))


def test_dmon_mig_rows_are_left_out_of_the_whole_gpu_figure() -> None:
    samples = parse_dmon(DMON_MIG)
    assert [s.entity for s in samples] == ["GPU 0", "GPU-I 0", "GPU-I 1"]
    whole = dcgm_features(samples)
    # GRACT was collected: figures over the busy time (value / engine activity), capped at 100
    assert whole.as_point() == pytest.approx((40.0 / 0.429, 1.1 / 0.429))
    assert whole.busy_fraction == pytest.approx(0.429)
    assert "over busy time" in whole.dram_source
    assert whole.measurements == 1
    mig = dcgm_features(samples, entities=["GPU-I 1"])
    assert mig.as_point() == pytest.approx((100.0, 2.0 / 0.75))


def test_without_gract_every_sample_weighs_the_same() -> None:
    text = "\n".join(
        line.replace("0.429  0.429", "0.429") if "GPU 0" in line else line
        for line in DMON_MIG.replace("GRACT  ", "").splitlines()
        if "GPU-I" not in line
    )
    (sample,) = parse_dmon(text)
    assert 1001 not in sample.values
    features = dcgm_features([sample])
    assert features.as_point() == pytest.approx((40.0, 1.1))
    assert features.busy_fraction is None


def test_dmon_ignores_columns_that_are_not_profiling_ratios() -> None:
    samples = parse_dmon(DMON_MIXED)
    assert samples[0].values == pytest.approx({1005: 38.2, 1002: 65.2, 1003: 20.6, 1004: 26.7})
    features = dcgm_features(samples)
    assert features.dram_util == pytest.approx((38.2 + 33.3) / 2)
    assert features.fu_util == pytest.approx((26.7 + 22.7) / 2)  # TENSO, the only pipe field


def test_sm_active_is_a_marked_fallback_when_no_pipe_field() -> None:
    features = dcgm_features(parse_dmon("#Entity SMACT DRAMA\nGPU 0 0.5 0.25\n"))
    assert features.as_point() == pytest.approx((25.0, 50.0))
    assert "fallback" in features.fu_source


def test_dcgm_blank_sentinel_means_no_value() -> None:
    samples = parse_dmon("#Entity TENSO DRAMA\nGPU 0 140737488355328.000 0.5\n")
    assert samples[0].values == {1005: 50.0}


def test_dmon_row_with_missing_values_names_the_line() -> None:
    text = DMON.replace("GPU 1     0.500  0.200  0.000  0.100  0.000", "GPU 1     0.500  0.200")
    with pytest.raises(DcgmParseError, match="2 values but the header names 5") as excinfo:
        parse_dmon(text, source="job42.dmon")
    assert (excinfo.value.source, excinfo.value.line) == ("job42.dmon", 4)
    assert str(excinfo.value).startswith("job42.dmon:4: ")


def test_dmon_percent_instead_of_ratio_is_an_error() -> None:
    with pytest.raises(DcgmParseError, match="not a ratio within 0..1") as excinfo:
        parse_dmon("#Entity TENSO DRAMA\nGPU 0 0.1 37.5\n")
    assert excinfo.value.line == 2


def test_dmon_error_text_is_not_silently_skipped() -> None:
    text = "Error setting watches. Result: The requested operation is not supported\n"
    with pytest.raises(DcgmParseError, match="unrecognised line") as excinfo:
        parse_dmon(text)
    assert excinfo.value.line == 1


def test_dmon_without_header() -> None:
    with pytest.raises(DcgmParseError, match="no '#Entity"):
        parse_dmon("\n\n")
    with pytest.raises(DcgmParseError, match="before any '#Entity'"):
        parse_dmon("GPU 0 0.1 0.2\n")


def test_missing_dram_field_lists_what_to_collect() -> None:
    with pytest.raises(
        DcgmMissingFieldError, match=r"DCGM_FI_PROF_DRAM_ACTIVE \(1005, dmon DRAMA\)"
    ):
        dcgm_features(parse_dmon("#Entity TENSO FP32A\nGPU 0 0.1 0.2\n"))


def test_missing_fu_fields_lists_them() -> None:
    with pytest.raises(DcgmMissingFieldError, match="PIPE_FP64_ACTIVE"):
        dcgm_features(parse_dmon("#Entity DRAMA\nGPU 0 0.1\n"))


def test_unknown_entity_lists_the_present_ones() -> None:
    with pytest.raises(DcgmMissingFieldError, match=r"present: \['GPU 0', 'GPU 1'\]"):
        dcgm_features(parse_dmon(DMON), entities=["GPU 7"])


def test_exporter_text_one_sample_per_gpu_with_labels() -> None:
    samples = parse_prometheus(EXPORTER)
    assert [(s.entity, s.uuid, s.hostname) for s in samples] == [
        ("GPU 0", "GPU-aaaa", "node01"),
        ("GPU 1", "GPU-bbbb", "node01"),
    ]
    assert samples[0].labels["modelName"] == 'NVIDIA "A100", SXM4'
    assert samples[0].values == pytest.approx({1005: 45.2, 1004: 61.0, 1007: 20.0})
    features = dcgm_features(samples, entities=["GPU-bbbb"])  # select by UUID
    assert features.as_point() == pytest.approx((10.0, 30.0))


def test_exporter_concatenated_scrapes_become_a_time_series() -> None:
    second = EXPORTER.replace("} 0.452", "} 0.252").replace("} 0.61", "} 0.41")
    samples = parse_prometheus(EXPORTER + second)
    assert [s.entity for s in samples] == ["GPU 0", "GPU 1", "GPU 0", "GPU 1"]
    gpu0 = dcgm_features(samples, entities=["GPU 0"])
    assert gpu0.as_point() == pytest.approx(((45.2 + 25.2) / 2, (61 + 41) / 2))
    assert gpu0.measurements == 2


def test_exporter_mig_instances_are_separate_entities() -> None:
    text = (
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a",GPU_I_PROFILE="1g.10gb",GPU_I_ID="3"} 0.5\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-a",GPU_I_ID="3"} 0.25\n'
    )
    (sample,) = parse_prometheus(text)
    assert sample.entity == "GPU 0 GI 3"
    assert not sample.is_whole_gpu


def test_exporter_without_profiling_metrics() -> None:
    with pytest.raises(DcgmMissingFieldError, match="no DCGM_FI_PROF_"):
        parse_prometheus(f"DCGM_FI_DEV_GPU_UTIL{{{LABELS0}}} 87\n", source="node01:9400")


def test_exporter_malformed_labels_name_the_line() -> None:
    text = EXPORTER + 'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID=GPU-aaaa} 0.4\n'
    with pytest.raises(DcgmParseError, match="malformed labels") as excinfo:
        parse_prometheus(text, source="metrics.txt")
    assert excinfo.value.line == len(EXPORTER.splitlines()) + 1


def test_exporter_percent_instead_of_ratio_is_an_error() -> None:
    with pytest.raises(DcgmParseError, match="not a ratio"):
        parse_prometheus('DCGM_FI_PROF_DRAM_ACTIVE{gpu="0"} 45.2\n')
