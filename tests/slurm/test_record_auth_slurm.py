"""Records over TCP with munge on the real Slurm: the rendered Prolog/Epilog send to the
advisor's TCP listener (``hooks.advisor``), each record inside a credential of the testbed's
munged; the advisor checks it against Slurm (``scontrol show node/job``).

And what an unprivileged user (``nobody``, as on a compute host) cannot do: forge a record,
change the advisor's state, read its store, or have it place a job; the advisor listens on
exactly its Unix socket and the one TCP port of ``advisor.listen``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.hooks.spool import spooled, tcp_request
from slurm_pal.testbed import LocalSlurm
from tests.helpers.slurm_lab import (
    AdvisorLab,
    free_port,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
)

REPO = Path(__file__).resolve().parents[2]


def _user_python() -> str:
    """An interpreter an unprivileged user can run (this venv's may sit under /root); the
    hooks are stdlib only, so the system Python with the repository on PYTHONPATH will do."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no system python3 for the unprivileged user")


@dataclass(kw_only=True)
class Lab(AdvisorLab):
    address: str  # the advisor's TCP listener, where the hooks send
    spool: Path

    def log(self) -> str:
        return self.advisor_log()

    def wait_records(self, job_id: int, count: int) -> list[tuple[str, str]]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = self.records(job_id)
            if len(got) >= count:
                return got
            time.sleep(0.2)
        raise AssertionError(f"job {job_id}: records {self.records(job_id)}\n{self.log()}")

    def nodes_of(self, job_id: int) -> tuple[str, ...]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = self.jobs()
            if job_id in jobs and jobs[job_id].state == "RUNNING":
                return jobs[job_id].nodes
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} never ran")


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    (root / "out").mkdir()
    (root / "out").chmod(0o1777)
    db, config, sock = work / "store.db", work / "site.toml", root / "adv" / "advisor.sock"
    spool = root / "spool"
    address = f"127.0.0.1:{free_port()}"
    munge_socket = root / "run" / "munge" / "munge.socket.2"  # LocalSlurm's munged
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\nrefresh_s = 1.0\nreplan_s = 0\n'
        f'labels_file = "{work / "site" / "labels.json"}"\nlisten = "{address}"\n'
        f'munge_socket = "{munge_socket}"\n'
        f'[hooks]\nspool_dir = "{spool}"\ntelemetry = false\nadvisor = "{address}"\n'
        f'munge_socket = "{munge_socket}"\n'
    )
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    labels = render_site(db, csv, work / "site", config=config)
    tb = LocalSlurm(root, rendered_nodes(labels), **rendered_hooks(work / "site"))
    assert tb.munge_socket == munge_socket
    the = Lab(
        tb=tb,
        root=root,
        db=db,
        config=config,
        socket=sock,
        log_path=root / "log" / "advisor.log",
        submit_user="nobody",
        address=address,
        spool=spool,
    )
    with the.running():
        yield the


def test_the_rendered_hooks_deliver_over_tcp_and_a_multi_node_end_is_one_round(lab: Lab) -> None:
    epilog = (lab.root / "work" / "site" / "epilog.sh").read_text()
    assert f"--advisor {lab.address}" in epilog and "--socket" not in epilog
    before = lab.ask("stats")
    release = lab.root / "out" / f"release-{time.monotonic_ns()}"
    job = lab.sbatch("-N2", "--gres=gpu:1", f"--wrap=while [ ! -e {release} ]; do sleep 0.05; done")
    nodes = lab.nodes_of(job)
    assert len(nodes) == 2
    # The job ends once a Slurm read has shown it running on both nodes: a job that starts
    # and ends between two reads gets a round per node (only each record's node is known).
    running_at = time.monotonic()
    while lab.ask("health")["state_age_s"] >= time.monotonic() - running_at:
        assert time.monotonic() - running_at < 30, "the advisor read no Slurm state in 30 s"
        time.sleep(0.2)
    release.touch()
    got = lab.wait_records(job, 4)
    assert got == sorted((n, k) for n in nodes for k in ("epilog", "prolog"))
    after = lab.ask("stats")
    assert after["records_rejected"] == before["records_rejected"]
    # both nodes' Epilogs reported the end; the first freed both nodes, the second no round
    assert after["replans_at_job_end"] - before["replans_at_job_end"] == 1
    # an Epilog that gave up waiting (its round outlasted hooks.epilog_timeout_ms) leaves its
    # file; the advisor's spool sweep takes it as a duplicate and removes it
    deadline = time.monotonic() + 30
    while spooled(lab.spool) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spooled(lab.spool) == []
    assert lab.records(job) == got  # still each record once


