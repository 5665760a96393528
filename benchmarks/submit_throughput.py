"""The controller's submit throughput with job_submit.lua asking the advisor: bursts of
submissions from several clients at once, controller pinned to a core of its own.

    sudo .venv/bin/python benchmarks/submit_throughput.py                  # 500 x 4 arms x 2
    sudo .venv/bin/python benchmarks/submit_throughput.py --burst 2000 --repeats 1 --json

Why: Slurm runs job_submit.lua while it holds its job-write lock, one copy at a time, so every
millisecond the plugin spends is one no other RPC of the controller gets; a site that submits
in bursts (HTC) sees it as jobs per second accepted and as the clients' latency. One
submission at a time (``benchmarks/submit_latency.py``) does not show that.

Setup as ``benchmarks/storm_pinned.py``: the multi-host testbed (a controller host and
``--nodes`` compute hosts, 4 fake GPUs each), the controller host's munged, slurmctld and
whatever answers job_submit.lua pinned to ``--pin-controller`` (default CPU 0), the compute
hosts to the other CPUs. The ``--clients`` submitting processes run on the controller host (the
testbed's login node) pinned to ``--submit-cpus`` (default: the compute CPUs, idle here since
every job is held: on the controller's core they would take what slurmctld needs). Each client
runs its share of the burst one ``sbatch`` after the other (a process per submission, as a
user's loop or a workflow engine does); all clients start together.

``--mode swap`` (the default, :class:`SwapRun`): one testbed and one advisor throughout, the
arms' scripts swapped in before each block of ``--burst`` submissions, rounds in rotated order;
the baseline is ``pass_through`` (the plugin with a script that returns at once). Blocks
seconds apart share the machine's load, which matters on a machine shared with other work.
``--mode fresh``: each arm on a fresh testbed, alternated in order across ``--repeats``:

- ``stock``: no job_submit plugin at all;
- ``advisor``: the rendered job_submit.lua and ``slurm-pal serve`` as shipped;
- ``fail_open``: the rendered job_submit.lua, no advisor (its socket is absent): what the
  plugin costs when the advisor is gone;
- ``instant``: the rendered job_submit.lua against a stand-in on the advisor's socket that
  answers every request at once with a fixed route: the Lua and the socket without the
  service's decision.

Jobs: ``sbatch -H --gres=gpu:1 --wrap=true`` (held: none runs, so the controller does nothing but
take submissions), ``--cpu-share`` of them CPU-only. Reported per arm: accepted jobs/s (burst
size over the time from the first submission's start to the last one's end), sbatch p50/p99
pooled over the repeats, slurmctld's CPU seconds in the burst and the controller core's CPU
milliseconds per job (slurmctld, munged and the advisor or stand-in with its children: what
bounds the controller's throughput once the clients are not the bottleneck); for the advisor
arm the service's decide time (its stats) and its decisions, and its CPU per request: its CPU
in the burst less what it spends over as long with the same queue and no submissions
(``--idle-s`` after the burst: its Slurm reads); ratios against stock of the
same run. On a 2-core machine the clients (a process per sbatch) fill their core: jobs/s
there measures the clients as much as the controller, the CPU per job does not.
``--lua-parts N`` also times, outside slurmctld (lua5.1 with a mock ``slurm`` table), the
rendered script's parts per request against the same stand-in: building and encoding the
request, the socket exchange, decoding the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from replan_load import percentile
from storm_pinned import Run as StormRun
from storm_pinned import busy_share, cpu_times, proc_cpu_s, terminate_as_exit

from slurm_pal.testbed import missing_binaries
from slurm_pal.testbed.hosts import missing_tools
from slurm_pal.testbed.multihost import MultiHostSlurm
from slurm_pal.testbed.pinning import cpu_list, parse_cpu_list, pinned, split_cpus
from slurm_pal.testbed.run import FIFO, AdvisorArm, Prepared, RunSettings, prepare

Log = Callable[[str], None]
ARMS = ("stock", "advisor", "fail_open", "instant")

# A client on the controller host: its jobs on the first line, "go" on the second; one result
# line [start, took, rc, stderr] per sbatch (monotonic clock: system-wide on Linux).
CLIENT = """
import json, subprocess, sys, time
jobs = json.loads(sys.stdin.readline())
sys.stdin.readline()
out = []
for args in jobs:
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True)
    out.append([start, time.monotonic() - start, proc.returncode, proc.stderr[-300:]])
