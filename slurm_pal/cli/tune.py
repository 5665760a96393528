"""`slurm-pal tune`: should this site turn the advisor on, and with which settings?

The experiment (the candidates, their runs paired with Slurm's packing, the honest
recommendation) is :mod:`slurm_pal.sim.tune`; this command reads the options and the site's
trace, runs the experiment with a progress bar and prints its table, recommendation and notes
(or ``--json``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from slurm_pal.adapters.config import load_config
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
    FaultsOption,
    TraceChoice,
    check_run_options,
    checked_cluster,
    load_jobs,
    parse_pairs,
    simulated_gpus,
    split_names,
)
from slurm_pal.core.workload import PAL_DEFAULT_CLASS
from slurm_pal.sim.engine import MODES, SCHEDULERS
from slurm_pal.sim.experiments import BASELINE, FaultRun
from slurm_pal.sim.faults import parse_plan
from slurm_pal.sim.tune import (
    TUNABLE,
    Draw,
    TuneResult,
    TuneRun,
    TuneSweep,
    run_tune,
    tune_experiment,
    with_unknown_share,
)

app = typer.Typer(
    rich_markup_mode=None,
    help="Should the advisor run on this site, and with which settings?",
    add_completion=False,
)

# The options, named once here so that the command's signature reads as a list of them.
TraceOption = Annotated[
    Path | None,
    typer.Option("--trace", help="Sia-Philly CSV or sacct --parsable2 output.", show_default=False),
]
TraceFormatOption = Annotated[str, typer.Option("--trace-format", help="auto, sia or sacct.")]
PoissonOption = Annotated[
    int, typer.Option("--poisson", help="Instead of --trace: N Poisson jobs.")
]
LoadOption = Annotated[float, typer.Option("--load", help="Poisson arrival rate (jobs/hour).")]
ProfileOption = Annotated[
    list[str],
    typer.Option("--profile", help="CLASS=PATH campaign file per class, most sensitive first."),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Site config whose advisor is the first candidate (default: the global --config, "
        "$SLURM_PAL_CONFIG or the built-in defaults, as serve reads it).",
        show_default=False,
    ),
]
ClusterOption = Annotated[str, typer.Option("--cluster", help="NODESxGPUS.")]
SeedsOption = Annotated[
    int,
    typer.Option(
        "--seeds", help="Paired runs per candidate: GPU draws (and Poisson traces) 0..N-1."
    ),
]
SitePenaltyOption = Annotated[
    float | None,
    typer.Option(
        "--site-penalty",
        help="The site's measured slowdown of a job spanning nodes (default: the config's).",
        show_default=False,
    ),
]
PenaltiesOption = Annotated[
    str, typer.Option("--penalties", help="pal/pm-first: advisor penalties to try.")
]
AvoidAboveOption = Annotated[
    str, typer.Option("--avoid-above", help="packed-pm: outlier thresholds to try.")
]
ClassCountsOption = Annotated[
    str,
    typer.Option("--class-counts", help="Numbers of classes to try, e.g. 4,3,2 (default: all)."),
]
DefaultClassesOption = Annotated[
    str,
    typer.Option(
        "--default-classes",
        help="Default classes to try for jobs the advisor cannot identify, e.g. A,D.",
    ),
]
UnknownShareOption = Annotated[
    float,
    typer.Option(
        "--unknown-share",
        help="Treat this seeded share of identified jobs as unidentified too (0-1).",
    ),
]
PlacementOption = Annotated[
    str, typer.Option("--placement", help=f"Candidates: {', '.join(TUNABLE)}.")
]
ModeOption = Annotated[str, typer.Option("--mode", help="slurm (production) or rounds.")]
SchedulerOption = Annotated[str, typer.Option("--scheduler", help="fifo, las or srtf.")]
RoundOption = Annotated[float, typer.Option("--round", help="Round length (rounds mode).")]
PalArtifactOption = Annotated[bool, typer.Option("--pal-artifact", help="PAL's artifact GPUs.")]
ClassMapOption = Annotated[list[str], typer.Option("--class-map", help="MODEL/JOBNAME=CLASS.")]
DefaultClassOption = Annotated[str, typer.Option("--default-class")]
WorkersOption = Annotated[int, typer.Option("--workers", help="Worker processes.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]
PlotOption = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Write tune.png into this directory: each candidate's per-run JCT ratio vs packing.",
        show_default=False,
    ),
]


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


def run_from_options(
    scheduler: str,
    mode: str,
    round_seconds: float,
    workers: int,
    seeds: int,
    pal_artifact: bool,
    site_penalty: float,
    faults: FaultRun | None = None,
) -> TuneRun:
    """How every candidate runs; one scheduler, since candidates are compared under one."""
    schedulers = split_names(scheduler, list(SCHEDULERS), "scheduler")
    if len(schedulers) > 1:
        fail(f"tune takes one --scheduler, got {', '.join(schedulers)}: run it once per scheduler")
    check_run_options(workers, 0, 0.0, None, round_seconds)
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if seeds < 2:
        fail("--seeds must be >= 2: one run says nothing about the noise")
    return TuneRun(schedulers[0], mode, round_seconds, pal_artifact, site_penalty, faults)


def sweep_from_options(
    policies: list[str],
    penalties: str,
    avoid_above: str,
    unknown_share: float,
    class_counts: str,
    default_classes: str,
) -> TuneSweep:
    """The knobs' values to try; the class counts and default classes are checked against
    the drawn cluster's classes later, by the experiment."""
    advisor_penalties = parse_numbers(penalties, "--penalties")
    thresholds = parse_numbers(avoid_above, "--avoid-above")
    if any(t < 1.0 for t in thresholds):
        fail("--avoid-above thresholds are PM-scores >= 1.0")
    if not 0.0 <= unknown_share <= 1.0:
        fail("--unknown-share must be within 0..1")
    counts = parse_counts(class_counts, "--class-counts") if class_counts else None
    defaults: list[str | None] = [None]
    if default_classes:
        defaults = [name.strip() for name in default_classes.split(",") if name.strip()]
    return TuneSweep(policies, advisor_penalties, thresholds, counts, defaults)


