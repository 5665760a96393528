"""Parsers of Slurm 22.05 output, on text captured from the real testbed (tests/fixtures/slurm)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import pytest

from slurm_pal.adapters.slurm.parse import (
    Gres,
    parse_gres,
    parse_indices,
    parse_key_values,
    split_top_level,
)
from slurm_pal.adapters.slurm.state import (
    BRIEF_FORMAT,
    CliStateReader,
    SlurmQueryError,
    SlurmTimeoutError,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_brief,
    parse_squeue_json,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
A, B, X = "v100-a0b0", "v100-a1b0", "v100-ax0b1"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:4", (Gres("gpu", None, 4),)),
        (f"gpu:{A}:2,gpu:{B}:1", (Gres("gpu", A, 2), Gres("gpu", B, 1))),
        ("gpu:tesla:2(S:0-1)", (Gres("gpu", "tesla", 2),)),
        (f"gpu:{A}:0(IDX:N/A)", (Gres("gpu", A, 0),)),
        (
            f"gpu:{A}:2(IDX:0-1),gpu:{X}:1(IDX:3)",
            (Gres("gpu", A, 2, (0, 1)), Gres("gpu", X, 1, (3,))),
        ),
        ("gpu:2(IDX:0,2)", (Gres("gpu", None, 2, (0, 2)),)),
        (f"gres:gpu:{A}:1,gres:gpu:{X}:1", (Gres("gpu", A, 1), Gres("gpu", X, 1))),
        ("gpu", (Gres("gpu", None, 1),)),
        ("(null)", ()),
        ("", ()),
        (None, ()),
    ],
)
def test_parse_gres(text: str | None, expected: tuple[Gres, ...]) -> None:
    assert parse_gres(text) == expected


def test_parse_gres_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="bad GRES entry"):
        parse_gres("gpu:a:b:c:2")
    with pytest.raises(ValueError, match="bad GRES index"):
        parse_indices("0-x")


def test_small_helpers() -> None:
    assert split_top_level("a(IDX:0,2),b, c") == ["a(IDX:0,2)", "b", "c"]
    assert parse_indices("0-1,3") == (0, 1, 3)
    assert str(Gres("gpu", A, 2)) == f"gpu:{A}:2"
    kv = parse_key_values("NodeName=n1 OS=Linux 6.1 #1 SMP CfgTRES=cpu=8,mem=2000M State=IDLE")
    assert kv == {
        "NodeName": "n1",
        "OS": "Linux 6.1 #1 SMP",
        "CfgTRES": "cpu=8,mem=2000M",
        "State": "IDLE",
    }


def test_sinfo_json_nodes() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(fixture("sinfo.json"))}
    assert sorted(nodes) == ["n01", "n02", "n03", "n04"]
    n1 = nodes["n01"]
    assert (n1.state, n1.flags, n1.features, n1.partitions) == ("mixed", (), ("rackA",), ("debug",))
    assert n1.gpu_types() == {A: 2, B: 1, X: 1}
    assert n1.used_gpu_indices() == {A: (0,), X: (3,)}
    assert nodes["n02"].used_gpu_indices() == {B: (2,)}


def test_scontrol_nodes_agree_with_sinfo_json() -> None:
    from_json = parse_sinfo_json(fixture("sinfo.json"))
    from_text = parse_scontrol_nodes(fixture("scontrol-show-node-d.txt"))
    assert [(n.name, n.state, n.features, n.gres, n.gres_used) for n in from_json] == [
        (n.name, n.state, n.features, n.gres, n.gres_used) for n in from_text
    ]


def test_scontrol_node_states_with_flags() -> None:
    (node,) = parse_scontrol_nodes("NodeName=g1 State=IDLE+DRAIN Gres=gpu:2 Reason=broken fan")
    assert (node.state, node.flags, node.reason) == ("idle", ("DRAIN",), "broken fan")
    (node,) = parse_sinfo_json('{"nodes": [{"name": "g2", "state": "down*", "state_flags": []}]}')
    assert (node.state, node.flags) == ("down", ("NOT_RESPONDING",))


def test_squeue_json_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(fixture("squeue.json"))}
    mixed = jobs[1]
    assert (mixed.state, mixed.user, mixed.partition, mixed.nodes) == (
        "RUNNING",
        "root",
        "debug",
        ("n01",),
    )
    assert mixed.tres_per_node == (Gres("gpu", A, 1), Gres("gpu", X, 1))
    assert mixed.allocated_gpu_indices() == {"n01": (0, 3)}
    assert mixed.priority > 0
    assert jobs[2].required_nodes == ("n02",)
    held = jobs[3]
    assert (held.state, held.reason, held.nodes, held.allocated_gres) == (
        "PENDING",
        "JobHeldUser",
        (),
        {},
    )
    spread = jobs[4]  # --gpus=A:2,B:2 -N2: a per-job request, split one of each per node
    assert spread.nodes == ("n03", "n04") and spread.tres_per_node == ()
    assert spread.tres_per_job == (Gres("gpu", A, 2), Gres("gpu", B, 2))
    assert spread.allocated_gpu_indices() == {"n03": (0, 2), "n04": (0, 2)}


def _reader(outputs: dict[str, str]) -> CliStateReader:
    def run(args):
        key = " ".join(args)
        if key not in outputs:
            raise SlurmQueryError(f"{key} exited 1: no such thing")
        return outputs[key]

    return CliStateReader(runner=run)


def test_reader_filters_on_the_client() -> None:
    reader = _reader(
        {"squeue --json": fixture("squeue.json"), "sinfo --json": fixture("sinfo.json")}
    )
    assert [j.job_id for j in reader.jobs(job_ids=[2, 4])] == [2, 4]
    assert [j.job_id for j in reader.jobs(states=["pending"])] == [3]
    assert reader.jobs(users=["nobody"]) == []
    assert [n.name for n in reader.nodes(["n03", "n09"])] == ["n03"]


def test_reader_falls_back_to_scontrol_without_json() -> None:
    reader = _reader({"scontrol show node -o -d": fixture("scontrol-show-node-d.txt")})
    assert [n.name for n in reader.nodes()] == ["n01", "n02", "n03", "n04"]


def test_reader_errors_are_clear() -> None:
    reader = CliStateReader(runner=lambda args: "not json")
    with pytest.raises(SlurmQueryError, match="did not print JSON"):
        reader.jobs()
    reader = CliStateReader(runner=lambda args: '{"errors": ["boom"], "jobs": []}')
    with pytest.raises(SlurmQueryError, match="boom"):
        reader.jobs()
    reader = CliStateReader(env={"PATH": "/nonexistent"})
    with pytest.raises(SlurmQueryError, match="not found"):
        reader.jobs()
    reader = CliStateReader(env={"SLURM_CONF": "/nonexistent/slurm.conf"})
    with pytest.raises(SlurmQueryError, match="does not exist"):
        reader.nodes()


def test_reader_does_not_fall_back_when_slurmctld_is_silent() -> None:
    calls: list[str] = []

    def silent(args):
        calls.append(args[0])
        raise SlurmTimeoutError(f"{args[0]} gave no answer")

    with pytest.raises(SlurmTimeoutError):
        CliStateReader(runner=silent).nodes()
    assert calls == ["scontrol", "sinfo"]  # scontrol --version (local), no fallback after sinfo


# What `squeue --noheader -O BRIEF_FORMAT` printed on the testbed (Slurm 22.05.8 and 24.11.5):
# a pending job whose admin comment holds blanks and a '|', a held job array asking per job
# with a 1-day limit, and a two-node running job with a 1-hour limit.
BRIEF_2205 = (
    "2|PENDING|root|debug||4294901758|Resources|gres:gpu:4|N/A|UNLIMITED|N/A|"
    "slurm-pal/0.1.0 wait r=abc class=A exc=n01 why=x|y z\n"
    "3|PENDING|root|debug||0|JobHeldUser|N/A|gres:gpu:3|1-00:00:00|N/A|(null)\n"
    "1|RUNNING|root|debug|n[01-02]|4294901759|None|gres:gpu:2|N/A|1:00:00|"
    "2026-11-26T14:00:00|(null)\n"
)
BRIEF_2411 = (
    "2|PENDING|root|debug||1|Resources|gres/gpu:4|N/A|UNLIMITED|N/A|"
    "slurm-pal/0.1.0 wait r=abc class=A exc=n01 why=x|y z\n"
    "3|PENDING|root|debug||0|JobHeldUser|N/A|gres/gpu:3|1-00:00:00|N/A|(null)\n"
    "1|RUNNING|root|debug|n[01-02]|1|None|gres/gpu:2|N/A|1:00:00|2026-11-26T14:00:00|(null)\n"
)


@pytest.mark.parametrize("text", [BRIEF_2205, BRIEF_2411], ids=["22.05", "24.11"])
def test_the_brief_job_read_of_both_releases(text: str) -> None:
    pending, held, running = parse_squeue_brief(text)
    assert (pending.job_id, pending.state, pending.reason) == (2, "PENDING", "Resources")
    assert pending.admin_comment == "slurm-pal/0.1.0 wait r=abc class=A exc=n01 why=x|y z"
    assert pending.tres_per_node == (Gres("gpu", None, 4),) and pending.tres_per_job == ()
    assert (held.priority, held.reason, held.admin_comment) == (0, "JobHeldUser", "")
    assert held.tres_per_job == (Gres("gpu", None, 3),)
    assert (running.state, running.nodes, running.user) == ("RUNNING", ("n01", "n02"), "root")
    # what the brief read leaves out: GPU indices and every field a user writes
    assert running.allocated_gres == {} and (running.name, running.comment) == ("", "")
    # what the advisor's wait estimates read: limits and the running job's planned end
    assert (pending.time_limit_s, held.time_limit_s, running.time_limit_s) == (
        math.inf,
        86400.0,
        3600.0,
    )
    assert pending.end_time is None
    assert running.end_time == datetime.fromisoformat("2026-11-26T14:00:00").timestamp()


def test_a_brief_line_that_is_not_a_job_is_left_out_and_the_rest_read(caplog) -> None:
    text = "x|PENDING|root|debug||1|None|N/A|N/A|UNLIMITED|N/A|(null)\nshort|line\n" + BRIEF_2205
    assert [j.job_id for j in parse_squeue_brief(text)] == [2, 3, 1]
    assert caplog.text.count("squeue line left out") == 2


@pytest.mark.parametrize("release", ["22.05.8", "24.11.5"])
def test_the_brief_reader_asks_for_exactly_the_brief_fields(release: str) -> None:
    """22.05: the brief read alone (its --json ignores --states: GPU indices come from the
    jobs' records). From 23.02 on, the jobs holding GPUs are read with --json as well, for
    their indices, which are merged in."""
    running = json.loads(fixture("24.11/squeue.json"))
    held = next(j for j in running["jobs"] if j["gres_detail"])
    calls: list[list[str]] = []

    def run(args):  # type: ignore[no-untyped-def]
        calls.append(list(args))
        if args[:2] == ["scontrol", "--version"]:
            return f"slurm {release}\n"
        if args[:2] == ["squeue", "--json"]:
            return json.dumps(running)
        return (
            f"{held['job_id']}|RUNNING|root|debug|{held['nodes']}|1|None|gres/gpu:2|N/A|"
            "UNLIMITED|N/A|(null)\n"
        )

    reader = CliStateReader({}, runner=run, brief_jobs=True)
    (job,) = reader.jobs(states=["RUNNING"])
    brief = ["squeue", "--noheader", "-O", BRIEF_FORMAT]
    if release.startswith("22"):
        assert [c for c in calls if c[0] == "squeue"] == [brief]
        assert job.allocated_gres == {}
    else:
        holding = ["squeue", "--json", "--states=RUNNING,COMPLETING,SUSPENDED,CONFIGURING"]
        assert [c for c in calls if c[0] == "squeue"] == [brief, holding]
        assert job.allocated_gres and job.allocated_gpu_indices()
    assert BRIEF_FORMAT.split(",")[-1] == "admin_comment:0"  # last: it may hold a '|'


def test_time_limits_and_planned_ends_of_both_json_generations() -> None:
    """What the advisor's wait estimate reads: 22.05 prints an UNLIMITED limit as null and a
    running job's end as start + one year; 24.11 marks it infinite."""
    old = {j.job_id: j for j in parse_squeue_json(fixture("squeue.json"))}
    assert old[1].time_limit_s is None and old[1].end_time == 1826871079.0
    assert old[3].end_time is None  # pending: no end yet
    new = {j.job_id: j for j in parse_squeue_json(fixture("24.11/squeue.json"))}
    assert new[10].time_limit_s == math.inf and new[10].end_time == 1827090045.0
    assert new[11].end_time is None
    limited = json.dumps({"jobs": [{"job_id": 5, "job_state": "PENDING", "time_limit": 90}]})
    assert parse_squeue_json(limited)[0].time_limit_s == 5400.0
    limited = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 5,
                    "job_state": ["PENDING"],
                    "time_limit": {"set": True, "infinite": False, "number": 90},
                }
            ]
        }
    )
    assert parse_squeue_json(limited)[0].time_limit_s == 5400.0
