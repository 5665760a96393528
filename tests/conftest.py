"""Shared fixtures: the reference data folder, a CLI runner, an example campaign file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from typer.testing import CliRunner

from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from tests.helpers.data import LONGHORN, LONGHORN_FILES, in_ci, need_shared

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
