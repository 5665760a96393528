"""job_submit.lua's job fields -> JobDescription -> GpuAsk, hostlists and features."""

from __future__ import annotations

import hashlib

import pytest

from slurm_pal.engine.jobdesc import (
    NO_VAL,
    NO_VAL16,
    GpuAsk,
    JobDescError,
    JobDescription,
    feature_set,
    gpu_ask,
    node_set,
    parse_tres,
)

FULL = {
    "user": "alice",
    "uid": 1001,
    "name": "train",
    "comment": "pal:app=resnet",
    "account": "ml",
    "partition": "gpu,debug",
    "tres_per_node": "gres:gpu:2,gres:shard:1",
    "tres_per_job": "gres:gpu:4",
    "tres_per_task": "cpu:2",
    "tres_per_socket": "gres:gpu:1",
    "min_nodes": 2,
    "max_nodes": 3,
    "num_tasks": 8,
    "req_nodes": "n[01-02]",
    "exc_nodes": "n03",
    "features": "rackA&ib",
    "script": "#!/bin/sh\n#PAL app=resnet\nsrun python train.py\n",
    "script_size": 43,
    "array": "0-15%4",
    "modify": True,
    "job_id": 1234,
}


def job(**fields: object) -> JobDescription:
    return JobDescription.from_wire({"user": "alice", **fields})


def test_from_wire_reads_every_field_and_round_trips() -> None:
    desc = JobDescription.from_wire(FULL)
    assert desc.user == "alice" and desc.uid == 1001 and desc.partition == "gpu,debug"
    assert desc.min_nodes == 2 and desc.max_nodes == 3 and desc.num_tasks == 8
    assert desc.array == "0-15%4" and desc.modify is True and desc.job_id == 1234
    assert desc.to_wire() == FULL
    assert JobDescription.from_wire(desc.to_wire()) == desc


def test_absent_fields_and_defaults() -> None:
    desc = JobDescription.from_wire({"uid": 7})
    assert desc.user == "uid:7"  # PROTOCOL: user name of submit_uid, or "uid:N"
    assert desc.name == "" and desc.tres_per_node is None and desc.min_nodes is None
    assert desc.modify is False and desc.job_id is None
    assert desc.to_wire() == {"user": "uid:7", "uid": 7}
    assert JobDescription.from_wire({}).user == ""


@pytest.mark.parametrize("value", [NO_VAL, NO_VAL16, float(NO_VAL), None])
@pytest.mark.parametrize("key", ["min_nodes", "max_nodes", "num_tasks", "job_id"])
def test_no_val_reads_as_absent(key: str, value: object) -> None:
    assert getattr(job(**{key: value}), key) is None


def test_lua_doubles_are_integers() -> None:
    desc = job(min_nodes=2.0, uid=1001.0)
    assert desc.min_nodes == 2 and isinstance(desc.min_nodes, int) and desc.uid == 1001


def test_empty_optional_string_is_absent() -> None:
    desc = job(tres_per_node="", req_nodes="", features="")
    assert desc.tres_per_node is None and desc.req_nodes is None and desc.features is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("min_nodes", "2"),
        ("min_nodes", 1.5),
        ("min_nodes", True),
        ("max_nodes", -1),
        ("uid", [1]),
        ("tres_per_node", 2),
        ("req_nodes", ["n01"]),
        ("name", 3),
        ("user", 5),
        ("script", b"x"),
        ("modify", "yes"),
        ("array", 4),
    ],
)
def test_wrong_types_name_the_field(key: str, value: object) -> None:
    with pytest.raises(JobDescError, match=repr(key)) as info:
        JobDescription.from_wire({"user": "alice", key: value})
    assert info.value.field == key


def test_job_must_be_an_object() -> None:
    with pytest.raises(JobDescError, match="'job'"):
        JobDescription.from_wire(["not", "a", "dict"])  # type: ignore[arg-type]


def test_unknown_keys_are_ignored() -> None:
    assert job(something_new=1) == job()


def test_script_sha256_whole_script_is_the_file_hash() -> None:
    script = "#!/bin/sh\necho héllo\n"
    data = script.encode()
    desc = job(script=script, script_size=len(data))
    assert desc.script_sha256 == hashlib.sha256(data).hexdigest()
    assert job(script=script).script_sha256 == hashlib.sha256(data).hexdigest()
    assert job().script_sha256 is None


def test_script_sha256_of_a_cut_script_includes_the_size() -> None:
    prefix = "#!/bin/sh\n" + "x" * 100
    short = job(script=prefix, script_size=20000).script_sha256
    longer = job(script=prefix, script_size=30000).script_sha256
    whole = job(script=prefix).script_sha256
    assert len({short, longer, whole}) == 3


def test_job_request_carries_resolve_fields() -> None:
    desc = JobDescription.from_wire(FULL)
    request = desc.job_request()
    assert request.user == "alice" and request.job_name == "train"
    assert request.account == "ml" and request.partitions == ("gpu", "debug")
    assert request.comment == "pal:app=resnet" and request.script == FULL["script"]
    assert request.script_sha256 == desc.script_sha256
    assert request.history_key == ("alice", "train", desc.script_sha256)


# --- tres parsing -----------------------------------------------------------------------------


