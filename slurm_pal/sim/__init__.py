"""Trace-driven simulator over the live advisor's placement core (issue 6).

``engine`` runs one (trace, GPUs, placement, scheduler) simulation, ``variability`` builds the
simulated GPUs' scores, ``metrics`` turns outcomes into figures, ``experiments`` runs sweeps.
"""

from slurm_pal.sim.engine import MODES, PLACEMENTS, SCHEDULERS, SimConfig, simulate
from slurm_pal.sim.metrics import JobOutcome, SimResult
from slurm_pal.sim.variability import SimGpus, artifact_gpus, measured_gpus, uniform_gpus

__all__ = [
    "MODES",
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
