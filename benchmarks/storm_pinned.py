"""sbatch latency under a job-end storm with the controller on a core of its own: the
multi-host testbed, slurmctld and the advisor pinned to one CPU, the compute hosts to the rest.

    sudo .venv/bin/python benchmarks/storm_pinned.py                 # 3 repeats x 2 arms
    sudo .venv/bin/python benchmarks/storm_pinned.py --pending 2000 --repeats 1 --json

Why: ``benchmarks/replan_load.py`` runs every daemon on one host of the 2-core machine, where
the 48 Epilog hooks of a job-end storm compete with slurmctld for the same cores; at a site the
hooks run on the compute nodes. Here the storm runs on the multi-host testbed
(:mod:`slurm_pal.testbed.multihost`: a controller host and ``--nodes`` compute hosts, records
over TCP in munge credentials) with

- the controller host's munged, slurmctld and ``slurm-pal serve`` (with its parsing worker and
  the ``squeue``/``scontrol`` it runs) pinned to ``--pin-controller`` (default CPU 0);
- every compute host's munged and slurmd, hence slurmstepd, the jobs and the Prolog/Epilog
  hooks, pinned to every other CPU this process may use; this process too;
- the storm's ``sbatch`` (a stand-in for the login node) on ``--submit-cpus`` (default: the
  controller's CPUs: on the compute CPUs it would be slowed by the hooks, which only the
  advisor arm runs, and that is not slurmctld's latency); the fill's, not measured, on the
  compute CPUs.

Pinning is by ``taskset`` at exec, so children inherit it; while the storm runs the benchmark
checks every process of the controller's daemons (and their descendants) and every process on
the compute hosts against its set (``pin_violations`` must be 0).

Each run: a fresh testbed, 48 holder jobs on every GPU, ``--pending`` one-GPU jobs behind them,
then ``--ending`` holders cancelled at once while one submitter keeps going (a GPU job, then a
held CPU-only job) from 1 s before the ends until ``--storm-s`` after. Two arms on the same
testbed: ``advisor`` (the rendered job_submit.lua, Prolog/Epilog and ``slurm-pal serve`` as
shipped; the testbed refreshes every second) and ``stock`` (no plugin, no hooks, no advisor),
alternated (stock first in even repeats, advisor first in odd ones) with the same storm window.
Reported per arm, pooled over the repeats and per run: ``sbatch`` p50/p99 of the GPU jobs and
of the CPU-only ones during the storm; per run the load average, each CPU's busy share and
slurmctld's CPU seconds during the storm window; for the advisor arm the Epilog's wait (the
advisor's stats). The storm's ``sbatch`` are timed by a process on the controller host (the
testbed's login node), so entering its namespaces is not in the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from replan_load import percentile, wait_until

from slurm_pal.testbed import missing_binaries
from slurm_pal.testbed.hosts import missing_tools
from slurm_pal.testbed.multihost import MultiHostSlurm
from slurm_pal.testbed.pinning import cpu_list, parse_cpu_list, pinned, split_cpus
from slurm_pal.testbed.run import FIFO, AdvisorArm, Prepared, RunSettings, StockArm, prepare

Log = Callable[[str], None]


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit, so the ``finally`` blocks stop Slurm, the advisor and the
    namespaces (a backgrounded run ignores SIGINT; SIGTERM is what it gets)."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sbatch(tb: MultiHostSlurm, out: Path, *args: str) -> float:
    """Submit one job on the controller host through ``nsenter`` (the fill's submits: their
    times include entering the host's namespaces)."""
    start = time.perf_counter()
    proc = subprocess.run(
        tb.on_host(tb.controller, sbatch_args(out, *args)),
        env=tb.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
    return took


def sbatch_args(out: Path, *args: str) -> list[str]:
    return ["sbatch", "--parsable", "-o", str(out / "%j.out"), "--chdir", str(out), *args]


# Runs inside the controller host and times each sbatch there, so the figures leave out
# entering the namespaces (nsenter into the mount namespace: ~5-10 ms on this machine).
TIMER = """
import json, subprocess, sys, time
for line in sys.stdin:
    start = time.perf_counter()
    proc = subprocess.run(json.loads(line), capture_output=True, text=True)
    took = time.perf_counter() - start
    print(json.dumps([took, proc.returncode, proc.stderr[-400:]]), flush=True)
"""


class Submitter:
    """A process on the controller host (the testbed's login node), pinned to ``cpus``, that
    runs and times the storm's sbatch one at a time."""

    def __init__(self, tb: MultiHostSlurm, cpus: Sequence[int]) -> None:
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        self.proc = subprocess.Popen(
            tb.on_host(tb.controller, pinned(cpus, [python, "-c", TIMER])),
            env=tb.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def submit(self, out: Path, *args: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(sbatch_args(out, *args)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the submitter exited ({self.proc.poll()})")
        took, rc, err = json.loads(line)
        if rc != 0:
            raise RuntimeError(f"sbatch failed: {err.strip()}")
        return float(took)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


# --- what the machine did during the storm --------------------------------------------------


def cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy, total) clock ticks since boot (/proc/stat; idle and iowait are idle)."""
    out: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            total = sum(ticks[:8])  # guest time is already in user
            out[int(name[3:])] = (total - idle, total)
    return out


def busy_share(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict:
    """Each CPU's busy share (%) between two :func:`cpu_times` (anything's: other users too)."""
    share = {}
    for cpu, (busy, total) in after.items():
        b0, t0 = before.get(cpu, (busy, total))
        share[f"cpu{cpu}"] = round(100.0 * (busy - b0) / (total - t0), 1) if total > t0 else None
    return share


def proc_cpu_s(pid: int | None) -> float:
    """A process's CPU seconds so far (all its threads); 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _netns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class PinCheck:
    """Samples every process the pinning covers and counts those found outside their CPUs:
    the controller's daemons and their descendants (a child of the advisor included) on the
    controller's set, everything on a compute host on the compute set."""

    def __init__(self, tb: MultiHostSlurm, roots: Sequence[int]) -> None:
        self.ctl_cpus = set(tb.controller_cpus)
        self.compute_cpus = set(tb.compute_cpus)
        self.roots = set(roots)
        ns = {h.name: tb.network.netns(h.name) for h in tb.network.hosts}
        self.compute_ns = {
            ino
            for name, netns in ns.items()
            if name != tb.controller and (ino := _netns_inode(f"/run/netns/{netns}")) is not None
        }
        self.checked = {"controller": 0, "compute": 0}
        self.violations: list[str] = []

    def sample(self) -> None:
        parents: dict[int, int | None] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                parents[int(entry.name)] = _ppid(int(entry.name))
        for pid in parents:
            side = None
            if _netns_inode(f"/proc/{pid}/ns/net") in self.compute_ns:
                side, expected = "compute", self.compute_cpus
            else:
                seen, at = 0, pid
                while at is not None and at > 1 and seen < 64:
                    if at in self.roots:
                        side, expected = "controller", self.ctl_cpus
                        break
                    at, seen = parents.get(at), seen + 1
            if side is None:
                continue
            try:  # every thread: slurmctld's and the advisor's threads run the work
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                got = set().union(*(os.sched_getaffinity(t) for t in tids))
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue  # ended meanwhile
            self.checked[side] += 1
            if not got <= expected and len(self.violations) < 20:
                self.violations.append(f"{comm} (pid {pid}, {side}) on {cpu_list(got)}")


# --- one run ---------------------------------------------------------------------------------


class Run:
    """One arm on a fresh testbed: fill, storm, figures."""

    def __init__(self, arm_name: str, prep: Prepared, args: argparse.Namespace, cpus: dict):
        self.arm_name = arm_name
        self.prep = prep
        self.args = args
        self.cpus = cpus
        self.stop_submitting = threading.Event()

    def run(self, log: Log) -> dict[str, object]:
        args, prep = self.args, self.prep
        arm = AdvisorArm() if self.arm_name == "advisor" else StockArm()
        settings = prep.settings
        out = settings.root / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        out.chmod(0o1777)
        tb = MultiHostSlurm(
            settings.root,
            prep.specs,
            device_pattern=settings.device_pattern,
            extra_conf=(*FIFO, f"MaxJobCount={args.pending * 2 + 1000}"),
            per_host_dirs=(str(settings.work / "spool"),),
            controller_cpus=self.cpus["controller"],
            compute_cpus=self.cpus["compute"],
            **arm.testbed_options(prep),  # type: ignore[arg-type]
        )
        report: dict[str, object] = {"arm": self.arm_name}
        # The fill is not measured: its sbatch run on the compute CPUs (this process's), which
        # are idle then, so the 10,000 submits do not wait on slurmctld's core.
        pool = ThreadPoolExecutor(args.submitters)
        try:
            tb.start(timeout_s=60.0)
            arm.start(tb, prep, log)
            gpus = len(prep.specs) * settings.gpus_per_node
            for spec in prep.specs:  # pinned to their node: every GPU is taken
                for _ in range(settings.gpus_per_node):
                    sbatch(tb, out, "--gres=gpu:1", "-w", spec.name, "--wrap=sleep 3600")
            wait_until(lambda: len(self._running_ids(tb)) == gpus, 120, "the holders")
            holders = self._running_ids(tb)
            log(f"{self.arm_name}: {gpus} holders running; submitting {args.pending} pending")
            started = time.perf_counter()
            fill = list(pool.map(lambda i: self._fill_one(tb, out, i), range(args.pending)))
            report["fill_s"] = round(time.perf_counter() - started, 1)
            report["fill_sbatch_ms_p99"] = round(percentile(fill, 0.99) * 1000, 1)
            time.sleep(max(12.0, 2.5 * args.refresh_s))  # the advisor's view holds every job
            before = arm.stats(prep) if isinstance(arm, AdvisorArm) else {}
            report |= self._storm(tb, arm, out, holders[: args.ending], log)
            if isinstance(arm, AdvisorArm):
                report |= self._advisor_figures(arm, before)
        finally:
            self.stop_submitting.set()
            pool.shutdown(wait=True, cancel_futures=True)
            self.stop_submitting.clear()
            arm.stop()
            tb.stop()
        return report

    def _fill_one(self, tb: MultiHostSlurm, out: Path, i: int) -> float:
        if self.stop_submitting.is_set():  # interrupted: the queued submits go unsent
            return 0.0
        return sbatch(tb, out, "--gres=gpu:1", f"-J=load{i % 50}", "--wrap=sleep 3600")

    def _running_ids(self, tb: MultiHostSlurm) -> list[int]:
        proc = tb.run(["squeue", "-h", "-t", "R", "-o", "%i"], timeout_s=60)
        return sorted(int(j) for j in proc.stdout.split())

    def _storm(
        self, tb: MultiHostSlurm, arm: object, out: Path, ending: list[int], log: Log
    ) -> dict[str, object]:
        """``ending`` holders end at once while one submitter runs, the same window in both
        arms; what the machine did in that window."""
        gpu_jobs: list[float] = []
        cpu_jobs: list[float] = []  # held, so they never take a node; never asked about
        stop = threading.Event()

        submitter = Submitter(tb, self.cpus["submit"])

        failed: list[BaseException] = []

        def submit_during() -> None:
            try:
                while not stop.is_set():
                    gpu_jobs.append(submitter.submit(out, "--gres=gpu:1", "--wrap=sleep 3600"))
                    cpu_jobs.append(submitter.submit(out, "--hold", "--wrap=sleep 3600"))
            except Exception as exc:  # reported below: a storm with a failed submit is no figure
                failed.append(exc)

        daemons = tb.running()
        ctld = daemons.get("slurmctld")
        # The controller host's daemons; descendants are found at each sample.
        roots = [p for k, p in daemons.items() if k in ("slurmctld", "munged") and p is not None]
        advisor = getattr(arm, "proc", None)
        if advisor is not None:
            roots.append(advisor.pid)
        check = PinCheck(tb, roots)

        def sample_pins() -> None:
            while not stop.wait(0.5):
                check.sample()

        cpu0, ctld0, load0 = cpu_times(), proc_cpu_s(ctld), os.getloadavg()
        advisor0 = self._tree_cpu_s(advisor.pid) if advisor is not None else 0.0
        threads = [threading.Thread(target=submit_during), threading.Thread(target=sample_pins)]
        for t in threads:
            t.start()
        try:
            check.sample()
            time.sleep(1.0)
            tb.run(["scancel", *map(str, ending)], timeout_s=60)
            time.sleep(self.args.storm_s)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
            submitter.close()
        if failed:
            raise RuntimeError(f"{self.arm_name}: the storm's submitter failed: {failed[0]}")
        window = self.args.storm_s + 1.0
        figures: dict[str, object] = {
            "storm_sbatch": len(gpu_jobs),
            "sbatch_ms_p50": _ms(gpu_jobs, 0.5),
            "sbatch_ms_p99": _ms(gpu_jobs, 0.99),
            "cpu_only_sbatch_ms_p50": _ms(cpu_jobs, 0.5),
            "cpu_only_sbatch_ms_p99": _ms(cpu_jobs, 0.99),
            "loadavg_1m_before": round(load0[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
            "cpu_busy_pct": busy_share(cpu0, cpu_times()),
            "slurmctld_cpu_s": round(proc_cpu_s(ctld) - ctld0, 2),
            "window_s": window,
            "pin_checked": dict(check.checked),
            "pin_violations": check.violations,
            "_gpu_jobs": gpu_jobs,
            "_cpu_jobs": cpu_jobs,
        }
        if advisor is not None:
            figures["advisor_cpu_s"] = round(self._tree_cpu_s(advisor.pid) - advisor0, 2)
        log(
            f"{self.arm_name}: storm sbatch p50 {figures['sbatch_ms_p50']} ms, p99 "
            f"{figures['sbatch_ms_p99']} ms ({len(gpu_jobs)} GPU jobs); CPU busy "
            f"{figures['cpu_busy_pct']}; load {figures['loadavg_1m_after']}; pin "
            f"violations {len(check.violations)}"
        )
        return figures

    @staticmethod
    def _tree_cpu_s(pid: int) -> float:
        """CPU seconds of a process, its reaped children and its live descendants (about:
        a child alive at the start and reaped before the end counts its earlier time too)."""
        parents = {
            int(e.name): _ppid(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()
        }
        tree, grew = {pid}, True
        while grew:
            more = {p for p, pp in parents.items() if pp in tree} - tree
            grew, tree = bool(more), tree | more
        total = 0.0
        for p in tree:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        return total

    def _advisor_figures(self, arm: AdvisorArm, before: dict[str, object]) -> dict[str, object]:
        """Wait (unmeasured) for every end's round; the Epilog's wait from the advisor."""

        def ends_taken() -> int:
            now = arm.stats(self.prep)
            return sum(
                int(now.get(k, 0)) - int(before.get(k, 0))  # type: ignore[call-overload]
                for k in ("replans_at_job_end", "spool_applied")
            )

        wait_until(lambda: ends_taken() >= self.args.ending, 60, "the rounds", required=False)
        after = arm.stats(self.prep)
        return {
            "job_end_ms_p50": after.get("job_end_ms_p50"),
            "job_end_ms_p99": after.get("job_end_ms_p99"),
            "ends_not_taken": max(0, self.args.ending - ends_taken()),
            "decide_ms_p99": after.get("decide_ms_p99"),
        }


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 1) if values else None


# --- the whole benchmark ------------------------------------------------------------------------


def summarize(runs: list[dict[str, object]]) -> dict[str, object]:
    """Pooled figures per arm, the advisor / stock ratios, and each repeat's pair."""
    arms: dict[str, dict[str, object]] = {}
    for name in ("stock", "advisor"):
        mine = [r for r in runs if r["arm"] == name]
        gpu = [v for r in mine for v in r["_gpu_jobs"]]  # type: ignore[attr-defined]
        cpu = [v for r in mine for v in r["_cpu_jobs"]]  # type: ignore[attr-defined]
        arms[name] = {
            "runs": len(mine),
            "storm_sbatch": len(gpu),
            "sbatch_ms_p50": _ms(gpu, 0.5),
            "sbatch_ms_p99": _ms(gpu, 0.99),
            "cpu_only_sbatch_ms_p50": _ms(cpu, 0.5),
            "cpu_only_sbatch_ms_p99": _ms(cpu, 0.99),
            "per_run_sbatch_ms_p99": [r["sbatch_ms_p99"] for r in mine],
        }
    summary: dict[str, object] = {"arms": arms}
    s, a = arms["stock"], arms["advisor"]
    for key in ("sbatch_ms_p50", "sbatch_ms_p99"):
        if s[key] and a[key]:
            summary[f"{key}_ratio"] = round(a[key] / s[key], 2)  # type: ignore[operator]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--ending", type=int, default=48)
    parser.add_argument("--nodes", type=int, default=12, help="compute hosts, 4 GPUs each")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (stock, advisor)")
    parser.add_argument("--storm-s", type=float, default=6.0, help="submitting after the ends")
    parser.add_argument("--submitters", type=int, default=4, help="parallel sbatch in the fill")
    parser.add_argument(
        "--pin-controller",
        default="0",
        help="CPUs of the controller host (taskset list); the compute hosts get the others",
    )
    parser.add_argument(
        "--submit-cpus", default=None, help="CPUs of the sbatch clients (default: the controller's)"
    )
    parser.add_argument(
        "--refresh-s",
        type=float,
        default=1.0,
        help="advisor.refresh_s (the testbed's 1 s; the shipped default is 5 s).",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="Keep the testbed folder.")
    args = parser.parse_args()
    missing = missing_binaries() + missing_tools()
    if missing or os.geteuid() != 0:
        print(
            f"storm_pinned: needs root and {', '.join(missing) or 'Slurm'} "
            "(bash scripts/install-slurm.sh)"
        )
        return 2
    if args.ending > args.nodes * 4 or min(args.repeats, args.pending, args.ending) < 1:
        raise SystemExit("need 1 <= --ending <= 4 x --nodes, --repeats >= 1, --pending >= 1")
    try:
        ctl, compute = split_cpus(parse_cpu_list(args.pin_controller), os.sched_getaffinity(0))
        submit = parse_cpu_list(args.submit_cpus) if args.submit_cpus else ctl
    except ValueError as exc:
        raise SystemExit(f"storm_pinned: {exc}") from None
    cpus = {"controller": ctl, "compute": compute, "submit": submit}
    # This process (and what it starts unpinned: the hosts' anchors, the fill's helpers) on
    # the compute side, off the controller's CPUs.
    os.sched_setaffinity(0, compute)
    log: Log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="spal-pin-", dir="/tmp"))
    root.chmod(0o755)
    settings = RunSettings(root=root, nodes=args.nodes, multihost=True, refresh_s=args.refresh_s)
    report: dict[str, object] = {
        "pending": args.pending,
        "ending": args.ending,
        "gpus": args.nodes * 4,
        "repeats": args.repeats,
        "storm_s": args.storm_s,
        "cpus": {k: cpu_list(v) for k, v in cpus.items()},
        "uptime_before": _uptime(),
    }
    runs: list[dict[str, object]] = []
    try:
        with terminate_as_exit():
            prep = prepare(settings, log)
            pristine = settings.work / "store.pristine.db"
            shutil.copy2(prep.db, pristine)
            for repeat in range(args.repeats):
                order = ("stock", "advisor") if repeat % 2 == 0 else ("advisor", "stock")
                for name in order:
                    if name == "advisor":  # every advisor run starts from the same store
                        for suffix in ("-wal", "-shm"):
                            Path(f"{prep.db}{suffix}").unlink(missing_ok=True)
                        shutil.copy2(pristine, prep.db)
                    log(f"repeat {repeat + 1}/{args.repeats}: {name}")
                    result = Run(name, prep, args, cpus).run(log)
                    result["repeat"] = repeat + 1
                    runs.append(result)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report["uptime_after"] = _uptime()
    report |= summarize(runs)
    report["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value}")
    return 0


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
