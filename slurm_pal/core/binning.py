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
