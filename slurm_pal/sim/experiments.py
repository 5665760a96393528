"""Many simulations at once: grids of configs, optionally in worker processes, and the
normalizations the paper reports (average JCT relative to Packed-Sticky = Tiresias)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from slurm_pal.core.workload import SimJob
from slurm_pal.sim.engine import SimConfig, simulate
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.variability import SimGpus

__all__ = ["BASELINE", "geomean_gain", "improvement", "run_grid"]

BASELINE = "packed-sticky"


def _run_one(args: tuple[Sequence[SimJob], SimGpus, SimConfig]) -> SimResult:
    jobs, gpus, config = args
    return simulate(jobs, gpus, config)


def run_grid(
    jobs: Sequence[SimJob],
    gpus: SimGpus,
    configs: Sequence[SimConfig],
    *,
    workers: int = 1,
    on_done: Callable[[SimConfig], None] | None = None,
) -> list[SimResult]:
    """Run every config on the same trace and GPUs; results in ``configs`` order.
    ``workers > 1`` runs them in that many processes (results are the same: runs are
    deterministic and independent)."""
    if workers <= 1 or len(configs) <= 1:
        results = []
        for config in configs:
            results.append(simulate(jobs, gpus, config))
            if on_done is not None:
                on_done(config)
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_one, (jobs, gpus, config)) for config in configs]
        results = []
        for config, future in zip(configs, futures, strict=True):
            results.append(future.result())
            if on_done is not None:
                on_done(config)
        return results


def improvement(value: float, baseline: float) -> float:
    """Relative gain over the baseline (0.4 = 40 % lower average JCT); NaN without a baseline."""
    if not (math.isfinite(value) and math.isfinite(baseline)) or baseline <= 0:
        return math.nan
    return 1.0 - value / baseline


def geomean_gain(normalized: Sequence[float]) -> float:
    """The paper's geomean improvement: 1 - geomean of normalized JCTs."""
    values = [v for v in normalized if math.isfinite(v) and v > 0]
    if not values:
        return math.nan
    return 1.0 - math.exp(sum(math.log(v) for v in values) / len(values))
