"""The GPUs a job's end frees, as the job-end rounds count them (the service on a real Unix
socket and store, Slurm fed from captured JSON). Found on the multi-host testbed by
benchmarks/job_end_latency.py: a second end's round, before Slurm's next read was 2 s past the
first end, still counted the first end's GPUs free after another job had got them, and pinned
its waiting job onto that occupied node."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_pal.advisor.client import AdvisorClient
from slurm_pal.advisor.server import AdvisorServer
from tests.helpers.advisor import JOB, Env, FakeJob, RecordingApplier, make_env, wait_saved

NODES = ("n01", "n02", "n03", "n04")


@pytest.fixture(params=[False, True], ids=["json-read", "brief-read"])
def served(request) -> Iterator[tuple[Env, AdvisorServer, AdvisorClient]]:  # type: ignore[no-untyped-def]
    """The service over the fake Slurm, its jobs read as ``squeue --json`` (GPU indices of
    running jobs known) and as the service reads them, ``squeue -O`` (none known: a GPU no
    known job holds is judged by whether the ended job is still on its node)."""
    root = Path(tempfile.mkdtemp(prefix="spal-adv-", dir="/tmp"))  # short socket paths
    root.chmod(0o755)
    env = make_env(root)
    state = env.state(brief=request.param)
    server = AdvisorServer(state, root / "adv.sock", refresh_s=3600, replan_s=0)
    server.start()
    try:
        yield env, server, AdvisorClient(str(root / "adv.sock"))
    finally:
        server.stop()
        env.close()
        shutil.rmtree(root, ignore_errors=True)


def _end(server: AdvisorServer, job_id: int, node: str):  # type: ignore[no-untyped-def]
    record = {"job_id": job_id, "node": node, "slurm_gpus": [0, 1, 2, 3]}
    return server.replan_at_job_end(server.state.released_by(record), job_id)


def _uuids(server: AdvisorServer, node: str) -> set[str]:
    labels = server.state.view.static.labels  # type: ignore[union-attr]
    return {labels.uuid_at_slurm_index(node, i) for i in range(4)}


def test_gpus_an_end_freed_stop_counting_once_slurm_shows_another_job_on_them(served) -> None:
    env, server, client = served
    server.applier = recorder = RecordingApplier()
    env.slurm.jobs = [
        FakeJob(i + 1, "RUNNING", gpus={node: [0, 1, 2, 3]}) for i, node in enumerate(NODES)
    ]
    server.state.refresh()
    # Job 2 ends on n02 with nothing waiting; Slurm starts a job of its own there (11, not
    # steered), and the next read, within 2 s of that end, shows it.
    _end(server, 2, "n02")
    assert _uuids(server, "n02") <= server.rounds.freed_now(frozenset())
    env.slurm.jobs[1] = FakeJob(11, "RUNNING", gpus={"n02": [0, 1, 2, 3]})
    server.state.refresh()
    assert not _uuids(server, "n02") & server.rounds.freed_now(frozenset())
    # A job that waits (nothing free), then job 3 ends on n03: its round sends the job there.
    answer = client.request({"op": "decide", "job": JOB})
    assert answer["action"] == "pass"
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(9, "PENDING", admin_comment=answer["set"]["admin_comment"]))
    server.state.refresh()
    result = _end(server, 3, "n03")
    assert result.applied == [9]
    (update,) = recorder.updates
    assert update.fields["req_nodes"] == "n03"  # type: ignore[attr-defined]


def test_an_ended_jobs_gpus_count_free_while_slurm_still_shows_that_job_on_them(served) -> None:
    """Slurm holds them until the Epilog ends, so reads show the ended job there: still free."""
    env, server, _ = served
    env.slurm.jobs = [
        FakeJob(i + 1, "RUNNING", gpus={node: [0, 1, 2, 3]}) for i, node in enumerate(NODES)
    ]
    server.state.refresh()
    _end(server, 2, "n02")
    server.state.refresh()  # job 2 still RUNNING on n02 in Slurm's eyes
    assert _uuids(server, "n02") <= server.rounds.freed_now(frozenset())


def _record(client: AdvisorClient, kind: str, job_id: int, node: str):  # type: ignore[no-untyped-def]
    record = {"record_id": f"{job_id}:{node}:{kind}", "kind": kind, "job_id": job_id,
              "node": node, "slurm_gpus": [0, 1, 2, 3]}  # fmt: skip
    return client.request({"op": "record", "record": record}, 10)


@pytest.mark.parametrize("prologs", [True, False], ids=["prologs-recorded", "no-prologs"])
def test_a_multi_node_end_without_gpu_indices_in_the_read(served, prologs: bool) -> None:
    """Job 7 held n02 and n03; job 9 waits for 4 GPUs on each of two nodes. When the read has
    the GPU indices (``--json``) or the job's Prolog records named each node's GPUs, the first
    Epilog frees both nodes, so its round places job 9 and the second Epilog starts none;
    with neither (a brief read, the advisor started after the job) each node's Epilog frees
    its own node, and the second round places job 9."""
    env, server, client = served
    one_round = prologs or not server.state.reader.brief_jobs  # type: ignore[attr-defined]
    server.applier = recorder = RecordingApplier()
    env.slurm.jobs = [
        FakeJob(1, "RUNNING", gpus={"n01": [0, 1, 2, 3]}),
        FakeJob(
            7,
            "RUNNING",
            gpus={"n02": [0, 1, 2, 3], "n03": [0, 1, 2, 3]},
            tres_per_node="gres:gpu:4",
        ),
        FakeJob(4, "RUNNING", gpus={"n04": [0, 1, 2, 3]}),
    ]
    server.state.refresh()
    if prologs:
        for node in ("n02", "n03"):
            assert _record(client, "prolog", 7, node)["ok"] is True
    wide = {**JOB, "tres_per_node": "gres:gpu:4", "min_nodes": 2, "max_nodes": 2}
    answer = client.request({"op": "decide", "job": wide})
    assert answer["action"] == "pass"
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(9, "PENDING", answer["set"]["admin_comment"]))
    server.state.refresh()
    first = _record(client, "epilog", 7, "n02")
    second = _record(client, "epilog", 7, "n03")
    if one_round:
        assert first["replan"]["applied"] == [9] and "replan" not in second
    else:
        assert first["replan"]["applied"] == [] and second["replan"]["applied"] == [9]
    (update,) = recorder.updates
    assert update.fields["req_nodes"] == "n[02-03]"  # type: ignore[attr-defined]
