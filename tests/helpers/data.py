"""Where the shared reference data lives (../shared/data, or SLURM_PAL_SHARED_DATA)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED_DATA / "variability" / "longhorn"
LONGHORN_FILES = {  # class -> file, as PAL's profiles.json maps them (sgemm as its own class)
    "A": "resnet-longhorn-agg.csv",
    "B": "bert-longhorn-agg.csv",
    "D": "pagerank-longhorn-agg.csv",
    "S": "sgemm-longhorn-agg.csv",
}
