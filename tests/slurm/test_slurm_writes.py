"""A re-planning round's writes against a real Slurm: the batched applier (one ``scontrol``
reading many updates from stdin) must leave Slurm exactly as the one-process-per-step applier
does, and give every job its own answer, also when some jobs started before the round."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_pal.adapters.slurm import update
from slurm_pal.adapters.slurm.pyslurm_backend import choose_backend, running_release
from slurm_pal.adapters.slurm.state import CliStateReader, JobState
from slurm_pal.adapters.slurm.update import JobChange, ScontrolApplier, ScontrolBatchApplier
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.testbed import LocalSlurm, NodeSpec

pytestmark = pytest.mark.slurm

HELD = "gres:gpu:ta:1"


class CountingBatchApplier(ScontrolBatchApplier):
    """The real batched applier, counting the scontrol processes it starts."""

    def __init__(self, env) -> None:  # type: ignore[no-untyped-def]
        super().__init__(env)
        self.batches: list[int] = []
        self.singles = 0

    def run_batch(self, steps):  # type: ignore[no-untyped-def]
        self.batches.append(len(steps))
        return super().run_batch(steps)

    def run(self, args):  # type: ignore[no-untyped-def]
        self.singles += 1
        return super().run(args)


@pytest.fixture
def busy_lab(testbed_root: Path) -> Iterator[tuple[LocalSlurm, list[int], list[int]]]:
    """Two nodes of two ``ta`` GPUs, all four held by running jobs; six GPU jobs pending."""
    nodes = [NodeSpec("n1", ("ta", "ta")), NodeSpec("n2", ("ta", "ta"))]
    tb = LocalSlurm(testbed_root, nodes)
    tb.start()
    running = [
        tb.submit("--gres=gpu:ta:1", "-w", node, "--wrap", "sleep 600")
        for node in ("n1", "n1", "n2", "n2")
    ]
    for job in running:
        tb.wait_job(job, 30, state="RUNNING")
    pending = [tb.submit("--gres=gpu:ta:1", "-x", "n1", "--wrap", "sleep 600") for _ in range(6)]
    yield tb, running, pending


def _jobs(tb: LocalSlurm) -> dict[int, JobState]:
    return {j.job_id: j for j in CliStateReader(tb.env).jobs()}


def _round(running: list[int], pending: list[int], tag: str) -> list[JobChange]:
    """A round as the re-planner writes it: placement changes, one with the advisor's admin
    comment (blanks), one that first lifts an exclusion; two jobs that started meanwhile and
    one that Slurm no longer knows."""
    p = pending
    return [
        JobChange(p[0], {"req_nodes": "n2", "tres_per_node": HELD}, HELD, 1),
        JobChange(running[0], {"tres_per_node": "gres:gpu:ta:2"}, HELD, 2),
        JobChange(p[1], {"req_nodes": "n1", "exc_nodes": ""}, HELD, 1, lift_exclusion_to=""),
        JobChange(
            p[2],
            {
                "req_nodes": "n2",
                "admin_comment": f'slurm-pal/test {tag} why=a reason with blank\'s and "quotes"',
            },
            HELD,
            1,
        ),
        JobChange(running[2], {"req_nodes": "n1"}, HELD, 1),
        JobChange(p[3], {"req_nodes": "n2", "tres_per_node": "gres:gpu:ta:1"}, HELD, 1),
        JobChange(999_999, {"req_nodes": "n2"}, HELD, 1),
    ]


def _check(tb: LocalSlurm, running, pending, errors, tag) -> None:  # type: ignore[no-untyped-def]
    jobs = _jobs(tb)
    by_job = dict(zip([c.job_id for c in _round(running, pending, tag)], errors, strict=True))
    for job in (pending[0], pending[1], pending[2], pending[3]):
        assert by_job[job] is None, (job, by_job[job])
    for job in (running[0], running[2], 999_999):
        assert by_job[job] is not None and str(job) in by_job[job], (job, by_job[job])
    assert "pending" in by_job[running[0]].lower(), by_job[running[0]]  # started: not pending
    assert jobs[pending[0]].required_nodes == ("n2",)
    assert jobs[pending[1]].required_nodes == ("n1",)  # reachable: its exclusion was lifted
    assert tb.job_fields(pending[1]).get("ExcNodeList") == "(null)"
    comment = f'slurm-pal/test {tag} why=a reason with blank\'s and "quotes"'
    # through scontrol's stdin the comment is stored in the quotes it was written in
    assert jobs[pending[2]].admin_comment in (comment, f'"{comment}"')
    assert parse_admin_comment(jobs[pending[2]].admin_comment) == parse_admin_comment(comment)
    assert jobs[pending[3]].required_nodes == ("n2",)
    assert jobs[pending[4]].required_nodes == ()  # not in the round: untouched
    for job in running:
        assert jobs[job].state == "RUNNING" and jobs[job].required_nodes in ((), ("n1",), ("n2",))


def test_batched_round_matches_per_job_and_errors_stay_per_job(busy_lab) -> None:
    tb, running, pending = busy_lab
    required_before = {j: _jobs(tb)[j].required_nodes for j in running}

    batch = CountingBatchApplier(tb.env)
    errors = batch.apply_many(_round(running, pending, "batch"))
    _check(tb, running, pending, errors, "batch")
    # One scontrol for the first steps (the admin comment with blanks and quotes too), one
    # for the second step of the job whose exclusion was lifted first.
    assert batch.batches == [7, 1], batch.batches
    assert batch.singles == 0
    assert {j: _jobs(tb)[j].required_nodes for j in running} == required_before

    # The same round, one process per step: the same answers, job by job.
    per_job = ScontrolApplier(tb.env).apply_many(_round(running, pending, "single"))
    assert [e is None for e in per_job] == [e is None for e in errors]
    _check(tb, running, pending, per_job, "single")


def test_a_line_scontrol_refuses_makes_the_batch_answer_job_by_job(busy_lab, monkeypatch) -> None:
    """A line scontrol refuses without naming a job (an unknown keyword, as a release that
    dropped a field would print): no job's error may be guessed, so the batch is redone one
    job at a time and only the broken one fails."""
    tb, _running, pending = busy_lab
    applier = CountingBatchApplier(tb.env)
    changes = [JobChange(j, {"req_nodes": "n2"}, HELD, 1) for j in pending[:3]]
    bad = JobChange(pending[3], {"req_nodes": "n2", "Bogus": "1"}, HELD, 1)
    monkeypatch.setitem(update._KEYS, "Bogus", "Bogus")  # a keyword this Slurm does not know
    errors = applier.apply_many([*changes, bad])
    assert errors[:3] == [None, None, None]
    assert errors[3] is not None and "Bogus" in errors[3]
    assert applier.batches == [4] and applier.singles == 4
    jobs = _jobs(tb)
    assert [jobs[j].required_nodes for j in pending[:3]] == [("n2",)] * 3


def test_auto_reads_the_running_release_from_this_slurms_scontrol(busy_lab) -> None:
    """``auto`` compares pyslurm's version with what this Slurm's ``scontrol --version`` says
    (the module stands in for pyslurm, which no Debian Slurm has a build of)."""
    tb = busy_lab[0]
    release = running_release(tb.env)
    assert release is not None
    printed = tb.run(["scontrol", "--version"]).stdout
    assert release.series in printed
    same = SimpleNamespace(__version__=f"{release.series}.0")
    other = SimpleNamespace(__version__="25.11.2" if release.series != "25.11" else "24.11.0")
    assert choose_backend("auto", tb.env, import_pyslurm=lambda: same).name == "pyslurm"  # type: ignore[arg-type,return-value]
    chosen = choose_backend("auto", tb.env, import_pyslurm=lambda: other)  # type: ignore[arg-type,return-value]
    assert chosen.name == "cli" and f"this is Slurm {release}" in chosen.why
