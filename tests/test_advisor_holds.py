"""A held job's bound, as the service acts on it (the service on a real Unix socket and store,
Slurm fed from captured JSON): once the bound has come, one round places the job wherever it
fits and lifts its hold in the same update, as the simulator starts it at its bound, instead of
leaving it to Slurm's next scheduling pass after its begin time."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from slurm_pal.adapters.slurm.update import scontrol_steps
from slurm_pal.advisor.server import AdvisorServer
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.engine.decide import format_admin_comment
from tests.helpers.advisor import JOB, FakeJob, RecordingApplier, make_env, wait_saved


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_held_job_gets_one_round_when_its_bound_comes_and_is_routed_with_its_hold_lifted() -> (
    None
):
    root = Path(tempfile.mkdtemp(prefix="spal-hold-", dir="/tmp"))
    root.chmod(0o755)
    env = make_env(root, policy="packed-pm")
    wall = WallClock(1_800_000_000.0)
    state: AdvisorState = env.state(wall_clock=wall)
    server = AdvisorServer(state, root / "adv.sock", refresh_s=3600, replan_s=0)
    server.applier = recorder = RecordingApplier()
    server.start()
    try:
        token = "held1"
        since, until = wall.now - 3000, wall.now + 600
        comment = format_admin_comment(
            version="0.1.0",
            action="wait",
            token=token,
            job_class="A",
            since=since,
            until=until,
            why="held for other GPUs",
        )
        job = {**JOB, "tres_per_node": "gres:gpu:1", "time_limit": 600}
        answer = {"v": 1, "ok": True, "action": "wait", "set": {}, "token": token, "class": "A"}
        state.writer.submit(lambda s: s.save_decision(token, job, answer, state="waiting")).result(
            timeout=30
        )
        wait_saved(env, token)
        env.slurm.jobs = [
            FakeJob(7, "PENDING", admin_comment=comment, reason="BeginTime", priority=500)
        ]
        state.refresh()
        (pending,) = state.view.pending  # type: ignore[union-attr]
        assert pending.waiting == (since, until)  # held by us: planned despite BeginTime
        server.rounds.round_for_due_holds()
        assert recorder.updates == []  # its bound has not come
        wall.now = until + 1
        server.rounds.round_for_due_holds()
        (change,) = recorder.updates
        assert change.job_id == 7 and change.fields["begin_time"] == 0  # type: ignore[attr-defined]
        assert scontrol_steps(change)[-1][-1] == "StartTime=now"  # type: ignore[arg-type]
        server.rounds.round_for_due_holds()
        assert len(recorder.updates) == 1  # once per job
    finally:
        server.stop()
        env.close()
        shutil.rmtree(root, ignore_errors=True)
