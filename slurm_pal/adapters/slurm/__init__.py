"""Slurm adapters: reading the live cluster state and parsing what Slurm's tools print."""

from slurm_pal.adapters.slurm.parse import Gres, parse_gres
from slurm_pal.adapters.slurm.state import (
    CliStateReader,
    JobState,
    NodeState,
    SlurmQueryError,
    SlurmStateReader,
    SlurmTimeoutError,
)

__all__ = [
    "CliStateReader",
    "Gres",
    "JobState",
    "NodeState",
    "SlurmQueryError",
    "SlurmStateReader",
    "SlurmTimeoutError",
    "parse_gres",
]
