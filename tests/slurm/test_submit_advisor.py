"""The live advisor end to end on a real Slurm 22.05: the rendered job_submit.lua, Prolog and
Epilog, and a real ``slurm-pal serve`` process, proven through sbatch and what jobs see
(SLURM_JOB_GPUS, ``squeue --json``).

One testbed for the module (4 nodes x 4 fake GPUs, labels from `site render` of the seeded
example campaign, reshaped: 12 GPUs fast for class A, 4 GPUs 10 % slower for A but 7 % faster
for class C; both gaps beyond the advisor's 5 % packing tolerance), so the per-class choice is
visible: A takes the fast ones, a lone C job the ones A does not want. Jobs hold their GPUs
with ``sleep`` and are cancelled by each test, so every test starts from an empty cluster.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_pal.adapters.slurm.state import JobState
from slurm_pal.adapters.store import Store
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import DEFAULT_SHAPES, ClassShape, generate_example_campaign
from slurm_pal.hooks.spool import spooled
from slurm_pal.testbed import LocalSlurm
from tests.helpers.slurm_lab import (
    FEATURES,
    AdvisorLab,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
    stored_tres,
)

pytestmark = pytest.mark.slurm

PACK_TOLERANCE = 0.05
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot enter this checkout's .venv
ACROSS = 1.7
SLEEP = "sleep 300"


@dataclass(kw_only=True)
class Lab(AdvisorLab):
    spool: Path
    slurm_labels: dict[str, dict[int, str]]  # node -> {Slurm GPU index: label}
    uuid_of: dict[tuple[str, int], str]  # (node, Slurm index) -> uuid
    specs: list[GpuSpec]
    label_scores: dict[str, dict[str, float]]  # label -> class -> PM-score
    stand_in: socket.socket | None = None
    held: list[socket.socket] = field(default_factory=list)

    # -- the advisor ------------------------------------------------------------------------
    def stop_advisor(self, kill: bool = False) -> None:
        super().stop_advisor(kill)
        self.stop_stand_in()

    def ctld_log_size(self) -> int:
        return (self.tb.log_dir / "slurmctld.log").stat().st_size

    def fail_open_lines(self, since: int) -> list[str]:
        """job_submit.lua's fail-open log lines written after byte ``since`` of slurmctld.log."""
        with (self.tb.log_dir / "slurmctld.log").open("rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
        return [ln for ln in text.splitlines() if "slurm-pal: job of uid" in ln]

    def stats(self) -> dict:
        return self.ask({"op": "stats"})

    def stand_in_server(self, respond: Callable[[bytes], bytes | None]) -> None:
        """Replace the advisor by a socket server that answers ``respond(line)``, or holds the
        connection open without a word when it returns None."""
        self.stop_advisor()
        self.socket.unlink(missing_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(self.socket))
        srv.listen(16)
        self.stand_in = srv

        def loop() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(1 << 20)
                reply = respond(b"")
                if reply is None:
                    self.held.append(conn)
                    continue
                try:
                    conn.sendall(reply)
                finally:
                    conn.close()

        threading.Thread(target=loop, daemon=True).start()

    def stop_stand_in(self) -> None:
        if self.stand_in is not None:
            self.stand_in.close()
            self.stand_in = None
            self.socket.unlink(missing_ok=True)
        for conn in self.held:
            conn.close()
        self.held.clear()

    # -- Slurm ------------------------------------------------------------------------------
    def wait_running(self, *job_ids: int) -> dict[int, JobState]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = self.jobs()
            states = {j: jobs[j].state if j in jobs else "?" for j in job_ids}
            if all(s == "RUNNING" for s in states.values()):
                return {j: jobs[j] for j in job_ids}
            bad = {j: s for j, s in states.items() if s not in ("PENDING", "RUNNING", "?")}
            assert not bad, f"jobs ended early: {bad}"
            time.sleep(0.2)
        raise AssertionError(f"jobs not running: {states}\n{self.tb.log_tails()}")

    def gpus(self, job: JobState) -> list[tuple[str, int]]:
        """(node, Slurm GPU index) the job holds."""
        return [(n, i) for n, idx in sorted(job.allocated_gpu_indices().items()) for i in idx]

    def job_gpus_seen(self, job_id: int) -> list[int]:
        """SLURM_JOB_GPUS as the batch script printed it."""
        path = self.root / "out" / f"{job_id}.out"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.exists() and "GPUS=" in path.read_text():
                text = path.read_text().split("GPUS=", 1)[1].split()[0]
                return [int(x) for x in text.split(",") if x]
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} printed no GPUS= line")

    def cancel_all(self, users: Sequence[str] = ("root", "nobody")) -> None:
        super().cancel_all(users)

    def score(self, node: str, slurm_index: int, job_class: str) -> float:
        return self.label_scores[self.slurm_labels[node][slurm_index]][job_class]

    # -- the placement core on the same state ----------------------------------------------
    def core_choice(self, req: PlacementRequest, busy: list[tuple[str, int]]):
        cluster = Cluster.from_gpus(
            self.specs,
            Topology.flat(across_nodes=ACROSS),
            busy=[self.uuid_of[g] for g in busy],
        )
        policy = get_policy("pal", pack_tolerance=PACK_TOLERANCE)
        result = policy.place(req, cluster)
        assert result.allocation is not None, result.reason
        return result.allocation

    def busy_gpus(self) -> list[tuple[str, int]]:
        return [g for j in self.jobs().values() if j.state == "RUNNING" for g in self.gpus(j)]


