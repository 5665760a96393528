"""The advisor service on a real Unix socket with a real store (Slurm fed from captured JSON)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.client import AdvisorClient, AdvisorUnavailable
from slurm_pal.advisor.server import AdvisorServer, sweep_spool
from slurm_pal.advisor.trim import BadRequestTrimmer
from slurm_pal.core.resolve import resolve
from slurm_pal.engine.decide import decide
from slurm_pal.engine.jobdesc import JobDescription
from tests.helpers.advisor import (
    JOB,
    Env,
    FakeJob,
    RecordingApplier,
    short_env,
    wait_saved,
)


@pytest.fixture
def adv_env() -> Iterator[Env]:
    with short_env("spal-adv-") as the_env:
        yield the_env


@pytest.fixture
def served(adv_env: Env) -> Iterator[tuple[Env, AdvisorServer, AdvisorClient]]:
    env = adv_env
    state = env.state()
    server = AdvisorServer(state, env.root / "adv.sock", refresh_s=3600, replan_s=0)
    server.start()
    try:
        yield env, server, AdvisorClient(str(env.root / "adv.sock"))
    finally:
        server.stop()


def _raw(path: Path, payload: bytes, *, close_write: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(payload)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def test_decide_answers_equal_decide_on_the_same_state(served) -> None:
    env, server, client = served
    for wire in (JOB, {**JOB, "tres_per_node": "gres:gpu:1"}, {**JOB, "comment": ""}):
        expected_cluster = server.state.cluster_snapshot()
        view = server.state.view
        job = JobDescription.from_wire(wire)
        resolution = resolve(
            job.job_request(), server.state.store_view, server.state.resolve_config
        )
        answer = client.request({"op": "decide", "job": wire})
        assert answer["ok"] is True and answer["action"] == "route"
        expected = decide(
            job,
            job_class=resolution.job_class,
            class_reason=resolution.reason,
            cluster=expected_cluster,
            labels=view.static.labels,
            policy=server.state.policy,
            version=server.state.version,
            token=answer["token"],
            partition_nodes=view.partition_nodes,
            default_partition=view.default_partition,
        ).to_wire()
        assert answer == expected
    assert answer["class"] == "A"  # the default class, without pal:app
    stats = client.request({"op": "stats"})
    assert stats["decide_total"] == 3 and stats["decide_route"] == 3
    assert stats["decide_ms_p50"] is not None and stats["decide_ms_p99"] >= stats["decide_ms_p50"]
    assert stats["runtimes"]["limited"] == {"limit_share": None, "jobs": 0}  # none ended yet
    wait_saved(env, answer["token"])
    with Store(env.db) as store:
        row = store.decision(answer["token"])
    assert row is not None and row["answer"] == answer
    # The store keeps the request without the batch script: its hash and the #PAL app only.
    stored = {k: v for k, v in JOB.items() if k not in ("script", "comment")}
    assert row["job"] == {
        **stored,
        "script_hash": JobDescription.from_wire(JOB).script_sha256,
        "script_app": "resnet",
    }
    assert "script" not in json.dumps(row["job"]).replace("script_", "")
    back = JobDescription.from_wire(row["job"])
    assert back.script_sha256 == JobDescription.from_wire(JOB).script_sha256
    assert back.job_request().history_key == JobDescription.from_wire(JOB).job_request().history_key


def test_cpu_jobs_pass_untouched(served) -> None:
    _env, _server, client = served
    answer = client.request({"op": "decide", "job": {"user": "bob", "name": "cpu"}})
    assert answer["action"] == "pass" and answer["set"] == {} and answer["token"] is None


def test_malformed_requests_get_errors_and_the_service_keeps_answering(served) -> None:
    env, _server, client = served
    path = env.root / "adv.sock"
    not_json = json.loads(_raw(path, b"this is not json\n"))
    assert not_json["ok"] is False and "not JSON" in not_json["error"]
    unknown = json.loads(_raw(path, b'{"v":1,"op":"dance"}\n'))
    assert unknown["ok"] is False and "decide" in unknown["valid"]
    bad_job = json.loads(_raw(path, b'{"v":1,"op":"decide","job":{"min_nodes":"two"}}\n'))
    assert bad_job["ok"] is False and "min_nodes" in bad_job["error"]
    huge = _raw(path, b"x" * (2 << 20) + b"\n")
    assert b"longer than" in huge
    assert _raw(path, b'{"v":1,"op":"hea') == b""  # half a line, then the peer closes
    # several requests on one connection, answered in order
    two = _raw(path, b'{"v":1,"op":"health"}\n{"v":1,"op":"stats"}\n').splitlines()
    assert [json.loads(x)["ok"] for x in two] == [True, True] and b"uptime_s" in two[1]
    stats = client.request({"op": "stats"})
    assert stats["bad_requests"] == 4 and stats["decide_errors"] == 1
    assert client.request({"op": "health"})["gpus"] == 16


def test_an_unprivileged_peer_is_refused(served) -> None:
    env, _server, client = served
    path = env.root / "adv.sock"
    assert os.stat(path).st_mode & 0o777 == 0o660
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    os.chmod(path, 0o666)  # let nobody connect, so the SO_PEERCRED check is what refuses
    nobody = pwd.getpwnam("nobody").pw_uid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, ask for health
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(nobody)
            answer = AdvisorClient(str(path)).request({"op": "health"}, 5)
            os.write(write, json.dumps(answer).encode())
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    assert json.loads(out) == {"v": 1, "ok": False, "error": "permission denied"}
    assert client.request({"op": "stats"})["peer_refused"] == 1


def test_records_are_applied_once(served) -> None:
    env, _server, client = served
    record = {"record_id": "9:n01:prolog", "kind": "prolog", "job_id": 9, "node": "n01"}
    first = client.request({"op": "record", "record": record})
    again = client.request({"op": "record", "record": record})
    assert first == {"v": 1, "ok": True, "duplicate": False}
    assert again == {"v": 1, "ok": True, "duplicate": True}
    bad = client.request({"op": "record", "record": {**record, "kind": "lunch"}})
    assert bad["ok"] is False and bad["valid"] == ["prolog", "epilog"]
    stats = client.request({"op": "stats"})
    assert stats["records_total"] == 2 and stats["records_duplicate"] == 1
    with Store(env.db) as store:
        assert store.job_records(9) == [record]


def test_an_epilog_with_telemetry_feeds_the_job_history(served) -> None:
    env, server, client = served
    answer = client.request({"op": "decide", "job": JOB})
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(77, "PENDING", admin_comment=answer["set"]["admin_comment"]))
    server.state.refresh()
    server.state.writer.call(lambda s: None)
    telemetry = {"dram_util": 60.0, "fu_util": 10.0, "source": "nvml", "samples": 3}
    record = {
        "record_id": "77:n01:epilog",
        "kind": "epilog",
        "job_id": 77,
        "node": "n01",
        "telemetry": telemetry,
    }
    assert client.request({"op": "record", "record": record})["duplicate"] is False
    with Store(env.db) as store:
        rows = store.history_rows()
    assert len(rows) == 1
    job = JobDescription.from_wire(JOB)
    assert rows[0].key == ("alice", "train", job.script_sha256)
    assert rows[0].app == "resnet"


def test_spool_sweep_applies_files_and_sets_broken_ones_aside(served) -> None:
    env, server, client = served
    spool = env.root / "spool"
    spool.mkdir()
    good = {"record_id": "5:n02:epilog", "kind": "epilog", "job_id": 5, "node": "n02"}
    (spool / "5.n02.epilog.json").write_text(json.dumps(good) + "\n")
    (spool / "6.n02.prolog.json").write_text('{"record_id": "6:n02:prolog", "kind": ')
    (spool / ".7.n02.prolog.json.123.tmp").write_text("{}")  # a hook still writing
    (spool / "8.n02.prolog.json").write_text(json.dumps({**good, "record_id": "5:n02:epilog"}))
    applied, bad = sweep_spool(spool, server.state.apply_record, server.counters)
    assert (applied, bad) == (2, 1)
    assert sorted(p.name for p in spool.iterdir()) == [
        ".7.n02.prolog.json.123.tmp",
        "6.n02.prolog.json.bad",
    ]
    with Store(env.db) as store:
        assert store.job_records(5) == [good]
    stats = client.request({"op": "stats"})
    assert stats["records_duplicate"] == 1 and stats["spool_bad"] == 1
    # by the kind the record says (the second file is the first record again: an epilog)
    assert (stats["spool_applied_epilog"], stats["spool_applied_prolog"]) == (2, 0)


def test_client_reports_an_absent_service(tmp_path: Path) -> None:
    with pytest.raises(AdvisorUnavailable, match="cannot reach"):
        AdvisorClient(str(tmp_path / "none.sock")).request({"op": "health"}, 0.5)


def test_sigterm_stops_the_service_and_removes_the_socket(adv_env: Env) -> None:
    env = adv_env
    sock = env.root / "cli.sock"
    config = env.root / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\nrefresh_s = 0.5\nreplan_s = 0\n'
        f'labels_file = "{env.labels_path}"\n[hooks]\nspool_dir = "{env.root / "spool"}"\n'
    )
    log = (env.root / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "slurm_pal.cli.main", "--db", str(env.db)),
            *("--config", str(config), "serve", "--foreground"),
            *("--pidfile", str(env.root / "pid")),
        ],
        env={**os.environ, "SLURM_CONF": str(env.root / "missing.conf"), "SLURM_PAL_CONFIG": ""},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = AdvisorClient(str(sock))
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and health is None:
            try:
                health = client.request({"op": "health"}, 1)
            except AdvisorUnavailable:
                assert proc.poll() is None, (env.root / "serve.log").read_text()
                time.sleep(0.1)
        assert health is not None and health["ok"] and health["campaign"] == "example"
        # no Slurm here: the refresh fails and is counted, jobs pass, the service stays up
        assert client.request({"op": "stats"})["refresh_errors"] >= 1
        assert (env.root / "pid").read_text().strip() == str(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not sock.exists() and not (env.root / "pid").exists()
        text = (env.root / "serve.log").read_text()
        assert "socket" in text and "removed" in text and "\x1b[" not in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reload_takes_a_new_config_and_the_store_again(served) -> None:
    env, server, client = served
    new = replace(env.config, advisor=replace(env.config.advisor, policy="packed"))
    server.reload_config = lambda: server.state.set_config(new)
    with Store(env.db) as store:
        store.set_application_class("newapp", "B")
    answer = client.request({"op": "reload"})
    assert answer["ok"] and answer["policy"] == "packed" and answer["gpus"] == 16
    decided = client.request({"op": "decide", "job": {**JOB, "comment": "pal:app=newapp"}})
    assert decided["class"] == "B"


def test_cli_health_stats_replan_ask_the_running_service(served) -> None:
    from typer.testing import CliRunner

    from slurm_pal.cli.main import app

    env, _server, _client = served
    runner = CliRunner()
    base = ["--db", str(env.db), "serve", "--socket", str(env.root / "adv.sock")]
    out = runner.invoke(app, [*base, "stats", "--json"], env={"SLURM_PAL_CONFIG": None})
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["decide_total"] == 0
    out = runner.invoke(app, [*base, "health"], env={"SLURM_PAL_CONFIG": None})
    assert out.exit_code == 0 and "example" in out.output and "pal" in out.output
    out = runner.invoke(app, [*base, "replan", "--json"], env={"SLURM_PAL_CONFIG": None})
    assert out.exit_code == 0 and json.loads(out.output)["considered"] == 0
    gone = ["--db", str(env.db), "serve", "--socket", str(env.root / "none.sock"), "health"]
    out = runner.invoke(app, gone, env={"SLURM_PAL_CONFIG": None})
    assert out.exit_code == 1 and "cannot reach" in out.output


def test_an_epilog_is_classified_by_the_active_model_and_a_false_claim_logged(served) -> None:
    import numpy as np

    from slurm_pal.core.classifier import JobClassifier

    env, server, client = served
    points = np.array([[10.0, 90.0], [12.0, 85.0], [80.0, 20.0], [85.0, 15.0]])
    model = JobClassifier(n_classes=2, class_names=["A", "B"]).fit(points)
    with Store(env.db) as store:
        store.save_classifier(model.to_dict(), {}, n_apps=4)
    client.request({"op": "reload"})
    answer = client.request({"op": "decide", "job": JOB})  # claims resnet (class A)
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(88, "PENDING", admin_comment=answer["set"]["admin_comment"]))
    server.state.refresh()
    # The job's binding to its decision is written after the read, in the writer's ordinary
    # lane; a record, urgent, could overtake it and find no claim to compare with.
    server.state.writer.call(lambda s: None)
    telemetry = {"dram_util": 82.0, "fu_util": 18.0, "source": "nvml"}  # memory-bound: B
    record = {"record_id": "88:n01:epilog", "kind": "epilog", "job_id": 88, "node": "n01"}
    client.request({"op": "record", "record": {**record, "telemetry": telemetry}})
    with Store(env.db) as store:
        (row,) = store.history_rows()
        mismatches = store.class_mismatches()
    assert row.measured_class == "B" and row.app == "resnet"
    assert [(m["job_id"], m["claimed_class"], m["measured_class"]) for m in mismatches] == [
        ("88", "A", "B")
    ]


def test_the_socket_belongs_to_the_configured_group(adv_env: Env) -> None:
    import grp

    try:
        gid = grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip("no group 'nogroup' here")
    server = AdvisorServer(
        adv_env.state(), adv_env.root / "g.sock", socket_group="nogroup", refresh_s=3600
    )
    server.start()
    try:
        info = os.stat(adv_env.root / "g.sock")
        assert info.st_gid == gid and info.st_mode & 0o777 == 0o660
    finally:
        server.stop()
    assert not (adv_env.root / "g.sock").exists()


def test_a_stale_socket_is_replaced_a_live_one_is_not(served) -> None:
    env, _server, client = served
    second = AdvisorServer(env.state(), env.root / "adv.sock", refresh_s=3600, replan_s=0)
    with pytest.raises(RuntimeError, match="already listens"):
        second.start()
    assert client.request({"op": "health"})["ok"]  # the first one is untouched
    stale = env.root / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))  # bound, never listening, then closed: a dead service's socket
    third = AdvisorServer(env.state(), stale, refresh_s=3600, replan_s=0)
    third.start()
    try:
        assert AdvisorClient(str(stale)).request({"op": "health"})["ok"]
    finally:
        third.stop()


def _job_9_waits_on_a_full_cluster(served) -> RecordingApplier:  # type: ignore[no-untyped-def]
    """Every GPU busy; job 9 decided (passed: nothing fits) and pending with its comment. The
    server's scontrol updates go to the returned recorder."""
    env, server, client = served
    server.applier = recorder = RecordingApplier()
    env.slurm.jobs = [
        FakeJob(i + 1, "RUNNING", gpus={node: [0, 1, 2, 3]})
        for i, node in enumerate(["n01", "n02", "n03", "n04"])
    ]
    server.state.refresh()
    answer = client.request({"op": "decide", "job": JOB})
    assert answer["action"] == "pass" and answer["reason"].startswith("no free GPUs fit now")
    wait_saved(env, answer["token"])
    env.slurm.jobs.append(FakeJob(9, "PENDING", admin_comment=answer["set"]["admin_comment"]))
    return recorder


