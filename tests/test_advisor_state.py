"""The advisor's cluster view: store + labels.json + what Slurm says, and its reservations.

Slurm is fed through ``CliStateReader`` with sinfo/squeue JSON made from the samples captured on
the real 22.05 testbed (tests/fixtures/slurm), rewritten to this test's nodes and jobs.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import AdvisorConfig, HooksConfig, SiteConfig
from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.decide import LabelTable, parse_admin_comment
from slurm_pal.advisor.jobdesc import JobDescription
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.site.render import plan_from_store

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
NODE_TEMPLATE = json.loads((FIXTURES / "sinfo.json").read_text())
JOB_TEMPLATE = json.loads((FIXTURES / "squeue.json").read_text())
# n01's GPUs alternate between two labels, so Slurm's numbering (grouped by type) differs from
# the device numbering: device 1 is Slurm's 2, device 2 is Slurm's 1.
N01 = [("X", 0), ("Y", 2), ("X", 1), ("Y", 3)]


@dataclass
class FakeJob:
    job_id: int
    state: str = "PENDING"
    admin_comment: str = ""
    gpus: dict[str, list[int]] = field(default_factory=dict)  # node -> Slurm indices
    priority: int = 100
    reason: str = "Resources"
    tres_per_node: str = "gres:gpu:1"


class FakeSlurm:
    """sinfo/squeue/scontrol answers for CliStateReader, from the captured 22.05 samples."""

    def __init__(self, labels: dict) -> None:
        self.labels = labels
        self.jobs: list[FakeJob] = []
        self.states: dict[str, str] = {}
        self.gres_override: dict[str, str] = {}
        self.calls: list[list[str]] = []
        self.fail = False

    def used(self, node: str) -> dict[int, bool]:
        out: dict[int, bool] = {}
        for job in self.jobs:
            if job.state == "RUNNING":
                for i in job.gpus.get(node, []):
                    out[i] = True
        return out

    def sinfo(self) -> str:
        data = copy.deepcopy(NODE_TEMPLATE)
        template = data["nodes"][0]
        nodes = []
        for name, gpus in self.labels["nodes"].items():
            node = dict(template)
            by_label: dict[str, list[int]] = {}
            for g in sorted(gpus, key=lambda g: g["slurm_index"]):
                by_label.setdefault(g["label"], []).append(g["slurm_index"])
            used = self.used(name)
            node["name"] = name
            node["gres"] = self.gres_override.get(
                name, ",".join(f"gpu:{lab}:{len(ix)}" for lab, ix in by_label.items())
            )
            parts = []
            for lab, ix in by_label.items():
                busy = [i for i in ix if used.get(i)]
                idx = ",".join(map(str, busy)) if busy else "N/A"
                parts.append(f"gpu:{lab}:{len(busy)}(IDX:{idx})")
            node["gres_used"] = ",".join(parts)
            node["state"] = self.states.get(name, "mixed" if used else "idle")
            node["state_flags"] = ["DRAIN"] if self.states.get(name) == "drain" else []
            if self.states.get(name) == "drain":
                node["state"] = "idle"
            node["features"] = node["active_features"] = ""
            node["partitions"] = ["debug"]
            nodes.append(node)
        data["nodes"] = nodes
        return json.dumps(data)

    def squeue(self) -> str:
        data = copy.deepcopy(JOB_TEMPLATE)
        template = data["jobs"][0]
        jobs = []
        for j in self.jobs:
            job = dict(template)
            job.update(
                job_id=j.job_id,
                job_state=j.state,
                admin_comment=j.admin_comment,
                priority=j.priority,
                state_reason=j.reason if j.state == "PENDING" else "None",
                nodes=",".join(j.gpus) if j.state == "RUNNING" else "",
                gres_detail=[
                    ",".join(f"gpu:{i}" for i in [0]) + f"(IDX:{','.join(map(str, ix))})"
                    for ix in j.gpus.values()
                ]
                if j.state == "RUNNING"
                else [],
                tres_per_node=j.tres_per_node,
                tres_per_job="",
                required_nodes="",
                user_name="alice",
            )
            jobs.append(job)
        data["jobs"] = jobs
        return json.dumps(data)

    def __call__(self, args: Sequence[str]) -> str:
        self.calls.append(list(args))
        if self.fail:
            from slurm_pal.adapters.slurm.state import SlurmTimeoutError

            raise SlurmTimeoutError("slurmctld does not answer")
        if list(args) == ["scontrol", "--version"]:
            return "slurm 22.05.8\n"  # the release the samples were captured on
        if args[:2] == ["sinfo", "--json"]:
            return self.sinfo()
        if args[:2] == ["squeue", "--json"]:
            return self.squeue()
        if args[:3] == ["scontrol", "show", "partition"]:
            return "PartitionName=debug AllowGroups=ALL Default=YES Nodes=n[01-04] State=UP\n"
        raise AssertionError(f"unexpected Slurm call {args}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    root: Path
    db: Path
    labels_path: Path
    labels: dict
    table: LabelTable
    slurm: FakeSlurm
    config: SiteConfig
    clock: Clock
    made: list[AdvisorState] = field(default_factory=list)

    def state(self, **kwargs: object) -> AdvisorState:
        reader = CliStateReader({}, runner=self.slurm)
        st = AdvisorState(
            self.config,
            self.db,
            reader,
            labels_file=str(self.labels_path),
            clock=self.clock,
            **kwargs,  # type: ignore[arg-type]
        )
        self.made.append(st)
        st.reload()
        st.refresh()
        return st

    def close(self) -> None:
        for st in self.made:
            st.writer.close()


def make_env(root: Path, *, policy: str = "pal", ttl: float = 60.0) -> Env:
    csv = root / "example.csv"
    generate_example_campaign(
        nodes=4, gpus_per_node=4, node_prefix="n", slow_bin_fraction=0.5
    ).to_csv(csv, index=False)
    config = SiteConfig()
    db = root / "store.db"
    with Store(db) as store:
        store.ingest(
            [read_campaign_csv(csv, gpu_model="v100")],
            campaign_id="example",
            class_order=config.classes.names,
            binner=config.binning.binner(),
        )
        store.set_application_class("resnet", "A")
        store.set_application_class("pagerank", "D")
        labels = plan_from_store(store).to_dict()
    n01 = sorted(labels["nodes"]["n01"], key=lambda g: g["index"])
    for g, (label, slurm_index) in zip(n01, N01, strict=True):
        g["label"], g["slurm_index"] = f"v100-{label}", slurm_index
    labels["nodes"]["n01"] = n01
    path = root / "labels.json"
    path.write_text(json.dumps(labels))
    config = replace(
        config,
        advisor=replace(
            AdvisorConfig(),
            socket=str(root / "adv.sock"),
            policy=policy,
            reservation_ttl_s=ttl,
            allowed_users=("root",),
            socket_group="nonexistent-group-xyz",
        ),
        hooks=replace(HooksConfig(), spool_dir=str(root / "spool")),
    )
    return Env(
        root,
        db,
        path,
        labels,
        LabelTable.from_labels_json(labels),
        FakeSlurm(labels),
        config,
        Clock(),
    )


@pytest.fixture
def env() -> Iterator[Env]:
    # Unix socket paths are short (108 bytes): not under pytest's long tmp paths.
    root = Path(tempfile.mkdtemp(prefix="spal-adv-", dir="/tmp"))
    root.chmod(0o755)
    the_env = make_env(root)
    yield the_env
    the_env.close()
    shutil.rmtree(root, ignore_errors=True)


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
