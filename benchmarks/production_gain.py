"""Does the advisor as shipped make a Slurm cluster faster, or slower? Judged where it runs,
on many kinds of sites.

    python benchmarks/production_gain.py                  # the whole matrix, tables on stdout
    python benchmarks/production_gain.py --json           # one JSON object
    python benchmarks/production_gain.py --shapes 4 --traces sia --profiles artifact --runs 8
    python benchmarks/production_gain.py --variant 'last=packed-pm,wait=false'
    python benchmarks/production_gain.py --placements advisor   # the advisor alone, faster

Every run is the simulator's Slurm mode (no preemption, no migration, FIFO + EASY backfill that
plans with the jobs' time limits, held jobs not eligible until their begin time), the world the
advisor lives in. A cell is one node shape x one trace family x one variability profile; each
of its runs pairs placements on exactly the same trace, GPUs and seed with the reference
(``packed-sticky``: Slurm's own packing), so every run gives an average-JCT ratio.

- Node shapes: 1, 2, 4 and 8 GPUs per node (the cluster's GPU count stays the trace's).
- Traces: ``sia`` (Sia-Philly workloads 1-4, 64 GPUs, perfect limits as in the paper: the
  scheduler knows each job's run time), ``sia-x2`` (the same workloads with the limits a site
  sees: each job asks for twice its run time on median GPUs, rounded up to the hour, so the
  advisor weighs waits from limits as it does under Slurm),
  ``philly-vc`` (a Philly virtual cluster's 76 days as a sacct history, 160 GPUs, every
  limit UNLIMITED), ``site`` (generated site-like weeks: Poisson arrivals at 60-95 % load, 85 %
  single-GPU jobs of minutes to days, limits from tight to UNLIMITED, 64 GPUs), ``sia-gang``
  (``sia-x2`` with five large gangs of 16-64 GPUs and hours of work among its short jobs, the
  work where a gang on slow GPUs costs the whole cluster: :func:`with_gangs`).
- Profiles: ``longhorn`` (measured V100s, no GPU above 1.5x), ``h100`` (the six H100s measured
  here, resampled), ``artifact`` (PAL's artifact draws, outliers to 2.8x), ``few-slow`` (3 %
  of GPUs at 2-3x for compute-bound jobs).

Per cell and placement: geomean gain with a bootstrap 95 % interval, p90 and worst run ratio,
geomean p99-JCT and makespan ratios, next to the two controls: the PM-blind ``null``
(packing with each node's GPUs in a seeded random order) and the noise floor ``faster``
(packing on the same cluster made 2 % faster everywhere, a strictly better cluster whose
ratios show how far a cell's queue alone swings average JCT); ``--placements`` runs fewer.
The summary checks the safety targets (worst <= 1.10, p90 <= 1.03, makespan <= 1.05 in every
cell), the tail rule against the controls (the advisor's p90 and worst run no worse than the
worse of the two controls' + 0.02, per cell; not judged unless both ran), the held jobs
that started later than ``max_wait_s`` after they could first have started (counted over every
advisor run), the jobs that ran past their time limit under packing and under the advisor
(Slurm would have ended them there: :func:`past_limits`), and the gain on profiles with
outliers. Data from
../shared/data (or SLURM_PAL_SHARED_DATA); the script says so and exits 2 when it is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from slurm_pal.adapters.config import load_config
from slurm_pal.adapters.traces import read_sacct, read_sia_trace
from slurm_pal.core.placement import SETTINGS
from slurm_pal.core.workload import SimJob, site_like_workload
from slurm_pal.sim import SimConfig, SimGpus, simulate
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.sim.experiments import PairedRatios
from slurm_pal.sim.inputs import PAL_LONGHORN_PROFILES, load_gpus, per_gpu_from_records
from slurm_pal.sim.metrics import JobOutcome
from slurm_pal.sim.variability import few_slow_gpus, sampled_gpus

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SLURM_PAL_SHARED_DATA", REPO.parent / "shared" / "data"))
LONGHORN = SHARED / "variability" / "longhorn"
SIA = SHARED / "traces" / "sia-philly"
PHILLY_VC = SHARED / "traces" / "philly-vc" / "philly_vc-ee9e8c_2017-09-25_2017-12-11.sacct"
H100 = SHARED / "gpu-h100" / "campaign-h100x" / "results"
SHAPES = (1, 2, 4, 8)
TRACES = {"sia": 64, "sia-x2": 64, "philly-vc": 160, "site": 64, "sia-gang": 64}
"""Trace family -> the cluster's GPU count."""
PROFILES = ("longhorn", "h100", "artifact", "few-slow")
WITH_OUTLIERS = ("artifact", "few-slow")
REFERENCE = "packed-sticky"
PLACEMENTS = ("advisor", "null", "faster")
"""By default both controls run beside the advisor: the tail rule is judged against them."""
FASTER = 0.98
"""``faster``: packing on the same GPUs made 2 % faster for every class. A strictly better
cluster: where it misses the safety targets, the cell's queue turns a small change of runtimes
into large swings of average JCT, and no placement's gain that small can meet them there."""
TARGETS = {"worst": 1.10, "p90": 1.03, "makespan": 1.05, "gain": 0.10, "gain_low": 0.05}
CONTROLS = ("null", "faster")
TAIL_SLACK = 0.02
"""The tail rule: in every cell the advisor's p90 and worst run are no worse than the worse
of the two controls' over the same runs, + this."""
GANGS = 5
GANG_SIZES = (16, 24, 32, 48, 64)

