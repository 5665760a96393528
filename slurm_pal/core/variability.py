"""Campaign measurements -> per-GPU PM-scores, bins and PM signatures (pure, no I/O).

A campaign holds raw runs: (job class, GPU, duration) rows, several per GPU. This module turns
them into what placement needs: per class a fitted :class:`~slurm_pal.core.binning.PMBinner`,
and per GPU a PM-score and bin in every class, plus a *PM signature* (GPU model + its bin in each
class). GPUs with one signature are interchangeable for PM-First and PAL, so a signature becomes
one gres.conf ``Type=`` label.

Identity: one physical GPU can appear under different ids in different files (the Longhorn
files use NVIDIA ``GPU-...`` UUIDs in some and ``cabinet-node-device`` locations in others).
Within one campaign, ids that share a known (node, gpu_index) location are one GPU and the NVIDIA
UUID becomes its canonical id, unless that location holds two different NVIDIA UUIDs (then the
location data is wrong and nothing is merged).

Unmeasured fallback: a GPU measured for some classes but not for class C is treated like C's
median GPU: it gets the bin (and PM-score) that the median value falls in, flagged
``measured=False``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from slurm_pal.core.binning import OUTLIER, Bin, PMBinner

GPU_COLUMNS = (
    "job_class",
    "uuid",
    "node",
    "gpu_index",
    "gpu_model",
    "n_runs",
    "raw_median",
    "norm_value",
    "pm_score",
    "bin",
    "outlier_rank",
    "measured",
)


@dataclass(frozen=True)
class ClassBins:
    """The binning of one class: what ``slurm-pal profile bins`` shows."""

    job_class: str
    mode: str  # "silhouette" or "pal-artifact"
    k: int
    silhouette: float | None
    median_raw: float
    bins: tuple[Bin, ...]
    outliers: tuple[tuple[str, float], ...]  # (uuid, score), slowest last
    # Silhouette mode: outliers are outside every bin. PAL-artifact mode: the one-sided outliers
    # PAL flags, which K-Means then clusters (so they are counted in ``bins`` too).
    measured_gpus: int
    unmeasured_gpus: int

    def to_dict(self) -> dict[str, object]:
        return {
            "k": self.k,
            "mode": self.mode,
            "silhouette": self.silhouette,
            "median_raw": self.median_raw,
            "measured_gpus": self.measured_gpus,
            "unmeasured_gpus": self.unmeasured_gpus,
            "bins": [{"score": b.score, "gpus": b.gpus} for b in self.bins],
            "outliers": [{"uuid": u, "score": s} for u, s in self.outliers],
        }


@dataclass(frozen=True)
class SignatureLabel:
    """A distinct PM signature and its short, stable label (a gres.conf ``Type=``)."""

    label: str
    gpu_model: str
    bins: tuple[tuple[str, str], ...]  # (job class, bin token) in class order
    scores: tuple[tuple[str, float], ...]  # (job class, PM-score)
    gpus: int


@dataclass(frozen=True)
class VariabilityProfile:
    """Everything derived from one campaign's measurements."""

    classes: Mapping[str, ClassBins]
    gpus: pd.DataFrame  # one row per (class, GPU): GPU_COLUMNS
    labels: tuple[SignatureLabel, ...]
    gpu_labels: Mapping[str, str]  # uuid -> label
    aliases: Mapping[str, str] = field(default_factory=dict)  # other id -> canonical uuid

    def scores(self, job_class: str) -> dict[str, float]:
        """uuid -> PM-score for one class (every GPU of the campaign has one)."""
        rows = self.gpus[self.gpus["job_class"] == job_class]
        return dict(zip(rows["uuid"], rows["pm_score"].astype(float), strict=True))


