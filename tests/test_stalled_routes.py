"""Routes Slurm does not start (engine/stalled.py, advisor/stalls.py): a routed job left pending
while its GPUs stand free is handed back to Slurm as written once it has stood
``advisor.route_stall_s``; never before, never a job whose GPUs are taken, never twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_pal.adapters.config import AdvisorConfig, ConfigError, load_config
from slurm_pal.adapters.slurm.release import SlurmRelease
from slurm_pal.adapters.slurm.update import scontrol_steps
from slurm_pal.advisor.counters import Counters
from slurm_pal.advisor.stalls import RouteReleaser
from slurm_pal.core.jobchange import JobChange
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import PendingJob, current_gpus
from slurm_pal.engine.stalled import (
    StallClock,
    free_labels,
    release_change,
    stands_free,
    waits_for_resources,
)
from tests.helpers.advisor import JOB, Env, FakeJob, RecordingApplier, make_env, wait_saved

RELEASE_24_11 = SlurmRelease(24, 11, 5)


def _routed(job_id: int, route: dict[str, tuple[str, ...]], **wire: object) -> PendingJob:
    job = JobDescription.from_wire(
        {"user": "u", "name": "j", "tres_per_node": "gres:gpu:2", **wire}
    )
    return PendingJob(
        job_id=job_id,
        token=f"t{job_id}",
        job=job,
        job_class="A",
        class_reason="test",
        current=route,
        tres_per_node=",".join(
            f"gres:gpu:{label}:1" for labels in route.values() for label in labels
        ),
    )


def test_free_labels_counts_the_gpus_slurm_shows_free_by_node_and_label(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    n01 = [e for e in env.table.entries if e.node == "n01"]
    free = free_labels(env.table, [n01[0].uuid])
    assert sum(free["n01"].values()) == 3 and sum(free["n02"].values()) == 4
    assert free["n01"][n01[0].label] == Counter(e.label for e in n01)[n01[0].label] - 1


def test_a_route_stands_free_only_when_every_gpu_it_names_is_free() -> None:
    free = {"n01": Counter({"x": 1, "y": 2}), "n02": Counter({"x": 1})}
    assert stands_free({"n01": ("x", "y")}, free)
    assert stands_free({"n01": ("y", "y"), "n02": ("x",)}, free)
    assert not stands_free({"n01": ("x", "x")}, free)  # one x free, two wanted
    assert not stands_free({"n03": ("x",)}, free)
    assert not stands_free({}, free)


def test_the_stall_clock_runs_only_while_the_route_stands_on_free_gpus() -> None:
    clock = StallClock(after_s=60)
    job = _routed(5, {"n01": ("x", "y")})
    free = {"n01": Counter({"x": 1, "y": 1})}
    taken = {"n01": Counter({"x": 1})}
    assert clock.due([job], free, 0.0) == []
    assert clock.due([job], free, 59.0) == []
    assert clock.due([job], free, 61.0) == [(job, 61.0)]
    assert clock.due([job], taken, 62.0) == []  # a GPU taken: starts over
    assert clock.due([job], free, 63.0) == []
    assert clock.due([job], free, 123.0) == [(job, 60.0)]
    moved = replace(job, current={"n02": ("x",)})
    assert clock.due([moved], {"n02": Counter({"x": 1})}, 124.0) == []  # re-routed: over
    held = replace(job, waiting=(0.0, 500.0))
    passed = replace(job, current=None)
    for other in (held, passed):
        assert StallClock(after_s=1).due([other], free, 0.0) == []
        assert StallClock(after_s=1).due([other], free, 10.0) == []
    off = StallClock(after_s=0)
    assert off.due([job], free, 0.0) == [] and off.due([job], free, 1e9) == []


def test_the_release_gives_back_the_users_request_and_a_pass_no_round_routes_again(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path)
    job = _routed(9, {"n02": ("v100-a", "v100-b")}, tres_per_node="gres:gpu:v100:2")
    change = release_change(job, env.table, version="9.9", stood_s=301.4, now=1_800_000_000)
    fields = dict(change.fields)
    comment = parse_admin_comment(str(fields.pop("admin_comment")))
    assert fields == {"tres_per_node": "gres:gpu:2", "tres_per_job": "", "req_nodes": ""}
    assert change.held_tres == job.tres_per_node
    assert comment is not None
    assert comment["action"] == "pass" and comment["r"] == "t9" and comment["class"] == "A"
    assert comment["released"] == "1800000000" and "301 s" in comment["why"]
    # The user's own node list and count come back as given.
    pinned = _routed(3, {"n02": ("v100-a",)}, req_nodes="n02", min_nodes=1, max_nodes=2)
    fields = release_change(pinned, env.table, version="9.9", stood_s=1, now=0).fields
    assert (fields["req_nodes"], fields["min_nodes"], fields["max_nodes"]) == ("n02", 1, 2)


def test_slurm_24_11_takes_the_release_in_one_update_and_22_05_cannot() -> None:
    change = JobChange(
        job_id=4,
        fields={"tres_per_node": "gres:gpu:2", "tres_per_job": "", "req_nodes": ""},
        held_tres="gres:gpu:v100-a:1,gres:gpu:v100-b:1",
    )
    assert scontrol_steps(change, RELEASE_24_11) == [
        ["update", "JobId=4", "ReqNodeList=", "TresPerNode=gres:gpu:2", "TresPerJob="]
    ]
    assert scontrol_steps(change, None) == []  # 22.05: typed -> untyped is refused


class _Applier(RecordingApplier):
    def __init__(self, release: SlurmRelease | None) -> None:
        super().__init__()
        self._release = release

    @property
    def release(self) -> SlurmRelease | None:  # type: ignore[override]
        return self._release


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[tuple[Env, object, str]]:
    """A service state with one job it routed, pending in Slurm on GPUs that are free."""
    env = make_env(tmp_path, policy="packed-pm")
    state = env.state()
    decision = state.decide(JobDescription.from_wire(JOB), JOB, None)
    assert decision.action == "route"
    assert decision.token is not None
    wait_saved(env, decision.token)
    fields = decision.set_fields
    env.slurm.jobs.append(
        FakeJob(
            41,
            admin_comment=str(fields["admin_comment"]),
            tres_per_node=str(fields["tres_per_node"]),
        )
    )
    yield env, state, decision.token
    env.close()


def _tick(env: Env, state: object, releaser: RouteReleaser, at: float) -> None:
    env.clock.now = at
    state.refresh()  # type: ignore[attr-defined]
    releaser.tick()


def test_the_service_releases_a_stalled_route_once_on_24_11(routed) -> None:
    env, state, token = routed
    applier = _Applier(RELEASE_24_11)
    counters = Counters()
    releaser = RouteReleaser(state, applier, counters, after_s=300)  # type: ignore[arg-type]
    start = env.clock.now
    _tick(env, state, releaser, start)
    _tick(env, state, releaser, start + 299)
    assert applier.updates == []
    _tick(env, state, releaser, start + 301)
    (change,) = applier.updates
    assert isinstance(change, JobChange) and change.job_id == 41
    assert change.fields["tres_per_node"] == "gres:gpu:2"
    assert counters.snapshot()["routes_released"] == 1
    # Slurm shows the pass now: the job is no longer in the steered queue, nor released again.
    env.slurm.jobs[0].admin_comment = str(change.fields["admin_comment"])
    env.slurm.jobs[0].tres_per_node = "gres:gpu:2"
    _tick(env, state, releaser, start + 1000)
    assert len(applier.updates) == 1
    assert state.view.pending == ()  # type: ignore[attr-defined]
    assert state.view.by_token[token].job_id == 41  # type: ignore[attr-defined]


def test_a_stalled_route_whose_gpus_are_taken_is_left_alone(routed) -> None:
    env, state, _ = routed
    applier = _Applier(RELEASE_24_11)
    releaser = RouteReleaser(state, applier, Counters(), after_s=300)  # type: ignore[arg-type]
    route = current_gpus(parse_admin_comment(env.slurm.jobs[0].admin_comment) or {})
    assert route is not None
    (node,) = route
    env.slurm.jobs.append(FakeJob(42, state="RUNNING", gpus={node: [0, 1, 2, 3]}))
    for at in (0, 400, 800):
        _tick(env, state, releaser, env.clock.now + at)
    assert applier.updates == []


def test_on_22_05_a_stalled_route_is_logged_once_and_not_written(routed, caplog) -> None:
    env, state, _ = routed
    applier = _Applier(None)
    counters = Counters()
    releaser = RouteReleaser(state, applier, counters, after_s=300)  # type: ignore[arg-type]
    start = env.clock.now
    for at in (0, 301, 600, 900):
        _tick(env, state, releaser, start + at)
    assert applier.updates == []
    assert counters.snapshot()["routes_stalled"] == 1
    lines = [r.getMessage() for r in caplog.records if "not released" in r.getMessage()]
    assert len(lines) == 1 and "job 41" in lines[0] and "22.05" in lines[0]


def test_route_stall_s_is_read_and_checked(tmp_path: Path) -> None:
    assert AdvisorConfig().route_stall_s == 300.0
    path = tmp_path / "site.toml"
    path.write_text("[advisor]\nroute_stall_s = 0\n")
    assert load_config(path).advisor.route_stall_s == 0
    path.write_text("[advisor]\nroute_stall_s = -1\n")
    with pytest.raises(ConfigError, match="route_stall_s"):
        load_config(path)


def test_only_a_job_slurm_keeps_for_resources_counts_as_stalled(routed) -> None:
    assert all(map(waits_for_resources, ("Resources", "Priority", "None")))
    assert not any(
        map(waits_for_resources, ("QOSMaxGRESPerUser", "AssocGrpGRES", "ReqNodeNotAvail"))
    )
    env, state, _ = routed
    env.slurm.jobs[0].reason = "QOSMaxGRESPerUser"  # a limit holds it wherever it is routed
    applier = _Applier(RELEASE_24_11)
    releaser = RouteReleaser(state, applier, Counters(), after_s=300)  # type: ignore[arg-type]
    start = env.clock.now
    for at in (0, 301, 900):
        _tick(env, state, releaser, start + at)
    assert applier.updates == []
