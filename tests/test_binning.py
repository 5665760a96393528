"""PMBinner: the properties PM-First/PAL rely on, edge cases, and PAL's artifact mode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.metrics import silhouette_score

from slurm_pal.core.binning import OUTLIER, PMBinner, silhouette_1d

durations = arrays(
    np.float64,
    st.integers(1, 80),
    elements=st.floats(0.5, 3.0, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=60, deadline=None)
@given(
    x=arrays(np.float64, st.integers(3, 60), elements=st.floats(-5, 5).map(lambda v: round(v, 1))),
    seed=st.integers(0, 1000),
)
def test_silhouette_1d_matches_sklearn(x: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, min(5, len(x) - 1) + 1))
    labels = rng.integers(0, k, len(x))
    if not 2 <= len(np.unique(labels)) <= len(x) - 1:
        return
    expected = silhouette_score(x.reshape(-1, 1), labels)
    assert silhouette_1d(x, labels) == pytest.approx(expected, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(x=durations)
def test_every_gpu_gets_one_positive_score_and_scores_are_monotone(x: np.ndarray) -> None:
    binner = PMBinner(min_gap=0.0).fit(x)
    scores = binner.transform(x)
    assert scores.shape == x.shape
    assert np.all(np.isfinite(scores)) and np.all(scores > 0)
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(scores[order]) >= -1e-12), "a slower GPU got a better PM-score"


@settings(max_examples=60, deadline=None)
@given(x=durations)
def test_outliers_keep_their_own_value_and_are_never_in_a_bin(x: np.ndarray) -> None:
    binner = PMBinner().fit(x)
    labels = binner.predict(x)
    norm = binner.normalize(x)
    scores = binner.transform(x)
    out = labels == OUTLIER
    np.testing.assert_allclose(scores[out], norm[out])
    assert np.array_equal(out, binner.outlier_mask_)
    assert sum(b.gpus for b in binner.bins_) == int((~out).sum())
    regular = norm[~out]
    if out.any() and len(regular):
        assert np.all((norm[out] < regular.min()) | (norm[out] > regular.max()))
    assert set(np.unique(scores[~out])) <= {b.score for b in binner.bins_}


@settings(max_examples=40, deadline=None)
@given(x=durations)
def test_k_is_within_range_when_there_is_enough_to_choose_from(x: np.ndarray) -> None:
    binner = PMBinner(min_gap=0.0).fit(x)
    regular = binner.normalize(x)[~binner.outlier_mask_]
    if len(np.unique(regular)) >= 3:
        assert 2 <= binner.k_ <= 11
        assert binner.silhouette_ == pytest.approx(max(binner.silhouette_by_k_.values()))
    else:
        # one bin per distinct value, except values a few ulps apart, which K-Means merges
        assert 1 <= binner.k_ <= len(np.unique(regular))
        assert binner.k_ == len(np.unique(np.round(regular, 9)))
    assert len(binner.centroids_) == binner.k_
    assert np.all(np.diff(binner.centroids_) > 0)


def test_fit_is_deterministic_and_order_independent() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(1.0, 0.01, 200), rng.normal(1.08, 0.01, 60), [2.5, 2.8]])
    a = PMBinner(random_state=7).fit(x)
    b = PMBinner(random_state=7).fit(rng.permutation(x))
    assert a.k_ == b.k_
    np.testing.assert_allclose(a.centroids_, b.centroids_)
    np.testing.assert_allclose(np.sort(a.transform(x)), np.sort(b.transform(x)))


def test_two_modes_and_outliers_are_found() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(100, 0.5, 300), rng.normal(110, 0.5, 100), [250.0, 280.0]])
    binner = PMBinner().fit(x)
    assert binner.k_ == 2
    assert binner.outlier_mask_.sum() == 2
    assert binner.centroids_[1] / binner.centroids_[0] == pytest.approx(1.10, abs=0.01)
    assert binner.transform([280.0])[0] == pytest.approx(280.0 / binner.median_)


def test_min_gap_collapses_noise_only_classes_to_one_bin() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(50.0, 0.01, 100)  # 0.02 % spread: no usable variability
    assert PMBinner(min_gap=0.005).fit(x).k_ == 1
    assert PMBinner(min_gap=0.0).fit(x).k_ >= 2


@pytest.mark.parametrize(
    ("values", "k"),
    [([7.0], 1), ([5.0, 5.0, 5.0, 5.0], 1), ([1.0, 2.0], 2), ([1.0, 1.0, 2.0], 2)],
)
def test_degenerate_campaigns(values: list[float], k: int) -> None:
    binner = PMBinner().fit(values)
    assert binner.k_ == k
    assert np.isnan(binner.silhouette_) == (k == 1 or len(values) < 3)
    assert np.all(np.isfinite(binner.transform(values)))


def test_fewer_gpus_than_k_max() -> None:
    binner = PMBinner(min_gap=0.0).fit([1.0, 1.1, 1.2, 1.3, 1.4])
    assert 2 <= binner.k_ <= 4


@pytest.mark.parametrize(
    ("values", "message"),
    [([], "at least one GPU"), ([1.0, np.nan], "NaN"), ([1.0, 0.0], "> 0"), ([[1.0, 2.0]], "1-D")],
)
def test_bad_measurements_are_rejected_clearly(values: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PMBinner().fit(values)


@pytest.mark.parametrize(
    ("params", "message"),
    [({"k_min": 1}, "k_min"), ({"k_min": 5, "k_max": 4}, "k_max"), ({"outlier_sigma": 0}, "sigma")],
)
def test_bad_parameters_name_the_parameter(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PMBinner(**params).fit([1.0, 2.0, 3.0])


def test_predict_before_fit_says_so() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        PMBinner().predict([1.0])


def test_pal_artifact_mode_reproduces_k2_plus_one_cluster_per_outlier() -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(1.0, 0.01, 100), rng.normal(1.05, 0.01, 100), [2.0, 2.5, 3.0]])
    binner = PMBinner(pal_artifact=True).fit(x)
    assert binner.k_ == 2 + 3
    # Scores are centroids over the median centroid, so the median centroid scores exactly 1.
    assert 1.0 in np.round(binner.centroids_, 12)
    assert binner.outlier_mask_.sum() == 3
    assert PMBinner().fit(x).k_ == 2  # the corrected mode agrees here, for the right reason


@pytest.mark.parametrize("seed", range(8))
def test_kmeans_1d_matches_scikit_learn_on_its_objective(seed: int) -> None:
    from sklearn.cluster import KMeans

    from slurm_pal.core.binning import kmeans_1d

    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(1.0, 0.02, 150), rng.normal(1.1, 0.02, 50), [1.5, 1.6]])
    k = 2 + seed % 6
    centers, labels, inertia = kmeans_1d(x, k, random_state=seed)
    reference = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(x.reshape(-1, 1))
    assert inertia <= reference.inertia_ * 1.05
    assert np.all(np.diff(centers) > 0) and len(centers) == k
    recomputed = sum(((x[labels == j] - centers[j]) ** 2).sum() for j in range(k))
    assert inertia == pytest.approx(recomputed, rel=1e-9, abs=1e-12)
    again = kmeans_1d(x, k, random_state=seed)
    np.testing.assert_array_equal(again[0], centers)


def test_kmeans_1d_finds_well_separated_groups_exactly() -> None:
    from slurm_pal.core.binning import kmeans_1d

    x = np.array([1.0, 1.01, 0.99, 2.0, 2.01, 1.99, 3.0, 3.02, 2.98])
    centers, labels, _ = kmeans_1d(x, 3)
    np.testing.assert_allclose(centers, [1.0, 2.0, 3.0])
    assert list(labels) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="distinct values"):
        kmeans_1d([1.0, 1.0, 2.0], 3)
