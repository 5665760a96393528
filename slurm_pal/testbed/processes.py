"""Reading and signalling processes through /proc, for a testbed's teardown.

Why: the testbed must stop its own daemons and their orphans and nothing else, so it names a
process only by what /proc shows (its command line, environment, working folder) and treats
zombies as gone (PID 1 reaps them late).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def read_pid(path: Path) -> int | None:
    """The pid a pid file names; None when it is missing, empty or garbled."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cwd_under(pid: int, root: Path) -> bool:
    """Is the process's working folder (deleted or not) inside ``root``?"""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:
        return False
    return cwd == str(root) or cwd.startswith(f"{root}/")


def read_proc(pid: int, name: str) -> bytes:
    """``/proc/PID/NAME`` (``cmdline``, ``environ``, ``stat``); empty when unreadable."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def process_state(pid: int) -> str:
    """The one-letter process state ('' when gone). Zombies count as stopped: PID 1 reaps late."""
    stat = read_proc(pid, "stat").decode(errors="replace")
    return stat.rsplit(")", 1)[1].split()[0] if ")" in stat else ""


def program_name(pid: int) -> str:
    """The base name of the process's program, for the list of what was stopped."""
    args = read_proc(pid, "cmdline").split(b"\0")
    return os.path.basename(args[0]).decode(errors="replace") or f"pid-{pid}"


def names_marker(args: list[bytes], marker: bytes) -> bool:
    """Whether a command line names ``marker`` as an argument (``-f X`` or ``--opt=X``)."""
    return any(a == marker or a.endswith(b"=" + marker) for a in args)


def running_with(pid: int, marker: str) -> bool:
    """Is ``pid`` alive (not a zombie) with ``marker`` on its command line? (A pid file's pid
    may have been reused by another program.)"""
    args = read_proc(pid, "cmdline").split(b"\0")
    return process_state(pid) not in ("", "Z") and names_marker(args, marker.encode())


def send_signal(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid``; a process already gone (or not ours to signal) is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait until the processes are gone or zombies; return those still running."""
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        left = [p for p in left if process_state(p) not in ("", "Z")]
        if left:
            time.sleep(0.05)
    return [p for p in left if process_state(p) not in ("", "Z")]
