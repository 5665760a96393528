"""Re-planning write time on a real Slurm: one round of 1,000 pending-job updates per backend.

    sudo .venv/bin/python benchmarks/slurm_writes.py                  # ~3 min on 2 cores
    sudo SLURM_PAL_SLURM_RELEASE=24.11 .venv/bin/python benchmarks/slurm_writes.py --json

The testbed (LocalSlurm on loopback, the host's Slurm or ``$SLURM_PAL_SLURM_RELEASE``) has 4
nodes x 4 GPUs; 16 holder jobs take every GPU and ``--jobs`` one-GPU jobs wait behind them.
A round gives every waiting job new nodes (``ReqNodeList``, alternating between rounds so each
update changes something) and its GPU request, as the re-planner does, in two forms:

- ``advisor``: with the advisor's admin comment (``slurm-pal/... why=...``: blanks), which is
  what every re-planned job gets (through stdin last on its line, in double quotes);
- ``placement``: the same without the comment.

Backends, all in this one process, taking turns (each figure the median of ``--repeat``
rounds):

- ``scontrol-serial``: one ``scontrol update`` process per job, one after another (baseline);
- ``scontrol-parallel``: one process per job, 8 at a time (the service before batching);
- ``scontrol-batch``: :class:`ScontrolBatchApplier`, one ``scontrol`` reading the round from
  stdin;
- ``pyslurm``: ``Job.modify`` RPCs in-process, when a pyslurm that matches this Slurm imports
  (none does on Debian: see adapters/slurm/pyslurm_backend.py); otherwise reported as not
  measured, with the reason.

Each figure: the round's wall time, and the CPU its ``scontrol`` processes took on this host
(the controller's, at a site; slurmctld's own is not in it). Every update must succeed (the
round's failures are reported and make the run exit 1).
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
import time
from pathlib import Path

from slurm_pal.adapters.slurm.pyslurm_backend import choose_backend
from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.adapters.slurm.update import (
    JobApplier,
    JobChange,
    ScontrolApplier,
    ScontrolBatchApplier,
)
from slurm_pal.testbed import LocalSlurm, NodeSpec

HELD = "gres:gpu:ta:1"
NODES = ("n1", "n2", "n3", "n4")


def _round(jobs: list[int], target: str, comment: bool) -> list[JobChange]:
    changes = []
    for i, job in enumerate(jobs):
        fields: dict[str, str | int] = {"req_nodes": target, "tres_per_node": HELD}
        if comment:
            fields["admin_comment"] = (
                f"slurm-pal/bench replan r=b{job} class=c{i % 7} lv=1.0{i % 10}00 "
                f"gpus={target}:ta why=re-planned when GPUs freed up"
            )
        changes.append(JobChange(job, fields, HELD, 1))
    return changes


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the ended processes this one started."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("sbatch") is None:
        print("slurm_writes: needs root and Slurm (bash scripts/install-slurm.sh)")
        return 2
    log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="spal-writes-", dir="/tmp"))
    root.chmod(0o755)
    tb = LocalSlurm(
        root,
        [NodeSpec(n, ("ta", "ta", "ta", "ta")) for n in NODES],
        extra_conf=(f"MaxJobCount={args.jobs * 2 + 1000}",),
    )
    report: dict[str, object] = {"jobs": args.jobs, "repeat": args.repeat}
    failed = 0
    try:
        tb.start()
        env = dict(tb.env)
        version = subprocess.run(
            ["scontrol", "--version"], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        report["slurm"] = version
        reader = CliStateReader(env)
        for node in NODES:
            for _ in range(4):
                tb.submit("--gres=gpu:ta:1", "-w", node, "-o", "/dev/null", "--wrap=sleep 3600")
        _wait(lambda: sum(j.state == "RUNNING" for j in reader.jobs()) == 16, 120, "holders")
        log(f"{version}: 16 holders running; submitting {args.jobs} pending jobs")
        pending = [
            tb.submit("--gres=gpu:ta:1", "-o", "/dev/null", "--wrap=sleep 3600")
            for _ in range(args.jobs)
        ]
        _wait(lambda: sum(j.state == "PENDING" for j in reader.jobs()) >= args.jobs, 120, "pending")
        appliers: dict[str, JobApplier] = {
            "scontrol-serial": ScontrolApplier(env, workers=1),
            "scontrol-parallel": ScontrolApplier(env, workers=8),
            "scontrol-batch": ScontrolBatchApplier(env),
        }
        choice = choose_backend("auto", env)
        if choice.name == "pyslurm":
            appliers["pyslurm"] = choice.applier
        else:
            report["pyslurm"] = f"not measured: {choice.why}"
        # Backends take turns within each repetition (the order rotating), so a machine whose
        # load changes during the run (other work on the same cores) weighs on all alike.
        times: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        names = list(appliers)
        flip = 0
        for rep in range(args.repeat):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for workload in ("advisor", "placement"):
                for name in order:
                    flip += 1
                    changes = _round(pending, NODES[flip % 2], workload == "advisor")
                    start, cpu = time.perf_counter(), _children_cpu_s()
                    errors = appliers[name].apply_many(changes)
                    took = time.perf_counter() - start
                    times.setdefault((workload, name), []).append(took)
                    cpus.setdefault((workload, name), []).append(_children_cpu_s() - cpu)
                    bad = [e for e in errors if e is not None]
                    failed += len(bad)
                    if bad:
                        log(f"{name}/{workload}: {len(bad)} failed, e.g. {bad[0]}")
                    log(f"{workload:>9} {name:>18}: {took:6.2f} s")
        figures: dict[str, dict[str, float]] = {}
        for (workload, name), values in times.items():
            figures.setdefault(workload, {})[name] = statistics.median(values)
        # The last round really is in Slurm: spot-check a job's nodes.
        last = NODES[flip % 2]
        job = {j.job_id: j for j in reader.jobs(job_ids=[pending[-1]])}[pending[-1]]
        if job.required_nodes != (last,):
            raise RuntimeError(f"job {pending[-1]} requires {job.required_nodes}, not {last}")
        for workload, by_backend in figures.items():
            base = by_backend["scontrol-serial"]
            report[workload] = {
                name: {
                    "seconds": round(s, 2),
                    "ms_per_update": round(s * 1000 / args.jobs, 2),
                    "vs_serial": round(base / s, 2),
                    "scontrol_cpu_s": round(statistics.median(cpus[(workload, name)]), 2),
                }
                for name, s in by_backend.items()
            }
        report["failed_updates"] = failed
    finally:
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key in ("slurm", "jobs", "repeat", "pyslurm", "failed_updates"):
            if key in report:
                print(f"{key}: {report[key]}")
        for workload in ("advisor", "placement"):
            print(f"{workload} round of {args.jobs} updates:")
            for name, fig in report[workload].items():  # type: ignore[union-attr]
                print(
                    f"  {name:>18}: {fig['seconds']:6.2f} s  {fig['ms_per_update']:6.2f} ms/update"
                    f"  {fig['vs_serial']:5.2f}x the serial baseline"
                    f"  scontrol CPU {fig['scontrol_cpu_s']:5.2f} s"
                )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
