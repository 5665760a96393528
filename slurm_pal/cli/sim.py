"""`slurm-pal sim`: replay a trace through the placement core and compare policies.

``sim run`` simulates one trace (Sia-Philly CSV, ``sacct --parsable2`` history, or a generated
Poisson trace) on a simulated cluster for every (placement, scheduler) pair asked for and prints
a table (or JSON, one object per pair), optionally with PNG plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from slurm_pal.adapters.config import SiteConfig, load_config
from slurm_pal.adapters.traces import TraceFormatError, detect_trace_format, load_trace
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
from slurm_pal.cli.plots import plot_directory, sim_plots
from slurm_pal.core.workload import (
    PAL_DEFAULT_CLASS,
    PAL_ITERATION_TIME,
    PAL_MODEL_CLASS,
    SimJob,
    poisson_workload,
)
from slurm_pal.sim.advisor import advisor_changes_no_job, advisor_sim_options
from slurm_pal.sim.engine import (
    ALL_PLACEMENTS,
    MODES,
    PAPER_PLACEMENTS,
    PLACEMENTS,
    SCHEDULERS,
    SimConfig,
)
from slurm_pal.sim.experiments import (
    FaultRun,
    grid_configs,
    run_grid,
    run_notes,
    with_gains,
)
from slurm_pal.sim.faults import FaultPlan, parse_plan, plan_note, summary_line
from slurm_pal.sim.inputs import load_gpus, parse_cluster
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.variability import SimGpus, uniform_gpus

app = typer.Typer(
    rich_markup_mode=None,
    help="Trace-driven simulation of placement policies.",
    no_args_is_help=True,
)

TRACE_FORMATS = ("auto", "sia", "sacct")

MAX_GPUS = 1_000_000
"""Largest simulated cluster: far above any site, far below what would exhaust memory."""

MIN_ROUND_S = 1.0
"""Shortest round: below a second the round count explodes and a run never ends."""


def checked_cluster(text: str) -> tuple[int, int]:
    """``--cluster`` as (nodes, GPUs per node), within what a simulation can hold."""
    try:
        n_nodes, per_node = parse_cluster(text)
    except ValueError as exc:
        fail(f"--cluster: {exc}")
    if n_nodes * per_node > MAX_GPUS:
        fail(f"--cluster {text}: {n_nodes * per_node} GPUs; the simulator takes at most {MAX_GPUS}")
    return n_nodes, per_node


SITE_PLACEMENTS = ("packed-sticky", "advisor", "null")
"""What ``sim run --config`` compares by default: Slurm's packing, the configured advisor, and
the PM-blind null next to which the advisor's difference from packing is read."""


def split_names(text: str, valid: Sequence[str], what: str) -> list[str]:
    """``"a,b"`` -> ["a", "b"], each checked against ``valid``."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        fail(f"no {what} given")
    unknown = [name for name in names if name not in valid]
    if unknown:
        fail(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return names


def parse_pairs(values: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` options into a dict (order kept)."""
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip() or not rest.strip():
            fail(f"{what} must look like KEY=VALUE, got {value!r}")
        pairs[key.strip()] = rest.strip()
    return pairs


@dataclass(frozen=True)
class TraceChoice:
    """Where the jobs come from: a trace file and how to read its classes, or ``poisson`` > 0
    jobs arriving at ``load`` per hour."""

    trace: Path | None
    trace_format: str
    poisson: int
    load: float
    class_map: dict[str, str]
    iteration_times: dict[str, float]
    default_class: str