Variant = tuple[str, dict[str, object]]  # (sim placement, SimConfig keyword arguments)
Cell = tuple[int, str, str]  # (GPUs per node, trace family, profile)


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
    options = {"advisor_policy": policy, "advisor_settings": tuple(params.items())}
    return name, ("advisor", options)


@functools.cache
def simulated_gpus(profile: str, n_gpus: int, per_node: int, seed: int) -> SimGpus:
    nodes = n_gpus // per_node
    if profile in ("longhorn", "artifact"):
        files = {c: LONGHORN / f for c, f in PAL_LONGHORN_PROFILES.items()}
        return load_gpus(files, nodes, per_node, pal_artifact=profile == "artifact", seed=seed)
    if profile == "h100":
        per_gpu = per_gpu_from_records(H100, {"A": "A", "B": "A", "C": "C", "D": "C"})
        return sampled_gpus(per_gpu, nodes, per_node, seed=seed, source="H100 campaign")
    return few_slow_gpus("ABCD", nodes, per_node, seed=seed)


LIMIT_PADDING = 2.0
"""``sia-x2``: a job's time limit over its run time on median GPUs (users ask for more than
they use; the advisor's own ``limit_share`` default, 0.5, assumes the same)."""


@functools.cache
def trace(family: str, run: int) -> tuple[SimJob, ...]:
    if family in ("sia", "sia-x2", "sia-gang"):
        jobs = read_sia_trace(SIA / f"workload-{1 + run % 4}.csv", track=(0, 159))
        if family == "sia":
            return tuple(jobs)
        padded = [dataclasses.replace(j, time_limit=padded_limit(j.work)) for j in jobs]
        return tuple(padded if family == "sia-x2" else with_gangs(padded, run))
    if family == "philly-vc":
        return tuple(read_sacct(PHILLY_VC))
    load = 0.6 + 0.35 * ((run * 0.618) % 1.0)  # spread over 60-95 %, run by run
    return tuple(site_like_workload(TRACES["site"], load=load, n_jobs=600, seed=run))


