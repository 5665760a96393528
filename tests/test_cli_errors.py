"""Errors a user can cause, through the real command in a subprocess: exit code 2, one line on
stderr naming the file, line or option, no traceback, nothing on stdout, nothing created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SIA_HEADER = "job_id,num_gpus,submit_time,duration,model\n"
SACCT_HEADER = "JobID|Submit|Start|End|AllocTRES|NNodes|JobName|User\n"


def slurm_pal(
    *args: object, db: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``slurm-pal ARGS`` as a user runs it: its own process, output to pipes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_PAL_")}
    env.update({"SLURM_PAL_DB": str(db), "COLUMNS": "80", **(extra_env or {})})
    return subprocess.run(
        [sys.executable, "-m", "slurm_pal.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit 2, nothing on stdout, one ``error:`` line on stderr that says each ``expected``."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store" / "slurm-pal.db"


@pytest.mark.parametrize(
    "args",
    [
        ("sim", "run", "--poisson", "20", "--load", "0"),
        ("tune", "--poisson", "20", "--load", "0"),
    ],
)
def test_zero_poisson_load_is_one_line(db: Path, args: tuple[str, ...]) -> None:
    assert_one_line_error(slurm_pal(*args, db=db), "--load must be > 0 jobs per hour, got 0")
    assert not db.parent.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("sim", "run", "--poisson", "20", "--load", "nan"), "--load must be > 0"),
        (("sim", "run", "--poisson", "-3"), "--poisson must be >= 1"),
        (("sim", "run", "--poisson", "5", "--seed", "-1"), "--seed must be >= 0"),
        (("sim", "run", "--poisson", "5", "--workers", "0"), "--workers must be >= 1"),
        (("sim", "run", "--poisson", "5", "--trace-format", "csv"), "--trace-format 'csv'"),
        (("sim", "run", "--poisson", "5", "--xi", "0.5"), "--xi must be >= 1"),
        (("sim", "run", "--poisson", "5", "--iter-time", "bert=0"), "--iter-time bert=0"),
        (("sim", "run", "--poisson", "5", "--migration-seconds", "-1"), "--migration-seconds"),
        (("sim", "run", "--poisson", "5", "--round", "1e-9"), "--round must be >= 1 s"),
        (("sim", "run", "--poisson", "5", "--cluster", "99999x99999"), "at most 1000000"),
        (("tune", "--poisson", "9", "--cluster", "0x1"), "--cluster: cluster needs >= 1 node"),
        (("tune", "--poisson", "9", "--class-counts", "1.5"), "--class-counts"),
        (("tune", "--poisson", "9", "--scheduler", "fifo,las"), "one --scheduler"),
        (("tune", "--poisson", "9", "--avoid-above", "inf"), "--avoid-above"),
        (("tune", "--poisson", "9", "--workers", "0"), "--workers must be >= 1"),
        (("profile", "ingest", "x.csv", "--campaign", ""), "--campaign: campaign id ''"),
        # A what-if typed on the command line is blamed on the option, not on the config.
        (
            ("advise", "lxv", "-c", "A", "--locality-penalty", "-2"),
            "error: --locality-penalty -2: locality penalties must be finite and > 0",
        ),
        (("advise", "lxv", "-c", "A", "--locality-penalty", "0.5"), "--locality-penalty 0.5: "),
    ],
)
def test_other_bad_options_are_one_line(
    run_cli: Callable[..., Any], args: tuple[str, ...], expected: str
) -> None:
    """The same rule for the options found by trying more values (in-process: faster)."""
    assert_one_line_in_process(run_cli(*args, ok=False), expected)


def assert_one_line_in_process(result: Any, expected: str) -> None:
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_user_text_with_brackets_is_printed_as_given(tmp_path: Path, db: Path) -> None:
    """Rich markup in a file name is text, not a colour tag to swallow."""
    result = slurm_pal("sim", "run", "--trace", tmp_path / "missing[red].csv", db=db)
    assert_one_line_error(result, "missing[red].csv not found")


def test_missing_matplotlib_names_the_extra(tmp_path: Path, db: Path) -> None:
    # An importable 'matplotlib' that fails the way an absent one does.
    fake = tmp_path / "no-mpl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    result = slurm_pal(
        "sim",
        "run",
        "--poisson",
        "5",
        "--plot",
        tmp_path / "plots",
        db=db,
        extra_env={"PYTHONPATH": str(fake.parent)},
    )
    assert_one_line_error(result, "pip install 'slurm-pal[plot]'")


def test_unwritable_paths_are_one_line(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    """A --plot folder that cannot be made is refused before the run, an --out file too."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_cli("sim", "run", "--poisson", "5", "--plot", blocker / "plots", ok=False)
    assert_one_line_in_process(result, f"--plot {blocker / 'plots'}: cannot create the folder")
    result = run_cli("profile", "example", "--out", blocker / "x.csv", ok=False)
    assert_one_line_in_process(result, f"cannot write {blocker / 'x.csv'}")


