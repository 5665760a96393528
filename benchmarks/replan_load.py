"""Job-end re-planning under load, on a real Slurm: 10,000 pending GPU jobs, then 48 jobs end
together.

    sudo .venv/bin/python benchmarks/replan_load.py            # ~5-10 min on 2 cores, as root
    sudo .venv/bin/python benchmarks/replan_load.py --pending 2000 --ending 20 --json

The testbed (Debian's Slurm 22.05 on loopback, 12 nodes x 4 fake GPUs; 13 nodes fail to
start: the example profile drawn onto 52 GPUs gives two nodes a gres count slurmd refuses) runs
the rendered job_submit.lua, Prolog/Epilog and ``slurm-pal serve`` as shipped (site defaults:
packed-pm, re-planning at every job's end, the Epilog waiting up to 900 ms for its answer). 48
holder jobs take every GPU; ``--pending`` one-GPU jobs are submitted behind them (they wait:
nothing is free); then ``--ending`` holders end at once (``scancel``: their Epilogs run as at
any end).
Each ending job's Epilog hands its record to the advisor, whose round re-plans the pending jobs
before Slurm reuses the GPUs. Reported:

- ``job_end_ms_p50`` / ``_p99`` / ``_max``: how long each Epilog waited for its answer (its own
  round or one it joined, and its record's store write), from the advisor's stats;
- ``rounds`` and ``coalesced``: job-end rounds run, and ends answered by a round another end
  started;
- ``updates_applied`` / ``updates_refused``: ``scontrol update``s of those rounds (refused:
  Slurm answered with an error, e.g. the job had already started);
- ``records_spooled``: records that fell back to the spool dir (their answer came too late):
  delivered later by the advisor's sweep, or still there; ``epilog_records_spooled`` (what
  the target is about: an Epilog that gave up on its round, 900 ms) and
  ``prolog_records_spooled`` (the jobs the storm starts: a Prolog waits 300 ms for its
  record's write) apart;
- ``last_update_s``: the ``scancel`` -> every ending job's round answered;
- ``sbatch_ms_p50`` / ``_p99`` during the storm (a submitter runs throughout), and during the
  fill (``fill_sbatch_ms_p99``);
- ``stock_sbatch_ms_p50`` / ``_p99``: the same submitter's CPU-only, held jobs, one after each
  GPU job. job_submit.lua does not ask the advisor about a job without GPUs, so these are
  slurmctld's own time under the same storm: the baseline the GPU figure is read against
  (``sbatch_p99_ratio``);
- ``refused_share``: the updates Slurm refused over all the rounds sent (Slurm started the job
  before the update arrived);
- ``read_json_s`` / ``read_brief_s`` (and their client CPU): one ``squeue --json`` against one
  brief ``squeue -O`` read (what the service reads), of the filled queue, one after the other
  before the storm; ``read_cpu_ratio`` = JSON client CPU / brief client CPU.

Targets: every job-end round within the Epilog's wait (900 ms) at p99, no record spooled for
lack of time, sbatch p99 < 100 ms.

``--stock`` runs the same fill and storm on the same testbed with no job_submit.lua, no hooks
and no advisor (cons_tres placing untyped requests: what a site has today), and reports only the
sbatch figures: what slurmctld alone does under this load, without the advisor's reads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurm_pal.adapters.slurm.state import BRIEF_FORMAT, CliStateReader
from slurm_pal.testbed import LocalSlurm
from slurm_pal.testbed.run import FIFO, AdvisorArm, RunSettings, StockArm, prepare


def sbatch(env: dict[str, str], out: Path, *args: str) -> float:
    """Submit one job; seconds it took (sbatch's wall time, the plugin's call included)."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["sbatch", "--parsable", "-o", str(out / "%j.out"), "--chdir", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
    return took


