"""NVML sampler, through a fake at the pynvml boundary (no GPU here)."""

from __future__ import annotations

import pynvml
import pytest
from fakes.fake_pynvml import FakeClock, FakeGpu, FakePynvml

from slurm_pal.adapters import nvml as nvml_adapter
from slurm_pal.adapters.nvml import SOURCE_GPM, SOURCE_UTILIZATION, NvmlSampler

H100_UUID = "GPU-8d3c2f5e-0000-4000-8000-000000000001"
V100_UUID = "GPU-1a2b3c4d-0000-4000-8000-000000000002"


def gpm_interval(dram: float, fp16: float, fp32: float, fp64: float, integer: float, tensor: float):
    return {
        "NVML_GPM_METRIC_DRAM_BW_UTIL": dram,
        "NVML_GPM_METRIC_FP16_UTIL": fp16,
        "NVML_GPM_METRIC_FP32_UTIL": fp32,
        "NVML_GPM_METRIC_FP64_UTIL": fp64,
        "NVML_GPM_METRIC_INTEGER_UTIL": integer,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": tensor,
    }


def h100(index: int = 0, uuid: str = H100_UUID, **kwargs) -> FakeGpu:
    return FakeGpu(
        index=index,
        uuid=uuid,
        gpm_intervals=[
            gpm_interval(60.0, 0.0, 20.0, 0.0, 5.0, 80.0),  # FU max 80 (tensor)
            gpm_interval(30.0, 0.0, 40.0, 0.0, 10.0, 0.0),  # FU max 40 (fp32)
            gpm_interval(90.0, 0.0, 10.0, 0.0, 50.0, 0.0),  # FU max 50 (integer)
        ],
        **kwargs,
    )


def v100(index: int = 1, uuid: str = V100_UUID) -> FakeGpu:
    return FakeGpu(
        index=index, uuid=uuid, gpm_supported=False, utilization=[(90, 40), (70, 20), (50, 60)]
    )


def sampler(fake: FakePynvml, clock: FakeClock | None = None, **kwargs) -> NvmlSampler:
    clock = clock or FakeClock()
    return NvmlSampler(fake, sleep=clock.sleep, monotonic=clock.monotonic, **kwargs)


def test_gpm_gpu_intervals_weighted_by_their_length() -> None:
    fake = FakePynvml([h100()])
    clock = FakeClock()
    job = sampler(fake, clock).sample_job([0], duration_s=2.5, interval_s=1.0)

    assert job.ok, job.all_errors()
    (gpu,) = job.gpus
    assert (gpu.device, gpu.uuid, gpu.source) == ("0", H100_UUID, SOURCE_GPM)
    assert clock.sleeps == [1.0, 1.0, 0.5]  # the last interval is cut at the deadline
    features = gpu.features
    assert features is not None
    assert features.dram_util == pytest.approx((60 * 1 + 30 * 1 + 90 * 0.5) / 2.5)
    assert features.fu_util == pytest.approx((80 * 1 + 40 * 1 + 50 * 0.5) / 2.5)
    assert (features.source, features.weight_unit) == ("nvml", "s")
    assert features.weight_total == pytest.approx(2.5)
    assert features.measurements == 3
    assert features.fu_source.startswith(SOURCE_GPM)
    assert job.features == features  # one GPU: the job figure is that GPU's


def test_gpm_requests_use_the_real_struct_and_consecutive_samples() -> None:
    gpu = h100()
    fake = FakePynvml([gpu])
    sampler(fake).sample_job([0], duration_s=3, interval_s=1)
    expected_ids = [
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        pynvml.NVML_GPM_METRIC_FP16_UTIL,
        pynvml.NVML_GPM_METRIC_FP32_UTIL,
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
        pynvml.NVML_GPM_METRIC_INTEGER_UTIL,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,  # the busy share that weights the others
    ]
    assert [r["metric_ids"] for r in gpu.metric_requests] == [expected_ids] * 3
    assert [r["samples"] for r in gpu.metric_requests] == [(0, 1), (1, 2), (2, 3)]
    assert (fake.init_calls, fake.shutdown_calls, fake.open_samples) == (1, 1, 0)


