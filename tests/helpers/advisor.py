"""The advisor's test environment several test modules share: a store with the example
campaign, labels.json (n01's GPUs numbered by Slurm unlike their devices), Slurm answered from
the samples captured on the real 22.05 testbed (tests/fixtures/slurm) through CliStateReader,
a clock, a job on the wire, and an applier that records instead of running scontrol.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import AdvisorConfig, HooksConfig, SiteConfig
from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.adapters.slurm.update import ScontrolApplier
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.engine.decide import LabelTable
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.site.render import plan_from_store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"

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

    def squeue_brief(self) -> str:
        """The same jobs as ``squeue --noheader -O BRIEF_FORMAT`` prints them (22.05)."""
        lines = []
        for j in self.jobs:
            nodes = ",".join(j.gpus) if j.state == "RUNNING" else ""
            reason = j.reason if j.state == "PENDING" else "None"
            comment = j.admin_comment or "(null)"
            lines.append(
                f"{j.job_id}|{j.state}|alice|debug|{nodes}|{j.priority}|{reason}|"
                f"{j.tres_per_node or 'N/A'}|N/A|UNLIMITED|N/A|{comment}"
            )
        return "".join(line + "\n" for line in lines)

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
        if args[:2] == ["squeue", "--noheader"]:
            return self.squeue_brief()
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

    def state(self, *, brief: bool = False, **kwargs: object) -> AdvisorState:
        """An AdvisorState over the fake Slurm; ``brief``: jobs read as the service reads them
        (``squeue -O``: no GPU indices)."""
        reader = CliStateReader({}, runner=self.slurm, brief_jobs=brief)
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


@contextmanager
def short_env(prefix: str, *, policy: str = "pal") -> Iterator[Env]:
    """:func:`make_env` under a folder of /tmp, removed after: Unix socket paths are short
    (108 bytes), pytest's tmp paths are long."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    the_env = make_env(root, policy=policy)
    try:
        yield the_env
    finally:
        the_env.close()
        shutil.rmtree(root, ignore_errors=True)


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


JOB = {
    "user": "alice",
    "uid": 1000,
    "name": "train",
    "comment": "pal:app=resnet",
    "tres_per_node": "gres:gpu:2",
    "script": "#!/bin/sh\n#PAL app=resnet\nsleep 1\n",
    "script_size": 33,
}


def wait_saved(env: Env, token: str) -> None:
    """Wait until the decision is in the store (written after the answer was sent)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with Store(env.db) as store:
            if store.decision(token) is not None:
                return
        time.sleep(0.01)
    raise AssertionError(f"decision {token} never stored")


class RecordingApplier(ScontrolApplier):
    """Keeps the updates instead of running scontrol (the real one is tested on Slurm)."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[object] = []

    def apply(self, update):  # type: ignore[no-untyped-def]
        self.updates.append(update)
        return None