def test_parse_tres_shapes() -> None:
    entries = parse_tres("gres:gpu:v100:2,gres:shard:1,gres/gpu:3,gpu,cpu=2")
    assert [(e.name, e.type, e.count) for e in entries] == [
        ("gpu", "v100", 2),
        ("shard", None, 0),
        ("gpu", None, 3),
        ("gpu", None, 1),
        ("cpu", None, 0),
    ]
    assert entries[1].text == "gres:shard:1" and not entries[1].is_gpu
    assert parse_tres(None) == ()


@pytest.mark.parametrize("bad", ["gres:gpu:a:b:2", "gres:gpu::2", "gres:gpu:2(S:0)"])
def test_parse_tres_rejects_unreadable_gpu_entries(bad: str) -> None:
    with pytest.raises(JobDescError, match="tres_per_node"):
        parse_tres(bad, "tres_per_node")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # --gres=gpu:2 and --gpus-per-node=2
        ({"tres_per_node": "gres:gpu:2"}, GpuAsk(2, None, None, None, ())),
        # --gpus=2
        ({"tres_per_job": "gres:gpu:2"}, GpuAsk(None, 2, None, None, ())),
        ({"tres_per_task": "gres:gpu:1"}, GpuAsk(None, None, 1, None, ())),
        (
            {"tres_per_node": "gres:gpu:v100:2,gres:shard:1"},
            GpuAsk(2, None, None, "v100", ("gres:shard:1",), types=("v100",)),
        ),
        (
            {"tres_per_node": "gres:gpu:L1:1,gres:gpu:L2:2"},
            GpuAsk(3, None, None, None, (), types=("L1", "L2")),
        ),
        (
            {"tres_per_node": "gres:gpu:1,gres:gpu:v100:1"},
            GpuAsk(2, None, None, None, (), types=(None, "v100")),
        ),
        (
            {"tres_per_node": "gres:gpu:4", "tres_per_job": "gres:gpu:8"},
            GpuAsk(4, 8, None, None, ()),
        ),
        ({"tres_per_socket": "gres:gpu:1"}, GpuAsk(None, None, None, None, (), per_socket=1)),
        (
            {"tres_per_node": "gres:gpu:2", "tres_per_task": "cpu:4"},
            GpuAsk(2, None, None, None, ("cpu:4",)),
        ),
    ],
)
def test_gpu_ask(fields: dict[str, object], expected: GpuAsk) -> None:
    assert gpu_ask(job(**fields)) == expected


@pytest.mark.parametrize(
    "fields", [{}, {"tres_per_node": "gres:shard:1"}, {"tres_per_node": "gres:gpu:0"}]
)
def test_no_gpus_asked(fields: dict[str, object]) -> None:
    assert gpu_ask(job(**fields)) is None


def test_mixed_types_flag() -> None:
    ask = gpu_ask(job(tres_per_node="gres:gpu:L1:1,gres:gpu:L2:1"))
    assert ask is not None and ask.mixed_types and ask.gpu_type is None
    single = gpu_ask(job(tres_per_job="gres:gpu:v100:2"))
    assert single is not None and not single.mixed_types and single.gpu_type == "v100"


# --- hostlists and features ---------------------------------------------------------------------


def test_node_set() -> None:
    assert node_set("n[01-03],gpu7", "req_nodes") == {"n01", "n02", "n03", "gpu7"}
    assert node_set(None, "req_nodes") == frozenset()
    with pytest.raises(JobDescError, match="exc_nodes"):
        node_set("n[03-01]", "exc_nodes")
    with pytest.raises(JobDescError, match="req_nodes"):
        node_set("n[01", "req_nodes")


def test_feature_set_plain_and() -> None:
    assert feature_set("rackA") == {"rackA"}
    assert feature_set("rackA&ib&gpu_v100") == {"rackA", "ib", "gpu_v100"}
    assert feature_set(None) == frozenset() and feature_set("  ") == frozenset()


@pytest.mark.parametrize(
    "expression",
    ["rackA|rackB", "[rackA|rackB]", "[rackA*2&rackB*2]", "!rackA", "(a&b)", "a,b", "a&&b", "a&"],
)
def test_feature_set_rejects_what_cannot_be_modelled(expression: str) -> None:
    with pytest.raises(JobDescError, match="features"):
        feature_set(expression)


def test_with_set_applies_a_decide_answer() -> None:
    desc = job(tres_per_job="gres:gpu:2", tres_per_node="gres:shard:1", min_nodes=1)
    new = desc.with_set(
        {
            "req_nodes": "n01",
            "tres_per_node": "gres:gpu:v100-a0:2,gres:shard:1",
            "tres_per_job": "",
            "min_nodes": 1,
            "max_nodes": 1,
            "admin_comment": "slurm-pal/1 route why=x",
        }
    )
    assert new.req_nodes == "n01" and new.tres_per_job is None and new.max_nodes == 1
    assert new.tres_per_node == "gres:gpu:v100-a0:2,gres:shard:1" and new.user == "alice"
    with pytest.raises(JobDescError, match="valid: req_nodes"):
        desc.with_set({"features": "rackA"})
    with pytest.raises(JobDescError, match="'min_nodes'"):
        desc.with_set({"min_nodes": "2"})