def test_pre_hopper_gpu_falls_back_to_utilization_rates() -> None:
    fake = FakePynvml([v100()])
    job = sampler(fake).sample_job([V100_UUID], duration_s=3, interval_s=1)
    (gpu,) = job.gpus
    assert gpu.source == SOURCE_UTILIZATION
    assert any("pre-Hopper" in note for note in gpu.notes)
    assert gpu.features is not None
    # weighted by the kernel-active share (the `gpu` figure): 90, 70 and 50 %
    assert gpu.features.dram_util == pytest.approx((40 * 90 + 20 * 70 + 60 * 50) / 210)
    assert gpu.features.fu_util == pytest.approx((90 * 90 + 70 * 70 + 50 * 50) / 210)
    assert gpu.features.busy_fraction == pytest.approx(210 / 300)
    assert "coarse" in gpu.features.dram_source
    assert "coarse" in gpu.features.fu_source
    assert job.ok


def test_mixed_job_uses_the_gpm_gpus_for_the_job_figure() -> None:
    fake = FakePynvml([h100(index=0), v100(index=1)])
    job = sampler(fake).sample_job([0, "1"], duration_s=3, interval_s=1)
    assert [g.source for g in job.gpus] == [SOURCE_GPM, SOURCE_UTILIZATION]
    assert job.features == job.gpus[0].features
    assert any("left out: 1" in note for note in job.notes)


def test_job_figure_pools_intervals_of_all_gpus() -> None:
    second = h100(index=1, uuid="GPU-second")
    second.gpm_intervals = [gpm_interval(10.0, 0, 0, 0, 0, 20.0)]
    fake = FakePynvml([h100(index=0), second])
    job = sampler(fake).sample_job([0, 1], duration_s=2, interval_s=1)
    assert job.features is not None
    assert job.features.dram_util == pytest.approx((60 + 30 + 10 + 10) / 4)
    assert job.features.fu_util == pytest.approx((80 + 40 + 20 + 20) / 4)
    assert job.features.measurements == 4


def test_use_gpm_false_forces_utilization_rates() -> None:
    gpu = h100()
    gpu.utilization = [(55, 44)]
    job = sampler(FakePynvml([gpu]), use_gpm=False).sample_job([0], duration_s=1, interval_s=1)
    assert job.gpus[0].source == SOURCE_UTILIZATION
    assert job.features is not None
    assert job.features.as_point() == (44.0, 55.0)


