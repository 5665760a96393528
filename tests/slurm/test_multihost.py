"""The advisor deployed as on a cluster, proven on the multi-host testbed: slurmctld and
`slurm-pal serve` on a controller host, the rendered Prolog/Epilog on three compute hosts
(network, UTS and mount namespaces on a private bridge, each with its own munged and spool
dir; slurm_pal/testbed/multihost.py), jobs submitted by an unprivileged user.

The compute hosts cannot see the controller's folder (the advisor's Unix socket, store and
log), so their records reach the advisor only over TCP, inside munge credentials that carry
the compute host's own address. ``replan_s`` is an hour: every re-planning round here is
started by a job's end.

Every test starts from an empty cluster; the module takes under a minute (25-45 s here).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from slurm_pal.cli.main import app
from slurm_pal.core.hostlist import expand
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed.hosts import missing_tools, namespaces, remove_namespaces, tag_for
from slurm_pal.testbed.multihost import MultiHostSlurm
from tests.helpers.slurm_lab import (
    AdvisorLab,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
    unavailable,
)

pytestmark = pytest.mark.slurm

HOSTS = ("n01", "n02", "n03")
GPUS_PER_NODE = 2
PORT = 7001
USER = "nobody"  # every Debian system has it; the fixture creates it where missing
SLEEP = "sleep 300"


@dataclass(kw_only=True)
class Cluster(AdvisorLab):
    """The advisor on the controller host; ``ask`` is its Unix socket, as an admin on the
    controller uses it; ``sbatch`` runs as the unprivileged user on the controller (the login
    node)."""

    tb: MultiHostSlurm
    spool: Path

    def _spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return self.tb.popen(self.tb.controller, argv, **kwargs)

    def stats(self) -> dict:
        return self.ask({"op": "stats"})

    def job(self, job_id: int) -> dict[str, str]:
        return self.tb.job_fields(job_id)

    def wait_state(self, job_id: int, state: str, timeout_s: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") == state:
                return fields
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} not {state}: {fields}\n{self.advisor_log()[-2000:]}")

    def cancel_all(self) -> None:
        self.tb.run(["scancel", "--full", "-u", USER], check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = self.tb.node_states()
            busy = self.tb.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"], check=False)
            if not busy.stdout.strip() and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs still alive: {self.tb.node_states()}")

    # -- what the hosts hold -----------------------------------------------------------------
    def spooled(self, host: str) -> list[str]:
        """Record files in ``host``'s own spool dir (the path every host sees as its own)."""
        local = self.tb.network.local_dir(host, 1)  # per_host_dirs[0], after munged's
        return sorted(p.name for p in local.glob("*.json"))

    def on(self, host: str, args: list[str], *, user: str | None = None, stdin: str = ""):
        cmd = args if user is None else ["runuser", "-u", user, "--", *args]
        return subprocess.run(
            self.tb.on_host(host, cmd),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=self.tb.env,
        )

    def wait_records(self, job_id: int, expected: list[tuple[str, str]]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.records(job_id) != sorted(expected):
            time.sleep(0.2)
        assert self.records(job_id) == sorted(expected), (job_id, self.advisor_log()[-3000:])


def _require_namespaces() -> None:
    """Network namespaces are the multi-host testbed: fail in CI without them."""
    missing = missing_tools()
    if missing:
        unavailable(f"the multi-host testbed needs {', '.join(missing)} (iproute2, util-linux)")
    probe = f"spal-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        unavailable(f"cannot create a network namespace: {made.stderr.strip()}")


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_slurm()
    _require_namespaces()
    _ensure_user(USER)
    root = fresh_testbed_dir()
    ctl = root / "ctl"  # the controller's own folder: compute hosts see an empty tmpfs here
    ctl.mkdir(mode=0o755)
    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)  # the user's jobs write here (a shared file system on a cluster)
    spool = root / "spool"
    sock = ctl / "adv" / "advisor.sock"
    db = ctl / "store.db"
    config = ctl / "slurm-pal.toml"
    site = root / "site"
    munge_socket = root / "run" / "munge" / "munge.socket.2"  # each host's own munged
    address = f"10.250.0.1:{PORT}"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\npolicy = "pal"\npack_tolerance = 0.05\n'
        "refresh_s = 1.0\nreplan_s = 3600\nreplan_on_epilog = true\nreservation_ttl_s = 30\n"
        f'labels_file = "{site / "labels.json"}"\nlisten = "{address}"\n'
        f'munge_socket = "{munge_socket}"\n'
        f'[hooks]\nspool_dir = "{spool}"\ntelemetry = false\nadvisor = "{address}"\n'
        f'munge_socket = "{munge_socket}"\n'
    )
    csv = ctl / "example.csv"
    generate_example_campaign(
        nodes=len(HOSTS), gpus_per_node=GPUS_PER_NODE, node_prefix="n"
    ).to_csv(csv, index=False)
    labels = render_site(db, csv, site, config=config, apps={"resnet": "A"})
    nodes = rendered_nodes(labels)
    assert [n.name for n in nodes] == list(HOSTS)
    tb = MultiHostSlurm(root, nodes, **rendered_hooks(site), per_host_dirs=(str(spool),))
    the = Cluster(
        tb=tb,
        root=root,
        db=db,
        config=config,
        socket=sock,
        log_path=ctl / "advisor.log",
        submit_user=USER,
        spool=spool,
    )
    with the.running():  # tb.stop() also ends what is left in the namespaces, and them
        yield the