def test_an_epilog_record_replans_the_queue_onto_the_gpus_its_job_frees(served) -> None:
    """Slurm holds a job's GPUs until its Epilog ends, and still shows them used: the round
    the Epilog's record starts counts them free, so the queued job is placed on them before
    Slurm can start it anywhere else."""
    _, server, client = served
    recorder = _job_9_waits_on_a_full_cluster(served)
    # a periodic round sees nothing free
    assert server.replan().updates == [] and recorder.updates == []
    record = {
        "record_id": "2:n02:epilog",
        "kind": "epilog",
        "job_id": 2,
        "node": "n02",
        "slurm_gpus": [0, 1, 2, 3],
    }
    got = client.request({"op": "record", "record": record})
    assert got["ok"] is True and got["replan"]["applied"] == [9] and got["replan"]["kept"] == 0
    assert got["replan"]["ms"] >= 0
    (update,) = recorder.updates
    assert update.job_id == 9 and update.fields["req_nodes"] == "n02"  # type: ignore[attr-defined]
    assert client.request({"op": "stats"})["replans_at_job_end"] == 1
    # the same record again (a spooled copy) is a duplicate: no second round
    again = client.request({"op": "record", "record": record})
    assert again["duplicate"] is True and "replan" not in again
    server.replan_on_epilog = False
    other = {**record, "record_id": "3:n03:epilog", "job_id": 3, "node": "n03"}
    assert "replan" not in client.request({"op": "record", "record": other})


