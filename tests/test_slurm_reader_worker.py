"""The service's Slurm reader parses in a worker process (adapters/slurm/state.py,
``parse_apart``); a worker that dies must cost one read's parse here, not the read. The real
commands are compared with the in-process reader on the real Slurm (tests/slurm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from slurm_pal.adapters.slurm.state import CliStateReader
from tests.helpers.processes import describe, in_session, wait_until_none

PARENT = "SLURM_PAL_TEST_PARENT_PID"


def lines_where_parsed(text: str) -> tuple[str, bool]:
    """The command's output, and whether it was parsed in this test's own process."""
    return text.strip(), str(os.getpid()) == os.environ[PARENT]


def dies_in_the_worker(text: str) -> tuple[str, bool]:
    if str(os.getpid()) != os.environ[PARENT]:
        os._exit(3)  # the worker process dies mid-parse
    return lines_where_parsed(text)


def test_reads_are_parsed_in_the_worker_and_a_dead_worker_is_replaced(monkeypatch) -> None:
    monkeypatch.setenv(PARENT, str(os.getpid()))  # spawned workers inherit the environment
    reader = CliStateReader(dict(os.environ), parse_apart=True)
    try:
        assert reader._parsed(["echo", "n01"], lines_where_parsed) == ("n01", False)
        # the worker dies: this read is parsed here, and the next one in a new worker
        assert reader._parsed(["echo", "n02"], dies_in_the_worker) == ("n02", True)
        assert reader._parsed(["echo", "n03"], lines_where_parsed) == ("n03", False)
    finally:
        reader.close()


def test_a_reader_with_its_own_runner_parses_in_process() -> None:
    """Tests and tools that feed the reader themselves: nothing to run in a worker."""
    reader = CliStateReader({}, runner=lambda args: "n01\n", parse_apart=True)
    assert not reader.parse_apart


CHILD = """
import sys, time
from slurm_pal.adapters.slurm.state import CliStateReader
reader = CliStateReader({"PATH": "/usr/bin:/bin"}, parse_apart=True)
print(reader._parsed(["echo", "ready"], str.strip), flush=True)
time.sleep(600)
"""


def test_the_worker_and_the_resource_tracker_end_when_the_service_is_killed() -> None:
    """SIGKILL leaves no handler to stop the worker: it must notice its parent's end itself.
    The child runs in its own session, so the session holds what it started."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        started = in_session(child.pid)
        # the reader, its worker and multiprocessing's resource tracker
        assert len(started) >= 3, [describe(p) for p in started]
        child.kill()
        child.wait(timeout=30)
        left = wait_until_none(lambda: in_session(child.pid), 20.0)
        assert not left, [describe(p) for p in left]
    finally:
        for pid in in_session(child.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
