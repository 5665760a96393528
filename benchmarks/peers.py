"""PAL against its peers: FFT-PM, SJF-BSBF, SJF-FFS, GIMBAL-style, and combinations.

    python benchmarks/peers.py                    # the table (markdown) on stdout
    python benchmarks/peers.py --json             # every figure as one JSON object
    python benchmarks/peers.py --workers 2 --traces w1,poisson --no-sweep

Setup: 16 nodes x 4 GPUs, L = 1.7, Longhorn profiles (A = resnet, B = C = bert, D = pagerank),
corrected mode (each simulated GPU a measured Longhorn GPU, seed 0, silhouette bins), 360 s
rounds where a policy has rounds. Traces: Sia-Philly workloads 1-4 (jobs 0-159 tracked, PAL's
model -> class and iteration times) and a Poisson trace (300 jobs, 7 jobs/hour, Philly-like GPU
mix, classes A-D alike, seed 0: 1.3x the cluster's GPU-hours while jobs arrive). Without the
shared data the Sia traces are skipped (said on stderr) and the GPUs are uniform.

Per trace and policy: average and p99 JCT (h), makespan (h), mean finish-time fairness (JCT over
the job's time on a 1/N share of the cluster; see ``slurm_pal.sim.metrics``). ``--sweep``
(default on) adds SJF-BSBF vs SJF-FFS under one global xi for every pair (SJF-BSBF Fig. 6b).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from slurm_pal.adapters.traces import read_sia_trace
from slurm_pal.core.workload import SimJob, poisson_workload
from slurm_pal.sim import SimConfig, SimGpus, simulate, uniform_gpus
from slurm_pal.sim.experiments import geomean_gain
from slurm_pal.sim.inputs import PAL_LONGHORN_PROFILES, load_gpus

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED / "variability" / "longhorn"
SIA = SHARED / "traces" / "sia-philly"
NODES, PER_NODE = 16, 4
POISSON = {"n_jobs": 300, "jobs_per_hour": 7.0, "seed": 0}

POLICIES: tuple[tuple[str, str, str, str], ...] = (
    # (label, placement, scheduler, mode)
    ("Packed-Sticky (Tiresias), FIFO", "packed-sticky", "fifo", "rounds"),
    ("PM-First, FIFO", "pm-first", "fifo", "rounds"),
    ("PAL, FIFO", "pal", "fifo", "rounds"),
    ("PAL, SRTF", "pal", "srtf", "rounds"),
    ("PAL, FIFO + backfill (Slurm mode)", "pal", "fifo", "slurm"),
    ("FFT-PM", "fft-pm", "fifo", "rounds"),
    ("PAL under FFT-fair (pal-fft)", "pal-fft", "fifo", "rounds"),
    ("SJF (exclusive)", "sjf", "fifo", "rounds"),
    ("SJF-BSBF", "sjf-bsbf", "fifo", "rounds"),
    ("SJF-FFS", "sjf-ffs", "fifo", "rounds"),
    ("GIMBAL-style, FIFO", "gimbal", "fifo", "rounds"),
    ("GIMBAL-style, SJF", "gimbal", "srtf", "rounds"),
    ("PAL + PM-aware sharing (pal-share), FIFO", "pal-share", "fifo", "rounds"),
    ("PAL + PM-aware sharing (pal-share), SJF", "pal-share", "srtf", "rounds"),
)
SWEEP_XI = (1.0, 1.25, 1.5, 1.75, 2.0)


def gpus() -> SimGpus:
    profiles = {c: LONGHORN / f for c, f in PAL_LONGHORN_PROFILES.items()}
    if all(p.is_file() for p in profiles.values()):
        return load_gpus(profiles, NODES, PER_NODE)
    return uniform_gpus(["A", "B", "C", "D"], NODES, PER_NODE)


def trace(name: str) -> list[SimJob]:
    if name == "poisson":
        return poisson_workload(POISSON["n_jobs"], POISSON["jobs_per_hour"], seed=POISSON["seed"])
    return read_sia_trace(SIA / f"workload-{name[1:]}.csv", track=(0, 159))


def run(task: tuple[str, str, str, str, float | None]) -> tuple[tuple, dict, float]:
    """One simulation -> (task, summary, seconds)."""
    trace_name, placement, scheduler, mode, xi = task
    started = time.perf_counter()
    config = SimConfig(placement=placement, scheduler=scheduler, mode=mode, xi=xi)
    summary = simulate(trace(trace_name), gpus(), config).summary()
    return task, summary, time.perf_counter() - started


def cell(summary: dict) -> str:
    def h(value: float) -> str:
        return "-" if not math.isfinite(value) else f"{value / 3600:.2f}"

    ftf = summary["avg_ftf"]
    return f"{h(summary['avg_jct'])} / {h(summary['p99_jct'])} / {h(summary['makespan'])} / " + (
        "-" if not math.isfinite(ftf) else f"{ftf:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", default="w1,w2,w3,w4,poisson")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--no-sweep", action="store_true", help="skip the global xi sweep")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [t.strip() for t in args.traces.split(",") if t.strip()]
    valid = {"w1", "w2", "w3", "w4", "poisson"}
    if unknown := [t for t in names if t not in valid]:
        sys.exit(f"unknown trace(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    if not LONGHORN.is_dir():
        print(f"no Longhorn profiles under {LONGHORN}: uniform GPUs", file=sys.stderr)
    missing = [t for t in names if t != "poisson" and not (SIA / f"workload-{t[1:]}.csv").is_file()]
    if missing:
        print(
            f"Sia-Philly traces not found under {SIA}: skipping {', '.join(missing)} "
            "(set SLURM_PAL_SHARED_DATA)",
            file=sys.stderr,
        )
        names = [t for t in names if t not in missing]
    tasks = [(t, p, s, m, None) for t in names for _, p, s, m in POLICIES]
    if not args.no_sweep:
        tasks += [
            (t, p, "fifo", "rounds", xi)
            for t in names
            for p in ("sjf-bsbf", "sjf-ffs")
            for xi in SWEEP_XI
        ]
    results: dict[tuple, dict] = {}
    seconds: dict[tuple, float] = {}
    started = time.perf_counter()

    def done(task: tuple, summary: dict, took: float) -> None:
        results[task] = summary
        seconds[task] = took
        print(
            f"  [{len(results)}/{len(tasks)}] {task[0]} {task[1]} {task[2]} {task[3]}"
            + (f" xi={task[4]}" if task[4] is not None else "")
            + f": {took:.1f} s",
            file=sys.stderr,
        )

    if args.workers > 1:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for task, summary, took in pool.map(run, tasks, chunksize=1):
                done(task, summary, took)
    else:
        for task in tasks:
            done(*run(task))
    elapsed = time.perf_counter() - started

    rows = []
    for label, p, s, m in POLICIES:
        per_trace = {}
        for t in names:
            summary = results[(t, p, s, m, None)]
            per_trace[t] = {
                "avg_jct_h": summary["avg_jct"] / 3600,
                "p99_jct_h": summary["p99_jct"] / 3600,
                "makespan_h": summary["makespan"] / 3600,
                "avg_ftf": summary["avg_ftf"],
                "max_ftf": summary["max_ftf"],
                "ftf_over_1": summary["ftf_over_1"],
                "avg_wait_h": summary["avg_wait"] / 3600,
                "migrations": summary["migrations"],
                "preemptions": summary["preemptions"],
                "seconds": round(seconds[(t, p, s, m, None)], 2),
            }
        base = POLICIES[0][1:]
        gain = geomean_gain(
            [
                results[(t, p, s, m, None)]["avg_jct"] / results[(t, *base, None)]["avg_jct"]
                for t in names
            ]
        )
        rows.append(
            {
                "policy": label,
                "placement": p,
                "scheduler": s,
                "mode": m,
                "traces": per_trace,
                "geomean_gain_vs_packed_sticky": gain,
            }
        )
    sweep = (
        {
            p: {
                xi: {t: results[(t, p, "fifo", "rounds", xi)]["avg_jct"] / 3600 for t in names}
                for xi in SWEEP_XI
            }
            for p in ("sjf-bsbf", "sjf-ffs")
        }
        if not args.no_sweep
        else {}
    )
    source = gpus().source
    if args.json:
        report = {
            "setup": {
                "cluster": f"{NODES}x{PER_NODE}",
                "gpus": source,
                "poisson": POISSON,
                "traces": names,
                "seconds": round(elapsed, 1),
            },
            "rows": rows,
            "xi_sweep_avg_jct_h": sweep,
        }
        print(
            json.dumps(
                report,
                default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else v,
            )
        )
        return
    print(f"{len(tasks)} simulations in {elapsed:.0f} s; {NODES}x{PER_NODE} GPUs, {source}\n")
    print(
        "Per trace: avg JCT h / p99 JCT h / makespan h / mean FTF; gain = geomean lower avg JCT "
        "than Packed-Sticky FIFO\n"
    )
    print("| policy | " + " | ".join(names) + " | gain |")
    print("|---|" + "---|" * (len(names) + 1))
    for row, (label, p, s, m) in zip(rows, POLICIES, strict=True):
        cells = " | ".join(cell(results[(t, p, s, m, None)]) for t in names)
        print(f"| {label} | {cells} | {row['geomean_gain_vs_packed_sticky']:+.1%} |")
    if sweep:
        print("\nGlobal xi sweep: average JCT h (SJF-BSBF / SJF-FFS)\n")
        print("| xi | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for xi in SWEEP_XI:
            cells = " | ".join(
                f"{sweep['sjf-bsbf'][xi][t]:.2f} / {sweep['sjf-ffs'][xi][t]:.2f}" for t in names
            )
            print(f"| {xi:g} | {cells} |")


if __name__ == "__main__":
    main()
