"""`slurm-pal campaign ...`: profiling campaigns through Slurm, from plan to active labels.

plan -> submit (job arrays; progress) -> collect (checks, ingest into the store) -> diff ->
activate; and suggest (GPUs drifting in production: a targeted re-measurement). The
campaign's files live in one directory per campaign (see :mod:`slurm_pal.campaigns.workspace`);
the store only sees what ``collect`` ingests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from slurm_pal.campaigns.collect import Collected, CollectRequest, collect_campaign
from slurm_pal.campaigns.drift import DriftRequest, production_drift
from slurm_pal.campaigns.planning import (
    PlanRequest,
    SiteClasses,
    gpus_to_measure,
    new_plan,
    shared_benchmark_note,
)
from slurm_pal.campaigns.settings import CampaignSettings
from slurm_pal.campaigns.slurm import SlurmCommands, SlurmError
from slurm_pal.campaigns.stored import stored_diff
from slurm_pal.campaigns.workspace import (
    SBATCH_DIR,
    CampaignError,
    CampaignPlan,
    Submission,
    add_submission,
    campaigns_root,
    create_campaign,
    load_plan,
)
from slurm_pal.cli.campaign_inputs import (
    gpus_from_slurm,
    node_states,
    task_states,
)
from slurm_pal.cli.campaign_views import (
    RESTART_ADVICE,
    counts_line,
    print_campaign_slowdowns,
    print_check,
    print_diff,
    print_drift,
    print_label_changes,
    print_progress,
)
from slurm_pal.cli.common import (
    AppState,
    console,
    err_console,
    fail,
    print_json,
    reported_errors,
    state,
)
from slurm_pal.core.campaigns import (
    DEFAULT_TOLERANCE,
    gpus_from_hostlist,
    progress_counts,
    waiting_for_unavailable_nodes,
)

# The restart advice is part of what this module offers its callers (tests check the text).
__all__ = ["RESTART_ADVICE", "app", "site_campaign_settings"]

app = typer.Typer(
    rich_markup_mode=None,
    help="Profiling campaigns through Slurm: plan, submit, collect, diff, activate.",
    no_args_is_help=True,
)

EXIT_FINDINGS = 1
ROOT_OPT = typer.Option(
    None,
    "--root",
    help="Folder of campaign directories, shared with the compute nodes (env "
    "SLURM_PAL_CAMPAIGNS; default: 'campaigns' next to the store).",
    show_default=False,
)
JSON_OPT = typer.Option(False, "--json", help="Print JSON instead of tables.")
SBATCH_OPT = typer.Option("sbatch", "--sbatch", help="sbatch command to use.")
SQUEUE_OPT = typer.Option("squeue", "--squeue", help="squeue command to use.")
SINFO_OPT = typer.Option("sinfo", "--sinfo", help="sinfo command to use (node states).")


@contextmanager
def _errors() -> Iterator[None]:
    """The project's errors plus campaign and Slurm ones, as one line and exit code 2."""
    with reported_errors():
        try:
            yield
        except (CampaignError, SlurmError, ValueError) as exc:
            fail(str(exc))


def site_campaign_settings(st: AppState) -> CampaignSettings:
    """The site config's ``[campaign]`` section (``SiteConfig.campaign``, loaded through
    :func:`slurm_pal.campaigns.settings.load_campaign_settings`), else the defaults."""
    found = getattr(st.config, "campaign", None)
    return found if isinstance(found, CampaignSettings) else CampaignSettings()


def _root(st: AppState, root: Path | None) -> Path:
    return campaigns_root(root, st.db_path, site_campaign_settings(st).root)


# -- plan ------------------------------------------------------------------------------------


