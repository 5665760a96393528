"""Start-up: a probe (`serve health`) or `version` must not import the numeric stack. The
time itself is measured by benchmarks/startup.py; here only what gets imported, which does
not depend on the machine's load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_pal.cli.main import SUBCOMMANDS

HEAVY = ("numpy", "pandas", "scipy", "sklearn", "matplotlib", "jinja2")

RUN_AND_LIST_HEAVY = """
import atexit, sys
heavy = {heavy!r}
def report():
    loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set(heavy))
    sys.__stderr__.write("HEAVY=" + ",".join(loaded) + "\\n")
atexit.register(report)
from slurm_pal.cli.main import app
sys.argv = ["slurm-pal", *{args!r}]
app()
"""


def heavy_modules_loaded_by(*args: str, tmp_path: Path) -> tuple[list[str], int]:
    code = RUN_AND_LIST_HEAVY.format(heavy=HEAVY, args=list(args))
    env = {"SLURM_PAL_DB": str(tmp_path / "none.db"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    line = [x for x in done.stderr.splitlines() if x.startswith("HEAVY=")]
    assert line, done.stderr
    loaded = line[-1].removeprefix("HEAVY=")
    return (loaded.split(",") if loaded else []), done.returncode


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (("version",), 0),
        (("serve", "health", "--json", "--socket", "{tmp}/no-advisor.sock"), 1),
        (("serve", "stats", "--socket", "{tmp}/no-advisor.sock"), 1),
    ],
)
def test_probes_start_without_the_numeric_stack(
    tmp_path: Path, args: tuple[str, ...], exit_code: int
) -> None:
    args = tuple(a.format(tmp=tmp_path) for a in args)
    loaded, code = heavy_modules_loaded_by(*args, tmp_path=tmp_path)
    assert code == exit_code
    assert loaded == []


def test_a_command_that_needs_the_numeric_stack_still_gets_it(tmp_path: Path) -> None:
    # The check above can fail: this command loads them (so the probe really reports them).
    out = str(tmp_path / "example.csv")
    loaded, code = heavy_modules_loaded_by("profile", "example", "--out", out, tmp_path=tmp_path)
    assert code == 0
    assert {"numpy", "pandas"} <= set(loaded)


def test_every_sub_app_is_listed_and_loads(run_cli) -> None:
    listed = run_cli("--help").output
    for name, module in SUBCOMMANDS.items():
        assert name in listed
        assert (Path(__file__).parents[1] / "slurm_pal" / "cli" / f"{module}.py").is_file()
        assert run_cli(name, "--help").exit_code == 0