def timed_read(env: dict[str, str], command: list[str]) -> tuple[float, float]:
    """Wall seconds and the command's own CPU seconds (user + system) for one Slurm read."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, capture_output=True, check=True, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def wait_until(check, timeout_s: float, what: str, *, required: bool = True) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    if required:
        raise RuntimeError(f"timed out waiting for {what}")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--ending", type=int, default=48)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="Keep the testbed folder.")
    parser.add_argument(
        "--stock", action="store_true", help="No advisor, plugin or hooks: sbatch figures only."
    )
    parser.add_argument(
        "--refresh-s",
        type=float,
        default=1.0,
        help="advisor.refresh_s (the testbed's 1 s; the shipped default is 5 s).",
    )
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        print("replan_load: needs root and Debian's Slurm (bash scripts/install-slurm.sh)")
        return 2
    gpus = args.nodes * 4
    if args.ending > gpus:
        raise SystemExit(f"--ending {args.ending} > {gpus} GPUs")
    log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="spal-load-", dir="/tmp"))
    root.chmod(0o755)
    # One host (loopback, records on the Unix socket): the figures before stay comparable;
    # benchmarks/job_end_latency.py measures the multi-host path.
    settings = RunSettings(
        root=root,
        nodes=args.nodes,
        arms=("stock",) if args.stock else ("advisor",),
        multihost=False,
        refresh_s=args.refresh_s,
    )
    prep = prepare(settings, log)
    arm = StockArm() if args.stock else AdvisorArm()

    def stats() -> dict[str, object]:
        return {} if isinstance(arm, StockArm) else arm.stats(prep)

    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)
    tb = LocalSlurm(
        root,
        prep.specs,
        device_pattern=settings.device_pattern,
        extra_conf=(*FIFO, f"MaxJobCount={args.pending * 2 + 1000}"),
        **arm.testbed_options(prep),  # type: ignore[arg-type]
    )
    report: dict[str, object] = {
        "arm": "stock" if args.stock else "advisor",
        "refresh_s": args.refresh_s,
        "pending": args.pending,
        "ending": args.ending,
        "gpus": gpus,
    }
    try:
        tb.start()
        arm.start(tb, prep, log)
        env = dict(tb.env)
        reader = CliStateReader(env)
        # Pinned to their node, so the advisor never holds one back (a job naming nodes takes
        # what it gets, outliers included): every GPU is taken.
        for spec in prep.specs:
            for _ in range(4):
                sbatch(env, out, "--gres=gpu:1", "-w", spec.name, "--wrap=sleep 3600")
        wait_until(
            lambda: sum(j.state == "RUNNING" for j in reader.jobs()) == gpus, 120, "the holders"
        )
        holders = sorted(j.job_id for j in reader.jobs() if j.state == "RUNNING")
        log(f"{gpus} holders running; submitting {args.pending} pending jobs")
        started = time.perf_counter()
        with ThreadPoolExecutor(args.submitters) as pool:
            fill = list(
                pool.map(
                    lambda i: sbatch(
                        env, out, "--gres=gpu:1", f"-J=load{i % 50}", "--wrap=sleep 3600"
                    ),
                    range(args.pending),
                )
            )
        report["fill_s"] = round(time.perf_counter() - started, 1)
        report["fill_sbatch_ms_p50"] = round(percentile(fill, 0.5) * 1000, 1)
        report["fill_sbatch_ms_p99"] = round(percentile(fill, 0.99) * 1000, 1)
        log(f"filled in {report['fill_s']} s; sbatch p99 {report['fill_sbatch_ms_p99']} ms")
        time.sleep(max(12.0, 2.5 * args.refresh_s))  # the advisor's view holds every job
        for name, command in (
            ("json", ["squeue", "--json"]),
            ("brief", ["squeue", "--noheader", "-O", BRIEF_FORMAT]),
        ):
            wall, cpu = timed_read(env, command)
            report[f"read_{name}_s"], report[f"read_{name}_cpu_s"] = round(wall, 3), round(cpu, 3)
        if report["read_brief_cpu_s"]:
            report["read_cpu_ratio"] = round(
                report["read_json_cpu_s"] / report["read_brief_cpu_s"],  # type: ignore[operator]
                1,
            )
        time.sleep(2)
        before = stats()
        spool = settings.work / "spool"
        spooled_before = len(list(spool.glob("*"))) if spool.exists() else 0
        # The storm: `ending` holders end at once, while a submitter keeps going.
        storm: list[float] = []
        stock: list[float] = []  # not asked: CPU-only (held, so they never take a node)
        stop = threading.Event()

        def submit_during() -> None:
            while not stop.is_set():
                storm.append(sbatch(env, out, "--gres=gpu:1", "--wrap=sleep 3600"))
                stock.append(sbatch(env, out, "--hold", "--wrap=sleep 3600"))

        submitter = threading.Thread(target=submit_during)
        submitter.start()
        time.sleep(1.0)
        ending = holders[: args.ending]
        subprocess.run(["scancel", *map(str, ending)], env=env, check=True)
        fired = time.perf_counter()

        def ends_taken() -> int:
            """Ends answered by a round, plus records the spool sweep delivered (their Epilog
            gave up waiting: no round at their end)."""
            now = stats()
            return sum(
                int(now.get(key, 0)) - int(before.get(key, 0))  # type: ignore[call-overload]
                for key in ("replans_at_job_end", "spool_applied")
            )

        if args.stock:  # no rounds to wait for: as long a storm as the advisor's runs take
            time.sleep(5.0)
            stop.set()
            submitter.join(timeout=60)
            storm_figures(report, storm, stock)
            return finish(report, args)
        done = wait_until(
            lambda: ends_taken() >= args.ending, 120, "the job-end rounds", required=False
        )
        report["last_update_s"] = round(time.perf_counter() - fired, 2) if done else None
        report["ends_not_taken_in_120s"] = max(0, args.ending - ends_taken())
        time.sleep(3.0)
        stop.set()
        submitter.join(timeout=60)
        after = stats()
        for key in ("job_end_ms_p50", "job_end_ms_p99", "job_end_ms_max"):
            report[key] = after.get(key)
        report["rounds"] = int(after["replans"]) - int(before["replans"])  # type: ignore[arg-type]
        report["coalesced"] = int(after["replans_coalesced"]) - int(before["replans_coalesced"])  # type: ignore[arg-type]
        report["updates_applied"] = int(after["replan_updates"]) - int(before["replan_updates"])  # type: ignore[arg-type]
        report["updates_refused"] = int(after["replan_failed"]) - int(before["replan_failed"])  # type: ignore[arg-type]
        # Records whose Epilog gave up waiting stay spooled: the sweep delivers them later
        # (counted by the advisor), or they are still there.
        left = (len(list(spool.glob("*"))) if spool.exists() else 0) - spooled_before
        swept = int(after["spool_applied"]) - int(before["spool_applied"])  # type: ignore[arg-type]
        report["records_spooled"] = left + swept
        for kind in ("epilog", "prolog"):  # swept ones by kind, plus those still waiting
            key = f"spool_applied_{kind}"
            still = len(list(spool.glob(f"*.{kind}.json"))) if spool.exists() else 0
            report[f"{kind}_records_spooled"] = (
                int(after.get(key, 0)) - int(before.get(key, 0)) + still  # type: ignore[call-overload]
            )
        storm_figures(report, storm, stock)
        sent = report["updates_applied"] + report["updates_refused"]  # type: ignore[operator]
        report["refused_share"] = round(report["updates_refused"] / sent, 3) if sent else None  # type: ignore[operator]
        report["decide_ms_p99"] = after.get("decide_ms_p99")
        report["mean_fill_sbatch_ms"] = round(statistics.fmean(fill) * 1000, 1)
    finally:
        arm.stop()
        tb.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return finish(report, args)


def storm_figures(report: dict[str, object], storm: list[float], stock: list[float]) -> None:
    """sbatch during the storm: GPU jobs (asked about, in the advisor arm) and CPU-only ones."""
    report["storm_sbatch"] = len(storm)
    report["sbatch_ms_p50"] = round(percentile(storm, 0.5) * 1000, 1) if storm else None
    report["sbatch_ms_p99"] = round(percentile(storm, 0.99) * 1000, 1) if storm else None
    report["stock_sbatch_ms_p50"] = round(percentile(stock, 0.5) * 1000, 1) if stock else None
    report["stock_sbatch_ms_p99"] = round(percentile(stock, 0.99) * 1000, 1) if stock else None
    if storm and stock:
        report["sbatch_p99_ratio"] = round(percentile(storm, 0.99) / percentile(stock, 0.99), 2)


def finish(report: dict[str, object], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