def test_a_request_read_past_its_deadline_is_dropped_and_a_late_answer_frees_its_gpus(
    served,
) -> None:
    """After a pause longer than the plugin's timeout the advisor must not reserve GPUs for
    answers nobody reads: a request already past its deadline gets an error (the plugin has
    let the job through as written), and a route sent after the deadline releases its GPUs."""
    _, server, _ = served
    now = [5000.0]
    server.wall_clock = lambda: now[0]
    stale = {"v": 1, "op": "decide", "deadline": 4999.7, "job": JOB}
    answer = server.answer(json.dumps(stale).encode())
    assert answer["ok"] is False and "past its deadline" in str(answer["error"])
    assert server.counters.snapshot()["decide_late"] == 1
    assert server.state.health()["reservations"] == 0
    fresh = {"v": 1, "op": "decide", "deadline": 5000.3, "job": JOB}
    after: list = []
    answer = server.answer(json.dumps(fresh).encode(), after)
    assert answer["action"] == "route" and server.state.health()["reservations"] == 1
    now[0] = 5000.5  # the answer went out after the plugin gave up
    for task in after:
        task()
    assert server.state.health()["reservations"] == 0
    assert server.counters.snapshot()["answers_undelivered"] == 1
    on_time = {"v": 1, "op": "decide", "deadline": 5001.0, "job": JOB}
    after = []
    assert server.answer(json.dumps(on_time).encode(), after)["action"] == "route"
    for task in after:
        task()
    assert server.state.health()["reservations"] == 1