def load_jobs(
    choice: TraceChoice,
    seed: int,
    classes: Sequence[str],
    spanned_penalty: float = 1.0,
    quiet: bool = False,
) -> list[SimJob]:
    """The trace file, or a Poisson trace when ``poisson`` > 0. ``spanned_penalty``: the
    site's penalty already in the run times of multi-node jobs of a sacct history. Rows of the
    trace left out (sacct jobs that never ran or have not ended) are counted in a note on
    stderr unless ``quiet``."""
    if choice.trace_format not in TRACE_FORMATS:
        fail(f"unknown --trace-format {choice.trace_format!r}; valid: {', '.join(TRACE_FORMATS)}")
    if choice.poisson < 0:
        fail(f"--poisson must be >= 1 jobs, got {choice.poisson}")
    trace = choice.trace
    if choice.poisson > 0:
        if trace is not None:
            fail("give --trace PATH or --poisson N, not both")
        if not (math.isfinite(choice.load) and choice.load > 0):
            fail(f"--load must be > 0 jobs per hour, got {choice.load:g}")
        try:
            return poisson_workload(choice.poisson, choice.load, seed=seed, classes=tuple(classes))
        except ValueError as exc:
            fail(str(exc))
    if trace is None:
        fail("give --trace PATH or --poisson N")
    if not trace.exists():
        fail(f"trace {trace} not found")
    options: dict[str, object] = {}
    try:
        fmt = detect_trace_format(trace) if choice.trace_format == "auto" else choice.trace_format
    except TraceFormatError as exc:
        fail(str(exc))
    if fmt == "sia":
        options = {
            "model_class": {
                **PAL_MODEL_CLASS,
                **{k.lower(): v for k, v in choice.class_map.items()},
            },
            "iteration_time": {
                **PAL_ITERATION_TIME,
                **{k.lower(): v for k, v in choice.iteration_times.items()},
            },
            "default_class": choice.default_class,
        }
    else:
        options = {
            "class_of": choice.class_map,
            "default_class": choice.default_class,
            "spanned_penalty": spanned_penalty,
        }
    try:
        with step(f"reading {trace}", quiet=quiet):
            read = load_trace(trace, fmt, **options)
    except (TraceFormatError, ValueError) as exc:
        fail(str(exc))
    note = read.left_out_text()
    if note and not quiet:
        warn(f"{trace}: {note}")
    return read.jobs


def simulated_gpus(
    profiles: dict[str, str],
    n_nodes: int,
    per_node: int,
    pal_artifact: bool,
    seed: int | None,
    default_class: str,
) -> SimGpus:
    """The simulated cluster: drawn from the ``--profile`` campaign files, or uniform GPUs
    (no variability) with the trace's classes."""
    if profiles:
        return load_gpus(
            {name: Path(path) for name, path in profiles.items()},
            n_nodes,
            per_node,
            pal_artifact=pal_artifact,
            seed=seed,
        )
    return uniform_gpus(sorted({default_class, *PAL_MODEL_CLASS.values()}), n_nodes, per_node)


