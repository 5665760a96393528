"""The batched scontrol applier's bookkeeping on stderr recorded from real scontrol runs (the
same rounds run against Slurm 22.05 and 24.11 in tests/slurm/test_slurm_writes.py): which
job each error line belongs to, which steps may go through stdin, and the fallback when a
line names no job."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from slurm_pal.adapters.slurm.update import (
    JobChange,
    ScontrolBatchApplier,
    stdin_line,
    stdin_safe,
)
from slurm_pal.engine.decide import parse_admin_comment

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
        self.batches.append([str(stdin_line(s)) for s in steps])
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
    # first steps of all five together (4's exclusion lifted first), the comment in quotes
    assert applier.batches[0] == [
        "update JobId=1 ReqNodeList=n2",
        "update JobId=2 ReqNodeList=n2",
        'update JobId=3 ReqNodeList=n1 AdminComment="slurm-pal/1 replan why=a b"',
        "update JobId=4 ExcNodeList=",
        "update JobId=99 ReqNodeList=n2",
    ]
    assert applier.singles == []
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


def test_an_admin_comment_goes_through_stdin_last_and_in_quotes() -> None:
    """scontrol's tokenizer takes a word to the line's end once a quote opens: the comment
    goes last, whatever quotes it holds; anything else with blanks takes a process."""
    comment = 'AdminComment=slurm-pal/1 route why=packing\'s "own" pick'
    step = ["update", "JobId=7", comment, "StartTime=now"]
    assert stdin_line(step) == (
        'update JobId=7 StartTime=now AdminComment="slurm-pal/1 route why=packing\'s "own" pick"'
    )
    assert stdin_line(["update", "JobId=7", "AdminComment=plain"]) == (
        "update JobId=7 AdminComment=plain"
    )
    assert stdin_line(["update", "JobId=7", "AdminComment=a\nb"]) is None
    assert stdin_line(["update", "JobId=7", "ReqNodeList=a b", "AdminComment=x y"]) is None
    assert stdin_line(["update", "JobId=7", "AdminComment=x y", "AdminComment=z"]) is None


def test_a_comment_stored_in_quotes_reads_as_written() -> None:
    text = 'slurm-pal/1 wait r=ab12 since=10 until=20 why=packing\'s "own" pick'
    assert parse_admin_comment(f'"{text}"') == parse_admin_comment(text)
    assert parse_admin_comment(text)["why"] == 'packing\'s "own" pick'  # type: ignore[index]
    assert parse_admin_comment('"someone else\'s comment"') is None
    assert parse_admin_comment('"') is None
    # cut short at its first key by `scontrol show job`: read as the unquoted one is
    assert parse_admin_comment('"slurm-pal/1 wait') == parse_admin_comment("slurm-pal/1 wait")


def test_a_large_round_goes_through_processes_side_by_side_in_its_order() -> None:
    """Up to ``workers`` scontrol processes, each at least MIN_BATCH steps, dealt out in the
    round's order (the first jobs first in every process); every job's answer its own."""

    class Refusing(Recorded):  # scontrol's answer for job 7, whichever process writes it
        def run_batch(self, steps):  # type: ignore[no-untyped-def]
            super().run_batch(steps)
            named = any(step[1] == "JobId=7" for step in steps)
            bad = "Invalid job id specified for job 7\n" if named else ""
            return subprocess.CompletedProcess(["scontrol"], 1 if bad else 0, "", bad)

    changes = [JobChange(job, {"req_nodes": "n2"}, HELD, 1) for job in range(1, 21)]
    applier = Refusing([], {})
    applier.workers = 3
    errors = applier.apply_many(changes)
    assert sorted(len(b) for b in applier.batches) == [6, 7, 7]  # 20 // 4 = 5 > 3 workers
    first = min(applier.batches, key=lambda b: b[0].split()[1] != "JobId=1")
    assert [line.split()[1] for line in first] == [f"JobId={j}" for j in range(1, 21, 3)]
    assert [i + 1 for i, e in enumerate(errors) if e is not None] == [7]
    assert sorted(line for b in applier.batches for line in b) == sorted(
        f"update JobId={j} ReqNodeList=n2" for j in range(1, 21)
    )
