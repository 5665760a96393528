"""How fast the simulator runs.

    python benchmarks/simulator.py            # figures on stdout
    python benchmarks/simulator.py --json     # one JSON object

Keys:

- ``sia160_all_placements_s``: Sia-Philly workload 1 (160 jobs) on 16 x 4 GPUs, FIFO, 360 s
  rounds, PAL's artifact variability (Longhorn files; uniform GPUs when the shared data is
  absent), all six placements one after the other, from the parsed inputs. Target: < 10 s.
- ``poisson3000_256gpu_s``: a 3,000-job Poisson trace (12 jobs/hour, Philly-like GPU mix) on
  64 x 4 GPUs, FIFO, 300 s rounds (the paper's Synergy setup), PAL placement.
- ``poisson3000_256gpu_slurm_s``: the same trace in the event-driven Slurm mode.
- ``sia160_placements_s``: the first figure per placement.
- ``slurm_nodes_vs_head``: the simulated Slurm planning as sched/backfill does (every waiting
  job reserved on whole nodes, ``backfill_reserves="nodes"``) against EASY (``head``), as a
  ratio of wall times over the same simulations: two of the matrix's cells with limits and
  gangs (Sia-Philly with a site's limits on 1-GPU nodes, the gang family on 8-GPU nodes,
  few-slow), 2 runs each, the advisor and packing; ``slurm_nodes_s`` / ``slurm_head_s`` the two
  times. Needs the shared data (skipped without it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from slurm_pal.adapters.traces import read_sia_trace
from slurm_pal.core.workload import poisson_workload
from slurm_pal.sim import PAPER_PLACEMENTS as PLACEMENTS
from slurm_pal.sim import SimConfig, simulate, uniform_gpus
from slurm_pal.sim.inputs import PAL_LONGHORN_PROFILES, load_gpus

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED / "variability" / "longhorn"
SIA = SHARED / "traces" / "sia-philly"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()

    figures: dict[str, object] = {}
    profiles = {c: LONGHORN / f for c, f in PAL_LONGHORN_PROFILES.items()}
    if all(p.is_file() for p in profiles.values()) and (SIA / "workload-1.csv").is_file():
        gpus = load_gpus(profiles, 16, 4, pal_artifact=True)
        jobs = read_sia_trace(SIA / "workload-1.csv")
        figures["sia160_inputs"] = "workload-1, Longhorn artifact draws"
    else:
        print(f"shared data not found under {SHARED}: Poisson stand-in", file=sys.stderr)
        gpus = uniform_gpus(["A", "B", "C", "D"], 16, 4)
        jobs = poisson_workload(160, 20.0, seed=1)
        figures["sia160_inputs"] = "160-job Poisson stand-in, uniform GPUs"
    per_placement: dict[str, float] = {}
    for placement in PLACEMENTS:
        started = time.perf_counter()
        simulate(jobs, gpus, SimConfig(placement=placement, pal_artifact=True))
        per_placement[placement] = round(time.perf_counter() - started, 3)
    figures["sia160_all_placements_s"] = round(sum(per_placement.values()), 3)
    figures["sia160_placements_s"] = per_placement

    big_gpus = uniform_gpus(["A", "B", "C", "D"], 64, 4)
    if all(p.is_file() for p in profiles.values()):
        big_gpus = load_gpus(profiles, 64, 4, pal_artifact=False)
    trace = poisson_workload(3000, 12.0, seed=0)
    for key, mode in (("poisson3000_256gpu_s", "rounds"), ("poisson3000_256gpu_slurm_s", "slurm")):
        started = time.perf_counter()
        result = simulate(trace, big_gpus, SimConfig(placement="pal", mode=mode, round_seconds=300))
        figures[key] = round(time.perf_counter() - started, 3)
        figures[f"{key}_avg_jct_h"] = round(result.summary()["avg_jct"] / 3600, 2)

    if (SIA / "workload-1.csv").is_file() and LONGHORN.is_dir():
        figures |= backfill_plan_cost()

    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key}: {value}")


def backfill_plan_cost() -> dict[str, float]:
    """Wall time of the matrix's simulations with each backfill model, and their ratio."""
    from production_gain import run_one  # the matrix's own simulations, beside this file

    from slurm_pal.adapters.config import load_config
    from slurm_pal.sim.advisor import advisor_sim_options

    options = advisor_sim_options(load_config(REPO / "site-config" / "slurm-pal.toml"))
    advisor = (str(options.pop("placement")), options)
    times: dict[str, float] = {}
    for reserves in ("head", "nodes"):
        started = time.perf_counter()
        for cell in ((1, "sia-x2", "few-slow"), (8, "sia-gang", "few-slow")):
            for run in range(2):
                for name, (placement, extra) in (
                    ("advisor", advisor),
                    ("packed", ("packed-sticky", {})),
                ):
                    variant = (placement, {**extra, "backfill_reserves": reserves})
                    run_one((cell, run, name, variant))
        times[reserves] = round(time.perf_counter() - started, 2)
    return {
        "slurm_head_s": times["head"],
        "slurm_nodes_s": times["nodes"],
        "slurm_nodes_vs_head": round(times["nodes"] / times["head"], 2),
    }


if __name__ == "__main__":
    main()
