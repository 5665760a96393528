"""Against a real Slurm (22.05, and 24.11 with SLURM_PAL_SLURM_RELEASE; no mocks): rendered GPU
types, typed requests, the state reader, `site check`. Findings that shape the advisor are
spelled out in the test docstrings, with what differs by release."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from slurm_pal.adapters.slurm.parse import Gres
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.example_campaign import generate_example_campaign

pytestmark = pytest.mark.slurm

PRINT_GPUS = (
    "echo NODE=$SLURMD_NODENAME; echo JOB_GPUS=$SLURM_JOB_GPUS; echo CVD=$CUDA_VISIBLE_DEVICES"
)


def _job_output(lab, job_id: int) -> dict[str, str]:
    path = Path(lab.tb.root) / "jobs" / f"{job_id}.out"
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _indices(text: str) -> list[int]:
    return [int(i) for i in text.split(",") if i]


def _run_to_end(lab, *args: str) -> dict[str, str]:
    job = lab.tb.submit(*args, "--wrap", PRINT_GPUS)
    assert lab.tb.wait_job(job, 30) == "COMPLETED", lab.tb.job_fields(job)
    out = _job_output(lab, job)
    assert out["JOB_GPUS"] == out["CVD"]
    return out


def _labels_by_count(lab) -> list[str]:
    """Labels from the most to the least common GPU type in the cluster."""
    counts = Counter(lbl for gpus in lab.slurm_labels.values() for lbl in gpus.values())
    return [label for label, _ in counts.most_common()]


def test_nodes_idle_with_rendered_gres_types(slurm_lab) -> None:
    nodes = {n.name: n for n in CliStateReader(slurm_lab.tb.env).nodes()}
    assert sorted(nodes) == ["n01", "n02", "n03", "n04"]
    for name, gpus in slurm_lab.slurm_labels.items():
        assert nodes[name].state == "idle"
        assert nodes[name].gpu_types() == dict(Counter(gpus.values()))
    assert nodes["n03"].features == ("rackB",)
    assert len(_labels_by_count(slurm_lab)) > 1  # the example campaign has several signatures


def test_typed_request_lands_on_a_gpu_of_that_label(slurm_lab) -> None:
    jobs = {
        label: slurm_lab.tb.submit(f"--gres=gpu:{label}:1", "--wrap", PRINT_GPUS)
        for label in _labels_by_count(slurm_lab)
    }
    for label, job in jobs.items():
        assert slurm_lab.tb.wait_job(job, 30) == "COMPLETED"
        out = _job_output(slurm_lab, job)
        assert out["JOB_GPUS"] == out["CVD"]
        (index,) = _indices(out["JOB_GPUS"])
        assert slurm_lab.slurm_labels[out["NODE"]][index] == label
        # The Prolog (PrologFlags=Alloc) sees the same Slurm indices as the job.
        record = Path(slurm_lab.tb.root) / "log" / f"prolog-{job}-{out['NODE']}"
        assert record.read_text().strip() == f"JOB_GPUS={out['JOB_GPUS']}"


def test_job_submit_lua_sees_the_typed_request(slurm_lab) -> None:
    label = _labels_by_count(slurm_lab)[-1]
    job = slurm_lab.tb.submit(
        "-H", "--comment=pal:probe", f"--gres=gpu:{label}:1", "--wrap", "true"
    )
    try:
        (info,) = CliStateReader(slurm_lab.tb.env).jobs(job_ids=[job])
        assert (info.state, info.reason) == ("PENDING", "JobHeldUser")
        assert info.admin_comment == "tres_per_node=" + slurm_lab.tres(f"gres:gpu:{label}:1")
        assert info.comment == "pal:probe"
    finally:
        slurm_lab.tb.run(["scancel", str(job)])


def test_slurm_numbers_gpus_grouped_by_type_not_by_device(slurm_lab) -> None:
    """Finding: slurmd merges a node's gres.conf lines by Type (first appearance, file order).

    SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES are Slurm's numbers, so a lone GPU of another type
    between GPUs of one type gets a number different from its device file. labels.json's
    slurm_index is the mapping to use.
    """
    moved = [
        (node, g)
        for node, gpus in slurm_lab.labels["nodes"].items()
        for g in gpus
        if g["index"] != g["slurm_index"]
        and sum(o["label"] == g["label"] for o in gpus) == 1  # a lone GPU of its type
    ]
    if not moved:
        pytest.skip("the rendered campaign has no interleaved GPU types")
    node, gpu = moved[0]
    out = _run_to_end(slurm_lab, "-w", node, f"--gres=gpu:{gpu['label']}:1")
    assert _indices(out["JOB_GPUS"]) == [gpu["slurm_index"]] != [gpu["index"]]


def test_mixed_type_request_on_one_node(slurm_lab) -> None:
    both = [
        (node, sorted(set(gpus.values())))
        for node, gpus in slurm_lab.slurm_labels.items()
        if len(set(gpus.values())) > 1
    ]
    assert both, "the example campaign should have a node with two GPU types"
    _, (l1, l2) = both[0][0], both[0][1][:2]
    out = _run_to_end(slurm_lab, f"--gres=gpu:{l1}:1,gpu:{l2}:1")
    got = sorted(slurm_lab.slurm_labels[out["NODE"]][i] for i in _indices(out["JOB_GPUS"]))
    assert got == sorted([l1, l2])


def test_an_update_that_drops_a_gpu_type_keeps_it(slurm_lab) -> None:
    """Finding (22.05.8): ``scontrol update TresPerNode=`` merges the new typed entries into the
    job's GRES request. A type the update leaves out keeps its old count, so a job updated from
    ``T1:1,T2:1`` to ``T1:1`` still runs on both GPUs (and a node without T2 can never run it:
    pending with BadConstraints for ever). The re-planner never sends such an update
    (``adapters.slurm.update.transition_problem``). 24.11.5 replaces the request: the job runs
    on the one T1 GPU (``SlurmRelease.typed_gres_update_replaces``)."""
    node, (l1, l2) = next(
        (n, sorted(set(g.values()))[:2])
        for n, g in slurm_lab.slurm_labels.items()
        if len(set(g.values())) > 1
    )
    tb = slurm_lab.tb
    job = tb.submit("-H", "-w", node, f"--gres=gpu:{l1}:1,gpu:{l2}:1", "--wrap", PRINT_GPUS)
    tb.run(["scontrol", "update", f"JobId={job}", f"TresPerNode=gres:gpu:{l1}:1"])
    assert tb.job_fields(job)["TresPerNode"] == slurm_lab.tres(f"gres:gpu:{l1}:1")  # shown
    tb.run(["scontrol", "release", str(job)])
    assert tb.wait_job(job, 30) == "COMPLETED", tb.job_fields(job)
    out = _job_output(slurm_lab, job)
    got = sorted(slurm_lab.slurm_labels[out["NODE"]][i] for i in _indices(out["JOB_GPUS"]))
    replaced = slurm_lab.release.typed_gres_update_replaces
    assert got == ([l1] if replaced else sorted([l1, l2]))  # what it got


def test_per_job_request_with_several_types(slurm_lab) -> None:
    """Finding (22.05.8): per-job typed GPU requests (`--gpus=T1:a,T2:b`, TresPerJob).

    * accepted without -N; they then run on ONE node (a per-job count does not raise the node
      count: `--gpus=T1:5,T2:1` on 4-GPU nodes is rejected, "Requested node configuration is
      not available", also with -N1-2);
    * with -N2 every typed count must be >= the node count ("--gpus < -N"), so a rare signature
      (one GPU in the cluster) can never be part of a multi-node per-job request. Steer
      multi-node jobs with per-node typed requests (tres_per_node) plus req_nodes instead.
    """
    common, *_, rare = _labels_by_count(slurm_lab)
    job = slurm_lab.tb.submit(f"--gpus={common}:2,{rare}:1", "--wrap", PRINT_GPUS)
    assert slurm_lab.tb.wait_job(job, 30) == "COMPLETED"
    assert slurm_lab.tb.job_fields(job)["TresPerJob"] == slurm_lab.tres(
        f"gres:gpu:{common}:2,gres:gpu:{rare}:1"
    )
    out = _job_output(slurm_lab, job)
    got = Counter(slurm_lab.slurm_labels[out["NODE"]][i] for i in _indices(out["JOB_GPUS"]))
    assert got == Counter({common: 2, rare: 1})

    too_few = slurm_lab.tb.run(
        ["sbatch", "-N2", f"--gpus={common}:2,{rare}:1", "--wrap", "true"], check=False
    )
    assert too_few.returncode != 0 and "--gpus < -N" in too_few.stderr
    spread = slurm_lab.tb.run(
        ["sbatch", "-N1-2", f"--gpus={common}:5,{rare}:1", "--wrap", "true"], check=False
    )
    assert spread.returncode != 0
    assert "Requested node configuration is not available" in spread.stderr


def test_state_reader_sees_a_running_job(slurm_lab) -> None:
    tb = slurm_lab.tb
    node = "n02"
    label = _labels_by_count(slurm_lab)[0]
    job = tb.submit("-w", node, f"--gres=gpu:{label}:2", "--wrap", PRINT_GPUS + "; sleep 60")
    try:
        tb.wait_job(job, 30, state="RUNNING")
        reader = CliStateReader(tb.env)
        (info,) = reader.jobs(job_ids=[job])  # squeue --json returns every job: client filter
        assert (info.state, info.nodes, info.user) == ("RUNNING", (node,), "root")
        assert info.tres_per_node == (Gres("gpu", label, 2),)
        held = info.allocated_gpu_indices()[node]
        assert len(held) == 2
        assert {slurm_lab.slurm_labels[node][i] for i in held} == {label}
        (n,) = reader.nodes([node])
        assert n.state == "mixed"
        assert n.used_gpu_indices() == {label: held}
        assert reader.jobs(job_ids=[job], states=["PENDING"]) == []
        # The service's reader runs the commands and parses them in a worker process: it
        # must read exactly what the in-process one reads, and report errors the same way.
        apart = CliStateReader(tb.env, parse_apart=True)
        # The service's brief read (squeue -O): the same jobs in every field it reads, the
        # advisor's admin comment with its blanks and '|' whole; GPU indices only from 23.02
        # on (a --json read of the jobs holding GPUs: 22.05's --json ignores --states).
        comment = "slurm-pal/0.1.0 route r=abcdef012345 class=A why=a b|c"
        tb.run(["scontrol", "update", f"JobId={job}", f"AdminComment={comment}"])
        full = {j.job_id: j for j in reader.jobs()}
        brief = CliStateReader(tb.env, brief_jobs=True).jobs()
        assert brief and {j.job_id for j in brief} <= set(full)
        shared = ("state", "user", "partition", "nodes", "priority", "reason", "tres_per_node",
                  "tres_per_job", "admin_comment")  # fmt: skip
        for got in brief:
            assert {k: getattr(got, k) for k in shared} == {
                k: getattr(full[got.job_id], k) for k in shared
            }
        (mine,) = [j for j in brief if j.job_id == job]
        indices = full[job].allocated_gres if reader.release.squeue_json_filters else {}
        assert mine.admin_comment == comment and mine.allocated_gres == indices
        try:
            assert apart.jobs() == reader.jobs()
            assert apart.nodes() == reader.nodes()
            broken = CliStateReader({**tb.env, "SLURM_CONF": "/nonexistent"}, parse_apart=True)
            with pytest.raises(SlurmQueryError, match="SLURM_CONF=/nonexistent does not exist"):
                broken.jobs()
            broken.close()
        finally:
            apart.close()
    finally:
        tb.run(["scancel", str(job)])
    assert tb.wait_job(job, 30) == "CANCELLED"
    assert _indices(_job_output(slurm_lab, job)["JOB_GPUS"]) == list(held)


def test_site_check_reports_matching_labels(slurm_lab) -> None:
    result = slurm_lab.cli("site", "check")
    assert "4 node(s) match, 0 differ" in result.output
    data = json.loads(slurm_lab.cli("site", "check", "--json").output)
    assert data["matching"] == ["n01", "n02", "n03", "n04"] and data["differing"] == []


def test_site_check_detects_a_mismatch(slurm_lab, tmp_path: Path) -> None:
    csv = tmp_path / "a100.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n", gpu_model="a100").to_csv(
        csv, index=False
    )
    slurm_lab.cli("profile", "ingest", str(csv), "--campaign", "a100")
    result = slurm_lab.cli("site", "check", "--campaign", "a100", ok=False)
    assert result.exit_code == 1
    assert "0 node(s) match, 4 differ" in result.output
    assert "restart of slurmctld" in " ".join(result.output.split())
    assert "n01: Slurm has gpu:v100-" in result.output