def _hook_as(lab: Lab, user: str, job: int, node: str, spool: Path) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    spool.mkdir(mode=0o777, exist_ok=True)
    spool.chmod(0o777)
    subprocess.run(
        ["runuser", "-u", user, "--", _user_python(), "-s", "-m", "slurm_pal.hooks", "epilog",
         "--advisor", lab.address, "--munge-socket", str(lab.tb.munge_socket),
         "--spool-dir", str(spool), "--timeout-ms", "5000", "--no-telemetry"],
        env=env, check=True, timeout=60,
    )  # fmt: skip


def test_forged_records_are_refused_and_stay_in_the_forgers_spool(lab: Lab) -> None:
    job = lab.sbatch("--gres=gpu:1", "--wrap=sleep 20")
    (node,) = lab.nodes_of(job)
    other = next(n for n in ("n01", "n02", "n03", "n04") if n != node)
    before = lab.ask("stats")
    # an unprivileged user on the job's own node claims the job ended (its GPUs free)
    _hook_as(lab, "nobody", job, node, lab.root / "nobody-spool")
    # root claims the job ended on a node it never ran on
    _hook_as(lab, "root", job, other, lab.root / "root-spool")
    after = lab.ask("stats")
    assert after["records_rejected"] - before["records_rejected"] == 2
    assert after["replans_at_job_end"] == before["replans_at_job_end"]
    assert [p.name for p in spooled(lab.root / "nobody-spool")] == [f"{job}.{node}.epilog.json"]
    assert [p.name for p in spooled(lab.root / "root-spool")] == [f"{job}.{other}.epilog.json"]
    assert (node, "epilog") not in lab.records(job) and (other, "epilog") not in lab.records(job)
    log = lab.log()
    assert "credential of uid 65534" in log and f"did not run on {other}" in log
    subprocess.run(["scancel", str(job)], env=lab.tb.env, check=False)


def test_an_unprivileged_user_cannot_reach_the_service_or_its_store(lab: Lab) -> None:
    def as_nobody(code: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["runuser", "-u", "nobody", "--", _user_python(), "-c", code],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    # the Unix socket (decide, replan, reload, stats): not even a connection
    proc = as_nobody(
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(lab.socket)!r})"
    )
    assert proc.returncode != 0 and "PermissionError" in proc.stderr
    # the store: unreadable
    proc = as_nobody(
        f"import sqlite3; sqlite3.connect('file:{lab.db}?mode=ro', uri=True)"
        ".execute('SELECT count(*) FROM job_records').fetchall()"
    )
    assert proc.returncode != 0 and "unable to open" in proc.stderr
    # over TCP a decide (placing a job), replan or reload is refused, whoever asks
    for op in ("decide", "replan", "reload", "stats"):
        answer = tcp_request(lab.address, {"v": 1, "op": op, "job": {"user": "alice"}}, 5)
        assert answer["ok"] is False and "not served over TCP" in answer["error"]


def _listening(pid: int) -> tuple[set[str], set[tuple[str, int]]]:
    """The Unix paths and TCP (address, port) pairs process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    unix = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        # Flags 00010000 = __SO_ACCEPTCON: a listening socket
        if len(parts) >= 8 and parts[6] in inodes and int(parts[3], 16) & 0x10000:
            unix.add(parts[7])
    tcp = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[9] in inodes and parts[3] == "0A":  # LISTEN
                host_hex, port_hex = parts[1].split(":")
                raw = bytes.fromhex(host_hex)
                if len(raw) == 4:
                    host = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    host = socket.inet_ntop(socket.AF_INET6, words)
                tcp.add((host, int(port_hex, 16)))
    return unix, tcp


def test_the_advisor_listens_on_exactly_its_socket_and_the_configured_port(lab: Lab) -> None:
    assert lab.advisor is not None
    unix, tcp = _listening(lab.advisor.pid)
    host, port = lab.address.rsplit(":", 1)
    assert unix == {str(lab.socket)}
    assert tcp == {(host, int(port))}
    assert oct(lab.socket.stat().st_mode & 0o777) == "0o660"