print(json.dumps(out), flush=True)
"""

# The stand-in for the advisor: every request line (several per connection) gets a fixed
# route at once.
INSTANT = """
import os, socket, sys, threading
ANSWER = (b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":"n01",'
          b'"tres_per_node":"gres:gpu:1","min_nodes":1,"max_nodes":1,'
          b'"admin_comment":"slurm-pal/bench route"},"class":"A","reason":"fixed","lv":1.0,'
          b'"token":"t"}\\n')
path = sys.argv[1]
if os.path.exists(path):
    os.unlink(path)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
os.chmod(path, 0o666)
srv.listen(64)
print("up", flush=True)
def serve(conn):
    with conn:
        buf = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
            while b"\\n" in buf:
                _line, buf = buf.split(b"\\n", 1)
                conn.sendall(ANSWER)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def job_args(out: Path, gpu: bool) -> list[str]:
    args = ["sbatch", "-H", "--parsable", "-o", "/dev/null", "--chdir", str(out)]
    return [*args, *(["--gres=gpu:1"] if gpu else []), "--wrap=true"]


def burst_jobs(n: int, clients: int, cpu_share: float, out: Path) -> list[list[list[str]]]:
    """``n`` submissions dealt round-robin to ``clients``; every ``1/cpu_share``-th CPU-only."""
    every = round(1 / cpu_share) if cpu_share > 0 else 0
    jobs = [job_args(out, not (every and i % every == every - 1)) for i in range(n)]
    return [jobs[c::clients] for c in range(clients)]


