"""The job record and the Synergy-style Poisson generator."""

from __future__ import annotations

import numpy as np
import pytest

from slurm_pal.core.workload import SimJob, pal_job_class, poisson_workload


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    first = poisson_workload(50, 10.0, seed=1)
    assert first == poisson_workload(50, 10.0, seed=1)
    assert first != poisson_workload(50, 10.0, seed=2)


def test_arrival_rate_and_gpu_mix_follow_the_parameters() -> None:
    jobs = poisson_workload(4000, 12.0, seed=0, gpu_mix={1: 0.75, 4: 0.25})
    submits = np.array([job.submit_time for job in jobs])
    assert np.all(np.diff(submits) >= 0)
    assert submits[-1] / 3600 == pytest.approx(4000 / 12.0, rel=0.05)
    single = sum(job.gpus == 1 for job in jobs) / len(jobs)
    assert single == pytest.approx(0.75, abs=0.03)
    assert {job.gpus for job in jobs} == {1, 4}
    assert all(60.0 <= job.work <= 7 * 24 * 3600 for job in jobs)


def test_tracking_window() -> None:
    jobs = poisson_workload(10, 10.0, track=(2, 4))
    assert [job.tracked for job in jobs] == [False, False, True, True, True] + [False] * 5


def test_pal_model_classes_are_case_insensitive_with_a_default() -> None:
    assert pal_job_class("ResNet50") == "A"
    assert pal_job_class("vgg19") == "C"
    assert pal_job_class("PointNet") == "D"
    assert pal_job_class("GPT2") == "B"
    assert pal_job_class("mystery") == "A"
    assert pal_job_class("mystery", default_class="D") == "D"


@pytest.mark.parametrize(
    "bad", [{"gpus": 0}, {"gpus": 1.5}, {"work": 0.0}, {"work": float("nan")}, {"submit_time": -1}]
)
def test_job_rejects_nonsense(bad: dict) -> None:
    fields = {"job_id": "x", "submit_time": 0.0, "gpus": 1, "work": 1.0, "job_class": "A"}
    with pytest.raises(ValueError):
        SimJob(**{**fields, **bad})
