"""A private Slurm on loopback for tests and demos (``slurm-pal testbed``)."""

from slurm_pal.testbed.cluster import LocalSlurm, NodeSpec, TestbedError, missing_binaries

__all__ = ["LocalSlurm", "NodeSpec", "TestbedError", "missing_binaries"]
