"""Per-second NVML/GPM readings of one GPU, idle and while a command runs.

What a detector of slowed GPUs could rely on: GPM ``GRAPHICS_UTIL`` (the busy share the
sampler weights by), ``SM_UTIL``, ``INTEGER_UTIL`` and the FP/tensor/DRAM metrics, with the SM
clock, power, temperature and clock-event reasons read in the same second. Standard library
plus pynvml; runs on a GPU node, prints one JSON document::

    python3 scripts/gpm_probe.py --idle-s 5 --label stream -- python3 profiling/stream.py ...

Each reading covers the interval before it; its ``phase`` is what the command was doing when
that interval began: ``idle`` (not started), ``run`` (start-up, warm-up), ``measure`` (after its
``PAL_MEASURE_START`` line), ``after`` (it had exited).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

METRICS = (
    "GRAPHICS_UTIL",
    "SM_UTIL",
    "SM_OCCUPANCY",
    "INTEGER_UTIL",
    "ANY_TENSOR_UTIL",
    "FP16_UTIL",
    "FP32_UTIL",
    "FP64_UTIL",
    "DRAM_BW_UTIL",
)


def _gpm_reading(nvml, handle, previous, current, ids: dict[str, int]) -> dict[str, float | None]:
    nvml.nvmlGpmSampleGet(handle, current)
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1 = previous
    request.sample2 = current
    for slot, metric_id in enumerate(ids.values()):
        request.metrics[slot].metricId = metric_id
    nvml.nvmlGpmMetricsGet(request)
    out: dict[str, float | None] = {}
    for slot, name in enumerate(ids):
        metric = request.metrics[slot]
        out[name] = round(metric.value, 3) if metric.nvmlReturn == nvml.NVML_SUCCESS else None
    return out


def _device_reading(nvml, handle) -> dict[str, object]:
    def read(func, *args):
        try:
            return func(handle, *args)
        except Exception as exc:
            return f"error: {exc}"

    reasons = read(
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    power = read(nvml.nvmlDeviceGetPowerUsage)
    return {
        "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
        "power_w": power / 1000 if isinstance(power, int) else power,
        "temperature_c": read(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": hex(reasons) if isinstance(reasons, int) else reasons,
    }


def _timestamp_lines(proc: subprocess.Popen, start: float, lines: list) -> None:
    """The command's stdout lines with when they came (the measure window starts at one)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((round(time.monotonic() - start, 2), line.rstrip()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="NVML index")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds read before the command")
    parser.add_argument("--after-s", type=float, default=2.0, help="seconds read after it ends")
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--label", default="run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...: what to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    import pynvml as nvml

    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(args.device)
        support = nvml.nvmlGpmQueryDeviceSupport(handle)
        ids = {
            name: getattr(nvml, f"NVML_GPM_METRIC_{name}")
            for name in METRICS
            if hasattr(nvml, f"NVML_GPM_METRIC_{name}")
        }
        doc: dict[str, object] = {
            "label": args.label,
            "gpu": nvml.nvmlDeviceGetName(handle),
            "uuid": nvml.nvmlDeviceGetUUID(handle),
            "driver": nvml.nvmlSystemGetDriverVersion(),
            "gpm_supported": bool(support.isSupportedDevice),
            "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
            "command": command,
            "interval_s": args.interval_s,
            "readings": [],
        }
        samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        nvml.nvmlGpmSampleGet(handle, samples[0])
        start = time.monotonic()
        proc = None
        phase = "idle"
        ended_at = None
        readings: list[dict[str, object]] = doc["readings"]  # type: ignore[assignment]
        lines: list[tuple[float, str]] = []
        while True:
            time.sleep(args.interval_s)
            now = time.monotonic() - start
            reading = {"t_s": round(now, 2), "phase": phase}
            reading.update(_gpm_reading(nvml, handle, samples[0], samples[1], ids))
            reading.update(_device_reading(nvml, handle))
            readings.append(reading)
            samples.reverse()
            if proc is None and command and now >= args.idle_s:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                reader = threading.Thread(target=_timestamp_lines, args=(proc, start, lines))
                reader.start()
                phase = "run"
            if (
                proc is not None
                and phase == "run"
                and any("PAL_MEASURE_START" in line for _, line in lines)
            ):
                phase = "measure"
            elif proc is None and not command and now >= args.idle_s:
                break
            if proc is not None and ended_at is None and proc.poll() is not None:
                ended_at = now
                phase = "after"
            if ended_at is not None and now - ended_at >= args.after_s:
                break
        if proc is not None:
            reader.join()
            doc["stdout"] = [{"t_s": t, "line": line} for t, line in lines[-40:]]
            doc["exit_code"] = proc.returncode
        for sample in samples:
            nvml.nvmlGpmSampleFree(sample)
    finally:
        nvml.nvmlShutdown()
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
