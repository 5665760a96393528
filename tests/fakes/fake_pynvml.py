"""A small, explicit fake of the part of the pynvml API that the NVML sampler uses.

Only the calls into the driver are faked. Constants, error classes and ctypes structs are
the real ones from the installed nvidia-ml-py, so the sampler is exercised against the real
struct layouts (``c_nvmlGpmMetricsGet_t``, ``c_nvmlUtilization_t``, ...) and real errors
(``NVMLError(NVML_ERROR_GPU_IS_LOST)`` is an ``NVMLError_GpuIsLost``). The fake also checks
what real NVML would reject: calls before ``nvmlInit``, a wrong struct version, GPM metrics
between samples of different GPUs or out of order.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

GPM_METRIC_NAMES = {
    getattr(real, name): name
    for name in (
        "NVML_GPM_METRIC_DRAM_BW_UTIL",
        "NVML_GPM_METRIC_FP16_UTIL",
        "NVML_GPM_METRIC_FP32_UTIL",
        "NVML_GPM_METRIC_FP64_UTIL",
        "NVML_GPM_METRIC_INTEGER_UTIL",
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        "NVML_GPM_METRIC_GRAPHICS_UTIL",
    )
}


@dataclass
class FakeGpu:
    """One GPU. ``gpm_intervals[k]`` holds the metric values between GPM samples k and k+1
    (keys are pynvml constant names, e.g. "NVML_GPM_METRIC_DRAM_BW_UTIL"; a missing key is
    reported as NOT_SUPPORTED for that metric). ``utilization[k]`` is the k-th (gpu, memory)
    reading. The last entry repeats when the lists run out.

    Signals (the suspicion rule's readings): ``clock_reasons[k]`` / ``sm_clocks[k]`` are the
    k-th reads of the clock-event bitmask / SM clock in MHz, ``max_sm_clock`` the max SM clock,
    ``remapped_rows`` (corrected, uncorrected, pending, failure) and ``retired_pending``,
    ``max_pcie_width`` and ``pcie_widths`` (the k-th read of the current PCIe link width; the
    last repeats); an empty list or None is NOT_SUPPORTED, as on a GPU without the feature."""

    index: int
    uuid: str
    gpm_supported: bool = True
    gpm_intervals: list[dict[str, float]] = field(default_factory=list)
    utilization: list[tuple[int, int]] = field(default_factory=list)
    lost_after_samples: int | None = None  # GPM sample number that fails with GPU_IS_LOST
    gpm_query_error: int | None = None  # NVML error code raised by nvmlGpmQueryDeviceSupport
    samples_taken: int = 0
    utilization_reads: int = 0
    metric_requests: list[dict[str, Any]] = field(default_factory=list)
    clock_reasons: list[int] = field(default_factory=list)
    sm_clocks: list[int] = field(default_factory=list)
    max_sm_clock: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = None
    retired_pending: int | None = None
    max_pcie_width: int | None = None
    pcie_widths: list[int] = field(default_factory=list)
    width_reads: int = 0
    reason_reads: int = 0
    clock_reads: int = 0


@dataclass(frozen=True)
class FakeHandle:
    gpu: FakeGpu


class FakePynvml:
    """Use as ``NvmlSampler(FakePynvml([...]))``."""

    NVMLError = real.NVMLError
    NVML_SUCCESS = real.NVML_SUCCESS
    NVML_GPM_METRICS_GET_VERSION = real.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRIC_DRAM_BW_UTIL = real.NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRIC_FP16_UTIL = real.NVML_GPM_METRIC_FP16_UTIL
    NVML_GPM_METRIC_FP32_UTIL = real.NVML_GPM_METRIC_FP32_UTIL
    NVML_GPM_METRIC_FP64_UTIL = real.NVML_GPM_METRIC_FP64_UTIL
    NVML_GPM_METRIC_INTEGER_UTIL = real.NVML_GPM_METRIC_INTEGER_UTIL
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = real.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    NVML_GPM_METRIC_GRAPHICS_UTIL = real.NVML_GPM_METRIC_GRAPHICS_UTIL

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        shutdown_error: int | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shutdown_error = shutdown_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.initialized = False
        self._samples: dict[int, tuple[int, int] | None] = {}  # address -> (gpu index, seq)
        self._sample_structs: dict[int, Any] = {}

    # -- helpers -----------------------------------------------------------------------------

    def _require_init(self) -> None:
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> FakeGpu:
        self._require_init()
        if not isinstance(handle, FakeHandle):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.gpu

    @staticmethod
    def _address(sample: Any) -> int:
        return ctypes.addressof(sample.contents)

    @property
    def open_samples(self) -> int:
        return len(self._samples)

    # -- init --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.shutdown_calls += 1
        self.initialized = False
        if self.shutdown_error is not None:
            raise real.NVMLError(self.shutdown_error)

    # -- devices -----------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._require_init()
        for gpu in self.gpus:
            if gpu.index == index:
                return FakeHandle(gpu)
        raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._require_init()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return FakeHandle(gpu)
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        if not gpu.utilization:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        reading = gpu.utilization[min(gpu.utilization_reads, len(gpu.utilization) - 1)]
        gpu.utilization_reads += 1
        return real.c_nvmlUtilization_t(gpu=reading[0], memory=reading[1])

    # -- signals -----------------------------------------------------------------------------

    NVML_CLOCK_SM = real.NVML_CLOCK_SM

    @staticmethod
    def _next(values: list[int], reads: int) -> int:
        if not values:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return values[min(reads, len(values) - 1)]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        value = self._next(gpu.clock_reasons, gpu.reason_reads)
        gpu.reason_reads += 1
        return value

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        if clock_type != real.NVML_CLOCK_SM:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        value = self._next(gpu.sm_clocks, gpu.clock_reads)
        gpu.clock_reads += 1
        return value

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        if clock_type != real.NVML_CLOCK_SM:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._next([] if gpu.max_sm_clock is None else [gpu.max_sm_clock], 0)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle)
        if gpu.remapped_rows is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.max_pcie_width is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_pcie_width

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.pcie_widths:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        width = gpu.pcie_widths[min(gpu.width_reads, len(gpu.pcie_widths) - 1)]
        gpu.width_reads += 1
        return width

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.retired_pending is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.retired_pending

    # -- GPM ---------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        if gpu.gpm_query_error is not None:
            raise real.NVMLError(gpu.gpm_query_error)
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._require_init()
        struct = real.struct_c_nvmlGpmSample_t()
        sample = ctypes.pointer(struct)
        address = self._address(sample)
        self._sample_structs[address] = struct
        self._samples[address] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        address = self._address(sample)
        if address not in self._samples:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        del self._samples[address]
        del self._sample_structs[address]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._gpu(handle)
        if not gpu.gpm_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        address = self._address(sample)
        if address not in self._samples:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.lost_after_samples is not None and gpu.samples_taken >= gpu.lost_after_samples:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        self._samples[address] = (gpu.index, gpu.samples_taken)
        gpu.samples_taken += 1
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._require_init()
        if request.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not 0 < request.numMetrics <= real.NVML_GPM_METRIC_MAX:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        first = self._samples.get(self._address(request.sample1))
        second = self._samples.get(self._address(request.sample2))
        if first is None or second is None or first[0] != second[0] or second[1] <= first[1]:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = next(g for g in self.gpus if g.index == first[0])
        interval = gpu.gpm_intervals[min(second[1] - 1, len(gpu.gpm_intervals) - 1)]
        requested = []
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            name = GPM_METRIC_NAMES.get(metric.metricId)
            requested.append(metric.metricId)
            if name in interval:
                metric.value = interval[name]
                metric.nvmlReturn = real.NVML_SUCCESS
            else:
                metric.value = 0.0
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        gpu.metric_requests.append({"metric_ids": requested, "samples": (first[1], second[1])})
        return request


class ThrottleNamedPynvml(FakePynvml):
    """An older pynvml: the clock-event reasons only under their old "throttle" name."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return FakePynvml.nvmlDeviceGetCurrentClocksEventReasons(self, handle)


class FakeClock:
    """``monotonic``/``sleep`` pair: sleeping advances time exactly, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds
