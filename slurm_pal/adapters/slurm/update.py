"""Writing to Slurm: the ``scontrol update`` steps that carry a pending job to a new request
(testbed findings, PROTOCOL.md "Reservations and re-planning", testbed/NOTES.md). Which changes
Slurm 22.05 refuses or mishandles, and the change itself, are pure rules the planner uses too:
:mod:`slurm_pal.core.jobchange` (re-exported here). The advisor plans; this module talks.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from slurm_pal.adapters.slurm.release import SlurmRelease, detect_release
from slurm_pal.core.jobchange import JobChange, gpu_types, transition_problem
from slurm_pal.core.jobchange import is_gpu_typed as _is_gpu_typed

__all__ = [
    "JobApplier",
    "JobChange",
    "ScontrolApplier",
    "ScontrolBatchApplier",
    "gpu_types",
    "scontrol_steps",
    "transition_problem",
]


_KEYS = {
    "exc_nodes": "ExcNodeList",
    "req_nodes": "ReqNodeList",
    "tres_per_node": "TresPerNode",
    "tres_per_job": "TresPerJob",
    "admin_comment": "AdminComment",
}


def start_time_text(epoch: object) -> str:
    """``StartTime=`` for a ``begin_time`` field: ``now`` for 0 (lift the hold), else the
    controller's local time (scontrol reads no epoch seconds)."""
    seconds = int(epoch)  # type: ignore[call-overload]
    if seconds <= 0:
        return "now"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def scontrol_steps(change: JobChange, release: SlurmRelease | None = None) -> list[list[str]]:
    """The ``scontrol update`` argument lists for one update, in order (testbed findings in
    PROTOCOL.md "Reservations and re-planning"): Slurm 22.05 refuses to turn an untyped GPU
    request into a typed one in one update ("Invalid GRES specification (with and without type
    identification)"), so such a job first moves its GPU count to an untyped per-job request
    (the count is never dropped, so the job can not start without GPUs), then gets the typed one.
    """
    fields = change.fields
    head = ["update", f"JobId={change.job_id}"]
    final: list[str] = []
    for key, name in _KEYS.items():
        if key in fields:
            final.append(f"{name}={fields[key]}")
    low, high = fields.get("min_nodes"), fields.get("max_nodes")
    if low is not None:
        final.append(f"NumNodes={low}-{high}" if high not in (None, low) else f"NumNodes={low}")
    if "begin_time" in fields:
        # Last, in the last update: a held job routed now gets its GPUs in the same update
        # that lifts its hold, never before.
        final.append(f"StartTime={start_time_text(fields['begin_time'])}")
    steps: list[list[str]] = []
    if change.lift_exclusion_to is not None:
        # Lift the advisor's exclusion first: the chosen nodes may be among the excluded ones.
        steps.append([*head, f"ExcNodeList={change.lift_exclusion_to}"])
    now = change.held_tres
    new_typed = any(
        _is_gpu_typed(str(fields.get(k, ""))) for k in ("tres_per_node", "tres_per_job")
    )
    if transition_problem(change, release) is not None:
        return []
    if release is not None and release.typed_gres_update_replaces:
        new_typed = False  # one update does it (24.11)
    if change.only_exclusion:
        return [*steps, [*head, *final]]
    if new_typed and now and not _is_gpu_typed(now):
        count = change.n_gpus or 1
        steps.append([*head, "TresPerNode=", f"TresPerJob=gres:gpu:{count}"])
        if "tres_per_job" not in fields:
            final.insert(0, "TresPerJob=")
    steps.append([*head, *final])
    return steps


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class JobApplier(Protocol):
    """Writes a re-planning round's changes to Slurm; each job's error (None: applied)."""

    def apply(self, change: JobChange) -> str | None: ...

    def apply_many(self, changes: Sequence[JobChange]) -> list[str | None]: ...