def resolve_identities(measurements: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Merge ids that name one physical GPU; return rows with canonical uuids and the aliases."""
    rows = measurements.copy()
    located = rows[(rows["node"] != "") & rows["gpu_index"].notna()]
    if located.empty:
        return rows, {}
    loc = located["node"] + "#" + located["gpu_index"].astype("Int64").astype(str)
    ids_at = pd.DataFrame({"loc": loc, "uuid": located["uuid"]}).drop_duplicates()
    aliases: dict[str, str] = {}
    for _, group in ids_at.groupby("loc", sort=True):
        ids = sorted(set(group["uuid"]))
        nvidia = [i for i in ids if i.startswith("GPU-")]
        if len(ids) < 2 or len(nvidia) > 1:
            continue  # two NVIDIA UUIDs are two GPUs: the location data is what is wrong
        canonical = nvidia[0] if nvidia else ids[0]
        for other in ids:
            if other != canonical:
                aliases[other] = canonical
    if aliases:
        rows["uuid"] = rows["uuid"].replace(aliases)
    return rows, aliases


def build_profile(
    measurements: pd.DataFrame,
    class_order: Sequence[str],
    binner: PMBinner | None = None,
) -> VariabilityProfile:
    """Bin every measured class and give each GPU its scores, bins and signature label.

    ``class_order`` lists the site's classes, most compute-bound first; classes with no
    measurements are left out, measured classes not listed are appended in name order.
    ``binner`` carries the binning parameters (cloned per class).
    """
    if measurements.empty:
        raise ValueError("campaign has no measurements")
    template = binner if binner is not None else PMBinner()
    rows, aliases = resolve_identities(measurements)
    measured_classes = set(rows["job_class"])
    order = [c for c in class_order if c in measured_classes]
    order += sorted(measured_classes - set(order))
    inventory = _inventory(rows)

    per_class_frames: list[pd.DataFrame] = []
    classes: dict[str, ClassBins] = {}
    for job_class in order:
        frame, bins = _bin_class(
            rows[rows["job_class"] == job_class], job_class, inventory, template
        )
        per_class_frames.append(frame)
        classes[job_class] = bins
    gpus = pd.concat(per_class_frames, ignore_index=True)[list(GPU_COLUMNS)]
    letters = list(class_order) + sorted(measured_classes - set(class_order))
    labels, gpu_labels = _signatures(gpus, order, [letters.index(c) for c in order])
    return VariabilityProfile(
        classes=classes, gpus=gpus, labels=labels, gpu_labels=gpu_labels, aliases=aliases
    )


def _inventory(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU: its most common node, index and model over all its runs."""
    inv = pd.DataFrame(index=pd.Index(sorted(set(rows["uuid"])), name="uuid"))
    inv["node"] = _most_common(rows, "node").reindex(inv.index).fillna("").astype(str)
    inv["gpu_index"] = _most_common(rows, "gpu_index").reindex(inv.index).astype("Int64")
    model = _most_common(rows, "gpu_model").reindex(inv.index).fillna("gpu")
    inv["gpu_model"] = model.replace("", "gpu").astype(str)
    return inv


def _most_common(rows: pd.DataFrame, column: str) -> pd.Series:
    """Per uuid, the most frequent known value of a column (ties: the smallest value)."""
    values = rows[column]
    known = rows.loc[values.notna() & (values.astype(str) != ""), ["uuid", column]]
    counts = known.groupby(["uuid", column], sort=False).size().rename("n").reset_index()
    counts = counts.sort_values(["uuid", "n", column], ascending=[True, False, True])
    return counts.drop_duplicates("uuid").set_index("uuid")[column]


def _bin_class(
    rows: pd.DataFrame, job_class: str, inventory: pd.DataFrame, template: PMBinner
) -> tuple[pd.DataFrame, ClassBins]:
    per_gpu = rows.groupby("uuid", sort=True)["duration"].agg(["median", "size"])
    binner = PMBinner(**template.get_params()).fit(per_gpu["median"].to_numpy())
    norm = binner.normalize(per_gpu["median"].to_numpy())
    labels = binner.predict(per_gpu["median"].to_numpy())
    scores = binner.transform(per_gpu["median"].to_numpy())

    frame = inventory.copy()
    frame["job_class"] = job_class
    frame["measured"] = frame.index.isin(per_gpu.index)
    frame["n_runs"] = per_gpu["size"].reindex(frame.index).fillna(0).astype(int)
    frame["raw_median"] = per_gpu["median"].reindex(frame.index)
    frame["norm_value"] = pd.Series(norm, index=per_gpu.index).reindex(frame.index)
    frame["bin"] = pd.Series(labels, index=per_gpu.index).reindex(frame.index)
    frame["pm_score"] = pd.Series(scores, index=per_gpu.index).reindex(frame.index)

    # Outliers: ranked by score so their signature token is stable (x0 = least slow outlier).
    is_outlier = frame["measured"] & (frame["bin"] == OUTLIER)
    ranks = frame.loc[is_outlier, "pm_score"].rank(method="first").astype(int) - 1
    frame["outlier_rank"] = ranks.reindex(frame.index).astype("Int64")

    # Unmeasured: the median GPU's bin (np.median of the normalized data is exactly 1.0).
    median_bin = int(binner.predict([binner.median_])[0])
    if median_bin == OUTLIER:  # only on pathological data; fall back to the nearest bin
        median_bin = int(np.argmin(np.abs(binner.centroids_ - 1.0)))
    median_score = float(binner.centroids_[median_bin])
    missing = ~frame["measured"]
    frame.loc[missing, "bin"] = median_bin
    frame.loc[missing, "pm_score"] = median_score
    frame["bin"] = frame["bin"].astype(int)
    # In PAL-artifact mode flagged outliers are clustered with everyone; list them all the same.
    mask = pd.Series(binner.outlier_mask_, index=per_gpu.index).reindex(frame.index)
    flagged = mask.fillna(False).astype(bool).to_numpy()
    frame = frame.reset_index().rename(columns={"index": "uuid"})

    outliers = frame[flagged].sort_values("pm_score")
    bins = ClassBins(
        job_class=job_class,
        mode="pal-artifact" if template.pal_artifact else "silhouette",
        k=int(binner.k_),
        silhouette=None if np.isnan(binner.silhouette_) else float(binner.silhouette_),
        median_raw=float(binner.median_),
        bins=binner.bins_,
        outliers=tuple(zip(outliers["uuid"], outliers["pm_score"].astype(float), strict=True)),
        measured_gpus=int(frame["measured"].sum()),
        unmeasured_gpus=int(missing.sum()),
    )
    return frame, bins


def bin_token(class_position: int, bin_index: int, outlier_rank: int | None) -> str:
    """Short token for one class's bin: 'a0' = first class, bin 0; 'ax2' = its third outlier."""
    letter = _class_letter(class_position)
    if bin_index == OUTLIER:
        return f"{letter}x{outlier_rank}"
    return f"{letter}{bin_index}"


def _class_letter(position: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    if position < len(letters):
        return letters[position]
    return f"c{position}_"


def _model_slug(model: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "", model.lower())
    return slug or "gpu"


def _signatures(
    gpus: pd.DataFrame, order: Sequence[str], positions: Sequence[int]
) -> tuple[tuple[SignatureLabel, ...], dict[str, str]]:
    tokens: dict[str, list[str]] = {}
    scores: dict[str, list[tuple[str, float]]] = {}
    models: dict[str, str] = {}
    for pos, job_class in zip(positions, order, strict=True):
        part = gpus[gpus["job_class"] == job_class]
        for uuid, b, rank, score, model in zip(
            part["uuid"],
            part["bin"],
            part["outlier_rank"],
            part["pm_score"],
            part["gpu_model"],
            strict=True,
        ):
            r = None if pd.isna(rank) else int(rank)
            tokens.setdefault(uuid, []).append(bin_token(pos, int(b), r))
            scores.setdefault(uuid, []).append((job_class, float(score)))
            models[uuid] = model
    by_label: dict[str, SignatureLabel] = {}
    gpu_labels: dict[str, str] = {}
    for uuid in sorted(tokens):
        label = f"{_model_slug(models[uuid])}-{''.join(tokens[uuid])}"
        gpu_labels[uuid] = label
        if label in by_label:
            old = by_label[label]
            by_label[label] = SignatureLabel(
                old.label, old.gpu_model, old.bins, old.scores, old.gpus + 1
            )
        else:
            by_label[label] = SignatureLabel(
                label=label,
                gpu_model=models[uuid],
                bins=tuple((c, t) for c, t in zip(order, tokens[uuid], strict=True)),
                scores=tuple(scores[uuid]),
                gpus=1,
            )
    return tuple(by_label[k] for k in sorted(by_label)), gpu_labels
