"""The base of every error slurm-pal raises on purpose, so a caller (above all the CLI, which
prints such an error as one line) tells the project's own errors, whose message is written
for the user, from a bug's traceback. Stdlib only: the Prolog/Epilog hooks import it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FileFormatError", "SlurmPalError"]


class SlurmPalError(Exception):
    """An error slurm-pal raises on purpose; its message says what is wrong, in one line.

    Each project error derives from it and keeps its builtin base too (``ValueError`` for bad
    input, ``RuntimeError`` for an operation that failed), so ``except ValueError`` still
    catches it."""


class FileFormatError(SlurmPalError, ValueError):
    """An input file that cannot be read; the message starts with the file (and the line)."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line