def _campaign_csv(path: Path) -> None:
    """The example campaign, reshaped so per-class choices show: class A has a 10 % slower
    bin (beyond the 5 % packing tolerance), class C is flat except that the GPUs fast for A
    are 8 % slower for C (so C's best GPUs are the ones A does not want)."""
    shapes = dict(DEFAULT_SHAPES)
    shapes["A"] = ClassShape("resnet50-iteration", 0.1754, 0.004, 0.10, (1.6, 2.6))
    shapes["C"] = ClassShape("vgg19-iteration", 0.3006, 0.0, 0.0, (1.0, 1.0))
    shapes["D"] = ClassShape("pagerank", 66.03, 0.0, 0.0, (1.0, 1.0))
    frame = generate_example_campaign(
        nodes=4,
        gpus_per_node=4,
        node_prefix="n",
        shapes=shapes,
        throttled_gpus=0,
        slow_bin_fraction=0.4,
    )
    a_speed = frame[frame.job_class == "A"].groupby("uuid")["duration_s"].median()
    fast_for_a = set(a_speed[a_speed < a_speed.min() * 1.05].index)
    slow_for_c = (frame.job_class == "C") & frame.uuid.isin(fast_for_a)
    frame.loc[slow_for_c, "duration_s"] *= 1.08
    frame.to_csv(path, index=False)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)  # nobody's jobs write here
    db = work / "store.db"
    sock = root / "adv" / "advisor.sock"
    spool = root / "spool"
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\npolicy = "pal"\npack_tolerance = {PACK_TOLERANCE}\n'
        "refresh_s = 1.0\nreplan_s = 0\nreservation_ttl_s = 30\n"
        f'labels_file = "{work / "site" / "labels.json"}"\n'
        f'[hooks]\nspool_dir = "{spool}"\ntelemetry = false\n'
        f"[locality]\nacross_switches = {ACROSS}\n"
    )
    csv = work / "example.csv"
    _campaign_csv(csv)
    site = work / "site"
    labels = render_site(db, csv, site, config=config, apps={"resnet": "A", "vgg": "C"})
    slurm_labels = {
        n: {g["slurm_index"]: g["label"] for g in gpus} for n, gpus in labels["nodes"].items()
    }
    uuid_of = {
        (n, g["slurm_index"]): g["uuid"] for n, gpus in labels["nodes"].items() for g in gpus
    }
    with Store(db) as store:
        scores = store.gpu_scores("example")
    per_uuid: dict[str, dict[str, float]] = {}
    for row in scores.itertuples(index=False):
        per_uuid.setdefault(row.uuid, {})[row.job_class] = float(row.pm_score)
    specs = [
        GpuSpec(g["uuid"], n, g["index"], "v100", per_uuid[g["uuid"]], frozenset(FEATURES[n]))
        for n, gpus in labels["nodes"].items()
        for g in gpus
    ]
    label_scores = {
        g["label"]: per_uuid[g["uuid"]] for gpus in labels["nodes"].values() for g in gpus
    }
    tb = LocalSlurm(root, rendered_nodes(labels, FEATURES), **rendered_hooks(site))
    the_lab = Lab(
        tb=tb,
        root=root,
        db=db,
        config=config,
        socket=sock,
        log_path=root / "log" / "advisor.log",
        spool=spool,
        slurm_labels=slurm_labels,
        uuid_of=uuid_of,
        specs=specs,
        label_scores=label_scores,
    )
    with the_lab.running():
        yield the_lab


