"""What every sub-command shares: the global options, opening config and store, error output."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console

from slurm_pal.adapters.campaign_csv import CampaignFormatError
from slurm_pal.adapters.config import ConfigError, SiteConfig, load_config, resolve_db_path
from slurm_pal.adapters.store import Store, StoreError

console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2
KNOWN_ERRORS = (ConfigError, StoreError, CampaignFormatError)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class AppState:
    """Global options, resolved lazily so `--help` works even with a broken config."""

    db: Path | None = None
    config_path: Path | None = None
    _config: SiteConfig | None = field(default=None, repr=False)

    @property
    def config(self) -> SiteConfig:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    @property
    def db_path(self) -> Path:
        return resolve_db_path(self.db, self.config)

    @contextmanager
    def store(self) -> Iterator[Store]:
        store = Store(self.db_path)
        try:
            yield store
        finally:
            store.close()


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if not isinstance(root.obj, AppState):
        root.obj = AppState()
    return root.obj


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn the project's own errors into one clear line on stderr and exit code 2."""
    try:
        yield
    except KNOWN_ERRORS as exc:
        fail(_escape(str(exc)))


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def print_json(data: Any) -> None:
    """JSON on stdout (NaN becomes null, so any JSON parser reads it)."""
    sys.stdout.write(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def fmt_score(value: float | None, digits: int = 3) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


@contextmanager
def stdout_kept_clean(active: bool = True) -> Iterator[None]:
    """While active, file descriptor 1 points at stderr: anything printed below Python (a C
    solver's log, a worker process's output) cannot end up in a command's ``--json`` output,
    which is printed after this block to the real stdout."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
