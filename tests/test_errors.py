"""One base for the project's errors: every exception class slurm_pal defines derives from
``SlurmPalError`` (and keeps its builtin base), and the CLI prints exactly those as one line."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import typer

import slurm_pal
from slurm_pal.adapters.campaign_csv import CampaignFormatError
from slurm_pal.adapters.config import ConfigError
from slurm_pal.adapters.slurm.state import SlurmTimeoutError
from slurm_pal.adapters.store import StoreError
from slurm_pal.adapters.traces import TraceFormatError
from slurm_pal.cli.common import EXIT_USAGE, reported_errors
from slurm_pal.errors import FileFormatError, SlurmPalError

PACKAGE = Path(slurm_pal.__file__).resolve().parent


def exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a slurm_pal module, folders without ``__init__.py``
    (site/) included. Left out: ``__main__`` modules and templates/ (scripts that run when
    imported), modules needing a library only GPU nodes have, and warnings (not errors)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__" or "templates" in parts:
            continue
        try:
            module = importlib.import_module(".".join(parts).removesuffix(".__init__"))
        except ModuleNotFoundError as exc:  # the GPU benchmarks' own imports
            if (exc.name or "").startswith("slurm_pal"):
                raise
            continue
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, BaseException)
                and not issubclass(cls, Warning)
                and cls.__module__ == module.__name__
            ):
                found.append(cls)
    return found


def test_every_project_exception_derives_from_the_one_base() -> None:
    classes = exception_classes()
    assert len(classes) >= 30  # the walk reached the package (36 classes when written)
    outside = [
        f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, SlurmPalError)
    ]
    assert outside == [], f"derive these from slurm_pal.errors.SlurmPalError: {outside}"


def test_the_builtin_bases_are_kept() -> None:
    """``except ValueError`` / ``except RuntimeError`` written before the base still catch."""
    assert issubclass(ConfigError, ValueError)
    assert issubclass(StoreError, RuntimeError)
    assert issubclass(SlurmTimeoutError, RuntimeError)
    assert issubclass(CampaignFormatError, ValueError)


@pytest.mark.parametrize("cls", [CampaignFormatError, TraceFormatError])
def test_file_format_errors_name_the_file_and_line(cls: type[FileFormatError]) -> None:
    with_line = cls("runs.csv", "bad duration", line=7)
    assert str(with_line) == "runs.csv, line 7: bad duration"
    assert (with_line.path, with_line.line) == ("runs.csv", 7)
    assert str(cls("runs.csv", "empty")) == "runs.csv: empty"


def test_the_cli_prints_a_project_error_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised, reported_errors():
        raise SlurmTimeoutError("squeue: no answer in 10 s")
    assert raised.value.exit_code == EXIT_USAGE
    assert capsys.readouterr().err.strip() == "error: squeue: no answer in 10 s"


def test_the_cli_keeps_the_traceback_of_anything_else() -> None:
    """A ValueError that is not the project's is a bug: it is not dressed as a user error."""
    with pytest.raises(ValueError, match="a bug"), reported_errors():
        raise ValueError("a bug")
