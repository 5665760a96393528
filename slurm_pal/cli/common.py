"""What every sub-command shares: the global options, opening config and store, error output."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.errors import NotRenderableError
from rich.measure import Measurement
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.rule import Rule
from rich.text import Text

from slurm_pal.adapters.config import SiteConfig, load_config, resolve_db_path
from slurm_pal.errors import SlurmPalError

if TYPE_CHECKING:
    from slurm_pal.adapters.store import Store

PIPE_WIDTH = 100_000
"""Line width when the output is not a terminal: wide enough that no value is ever cut."""

LOG_RULE_WIDTH = 80
"""Rules (horizontal lines) and short text keep this width in logs."""


class FullWidthConsole(Console):
    """A console that prints every value in full when its output is a pipe or a log file.

    Rich assumes 80 columns when it cannot ask a terminal, so a table piped into ``tee`` or a
    log came out with its values cut (``33.…``). Off a terminal this console is as wide as
    each printed thing needs (tables at their natural width, text on its own lines); on a
    terminal it behaves exactly like rich's console.
    """

    def _piped(self) -> bool:
        return self._width is None and not self.is_terminal

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return ConsoleDimensions(PIPE_WIDTH, size.height) if self._piped() else size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def print(self, *objects: Any, width: int | None = None, **kwargs: Any) -> None:
        if width is None and self._piped() and not kwargs.get("soft_wrap"):
            width = self._natural_width(objects, kwargs.get("markup"))
        super().print(*objects, width=width, **kwargs)

    def _natural_width(self, objects: tuple[Any, ...], markup: bool | None) -> int:
        widest = LOG_RULE_WIDTH
        options = self.options.update(markup=markup)
        for item in objects:
            if isinstance(item, Rule):
                continue
            try:
                widest = max(widest, Measurement.get(self, options, item).maximum)
            except NotRenderableError:
                widest = max(widest, len(str(item)))
        return widest


console = FullWidthConsole()
err_console = FullWidthConsole(stderr=True)

EXIT_USAGE = 2


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
    def store(self, *, create: bool = True) -> Iterator[Store]:
        """The store. ``create=False`` for commands that only read: a store that does not exist
        yet reads as an empty one (in memory; its messages name the real path) and nothing is
        created on disk, neither the database nor its folders. A note on stderr says so when
        the command succeeds (a failing one has its own line)."""
        from slurm_pal.adapters.store import Store

        path = self.db_path
        if create or path.exists():
            store = Store(path, create=create)
            try:
                yield store
            finally:
                store.close()
            return
        store = Store(":memory:")
        store.path = path
        try:
            yield store
        finally:
            store.close()
        warn(f"no store at {path} yet (nothing stored there): this is an empty one")


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if not isinstance(root.obj, AppState):
        root.obj = AppState()
    return root.obj


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr and the exit code. ``message`` is plain text, printed as it is:
    file names and values with brackets (``missing[red].csv``, ``slurm-pal[plot]``) are
    never read as rich markup."""
    line = Text("error:", style="bold red")
    line.append(" " + message)
    err_console.print(line, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """A notice on stderr (plain text, like :func:`fail`), never mixed into stdout."""
    line = Text("note:", style="yellow")
    line.append(" " + message)
    err_console.print(line, highlight=False, soft_wrap=True)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn the project's own errors (:class:`SlurmPalError`) into one clear line on stderr and
    exit code 2; anything else is a bug and keeps its traceback."""
    try:
        yield
    except SlurmPalError as exc:
        fail(str(exc))


# Typer exports BadParameter but not its base class, the one every option-parsing error
# (bad value, unknown option, missing argument) derives from.
UsageError: type[Exception] = typer.BadParameter.__mro__[1]


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Option-parsing errors as one ``error:`` line naming the command, like every other error
    (typer prints usage, a hint and the error on three lines). A group run without a
    command still prints its help."""
    try:
        yield
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        fail(f"{_command_named(getattr(exc, 'ctx', None))}: {exc.format_message()}")  # type: ignore[attr-defined]


def _command_named(context: typer.Context | None) -> str:
    """``slurm-pal campaign plan``, however the program was started (``python -m ...``)."""
    names = []
    while context is not None and context.parent is not None:
        names.append(context.info_name or "")
        context = context.parent  # type: ignore[assignment]  # typer's parent is click's Context
    return " ".join(["slurm-pal", *reversed(names)])


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


PROGRESS_AFTER_ENV = "SLURM_PAL_PROGRESS_AFTER_S"
"""Seconds a step runs before a log (not a terminal) hears of it; 0 reports every step."""

LOG_PROGRESS_EVERY_S = 10.0
"""Off a terminal, a running bar prints its count at most this often."""


def _progress_after() -> float:
    try:
        return max(0.0, float(os.environ.get(PROGRESS_AFTER_ENV, "2")))
    except ValueError:
        return 2.0


class Steps:
    """Progress through named steps that may each take a while (reading a large file, storing,
    binning). Call it with each step's description as the work moves on.

    On a terminal: a spinner with the step and its elapsed time on stderr, gone at the end. In
    a log: a step that runs for ``$SLURM_PAL_PROGRESS_AFTER_S`` (2 s) prints ``step ...`` and
    then its time when it ends, so a long silent stretch in a log always says what it is
    doing; short steps print nothing."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._progress: Progress | None = None
        self._task: Any = None
        self._timer: threading.Timer | None = None
        self._current: tuple[str, float, threading.Event] | None = None
        if not quiet and err_console.is_terminal:
            columns = (TextColumn("{task.description}"), TimeElapsedColumn())
            self._progress = Progress(*columns, console=err_console, transient=True)
            self._progress.start()

    def __call__(self, description: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            if self._task is None:
                self._task = self._progress.add_task(description, total=None)
            else:
                self._progress.reset(self._task, description=description)
            return
        self._end_step()
        said = threading.Event()

        def announce() -> None:
            said.set()
            _log_line(f"{description} ...")

        self._current = (description, time.monotonic(), said)
        self._timer = threading.Timer(_progress_after(), announce)
        self._timer.daemon = True
        self._timer.start()

    def _end_step(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self._current is not None:
            description, started, said = self._current
            if said.is_set():
                _log_line(f"{description}: done in {time.monotonic() - started:.1f} s")
        self._timer, self._current = None, None

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._end_step()


def _log_line(text: str) -> None:
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def steps(quiet: bool = False) -> Iterator[Steps]:
    """:class:`Steps` for the length of a block."""
    progress = Steps(quiet)
    try:
        yield progress
    finally:
        progress.close()


@contextmanager
def step(description: str, quiet: bool = False) -> Iterator[None]:
    """One step that may take a while (see :class:`Steps`)."""
    with steps(quiet) as progress:
        progress(description)
        yield


@contextmanager
def progress_bar(description: str, total: int, quiet: bool = False) -> Iterator[Callable[[], None]]:
    """A counted task (simulations, paired runs); yields ``advance()``, called once per item.

    On a terminal: a bar on stderr, gone when done. In a log: ``description: done/total (t s)``
    once the task has run ``$SLURM_PAL_PROGRESS_AFTER_S`` seconds and then at most every
    ten seconds, and the total time at the end if anything was said."""
    if quiet:
        yield lambda: None
        return
    if err_console.is_terminal:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda: progress.advance(task)
        return
    after = _progress_after()
    every = LOG_PROGRESS_EVERY_S if after > 0 else 0.0
    started = time.monotonic()
    counts: dict[str, Any] = {"done": 0, "said_at": None}

    def advance() -> None:
        counts["done"] += 1
        now = time.monotonic()
        said_at = counts["said_at"]
        due = now - started >= after if said_at is None else now - said_at >= every
        if due and counts["done"] < total:
            counts["said_at"] = now
            _log_line(f"{description}: {counts['done']}/{total} ({now - started:.0f} s)")

    yield advance
    if counts["said_at"] is not None:
        _log_line(
            f"{description}: {counts['done']}/{total} done in {time.monotonic() - started:.1f} s"
        )
