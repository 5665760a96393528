"""The advisor engine on its own: its settings from a site's ``[advisor]``, the policy it builds
(the same for ``serve`` and ``sim run --config``), and its one placement entry point."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_pal.adapters.config import AdvisorConfig, SiteConfig
from slurm_pal.advisor.state import make_engine
from slurm_pal.core.placement import configured_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.placing import ANYWHERE, place
from slurm_pal.engine.settings import EngineSettings
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.sim.engine import SimConfig, _Simulation
from slurm_pal.sim.variability import uniform_gpus
from tests.helpers.decide_site import A0, A1, AX, site

POLICY_KNOBS = ("avoid_above", "wait", "max_wait_s", "assumed_runtime_s")


def test_settings_carry_every_decision_knob_of_the_advisor_section() -> None:
    advisor = replace(
        AdvisorConfig(),
        policy="pal",
        pack_tolerance=0.1,
        outliers="last-resort",
        pin="every-job",
        label_requests="deny",
        reservation_ttl_s=5.0,
        replan_on_epilog=False,
    )
    settings = EngineSettings.from_advisor(advisor)
    assert settings.policy == "pal" and dict(settings.policy_settings)["pack_tolerance"] == 0.1
    assert dict(settings.policy_settings)["wait"] is False
    assert (settings.pin, settings.label_requests) == ("every-job", "deny")
    assert (settings.reservation_ttl_s, settings.replan_on_epilog) == (5.0, False)
    assert EngineSettings.from_advisor(advisor, "packed-pm").policy == "packed-pm"
    assert not settings.leave_packing and EngineSettings().leave_packing
    with pytest.raises(ValueError, match="unknown pin"):
        EngineSettings(pin="sometimes")


def test_serve_and_sim_run_config_build_the_same_engine_policy() -> None:
    """A non-default ``[advisor]``: the engine ``serve`` builds and the one the simulator's
    Slurm mode builds from ``advisor_sim_options`` of the same config hold the same policy."""
    advisor = replace(
        AdvisorConfig(),
        avoid_above=1.3,
        outliers="last-resort",
        max_wait_s=600.0,
        assumed_runtime_s=120.0,
        replan_on_epilog=False,
    )
    config = replace(SiteConfig(), advisor=advisor)
    served = make_engine(advisor.policy, advisor)
    gpus = uniform_gpus(("A", "B", "C", "D"), 2, 4)
    simulated = _Simulation([], gpus, SimConfig(mode="slurm", **advisor_sim_options(config)))
    engine = simulated.engine
    assert type(engine) is type(served) is AdvisorEngine
    assert engine.policy.name == served.policy.name == "packed-pm"
    for knob in POLICY_KNOBS:
        assert getattr(engine.policy, knob) == getattr(served.policy, knob), knob
    assert engine.rounds_at_job_end is served.rounds_at_job_end is False
    assert simulated.at_submit_only


def test_place_is_the_policy_with_the_clock_the_wait_and_the_pin() -> None:
    cluster, _ = site({"n1": [A0, A1, A0, A1], "n2": [AX, A0, A0, A0]})
    steered = AdvisorEngine(EngineSettings(policy="packed"), version="t")
    pinned = AdvisorEngine(EngineSettings(policy="packed", pin="every-job"), version="t")
    request = PlacementRequest(job_id="1", job_class="A", gpus=2)
    left = steered.place(request, cluster, now=50.0, waiting_since=20.0)
    assert cluster.clock == 50.0 and left.request.waited_s == 30.0
    assert left.left_to_slurm and left.allocation is not None
    kept = pinned.place(request, cluster)
    assert not kept.left_to_slurm and kept.allocation == left.allocation
    # the same answer as the policy itself, through the entry point both drivers share
    own = configured_policy("packed").place(request, cluster)
    assert left.result().allocation == own.allocation


def test_a_placement_over_partitions_takes_the_best_and_joins_the_reasons() -> None:
    cluster, _ = site({"n1": [A0, A0], "n2": [A1, A1, A1, A1]})
    policy = configured_policy("pal")
    request = PlacementRequest(job_id="1", job_class="A", gpus=2)
    both = place(
        policy,
        request,
        cluster,
        candidates=(("p2", frozenset({"n1"})), ("p1", frozenset({"n2"}))),
    )
    assert both.allocation is not None and set(both.allocation.node_names) == {"n1"}
    big = replace(request, gpus=8)
    none = place(
        policy, big, cluster, candidates=(("p1", frozenset({"n2"})), ("p2", frozenset({"n1"})))
    )
    assert none.allocation is None and not none.waits and len(none.reasons) == 2
    assert none.result().reason == "; ".join(none.reasons)
    alone = place(policy, big, cluster, candidates=ANYWHERE)
    assert alone.result() is alone.results[0]  # a queue loop gets the policy's own answer
