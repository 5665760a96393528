"""Print, as JSON, the NVML health readings the hooks' signal reader uses, per GPU, with each
call's answer or its error: which of them a GPU and driver answer decides which faults the
closed loop can see without a clock reason (link trained down, memory awaiting a reset).

Usage: python scripts/nvml_health.py [--busy-s S]   (S > 0: the widths again under a matmul)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

READINGS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "pcie_width_max": ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    "pcie_width_now": ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    "pcie_gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    "pcie_gen_gpu_max": ("nvmlDeviceGetGpuMaxPcieLinkGeneration", ()),
    "pcie_gen_now": ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    "pcie_replays": ("nvmlDeviceGetPcieReplayCounter", ()),
    "remapped_rows": ("nvmlDeviceGetRemappedRows", ()),
    "retired_pages_pending": ("nvmlDeviceGetRetiredPagesPendingStatus", ()),
    "ecc_mode": ("nvmlDeviceGetEccMode", ()),
    "clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", ()),
}


def _answer(call: Callable[..., Any], handle: Any, args: tuple[Any, ...]) -> object:
    try:
        value = call(handle, *args)
    except Exception as exc:  # NVMLError names what the GPU or driver does not support
        return {"error": f"{type(exc).__name__}: {exc}"}
    return list(value) if isinstance(value, tuple | list) else value


def readings(nvml: Any, handle: Any, names: tuple[str, ...] = tuple(READINGS)) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in names:
        function, args = READINGS[key]
        call = getattr(nvml, function, None)
        out[key] = _answer(call, handle, args) if callable(call) else {"error": "not in pynvml"}
    return out


def busy_widths(nvml: Any, handle: Any, seconds: float) -> dict[str, object]:
    """The link width and generation sampled while a matmul keeps the GPU busy (the idle
    generation drops by design; a width below the max while busy is a link trained down)."""
    import torch  # only for the busy phase

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    seen: list[tuple[object, object]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        w = readings(nvml, handle, ("pcie_width_now", "pcie_gen_now"))
        seen.append((w["pcie_width_now"], w["pcie_gen_now"]))
    torch.cuda.synchronize()
    return {"samples": len(seen), "width_gen_seen": sorted({json.dumps(s) for s in seen})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy-s", type=float, default=0.0)
    args = parser.parse_args()
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, object] = {"index": index, "idle": readings(pynvml, handle)}
            if args.busy_s > 0 and index == 0:
                gpu["busy"] = busy_widths(pynvml, handle, args.busy_s)
            out.append(gpu)
    finally:
        pynvml.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