@pytest.fixture
def clean(cluster: Cluster) -> Iterator[Cluster]:
    """The advisor running, no jobs, every spool empty; afterwards every job cancelled."""
    cluster.ensure_advisor()
    cluster.cancel_all()
    cluster.wait_advisor_sees_all_free(len(HOSTS) * GPUS_PER_NODE)
    try:
        yield cluster
    finally:
        cluster.cancel_all()


def _admin(fields: dict[str, str]) -> dict[str, str]:
    parsed = parse_admin_comment(fields.get("AdminComment", ""))
    assert parsed is not None, f"no advisor comment: {fields.get('AdminComment')!r}"
    return parsed


# ---------------------------------------------------------------------------------------------


def test_hosts_are_separate(clean: Cluster) -> None:
    """Own host name and address per host; compute hosts cannot see the controller's folder
    or each other's spool dir; nothing was added to this machine's own network namespace."""
    c = clean
    for host in (c.tb.controller, *HOSTS):
        proc = c.on(host, ["sh", "-c", "hostname; ip -4 -o addr show dev eth0"])
        name, addr = proc.stdout.split("\n", 1)
        assert name == host and f"inet {c.tb.address(host)}/24" in addr, proc.stdout
    for host in HOSTS:
        seen = c.on(host, ["ls", "-A", str(c.root / "ctl")])
        assert seen.returncode == 0 and seen.stdout.strip() == "", seen  # an empty tmpfs
        assert c.on(host, ["test", "-S", str(c.socket)]).returncode != 0
    mark = c.tb.network.local_dir("n01", 1) / "probe"
    mark.write_text("n01 only")
    try:
        assert c.on("n01", ["cat", str(c.spool / "probe")]).stdout == "n01 only"
        assert c.on("n02", ["cat", str(c.spool / "probe")]).returncode != 0
    finally:
        mark.unlink()
    own = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.250.0." not in own


def test_routing_at_submit_and_jobs_run_on_their_compute_host(clean: Cluster) -> None:
    c = clean
    before = c.stats()["decide_total"]
    job_id = c.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", f"--wrap=hostname; {SLEEP}")
    fields = c.wait_state(job_id, "RUNNING")
    comment = _admin(fields)
    assert comment["action"] == "route", fields["AdminComment"]
    node = fields["NodeList"]
    assert fields["ReqNodeList"] == node, fields  # routed there by the advisor, ran there
    assert fields["UserId"].startswith(f"{USER}(")
    out = c.root / "out" / f"{job_id}.out"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and out.read_text().strip()):
        time.sleep(0.1)
    assert out.read_text().split() == [node]  # the batch script ran on that host
    assert c.stats()["decide_total"] == before + 1


# ---------------------------------------------------------------------------------------------
# job ends on compute hosts start the re-planning


def _held(c: Cluster, name: str, *args: str) -> tuple[int, Path]:
    """A job that runs until the test creates its release file, then ends by itself."""
    release = c.root / "out" / f"release-{name}-{time.monotonic_ns()}"
    wrap = f"while [ ! -e {release} ]; do sleep 0.05; done"
    return c.sbatch(*args, f"--wrap={wrap}"), release


