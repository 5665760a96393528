"""Which Slurm release the command-line tools belong to, and what differs between releases.

Why here: slurm-pal is tested on 22.05 (Debian 12) and 24.11 (Debian 13), and a few things the
adapter and the round's prediction depend on the release (which command lists nodes as JSON,
whether ``scontrol update`` of a typed GRES request replaces or merges, how backfill plans a
job past its limit). Those choices live in this module's :class:`SlurmRelease`; the advisor
core never branches on a version. An unknown release (the version could not be read) gets
22.05's behaviour, the oldest and most restrictive one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_VERSION = re.compile(r"\bslurm(?:-wlm)?\s+(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class SlurmRelease:
    """A Slurm release (``24.11.5`` -> major 24, minor 11, micro 5)."""

    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def series(self) -> str:
        return f"{self.major}.{self.minor:02d}"

    @property
    def scontrol_json(self) -> bool:
        """``scontrol show nodes --json`` exists (23.02 and later): one record per node.
        22.05 only has ``sinfo --json``; from 23.11 on that one groups nodes like sinfo's
        table does, so it is not used for per-node state."""
        return (self.major, self.minor) >= (23, 2)

    @property
    def squeue_json_filters(self) -> bool:
        """``squeue --json`` honours its filters (24.11; so ended jobs need ``--states=all``).
        22.05 ignores them and always lists every job slurmctld knows, ended ones too."""
        return (self.major, self.minor) >= (23, 2)

    @property
    def tres_prefix(self) -> str:
        """How a GRES entry of a TRES request is stored and must be written in job_submit.lua:
        ``gres:gpu:T:n`` on 22.05, ``gres/gpu:T:n`` on 24.11 (both checked: each refuses the
        other's at submit). Releases in between are untested and taken as 24.11."""
        return "gres/" if (self.major, self.minor) >= (23, 2) else "gres:"

    @property
    def typed_gres_update_replaces(self) -> bool:
        """``scontrol update TresPerNode=...`` replaces a pending job's GPU request, types
        included (checked on 24.11: ``binA:2 -> binB:2`` runs on 2 binB GPUs, typed -> untyped
        and untyped -> typed in one update are accepted). 22.05 merges the new typed entries
        into the old ones and refuses typed <-> untyped changes (testbed/NOTES.md)."""
        return (self.major, self.minor) >= (24, 11)

    @property
    def backfill_drops_jobs_past_limit(self) -> bool:
        """The backfill planner counts a running job already past its time limit as gone, so
        it plans the queue's head now and backfills nothing beside such a job, whatever
        ``OverTimeLimit`` says (24.11 on: cons_tres ``_build_cr_job_list`` drops a job whose
        end is before the planned start, upstream commit 4107be4f80; measured on 24.11.5 by
        tests/slurm/test_overtime_backfill.py). Earlier releases guess its end
        (``_guess_job_end``): a second from now, or a whole limit from now where
        ``OverTimeLimit=UNLIMITED`` (22.05.8 measured; 23.02-24.05 have the same code)."""
        return (self.major, self.minor) >= (24, 11)


OLDEST = SlurmRelease(22, 5, 0)  # what an unreadable version is treated as


def parse_release(text: str) -> SlurmRelease | None:
    """``slurm-wlm 24.11.5`` / ``slurm 22.05.8`` (``--version`` output) -> release, or None."""
    m = _VERSION.search(text or "")
    if m is None:
        return None
    return SlurmRelease(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def detect_release(run: Callable[[Sequence[str]], str]) -> SlurmRelease | None:
    """The release of the ``scontrol`` that ``run`` starts (``scontrol --version`` reads only
    the local binary, it does not ask slurmctld); None when it cannot be run or read."""
    try:
        return parse_release(run(["scontrol", "--version"]))
    except (OSError, RuntimeError):
        return None