class ScontrolApplier:
    """Applies updates with one ``scontrol`` process per step (SLURM_CONF from ``env``); one
    failed job does not stop the others. A round's jobs run ``workers`` at a time: each is a
    process and an RPC that slurmctld serializes only inside."""

    def __init__(
        self, env: Mapping[str, str] | None = None, timeout_s: float = 10.0, workers: int = 8
    ) -> None:
        self.env = None if env is None else dict(env)
        self.timeout_s = timeout_s
        self.workers = workers

    def apply_many(self, changes: Sequence[JobChange]) -> list[str | None]:
        """Each change's error (None: applied), in order; started in the given order."""
        if len(changes) > 1 and self.workers > 1:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(changes))) as pool:
                return list(pool.map(self.apply, changes))
        return [self.apply(change) for change in changes]

    def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["scontrol", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    _release: SlurmRelease | None = None
    _release_read = False

    @property
    def release(self) -> SlurmRelease | None:
        """The release of the scontrol this applier runs, read once (``scontrol --version``,
        local); None when unreadable, which gets 22.05's rules."""
        if not self._release_read:
            self._release = detect_release(self._version)
            self._release_read = True
        return self._release

    def _version(self, args: Sequence[str]) -> str:
        proc = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=self.timeout_s
        )
        return proc.stdout

    def apply(self, change: JobChange) -> str | None:
        """Run the steps; None on success, else the error text."""
        problem = transition_problem(change, self.release)
        if problem is not None:
            return problem
        for step in scontrol_steps(change, self.release):
            error = self.apply_step(step)
            if error is not None:
                return error
        return None

    def apply_step(self, step: Sequence[str]) -> str | None:
        """One ``scontrol`` argument list; None on success, else the error text."""
        try:
            proc = self.run(step)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"scontrol {' '.join(step)}: {exc}"
        if proc.returncode != 0:
            return f"scontrol {' '.join(step)}: {proc.stderr.strip() or proc.returncode}"
        return None


# scontrol reading commands from stdin names the job in every update error it prints, e.g.
# "Job is no longer pending execution for job 12", "scontrol: error: Could not load state
# information for job 99: Invalid job id specified" (22.05.8 and 24.11.5, on the testbed).
_JOB_ERROR = re.compile(r"\bfor job (?P<job>\d+)\b")


def stdin_safe(step: Sequence[str]) -> bool:
    """Can this step go through scontrol's stdin as it is? Its tokenizer splits on blanks
    and keeps quotes in the value (``AdminComment="a b"`` is stored with the quotes: 22.05.8
    and 24.11.5, on the testbed), so a value with a blank or a quote cannot be written
    exactly that way (but see :func:`stdin_line`)."""
    return not any(_unsafe(word) for word in step)


def _unsafe(word: str) -> bool:
    return any(c.isspace() or c in "\"'" for c in word)


_COMMENT = "AdminComment="


def stdin_line(step: Sequence[str]) -> str | None:
    """The line that writes ``step`` through scontrol's stdin, or None when none can.

    An admin comment with blanks goes last on the line, in double quotes: the tokenizer
    takes a word to the line's end once a quote opens, and Slurm keeps the quotes, so the
    stored comment is the text in one pair of double quotes, whatever quotes it holds
    (22.05.8 and 24.11.5, squeue's JSON and ``-O`` alike;
    :func:`~slurm_pal.engine.decide.parse_admin_comment` reads it). Any other word with a
    blank or a quote, or a comment over one line, cannot go through stdin."""
    if stdin_safe(step):
        return " ".join(step)
    comments = [w for w in step if w.startswith(_COMMENT)]
    rest = [w for w in step if not w.startswith(_COMMENT)]
    if len(comments) != 1 or any(_unsafe(w) for w in rest):
        return None
    text = comments[0][len(_COMMENT) :]
    if any(c in "\r\n" for c in text):
        return None
    return " ".join([*rest, f'{_COMMENT}"{text}"'])


#: The fewest steps one scontrol process of a batch gets: below that, a process costs more
#: than the RPCs it writes.
MIN_BATCH = 4


