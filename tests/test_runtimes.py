"""The runtime model: what the site's finished jobs ran, as the wait rule weighs it."""

from __future__ import annotations

import math

import pytest

from slurm_pal.core.placement import get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.runtimes import EndedJob, RuntimeModel, size_bucket
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.settings import EngineSettings


def test_a_limited_job_is_predicted_at_the_share_of_its_limit_the_site_used() -> None:
    model = RuntimeModel(min_runs=3)
    for used in (600.0, 1800.0, 3600.0):  # shares 1/6, 1/2, 1 of an hour
        model.partial_fit(EndedJob(1, 3600.0, used))
    assert model.limit_share == pytest.approx(0.5)
    assert model.share_of(7200.0) == pytest.approx(0.5)  # the median share, for holders
    # a job's own runtime at the mean share: the outlier's cost grows with it
    assert model.predict(4, 7200.0) == pytest.approx(7200.0 * (1 / 6 + 1 / 2 + 1) / 3)
    # an overrun (a grace period) counts as the whole limit, not more
    model.partial_fit(EndedJob(1, 3600.0, 9000.0))
    assert model.limit_share == pytest.approx(0.75)


def test_a_limited_job_is_weighed_by_the_jobs_whose_limits_were_nearest_its_own() -> None:
    # Many 1-h jobs use a tenth of their hour; the few 2-day jobs use half of theirs. One
    # site-wide share would call a 2-day job 5 h long.
    model = RuntimeModel(min_runs=4)
    for _ in range(20):
        model.partial_fit(EndedJob(1, 3600.0, 360.0))
    for used in (0.4, 0.5, 0.5, 0.6):
        model.partial_fit(EndedJob(8, 172_800.0, used * 172_800.0))
    assert model.limit_share == pytest.approx(0.1)
    assert model.share_of(172_800.0) == pytest.approx(0.5)
    assert model.predict(32, 200_000.0) == pytest.approx(0.5 * 200_000.0)
    assert model.predict(1, 3000.0) == pytest.approx(300.0)
    # the copy a predicting thread gets knows the same
    assert model.copy().share_of(172_800.0) == pytest.approx(0.5)
    # admins see the share at the site's typical limits, not only the site-wide one
    typical = {k: v for k, v in model.learned().items() if "limit_s" in v}
    assert typical["limited, 1 h limit"]["limit_share"] == pytest.approx(0.1)
    assert typical["limited, 48 h limit"]["limit_share"] == pytest.approx(0.5)
    # a limit that is not a positive number is not learned from
    model.partial_fit(EndedJob(1, 0.0, 10.0))
    assert model.limit_share == pytest.approx(0.1)


def test_an_unlimited_job_is_predicted_from_unlimited_jobs_of_its_size_first() -> None:
    model = RuntimeModel(min_runs=2)
    assert model.predict(1, math.inf) is None  # knows nothing yet
    for runtime in (100.0, 300.0):
        model.partial_fit(EndedJob(1, None, runtime))
    assert model.predict(1, math.inf) == pytest.approx(200.0)
    # no 16-GPU job has ended yet: the median of every size stands in
    assert model.predict(16, None) == pytest.approx(200.0)
    for runtime in (80_000.0, 90_000.0):
        model.partial_fit(EndedJob(16, math.inf, runtime))
    assert model.predict(16, None) == pytest.approx(85_000.0)
    assert model.predict(1, None) == pytest.approx(200.0)
    assert size_bucket(1) != size_bucket(8) != size_bucket(9)


def test_only_the_window_counts_and_nonsense_is_ignored() -> None:
    model = RuntimeModel(min_runs=2, window=2)
    for runtime in (10.0, 20.0, 1000.0, 2000.0):
        model.partial_fit(EndedJob(1, None, runtime))
    model.partial_fit(EndedJob(1, None, -5.0))
    model.partial_fit(EndedJob(1, None, math.nan))
    model.partial_fit(EndedJob(0, None, 50.0))
    assert model.predict(1, None) == pytest.approx(1500.0)
    assert model.fit([]).predict(1, None) is None
    with pytest.raises(ValueError, match="min_runs"):
        RuntimeModel(min_runs=5, window=2)


def weighed_runtime(engine: AdvisorEngine, gpus: int, limit: float | None) -> float:
    request = PlacementRequest(job_id="1", job_class="A", gpus=gpus, time_limit_s=limit)
    return engine.policy._expected_runtime_s(request)  # type: ignore[attr-defined]


def test_the_engine_teaches_its_policy_what_the_sites_jobs_ran() -> None:
    settings = EngineSettings(policy="packed-pm", policy_settings=(("wait", True),))
    engine = AdvisorEngine(settings, version="test")
    # before any job ended: the policy's fixed rules (an hour; half the limit)
    assert weighed_runtime(engine, 16, None) == pytest.approx(3600.0)
    assert weighed_runtime(engine, 1, 7200.0) == pytest.approx(3600.0)
    engine.learn_runtimes(EndedJob(16, None, 80_000.0) for _ in range(20))
    assert weighed_runtime(engine, 16, None) == pytest.approx(80_000.0)
    for _ in range(20):
        engine.job_ended(EndedJob(1, 7200.0, 720.0))
    assert weighed_runtime(engine, 1, 7200.0) == pytest.approx(720.0)
    # a known runtime (the simulator's perfect knowledge) is never second-guessed
    known = PlacementRequest(job_id="2", job_class="A", gpus=1, runtime_s=50.0)
    assert engine.policy._expected_runtime_s(known) == 50.0  # type: ignore[attr-defined]
    # a policy that does not weigh waits is left alone
    assert not hasattr(
        AdvisorEngine(EngineSettings(policy="packed"), version="t").policy, "runtimes"
    )
    assert get_policy("packed-pm").runtimes is None


def test_a_copy_learns_apart_and_says_what_it_learned() -> None:
    model = RuntimeModel(min_runs=2)
    for used in (600.0, 1800.0):
        model.partial_fit(EndedJob(1, 3600.0, used))
    model.partial_fit(EndedJob(16, None, 50_000.0))
    snap = model.copy()
    model.partial_fit(EndedJob(1, 3600.0, 3600.0))
    model.partial_fit(EndedJob(16, None, 70_000.0))
    assert snap.limit_share == pytest.approx(1 / 3) and model.limit_share == pytest.approx(0.5)
    assert snap.predict(16, None) is None and model.predict(16, None) == pytest.approx(60_000.0)
    assert snap.learned() == {
        "limited": {"limit_share": pytest.approx(1 / 3), "jobs": 2},
        "limited, 1 h limit": {"limit_share": pytest.approx(1 / 3), "jobs": 2, "limit_s": 3600.0},
        "unlimited 1 GPU": {"median_s": None, "jobs": 0},
        "unlimited 2-8 GPUs": {"median_s": None, "jobs": 0},
        "unlimited over 8 GPUs": {"median_s": None, "jobs": 1},
        "unlimited any size": {"median_s": None, "jobs": 1},
    }


def test_an_engine_hands_a_model_learned_elsewhere_to_its_policy() -> None:
    settings = EngineSettings(policy="packed-pm", policy_settings=(("wait", True),))
    learned = RuntimeModel().fit(EndedJob(16, None, 80_000.0) for _ in range(20))
    engine = AdvisorEngine(settings, version="test")
    engine.use_runtimes(learned)
    assert engine.runtimes is learned
    assert weighed_runtime(engine, 16, None) == pytest.approx(80_000.0)