def test_idle_connections_give_way_to_new_ones_and_the_oldest_goes_first(adv_env: Env) -> None:
    """Two idle connections hold both slots: a new request is still answered, and the one
    that waited longest is the one closed for it."""
    env = adv_env
    path = env.root / "bound.sock"
    server = AdvisorServer(
        env.state(), path, refresh_s=3600, replan_s=0, max_connections=2, request_timeout_s=30
    )
    server.start()
    held: list[socket.socket] = []
    try:
        for _ in range(2):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(path))
            held.append(conn)
            time.sleep(0.2)  # accepted one after the other: the first is the oldest
        answer = json.loads(_raw(path, b'{"v":1,"op":"health"}\n'))
        assert answer["ok"] is True
        held[0].settimeout(10)
        assert held[0].recv(100) == b""  # closed to make room
        held[1].setblocking(False)
        with pytest.raises(BlockingIOError):
            held[1].recv(100)  # still open
        assert server.counters.snapshot()["connections_closed_for_room"] == 1
    finally:
        for conn in held:
            conn.close()
        server.stop()


def test_a_request_must_arrive_whole_by_its_deadline_however_it_trickles(adv_env: Env) -> None:
    env = adv_env
    path = env.root / "slow.sock"
    server = AdvisorServer(env.state(), path, refresh_s=3600, replan_s=0, request_timeout_s=0.5)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            started = time.monotonic()
            answer = b""
            for byte in b'{"v":1,"op":"health"}':  # one byte every 0.1 s: each read is quick
                try:
                    conn.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    break
                time.sleep(0.1)
            conn.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                answer = conn.recv(1000)
        assert b"no whole request line within 0.5 s" in answer
        assert time.monotonic() - started < 10
        assert server.counters.snapshot()["requests_timed_out"] == 1
    finally:
        server.stop()