@pytest.fixture
def clean(lab: Lab) -> Iterator[Lab]:
    """The advisor running, no jobs, afterwards every job cancelled."""
    lab.ensure_advisor()
    lab.cancel_all()
    lab.wait_advisor_sees_all_free(16)
    try:
        yield lab
    finally:
        lab.cancel_all()


def _admin(job: JobState) -> dict[str, str]:
    parsed = parse_admin_comment(job.admin_comment)
    assert parsed is not None, f"job {job.job_id}: no advisor comment: {job.admin_comment!r}"
    return parsed


WRAP = f"echo GPUS=$SLURM_JOB_GPUS; {SLEEP}"


# ---------------------------------------------------------------------------------------------
# placement


def test_class_a_jobs_get_the_best_gpus_as_the_core_computes(clean: Lab) -> None:
    lab = clean
    for _ in range(3):
        busy = lab.busy_gpus()
        free_a = [
            lab.score(n, i, "A")
            for n, idx in lab.slurm_labels.items()
            for i in idx
            if (n, i) not in busy
        ]
        job_id = lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", f"--wrap={WRAP}")
        job = lab.wait_running(job_id)[job_id]
        (gpu,) = lab.gpus(job)
        assert lab.job_gpus_seen(job_id) == [gpu[1]]  # what the job sees
        assert lab.score(*gpu, "A") == pytest.approx(min(free_a))  # the best free for A
        core = lab.core_choice(PlacementRequest(str(job_id), "A", 1), busy)
        assert lab.score(*gpu, "A") == pytest.approx(core.max_score)
        comment = _admin(job)
        assert comment["action"] == "route" and comment["class"] == "A"
        assert float(comment["lv"]) == pytest.approx(core.lv_product, abs=1e-4)


def test_class_c_packs_and_leaves_class_a_its_gpus(clean: Lab) -> None:
    lab = clean
    big = lab.sbatch("--gres=gpu:4", "--comment=pal:app=vgg", f"--wrap={WRAP}")
    job = lab.wait_running(big)[big]
    gpus = lab.gpus(job)
    assert len(gpus) == 4 and len({n for n, _ in gpus}) == 1  # packed on one node
    core = lab.core_choice(PlacementRequest(str(big), "C", 4), [])
    assert max(lab.score(*g, "C") for g in gpus) == pytest.approx(core.max_score)
    assert len(set(core.nodes)) == 1
    busy = lab.busy_gpus()
    free = [(n, i) for n, idx in lab.slurm_labels.items() for i in idx if (n, i) not in busy]
    small = lab.sbatch("--gpus=1", "--comment=pal:app=vgg", f"--wrap={WRAP}")
    (gpu,) = lab.gpus(lab.wait_running(small)[small])
    core = lab.core_choice(PlacementRequest(str(small), "C", 1), busy)
    assert lab.score(*gpu, "C") == pytest.approx(core.max_score)
    assert lab.score(*gpu, "C") == pytest.approx(min(lab.score(*g, "C") for g in free))
    # a GPU class A would not want: a faster one for A is still free
    assert lab.score(*gpu, "A") > min(lab.score(*g, "A") for g in free if g != gpu)


# ---------------------------------------------------------------------------------------------
# user constraints


def _nodes_of(lab: Lab, job_id: int) -> set[str]:
    job = lab.wait_running(job_id)[job_id]
    return {n for n, _ in lab.gpus(job)}


