"""The pyslurm backend at its boundary, and the choice of backend.

No pyslurm builds against a libslurm on this machine (see pyslurm_backend's docstring), so
pyslurm itself is the boundary: its objects are built here with the attribute names and value
shapes of pyslurm 25.11.2's source (``Job.gres_per_node`` and the resource layout's ``gres``
are ``cstr.to_gres_dict`` dicts, ``Node.state`` is ``slurm_node_state_string_complete``, lists
for features and partitions), filled from the squeue/sinfo output captured on a real Slurm
22.05 (tests/fixtures/slurm). The reader must then agree with the CLI reader on the same
cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_pal.adapters.slurm.pyslurm_backend import (
    BackendError,
    PyslurmApplier,
    PyslurmStateReader,
    choose_backend,
    modify_kwargs,
    pyslurm_release,
)
from slurm_pal.adapters.slurm.release import SlurmRelease
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.adapters.slurm.update import JobChange, ScontrolBatchApplier
from slurm_pal.core.hostlist import expand

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def to_gres_dict(text: str) -> dict[str, Any]:
    """A Slurm GRES string in the dict form pyslurm's ``cstr.to_gres_dict`` returns:
    ``gpu:T:2`` -> ``{"gpu:T": 2}``, ``gpu:T:1(IDX:0,2)`` -> ``{"gpu:T": {"count": 1,
    "indexes": "0,2"}}``, the ``gres:`` prefix dropped."""
    out: dict[str, Any] = {}
    for item in re.split(r",(?=[^,()]+:)", text or ""):
        if not item or item in ("(null)", "N/A"):
            continue
        item = item.replace("gres:", "")
        m = re.match(r"^([^:(]+)(?::([^:(]+))?(?::(\d+))?(?:\(IDX:([^)]*)\))?$", item)
        assert m, item
        name, typ, count, idx = m.groups()
        if typ is not None and typ.isdigit() and count is None:
            typ, count = None, typ
        key = f"{name}:{typ}" if typ else name
        out[key] = int(count or 1) if idx is None else {"count": int(count), "indexes": idx}
    return out


class RPCError(Exception):
    """pyslurm.RPCError: its message is slurm_strerror's text."""


def recorded_pyslurm(version: str = "22.05.8") -> SimpleNamespace:
    """A pyslurm module whose Jobs/Nodes/Partitions hold the captured 22.05 cluster."""
    squeue = json.loads((FIXTURES / "squeue.json").read_text())["jobs"]
    sinfo = json.loads((FIXTURES / "sinfo.json").read_text())["nodes"]

    def job(j: dict) -> SimpleNamespace:
        nodes = j["nodes"] or None
        layout = {}
        if nodes:
            layout = {
                n: {"cpu_ids": "0", "gres": to_gres_dict(d), "memory": None}
                for n, d in zip(expand(nodes), j["gres_detail"], strict=False)
            }
        tres_per_job = None
        if j["tres_per_job"]:
            gres = {
                k: SimpleNamespace(name=k, count=v)
                for k, v in to_gres_dict(j["tres_per_job"]).items()
            }
            tres_per_job = SimpleNamespace(gres=gres)
        return SimpleNamespace(
            id=j["job_id"],
            state=j["job_state"],
            user_name=j["user_name"],
            user_id=j["user_id"],
            partition=j["partition"],
            allocated_nodes=nodes,
            name=j["name"],
            priority=j["priority"],
            state_reason=j["state_reason"],
            gres_per_node=to_gres_dict(j["tres_per_node"]),
            tres_per_job=tres_per_job,
            required_nodes=j["required_nodes"] or None,
            constraints=j["features"] or None,
            comment=j["comment"] or None,
            admin_comment=j["admin_comment"] or None,
            time_limit=j["time_limit"],  # minutes; None: UNLIMITED
            end_time=j["end_time"] or None,
            get_resource_layout_per_node=lambda layout=layout: layout,
        )

    def node(n: dict) -> SimpleNamespace:
        state = "+".join([n["state"].upper(), *n.get("state_flags", [])])
        return SimpleNamespace(
            name=n["name"],
            state=state,
            active_features=[f for f in (n["active_features"] or "").split(",") if f],
            available_features=[f for f in (n["features"] or "").split(",") if f],
            partitions=list(n["partitions"]),
            configured_gres=to_gres_dict(n["gres"]),
            reason=n["reason"] or None,
        )

    def collection(items: list[SimpleNamespace]) -> SimpleNamespace:
        return SimpleNamespace(values=lambda: items)

    partitions = [SimpleNamespace(name="debug", is_default=True)]
    return SimpleNamespace(
        __version__=version,
        RPCError=RPCError,
        Jobs=SimpleNamespace(load=lambda: collection([job(j) for j in squeue])),
        Nodes=SimpleNamespace(load=lambda: collection([node(n) for n in sinfo])),
        Partitions=SimpleNamespace(load=lambda: collection(partitions)),
    )