def test_a_kept_connection_serves_many_requests_and_is_closed_quietly_when_idle(
    adv_env: Env,
) -> None:
    """job_submit.lua keeps its connection between submissions: each request on it is answered
    in turn; once it has been idle for the request deadline it is closed without an error line
    (which the plugin could read as its next answer) and not counted as a timed-out request."""
    env = adv_env
    path = env.root / "kept.sock"
    server = AdvisorServer(env.state(), path, refresh_s=3600, replan_s=0, request_timeout_s=0.5)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(path))
            reader = conn.makefile("rb")
            for _ in range(3):
                conn.sendall(b'{"v":1,"op":"health"}\n')
                assert json.loads(reader.readline())["ok"] is True
                time.sleep(0.2)  # idle, but within the deadline
            started = time.monotonic()
            assert reader.readline() == b""  # closed, nothing said
            assert 0.2 < time.monotonic() - started < 5
        assert server.counters.snapshot()["requests_timed_out"] == 0
    finally:
        server.stop()


def _node_uuids(server: AdvisorServer, node: str) -> set[str]:
    labels = server.state.view.static.labels  # type: ignore[union-attr]
    return {labels.uuid_at_slurm_index(node, i) for i in range(4)}


def test_rounds_without_a_slurm_read_see_their_own_updates(served) -> None:
    """Job-end rounds work from the view without re-reading Slurm: a job the first round
    routed is starting as far as the next rounds are concerned (its GPUs held, no second
    update, which Slurm would refuse once it started the job, and which 22.05 refuses on a
    typed job anyway), until a Slurm read shows what Slurm holds; the read's own rounds see
    the update it wrote."""
    env, server, _ = served
    recorder = _job_9_waits_on_a_full_cluster(served)
    server.state.refresh()
    record = {"job_id": 2, "node": "n02", "slurm_gpus": [0, 1, 2, 3]}
    first = server.replan_at_job_end(server.state.released_by(record))
    assert first.applied == [9] and len(recorder.updates) == 1
    second = server.replan_at_job_end(server.state.released_by(record))
    assert second.considered == 0 and second.updates == []
    reserved = {r.job_id: r.uuids for r in server.state.reservations().values()}
    assert set(reserved[9]) <= _node_uuids(server, "n02")  # still held for it
    # Slurm did not start it: a later read shows it pending still, as the first round wrote
    # it, and the next round plans it again: already where it would go, nothing to send.
    (update,) = recorder.updates
    job9 = env.slurm.jobs[-1]
    job9.admin_comment = str(update.fields["admin_comment"])  # type: ignore[attr-defined]
    job9.tres_per_node = "gres:" + str(update.fields["tres_per_node"]).removeprefix("gres:")  # type: ignore[attr-defined]
    env.clock.now += 1
    server.state.refresh()
    third = server.replan_at_job_end(server.state.released_by(record))
    assert third.considered == 1 and third.updates == [] and third.unchanged == [9]
    assert len(recorder.updates) == 1