def drawn_inputs(
    seeds: int,
    cluster: tuple[int, int],
    profiles: dict[str, str],
    jobs_from: TraceChoice,
    run: TuneRun,
    unknown_share: float,
) -> list[Draw]:
    """One trace and simulated cluster per seed; every candidate's runs share them."""
    draws = []
    for seed in range(seeds):
        gpus = simulated_gpus(profiles, *cluster, run.pal_artifact, seed, jobs_from.default_class)
        jobs = load_jobs(
            jobs_from,
            seed,
            gpus.classes,
            spanned_penalty=run.site_penalty,
            quiet=seed > 0,  # one note about left-out rows, not one per seed
        )
        draws.append((with_unknown_share(jobs, unknown_share, seed), gpus))
    return draws


@app.command()
def tune(
    ctx: typer.Context,
    trace: TraceOption = None,
    trace_format: TraceFormatOption = "auto",
    poisson: PoissonOption = 0,
    load: LoadOption = 12.0,
    profile: ProfileOption = [],  # noqa: B006 (typer only reads it)
    config: ConfigOption = None,
    cluster: ClusterOption = "16x4",
    seeds: SeedsOption = 10,
    site_penalty: SitePenaltyOption = None,
    penalties: PenaltiesOption = "1.3,1.7,2.5",
    avoid_above: AvoidAboveOption = "1.25,1.5,2.0",
    class_counts: ClassCountsOption = "",
    default_classes: DefaultClassesOption = "",
    unknown_share: UnknownShareOption = 0.0,
    placement: PlacementOption = "advisor,packed-pm,pal",
    mode: ModeOption = "slurm",
    scheduler: SchedulerOption = "fifo",
    round_seconds: RoundOption = 360.0,
    pal_artifact: PalArtifactOption = False,
    class_map: ClassMapOption = [],  # noqa: B006 (typer only reads it)
    default_class: DefaultClassOption = PAL_DEFAULT_CLASS,
    workers: WorkersOption = 2,
    as_json: JsonOption = False,
    plot: PlotOption = None,
    faults: FaultsOption = "",
) -> None:
    """Compare the advisor's settings with Slurm's packing over paired runs; recommend one
    only when its gain is clear of the noise (with --faults: every run meets the same faults)."""
    with reported_errors():
        site = load_config(config) if config is not None else state(ctx).config
        plan = parse_plan(faults, mode)
    policies = split_names(placement, list(TUNABLE), "placement")
    penalty = site.locality.across_switches if site_penalty is None else site_penalty
    run = run_from_options(
        scheduler, mode, round_seconds, workers, seeds, pal_artifact, penalty,
        (plan, site.advisor) if plan else None,
    )  # fmt: skip
    n_nodes, per_node = checked_cluster(cluster)
    sweep = sweep_from_options(
        policies, penalties, avoid_above, unknown_share, class_counts, default_classes
    )
    profiles = parse_pairs(profile, "--profile")
    classes = parse_pairs(class_map, "--class-map")
    jobs_from = TraceChoice(trace, trace_format, poisson, load, classes, {}, default_class)
    if plot is not None:
        plot_directory(plot)
    with reported_errors():
        with step(f"drawing {seeds} clusters and traces"):
            draws = drawn_inputs(
                seeds, (n_nodes, per_node), profiles, jobs_from, run, unknown_share
            )
        try:
            experiment = tune_experiment(site, draws, sweep, run)
            if default_classes and all(job.known for job in draws[0][0]):
                warn(
                    "every job's class is known: --default-classes changes nothing "
                    "(see --unknown-share)"
                )
            with (
                stdout_kept_clean(as_json),
                progress_bar("paired runs", experiment.total_runs) as advance,
            ):
                result = run_tune(experiment, workers, on_done=lambda _: advance())
        except ValueError as exc:
            fail(str(exc))
    print_tune(result, (n_nodes, per_node), plot, as_json)


