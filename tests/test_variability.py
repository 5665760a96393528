"""Campaign -> per-GPU scores, identity resolution, unmeasured fallback, signature labels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from slurm_pal.core.binning import OUTLIER
from slurm_pal.core.variability import bin_token, build_profile, resolve_identities
from slurm_pal.example_campaign import generate_example_campaign


def rows(records: list[tuple]) -> pd.DataFrame:
    frame = pd.DataFrame(records, columns=["job_class", "uuid", "node", "gpu_index", "duration"])
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    frame["gpu_model"] = "v100"
    return frame


def example_rows() -> pd.DataFrame:
    frame = generate_example_campaign(nodes=8, gpus_per_node=4, seed=11)
    return frame.rename(columns={"duration_s": "duration"})


def test_every_gpu_gets_one_score_per_class() -> None:
    profile = build_profile(example_rows(), ["A", "B", "C", "D"])
    assert list(profile.classes) == ["A", "B", "C", "D"]
    counts = profile.gpus.groupby("job_class")["uuid"].nunique()
    assert (counts == 32).all()
    assert not profile.gpus.duplicated(["job_class", "uuid"]).any()
    assert profile.gpus["pm_score"].notna().all()
    assert len(profile.gpu_labels) == 32
    assert sum(label.gpus for label in profile.labels) == 32


def test_repeated_runs_are_aggregated_by_median() -> None:
    data = rows(
        [("A", "g1", "n1", 0, d) for d in (1.0, 1.0, 9.0)]
        + [("A", "g2", "n1", 1, 2.0), ("A", "g3", "n1", 2, 3.0)]
    )
    profile = build_profile(data, ["A"])
    g1 = profile.gpus.set_index("uuid").loc["g1"]
    assert g1["raw_median"] == 1.0 and g1["n_runs"] == 3


def test_unmeasured_gpu_gets_the_median_bin_and_is_flagged() -> None:
    data = example_rows()
    dropped = data["uuid"].iloc[0]
    data = data[~((data["uuid"] == dropped) & (data["job_class"] == "B"))]
    profile = build_profile(data, ["A", "B", "C", "D"])
    b = profile.gpus[profile.gpus["job_class"] == "B"].set_index("uuid")
    assert not b.loc[dropped, "measured"]
    assert b.loc[dropped, "n_runs"] == 0
    measured = b[b["measured"]]
    median_bin_scores = measured.loc[measured["bin"] == b.loc[dropped, "bin"], "pm_score"]
    assert b.loc[dropped, "pm_score"] == pytest.approx(median_bin_scores.iloc[0])
    assert profile.classes["B"].unmeasured_gpus == 1


def test_location_ids_merge_with_nvidia_uuids_but_two_uuids_never_merge() -> None:
    data = rows(
        [
            ("A", "c001-1-0", "c001-1", 0, 1.0),
            ("D", "GPU-aaa", "c001-1", 0, 5.0),  # same place, other id format: same GPU
            ("D", "GPU-bbb", "c001-2", 1, 5.0),
            ("D", "GPU-ccc", "c001-2", 1, 5.1),  # two NVIDIA UUIDs at one place: keep apart
        ]
    )
    merged, aliases = resolve_identities(data)
    assert aliases == {"c001-1-0": "GPU-aaa"}
    assert set(merged["uuid"]) == {"GPU-aaa", "GPU-bbb", "GPU-ccc"}


def test_outliers_get_ranked_tokens_and_labels_are_stable() -> None:
    data = example_rows()
    a = build_profile(data, ["A", "B", "C", "D"])
    b = build_profile(data.sample(frac=1.0, random_state=3), ["A", "B", "C", "D"])
    assert a.gpu_labels == b.gpu_labels
    assert [label.label for label in a.labels] == sorted(label.label for label in a.labels)
    outliers = a.gpus[a.gpus["bin"] == OUTLIER]
    assert len(outliers) > 0
    for _, r in outliers.iterrows():
        assert f"x{int(r['outlier_rank'])}" in a.gpu_labels[r["uuid"]]
    assert bin_token(0, 3, None) == "a3" and bin_token(1, OUTLIER, 0) == "bx0"


def test_class_letters_follow_site_order_even_when_a_class_is_missing() -> None:
    data = example_rows()
    profile = build_profile(data[data["job_class"].isin(["A", "D"])], ["A", "B", "C", "D"])
    label = next(iter(profile.gpu_labels.values()))
    assert label.startswith("v100-a") and "d" in label and "b" not in label.split("-")[1]


def test_signature_scores_match_per_gpu_scores() -> None:
    profile = build_profile(example_rows(), ["A", "B", "C", "D"])
    by_label = {s.label: dict(s.scores) for s in profile.labels}
    for _, r in profile.gpus.iterrows():
        assert by_label[profile.gpu_labels[r["uuid"]]][r["job_class"]] == pytest.approx(
            r["pm_score"]
        )


def test_empty_campaign_is_an_error() -> None:
    with pytest.raises(ValueError, match="no measurements"):
        build_profile(rows([]), ["A"])


def test_scores_follow_the_measurements_within_a_class() -> None:
    profile = build_profile(example_rows(), ["A", "B", "C", "D"])
    a = profile.gpus[(profile.gpus["job_class"] == "A") & profile.gpus["measured"]]
    order = np.argsort(a["raw_median"].to_numpy())
    assert np.all(np.diff(a["pm_score"].to_numpy()[order]) >= -1e-12)
