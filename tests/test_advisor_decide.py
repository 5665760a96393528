"""The submit-time decision: label table, routing encodings, pass cases, translation, admin
comment; a property test against the policy on random clusters; the example campaign's real
labels.json."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from slurm_pal.adapters.store import Store
from slurm_pal.cli.main import app
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import PlacementPolicy, get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.decide import (
    ADMIN_COMMENT_MAX,
    SET_FIELDS,
    Decision,
    LabelTable,
    LabelTableError,
    decide,
    format_admin_comment,
    parse_admin_comment,
    parse_gpus_field,
    translate_model_types,
)
from slurm_pal.engine.jobdesc import (
    JobDescription,
    feature_set,
    gpu_ask,
    node_set,
    parse_tres,
)
from slurm_pal.example_campaign import generate_example_campaign
from tests.helpers.decide_site import A0, A1, A2, AX, SCORES, site

PAL = get_policy("pal")


LAYOUT = {
    "n01": [A0, A0, A1, A1],
    "n02": [A0, A0, A1, A1],
    "n03": [A1, A2, A2, A2],
}


def run(
    fields: Mapping[str, object],
    cluster: Cluster,
    labels: LabelTable,
    *,
    policy: PlacementPolicy = PAL,
    job_class: str = "A",
    **extra: object,
) -> Decision:
    job = JobDescription.from_wire({"user": "alice", **fields})
    return decide(
        job,
        job_class=job_class,
        class_reason="site default",
        cluster=cluster,
        labels=labels,
        policy=policy,
        version="0.1.0",
        token="tok-1",
        **extra,  # type: ignore[arg-type]
    )


def chosen_labels(decision: Decision, labels: LabelTable) -> dict[str, Counter[str]]:
    """Node -> label multiset of the allocated GPUs, looked up by UUID (not by index)."""
    by_uuid = {e.uuid: e.label for e in labels.entries}
    assert decision.allocation is not None
    out: dict[str, Counter[str]] = {}
    for node, uuid in zip(decision.allocation.nodes, decision.allocation.uuids, strict=True):
        out.setdefault(node, Counter())[by_uuid[uuid]] += 1
    return out


def applied(fields: Mapping[str, object], decision: Decision) -> JobDescription:
    """The job as Slurm sees it after job_submit.lua applied ``set`` ("" clears a field)."""
    assert set(decision.set_fields) <= set(SET_FIELDS)
    return JobDescription.from_wire({"user": "alice", **fields}).with_set(decision.set_fields)


# --- LabelTable -------------------------------------------------------------------------------


def test_label_table_maps_device_and_slurm_indices() -> None:
    _, labels = site({"n1": [A0, A1, A0, A1]}, slurm_order={"n1": [0, 2, 1, 3]})
    assert labels.label("n1", 1) == A1 and labels.slurm_index("n1", 1) == 2
    assert labels.device_index("n1", 2) == 1 and labels.uuid("n1", 3) == "GPU-n1-3"
    assert labels.labels == {A0, A1} and labels.models == {"v100"} and labels.nodes == ("n1",)
    assert labels.is_label("V100-A0B1") and labels.is_model("V100") and not labels.is_model(A0)
    with pytest.raises(KeyError, match=r"valid: \[0, 1, 2, 3\]"):
        labels.label("n1", 7)
    with pytest.raises(KeyError, match="not in labels.json"):
        labels.device_index("n9", 0)


GOOD_GPU = {"index": 0, "slurm_index": 0, "label": A0, "uuid": "u0"}


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ([], "top level"),
        ({"campaign": "c"}, "'nodes'"),
        ({"nodes": {}}, "no GPUs"),
        ({"nodes": {"n1": {"index": 0}}}, "list of GPUs"),
        ({"nodes": {"n1": [{**GOOD_GPU, "index": "0"}]}}, "'index'"),
        ({"nodes": {"n1": [{**GOOD_GPU, "slurm_index": True}]}}, "'slurm_index'"),
        ({"nodes": {"n1": [{**GOOD_GPU, "label": ""}]}}, "'label'"),
        ({"nodes": {"n1": [{**GOOD_GPU, "label": "a:b"}]}}, "not a valid gres Type"),
        ({"nodes": {"n1": [GOOD_GPU, {**GOOD_GPU, "slurm_index": 1}]}}, "index 0 listed twice"),
        ({"nodes": {"n1": [GOOD_GPU, {**GOOD_GPU, "index": 1}]}}, "slurm_index 0 listed twice"),
        ({"nodes": {"n1": [{k: v for k, v in GOOD_GPU.items() if k != "uuid"}]}}, "'uuid'"),
    ],
)
def test_label_table_rejects_bad_files(data: object, text: str) -> None:
    with pytest.raises(LabelTableError, match=text):
        LabelTable.from_labels_json(data)  # type: ignore[arg-type]


# --- the four routing encodings ---------------------------------------------------------------


def test_encoding_1_one_node_typed_by_label() -> None:
    cluster, labels = site(LAYOUT)
    fields = {"tres_per_node": "gres:gpu:2"}
    d = run(fields, cluster, labels)
    assert d.action == "route" and d.encoding == 1 and d.token == "tok-1"
    node = d.allocation.node_names[0]  # type: ignore[union-attr]
    assert node in ("n01", "n02")
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2"
    assert d.set_fields["req_nodes"] == node
    assert d.set_fields["min_nodes"] == d.set_fields["max_nodes"] == 1
    assert "tres_per_job" not in d.set_fields and d.lv_product == pytest.approx(0.9)
    assert d.allocation == PAL.place(d.request, cluster).allocation  # type: ignore[arg-type]


def test_encoding_1_several_labels_on_one_node() -> None:
    cluster, labels = site(LAYOUT, busy=[("n02", 0), ("n02", 1)])
    d = run({"tres_per_node": "gres:gpu:3"}, cluster, labels)
    assert d.encoding == 1 and d.set_fields["req_nodes"] == "n01"
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2,gres:gpu:{A1}:1"


def test_encoding_2_same_multiset_on_every_node() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:2", "min_nodes": 2}, cluster, labels)
    assert d.action == "route" and d.encoding == 2
    assert d.set_fields["req_nodes"] == "n[01-02]"
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2"
    assert d.set_fields["min_nodes"] == d.set_fields["max_nodes"] == 2


def test_encoding_3_equal_counts_different_labels() -> None:
    cluster, labels = site(LAYOUT, busy=[("n02", 0)])
    d = run({"tres_per_node": "gres:gpu:3", "min_nodes": 2, "max_nodes": 2}, cluster, labels)
    assert d.encoding == 3, d.reason
    assert chosen_labels(d, labels) == {
        "n01": Counter({A0: 2, A1: 1}),
        "n02": Counter({A0: 1, A1: 2}),
    }
    assert d.set_fields["tres_per_node"] == "gres:gpu:3"
    assert d.set_fields["req_nodes"] == "n[01-02]"


def test_encoding_4_per_job_count_split_unevenly() -> None:
    cluster, labels = site(LAYOUT, busy=[("n02", 0), ("n02", 1)] + [("n03", i) for i in range(4)])
    fields = {"tres_per_job": "gres:gpu:6", "tres_per_node": "gres:shard:1"}
    d = run(fields, cluster, labels)
    assert d.encoding == 4
    assert chosen_labels(d, labels) == {"n01": Counter({A0: 2, A1: 2}), "n02": Counter({A1: 2})}
    assert d.set_fields["tres_per_job"] == "gres:gpu:6"
    assert d.set_fields["req_nodes"] == "n[01-02]"
    assert d.set_fields["min_nodes"] == d.set_fields["max_nodes"] == 2
    assert "tres_per_node" not in d.set_fields  # only the user's shard: left alone


def test_encoding_4_typed_when_every_gpu_has_one_label() -> None:
    cluster, labels = site({"n01": [A0] * 4, "n02": [A0] * 4, "n03": [A2] * 4}, busy=[("n02", 0)])
    d = run({"tres_per_job": "gres:gpu:v100:7"}, cluster, labels)
    assert d.encoding == 4 and d.set_fields["tres_per_job"] == f"gres:gpu:{A0}:7"
    assert d.set_fields["req_nodes"] == "n[01-02]"


def test_per_job_on_one_node_moves_to_per_node_and_clears_per_job() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_job": "gres:gpu:v100:2"}, cluster, labels)
    assert d.encoding == 1
    assert d.set_fields["tres_per_job"] == ""
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2"


def test_per_job_and_per_node_together() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_job": "gres:gpu:8", "tres_per_node": "gres:gpu:4"}, cluster, labels)
    assert d.action == "route" and d.encoding == 2
    assert d.set_fields["tres_per_job"] == ""
    assert d.set_fields["min_nodes"] == 2 and d.request.gpus == 8  # type: ignore[union-attr]


def test_other_gres_are_kept() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:2,gres:shard:1"}, cluster, labels)
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2,gres:shard:1"
    d = run({"tres_per_job": "gres:gpu:2,gres:shard:1"}, cluster, labels)
    assert d.set_fields["tres_per_job"] == "gres:shard:1"
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A0}:2"


def test_per_task_routes_nodes_only() -> None:
    cluster, labels = site(LAYOUT)
    fields = {"tres_per_task": "gres:gpu:v100:1", "num_tasks": 3, "tres_per_node": "gres:shard:1"}
    d = run(fields, cluster, labels)
    assert d.action == "route" and d.encoding == 0
    assert d.request.gpus == 3  # type: ignore[union-attr]
    assert set(d.set_fields) == {
        "req_nodes",
        "min_nodes",
        "max_nodes",
        "tres_per_task",
        "admin_comment",
    }
    assert d.set_fields["tres_per_task"] == "gres:gpu:1"  # the model type translated


def test_per_node_without_min_nodes_means_one_node() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:4"}, cluster, labels)
    assert d.request.gpus == 4 and d.set_fields["min_nodes"] == 1  # type: ignore[union-attr]


def test_user_nodelist_gets_a_gpu_on_every_listed_node() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_job": "gres:gpu:2", "req_nodes": "n01,n03"}, cluster, labels)
    assert d.action == "route"
    assert set(d.allocation.node_names) == {"n01", "n03"}  # type: ignore[union-attr]
    assert d.set_fields["req_nodes"] == "n[01,03]"
    d = run({"tres_per_node": "gres:gpu:1", "req_nodes": "n03"}, cluster, labels)
    assert d.set_fields["req_nodes"] == "n03"
    assert d.set_fields["tres_per_node"] == f"gres:gpu:{A1}:1"


def test_excluded_nodes_and_features() -> None:
    feats = {"n01": ["rackA"], "n02": ["rackA", "ib"], "n03": ["rackB", "ib"]}
    cluster, labels = site(LAYOUT, features=feats)
    d = run({"tres_per_node": "gres:gpu:2", "features": "rackA&ib"}, cluster, labels)
    assert d.set_fields["req_nodes"] == "n02"
    d = run({"tres_per_node": "gres:gpu:2", "exc_nodes": "n[01-02]"}, cluster, labels)
    assert d.set_fields["req_nodes"] == "n03"


def test_partitions_keep_nodes_inside_the_job_partition() -> None:
    cluster, labels = site(LAYOUT)
    parts = {"big": ["n01", "n02", "n03"], "slow": ["n03"]}
    d = run(
        {"tres_per_node": "gres:gpu:2", "partition": "slow"}, cluster, labels, partition_nodes=parts
    )
    assert d.set_fields["req_nodes"] == "n03"
    # several partitions: the best LV product among them
    d = run(
        {"tres_per_node": "gres:gpu:2", "partition": "slow,big"},
        cluster,
        labels,
        partition_nodes=parts,
    )
    assert d.set_fields["req_nodes"] in ("n01", "n02")
    # no partition given: the default partition's nodes
    d = run(
        {"tres_per_node": "gres:gpu:2"},
        cluster,
        labels,
        partition_nodes=parts,
        default_partition="slow",
    )
    assert d.set_fields["req_nodes"] == "n03"
    d = run(
        {"tres_per_node": "gres:gpu:2", "partition": "nope"}, cluster, labels, partition_nodes=parts
    )
    assert d.action == "pass" and "unknown partition(s) nope (valid: big, slow)" in d.reason


# --- pass cases ---------------------------------------------------------------------------------


def test_cpu_job_is_untouched() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_task": "cpu:4"}, cluster, labels)
    assert d.action == "pass" and dict(d.set_fields) == {} and d.job_class is None
    assert d.to_wire()["set"] == {} and d.to_wire()["class"] is None


@pytest.mark.parametrize(
    ("fields", "reason", "translated"),
    [
        ({"tres_per_node": f"gres:gpu:{A0}:1"}, "pinned by the user", {}),
        (
            {"tres_per_node": f"gres:gpu:{A0}:1,gres:gpu:v100:1"},
            "pinned by the user",
            {"tres_per_node": f"gres:gpu:{A0}:1,gres:gpu:1"},
        ),
        (
            {"tres_per_node": "gres:gpu:v100:2", "array": "0-7"},
            "job array: Slurm places each task",
            {"tres_per_node": "gres:gpu:2"},
        ),
        (
            {"tres_per_job": "gres:gpu:v100:2", "modify": True, "job_id": 12},
            "job modification",
            {"tres_per_job": "gres:gpu:2"},
        ),
        ({"tres_per_socket": "gres:gpu:1"}, "per socket", {}),
        (
            {"tres_per_node": "gres:gpu:v100:1,gres:gpu:a100:1"},
            "several GPU types",
            {"tres_per_node": "gres:gpu:1,gres:gpu:a100:1"},
        ),
        ({"tres_per_node": "gres:gpu:tesla:1"}, "unknown GPU type 'tesla' (models: v100", {}),
        ({"tres_per_task": "gres:gpu:1", "tres_per_node": "gres:gpu:2"}, "per task together", {}),
        ({"tres_per_node": "gres:gpu:a:b:1"}, "cannot read the GPU request", {}),
        ({"tres_per_node": "gres:gpu:2", "req_nodes": "n[02-01]"}, "req_nodes", {}),
        ({"tres_per_node": "gres:gpu:2", "features": "rackA|rackB"}, "plain AND", {}),
        ({"tres_per_node": "gres:gpu:5"}, "no free GPUs fit now", {}),
        (
            {"tres_per_job": "gres:gpu:2", "req_nodes": "n01", "exc_nodes": "n01"},
            "both required and excluded",
            {},
        ),
        ({"tres_per_job": "gres:gpu:2", "req_nodes": "n09"}, "unknown required node", {}),
    ],
)
def test_pass_cases(fields: dict[str, object], reason: str, translated: dict[str, str]) -> None:
    cluster, labels = site(LAYOUT)
    d = run(fields, cluster, labels)
    assert d.action == "pass" and reason in d.reason
    assert d.token is None and d.allocation is None and d.lv_product is None
    assert {k: v for k, v in d.set_fields.items() if k != "admin_comment"} == translated
    comment = parse_admin_comment(str(d.set_fields["admin_comment"]))
    assert comment is not None and comment["action"] == "pass" and comment["class"] == "A"
    assert comment["why"] == d.reason[: len(comment["why"])]


def test_more_tasks_than_gpus_without_a_node_count_passes() -> None:
    """Slurm derives the node count of ``-n 8 --gres=gpu:2`` from CPUs the advisor does not
    see; pinning one node could get the job rejected."""
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:2", "num_tasks": 8}, cluster, labels)
    assert d.action == "pass" and "8 tasks on 2 GPU(s) without a node count" in d.reason
    assert run({"tres_per_node": "gres:gpu:2", "num_tasks": 2}, cluster, labels).action == "route"
    routed = run({"tres_per_node": "gres:gpu:2", "num_tasks": 8, "min_nodes": 1}, cluster, labels)
    assert routed.action == "route"
    per_task = run({"tres_per_task": "gres:gpu:1", "num_tasks": 8}, cluster, labels)
    assert per_task.action == "route" and per_task.request.gpus == 8  # type: ignore[union-attr]


def test_no_free_gpus_says_replanning_retries() -> None:
    cluster, labels = site(LAYOUT, busy=[(n, i) for n in LAYOUT for i in range(4)])
    d = run({"tres_per_job": "gres:gpu:v100:1"}, cluster, labels)
    assert d.action == "pass" and "re-planning retries" in d.reason
    assert d.set_fields["tres_per_job"] == "gres:gpu:1"
    assert d.request is not None and d.request.gpu_model == "v100"


def test_unknown_class_passes() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:1"}, cluster, labels, job_class="Z")
    assert d.action == "pass" and "class 'Z' has no PM-scores" in d.reason
    assert "valid: A, B" in d.reason


def test_cluster_gpu_missing_from_labels_passes() -> None:
    cluster, _ = site({"n01": [A0, A1]})
    _, other = site({"n02": [A0, A1]})
    d = run({"tres_per_node": "gres:gpu:1"}, cluster, other)
    assert d.action == "pass" and "labels.json disagree" in d.reason


def test_class_decides_the_gpus() -> None:
    cluster, labels = site({"n01": [A0, A1]})
    assert chosen_labels(run({"tres_per_node": "gres:gpu:1"}, cluster, labels), labels) == {
        "n01": Counter({A0: 1})
    }
    b = run({"tres_per_node": "gres:gpu:1"}, cluster, labels, job_class="B")
    assert chosen_labels(b, labels) == {"n01": Counter({A1: 1})}
    assert "class B: site default" in b.reason


# --- translation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("gres:gpu:v100:2", "gres:gpu:2"),
        ("gres:gpu:V100:2", "gres:gpu:2"),
        ("gres:gpu:v100", "gres:gpu:1"),
        ("gres:gpu:v100:2,gres:shard:1", "gres:gpu:2,gres:shard:1"),
        ("gres:shard:1,gres:gpu:v100:2", "gres:shard:1,gres:gpu:2"),
        (f"gres:gpu:{A0}:1,gres:gpu:v100:1", f"gres:gpu:{A0}:1,gres:gpu:1"),
        ("gres:gpu:1,gres:gpu:v100:2", "gres:gpu:3"),
        ("gres:gpu:2", "gres:gpu:2"),
        (f"gres:gpu:{A0}:2", f"gres:gpu:{A0}:2"),
        ("gres:gpu:a100:2", "gres:gpu:a100:2"),  # not a model of this site: left to Slurm
        ("gres:gpu:v100:x:1,gres:gpu:v100:1", "gres:gpu:v100:x:1,gres:gpu:1"),  # fail-open
        ("gres/gpu:v100:2", "gres:gpu:2"),
        ("", ""),
    ],
)
def test_translate_model_types(tres: str, expected: str) -> None:
    _, labels = site(LAYOUT)
    assert translate_model_types(tres, labels) == expected


tres_items = st.one_of(
    st.builds(
        lambda t, n: f"gres:gpu:{t}:{n}" if t else f"gres:gpu:{n}",
        st.sampled_from([None, "v100", "V100", A0, A1, "a100"]),
        st.integers(0, 8),
    ),
    st.sampled_from(["gres:shard:1", "gres:gpu:bad:x:1", "cpu:2", "gres/gpu:v100:1", "gres:gpu"]),
)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(tres_items, max_size=5))
def test_translation_keeps_counts_and_everything_but_model_types(items: list[str]) -> None:
    _, labels = site(LAYOUT)
    tres = ",".join(items)
    out = translate_model_types(tres, labels)
    readable = [i for i in items if i != "gres:gpu:bad:x:1"]
    before = parse_tres(",".join(readable))
    after = parse_tres(",".join(i for i in out.split(",") if i != "gres:gpu:bad:x:1"))
    assert sum(e.count for e in before if e.is_gpu) == sum(e.count for e in after if e.is_gpu)
    assert not any(e.is_gpu and e.type and labels.is_model(e.type) for e in after)
    assert [e.text for e in before if not e.is_gpu] == [e.text for e in after if not e.is_gpu]
    kept = [e.text for e in before if e.is_gpu and e.type and not labels.is_model(e.type)]
    assert kept == [e.text for e in after if e.is_gpu and e.type]
    assert out.count("gres:gpu:bad:x:1") == tres.count("gres:gpu:bad:x:1")
    if not any(e.is_gpu and e.type and labels.is_model(e.type) for e in before):
        assert sum(1 for e in before if e.is_gpu and e.type is None) > 1 or out == tres


# --- admin comment --------------------------------------------------------------------------------


def test_admin_comment_round_trip() -> None:
    gpus = {"n01": [A0, A0], "n02": [A1]}
    text = format_admin_comment(
        version="0.1.0",
        action="route",
        token="r-42",
        job_class="A",
        lv=1.23456,
        gpus=gpus,
        why="PAL: across-nodes; class A: history of\n3 runs",
    )
    assert text == (
        f"slurm-pal/0.1.0 route r=r-42 class=A lv=1.2346 gpus=n01:{A0}+{A0};n02:{A1} "
        "why=PAL: across-nodes; class A: history of 3 runs"
    )
    fields = parse_admin_comment(text)
    assert fields == {
        "version": "0.1.0",
        "action": "route",
        "r": "r-42",
        "class": "A",
        "lv": "1.2346",
        "gpus": f"n01:{A0}+{A0};n02:{A1}",
        "why": "PAL: across-nodes; class A: history of 3 runs",
    }
    assert parse_gpus_field(fields["gpus"]) == gpus


def test_admin_comment_of_a_routed_decision_parses_back() -> None:
    cluster, labels = site(LAYOUT)
    d = run({"tres_per_node": "gres:gpu:2", "min_nodes": 2}, cluster, labels)
    fields = parse_admin_comment(str(d.set_fields["admin_comment"]))
    assert fields is not None and fields["r"] == "tok-1" and fields["class"] == "A"
    assert float(fields["lv"]) == pytest.approx(d.lv_product, abs=1e-4)
    got = {n: Counter(ls) for n, ls in parse_gpus_field(fields["gpus"]).items()}
    assert got == chosen_labels(d, labels)


def test_admin_comment_stays_within_1024_characters() -> None:
    gpus = {f"node{i:03d}": [A0, A0, A1, AX] for i in range(40)}
    text = format_admin_comment(
        version="0.1.0", action="route", token="t", job_class="A", lv=2.0, gpus=gpus, why="w" * 50
    )
    assert len(text) <= ADMIN_COMMENT_MAX
    fields = parse_admin_comment(text)
    assert fields is not None and fields["why"] == "w" * 50
    parsed = parse_gpus_field(fields["gpus"])
    assert parsed and all(parsed[n] == gpus[n] for n in parsed)  # complete nodes only
    assert fields["gpus"].endswith("...") and f"{A0}*2" in fields["gpus"]
    # counting alone is enough for a mid-sized job
    mid = {f"node{i:03d}": [A0] * 4 for i in range(25)}
    text = format_admin_comment(version="0.1.0", action="route", why="w", gpus=mid)
    assert (
        len(text) <= ADMIN_COMMENT_MAX
        and parse_gpus_field(
            parse_admin_comment(text)["gpus"]  # type: ignore[index]
        )
        == mid
    )
    long_why = format_admin_comment(version="0.1.0", action="pass", why="x" * 5000)
    assert len(long_why) == ADMIN_COMMENT_MAX


@pytest.mark.parametrize(
    "text",
    ["", "user note", "slurm-pal/1 maybe why=x", "slurm-pal/1 route r", "slurm-pal/1 pass r=1 r=2"],
)
def test_parse_admin_comment_refuses_other_text(text: str) -> None:
    assert parse_admin_comment(text) is None


def test_admin_comment_refuses_tokens_with_blanks_and_cleans_class_names() -> None:
    with pytest.raises(ValueError, match="blanks"):
        format_admin_comment(version="1", action="route", token="a b", why="")
    text = format_admin_comment(version="1", action="pass", job_class="big one=x", why="w")
    assert parse_admin_comment(text) == {
        "version": "1",
        "action": "pass",
        "class": "big_one_x",
        "why": "w",
    }


def test_decision_to_wire() -> None:
    cluster, labels = site(LAYOUT)
    wire = run({"tres_per_node": "gres:gpu:2"}, cluster, labels).to_wire()
    assert set(wire) == {"v", "ok", "action", "set", "class", "reason", "lv", "token"}
    assert wire["v"] == 1 and wire["ok"] is True and wire["action"] == "route"
    assert json.loads(json.dumps(wire)) == wire
    assert all(isinstance(v, str | int) for v in wire["set"].values())  # type: ignore[union-attr]


# --- property: decide = the policy, and the written fields describe the chosen GPUs --------------

NODES = ("n01", "n02", "n03", "n04")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Cluster, LabelTable]:
    n_nodes = draw(st.integers(1, 4) | st.just(4))
    pool = draw(st.lists(st.sampled_from(list(SCORES)), min_size=1, max_size=3, unique=True))
    layout: dict[str, list[str]] = {}
    order: dict[str, list[int]] = {}
    busy: list[tuple[str, int]] = []
    feats: dict[str, list[str]] = {}
    for node in NODES[:n_nodes]:
        labels = draw(
            st.lists(st.sampled_from(pool), min_size=1, max_size=4) | st.just(pool[:1] * 4)
        )
        layout[node] = labels
        order[node] = draw(st.permutations(range(len(labels))))
        busy += [(node, i) for i in range(len(labels)) if draw(st.integers(0, 5)) == 0]
        feats[node] = draw(st.sets(st.sampled_from(["rackA", "ib"]), max_size=2))
    return site(layout, busy=busy, features=feats, slurm_order=order)


def sometimes(draw: st.DrawFn, strategy: st.SearchStrategy, empty: object) -> object:
    """``strategy``'s value one time in three, else ``empty``: constraints make most jobs
    unplaceable, and the property is about the jobs that are placed."""
    return draw(strategy) if draw(st.integers(0, 2)) == 0 else empty


@st.composite
def jobs(draw: st.DrawFn) -> tuple[dict[str, object], PlacementRequest]:
    """A job's wire fields and the PlacementRequest they mean (written from Slurm's rules)."""
    form = draw(st.sampled_from(["node", "job", "node+job", "task"]))
    count = draw(st.integers(1, 6) if form == "job" else st.integers(1, 3))
    model = draw(st.sampled_from([None, "v100"]))
    gpu = f"gres:gpu:{model}:{count}" if model else f"gres:gpu:{count}"
    other = draw(st.sampled_from([None, "gres:shard:1"]))
    fields: dict[str, object] = {}
    min_nodes = draw(st.none() | st.integers(1, 3) | st.just(2))
    max_nodes = None
    if draw(st.booleans()):
        max_nodes = (min_nodes or 1) + draw(st.integers(0, 2))
    if min_nodes is not None:
        fields["min_nodes"] = min_nodes
    if max_nodes is not None:
        fields["max_nodes"] = max_nodes
    per_node = None
    if form == "node":
        fields["tres_per_node"] = gpu
        per_node, gpus = count, count * (min_nodes or 1)
    elif form == "job":
        fields["tres_per_job"] = gpu
        gpus = count
    elif form == "node+job":
        fields["tres_per_node"] = gpu
        per_node = count
        gpus = count * draw(st.integers(1, 3))
        fields["tres_per_job"] = f"gres:gpu:{model}:{gpus}" if model else f"gres:gpu:{gpus}"
    else:
        fields["tres_per_task"] = gpu
        tasks = draw(st.none() | st.integers(1, 4))
        if tasks is not None:
            fields["num_tasks"] = tasks
        gpus = count * (tasks or min_nodes or 1)
    if other:
        field = "tres_per_node" if form != "node" and form != "node+job" else "tres_per_job"
        fields[field] = ",".join(filter(None, [fields.get(field), other]))  # type: ignore[list-item]
    required = sometimes(draw, st.sets(st.sampled_from(NODES), max_size=2), set())
    excluded = sometimes(draw, st.sets(st.sampled_from(NODES), max_size=1), set())
    features = sometimes(draw, st.sets(st.sampled_from(["rackA", "ib"]), max_size=2), set())
    assert isinstance(required, set) and isinstance(excluded, set) and isinstance(features, set)
    if required:
        fields["req_nodes"] = ",".join(sorted(required))
    if excluded:
        fields["exc_nodes"] = ",".join(sorted(excluded))
    if features:
        fields["features"] = "&".join(sorted(features))
    request = PlacementRequest(
        job_id="tok-1",  # decide names the request by its token until Slurm gives a job id
        job_class=draw(st.sampled_from(["A", "B"])),
        gpus=gpus,
        gpus_per_node=per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        required_nodes=frozenset(required),
        excluded_nodes=frozenset(excluded),
        required_features=frozenset(features),
        gpu_model=model,
    )
    return fields, request


def gpu_entries(text: str | None) -> Counter[str | None]:
    out: Counter[str | None] = Counter()
    for e in parse_tres(text):
        if e.is_gpu:
            out[e.type] += e.count
    return out


def others(text: str | None) -> list[str]:
    return [e.text for e in parse_tres(text) if not e.is_gpu]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    site_=clusters(),
    job_=jobs(),
    policy_name=st.sampled_from(["pal", "pm-first"]),
    tolerance=st.sampled_from([0.0, 0.05]),
    partition=st.one_of(
        st.none(), st.none(), st.none(), st.sets(st.sampled_from(NODES), min_size=1)
    ),
)
def test_decide_follows_the_policy_and_set_fields_describe_the_gpus(
    site_: tuple[Cluster, LabelTable],
    job_: tuple[dict[str, object], PlacementRequest],
    policy_name: str,
    tolerance: float,
    partition: set[str] | None,
) -> None:
    cluster, labels = site_
    fields, request = job_
    policy = get_policy(policy_name, pack_tolerance=tolerance)
    extra: dict[str, object] = {}
    if partition is not None:  # the job's default partition holds only these nodes
        extra = {"partition_nodes": {"p": sorted(partition)}, "default_partition": "p"}
        outside = frozenset(cluster.node_names) - partition
        request = replace(request, excluded_nodes=request.excluded_nodes | outside)
    d = run(fields, cluster, labels, policy=policy, job_class=request.job_class, **extra)
    expected = policy.place(request, cluster)
    why = d.reason.split(":")[0][:30] if d.action == "pass" else ""
    event(f"{d.action} encoding={d.encoding} {why}")
    assert d.allocation == expected.allocation, (d.reason, expected.reason)
    if expected.allocation is None:
        assert d.action == "pass" and d.token is None
        return
    assert d.action == "route" and d.request == request
    chosen = chosen_labels(d, labels)
    new = applied(fields, d)
    # same nodes, node counts pinned
    assert node_set(new.req_nodes, "req_nodes") == set(chosen)
    assert new.min_nodes == new.max_nodes == len(chosen)
    # the user's constraints are untouched and hold for the chosen nodes
    assert new.exc_nodes == fields.get("exc_nodes") and new.features == fields.get("features")
    assert not set(chosen) & node_set(new.exc_nodes, "exc_nodes")
    assert partition is None or set(chosen) <= partition
    for node in chosen:
        assert feature_set(new.features) <= cluster.node_features[cluster.node_index[node]]
    # non-GPU gres kept in every field
    for name in ("tres_per_node", "tres_per_job", "tres_per_task"):
        assert others(getattr(new, name)) == others(fields.get(name))  # type: ignore[arg-type]
    ask = gpu_ask(new)
    assert ask is not None
    per_node_counts = {n: sum(c.values()) for n, c in chosen.items()}
    total = sum(per_node_counts.values())
    if d.encoding == 0:
        assert gpu_entries(new.tres_per_task) == Counter({None: ask.per_task})
        assert ask.per_node is None and ask.per_job is None
        assert ask.per_task * (new.num_tasks or request.min_nodes or 1) == total  # type: ignore[operator]
    elif d.encoding in (1, 2):
        multisets = list(chosen.values())
        assert all(m == multisets[0] for m in multisets)
        assert gpu_entries(new.tres_per_node) == multisets[0]  # labels, counted, per node
        assert all(labels.is_label(t) for t in multisets[0])  # type: ignore[arg-type]
        assert ask.per_job is None and (d.encoding == 1) == (len(chosen) == 1)
    elif d.encoding == 3:
        assert len(set(per_node_counts.values())) == 1 and len(chosen) > 1
        assert gpu_entries(new.tres_per_node) == Counter({None: total // len(chosen)})
        assert ask.per_job is None
    else:
        assert d.encoding == 4 and len(set(per_node_counts.values())) > 1
        kinds = set().union(*chosen.values())
        only = next(iter(kinds)) if len(kinds) == 1 else None
        assert gpu_entries(new.tres_per_job) == Counter({only: total})
        assert ask.per_node is None
    assert total == request.gpus
    # no model type survives: every GPU type Slurm sees is a label
    for name in ("tres_per_node", "tres_per_job", "tres_per_task"):
        for gpu_type in gpu_entries(getattr(new, name)):
            assert gpu_type is None or labels.is_label(gpu_type)
    comment = parse_admin_comment(str(d.set_fields["admin_comment"]))
    assert comment is not None and comment["r"] == "tok-1"
    assert len(str(d.set_fields["admin_comment"])) <= ADMIN_COMMENT_MAX
    assert {n: Counter(ls) for n, ls in parse_gpus_field(comment["gpus"]).items()} == chosen


junk = st.one_of(
    st.none(),
    st.text(alphabet="gres:pu,v10-a[]&|!*()n0123=/ ", max_size=30),
)


@settings(max_examples=200, deadline=None)
@given(
    tres=st.tuples(junk, junk, junk, junk),
    nodes=st.tuples(junk, junk, junk),
    counts=st.tuples(*[st.none() | st.integers(0, 5)] * 3),
    array=st.none() | st.just("0-3"),
    job_class=st.sampled_from(["A", "B", "Z"]),
)
def test_decide_never_raises_on_user_input(
    tres: tuple[str | None, ...],
    nodes: tuple[str | None, ...],
    counts: tuple[int | None, ...],
    array: str | None,
    job_class: str,
) -> None:
    cluster, labels = site(LAYOUT, busy=[("n01", 0)])
    job = JobDescription(
        user="u",
        tres_per_node=tres[0],
        tres_per_job=tres[1],
        tres_per_task=tres[2],
        tres_per_socket=tres[3],
        req_nodes=nodes[0],
        exc_nodes=nodes[1],
        features=nodes[2],
        min_nodes=counts[0],
        max_nodes=counts[1],
        num_tasks=counts[2],
        array=array,
    )
    d = decide(
        job,
        job_class=job_class,
        class_reason="r",
        cluster=cluster,
        labels=labels,
        policy=PAL,
        version="1",
        token="t",
    )
    wire = d.to_wire()
    assert json.loads(json.dumps(wire)) == wire
    assert set(wire["set"]) <= set(SET_FIELDS)  # type: ignore[arg-type]
    comment = wire["set"].get("admin_comment")  # type: ignore[union-attr]
    assert comment is None or len(comment) <= ADMIN_COMMENT_MAX


# --- the example campaign's real labels.json ------------------------------------------------


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cluster, LabelTable]:
    """The example campaign (4 nodes x 4 V100) ingested and rendered as `site render` does; the
    cluster is built from the store's PM-scores, the labels from the rendered labels.json."""
    work = tmp_path_factory.mktemp("example-site")
    db, csv = work / "store.db", work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    for args in (
        ["profile", "ingest", str(csv), "--campaign", "example"],
        ["site", "render", "--out", str(work / "site"), "--device-pattern", "/dev/tty{index}"],
    ):
        result = CliRunner().invoke(app, ["--db", str(db), *args], env={"SLURM_PAL_CONFIG": None})
        assert result.exit_code == 0, result.output
    labels = LabelTable.from_labels_json(json.loads((work / "site" / "labels.json").read_text()))
    with Store(db) as store:
        scores = store.gpu_scores("example")
    specs = [
        GpuSpec(
            str(uuid),
            str(group["node"].iloc[0]),
            int(group["gpu_index"].iloc[0]),
            str(group["gpu_model"].iloc[0]),
            dict(zip(group["job_class"], group["pm_score"].astype(float), strict=True)),
        )
        for uuid, group in scores.groupby("uuid")
    ]
    return Cluster.from_gpus(specs), labels