def print_tune(
    result: TuneResult, cluster: tuple[int, int], plot: Path | None, as_json: bool
) -> None:
    """The plot (when asked), then the report as JSON or as a table with the recommendation
    and the notes under it."""
    written = None
    if plot is not None:
        written = tune_plot(
            result.rows,
            result.per_run,
            f"{result.jobs} jobs, {cluster[0]}x{cluster[1]} GPUs, {result.run.mode} mode, "
            f"{len(result.baseline_jct)} paired runs per candidate\ndots: single runs; diamond "
            f"and bar: geomean and its 95 % interval; green: gain clear of the noise",
            plot / "tune.png",
        )
    if as_json:
        print_json(result.report())
        return
    console.print(
        f"{result.jobs} jobs, {cluster[0]}x{cluster[1]} GPUs, {result.run.mode} mode, site "
        f"penalty {result.run.site_penalty:g}; {len(result.baseline_jct)} paired runs each vs "
        f"{BASELINE} (Slurm's packing) on the same trace and GPUs; ratio: the candidate's "
        f"JCT / {BASELINE}'s (lower is better)",
        highlight=False,
        markup=False,
    )
    console.print(candidates_table(result.rows))
    recommended = result.recommended
    settings = (
        ", ".join(f"{k} = {v!r}" for k, v in recommended["settings"].items())
        or "keep the site config as it is"
    )
    if result.clear_gain:
        console.print(
            f"recommended: {recommended['candidate']} ({settings}): "
            f"{recommended['geomean_gain']:+.1%} average JCT vs {BASELINE}, clear of the noise",
            highlight=False,
            markup=False,
        )
    else:
        console.print(
            f"recommended: keep packing ({BASELINE}), the advisor in pass-through ({settings}): "
            f"{recommended['why']}",
            highlight=False,
            markup=False,
        )
    notes = [result.advisor_changes_no_job] if result.advisor_changes_no_job else []
    for note in notes + result.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if written is not None:
        console.print(f"wrote {written}", markup=False, highlight=False)


def candidates_table(rows: list[dict]) -> Table:
    """One row per candidate: its gain over packing, the interval, the spread of its runs."""
    table = Table(box=box.SIMPLE_HEAD)
    columns = (
        "candidate",
        f"gain vs {BASELINE}",
        "95% CI",
        "median",
        "p90",
        "worst",
        "p99 JCT",
    )
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
    return table
