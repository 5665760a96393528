"""The advisor's wire format: one JSON object per line each way (PROTOCOL.md, pure).

Why a module of its own: the server, the client, the hooks' tests and job_submit.lua's tests
must agree byte for byte on what a valid request is and what an error looks like, and a
malformed request must become an error answer, never an exception inside the service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_pal.errors import SlurmPalError

__all__ = [
    "MAX_LINE",
    "OPS",
    "RECORD_KINDS",
    "VERSION",
    "ProtocolError",
    "Request",
    "encode",
    "error_answer",
    "parse_request",
]

VERSION = 1
OPS = ("decide", "record", "health", "stats", "replan", "reload")
RECORD_KINDS = ("prolog", "epilog")
MAX_LINE = 1 << 20
"""Longest request line in bytes, without its ``\\n``."""


def error_answer(message: str, valid: Sequence[str] = ()) -> dict[str, object]:
    """``{"v": 1, "ok": false, "error": message}`` plus ``valid`` when it lists choices."""
    answer: dict[str, object] = {"v": VERSION, "ok": False, "error": message}
    if valid:
        answer["valid"] = [str(v) for v in valid]
    return answer


class ProtocolError(SlurmPalError, ValueError):
    """A request that breaks the contract; :meth:`answer` is what the server replies."""

    def __init__(self, message: str, valid: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.valid = tuple(str(v) for v in valid)

    def answer(self) -> dict[str, object]:
        return error_answer(self.message, self.valid)


@dataclass(frozen=True)
class Request:
    """A valid request: its op and the rest of the object (``v`` and ``op`` removed)."""

    op: str
    body: Mapping[str, object]


def _int_field(where: str, key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{where}.{key} must be an integer >= 0, got {value!r}")


def _str_field(where: str, key: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{where}.{key} must be a non-empty string, got {value!r}")


def _check_decide(body: Mapping[str, object]) -> None:
    job = body.get("job")
    if not isinstance(job, dict):
        got = "missing" if job is None else f"a {type(job).__name__}"
        raise ProtocolError(f"decide needs 'job', an object of job_desc fields ({got})")
    deadline = body.get("deadline")
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0
    ):
        raise ProtocolError(f"decide.deadline must be epoch seconds > 0, got {deadline!r}")


def _check_record(body: Mapping[str, object]) -> None:
    record = body.get("record")
    if not isinstance(record, dict):
        got = "missing" if record is None else f"a {type(record).__name__}"
        raise ProtocolError(f"record needs 'record', an object ({got})")
    missing = [k for k in ("record_id", "kind", "job_id", "node") if k not in record]
    if missing:
        raise ProtocolError(f"record lacks {', '.join(missing)}")
    _str_field("record", "record_id", record["record_id"])
    if record["kind"] not in RECORD_KINDS:
        raise ProtocolError(f"record.kind {record['kind']!r} is not valid", RECORD_KINDS)
    _int_field("record", "job_id", record["job_id"])
    _str_field("record", "node", record["node"])


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_CHECKS = {"decide": _check_decide, "record": _check_record}


def parse_request(line: bytes) -> Request:
    """Validate one request line (``v``, ``op``, the op's required keys) or raise ProtocolError."""
    data = parse_message(line)
    op = data.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r}", OPS)
    body = {k: v for k, v in data.items() if k not in ("v", "op")}
    check = _CHECKS.get(op)
    if check is not None:
        check(body)
    return Request(op, body)


def parse_message(line: bytes) -> dict[str, Any]:
    """One line as a JSON object of this protocol's version (any op), or ProtocolError: what
    every listener checks before it looks at the op."""
    line = line.removesuffix(b"\n").removesuffix(b"\r")
    if len(line) > MAX_LINE:
        raise ProtocolError(f"request line longer than {MAX_LINE} bytes ({len(line)})")
    # Invalid UTF-8 is kept as surrogate escapes rather than refused: job_submit.lua cuts the
    # script at 16 KiB, possibly inside a character, and the hash must see the bytes as sent.
    text = line.decode("utf-8", "surrogateescape")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:
        raise ProtocolError(f"request is not JSON: {error}") from None
    except RecursionError:
        raise ProtocolError("request is not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"request must be a JSON object, got {type(data).__name__}")
    version = data.get("v")
    if isinstance(version, bool) or version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r}", [str(VERSION)])
    return data


def encode(answer: Mapping[str, object]) -> bytes:
    """One answer as a ``\\n``-terminated JSON line (ASCII, so any Lua JSON reader copes).

    ``v`` is added when missing; ValueError for an answer without ``ok`` or with NaN/inf."""
    if "ok" not in answer:
        raise ValueError("an answer needs 'ok'")
    out = dict(answer) if "v" in answer else {"v": VERSION, **answer}
    return (json.dumps(out, separators=(",", ":"), allow_nan=False) + "\n").encode("ascii")