def _round_lines(c: Cluster, since: int, job_id: int) -> list[str]:
    return [
        ln for ln in c.advisor_log(since).splitlines() if f"end of job {job_id}: re-planned" in ln
    ]


def test_a_job_ending_on_a_compute_host_replans_a_waiting_job_onto_its_gpus(
    clean: Cluster,
) -> None:
    c = clean
    held = [_held(c, f"b{i}", "--gres=gpu:2", "-N1") for i in range(len(HOSTS))]
    nodes = {c.wait_state(j, "RUNNING")["NodeList"] for j, _ in held}
    assert nodes == set(HOSTS)  # the cluster is full
    waiting = c.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", f"--wrap={SLEEP}")
    time.sleep(2.0)  # a scheduling pass and a refresh: it stays pending, no GPU is free
    assert c.job(waiting)["JobState"] == "PENDING"
    before, mark = c.stats(), c.log_size()
    ending, release = held[1]
    freed = c.job(ending)["NodeList"]
    release.touch()  # the job's script ends on the compute host
    fields = c.wait_state(waiting, "RUNNING")
    assert fields["NodeList"] == freed
    after = c.stats()
    assert after["replans_at_job_end"] == before["replans_at_job_end"] + 1
    assert after["replan_updates"] >= before["replan_updates"] + 1
    assert after["replans"] == before["replans"] + 1  # no periodic round (replan_s = 3600)
    lines = _round_lines(c, mark, ending)
    assert len(lines) == 1 and "re-planned 1 job(s)" in lines[0], c.advisor_log(mark)
    assert _admin(fields)["action"] == "route"
    c.wait_records(ending, [(freed, "epilog"), (freed, "prolog")])  # over TCP, from its host
    assert after["records_rejected"] == before["records_rejected"]


def test_job_ends_in_quick_succession_each_start_a_waiting_job_on_their_own_gpus(
    clean: Cluster,
) -> None:
    """The GPUs a round gave to a waiting job are not free for the next end's round, even
    before Slurm's next read shows that job running there (seen by the latency benchmark:
    the second waiting job was sent to the first end's node, taken, and waited there)."""
    c = clean
    held = [_held(c, f"q{i}", "--gres=gpu:2", "-N1") for i in range(len(HOSTS))]
    for job_id, _ in held:
        c.wait_state(job_id, "RUNNING")
    waiting = [
        c.sbatch("--gres=gpu:2", "--comment=pal:app=resnet", f"--wrap={SLEEP}") for _ in range(2)
    ]
    time.sleep(2.0)  # both wait, no GPU is free
    for (ending, release), job_id in zip(held[:2], waiting, strict=True):
        freed = c.job(ending)["NodeList"]
        release.touch()
        assert c.wait_state(job_id, "RUNNING")["NodeList"] == freed
        # A refresh now shows the first one running (its reservation ends) while the next end
        # comes within 2 s of this one: the window in which the round still counted the
        # first end's GPUs free.
        time.sleep(1.2)


def test_a_two_node_jobs_end_frees_both_nodes_in_one_round(clean: Cluster) -> None:
    c = clean
    two, release = _held(c, "two", "-N2", "--gres=gpu:2")
    held = c.wait_state(two, "RUNNING")["NodeList"]
    third = c.sbatch("--gres=gpu:2", "-N1", f"--wrap={SLEEP}")
    c.wait_state(third, "RUNNING")
    waiting = c.sbatch("-N2", "--gres=gpu:2", "--comment=pal:app=resnet", f"--wrap={SLEEP}")
    time.sleep(2.0)
    assert c.job(waiting)["JobState"] == "PENDING"
    before, mark = c.stats(), c.log_size()
    release.touch()
    fields = c.wait_state(waiting, "RUNNING")
    assert fields["NodeList"] == held
    after = c.stats()
    # The first of its two Epilogs freed both nodes: the waiting job needs both, and that
    # round placed it (one logged round). The second Epilog needs no round while the view
    # still shows the job; once (24.11) it got one of its own, most likely after a read
    # between the two no longer showed the job, and that round found nothing to do.
    rounds = after["replans_at_job_end"] - before["replans_at_job_end"]
    assert rounds in (1, 2), (before, after)
    lines = _round_lines(c, mark, two)
    assert len(lines) == 1 and "re-planned 1 job(s)" in lines[0], c.advisor_log(mark)
    expected = [(n, k) for n in expand(held) for k in ("epilog", "prolog")]
    c.wait_records(two, expected)


