"""What differs between Slurm releases, on output captured from a real 24.11.5 testbed
(tests/fixtures/slurm/24.11, `scripts/install-slurm.sh --release 24.11`) next to 22.05's."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_pal.adapters.slurm.parse import Gres, parse_gres
from slurm_pal.adapters.slurm.release import OLDEST, SlurmRelease, detect_release, parse_release
from slurm_pal.adapters.slurm.state import (
    CliStateReader,
    SlurmQueryError,
    flat_job_json,
    parse_squeue_json,
)
from slurm_pal.adapters.slurm.update import JobChange, scontrol_steps, transition_problem

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
R2205, R2411 = SlurmRelease(22, 5, 8), SlurmRelease(24, 11, 5)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("slurm-wlm 24.11.5\n", R2411),
        ("slurm 22.05.8", R2205),
        ("slurm 23.02", SlurmRelease(23, 2, 0)),
        ("scontrol: fatal: Could not establish a configuration source", None),
        ("", None),
    ],
)
def test_release_from_version_text(text: str, release: SlurmRelease | None) -> None:
    assert parse_release(text) == release


def test_release_capabilities() -> None:
    assert str(R2205) == "22.05.8" and R2411.series == "24.11"
    assert not R2205.scontrol_json and SlurmRelease(23, 2).scontrol_json and R2411.scontrol_json
    assert not R2205.typed_gres_update_replaces and R2411.typed_gres_update_replaces
    assert OLDEST.series == "22.05" and not OLDEST.typed_gres_update_replaces
    assert (R2205.tres_prefix, R2411.tres_prefix) == ("gres:", "gres/")
    assert parse_release(fixture("24.11/version.txt")) == R2411


def test_detection_failures_mean_unknown() -> None:
    def broken(args):
        raise SlurmQueryError("scontrol exited 1")

    assert detect_release(broken) is None
    assert detect_release(lambda args: "no version here") is None
    reader = CliStateReader(runner=broken)
    assert reader.release == OLDEST  # unknown: 22.05's commands
    answers = iter(["", "slurm-wlm 24.11.5"])
    reader = CliStateReader(runner=lambda args: next(answers))
    assert reader.release == OLDEST and reader.release == R2411  # asked again, then kept
    assert reader.release == R2411


def test_a_grouped_sinfo_json_falls_back_to_scontrol_text() -> None:
    """If the release was misread as 22.05 on 24.11, sinfo's node groups are not taken for
    nodes: the reader falls back to ``scontrol show node -o -d``."""
    grouped = '{"sinfo": [{"nodes": {"nodes": ["n1"]}}], "errors": []}'
    outputs = {
        "scontrol --version": "",
        "sinfo --json": grouped,
        "scontrol show node -o -d": fixture("scontrol-show-node-d.txt"),
    }
    reader = CliStateReader(runner=lambda args: outputs[" ".join(args)])
    assert [n.name for n in reader.nodes()] == ["n01", "n02", "n03", "n04"]


def test_2411_tres_are_written_with_a_slash() -> None:
    assert parse_gres("gres/gpu:binB:1,gres/gpu:binA:1") == (
        Gres("gpu", "binB", 1),
        Gres("gpu", "binA", 1),
    )


def test_2411_squeue_json() -> None:
    running, held = parse_squeue_json(fixture("24.11/squeue.json"))
    assert (running.job_id, running.state, running.user) == (10, "RUNNING", "root")
    assert running.nodes == ("n1",) and running.required_nodes == ("n1",)
    assert running.tres_per_node == (Gres("gpu", "binB", 1), Gres("gpu", "binA", 1))
    assert running.allocated_gpu_indices() == {"n1": (0, 2)}
    assert running.comment == "hello" and running.priority > 0
    assert (held.job_id, held.state, held.reason) == (11, "PENDING", "JobHeldUser")
    assert held.tres_per_node == (Gres("gpu", "binA", 2),) and held.nodes == ()


def test_2411_nodes_come_from_scontrol_json() -> None:
    calls: list[str] = []
    outputs = {
        "scontrol --version": fixture("24.11/version.txt"),
        "scontrol show nodes --json": fixture("24.11/scontrol-show-nodes.json"),
    }

    def run(args):
        calls.append(" ".join(args))
        return outputs[" ".join(args)]

    reader = CliStateReader(runner=run)
    n1, n2 = reader.nodes()
    assert calls == ["scontrol --version", "scontrol show nodes --json"]
    assert (n1.name, n1.state, n1.flags, n1.features) == ("n1", "mixed", (), ("rackA",))
    assert n1.gpu_types() == {"binA": 2, "binB": 2}
    assert n1.used_gpu_indices() == {"binA": (0,), "binB": (2,)}
    assert n2.state == "idle" and "DRAIN" in n2.flags and n2.reason == "maint"
    assert n2.partitions == ("debug",)
    reader.nodes(["n2"])
    assert calls.count("scontrol --version") == 1  # read once


def test_2411_jobs_ask_for_ended_ones_too() -> None:
    """24.11's squeue honours filters and hides ended jobs by default; 22.05 lists all."""
    outputs = {
        "scontrol --version": fixture("24.11/version.txt"),
        "squeue --json --states=all": fixture("24.11/squeue.json"),
    }
    reader = CliStateReader(runner=lambda args: outputs[" ".join(args)])
    assert [j.job_id for j in reader.jobs(states=["PENDING"])] == [11]


def test_flat_job_json_gives_2205_shapes() -> None:
    import json

    raw = json.loads(fixture("24.11/squeue.json"))["jobs"][0]
    flat = flat_job_json(raw)
    assert flat["job_state"] == "RUNNING" and isinstance(flat["start_time"], int)
    assert flat["gres_detail"] == raw["gres_detail"] and flat["nodes"] == "n1"
    assert flat_job_json({"job_state": "PENDING", "priority": 5}) == {
        "job_state": "PENDING",
        "priority": 5,
    }


@pytest.mark.parametrize(
    ("now", "new"),
    [
        ("gres:gpu:ta:2", "gres:gpu:tb:2"),  # drops a type: 22.05 merges, 24.11 replaces
        ("gres:gpu:ta:2", "gres:gpu:2"),  # typed -> untyped: 22.05 refuses
        ("gres:gpu:2", "gres:gpu:tb:1"),  # untyped -> typed: 22.05 needs two steps
    ],
)
def test_typed_updates_by_release(now: str, new: str) -> None:
    change = JobChange(7, {"tres_per_node": new}, held_tres=now, n_gpus=2)
    assert scontrol_steps(change, R2411) == [["update", "JobId=7", f"TresPerNode={new}"]]
    assert transition_problem(change, R2411) is None
    old_rules = transition_problem(change, R2205), scontrol_steps(change, R2205)
    assert old_rules == (transition_problem(change), scontrol_steps(change))  # None: 22.05
    problem, steps = old_rules
    assert (problem is not None and steps == []) or len(steps) == 2


@pytest.mark.parametrize(
    ("version", "drops"),
    [
        ("slurm 22.05.8", False),
        ("slurm 24.05.8", False),
        ("slurm 24.11.5", True),
        ("slurm 25.05.0", True),
    ],
)
def test_backfill_counts_a_job_past_its_limit_gone_from_24_11_on(version: str, drops: bool) -> None:
    release = parse_release(version)
    assert release is not None and release.backfill_drops_jobs_past_limit is drops
