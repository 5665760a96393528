"""Which processes are alive, by session or by an environment marker, read from /proc: the
tests that kill the service and the suite's own check for what it leaves behind."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def testbed_prefix() -> str:
    """The folder prefix of this test run's testbeds (one tag per run, from the suite's leak
    marker): the leak check then takes only its own run's step daemons, never those of a
    run beside it on the same machine."""
    run = os.environ.get("SPAL_TEST_RUN", "")
    tag = run.rsplit("-", 1)[-1][:8] or "solo"
    return f"/tmp/spal-tb-{tag}-"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold blanks and parentheses)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def live_pids() -> list[int]:
    """Every process that is running (zombies hold nothing and are left out)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a process started with start_new_session=True
    and everything it started that did not leave the session)."""
    found = []
    for pid in live_pids():
        fields = _stat_fields(pid)
        if fields is not None and int(fields[3]) == sid:
            found.append(pid)
    return found


def with_env(name: str, value: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes whose environment has ``name=value`` (readable ones: as root, all)."""
    wanted = f"{name}={value}".encode()
    skip = set(exclude)
    found = []
    for pid in live_pids():
        if pid in skip:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in env:
            found.append(pid)
    return found


def describe(pid: int) -> str:
    """``pid (cmdline)`` for a failure message."""
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd.strip()[:200]})"


def wait_until_none(find: Callable[[], list[int]], timeout_s: float) -> list[int]:
    """Poll ``find`` until it finds nothing or ``timeout_s`` passes; what it found last."""
    deadline = time.monotonic() + timeout_s
    found = find()
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = find()
    return found


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def started_at(pid: int) -> float | None:
    """When the process started (epoch seconds), from /proc."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def step_daemons_under(prefix: str, since: float) -> list[int]:
    """slurmstepd processes started after ``since`` whose working folder (deleted or not)
    starts with ``prefix``: 24.11's step daemons clear their environment and rename their
    command line, so no marker finds them, but they stay in the testbed's folder."""
    found = []
    for pid in live_pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        when = started_at(pid)
        if cmd.startswith(b"slurmstepd") and cwd.startswith(prefix) and (when or 0) >= since:
            found.append(pid)
    return found
