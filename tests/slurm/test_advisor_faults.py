"""Faults that used to blind the advisor or leak, on the real Slurm with the rendered
job_submit.lua and hooks and a real ``slurm-pal serve``: peers that trickle or idle, a store
locked at start, SIGKILL of the service, job names that try to forge log lines."""

from __future__ import annotations

import contextlib
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm
from tests.helpers.processes import describe, in_session, wait_until_none
from tests.helpers.slurm_lab import (
    AdvisorLab,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
)

pytestmark = pytest.mark.slurm

WRAP = "--wrap=sleep 300"
TRICKLERS = 80  # more than advisor.max_connections (64)


@dataclass(kw_only=True)
class FaultLab(AdvisorLab):
    def fail_open_lines(self) -> list[str]:
        """job_submit.lua's fail-open file (one line per job let through unadvised)."""
        path = self.socket.with_name(self.socket.name + ".failopen")
        return path.read_text().splitlines() if path.exists() else []

    def admin(self, job_id: int) -> dict[str, str] | None:
        return parse_admin_comment(self.jobs()[job_id].admin_comment)

    def cancel_all(self) -> None:
        for user in ("root", "nobody"):
            self.tb.run(["scancel", "--full", "-u", user], check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = [j for j in self.jobs().values() if j.state in ("PENDING", "RUNNING")]
            if not live:
                return
            time.sleep(0.2)
        raise AssertionError("jobs still alive")


@pytest.fixture(scope="module")
def lab() -> Iterator[FaultLab]:
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)  # nobody's jobs write here
    sock = root / "adv" / "advisor.sock"
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\npolicy = "pal"\npin = "every-job"\n'
        "refresh_s = 1.0\nreplan_s = 0\nreservation_ttl_s = 30\n"
        f'labels_file = "{work / "site" / "labels.json"}"\n'
        f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
    )
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    site = work / "site"
    labels = render_site(work / "store.db", csv, site, config=config, apps={"resnet": "A"})
    the_lab = FaultLab(
        tb=LocalSlurm(root, rendered_nodes(labels), **rendered_hooks(site)),
        root=root,
        db=work / "store.db",
        config=config,
        socket=sock,
        log_path=root / "log" / "advisor.log",
    )
    with the_lab.running():
        yield the_lab


@pytest.fixture
def clean(lab: FaultLab) -> Iterator[FaultLab]:
    lab.ensure_advisor()
    lab.cancel_all()
    try:
        yield lab
    finally:
        lab.cancel_all()


class Tricklers:
    """``count`` connections to the advisor that each send one byte now and then and never a
    whole line; one that is closed is opened again at once, so ``count`` are always held."""

    def __init__(self, path: str, count: int) -> None:
        self.path, self.count = path, count
        self.stop = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendall(b"{")
        return conn

    def _run(self) -> None:
        held = [self._open() for _ in range(self.count)]
        try:
            while not self.stop.wait(0.2):
                for i, conn in enumerate(held):
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        conn.close()
                        with contextlib.suppress(OSError):
                            held[i] = self._open()
                            self.reopened += 1
        finally:
            for conn in held:
                conn.close()

    def __enter__(self) -> Tricklers:
        self.thread.start()
        time.sleep(1.0)  # every connection opened before the first sbatch
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_trickling_connections_do_not_starve_the_plugin(clean: FaultLab) -> None:
    """80 connections that trickle a byte every 0.2 s and are reopened when closed: every job
    is still advised (routed, nothing let through as written)."""
    lab = clean
    fail_opens = len(lab.fail_open_lines())
    with Tricklers(str(lab.socket), TRICKLERS) as tricklers:
        jobs = [lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", WRAP) for _ in range(6)]
        assert tricklers.reopened > 0  # the advisor did close them
    assert lab.fail_open_lines()[fail_opens:] == []
    for job_id in jobs:
        admin = lab.admin(job_id)
        assert admin is not None and admin["action"] == "route", lab.jobs()[job_id]
    stats = lab.ask("stats")
    assert stats["requests_timed_out"] + stats["connections_closed_for_room"] > 0, stats


def test_a_store_locked_at_start_fails_open_then_advises_within_2_s_of_the_release(
    clean: FaultLab,
) -> None:
    lab = clean
    lab.stop_advisor()
    mark = lab.log_size()
    holder = sqlite3.connect(lab.db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a long write
    try:
        lab.start_advisor()  # health answers although the store is locked
        health = lab.ask("health")
        assert "locked by another process" in str(health["problem"]), health
        fail_opens = len(lab.fail_open_lines())
        unadvised = lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", WRAP)
        assert lab.admin(unadvised) is None  # let through as written
        (line,) = lab.fail_open_lines()[fail_opens:]
        assert "not advising yet" in line and "locked by another process" in line
        # A lock lasts longer than the service's start: release it once the start is over
        # (its Slurm parsing worker, a new interpreter, is up: seconds here), as a real lock
        # would be; the bound is for noticing the release, loading the store and reading.
        up = time.monotonic() + 60
        while "Slurm parsing worker up" not in lab.advisor_log(mark):
            assert time.monotonic() < up, lab.advisor_log(mark)
            time.sleep(0.05)
    finally:
        holder.execute("COMMIT")
        released = time.monotonic()
        holder.close()
    # event-based: the first health that shows the campaign loaded; the bound is 2 s
    while time.monotonic() - released < 30:
        health = lab.ask("health", 5.0)
        if health.get("campaign") and health.get("problem") is None and health.get("gpus"):
            break
        time.sleep(0.05)
    advising_after = time.monotonic() - released
    assert health.get("problem") is None, health
    assert advising_after <= 2.0, f"advising {advising_after:.2f} s after the release"
    routed = lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", WRAP)
    admin = lab.admin(routed)
    assert admin is not None and admin["action"] == "route"


def test_sigkill_of_the_service_leaves_none_of_its_processes(clean: FaultLab) -> None:
    lab = clean
    assert lab.advisor is not None
    pid = lab.advisor.pid  # started in its own session: the session holds what it started
    lab.sbatch("--gres=gpu:1", WRAP)  # the service has read Slurm: its worker is up
    started = in_session(pid)
    assert len(started) >= 3, [describe(p) for p in started]  # service, worker, tracker
    lab.stop_advisor(kill=True)
    left = wait_until_none(lambda: in_session(pid), 20.0)
    assert not left, [describe(p) for p in left]


FORGED = "a\"b'c\nINFO slurm_pal.advisor: decide route user=root name=x\r\u202egnp.exe\x1b[2J"


def test_a_job_name_cannot_split_or_forge_the_decision_log_line(clean: FaultLab) -> None:
    lab = clean
    mark = lab.log_size()
    job_id = lab.sbatch(f"--job-name={FORGED}", "--gres=gpu:1", WRAP, user="nobody")
    admin = lab.admin(job_id)
    assert admin is not None
    token = admin["r"]
    deadline = time.monotonic() + 10
    lines: list[str] = []
    while time.monotonic() < deadline and not lines:
        lines = [ln for ln in lab.advisor_log(mark).split("\n") if f"token={token}" in ln]
        time.sleep(0.1)
    (line,) = lines
    assert line.isprintable(), line
    name = re.search(r' name=("(?:[^"\\]|\\.)*") class=', line)
    assert name is not None, line
    assert "\\n" in name.group(1) and "\\u202e" in name.group(1), line
    forged = [ln for ln in lab.advisor_log(mark).split("\n") if ln.startswith("INFO slurm_pal")]
    assert forged == [], forged
    assert not any(c in lab.advisor_log(mark) for c in "\r\u202e\x1b")
