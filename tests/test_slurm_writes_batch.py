"""The batched scontrol applier's bookkeeping on stderr recorded from real scontrol runs (the
same rounds run against Slurm 22.05 and 24.11 in tests/slurm/test_slurm_writes.py): which
job each error line belongs to, which steps may go through stdin, and the fallback when a
line names no job."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from slurm_pal.adapters.slurm.update import JobChange, ScontrolBatchApplier, stdin_safe

HELD = "gres:gpu:ta:1"

# What scontrol printed on stderr for such rounds (22.05.8; 24.11.5 prints the same lines).
NOT_PENDING = "Job is no longer pending execution for job 2"
UNKNOWN = "scontrol: error: Could not load state information for job 99: Invalid job id specified"
REFUSED_LINE = "Update of this parameter is not supported: Bogus=1\nRequest aborted"


class Recorded(ScontrolBatchApplier):
    """Answers each scontrol start with recorded output instead of starting one."""

    def __init__(self, batch_stderr: list[str], failing: dict[str, str]) -> None:
        super().__init__({})
        self._release, self._release_read = None, True  # 22.05's rules
        self.batch_stderr, self.failing = list(batch_stderr), failing
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    def run_batch(self, steps: Sequence[Sequence[str]]) -> subprocess.CompletedProcess[str]:
        self.batches.append([" ".join(s) for s in steps])
        stderr = self.batch_stderr.pop(0) if self.batch_stderr else ""
        return subprocess.CompletedProcess(["scontrol"], 1 if stderr else 0, "", stderr)

    def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        line = " ".join(args)
        self.singles.append(line)
        job = args[1].split("=", 1)[1]
        if job in self.failing:
            return subprocess.CompletedProcess(args, 1, "", self.failing[job])
        return subprocess.CompletedProcess(args, 0, "", "")


def _changes() -> list[JobChange]:
    return [
        JobChange(1, {"req_nodes": "n2"}, HELD, 1),
        JobChange(2, {"req_nodes": "n2"}, HELD, 1),
        JobChange(3, {"req_nodes": "n1", "admin_comment": "slurm-pal/1 replan why=a b"}, HELD, 1),
        JobChange(4, {"req_nodes": "n1", "exc_nodes": ""}, HELD, 1, lift_exclusion_to=""),
        JobChange(99, {"req_nodes": "n2"}, HELD, 1),
    ]


def test_each_error_line_goes_to_the_job_it_names() -> None:
    applier = Recorded([f"{NOT_PENDING}\n{UNKNOWN}\n"], {})
    errors = applier.apply_many(_changes())
    assert errors[0] is None and errors[2] is None and errors[3] is None
    assert errors[1] == f"scontrol update JobId=2 ReqNodeList=n2: {NOT_PENDING}"
    assert errors[4] is not None and "job 99" in errors[4]
    # first steps of 1, 2, 4 (its exclusion lifted first) and 99 together; the comment alone
    assert applier.batches[0] == [
        "update JobId=1 ReqNodeList=n2",
        "update JobId=2 ReqNodeList=n2",
        "update JobId=4 ExcNodeList=",
        "update JobId=99 ReqNodeList=n2",
    ]
    assert applier.singles == [
        "update JobId=3 ReqNodeList=n1 AdminComment=slurm-pal/1 replan why=a b"
    ]
    # the second round holds only job 4's second step (1, 2, 99 had one step)
    assert applier.batches[1] == ["update JobId=4 ExcNodeList= ReqNodeList=n1"]


def test_a_job_whose_first_step_failed_gets_no_second_step() -> None:
    applier = Recorded(["Invalid job id specified for job 4\n"], {})
    errors = applier.apply_many([_changes()[3]])
    assert errors[0] is not None and "job 4" in errors[0]
    assert len(applier.batches) == 1


def test_a_line_naming_no_job_makes_the_batch_go_job_by_job() -> None:
    applier = Recorded([REFUSED_LINE], {"2": "Update of this parameter is not supported"})
    errors = applier.apply_many(_changes()[:2])
    assert errors[0] is None
    assert errors[1] is not None and "not supported" in errors[1]
    assert applier.singles == ["update JobId=1 ReqNodeList=n2", "update JobId=2 ReqNodeList=n2"]


def test_a_failed_batch_with_no_error_lines_is_redone_job_by_job() -> None:
    class Silent(Recorded):
        def run_batch(self, steps):  # type: ignore[no-untyped-def]
            super().run_batch(steps)
            return subprocess.CompletedProcess(["scontrol"], 1, "", "")

    applier = Silent([], {})
    assert applier.apply_many(_changes()[:2]) == [None, None]
    assert len(applier.singles) == 2


def test_stdin_takes_no_value_with_blanks_or_quotes() -> None:
    assert stdin_safe(["update", "JobId=1", "ReqNodeList=n[1-2]", "ExcNodeList="])
    assert not stdin_safe(["update", "JobId=1", "AdminComment=a b"])
    assert not stdin_safe(["update", "JobId=1", 'AdminComment="a"'])
    assert not stdin_safe(["update", "JobId=1", "AdminComment=it's"])
