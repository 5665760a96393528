"""The busy SM clock against the same model's other GPUs (core/clocks.py) and the memory
faults of the suspicion rule (core/suspicion.GpuSignals)."""

from __future__ import annotations

import pytest

from slurm_pal.core.clocks import ModelClocks, with_clock_ratios
from slurm_pal.core.drift import JobRun
from slurm_pal.core.suspicion import GpuSignals, JobRecord, SuspicionDetector

RULE = SuspicionDetector()
UNCAPPED = {"sw_power_cap": 0.1}
CAPPED = {"sw_power_cap": 0.9}


def reading(mhz: float, events: dict[str, float] | None = None, top: float = 1980.0) -> GpuSignals:
    return GpuSignals(events or {}, event_samples=10, sm_clock_mhz=mhz, sm_clock_max_mhz=top)


def record(gpu: str, signals: GpuSignals, end: float) -> JobRecord:
    run = JobRun(f"j{end:g}", "app", "A", (gpu,), 100.0)
    return JobRecord(run, end, {gpu: signals})


def test_a_slow_uncapped_clock_is_judged_against_the_other_gpus_median() -> None:
    clocks = ModelClocks(min_peers=3)
    models = {f"g{i}": "h100" for i in range(5)}
    history = [record(f"g{i}", reading(1980 - 15 * i, UNCAPPED), float(i)) for i in range(3)]
    history.append(record("g3", reading(1300, CAPPED), 3.0))  # a capped GEMM: not the model's
    judged = with_clock_ratios(history, models, clocks)
    ratios = [r.signals[r.run.gpus[0]].sm_clock_ratio for r in judged]
    assert ratios[:3] == [None] * 3  # too few peers yet
    assert ratios[3] == pytest.approx(1300 / 1965)  # low, but capped: excused, not accused
    assert judged[3].signals["g3"].fault(RULE.signal_share, RULE.clock_ratio) == ""
    slow, capped = with_clock_ratios(
        [record("g4", reading(1200, UNCAPPED), 4.0), record("g4", reading(1200, CAPPED), 5.0)],
        models,
        clocks,
    )
    ratio = slow.signals["g4"].sm_clock_ratio
    assert ratio == pytest.approx(1200 / 1965)  # median of 1980, 1965, 1950; not the capped one
    assert "not power capped" in slow.signals["g4"].fault(RULE.signal_share, RULE.clock_ratio)
    assert capped.signals["g4"].fault(RULE.signal_share, RULE.clock_ratio) == ""


def test_a_gpu_is_never_its_own_reference_and_models_do_not_mix() -> None:
    clocks = ModelClocks(min_peers=1)
    for _ in range(5):
        clocks.observe("a", "h100", reading(1000, UNCAPPED))
    assert clocks.ratio("a", "h100", reading(1000)) is None
    clocks.observe("b", "h100", reading(2000, UNCAPPED))
    assert clocks.ratio("a", "h100", reading(1000)) == pytest.approx(0.5)
    assert clocks.ratio("a", "h100", reading(1000, top=1755)) is None  # another SKU
    assert clocks.ratio("a", "a100", reading(1000)) is None
    kept = GpuSignals({}, 0.7, sm_clock_mhz=1000)  # an older sender's ratio is kept
    (out,) = with_clock_ratios([record("a", kept, 1.0)], {"a": "h100"}, clocks)
    assert out.signals["a"].sm_clock_ratio == 0.7


def test_memory_faults_are_faults_and_a_clean_busy_reading_counts_as_read() -> None:
    remap = GpuSignals(memory_faults=("row_remap_pending",))
    assert remap.read and "reset the GPU" in remap.fault(RULE.signal_share, RULE.clock_ratio)
    assert GpuSignals(memory_faults=("something_new",)).fault(0.2, 0.85) == ""
    clean = GpuSignals({}, event_samples=12)
    assert clean.read and clean.fault(0.2, 0.85) == ""
    assert not GpuSignals().read


def test_a_link_trained_down_is_a_fault_and_an_unknown_link_state_is_not() -> None:
    link = GpuSignals(link_faults=("pcie_width_degraded",))
    assert link.read and "PCIe link narrower" in link.fault(0.2, 0.85)
    assert GpuSignals(link_faults=("something_new",)).fault(0.2, 0.85) == ""
