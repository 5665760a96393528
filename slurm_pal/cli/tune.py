"""`slurm-pal tune`: pick the advisor's locality penalty (and class count, default class) for a
site by replaying its trace through the simulator.

The site has one true cost of spanning nodes (``--site-penalty``, measured the way the paper
does: a 2-node run's iteration time over a 1-node run's). PAL's L x V matrix uses a penalty too:
the advisor's knob. Each candidate (placement, advisor penalty, number of classes) runs the
same trace on the same simulated GPUs, jobs always paying the site's penalty; Packed-Sticky
(what Slurm does without the advisor, roughly) is the baseline. Fewer classes merge the least
variability-sensitive ones into the last kept class (placed by its scores, run at their own).
The default class is what the advisor gives jobs it cannot identify (trace jobs with no class
mapping, plus ``--unknown-share`` of the others, drawn with the seed); they still run at their
true class's slowdowns.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import typer
from rich import box
from rich.table import Table

from slurm_pal.cli.common import console, fail, print_json, reported_errors
from slurm_pal.cli.sim import (
    hours,
    load_jobs,
    parse_pairs,
    run_with_progress,
    split_names,
)
from slurm_pal.core.workload import PAL_DEFAULT_CLASS, PAL_MODEL_CLASS
from slurm_pal.sim.engine import MODES, SCHEDULERS, SimConfig
from slurm_pal.sim.experiments import BASELINE, improvement
from slurm_pal.sim.inputs import load_gpus, parse_cluster
from slurm_pal.sim.variability import uniform_gpus

TUNABLE = ("pal", "pm-first")

app = typer.Typer(help="Recommend the advisor's locality penalty and class count for a site.")


def parse_numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"{what} must be comma-separated numbers, got {text!r}")
    if not values:
        fail(f"no {what} given")
    return values


def merged_classes(order: tuple[str, ...], keep: int) -> tuple[tuple[str, str], ...]:
    """Classes beyond the first ``keep`` (most variability-sensitive first) placed as the last
    kept one."""
    return tuple((name, order[keep - 1]) for name in order[keep:])


@app.callback(invoke_without_command=True)
def tune(
    trace: Path | None = typer.Option(
        None, "--trace", help="Sia-Philly CSV or sacct --parsable2 output.", show_default=False
    ),
    trace_format: str = typer.Option("auto", "--trace-format", help="auto, sia or sacct."),
    poisson: int = typer.Option(0, "--poisson", help="Instead of --trace: N Poisson jobs."),
    load: float = typer.Option(12.0, "--load", help="Poisson arrival rate (jobs/hour)."),
    profile: list[str] = typer.Option(
        [], "--profile", help="CLASS=PATH campaign file per class, most sensitive first."
    ),
    cluster: str = typer.Option("16x4", "--cluster", help="NODESxGPUS."),
    site_penalty: float = typer.Option(
        1.7, "--site-penalty", help="The site's measured slowdown of a job spanning nodes."
    ),
    penalties: str = typer.Option(
        "1.0,1.3,1.5,1.7,2.0,2.5,3.0", "--penalties", help="Advisor penalties to try."
    ),
    class_counts: str = typer.Option(
        "", "--class-counts", help="Numbers of classes to try, e.g. 4,3,2 (default: all)."
    ),
    default_classes: str = typer.Option(
        "",
        "--default-classes",
        help="Default classes to try for jobs the advisor cannot identify, e.g. A,D.",
    ),
    unknown_share: float = typer.Option(
        0.0,
        "--unknown-share",
        help="Treat this seeded share of identified jobs as unidentified too (0-1).",
    ),
    placement: str = typer.Option("pal,pm-first", "--placement", help="Policies to tune."),
    mode: str = typer.Option("slurm", "--mode", help="slurm (production-like) or rounds."),
    scheduler: str = typer.Option("fifo", "--scheduler", help="fifo, las or srtf."),
    round_seconds: float = typer.Option(360.0, "--round", help="Round length (rounds mode)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the GPU draw."),
    pal_artifact: bool = typer.Option(False, "--pal-artifact", help="PAL's artifact GPUs."),
    class_map: list[str] = typer.Option([], "--class-map", help="MODEL/JOBNAME=CLASS."),
    default_class: str = typer.Option(PAL_DEFAULT_CLASS, "--default-class"),
    workers: int = typer.Option(2, "--workers", help="Worker processes."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Sweep the advisor's locality penalty (and class count) and recommend settings."""
    policies = split_names(placement, list(TUNABLE), "placement")
    (scheduler_name,) = split_names(scheduler, list(SCHEDULERS), "scheduler")[:1]
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    try:
        n_nodes, per_node = parse_cluster(cluster)
    except ValueError as exc:
        fail(str(exc))
    advisor_penalties = parse_numbers(penalties, "--penalties")
    profiles = parse_pairs(profile, "--profile")
    with reported_errors():
        if profiles:
            gpus = load_gpus(
                {name: Path(path) for name, path in profiles.items()},
                n_nodes,
                per_node,
                pal_artifact=pal_artifact,
                seed=seed,
            )
        else:
            gpus = uniform_gpus(
                sorted({default_class, *PAL_MODEL_CLASS.values()}), n_nodes, per_node
            )
        order = gpus.classes
        counts = (
            [int(k) for k in parse_numbers(class_counts, "--class-counts")]
            if class_counts
            else [len(order)]
        )
        if any(not 1 <= k <= len(order) for k in counts):
            fail(f"class counts must be within 1..{len(order)}")
        defaults: list[str | None] = [None]
        if default_classes:
            defaults = [name.strip() for name in default_classes.split(",") if name.strip()]
            unknown_names = [name for name in defaults if name not in order]
            if unknown_names:
                fail(f"unknown default class(es) {', '.join(map(str, unknown_names))}")
        if not 0.0 <= unknown_share <= 1.0:
            fail("--unknown-share must be within 0..1")
        jobs = load_jobs(
            trace,
            trace_format,
            poisson,
            load,
            seed if seed is not None else 0,
            parse_pairs(class_map, "--class-map"),
            {},
            default_class,
            order,
            spanned_penalty=site_penalty,
        )
        if unknown_share > 0:
            rng = np.random.default_rng(seed if seed is not None else 0)
            hidden = rng.random(len(jobs)) < unknown_share
            jobs = [replace(j, known=False) if h else j for j, h in zip(jobs, hidden, strict=True)]
        if default_classes and all(job.known for job in jobs):
            console.print(
                "[yellow]every job's class is known: --default-classes changes nothing "
                "(see --unknown-share)[/]"
            )
        common = {
            "scheduler": scheduler_name,
            "mode": mode,
            "round_seconds": round_seconds,
            "site_locality_penalty": site_penalty,
            "pal_artifact": pal_artifact,
            "seed": seed if seed is not None else 0,
        }
        try:
            candidates = [
                (policy, penalty, k, default)
                for policy in policies
                for k in counts
                for default in defaults
                for penalty in advisor_penalties
            ]
            configs = [
                SimConfig(placement=BASELINE, locality_penalty=site_penalty, **common),
                *(
                    SimConfig(
                        placement=policy,
                        locality_penalty=penalty,
                        advised_classes=merged_classes(order, k),
                        default_class=default,
                        **common,
                    )
                    for policy, penalty, k, default in candidates
                ),
            ]
            results = run_with_progress(jobs, gpus, configs, workers, quiet=as_json)
        except ValueError as exc:
            fail(str(exc).replace("[", "\\["))
    baseline = results[0].summary()
    rows = []
    for (policy, penalty, k, default), result in zip(candidates, results[1:], strict=True):
        summary = result.summary()
        rows.append(
            {
                "placement": policy,
                "advisor_penalty": penalty,
                "classes": k,
                "default_class": default,
                "avg_jct": summary["avg_jct"],
                "p99_jct": summary["p99_jct"],
                "avg_wait": summary["avg_wait"],
                "makespan": summary["makespan"],
                "gain_vs_baseline": improvement(summary["avg_jct"], baseline["avg_jct"]),
            }
        )
    rows.sort(key=lambda r: (r["avg_jct"], r["p99_jct"]))
    best = rows[0]
    default = next(
        (
            r
            for r in rows
            if r["placement"] == "pal"
            and math.isclose(r["advisor_penalty"], site_penalty)
            and r["classes"] == len(order)
        ),
        None,
    )
    report = {
        "site_penalty": site_penalty,
        "mode": mode,
        "scheduler": scheduler_name,
        "baseline": {"placement": BASELINE, "avg_jct": baseline["avg_jct"]},
        "recommended": best,
        "candidates": rows,
    }
    if as_json:
        print_json(report)
        return
    table = Table(
        title=f"{len(jobs)} jobs, {n_nodes}x{per_node} GPUs, {mode} mode, site penalty "
        f"{site_penalty:g}; baseline {BASELINE} avg JCT {hours(baseline['avg_jct'])} h",
        box=box.SIMPLE_HEAD,
    )
    columns = ("placement", "L (advisor)", "classes", "default", "JCT h", "gain", "p99 h", "wait h")
    for column in columns:
        table.add_column(column, justify="left" if column == "placement" else "right")
    for row in rows:
        table.add_row(
            row["placement"],
            f"{row['advisor_penalty']:g}",
            str(row["classes"]),
            row["default_class"] or "-",
            hours(row["avg_jct"]),
            f"{row['gain_vs_baseline']:+.1%}",
            hours(row["p99_jct"]),
            hours(row["avg_wait"]),
        )
    console.print(table)
    if not best["gain_vs_baseline"] > 0:
        console.print(
            f"[yellow]no candidate beats {BASELINE} on this trace:[/] the advisor would cost "
            "average JCT here (variability too small to pay for the locality it gives up); "
            "the best candidate is listed first"
        )
    console.print(
        f"recommended: placement {best['placement']}, locality penalty "
        f"{best['advisor_penalty']:g}, {best['classes']} classes"
        + (f", default class {best['default_class']}" if best["default_class"] else "")
        + " "
        f"({best['gain_vs_baseline']:+.1%} average JCT vs {BASELINE})"
    )
    if default is not None and default is not best:
        gap = improvement(best["avg_jct"], default["avg_jct"])
        console.print(
            f"vs PAL with the site penalty and all classes: {gap:+.1%} average JCT"
            + (" (within noise: keep the defaults)" if abs(gap) < 0.01 else "")
        )