def with_gangs(jobs: list[SimJob], run: int) -> list[SimJob]:
    """``jobs`` with ``GANGS`` large gangs added (Sia-Philly-like: a handful of 16-64 GPU jobs
    of hours among many short ones): each a model of one of the trace's multi-GPU jobs (its
    class with it), 16-64 GPUs, 1-12 h of median-GPU work (lognormal, median 3 h), submitted
    uniformly over the first 80 % of the trace, its limit padded as ``sia-x2``'s. Seeded by
    ``run``: the same gangs for every placement of a run."""
    rng = np.random.default_rng(10_000 + run)
    multi = [j for j in jobs if j.gpus > 1]
    end = max(j.submit_time for j in jobs)
    added = []
    for number in range(GANGS):
        like = multi[int(rng.integers(len(multi)))]
        work = float(np.clip(rng.lognormal(math.log(3 * 3600.0), 0.6), 3600.0, 12 * 3600.0))
        added.append(
            dataclasses.replace(
                like,
                job_id=f"gang{number}",
                submit_time=float(rng.uniform(0.0, 0.8 * end)),
                gpus=int(rng.choice(GANG_SIZES)),
                work=work,
                time_limit=padded_limit(work),
            )
        )
    return sorted(jobs + added, key=lambda j: j.submit_time)


def padded_limit(work_s: float) -> float:
    """The limit a user asks for a job that runs ``work_s``: ``LIMIT_PADDING`` times it,
    rounded up to a whole hour."""
    return math.ceil(work_s * LIMIT_PADDING / 3600.0) * 3600.0


def gpu_seed(family: str, run: int) -> int:
    return run // 4 if family.startswith("sia") else run


def run_one(task: tuple[Cell, int, str, Variant]) -> tuple[tuple[Cell, int, str], dict]:
    """One simulation -> its average JCT, p99 JCT and makespan."""
    (per_node, family, profile), run, name, (placement, options) = task
    seed = gpu_seed(family, run)
    gpus = simulated_gpus(profile, TRACES[family], per_node, seed)
    if name == "faster":
        gpus = faster_gpus(gpus)
    config = SimConfig(
        placement=placement, mode="slurm", **{"locality_penalty": 1.7, "seed": seed, **options}
    )
    jobs = trace(family, run)
    result = simulate(jobs, gpus, config)
    summary = result.summary()
    keys = ("avg_jct", "p99_jct", "makespan")
    figures = {k: float(summary[k]) for k in keys}
    bound = dict(options.get("advisor_settings", ())).get("max_wait_s")  # type: ignore[call-overload]
    held = [job for job in result.jobs if job.held_s > 0]
    figures["held"] = float(len(held))
    # started later than the bound after it could first have started (1 s for rounding)
    late = [job for job in held if bound is not None and job.held_s > float(bound) + 1.0]
    figures["held_past_bound"] = float(len(late))
    figures["past_bound_jobs"] = [past_bound_row(job, float(bound)) for job in late]  # type: ignore[assignment]
    figures.update(past_limits(result.jobs, {job.job_id: job.time_limit for job in jobs}))
    if name == REFERENCE:  # a held job past its bound is read beside its start under packing
        figures["starts"] = {j.job_id: j.start for j in result.jobs}  # type: ignore[assignment]
    return ((per_node, family, profile), run, name), figures


def past_limits(
    outcomes: Iterable[JobOutcome], limits: Mapping[str, float | None]
) -> dict[str, float]:
    """The jobs that ran longer than their time limit, and their GPU-hours past it as a share
    of the run's GPU-hours. The simulator lets them run to the end of their work (what a slow
    GPU costs stays counted); Slurm, as shipped, ends a job at its limit (state TIMEOUT, the
    work lost unless checkpointed). So these are the part of a result a real Slurm would not
    reproduce: where they differ between placements, so would Slurm's verdict."""
    over, past_s, total_s, killed, killed_s = 0, 0.0, 0.0, 0, 0.0
    for job in outcomes:
        if job.start is None or job.end is None:
            continue
        ran = job.end - job.start
        total_s += job.gpus * ran
        limit = limits.get(job.job_id)
        if limit is not None and math.isfinite(limit) and ran > limit + 1.0:
            over += 1
            past_s += job.gpus * (ran - limit)
        if job.timed_out:  # ``--enforce-limits``: ended at its limit, every GPU-hour lost
            killed += 1
            killed_s += job.gpus * ran
    return {
        "past_limit": float(over),
        "past_limit_gpu_share": past_s / total_s if total_s else 0.0,
        "timed_out": float(killed),
        "timed_out_gpu_share": killed_s / total_s if total_s else 0.0,
    }


