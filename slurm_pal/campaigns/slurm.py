"""The two Slurm calls a campaign needs: submit a job array, list what is still queued.

A deliberately small seam (:class:`CampaignSlurm`) so the testbed's Slurm adapter can replace
it later; this implementation runs ``sbatch`` and ``squeue`` (found on PATH, or named) and
filters on the client, as Slurm 22.05's ``--json`` output ignores filters.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from slurm_pal.errors import SlurmPalError


class SlurmError(SlurmPalError, RuntimeError):
    """A Slurm command that failed; the message holds its stderr."""


class CampaignSlurm(Protocol):
    def submit(self, script: Path, *, array: str, cwd: Path) -> str:
        """Submit ``script`` as a job array over ``array``; return the job id."""
        ...

    def queued(self, job_names: Iterable[str]) -> Mapping[str, tuple[str, str]]:
        """``jobid_taskid`` -> (state, reason) for tasks of these jobs still in the queue."""
        ...

    def node_states(self, nodes: Iterable[str]) -> Mapping[str, str]:
        """Node -> Slurm's long state (``idle``, ``drained``, ``down*``...) for these nodes."""
        ...


class SlurmCommands:
    """:class:`CampaignSlurm` through the Slurm command-line tools."""

    def __init__(
        self,
        sbatch: str = "sbatch",
        squeue: str = "squeue",
        timeout_s: float = 60,
        sinfo: str = "sinfo",
    ):
        self.sbatch = sbatch
        self.squeue = squeue
        self.sinfo = sinfo
        self.timeout_s = timeout_s

    def _run(self, args: list[str], cwd: Path | None = None) -> str:
        try:
            proc = subprocess.run(
                args, cwd=cwd, capture_output=True, text=True, timeout=self.timeout_s
            )
        except FileNotFoundError as exc:
            raise SlurmError(
                f"{args[0]} not found: run this on a Slurm login or controller node"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{args[0]} did not answer within {self.timeout_s:g} s") from exc
        if proc.returncode != 0:
            raise SlurmError(
                f"{' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def submit(self, script: Path, *, array: str, cwd: Path) -> str:
        out = self._run([self.sbatch, "--parsable", f"--array={array}", str(script)], cwd=cwd)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r}, expected a job id")
        return job_id

    def queued(self, job_names: Iterable[str]) -> dict[str, tuple[str, str]]:
        names = sorted(set(job_names))
        if not names:
            return {}
        out = self._run(
            [self.squeue, "--noheader", "--array", f"--name={','.join(names)}", "--format=%i|%T|%r"]
        )
        found: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                found[parts[0]] = (parts[1], parts[2])
        return found

    def node_states(self, nodes: Iterable[str]) -> dict[str, str]:
        names = sorted(set(nodes))
        if not names:
            return {}
        out = self._run([self.sinfo, "--noheader", "--Node", f"--nodes={','.join(names)}",
                         "--format=%N|%T"])  # fmt: skip
        found: dict[str, str] = {}
        for line in out.splitlines():
            node, sep, node_state = line.strip().partition("|")
            if sep and node in names:
                found[node] = node_state.strip()
        return found
