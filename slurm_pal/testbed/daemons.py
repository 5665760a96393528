"""Starting and stopping a testbed's daemons, and finding every process that is its own.

Why: a testbed shares its machine with other testbeds and the user's own Slurm, so it signals
only the processes named by its pid files whose command line still names its config or munge
socket (a reused pid is never killed), plus leftovers whose command line, environment or
working folder is its own; and a daemon that dies during start-up fails the start at once,
with its logs, instead of a timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from slurm_pal.testbed.commands import SlurmCommands
from slurm_pal.testbed.processes import (
    cwd_under,
    names_marker,
    process_state,
    program_name,
    read_pid,
    read_proc,
    running_with,
    send_signal,
    wait_gone,
)
from slurm_pal.testbed.spec import TestbedError


class SlurmDaemons(SlurmCommands):
    """slurmctld and slurmd of :class:`~slurm_pal.testbed.cluster.LocalSlurm`: spawn, wait,
    stop (munged is :class:`~slurm_pal.testbed.munge.MungeDaemon`'s)."""

    def pid_files(self) -> dict[str, Path]:
        """Daemon name -> pid file."""
        run = self.root / "run"
        files = {f"slurmd-{n.name}": run / f"slurmd-{n.name}.pid" for n in self.nodes}
        files["slurmctld"] = run / "slurmctld.pid"
        files["munged"] = run / "munge" / "munged.pid"
        return files

    def running(self) -> dict[str, int | None]:
        """Daemon name -> pid if it is running (our pid file and our command line), else None."""
        return {d: self._alive(d) for d in self.pid_files()}

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Cancel jobs, stop our daemons (SIGTERM, then SIGKILL), leave no stray process.

        Returns what was stopped, e.g. ``["slurmd-n01 (pid 123)", ...]``.
        """
        stopped: list[str] = []
        if self._alive("slurmctld") is not None:
            self._cancel_all_jobs(min(timeout_s, 5.0))
        # slurmctld first: stopped while it still talks to dying slurmd, it waits out the RPC
        # timeouts (MessageTimeout, 10 s). munged last: everyone authenticates through it.
        slurm_daemons = [d for d in self.pid_files() if d.startswith("slurmd-")]
        for group in (["slurmctld"], slurm_daemons, ["munged"]):
            pids = {d: p for d in group if (p := self._alive(d)) is not None}
            for name, pid in pids.items():
                send_signal(pid, signal.SIGTERM)
                stopped.append(f"{name} (pid {pid})")
            for pid in self._stray_pids() if group is slurm_daemons else ():
                # Orphans of a crashed node or step (srun even ignores SIGTERM): no grace.
                stopped.append(f"{program_name(pid)} (pid {pid})")
                send_signal(pid, signal.SIGKILL)
            left = wait_gone(pids.values(), timeout_s)
            if group is slurm_daemons:  # job processes orphaned while their steps went down
                left += [p for p in self._stray_pids() if p not in left]
            for pid in left:
                send_signal(pid, signal.SIGKILL)
            if left and wait_gone(left, 5.0):
                raise TestbedError(
                    f"processes {sorted(left)} of the testbed in {self.root} survived SIGKILL; "
                    "check them with 'ps -fp PID'"
                )
        return stopped

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Poll sinfo until every node is idle; a clear error with log tails otherwise."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        last_error = ""
        while time.monotonic() < deadline:
            try:
                states = self.node_states()
                last_error = ""
            except TestbedError as exc:
                last_error = str(exc)
            if states and all(states.get(n.name) == "idle" for n in self.nodes):
                return
            self._check_started_daemons()
            time.sleep(0.2)
        raise TestbedError(
            f"nodes not idle after {timeout_s:g} s: {states or last_error}\n" + self.log_tails()
        )

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon log, for error messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")) if self.log_dir.is_dir() else ():
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {log} ---\n" + "\n".join(tail))
        return "\n".join(parts) or f"(no logs in {self.log_dir})"

    # -- starting ------------------------------------------------------------------------------
    def _start_slurmctld(self, timeout_s: float) -> None:
        self._spawn(["slurmctld", "-f", str(self.conf)], "slurmctld")

        def answers() -> bool:
            return self.run(["scontrol", "ping"], check=False, timeout_s=5).returncode == 0

        self._poll(answers, timeout_s, "slurmctld answering 'scontrol ping'")

    def _spawn(self, args: list[str], what: str) -> None:
        """Run a command that daemonizes (or finishes) quickly; fail with its output and logs."""
        exe = self._which(args[0])
        try:
            proc = subprocess.run(
                [exe or args[0], *args[1:]],
                env=self.env,
                cwd=self.root,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"starting {what} did not return within 30 s") from exc
        if proc.returncode != 0:
            raise TestbedError(
                f"starting {what} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()}\n{self.log_tails()}"
            )

    def _poll(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            self._check_started_daemons()
            time.sleep(0.1)
        raise TestbedError(
            f"timed out after {timeout_s:g} s waiting for {what}\n{self.log_tails()}"
        )

    def _check_started_daemons(self) -> None:
        """Fail fast, with the logs, when a daemon that wrote its pid file has died again
        (a port taken after all, a config it rejects) instead of waiting out the timeout."""
        for daemon, pid_file in self.pid_files().items():
            # A pid file still being written (empty), or naming the parent that is handing over
            # to its daemonized child, says nothing yet: look again a moment later.
            if read_pid(pid_file) is not None and self._alive(daemon) is None:
                time.sleep(0.5)
            if read_pid(pid_file) is not None and self._alive(daemon) is None:
                raise TestbedError(
                    f"{daemon} exited during start-up (see {self.log_dir})\n{self.log_tails()}"
                )
        for log in self.log_dir.glob("slurm*.log"):  # slurmd dies before writing a pid file
            with contextlib.suppress(OSError):
                if b"Address already in use" in log.read_bytes():
                    raise TestbedError(
                        f"a port was taken ({log.name}: Address already in use)\n"
                        + self.log_tails()
                    )

    # -- our own processes ---------------------------------------------------------------------
    def _marker(self, daemon: str) -> str:
        return str(self.munge_socket) if daemon == "munged" else str(self.conf)

    def _alive(self, daemon: str) -> int | None:
        pid = read_pid(self.pid_files()[daemon])
        return pid if pid is not None and running_with(pid, self._marker(daemon)) else None

    def _stray_pids(self) -> list[int]:
        """Our processes that no pid file names: Slurm daemons whose command line names our
        slurm.conf, and slurmstepd and job processes whose environment does (job processes
        carry SLURM_JOB_ID; a user's shell that merely exports our SLURM_CONF is left alone).
        After a crash, slurmd and slurmstepd die without killing the jobs' processes."""
        conf = str(self.conf).encode()
        known = {p for d in self.pid_files() if (p := self._alive(d)) is not None}
        strays = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in known or pid == os.getpid() or process_state(pid) in ("Z", ""):
                continue
            args = read_proc(pid, "cmdline").split(b"\0")
            slurm = os.path.basename(args[0]).startswith(b"slurm")
            if slurm and names_marker(args, conf):
                strays.append(pid)
                continue
            env = read_proc(pid, "environ").split(b"\0")
            if b"SLURM_CONF=" + conf in env and (
                slurm or any(v.startswith(b"SLURM_JOB_ID=") for v in env)
            ):
                strays.append(pid)
                continue
            # 24.11's slurmstepd clears its environment and renames its command line
            # ("slurmstepd: [1.batch]"); its working folder is still ours.
            if args[0].startswith(b"slurmstepd") and cwd_under(pid, self.root):
                strays.append(pid)
        return strays

    def _cancel_all_jobs(self, timeout_s: float) -> None:
        try:
            out = self.run(["squeue", "-h", "-o", "%i"], timeout_s=timeout_s, check=False).stdout
            ids = [j for j in out.split() if j.strip()]
            if ids:
                self.run(["scancel", *ids], timeout_s=timeout_s, check=False)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and any(
                    b"slurmstepd" in read_proc(p, "cmdline") for p in self._stray_pids()
                ):
                    time.sleep(0.1)
        except TestbedError:
            pass  # slurmctld is going down anyway; leftover steps are killed as strays
