"""Shared fixtures: the reference data folder, a CLI runner, an example campaign file; and the
suite's check that it leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from typer.testing import CliRunner

# First: the run's marker and, in a pytest-xdist worker, its controller's environment.
from tests.helpers.run import LEAK_MARK, XDIST_WORKER  # isort: split

from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from tests.helpers.data import LONGHORN, LONGHORN_FILES, in_ci, need_shared
from tests.helpers.processes import (
    describe,
    step_daemons_under,
    testbed_prefix,
    wait_until_none,
    with_env,
)

# 24.11's step daemons carry no marker (they clear their environment): they are known by the
# testbed folder they run in (tests/helpers/slurm_lab.fresh_testbed_dir) and their start.
TESTBED_PREFIX = testbed_prefix()
SUITE_STARTED = time.time()
# Teardowns signal and go on: what they stopped may take a moment to end.
LEFT_GRACE_S = float(os.environ.get("SPAL_TEST_LEFT_GRACE_S", "15"))


def _left_behind() -> list[int]:
    """Processes the suite started that are still alive, but for this process's own
    multiprocessing resource tracker (it ends with this process, when its pipe closes)."""
    from multiprocessing import resource_tracker

    own_tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    exclude = {os.getpid(), *([own_tracker] if own_tracker else [])}
    marked = with_env(LEAK_MARK, os.environ[LEAK_MARK], exclude)
    return sorted({*marked, *step_daemons_under(TESTBED_PREFIX, SUITE_STARTED)})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process it started is still alive at its end (after a grace for
    teardowns that signalled it); those found are killed, so they do not pile up run after
    run. Under pytest-xdist the controller checks, after its workers have ended."""
    if XDIST_WORKER:
        return
    left = wait_until_none(_left_behind, LEFT_GRACE_S)
    if not left:
        return
    described = [describe(pid) for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"the suite left {len(left)} process(es) running (killed now): " + "; ".join(
        described
    )
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Under pytest-xdist (``--dist loadgroup``) the tests under each prefix run on one worker: the
# gpu_check script's tests share one run of it (a minute), which a module fixture would repeat
# on each worker. The real-Slurm tests are not grouped: each testbed has its own namespaces,
# free ports and folder, so two run side by side (as they always did: a group added here was
# ignored until this hook ran first, and grouping them would put ~15 min on one worker).
XDIST_GROUPS = {"tests/test_gpu_check_script.py": "gpu_check_script"}


# First: pytest-xdist's own hook reads the groups to tag each test, so a mark added after it
# is silently ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep each of :data:`XDIST_GROUPS` on one worker."""
    for item in items:
        for prefix, group in XDIST_GROUPS.items():
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))


# CI runs the same examples every time: a rare counterexample is found by a developer's random
# runs (the default profile) and then pinned as a test, instead of failing one CI run in a
# hundred as a flake. No deadline: the runner is a shared 2-core machine.
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.load_profile("ci" if in_ci() else "default")


@pytest.fixture
def longhorn() -> Path:
    """The real Longhorn variability files; skip clearly when the shared data is absent."""
    need_shared(*(LONGHORN / f for f in LONGHORN_FILES.values()))
    return LONGHORN


@pytest.fixture
def example_csv(tmp_path: Path) -> Path:
    path = tmp_path / "example.csv"
    generate_example_campaign().to_csv(path, index=False)
    return path


@pytest.fixture
def run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., object]:
    """Invoke `slurm-pal` in-process with a private store; returns the click Result."""
    monkeypatch.delenv("SLURM_PAL_CONFIG", raising=False)
    monkeypatch.setenv("SLURM_PAL_DB", str(tmp_path / "store.db"))
    # Progress lines in a log depend on how long a step takes: keep them out of these outputs
    # (tests/test_cli_output.py checks them with the threshold at 0).
    monkeypatch.setenv("SLURM_PAL_PROGRESS_AFTER_S", "1e9")
    runner = CliRunner()

    def run(*args: str, ok: bool = True):
        result = runner.invoke(app, [str(a) for a in args])
        if ok and result.exit_code != 0:
            raise AssertionError(
                f"slurm-pal {' '.join(map(str, args))} exited {result.exit_code}:\n"
                f"{result.output}\n{result.exception!r}"
            )
        return result

    return run
