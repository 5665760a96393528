"""Nsight Compute figures of a recorded CSV, optionally of some kernels only (the tests of the
files recorded on GPUs compare the NVML sampler's busy-time figures with them)."""

from __future__ import annotations

from pathlib import Path

from slurm_pal.adapters.ncu import application_features, read_ncu_csv
from slurm_pal.core.features import UtilizationFeatures


def ncu_features(path: Path, kernel_prefix: str | None = None) -> UtilizationFeatures:
    """The CSV's application features; with ``kernel_prefix``, of the kernels whose name
    starts with it (a short profile's set-up kernels are not what a long job runs)."""
    report = read_ncu_csv(path)
    if kernel_prefix is not None:
        kernels = tuple(k for k in report.kernels if k.kernel_name.startswith(kernel_prefix))
        assert kernels, f"no {kernel_prefix} launch in {path.name}"
        report = type(report)(**{**report.__dict__, "kernels": kernels})
    return application_features([report])
