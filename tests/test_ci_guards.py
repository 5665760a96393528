"""What CI must not let go quiet: tests that need ../shared/data skip on a machine without it
but fail in CI (like the Slurm, Lua and munge tests), and property tests draw fixed examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import need_shared

REPO = Path(__file__).resolve().parents[1]


def test_present_data_lets_the_test_run(tmp_path: Path) -> None:
    need_shared(tmp_path)  # returns: nothing to skip or fail


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)]
)
def test_missing_data_skips_locally_and_fails_in_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="set SLURM_PAL_SHARED_DATA") as caught:
        need_shared(tmp_path / "present-not", tmp_path)
    assert str(tmp_path / "present-not") in str(caught.value)


def test_every_data_test_fails_in_ci_without_the_data(tmp_path: Path) -> None:
    """The whole set of data-reading tests, run with CI=true against an empty data folder:
    none may pass quietly by skipping (the traces test read workload-1.csv unguarded)."""
    env = {"PATH": "/usr/bin:/bin", "CI": "true", "SLURM_PAL_SHARED_DATA": str(tmp_path)}
    modules = [
        "tests/test_traces.py",
        "tests/test_sim_variability.py",
        "tests/test_testbed_emulation.py",
        "tests/test_h100_recorded.py",
        "tests/test_campaign_csv.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *modules],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-2000:]
    assert "skipped" not in summary, summary
    assert "CI needs the shared reference data" in done.stdout


def test_ci_runs_hypothesis_with_a_fixed_profile() -> None:
    """Under CI=true the property tests draw the same examples on every run."""
    code = (
        "import tests.conftest; from hypothesis import settings; "
        "print(settings.default.derandomize, settings.default.deadline, settings.default.database)"
    )
    runs = {
        ci: subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "CI": ci},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()
        for ci in ("true", "")
    }
    assert runs["true"] == ["True", "None", "None"]
    assert runs[""][0] == "False"  # developers' runs keep exploring at random


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path: Path) -> None:
    """tests/conftest.py keeps the gpu_check script's tests on one worker (one run of the
    script, not one per worker) through ``--dist loadgroup``. A mark added after
    pytest-xdist's own hook, or a pytest that will not let it tag a test, makes the group
    silently ignored; this catches both."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "@pytest.hookimpl(tryfirst=True)\n"  # as tests/conftest.py adds its groups
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        if 'grouped' in item.nodeid:\n"
        "            item.add_marker(pytest.mark.xdist_group('g'))\n"
    )
    (tmp_path / "test_grouped.py").write_text(
        "".join(f"def test_{i}():\n    pass\n" for i in range(6))
    )
    (tmp_path / "test_free.py").write_text("def test_x():\n    pass\n")
    args = ["-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", str(tmp_path)]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    workers = {
        line.split()[0]
        for line in run.stdout.splitlines()
        if "test_grouped.py" in line and "PASSED" in line
    }
    assert len(workers) == 1, f"grouped tests ran on {sorted(workers)}: loadgroup is not honoured"
