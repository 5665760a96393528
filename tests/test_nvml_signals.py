"""The sampler's suspicion readings (clock-event shares over busy time, busy SM clock, memory
faults), through the fake at the pynvml boundary: what the Epilog's ``gpu_signals`` carry."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fakes.fake_pynvml import FakeClock, FakeGpu, FakePynvml, ThrottleNamedPynvml

from slurm_pal.adapters.nvml import NvmlSampler
from slurm_pal.hooks import gpus

CAP, SLOWDOWN, THERMAL = 0x4, 0x8, 0x20


def sample(nvml: FakePynvml, seconds: int = 5) -> object:
    clock = FakeClock()
    sampler = NvmlSampler(nvml, use_gpm=False, sleep=clock.sleep, monotonic=clock.monotonic)
    return sampler.sample_job([g.uuid for g in nvml.gpus], duration_s=seconds, interval_s=1)


def test_shares_are_over_busy_samples_and_the_clock_is_the_busy_median() -> None:
    gpu = FakeGpu(
        index=0,
        uuid="GPU-0",
        gpm_supported=False,
        # idle first second (not counted), then four busy ones
        utilization=[(0, 0), (90, 30), (90, 30), (90, 30), (90, 30)],
        clock_reasons=[CAP, CAP | SLOWDOWN, CAP, CAP | SLOWDOWN],  # read on busy samples only
        sm_clocks=[1300, 900, 1300, 950],
        max_sm_clock=1980,
        remapped_rows=(3, 0, 0, 0),
        retired_pending=0,
    )
    result = sample(FakePynvml([gpu]))
    (one,) = result.gpus  # type: ignore[attr-defined]
    assert one.ok and one.errors == ()  # signals never mark the utilization as failed
    assert one.signals == {
        "event_samples": 4,
        "clock_events": {"hw_slowdown": 0.5, "sw_power_cap": 1.0},
        "sm_clock_mhz": 1125.0,
        "sm_clock_max_mhz": 1980.0,
    }
    assert gpu.reason_reads == 4 and gpu.clock_reads == 4


def test_memory_faults_are_read_once_at_the_end() -> None:
    base = {"gpm_supported": False, "utilization": [(50, 10)], "sm_clocks": [1410]}
    remap = FakeGpu(index=0, uuid="GPU-0", remapped_rows=(0, 2, 1, 1), **base)  # type: ignore[arg-type]
    pages = FakeGpu(index=1, uuid="GPU-1", retired_pending=1, **base)  # type: ignore[arg-type]
    result = sample(FakePynvml([remap, pages]), seconds=2)
    first, second = result.gpus  # type: ignore[attr-defined]
    assert first.signals["memory_faults"] == ["row_remap_failure", "row_remap_pending"]
    assert second.signals["memory_faults"] == ["retired_pages_pending"]
    assert "clock_events" not in first.signals  # the reasons were NotSupported: left out


def test_a_pcie_link_narrower_than_its_max_while_busy_is_a_link_fault() -> None:
    base = {"gpm_supported": False, "sm_clocks": [1410], "max_pcie_width": 16}
    # the idle first second's width (8) does not count: only busy samples are read
    down = FakeGpu(
        index=0,
        uuid="GPU-0",
        utilization=[(0, 0), (60, 10), (60, 10), (60, 10)],
        pcie_widths=[16, 8, 16],
        **base,  # type: ignore[arg-type]
    )
    full = FakeGpu(index=1, uuid="GPU-1", utilization=[(0, 0), (60, 10)], pcie_widths=[16], **base)  # type: ignore[arg-type]
    first, second = sample(FakePynvml([down, full]), seconds=4).gpus  # type: ignore[attr-defined]
    assert first.signals["link_faults"] == ["pcie_width_degraded"]
    assert first.signals["pcie_width"] == [8, 16]
    assert "link_faults" not in second.signals and "pcie_width" not in second.signals


def test_nothing_supported_reads_nothing_and_stops_asking() -> None:
    gpu = FakeGpu(index=0, uuid="GPU-0", gpm_supported=False, utilization=[(80, 20)])
    result = sample(FakePynvml([gpu]))
    (one,) = result.gpus  # type: ignore[attr-defined]
    assert one.ok and one.signals is None and one.features is not None
    assert gpu.reason_reads == 0  # NotSupported once: never called again


def test_an_idle_job_sends_no_clock_and_an_older_pynvml_still_reads_the_reasons() -> None:
    idle = FakeGpu(index=0, uuid="GPU-0", gpm_supported=False, utilization=[(0, 0)],
                   clock_reasons=[THERMAL], sm_clocks=[300])  # fmt: skip
    assert sample(FakePynvml([idle])).gpus[0].signals is None  # type: ignore[attr-defined]
    old = FakeGpu(index=0, uuid="GPU-0", gpm_supported=False, utilization=[(70, 5)],
                  clock_reasons=[THERMAL])  # fmt: skip
    signals = sample(ThrottleNamedPynvml([old])).gpus[0].signals  # type: ignore[attr-defined]
    assert signals == {"event_samples": 5, "clock_events": {"sw_thermal": 1.0}}


def test_a_gpu_lost_mid_job_keeps_what_was_read() -> None:
    class Flaky(FakePynvml):
        def nvmlDeviceGetClockInfo(self, handle, clock_type):
            if handle.gpu.clock_reads >= 2:
                raise self.NVMLError(15)  # GPU_IS_LOST: skipped, not "never supported"
            return super().nvmlDeviceGetClockInfo(handle, clock_type)

    gpu = FakeGpu(index=0, uuid="GPU-0", gpm_supported=False, utilization=[(70, 5)],
                  clock_reasons=[0], sm_clocks=[1980])  # fmt: skip
    signals = sample(Flaky([gpu])).gpus[0].signals  # type: ignore[attr-defined]
    assert signals == {"event_samples": 5, "clock_events": {}, "sm_clock_mhz": 1980.0}


def test_the_sampler_keys_signals_by_slurm_index(tmp_path: Path) -> None:
    nvml = FakePynvml([
        FakeGpu(index=i, uuid=f"GPU-{i}", gpm_supported=False, utilization=[(90, 20)],
                clock_reasons=[SLOWDOWN if i == 1 else CAP], sm_clocks=[1000 + i])
        for i in range(2)
    ])  # fmt: skip
    stop = threading.Event()
    stop.set()  # one pass of the loop is enough here: stop at once
    summary = gpus.run_sampler(tmp_path, 7, ["GPU-0", "GPU-1"], 0.01, stop, nvml, [3, 5])
    assert summary is None or "gpu_signals" not in summary  # stopped before any sample
    stop.clear()
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    summary = gpus.run_sampler(tmp_path, 7, ["GPU-0", "GPU-1"], 0.01, stop, nvml, [3, 5])
    timer.join()
    assert summary is not None and summary["source"] == "nvml"
    assert set(summary["gpu_signals"]) == {"3", "5"}
    assert summary["gpu_signals"]["5"]["clock_events"] == {"hw_slowdown": 1.0}
    assert summary["gpu_signals"]["3"]["sm_clock_mhz"] == 1000.0
    # without the indices (a count that does not match) there are no signals, telemetry stays
    stop.clear()
    threading.Timer(0.1, stop.set).start()
    summary = gpus.run_sampler(tmp_path, 8, ["GPU-0", "GPU-1"], 0.01, stop, nvml, [3])
    assert summary is not None and "gpu_signals" not in summary and summary["samples"] >= 1


@pytest.mark.parametrize("error", [3, 13, 4])
def test_never_supported_codes_are_not_retried(error: int) -> None:
    class Never(FakePynvml):
        calls = 0

        def nvmlDeviceGetMaxClockInfo(self, handle, clock_type):
            Never.calls += 1
            raise self.NVMLError(error)

    gpu = FakeGpu(index=0, uuid="GPU-0", gpm_supported=False, utilization=[(90, 1)],
                  sm_clocks=[1500])  # fmt: skip
    signals = sample(Never([gpu])).gpus[0].signals  # type: ignore[attr-defined]
    assert signals == {"sm_clock_mhz": 1500.0} and Never.calls == 1
