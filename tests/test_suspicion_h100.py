"""The suspicion rule's NVML signals on what a real H100 read under minutes of load.

``shared/data/gpu-h100/sustained/``: per-second NVML readings of 120 s of fp16 GEMM (power
capped from the first second: clock-event reason 0x4, SM clock ~1,300 of 1,980 MHz) and 40 s
of STREAM (no reason, 1,980 MHz). Power capping is normal power management, the very
variability PM-scores measure: it must never make a GPU suspect, however low the clock it
leaves. No GPU was lent to check this live; these are the recorded readings.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from slurm_pal.campaigns.runner import decode_clock_events
from slurm_pal.core.suspicion import GpuSignals, SuspicionDetector
from tests.helpers.data import SHARED_DATA, need_shared

SUSTAINED = SHARED_DATA / "gpu-h100" / "sustained"
BUSY_GR = 50.0  # graphics engine active, in percent: a second the GPU worked


def readings(name: str) -> list[dict]:
    need_shared(SUSTAINED / name)
    return json.loads(Path(SUSTAINED / name).read_text())["rows"]


def signals(rows: list[dict], model_clock_mhz: float, mask: int | None = None) -> GpuSignals:
    """What the hooks would send for these readings: each reason's share of the busy seconds,
    and the busy SM clock over the model's median (``mask`` replaces every second's reasons)."""
    busy = [r for r in rows if r["gr"] >= BUSY_GR]
    counts: dict[str, int] = {}
    for r in busy:
        bits = int(r["reasons"], 16) if mask is None else mask
        for name in decode_clock_events(bits):
            counts[name] = counts.get(name, 0) + 1
    clock = statistics.median(r["sm_mhz"] for r in busy)
    return GpuSignals({k: n / len(busy) for k, n in counts.items()}, clock / model_clock_mhz)


def test_a_power_capped_h100_is_never_a_fault_however_low_its_clock() -> None:
    gemm, stream = readings("gemm-per-second.json"), readings("stream-per-second.json")
    rule = SuspicionDetector()
    uncapped_mhz = statistics.median(r["sm_mhz"] for r in stream if r["gr"] >= BUSY_GR)
    capped = signals(gemm, uncapped_mhz)
    assert capped.clock_events["sw_power_cap"] == pytest.approx(1.0)
    assert capped.sm_clock_ratio is not None and capped.sm_clock_ratio < 0.7  # ~1300 / 1980
    assert capped.fault(rule.signal_share, rule.clock_ratio) == ""
    assert signals(stream, uncapped_mhz).fault(rule.signal_share, rule.clock_ratio) == ""
    # The same low clock without power capping is a fault; so is hardware slowdown (0x8).
    quiet = signals(gemm, uncapped_mhz, mask=0)
    assert "not power capped" in quiet.fault(rule.signal_share, rule.clock_ratio)
    slowed = signals(gemm, uncapped_mhz, mask=0x4 | 0x8)
    assert "hw_slowdown" in slowed.fault(rule.signal_share, rule.clock_ratio)