# The options of `campaign plan`, named once here so that its signature reads as a list.
NodesOption = Annotated[
    str | None,
    typer.Option(
        "--nodes",
        help="Nodes to measure, as a Slurm hostlist (e.g. gpu[01-16]); default: every node "
        "with GPUs (in --partition), as Slurm reports them.",
    ),
]
GpusPerNodeOption = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="GPUs per node (device minors 0..N-1 are measured); default: each node's GPU "
        "count from Slurm.",
    ),
]
ExcludeOption = Annotated[
    str | None,
    typer.Option("--exclude", help="Nodes to leave out (hostlist), e.g. drained ones."),
]
OnlyOption = Annotated[
    str | None,
    typer.Option(
        "--only",
        help="Measure only these GPUs, NODE:INDEX,... (e.g. from 'campaign suggest'); each "
        "task still holds its whole node.",
    ),
]
PartitionOption = Annotated[
    str | None,
    typer.Option("--partition", help="Slurm partition (default: campaign.partition)."),
]
ClassesOption = Annotated[
    str | None,
    typer.Option("--classes", help="Comma-separated job classes (default: all site classes)."),
]
RepeatsOption = Annotated[
    int | None,
    typer.Option("--repeats", min=1, help="Runs per GPU and class (default: campaign.repeats, 3)."),
]
CommandOption = Annotated[
    list[str],
    typer.Option(
        "--command",
        help="CLASS=COMMAND: bring your own benchmark (prints PAL_DURATION_S=<s>). "
        "{python} and {bench_dir} are filled in. Repeatable; overrides [campaign.commands].",
    ),
]
CampaignIdOption = Annotated[
    str | None, typer.Option("--id", help="Campaign id (default: c<UTC date-time>).")
]
GpuModelOption = Annotated[
    str | None,
    typer.Option("--gpu-model", help="GPU model name for the labels (default: site config)."),
]
TimeLimitOption = Annotated[
    str | None,
    typer.Option(
        "--time", help="Slurm time limit per task (default: campaign.time_limit, 01:00:00)."
    ),
]
RunTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--run-timeout",
        min=1,
        help="Seconds one benchmark run may take (default: campaign.run_timeout_s, 1800).",
    ),
]
WarmupOption = Annotated[
    float | None,
    typer.Option(
        "--warmup-s",
        min=0,
        help="Benchmark warm-up seconds before the timed window (default: campaign.warmup_s, "
        "10); passed to the benchmarks as PAL_WARMUP_S.",
    ),
]
MeasureOption = Annotated[
    float | None,
    typer.Option(
        "--measure-s",
        min=0.001,
        help="Seconds of the timed window (default: campaign.measure_s, 20); passed as "
        "PAL_MEASURE_S.",
    ),
]
PythonOption = Annotated[
    str | None,
    typer.Option(
        "--python",
        help="Python on the compute nodes, runs runner and benchmarks (default: "
        "campaign.python, python3).",
    ),
]
SbatchArgOption = Annotated[
    list[str],
    typer.Option(
        "--sbatch-arg",
        help="Extra #SBATCH line, e.g. --account=ops. Repeatable; added to campaign.sbatch_args.",
    ),
]


