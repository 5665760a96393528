"""Does the advisor as shipped make a Slurm cluster faster, or slower? Judged where it runs.

    python benchmarks/production_gain.py                 # tables on stdout
    python benchmarks/production_gain.py --json          # one JSON object
    python benchmarks/production_gain.py --workloads 1,2 --seeds 0-4 --profile longhorn
    python benchmarks/production_gain.py --variant 'loose=packed-pm,avoid_above=1.1'

Every run is the simulator's Slurm mode (no preemption, no migration, FIFO + EASY backfill), the
world the advisor lives in, on one Sia-Philly workload (16 nodes x 4 GPUs, jobs 0-159 tracked)
with simulated GPUs drawn with one seed. Each placement runs on exactly the same trace, GPUs and
seed as the reference (``packed-sticky``: Slurm's own packing), so every run gives a paired
average-JCT ratio. Per profile and placement the table shows the geomean gain with a bootstrap
95 % interval over the runs, the median, p90 and worst run ratio, and the geomean p99-JCT and
makespan ratios.

Placements: ``advisor`` is the engine as ``--config`` configures it (site-config/slurm-pal.toml:
what ``slurm-pal serve`` runs with that file); ``pal`` and ``pm-first`` are the paper's policies
(pack tolerance 0); ``null`` is packing with each node's GPUs taken in a seeded random order,
blind to PM-scores: it shows how far the queue's own noise moves single runs. ``--variant
NAME=POLICY,key=value,...`` adds a policy with site settings (``avoid_above``, ``wait``,
``pack_tolerance``; for design experiments).

Profiles: ``longhorn`` is measured GPUs (per-GPU medians of PAL's Longhorn V100 files, drawn
without repetition, silhouette binning); ``artifact`` is PAL's artifact's per-GPU draws from the
raw rows (single-run outliers up to 2.83x, K = 2 binning). Data from ../shared/data (or
SLURM_PAL_SHARED_DATA); the script says so and exits 2 when it is absent.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from slurm_pal.adapters.config import load_config
from slurm_pal.adapters.traces import read_sia_trace
from slurm_pal.core.placement import SETTINGS
from slurm_pal.core.workload import SimJob
from slurm_pal.sim import SimConfig, SimGpus, simulate
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.sim.experiments import PairedRatios
from slurm_pal.sim.inputs import PAL_LONGHORN_PROFILES, load_gpus

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED / "variability" / "longhorn"
SIA = SHARED / "traces" / "sia-philly"
PROFILES = ("longhorn", "artifact")
REFERENCE = "packed-sticky"
PLACEMENTS = ("advisor", "pal", "pm-first", "null")

Variant = tuple[str, dict[str, object]]  # (sim placement, SimConfig keyword arguments)


def parse_seeds(text: str) -> list[int]:
    """``0-9`` or ``0,3,5``."""
    if "-" in text:
        low, high = (int(part) for part in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(part) for part in text.split(",") if part]


def parse_variant(text: str) -> tuple[str, Variant]:
    """``NAME=POLICY,key=value,...`` -> (NAME, the advisor placement with that policy and
    those site settings)."""
    name, _, spec = text.partition("=")
    policy, *pairs = spec.split(",")
    params: dict[str, float | bool | str] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        value: float | bool | str
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = float(raw)
            except ValueError:
                value = raw
        params[key] = value
    if not name or not policy:
        raise SystemExit(f"--variant wants NAME=POLICY[,key=value...], got {text!r}")
    if policy not in SETTINGS:
        raise SystemExit(f"--variant {text!r}: unknown policy; valid: {', '.join(SETTINGS)}")
    unknown = sorted(set(params) - set(SETTINGS[policy]))
    if unknown:
        valid = ", ".join(SETTINGS[policy]) or "none"
        raise SystemExit(f"--variant {text!r}: {policy} takes no {unknown}; valid: {valid}")
    # Run as the advisor placement: the builder and settings the service uses.
    options = {"advisor_policy": policy, "advisor_settings": tuple(params.items())}
    return name, ("advisor", options)


@functools.cache
def simulated_gpus(profile: str, seed: int) -> SimGpus:
    files = {c: LONGHORN / f for c, f in PAL_LONGHORN_PROFILES.items()}
    return load_gpus(files, 16, 4, pal_artifact=profile == "artifact", seed=seed)


@functools.cache
def trace(workload: int) -> list[SimJob]:
    return read_sia_trace(SIA / f"workload-{workload}.csv", track=(0, 159))


def run_one(
    task: tuple[str, int, int, str, Variant],
) -> tuple[tuple[str, int, int, str], dict[str, float]]:
    """One simulation -> its average JCT, p99 JCT and makespan."""
    profile, workload, seed, name, (placement, options) = task
    gpus = simulated_gpus(profile, seed)
    jobs = trace(workload)
    base = {"locality_penalty": 1.7, "seed": seed}
    config = SimConfig(placement=placement, mode="slurm", **{**base, **options})
    summary = simulate(jobs, gpus, config).summary()
    keys = ("avg_jct", "p99_jct", "makespan")
    return (profile, workload, seed, name), {k: float(summary[k]) for k in keys}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="1,2,3,4")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--profile", default=",".join(PROFILES), help="longhorn,artifact")
    parser.add_argument("--config", type=Path, default=REPO / "site-config" / "slurm-pal.toml")
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    if not (LONGHORN.is_dir() and SIA.is_dir()):
        print(f"production_gain: shared data not found under {SHARED} (set SLURM_PAL_SHARED_DATA)")
        return 2
    profiles = [p for p in args.profile.split(",") if p]
    for profile in profiles:
        if profile not in PROFILES:
            raise SystemExit(f"unknown profile {profile!r}; valid: {', '.join(PROFILES)}")
    workloads = [int(w) for w in args.workloads.split(",") if w]
    seeds = parse_seeds(args.seeds)
    site = load_config(args.config)
    variants: dict[str, Variant] = {REFERENCE: (REFERENCE, {})}
    for name in [p for p in args.placements.split(",") if p]:
        if name == "advisor":
            options = advisor_sim_options(site)
            variants[name] = (str(options.pop("placement")), options)
        elif name == "null":
            variants[name] = ("null", {})
        else:
            variants[name] = (name, {})
    for text in args.variant:
        name, variant = parse_variant(text)
        variants[name] = variant

    tasks = [
        (profile, workload, seed, name, variant)
        for profile in profiles
        for workload in workloads
        for seed in seeds
        for name, variant in variants.items()
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = dict(pool.map(run_one, tasks, chunksize=4))
    elapsed = time.perf_counter() - started

    report: dict[str, object] = {
        "config": str(args.config),
        "advisor": {k: v for k, v in advisor_sim_options(site).items() if k != "placement"},
        "workloads": workloads,
        "seeds": seeds,
        "reference": REFERENCE,
        "seconds": round(elapsed, 1),
        "profiles": {},
    }
    for profile in profiles:
        rows: dict[str, object] = {}
        for name in variants:
            if name == REFERENCE:
                continue
            avg, p99, span = [], [], []
            for workload in workloads:
                for seed in seeds:
                    ref = results[(profile, workload, seed, REFERENCE)]
                    mine = results[(profile, workload, seed, name)]
                    avg.append(mine["avg_jct"] / ref["avg_jct"])
                    p99.append(mine["p99_jct"] / ref["p99_jct"])
                    span.append(mine["makespan"] / ref["makespan"])
            paired = PairedRatios.of(avg)
            rows[name] = {
                **paired.summary(),
                "p99_jct_geomean_ratio": geomean(p99),
                "makespan_geomean_ratio": geomean(span),
            }
        report["profiles"][profile] = rows  # type: ignore[index]

    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"Slurm mode, workloads {workloads} x seeds {seeds[0]}-{seeds[-1]}, vs {REFERENCE}")
    print(f"advisor = {report['advisor']}  ({elapsed:.0f} s)")
    for profile, rows in report["profiles"].items():  # type: ignore[union-attr]
        print(f"\n{profile}")
        print(
            f"{'placement':<18} {'gain':>7} {'95% CI':>17} {'median':>7} {'p90':>6} "
            f"{'worst':>6} {'p99 JCT':>8} {'makespan':>9}"
        )
        for name, row in rows.items():
            low, high = row["gain_ci95"]
            print(
                f"{name:<18} {row['geomean_gain']:>+7.1%} {low:>+8.1%}..{high:>+7.1%} "
                f"{row['median_ratio']:>7.3f} {row['p90_ratio']:>6.3f} {row['worst_ratio']:>6.3f} "
                f"{row['p99_jct_geomean_ratio']:>8.3f} {row['makespan_geomean_ratio']:>9.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
