"""One base for the project's errors: every exception class slurm_pal defines derives from
``SlurmPalError`` (and keeps its builtin base), and the CLI prints exactly those as one line."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

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


def exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a slurm_pal module (``__main__`` modules run a command
    when imported, and define none); warnings are not errors and are left out."""
    found = []
    for info in pkgutil.walk_packages(slurm_pal.__path__, "slurm_pal."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an optional extra that is not installed
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
