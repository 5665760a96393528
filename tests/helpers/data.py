"""Where the shared reference data lives (../shared/data, or SLURM_PAL_SHARED_DATA), and the
guard of every test that needs it: skipped on a machine without it, failed in CI (CI=true),
where it must be present (the same rule as the Slurm, Lua and munge tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED_DATA / "variability" / "longhorn"
LONGHORN_FILES = {  # class -> file, as PAL's profiles.json maps them (sgemm as its own class)
    "A": "resnet-longhorn-agg.csv",
    "B": "bert-longhorn-agg.csv",
    "D": "pagerank-longhorn-agg.csv",
    "S": "sgemm-longhorn-agg.csv",
}
SIA = SHARED_DATA / "traces" / "sia-philly"
NCU = SHARED_DATA / "ncu"
H100 = SHARED_DATA / "gpu-h100"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def need_shared(*paths: Path) -> None:
    """Skip the test unless every path exists; in CI, fail it instead: a missing data folder
    must not turn the only reproduction of a paper figure into a quiet skip."""
    missing = [str(p) for p in paths if not p.exists()]
    if not missing:
        return
    reason = f"shared reference data not found: {', '.join(missing)} (set SLURM_PAL_SHARED_DATA)"
    if in_ci():
        pytest.fail(f"CI needs the shared reference data: {reason}", pytrace=False)
    pytest.skip(reason)
