"""Trace-driven simulator over the live advisor's placement core.

``engine`` runs one (trace, GPUs, placement, scheduler) simulation, ``variability`` builds the
simulated GPUs' scores, ``metrics`` turns outcomes into figures, ``experiments`` runs sweeps,
``peers`` holds FFT-PM, SJF-BSBF/SJF-FFS, GIMBAL-style packing and their combinations with
PAL.
"""

from slurm_pal.sim.engine import (
    ALL_PLACEMENTS,
    MODES,
    PAPER_PLACEMENTS,
    PLACEMENTS,
    SCHEDULERS,
    SimConfig,
    simulate,
)
from slurm_pal.sim.metrics import JobOutcome, SimResult
from slurm_pal.sim.variability import SimGpus, artifact_gpus, measured_gpus, uniform_gpus

__all__ = [
    "ALL_PLACEMENTS",
    "MODES",
    "PAPER_PLACEMENTS",
    "PLACEMENTS",
    "SCHEDULERS",
    "JobOutcome",
    "SimConfig",
    "SimGpus",
    "SimResult",
    "artifact_gpus",
    "measured_gpus",
    "simulate",
    "uniform_gpus",
]
