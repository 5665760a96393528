"""The advisor service against a real Slurm 22.05 (own testbed, no job_submit.lua): its refresh
sees the GPUs running jobs hold, and a re-planning round moves a pending job to the GPUs the
placement core picks once GPUs free up (through ``scontrol update``)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime

import pytest

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import AdvisorConfig, HooksConfig, SiteConfig
from slurm_pal.adapters.slurm.parse import parse_key_values
from slurm_pal.adapters.slurm.state import CliStateReader, JobState
from slurm_pal.adapters.slurm.update import ScontrolApplier
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.client import AdvisorClient
from slurm_pal.advisor.server import AdvisorServer
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.site.render import plan_from_store
from slurm_pal.testbed import LocalSlurm, NodeSpec
from tests.slurm.conftest import require_slurm, stored_tres
from tests.slurm.conftest import testbed_dir as fresh_root

pytestmark = pytest.mark.slurm

SLEEP = "--wrap=sleep 300"


@dataclass
class Service:
    tb: LocalSlurm
    server: AdvisorServer
    client: AdvisorClient
    labels: dict
    specs: list[GpuSpec]

    def slurm_to_uuid(self, node: str, slurm_index: int) -> str:
        (g,) = [g for g in self.labels["nodes"][node] if g["slurm_index"] == slurm_index]
        return str(g["uuid"])

    def jobs(self) -> dict[int, JobState]:
        return {j.job_id: j for j in CliStateReader(self.tb.env).jobs()}

    def wait(self, job_id: int, state: str) -> JobState:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = self.jobs().get(job_id)
            if job is not None and job.state == state:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not {state}: {self.jobs().get(job_id)}")

    def busy_uuids(self) -> set[str]:
        return {
            self.slurm_to_uuid(node, i)
            for j in self.jobs().values()
            if j.state == "RUNNING"
            for node, indices in j.allocated_gpu_indices().items()
            for i in indices
        }

    def cancel_all(self) -> None:
        self.tb.run(["scancel", "--full", "-u", "root"], check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = [j for j in self.jobs().values() if j.state in ("PENDING", "RUNNING")]
            if not live and set(self.tb.node_states().values()) == {"idle"}:
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs still alive: {self.tb.node_states()}")


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    require_slurm()
    root = fresh_root()
    csv = root / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
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
        labels = plan_from_store(store, device_pattern="/dev/tty{index}").to_dict()
        scores = store.gpu_scores("example")
    labels_path = root / "labels.json"
    labels_path.write_text(json.dumps(labels))
    nodes = [
        NodeSpec(node, tuple(g["label"] for g in sorted(gpus, key=lambda g: g["index"])))
        for node, gpus in labels["nodes"].items()
    ]
    per_uuid: dict[str, dict[str, float]] = {}
    for row in scores.itertuples(index=False):
        per_uuid.setdefault(row.uuid, {})[row.job_class] = float(row.pm_score)
    specs = [
        GpuSpec(g["uuid"], n, g["index"], "v100", per_uuid[g["uuid"]])
        for n, gpus in labels["nodes"].items()
        for g in gpus
    ]
    config = replace(
        config,
        advisor=replace(AdvisorConfig(), labels_file=str(labels_path), allowed_users=("root",)),
        hooks=replace(HooksConfig(), spool_dir=str(root / "spool")),
    )
    tb = LocalSlurm(root, nodes, job_submit_lua=None)
    server: AdvisorServer | None = None
    try:
        tb.start()
        state = AdvisorState(config, db, CliStateReader(tb.env))
        server = AdvisorServer(
            state,
            root / "adv.sock",
            refresh_s=3600,
            replan_s=0,
            applier=ScontrolApplier(tb.env),
        )
        server.start()
        yield Service(tb, server, AdvisorClient(str(root / "adv.sock")), labels, specs)
    finally:
        if server is not None:
            server.stop()
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def svc(service: Service) -> Iterator[Service]:
    service.cancel_all()
    try:
        yield service
    finally:
        service.cancel_all()


def test_refresh_sees_the_gpus_a_running_job_holds(svc: Service) -> None:
    label = svc.labels["nodes"]["n04"][-1]["label"]  # a typed request, as a routed job makes
    job_id = svc.tb.submit(f"--gres=gpu:{label}:1", "-w", "n04", SLEEP)
    job = svc.wait(job_id, "RUNNING")
    ((node, (slurm_index,)),) = job.allocated_gpu_indices().items()
    held = svc.slurm_to_uuid(node, slurm_index)
    svc.server.state.refresh()
    cluster = svc.server.state.cluster_snapshot()
    assert cluster is not None
    busy = {u for u, free in zip(cluster.uuids, cluster.free.tolist(), strict=True) if not free}
    assert busy == {held}
    health = svc.client.request({"op": "health"})
    assert health["free"] == 15 and health["gpus"] == 16 and health["excluded_nodes"] == {}


def test_a_job_passed_for_lack_of_gpus_gets_the_pal_choice_when_gpus_free_up(
    svc: Service,
) -> None:
    tb = svc.tb
    fillers = {
        node: tb.submit("--gres=gpu:4", "-N1", "-w", node, SLEEP) for node in svc.labels["nodes"]
    }
    for job_id in fillers.values():
        svc.wait(job_id, "RUNNING")
    svc.server.state.refresh()
    wire = {"user": "root", "uid": 0, "name": "train", "comment": "pal:app=resnet"}
    wire["tres_per_node"] = "gres:gpu:1"
    answer = svc.client.request({"op": "decide", "job": wire})
    assert answer["action"] == "pass" and answer["reason"].startswith("no free GPUs fit now")
    comment = answer["set"]["admin_comment"]
    assert parse_admin_comment(comment)["r"] == answer["token"]  # type: ignore[index]
    # what job_submit.lua would have made of it: the job as written plus the comment
    job_id = tb.submit("--gres=gpu:1", "--comment=pal:app=resnet", "-J", "train", SLEEP)
    tb.run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"])
    assert svc.wait(job_id, "PENDING").admin_comment == comment
    # keep Slurm from starting it on its own while GPUs free up, then free two nodes
    tb.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"])
    try:
        for node in ("n01", "n04"):
            tb.run(["scancel", str(fillers[node])])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = tb.node_states()
            if states["n01"] == states["n04"] == "idle":
                break
            time.sleep(0.2)
        busy = svc.busy_uuids()
        assert len(busy) == 8
        summary = svc.client.request({"op": "replan"}, timeout_s=60)
        assert summary["ok"] and summary["applied"] == [job_id], (summary, svc.jobs()[job_id])
    finally:
        tb.run(["scontrol", "update", "PartitionName=debug", "State=UP"])
    core = svc.server.state.policy.place(  # the configured policy, as the service runs it
        PlacementRequest(str(job_id), "A", 1),
        Cluster.from_gpus(svc.specs, Topology.flat(across_nodes=1.7), busy=busy),
    )
    assert core.allocation is not None
    (node,), (index,) = core.allocation.nodes, core.allocation.local_indices
    (label,) = [g["label"] for g in svc.labels["nodes"][node] if g["index"] == index]
    fields = parse_key_values(tb.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout.strip())
    assert fields["ReqNodeList"] == node
    assert fields["TresPerNode"] == stored_tres(tb, f"gres:gpu:{label}:1")
    job = svc.wait(job_id, "RUNNING")
    ((got_node, (got,)),) = job.allocated_gpu_indices().items()
    assert got_node == node
    got_label = next(g["label"] for g in svc.labels["nodes"][node] if g["slurm_index"] == got)
    assert got_label == label
    parsed = parse_admin_comment(job.admin_comment)
    assert parsed is not None and parsed["action"] == "route" and parsed["r"] == answer["token"]
    stats = svc.client.request({"op": "stats"})
    assert stats["replans"] >= 1 and stats["replan_updates"] >= 1
    # a second round leaves the running job alone
    again = svc.client.request({"op": "replan"}, timeout_s=60)
    assert again["considered"] == 0 and again["applied"] == []


def test_a_job_that_fits_only_on_outliers_is_held_and_routed_when_gpus_free(
    svc: Service,
) -> None:
    """The shipped policy (packed-pm, outliers = "wait") on a real Slurm 22.05: with only the
    example campaign's two outlier GPUs free (n01 at 2.3x and n04 at 1.9x class A's median)
    and the other GPUs' jobs planned to end within 5 minutes, an hour-long class-A job keeps
    its request with its bound as its begin time, so Slurm starts it nowhere; when a GPU frees
    up, the re-planning round routes it there with ``StartTime=now`` in the same update (after
    the untyped -> typed step 22.05 needs), and it runs there."""
    # The fillers take every GPU but the outliers, one job per GPU, so one can be freed alone.
    tb = svc.tb
    good = "v100-a0b0c0d0"
    fillers = {
        (node, g["slurm_index"]): tb.submit(
            f"--gres=gpu:{good}:1", "-N1", "-w", node, "-t", "5", SLEEP
        )
        for node, gpus in svc.labels["nodes"].items()
        for g in gpus
        if g["label"] == good
    }
    for job_id in fillers.values():
        svc.wait(job_id, "RUNNING")
    svc.server.state.refresh()
    wire = {"user": "root", "uid": 0, "name": "train", "comment": "pal:app=resnet"}
    wire["tres_per_node"] = "gres:gpu:1"
    wire["time_limit"] = 60
    answer = svc.client.request({"op": "decide", "job": wire})
    assert answer["action"] == "wait", answer
    assert "exc_nodes" not in answer["set"]
    begin = answer["set"]["begin_time"]
    bound = AdvisorConfig().max_wait_s  # the service runs the shipped default
    assert time.time() + bound - 100 < begin <= time.time() + bound + 1
    comment = answer["set"]["admin_comment"]
    parsed = parse_admin_comment(comment)
    assert parsed is not None and parsed["until"] == str(begin) and parsed["r"] == answer["token"]
    # What job_submit.lua makes of it: the job as written, not before its begin time.
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(begin))
    job_id = tb.submit("--gres=gpu:1", "--begin", when, "-t", "60", "-J", "train", SLEEP)
    tb.run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"])
    tb.run(["scontrol", "reconfigure"])  # a scheduling pass: the two free GPUs stay unused
    time.sleep(2)
    assert svc.jobs()[job_id].state == "PENDING"
    held = parse_key_values(tb.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout.strip())
    assert datetime.fromisoformat(held["EligibleTime"]).timestamp() >= begin - 1
    tb.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"])
    try:
        # One good GPU frees on n02.
        tb.run(["scancel", str(fillers[("n02", 0)])])
        deadline = time.monotonic() + 60
        while len(svc.busy_uuids()) != 13 and time.monotonic() < deadline:
            time.sleep(0.2)
        summary = svc.client.request({"op": "replan"}, timeout_s=60)
        assert summary["ok"] and summary["applied"] == [job_id], (summary, svc.jobs()[job_id])
        fields = parse_key_values(
            tb.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout.strip()
        )
        assert fields["ReqNodeList"] == "n02"
        assert fields["TresPerNode"] == stored_tres(tb, f"gres:gpu:{good}:1")
        eligible = datetime.fromisoformat(fields["EligibleTime"]).timestamp()
        assert eligible <= time.time() + 1  # the hold is lifted (Reason follows at a pass)
    finally:
        tb.run(["scontrol", "update", "PartitionName=debug", "State=UP"])
    job = svc.wait(job_id, "RUNNING")
    assert list(job.allocated_gpu_indices()) == ["n02"]
    routed = parse_admin_comment(job.admin_comment)
    assert routed is not None and routed["action"] == "route" and routed["r"] == answer["token"]