def run_clients(
    tb: MultiHostSlurm, cpus: Sequence[int], shares: list[list[list[str]]]
) -> list[list[float]]:
    """Start one client per share, let them go together, return every [start, took]."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    procs = [
        subprocess.Popen(
            tb.on_host(tb.controller, pinned(cpus, [python, "-c", CLIENT])),
            env=tb.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in shares
    ]
    for proc, share in zip(procs, shares, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(share) + "\n")
        proc.stdin.flush()
    time.sleep(1.0)  # every client has entered the host and read its jobs
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results: list[list[float]] = []
    failed: list[str] = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=1800)
        for start, took, rc, err in json.loads(stdout):
            if rc != 0:
                failed.append(err.strip())
            results.append([start, took])
    if failed:
        raise RuntimeError(f"{len(failed)} sbatch failed, first: {failed[0]}")
    return results


class Run:
    """One arm on a fresh testbed: warm-up, one burst, figures."""

    def __init__(self, arm: str, prep: Prepared, args: argparse.Namespace, cpus: dict) -> None:
        self.arm = arm
        self.prep = prep
        self.args = args
        self.cpus = cpus

    def run(self, log: Log) -> dict[str, object]:
        args, prep = self.args, self.prep
        settings = prep.settings
        out = settings.root / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        out.chmod(0o1777)
        advisor = AdvisorArm() if self.arm == "advisor" else None
        options = {} if self.arm == "stock" else AdvisorArm().testbed_options(prep)
        tb = MultiHostSlurm(
            settings.root,
            prep.specs,
            device_pattern=settings.device_pattern,
            extra_conf=(*FIFO, f"MaxJobCount={args.burst + args.warmup + 1000}"),
            per_host_dirs=(str(settings.work / "spool"),),
            controller_cpus=self.cpus["controller"],
            compute_cpus=self.cpus["compute"],
            **options,  # type: ignore[arg-type]
        )
        stand_in: subprocess.Popen[str] | None = None
        report: dict[str, object] = {"arm": self.arm}
        try:
            tb.start(timeout_s=60.0)
            prep.socket_path.unlink(missing_ok=True)
            failopen = prep.socket_path.with_name(prep.socket_path.name + ".failopen")
            failopen.unlink(missing_ok=True)
            if advisor is not None:
                advisor.start(tb, prep, log)
            elif self.arm == "instant":
                stand_in = start_stand_in(tb, prep.socket_path)
            # warm-up (not counted): the script loaded, the advisor's first decisions made
            run_clients(tb, self.cpus["submit"], burst_jobs(args.warmup, 1, 0.0, out))
            time.sleep(2.5 * settings.refresh_s)  # the advisor has seen the warm-up jobs
            before = advisor.stats(prep) if advisor is not None else {}
            shares = burst_jobs(args.burst, args.clients, args.cpu_share, out)
            daemons = tb.running()
            ctld, munged = daemons.get("slurmctld"), daemons.get("munged")
            answerer = advisor.proc if advisor is not None else stand_in
            cpu0, ctld0, munged0 = cpu_times(), proc_cpu_s(ctld), proc_cpu_s(munged)
            answerer0 = StormRun._tree_cpu_s(answerer.pid) if answerer is not None else 0.0
            spy = start_py_spy(args, advisor) if advisor is not None else None
            times = run_clients(tb, self.cpus["submit"], shares)
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                spy.wait(timeout=60)
            answerer_s = StormRun._tree_cpu_s(answerer.pid) - answerer0 if answerer else 0.0
            idle_s = 0.0
            if answerer is not None and args.idle_s > 0:
                # the same queue, no submissions: what the answerer spends on its own (the
                # advisor's Slurm reads), to tell its per-request CPU from it
                idle0 = StormRun._tree_cpu_s(answerer.pid)
                time.sleep(args.idle_s)
                idle_s = StormRun._tree_cpu_s(answerer.pid) - idle0
            controller_s = proc_cpu_s(ctld) - ctld0 + proc_cpu_s(munged) - munged0 + answerer_s
            first = min(s for s, _ in times)
            last = max(s + t for s, t in times)
            idle_rate = idle_s / args.idle_s if args.idle_s > 0 else 0.0
            report |= {
                "accepted": len(times),
                "burst_s": round(last - first, 2),
                "jobs_per_s": round(len(times) / (last - first), 1),
                "sbatch_ms_p50": _ms([t for _, t in times], 0.5),
                "sbatch_ms_p99": _ms([t for _, t in times], 0.99),
                "slurmctld_cpu_s": round(proc_cpu_s(ctld) - ctld0, 2),
                "answerer_cpu_s": round(answerer_s, 2),
                "answerer_idle_cpu_pct": round(100 * idle_rate, 1),
                # its CPU in the burst less what it spends idle over as long: per request
                "answerer_request_cpu_ms_per_job": round(
                    1000 * max(0.0, answerer_s - idle_rate * (last - first)) / len(times), 2
                ),
                # what the controller's core spent per job: slurmctld, munged, the answerer
                "controller_cpu_ms_per_job": round(1000 * controller_s / len(times), 2),
                "cpu_busy_pct": busy_share(cpu0, cpu_times()),
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "_times": [t for _, t in times],
            }
            if advisor is not None:
                report |= _advisor_figures(before, advisor.stats(prep))
            if self.arm != "stock":
                text = failopen.read_text() if failopen.exists() else ""
                report["fail_open_lines"] = text.count("\n")
            log(
                f"{self.arm}: {report['jobs_per_s']} jobs/s, sbatch p50 "
                f"{report['sbatch_ms_p50']} ms p99 {report['sbatch_ms_p99']} ms, slurmctld "
                f"{report['slurmctld_cpu_s']} CPU s, CPU busy {report['cpu_busy_pct']}"
            )
        finally:
            if advisor is not None:
                advisor.stop()
            if stand_in is not None:
                stand_in.kill()
                stand_in.wait(timeout=10)
            tb.stop()
        return report


PASS_THROUGH = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""


class SwapRun:
    """``--mode swap``: one testbed, the advisor up throughout, the arms' job_submit.lua swapped
    in turn before each block of ``--burst`` submissions (slurmctld re-reads the script when its
    mtime changes), ``--repeats`` rounds in rotated order, every job cancelled after a round.
    Blocks seconds apart see the same load from the machine's other users, which fresh testbeds
    minutes apart do not. The baseline is ``pass_through`` (the plugin loaded with a script that
    returns at once: stock plus one empty Lua call per job); ``stock`` without the plugin needs
    ``--mode fresh``."""

    ARMS = ("pass_through", "advisor", "fail_open", "instant")

    def __init__(self, prep: Prepared, args: argparse.Namespace, cpus: dict) -> None:
        self.prep = prep
        self.args = args
        self.cpus = cpus
        self._swaps = 0

    def scripts(self) -> dict[str, str]:
        rendered = (self.prep.site_dir / "job_submit.lua").read_text()
        sock = str(self.prep.socket_path)
        quoted = json.dumps(sock)  # the template writes it as a Lua string, the same here
        if quoted not in rendered:
            raise RuntimeError(f"the rendered job_submit.lua does not name {sock}")
        instant = json.dumps(str(self.prep.socket_path.with_name("instant.sock")))
        absent = json.dumps(str(self.prep.socket_path.with_name("absent.sock")))
        return {
            "pass_through": PASS_THROUGH,
            "advisor": rendered,
            "fail_open": rendered.replace(quoted, absent),
            "instant": rendered.replace(quoted, instant),
        }

    def swap(self, tb: MultiHostSlurm, text: str) -> None:
        """Install a script with a strictly later mtime (whole seconds, in the future)."""
        path = tb.root / "etc" / "job_submit.lua"
        path.write_text(text)
        self._swaps += 1
        later = int(time.time()) + 10 + self._swaps
        os.utime(path, (later, later))

    def _request_cpu(self, advisor: AdvisorArm, block: dict[str, object]) -> dict[str, object]:
        """The advisor's CPU per request: its CPU in the block less what it spends over as long
        with the same queue and no submissions (its Slurm reads), measured right after."""
        assert advisor.proc is not None
        if self.args.idle_s <= 0:
            return {}
        idle0 = StormRun._tree_cpu_s(advisor.proc.pid)
        time.sleep(self.args.idle_s)
        rate = (StormRun._tree_cpu_s(advisor.proc.pid) - idle0) / self.args.idle_s
        busy = block["answerers_cpu_s"][0]  # type: ignore[index]
        request_s = max(0.0, busy - rate * block["burst_s"])  # type: ignore[operator]
        return {
            "answerer_idle_cpu_pct": round(100 * rate, 1),
            "answerer_request_cpu_ms_per_job": round(1000 * request_s / block["accepted"], 2),  # type: ignore[operator]
        }

    def run(self, log: Log) -> list[dict[str, object]]:
        args, prep = self.args, self.prep
        settings = prep.settings
        out = settings.root / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        out.chmod(0o1777)
        arms = [a for a in args.arms.split(",") if a]
        scripts = self.scripts()
        absent_log = prep.socket_path.with_name("absent.sock.failopen")
        absent_log.unlink(missing_ok=True)
        advisor = AdvisorArm()
        # cancelled jobs stay in slurmctld's memory for MinJobAge (300 s): room for them all
        max_jobs = args.repeats * len(arms) * (args.burst + args.warmup) + 1000
        tb = MultiHostSlurm(
            settings.root,
            prep.specs,
            device_pattern=settings.device_pattern,
            extra_conf=(*FIFO, f"MaxJobCount={max_jobs}"),
            per_host_dirs=(str(settings.work / "spool"),),
            controller_cpus=self.cpus["controller"],
            compute_cpus=self.cpus["compute"],
            **advisor.testbed_options(prep),  # type: ignore[arg-type]
        )
        stand_in: subprocess.Popen[str] | None = None
        results: list[dict[str, object]] = []
        try:
            tb.start(timeout_s=60.0)
            prep.socket_path.unlink(missing_ok=True)
            advisor.start(tb, prep, log)
            stand_in = start_stand_in(tb, prep.socket_path.with_name("instant.sock"))
            assert advisor.proc is not None
            for repeat in range(args.repeats):
                shift = repeat % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    self.swap(tb, scripts[arm])
                    # warm-up (not counted): the new script loaded, its connection made
                    run_clients(tb, self.cpus["submit"], burst_jobs(args.warmup, 1, 0.0, out))
                    before = advisor.stats(prep)
                    lines_before = _lines(absent_log)
                    block = measure_burst(
                        tb, self.cpus["submit"], burst_jobs(args.burst, args.clients,
                        args.cpu_share, out), [advisor.proc.pid, stand_in.pid],
                        spy=start_py_spy(args, advisor) if arm == "advisor" else None,
                    )  # fmt: skip
                    block |= {"arm": arm, "repeat": repeat + 1}
                    if arm == "fail_open":  # the swapped script ran: one line per job
                        block["fail_open_lines"] = _lines(absent_log) - lines_before
                    if arm == "advisor":
                        block |= _advisor_figures(before, advisor.stats(prep))
                        block |= self._request_cpu(advisor, block)
                    results.append(block)
                    log(
                        f"round {repeat + 1}/{args.repeats} {arm}: {block['jobs_per_s']} jobs/s,"
                        f" sbatch p50 {block['sbatch_ms_p50']} ms p99 {block['sbatch_ms_p99']}"
                        f" ms, controller CPU {block['controller_cpu_ms_per_job']} ms/job"
                    )
                tb.run(["scancel", "-u", "root"], timeout_s=120, check=False)
                time.sleep(2.5 * settings.refresh_s)  # the advisor's view empty again
        finally:
            advisor.stop()
            if stand_in is not None:
                stand_in.kill()
                stand_in.wait(timeout=10)
            tb.stop()
        return results


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def measure_burst(
    tb: MultiHostSlurm,
    cpus: Sequence[int],
    shares: list[list[list[str]]],
    answerers: Sequence[int],
    spy: subprocess.Popen[bytes] | None = None,
) -> dict[str, object]:
    """One burst from the clients: jobs/s, latency, and the controller core's CPU per job
    (slurmctld, munged and ``answerers`` with their children)."""
    daemons = tb.running()
    ctld, munged = daemons.get("slurmctld"), daemons.get("munged")

    def controller_cpu_s() -> float:
        own = proc_cpu_s(ctld) + proc_cpu_s(munged)
        return own + sum(StormRun._tree_cpu_s(pid) for pid in answerers)

    cpu0, ctld0, controller0 = cpu_times(), proc_cpu_s(ctld), controller_cpu_s()
    answerers0 = [StormRun._tree_cpu_s(pid) for pid in answerers]
    times = run_clients(tb, cpus, shares)
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        spy.wait(timeout=60)
    controller_s = controller_cpu_s() - controller0
    answerers_s = [StormRun._tree_cpu_s(p) - c for p, c in zip(answerers, answerers0, strict=True)]
    first = min(s for s, _ in times)
    last = max(s + t for s, t in times)
    return {
        "accepted": len(times),
        "burst_s": round(last - first, 2),
        "jobs_per_s": round(len(times) / (last - first), 1),
        "sbatch_ms_p50": _ms([t for _, t in times], 0.5),
        "sbatch_ms_p99": _ms([t for _, t in times], 0.99),
        "slurmctld_cpu_s": round(proc_cpu_s(ctld) - ctld0, 2),
        "controller_cpu_ms_per_job": round(1000 * controller_s / len(times), 2),
        "answerers_cpu_s": [round(a, 2) for a in answerers_s],
        "cpu_busy_pct": busy_share(cpu0, cpu_times()),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "_times": [t for _, t in times],
    }


def start_stand_in(tb: MultiHostSlurm, path: Path) -> subprocess.Popen[str]:
    """The instant stand-in on the controller host, on the controller's CPUs (where the
    advisor runs)."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    proc = subprocess.Popen(
        tb.daemon_command(tb.controller, [python, "-c", INSTANT, str(path)]),
        env=tb.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "up":
        raise RuntimeError("the instant stand-in did not start")
    return proc