def cli_reader() -> CliStateReader:
    outputs = {
        "squeue --json": (FIXTURES / "squeue.json").read_text(),
        "sinfo --json": (FIXTURES / "sinfo.json").read_text(),
    }
    return CliStateReader(
        runner=lambda args: outputs[" ".join(args)], release=SlurmRelease(22, 5, 8)
    )


def test_pyslurm_reader_agrees_with_the_cli_reader_on_the_same_cluster() -> None:
    reader = PyslurmStateReader(recorded_pyslurm())  # type: ignore[arg-type]
    assert reader.jobs() == cli_reader().jobs()
    assert reader.jobs(states=["pending"]) == cli_reader().jobs(states=["PENDING"])
    ours = {n.name: n for n in reader.nodes()}
    theirs = {n.name: n for n in cli_reader().nodes()}
    assert sorted(ours) == sorted(theirs)
    for name, node in theirs.items():
        mine = ours[name]
        assert (mine.state, mine.flags, mine.features, mine.partitions, mine.gres) == (
            node.state,
            node.flags,
            node.features,
            node.partitions,
            node.gres,
        )
        # GPUs in use come from the jobs' layouts: the same device indices sinfo reports
        assert mine.used_gpu_indices() == node.used_gpu_indices(), name
    assert any(n.used_gpu_indices() for n in ours.values())
    assert reader.default_partition() == "debug"


def test_pyslurm_reader_turns_rpc_errors_into_query_errors() -> None:
    module = recorded_pyslurm()

    def refuse() -> None:
        raise RPCError("Unable to contact slurm controller (connect failure)")

    module.Jobs.load = refuse
    with pytest.raises(SlurmQueryError, match="connect failure"):
        PyslurmStateReader(module).jobs()  # type: ignore[arg-type]


class RecordingPyslurm(SimpleNamespace):
    """pyslurm's write side: ``Job(id).modify(JobSubmitDescription(**fields))``; jobs in
    ``started`` answer as slurmctld does for a job that is no longer pending."""

    def __init__(self, started: set[int]) -> None:
        calls: list[tuple[int, dict[str, str]]] = []

        class Desc:
            def __init__(self, **kwargs: str) -> None:
                self.kwargs = kwargs

        class Job:
            def __init__(self, job_id: int) -> None:
                self.id = job_id

            def modify(self, desc: Desc) -> None:
                if self.id in started:
                    raise RPCError("Job is no longer pending execution")
                calls.append((self.id, desc.kwargs))

        super().__init__(
            __version__="22.05.8", RPCError=RPCError, Job=Job, JobSubmitDescription=Desc
        )
        self.calls = calls


class RecordingScontrol(ScontrolBatchApplier):
    """The scontrol fallback, keeping the steps instead of running them (the real one is
    tested against Slurm in tests/slurm/test_slurm_writes.py)."""

    def __init__(self) -> None:
        super().__init__({})
        self.steps: list[list[str]] = []
        self._release, self._release_read = None, True

    def apply_step(self, step):  # type: ignore[no-untyped-def]
        self.steps.append(list(step))
        return None


