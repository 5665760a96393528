"""Slurm's client commands against a testbed: run one, read nodes and jobs, submit, wait.

Why apart from the daemons: the tests, the benchmarks and ``testbed run`` use a started
testbed through these few calls only; a multi-host testbed runs the same commands on its
controller host (it overrides :meth:`SlurmCommands.run` alone).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

from slurm_pal.adapters.slurm.parse import parse_key_values
from slurm_pal.testbed.layout import TestbedLayout
from slurm_pal.testbed.spec import TestbedError

TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)


class SlurmCommands(TestbedLayout):
    """Client commands of :class:`~slurm_pal.testbed.cluster.LocalSlurm` (SLURM_CONF set)."""

    def run(
        self, args: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (SLURM_CONF set)."""
        try:
            proc = subprocess.run(
                list(args),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=self.root,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"{' '.join(args)} did not finish within {timeout_s:g} s") from exc
        except FileNotFoundError as exc:
            raise TestbedError(
                f"{args[0]} not found; install Slurm with scripts/install-slurm.sh"
            ) from exc
        if check and proc.returncode != 0:
            raise TestbedError(
                f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
            )
        return proc

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo's long state (``idle``, ``mixed``, ``allocated``, ``down*``...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=10).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def submit(self, *args: str) -> int:
        """``sbatch --parsable ARGS`` -> job id (output files default to the testbed's jobs/)."""
        jobs = self.root / "jobs"
        jobs.mkdir(exist_ok=True)
        opts = list(args)
        if not any(a.startswith(("-o", "--output")) for a in opts):
            opts = ["-o", str(jobs / "%j.out"), *opts]
        out = self.run(["sbatch", "--parsable", *opts]).stdout.strip()
        try:
            return int(out.split(";")[0])
        except ValueError as exc:
            raise TestbedError(f"sbatch printed {out!r}, not a job id") from exc

    def job_fields(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o -d ID`` as a dict (known for MinJobAge after it ends)."""
        out = self.run(["scontrol", "show", "job", "-o", "-d", str(job_id)], timeout_s=10).stdout
        return parse_key_values(out)

    def wait_job(self, job_id: int, timeout_s: float = 30.0, *, state: str | None = None) -> str:
        """Poll until the job reaches ``state`` (default: any end state); return its state."""
        deadline = time.monotonic() + timeout_s
        current = ""
        while time.monotonic() < deadline:
            current = self.job_fields(job_id).get("JobState", "")
            if (state is not None and current == state) or (
                state is None and current in TERMINAL_JOB_STATES
            ):
                return current
            if state is not None and current in TERMINAL_JOB_STATES:
                break
            time.sleep(0.2)
        raise TestbedError(
            f"job {job_id} is {current or 'unknown'} after {timeout_s:g} s, wanted "
            f"{state or 'an end state'}; fields: {self.job_fields(job_id)}"
        )
