"""A seeded, synthetic profiling campaign with the shape of real variability data.

The demo and the docs need a campaign that works everywhere, without shipping anybody's data.
This generator mimics what the Longhorn/Summit measurements in the PAL and SC'22 papers show:

* every GPU has a latent power-management efficiency shared by all classes, so a GPU that is
  slow for one class tends to be slow for the others;
* compute-bound classes feel it most (A spreads ~4 %, the memory-bound D well under 1 %);
* a minority of GPUs sit in a slower manufacturing/clock bin (a second mode, which K-Means finds);
* a few throttled GPUs are far slower (1.6-2.6x for class A), the > 3 sigma outliers;
* each GPU is measured ``repeats`` times with a little run-to-run noise.

The output is the project's own campaign format (``slurm-pal`` CSV columns), so it goes through
exactly the same ingest path as a real campaign.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class ClassShape:
    """How one class's benchmark responds to GPU variability."""

    benchmark: str
    base_seconds: float  # duration on the median GPU
    sensitivity: float  # relative slowdown per unit of latent inefficiency
    slow_bin_penalty: float  # extra slowdown on the slower manufacturing bin
    throttle_range: tuple[float, float]  # slowdown of a throttled GPU


DEFAULT_SHAPES: dict[str, ClassShape] = {
    "A": ClassShape("resnet50-iteration", 0.1754, 0.012, 0.045, (1.6, 2.6)),
    "B": ClassShape("bert-iteration", 0.2430, 0.006, 0.018, (1.2, 1.45)),
    "C": ClassShape("vgg19-iteration", 0.3006, 0.004, 0.008, (1.08, 1.2)),
    "D": ClassShape("pagerank", 66.03, 0.002, 0.002, (1.02, 1.05)),
}


def generate_example_campaign(
    *,
    nodes: int = 16,
    gpus_per_node: int = 4,
    node_prefix: str = "node",
    gpu_model: str = "v100",
    shapes: dict[str, ClassShape] | None = None,
    repeats: int = 3,
    slow_bin_fraction: float = 0.25,
    throttled_gpus: int = 2,
    seed: int = 2026,
) -> pd.DataFrame:
    """Rows of a synthetic campaign: every GPU x class x repeat, in the slurm-pal CSV format."""
    if nodes < 1 or gpus_per_node < 1 or repeats < 1:
        raise ValueError("nodes, gpus_per_node and repeats must be >= 1")
    shapes = DEFAULT_SHAPES if shapes is None else shapes
    rng = np.random.default_rng(seed)
    n = nodes * gpus_per_node
    if not 0 <= throttled_gpus <= n:
        raise ValueError(f"throttled_gpus must be within 0..{n}, got {throttled_gpus}")
    width = max(2, len(str(nodes)))
    node_names = np.repeat([f"{node_prefix}{i + 1:0{width}d}" for i in range(nodes)], gpus_per_node)
    indices = np.tile(np.arange(gpus_per_node), nodes)
    uuids = [f"GPU-{uuidlib.UUID(bytes=rng.bytes(16), version=4)}" for _ in range(n)]

    inefficiency = rng.standard_normal(n)  # shared across classes
    slow_bin = rng.random(n) < slow_bin_fraction
    throttled = np.zeros(n, dtype=bool)
    throttled[rng.choice(n, size=throttled_gpus, replace=False)] = True
    throttle_level = rng.random(n)  # where in each class's range a throttled GPU sits

    frames = []
    t0 = 1_764_000_000.0
    for job_class, shape in shapes.items():
        own = 0.5 * rng.standard_normal(n)  # class-specific part of the variability
        slowdown = (
            1.0 + shape.sensitivity * (inefficiency + own) + shape.slow_bin_penalty * slow_bin
        )
        lo, hi = shape.throttle_range
        slowdown = np.where(throttled, lo + (hi - lo) * throttle_level, slowdown)
        for rep in range(repeats):
            noise = 1.0 + 0.002 * rng.standard_normal(n)
            duration = shape.base_seconds * slowdown * noise
            clock = 1530.0 / np.maximum(slowdown, 1.0) ** 0.8
            frames.append(
                pd.DataFrame(
                    {
                        "uuid": uuids,
                        "node": node_names,
                        "gpu_index": indices,
                        "gpu_model": gpu_model,
                        "job_class": job_class,
                        "benchmark": shape.benchmark,
                        "duration_s": np.round(duration, 6),
                        "sm_clock_mhz": np.round(clock, 1),
                        "temperature_c": np.round(45 + 20 * rng.random(n) + 10 * throttled, 1),
                        "power_w": np.round(
                            250 - 30 * (slowdown - 1) + 10 * rng.standard_normal(n), 1
                        ),
                        "started_at": t0 + rep * 600 + np.arange(n) * 2.0,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)
