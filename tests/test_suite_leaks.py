"""The suite's own check (tests/conftest.py): a run that leaves a process it started alive
fails, names it and kills it; a run that stops what it starts passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.processes import with_env

ROOT = Path(__file__).resolve().parents[1]
LEAKS = """
import subprocess

def test_starts_a_process_and_forgets_it():
    subprocess.Popen(["sleep", "600"], start_new_session=True)
"""
CLEAN = """
import subprocess

def test_starts_a_process_and_stops_it():
    proc = subprocess.Popen(["sleep", "600"])
    proc.kill()
    proc.wait()
"""


def _run(
    tmp_path: Path, body: str, mark: str, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    """The inner run: ``workers`` > 0 runs it under pytest-xdist, as scripts/test.sh does."""
    test = tmp_path / "test_inner.py"
    test.write_text(body + WORKER_PID)
    env = {**os.environ, "SPAL_TEST_LEFT_GRACE_S": "1"}
    env["SPAL_INNER_MARK"] = mark  # how this test finds the inner run's sleep afterwards
    env["SPAL_INNER_OUT"] = str(tmp_path / f"{mark}.out")  # where its tests say where they ran
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", *xdist,
         "--rootdir", str(tmp_path), "-c", os.devnull, str(test)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


WORKER_PID = """

def test_says_where_it_ran():
    import os
    with open(os.environ["SPAL_INNER_OUT"], "a") as out:
        print("ran in", os.getpid(), "mark", os.environ["SPAL_TEST_RUN"], file=out)
"""


def test_a_run_that_leaves_a_process_fails_and_the_process_is_killed(tmp_path: Path) -> None:
    result = _run(tmp_path, LEAKS, "leaks")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert "left 1 process(es) running" in result.stdout and "sleep 600" in result.stdout
    assert with_env("SPAL_INNER_MARK", "leaks") == []  # killed by the check


def test_a_run_that_stops_what_it_starts_passes(tmp_path: Path) -> None:
    result = _run(tmp_path, CLEAN, "clean")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left" not in result.stdout


def test_under_xdist_a_leak_in_a_worker_is_found_once_every_worker_is_done(
    tmp_path: Path,
) -> None:
    """Workers keep the controller's mark and leave the check to it: what a worker leaves is
    found (and killed) once, at the end, and a worker that finishes first never takes what
    another still runs for a leak."""
    result = _run(tmp_path, LEAKS, "xdist-leaks", workers=2)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert result.stdout.count("left 1 process(es) running") == 1, result.stdout
    assert with_env("SPAL_INNER_MARK", "xdist-leaks") == []
    clean = _run(tmp_path, CLEAN, "xdist-clean", workers=2)
    assert clean.returncode == 0 and "left" not in clean.stdout, clean.stdout + clean.stderr
    # the test ran in a worker, under the controller's mark (not one of its own)
    said = (tmp_path / "xdist-clean.out").read_text()
    ran = re.search(r"ran in (\d+) mark (\d+)-", said)
    assert ran is not None and ran.group(1) != ran.group(2), said


def test_a_step_daemon_without_marker_is_found_by_its_testbed_folder() -> None:
    """24.11's slurmstepd clears its environment and renames its command line
    ("slurmstepd: [1.batch]"): the suite's check and the testbed's stop find it by the testbed
    folder it runs in, deleted or not."""
    import shutil
    import tempfile
    import time

    from slurm_pal.testbed import LocalSlurm, NodeSpec
    from tests.helpers.processes import step_daemons_under, testbed_prefix

    root = Path(tempfile.mkdtemp(prefix="spal-tb-", dir="/tmp"))
    (root / "log").mkdir()
    since = time.time() - 1
    stepd = subprocess.Popen(
        ["bash", "-c", 'exec -a "slurmstepd: [1.batch]" sleep 60'],
        cwd=root / "log",
        env={"PATH": os.environ["PATH"]},
    )
    try:
        deadline = time.monotonic() + 10
        while b"slurmstepd" not in Path(f"/proc/{stepd.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert stepd.pid in step_daemons_under("/tmp/spal-tb-", since)
        assert stepd.pid not in step_daemons_under("/tmp/spal-tb-", time.time() + 60)
        # Another run's testbed (not this run's prefix): this run's leak check leaves it be.
        assert stepd.pid not in step_daemons_under(testbed_prefix(), since)
        testbed = LocalSlurm(root, [NodeSpec("n01", ("a",))])
        assert stepd.pid in testbed._stray_pids()
        other = LocalSlurm(
            Path(tempfile.mkdtemp(prefix="spal-tb-", dir="/tmp")), [NodeSpec("n01", ("a",))]
        )
        assert stepd.pid not in other._stray_pids()
        shutil.rmtree(other.root, ignore_errors=True)
    finally:
        stepd.kill()
        stepd.wait()
        shutil.rmtree(root, ignore_errors=True)