def test_negative_sia_duration_names_the_column_and_line(tmp_path: Path, db: Path) -> None:
    trace = tmp_path / "neg.csv"
    trace.write_text(SIA_HEADER + "1,1,0,100,resnet50\n2,1,5,-5,resnet50\n")
    result = slurm_pal("sim", "run", "--trace", trace, db=db)
    assert_one_line_error(result, f"{trace}, line 3", "duration must be > 0 iterations, got -5")


def test_binary_trace_is_one_line(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(b"job_id,\xff\xfe\x00\x01binary")
    assert_one_line_in_process(run_cli("sim", "run", "--trace", trace, ok=False), "not a text")


def test_sacct_rows_left_out_are_counted(tmp_path: Path, db: Path) -> None:
    """4 jobs fed, 1 replayable: the run says so instead of simulating 1 job silently."""
    day = "2024-01-01T"
    trace = tmp_path / "sacct.txt"
    trace.write_text(
        SACCT_HEADER
        + f"1|{day}00:00:00|{day}01:00:00|{day}02:00:00|gres/gpu=1|1|a|u\n"
        + f"1.batch|{day}00:00:00|{day}01:00:00|{day}02:00:00|gres/gpu=1|1|batch|u\n"
        + f"2|{day}00:00:00|{day}03:00:00|{day}02:00:00|gres/gpu=1|1|a|u\n"
        + f"3|{day}00:00:00|{day}03:00:00|Unknown|gres/gpu=1|1|a|u\n"
        + f"4|{day}00:00:00|Unknown|Unknown|gres/gpu=1|1|a|u\n"
    )
    result = slurm_pal(
        "sim", "run", "--trace", trace, "--placement", "packed-sticky", "--json", db=db
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        f"{trace}: left out 3 of 4 jobs: 1 ended before (or when) they started, "
        "1 still running (no end time), 1 never started (pending or cancelled)"
    ) in result.stderr
    assert '"avg_jct": 3600.0' in result.stdout


def test_read_commands_create_no_store_and_no_folder(tmp_path: Path) -> None:
    db = tmp_path / "nonexistent" / "dir" / "x.db"
    result = slurm_pal("--db", db, "profile", "campaigns", db=tmp_path / "unused.db")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert f"no store at {db} yet" in result.stderr
    for view in ("bins", "gpus", "labels"):
        # An empty view and a note, as for every read command: no error, no exit 2.
        result = slurm_pal("--db", db, "profile", view, "--json", db=tmp_path / "unused.db")
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "no campaign yet: ingest one with 'slurm-pal profile ingest" in result.stderr
        assert f"no store at {db} yet" in result.stderr
    assert json.loads(result.stdout) == {"campaign": None, "labels": []}
    result = slurm_pal("--db", db, "profile", "bins", db=tmp_path / "unused.db")
    assert result.returncode == 0 and result.stdout == ""
    result = slurm_pal("--db", db, "apps", "list", "--json", db=tmp_path / "unused.db")
    assert result.returncode == 0 and result.stdout.strip() == "[]"
    assert not (tmp_path / "nonexistent").exists()


def test_empty_ncu_file_says_empty(tmp_path: Path, db: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    result = slurm_pal("apps", "classify", "--app", "x", "--source", "ncu", empty, db=db)
    line = assert_one_line_error(result, f"{empty}: the file is empty")
    assert "1 lines" not in line
    assert not db.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("campaign", "plan", "--repeats", "-1"),
            "slurm-pal campaign plan: Invalid value for '--repeats'",
        ),
        (("profile", "bins", "--class", "C"), "slurm-pal profile bins: No such option: --class"),
        (("profile", "show"), "slurm-pal profile show: Missing argument 'gpu'"),
        (("--bogus", "version"), "slurm-pal: No such option: --bogus"),
        (("simm", "run"), "slurm-pal: no such command 'simm'; did you mean 'sim'?"),
        (("tune", "--seeds", "many"), "slurm-pal tune: Invalid value for '--seeds'"),
    ],
)
def test_option_parsing_errors_are_one_line(db: Path, args: tuple[str, ...], expected: str) -> None:
    """typer's own three lines (Usage:, Try ..., Error:) become the project's one line."""
    assert_one_line_error(slurm_pal(*args, db=db), expected)
    assert not db.parent.exists()


def test_a_group_without_its_command_still_prints_its_help(db: Path) -> None:
    result = slurm_pal("campaign", db=db)
    assert "campaign [OPTIONS] COMMAND" in result.stdout + result.stderr
    assert "plan" in result.stdout + result.stderr
