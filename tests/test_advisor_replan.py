"""Re-planning pending jobs: PAL's queue round over the jobs the advisor steered (pure plan)
and the ``scontrol update`` steps that carry it out."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from slurm_pal.adapters.slurm.release import parse_release
from slurm_pal.adapters.slurm.update import ScontrolApplier, scontrol_steps, transition_problem
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement import configured_policy, get_policy
from slurm_pal.core.queue import Outcome, StopAtMisfit, plan_round, queue_round
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.decide import LabelTable, parse_admin_comment
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import (
    PendingJob,
    current_gpus,
    plan_replan,
)
from tests.helpers.advisor import Env, make_env
from tests.helpers.decide_site import A0, A1, A2, AX, site


@pytest.fixture
def st(tmp_path: Path) -> Iterator[tuple[AdvisorState, LabelTable]]:
    env: Env = make_env(tmp_path)
    state = env.state()
    yield state, env.table
    env.close()


def _pending(job_id: int, n: int, job_class: str, **kw: object) -> PendingJob:
    job = JobDescription.from_wire(
        {"user": "u", "name": f"j{job_id}", "tres_per_node": f"gres:gpu:{n}"}
    )
    return PendingJob(
        job_id=job_id,
        token=f"t{job_id}",
        job=job,
        job_class=job_class,
        class_reason="test",
        current=kw.get("current"),  # type: ignore[arg-type]
        tres_per_node=str(kw.get("tres", "gres:gpu:1")),
        priority=int(kw.get("priority", 0)),  # type: ignore[call-overload]
    )


def _cluster(st: tuple[AdvisorState, LabelTable], busy_nodes: Sequence[str] = ()) -> Cluster:
    state, _ = st
    cluster = state.cluster_snapshot()
    assert cluster is not None
    ids = [g for n in busy_nodes for g in cluster.node_gpus[cluster.node_index[n]] if g >= 0]
    if ids:
        cluster.allocate(ids)
    return cluster


def test_the_round_equals_plan_round_of_the_placement_core(st) -> None:
    state, labels = st
    cluster = _cluster(st, ["n02", "n03"])
    pending = [_pending(1, 2, "D"), _pending(2, 1, "A"), _pending(3, 4, "B"), _pending(4, 4, "A")]
    result = plan_replan(
        pending,
        cluster,
        labels=labels,
        policy=state.policy,
        version="t",
        class_order=cluster.class_order,
    )
    requests = [
        PlacementRequest(str(p.job_id), p.job_class, n, gpus_per_node=n)
        for p, n in zip(pending, (2, 1, 4, 4), strict=True)
    ]
    expected = plan_round(requests, cluster, state.policy, on_misfit="stop")
    placed = {r.request.job_id: r.allocation.uuids for r in expected if r.allocation is not None}
    got = {str(u.job_id): u.decision.allocation.uuids for u in result.updates}  # type: ignore[union-attr]
    assert got == placed and len(got) == 3  # the cut: 2+1+4 of 8 free GPUs; then 1 is left
    assert result.not_placed == [4]
    # class A first within the cut (PAL's order), whatever the priority order said
    assert [u.job_id for u in result.updates] == [2, 3, 1]  # A, B, D
    assert cluster.n_free == 8  # the caller's cluster is untouched


def test_a_job_already_on_its_choice_is_left_alone(st) -> None:
    state, labels = st
    cluster = _cluster(st)
    first = plan_replan([_pending(1, 2, "A")], cluster, labels=labels, policy=state.policy,
                        version="t")  # fmt: skip
    (update,) = first.updates
    again = plan_replan(
        [_pending(1, 2, "A", current=update.chosen)],
        cluster,
        labels=labels,
        policy=state.policy,
        version="t",
    )
    assert again.updates == [] and again.unchanged == [1]


def test_nothing_free_means_no_update(st) -> None:
    state, labels = st
    cluster = _cluster(st, ["n01", "n02", "n03", "n04"])
    result = plan_replan([_pending(1, 1, "A")], cluster, labels=labels, policy=state.policy,
                         version="t")  # fmt: skip
    assert result.updates == [] and result.not_placed == [1]


def test_current_gpus_reads_the_admin_comment() -> None:
    assert current_gpus({"gpus": "n01:b+a;n02:c*2"}) == {"n01": ("a", "b"), "n02": ("c", "c")}
    assert current_gpus({}) is None
    assert current_gpus({"gpus": "garbage"}) is None


def test_untyped_jobs_move_through_an_untyped_per_job_request(st) -> None:
    """22.05 refuses untyped -> typed in one update (testbed finding in PROTOCOL.md)."""
    state, labels = st
    cluster = _cluster(st)
    (update,) = plan_replan(
        [_pending(7, 2, "A", tres="gres:gpu:2")], cluster, labels=labels, policy=state.policy,
        version="t",
    ).updates  # fmt: skip
    steps = scontrol_steps(update.change)
    assert steps[0] == ["update", "JobId=7", "TresPerNode=", "TresPerJob=gres:gpu:2"]
    final = steps[1]
    assert final[:2] == ["update", "JobId=7"] and "TresPerJob=" in final
    fields = update.decision.set_fields
    assert f"TresPerNode={fields['tres_per_node']}" in final
    assert f"ReqNodeList={fields['req_nodes']}" in final and "NumNodes=1" in final
    assert any(a.startswith("AdminComment=slurm-pal/") for a in final)
    (label,) = {lab for labs in update.chosen.values() for lab in labs}
    typed = PendingJob(**{**update.pending.__dict__, "tres_per_node": f"gres:gpu:{label}:1"})
    steps = scontrol_steps(type(update)(**{**update.__dict__, "pending": typed}).change)
    assert len(steps) == 1  # typed -> typed keeping the type: one update


def _with_request(update, now: str, new: str):  # type: ignore[no-untyped-def]
    """``update`` as if the job held ``now`` and the plan wrote ``new`` (tres_per_node)."""
    fields = {**update.decision.set_fields, "tres_per_node": new}
    decision = type(update.decision)(**{**update.decision.__dict__, "set_fields": fields})
    pending = PendingJob(**{**update.pending.__dict__, "tres_per_node": now})
    return type(update)(**{**update.__dict__, "decision": decision, "pending": pending})


@pytest.mark.parametrize(
    ("now", "new", "refused"),
    [
        # Slurm 22.05 merges a TresPerNode update into the old request (tests/slurm finding):
        ("gres:gpu:ta:2", "gres:gpu:tb:2", True),  # ran on 4 GPUs
        ("gres:gpu:ta:3,gres:gpu:tb:1", "gres:gpu:ta:4", True),  # BadConstraints without tb
        ("gres:gpu:ta:1,gres:gpu:tb:1", "gres:gpu:ta:2,gres:gpu:tb:0", True),  # tb:0 keeps tb:1
        ("gres:gpu:ta:1,gres:gpu:tb:1", "gres:gpu:ta:2", True),
        ("gres:gpu:ta:3", "gres:gpu:ta:4", False),  # new count: exact
        ("gres:gpu:ta:2", "gres:gpu:ta:1,gres:gpu:tb:1", False),  # added type: exact
        ("gres:gpu:ta:1,gres:gpu:tb:1", "gres:gpu:tb:1,gres:gpu:ta:1", False),
        ("gres:gpu:2", "gres:gpu:tb:2", False),  # untyped -> typed: two steps, exact
    ],
)
def test_updates_that_drop_a_gpu_type_are_refused(st, now: str, new: str, refused: bool) -> None:
    state, labels = st
    (update,) = plan_replan(
        [_pending(7, 1, "A")], _cluster(st), labels=labels, policy=state.policy, version="t"
    ).updates
    problem = transition_problem(_with_request(update, now, new).change)
    assert (problem is not None) == refused, problem
    if refused:
        assert "keeps a dropped GPU type" in problem


def test_a_job_slurm_cannot_move_keeps_its_request_and_frees_its_planned_gpus(st) -> None:
    """A typed job whose plan would drop its type is ``kept``; the GPU planned for it goes to
    the next job instead of standing idle in the plan."""
    state, labels = st
    (alone,) = plan_replan(
        [_pending(7, 1, "A")], _cluster(st), labels=labels, policy=state.policy, version="t"
    ).updates
    held = _pending(7, 1, "A", tres="gres:gpu:v100-elsewhere:1", current={"n04": ("x",)})
    result = plan_replan(
        [held, _pending(8, 1, "A")], _cluster(st), labels=labels, policy=state.policy,
        version="t",
    )  # fmt: skip
    assert list(result.kept) == [7] and "v100-elsewhere" in result.kept[7]
    (update,) = result.updates
    assert update.job_id == 8 and update.chosen == alone.chosen
    assert result.summary()["kept"] == {"7": result.kept[7]}


def test_on_2411_a_typed_job_may_drop_its_type(st) -> None:
    """24.11 replaces a pending job's typed request (checked on the testbed), so the job the
    22.05 round keeps is moved there."""
    from slurm_pal.adapters.slurm.release import SlurmRelease

    state, labels = st
    held = _pending(7, 1, "A", tres="gres:gpu:v100-elsewhere:1", current={"n04": ("x",)})
    result = plan_replan(
        [held], _cluster(st), labels=labels, policy=state.policy, version="t",
        release=SlurmRelease(24, 11, 5),
    )  # fmt: skip
    assert result.kept == {} and [u.job_id for u in result.updates] == [7]


def test_the_applier_reports_the_failing_step(st) -> None:
    state, labels = st
    (update,) = plan_replan(
        [_pending(7, 1, "A")], _cluster(st), labels=labels, policy=state.policy, version="t"
    ).updates
    calls: list[Sequence[str]] = []

    class Fake(ScontrolApplier):
        def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
            calls.append(list(args))
            code = 1 if len(calls) == 2 else 0
            return subprocess.CompletedProcess(args, code, "", "Invalid GRES specification")

    error = Fake().apply(update.change)
    assert error is not None and "Invalid GRES" in error and len(calls) == 2


def test_only_jobs_the_scheduler_would_start_are_replanned() -> None:
    from slurm_pal.engine.replan import replannable

    assert replannable("Resources") and replannable("Priority") and replannable("PartitionDown")
    assert replannable("None")  # 24.11 resets the reason to None at every update
    for reason in ("", "JobHeldUser", "JobHeldAdmin", "Dependency", "BeginTime"):
        assert not replannable(reason), reason


def test_changes_slurm_refuses_are_not_sent(st) -> None:
    state, labels = st
    (update,) = plan_replan(
        [_pending(7, 1, "A", tres="gres:gpu:1")], _cluster(st), labels=labels,
        policy=state.policy, version="t",
    ).updates  # fmt: skip
    assert transition_problem(update.change) is None  # untyped -> typed per node: two steps
    fields = dict(update.decision.set_fields)
    fields["tres_per_node"] = "gres:gpu:1"  # as encoding 3 writes it
    decision = type(update.decision)(**{**update.decision.__dict__, "set_fields": fields})
    typed_now = PendingJob(**{**update.pending.__dict__, "tres_per_node": "gres:gpu:v100-x:1"})
    to_untyped = type(update)(**{**update.__dict__, "decision": decision, "pending": typed_now})
    assert "typed GPU request into an untyped" in str(transition_problem(to_untyped.change))
    assert scontrol_steps(to_untyped.change) == []
    assert "untyped" in str(ScontrolApplier().apply(to_untyped.change))  # no scontrol run


def test_a_held_job_gets_its_begin_time_once_then_is_routed_with_the_hold_lifted() -> None:
    from slurm_pal.adapters.slurm.update import start_time_text
    from slurm_pal.engine.replan import held

    now = 1_800_000_000.0
    policy = get_policy("packed-pm", avoid_above=1.5, wait=True, max_wait_s=3600)
    job = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1", "time_limit": 600})
    waiting = PendingJob(7, "t7", job, "A", "test", None, tres_per_node="gres:gpu:1")
    # Only an outlier (n01-1) is free; n02-1's job is planned to end in 5 minutes: the 10-hour
    # job is held to its bound, told to Slurm once as its begin time.
    cluster, labels = site({"n01": [A0, AX], "n02": [A0, A0]}, busy=[("n01", 0), ("n02", 0)])
    cluster.allocate([cluster.uuid_index["GPU-n02-1"]])
    cluster.expect_free_at([cluster.uuid_index["GPU-n02-1"]], now + 300)
    plan = {"labels": labels, "policy": policy, "version": "t", "now": now}
    result = plan_replan([waiting], cluster, **plan)
    assert result.waiting == [7] and not result.not_placed
    (update,) = result.updates
    assert update.decision.action == "wait" and update.decision.wait_until == now + 3600
    comment = update.decision.set_fields["admin_comment"]
    assert scontrol_steps(update.change) == [
        [
            "update",
            "JobId=7",
            f"AdminComment={comment}",
            f"StartTime={start_time_text(now + 3600)}",
        ]
    ]
    since_until = held(parse_admin_comment(str(comment)) or {})
    assert since_until == (now, now + 3600)
    again = PendingJob(**{**waiting.__dict__, "waiting": since_until})
    result = plan_replan([again], cluster, **{**plan, "now": now + 60})
    assert result.waiting == [7] and not result.updates  # the same hold: nothing sent
    # A good GPU frees on n02: the job is routed there, its hold lifted in the same update.
    cluster.release([cluster.uuid_index["GPU-n02-1"]])
    (update,) = plan_replan([again], cluster, **{**plan, "now": now + 300}).updates
    assert update.decision.action == "route" and update.chosen == {"n02": (A0,)}
    *first, last = scontrol_steps(update.change)  # 22.05: untyped -> typed in two updates
    assert last[-1] == "StartTime=now" and "ReqNodeList=n02" in last
    assert not any(a.startswith("StartTime") for step in first for a in step)  # not before
    assert held({"action": "route", "since": "1", "until": "2"}) is None


def test_the_round_goes_past_a_held_job_that_fits_nowhere_as_slurm_does() -> None:
    """A job held to a later begin time is not considered by Slurm, so it ends no round: a
    2-GPU job held while one GPU is free, and a 1-GPU job behind it that fits. Once its bound
    has come it is eligible again, and the round stops at it (PAL: the head is not
    overtaken)."""
    now = 1_800_000_000.0
    policy = get_policy("packed-pm", avoid_above=1.5, wait=True, max_wait_s=3600)
    two = JobDescription.from_wire({"user": "u", "tres_per_job": "gres:gpu:2", "time_limit": 600})
    one = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1"})
    cluster, labels = site({"n01": [A0, AX], "n02": [A0, A0]}, busy=[("n01", 0), ("n02", 0)])
    cluster.allocate([cluster.uuid_index["GPU-n01-1"]])
    plan = {"labels": labels, "policy": policy, "version": "t", "now": now}
    held_job = PendingJob(
        7, "t7", two, "A", "test", None, tres_per_job="gres:gpu:2", waiting=(now, now + 3600)
    )
    behind = PendingJob(8, "t8", one, "A", "test", None, tres_per_node="gres:gpu:1")
    result = plan_replan([held_job, behind], cluster, **plan)
    assert result.not_placed == [7]
    assert [u.job_id for u in result.updates] == [8]
    assert result.updates[0].chosen == {"n02": (A0,)}
    # At its bound it is eligible: a job that fits nowhere ends the round again.
    result = plan_replan([held_job, behind], cluster, **{**plan, "now": now + 3600})
    assert result.not_placed == [7, 8] and not result.updates


def test_an_older_advisors_exclusion_is_lifted_when_its_waiting_job_is_routed() -> None:
    from slurm_pal.engine.replan import kept_off

    policy = get_policy("packed-pm", avoid_above=1.5, wait=True)
    job = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1"})
    old = PendingJob(7, "t7", job, "A", "test", None, tres_per_node="gres:gpu:1", kept_off=("n01",))
    cluster, labels = site({"n01": [A0, AX], "n02": [A0, A0]}, busy=[("n01", 0), ("n02", 0)])
    (update,) = plan_replan([old], cluster, labels=labels, policy=policy, version="t").updates
    assert update.decision.action == "route" and update.chosen == {"n02": (A0,)}
    steps = scontrol_steps(update.change)
    assert steps[0] == ["update", "JobId=7", "ExcNodeList="]
    assert any(a == "ReqNodeList=n02" for a in steps[-1])
    assert kept_off({"action": "wait", "exc": "n[01-02]"}) == ("n01", "n02")
    assert kept_off({"action": "route", "exc": "n01"}) == ()


@settings(max_examples=60, deadline=None)
@given(st_.integers(0, 2**32 - 1))
def test_the_services_round_decides_what_the_simulators_round_decides(seed: int) -> None:
    """The same state (free GPUs, a queue in priority order) through the service's round
    (decide, its encodings and kept/wait rules) and through the core round the simulator runs,
    with the shipped policy (packed-pm, outliers wait) on a cluster with outliers: the same GPUs
    for every job up to the first that gets none, which both then hold back alike."""
    rng = np.random.default_rng(seed)
    kinds = [A0, A1, A2, AX]
    layout = {
        f"n{i:02d}": list(rng.choice(kinds, size=4, p=[0.4, 0.3, 0.2, 0.1])) for i in range(5)
    }
    slots = [(node, i) for node in layout for i in range(4)]
    busy = [slot for slot in slots if rng.random() < 0.45]
    cluster, labels = site(layout, busy=busy)
    now = 1_800_000_000.0
    cluster.clock = now
    for gpu in np.flatnonzero(~cluster.free):  # planned ends: soon, later, never
        cluster.expect_free_at([gpu], now + float(rng.choice([120.0, 5400.0, np.inf])))
    policy = configured_policy("packed-pm", avoid_above=1.5, wait=True, max_wait_s=3600.0)
    pending = []
    limits: dict[int, float] = {}
    for job_id in range(1, 7):
        n = int(rng.choice([1, 1, 2, 3, 4]))
        minutes = int(rng.choice([5, 60, 600]))
        limits[job_id] = minutes * 60.0
        job = JobDescription.from_wire(
            {"user": "u", "tres_per_job": f"gres:gpu:{n}", "time_limit": minutes}
        )
        job_class = str(rng.choice(["A", "B"]))
        pending.append(PendingJob(job_id, f"t{job_id}", job, job_class, "t", None))
    service = plan_replan(pending, cluster, labels=labels, policy=policy, version="t", now=now)
    requests = [
        PlacementRequest(
            str(p.job_id),
            p.job_class,
            int(p.job.tres_per_job[-1]),
            time_limit_s=limits[p.job_id],
        )
        for p in pending
    ]
    steps = queue_round(requests, cluster.copy(), policy.place, start=StopAtMisfit())
    routed = {
        u.job_id: sorted(u.decision.allocation.uuids)
        for u in service.updates
        if u.decision.allocation
    }
    for step in steps:
        job_id = int(step.request.job_id)
        if step.outcome is Outcome.PLACED:
            assert step.result is not None and step.result.allocation is not None
            assert routed.get(job_id) == sorted(step.result.allocation.uuids)
        elif step.outcome is Outcome.WAITS:
            assert job_id in service.waiting
            held = next(u for u in service.updates if u.job_id == job_id)
            assert step.result is not None and held.decision.wait_until == math.ceil(
                step.result.wait_until
            )
        else:
            assert job_id in service.not_placed
    assert set(routed) == {int(s.request.job_id) for s in steps if s.outcome is Outcome.PLACED}


def test_a_routed_job_the_round_would_make_wait_is_kept_as_routed() -> None:
    """A job routed at submit (typed, on its node) whose GPUs were taken before it started:
    the round would have it wait, but an exclusion would contradict its node list (found on
    the testbed: the job was held with BadConstraints), so it is kept."""
    policy = get_policy("packed-pm", avoid_above=1.5, wait=True)
    job = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1"})
    routed = PendingJob(7, "t7", job, "A", "test", {"n02": (A0,)}, tres_per_node=f"gres:gpu:{A0}:1")
    cluster, labels = site({"n01": [A0, AX], "n02": [A0, A0]}, busy=[("n01", 0), ("n02", 0)])
    cluster.allocate([cluster.uuid_index["GPU-n02-1"]])
    result = plan_replan([routed], cluster, labels=labels, policy=policy, version="t")
    assert result.updates == [] and 7 in result.kept and result.waiting == []


def test_a_job_without_a_pin_whose_place_is_packings_own_is_left_to_slurm(tmp_path: Path) -> None:
    env = make_env(tmp_path, policy="packed")
    try:
        state = env.state()
        cluster = state.cluster_snapshot()
        assert cluster is not None
        common = {"labels": env.table, "policy": state.policy, "version": "t"}
        pending = [_pending(1, 2, "D"), _pending(2, 1, "A")]
        left = plan_replan(pending, cluster, leave_packing=True, **common)  # type: ignore[arg-type]
        assert left.updates == [] and sorted(left.unchanged) == [1, 2]
        pinned = plan_replan(pending, cluster, **common)  # type: ignore[arg-type]
        assert sorted(u.job_id for u in pinned.updates) == [1, 2]
        # A job pinned already keeps being re-planned as a route (its pin must follow).
        held = plan_replan(
            [_pending(3, 1, "A", current={"n04": ("v100-x",)})],
            cluster,
            leave_packing=True,
            **common,  # type: ignore[arg-type]
        )
        assert [u.job_id for u in held.updates] == [3]
    finally:
        env.close()


def test_under_backfill_a_job_slurm_would_keep_behind_the_heads_reservation_is_not_routed() -> None:
    """The head (4 GPUs) fits nowhere; Slurm reserves the cluster for it when n01's jobs end by
    their limits (in 10 min). Behind it, a job whose limit (60 min) runs past that would delay
    it, so Slurm does not start it now: the round leaves it; one whose limit (5 min) ends by
    then starts in the hole, and the round routes it."""
    policy = get_policy("packed-pm", avoid_above=1.5)
    now = 10_000.0
    head = JobDescription.from_wire({"user": "u", "tres_per_job": "gres:gpu:4", "time_limit": 60})
    long = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:2", "time_limit": 60})
    short = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:2", "time_limit": 5})
    cluster, labels = site({"n01": [A0, A0], "n02": [A0, A0]}, busy=[("n01", 0), ("n01", 1)])
    cluster.busy_until[[cluster.uuid_index["GPU-n01-0"], cluster.uuid_index["GPU-n01-1"]]] = (
        now + 600.0
    )
    pending = [
        PendingJob(7, "t7", head, "A", "test", None, tres_per_job="gres:gpu:4"),
        PendingJob(8, "t8", long, "A", "test", None, tres_per_node="gres:gpu:2"),
        PendingJob(9, "t9", short, "A", "test", None, tres_per_node="gres:gpu:2"),
    ]
    plan = {"labels": labels, "policy": policy, "version": "t", "now": now}
    result = plan_replan(pending, cluster, backfill=True, **plan)
    assert [u.job_id for u in result.updates] == [9]
    assert 7 in result.not_placed and 8 not in result.in_place


def test_under_backfill_the_round_goes_past_a_job_that_fits_nowhere_yet() -> None:
    """A 2-GPU job that fits nowhere heads the queue; behind it a 1-GPU job routed at its
    submit to a GPU that has since been taken. Under strict FIFO nothing behind the head starts,
    so the round stops there; under backfill Slurm would start the job behind it in a hole, so
    the round routes it to the GPU that is free now instead of leaving it pinned to a busy one."""
    policy = get_policy("packed-pm", avoid_above=1.5)
    two = JobDescription.from_wire({"user": "u", "tres_per_job": "gres:gpu:2"})
    one = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1"})
    cluster, labels = site({"n01": [A0, A0], "n02": [A0, A0]}, busy=[("n01", 0), ("n02", 0)])
    cluster.allocate([cluster.uuid_index["GPU-n01-1"]])
    head = PendingJob(7, "t7", two, "A", "test", None, tres_per_job="gres:gpu:2")
    pinned = PendingJob(8, "t8", one, "A", "test", {"n01": (A0,)}, tres_per_node=f"gres:gpu:{A0}:1")
    plan = {"labels": labels, "policy": policy, "version": "t"}
    fifo = plan_replan([head, pinned], cluster, **plan)
    assert fifo.not_placed == [7, 8] and not fifo.updates
    backfill = plan_replan([head, pinned], cluster, backfill=True, **plan)
    assert backfill.not_placed == [7]
    assert [(u.job_id, u.chosen) for u in backfill.updates] == [(8, {"n02": (A0,)})]


@pytest.mark.parametrize(("version", "backfills"), [("22.05.8", True), ("24.11.5", False)])
def test_under_backfill_the_round_plans_a_job_past_its_limit_as_the_running_release_does(
    version: str, backfills: bool
) -> None:
    """Where Slurm lets jobs run past their limits (``overtime_unlimited``), 22.05's backfill
    expects one that has to run a whole limit more and starts a short job beside it; 24.11's
    counts it gone, plans the head now and starts nothing beside it. The round predicts what
    the release it writes to does (tests/slurm/test_overtime_backfill.py measures both)."""
    policy = get_policy("packed-pm", avoid_above=1.5)
    now = 10_000.0
    head = JobDescription.from_wire({"user": "u", "tres_per_job": "gres:gpu:4", "time_limit": 10})
    short = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1", "time_limit": 5})
    busy = [("n01", 0), ("n01", 1), ("n01", 2)]
    cluster, labels = site({"n01": [A0, A0, A0, A0]}, busy=busy)
    overrun = [cluster.uuid_index[f"GPU-n01-{i}"] for i in range(3)]
    cluster.expect_free_at(overrun, now - 60.0, since=now - 660.0)  # 10-min limit, 1 min past
    pending = [
        PendingJob(7, "t7", head, "A", "test", None, tres_per_job="gres:gpu:4"),
        PendingJob(8, "t8", short, "A", "test", None, tres_per_node="gres:gpu:1"),
    ]
    plan = {"labels": labels, "policy": policy, "version": "t", "now": now}
    result = plan_replan(
        pending,
        cluster,
        backfill=True,
        overtime_unlimited=True,
        release=parse_release(f"slurm {version}"),
        **plan,  # type: ignore[arg-type]
    )
    assert 7 in result.not_placed
    assert ([u.job_id for u in result.updates] == [8]) is backfills


@pytest.mark.parametrize(("reserves", "node"), [("head", "n01"), ("nodes", "n02")])
def test_under_backfill_the_round_expects_the_reservations_the_site_says_slurm_makes(
    reserves: str, node: str
) -> None:
    """n01 (four GPUs) has three held until their limit 10 min from now, n02 (two) one for
    hours; the first waiting job (2 GPUs on a node) fits only n01, then. Slurm (``nodes``)
    reserves n01 for it and would start a 1-GPU job with a 60-minute limit on n02's free GPU,
    never on n01's: the round routes it to n02. EASY (``head``) counts GPUs, not nodes: one
    is left over beside the reservation, so the round routes the job to packing's pick, n01,
    where Slurm would keep it waiting behind the first job."""
    policy = get_policy("packed-pm", avoid_above=1.5)
    now = 10_000.0
    first = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:2", "time_limit": 10})
    long = JobDescription.from_wire({"user": "u", "tres_per_node": "gres:gpu:1", "time_limit": 60})
    busy = [("n01", 0), ("n01", 1), ("n01", 2), ("n02", 0)]
    cluster, labels = site({"n01": [A0] * 4, "n02": [A0] * 2}, busy=busy)
    soon = [cluster.uuid_index[f"GPU-n01-{i}"] for i in range(3)]
    cluster.expect_free_at(soon, now + 600.0, since=now - 600.0)
    cluster.expect_free_at([cluster.uuid_index["GPU-n02-0"]], now + 20_000.0, since=now)
    pending = [
        PendingJob(7, "t7", first, "A", "test", None, tres_per_node="gres:gpu:2"),
        PendingJob(9, "t9", long, "A", "test", None, tres_per_node="gres:gpu:1"),
    ]
    plan = {"labels": labels, "policy": policy, "version": "t", "now": now}
    result = plan_replan(
        pending,
        cluster,
        backfill=True,
        backfill_reserves=reserves,
        **plan,  # type: ignore[arg-type]
    )
    assert 7 in result.not_placed
    assert [(u.job_id, *u.chosen) for u in result.updates] == [(9, node)]