def test_pyslurm_applier_modifies_each_job_and_falls_back_for_what_it_cannot_say() -> None:
    module = RecordingPyslurm(started={7})
    fallback = RecordingScontrol()
    applier = PyslurmApplier(module, fallback, release=None)  # type: ignore[arg-type]
    comment = "slurm-pal/1 replan r=ab why=two blanks"
    changes = [
        JobChange(5, {"req_nodes": "n02", "tres_per_node": "gres:gpu:ta:1"}, "gres:gpu:ta:1", 1),
        JobChange(6, {"req_nodes": "n01", "admin_comment": comment}, "", 1, lift_exclusion_to=""),
        JobChange(7, {"req_nodes": "n03"}, "gres:gpu:ta:1", 1),
        # 22.05: an untyped request cannot become typed per job: refused before any RPC
        JobChange(8, {"tres_per_job": "gres:gpu:ta:2"}, "gres:gpu:2", 2),
        JobChange(9, {"req_nodes": "n01", "min_nodes": 1, "max_nodes": 2}, "", 1),
    ]
    errors = applier.apply_many(changes)
    assert errors[0] is None and errors[1] is None and errors[4] is None
    assert errors[2] is not None and "job 7" in errors[2] and "no longer pending" in errors[2]
    assert errors[3] is not None and "untyped" in errors[3]
    assert module.calls == [
        (5, {"required_nodes": "n02", "gres_per_node": "gres:gpu:ta:1"}),
        (6, {"required_nodes": "n01", "admin_comment": comment}),
    ]
    # Clearing the exclusion and a node count are not expressible through Job.modify
    assert fallback.steps == [
        ["update", "JobId=6", "ExcNodeList="],
        ["update", "JobId=9", "ReqNodeList=n01", "NumNodes=1-2"],
    ]


def test_modify_kwargs_maps_scontrol_keywords_to_job_submit_description() -> None:
    step = ["update", "JobId=3", "ReqNodeList=n[01-02]", "TresPerJob=gres:gpu:ta:2"]
    assert modify_kwargs(step) == {"required_nodes": "n[01-02]", "gpus": "gres:gpu:ta:2"}
    assert modify_kwargs(["update", "JobId=3", "TresPerNode="]) is None


def fake_module(version: str) -> SimpleNamespace:
    return recorded_pyslurm(version)


@pytest.mark.parametrize(
    ("pyslurm_version", "running", "chosen", "why"),
    [
        ("24.11.1", SlurmRelease(24, 11, 5), "pyslurm", "matches Slurm 24.11.5"),
        ("25.11.2", SlurmRelease(24, 11, 5), "cli", "is for Slurm 25.11, this is Slurm 24.11.5"),
        ("25.11.2", None, "cli", "release is unknown"),
    ],
)
def test_auto_picks_pyslurm_only_when_its_release_matches(
    pyslurm_version: str, running: SlurmRelease | None, chosen: str, why: str
) -> None:
    choice = choose_backend(
        "auto",
        {"SLURM_CONF": "/nonexistent"},
        import_pyslurm=lambda: fake_module(pyslurm_version),  # type: ignore[arg-type,return-value]
        release=lambda env: running,
    )
    assert choice.name == chosen
    assert why in choice.why
    if chosen == "pyslurm":
        assert isinstance(choice.reader, PyslurmStateReader)
        assert isinstance(choice.applier, PyslurmApplier)
    else:
        assert isinstance(choice.reader, CliStateReader)
        assert isinstance(choice.applier, ScontrolBatchApplier)


def test_pyslurm_setting_is_refused_with_one_line_when_it_cannot_be_used() -> None:
    with pytest.raises(BackendError, match=r"is for Slurm 25\.11, this is Slurm 22\.05\.8"):
        choose_backend(
            "pyslurm",
            {},
            import_pyslurm=lambda: fake_module("25.11.2"),  # type: ignore[arg-type,return-value]
            release=lambda env: SlurmRelease(22, 5, 8),
        )


def test_here_auto_falls_back_to_the_cli_because_pyslurm_is_not_installed() -> None:
    """The real import on this machine (no pyslurm: none builds against Debian's libslurm)."""
    choice = choose_backend("auto", {"SLURM_CONF": "/nonexistent/slurm.conf"})
    assert choice.name == "cli"
    assert "pyslurm does not import" in choice.why
    with pytest.raises(BackendError, match="pyslurm does not import"):
        choose_backend("pyslurm", {})
    cli = choose_backend("cli", {})
    assert cli.name == "cli" and isinstance(cli.applier, ScontrolBatchApplier)
    # the service's cli reader parses apart; it reads jobs briefly only when told to
    assert cli.reader.parse_apart and not cli.reader.brief_jobs  # type: ignore[attr-defined]
    assert choose_backend("cli", {}, brief_jobs=True).reader.brief_jobs  # type: ignore[attr-defined]


def test_pyslurm_release_reads_the_version_it_was_built_for() -> None:
    assert pyslurm_release(SimpleNamespace(__version__="25.11.2")) == SlurmRelease(25, 11, 2)  # type: ignore[arg-type]
    assert pyslurm_release(SimpleNamespace()) is None  # type: ignore[arg-type]