def test_example_labels_json_is_read(example_site: tuple[Cluster, LabelTable]) -> None:
    cluster, labels = example_site
    assert labels.campaign == "example" and labels.nodes == ("n01", "n02", "n03", "n04")
    assert labels.models == {"v100"} and len(labels.entries) == 16
    for e in labels.entries:
        assert labels.device_index(e.node, labels.slurm_index(e.node, e.index)) == e.index
        assert cluster.uuids[cluster.gpu_id(e.uuid)] == labels.uuid(e.node, e.index)
    # the same signature means the same scores: labels.json and the store agree
    by_label: dict[str, set[tuple[float, ...]]] = {}
    for e in labels.entries:
        gpu = cluster.gpu_id(e.uuid)
        scores = tuple(float(cluster.classes[c].scores[gpu]) for c in cluster.class_order)
        by_label.setdefault(e.label, set()).add(scores)
    assert all(len(s) == 1 for s in by_label.values())


@pytest.mark.parametrize(
    "fields",
    [
        {"tres_per_node": "gres:gpu:v100:1"},
        {"tres_per_node": "gres:gpu:3"},
        {"tres_per_node": "gres:gpu:2", "min_nodes": 3},
        {"tres_per_job": "gres:gpu:7"},
        {"tres_per_task": "gres:gpu:1", "num_tasks": 4, "req_nodes": "n04"},
    ],
)
def test_example_campaign_jobs_are_routed_to_their_labels(
    example_site: tuple[Cluster, LabelTable], fields: dict[str, object]
) -> None:
    cluster, labels = example_site
    for job_class in cluster.class_order:
        d = run(fields, cluster, labels, job_class=job_class)
        assert d.action == "route", d.reason
        chosen = chosen_labels(d, labels)
        new = applied(fields, d)
        assert node_set(new.req_nodes, "req_nodes") == set(chosen)
        if d.encoding in (1, 2):
            assert all(gpu_entries(new.tres_per_node) == c for c in chosen.values())
        # the chosen GPUs are the policy's best: no free GPU of a better bin is left out on a
        # one-node job
        if len(chosen) == 1 and d.request is not None and d.request.gpus == 1:
            best = min(float(s) for s in cluster.classes[job_class].scores)
            assert d.allocation is not None and d.allocation.max_score == pytest.approx(best)


