"""Job records over TCP inside munge credentials: real munged daemons, real sockets, a real store.

Two munged with one key stand in for two hosts (``--origin`` gives each its own encoding
address, as a compute node's own munged would), a third has another key (another cluster);
``runuser -u nobody`` makes a credential of an unprivileged user on the "compute host".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_pal.advisor import munge
from slurm_pal.advisor.client import AdvisorClient
from slurm_pal.advisor.jobend import merge_telemetry
from slurm_pal.advisor.server import AdvisorServer
from slurm_pal.advisor.transport import RecordListener, RecordRejected, RecordVerifier
from slurm_pal.hooks.cli import run_hook
from slurm_pal.hooks.spool import flush, send_record, spooled
from tests.helpers.advisor import JOB, Env, FakeJob, RecordingApplier, make_env, wait_saved

NODE_A, NODE_B = "127.0.0.1", "127.0.0.2"  # the two "hosts" (munged --origin)


def _need(*programs: str) -> None:
    missing = [p for p in programs if shutil.which(p) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not installed" if missing else "munged runs as user munge"
        if os.environ.get("CI"):
            pytest.fail(f"record auth tests need munge and root: {why}")
        pytest.skip(why)


@dataclass
class Munge:
    a: str  # socket of host A's munged (origin 127.0.0.1)
    b: str  # host B (origin 127.0.0.2), same key
    other: str  # a munged with another key


@pytest.fixture(scope="module")
def munged() -> Iterator[Munge]:
    _need("munged", "munge", "unmunge", "mungekey", "runuser")
    root = Path(tempfile.mkdtemp(prefix="spal-mu-", dir="/tmp"))  # socket paths stay short
    root.chmod(0o755)  # munged wants its socket's directory searchable by all
    shutil.chown(root, "munge", "munge")
    pids: list[Path] = []

    def start(name: str, key: str, origin: str) -> str:
        key_file = root / f"{key}.key"
        if not key_file.exists():
            subprocess.run(
                ["runuser", "-u", "munge", "--", "mungekey", "-c", "-k", str(key_file)],
                check=True,
            )
        sock, pid = root / f"{name}.sock", root / f"{name}.pid"
        subprocess.run(
            ["runuser", "-u", "munge", "--", "munged", f"--socket={sock}",
             f"--key-file={key_file}", f"--pid-file={pid}", f"--log-file={root / name}.log",
             f"--seed-file={root / name}.seed", f"--origin={origin}"],
            check=True,
        )  # fmt: skip
        pids.append(pid)
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return str(sock)

    try:
        yield Munge(start("a", "k1", NODE_A), start("b", "k1", NODE_B), start("x", "k2", NODE_A))
    finally:
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def _cred_as(user: str, payload: bytes, sock: str) -> str:
    """A credential made by ``user`` (an unprivileged user on a compute host)."""
    out = subprocess.run(
        ["runuser", "-u", user, "--", "munge", "--socket", sock],
        input=payload,
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


# -- munge itself ------------------------------------------------------------------------------


def test_a_credential_says_who_made_it_where_and_is_good_once(munged: Munge) -> None:
    cred = munge.encode(b'{"x": 1}', munged.b)
    got = munge.decode(cred, munged.a)
    assert (got.uid, got.gid, got.host, got.payload) == (0, 0, NODE_B, b'{"x": 1}')
    assert got.ttl > 0 and abs(got.encode_time - time.time()) < 60
    with pytest.raises(munge.MungeError) as replayed:
        munge.decode(cred, munged.a)
    assert replayed.value.code == 17 and "replayed" in str(replayed.value)


def test_credentials_of_another_key_tampered_or_expired_are_refused(munged: Munge) -> None:
    with pytest.raises(munge.MungeError) as other:
        munge.decode(munge.encode(b"{}", munged.other), munged.a)
    assert other.value.code == 14  # invalid credential
    cred = munge.encode(b'{"gpus": [0]}', munged.a)
    body = cred[6:-1]
    flipped = body[:20] + ("A" if body[20] != "A" else "B") + body[21:]
    with pytest.raises(munge.MungeError):
        munge.decode(f"MUNGE:{flipped}:", munged.a)
    short = subprocess.run(
        ["munge", "--socket", munged.a, "--ttl", "1", "--no-input"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    time.sleep(2.2)
    with pytest.raises(munge.MungeError) as expired:
        munge.decode(short, munged.a)
    assert expired.value.code == 15


# -- the checks --------------------------------------------------------------------------------

ADDRESSES = {"n01": frozenset({NODE_A}), "n02": frozenset({NODE_B})}
JOBS: dict[int, tuple[str, ...]] = {5: ("n01",), 6: ("n02",), 7: ("n01", "n02")}


def _verifier(munged: Munge, asked: list[str] | None = None) -> RecordVerifier:
    def addresses(node: str) -> frozenset[str]:
        if asked is not None:
            asked.append(node)
        return ADDRESSES.get(node, frozenset())

    return RecordVerifier(
        munge_socket=munged.a,
        uids=frozenset({0}),
        addresses=addresses,
        job_nodes=JOBS.get,
    )


def _record(job: int, node: str, kind: str = "epilog") -> dict[str, object]:
    return {"record_id": f"{job}:{node}:{kind}", "kind": kind, "job_id": job, "node": node}


def _payload(record: dict[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def test_a_record_from_its_own_node_for_a_job_there_is_accepted(munged: Munge) -> None:
    verifier = _verifier(munged)
    for job, node, sock in ((5, "n01", munged.a), (7, "n02", munged.b), (7, "n01", munged.a)):
        got = verifier.verify(munge.encode(_payload(_record(job, node)), sock))
        assert got.record == _record(job, node) and got.job_checked is True


@pytest.mark.parametrize(
    ("job", "node", "host", "user", "why"),
    [
        (5, "n01", "b", "root", "not node n01"),  # node B claims to be n01
        (6, "n01", "a", "root", "did not run on n01"),  # n01 claims another node's job
        (5, "n01", "a", "nobody", "uid 65534"),  # an unprivileged user on the right host
        (5, "n03", "a", "root", "not node n03"),  # a node Slurm does not know
    ],
)
def test_forged_records_are_refused(
    munged: Munge, job: int, node: str, host: str, user: str, why: str
) -> None:
    sock = munged.a if host == "a" else munged.b
    cred = _cred_as(user, _payload(_record(job, node)), sock)
    with pytest.raises(RecordRejected, match=why):
        _verifier(munged).verify(cred)


def test_no_credential_a_replay_and_a_payload_that_is_no_record_are_refused(
    munged: Munge,
) -> None:
    verifier = _verifier(munged)
    for cred, why in ((None, "no munge credential"), ("{}", "no munge credential")):
        with pytest.raises(RecordRejected, match=why):
            verifier.verify(cred)
    cred = munge.encode(_payload(_record(5, "n01")), munged.a)
    verifier.verify(cred)
    with pytest.raises(RecordRejected, match="replayed"):
        verifier.verify(cred)
    for payload in (
        b'{"kind": "epilog", "job_id": 5}',
        b"[1, 2]",
        b"not json",
        # a payload that would add its own op if it were spliced into the request as text
        _payload(_record(5, "n01"))[:-1] + b', "x": 1}, "op": "decide", "job": {"a": 1}',
    ):
        with pytest.raises(RecordRejected, match="not a record"):
            verifier.verify(munge.encode(payload, munged.a))


def test_a_job_slurm_has_forgotten_is_kept_but_unchecked(munged: Munge) -> None:
    got = _verifier(munged).verify(munge.encode(_payload(_record(99, "n01")), munged.a))
    assert got.job_checked is False


def test_node_addresses_are_asked_again_only_after_a_while(munged: Munge) -> None:
    asked: list[str] = []
    verifier = _verifier(munged, asked)
    for _ in range(3):  # host B keeps claiming n01: Slurm is asked once, not per record
        with pytest.raises(RecordRejected):
            verifier.verify(munge.encode(_payload(_record(5, "n01")), munged.b))
    verifier.verify(munge.encode(_payload(_record(5, "n01")), munged.a))
    assert asked == ["n01"]


# -- the listener in the service ---------------------------------------------------------------


@pytest.fixture
def tcp_served(munged: Munge) -> Iterator[tuple[Env, AdvisorServer, str]]:
    root = Path(tempfile.mkdtemp(prefix="spal-tcp-", dir="/tmp"))
    root.chmod(0o755)
    env = make_env(root)
    server = AdvisorServer(env.state(), root / "adv.sock", refresh_s=3600, replan_s=0)
    server.start()
    addresses = {f"n0{i}": frozenset({NODE_A}) for i in range(1, 5)}
    addresses["n02"] = frozenset({NODE_B})

    def job_nodes(job_id: int) -> tuple[str, ...] | None:
        for job in env.slurm.jobs:
            if job.job_id == job_id:
                return tuple(job.gpus)
        return None

    verifier = RecordVerifier(
        munge_socket=munged.a,
        uids=frozenset({0}),
        addresses=lambda node: addresses.get(node, frozenset()),
        job_nodes=job_nodes,
    )
    listener = RecordListener(server, "127.0.0.1:0", verifier)
    listener.start()
    host, port = listener.bound
    try:
        yield env, server, f"{host}:{port}"
    finally:
        listener.stop()
        server.stop()
        env.close()
        shutil.rmtree(root, ignore_errors=True)


def _line(address: str, message: dict) -> dict:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall((json.dumps(message) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def test_over_tcp_only_credentialed_records_are_served(tcp_served, munged: Munge) -> None:
    env, server, address = tcp_served
    env.slurm.jobs = [FakeJob(5, "RUNNING", gpus={"n01": [0]})]
    for op in ("decide", "replan", "reload", "health", "stats"):
        answer = _line(address, {"v": 1, "op": op, "job": JOB})
        assert answer["ok"] is False and "not served over TCP" in answer["error"]
    # a record in clear, as the Unix socket takes it: refused over TCP
    clear = _line(address, {"v": 1, "op": "record", "record": _record(5, "n01", "prolog")})
    assert clear["ok"] is False and "no munge credential" in clear["error"]
    forged = _cred_as("nobody", _payload(_record(5, "n01", "prolog")), munged.a)
    assert _line(address, {"v": 1, "op": "record", "cred": forged})["ok"] is False
    assert send_record(None, _record(5, "n01", "prolog"), 5, tcp=address, munge_socket=munged.a)
    stats = server.counters.snapshot()
    assert stats["records_rejected"] == 2 and stats["records_total"] == 1
    with sqlite3.connect(env.db) as db:
        assert db.execute("SELECT record_id FROM job_records").fetchall() == [("5:n01:prolog",)]


def test_hooks_spool_when_the_advisor_is_away_and_flush_resends_with_new_credentials(
    tcp_served, munged: Munge, tmp_path: Path
) -> None:
    env, server, address = tcp_served
    env.slurm.jobs = [FakeJob(6, "RUNNING", gpus={"n02": [1]})]
    spool = tmp_path / "spool"
    hook_env = {"SLURM_JOB_ID": "6", "SLURMD_NODENAME": "n02", "SLURM_JOB_GPUS": "1"}
    # the advisor's port is closed: the record stays in the spool
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    run_hook("epilog", socket_path=None, spool_dir=spool, timeout_s=1, tcp=dead,
             munge_socket=munged.b, env=hook_env, telemetry=False)  # fmt: skip
    assert [p.name for p in spooled(spool)] == ["6.n02.epilog.json"]
    result = flush(spool, None, 5, tcp=address, munge_socket=munged.b)
    assert result.delivered == ["6.n02.epilog.json"] and spooled(spool) == []
    # the same record again (a copy that stayed behind): a fresh credential, a duplicate
    (spool / "6.n02.epilog.json").write_text(json.dumps(_record(6, "n02")))
    assert flush(spool, None, 5, tcp=address, munge_socket=munged.b).delivered
    stats = server.counters.snapshot()
    assert stats["records_total"] == 2 and stats["records_duplicate"] == 1
    with sqlite3.connect(env.db) as db:
        assert db.execute("SELECT count(*) FROM job_records").fetchone() == (1,)


def test_a_multi_node_jobs_first_epilog_frees_all_its_nodes_and_the_rest_start_no_round(
    tcp_served, munged: Munge
) -> None:
    """Job 7 held n02 and n03; job 9 waits for 4 GPUs on each of two nodes. n02's Epilog
    alone frees too little for job 9: the round must count n03 free as well."""
    env, server, address = tcp_served
    server.applier = recorder = RecordingApplier()
    env.slurm.jobs = [
        FakeJob(1, "RUNNING", gpus={"n01": [0, 1, 2, 3]}),
        FakeJob(7, "RUNNING", gpus={"n02": [0, 1, 2, 3], "n03": [0, 1, 2, 3]}),
        FakeJob(4, "RUNNING", gpus={"n04": [0, 1, 2, 3]}),
    ]
    server.state.refresh()
    wide = {**JOB, "tres_per_node": "gres:gpu:4", "min_nodes": 2, "max_nodes": 2}
    client = AdvisorClient(str(server.socket_path))
    answer = client.request({"op": "decide", "job": wide})
    assert answer["action"] == "pass" and answer["token"]
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(9, "PENDING", answer["set"]["admin_comment"]))
    server.state.refresh()
    first = {**_record(7, "n02"), "slurm_gpus": [0, 1, 2, 3]}
    got = _line(address, {"v": 1, "op": "record", "cred": munge.encode(_payload(first), munged.b)})
    assert got["ok"] is True and got["replan"]["applied"] == [9]
    (update,) = recorder.updates
    assert update.fields["req_nodes"] == "n[02-03]"
    second = {**_record(7, "n03"), "slurm_gpus": [0, 1, 2, 3]}
    got = _line(address, {"v": 1, "op": "record", "cred": munge.encode(_payload(second), munged.a)})
    assert got["ok"] is True and got["duplicate"] is False and "replan" not in got
    assert server.counters.snapshot()["replans_at_job_end"] == 1


def test_a_multi_node_jobs_telemetry_is_merged_into_one_history_row(tcp_served, munged) -> None:
    env, server, address = tcp_served
    client = AdvisorClient(str(server.socket_path))
    answer = client.request({"op": "decide", "job": JOB})
    wait_saved(env, answer["token"])
    comment = answer["set"]["admin_comment"]
    env.slurm.jobs = [FakeJob(77, "RUNNING", comment, gpus={"n01": [0], "n02": [0]})]
    server.state.refresh()
    server.state.writer.call(lambda s: None)
    parts = [
        ("n01", munged.a, {"dram_util": 60.0, "fu_util": 10.0, "weight_total": 10.0}),
        ("n02", munged.b, {"dram_util": 20.0, "fu_util": 30.0, "weight_total": 30.0}),
    ]
    for node, sock, figures in parts:
        telemetry = {**figures, "source": "nvml", "busy_fraction": 1.0, "samples": 2}
        record = {**_record(77, node), "telemetry": telemetry}
        got = _line(address, {"v": 1, "op": "record", "cred": munge.encode(_payload(record), sock)})
        assert got["ok"] is True
    server.state.writer.call(lambda s: None)
    with sqlite3.connect(env.db) as db:
        rows = db.execute("SELECT dram_util, fu_util FROM job_history WHERE job_id = '77'")
        assert rows.fetchall() == [(30.0, 25.0)]  # (60*10 + 20*30) / 40, (10*10 + 30*30) / 40


def test_merge_telemetry_weights_by_busy_time_and_keeps_a_single_node_as_is() -> None:
    one = {"kind": "epilog", "node": "n1", "telemetry": {"dram_util": 5.0, "fu_util": 6.0}}
    assert merge_telemetry([one]) == {"dram_util": 5.0, "fu_util": 6.0}
    two = {
        "kind": "epilog",
        "node": "n2",
        "telemetry": {"dram_util": 15.0, "fu_util": 2.0, "weight_total": 4.0, "busy_fraction": 0.5},
    }
    first = {**one, "telemetry": {**one["telemetry"], "weight_total": 2.0}}
    merged = merge_telemetry([first, two, {"kind": "prolog", "node": "n3"}])
    assert merged is not None
    assert merged["dram_util"] == 10.0 and merged["fu_util"] == 4.0  # equal busy time: 2 s each
    assert merged["nodes"] == ["n1", "n2"] and merged["weight_total"] == 6.0
    assert merge_telemetry([{"kind": "epilog", "node": "n1"}]) is None


def test_a_taken_port_stops_the_start_before_the_socket_exists() -> None:
    root = Path(tempfile.mkdtemp(prefix="spal-tcp-", dir="/tmp"))
    root.chmod(0o755)
    env = make_env(root)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    server = AdvisorServer(env.state(), root / "adv.sock", refresh_s=3600, replan_s=0,
                           listen=address)  # fmt: skip
    try:
        with pytest.raises(OSError):
            server.start()
        assert not (root / "adv.sock").exists()
    finally:
        server.stop()
        taken.close()
        env.close()
        shutil.rmtree(root, ignore_errors=True)


def test_scontrol_node_and_job_lines_give_addresses_and_nodes() -> None:
    from slurm_pal.adapters.slurm.hosts import SlurmHosts, parse_job_nodes, parse_node_names
    from slurm_pal.adapters.slurm.state import SlurmQueryError

    node = (
        "NodeName=n01 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost "
        "Version=22.05.8 OS=Linux 6.1.0 #1 SMP\nNodeName=n02 NodeAddr=n02 NodeHostName=n02\n"
    )
    assert parse_node_names(node) == {"n01": ("127.0.0.1", "localhost", "n01"), "n02": ("n02",)}
    job = "JobId=7 JobName=wrap UserId=nobody(65534) NodeList=n[01-02,04] BatchHost=n01\n"
    assert parse_job_nodes(job) == ("n01", "n02", "n04")
    assert parse_job_nodes("JobId=8 JobName=x NodeList=(null)\n") == ()
    assert parse_job_nodes("") is None
    hosts = SlurmHosts(runner=lambda args: (0, node if args[2] == "node" else job))
    assert "127.0.0.1" in hosts.node_addresses("n01")
    assert hosts.node_addresses("n09") == frozenset()  # not in Slurm's answer
    assert hosts.job_nodes(7) == ("n01", "n02", "n04")
    # what 22.05 answers for a node or job it does not know, and when slurmctld is away
    gone = SlurmHosts(runner=lambda args: (1, "Node n09 not found\n"))
    assert gone.node_addresses("n09") == frozenset()
    forgotten = SlurmHosts(
        runner=lambda args: (1, "slurm_load_jobs error: Invalid job id specified\n")
    )
    assert forgotten.job_nodes(7) is None  # stored, unchecked
    away = SlurmHosts(
        runner=lambda args: (1, "Unable to contact slurm controller (connect failure)")
    )
    with pytest.raises(SlurmQueryError):  # the record is refused and stays spooled
        away.job_nodes(7)
    with pytest.raises(SlurmQueryError):
        away.node_addresses("n01")


def test_over_tcp_malformed_lines_get_the_protocols_error_answers(tcp_served) -> None:
    """The TCP port reads lines with the protocol's one parser: deep nesting, NaN and other
    versions are refused in an answer, and the port keeps serving."""
    _, server, address = tcp_served
    host, port = address.rsplit(":", 1)
    for line in (b"[" * 50_000 + b"\n", b'{"v": 1, "op": "record", "x": NaN}\n', b'{"v": 2}\n'):
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(line)
            answer = json.loads(conn.makefile("rb").readline())
        assert answer["ok"] is False and answer["error"], line[:20]
    assert server.counters.snapshot()["bad_requests"] >= 3
    assert _line(address, {"v": 1, "op": "health"})["ok"] is False  # still answering
