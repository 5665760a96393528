"""The advisor's cluster view: store + labels.json + what Slurm says, and its reservations.

Slurm is fed through ``CliStateReader`` with sinfo/squeue JSON made from the samples captured on
the real 22.05 testbed (tests/fixtures/slurm), rewritten to this test's nodes and jobs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.engine.jobdesc import JobDescription
from tests.helpers.advisor import (
    Env,
    FakeJob,
    FakeSlurm,
    make_env,
    short_env,
)


@pytest.fixture
def env() -> Iterator[Env]:
    with short_env("spal-adv-") as the_env:
        yield the_env


def job(n: int = 1, app: str = "resnet", **extra: object) -> JobDescription:
    wire = {"user": "alice", "uid": 1000, "name": "train", "tres_per_node": f"gres:gpu:{n}"}
    wire["comment"] = f"pal:app={app}"
    wire.update(extra)
    return JobDescription.from_wire(wire)


def _free_uuids(st: AdvisorState) -> set[str]:
    cluster = st.cluster_snapshot()
    assert cluster is not None
    return {u for u, free in zip(cluster.uuids, cluster.free.tolist(), strict=True) if free}


# ---------------------------------------------------------------------------------------------


def test_refresh_maps_slurm_indices_through_labels(env: Env) -> None:
    # Slurm index 1 on n01 is device 2 (label X), not device 1.
    env.slurm.jobs.append(FakeJob(7, "RUNNING", gpus={"n01": [1]}))
    st = env.state()
    busy = {u for u in st.view.static.cluster.uuids} - _free_uuids(st)  # type: ignore[union-attr]
    assert busy == {env.table.uuid("n01", 2)}
    assert st.health()["free"] == 15 and st.health()["gpus"] == 16
    assert st.view.default_partition == "debug"  # type: ignore[union-attr]
    assert st.view.partition_nodes == {"debug": ("n01", "n02", "n03", "n04")}  # type: ignore[union-attr]
    env.slurm.jobs.clear()
    st.refresh()
    assert len(_free_uuids(st)) == 16


def test_down_drained_and_mismatched_nodes_are_not_routed_to(env: Env) -> None:
    env.slurm.states = {"n02": "down", "n03": "drain"}
    env.slurm.gres_override = {"n04": "gpu:v100-other:4"}
    st = env.state()
    excluded = st.health()["excluded_nodes"]
    assert set(excluded) == {"n02", "n03", "n04"}  # type: ignore[arg-type]
    assert "labels" in excluded["n04"]  # type: ignore[index]
    free = _free_uuids(st)
    assert free == {env.table.uuid("n01", i) for i in range(4)}
    decision = st.decide(job(2), {})
    assert decision.action == "route"
    assert set(decision.allocation.nodes) == {"n01"}  # type: ignore[union-attr]


def test_reservations_keep_back_to_back_decisions_apart(env: Env) -> None:
    st = env.state()
    first = st.decide(job(1), {})
    second = st.decide(job(1), {})
    assert first.action == second.action == "route"
    assert set(first.allocation.uuids).isdisjoint(second.allocation.uuids)  # type: ignore[union-attr]
    assert st.health()["reservations"] == 2
    # a refresh (Slurm has not seen the jobs yet) keeps them
    st.refresh()
    assert len(_free_uuids(st)) == 14


def test_reservations_expire_after_the_ttl(env: Env) -> None:
    st = env.state()
    d = st.decide(job(4), {})
    assert d.action == "route" and len(_free_uuids(st)) == 12
    env.clock.now += env.config.advisor.reservation_ttl_s - 1
    assert st.expire() == 0
    env.clock.now += 2
    assert st.expire() == 1
    assert len(_free_uuids(st)) == 16 and st.health()["reservations"] == 0


def test_reservation_binds_to_its_job_and_ends_when_it_runs(env: Env) -> None:
    st = env.state()
    d = st.decide(job(1), {"name": "train"})
    comment = d.set_fields["admin_comment"]
    assert parse_admin_comment(str(comment))["r"] == d.token  # type: ignore[index]
    env.slurm.jobs.append(FakeJob(42, "PENDING", admin_comment=str(comment)))
    st.refresh()
    assert st.reservations()[d.token].job_id == 42  # type: ignore[index]
    st.writer.call(lambda s: None)  # the binding was written before this
    with Store(env.db) as store:
        row = store.decision_for_job(42)
    assert row is not None and row["token"] == d.token and row["state"] == "bound"
    # running: Slurm's own state counts its GPUs from now on
    node, index = d.allocation.nodes[0], d.allocation.local_indices[0]  # type: ignore[union-attr]
    env.slurm.jobs[0] = FakeJob(
        42,
        "RUNNING",
        admin_comment=str(comment),
        gpus={node: [env.table.slurm_index(node, index)]},
    )
    st.refresh()
    assert st.reservations() == {}
    assert d.allocation.uuids[0] not in _free_uuids(st)  # type: ignore[union-attr]
    # a job that runs before any refresh saw it pending is bound all the same
    quick = st.decide(job(1), {"name": "quick"})
    node, index = quick.allocation.nodes[0], quick.allocation.local_indices[0]  # type: ignore[union-attr]
    env.slurm.jobs.append(
        FakeJob(
            43,
            "RUNNING",
            admin_comment=str(quick.set_fields["admin_comment"]),
            gpus={node: [env.table.slurm_index(node, index)]},
        )
    )
    st.refresh()
    st.writer.call(lambda s: None)
    with Store(env.db) as store:
        row = store.decision_for_job(43)
    assert row is not None and row["token"] == quick.token and st.reservations() == {}


def test_no_fit_pass_carries_a_token_for_the_replanner(env: Env) -> None:
    st = env.state()
    for _ in range(4):
        assert st.decide(job(4), {}).action == "route"
    waiting = st.decide(job(1), {"n": 1})
    assert waiting.action == "pass" and waiting.reason.startswith("no free GPUs fit now")
    parsed = parse_admin_comment(str(waiting.set_fields["admin_comment"]))
    assert parsed is not None and parsed["action"] == "pass" and parsed["r"] == waiting.token
    st.writer.call(lambda s: None)
    with Store(env.db) as store:
        row = store.decision(waiting.token)  # type: ignore[arg-type]
    assert row is not None and row["state"] == "waiting" and row["job"]["name"] == "train"


def test_no_campaign_passes_everything(tmp_path: Path) -> None:
    Store(tmp_path / "empty.db").close()
    st = AdvisorState(
        SiteConfig(), tmp_path / "empty.db", CliStateReader({}, runner=FakeSlurm({"nodes": {}}))
    )
    st.reload()
    d = st.decide(job(1), {})
    assert d.action == "pass" and "no active campaign" in d.reason
    assert st.health()["problem"] == "no active campaign"
    st.writer.close()


def test_a_failed_slurm_read_keeps_the_old_view(env: Env) -> None:
    st = env.state()
    before = st.view
    env.slurm.fail = True
    with pytest.raises(Exception, match="does not answer"):
        st.refresh()
    assert st.view is before


def test_a_reservation_no_job_carries_is_dropped_at_the_next_refresh(env: Env) -> None:
    """An answer nobody received (the plugin timed out: the advisor was paused) leaves a
    reservation under a token no job carries; the first Slurm read that starts well after it
    was made drops it, instead of the GPUs looking taken for the whole TTL."""
    st = env.state()
    lost = st.decide(job(4), {})
    kept = st.decide(job(4), {})
    assert lost.action == kept.action == "route" and len(_free_uuids(st)) == 8
    env.slurm.jobs.append(
        FakeJob(7, "PENDING", admin_comment=str(kept.set_fields["admin_comment"]))
    )
    env.clock.now += 1.0  # within the plugin's timeout + 1 s: the job may not show yet
    st.refresh()
    assert st.health()["reservations"] == 2
    env.clock.now += 1.0
    st.refresh()
    assert set(st.reservations()) == {kept.token}
    assert len(_free_uuids(st)) == 12


def test_a_job_naming_a_pm_label_is_translated_allowed_or_denied_by_site_policy(env: Env) -> None:
    """A user who learns the labels could pick the fastest bin; the site decides."""
    label = sorted(env.table.labels)[0]
    named = job(1, tres_per_node=f"gres:gpu:{label}:1")
    st = env.state()
    translated = st.decide(named, {})  # default: translate, then place like a model request
    assert translated.action == "route", translated.reason
    assert "pinned" not in translated.reason
    st.writer.call(lambda s: None)
    with Store(env.db) as store:
        row = store.decision(str(translated.token))
    assert row is not None and row["job"]["tres_per_node"] == "gres:gpu:v100:1"
    allow = env.state()
    allow.set_config(
        replace(env.config, advisor=replace(env.config.advisor, label_requests="allow"))
    )
    allow.reload()
    allow.refresh()
    kept = allow.decide(named, {})
    assert kept.action == "pass" and "pinned by the user" in kept.reason
    deny = env.state()
    deny.set_config(replace(env.config, advisor=replace(env.config.advisor, label_requests="deny")))
    deny.reload()
    deny.refresh()
    refused = deny.decide(named, {})
    assert refused.action == "deny" and "ask for the GPU model instead (gres:gpu:v100:1)" in (
        refused.reason
    )
    assert deny.decide(job(1), {}).action == "route"  # a model or untyped request is fine
    root = JobDescription.from_wire({**named.to_wire(), "user": "root", "uid": 0})
    assert deny.decide(root, {}).action == "pass"  # the advisor's own users may pin


def test_steered_pinning_leaves_packings_own_picks_to_slurm_but_still_reserves_them(
    tmp_path: Path,
) -> None:
    """With ``pin = "steered"`` a job the policy places as packing would goes through
    untouched (no GRES type, no node list), with its token in the admin comment so the
    re-planner and the Epilog still know it; the GPUs Slurm will likely give it are reserved,
    so the next decision before Slurm's next read does not count them free."""
    the_env = make_env(tmp_path, policy="packed")
    try:
        st = the_env.state()
        first, second = st.decide(job(2), {}), st.decide(job(2), {})
        for d in (first, second):
            assert d.action == "pass" and d.left_to_slurm and d.allocation is not None
            assert "tres_per_node" not in d.set_fields and "req_nodes" not in d.set_fields
            comment = parse_admin_comment(str(d.set_fields["admin_comment"]))
            assert comment is not None and comment["action"] == "pass"
            assert comment["r"] == d.token
        assert set(first.allocation.uuids).isdisjoint(second.allocation.uuids)  # type: ignore[union-attr]
        assert st.health()["reservations"] == 2
        pinned = the_env.state()
        pinned.config = replace(
            pinned.config, advisor=replace(pinned.config.advisor, pin="every-job")
        )
        assert pinned.decide(job(2), {}).action == "route"
    finally:
        the_env.close()


