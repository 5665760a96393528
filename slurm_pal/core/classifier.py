"""Job classes from (DRAM utilization, peak functional-unit utilization), as PAL defines them.

K-Means in the 2-D plane of :data:`~slurm_pal.core.features.FEATURE_ORDER` (both in percent of
peak, 0-100, so no rescaling: one percentage point is worth the same on both axes). K is a
parameter; the PAL paper's example uses 3.

**Class order.** K-Means numbers its clusters arbitrarily, but class A must always mean "most
compute-bound, most sensitive to GPU variability" (it gets the best GPUs). So the centroids are
sorted by their compute-boundness score ``fu_util - dram_util``, highest first: A is the most
compute-bound class, the last class the most memory-bound. Ties (equal score) go to the higher
FU, then to the lower DRAM. The order is a property of the centroids only, so a refit on the
same applications gives the same names.

**Duplicates and noise.** K-Means sees each distinct *behaviour* once. Measurements within
``noise_tolerance`` percentage points of each other on both axes (complete linkage: every two
points of a group are that close) are one behaviour: two profiles of one kernel that differ
by measurement noise (GEMM at DRAM 24.2 / FU 93.0 and 24.3 / 93.0) get one class and do not
outweigh the others; 0 merges only identical measurements.

**Determinism.** The rows are put in a canonical (sorted) order before K-Means runs with a
fixed ``random_state`` on one thread, so a refit on the same applications in any order, on
any machine, gives the same centroids and the same labels.

**Too few applications.** With fewer distinct behaviours than K, K-Means cannot make K classes.
By default that is an error (:class:`TooFewApplicationsError`) that says how many are needed:
the classes feed per-class PM-scores, so silently making fewer would change what the names
mean. ``too_few="reduce"`` (what `apps fit` uses, with a note) instead fits as many classes as
there are distinct behaviours, warns
(:class:`TooFewApplicationsWarning`) and records it in ``n_classes_``; the classes are then the
first ``n_classes_`` names (A, B, ...), still ordered by the score.

Pure: no I/O. :meth:`JobClassifier.to_dict` / :meth:`JobClassifier.from_dict` give the
JSON-able form the store persists.
"""

from __future__ import annotations

import string
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.cluster import KMeans
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from slurm_pal.core.features import FEATURE_ORDER, UtilizationFeatures
from slurm_pal.errors import SlurmPalError

__all__ = [
    "MODEL_FORMAT",
    "MODEL_VERSION",
    "JobClassifier",
    "TooFewApplicationsError",
    "TooFewApplicationsWarning",
    "default_class_names",
]

MODEL_FORMAT = "slurm-pal/job-classifier"
MODEL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
ORDERING = (
    "centroids sorted by compute-boundness score fu_util - dram_util, highest first "
    "(A = most compute-bound); ties: higher fu_util, then lower dram_util"
)
_PERCENT_TOLERANCE = 1e-6
DEFAULT_NOISE_TOLERANCE = 1.0
"""Percentage points two measurements of one application may differ by (DRAM and FU)."""
_TOO_FEW_CHOICES = ("raise", "reduce")


class TooFewApplicationsError(SlurmPalError, ValueError):
    """Fewer distinct behaviours (applications beyond measurement noise) than classes."""


class TooFewApplicationsWarning(UserWarning):
    """``too_few="reduce"`` fitted fewer classes than ``n_classes``."""


