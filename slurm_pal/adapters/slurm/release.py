"""Which Slurm release the command-line tools belong to, and what differs between releases.

Why here: slurm-pal is tested on 22.05 (Debian 12) and 24.11 (Debian 13), and a few things the
adapter does depend on the release (which command lists nodes as JSON, whether ``scontrol
update`` of a typed GRES request replaces or merges). Those choices live in this module's
:class:`SlurmRelease`; the advisor core never branches on a version. An unknown release (the
version could not be read) gets 22.05's behaviour, the oldest and most restrictive one.
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