def past_bound_row(job: JobOutcome, bound_s: float) -> dict[str, object]:
    """A held job that started past its bound, as the report lists it (hours from the
    trace's start): its size, when it was first held, its bound, when it started."""
    assert job.start is not None
    held_at = job.start - job.held_s
    return {
        "job": job.job_id,
        "gpus": job.gpus,
        "class": job.job_class,
        "held_at_h": round(held_at / 3600, 2),
        "bound_h": round((held_at + bound_s) / 3600, 2),
        "start_h": round(job.start / 3600, 2),
        "late_h": round((job.held_s - bound_s) / 3600, 2),
        "nodes": job.max_nodes,
    }


def faster_gpus(gpus: SimGpus) -> SimGpus:
    """The same cluster with every GPU ``FASTER`` times as slow: the noise floor's cluster."""
    slowdown = {klass: np.asarray(v) * FASTER for klass, v in gpus.true_slowdown.items()}
    return dataclasses.replace(gpus, true_slowdown=slowdown)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(results: dict, cell: Cell, runs: int, name: str) -> dict[str, object]:
    avg, p99, span = [], [], []
    for run in range(runs):
        ref = results[(cell, run, REFERENCE)]
        mine = results[(cell, run, name)]
        avg.append(mine["avg_jct"] / ref["avg_jct"])
        p99.append(mine["p99_jct"] / ref["p99_jct"])
        span.append(mine["makespan"] / ref["makespan"])
    return {
        **PairedRatios.of(avg).summary(),
        "p99_jct_geomean_ratio": geomean(p99),
        "makespan_geomean_ratio": geomean(span),
        "makespan_worst_ratio": max(span),
        **past_limit_summary(results, cell, runs, name),
        "held_jobs": int(sum(results[(cell, run, name)].get("held", 0) for run in range(runs))),
        "held_past_bound": int(
            sum(results[(cell, run, name)].get("held_past_bound", 0) for run in range(runs))
        ),
        **past_bound_summary(results, cell, runs, name),
    }


def past_bound_summary(results: dict, cell: Cell, runs: int, name: str) -> dict[str, object]:
    """Over a cell's runs: the held jobs that started past their bound, each with its start
    under packing in the same run (``reference_start_h``), and how many of them started later
    than that too. A wide job the simulated Slurm starves starts late under packing as well;
    one that starts past its bound *and* after packing started it is the hold's doing, or what
    the hold set off."""
    rows = []
    for run in range(runs):
        starts = results[(cell, run, REFERENCE)].get("starts", {})
        for row in results[(cell, run, name)].get("past_bound_jobs", []):
            reference = starts.get(row["job"])
            reference_h = None if reference is None else round(reference / 3600, 2)
            later = reference_h is None or row["start_h"] > reference_h
            rows.append({"run": run, **row, "reference_start_h": reference_h, "later": later})
    return {
        "past_bound_jobs": rows,
        "held_past_bound_later_than_reference": sum(bool(row["later"]) for row in rows),
    }


def past_limit_summary(results: dict, cell: Cell, runs: int, name: str) -> dict[str, object]:
    """Over a cell's runs: jobs past their limit (``name``'s and packing's, the reference),
    and the mean share of GPU-hours they ran past it."""
    out: dict[str, object] = {}
    for key, who in (("", name), ("reference_", REFERENCE)):
        figures = [results[(cell, run, who)] for run in range(runs)]
        for what in ("past_limit", "timed_out"):
            out[f"{key}{what}_jobs"] = int(sum(f.get(what, 0) for f in figures))
            shares = [float(f.get(f"{what}_gpu_share", 0.0)) for f in figures]
            out[f"{key}{what}_gpu_share"] = sum(shares) / len(shares)
    return out


