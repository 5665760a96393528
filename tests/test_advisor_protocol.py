"""The wire format: request validation, error answers, encoding (PROTOCOL.md)."""

from __future__ import annotations

import hashlib
import json

import pytest

from slurm_pal.advisor.protocol import (
    MAX_LINE,
    OPS,
    VERSION,
    ProtocolError,
    Request,
    encode,
    error_answer,
    parse_request,
)
from slurm_pal.engine.jobdesc import JobDescription


def line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


RECORD = {"record_id": "12:n01:prolog", "kind": "prolog", "job_id": 12, "node": "n01"}


def test_valid_requests() -> None:
    assert parse_request(line({"v": 1, "op": "decide", "job": {"user": "a"}})) == Request(
        "decide", {"job": {"user": "a"}}
    )
    got = parse_request(line({"v": 1, "op": "record", "record": RECORD}))
    assert got.op == "record" and got.body["record"] == RECORD
    for op in ("health", "stats", "replan", "reload"):
        assert parse_request(line({"v": 1, "op": op})) == Request(op, {})
    # no trailing newline, and CRLF, are fine too
    assert parse_request(b'{"v":1,"op":"health"}').op == "health"
    assert parse_request(b'{"v":1,"op":"health"}\r\n').op == "health"


def error_of(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_request(raw)
    return info.value


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"not json\n", "not JSON"),
        (b"\xff\xfe\n", "not JSON"),
        (b'{"v": 1, "op": "health", "x": NaN}', "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[1, 2]\n", "JSON object"),
        (b"", "not JSON"),
    ],
)
def test_malformed_lines(raw: bytes, text: str) -> None:
    error = error_of(raw)
    assert text in error.message
    answer = error.answer()
    assert answer["ok"] is False and answer["v"] == VERSION and "valid" not in answer


def test_bytes_that_are_not_utf8_survive_for_the_script_hash() -> None:
    """job_submit.lua cuts the script at 16 KiB, maybe inside a character: the request is still
    read, and the script hashes as the bytes sent."""
    script = "#!/bin/sh echo \u00e9".encode()[:-1]  # cut inside the two-byte "\u00e9"
    raw = b'{"v":1,"op":"decide","job":{"user":"a","script":"' + script + b'"}}\n'
    request = parse_request(raw)
    job = JobDescription.from_wire(request.body["job"])  # type: ignore[arg-type]
    assert job.script_sha256 == hashlib.sha256(script).hexdigest()
    assert encode({"ok": True, "echo": job.script}).isascii()


@pytest.mark.parametrize("version", [None, 2, "1", True])
def test_wrong_version_lists_the_valid_one(version: object) -> None:
    request = {"op": "health"} if version is None else {"v": version, "op": "health"}
    answer = error_of(line(request)).answer()
    assert "version" in str(answer["error"]) and answer["valid"] == ["1"]


@pytest.mark.parametrize("op", [None, "decid", 3])
def test_unknown_op_lists_valid_ops(op: object) -> None:
    request = {"v": 1} if op is None else {"v": 1, "op": op}
    answer = error_of(line(request)).answer()
    assert "unknown op" in str(answer["error"]) and answer["valid"] == list(OPS)


def test_line_too_long() -> None:
    big = {"v": 1, "op": "decide", "job": {"script": "x" * MAX_LINE}}
    assert "longer than" in error_of(line(big)).message
    # exactly MAX_LINE bytes (without the newline) is still accepted
    body = b'{"v":1,"op":"health","pad":""}'
    fitting = body[:-2] + b"x" * (MAX_LINE - len(body)) + b'"}'
    assert len(fitting) == MAX_LINE and parse_request(fitting + b"\n").op == "health"


@pytest.mark.parametrize("job", [None, "user=a", [1], 3])
def test_decide_needs_a_job_object(job: object) -> None:
    request = {"v": 1, "op": "decide"} if job is None else {"v": 1, "op": "decide", "job": job}
    assert "'job'" in error_of(line(request)).message


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"record_id": None}, "lacks record_id"),
        ({"kind": None, "node": None}, "lacks kind, node"),
        ({"kind": "sampler"}, "record.kind"),
        ({"job_id": "12"}, "record.job_id"),
        ({"job_id": -1}, "record.job_id"),
        ({"node": ""}, "record.node"),
        ({"record_id": 5}, "record.record_id"),
    ],
)
def test_record_validation(change: dict[str, object], text: str) -> None:
    record = {k: v for k, v in {**RECORD, **change}.items() if v is not None}
    error = error_of(line({"v": 1, "op": "record", "record": record}))
    assert text in error.message
    if "kind" in change and change["kind"] is not None:
        assert error.answer()["valid"] == ["prolog", "epilog"]


def test_record_must_be_an_object() -> None:
    assert "'record'" in error_of(line({"v": 1, "op": "record", "record": [1]})).message


def test_encode_one_ascii_line() -> None:
    raw = encode({"ok": True, "reason": "naïve\nline"})
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1 and raw.isascii()
    assert json.loads(raw) == {"v": 1, "ok": True, "reason": "naïve\nline"}
    assert next(iter(json.loads(raw))) == "v"


def test_encode_refuses_bad_answers() -> None:
    with pytest.raises(ValueError, match="'ok'"):
        encode({"v": 1})
    with pytest.raises(ValueError):
        encode({"ok": True, "lv": float("nan")})


def test_error_answer() -> None:
    assert error_answer("bad") == {"v": 1, "ok": False, "error": "bad"}
    assert error_answer("bad", ("a", "b"))["valid"] == ["a", "b"]
    assert json.loads(encode(error_answer("x", OPS)))["valid"] == list(OPS)


def test_the_engine_answers_in_the_protocols_version() -> None:
    """The engine states the version its decide answers carry (it imports nothing of
    ``advisor/``); it must be the protocol's."""
    from slurm_pal.engine.decide import WIRE_VERSION

    assert WIRE_VERSION == VERSION
