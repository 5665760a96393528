"""Job classifier: ordered, stable K-Means classes in the (DRAM, FU) plane."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from slurm_pal.adapters.ncu import application_features, read_ncu_csv
from slurm_pal.core.classifier import (
    JobClassifier,
    TooFewApplicationsError,
    TooFewApplicationsWarning,
    default_class_names,
)
from slurm_pal.core.features import (
    UtilizationFeatures,
    time_weighted_mean,
    weighted_mean_skipping_missing,
)
from tests.helpers.data import NCU, need_shared

SHARED_NCU = NCU

# A small catalogue spread over the plane: (dram_util, fu_util) in percent.
CATALOGUE = {
    "sgemm": (8.0, 85.0),  # compute-bound
    "resnet50": (20.0, 70.0),
    "bert": (40.0, 45.0),  # in between
    "gpt2": (35.0, 50.0),
    "pagerank": (75.0, 15.0),  # memory-bound
    "stream": (85.0, 10.0),
}
CATALOGUE_X = np.array(list(CATALOGUE.values()))

percent = st.floats(min_value=0.0, max_value=100.0, allow_nan=False, allow_infinity=False)
points_strategy = st.lists(st.tuples(percent, percent), min_size=3, max_size=40).filter(
    lambda pts: len(set(pts)) >= 3
)


def test_catalogue_classes_are_ordered_compute_to_memory() -> None:
    model = JobClassifier(n_classes=3).fit(CATALOGUE_X)
    labels = dict(zip(CATALOGUE, model.labels_, strict=True))
    assert labels == {
        "sgemm": "A",
        "resnet50": "A",
        "bert": "B",
        "gpt2": "B",
        "pagerank": "C",
        "stream": "C",
    }
    assert list(model.classes_) == ["A", "B", "C"]
    np.testing.assert_allclose(model.cluster_centers_, [[14, 77.5], [37.5, 47.5], [80, 12.5]])
    np.testing.assert_allclose(model.compute_scores_, [63.5, 10.0, -67.5])


def test_real_ncu_samples_go_to_the_nearest_class() -> None:
    need_shared(SHARED_NCU / "dropout-162-launches.csv")
    need_shared(SHARED_NCU / "llm-kernel-rtx5090.details.csv")
    dropout = application_features([read_ncu_csv(SHARED_NCU / "dropout-162-launches.csv")])
    llm = application_features([read_ncu_csv(SHARED_NCU / "llm-kernel-rtx5090.details.csv")])
    model = JobClassifier().fit(CATALOGUE_X)
    assert list(model.predict([dropout, llm])) == ["C", "B"]  # dropout (56, 22); llm (37, 37)


def test_accepts_features_objects_and_named_dataframe_columns() -> None:
    features = [
        UtilizationFeatures(d, f, "ncu", "x", "y", 1, 1.0, "ns") for d, f in CATALOGUE.values()
    ]
    frame = pd.DataFrame(CATALOGUE_X, columns=["dram_util", "fu_util"])[["fu_util", "dram_util"]]
    by_array = JobClassifier().fit(CATALOGUE_X).labels_
    assert list(JobClassifier().fit(features).labels_) == list(by_array)
    assert list(JobClassifier().fit(frame).labels_) == list(by_array)


def test_sklearn_conventions() -> None:
    model = JobClassifier(n_classes=2, random_state=7, class_names=["hot", "cold"])
    assert model.get_params() == {
        "n_classes": 2,
        "random_state": 7,
        "class_names": ["hot", "cold"],
        "n_init": 10,
        "too_few": "raise",
        "noise_tolerance": 1.0,
    }
    with pytest.raises(NotFittedError):
        model.predict(CATALOGUE_X)
    copy = clone(model).set_params(n_classes=3, class_names=None)
    assert list(copy.fit_predict(CATALOGUE_X)) == ["A", "A", "B", "B", "C", "C"]
    assert list(model.fit(CATALOGUE_X).classes_) == ["hot", "cold"]
    assert model.transform(CATALOGUE_X).shape == (6, 2)


def test_to_dict_is_json_and_round_trips() -> None:
    model = JobClassifier(class_names=("compute", "mixed", "memory")).fit(CATALOGUE_X)
    restored = JobClassifier.from_dict(json.loads(json.dumps(model.to_dict())))
    queries = np.array([[0, 100], [50, 50], [100, 0], [56.0, 21.6], [30, 30]])
    assert list(restored.predict(queries)) == list(model.predict(queries))
    assert restored.get_params() == {**model.get_params(), "class_names": list(model.class_names)}
    np.testing.assert_array_equal(restored.cluster_centers_, model.cluster_centers_)


def test_from_dict_refuses_inconsistent_models() -> None:
    data = JobClassifier().fit(CATALOGUE_X).to_dict()
    with pytest.raises(ValueError, match=r"supported: \[1\]"):
        JobClassifier.from_dict({**data, "version": 99})
    with pytest.raises(ValueError, match="not in class order"):
        JobClassifier.from_dict({**data, "centroids": data["centroids"][::-1]})
    with pytest.raises(ValueError, match="do not match"):
        JobClassifier.from_dict({**data, "classes": ["X", "Y", "Z"]})


def test_nan_is_a_clear_error() -> None:
    X = CATALOGUE_X.copy()
    X[4, 1] = np.nan
    with pytest.raises(ValueError, match=r"rows \[4\] contain NaN"):
        JobClassifier().fit(X)
    model = JobClassifier().fit(CATALOGUE_X)
    with pytest.raises(ValueError, match="NaN"):
        model.predict([[np.nan, 3.0]])


def test_minos_style_percentages_are_refused() -> None:
    with pytest.raises(ValueError, match="within 0..100"):
        JobClassifier().fit(np.vstack([CATALOGUE_X, [3807.66, 2429.73]]))


def test_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"expected shape \(n_applications, 2\)"):
        JobClassifier().fit([[1.0, 2.0, 3.0]])


def test_too_few_distinct_applications_raise_by_default() -> None:
    duplicated = np.array([[10, 80], [10, 80], [70, 20], [70, 20]])
    with pytest.raises(TooFewApplicationsError, match="got 2 distinct among 4 given"):
        JobClassifier(n_classes=3).fit(duplicated)


def test_too_few_reduce_warns_and_records() -> None:
    duplicated = np.array([[10, 80], [10, 80], [70, 20]])
    with pytest.warns(TooFewApplicationsWarning, match=r"fitting 2 classes \['A', 'B'\]"):
        model = JobClassifier(n_classes=3, too_few="reduce").fit(duplicated)
    assert model.n_classes_ == 2
    assert list(model.labels_) == ["A", "A", "B"]


NOISY_TWO_KERNELS = np.array([[24.2, 93.0], [24.3, 93.0], [87.6, 9.0], [87.7, 9.0]])
"""GEMM and STREAM measured twice each: the pairs differ only by measurement noise."""


def test_measurements_within_the_noise_are_one_behaviour_and_one_class() -> None:
    with pytest.warns(TooFewApplicationsWarning, match="got 2 distinct among 4 given"):
        model = JobClassifier(n_classes=4, too_few="reduce").fit(NOISY_TWO_KERNELS)
    assert (model.n_classes_, model.n_behaviours_) == (2, 2)
    assert list(model.labels_) == ["A", "A", "B", "B"]
    np.testing.assert_allclose(model.cluster_centers_, [[24.25, 93.0], [87.65, 9.0]])
    with pytest.raises(TooFewApplicationsError, match="within 1 points counted as one"):
        JobClassifier(n_classes=3).fit(NOISY_TWO_KERNELS)
    # Without a tolerance each measurement is its own behaviour: the split this prevents.
    exact = JobClassifier(n_classes=4, noise_tolerance=0).fit(NOISY_TWO_KERNELS)
    assert len(set(exact.labels_[:2])) == 2


def test_a_chain_of_small_steps_does_not_merge_far_apart_measurements() -> None:
    # Complete linkage: 10.0 and 11.6 are 1.6 points apart, more than the tolerance, so the
    # three points are two behaviours even though each step is within it.
    chain = np.array([[10.0, 90.0], [10.8, 90.0], [11.6, 90.0], [80.0, 5.0]])
    model = JobClassifier(n_classes=3).fit(chain)
    assert model.n_behaviours_ == 3


def test_noise_merging_does_not_depend_on_the_order_of_the_measurements() -> None:
    rng = np.random.default_rng(3)
    points = np.vstack([NOISY_TWO_KERNELS, CATALOGUE_X, CATALOGUE_X + 0.4])
    reference = JobClassifier(n_classes=3).fit(points)
    for _ in range(5):
        order = rng.permutation(len(points))
        shuffled = JobClassifier(n_classes=3).fit(points[order])
        np.testing.assert_array_equal(shuffled.cluster_centers_, reference.cluster_centers_)
        assert list(shuffled.labels_) == list(reference.labels_[order])


def test_duplicates_with_enough_distinct_points_fit_without_warning() -> None:
    X = np.vstack([CATALOGUE_X, CATALOGUE_X, CATALOGUE_X[:2]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = JobClassifier().fit(X)
    assert list(model.labels_[:6]) == ["A", "A", "B", "B", "C", "C"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_classes": 0}, "n_classes must be an integer >= 1"),
        ({"too_few": "ignore"}, r"too_few must be one of \('raise', 'reduce'\)"),
        ({"class_names": ["A", "B"]}, "class_names has 2 names"),
        ({"class_names": ["A", "A", "B"]}, "must be distinct"),
        ({"n_init": 0}, "n_init must be"),
    ],
)
def test_invalid_parameters_name_the_valid_choices(params, message) -> None:
    with pytest.raises(ValueError, match=message):
        JobClassifier(**params).fit(CATALOGUE_X)


def test_default_class_names() -> None:
    assert default_class_names(4) == ["A", "B", "C", "D"]
    assert default_class_names(27)[-1] == "A1"


# --------------------------------------------------------------------------------------------
# The shared features record and its weighted means (slurm_pal.core.features)


def test_time_weighted_mean_counts_every_launch_with_its_own_weight() -> None:
    # 162 launches of one kernel must not collapse to one duration (the Minos bug)
    assert time_weighted_mean([20.0] * 162, [10.0] * 162) == pytest.approx(20.0)
    assert time_weighted_mean([10.0, 40.0], [3.0, 1.0]) == pytest.approx(17.5)


@pytest.mark.parametrize(
    ("values", "weights", "message"),
    [
        ([1.0], [1.0, 2.0], "1 values but 2 weights"),
        ([], [], "zero values"),
        ([1.0, 2.0], [0.0, 0.0], "total weight is zero"),
        ([1.0], [-1.0], "must be finite and >= 0"),
        ([float("nan")], [1.0], "must be finite"),
    ],
)
def test_time_weighted_mean_rejects_bad_input(values, weights, message) -> None:
    with pytest.raises(ValueError, match=message):
        time_weighted_mean(values, weights)


def test_weighted_mean_skipping_missing_reports_the_left_out_weight() -> None:
    result = weighted_mean_skipping_missing([10.0, None, 30.0], [1.0, 2.0, 1.0])
    assert result.mean == pytest.approx(20.0)
    assert result.excluded_fraction == pytest.approx(0.5)
    assert result.used_count == 2
    with pytest.raises(ValueError, match="no value present"):
        weighted_mean_skipping_missing([None, None], [1.0, 1.0])


def test_utilization_features_validate_and_round_trip_through_json() -> None:
    features = UtilizationFeatures(
        dram_util=56.02,
        fu_util=21.61,
        source="ncu",
        dram_source="gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        fu_source="sm__throughput.avg.pct_of_peak_sustained_elapsed (fallback: no pipe metric)",
        measurements=162,
        weight_total=5_689_984.0,
        weight_unit="ns",
    )
    restored = UtilizationFeatures.from_dict(json.loads(json.dumps(features.to_dict())))
    assert restored == features
    assert features.as_point() == (56.02, 21.61)
    with pytest.raises(ValueError, match=r"source must be one of \('ncu', 'nvml', 'dcgm'\)"):
        UtilizationFeatures(1.0, 2.0, "nsight", "d", "f", 1, 1.0, "ns")
    with pytest.raises(ValueError, match="dram_util must be a finite number"):
        UtilizationFeatures(float("nan"), 2.0, "ncu", "d", "f", 1, 1.0, "ns")
    with pytest.raises(ValueError, match="unknown UtilizationFeatures keys"):
        UtilizationFeatures.from_dict({**features.to_dict(), "colour": "blue"})


# --------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=60, deadline=None)
@given(points=points_strategy, data=st.data())
def test_refit_on_shuffled_input_gives_the_same_classes(points, data) -> None:
    X = np.array(points)
    permutation = data.draw(st.permutations(range(len(X))))
    # Exact measurements (no noise merging): each training point is its centroid's nearest.
    first = JobClassifier(n_classes=3, noise_tolerance=0).fit(X)
    second = JobClassifier(n_classes=3, noise_tolerance=0).fit(X[permutation])
    np.testing.assert_array_equal(first.cluster_centers_, second.cluster_centers_)
    assert list(second.labels_) == list(first.labels_[permutation])
    assert list(second.predict(X)) == list(first.labels_)
    # With the default noise merging, as apps fit runs it: the same classes in any order.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TooFewApplicationsWarning)
        merged = JobClassifier(n_classes=3, too_few="reduce").fit(X)
        shuffled = JobClassifier(n_classes=3, too_few="reduce").fit(X[permutation])
    np.testing.assert_array_equal(merged.cluster_centers_, shuffled.cluster_centers_)
    assert list(shuffled.labels_) == list(merged.labels_[permutation])


@settings(max_examples=60, deadline=None)
@given(points=points_strategy, k=st.integers(min_value=1, max_value=3))
def test_classes_are_ordered_by_compute_boundness(points, k) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TooFewApplicationsWarning)
        model = JobClassifier(n_classes=k, too_few="reduce").fit(np.array(points))
    centers = model.cluster_centers_
    scores = centers[:, 1] - centers[:, 0]
    np.testing.assert_allclose(model.compute_scores_, scores)
    assert np.all(np.diff(scores) <= 0)


@st.composite
def three_blobs(draw):
    """Applications around a compute-bound, a mixed and a memory-bound centre."""
    centres = {"A": (5.0, 85.0), "B": (45.0, 45.0), "C": (85.0, 5.0)}
    jitter = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False)
    points, truth = [], []
    for name, (dram, fu) in centres.items():
        for _ in range(draw(st.integers(min_value=1, max_value=12))):
            points.append((dram + draw(jitter), fu + draw(jitter)))
            truth.append(name)
    order = draw(st.permutations(range(len(points))))
    return np.array(points)[order], [truth[i] for i in order]


@settings(max_examples=60, deadline=None)
@given(blobs=three_blobs(), seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_spread_applications_get_the_expected_ordered_classes(blobs, seed) -> None:
    X, truth = blobs
    model = JobClassifier(n_classes=3, random_state=seed).fit(X)
    assert list(model.labels_) == truth


CATALOGUE_MODEL = JobClassifier().fit(CATALOGUE_X)


@settings(max_examples=100, deadline=None)
@given(query=st.tuples(percent, percent))
def test_new_applications_go_to_the_nearest_centroid(query) -> None:
    model = CATALOGUE_MODEL
    distances = np.linalg.norm(model.cluster_centers_ - np.array(query), axis=1)
    (predicted,) = model.predict_index([query])
    assert distances[predicted] == distances.min()


def test_repeated_measurements_do_not_pull_the_centroids() -> None:
    """One application measured five times is one point for K-Means, not five."""
    once = np.array([[0.0, 100.0], [10.0, 90.0], [90.0, 10.0], [100.0, 0.0]])
    repeated = np.vstack([once, [[0.0, 100.0]] * 4])
    a = JobClassifier(n_classes=2).fit(once)
    b = JobClassifier(n_classes=2).fit(repeated)
    np.testing.assert_allclose(b.cluster_centers_, a.cluster_centers_)
    np.testing.assert_allclose(b.cluster_centers_[0], [5.0, 95.0])
    assert set(b.labels_[4:]) == {"A"} and b.labels_[0] == "A"