def start_py_spy(args: argparse.Namespace, advisor: AdvisorArm) -> subprocess.Popen[bytes] | None:
    """``--py-spy``: sample the advisor (and its children) through a burst, as collapsed
    stacks (flamegraph.pl or speedscope read them)."""
    if advisor.proc is None or not args.py_spy:
        return None
    out = Path(args.py_spy)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"advisor-burst-{args.burst}-{int(time.time())}.txt"
    spy = subprocess.Popen(
        [
            *(args.py_spy_bin, "record", "--format", "raw", "--subprocesses"),
            *("--rate", "500", "--pid", str(advisor.proc.pid), "-o", str(target)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached
    return spy


def _advisor_figures(before: dict, after: dict) -> dict[str, object]:
    def delta(key: str) -> int:
        return int(after.get(key, 0)) - int(before.get(key, 0))

    return {
        "decide_ms_p50": after.get("decide_ms_p50"),
        "decide_ms_p99": after.get("decide_ms_p99"),
        "decisions": {a: delta(f"decide_{a}") for a in ("route", "wait", "pass", "deny")},
        "decide_errors": delta("decide_errors"),
        "decide_late": delta("decide_late"),
    }


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 1) if values else None


def _median(runs: list[dict[str, object]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in runs), 2)  # type: ignore[arg-type]


def summarize(runs: list[dict[str, object]], arms: Sequence[str]) -> dict[str, object]:
    """Per arm: pooled latency, median jobs/s and CPU over the repeats; each against the
    baseline (``stock``, in swap mode ``pass_through``) as ``<key>_x_base``."""
    out: dict[str, dict[str, object]] = {}
    keys = ("jobs_per_s", "sbatch_ms_p50", "sbatch_ms_p99", "controller_cpu_ms_per_job")
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        pooled = [t for r in mine for t in r["_times"]]  # type: ignore[attr-defined]
        out[arm] = {
            "runs": len(mine),
            "jobs_per_s": _median(mine, "jobs_per_s"),
            "per_run_jobs_per_s": [r["jobs_per_s"] for r in mine],
            "sbatch_ms_p50": _ms(pooled, 0.5),
            "sbatch_ms_p99": _ms(pooled, 0.99),
            "controller_cpu_ms_per_job": _median(mine, "controller_cpu_ms_per_job"),
        }
        for extra in ("answerer_request_cpu_ms_per_job", "answerer_idle_cpu_pct"):
            if all(extra in r for r in mine):
                out[arm][extra] = _median(mine, extra)
    base_name = "stock" if "stock" in out else "pass_through"
    base = out.get(base_name)
    if base:
        for arm, figures in out.items():
            if arm == base_name:
                continue
            for key in keys:
                if base[key] and figures[key] is not None:
                    figures[f"{key}_x_base"] = round(figures[key] / base[key], 2)  # type: ignore[operator]
    return {"baseline": base_name, "arms": out}


# --- the rendered script's parts, outside slurmctld ---------------------------------------------

LUA_PARTS = """
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534}
slurm.log_info = function() end
slurm.log_user = function() end
dofile(%(script)s)
local J = slurm_pal_lua
local socket = require("socket")
local job = {tres_per_node = "gres:gpu:1", name = "wrap", partition = "gpu",
  script = "#!/bin/sh\\n# a batch script of a typical size\\n" .. string.rep("x", 600),
  min_nodes = 1, max_nodes = 1, num_tasks = 1, time_limit = 60, user_name = "alice"}
local n = %(n)d
local t = {build = {}, exchange = {}, decode = {}, whole = {}}
for i = 1, n do
  local a = socket.gettime()
  local line = J.encode({v = 1, op = "decide", deadline = a + 2,
    job = J.job_fields(job, 1000)})
  local b = socket.gettime()
  local answer = assert(J.exchange(line, b + 2))
  local c = socket.gettime()
  J.decode(answer)
  local d = socket.gettime()
  t.build[i], t.exchange[i], t.decode[i] = (b - a) * 1e6, (c - b) * 1e6, (d - c) * 1e6
  local e = socket.gettime()
  slurm_job_submit({tres_per_node = "gres:gpu:1", name = "wrap", script = job.script,
    user_name = "alice"}, {}, 1000)
  t.whole[i] = (socket.gettime() - e) * 1e6
end
io.write(J.encode(t), "\\n")
"""


def lua_parts(script: Path, n: int, socket_path: Path) -> dict[str, object]:
    """Per-request microseconds (p50/p99) of the rendered script's parts, run by lua5.1
    against the instant stand-in at ``socket_path`` (which the script was rendered for)."""
    lua = shutil.which("lua5.1")
    if lua is None:
        return {"skipped": "lua5.1 not installed"}
    stand_in = subprocess.Popen(
        [sys.executable, "-c", INSTANT, str(socket_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stand_in.stdout is not None
        stand_in.stdout.readline()
        code = LUA_PARTS % {"script": json.dumps(str(script)), "n": n}
        proc = subprocess.run([lua, "-"], input=code, capture_output=True, text=True, timeout=600)
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-400:]}
    parts = json.loads(proc.stdout)
    result: dict[str, object] = {"n": n}
    for name, values in parts.items():
        values = values[max(1, n // 20) :]  # the first requests warm the interpreter up
        result[f"{name}_us_p50"] = round(percentile(values, 0.5), 1)
        result[f"{name}_us_p99"] = round(percentile(values, 0.99), 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=500, help="submissions per burst")
    parser.add_argument("--clients", type=int, default=4, help="submitting at once")
    parser.add_argument("--warmup", type=int, default=8, help="uncounted, before the burst")
    parser.add_argument("--cpu-share", type=float, default=0.0, help="share of CPU-only jobs")
    parser.add_argument("--nodes", type=int, default=4, help="compute hosts, 4 GPUs each")
    parser.add_argument("--repeats", type=int, default=2, help="runs (rounds) of every arm")
    parser.add_argument(
        "--mode",
        choices=("swap", "fresh"),
        default="swap",
        help="swap: one testbed, the scripts swapped per block (SwapRun); fresh: a testbed per arm",
    )
    parser.add_argument(
        "--arms",
        default="",
        help=f"fresh: among {','.join(ARMS)}; swap: among {','.join(SwapRun.ARMS)} (default all)",
    )
    parser.add_argument("--pin-controller", default="0", help="CPUs of the controller host")
    parser.add_argument(
        "--submit-cpus", default=None, help="CPUs of the clients (default: the compute CPUs)"
    )
    parser.add_argument("--refresh-s", type=float, default=1.0, help="advisor.refresh_s")
    parser.add_argument(
        "--idle-s", type=float, default=6.0, help="after the burst: the answerer's idle CPU"
    )
    parser.add_argument(
        "--lua-parts", type=int, default=0, help="also time the script's parts (requests)"
    )
    parser.add_argument(
        "--py-spy", default="", help="folder: profile the advisor through each burst (py-spy)"
    )
    parser.add_argument("--py-spy-bin", default="py-spy", help="the py-spy program")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    valid = ARMS if args.mode == "fresh" else SwapRun.ARMS
    arms = [a for a in args.arms.split(",") if a] or list(valid)
    if bad := [a for a in arms if a not in valid]:
        raise SystemExit(f"submit_throughput: unknown arm(s) {bad}; valid: {', '.join(valid)}")
    args.arms = ",".join(arms)
    if min(args.burst, args.clients, args.repeats, args.nodes) < 1 or not 0 <= args.cpu_share < 1:
        raise SystemExit(
            "submit_throughput: need --burst, --clients, --repeats, --nodes >= 1; "
            "0 <= --cpu-share < 1"
        )
    missing = missing_binaries() + missing_tools()
    if missing or os.geteuid() != 0:
        print(
            f"submit_throughput: needs root and {', '.join(missing) or 'Slurm'} "
            "(bash scripts/install-slurm.sh)"
        )
        return 2
    try:
        ctl, compute = split_cpus(parse_cpu_list(args.pin_controller), os.sched_getaffinity(0))
        submit = parse_cpu_list(args.submit_cpus) if args.submit_cpus else compute
    except ValueError as exc:
        raise SystemExit(f"submit_throughput: {exc}") from None
    cpus = {"controller": ctl, "compute": compute, "submit": submit}
    os.sched_setaffinity(0, compute)
    log: Log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="spal-tput-", dir="/tmp"))
    root.chmod(0o755)
    settings = RunSettings(root=root, nodes=args.nodes, multihost=True, refresh_s=args.refresh_s)
    report: dict[str, object] = {
        "burst": args.burst,
        "clients": args.clients,
        "cpu_share": args.cpu_share,
        "gpus": args.nodes * 4,
        "repeats": args.repeats,
        "mode": args.mode,
        "cpus": {k: cpu_list(v) for k, v in cpus.items()},
        "uptime_before": _uptime(),
    }
    runs: list[dict[str, object]] = []
    try:
        with terminate_as_exit():
            prep = prepare(settings, log)
            pristine = settings.work / "store.pristine.db"
            shutil.copy2(prep.db, pristine)
            if args.mode == "swap":
                runs = SwapRun(prep, args, cpus).run(log)
            for repeat in range(args.repeats if args.mode == "fresh" else 0):
                shift = repeat % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    if arm == "advisor":  # every advisor run starts from the same store
                        for suffix in ("-wal", "-shm"):
                            Path(f"{prep.db}{suffix}").unlink(missing_ok=True)
                        shutil.copy2(pristine, prep.db)
                    log(f"repeat {repeat + 1}/{args.repeats}: {arm}")
                    result = Run(arm, prep, args, cpus).run(log)
                    result["repeat"] = repeat + 1
                    runs.append(result)
            if args.lua_parts:
                report["lua_parts"] = lua_parts(
                    prep.site_dir / "job_submit.lua", args.lua_parts, prep.socket_path
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report["uptime_after"] = _uptime()
    report |= summarize(runs, arms)
    report["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>14}: {value}")
    return 0


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
