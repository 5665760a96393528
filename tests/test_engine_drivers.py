"""The advisor engine's two drivers decide alike: one event sequence (submissions, Slurm state
reads, a job's end and its round) replayed through the service's path (``AdvisorState`` over
Slurm answered from the recorded 22.05 samples, its round through ``RoundCoordinator``) and
through the simulator's Slurm mode (``sim run --config`` of the same site config, on GPUs with
the same PM-scores) gives the same decision for every job: routed, left to Slurm or passed,
on the same GPUs. Both drivers' rounds are ``AdvisorEngine.replan``: the simulator runs one at
every arrival and job end, and its round at the job's end decides what the service's does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurm_pal.advisor.counters import Counters
from slurm_pal.advisor.rounds import RoundCoordinator
from slurm_pal.core.workload import SimJob
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import ReplanResult
from slurm_pal.engine.settings import EngineSettings
from slurm_pal.sim import engine as sim_engine
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.sim.engine import SimConfig
from slurm_pal.sim.variability import SimGpus
from tests.helpers.advisor import Env, FakeJob, RecordingApplier, make_env

T0 = 1000.0  # the service's clock when the simulation's clock is 0

# (time, job, GPUs, application -> class, work in seconds): J1 ends at 10 (its GPUs are median
# ones, the others run long). Class A has an outlier on two nodes, so A's jobs are steered
# around them (routed); J4 finds no fit at submit and is placed by the round at J1's end; J5,
# of a class no GPU is an outlier for, is packing's own pick: left to Slurm (the simulator
# backfills it, as Slurm would: it fits in what J4's reservation leaves over).
EVENTS = (
    (0.0, 1, 4, "resnet", 10.0),
    (1.0, 2, 2, "resnet", 500.0),
    (2.0, 3, 3, "resnet", 500.0),
    (3.0, 4, 8, "pagerank", 500.0),
    (4.0, 5, 1, "pagerank", 500.0),
)
CLASSES = {"resnet": "A", "pagerank": "D"}

Decisions = dict[int, tuple[str, tuple[int, ...]]]
"""Job -> (what was decided: routed or left to Slurm, at its submission or at J1's end; the
GPUs, as rows of the cluster)."""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    the_env = make_env(tmp_path, policy="packed-pm")
    yield the_env
    the_env.close()


def _wire(job_id: int, gpus: int, app: str) -> JobDescription:
    return JobDescription.from_wire(
        {
            "user": "alice",
            "uid": 1000,
            "name": f"job{job_id}",
            "comment": f"pal:app={app}",
            "tres_per_job": f"gres:gpu:{gpus}",
            "script": f"#!/bin/sh\n#PAL app={app}\nsleep 1\n",
            "script_size": 30,
        }
    )


def _service(env: Env) -> tuple[Decisions, AdvisorEngine, Decisions]:
    """Each job's decision through the service: (action, GPU rows of the cluster)."""
    env.clock.now = T0
    st = env.state(wall_clock=env.clock)
    rows = {u: i for i, u in enumerate(st.cluster_snapshot().uuids)}  # type: ignore[union-attr]
    slurm_index = {
        g["uuid"]: (node, g["slurm_index"])
        for node, gpus in env.labels["nodes"].items()
        for g in gpus
    }
    out: Decisions = {}
    for t, job_id, gpus, app, _ in EVENTS:
        env.clock.now = T0 + t
        decision = st.decide(_wire(job_id, gpus, app), {})
        if decision.allocation is None:
            out[job_id] = (decision.action, ())
            env.slurm.jobs.append(
                FakeJob(
                    job_id,
                    admin_comment=str(decision.set_fields["admin_comment"]),
                    tres_per_node="",
                )
            )
            continue
        action = "left to Slurm" if decision.left_to_slurm else decision.action
        out[job_id] = (action, tuple(sorted(rows[u] for u in decision.allocation.uuids)))
        held: dict[str, list[int]] = {}
        for uuid in decision.allocation.uuids:  # Slurm starts it where it was decided
            node, index = slurm_index[uuid]
            held.setdefault(node, []).append(index)
        env.slurm.jobs.append(
            FakeJob(
                job_id,
                state="RUNNING",
                admin_comment=str(decision.set_fields["admin_comment"]),
                gpus=held,
            )
        )
        st.refresh()  # Slurm's next read shows it running
    # J1 ends at 10: Slurm shows it gone; the round places the pending jobs
    env.clock.now = T0 + 10.0
    env.slurm.jobs = [j for j in env.slurm.jobs if j.job_id != 1]
    rounds = RoundCoordinator(
        st,
        RecordingApplier(),
        Counters(),
        reread=st.refresh,
        refresh_now=threading.Event(),
        replan_s=0,
    )
    result = rounds.replan(refresh=True)
    at_end = _round(result, rows)
    for job_id, (action, chosen) in at_end.items():
        out[job_id] = (f"{action} at end", chosen)
    return out, st.engine, at_end