def test_the_service_purges_what_is_older_than_the_retention_once_a_day(served) -> None:
    env, server, _ = served
    with Store(env.db) as store:
        store.save_decision("ancient", {"user": "u"}, {"ok": True})
    db = sqlite3.connect(env.db)
    db.execute("UPDATE advisor_decisions SET created = '2020-01-01T00:00:00'")
    db.commit()
    db.close()
    server.refresher.purge_when_due()
    server.state.writer.call(lambda s: None)
    with Store(env.db) as store:
        assert store.decision("ancient") is None
        store.save_decision("ancient2", {"user": "u"}, {"ok": True})
    db = sqlite3.connect(env.db)
    db.execute("UPDATE advisor_decisions SET created = '2020-01-01T00:00:00'")
    db.commit()
    db.close()
    server.refresher.purge_when_due()  # within the day: not again
    server.state.writer.call(lambda s: None)
    with Store(env.db) as store:
        assert store.decision("ancient2") is not None


def test_slurm_reads_take_at_most_a_quarter_of_the_refresh_threads_time() -> None:
    """A read that takes long (a large queue) stretches the pause before the next one, so the
    parsing cannot starve the decides; quick reads go back to ``refresh_s``."""
    from slurm_pal.advisor.server import MAX_READ_SHARE, refresh_pause

    assert refresh_pause(1.0, 0.1) == 1.0
    slow = refresh_pause(1.0, 1.2)
    assert 1.2 / (1.2 + slow) == pytest.approx(MAX_READ_SHARE)
    assert refresh_pause(1.0, 0.05) == 1.0


