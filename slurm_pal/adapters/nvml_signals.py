"""The NVML readings the suspicion rule uses, taken by the job's sampler alongside utilization.

Per GPU, each sample the GPU was busy (utilization above 0: the clock of an idle GPU says
nothing of its health): the clock-event reasons active (``nvmlDeviceGetCurrentClocksEvent
Reasons``, ``...ThrottleReasons`` on an older pynvml or driver; the bits named as the campaign
runner names them) and the SM clock. At the job's end, once: the memory states that need a
reset or a replacement (pending or failed row remapping on Ampere and newer, pending page
retirement on older GPUs), and a PCIe link that ran narrower than the GPU and its slot allow
while the GPU was busy (a link trained down: a fault no clock reason shows; width only, since
the link's generation drops at low load by design). The summary is small (a few reason
shares, two clocks, a list of faults) because it rides in every Epilog record.

Every call may fail: a function the library or the GPU does not have (NotSupported,
FunctionNotFound, NoPermission) is not called again for that GPU and its reading is left out;
any other failure skips that one reading. Nothing here raises or marks the utilization
figures as failed, so a GPU without these readings is measured as before.

Stdlib + pynvml only (the hooks import it).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from slurm_pal.campaigns.runner import decode_clock_events

__all__ = ["EVENT_REASON_FUNCTIONS", "SignalReader"]

#: Newer name first: pynvml 12+ renamed "throttle" reasons to "clock event" reasons.
EVENT_REASON_FUNCTIONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
# NVML return codes meaning "never here" (nvml.h), when the module does not name them.
_GONE_DEFAULTS = {
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
}
_NVML_CLOCK_SM = 1


class SignalReader:
    """One GPU's signal readings over a job (``sample`` per interval, ``finish`` at the end)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.gone: set[str] = set()  # functions not to call again on this GPU
        self.events: Counter[str] = Counter()
        self.event_samples = 0
        self.clocks: Counter[float] = Counter()  # MHz -> busy samples (clocks are few steps)
        self.max_mhz: float | None = None
        self.memory_faults: list[str] = []
        self._gone_codes = {getattr(nvml, k, v) for k, v in _GONE_DEFAULTS.items()}
        self._clock_sm = getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
        value = self._call("nvmlDeviceGetMaxClockInfo", self._clock_sm)
        if isinstance(value, int | float) and value > 0:
            self.max_mhz = float(value)
        self.busy_width: int | None = None  # the narrowest PCIe link width seen while busy
        max_width = self._call("nvmlDeviceGetMaxPcieLinkWidth")
        self.max_width = int(max_width) if isinstance(max_width, int) and max_width > 0 else None

    def _call(self, name: str, *args: Any) -> Any:
        """``nvml.name(handle, *args)``; None when it fails (and never again if it never can)."""
        func: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if name in self.gone or not callable(func):
            self.gone.add(name)
            return None
        try:
            return func(self.handle, *args)
        except Exception as exc:  # NVMLError and anything ctypes raises: never escape
            if isinstance(exc, AttributeError) or getattr(exc, "value", None) in self._gone_codes:
                self.gone.add(name)
            return None

    def _reasons(self) -> int | None:
        for name in EVENT_REASON_FUNCTIONS:
            value = self._call(name)
            if value is not None:
                return int(value)
        return None

    def _busy_now(self) -> float | None:
        rates = self._call("nvmlDeviceGetUtilizationRates")
        return None if rates is None else float(getattr(rates, "gpu", 0.0))

    def sample(self, busy: float | None) -> None:
        """One interval; ``busy``: the utilization the sampler measured over it (None: not
        measured, read it now). Only busy samples count."""
        if busy is None:
            busy = self._busy_now()
        if busy is None or not busy > 0:
            return
        mask = self._reasons()
        if mask is not None:
            self.event_samples += 1
            self.events.update(decode_clock_events(mask))
        mhz = self._call("nvmlDeviceGetClockInfo", self._clock_sm)
        if isinstance(mhz, int | float) and mhz > 0:
            self.clocks[float(mhz)] += 1
        if self.max_width is not None:
            width = self._call("nvmlDeviceGetCurrPcieLinkWidth")
            if isinstance(width, int) and width > 0:
                self.busy_width = width if self.busy_width is None else min(self.busy_width, width)

    def finish(self) -> None:
        """The memory states at the job's end (they last until a reset)."""
        rows = self._call("nvmlDeviceGetRemappedRows")
        if isinstance(rows, tuple | list) and len(rows) >= 4:
            if rows[3]:
                self.memory_faults.append("row_remap_failure")
            if rows[2]:
                self.memory_faults.append("row_remap_pending")
        if self._call("nvmlDeviceGetRetiredPagesPendingStatus"):
            self.memory_faults.append("retired_pages_pending")

    def summary(self) -> dict[str, object] | None:
        """The record's readings for this GPU (``gpu_signals`` entry; None: nothing read)."""
        out: dict[str, object] = {}
        if self.event_samples:
            n = self.event_samples
            out["event_samples"] = n
            out["clock_events"] = {k: round(c / n, 4) for k, c in sorted(self.events.items())}
        if self.clocks:
            out["sm_clock_mhz"] = statistics.median(self.clocks.elements())
            if self.max_mhz is not None:
                out["sm_clock_max_mhz"] = self.max_mhz
        if self.memory_faults:
            out["memory_faults"] = list(self.memory_faults)
        width, widest = self.busy_width, self.max_width
        if width is not None and widest is not None and width < widest:
            out["link_faults"] = ["pcie_width_degraded"]
            out["pcie_width"] = [width, widest]
        return out or None
