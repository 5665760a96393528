"""`slurm-pal tune`: should this site turn the advisor on, and with which settings?

Each candidate (the advisor as the site config sets it up, and sweeps of its knobs: the locality
penalty PAL's L x V matrix assumes, packed-pm's outlier threshold, the number of classes, the
default class) replays the site's trace on simulated GPUs drawn with ``--seeds`` seeds. Every
run is paired with Slurm's packing (packed-sticky) on the same trace, GPUs and seed, and jobs
always pay the site's true cost of spanning nodes (``--site-penalty``). A candidate is judged
by the distribution of its paired average-JCT ratios: geomean gain with a bootstrap 95 %
interval, median, p90 and worst run. Single runs are chaotic under FIFO + backfill, so the
PM-blind ``null`` placement is listed to show how far the queue's own noise moves them.

The recommendation is honest: a candidate is recommended only when its gain is clear of the
noise (the interval's lower bound above zero); otherwise tune recommends packing (the advisor
in pass-through: ``policy = "packed"``), and it never recommends a candidate that lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import typer
from rich import box
from rich.table import Table

from slurm_pal.adapters.config import SiteConfig, load_config
from slurm_pal.cli.common import (
    console,
    fail,
    print_json,
    progress_bar,
    reported_errors,
    state,
    stdout_kept_clean,
    step,
    warn,
)
from slurm_pal.cli.plots import plot_directory, tune_plot
from slurm_pal.cli.sim import (
    check_run_options,
    checked_cluster,
    load_jobs,
    parse_pairs,
    simulated_gpus,
    split_names,
)
from slurm_pal.core.workload import PAL_DEFAULT_CLASS, SimJob
from slurm_pal.sim.advisor import advisor_changes_no_job, advisor_sim_options
from slurm_pal.sim.engine import MODES, SCHEDULERS, SimConfig
from slurm_pal.sim.experiments import (
    BASELINE,
    PairedRatios,
    limits_note,
    run_grid,
    waiting_note,
)
from slurm_pal.sim.variability import SimGpus

TUNABLE = ("advisor", "packed-pm", "pal", "pm-first")
PASS_THROUGH = "packed"

app = typer.Typer(help="Should the advisor run on this site, and with which settings?")


@dataclass(frozen=True)
class Candidate:
    """One setting of the advisor to try: a policy and the knobs that change its decisions."""

    policy: str
    label: str
    options: dict[str, object]
    settings: dict[str, object]  # what to write into [advisor]/[locality] to get it
    classes: int | None = None
    default_class: str | None = None


def parse_numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"{what} must be comma-separated numbers, got {text!r}")
    if not values:
        fail(f"no {what} given")
    if not all(math.isfinite(v) for v in values):
        fail(f"{what} must be finite numbers, got {text!r}")
    return values


def parse_counts(text: str, what: str) -> list[int]:
    """Comma-separated whole numbers (``4,3,2``); ``1.5`` is refused, not rounded."""
    counts = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            fail(f"{what} must be comma-separated whole numbers, got {text!r}")
        counts.append(int(part))
    if not counts:
        fail(f"no {what} given")
    return counts


def merged_classes(order: tuple[str, ...], keep: int) -> tuple[tuple[str, str], ...]:
    """Classes beyond the first ``keep`` (most variability-sensitive first) placed as the last
    kept one."""
    return tuple((name, order[keep - 1]) for name in order[keep:])


def candidates_for(
    policies: list[str],
    site: SiteConfig,
    penalties: list[float],
    thresholds: list[float],
    counts: list[int],
    defaults: list[str | None],
    order: tuple[str, ...],
) -> list[Candidate]:
    """Every setting to try, the configured advisor first."""
    out: list[Candidate] = []
    for policy in policies:
        for k in counts:
            for default in defaults:
                shared: dict[str, object] = {"advised_classes": merged_classes(order, k)}
                extra = f", {k} classes" if k != len(order) else ""
                if default is not None:
                    shared["default_class"] = default
                    extra += f", default class {default}"
                if policy == "advisor":
                    options = {**advisor_sim_options(site), **shared}
                    label = f"advisor ({site.advisor.policy}, as configured){extra}"
                    out.append(Candidate(policy, label, options, {}, k, default))
                    continue
                knobs: list[tuple[str, dict[str, object], dict[str, object]]]
                if policy == "packed-pm":
                    knobs = [
                        (
                            f"avoid_above {t:g}",
                            {
                                "advisor_settings": (
                                    ("avoid_above", t),
                                    ("wait", site.advisor.outliers == "wait"),
                                )
                            },
                            {"avoid_above": t, "outliers": site.advisor.outliers},
                        )
                        for t in thresholds
                    ]
                else:
                    knobs = [
                        (
                            f"L {p:g}",
                            {
                                "locality_penalty": p,
                                "advisor_settings": (
                                    ("pack_tolerance", site.advisor.pack_tolerance),
                                ),
                            },
                            {"across_switches": p, "pack_tolerance": site.advisor.pack_tolerance},
                        )
                        for p in penalties
                    ]
                for text, options, settings in knobs:
                    out.append(
                        Candidate(
                            policy,
                            f"{policy}, {text}{extra}",
                            {"placement": "advisor", "advisor_policy": policy, **options, **shared},
                            {"policy": policy, **settings},
                            k,
                            default,
                        )
                    )
    return out


@app.callback(invoke_without_command=True)
def tune(
    ctx: typer.Context,
    trace: Path | None = typer.Option(
        None, "--trace", help="Sia-Philly CSV or sacct --parsable2 output.", show_default=False
    ),
    trace_format: str = typer.Option("auto", "--trace-format", help="auto, sia or sacct."),
    poisson: int = typer.Option(0, "--poisson", help="Instead of --trace: N Poisson jobs."),
    load: float = typer.Option(12.0, "--load", help="Poisson arrival rate (jobs/hour)."),
    profile: list[str] = typer.Option(
        [], "--profile", help="CLASS=PATH campaign file per class, most sensitive first."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Site config whose advisor is the first candidate (default: the global --config, "
        "$SLURM_PAL_CONFIG or the built-in defaults, as serve reads it).",
        show_default=False,
    ),
    cluster: str = typer.Option("16x4", "--cluster", help="NODESxGPUS."),
    seeds: int = typer.Option(
        10, "--seeds", help="Paired runs per candidate: GPU draws (and Poisson traces) 0..N-1."
    ),
    site_penalty: float | None = typer.Option(
        None,
        "--site-penalty",
        help="The site's measured slowdown of a job spanning nodes (default: the config's).",
        show_default=False,
    ),
    penalties: str = typer.Option(
        "1.3,1.7,2.5", "--penalties", help="pal/pm-first: advisor penalties to try."
    ),
    avoid_above: str = typer.Option(
        "1.25,1.5,2.0", "--avoid-above", help="packed-pm: outlier thresholds to try."
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
    placement: str = typer.Option(
        "advisor,packed-pm,pal", "--placement", help=f"Candidates: {', '.join(TUNABLE)}."
    ),
    mode: str = typer.Option("slurm", "--mode", help="slurm (production) or rounds."),
    scheduler: str = typer.Option("fifo", "--scheduler", help="fifo, las or srtf."),
    round_seconds: float = typer.Option(360.0, "--round", help="Round length (rounds mode)."),
    pal_artifact: bool = typer.Option(False, "--pal-artifact", help="PAL's artifact GPUs."),
    class_map: list[str] = typer.Option([], "--class-map", help="MODEL/JOBNAME=CLASS."),
    default_class: str = typer.Option(PAL_DEFAULT_CLASS, "--default-class"),
    workers: int = typer.Option(2, "--workers", help="Worker processes."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write tune.png into this directory: each candidate's per-run JCT ratio vs packing.",
        show_default=False,
    ),
) -> None:
    """Compare the advisor's settings with Slurm's packing over paired runs; recommend one
    only when its gain is clear of the noise."""
    with reported_errors():
        site = load_config(config) if config is not None else state(ctx).config
    policies = split_names(placement, list(TUNABLE), "placement")
    schedulers = split_names(scheduler, list(SCHEDULERS), "scheduler")
    if len(schedulers) > 1:
        fail(f"tune takes one --scheduler, got {', '.join(schedulers)}: run it once per scheduler")
    scheduler_name = schedulers[0]
    check_run_options(workers, 0, 0.0, None, round_seconds)
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if seeds < 2:
        fail("--seeds must be >= 2: one run says nothing about the noise")
    n_nodes, per_node = checked_cluster(cluster)
    if site_penalty is None:
        site_penalty = site.locality.across_switches
    advisor_penalties = parse_numbers(penalties, "--penalties")
    thresholds = parse_numbers(avoid_above, "--avoid-above")
    if any(t < 1.0 for t in thresholds):
        fail("--avoid-above thresholds are PM-scores >= 1.0")
    if not 0.0 <= unknown_share <= 1.0:
        fail("--unknown-share must be within 0..1")
    profiles = parse_pairs(profile, "--profile")
    counts_asked = parse_counts(class_counts, "--class-counts") if class_counts else None
    if plot is not None:
        plot_directory(plot)

    def draw(seed: int) -> tuple[list[SimJob], SimGpus]:
        gpus = simulated_gpus(profiles, n_nodes, per_node, pal_artifact, seed, default_class)
        jobs = load_jobs(
            trace,
            trace_format,
            poisson,
            load,
            seed,
            parse_pairs(class_map, "--class-map"),
            {},
            default_class,
            gpus.classes,
            spanned_penalty=site_penalty,
            quiet=seed > 0,  # one note about left-out rows, not one per seed
        )
        if unknown_share > 0:
            rng = np.random.default_rng(seed)
            hidden = rng.random(len(jobs)) < unknown_share
            jobs = [replace(j, known=False) if h else j for j, h in zip(jobs, hidden, strict=True)]
        return jobs, gpus

    with reported_errors():
        with step(f"drawing {seeds} clusters and traces"):
            draws = [draw(seed) for seed in range(seeds)]
        order = draws[0][1].classes
        counts = counts_asked or [len(order)]
        if any(not 1 <= k <= len(order) for k in counts):
            fail(f"class counts must be within 1..{len(order)}")
        defaults: list[str | None] = [None]
        if default_classes:
            defaults = [name.strip() for name in default_classes.split(",") if name.strip()]
            unknown_names = [name for name in defaults if name not in order]
            if unknown_names:
                fail(f"unknown default class(es) {', '.join(map(str, unknown_names))}")
        if default_classes and all(job.known for job in draws[0][0]):
            warn(
                "every job's class is known: --default-classes changes nothing "
                "(see --unknown-share)"
            )
        candidates = candidates_for(
            policies, site, advisor_penalties, thresholds, counts, defaults, order
        )
        common = {
            "scheduler": scheduler_name,
            "mode": mode,
            "round_seconds": round_seconds,
            "pal_artifact": pal_artifact,
            "locality_penalty": site_penalty,
            "site_locality_penalty": site_penalty,
        }
        reference = [Candidate("packed-sticky", BASELINE, {"placement": BASELINE}, {})]
        noise = [Candidate("null", "null (PM-blind: the queue's noise)", {"placement": "null"}, {})]
        everything = reference + noise + candidates
        results: dict[tuple[int, int], dict[str, float]] = {}
        summaries: dict[int, list[dict]] = {}
        try:
            total = seeds * len(everything)
            with stdout_kept_clean(as_json), progress_bar("paired runs", total) as advance:
                for seed, (jobs, gpus) in enumerate(draws):
                    configs = [SimConfig(seed=seed, **{**common, **c.options}) for c in everything]
                    runs = run_grid(
                        jobs, gpus, configs, workers=workers, on_done=lambda _: advance()
                    )
                    for index, run in enumerate(runs):
                        summary = run.summary()
                        results[(index, seed)] = {
                            k: float(summary[k]) for k in ("avg_jct", "p99_jct", "makespan")
                        }
                        summaries.setdefault(index, []).append(summary)
        except ValueError as exc:
            fail(str(exc))

    rows = []
    per_run: dict[str, list[float]] = {}
    for index, candidate in enumerate(everything[1:], start=1):
        ratios = [
            results[(index, seed)]["avg_jct"] / results[(0, seed)]["avg_jct"]
            for seed in range(seeds)
        ]
        p99 = [
            results[(index, seed)]["p99_jct"] / results[(0, seed)]["p99_jct"]
            for seed in range(seeds)
        ]
        paired = PairedRatios.of(ratios)
        per_run[candidate.label] = ratios
        rows.append(
            {
                "candidate": candidate.label,
                "placement": candidate.policy,
                "settings": candidate.settings,
                "classes": candidate.classes,
                "default_class": candidate.default_class,
                **paired.summary(),
                "p99_jct_geomean_ratio": float(np.exp(np.mean(np.log(p99)))),
                "clear_gain": paired.clear_gain,
                "noise_reference": candidate.policy == "null",
            }
        )
    judged = [r for r in rows if not r["noise_reference"]]
    winners = sorted(
        (r for r in judged if r["clear_gain"]), key=lambda r: -float(r["geomean_gain"])
    )
    if winners:
        recommended = {"advisor": "on", **winners[0]}
    else:
        recommended = {
            "advisor": "pass-through",
            "candidate": f"packing (policy = {PASS_THROUGH!r})",
            "settings": {"policy": PASS_THROUGH},
            "why": "no candidate's gain is clear of the noise (95 % interval lower bound > 0)",
        }
    unchanged = (
        advisor_changes_no_job(site, (gpus.placement_scores for _, gpus in draws))
        if "advisor" in policies
        else None
    )
    report = {
        "site_penalty": site_penalty,
        "mode": mode,
        "scheduler": scheduler_name,
        "seeds": seeds,
        "baseline": {
            "placement": BASELINE,
            "avg_jct": [results[(0, seed)]["avg_jct"] for seed in range(seeds)],
        },
        "recommended": recommended,
        "advisor_changes_no_job": unchanged,
        "candidates": rows,
        "notes": [
            note
            for note in (
                limits_note(draws[0][0]),
                *(
                    waiting_note(c.label, summaries[i], per_run[c.label])
                    for i, c in enumerate(everything)
                    if i > 0 and c.label in per_run
                ),
            )
            if note is not None
        ],
    }
    written = None
    if plot is not None:
        written = tune_plot(
            rows,
            per_run,
            f"{len(draws[0][0])} jobs, {n_nodes}x{per_node} GPUs, {mode} mode, {seeds} paired "
            f"runs per candidate\ndots: single runs; diamond and bar: geomean and its 95 % "
            f"interval; green: gain clear of the noise",
            plot / "tune.png",
        )
    if as_json:
        print_json(report)
        return
    title = (
        f"{len(draws[0][0])} jobs, {n_nodes}x{per_node} GPUs, {mode} mode, site penalty "
        f"{site_penalty:g}; {seeds} paired runs each vs {BASELINE} (ratios: lower is better)"
    )
    console.print(title, highlight=False, markup=False)
    table = Table(box=box.SIMPLE_HEAD)
    columns = ("candidate", "gain", "95% CI", "median", "p90", "worst", "p99 JCT")
    for column in columns:
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for row in rows:
        low, high = row["gain_ci95"]
        table.add_row(
            row["candidate"],
            f"{row['geomean_gain']:+.1%}",
            f"{low:+.1%}..{high:+.1%}",
            f"{row['median_ratio']:.3f}",
            f"{row['p90_ratio']:.3f}",
            f"{row['worst_ratio']:.3f}",
            f"{row['p99_jct_geomean_ratio']:.3f}",
        )
    console.print(table)
    settings = (
        ", ".join(f"{k} = {v!r}" for k, v in recommended["settings"].items())
        or "keep the site config as it is"
    )
    if winners:
        console.print(
            f"recommended: {recommended['candidate']} ({settings}): "
            f"{recommended['geomean_gain']:+.1%} average JCT vs {BASELINE}, clear of the noise"
        )
    else:
        console.print(
            f"recommended: packing, the advisor in pass-through ({settings}): {recommended['why']}"
        )
    if unchanged:
        console.print(f"note: {unchanged}", markup=False, highlight=False)
    for note in report["notes"]:
        console.print(f"note: {note}", markup=False, highlight=False)
    if written is not None:
        console.print(f"wrote {written}", markup=False, highlight=False)
