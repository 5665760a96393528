"""PM-score binning: one class's per-GPU measurements -> K-Means bins (PAL paper, section III-B).

Scheduling on thousands of distinct per-GPU values is costly and over-reacts to noise, so PAL
groups GPUs of similar speed into bins and gives every GPU of a bin the bin's centroid as its
PM-score. :class:`PMBinner` is a scikit-learn style estimator doing exactly that:

1. normalize by the median GPU (1.0 = the median GPU, 1.3 = 30 % slower);
2. set aside > ``outlier_sigma`` sigma outliers (they would wreck the silhouette scores);
3. choose K in ``k_min..k_max`` by the silhouette score of K-Means on the rest, among the K whose
   neighbouring centroids are at least ``min_gap`` apart (bins closer than run-to-run noise are
   not different speeds; a class with no such K gets one bin: it shows no usable variability);
4. a GPU's PM-score is its bin's centroid; an outlier keeps its own normalized value.

``pal_artifact=True`` reproduces what PAL's public code really does instead (for like-for-like
paper reproductions): K is always 2 (a ``return`` inside its K loop), each one-sided outlier adds a
cluster, K-Means runs on all values, and scores are centroids divided by the median centroid.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

OUTLIER = -1
"""Bin label :meth:`PMBinner.predict` gives a GPU that keeps its own normalized value."""


def silhouette_1d(values: ArrayLike, labels: ArrayLike) -> float:
    """Exact mean silhouette coefficient of a 1-D clustering in O(n K log n).

    scikit-learn's ``silhouette_score`` builds pairwise distances (O(n^2)), which is too slow for
    campaigns over tens of thousands of GPUs. In one dimension the mean distance from a point to
    a cluster follows from the cluster's sorted values and prefix sums. Conventions follow
    scikit-learn: a point alone in its cluster scores 0.
    """
    x = np.asarray(values, dtype=float).ravel()
    lab = np.asarray(labels).ravel()
    uniq, lab_idx = np.unique(lab, return_inverse=True)
    if not 2 <= len(uniq) <= len(x) - 1:
        raise ValueError(
            f"silhouette needs 2 <= number of clusters <= n_samples - 1, got {len(uniq)} "
            f"clusters for {len(x)} samples"
        )
    n_clusters = len(uniq)
    # mean_dist[c, i]: mean |x_i - y| over y in cluster c (self included, distance 0).
    sums = np.empty((n_clusters, len(x)))
    sizes = np.bincount(lab_idx, minlength=n_clusters).astype(float)
    for c in range(n_clusters):
        members = np.sort(x[lab_idx == c])
        prefix = np.concatenate(([0.0], np.cumsum(members)))
        below = np.searchsorted(members, x, side="right")
        total = prefix[-1]
        sums[c] = x * below - prefix[below] + (total - prefix[below]) - x * (len(members) - below)
    own = lab_idx
    own_size = sizes[own]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(own_size > 1, sums[own, np.arange(len(x))] / (own_size - 1), 0.0)
        other = sums / sizes[:, None]
    other[own, np.arange(len(x))] = np.inf
    b = other.min(axis=0)
    denom = np.maximum(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(denom > 0, (b - a) / denom, 0.0)
    s[own_size <= 1] = 0.0
    return float(s.mean())


def kmeans_1d(
    values: ArrayLike, k: int, *, n_init: int = 10, random_state: int = 0, max_iter: int = 300
) -> tuple[NDArray[np.float64], NDArray[np.intp], float]:
    """K-Means on one dimension: (sorted centers, labels, inertia), best of ``n_init`` starts.

    Same objective and the same k-means++ seeding idea as scikit-learn's KMeans, but 1-D makes
    every Lloyd step a sort-free prefix-sum pass: clusters are intervals of the sorted values, cut
    at the midpoints between neighbouring centers. That is ~100x faster than calling KMeans ten
    times per K (``benchmarks/binning.py``), which matters for 30,000-GPU campaigns. One extra
    deterministic start from evenly spaced quantiles is always tried.
    """
    x = np.sort(np.asarray(values, dtype=float).ravel())
    n = len(x)
    if not 1 <= k <= len(np.unique(x)):
        raise ValueError(f"k must be within 1..{len(np.unique(x))} (distinct values), got {k}")
    prefix = np.concatenate(([0.0], np.cumsum(x)))
    prefix_sq = np.concatenate(([0.0], np.cumsum(x * x)))
    rng = np.random.default_rng(random_state)

    tol = 1e-4 * float(np.var(x))  # scikit-learn's default stopping rule

    def lloyd(centers: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
        for _ in range(max_iter):
            cuts = np.searchsorted(x, (centers[1:] + centers[:-1]) / 2, side="right")
            starts = np.concatenate(([0], cuts))
            ends = np.concatenate((cuts, [n]))
            counts = ends - starts
            sums = prefix[ends] - prefix[starts]
            new = np.where(counts > 0, sums / np.maximum(counts, 1), centers)
            new.sort()
            shift = float(np.sum((new - centers) ** 2))
            centers = new
            if shift <= tol:
                break
        cuts = np.searchsorted(x, (centers[1:] + centers[:-1]) / 2, side="right")
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [n]))
        counts = ends - starts
        sums = prefix[ends] - prefix[starts]
        sq = prefix_sq[ends] - prefix_sq[starts]
        inertia = float(np.sum(sq - 2 * centers * sums + counts * centers**2))
        return centers, max(inertia, 0.0)

    def plus_plus() -> NDArray[np.float64]:
        # Greedy k-means++ as in scikit-learn: 2 + log(k) candidates per step, keep the best.
        trials = 2 + int(np.log(k))
        centers = np.array([x[rng.integers(n)]])
        d2 = (x - centers[0]) ** 2
        for _ in range(k - 1):
            total = d2.sum()
            if total == 0:
                break
            cumulative = np.cumsum(d2)
            picks = np.searchsorted(cumulative, rng.random(trials) * total, side="right")
            picks = np.minimum(picks, n - 1)
            cand_d2 = np.minimum(d2[None, :], (x[None, :] - x[picks][:, None]) ** 2)
            best = int(np.argmin(cand_d2.sum(axis=1)))
            centers = np.append(centers, x[picks[best]])
            d2 = cand_d2[best]
        centers = np.unique(centers)
        return centers if len(centers) == k else _spread(x, k)

    starts_list = [_spread(x, k)] + [plus_plus() for _ in range(n_init)]
    best_centers, best_inertia = lloyd(starts_list[0])
    for init in starts_list[1:]:
        centers, inertia = lloyd(np.sort(init))
        if inertia < best_inertia - 1e-15 * max(1.0, abs(best_inertia)):
            best_centers, best_inertia = centers, inertia
    mids = (best_centers[1:] + best_centers[:-1]) / 2
    labels = np.searchsorted(mids, np.asarray(values, dtype=float).ravel(), side="right")
    return best_centers, labels.astype(np.intp), best_inertia


def _spread(x: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """k distinct start centers at evenly spaced quantiles of the sorted distinct values."""
    distinct = np.unique(x)
    return distinct[np.linspace(0, len(distinct) - 1, k).round().astype(int)]


@dataclass(frozen=True)
class Bin:
    """One PM bin: its score (the centroid, median GPU = 1.0) and how many GPUs it holds."""

    score: float
    gpus: int


class PMBinner(BaseEstimator):
    """Bin one class's per-GPU measurements (durations: higher = slower) into PM-scores.

    Fit on the per-GPU *medians* of repeated runs (one value per GPU). After ``fit``:
    ``median_`` (raw units), ``k_`` (regular bins), ``silhouette_`` (NaN when K was not chosen
    by silhouette), ``silhouette_by_k_``, ``centroids_`` (normalized, ascending),
    ``outlier_low_`` / ``outlier_high_`` (normalized thresholds; values outside keep their own
    score), ``outlier_mask_`` and ``labels_`` for the training data, and ``bins_``.
    """

    def __init__(
        self,
        *,
        k_min: int = 2,
        k_max: int = 11,
        outlier_sigma: float = 3.0,
        min_gap: float = 0.005,
        n_init: int = 10,
        random_state: int = 0,
        pal_artifact: bool = False,
    ) -> None:
        self.k_min = k_min
        self.k_max = k_max
        self.outlier_sigma = outlier_sigma
        self.min_gap = min_gap
        self.n_init = n_init
        self.random_state = random_state
        self.pal_artifact = pal_artifact

    # -- fitting -------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: object = None) -> Self:
        """Choose the bins for these per-GPU values (one per GPU, raw units, all > 0)."""
        self._check_params()
        x = _as_durations(X)
        self.median_ = float(np.median(x))
        norm = x / self.median_
        self.n_gpus_ = len(norm)
        if self.pal_artifact:
            self._fit_pal_artifact(norm)
        else:
            self._fit_silhouette(norm)
        self.labels_ = self._label_normalized(norm)
        if self.pal_artifact:
            self.outlier_mask_ = self._artifact_outliers
        else:
            self.outlier_mask_ = self.labels_ == OUTLIER
        counts = np.bincount(self.labels_[self.labels_ >= 0], minlength=len(self.centroids_))
        pairs = zip(self.centroids_, counts, strict=True)
        self.bins_ = tuple(Bin(float(c), int(n)) for c, n in pairs)
        return self

    def _check_params(self) -> None:
        if not (isinstance(self.k_min, int) and isinstance(self.k_max, int)):
            raise ValueError(f"k_min, k_max must be integers: {self.k_min!r}, {self.k_max!r}")
        if not 2 <= self.k_min <= self.k_max:
            raise ValueError(f"need 2 <= k_min <= k_max, got {self.k_min}, {self.k_max}")
        if not self.outlier_sigma > 0:
            raise ValueError(f"outlier_sigma must be > 0, got {self.outlier_sigma!r}")
        if not self.min_gap >= 0:
            raise ValueError(f"min_gap must be >= 0, got {self.min_gap!r}")
        if not (isinstance(self.n_init, int) and self.n_init >= 1):
            raise ValueError(f"n_init must be an integer >= 1, got {self.n_init!r}")

    def _fit_silhouette(self, norm: NDArray[np.float64]) -> None:
        mean, std = float(norm.mean()), float(norm.std(ddof=1)) if len(norm) > 1 else 0.0
        if std > 0:
            self.outlier_low_ = mean - self.outlier_sigma * std
            self.outlier_high_ = mean + self.outlier_sigma * std
        else:
            self.outlier_low_, self.outlier_high_ = -np.inf, np.inf
        regular = norm[(norm >= self.outlier_low_) & (norm <= self.outlier_high_)]
        n_distinct = len(np.unique(regular))
        k_top = min(self.k_max, n_distinct, len(regular) - 1)
        self.silhouette_by_k_: dict[int, float] = {}
        if k_top < self.k_min:
            # Too few distinct values to compare clusterings: one bin per distinct value.
            centroids = np.unique(regular) if n_distinct else np.array([1.0])
            if len(centroids) > 1 and np.min(np.diff(centroids)) < self.min_gap:
                centroids = np.array([float(np.mean(regular))])
            self.k_ = len(centroids)
            self.silhouette_ = float("nan")
            self.centroids_ = centroids
            return
        fits: dict[int, NDArray[np.float64]] = {}
        for k in range(self.k_min, k_top + 1):
            centers, labels, _ = kmeans_1d(
                regular, k, n_init=self.n_init, random_state=self.random_state
            )
            fits[k] = centers
            if len(np.unique(labels)) < 2 or np.min(np.diff(np.sort(centers))) < self.min_gap:
                continue
            self.silhouette_by_k_[k] = silhouette_1d(regular, labels)
        if not self.silhouette_by_k_:  # no K gives bins that differ: one bin
            self.k_, self.silhouette_ = 1, float("nan")
            self.centroids_ = np.array([float(np.mean(regular))])
            return
        # Highest silhouette wins; on a tie the smaller K (fewer, coarser bins).
        best = max(self.silhouette_by_k_, key=lambda k: (self.silhouette_by_k_[k], -k))
        self.k_ = best
        self.silhouette_ = self.silhouette_by_k_[best]
        self.centroids_ = np.sort(fits[best])

    def _fit_pal_artifact(self, norm: NDArray[np.float64]) -> None:
        # PAL's identify_outliers: one-sided, mean + 3 std (pandas std, ddof=1).
        std = float(norm.std(ddof=1)) if len(norm) > 1 else 0.0
        self.outlier_low_ = -np.inf
        self.outlier_high_ = float(norm.mean() + self.outlier_sigma * std) if std > 0 else np.inf
        self._artifact_outliers = norm > self.outlier_high_
        n_clusters = 2 + int(self._artifact_outliers.sum())
        n_clusters = min(n_clusters, len(np.unique(norm)))
        # scikit-learn's KMeans, seeded as PAL's code seeds it, to stay close to the artifact.
        model = KMeans(n_clusters=n_clusters, n_init=self.n_init, random_state=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(norm.reshape(-1, 1))
        centers = model.cluster_centers_.ravel()
        self.k_ = n_clusters
        self.silhouette_ = float("nan")
        self.silhouette_by_k_ = {}
        self.centroids_ = np.sort(centers / np.median(centers))

    # -- applying ------------------------------------------------------------------------
    def normalize(self, X: ArrayLike) -> NDArray[np.float64]:
        """Raw values -> multiples of the fitted median GPU."""
        self._check_fitted()
        return _as_durations(X) / self.median_

    def predict(self, X: ArrayLike) -> NDArray[np.intp]:
        """Bin index per value (0 = fastest bin), or :data:`OUTLIER` for an outlier."""
        return self._label_normalized(self.normalize(X))

    def transform(self, X: ArrayLike) -> NDArray[np.float64]:
        """PM-score per value: its bin centroid, or its own normalized value for an outlier."""
        norm = self.normalize(X)
        labels = self._label_normalized(norm)
        return np.where(labels == OUTLIER, norm, self.centroids_[np.maximum(labels, 0)])

    def fit_transform(self, X: ArrayLike, y: object = None) -> NDArray[np.float64]:
        return self.fit(X).transform(X)

    def _label_normalized(self, norm: NDArray[np.float64]) -> NDArray[np.intp]:
        # Nearest centroid; centroids are sorted, so the midpoints split the line.
        mids = (self.centroids_[1:] + self.centroids_[:-1]) / 2
        labels = np.searchsorted(mids, norm, side="left").astype(np.intp)
        if not self.pal_artifact:
            labels[(norm < self.outlier_low_) | (norm > self.outlier_high_)] = OUTLIER
        return labels

    def _check_fitted(self) -> None:
        if not hasattr(self, "centroids_"):
            raise RuntimeError("PMBinner is not fitted yet: call fit() on a campaign first")


def _as_durations(X: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(X, dtype=float)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x.ravel()
    if x.ndim != 1:
        raise ValueError(f"expected one value per GPU (1-D), got shape {x.shape}")
    if len(x) == 0:
        raise ValueError("no measurements: need at least one GPU")
    if not np.all(np.isfinite(x)):
        raise ValueError("measurements contain NaN or infinity; drop unmeasured GPUs first")
    if np.any(x <= 0):
        raise ValueError("measurements must be durations > 0 (higher = slower)")
    return x


# --- bounding the number of labels ------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """One PM signature as label merging sees it: its label, GPU model, PM-score per class and
    how many GPUs carry it (every GPU of a signature has the same scores)."""

    label: str
    model: str
    scores: Mapping[str, float]
    gpus: int


@dataclass(frozen=True)
class MergeCost:
    """What merging costs one class: how far a GPU's own PM-score is from its label's (the
    GPU-weighted mean of the label's members), worst and mean over the GPUs."""

    job_class: str
    worst: float
    mean: float


@dataclass(frozen=True)
class LabelMerge:
    """Which label every signature is rendered as, each label's PM-scores, and the cost."""

    labels: Mapping[str, str]  # signature label -> rendered label
    scores: Mapping[str, Mapping[str, float]]  # rendered label -> class -> PM-score
    members: Mapping[str, tuple[str, ...]]  # rendered label -> its signatures
    cost: tuple[MergeCost, ...]  # per class, in the signatures' class order
    merged: bool  # False: every signature kept its own label (nothing to merge)

    @property
    def count(self) -> int:
        return len(self.members)


def merge_signatures(
    signatures: Sequence[Signature],
    max_labels: int | None,
    *,
    keep_apart_above: float | None = None,
) -> LabelMerge:
    """At most ``max_labels`` labels: merge the closest signatures of one GPU model.

    Why: one signature is one gres.conf ``Type=``; a big site can have dozens, which breaks
    ``--gres=gpu:<model>`` habits and usage reports by model. Merging is complete linkage: the
    two groups whose union spans the smallest PM-score range in any class go together first, so
    an outlier merges last. Groups are never merged across GPU models, nor across
    ``keep_apart_above`` in any class (packed-pm keeps jobs off GPUs above ``advisor.avoid_above``
    by their label, so such GPUs must keep labels of their own). When the cap binds, every label
    of a model that merged becomes ``<model>-pm<rank>`` (0 = fastest: lowest mean PM-score), so
    the model stays readable; otherwise labels are unchanged. Raises ValueError when the cap
    cannot be met, saying the smallest count that can.
    """
    if max_labels is not None and (not isinstance(max_labels, int) or max_labels < 1):
        raise ValueError(f"max_labels must be an integer >= 1, got {max_labels!r}")
    sigs = sorted(signatures, key=lambda s: s.label)
    if len({s.label for s in sigs}) != len(sigs):
        raise ValueError("signature labels must be unique")
    classes = list(dict.fromkeys(c for s in sigs for c in s.scores))
    vectors = {
        s.label: np.array([s.scores.get(c, np.nan) for c in classes], dtype=float) for s in sigs
    }
    groups: list[list[Signature]] = [[s] for s in sigs]

    def above(group: list[Signature]) -> NDArray[np.bool_]:
        stack = np.vstack([vectors[s.label] for s in group])
        return np.asarray(stack > keep_apart_above, dtype=bool)

    def spread(a: list[Signature], b: list[Signature]) -> float | None:
        if a[0].model != b[0].model:
            return None
        members = a + b
        stack = np.vstack([vectors[s.label] for s in members])
        if keep_apart_above is not None:
            flags = above(members)
            if np.any(flags.any(axis=0) & ~flags.all(axis=0)):
                return None
        return float(np.nanmax(np.nanmax(stack, axis=0) - np.nanmin(stack, axis=0)))

    merged = False
    while max_labels is not None and len(groups) > max_labels:
        best: tuple[float, int, str, int, int] | None = None
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                width = spread(groups[i], groups[j])
                if width is None:
                    continue
                size = sum(s.gpus for s in groups[i] + groups[j])
                key = (width, size, groups[i][0].label, i, j)
                if best is None or key < best:
                    best = key
        if best is None:
            raise ValueError(
                f"max_labels = {max_labels} cannot be met: {len(groups)} labels are the fewest "
                "that keep GPU models apart"
                + (
                    f" and GPUs above {keep_apart_above:g} (advisor.avoid_above) on their own"
                    if keep_apart_above is not None
                    else ""
                )
            )
        _, _, _, i, j = best
        groups[i] = groups[i] + groups[j]
        del groups[j]
        merged = True

    def group_scores(group: list[Signature]) -> NDArray[np.float64]:
        if len(group) == 1:  # exactly its own scores, no rounding
            return vectors[group[0].label].copy()
        weights = np.array([s.gpus for s in group], dtype=float)
        stack = np.vstack([vectors[s.label] for s in group])
        if weights.sum() <= 0:
            return np.nanmean(stack, axis=0)
        masked = np.ma.masked_invalid(stack)
        return np.ma.average(masked, axis=0, weights=weights).filled(np.nan)  # type: ignore[attr-defined]

    rendered: dict[str, str] = {}
    scores: dict[str, dict[str, float]] = {}
    members: dict[str, tuple[str, ...]] = {}
    renamed_models = {g[0].model for g in groups if len(g) > 1}
    by_model: dict[str, list[tuple[float, list[Signature], NDArray[np.float64]]]] = {}
    for group in groups:
        mean = group_scores(group)
        by_model.setdefault(group[0].model, []).append((float(np.nanmean(mean)), group, mean))
    for model, entries in by_model.items():
        entries.sort(key=lambda e: (e[0], min(s.label for s in e[1])))
        for rank, (_, group, mean) in enumerate(entries):
            name = f"{model}-pm{rank}" if model in renamed_models else group[0].label
            members[name] = tuple(sorted(s.label for s in group))
            scores[name] = {c: float(v) for c, v in zip(classes, mean, strict=True)}
            for s in group:
                rendered[s.label] = name
    cost = []
    for k, c in enumerate(classes):
        errors, weights = [], []
        for s in sigs:
            own = vectors[s.label][k]
            if np.isnan(own):
                continue
            errors.append(abs(own - scores[rendered[s.label]][c]))
            weights.append(s.gpus)
        worst = max(errors, default=0.0)
        mean_error = float(np.average(errors, weights=weights)) if sum(weights) > 0 else 0.0
        cost.append(MergeCost(c, float(worst), mean_error))
    return LabelMerge(rendered, scores, members, tuple(cost), merged)