def tail_rule(row: dict[str, dict]) -> dict[str, object] | None:
    """The advisor's p90 and worst run against the worse of the two controls' + the slack
    (None unless the advisor and both controls ran)."""
    if "advisor" not in row or any(c not in row for c in CONTROLS):
        return None
    out: dict[str, object] = {}
    ok = True
    for key in ("p90_ratio", "worst_ratio"):
        control = max(float(row[c][key]) for c in CONTROLS)
        mine = float(row["advisor"][key])
        out[key] = {"advisor": mine, "worse_control": control}
        ok = ok and mine <= control + TAIL_SLACK
    out["within"] = ok
    return out


def missing_tail_rule(tails: dict[tuple, dict[str, object] | None]) -> list[str] | None:
    """The cells whose advisor misses the tail rule; None, not [], when no cell ran both
    controls (an empty list would read as "met")."""
    judged = {cell: t for cell, t in tails.items() if t is not None}
    if not judged:
        return None
    return [f"{s}x{f}x{p}" for (s, f, p), t in judged.items() if not t["within"]]


def misses(row: dict, profile: str) -> list[str]:
    """The safety targets a cell's advisor row misses."""
    out = []
    if row["worst_ratio"] > TARGETS["worst"]:
        out.append(f"worst {row['worst_ratio']:.3f}")
    if row["p90_ratio"] > TARGETS["p90"]:
        out.append(f"p90 {row['p90_ratio']:.3f}")
    if row["makespan_geomean_ratio"] > TARGETS["makespan"]:
        out.append(f"makespan {row['makespan_geomean_ratio']:.3f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(map(str, SHAPES)), help="GPUs per node")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--runs", type=int, default=8, help="paired runs per cell")
    parser.add_argument("--config", type=Path, default=REPO / "site-config" / "slurm-pal.toml")
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--enforce-limits",
        action="store_true",
        help="end a job at its time limit, as Slurm does (TIMEOUT), in every placement",
    )
    parser.add_argument(
        "--slurm-release",
        default="22.05",
        help="the release whose backfill the simulated Slurm plans as, in every placement "
        "(22.05: a job past its limit runs a limit more; 24.11: it counts as gone)",
    )
    parser.add_argument(
        "--backfill-reserves",
        default="head",
        choices=("head", "nodes"),
        help="what the simulated Slurm's backfill reserves: the first waiting job by GPU count "
        "(EASY), or every waiting job on whole nodes (sched/backfill)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    if not (LONGHORN.is_dir() and SIA.is_dir() and PHILLY_VC.is_file() and H100.is_dir()):
        print(f"production_gain: shared data not found under {SHARED} (set SLURM_PAL_SHARED_DATA)")
        return 2
    shapes = [int(s) for s in args.shapes.split(",") if s]
    families = [t for t in args.traces.split(",") if t]
    profiles = [p for p in args.profiles.split(",") if p]
    for value, valid, what in (
        (families, TRACES, "trace"),
        (profiles, PROFILES, "profile"),
        ([str(s) for s in shapes], [str(s) for s in SHAPES], "shape"),
    ):
        wrong = sorted(set(value) - set(valid))
        if wrong:
            raise SystemExit(f"unknown {what}(s) {wrong}; valid: {', '.join(map(str, valid))}")
    site = load_config(args.config)
    variants: dict[str, Variant] = {REFERENCE: (REFERENCE, {})}
    for name in [p for p in args.placements.split(",") if p]:
        if name == "advisor":
            options = advisor_sim_options(site)
            variants[name] = (str(options.pop("placement")), options)
        elif name == "faster":
            variants[name] = (REFERENCE, {})
        else:
            variants[name] = (name, {})
    for text in args.variant:
        name, variant = parse_variant(text)
        variants[name] = variant
    if args.enforce_limits:
        variants = {n: (p, {**o, "enforce_limits": True}) for n, (p, o) in variants.items()}
    if args.backfill_reserves != "head":
        reserves = {"backfill_reserves": args.backfill_reserves}
        variants = {n: (p, {**o, **reserves}) for n, (p, o) in variants.items()}
    if args.slurm_release != "22.05":
        try:
            SimConfig(mode="slurm", slurm_release=args.slurm_release)
        except ValueError as exc:
            raise SystemExit(f"--slurm-release: {exc}") from None
        release = {"slurm_release": args.slurm_release}
        variants = {n: (p, {**o, **release}) for n, (p, o) in variants.items()}

    cells: list[Cell] = [(s, f, p) for f in families for p in profiles for s in shapes]
    tasks = [
        (cell, run, name, variant)
        for cell in cells
        for run in range(args.runs)
        for name, variant in variants.items()
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = dict(pool.map(run_one, tasks, chunksize=2))
    elapsed = time.perf_counter() - started

    rows = {
        cell: {
            name: summarize(results, cell, args.runs, name)
            for name in variants
            if name != REFERENCE
        }
        for cell in cells
    }
    report: dict[str, object] = {
        "config": str(args.config),
        "advisor": {k: v for k, v in advisor_sim_options(site).items() if k != "placement"},
        "runs_per_cell": args.runs,
        "reference": REFERENCE,
        "targets": TARGETS,
        "seconds": round(elapsed, 1),
        "enforce_limits": args.enforce_limits,
        "slurm_release": args.slurm_release,
        "backfill_reserves": args.backfill_reserves,
        "cells": [
            {"gpus_per_node": s, "trace": f, "profile": p, "placements": rows[(s, f, p)]}
            for s, f, p in cells
        ],
    }
    lost = {
        cell: misses(rows[cell]["advisor"], cell[2]) for cell in cells if "advisor" in rows[cell]
    }
    by_profile: dict[str, dict] = {}
    if "advisor" in variants:
        for profile in profiles:
            ratios = [
                results[(c, r, "advisor")]["avg_jct"] / results[(c, r, REFERENCE)]["avg_jct"]
                for c in cells
                if c[2] == profile
                for r in range(args.runs)
            ]
            by_profile[profile] = PairedRatios.of(ratios).summary()
    report["by_profile"] = by_profile
    report["cells_missing_targets"] = {f"{s}x{f}x{p}": m for (s, f, p), m in lost.items() if m}
    tails = {cell: tail_rule(rows[cell]) for cell in cells}
    report["tail_rule"] = {f"{s}x{f}x{p}": t for (s, f, p), t in tails.items() if t is not None}
    report["cells_missing_tail_rule"] = missing_tail_rule(tails)
    if "advisor" in variants:
        report["held_jobs"] = sum(int(rows[c]["advisor"]["held_jobs"]) for c in cells)
        report["held_past_bound"] = sum(int(rows[c]["advisor"]["held_past_bound"]) for c in cells)
        report["held_past_bound_later_than_reference"] = sum(
            int(rows[c]["advisor"]["held_past_bound_later_than_reference"]) for c in cells
        )
    floor_lost = {
        cell: misses(rows[cell]["faster"], cell[2]) for cell in cells if "faster" in rows[cell]
    }
    report["cells_where_faster_misses"] = {
        f"{s}x{f}x{p}": m for (s, f, p), m in floor_lost.items() if m
    }

    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"Slurm mode, {len(cells)} cells x {args.runs} paired runs vs {REFERENCE} "
        f"({elapsed:.0f} s); advisor = {report['advisor']}"
    )
    header = (
        f"{'GPUs/node':>9} {'trace':<10} {'profile':<9} {'placement':<10} {'gain':>7} "
        f"{'95% CI':>17} {'p90':>6} {'worst':>6} {'p99 JCT':>8} {'makespan':>9}"
    )
    print(header)
    for cell in cells:
        for name, row in rows[cell].items():
            low, high = row["gain_ci95"]
            flag = "  <- " + ", ".join(lost[cell]) if name == "advisor" and lost.get(cell) else ""
            if flag and floor_lost.get(cell):
                flag += " (a 2 % faster cluster misses too)"
            tail = tails[cell]
            if name == "advisor" and tail is not None:
                p90, worst = tail["p90_ratio"], tail["worst_ratio"]  # type: ignore[index]
                flag += (
                    f"  [controls' worse p90 {p90['worse_control']:.3f}, "
                    f"worst {worst['worse_control']:.3f}: "
                    + ("within +0.02]" if tail["within"] else "TAIL MISSED]")
                )
            print(
                f"{cell[0]:>9} {cell[1]:<10} {cell[2]:<9} {name:<10} {row['geomean_gain']:>+7.1%} "
                f"{low:>+8.1%}..{high:>+7.1%} {row['p90_ratio']:>6.3f} {row['worst_ratio']:>6.3f} "
                f"{row['p99_jct_geomean_ratio']:>8.3f} {row['makespan_geomean_ratio']:>9.3f}{flag}"
            )
    if by_profile:
        print("\nadvisor over every cell of a profile:")
        for profile, row in by_profile.items():
            low, high = row["gain_ci95"]
            print(
                f"  {profile:<9} {row['geomean_gain']:+.1%} [{low:+.1%}, {high:+.1%}] "
                f"p90 {row['p90_ratio']:.3f} worst {row['worst_ratio']:.3f} ({row['runs']} runs)"
            )
        if "held_jobs" in report:
            print(
                f"\nheld jobs: {report['held_jobs']} over every advisor run; started later than "
                f"max_wait_s after they could first have started: {report['held_past_bound']}, "
                f"of them later than under packing in the same run: "
                f"{report['held_past_bound_later_than_reference']}"
            )
            for cell in cells:
                for row in rows[cell]["advisor"]["past_bound_jobs"]:
                    print(f"  {cell[0]}x{cell[1]}x{cell[2]}: {row}")
        print(
            "\njobs that ran past their time limit (Slurm would have ended them; the simulator "
            "lets them finish), over the cell's runs, and their GPU-hours past it (mean share):"
        )
        what = "timed_out" if args.enforce_limits else "past_limit"
        if args.enforce_limits:
            print("(--enforce-limits: ended at their limit, their GPU-hours lost, as a share)")
        for cell in cells:
            row = rows[cell]["advisor"]
            if row[f"{what}_jobs"] or row[f"reference_{what}_jobs"]:
                print(
                    f"  {cell[0]}x{cell[1]}x{cell[2]}: packing {row[f'reference_{what}_jobs']} "
                    f"({row[f'reference_{what}_gpu_share']:.1%}), advisor "
                    f"{row[f'{what}_jobs']} ({row[f'{what}_gpu_share']:.1%})"
                )
        if not report["tail_rule"]:
            print(f"tail rule: not judged (it needs --placements advisor,{','.join(CONTROLS)})")
        else:
            tail_missed = report["cells_missing_tail_rule"]
            print(
                f"tail rule (advisor's p90 and worst <= the worse control's + {TAIL_SLACK}): "
                + (
                    f"missed in {len(tail_missed)} of {len(report['tail_rule'])} cells "
                    f"({', '.join(tail_missed)})"
                    if tail_missed
                    else f"met in every one of {len(report['tail_rule'])} cells"
                )
            )
        missing = report["cells_missing_targets"]
        print(
            f"\nsafety targets (worst <= {TARGETS['worst']}, p90 <= {TARGETS['p90']}, "
            f"makespan <= {TARGETS['makespan']}): "
            + (
                f"missed in {len(missing)} of {len(cells)} cells"
                if missing
                else "met in every cell"
            )
        )
        if floor_lost:
            floor = report["cells_where_faster_misses"]
            print(
                f"noise floor: a 2 % faster cluster misses them in {len(floor)} of "
                f"{len(cells)} cells" + (f" ({', '.join(floor)})" if floor else "")
            )
        for profile in (p for p in profiles if p in WITH_OUTLIERS):
            row = by_profile[profile]
            ok = (
                row["geomean_gain"] >= TARGETS["gain"]
                and row["gain_ci95"][0] >= TARGETS["gain_low"]
            )
            wanted = f">= {TARGETS['gain']:.0%}, CI low >= {TARGETS['gain_low']:.0%}"
            print(f"gain on {profile} ({wanted}): {'met' if ok else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