def test_nodelist_exclude_constraint_are_honored(clean: Lab) -> None:
    lab = clean
    a = lab.sbatch("--gres=gpu:1", "--nodelist=n03", "--comment=pal:app=resnet", f"--wrap={WRAP}")
    b = lab.sbatch("--gres=gpu:1", "--exclude=n01,n02,n03", f"--wrap={WRAP}")
    c = lab.sbatch(
        "--gres=gpu:2", "--constraint=rackB", "--comment=pal:app=resnet", f"--wrap={WRAP}"
    )
    assert _nodes_of(lab, a) == {"n03"}
    assert _nodes_of(lab, b) == {"n04"}
    assert _nodes_of(lab, c) <= {"n03", "n04"}
    for job_id in (a, b, c):
        assert _admin(lab.jobs()[job_id])["action"] in ("route", "pass")


def test_gpu_counts_per_node_per_job_typed_and_arrays(clean: Lab) -> None:
    lab = clean
    per_node = lab.sbatch("-N2", "--gpus-per-node=2", f"--wrap={WRAP}")
    per_job = lab.sbatch("--gpus=3", "--comment=pal:app=resnet", f"--wrap={WRAP}")
    label = lab.slurm_labels["n02"][0]
    typed = lab.sbatch(f"--gres=gpu:{label}:1", f"--wrap={WRAP}")
    lab.sbatch("-a", "0-1", "--gres=gpu:1", f"--wrap={WRAP}")  # its tasks: the other jobs
    jobs = lab.wait_running(per_node, per_job, typed)
    pn = lab.gpus(jobs[per_node])
    assert len(pn) == 4 and len({n for n, _ in pn}) == 2
    assert all(sum(1 for m, _ in pn if m == n) == 2 for n, _ in pn)
    assert len(lab.gpus(jobs[per_job])) == 3
    (g,) = lab.gpus(jobs[typed])
    assert lab.slurm_labels[g[0]][g[1]] == label  # pinned by the user: passed as written
    assert _admin(jobs[typed])["action"] == "pass"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tasks = [
            j
            for j in lab.jobs().values()
            if j.state == "RUNNING" and j.job_id not in (per_node, per_job, typed)
        ]
        if len(tasks) == 2:
            break
        time.sleep(0.2)
    assert len(tasks) == 2 and all(len(lab.gpus(t)) == 1 for t in tasks)


def test_cpu_only_jobs_are_untouched(clean: Lab) -> None:
    lab = clean
    before = lab.stats()["decide_total"]
    job_id = lab.sbatch("-N1", f"--wrap={SLEEP}")
    job = lab.wait_running(job_id)[job_id]
    assert job.admin_comment == "" and lab.gpus(job) == []
    assert lab.stats()["decide_total"] == before


# ---------------------------------------------------------------------------------------------
# fail open


def _runs_as_written(lab: Lab, why: str) -> None:
    """A model-typed and an untyped GPU job are accepted and run, nothing steered, and
    job_submit.lua logged one fail-open line per job saying ``why``."""
    mark = lab.ctld_log_size()
    typed = lab.sbatch("--gres=gpu:v100:2", f"--wrap={WRAP}")
    plain = lab.sbatch("--gpus=1", f"--wrap={WRAP}")
    jobs = lab.wait_running(typed, plain)
    assert len(lab.gpus(jobs[typed])) == 2 and len(lab.gpus(jobs[plain])) == 1
    assert len(lab.job_gpus_seen(typed)) == 2
    for job in jobs.values():
        assert job.admin_comment == "" and not job.required_nodes
    lines = lab.fail_open_lines(mark)
    assert len(lines) == 2, lines
    assert "translated tres_per_node=" + stored_tres(lab.tb, "gres:gpu:2") in lines[0]
    assert all(why in line for line in lines), lines


def test_advisor_stopped_or_killed_jobs_run_as_written(clean: Lab) -> None:
    lab = clean
    lab.stop_advisor(kill=True)  # SIGKILL: the socket file stays, nobody listens
    assert lab.socket.exists()
    _runs_as_written(lab, "connect")
    lab.cancel_all()
    lab.socket.unlink()  # stopped and cleaned up: no socket at all
    _runs_as_written(lab, "connect")


