"""The rendered job_submit.lua under the real Lua 5.1 interpreter with a mock ``slurm`` table:
JSON through lua-cjson as the plugin sets it up, the GPU-request translation, and the whole
submit path against a Python Unix-socket server that answers, stalls, answers garbage or closes
mid-line.

Only slurmctld is mocked (the ``slurm`` table and a plain-table ``job_desc``); the socket, the
lua-socket and lua-cjson modules and the interpreter are real. Needs ``lua5.1``, ``lua-socket``
and ``lua-cjson`` (scripts/install-slurm.sh installs them)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from slurm_pal.site.render import HookSettings, lua_string, plan_site, render_files

LUA = shutil.which("lua5.1")


def _missing_lua() -> str | None:
    """Why the plugin cannot run here (no interpreter, no lua-cjson), or None."""
    if LUA is None:
        return "lua5.1 not installed: bash scripts/install-slurm.sh"
    probe = subprocess.run([LUA, "-e", 'require "cjson"'], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return "lua-cjson not installed: bash scripts/install-slurm.sh"
    return None


MISSING_LUA = _missing_lua()


@pytest.fixture(autouse=True)
def _need_lua() -> None:
    """Skip without lua5.1 and lua-cjson locally; in CI (CI=true, install-slurm.sh ran) it is a
    failure."""
    if MISSING_LUA is not None:
        why = MISSING_LUA
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


NO_VAL = 4294967294
MOCK = """
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534}
LOGS = {}
slurm.log_info = function(fmt, ...) LOGS[#LOGS + 1] = string.format(fmt, ...) end
USER_MESSAGES = {}
slurm.log_user = function(fmt, ...) USER_MESSAGES[#USER_MESSAGES + 1] = string.format(fmt, ...) end
dofile(%s)
J = slurm_pal_lua
function emit(v) io.write(J.encode(v), "\\n") end
"""


def _render(tmp: Path, socket_path: str, timeout_ms: int = 300) -> Path:
    rows = [("u0", "n1", 0, "v100-a0"), ("u1", "n1", 1, "v100-a1"), ("u2", "n2", 0, "A40")]
    frame = pd.DataFrame(
        [
            {"job_class": "A", "uuid": u, "node": n, "gpu_index": i, "gpu_model": "v100"}
            for u, n, i, _ in rows
        ]
    )
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    plan = plan_site("c1", frame, {u: label for u, _, _, label in rows})
    hooks = HookSettings(socket=socket_path, submit_timeout_ms=timeout_ms, privileged_uids=(0, 77))
    path = tmp / "job_submit.lua"
    path.write_text(render_files(plan, hooks=hooks)["job_submit.lua"])
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder (Unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="spal-lua-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_lua(script: Path, code: str) -> list[object]:
    """Run ``code`` after loading the script; every ``emit(v)`` is one JSON value back."""
    proc = subprocess.run(
        [str(LUA), "-"],
        input=(MOCK % lua_string(str(script)) + code).encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = proc.stdout.decode("utf-8", "surrogateescape")
    return [json.loads(line) for line in out.splitlines()]


class Server:
    """A Unix-socket server whose reply to each request line is ``respond(line)``: bytes to
    send (then close), or None to hold the connection open without answering."""

    def __init__(self, path: Path, respond: Callable[[bytes], bytes | None]) -> None:
        self.path = path
        self.respond = respond
        self.requests: list[dict] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            self.requests.append(json.loads(data.decode("utf-8", "surrogateescape")))
            reply = self.respond(data)
            if reply is None:
                self.held.append(conn)
                continue
            conn.sendall(reply)
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def serve(short_dir: Path) -> Iterator[Callable[[Callable[[bytes], bytes | None]], Server]]:
    servers: list[Server] = []

    def start(respond: Callable[[bytes], bytes | None]) -> Server:
        server = Server(short_dir / "advisor.sock", respond)
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.close()


def answer(**fields: object) -> Callable[[bytes], bytes]:
    body = {"v": 1, "ok": True, "action": "route", "set": {}, **fields}
    return lambda _line: (json.dumps(body) + "\n").encode()


SUBMIT = """
local job = %s
local rc = slurm_job_submit(job, {}, %d)
emit({rc = rc, job = job, logs = LOGS, user_messages = USER_MESSAGES})
"""


def submit(script: Path, job: str, uid: int = 1000) -> dict:
    (out,) = run_lua(script, SUBMIT % (job, uid))
    assert isinstance(out, dict)
    return out


GPU_JOB = (
    '{tres_per_node = "gres:gpu:v100:2", name = "train", comment = "pal:app=bert", '
    f"min_nodes = {NO_VAL}, max_nodes = {NO_VAL}, num_tasks = 1, "
    'script = "#!/bin/sh\\nsrun hostname\\n", array_inx = "0-3%2"}'
)


# ---------------------------------------------------------------------------------------------
# JSON


STRINGS = [
    "plain",
    'quote " backslash \\ slash /',
    "tab\t newline\n cr\r bell\a nul\x00 esc\x1b del\x7f",
    "unicode: é ü 日本 🚀",
    "",
]


def test_encoder_output_is_json_python_reads_back(short_dir: Path) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    cases = ", ".join(lua_string(s) for s in STRINGS)
    code = f"""
local strings = {{ {cases} }}
for _, s in ipairs(strings) do io.write(J.encode({{s = s, n = 42, f = 0.5, t = true}}), "\\n") end
io.write(J.encode({{big = 4294967294, neg = -3, nested = {{a = {{b = "c"}}}}}}), "\\n")
"""
    proc = subprocess.run(
        [str(LUA), "-"],
        input=(MOCK % lua_string(str(script)) + code).encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    for s, line in zip(STRINGS, lines, strict=False):
        assert json.loads(line) == {"s": s, "n": 42, "f": 0.5, "t": True}
    assert json.loads(lines[-1]) == {"big": NO_VAL, "neg": -3, "nested": {"a": {"b": "c"}}}
    assert "\\u0000" in lines[2] and "\\u001b" in lines[2]


def test_encoder_sends_bytes_that_are_not_utf8_as_they_are(short_dir: Path) -> None:
    """The advisor decodes with surrogateescape, so the script hashes as sent (PROTOCOL.md)."""
    script = _render(short_dir, "/nonexistent.sock")
    proc = subprocess.run(
        [str(LUA), "-"],
        input=(MOCK % lua_string(str(script)) + 'emit({s = "a\\128b\\226\\130"})').encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b'{"s":"a\x80b\xe2\x82"}\n'
    decoded = json.loads(proc.stdout.decode("utf-8", "surrogateescape"))
    assert decoded["s"].encode("utf-8", "surrogateescape") == b"a\x80b\xe2\x82"


def test_decoder_round_trips_what_python_writes(short_dir: Path) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    values = [
        {"v": 1, "ok": True, "set": {"req_nodes": "n[1-2]", "min_nodes": 2}, "lv": 1.0123},
        {"s": 'q"\\/\b\f\n\r\t\u0001', "u": "é日🚀", "a": [1, -2, 3.5e-3, 1e10, 0, -0.25]},
        {"nested": [[[1]], {}], "t": True, "f": False, "e": ""},
    ]
    code = "".join(
        f"emit(J.decode({lua_string(json.dumps(v, ensure_ascii=ea))}))\n"
        for v in values
        for ea in (True, False)
    )
    out = run_lua(script, code)
    assert out == [v for v in values for _ in (True, False)]


def test_decoder_null_and_whitespace(short_dir: Path) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    out = run_lua(
        script,
        'local v = J.decode(\' { "class" : null , "x" : [ 1 ] } \\r\')\n'
        "emit({null = v.class == J.JSON_NULL, x = v.x})",
    )
    assert out == [{"null": True, "x": [1]}]


# lua-cjson 2.1.0 also takes "1." and raw control characters inside strings; the advisor never
# writes either and every field it sets is type-checked, so they are left out here.
BAD_JSON = [
    "",
    "{",
    '{"a":1,}',
    "[1,]",
    "[1 2]",
    "01",
    ".5",
    "-",
    "1e",
    "+1",
    '"\\x"',
    '"\\u12"',
    '"\\ud800"',
    '"\\udc00x"',
    '"unterminated',
    '{"a":1}x',
    "nul",
    "NaN",
    "Infinity",
    "-inf",
    "0x10",
    "'a'",
    "{a:1}",
    "[" * 40 + "]" * 40,
]


@pytest.mark.parametrize("text", BAD_JSON)
def test_decoder_rejects_malformed_json(short_dir: Path, text: str) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    (out,) = run_lua(
        script, f"local v, e = J.decode({lua_string(text)}); emit({{v = v == nil, e = e}})"
    )
    assert out["v"] is True and out["e"], text


# ---------------------------------------------------------------------------------------------
# GPU requests


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("gres:gpu:v100:2", "gres:gpu:2"),
        ("gres:gpu:V100:2", "gres:gpu:2"),  # models match case-insensitively
        ("gres:gpu:v100", "gres:gpu:1"),
        ("gres:gpu:v100:1,gres:gpu:2", "gres:gpu:3"),
        ("gres:shard:1,gres:gpu:v100:2", "gres:shard:1,gres:gpu:2"),
        ("gres:gpu:v100-a0:2", "gres:gpu:v100-a0:2"),  # a label: pinned, kept
        ("gres:gpu:a40:1", "gres:gpu:a40:1"),  # 'A40' is a label here, not a model
        ("gres:gpu:h100:1", "gres:gpu:h100:1"),  # unknown type: kept, Slurm will say
        ("gres:gpu:2", "gres:gpu:2"),
        ("gres/gpu:v100:4", "gres/gpu:4"),  # 24.11 writes gres/ and refuses gres:
        ("gres:gpu:v100:x", "gres:gpu:v100:x"),  # unreadable: as written
    ],
)
def test_translate_model_types(short_dir: Path, tres: str, expected: str) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    assert run_lua(script, f"emit(J.translate({lua_string(tres)}))") == [expected]


@pytest.mark.parametrize(
    ("job", "value", "expected"),
    [
        (
            '{tres_per_node = "gres:gpu:2"}',
            "gres:gpu:a:1,gres:gpu:b:1",
            "gres:gpu:a:1,gres:gpu:b:1",
        ),
        (
            '{tres_per_node = "gres/gpu:2"}',
            "gres:gpu:a:1,gres:gpu:b:1",
            "gres/gpu:a:1,gres/gpu:b:1",
        ),
        ('{tres_per_job = "gres/gpu:a:2"}', "gres:gpu:a:2", "gres/gpu:a:2"),
        ("{}", "gres:gpu:a:2", "gres:gpu:a:2"),  # nothing says: as the advisor wrote it
    ],
)
def test_tres_written_with_the_releases_prefix(
    short_dir: Path, job: str, value: str, expected: str
) -> None:
    """22.05 stores and accepts only gres:gpu:..., 24.11 only gres/gpu:... (both checked on the
    testbed): the advisor's values are written the way the job's own request was."""
    script = _render(short_dir, "/nonexistent.sock")
    code = f"emit(J.with_prefix({lua_string(value)}, J.tres_prefix({job})))"
    assert run_lua(script, code) == [expected]


@pytest.mark.parametrize(
    ("job", "gpus"),
    [
        ("{}", False),
        ('{tres_per_node = "gres:shard:1"}', False),
        ('{tres_per_node = "gres:gpu:0"}', False),
        ('{tres_per_job = "gres:gpu:1"}', True),
        ('{tres_per_task = "gres:gpu:v100:1"}', True),
        ('{tres_per_socket = "gres:gpu:1"}', True),
        ('{tres_per_node = "gres:gpu:weird:spec:here"}', True),
    ],
)
def test_which_jobs_ask_for_gpus(short_dir: Path, job: str, gpus: bool) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    assert run_lua(script, f"emit({{g = J.asks_gpus({job})}})") == [{"g": gpus}]


# ---------------------------------------------------------------------------------------------
# The submit path


def test_route_answer_is_applied_and_request_carries_the_job(short_dir: Path, serve) -> None:
    server = serve(
        answer(
            set={
                "req_nodes": "n1",
                "tres_per_node": "gres:gpu:v100-a0:1,gres:gpu:v100-a1:1",
                "tres_per_job": "",
                "min_nodes": 1,
                "max_nodes": 1,
                "admin_comment": "slurm-pal/0.1.0 route r=t1",
                "features": "sneaky",  # not whitelisted: ignored
                "partition": "other",
            },
            **{"class": "A", "lv": 1.0, "token": "t1"},
        )
    )
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB, uid=1234)
    assert out["rc"] == 0 and not out["logs"]
    job = out["job"]
    assert job["req_nodes"] == "n1"
    assert job["tres_per_node"] == "gres:gpu:v100-a0:1,gres:gpu:v100-a1:1"
    assert job["tres_per_job"] == ""
    assert (job["min_nodes"], job["max_nodes"]) == (1, 1)
    assert job["admin_comment"] == "slurm-pal/0.1.0 route r=t1"
    assert "features" not in job and "partition" not in job
    (request,) = server.requests
    assert request["v"] == 1 and request["op"] == "decide"
    # The plugin's deadline travels with the request: now + the timeout, in epoch seconds.
    assert abs(request["deadline"] - time.time()) < 5  # same clock; a wide margin, not timing
    sent = request["job"]
    assert sent["uid"] == 1234 and sent["user"] == "uid:1234"
    assert sent["tres_per_node"] == "gres:gpu:v100:2"
    assert sent["name"] == "train" and sent["comment"] == "pal:app=bert"
    assert sent["num_tasks"] == 1 and "min_nodes" not in sent and "max_nodes" not in sent
    assert sent["script"] == "#!/bin/sh\nsrun hostname\n" and sent["script_size"] == 24
    assert sent["array"] == "0-3%2"


def test_script_is_sent_as_a_bounded_prefix(short_dir: Path, serve) -> None:
    server = serve(answer(action="pass"))
    script = _render(short_dir, str(server.path))
    submit(
        script,
        '{tres_per_node = "gres:gpu:1", user_name = "alice", '
        'script = "#!/bin/sh\\n" .. string.rep("x", 40000)}',
    )
    sent = server.requests[0]["job"]
    assert len(sent["script"]) == 16384 and sent["script_size"] == 40010
    assert sent["user"] == "alice"


def test_cpu_jobs_are_not_sent(short_dir: Path, serve) -> None:
    server = serve(answer())
    script = _render(short_dir, str(server.path))
    out = submit(script, '{name = "cpu", tres_per_node = "gres:shard:1", min_nodes = 2}')
    assert server.requests == [] and not out["logs"]
    assert out["job"] == {"name": "cpu", "tres_per_node": "gres:shard:1", "min_nodes": 2}


def _failed_open(out: dict) -> None:
    """Accepted as written with the model type translated, and one log line."""
    assert out["rc"] == 0
    assert out["job"]["tres_per_node"] == "gres:gpu:2"
    assert "req_nodes" not in out["job"] and "admin_comment" not in out["job"]
    assert len(out["logs"]) == 1 and "accepted as written" in out["logs"][0]


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (b"this is not json\n", "not JSON"),
        (b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":"n1"}', "receive: closed"),
        (b"", "receive: closed"),
        (b'{"v":1,"ok":false,"error":"boom"}\n', "advisor error: boom"),
        (b'{"v":1,"ok":true,"action":"explode","set":{}}\n', "unknown action"),
        (b'{"v":1,"ok":true,"action":"route","set":[1]}\n', "'set' is not an object"),
        (b'{"v":1,"ok":true,"action":"route","set":"x"}\n', "'set' is not an object"),
        (b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":1}}\n', "not a string"),
        (b'{"v":1,"ok":true,"action":"route","set":{"min_nodes":"1"}}\n', "node count"),
        (b'{"v":1,"ok":true,"action":"route","set":{"min_nodes":1.5}}\n', "node count"),
        (
            b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":"n1","max_nodes":-1}}\n',
            "node count",
        ),
        (b"[]\n", '"ok": true'),
        (b'"a string"\n', "not a JSON object"),
    ],
)
def test_garbage_answers_fail_open(short_dir: Path, serve, reply: bytes, why: str) -> None:
    server = serve(lambda _line: reply)
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB)
    _failed_open(out)
    assert why in out["logs"][0]


def test_stalled_advisor_times_out_and_fails_open(short_dir: Path, serve) -> None:
    server = serve(lambda _line: None)  # accepts, reads, never answers
    script = _render(short_dir, str(server.path), timeout_ms=200)
    out = submit(script, GPU_JOB)
    _failed_open(out)
    assert "timeout" in out["logs"][0]
    assert len(server.requests) == 1


class KeptServer:
    """A Unix-socket server that answers every request line of a connection in turn, as the
    advisor does; ``respond(n, line)`` (n counts requests from 1) gives the bytes to send, or
    None to close the connection without answering. ``connections`` counts accepts."""

    def __init__(self, path: Path, respond: Callable[[int, bytes], bytes | None]) -> None:
        self.path = path
        self.respond = respond
        self.requests: list[dict] = []
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                self.requests.append(json.loads(line))
                reply = self.respond(len(self.requests), line)
                if reply is None:
                    return
                try:
                    conn.sendall(reply)
                except OSError:  # the plugin gave up on this connection
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def kept_server(short_dir: Path) -> Iterator[Callable[..., KeptServer]]:
    servers: list[KeptServer] = []

    def start(respond: Callable[[int, bytes], bytes | None]) -> KeptServer:
        servers.append(KeptServer(short_dir / "kept.sock", respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


SUBMIT_MANY = """
local socket = require("socket")
local results = {}
for i = 1, %d do
  local job = %s
  local rc = slurm_job_submit(job, {}, 1000)
  results[i] = {rc = rc, req_nodes = job.req_nodes or "", logs = #LOGS}
  %s
end
emit(results)
"""


def _routed_to(n: int, node: str = "n%d") -> bytes:
    body = {"v": 1, "ok": True, "action": "route", "set": {"req_nodes": node % n}}
    return (json.dumps(body) + "\n").encode()


def test_a_burst_goes_over_one_kept_connection(short_dir: Path, kept_server) -> None:
    """slurmctld runs the script one call at a time: one connection carries every request of
    a burst, each job gets its own answer."""
    server = kept_server(lambda n, _line: _routed_to(n))
    script = _render(short_dir, str(server.path))
    (results,) = run_lua(script, SUBMIT_MANY % (5, GPU_JOB, ""))
    assert [r["req_nodes"] for r in results] == [f"n{i}" for i in range(1, 6)], results
    assert all(r["rc"] == 0 and r["logs"] == 0 for r in results)
    assert len(server.requests) == 5 and server.connections == 1


def test_a_kept_connection_the_advisor_closed_is_replaced(short_dir: Path, serve) -> None:
    """An advisor that closes after each answer (idle timeout, restart): every job is still
    asked and answered, on a new connection."""
    server = serve(answer(set={"req_nodes": "n1"}))
    script = _render(short_dir, str(server.path))
    (results,) = run_lua(script, SUBMIT_MANY % (3, GPU_JOB, "socket.sleep(0.05)"))
    assert [(r["req_nodes"], r["logs"]) for r in results] == [("n1", 0)] * 3
    assert len(server.requests) == 3


def test_a_request_the_advisor_did_not_answer_on_the_kept_connection_goes_again(
    short_dir: Path, kept_server
) -> None:
    """The advisor closes the kept connection as the next request goes out (its idle close
    racing the send): the plugin asks once more on a new connection instead of failing open."""
    server = kept_server(lambda n, _line: None if n == 2 else _routed_to(n))
    script = _render(short_dir, str(server.path))
    (results,) = run_lua(script, SUBMIT_MANY % (2, GPU_JOB, ""))
    assert [(r["req_nodes"], r["logs"]) for r in results] == [("n1", 0), ("n3", 0)]
    assert server.connections == 2 and len(server.requests) == 3


def test_a_late_answer_is_never_read_as_the_next_jobs(short_dir: Path, kept_server) -> None:
    """The first answer comes after the plugin's timeout: that job fails open, its connection
    is dropped, and the next job gets its own answer, not the late one."""

    def respond(n: int, _line: bytes) -> bytes:
        if n == 1:
            time.sleep(0.5)  # past the 200 ms timeout
        return _routed_to(n)

    server = kept_server(respond)
    script = _render(short_dir, str(server.path), timeout_ms=200)
    (results,) = run_lua(script, SUBMIT_MANY % (2, GPU_JOB, "socket.sleep(0.6)"))
    assert results[0]["req_nodes"] == "" and results[0]["logs"] == 1  # failed open
    assert results[1]["req_nodes"] == "n2" and results[1]["logs"] == 1
    assert server.connections == 2


def test_no_socket_fails_open(short_dir: Path) -> None:
    script = _render(short_dir, str(short_dir / "absent.sock"))
    out = submit(script, GPU_JOB)
    _failed_open(out)
    assert "connect" in out["logs"][0]
    assert "job of uid 1000 (uid:1000, name 'train') accepted as written" in out["logs"][0]


def test_a_fail_open_line_names_what_finds_the_job(short_dir: Path) -> None:
    """Slurm has not numbered the job when the plugin runs: the advisor's count gets the time,
    uid, user and job name (tabs and newlines in them made blanks), then why."""
    sock = short_dir / "absent.sock"
    script = _render(short_dir, str(sock))
    job = GPU_JOB.replace('name = "train"', 'name = "a\\tb\\nc", user_name = "alice"')
    before = time.time()
    submit(script, job, uid=1234)
    (line,) = sock.with_name("absent.sock.failopen").read_text().splitlines()
    epoch, uid, user, name, why = line.split("\t")
    assert before - 1 <= int(epoch) <= time.time() + 1
    assert (uid, user, name) == ("1234", "alice", "a b c")
    assert why.startswith("connect ")


def test_socket_without_a_listener_fails_open(short_dir: Path) -> None:
    path = short_dir / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: connection refused
    script = _render(short_dir, str(path))
    _failed_open(submit(script, GPU_JOB))


def test_pass_answer_with_translation(short_dir: Path, serve) -> None:
    server = serve(
        answer(
            action="pass",
            set={"tres_per_node": "gres:gpu:2", "admin_comment": "slurm-pal/0.1.0 pass why=x"},
        )
    )
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB)
    assert out["job"]["tres_per_node"] == "gres:gpu:2" and "req_nodes" not in out["job"]
    assert out["job"]["admin_comment"].startswith("slurm-pal/0.1.0 pass")
    assert not out["logs"]


def test_wait_answer_keeps_the_request_and_excludes_the_nodes(short_dir: Path, serve) -> None:
    server = serve(
        answer(
            action="wait",
            set={
                "exc_nodes": "n[1-2]",
                "admin_comment": "slurm-pal/0.1.0 wait r=abc exc=n[1-2] why=x",
            },
        )
    )
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB)
    assert out["job"]["exc_nodes"] == "n[1-2]" and "req_nodes" not in out["job"]
    assert out["job"]["admin_comment"].startswith("slurm-pal/0.1.0 wait r=abc")
    assert not out["logs"]


def test_deny_answer_refuses_the_job_and_tells_the_user(short_dir: Path, serve) -> None:
    why = "GPU types here are PM labels the advisor assigns; ask for the GPU model instead (v100)"
    server = serve(answer(action="deny", set={}, reason=why))
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB)
    assert out["rc"] == -1  # slurm.ERROR: sbatch fails with the message
    assert out["user_messages"] == [f"slurm-pal: {why}"]
    assert len(out["logs"]) == 1 and "refused" in out["logs"][0]


def test_a_field_slurm_refuses_is_undone(short_dir: Path, serve) -> None:
    """A job_desc that raises on one assignment (as slurmctld's does for a bad value): the
    fields already applied are restored and the job fails open."""
    server = serve(
        answer(set={"req_nodes": "n1", "tres_per_node": "gres:gpu:v100-a0:2", "max_nodes": 1})
    )
    script = _render(short_dir, str(server.path))
    code = """
local store = {tres_per_node = "gres:gpu:v100:2", req_nodes = "n[1-2]"}
local job = setmetatable({}, {
  __index = store,
  __newindex = function(t, k, v)
    if k == "max_nodes" then error("refused") end
    store[k] = v
  end,
})
local rc = slurm_job_submit(job, {}, 1000)
emit({rc = rc, job = store, logs = LOGS})
"""
    (out,) = run_lua(script, code)
    assert out["rc"] == 0
    assert out["job"] == {"tres_per_node": "gres:gpu:2", "req_nodes": "n[1-2]"}
    assert "internal error" in out["logs"][0]


def test_modify_by_privileged_passes_untouched_user_modify_is_translated(
    short_dir: Path, serve
) -> None:
    server = serve(answer())
    script = _render(short_dir, str(server.path))
    code = """
local a = {tres_per_node = "gres:gpu:v100:1", req_nodes = "n2"}
local b = {tres_per_node = "gres:gpu:v100:1"}
local c = {tres_per_node = "gres:gpu:v100:1"}
emit({rc = slurm_job_modify(a, {}, {}, 0), job = a})
emit({rc = slurm_job_modify(b, {}, {}, 77), job = b})
emit({rc = slurm_job_modify(c, {}, {}, 1000), job = c, logs = LOGS})
"""
    a, b, c = run_lua(script, code)
    assert a == {"rc": 0, "job": {"tres_per_node": "gres:gpu:v100:1", "req_nodes": "n2"}}
    assert b == {"rc": 0, "job": {"tres_per_node": "gres:gpu:v100:1"}}
    assert c["rc"] == 0 and c["job"] == {"tres_per_node": "gres:gpu:1"}
    assert len(c["logs"]) == 1
    assert server.requests == []


def test_missing_lua_socket_fails_open(short_dir: Path) -> None:
    """Without lua-socket the script still loads and every GPU job fails open."""
    script = _render(short_dir, str(short_dir / "x.sock"))
    code = 'package.preload["socket.unix"] = function() error("no module") end\n'
    proc = subprocess.run(
        [str(LUA), "-"],
        input=code + MOCK % lua_string(str(script)) + SUBMIT % (GPU_JOB, 1000),
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "LUA_CPATH": ";;"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    _failed_open(out)
    assert "lua-socket" in out["logs"][0]


def test_missing_lua_cjson_fails_open(short_dir: Path, serve) -> None:
    """Without lua-cjson the script still loads, asks nobody, and every GPU job fails open
    with one line that names the module (printed line by line: no JSON writer here)."""
    server = serve(answer())
    script = _render(short_dir, str(server.path))
    code = (
        'package.preload["cjson"] = function() error("no module") end\n'
        + MOCK % lua_string(str(script))
        + f"local job = {GPU_JOB}\n"
        + "print(slurm_job_submit(job, {}, 1000)); print(job.tres_per_node)\n"
        + "print(job.req_nodes); print(#LOGS); print(LOGS[1])\n"
    )
    proc = subprocess.run([str(LUA), "-"], input=code, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    rc, tres, req_nodes, n_logs, log = proc.stdout.splitlines()
    assert (rc, tres, req_nodes, n_logs) == ("0", "gres:gpu:2", "nil", "1")
    assert "accepted as written" in log and "lua-cjson" in log
    assert server.requests == []


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (b'{"v":1,"ok":true,"pad":"' + b"x" * 1048576 + b'"}\n', "longer than"),
        (b'{"v":1,"ok":true,"x":' + b"[" * 40 + b"]" * 40 + b"}\n", "nested"),
        (b'{"v":1,"ok":true,"action":"route","set":{"min_nodes":1e400}}\n', "node count"),
        (b'{"v":1,"ok":true,"action":"route","set":null,"x":NaN}\n', "not JSON"),
    ],
    # short ids: pytest puts a test's id in PYTEST_CURRENT_TEST, and a 1 MiB one in the
    # environment makes every exec of the test fail (E2BIG) before Lua runs
    ids=["oversized", "too-deep", "huge-number", "nan"],
)
def test_oversized_deep_or_odd_answers_fail_open(
    short_dir: Path, serve, reply: bytes, why: str
) -> None:
    server = serve(lambda _line: reply)
    script = _render(short_dir, str(server.path))
    out = submit(script, GPU_JOB)
    _failed_open(out)
    assert why in out["logs"][0]


def test_null_set_is_no_change_and_numbers_go_out_exact(short_dir: Path, serve) -> None:
    """``"set": null`` changes nothing; a uid near 2^32 and the script size are sent exactly
    (lua-cjson writes 14 significant digits)."""
    server = serve(lambda _line: b'{"v":1,"ok":true,"action":"pass","set":null}\n')
    script = _render(short_dir, str(server.path))
    out = submit(
        script, '{tres_per_node = "gres:gpu:1", script = string.rep("y", 123456)}', 4294967294
    )
    assert out["rc"] == 0 and not out["logs"]
    assert out["job"]["tres_per_node"] == "gres:gpu:1"
    sent = server.requests[0]["job"]
    assert sent["uid"] == 4294967294 and sent["script_size"] == 123456


def test_request_passes_the_advisors_own_parser_and_hashes_the_script_as_sent(
    short_dir: Path,
) -> None:
    """What Lua sends is what advisor.protocol and engine.jobdesc read: a script with bytes
    that are not UTF-8 hashes like the file (sha256), a cut one hashes prefix + size."""
    import hashlib

    from slurm_pal.advisor.protocol import parse_request
    from slurm_pal.engine.jobdesc import JobDescription

    lines: list[bytes] = []
    srv = Server(short_dir / "advisor.sock", lambda line: lines.append(line) or b"x\n")
    try:
        script = _render(short_dir, str(srv.path))
        body = b"#!/bin/sh\n# caf\xe9 \xff\xfe\n" + b"srun x\n"
        lua_body = "".join(f"\\{b}" for b in body)
        long = b"#!/bin/sh\n" + b"\xc3\xa9" * 9000  # 18,010 bytes: cut inside a character
        lua_long = '"#!/bin/sh\\n" .. string.rep("\\195\\169", 9000)'
        submit(script, f'{{tres_per_node = "gres:gpu:1", script = "{lua_body}"}}')
        submit(script, f'{{tres_per_job = "gres:gpu:2", num_tasks = 2, script = {lua_long}}}')
    finally:
        srv.close()
    first, second = (parse_request(line) for line in lines)
    assert first.op == second.op == "decide"
    job = JobDescription.from_wire(first.body["job"])
    assert job.script_sha256 == hashlib.sha256(body).hexdigest()
    job = JobDescription.from_wire(second.body["job"])
    assert job.script_size == len(long) and job.num_tasks == 2
    expected = hashlib.sha256(long[:16384] + f"\0size={len(long)}".encode()).hexdigest()
    assert job.script_sha256 == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\nb", "a\\x0ab"),
        ("tab\there\r", "tab\\x09here\\x0d"),
        ("\u202egnp", "\\u202egnp"),
        ("z\u200bw\u2028s\u2066i", "z\\u200bw\\u2028s\\u2066i"),
        ("résumé, 日本 \u2013 ok", "résumé, 日本 \u2013 ok"),  # other UTF-8 is kept
    ],
)
def test_log_lines_escape_what_could_split_or_reorder_them(
    short_dir: Path, text: str, expected: str
) -> None:
    script = _render(short_dir, "/nonexistent.sock")
    assert run_lua(script, f"emit(J.one_line({lua_string(text)}))") == [expected]
