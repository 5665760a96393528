"""Drift detection on synthetic production runs: PAL's runtime model plus noise, one GPU slower
than its campaign said. It must be found, and nothing else; too little evidence lists nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slurm_pal.core.drift import DriftDetector, JobInfo, JobRun, job_span, runs_from_records

NODES = 8
GPUS_PER_NODE = 4
CLASSES = ("A", "D")


def campaign_scores(rng: np.random.Generator) -> dict[str, dict[str, float]]:
    """PM-scores of 32 GPUs: bins 1.0 / 1.04 / 1.09 for A, 1.0 / 1.02 for D, one outlier."""
    scores = {}
    for n in range(NODES):
        for i in range(GPUS_PER_NODE):
            gpu = f"n{n:02d}/gpu{i}"
            scores[gpu] = {
                "A": float(rng.choice([1.0, 1.0, 1.04, 1.09])),
                "D": float(rng.choice([1.0, 1.02])),
            }
    scores["n05/gpu2"]["A"] = 1.31  # an outlier of the campaign: slow, but known to be
    return scores


def production(
    rng: np.random.Generator,
    scores: dict[str, dict[str, float]],
    n_jobs: int,
    drift: dict[str, float],
    *,
    noise: float = 0.02,
    apps: int = 12,
) -> list[JobRun]:
    """Jobs of ``apps`` applications on 1, 2, 4 (one node) or 8 (two nodes) random GPUs.

    Runtime = base x max over its GPUs of (score x drift) x lognormal noise: PAL's model, with
    the drifting GPUs slower than their scores by their factor.
    """
    app_class = {f"app{a}": CLASSES[a % 2] for a in range(apps)}
    base = {a: float(rng.uniform(100, 1000)) for a in app_class}
    runs = []
    for j in range(n_jobs):
        app = f"app{rng.integers(apps)}"
        size = int(rng.choice([1, 1, 2, 4, 8]))
        nodes = rng.choice(NODES, size=2 if size == 8 else 1, replace=False)
        per_node = min(size, GPUS_PER_NODE)
        gpus = tuple(
            f"n{n:02d}/gpu{i}"
            for n in nodes
            for i in rng.choice(GPUS_PER_NODE, size=per_node, replace=False)
        )
        c = app_class[app]
        slowest = max(scores[g][c] * (1 + drift.get(g, 0.0)) for g in gpus)
        runtime = base[app] * slowest * math.exp(rng.normal(0, noise))
        runs.append(JobRun(f"{j}", app, c, gpus, runtime))
    return runs


@pytest.mark.parametrize("seed", range(6))
def test_one_gpu_drifting_by_8_percent_is_found_and_nothing_else(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = campaign_scores(rng)
    drifted = f"n0{seed % NODES}/gpu{seed % GPUS_PER_NODE}"
    runs = production(rng, scores, 1500, {drifted: 0.08})
    det = DriftDetector().fit(runs, scores)
    found = det.drifting_gpus()
    assert [d.gpu for d in found] == [drifted]
    (d,) = found
    assert d.median_residual == pytest.approx(0.08, abs=0.02)
    assert d.runs >= 5 and d.share_slower > 0.8
    assert d.observed_s > d.expected_s
    assert d.node == drifted.split("/")[0]
    assert all(e.residual > 0.03 for e in d.examples)
    # Every other GPU was judged, with evidence, and none drifts.
    others = [g for g in det.gpus_.values() if g.gpu != drifted]
    assert len(others) == NODES * GPUS_PER_NODE - 1
    assert all(not g.drifting and g.runs >= 5 for g in others)
    assert max(g.median_residual for g in others) < 0.03


def test_no_drift_lists_nothing_and_the_campaign_outlier_is_expected_slow() -> None:
    rng = np.random.default_rng(42)
    scores = campaign_scores(rng)
    runs = production(rng, scores, 1500, {})
    det = DriftDetector().fit(runs, scores)
    assert det.drifting_gpus() == []
    outlier = det.gpus_["n05/gpu2"]  # 31 % slower for A, as the campaign says: no drift
    assert abs(outlier.median_residual) < 0.03


def test_too_few_runs_are_not_listed() -> None:
    rng = np.random.default_rng(3)
    scores = campaign_scores(rng)
    runs = production(rng, scores, 400, {})
    slow = "n01/gpu1"
    runs = [r for r in runs if slow not in r.gpus]
    base = {r.app: r.runtime_s / max(scores[g][r.job_class] for g in r.gpus) for r in runs}
    app = sorted(base)[0]
    c = next(r.job_class for r in runs if r.app == app)
    extra = [JobRun(f"x{k}", app, c, (slow,), base[app] * scores[slow][c] * 1.2) for k in range(3)]
    det = DriftDetector(min_runs=5).fit(runs + extra, scores)
    assert det.drifting_gpus() == []
    judged = det.gpus_[slow]
    assert judged.runs == 3 and judged.median_residual > 0.15
    assert "only 3 run(s)" in judged.note
    # The same three runs are enough when the site accepts less evidence.
    assert [d.gpu for d in DriftDetector(min_runs=3).fit(runs + extra, scores).drifting_gpus()] == [
        slow
    ]


def test_a_partner_of_the_drifting_gpu_is_explained_away() -> None:
    """Jobs pairing n02/gpu0 (drifting 10 %) with n02/gpu1 are slow because of gpu0."""
    rng = np.random.default_rng(7)
    scores = {f"n02/gpu{i}": {"A": 1.0} for i in range(4)}
    runs = []
    for j in range(200):
        gpus = [("n02/gpu0", "n02/gpu1"), ("n02/gpu1",), ("n02/gpu2",), ("n02/gpu3",)][j % 4]
        factor = 1.10 if "n02/gpu0" in gpus else 1.0
        runs.append(JobRun(str(j), "app", "A", gpus, 100 * factor * math.exp(rng.normal(0, 0.01))))
    det = DriftDetector().fit(runs, scores)
    assert [d.gpu for d in det.drifting_gpus()] == ["n02/gpu0"]
    # Without the explaining away gpu1's pairs alone would have looked slow.
    assert det.gpus_["n02/gpu1"].median_residual == pytest.approx(0.0, abs=0.01)


def test_runs_that_cannot_be_judged_are_skipped_with_a_reason() -> None:
    scores = {"g1": {"A": 1.0}, "g2": {"A": 1.0}}
    runs = [
        JobRun("1", "app", "A", (), 10.0),
        JobRun("2", "app", "A", ("g9",), 10.0),
        JobRun("3", "app", "B", ("g1",), 10.0),
        JobRun("4", "app", "A", ("g1",), 0.0),
        JobRun("5", "app", "A", ("g2",), 10.0),
    ]
    det = DriftDetector().fit(runs, scores)
    assert det.skipped_ == {
        "1": "no GPUs recorded",
        "2": "GPU(s) g9 not in the campaign",
        "3": "class 'B' has no score on g1",
        "4": "runtime 0.0 s is not a positive duration",
    }
    assert "no run with 3+ runs" in det.gpus_["g2"].note
    assert det.drifting_gpus() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0}, "threshold must be > 0"),
        ({"min_runs": 0}, "min_runs must be at least 1"),
        ({"min_baseline": 0}, "min_baseline"),
        ({"consistency": 1.5}, "consistency must be in"),
    ],
)
def test_bad_settings_say_what_is_valid(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DriftDetector(**kwargs)


def test_records_pair_into_runs() -> None:
    """Prolog/Epilog records (PROTOCOL.md op record) -> runs; GPUs by UUID or Slurm index."""
    gpu_ids = {("n1", 0): "n1/gpu0", ("n1", 3): "n1/gpu2", ("n2", 0): "n2/gpu0"}
    jobs = {
        "10": JobInfo("alice|train|abc", "A"),
        "11": JobInfo("bob|bert|def", "B"),
        "12": JobInfo("x", "A"),
        "14": JobInfo("y", "A"),
        "15": JobInfo("z", "A"),
    }

    def rec(job: str, node: str, kind: str, t: float, **extra: object) -> dict[str, object]:
        return {"record_id": f"{job}:{node}:{kind}", "job_id": job, "node": node, "kind": kind,
                "time": t, **extra}  # fmt: skip

    records = [
        # two nodes, Slurm indices mapped through the labels (index 3 is device 2 on n1)
        rec("10", "n1", "prolog", 100.0, slurm_gpus=[0, 3]),
        rec("10", "n2", "prolog", 101.0, slurm_gpus=[0]),
        rec("10", "n1", "epilog", 400.0, slurm_gpus=[0, 3], exit_code=0),
        rec("10", "n2", "epilog", 402.0, slurm_gpus=[0]),
        # NVML UUIDs win over indices
        rec("11", "n1", "prolog", 10.0, slurm_gpus=[0], uuids=["GPU-aa"]),
        rec("11", "n1", "epilog", 70.0),
        rec("12", "n1", "prolog", 10.0, slurm_gpus=[0]),  # still running
        rec("13", "n1", "prolog", 10.0, slurm_gpus=[0]),  # no decision
        rec("13", "n1", "epilog", 20.0),
        rec("14", "n1", "prolog", 10.0, slurm_gpus=[1]),  # index not in the labels
        rec("14", "n1", "epilog", 20.0),
        rec("15", "n1", "prolog", 10.0, slurm_gpus=[0]),
        rec("15", "n1", "epilog", 20.0, exit_code=137),  # failed
    ]
    runs, skipped = runs_from_records(records, jobs, gpu_ids)
    assert runs == [
        JobRun("10", "alice|train|abc", "A", ("n1/gpu0", "n1/gpu2", "n2/gpu0"), 302.0),
        JobRun("11", "bob|bert|def", "B", ("GPU-aa",), 60.0),
    ]
    assert skipped == {
        "12": "no epilog record yet",
        "13": "no advisor decision (application and class unknown)",
        "14": "n1 Slurm GPU 1 is not in the labels",
        "15": "the job failed (exit code 137): its runtime says nothing",
    }


def test_a_job_ran_from_its_first_prolog_to_its_last_epilog() -> None:
    records = [
        {"kind": "prolog", "node": "n2", "time": 101.0},
        {"kind": "prolog", "node": "n1", "time": 100.0},
        {"kind": "epilog", "node": "n1", "time": 402.0},
        {"kind": "epilog", "node": "n2", "time": 400.0},
    ]
    assert job_span(records) == (100.0, 402.0)
    assert job_span(records[:2]) is None  # still running
    assert job_span(records[2:]) is None  # no Prolog record
    assert job_span([*records, {"kind": "epilog", "time": "late"}]) is None