def hours(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else f"{seconds / 3600:.2f}"


COLUMNS_LEGEND = (
    "JCT: average job completion time; gain: lower average JCT than packed-sticky under the "
    "same scheduler; p99: 99th percentile JCT; mksp: makespan; wait: average queue wait; "
    "FTF: finish-time fairness, a job's JCT over its time on a fair 1/N share of the cluster "
    "(1 = fair, lower is better); util: GPU utilization; pre: jobs preempted; mig: running "
    "jobs moved to other GPUs (round mode only; Slurm never moves one)"
)
"""Printed under `sim run`'s table: the column names are short so the table fits a terminal."""


def results_table(summaries: list[dict], title: str) -> Table:
    """One row per (placement, scheduler); times in hours, gain = lower average JCT than
    Packed-Sticky (Tiresias) under the same scheduler."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        # The title says what was simulated and is often wider than the numbers: never wrap it.
        min_width=len(title),
    )
    table.add_column("placement", no_wrap=True)
    table.add_column("sched", no_wrap=True)
    for column in ("JCT h", "gain", "p99 h", "mksp h", "wait h", "FTF", "util", "pre", "mig"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in summaries:
        gain = row.get("gain_vs_baseline", math.nan)
        table.add_row(
            row["placement"],
            row["scheduler"],
            hours(row["avg_jct"]),
            "-" if not math.isfinite(gain) else f"{gain:+.1%}",
            hours(row["p99_jct"]),
            hours(row["makespan"]),
            hours(row["avg_wait"]),
            "-" if not math.isfinite(row["avg_ftf"]) else f"{row['avg_ftf']:.2f}",
            "-" if not math.isfinite(row["utilization"]) else f"{row['utilization']:.0%}",
            str(row["preemptions"]),
            str(row["migrations"]),
        )
    return table


def run_with_progress(
    jobs: list[SimJob],
    gpus: SimGpus,
    configs: list[SimConfig],
    workers: int,
    quiet: bool,
    faults: FaultRun | None = None,
) -> list[SimResult]:
    """Every config on the trace, with a progress bar on stderr (in a log: a count line once
    it has run a few seconds)."""
    with progress_bar("simulating", len(configs), quiet=quiet) as advance:
        return run_grid(
            jobs, gpus, configs, workers=workers, on_done=lambda _: advance(), faults=faults
        )


def check_run_options(
    workers: int,
    seed: int | None,
    migration_seconds: float,
    xi: float | None,
    round_seconds: float = 360.0,
    mode: str = "rounds",
    enforce_limits: bool = False,
) -> None:
    """Options the engine would take silently or fail on deep inside: one line each."""
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if enforce_limits and mode != "slurm":
        fail("--enforce-limits needs --mode slurm (the round mode preempts jobs)")
    if workers < 1:
        fail(f"--workers must be >= 1, got {workers}")
    if not (math.isfinite(round_seconds) and round_seconds >= MIN_ROUND_S):
        fail(f"--round must be >= {MIN_ROUND_S:g} s, got {round_seconds:g}")
    if seed is not None and seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    if not (math.isfinite(migration_seconds) and migration_seconds >= 0):
        fail(f"--migration-seconds must be >= 0, got {migration_seconds:g}")
    if xi is not None and not (math.isfinite(xi) and xi >= 1.0):
        fail(f"--xi must be >= 1 (an interference slowdown), got {xi:g}")


def iteration_times(values: Sequence[str]) -> dict[str, float]:
    """``--iter-time MODEL=SECONDS`` options, each a positive number of seconds."""
    times: dict[str, float] = {}
    for model, value in parse_pairs(values, "--iter-time").items():
        try:
            times[model] = float(value)
        except ValueError:
            fail(f"--iter-time {model}={value}: not a number")
        if not (math.isfinite(times[model]) and times[model] > 0):
            fail(f"--iter-time {model}={value}: must be > 0 seconds per iteration")
    return times


# The options of `sim run`, named once here so that its signature reads as a list of them.
TraceOption = Annotated[
    Path | None,
    typer.Option("--trace", help="Sia-Philly CSV or sacct --parsable2 output.", show_default=False),
]
TraceFormatOption = Annotated[str, typer.Option("--trace-format", help="auto, sia or sacct.")]
PoissonOption = Annotated[
    int,
    typer.Option("--poisson", help="Instead of --trace: generate this many Poisson-arrival jobs."),
]
LoadOption = Annotated[float, typer.Option("--load", help="Poisson arrival rate (jobs/hour).")]
ProfileOption = Annotated[
    list[str],
    typer.Option(
        "--profile",
        help="CLASS=PATH per-GPU campaign file of a class, repeatable, most "
        "variability-sensitive class first (none: no variability).",
    ),
]
PlacementOption = Annotated[
    str,
    typer.Option(
        "--placement",
        help="Comma-separated placements (default: the paper's six; with --config: "
        "packed-sticky,advisor,null). 'advisor' is the advisor exactly as the site config sets "
        "it up (what serve runs); 'null' is packing with each node's GPUs in random order, "
        "blind to PM-scores (the queue's own noise). Peers (scheduler and placement at once): "
        + ", ".join(ALL_PLACEMENTS[len(PLACEMENTS) :])
        + ".",
        show_default=False,
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Site config (slurm-pal.toml) whose advisor the 'advisor' placement simulates, and "
        "whose locality penalty applies (default: the global --config, $SLURM_PAL_CONFIG, or "
        "the built-in defaults, as serve reads it).",
        show_default=False,
    ),
]
SchedulerOption = Annotated[str, typer.Option("--scheduler", help="fifo, las, srtf (or a list).")]
ClusterOption = Annotated[str, typer.Option("--cluster", help="NODESxGPUS.")]
LocalityPenaltyOption = Annotated[
    float | None,
    typer.Option(
        "--locality-penalty",
        help="Slowdown of a job spanning nodes (default: the config's locality.across_switches, "
        "1.7).",
        show_default=False,
    ),
]
ModeOption = Annotated[str, typer.Option("--mode", help="rounds (PAL/Blox) or slurm.")]
RoundOption = Annotated[float, typer.Option("--round", help="Round length (s).")]
BackfillOption = Annotated[
    bool,
    typer.Option(
        "--backfill/--no-backfill",
        help="Slurm mode: EASY backfill (Slurm's default), or strict FIFO (the testbed's).",
    ),
]
EnforceLimitsOption = Annotated[
    bool,
    typer.Option(
        "--enforce-limits",
        help="Slurm mode: end a job at its time limit as Slurm does (TIMEOUT, work lost); "
        "by default it runs to its end, so a slow GPU's cost stays in its JCT.",
    ),
]
BackfillReservesOption = Annotated[
    str,
    typer.Option(
        "--backfill-reserves",
        help="Slurm mode, backfill: head (EASY: the first waiting job, by GPU count) or nodes "
        "(as Slurm's sched/backfill: every waiting job, on whole nodes, over its limit).",
    ),
]
SlurmReleaseOption = Annotated[
    str,
    typer.Option(
        "--slurm-release",
        help="Slurm mode: the release whose backfill to plan as (22.05 expects a job past its "
        "limit to run a limit more; 24.11 counts it gone).",
    ),
]
SeedOption = Annotated[
    int | None,
    typer.Option(
        "--seed", help="Seed (GPU draw and random placement; default 42 artifact, else 0)."
    ),
]
PalArtifactOption = Annotated[
    bool,
    typer.Option("--pal-artifact", help="PAL's artifact: random per-GPU draws, K=2, its quirks."),
]
ClassMapOption = Annotated[
    list[str],
    typer.Option("--class-map", help="MODEL=CLASS (Sia) or JOBNAME=CLASS (sacct), repeatable."),
]
IterTimeOption = Annotated[
    list[str],
    typer.Option("--iter-time", help="MODEL=SECONDS per iteration (Sia traces), repeatable."),
]
DefaultClassOption = Annotated[
    str, typer.Option("--default-class", help="Class of jobs the map does not know.")
]
MigrationOption = Annotated[
    float,
    typer.Option(
        "--migration-seconds", help="fft-pm/pal-fft: cost of moving or resuming a job (s)."
    ),
]
XiOption = Annotated[
    float | None,
    typer.Option(
        "--xi",
        help="Sharing peers: one interference factor for every pair (>= 1).",
        show_default=False,
    ),
]
WorkersOption = Annotated[int, typer.Option("--workers", help="Worker processes.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]
TimelineOption = Annotated[
    bool,
    typer.Option("--timeline", help="With --json: add gpus_in_use, [[time s, GPUs], ...]."),
]
PlotOption = Annotated[
    Path | None,
    typer.Option("--plot", help="Write PNG plots into this directory.", show_default=False),
]
FaultsOption = Annotated[
    str,
    typer.Option(
        "--faults",
        help="Slurm mode: GPUs turn slow and the advisor's closed loop meets them, as served "
        "(the config's advisor.remeasure_* and avoid_above): rate=FAULTS_PER_1000_GPU_DAYS"
        "[,factors=1.5/2][,visible=0.5 (share NVML sees)][,classes=A/D (the class each "
        "slows most; default the first)][,repair-days=14][,from-days=0][,loop=remeasure, "
        "detector, oracle or none]. Each run reports faults flagged and the GPU-hours they "
        "added.",
        show_default=False,
    ),
]


@app.command("run")
def run(
    ctx: typer.Context,
    trace: TraceOption = None,
    trace_format: TraceFormatOption = "auto",
    poisson: PoissonOption = 0,
    load: LoadOption = 12.0,
    profile: ProfileOption = [],  # noqa: B006 (typer only reads it)
    placement: PlacementOption = "",
    config: ConfigOption = None,
    scheduler: SchedulerOption = "fifo",
    cluster: ClusterOption = "16x4",
    locality_penalty: LocalityPenaltyOption = None,
    mode: ModeOption = "rounds",
    round_seconds: RoundOption = 360.0,
    backfill: BackfillOption = True,
    enforce_limits: EnforceLimitsOption = False,
    slurm_release: SlurmReleaseOption = "22.05",
    backfill_reserves: BackfillReservesOption = "head",
    seed: SeedOption = None,
    pal_artifact: PalArtifactOption = False,
    class_map: ClassMapOption = [],  # noqa: B006 (typer only reads it)
    iter_time: IterTimeOption = [],  # noqa: B006 (typer only reads it)
    default_class: DefaultClassOption = PAL_DEFAULT_CLASS,
    migration_seconds: MigrationOption = 30.0,
    xi: XiOption = None,
    workers: WorkersOption = 1,
    as_json: JsonOption = False,
    timeline: TimelineOption = False,
    plot: PlotOption = None,
    faults: FaultsOption = "",
) -> None:
    """Simulate a trace under each placement x scheduler and compare them."""
    with reported_errors():
        site = load_config(config) if config is not None else state(ctx).config
    if not placement:
        placement = ",".join(SITE_PLACEMENTS if config is not None else PAPER_PLACEMENTS)
    placements = split_names(placement, list(ALL_PLACEMENTS), "placement")
    penalty = site.locality.across_switches if locality_penalty is None else locality_penalty
    schedulers = split_names(scheduler, list(SCHEDULERS), "scheduler")
    n_nodes, per_node = checked_cluster(cluster)
    check_run_options(workers, seed, migration_seconds, xi, round_seconds, mode, enforce_limits)
    profiles = parse_pairs(profile, "--profile")
    times = iteration_times(iter_time)
    classes = parse_pairs(class_map, "--class-map")
    if plot is not None:
        plot_directory(plot)
    with reported_errors():
        plan = parse_plan(faults, mode)
        with step("reading the variability profiles", quiet=not profiles):
            gpus = simulated_gpus(profiles, n_nodes, per_node, pal_artifact, seed, default_class)
        jobs = load_jobs(
            TraceChoice(trace, trace_format, poisson, load, classes, times, default_class),
            seed if seed is not None else 0,
            gpus.classes,
            spanned_penalty=penalty,
        )
        common: dict[str, object] = {
            "mode": mode,
            "round_seconds": round_seconds,
            "backfill": backfill,
            "enforce_limits": enforce_limits,
            "slurm_release": slurm_release,
            "backfill_reserves": backfill_reserves,
            "locality_penalty": penalty,
            "seed": seed if seed is not None else 0,
            "pal_artifact": pal_artifact,
            "migration_seconds": migration_seconds,
            "xi": xi,
        }
        try:
            configs = grid_configs(placements, schedulers, common, advisor_sim_options(site))
            with stdout_kept_clean(as_json):
                results = run_with_progress(
                    jobs, gpus, configs, workers, False, (plan, site.advisor) if plan else None
                )
        except ValueError as exc:
            fail(str(exc))
    title = run_title(len(jobs), (n_nodes, per_node), common, gpus.source if profiles else "", plan)
    note = advisor_note(site, placements, gpus)
    print_run(jobs, results, RunOutput(title, note, plot, as_json, timeline))


def advisor_note(site: SiteConfig, placements: Sequence[str], gpus: SimGpus) -> str | None:
    """Why the advisor placement equals packing on these GPUs, when it does (else None)."""
    if "advisor" not in placements:
        return None
    return advisor_changes_no_job(site, [gpus.placement_scores])


def run_title(
    n_jobs: int,
    cluster: tuple[int, int],
    common: dict[str, object],
    source: str,
    plan: FaultPlan | None,
) -> str:
    """The results table's title: the trace, cluster, mode and what varies."""
    mode = common["mode"]
    return (
        f"{n_jobs} jobs, {cluster[0]}x{cluster[1]} GPUs, {mode} mode"
        + (f" ({common['round_seconds']:g} s rounds)" if mode == "rounds" else "")
        + (" (time limits enforced)" if common.get("enforce_limits") else "")
        + (
            " (backfill reserves nodes for every waiting job)"
            if mode == "slurm" and common.get("backfill_reserves", "head") != "head"
            else ""
        )
        + (
            f" (Slurm {common['slurm_release']}'s backfill)"
            if mode == "slurm" and common.get("slurm_release", "22.05") != "22.05"
            else ""
        )
        + f", L={common['locality_penalty']:g}, "
        + (source or "no variability (uniform GPUs)")
        + (f"; {plan_note(plan)}" if plan else "")
    )


@dataclass(frozen=True)
class RunOutput:
    """What `sim run` prints besides the results: the table's title, the note on the
    configured advisor, and where and how it writes."""

    title: str
    advisor_note: str | None
    plot: Path | None
    as_json: bool
    timeline: bool


def print_run(jobs: list[SimJob], results: list[SimResult], output: RunOutput) -> None:
    """The plots (when asked), then JSON or the table with its legend and notes."""
    summaries = with_gains(results)
    if output.timeline:
        for summary, result in zip(summaries, results, strict=True):
            summary["gpus_in_use"] = [[t, busy] for t, busy in result.timeline]
    written: list[Path] = []
    if output.plot is not None:
        with step(f"drawing the plots into {output.plot}"):
            written = sim_plots(results, output.plot)
    if output.as_json:
        print_json(summaries)
        return
    console.print(results_table(summaries, output.title))
    console.print(COLUMNS_LEGEND, markup=False, highlight=False)
    if output.advisor_note:
        console.print(f"note: {output.advisor_note}", markup=False, highlight=False)
    unplaceable = sorted({j for r in results for j in r.unplaceable})
    if unplaceable:
        console.print(
            "[yellow]left out (more GPUs than the cluster):[/] " + escape(", ".join(unplaceable))
        )
    for note in run_notes(jobs, summaries):
        console.print(f"note: {note}", markup=False, highlight=False)
    for summary in summaries:
        if "faults" in summary:
            console.print(summary_line(summary), markup=False, highlight=False)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False)
