"""Sample a job's GPUs through NVML (``import pynvml`` from nvidia-ml-py) for its features.

Two sources, chosen per GPU and written into every result:

* **nvml-gpm** (Hopper and newer, where ``nvmlGpmQueryDeviceSupport`` says so): GPU
  Performance Monitoring metrics computed between two GPM samples taken ``interval_s``
  apart: ``DRAM_BW_UTIL`` for DRAM, and the max of ``FP16/FP32/FP64/INTEGER/ANY_TENSOR_UTIL``
  for the peak functional unit. Both are 0-100 % like the ncu pct-of-peak metrics.
  ``GRAPHICS_UTIL`` (graphics-engine activity) says how busy the GPU was in each interval.
* **nvml-utilization** (any GPU, the fallback): ``nvmlDeviceGetUtilizationRates``. Its
  ``memory`` figure is the share of time the memory controller was busy (a coarse DRAM
  proxy) and its ``gpu`` figure the share of time any kernel ran (a coarse stand-in for FU
  utilization, not a pipe measurement, and the busy share). The ``fu_source`` says so.

**Busy time.** ncu weights kernels by their run time, so its figures never see idle time; a
job's window has idle seconds (start-up, data loading, the end). Averaged over the whole
window the H100 recordings halve a GEMM's figures (DRAM 12.0 / FU 45.6 against ncu's 24.2 /
93.0). So the figures are taken over the busy time (:func:`~slurm_pal.core.features.
busy_time_mean`): GPM values are divided by the interval's graphics-engine activity and
weighted by it (idle intervals drop out); utilization rates are weighted by the ``gpu`` share.
``busy_fraction`` records how much of the window was busy. Where no busy share was measured
(an old pynvml without ``GRAPHICS_UTIL``) the whole-window mean is kept and the sources say so.

Built for the Prolog/Epilog hooks: :meth:`NvmlSampler.sample_job` never raises on NVML
trouble (missing library, driver not loaded, GPU lost, unknown device). It returns a
:class:`JobUtilization` that says per GPU what was measured and what failed; NVML is
initialised once per call and always shut down. Only invalid arguments raise (ValueError).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from slurm_pal.adapters.nvml_signals import SignalReader
from slurm_pal.core.features import (
    UtilizationFeatures,
    busy_time_mean,
    weighted_mean_skipping_missing,
)

__all__ = [
    "GPM_BUSY_METRIC",
    "GPM_FU_METRICS",
    "SOURCE_GPM",
    "SOURCE_UTILIZATION",
    "GpuUtilization",
    "JobUtilization",
    "NvmlSampler",
]

SOURCE_GPM = "nvml-gpm"
SOURCE_UTILIZATION = "nvml-utilization"

#: GPM metric constant names in pynvml (functional units; the max of these is the FU figure).
GPM_FU_METRICS: tuple[str, ...] = (
    "NVML_GPM_METRIC_FP16_UTIL",
    "NVML_GPM_METRIC_FP32_UTIL",
    "NVML_GPM_METRIC_FP64_UTIL",
    "NVML_GPM_METRIC_INTEGER_UTIL",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
)
GPM_DRAM_METRIC = "NVML_GPM_METRIC_DRAM_BW_UTIL"
#: Graphics-engine activity: the share of the interval the GPU was busy (weights the others).
GPM_BUSY_METRIC = "NVML_GPM_METRIC_GRAPHICS_UTIL"

_SOURCE_DESCRIPTIONS = {
    SOURCE_GPM: (
        f"{SOURCE_GPM} DRAM_BW_UTIL",
        f"{SOURCE_GPM} max(FP16,FP32,FP64,INTEGER,ANY_TENSOR)_UTIL",
    ),
    SOURCE_UTILIZATION: (
        f"{SOURCE_UTILIZATION}.memory (coarse: memory-controller busy time)",
        f"{SOURCE_UTILIZATION}.gpu (coarse: kernel-active time, not pipe utilization)",
    ),
}
# Better first: when a job's GPUs mix sources, the job figure uses the best one only.
_SOURCE_PREFERENCE = (SOURCE_GPM, SOURCE_UTILIZATION)


@dataclass(frozen=True)
class GpuUtilization:
    """What one GPU measured during the job (``features`` is None when nothing worked)."""

    device: str
    uuid: str | None
    source: str | None
    features: UtilizationFeatures | None
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    signals: dict[str, object] | None = None  # what the suspicion rule reads (nvml_signals)

    @property
    def ok(self) -> bool:
        return self.features is not None and not self.errors


@dataclass(frozen=True)
class JobUtilization:
    """Per-GPU and per-job features; ``errors`` are failures outside any single GPU."""

    gpus: tuple[GpuUtilization, ...]
    features: UtilizationFeatures | None
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every GPU was measured without error."""
        return self.features is not None and not self.errors and all(gpu.ok for gpu in self.gpus)

    def all_errors(self) -> list[str]:
        """Every error, prefixed by the GPU it belongs to, for logs."""
        return list(self.errors) + [f"{g.device}: {e}" for g in self.gpus for e in g.errors]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class _Interval:
    dram: float | None
    fu: float | None
    seconds: float
    busy: float | None = None  # percent of the interval the GPU was busy; None: not measured


