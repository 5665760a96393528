"""The busy SM clock a GPU ran at against its model's other GPUs (pure).

Why the service and not the hook: a node sees its own GPUs only, and "slow" means slower than
the same model elsewhere. So the hooks send the busy SM clock in MHz (and the GPU's max SM
clock when NVML gives it) and the service turns it into
:attr:`~slurm_pal.core.suspicion.GpuSignals.sm_clock_ratio`: the clock over the median of the
same model's *other* GPUs' recent busy clocks.

What counts as the model's clock: only readings power capping does not explain (capped under
:data:`~slurm_pal.core.suspicion.CAP_EXCUSES` of the busy time). A power-capped clock depends on
the job's power draw (an H100 ran a GEMM at ~1,300 of 1,980 MHz at its power limit and STREAM
at 1,980), so it says nothing about the GPU and would drag the median down; the readings the
rule judges are the uncapped ones, so they are judged against uncapped ones. Each GPU counts
once (the median of its last ``per_gpu`` readings), so a busy GPU does not outvote the rest
and a GPU's own readings never make its reference. Without ``min_peers`` other GPUs of the
model there is no ratio rather than one against too few: the max SM clock is not used as a
stand-in, because clocks held below it by application clocks or a site's clock lock would
then read as faults; it is part of the model key, so two SKUs sharing a name are not compared.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from slurm_pal.core.suspicion import CAP_EXCUSES, GpuSignals, JobRecord

__all__ = ["ModelClocks", "with_clock_ratios"]

ModelKey = tuple[str, float | None]


@dataclass
class ModelClocks:
    """Recent uncapped busy SM clocks per (model, max clock), per GPU; ``ratio`` before
    ``observe`` for each reading, in the order the records ended."""

    min_peers: int = 3
    per_gpu: int = 5
    _clocks: dict[ModelKey, dict[str, deque[float]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.min_peers < 1 or self.per_gpu < 1:
            raise ValueError("min_peers and per_gpu must be at least 1")

    def reference(self, gpu: str, key: ModelKey) -> float | None:
        """The median of the other GPUs' own medians (None: fewer than ``min_peers``)."""
        peers = [statistics.median(c) for g, c in self._clocks.get(key, {}).items() if g != gpu]
        return statistics.median(peers) if len(peers) >= self.min_peers else None

    def ratio(self, gpu: str, model: str, signals: GpuSignals) -> float | None:
        mhz = signals.sm_clock_mhz
        reference = self.reference(gpu, (model, signals.sm_clock_max_mhz))
        if mhz is None or reference is None or reference <= 0:
            return None
        return mhz / reference

    def observe(self, gpu: str, model: str, signals: GpuSignals) -> None:
        """Keep an uncapped busy clock as the model's (capped ones say nothing of the GPU)."""
        mhz = signals.sm_clock_mhz
        if mhz is None or mhz <= 0 or signals.power_capped >= CAP_EXCUSES:
            return
        per_model = self._clocks.setdefault((model, signals.sm_clock_max_mhz), {})
        per_model.setdefault(gpu, deque(maxlen=self.per_gpu)).append(mhz)


def with_clock_ratios(
    records: Iterable[JobRecord], models: Mapping[str, str], clocks: ModelClocks
) -> list[JobRecord]:
    """``records`` (in the order they ended) with each reading's ``sm_clock_ratio`` against
    ``clocks`` as it stood before the record, which then keeps the reading. A ratio the record
    already carries (an older sender) is kept; GPUs without a model get none."""
    out = []
    for record in records:
        signals = dict(record.signals)
        for gpu, read in record.signals.items():
            model = models.get(gpu)
            if model is None:
                continue
            if read.sm_clock_ratio is None:
                signals[gpu] = replace(read, sm_clock_ratio=clocks.ratio(gpu, model, read))
            clocks.observe(gpu, model, read)
        out.append(replace(record, signals=signals))
    return out