class ScontrolBatchApplier(ScontrolApplier):
    """Applies a round's updates through ``scontrol`` processes reading them from stdin (up to
    ``workers`` side by side, each its share in the round's order, at least
    :data:`MIN_BATCH` steps each: a configuration load and credential cache per process,
    instead of one per job), step by step: a job's second step goes in a later process, and
    only if its first step was applied.

    Errors: scontrol prints each failed update's error with its job id; a line that names no
    job (scontrol refusing the line itself) makes this applier redo the jobs of that process
    one by one, so every job's error is still its own. Steps that cannot pass the stdin
    tokenizer (:func:`stdin_line`: a value with blanks other than the admin comment's) run
    one process each, as :class:`ScontrolApplier` does."""

    def run_batch(self, steps: Sequence[Sequence[str]]) -> subprocess.CompletedProcess[str]:
        script = "".join(f"{stdin_line(step)}\n" for step in steps)
        return subprocess.run(
            ["scontrol"],
            input=script,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s + 0.05 * len(steps),
            check=False,
        )

    def apply_many(self, changes: Sequence[JobChange]) -> list[str | None]:
        release = self.release
        errors: list[str | None] = [transition_problem(c, release) for c in changes]
        plans = [
            scontrol_steps(c, release) if e is None else []
            for c, e in zip(changes, errors, strict=True)
        ]
        depth = 0
        while True:
            todo = [i for i, plan in enumerate(plans) if errors[i] is None and depth < len(plan)]
            if not todo:
                return errors
            through_stdin = [stdin_line(plans[i][depth]) is not None for i in todo]
            batch = [i for i, ok in zip(todo, through_stdin, strict=True) if ok]
            single = [i for i, ok in zip(todo, through_stdin, strict=True) if not ok]
            if batch:
                self._batch_steps(batch, [plans[i][depth] for i in batch], errors)
            if single:
                steps = [plans[i][depth] for i in single]
                with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(steps)))) as pool:
                    results = list(pool.map(self.apply_step, steps))
                for i, error in zip(single, results, strict=True):
                    errors[i] = error
            depth += 1

    def _batch_steps(
        self, index: Sequence[int], steps: Sequence[Sequence[str]], errors: list[str | None]
    ) -> None:
        """The steps through up to ``workers`` scontrol processes side by side, in order
        within each (a job's steps are never split: one step of each job per call). Why side
        by side: slurmctld answers its clients' RPCs in turn, so on a busy controller one
        process writing a round waits behind every other client at each update, where an
        Epilog waits for the round."""
        chunks = max(1, min(self.workers, len(steps) // MIN_BATCH))
        if chunks == 1:
            self._batch_step(index, steps, errors)
            return
        with ThreadPoolExecutor(max_workers=chunks) as pool:
            list(
                pool.map(
                    lambda k: self._batch_step(index[k::chunks], steps[k::chunks], errors),
                    range(chunks),
                )
            )

    def _batch_step(
        self, index: Sequence[int], steps: Sequence[Sequence[str]], errors: list[str | None]
    ) -> None:
        try:
            proc = self.run_batch(steps)
        except (OSError, subprocess.TimeoutExpired) as exc:
            for i, step in zip(index, steps, strict=True):
                errors[i] = f"scontrol {' '.join(step)}: {exc}"
            return
        by_job = {int(_job_of(step)): (i, step) for i, step in zip(index, steps, strict=True)}
        unattributed = False
        for line in proc.stderr.splitlines():
            m = _JOB_ERROR.search(line)
            if m and int(m["job"]) in by_job:
                i, step = by_job[int(m["job"])]
                errors[i] = f"scontrol {' '.join(step)}: {line.strip()}"
            elif line.strip():
                unattributed = True
        if unattributed or (proc.returncode != 0 and all(errors[i] is None for i in index)):
            # Which line failed is not known: redo them one by one (an update sets values, so
            # applying one again is harmless) and keep each job's own answer.
            for i, step in zip(index, steps, strict=True):
                errors[i] = self.apply_step(step)


def _job_of(step: Sequence[str]) -> str:
    """The job id of an ``update JobId=N ...`` step."""
    return step[1].split("=", 1)[1]