@dataclass
class _DeviceState:
    """Per-GPU sampling state; every NVML call goes through :meth:`_call` (never raises)."""

    requested: str
    nvml: ModuleType
    handle: Any = None
    uuid: str | None = None
    source: str | None = None
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, current]
    gpm_metric_ids: list[int] = field(default_factory=list)
    gpm_busy_slot: int | None = None  # slot of GRAPHICS_UTIL in the request, if requested
    intervals: list[_Interval] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # message -> occurrences
    notes: list[str] = field(default_factory=list)
    signals: SignalReader | None = None

    def _call(self, what: str, func: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            return True, func(*args)
        except Exception as exc:  # NVMLError and anything ctypes raises: never escape
            message = f"{what} failed: {_describe(exc)}"
            self.errors[message] = self.errors.get(message, 0) + 1
            return False, None

    # -- setup -------------------------------------------------------------------------------

    def open(self, use_gpm: bool) -> None:
        nvml = self.nvml
        text = self.requested.strip()
        if text.isdigit():
            ok, self.handle = self._call(
                f"nvmlDeviceGetHandleByIndex({text})", nvml.nvmlDeviceGetHandleByIndex, int(text)
            )
        elif text.startswith(("GPU-", "MIG-")):
            ok, self.handle = self._call(
                f"nvmlDeviceGetHandleByUUID({text})", nvml.nvmlDeviceGetHandleByUUID, text
            )
        else:
            self.errors[
                f"device {text!r} is neither an index (e.g. '0') nor a UUID ('GPU-...', 'MIG-...')"
            ] = 1
            return
        if not ok:
            return
        ok, uuid = self._call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, self.handle)
        self.uuid = _as_text(uuid) if ok else None
        self.signals = SignalReader(nvml, self.handle)
        if use_gpm and self._open_gpm():
            self.source = SOURCE_GPM
        else:
            self.source = SOURCE_UTILIZATION

    def _open_gpm(self) -> bool:
        nvml = self.nvml
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(self.handle)
            supported = bool(support.isSupportedDevice)
        except Exception as exc:  # old driver/pynvml (FunctionNotFound), NotSupported, ...
            self.notes.append(f"GPM unavailable ({_describe(exc)}); using utilization rates")
            return False
        if not supported:
            self.notes.append("GPM not supported on this GPU (pre-Hopper); using utilization rates")
            return False
        try:
            self.gpm_metric_ids = [getattr(nvml, GPM_DRAM_METRIC)] + [
                getattr(nvml, name) for name in GPM_FU_METRICS
            ]
        except AttributeError as exc:
            self.notes.append(f"pynvml lacks GPM constants ({exc}); using utilization rates")
            return False
        busy_id = getattr(nvml, GPM_BUSY_METRIC, None)
        if busy_id is None:
            self.notes.append(
                "pynvml lacks NVML_GPM_METRIC_GRAPHICS_UTIL: figures are over the whole window, "
                "idle time included"
            )
        else:
            self.gpm_busy_slot = len(self.gpm_metric_ids)
            self.gpm_metric_ids.append(busy_id)
        for _ in range(2):
            ok, sample = self._call("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
            if not ok:
                self.close()
                return False
            self.gpm_samples.append(sample)
        ok, _ = self._call(
            "nvmlGpmSampleGet", nvml.nvmlGpmSampleGet, self.handle, self.gpm_samples[0]
        )
        if not ok:
            self.close()
            self.notes.append("first GPM sample failed; using utilization rates")
            return False
        return True

    # -- measuring ---------------------------------------------------------------------------

    def measure(self, seconds: float) -> None:
        before = len(self.intervals)
        if self.source == SOURCE_GPM:
            self._measure_gpm(seconds)
        elif self.source == SOURCE_UTILIZATION:
            self._measure_utilization(seconds)
        if self.signals is not None:  # busy as just measured, else the reader reads it
            self.signals.sample(self.intervals[-1].busy if len(self.intervals) > before else None)

    def _measure_gpm(self, seconds: float) -> None:
        nvml = self.nvml
        previous, current = self.gpm_samples
        ok, _ = self._call("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet, self.handle, current)
        if not ok:
            return  # keep `previous`; the next interval spans the gap
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.gpm_metric_ids)
        request.sample1 = previous
        request.sample2 = current
        for slot, metric_id in enumerate(self.gpm_metric_ids):
            request.metrics[slot].metricId = metric_id
        ok, _ = self._call("nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet, request)
        self.gpm_samples = [current, previous]  # `current` is the start of the next interval
        if not ok:
            return
        values: list[float | None] = []
        for slot in range(len(self.gpm_metric_ids)):
            metric = request.metrics[slot]
            good = metric.nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(metric.value)
            values.append(float(metric.value) if good else None)
        busy = None if self.gpm_busy_slot is None else values[self.gpm_busy_slot]
        fu_slots = range(1, 1 + len(GPM_FU_METRICS))
        fu_values = [v for v in (values[i] for i in fu_slots) if v is not None]
        fu = max(fu_values) if fu_values else None
        self.intervals.append(_Interval(values[0], fu, seconds, busy))

    def _measure_utilization(self, seconds: float) -> None:
        ok, rates = self._call(
            "nvmlDeviceGetUtilizationRates", self.nvml.nvmlDeviceGetUtilizationRates, self.handle
        )
        if ok:
            gpu = float(rates.gpu)
            self.intervals.append(_Interval(float(rates.memory), gpu, seconds, gpu))

    def close(self) -> None:
        for sample in self.gpm_samples:
            self._call("nvmlGpmSampleFree", self.nvml.nvmlGpmSampleFree, sample)
        self.gpm_samples = []

    # -- result ------------------------------------------------------------------------------

    def result(self) -> GpuUtilization:
        errors = [f"{m} (x{n})" if n > 1 else m for m, n in self.errors.items()]
        features = _features(self.source, self.intervals)
        if features is None and self.source is not None:
            errors.append("no interval measured both DRAM and FU utilization")
        return GpuUtilization(
            device=self.requested,
            uuid=self.uuid,
            source=self.source,
            features=features,
            errors=tuple(errors),
            notes=tuple(self.notes),
            signals=None if self.signals is None else self.signals.summary(),
        )


def _features(source: str | None, intervals: Sequence[_Interval]) -> UtilizationFeatures | None:
    """The figures over the GPU's busy time (whole window when no busy share was measured)."""
    if source is None or not intervals:
        return None
    seconds = [interval.seconds for interval in intervals]
    dram_source, fu_source = _SOURCE_DESCRIPTIONS[source]
    busy = [interval.busy for interval in intervals]
    rescale = source == SOURCE_GPM  # GPM values span the whole interval; `gpu` is the share
    if any(b is not None for b in busy):
        try:
            dram_b = busy_time_mean([i.dram for i in intervals], busy, seconds, rescale=rescale)
            # the fallback's FU figure *is* the busy share: weighted, never rescaled
            fu_b = busy_time_mean([i.fu for i in intervals], busy, seconds, rescale=rescale)
        except ValueError:
            pass  # idle throughout: nothing ran, the whole-window mean says so
        else:
            how = "over busy time" if rescale else "weighted by the busy share"
            return UtilizationFeatures.over_busy_time(
                dram_b,
                fu_b,
                source="nvml",
                dram_source=f"{dram_source} {how}",
                fu_source=f"{fu_source} {how}",
                measurements=len(intervals),
                weight_unit="s",
            )
        window = "whole window: the GPU was idle throughout"
        busy_fraction: float | None = 0.0
    else:
        window = "whole window: no busy share measured"
        busy_fraction = None
    try:
        dram = weighted_mean_skipping_missing([i.dram for i in intervals], seconds)
        fu = weighted_mean_skipping_missing([i.fu for i in intervals], seconds)
    except ValueError:
        return None
    return UtilizationFeatures(
        dram_util=dram.mean,
        fu_util=fu.mean,
        source="nvml",
        dram_source=f"{dram_source} ({window})",
        fu_source=f"{fu_source} ({window})",
        measurements=len(intervals),
        weight_total=math.fsum(seconds),
        weight_unit="s",
        dram_excluded_fraction=dram.excluded_fraction,
        fu_excluded_fraction=fu.excluded_fraction,
        busy_fraction=busy_fraction,
    )


class NvmlSampler:
    """Samples a job's GPUs every ``interval_s`` seconds and aggregates per GPU and per job.

    ``pynvml_module`` is injected in tests (a fake at the pynvml boundary); by default the
    real ``pynvml`` is imported on first use, so importing this module needs no driver.
    ``sleep``/``monotonic`` are injectable for the same reason.
    """

    def __init__(
        self,
        pynvml_module: ModuleType | Any | None = None,
        *,
        use_gpm: bool = True,
        sleep: Callable[[float], object] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._module = pynvml_module
        self.use_gpm = use_gpm
        self._sleep = sleep
        self._monotonic = monotonic

    def _load(self) -> Any:
        if self._module is None:
            self._module = importlib.import_module("pynvml")
        return self._module

    def sample_job(
        self,
        devices: Sequence[int | str],
        duration_s: float,
        interval_s: float = 1.0,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> JobUtilization:
        """Sample ``devices`` (NVML indices or UUIDs) for ``duration_s`` seconds.

        Stops early when ``should_stop()`` returns True (checked before every interval), so
        a hook can run it in the background until the job ends. The last interval may be
        shorter; every interval is weighted by its measured length.
        """
        if not devices:
            raise ValueError("devices must name at least one GPU (index or UUID)")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"duration_s must be a positive number, got {duration_s!r}")
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a positive number, got {interval_s!r}")

        try:
            nvml = self._load()
        except Exception as exc:
            return _failed(devices, f"cannot import pynvml (nvidia-ml-py): {_describe(exc)}")
        try:
            nvml.nvmlInit()
        except Exception as exc:
            return _failed(devices, f"nvmlInit failed: {_describe(exc)}")

        states = [_DeviceState(requested=str(d), nvml=nvml) for d in devices]
        shutdown_errors: list[str] = []
        try:
            for state in states:
                state.open(self.use_gpm)
            self._loop(states, duration_s, interval_s, should_stop)
        finally:
            for state in states:
                if state.signals is not None:  # the memory state at the end, before shutdown
                    state.signals.finish()
                state.close()
            try:
                nvml.nvmlShutdown()
            except Exception as exc:
                shutdown_errors.append(f"nvmlShutdown failed: {_describe(exc)}")
        gpus = tuple(state.result() for state in states)
        features, notes = _job_features(states)
        return JobUtilization(
            gpus=gpus, features=features, errors=tuple(shutdown_errors), notes=tuple(notes)
        )

    def _loop(
        self,
        states: Sequence[_DeviceState],
        duration_s: float,
        interval_s: float,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        active = [s for s in states if s.source is not None]
        if not active:
            return
        start = last = self._monotonic()
        deadline = start + duration_s
        while True:
            now = self._monotonic()
            if now >= deadline:
                break
            if should_stop is not None and _stop_requested(should_stop, states):
                break
            self._sleep(max(0.0, min(last + interval_s, deadline) - now))
            now = self._monotonic()
            elapsed = now - last
            if elapsed <= 0:
                continue
            for state in active:
                state.measure(elapsed)
            last = now


def _stop_requested(should_stop: Callable[[], bool], states: Sequence[_DeviceState]) -> bool:
    try:
        return bool(should_stop())
    except Exception as exc:  # a broken callback must not leave NVML initialised forever
        for state in states:
            state.errors[f"should_stop raised {_describe(exc)}; stopped sampling"] = 1
        return True


def _failed(devices: Sequence[int | str], message: str) -> JobUtilization:
    gpus = tuple(
        GpuUtilization(device=str(d), uuid=None, source=None, features=None) for d in devices
    )
    return JobUtilization(gpus=gpus, features=None, errors=(message,))


def _job_features(states: Sequence[_DeviceState]) -> tuple[UtilizationFeatures | None, list[str]]:
    """Pool the intervals of the GPUs with the best source that measured anything."""
    for source in _SOURCE_PREFERENCE:
        chosen = [s for s in states if s.source == source and _features(source, s.intervals)]
        if not chosen:
            continue
        features = _features(source, [i for s in chosen for i in s.intervals])
        chosen_ids = {id(s) for s in chosen}
        left_out = [s.requested for s in states if id(s) not in chosen_ids]
        notes = (
            [f"job figure uses {source} GPUs only; left out: {', '.join(left_out)}"]
            if left_out
            else []
        )
        return features, notes
    return None, []