def _round(result: ReplanResult, rows: dict[str, int]) -> Decisions:
    """What one round decided for each job it placed: routed, or left to Slurm (GPU rows)."""
    out: Decisions = {}
    for update in result.updates:
        if update.decision.allocation is not None:
            uuids = update.decision.allocation.uuids
            out[update.job_id] = ("route", tuple(sorted(rows[u] for u in uuids)))
    for job_id, (_, uuids) in result.in_place.items():
        out[job_id] = ("left to Slurm", tuple(sorted(rows[u] for u in uuids)))
    return out


def _simulator(
    env: Env, scores: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> tuple[Decisions, list[AdvisorEngine], list[tuple[float, Decisions]]]:
    """Each job's decision through the simulator's Slurm mode, from the same site config, and
    what each of its rounds (``engine.replan``, every one) decided."""
    engines: list[AdvisorEngine] = []
    rounds: list[tuple[float, Decisions]] = []

    class Recording(AdvisorEngine):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            engines.append(self)

        def replan(self, pending, cluster, **kwargs):  # type: ignore[no-untyped-def]
            rows = {u: i for i, u in enumerate(cluster.uuids)}
            result = super().replan(pending, cluster, **kwargs)
            rounds.append((kwargs["now"], _round(result, rows)))
            return result

    starts: dict[int, tuple[float, tuple[int, ...]]] = {}
    started = sim_engine._Simulation._started

    def record(self, job, alloc, now):  # type: ignore[no-untyped-def]
        starts[job.order] = (now, tuple(sorted(int(g) for g in alloc.gpu_ids)))
        started(self, job, alloc, now)

    monkeypatch.setattr(sim_engine, "AdvisorEngine", Recording)
    monkeypatch.setattr(sim_engine._Simulation, "_started", record)
    n = len(next(iter(scores.values())))
    gpus = SimGpus(
        n // 4,
        4,
        scores,
        {c: np.ones(n) for c in scores},  # median speed everywhere: J1 ends at 10
        source="the service's campaign",
    )
    jobs = [
        SimJob(str(job_id), t, size, work, CLASSES[app]) for t, job_id, size, app, work in EVENTS
    ]
    config = SimConfig(mode="slurm", **advisor_sim_options(env.config))  # sim run --config
    sim_engine.simulate(jobs, gpus, config)
    out: Decisions = {}
    for order, (t, job_id, *_rest) in enumerate(EVENTS):
        when, rows = starts[order]
        decided = dict(rounds)[when]  # the round that started it
        assert order in decided, f"job {job_id} started at {when} without the round's decision"
        action, chosen = decided[order]
        assert chosen == rows  # started on the GPUs the round wrote
        out[job_id] = (action if when == t else f"{action} at end", rows)
    return out, engines, rounds


def test_the_service_and_the_simulator_make_the_same_decisions(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = env.state()
    cluster = probe.cluster_snapshot()
    assert cluster is not None
    scores = {c: np.asarray(cluster.classes[c].scores, float) for c in cluster.class_order}
    service, served, service_round = _service(env)
    simulated, engines, rounds = _simulator(env, scores, monkeypatch)
    # one engine class, one policy, one pin rule, built from the same site config
    assert len(engines) == 1 and type(served) is AdvisorEngine
    assert isinstance(engines[0], AdvisorEngine)
    assert engines[0].policy.name == served.policy.name == "packed-pm"
    assert engines[0].settings.pin == served.settings.pin == "steered"
    assert served.settings == EngineSettings.from_advisor(env.config.advisor)
    # what each driver did with each job: J4 waited for the end of J1 in both
    assert service[4][0].endswith("at end")
    assert service == simulated
    assert {action for action, _ in service.values()} >= {"left to Slurm", "route"}
    # the simulator's rounds are the engine's: one at every arrival and at J1's end, and the
    # round at J1's end decides what the service's round decides (job ids: trace order)
    assert [when for when, _ in rounds] == [t for t, *_ in EVENTS] + [10.0]
    at_end = {order + 1: decided for order, decided in rounds[-1][1].items()}
    assert at_end == service_round
    assert set(service_round) == {4}  # the round placed J4 (left to Slurm where it fits)