# ---------------------------------------------------------------------------------------------
# records: once each, authenticated


def _on_every_host(c: Cluster, *args: str) -> dict[str, int]:
    """One GPU job pinned to each compute host; job ids by host, once all have ended."""
    jobs = {h: c.sbatch("--gres=gpu:1", "-w", h, *args) for h in HOSTS}
    for job_id in jobs.values():
        c.wait_state(job_id, "COMPLETED")
    return jobs


def _flush(c: Cluster, host: str) -> dict:
    """What a site runs on each compute host to resend its spool (`hook flush`)."""
    proc = c.on(
        host,
        [
            sys.executable,
            "-m",
            "slurm_pal.hooks",
            "flush",
            "--advisor",
            f"10.250.0.1:{PORT}",
            "--munge-socket",
            str(c.tb.munge_socket),
            "--spool-dir",
            str(c.spool),
        ],
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_compute_hosts_records_are_applied_exactly_once(clean: Cluster) -> None:
    c = clean
    before = c.stats()
    jobs = _on_every_host(c, "--wrap=true")
    for host, job_id in jobs.items():
        c.wait_records(job_id, [(host, "epilog"), (host, "prolog")])
        assert c.spooled(host) == []
    after = c.stats()
    assert after["records_total"] - before["records_total"] == 2 * len(HOSTS)
    assert after["records_duplicate"] == before["records_duplicate"]
    assert after["records_rejected"] == before["records_rejected"]
    # A record sent again (a spool file left behind by a crash after delivery) is answered as
    # a duplicate: stored once, no second round.
    with sqlite3.connect(c.db) as db:
        (payload,) = db.execute(
            "SELECT payload FROM job_records WHERE job_id = ? AND kind = 'epilog'",
            (jobs["n03"],),
        ).fetchone()
    local = c.tb.network.local_dir("n03", 1) / f"{jobs['n03']}.n03.epilog.json"
    local.write_text(payload)
    assert _flush(c, "n03") == {"delivered": 1, "left": 0, "unreadable": []}
    again = c.stats()
    assert c.spooled("n03") == []
    assert again["records_duplicate"] == after["records_duplicate"] + 1
    assert again["replans_at_job_end"] == after["replans_at_job_end"]
    assert c.records(jobs["n03"]) == [("n03", "epilog"), ("n03", "prolog")]


def _credential(c: Cluster, host: str, payload: str, user: str | None = None) -> str:
    """A munge credential made by ``host``'s own munged (as ``user``, default root)."""
    proc = c.on(host, ["munge", "--socket", str(c.tb.munge_socket)], user=user, stdin=payload)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


SEND = (
    "import json, sys\n"
    "from slurm_pal.hooks.spool import tcp_request\n"
    "print(json.dumps(tcp_request(sys.argv[1], json.loads(sys.stdin.read()), 10.0)))\n"
)


def _send(c: Cluster, host: str, message: dict) -> dict:
    """One request to the advisor's TCP listener, from ``host``."""
    proc = c.on(host, [sys.executable, "-c", SEND, f"10.250.0.1:{PORT}"], stdin=json.dumps(message))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_forged_and_replayed_records_are_rejected_and_logged(clean: Cluster) -> None:
    c = clean
    job_id = c.sbatch("--gres=gpu:1", "-w", "n01", "--wrap=true")
    c.wait_state(job_id, "COMPLETED")
    c.wait_records(job_id, [("n01", "epilog"), ("n01", "prolog")])
    with sqlite3.connect(c.db) as db:
        (text,) = db.execute(
            "SELECT payload FROM job_records WHERE job_id = ? AND kind = 'epilog'", (job_id,)
        ).fetchone()
    record = json.loads(text)
    # A new record for the job (a different kind, so it would be stored if accepted).
    forged = {**record, "kind": "prolog", "record_id": f"{job_id}.n01.forged"}
    payload = json.dumps(forged, sort_keys=True)
    before, mark = c.stats(), c.log_size()
    cases = {
        "made on another host": {"cred": _credential(c, "n02", payload)},
        "made by an unprivileged user": {"cred": _credential(c, "n01", payload, user=USER)},
        "not a credential": {"cred": "MUNGE:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:"},
        "without a credential": {"record": forged},
    }
    answers = {why: _send(c, "n01", {"v": 1, "op": "record", **m}) for why, m in cases.items()}
    for why, answer in answers.items():
        assert answer.get("ok") is False, (why, answer)
    # Replayed: the same credential twice. The first is accepted (the record is the job's
    # real epilog record, already stored: a duplicate); munged refuses the second.
    real = _credential(c, "n01", json.dumps(record, sort_keys=True))
    first = _send(c, "n01", {"v": 1, "op": "record", "cred": real})
    assert first.get("ok") is True and first.get("duplicate") is True, first
    replay = _send(c, "n02", {"v": 1, "op": "record", "cred": real})
    assert replay.get("ok") is False and "replay" in json.dumps(replay).lower(), replay
    after = c.stats()
    refused = [ln for ln in c.advisor_log(mark).splitlines() if "record over TCP refused" in ln]
    uid = pwd.getpwnam(USER).pw_uid
    reasons = [
        f"credential from {c.tb.address('n02')}, which is not node n01",
        f"credential of uid {uid}",
        "credential refused: bad",  # munged: not a credential of this key
        "no munge credential",
        "credential refused: replayed credential",
    ]
    assert len(refused) == len(reasons), refused
    for reason, line in zip(reasons, refused, strict=True):
        assert reason in line, (reason, refused)
    assert after["records_rejected"] - before["records_rejected"] == len(reasons), after
    assert c.records(job_id) == [("n01", "epilog"), ("n01", "prolog")]  # nothing forged stored
    assert after["records_total"] - before["records_total"] == 1  # the duplicate


def test_advisor_killed_submits_accepted_records_spooled_on_hosts_then_applied_once(
    clean: Cluster,
) -> None:
    c = clean
    c.stop_advisor(kill=True)
    jobs = _on_every_host(c, "--comment=pal:app=resnet", "--wrap=true")  # accepted, ran
    for host, job_id in jobs.items():
        assert c.job(job_id).get("AdminComment", "") in ("", "(null)")  # failed open
        deadline = time.monotonic() + 30
        want = [f"{job_id}.{host}.epilog.json", f"{job_id}.{host}.prolog.json"]
        while time.monotonic() < deadline and c.spooled(host) != want:
            time.sleep(0.2)
        assert c.spooled(host) == want  # on its own host, nowhere else
        assert c.records(job_id) == []
    c.start_advisor()
    before = c.stats()
    for host in HOSTS:
        assert _flush(c, host) == {"delivered": 2, "left": 0, "unreadable": []}
        assert _flush(c, host) == {"delivered": 0, "left": 0, "unreadable": []}
        assert c.spooled(host) == []
    for host, job_id in jobs.items():
        assert c.records(job_id) == [(host, "epilog"), (host, "prolog")]
    after = c.stats()
    assert after["records_total"] - before["records_total"] == 2 * len(HOSTS)
    assert after["records_duplicate"] == before["records_duplicate"]
    assert after["records_rejected"] == before["records_rejected"]


def test_cli_up_exec_and_down_even_after_a_crash() -> None:
    """`testbed up --hosts`, `exec` on a host, and `down` removing the namespaces by the
    folder's name when testbed.json is gone (a crashed run)."""
    require_slurm()
    _require_namespaces()
    root = fresh_testbed_dir()
    runner = CliRunner()
    env = {"SLURM_PAL_CONFIG": None}
    tag = f"spal-{tag_for(root)}-"
    try:
        result = runner.invoke(app, ["testbed", "up", "--dir", str(root), "--hosts", "3"], env=env)
        assert result.exit_code == 0, result.output
        assert len(namespaces(tag)) == 4 + 1  # controller, 3 compute hosts, the switch
        name = ["sh", "-c", 'test "$(hostname)" = n02']
        on_n02 = ["testbed", "exec", "--dir", str(root), "--host", "n02", "--", *name]
        assert runner.invoke(app, on_n02, env=env).exit_code == 0
        on_ctl = ["testbed", "exec", "--dir", str(root), "--", *name]
        assert runner.invoke(app, on_ctl, env=env).exit_code == 1
        (root / "testbed.json").unlink()  # what a crash may leave: no description, live hosts
        result = runner.invoke(app, ["testbed", "down", "--dir", str(root)], env=env)
        assert result.exit_code == 0, result.output
        assert namespaces(tag) == []
    finally:
        remove_namespaces(namespaces(tag))
        shutil.rmtree(root, ignore_errors=True)