def test_packings_own_pick_is_the_gpu_slurm_gives_in_its_numbering(tmp_path: Path) -> None:
    """cons_tres gives a job a node's lowest free Slurm indices, and Slurm numbers a node's
    GPUs grouped by type (gres.conf), not in the campaign's order: on n01 device 2 is Slurm's
    1. A job left to Slurm is expected, and its GPUs reserved, where Slurm puts it."""
    the_env = make_env(tmp_path, policy="packed")
    try:
        the_env.slurm.states = {n: "down" for n in the_env.labels["nodes"] if n != "n01"}
        st = the_env.state()
        labels = the_env.table
        assert labels.slurm_index("n01", 2) == 1 and labels.slurm_index("n01", 1) == 2
        expected = []
        for _ in range(3):
            d = st.decide(job(1), {})
            assert d.left_to_slurm and d.allocation is not None
            (node,), (index,) = d.allocation.node_names, d.allocation.local_indices
            expected.append((node, labels.slurm_index(node, index)))
        assert expected == [("n01", 0), ("n01", 1), ("n01", 2)]
    finally:
        the_env.close()


def test_each_read_works_out_the_steered_queue_in_priority_order_with_requests(env: Env) -> None:
    """A job-end round (an Epilog waits for it) plans from the queue the last read worked
    out: the steered pending jobs Slurm would start, highest priority first, each with its
    placement request, read once per job across reads."""
    st = env.state()
    for _ in range(4):
        assert st.decide(job(4), {}).action == "route"  # every GPU reserved: the rest wait
    tokens = {}
    for job_id, priority in ((51, 10), (52, 30), (53, 20), (54, 40), (55, 50)):
        d = st.decide(job(1), {"n": job_id})
        assert d.token is not None
        tokens[job_id] = d.token
        reason = "JobHeld" if job_id == 54 else "Priority"
        comment = str(d.set_fields["admin_comment"])
        env.slurm.jobs.append(
            FakeJob(job_id, admin_comment=comment, priority=priority, reason=reason)
        )
    env.slurm.jobs.append(FakeJob(56, priority=99))  # not steered: no token
    env.slurm.jobs.append(
        FakeJob(57, admin_comment="slurm-pal/0.1.0 route r=ffffffffffff", priority=98)
    )
    view = st.refresh()
    assert view is not None
    # 54 is held (the scheduler would not start it); 56 carries no token; 57's token is no
    # decision of this advisor's
    assert [p.job_id for p in view.pending] == [55, 52, 53, 51]
    assert [p.token for p in view.pending] == [tokens[j] for j in (55, 52, 53, 51)]
    assert {key[1] for key in view.requests} == {55, 52, 53, 51}
    assert all(request is not None and request.gpus == 1 for request in view.requests.values())
    # the next read reuses each job's request (the same object, not worked out again)
    again = st.refresh()
    assert again is not None
    assert all(again.requests[key] is view.requests[key] for key in view.requests)
    # a job that left the queue leaves the requests with it
    env.slurm.jobs = [j for j in env.slurm.jobs if j.job_id != 52]
    third = st.refresh()
    assert third is not None and {key[1] for key in third.requests} == {55, 53, 51}


def test_a_token_is_bound_by_one_queued_write_however_many_reads_see_it_first(env: Env) -> None:
    """Binding a job to its decision is a store write; reads that come while it is still
    queued (10,000 jobs after a burst of submits) must not queue it again each time."""
    st = env.state()
    d = st.decide(job(1), {"name": "train"})
    env.slurm.jobs.append(FakeJob(42, admin_comment=str(d.set_fields["admin_comment"])))
    queued: list[object] = []
    submit = st.writer.submit

    def counting(fn, **kwargs):  # type: ignore[no-untyped-def]
        queued.append(fn)
        return submit(fn, **kwargs)

    gate = threading.Event()
    st.writer.submit(lambda s: gate.wait(10))  # the writer is busy: binds stay queued
    st.writer.submit = counting  # type: ignore[method-assign]
    for _ in range(3):
        st.refresh()
    gate.set()
    st.writer.submit = submit  # type: ignore[method-assign]
    assert len(queued) == 1
    st.writer.call(lambda s: None)
    with Store(env.db) as store:
        row = store.decision_for_job(42)
    assert row is not None and row["token"] == d.token