def test_a_job_that_fits_only_on_outliers_is_held_to_its_bound_as_its_begin_time() -> None:
    """packed-pm with waiting: the only free GPU is an outlier for class A (1.6 > 1.5) and a
    good one frees in 10 minutes (its job's planned end), so a 2-hour job keeps its request as
    written with its begin time at the bound (an hour from now): Slurm starts it nowhere
    before. A class-B job is not slowed there (1.3) and is routed to it."""
    cluster, labels = site(
        {"n01": [A0, AX], "n02": [A0, A0]},
        busy=[("n01", 0), ("n02", 0), ("n02", 1)],
    )
    now = 1_800_000_000.0
    cluster.expect_free_at([cluster.uuid_index["GPU-n02-0"]], now + 600)
    policy = get_policy("packed-pm", avoid_above=1.5, wait=True, max_wait_s=3600)
    fields = {"tres_per_node": "gres:gpu:v100:1", "exc_nodes": "n09", "time_limit": 120}
    decision = run(fields, cluster, labels, policy=policy, now=now)
    assert decision.action == "wait" and decision.retry
    assert decision.set_fields["begin_time"] == now + 3600 == decision.wait_until
    assert "exc_nodes" not in decision.set_fields  # the user's own exclusions stay as written
    assert decision.set_fields["tres_per_node"] == "gres:gpu:1"  # model type translated
    assert "req_nodes" not in decision.set_fields
    comment = parse_admin_comment(str(decision.set_fields["admin_comment"]))
    assert comment is not None and comment["action"] == "wait" and comment["r"] == "tok-1"
    assert (comment["since"], comment["until"]) == (str(int(now)), str(int(now + 3600)))
    assert decision.to_wire()["action"] == "wait"
    as_slurm_holds_it = applied(fields, decision)
    assert node_set(as_slurm_holds_it.exc_nodes, "exc_nodes") == {"n09"}
    # Held 50 minutes already (a re-planning round): the bound is still the first one's.
    later = run(fields, cluster, labels, policy=policy, now=now + 3000, waiting_since=now)
    assert later.action == "wait" and later.wait_until == now + 3600
    # A 5-minute job loses less on the outlier than it would wait: routed there now.
    short = run({**fields, "time_limit": 5}, cluster, labels, policy=policy, now=now)
    assert short.action == "route" and "rather than wait" in short.reason
    # Nothing is expected to end (an UNLIMITED neighbour): no wait justifies itself.
    cluster.expect_free_at([cluster.uuid_index["GPU-n02-0"]], float("inf"))
    assert run(fields, cluster, labels, policy=policy, now=now).action == "route"

    routed = run(fields, cluster, labels, policy=policy, job_class="B")
    assert routed.action == "route" and routed.allocation is not None
    assert routed.allocation.uuids == ("GPU-n01-1",)
    # Without waiting, the outlier is the last resort: the class-A job is routed there.
    last_resort = run(fields, cluster, labels, policy=get_policy("packed-pm", avoid_above=1.5))
    assert last_resort.action == "route" and last_resort.allocation is not None
    assert last_resort.allocation.uuids == ("GPU-n01-1",)