def test_a_paused_advisor_is_routing_again_within_one_refresh(clean: Lab) -> None:
    """SIGSTOP for 2 s during 20 submits (swap, a long GC): the jobs go through as written,
    the requests it reads late are dropped or their answers' GPUs released, and once the jobs
    are gone a new job is routed within one refresh, not after the reservation TTL (30 s)."""
    import signal

    lab = clean
    assert lab.advisor is not None
    before = lab.ask({"op": "stats"})
    submitted: list[int] = []

    def submit() -> None:
        for _ in range(20):
            submitted.append(
                lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", f"--wrap={WRAP}")
            )

    os.kill(lab.advisor.pid, signal.SIGSTOP)
    worker = threading.Thread(target=submit)
    try:
        worker.start()
        time.sleep(2.0)
    finally:
        os.kill(lab.advisor.pid, signal.SIGCONT)
    worker.join(timeout=120)
    assert len(submitted) == 20  # nothing was rejected
    stats = lab.ask({"op": "stats"})
    late = (stats["decide_late"] - before["decide_late"]) + (
        stats["answers_undelivered"] - before["answers_undelivered"]
    )
    assert late >= 1, stats  # the pause made some answers too late for the plugin
    lab.cancel_all()
    # A refresh (every 1 s) releases them: every GPU free well before the reservations' 30 s
    # TTL could have, counted from their making, before the cancel. The margin over one
    # refresh is for a loaded machine (the suite's other worker), not for the TTL.
    deadline = time.monotonic() + 12.0
    health: dict = {}
    while time.monotonic() < deadline:
        health = lab.ask({"op": "health"})
        if health.get("free") == 16 and not health.get("reservations"):
            break
        time.sleep(0.1)
    assert health.get("free") == 16 and not health.get("reservations"), health
    job_id = lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", f"--wrap={WRAP}")
    assert _admin(lab.wait_running(job_id)[job_id])["action"] == "route"


def test_advisor_that_never_answers(clean: Lab) -> None:
    lab = clean
    lab.stand_in_server(lambda _line: None)
    _runs_as_written(lab, "timeout")
    assert lab.held  # the script did connect and wait


def test_advisor_dying_mid_answer(clean: Lab) -> None:
    """The advisor dies while job_submit.lua waits: half a line, then the connection closes."""
    lab = clean
    lab.stand_in_server(lambda _line: b'{"v":1,"ok":true,"action":"route","set":{"req_no')
    _runs_as_written(lab, "closed")


def test_advisor_answering_garbage(clean: Lab) -> None:
    lab = clean
    lab.stand_in_server(lambda _line: b"\x00\xffnot json at all\n")
    _runs_as_written(lab, "not JSON")
    lab.cancel_all()
    bad_type = b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":"n99","min_nodes":"x"}}\n'
    lab.stand_in_server(lambda _line: bad_type)
    _runs_as_written(lab, "node count")


def test_slurmctld_keeps_one_connection_to_the_advisor_across_submissions(clean: Lab) -> None:
    """slurmctld keeps job_submit.lua's Lua state between calls (one call at a time), so
    back-to-back submissions share one connection, each with its own answer; a connection
    the advisor closed (idle, restart) is replaced at the next submission."""
    lab = clean
    lab.stop_advisor()
    lab.socket.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(lab.socket))
    srv.listen(16)
    lab.stand_in = srv  # closed by stop_stand_in, with the connections in lab.held
    requests: list[int] = []

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn.makefile("rb") as lines:
            for _line in lines:
                requests.append(len(requests) + 1)
                comment = f"slurm-pal/stand-in pass n={requests[-1]}"
                answer = (
                    f'{{"v":1,"ok":true,"action":"pass","set":{{"admin_comment":"{comment}"}}}}'
                )
                conn.sendall(answer.encode() + b"\n")

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            lab.held.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        jobs = [lab.sbatch("-H", "--gres=gpu:1", f"--wrap={WRAP}") for _ in range(4)]
        assert len(lab.held) == 1 and requests == [1, 2, 3, 4]
        seen = lab.jobs()
        assert [seen[j].admin_comment for j in jobs] == [
            f"slurm-pal/stand-in pass n={n}" for n in (1, 2, 3, 4)
        ]
        lab.held[0].shutdown(socket.SHUT_RDWR)  # the advisor closes it
        again = lab.sbatch("-H", "--gres=gpu:1", f"--wrap={WRAP}")
        assert len(lab.held) == 2 and requests[-1] == 5
        assert lab.jobs()[again].admin_comment == "slurm-pal/stand-in pass n=5"
    finally:
        for conn in lab.held:  # close() alone leaves the fd to the serving thread's reader
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        lab.stop_stand_in()


