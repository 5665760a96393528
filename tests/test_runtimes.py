"""The runtime model: what the site's finished jobs ran, as the wait rule weighs it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slurm_pal.core.placement import PackedPMPolicy, get_policy
from slurm_pal.core.placement.packedpm import WAIT_REASON
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


def test_the_product_limit_curve_counts_running_jobs_as_at_risk_until_they_were_seen() -> None:
    from slurm_pal.core.runtimes import product_limit

    # Ends at 1, 2 and 4; one job still running at 3. After 1: 4/5 run; after 2: 3/5; the
    # running job leaves the risk set at 3, so the end at 4 takes the last of two: 3/5 x 1/2.
    times, survival = product_limit(
        np.array([2.0, 1.0, 3.0, 4.0, 5.0]), np.array([True, True, False, True, False])
    )
    assert times.tolist() == [1.0, 2.0, 4.0]
    assert survival == pytest.approx([0.8, 0.6, 0.3])
    # No running job: the empirical curve (ties end together).
    times, survival = product_limit(np.array([1.0, 1.0, 2.0]), np.ones(3, bool))
    assert times.tolist() == [1.0, 2.0] and survival == pytest.approx([1 / 3, 0.0])


def _early_history(model: RuntimeModel) -> RuntimeModel:
    """A site's first hours: 20 jobs with a 100 h limit failed within 1.6 h, 20 one-hour jobs
    used a tenth of theirs; the 100 h jobs that work have not ended."""
    for _ in range(20):
        model.partial_fit(EndedJob(2, 360_000.0, 5_760.0))
        model.partial_fit(EndedJob(1, 3_600.0, 360.0))
    return model


def test_long_jobs_still_running_keep_their_class_from_being_called_short() -> None:
    from slurm_pal.core.runtimes import RunningJob

    model = _early_history(RuntimeModel(min_runs=20))
    # From the ends alone, a 100 h job runs 1.6 h.
    assert model.predict(2, 360_000.0) == pytest.approx(5_760.0)
    # Ten of the class have run 20-65 h so far (and a 1 h job 50 min, of another class).
    running = [RunningJob(2, 360_000.0, 3600.0 * h) for h in range(20, 70, 5)]
    running.append(RunningJob(1, 3_600.0, 3_000.0))
    predicted = model.predict(2, 360_000.0, running)
    assert predicted is not None
    # never below what a running job of its limit class has run
    assert predicted >= 65 * 3600.0
    assert model.running_floor_s(360_000.0, running) == 65 * 3600.0
    # the product-limit mean: a third of the class still runs past 1.6 h, to at least 20 h
    share = model.mean_share_of(360_000.0, running)
    assert share is not None and 0.3 < share < 0.4
    # the median holder of the class: still a third running after the early ends, so the
    # median is the first end (1.6 h): the class has more early ends than running jobs
    assert model.share_of(360_000.0, running) == pytest.approx(0.016)
    # A 1 h job's class is its own: the 100 h jobs do not make it long, its own running one
    # does (50 min of the hour).
    assert model.predict(1, 3_600.0) == pytest.approx(360.0)
    assert model.predict(1, 3_600.0, running) == pytest.approx(3_000.0)
    # what was learned is not changed by asking
    assert model.predict(2, 360_000.0) == pytest.approx(5_760.0)


def test_while_too_few_jobs_have_ended_the_fixed_rules_stand_with_the_running_floor() -> None:
    from slurm_pal.core.runtimes import RunningJob

    model = RuntimeModel(min_runs=20)
    running = [RunningJob(2, 360_000.0, 50 * 3600.0), RunningJob(2, 7_200.0, 7_000.0)]
    assert model.predict(2, 360_000.0, running) is None  # too few ended: limit_share stands
    # the floor is those with the very same limit while the class cannot be told
    assert model.running_floor_s(360_000.0, running) == 50 * 3600.0
    assert model.running_floor_s(180_000.0, running) == 0.0
    # unlimited jobs have no floor (heavy-tailed: one job running for weeks says little)
    assert model.running_floor_s(math.inf, running) == 0.0
    assert model.running_floor_s(None, [RunningJob(1, None, 9e6)]) == 0.0


def test_the_policy_reads_running_jobs_off_the_view_and_weighs_the_wait_with_them() -> None:
    """A 2-GPU job with a 100 h limit: the good GPUs free in 3 h. From the ends alone it would
    run 1.6 h and lose 2.3 h on the 2.4x pair, less than the wait: it takes them. Two 100 h
    jobs of the view have run 30 h: it waits."""
    from slurm_pal.core.cluster import Cluster, GpuSpec
    from slurm_pal.core.topology import Topology
    from slurm_pal.core.waiting import running_jobs

    gpus = [
        GpuSpec(f"{node}-{i}", node, i, "v100", {"A": score, "D": 1.0})
        for node, scores in {"n0": [2.4, 2.4], "n1": [1.0, 1.0], "n2": [1.0, 1.0]}.items()
        for i, score in enumerate(scores)
    ]
    cluster = Cluster.from_gpus(gpus, Topology.flat(1.7), busy=("n1-0", "n1-1", "n2-0", "n2-1"))
    index = cluster.uuid_index
    now = 200_000.0
    cluster.clock = now
    # n1's holder ends at its limit in 3 h (its start unknown to the view: not a running
    # observation)
    cluster.expect_free_at([index["n1-0"], index["n1-1"]], now + 3 * 3600.0)
    policy = PackedPMPolicy(wait=True, max_wait_s=86_400.0)
    policy.runtimes = _early_history(RuntimeModel(min_runs=20))
    request = PlacementRequest("j", "A", 2, time_limit_s=360_000.0)
    # n2's holder: started 30 h ago on a 100 h limit
    started = now - 30 * 3600.0
    cluster.expect_free_at([index["n2-0"], index["n2-1"]], started + 360_000.0, since=started)
    seen = running_jobs(cluster)
    assert [(j.gpus, j.time_limit_s, j.elapsed_s) for j in seen] == [(2, 360_000.0, 30 * 3600.0)]
    held = policy.place(request, cluster)
    assert held.allocation is None and WAIT_REASON in held.reason
    # Without the running one (a view that does not know its start), the ends alone decide.
    cluster.expect_free_at([index["n2-0"], index["n2-1"]], started + 360_000.0)
    taken = policy.place(request, cluster)
    assert taken.allocation is not None and "rather than wait" in taken.reason


def test_a_holder_is_expected_at_its_classs_median_end_given_what_it_has_run() -> None:
    """Twenty 1 h jobs used 5 %, 10 %, ... 100 % of their hour. A holder 80 % in is not
    expected at its limit's end (what a share it has outlived said), but when half of those
    that ran that long ended: at 90 %; one 10 % in, when half of those past 10 % ended."""
    model = RuntimeModel(min_runs=20)
    for step in range(1, 21):
        model.partial_fit(EndedJob(1, 3600.0, 180.0 * step))
    assert model.share_of(3600.0) == pytest.approx(0.525)  # the plain median
    assert model.share_of(3600.0, used=0.8) == pytest.approx(0.9)
    assert model.share_of(3600.0, used=0.1) == pytest.approx(0.55)
    assert model.share_of(3600.0, used=1.0) == pytest.approx(1.0)  # at its limit
