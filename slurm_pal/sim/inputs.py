"""The simulator's I/O edge: variability files and traces -> the engine's pure inputs.

The engine (``engine``, ``metrics``, ``variability``) never touches files; the CLI, the
benchmarks and the reproduction script come through here so they read data the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.core.binning import PMBinner
from slurm_pal.core.variability import build_profile
from slurm_pal.sim.variability import SimGpus, artifact_gpus, measured_gpus

__all__ = [
    "PAL_LONGHORN_PROFILES",
    "load_gpus",
    "parse_cluster",
    "per_gpu_from_records",
    "refuse_disjoint_profiles",
]

PAL_LONGHORN_PROFILES: Mapping[str, str] = {
    "A": "resnet-longhorn-agg.csv",
    "B": "bert-longhorn-agg.csv",
    "C": "bert-longhorn-agg.csv",
    "D": "pagerank-longhorn-agg.csv",
}
"""PAL's ``profiles.json``: class -> Longhorn file (B and C share the BERT file)."""


def parse_cluster(text: str) -> tuple[int, int]:
    """``"16x4"`` -> (16 nodes, 4 GPUs per node)."""
    try:
        nodes, per_node = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"cluster must look like NODESxGPUS (e.g. 16x4), got {text!r}") from None
    if nodes < 1 or per_node < 1:
        raise ValueError(f"cluster needs >= 1 node and >= 1 GPU per node, got {text!r}")
    return nodes, per_node


def load_gpus(
    profiles: Mapping[str, Path | str],
    n_nodes: int,
    gpus_per_node: int,
    *,
    pal_artifact: bool = False,
    seed: int | None = None,
    class_order: Sequence[str] | None = None,
    binner: PMBinner | None = None,
) -> SimGpus:
    """Simulated GPUs from per-class campaign files (``class -> CSV``, any format
    :func:`read_campaign_csv` reads).

    ``pal_artifact``: PAL's independent per-GPU draws from the raw rows (seed default 42, PAL's)
    and K = 2 binning. Otherwise the variability pipeline bins the campaign (silhouette K) and
    the simulated GPUs are measured GPUs drawn without repetition (seed default 0).
    """
    if not profiles:
        raise ValueError("no variability profiles given (CLASS=PATH)")
    order = list(class_order) if class_order is not None else list(profiles)
    files = {name: read_campaign_csv(path, job_class=name) for name, path in profiles.items()}
    if pal_artifact:
        raw = {name: files[name].rows["duration"].to_numpy() for name in order}
        return artifact_gpus(
            raw, n_nodes, gpus_per_node, seed=42 if seed is None else seed, binner=binner
        )
    rows = pd.concat([files[name].rows for name in order], ignore_index=True)
    profile = build_profile(rows, order, binner if binner is not None else PMBinner())
    refuse_disjoint_profiles(profile.gpus, {name: str(profiles[name]) for name in order})
    return measured_gpus(
        profile, n_nodes, gpus_per_node, seed=0 if seed is None else seed, classes=order
    )


def refuse_disjoint_profiles(gpus: pd.DataFrame, files: Mapping[str, str]) -> None:
    """ValueError when the classes' files measure GPU sets that share no GPU (files from two
    clusters): every simulated GPU would then be measured in one file and at the median in
    the others, which replays as if there were hardly any variability."""
    measured = gpus[gpus["measured"].astype(bool)]
    by_file: dict[str, set[str]] = {}
    for name, path in files.items():
        uuids = set(measured.loc[measured["job_class"] == name, "uuid"])
        by_file.setdefault(path, set()).update(uuids)
    if len(by_file) < 2:
        return
    for path, uuids in by_file.items():
        others = set().union(*(u for p, u in by_file.items() if p != path))
        if not uuids & others:
            rest = ", ".join(sorted(p for p in by_file if p != path))
            raise ValueError(
                f"{path} measures no GPU that {rest} measures (files from two clusters?): "
                "a replay would see each GPU in one class only; give files of one campaign"
            )


def per_gpu_from_records(
    results: Path | str, class_map: Mapping[str, str]
) -> dict[str, list[float]]:
    """Per class, one value per GPU from a campaign's runner records (``*.json``:
    ``uuid``, ``job_class``, ``duration_s``, ``status``): each GPU's median duration over the
    median GPU's. ``class_map`` maps each simulated class to the campaign class it reads
    (``{"A": "A", "B": "A", "C": "C", "D": "C"}``); GPUs not measured in every class read are
    left out."""
    durations: dict[tuple[str, str], list[float]] = {}
    paths = sorted(Path(results).glob("*.json"))
    if not paths:
        raise ValueError(f"{results}: no campaign records (*.json)")
    for path in paths:
        try:
            record = json.loads(path.read_text())
            if record.get("status") != "ok":
                continue
            key = (str(record["uuid"]), str(record["job_class"]))
            durations.setdefault(key, []).append(float(record["duration_s"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a campaign record ({exc})") from None
    wanted = sorted(set(class_map.values()))
    uuids = sorted({u for u, _ in durations if all((u, c) in durations for c in wanted)})
    if not uuids:
        raise ValueError(f"{results}: no GPU measured in every class of {wanted}")
    medians = {c: np.array([np.median(durations[(u, c)]) for u in uuids]) for c in wanted}
    normalized = {c: (v / np.median(v)).tolist() for c, v in medians.items()}
    return {name: normalized[source] for name, source in class_map.items()}