# ---------------------------------------------------------------------------------------------
# security


def test_unprivileged_user_cannot_talk_to_the_socket(clean: Lab) -> None:
    lab = clean
    probe = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({str(lab.socket)!r})\n"
        "except OSError as e:\n"
        "    print('REFUSED', e); raise SystemExit\n"
        "try:\n"
        '    s.sendall(b\'{"v":1,"op":"health"}\\n\')\n'
        "except OSError as e:\n"
        "    print('SEND', e)\n"
        "try:\n"
        "    print('ANSWER', s.recv(4096))\n"
        "except OSError as e:\n"
        "    print('RECV', e)\n"
    )

    def as_nobody() -> str:
        proc = subprocess.run(
            ["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return proc.stdout + proc.stderr

    out = as_nobody()  # the socket's file mode (0660, group advisor.socket_group) stops it
    assert "REFUSED" in out and "Permission denied" in out, out
    # with the file opened to everyone, the service's peer check still refuses nobody
    modes = {p: p.stat().st_mode & 0o7777 for p in (lab.socket, lab.socket.parent)}
    try:
        lab.socket.parent.chmod(modes[lab.socket.parent] | 0o005)
        lab.socket.chmod(0o666)
        out = as_nobody()
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    # the service answers "permission denied" and closes (nobody may see the answer, or a
    # reset if it was still sending); it never answers nobody's request
    assert "REFUSED" not in out and '"ok": true' not in out and '"ok":true' not in out, out
    assert "permission denied" in out or "ANSWER b''" in out or "RECV" in out, out
    assert lab.stats()["peer_refused"] >= 1
    # nobody's GPU job still goes through the advisor (slurmctld asks it as root)
    job_id = lab.sbatch("--gres=gpu:1", f"--wrap={WRAP}", user="nobody")
    job = lab.wait_running(job_id)[job_id]
    assert _admin(job)["action"] == "route", job.admin_comment


# ---------------------------------------------------------------------------------------------
# job records


def test_epilog_records_reach_the_store_and_survive_an_advisor_restart(clean: Lab) -> None:
    lab = clean
    first = lab.stats()["records_total"]
    job_id = lab.sbatch("--gres=gpu:1", "--wrap=true")
    lab.tb.wait_job(job_id)
    deadline = time.monotonic() + 30
    while lab.stats()["records_total"] < first + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lab.stats()["records_total"] >= first + 2  # prolog + epilog
    assert _store_records(lab, job_id) == {"prolog", "epilog"}

    lab.stop_advisor()
    down = lab.sbatch("--gres=gpu:1", "--wrap=true")
    lab.tb.wait_job(down)
    deadline = time.monotonic() + 30
    while len(spooled(lab.spool)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    names = sorted(p.name for p in spooled(lab.spool))
    assert [n for n in names if n.startswith(f"{down}.")] == [
        f"{down}.{_node(lab, down)}.epilog.json",
        f"{down}.{_node(lab, down)}.prolog.json",
    ]
    lab.start_advisor()  # the service sweeps the spool dir
    deadline = time.monotonic() + 60
    while spooled(lab.spool) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spooled(lab.spool) == []
    assert _store_records(lab, down) == {"prolog", "epilog"}


def _node(lab: Lab, job_id: int) -> str:
    return lab.tb.job_fields(job_id)["NodeList"]


def _store_records(lab: Lab, job_id: int) -> set[str]:
    """The kinds of the job's records in the store's ``job_records`` table."""
    with sqlite3.connect(lab.db) as db:
        rows = db.execute("SELECT kind FROM job_records WHERE job_id = ?", (job_id,)).fetchall()
    return {str(kind) for (kind,) in rows}