def default_class_names(n_classes: int) -> list[str]:
    """A, B, C, ... (then A1, B1, ... past Z, for completeness)."""
    letters = string.ascii_uppercase
    return [letters[i % 26] + (str(i // 26) if i >= 26 else "") for i in range(n_classes)]


def _as_points(X: Any) -> np.ndarray:
    """Accept an (n, 2) array-like, a DataFrame with dram_util/fu_util columns, or a
    sequence of UtilizationFeatures; return a float (n, 2) array after validation."""
    if isinstance(X, Sequence) and X and all(isinstance(x, UtilizationFeatures) for x in X):
        points = np.array([x.as_point() for x in X], dtype=float)
    elif hasattr(X, "columns") and all(c in X.columns for c in FEATURE_ORDER):
        points = np.asarray(X[list(FEATURE_ORDER)], dtype=float)
    else:
        try:
            points = np.asarray(X, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"features must be numbers: {exc}") from None
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(
            f"expected shape (n_applications, 2) with columns {FEATURE_ORDER}, "
            f"got shape {points.shape}"
        )
    if points.shape[0] == 0:
        raise ValueError("no applications given")
    bad = np.flatnonzero(~np.isfinite(points).all(axis=1))
    if bad.size:
        raise ValueError(
            f"features must be finite numbers; rows {bad[:10].tolist()} contain NaN or inf "
            f"(first: {points[bad[0]].tolist()}); measure those applications again or leave "
            "them out"
        )
    outside = np.flatnonzero(
        ((points < -_PERCENT_TOLERANCE) | (points > 100 + _PERCENT_TOLERANCE)).any(axis=1)
    )
    if outside.size:
        raise ValueError(
            f"features are percent of peak within 0..100; rows {outside[:10].tolist()} are "
            f"outside (first: {points[outside[0]].tolist()}); a value like 2429 % comes from "
            "averaging kernels by name instead of by launch"
        )
    return points


def _behaviours(points: np.ndarray, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """Group measurements that differ by at most ``tolerance`` points on each axis (complete
    linkage, so no chain of small steps joins far-apart points). Returns each point's group
    and the groups' mean points, sorted, so the result depends only on the set of points."""
    distinct, inverse = np.unique(points, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if tolerance <= 0 or len(distinct) < 2:
        return inverse, distinct
    from scipy.cluster.hierarchy import fcluster, linkage

    tree = linkage(distinct, method="complete", metric="chebyshev")
    group_of_distinct = fcluster(tree, t=tolerance, criterion="distance") - 1
    means = np.array(
        [distinct[group_of_distinct == g].mean(axis=0) for g in range(group_of_distinct.max() + 1)]
    )
    means, group_to_sorted = np.unique(means, axis=0, return_inverse=True)
    return group_to_sorted.reshape(-1)[group_of_distinct][inverse], means


class JobClassifier(ClusterMixin, BaseEstimator):
    """K-Means job classes in the (DRAM util, FU util) plane, ordered compute -> memory bound.

    Parameters:
        n_classes: K, the number of classes (PAL's example: 3).
        random_state: seed of K-Means' initialisation.
        class_names: names from most compute-bound to most memory-bound; default A, B, C, ...
        n_init: K-Means restarts (the best inertia wins).
        too_few: "raise" (default) or "reduce" when there are fewer distinct behaviours
            than ``n_classes``; see the module docstring.
        noise_tolerance: percentage points within which measurements are one behaviour.

    Fitted attributes:
        cluster_centers_: (n_classes_, 2) centroids in class order (A first).
        compute_scores_: ``fu_util - dram_util`` of each centroid (non-increasing).
        classes_: class names in the same order.
        labels_: class name of each training application.
        n_classes_: classes actually fitted (< n_classes only with too_few="reduce").
        n_behaviours_: distinct behaviours K-Means saw (measurements merged within the noise).
        inertia_: K-Means' sum of squared distances.
        n_features_in_, n_samples_fit_.
    """

    def __init__(
        self,
        n_classes: int = 3,
        random_state: int = 0,
        class_names: Sequence[str] | None = None,
        n_init: int = 10,
        too_few: Literal["raise", "reduce"] = "raise",
        noise_tolerance: float = DEFAULT_NOISE_TOLERANCE,
    ) -> None:
        self.n_classes = n_classes
        self.random_state = random_state
        self.class_names = class_names
        self.n_init = n_init
        self.too_few = too_few
        self.noise_tolerance = noise_tolerance

    # -- validation --------------------------------------------------------------------------

    def _validated_names(self) -> list[str]:
        if not isinstance(self.n_classes, int | np.integer) or self.n_classes < 1:
            raise ValueError(f"n_classes must be an integer >= 1, got {self.n_classes!r}")
        if not isinstance(self.n_init, int | np.integer) or self.n_init < 1:
            raise ValueError(f"n_init must be an integer >= 1, got {self.n_init!r}")
        if self.too_few not in _TOO_FEW_CHOICES:
            raise ValueError(f"too_few must be one of {_TOO_FEW_CHOICES}, got {self.too_few!r}")
        tolerance = self.noise_tolerance
        if not isinstance(tolerance, int | float) or not 0 <= tolerance < 100:
            raise ValueError(f"noise_tolerance must be within 0..100 points, got {tolerance!r}")
        if self.class_names is None:
            return default_class_names(int(self.n_classes))
        names = [str(name) for name in self.class_names]
        if len(names) != self.n_classes:
            raise ValueError(
                f"class_names has {len(names)} names {names} but n_classes is {self.n_classes}; "
                "give one name per class, most compute-bound first"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"class_names must be distinct, got {names}")
        return names

    # -- fitting -----------------------------------------------------------------------------

    def fit(self, X: Any, y: None = None) -> JobClassifier:
        """Fit the K classes on the applications' (DRAM, FU) points (``y`` is ignored)."""
        names = self._validated_names()
        points = _as_points(X)
        behaviour_of, behaviours = _behaviours(points, float(self.noise_tolerance))
        n_distinct = len(behaviours)
        k = int(self.n_classes)
        if n_distinct < k:
            message = (
                f"{k} classes need at least {k} distinct applications (distinct (dram_util, "
                f"fu_util) behaviours, measurements within {self.noise_tolerance:g} points "
                f"counted as one), got {n_distinct} distinct among {len(points)} given"
            )
            if self.too_few == "raise":
                raise TooFewApplicationsError(
                    message + "; profile more applications, lower n_classes, or pass "
                    "too_few='reduce'"
                )
            warnings.warn(
                f"{message}; fitting {n_distinct} classes {names[:n_distinct]} instead",
                TooFewApplicationsWarning,
                stacklevel=2,
            )
            k = n_distinct
        # One point per behaviour, in a canonical order (order-independent fit): an application
        # profiled twice, or two within measurement noise of each other, must not pull a
        # centroid twice as hard, and can never end up in different classes.
        kmeans = KMeans(n_clusters=k, n_init=int(self.n_init), random_state=self.random_state)
        # Application catalogues are small: one thread is ~10x faster than spinning up the
        # OpenMP pool, and the result cannot depend on the machine's thread count.
        with threadpool_limits(limits=1, user_api="openmp"):
            kmeans.fit(behaviours)
        centers = kmeans.cluster_centers_
        scores = centers[:, 1] - centers[:, 0]
        order = np.lexsort((centers[:, 0], -centers[:, 1], -scores))
        rank_of_cluster = np.empty(k, dtype=int)
        rank_of_cluster[order] = np.arange(k)
        self.cluster_centers_ = centers[order]
        self.compute_scores_ = scores[order]
        self.classes_ = np.array(names[:k], dtype=object)
        self.n_classes_ = k
        self.n_behaviours_ = n_distinct
        self.inertia_ = float(kmeans.inertia_)
        self.n_features_in_ = 2
        self.n_samples_fit_ = len(points)
        # Each measurement takes its behaviour's class (not its own nearest centroid, which
        # could differ for two noisy points near a border).
        self.labels_ = self.classes_[rank_of_cluster[kmeans.labels_[behaviour_of]]]
        return self

    # -- prediction --------------------------------------------------------------------------

    def _nearest(self, points: np.ndarray) -> np.ndarray:
        distances = ((points[:, None, :] - self.cluster_centers_[None, :, :]) ** 2).sum(axis=2)
        return distances.argmin(axis=1)  # ties go to the more compute-bound class

    def predict_index(self, X: Any) -> np.ndarray:
        """Class index of each application: 0 = most compute-bound."""
        check_is_fitted(self, "cluster_centers_")
        return self._nearest(_as_points(X))

    def predict(self, X: Any) -> np.ndarray:
        """Class name of each application: the class of its nearest centroid."""
        indices = self.predict_index(X)
        return self.classes_[indices]

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distance of each application to each centroid, in class order."""
        check_is_fitted(self, "cluster_centers_")
        points = _as_points(X)
        return np.sqrt(((points[:, None, :] - self.cluster_centers_[None, :, :]) ** 2).sum(axis=2))

    # -- persistence -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description of the fitted model (training labels are not kept)."""
        check_is_fitted(self, "cluster_centers_")
        params = self.get_params()
        if params["class_names"] is not None:
            params["class_names"] = [str(n) for n in params["class_names"]]
        params["n_classes"] = int(params["n_classes"])
        params["n_init"] = int(params["n_init"])
        params["noise_tolerance"] = float(params["noise_tolerance"])
        params["random_state"] = (
            None if params["random_state"] is None else int(params["random_state"])
        )
        return {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "params": params,
            "feature_order": list(FEATURE_ORDER),
            "ordering": ORDERING,
            "classes": [str(c) for c in self.classes_],
            "centroids": self.cluster_centers_.tolist(),
            "compute_scores": self.compute_scores_.tolist(),
            "n_classes_fitted": int(self.n_classes_),
            "n_behaviours": int(self.n_behaviours_),
            "n_samples_fit": int(self.n_samples_fit_),
            "inertia": float(self.inertia_),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobClassifier:
        """Rebuild a fitted model from :meth:`to_dict` output; refuses anything inconsistent."""
        if data.get("format") != MODEL_FORMAT:
            raise ValueError(f"not a {MODEL_FORMAT} model (format={data.get('format')!r})")
        if data.get("version") not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"unsupported model version {data.get('version')!r}; "
                f"supported: {list(SUPPORTED_VERSIONS)}"
            )
        if list(data.get("feature_order", [])) != list(FEATURE_ORDER):
            raise ValueError(
                f"feature_order must be {list(FEATURE_ORDER)}, got {data.get('feature_order')}"
            )
        model = cls(**dict(data["params"]))
        names = model._validated_names()
        centers = np.asarray(data["centroids"], dtype=float)
        classes = [str(c) for c in data["classes"]]
        k = int(data["n_classes_fitted"])
        if centers.shape != (k, 2) or not np.isfinite(centers).all():
            raise ValueError(f"centroids must be {k} finite (dram, fu) pairs, got {centers.shape}")
        if classes != names[:k]:
            raise ValueError(f"classes {classes} do not match the class names {names[:k]}")
        scores = centers[:, 1] - centers[:, 0]
        if np.any(np.diff(scores) > 1e-9):
            raise ValueError(
                f"centroids are not in class order ({ORDERING}); scores {scores.tolist()}"
            )
        model.cluster_centers_ = centers
        model.compute_scores_ = scores
        model.classes_ = np.array(classes, dtype=object)
        model.n_classes_ = k
        model.n_behaviours_ = int(data.get("n_behaviours", k))
        model.inertia_ = float(data.get("inertia", float("nan")))
        model.n_features_in_ = 2
        model.n_samples_fit_ = int(data.get("n_samples_fit", 0))
        return model