@app.command()
def plan(
    ctx: typer.Context,
    nodes: NodesOption = None,
    gpus_per_node: GpusPerNodeOption = None,
    exclude: ExcludeOption = None,
    only: OnlyOption = None,
    partition: PartitionOption = None,
    classes: ClassesOption = None,
    repeats: RepeatsOption = None,
    command: CommandOption = [],  # noqa: B006 (typer only reads it)
    campaign_id: CampaignIdOption = None,
    gpu_model: GpuModelOption = None,
    time_limit: TimeLimitOption = None,
    run_timeout: RunTimeoutOption = None,
    warmup_s: WarmupOption = None,
    measure_s: MeasureOption = None,
    python: PythonOption = None,
    sbatch_arg: SbatchArgOption = [],  # noqa: B006 (typer only reads it)
    root: Path | None = ROOT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Write a campaign: one job array per node, one task per GPU, batch scripts rendered."""
    st = state(ctx)
    request = PlanRequest(
        classes=classes,
        repeats=repeats,
        commands=command,
        campaign_id=campaign_id,
        gpu_model=gpu_model,
        time_limit=time_limit,
        run_timeout_s=run_timeout,
        python=python,
        sbatch_args=sbatch_arg,
        warmup_s=warmup_s,
        measure_s=measure_s,
    )
    with _errors():
        cfg = st.config
        settings = site_campaign_settings(st)
        plan_partition = partition or settings.partition
        notes: list[str] = []
        if gpus_per_node is not None:
            if nodes is None:
                fail("--gpus-per-node needs --nodes HOSTLIST (or leave both out: ask Slurm)")
            gpus = gpus_from_hostlist(nodes, gpus_per_node)
        else:
            gpus, notes = gpus_from_slurm(nodes, plan_partition)
        gpus, counts = gpus_to_measure(gpus, exclude, only)
        site = SiteClasses(cfg.classes.names, cfg.profiling.gpu_model, cfg.source)
        the_plan = new_plan(request, settings, site, gpus, counts, plan_partition)
        directory = create_campaign(_root(st, root), the_plan)
    shared = shared_benchmark_note(the_plan)
    print_plan(the_plan, directory, [*notes, shared] if shared else notes, as_json)


def print_plan(the_plan: CampaignPlan, directory: Path, notes: list[str], as_json: bool) -> None:
    """The plan as JSON, or a line, its benchmarks, the notes and the next command."""
    if as_json:
        print_json(
            {
                "campaign": the_plan.campaign,
                "directory": str(directory),
                "plan": the_plan.to_dict(),
                "notes": notes,
            }
        )
        return
    console.print(
        f"planned campaign [bold]{the_plan.campaign}[/] in {directory}: {len(the_plan.gpus)} "
        f"GPUs on {len(the_plan.nodes)} node(s), classes {','.join(the_plan.classes)}, "
        f"{the_plan.repeats} run(s) each"
    )
    table = Table(title="benchmarks", title_justify="left")
    table.add_column("class")
    table.add_column("benchmark")
    table.add_column("command")
    for job_class, bench in the_plan.benchmarks.items():
        table.add_row(job_class, bench.name, bench.command)
    console.print(table)
    for note in notes:
        console.print(f"note: {note}")
    console.print(f"next: slurm-pal campaign submit {the_plan.campaign}")


# -- submit / status -------------------------------------------------------------------------


@app.command()
def submit(
    ctx: typer.Context,
    campaign: str = typer.Argument(..., help="Campaign id (from 'campaign plan')."),
    wait: bool = typer.Option(False, "--wait", help="Poll and show progress until done."),
    poll: float = typer.Option(30.0, "--poll", min=0.0, help="Seconds between polls (--wait)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be submitted."),
    root: Path | None = ROOT_OPT,
    sbatch: str = SBATCH_OPT,
    squeue: str = SQUEUE_OPT,
    sinfo: str = SINFO_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Submit the tasks still to run (all at first; later: failed and never finished ones).

    Tasks that are done, running or queued are left alone, so submitting again after a
    failure or a drained node reruns only what is missing; a rerun replaces a task's records.
    """
    st = state(ctx)
    slurm = SlurmCommands(sbatch=sbatch, squeue=squeue, sinfo=sinfo)
    with _errors():
        the_plan, directory = load_plan(_root(st, root), campaign)
        tasks, _ = task_states(the_plan, directory, slurm)
        todo: dict[str, list[int]] = {}
        for t in tasks:
            if t.state in ("failed", "incomplete", "not submitted"):
                todo.setdefault(t.node, []).append(t.gpu_index)
        submitted = []
        for node, gpus in todo.items():
            array = ",".join(str(i) for i in gpus)
            script = directory / SBATCH_DIR / f"{node}.sbatch"
            job_id = "-" if dry_run else slurm.submit(script, array=array, cwd=directory)
            if not dry_run:
                add_submission(
                    directory,
                    Submission(
                        node, job_id, tuple(gpus), datetime.now(UTC).isoformat(timespec="seconds")
                    ),
                )
            submitted.append({"node": node, "job_id": job_id, "gpus": gpus})
        tasks, problems = task_states(the_plan, directory, slurm)
        last = ""
        while wait and not dry_run and any(t.state in ("pending", "running") for t in tasks):
            if all(t.state != "running" for t in tasks) and waiting_for_unavailable_nodes(
                tasks, node_states(slurm, {t.node for t in tasks if t.state == "pending"})
            ):
                nodes = sorted({t.node for t in tasks if t.state == "pending"})
                err_console.print(
                    f"stopped waiting: the queued tasks wait for unavailable node(s) "
                    f"{', '.join(nodes)} (drained or down). Resume them, or collect the rest "
                    f"with 'slurm-pal campaign collect {campaign} --allow-missing'",
                    highlight=False,
                )
                break
            line = counts_line(tasks)
            if line != last and not as_json:
                console.print(f"{time.strftime('%H:%M:%S')} {line}")
                last = line
            time.sleep(poll)
            tasks, problems = task_states(the_plan, directory, slurm)
    if as_json:
        print_json(
            {
                "campaign": campaign,
                "dry_run": dry_run,
                "submitted": submitted,
                "progress": progress_counts(tasks),
                "tasks": [t.__dict__ for t in tasks],
                "record_problems": problems,
            }
        )
        return
    verb = "would submit" if dry_run else "submitted"
    if not submitted:
        console.print(f"nothing to submit: every task of {campaign} is done, running or queued")
    for s in submitted:
        console.print(
            f"{verb} node {s['node']} GPUs {','.join(map(str, s['gpus']))}"
            + ("" if dry_run else f" as job {s['job_id']}")
        )
    print_progress(tasks, the_plan, problems)


@app.command()
def status(
    ctx: typer.Context,
    campaign: str = typer.Argument(..., help="Campaign id."),
    root: Path | None = ROOT_OPT,
    squeue: str = SQUEUE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Progress: tasks done / failed / running / pending (with Slurm's reason)."""
    st = state(ctx)
    with _errors():
        the_plan, directory = load_plan(_root(st, root), campaign)
        tasks, problems = task_states(
            the_plan, directory, SlurmCommands(squeue=squeue), need_queue=False
        )
    if as_json:
        print_json(
            {
                "campaign": campaign,
                "progress": progress_counts(tasks),
                "tasks": [t.__dict__ for t in tasks],
                "record_problems": problems,
            }
        )
        return
    print_progress(tasks, the_plan, problems)


# -- collect ---------------------------------------------------------------------------------


@app.command()
def collect(
    ctx: typer.Context,
    campaign: str = typer.Argument(..., help="Campaign id."),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        min=0.0,
        help="Repeats of a GPU may differ by this much (max/min - 1) before they are reported "
        f"(default: campaign.tolerance, {DEFAULT_TOLERANCE}).",
    ),
    allow_missing: bool = typer.Option(
        False,
        "--allow-missing",
        help="Ingest even with missing or failed GPUs (they get the median bin or are absent).",
    ),
    store_id: str | None = typer.Option(
        None, "--as", help="Store campaign id (default: the campaign id; a new one per rerun)."
    ),
    root: Path | None = ROOT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Check the records and ingest them into the store (all or nothing).

    Reports GPUs missing (no successful run of a class), failed runs, GPUs whose repeats
    disagree beyond the tolerance (an intermittently throttling GPU is a finding), and GPUs
    whose runs hit thermal or hardware clock slowdowns (a cooling fault, not a PM-score).
    """
    st = state(ctx)
    with _errors():
        cfg = st.config
        request = CollectRequest(
            tolerance=site_campaign_settings(st).tolerance if tolerance is None else tolerance,
            allow_missing=allow_missing,
            store_id=store_id,
            class_order=cfg.classes.names,
            binner=cfg.binning.binner(),
        )
        the_plan, directory = load_plan(_root(st, root), campaign)
        collected = collect_campaign(st.store, the_plan, directory, request, campaign)
    print_collected(collected, campaign, as_json)


def print_collected(collected: Collected, campaign: str, as_json: bool) -> None:
    """The check and what was ingested, as JSON or tables; a blocked or empty campaign exits
    with the findings code, one already in the store with 0."""
    check, problems, result = collected.check, collected.problems, collected.ingested
    if collected.unchanged:
        if as_json:
            print_json(check.to_dict() | {"campaign": campaign, "unchanged": True})
        else:
            console.print(
                f"campaign {collected.target!r} is already in the store with exactly these "
                "records; nothing to do"
            )
        raise typer.Exit(0)
    report = check.to_dict() | {"campaign": campaign, "record_problems": problems}
    if result is not None:
        report["ingested"] = {
            "store_campaign": result.campaign_id,
            "rows": result.rows,
            "activated": result.activated,
            "csv": str(collected.csv_path),
        }
    if as_json:
        print_json(report)
    else:
        print_check(check, problems)
    if result is None:
        if not check.ok_runs:
            fail(
                f"campaign {campaign} has no successful runs yet; nothing to ingest", EXIT_FINDINGS
            )
        fail(
            f"campaign {campaign} is incomplete ({len(check.missing_gpus)} GPU(s) missing, "
            f"{len(check.failures)} failed run(s), {len(check.short)} GPU/class(es) with fewer "
            f"runs than planned, {len(problems)} bad record file(s)); "
            f"nothing was ingested. Fix the causes and rerun the tasks with 'slurm-pal "
            f"campaign submit {campaign}', or ingest what there is with --allow-missing",
            EXIT_FINDINGS,
        )
    if not as_json:
        console.print(
            f"ingested {result.rows} runs into store campaign [bold]{result.campaign_id}[/]"
            + (
                " (now active)"
                if result.activated
                else f"; compare with 'slurm-pal campaign diff {collected.active_before} "
                f"{result.campaign_id}', then "
                f"'slurm-pal campaign activate {result.campaign_id}'"
            )
        )


# -- diff / activate -------------------------------------------------------------------------


@app.command()
def diff(
    ctx: typer.Context,
    old: str = typer.Argument(..., help="Store campaign id (e.g. the active one)."),
    new: str = typer.Argument(..., help="Store campaign id to compare with."),
    as_json: bool = JSON_OPT,
) -> None:
    """GPUs that changed bin, new outliers, and the label changes a switch would make."""
    st = state(ctx)
    with _errors(), st.store(create=False) as store:
        d = stored_diff(store, old, new)
    if as_json:
        print_json(d.to_dict())
        return
    print_diff(d)


@app.command()
def activate(
    ctx: typer.Context,
    campaign: str = typer.Argument(..., help="Store campaign id."),
    as_json: bool = JSON_OPT,
) -> None:
    """Make a campaign the one the advisor uses; shows what changes against the active one."""
    st = state(ctx)
    with _errors(), st.store(create=False) as store:
        store.resolve_campaign(campaign)
        previous = store.active_campaign_id()
        d = stored_diff(store, previous, campaign) if previous and previous != campaign else None
        store.activate(campaign)
    if as_json:
        print_json(
            {"active": campaign, "previous": previous, "diff": None if d is None else d.to_dict()}
        )
        return
    console.print(
        f"campaign [bold]{campaign}[/] is now active"
        + (f" (was {previous})" if previous and previous != campaign else "")
    )
    if d is not None:
        print_label_changes(d)


# -- suggest ---------------------------------------------------------------------------------


@app.command()
def suggest(
    ctx: typer.Context,
    records: Path | None = typer.Option(
        None,
        "--records",
        help="JSON lines of Prolog/Epilog records and advisor decisions, e.g. from another "
        "store (default: what the advisor service kept in the store).",
    ),
    labels: Path | None = typer.Option(
        None,
        "--labels",
        help="labels.json Slurm runs with, to map SLURM_JOB_GPUS to GPUs (default: "
        "advisor.labels_file, else the campaign's own labels).",
    ),
    campaign: str | None = typer.Option(
        None, "--campaign", help="Store campaign whose PM-scores are expected (default: active)."
    ),
    min_runs: int | None = typer.Option(
        None,
        "--min-runs",
        min=1,
        help="Production runs a GPU needs before it can be listed (default: "
        "campaign.drift_min_runs, 5).",
    ),
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        min=0.0,
        help="Median slowdown beyond which a GPU drifts, 0.05 = 5 % (default: "
        "campaign.drift_threshold).",
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """GPUs that run slower in production than their PM-scores say: re-measure these.

    Each job's runtime is compared with the same application's runs on other GPUs, scaled
    by the PM-scores of the GPUs used (the slowest one sets the pace); a GPU whose runs are
    consistently slower by more than the threshold is listed, with a targeted campaign plan.
    GPUs that hit thermal or hardware slowdowns while the campaign measured them are listed
    too: their PM-scores were taken under a cooling fault.
    """
    st = state(ctx)
    settings = site_campaign_settings(st)
    request = DriftRequest(
        campaign=campaign,
        records=records,
        labels=labels,
        threshold=settings.drift_threshold if threshold is None else threshold,
        min_runs=min_runs or settings.drift_min_runs,
    )
    with _errors(), st.store(create=False) as store:
        findings = production_drift(store, request, st.config)
    if as_json:
        print_json(findings.to_dict())
        return
    detector = findings.detector
    console.print(
        f"campaign {findings.campaign_id}: {findings.jobs_used} production job(s) "
        f"compared, {len(detector.gpus_)} GPU(s) judged (threshold "
        f"{detector.threshold:.1%}, at least {detector.min_runs} runs)"
    )
    for why, n in sorted(findings.reasons.items(), key=lambda x: -x[1]):
        console.print(f"  {n} job(s) left out: {why}", highlight=False)
    print_campaign_slowdowns(findings.clock, findings.hot_command)
    print_drift(findings.found, findings.where, findings.clock, findings.command)