def test_a_large_request_with_a_long_list_is_refused_unparsed(served) -> None:
    """A flood of lines just under the limit whose job is a long list held millions of small
    objects at once, memory the allocator kept long after: such a line is now refused from
    a count of its values (bounded work), and still counted as a bad request."""
    env, _server, client = served
    path = env.root / "adv.sock"
    junk = b",".join(b'"%08d"' % i for i in range(40_000))
    long_list = b'{"v":1,"op":"decide","job":{"min_nodes":[' + junk + b"]}}\n"
    answer = json.loads(_raw(path, long_list))
    assert answer["ok"] is False and "refused unparsed" in answer["error"]
    # a large line with few values is parsed and answered as before
    padded = b'{"v":1,"op":"health","pad":"' + b"x" * (100 << 10) + b'"}\n'
    assert json.loads(_raw(path, padded))["ok"] is True
    assert client.request({"op": "stats"})["bad_requests"] == 1


def test_the_heap_is_trimmed_once_refused_requests_stop() -> None:
    refused = [0]
    trimmer = BadRequestTrimmer(lambda: refused[0])
    assert not trimmer.tick()  # nothing refused: nothing to hand back
    for _ in range(3):  # a flood: not trimmed while it goes on
        refused[0] += 100
        assert not trimmer.tick()
    assert trimmer.tick() and trimmer.trims == 1  # once it stopped
    assert not trimmer.tick() and trimmer.trims == 1  # and only once


def test_a_spooled_record_not_applied_names_its_job_file_and_reason(tmp_path: Path, caplog) -> None:
    """A timeout carries no message: the line still says why, and which job's record."""
    spool = tmp_path / "spool"
    spool.mkdir()
    record = {"record_id": "641:n02:epilog", "job_id": 641, "node": "n02", "kind": "epilog",
              "time": 1.0}  # fmt: skip
    (spool / "641.n02.epilog.json").write_text(json.dumps(record))

    def busy(_record: object) -> bool:
        raise TimeoutError

    caplog.set_level("WARNING", logger="slurm_pal.advisor")
    assert sweep_spool(spool, busy) == (0, 0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "641.n02.epilog.json" in line and "job 641's epilog record from n02" in line
    assert not line.rstrip().endswith(":") and "did not answer in time" in line
    assert (spool / "641.n02.epilog.json").exists()  # kept for the next sweep
