"""Text from users in the service's log: one event stays one line, whatever a job name holds.

Why: job names, comments, user names and paths come from users (a job name is whatever
``sbatch -J`` was given). Written as is, a newline in one splits a log line in two, so a user
can forge what looks like the advisor's own line, and a right-to-left override makes a line
read differently from what it holds. Values are quoted where they are logged
(:func:`quoted`), and :class:`OneLineFormatter` escapes what no log line may carry in the
whole line (also in reasons and errors that echo a user's value). Stdlib only.
"""

from __future__ import annotations

import copy
import logging
import unicodedata
from collections.abc import Mapping

__all__ = ["OneLineFormatter", "about", "escaped", "quoted", "reason"]

# Line breaks, controls, format characters (bidi overrides and isolates, zero-width ones),
# line and paragraph separators, surrogates and unassigned code points.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def escaped(text: str) -> str:
    """``text`` with every character a log line must not carry written as an escape
    (``\\n``, ``\\x1b``, ``\\u202e``); printable text, accents included, is kept."""
    if text.isprintable() and text.isascii():
        return text  # the common case, fast
    return "".join(_escape_char(c) if _unsafe(c) else c for c in text)


def quoted(value: object) -> str:
    """A user's value as one double-quoted token: backslashes and quotes escaped as well, so
    the value cannot end its quotes and fake the next ``key=value`` of the line."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped(text)}"'


class OneLineFormatter(logging.Formatter):
    """A formatter whose records never span lines: the message is escaped; a traceback keeps
    its lines, each escaped and indented under ``  | `` so none can pass for a record."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # other handlers see the record unchanged
        record.message = escaped(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: object) -> str:
        return _indented(super().formatException(ei))  # type: ignore[arg-type]

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  | " + escaped(line) for line in text.split("\n"))


def about(record: Mapping[str, object]) -> str:
    """A job record as an admin looks it up: Slurm's job id, the hook and the node."""
    return f"job {record.get('job_id')}'s {record.get('kind')} record from {record.get('node')}"


def reason(exc: BaseException) -> str:
    """Why, never empty: some exceptions (a timeout) carry no message of their own."""
    text = str(exc).strip()
    if text:
        return text
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return type(exc).__name__