def test_old_driver_without_gpm_functions_falls_back() -> None:
    gpu = h100(gpm_query_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    gpu.utilization = [(10, 20)]
    job = sampler(FakePynvml([gpu])).sample_job([0], duration_s=1, interval_s=1)
    assert job.gpus[0].source == SOURCE_UTILIZATION
    assert any("Function Not Found" in note for note in job.gpus[0].notes)
    assert job.ok


def test_missing_tensor_metric_still_gives_fu_from_the_others() -> None:
    gpu = h100()
    for interval in gpu.gpm_intervals:
        del interval["NVML_GPM_METRIC_ANY_TENSOR_UTIL"]
    job = sampler(FakePynvml([gpu])).sample_job([0], duration_s=3, interval_s=1)
    assert job.features is not None
    assert job.features.fu_util == pytest.approx((20 + 40 + 50) / 3)


def test_dram_metric_never_available_is_reported_not_raised() -> None:
    gpu = h100()
    for interval in gpu.gpm_intervals:
        del interval["NVML_GPM_METRIC_DRAM_BW_UTIL"]
    job = sampler(FakePynvml([gpu])).sample_job([0], duration_s=2, interval_s=1)
    assert job.features is None
    assert not job.ok
    assert "no interval measured both DRAM and FU" in job.gpus[0].errors[0]


def test_unknown_devices_are_errors_for_that_gpu_only() -> None:
    fake = FakePynvml([h100(index=0)])
    job = sampler(fake).sample_job([0, 7, "GPU-nope", "eth0"], duration_s=1, interval_s=1)
    assert job.gpus[0].ok
    assert "Invalid Argument" in job.gpus[1].errors[0]
    assert "Not Found" in job.gpus[2].errors[0]
    assert "neither an index" in job.gpus[3].errors[0]
    assert job.features == job.gpus[0].features
    assert not job.ok
    assert len(job.all_errors()) == 3
    assert fake.shutdown_calls == 1


def test_gpu_lost_mid_job_keeps_what_was_measured_and_shuts_down() -> None:
    gpu = h100(lost_after_samples=3)  # samples 0, 1, 2 work: two intervals
    fake = FakePynvml([gpu])
    job = sampler(fake).sample_job([0], duration_s=4, interval_s=1)
    (result,) = job.gpus
    assert result.features is not None
    assert result.features.measurements == 2
    assert result.errors == ("nvmlGpmSampleGet failed: NVMLError_GpuIsLost: GPU is lost (x2)",)
    assert (fake.shutdown_calls, fake.open_samples) == (1, 0)


def test_nvml_init_failure_is_returned_not_raised() -> None:
    fake = FakePynvml([h100()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    job = sampler(fake).sample_job(["0", "1"], duration_s=1, interval_s=1)
    assert job.features is None
    assert job.errors == ("nvmlInit failed: NVMLError_DriverNotLoaded: Driver Not Loaded",)
    assert [g.device for g in job.gpus] == ["0", "1"]
    assert fake.shutdown_calls == 0


def test_shutdown_failure_is_reported() -> None:
    fake = FakePynvml([h100()], shutdown_error=pynvml.NVML_ERROR_UNKNOWN)
    job = sampler(fake).sample_job([0], duration_s=1, interval_s=1)
    assert job.features is not None
    assert job.errors == ("nvmlShutdown failed: NVMLError_Unknown: Unknown Error",)


def test_missing_pynvml_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module(name: str):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(nvml_adapter.importlib, "import_module", no_module)
    job = NvmlSampler().sample_job([0], duration_s=1, interval_s=1)
    assert job.features is None
    assert "cannot import pynvml" in job.errors[0]


def test_real_pynvml_without_a_driver_does_not_raise() -> None:
    """The real module in a container with no NVIDIA driver: an error result, no exception."""
    job = NvmlSampler(pynvml).sample_job([0], duration_s=0.01, interval_s=0.01)
    if job.features is not None:  # pragma: no cover - only on a machine with a GPU
        pytest.skip("an NVIDIA driver is present; this test covers the driverless case")
    assert job.errors and job.errors[0].startswith("nvmlInit failed: ")


def test_should_stop_ends_sampling_early() -> None:
    checks = iter([False, False, True])
    fake = FakePynvml([h100()])
    job = sampler(fake).sample_job(
        [0], duration_s=3600, interval_s=1, should_stop=lambda: next(checks)
    )
    assert job.features is not None
    assert job.features.measurements == 2
    assert fake.shutdown_calls == 1


def test_should_stop_that_raises_stops_and_is_reported() -> None:
    def broken() -> bool:
        raise RuntimeError("scontrol timed out")

    fake = FakePynvml([h100()])
    job = sampler(fake).sample_job([0], duration_s=10, interval_s=1, should_stop=broken)
    assert fake.shutdown_calls == 1
    assert "should_stop raised RuntimeError" in job.gpus[0].errors[0]


@pytest.mark.parametrize(
    ("devices", "duration", "interval"),
    [([], 1, 1), ([0], 0, 1), ([0], 1, 0), ([0], float("nan"), 1), ([0], 1, -1)],
)
def test_invalid_arguments_raise_value_error(devices, duration, interval) -> None:
    with pytest.raises(ValueError):
        sampler(FakePynvml([h100()])).sample_job(devices, duration_s=duration, interval_s=interval)
