"""`slurm-pal campaign ...`: profiling campaigns through Slurm, from plan to active labels.

plan -> submit (job arrays; progress) -> collect (checks, ingest into the store) -> diff ->
activate; and suggest (GPUs drifting in production: a targeted re-measurement). The
campaign's files live in one directory per campaign (see :mod:`slurm_pal.campaigns.workspace`);
the store only sees what ``collect`` ingests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import typer
from rich.table import Table

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.slurm.parse import gpu_counts
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.advisor.jobdesc import JobDescription
from slurm_pal.campaigns.settings import CampaignSettings
from slurm_pal.campaigns.slurm import CampaignSlurm, SlurmCommands, SlurmError
from slurm_pal.campaigns.workspace import (
    COLLECTED_DIR,
    SBATCH_DIR,
    CampaignError,
    CampaignPlan,
    Submission,
    add_submission,
    campaigns_root,
    check_campaign_id,
    create_campaign,
    default_benchmarks,
    default_campaign_id,
    job_name,
    load_plan,
    parse_commands,
    read_records,
    read_submissions,
)
from slurm_pal.cli.common import (
    AppState,
    console,
    err_console,
    fail,
    fmt_score,
    print_json,
    reported_errors,
    state,
)
from slurm_pal.core.campaigns import (
    CLOCK_EVENTS_UNKNOWN,
    DEFAULT_TOLERANCE,
    CampaignCheck,
    CampaignDiff,
    ClockEventSummary,
    GpuKey,
    PlannedGpu,
    TaskProgress,
    check_campaign,
    diff_campaigns,
    gpus_from_hostlist,
    measurement_rows,
    node_unavailable,
    progress_counts,
    summarize_clock_events,
    task_progress,
    waiting_for_unavailable_nodes,
)
from slurm_pal.core.drift import DriftDetector, JobInfo, runs_from_records
from slurm_pal.core.hostlist import compress as compress_hostlist
from slurm_pal.core.hostlist import expand as expand_hostlist
from slurm_pal.site.render import plan_from_store

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
            fail(str(exc).replace("[", "\\["))


def site_campaign_settings(st: AppState) -> CampaignSettings:
    """The site config's ``[campaign]`` section (``SiteConfig.campaign``, loaded through
    :func:`slurm_pal.campaigns.settings.load_campaign_settings`), else the defaults."""
    found = getattr(st.config, "campaign", None)
    return found if isinstance(found, CampaignSettings) else CampaignSettings()


def _root(st: AppState, root: Path | None) -> Path:
    return campaigns_root(root, st.db_path, site_campaign_settings(st).root)


# -- plan ------------------------------------------------------------------------------------


@app.command()
def plan(
    ctx: typer.Context,
    nodes: str | None = typer.Option(
        None,
        "--nodes",
        help="Nodes to measure, as a Slurm hostlist (e.g. gpu[01-16]); default: every node "
        "with GPUs (in --partition), as Slurm reports them.",
    ),
    gpus_per_node: int | None = typer.Option(
        None,
        "--gpus-per-node",
        help="GPUs per node (device minors 0..N-1 are measured); default: each node's GPU "
        "count from Slurm.",
    ),
    exclude: str | None = typer.Option(
        None, "--exclude", help="Nodes to leave out (hostlist), e.g. drained ones."
    ),
    only: str | None = typer.Option(
        None,
        "--only",
        help="Measure only these GPUs, NODE:INDEX,... (e.g. from 'campaign suggest'); each "
        "task still holds its whole node.",
    ),
    partition: str | None = typer.Option(
        None, "--partition", help="Slurm partition (default: campaign.partition)."
    ),
    classes: str | None = typer.Option(
        None, "--classes", help="Comma-separated job classes (default: all site classes)."
    ),
    repeats: int | None = typer.Option(
        None, "--repeats", min=1, help="Runs per GPU and class (default: campaign.repeats, 3)."
    ),
    command: list[str] = typer.Option(
        [],
        "--command",
        help="CLASS=COMMAND: bring your own benchmark (prints PAL_DURATION_S=<s>). "
        "{python} and {bench_dir} are filled in. Repeatable; overrides [campaign.commands].",
    ),
    campaign_id: str | None = typer.Option(
        None, "--id", help="Campaign id (default: c<UTC date-time>)."
    ),
    gpu_model: str | None = typer.Option(
        None, "--gpu-model", help="GPU model name for the labels (default: site config)."
    ),
    time_limit: str | None = typer.Option(
        None, "--time", help="Slurm time limit per task (default: campaign.time_limit, 01:00:00)."
    ),
    run_timeout: float | None = typer.Option(
        None,
        "--run-timeout",
        min=1,
        help="Seconds one benchmark run may take (default: campaign.run_timeout_s, 1800).",
    ),
    warmup_s: float | None = typer.Option(
        None,
        "--warmup-s",
        min=0,
        help="Benchmark warm-up seconds before the timed window (default: campaign.warmup_s, "
        "10); passed to the benchmarks as PAL_WARMUP_S.",
    ),
    measure_s: float | None = typer.Option(
        None,
        "--measure-s",
        min=0.001,
        help="Seconds of the timed window (default: campaign.measure_s, 20); passed as "
        "PAL_MEASURE_S.",
    ),
    python: str | None = typer.Option(
        None,
        "--python",
        help="Python on the compute nodes, runs runner and benchmarks (default: "
        "campaign.python, python3).",
    ),
    sbatch_arg: list[str] = typer.Option(
        [],
        "--sbatch-arg",
        help="Extra #SBATCH line, e.g. --account=ops. Repeatable; added to campaign.sbatch_args.",
    ),
    root: Path | None = ROOT_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Write a campaign: one job array per node, one task per GPU, batch scripts rendered."""
    st = state(ctx)
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
            gpus, notes = _gpus_from_slurm(nodes, plan_partition)
        if exclude:
            skip = set(expand_hostlist(exclude))
            gpus = [g for g in gpus if g.node not in skip]
            if not gpus:
                fail(f"--exclude {exclude} leaves no node to measure")
        counts: dict[str, int] = {}
        if only:
            wanted = parse_gpu_list(only)
            known = {g.key for g in gpus}
            unknown = sorted(wanted - known)
            if unknown:
                fail(
                    f"--only names GPU(s) {', '.join(f'{n}:{i}' for n, i in unknown)} that "
                    "the planned nodes do not have"
                )
            for g in gpus:
                counts[g.node] = counts.get(g.node, 0) + 1
            gpus = [g for g in gpus if g.key in wanted]
            counts = {n: c for n, c in counts.items() if any(g.node == n for g in gpus)}
        names = tuple(c.strip() for c in classes.split(",")) if classes else cfg.classes.names
        unknown = [c for c in names if c not in cfg.classes.names]
        if unknown or not names or "" in names:
            fail(
                f"unknown class(es) {', '.join(unknown) or '(empty)'}; valid classes: "
                f"{', '.join(cfg.classes.names)} (classes.names in the site config, {cfg.source})"
            )
        if len(set(names)) != len(names):
            fail(f"--classes names a class twice: {classes}")
        commands = {c: cmd for c, cmd in settings.commands if c in names}
        commands |= parse_commands(command)
        repeats = repeats or settings.repeats
        benchmarks = default_benchmarks(names, commands)
        the_plan = CampaignPlan(
            campaign=check_campaign_id(campaign_id or default_campaign_id()),
            classes=names,
            repeats=repeats,
            benchmarks=benchmarks,
            gpus=tuple(gpus),
            gpu_model=gpu_model or cfg.profiling.gpu_model,
            partition=plan_partition,
            time_limit=time_limit or settings.time_limit,
            run_timeout_s=run_timeout or settings.run_timeout_s,
            python=python or settings.python,
            sbatch_args=(*settings.sbatch_args, *sbatch_arg),
            node_gpu_counts=counts,
            warmup_s=settings.warmup_s if warmup_s is None else warmup_s,
            measure_s=settings.measure_s if measure_s is None else measure_s,
        )
        window_s = the_plan.warmup_s + the_plan.measure_s
        if window_s >= the_plan.run_timeout_s:
            fail(
                f"warm-up + timed window ({window_s:g} s) do not fit in one run's timeout "
                f"({the_plan.run_timeout_s:g} s): raise --run-timeout or shorten them"
            )
        directory = create_campaign(_root(st, root), the_plan)
    shared = [b.name for b in benchmarks.values()]
    if len(set(shared)) < len(shared):
        notes.append(
            "several classes run the same default benchmark, so they measure the same thing; "
            "give each class its own with --command CLASS=COMMAND"
        )
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
        f"planned campaign [bold]{the_plan.campaign}[/] in {directory}: {len(gpus)} GPUs on "
        f"{len(the_plan.nodes)} node(s), classes {','.join(names)}, {repeats} run(s) each"
    )
    table = Table(title="benchmarks", title_justify="left")
    table.add_column("class")
    table.add_column("benchmark")
    table.add_column("command")
    for job_class, bench in benchmarks.items():
        table.add_row(job_class, bench.name, bench.command)
    console.print(table)
    for note in notes:
        console.print(f"note: {note}")
    console.print(f"next: slurm-pal campaign submit {the_plan.campaign}")


# -- submit / status -------------------------------------------------------------------------


def _progress(
    the_plan: CampaignPlan, directory: Path, slurm: CampaignSlurm, *, need_queue: bool = True
) -> tuple[list[TaskProgress], list[str]]:
    """Every task's state: Slurm's queue first, then the records.

    Without ``need_queue`` a failing squeue only costs the queued states (a warning), so
    ``status`` works where Slurm is not reachable; ``submit`` must know the queue, or it
    would submit queued tasks twice.
    """
    submissions = read_submissions(directory)
    queued: dict[GpuKey, tuple[str, str]] = {}
    problems: list[str] = []
    if submissions:
        by_job = {s.job_id: s.node for s in submissions}
        names = [job_name(the_plan.campaign, node) for node in {s.node for s in submissions}]
        try:
            in_queue = dict(slurm.queued(names))
        except SlurmError as exc:
            if need_queue:
                raise
            in_queue = {}
            problems.append(f"Slurm queue unknown, states come from the records only: {exc}")
        for task, value in in_queue.items():
            job, _, index = task.partition("_")
            if job in by_job and index.isdigit():
                queued[(by_job[job], int(index))] = value
    records, record_problems = read_records(directory, the_plan.campaign)
    problems += record_problems
    sent = {(s.node, g) for s in submissions for g in s.gpus}
    tasks = task_progress(the_plan.gpus, the_plan.classes, the_plan.repeats, records, queued, sent)
    return tasks, problems


def _counts_line(tasks: list[TaskProgress]) -> str:
    counts = progress_counts(tasks)
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no tasks"


def _progress_table(tasks: list[TaskProgress], the_plan: CampaignPlan) -> Table:
    table = Table(
        title=f"campaign {the_plan.campaign}: {_counts_line(tasks)}", title_justify="left"
    )
    for col in ("node", "GPU", "state", "ok runs", "failed runs", "Slurm reason"):
        table.add_column(col)
    total = len(the_plan.classes) * the_plan.repeats
    for t in tasks:
        if t.state == "done":
            continue
        table.add_row(
            t.node,
            str(t.gpu_index),
            t.state,
            f"{t.ok_runs}/{total}",
            str(t.failed_runs),
            t.slurm_reason,
        )
    return table


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
        tasks, _ = _progress(the_plan, directory, slurm)
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
        tasks, problems = _progress(the_plan, directory, slurm)
        last = ""
        while wait and not dry_run and any(t.state in ("pending", "running") for t in tasks):
            if all(t.state != "running" for t in tasks) and waiting_for_unavailable_nodes(
                tasks, _node_states(slurm, {t.node for t in tasks if t.state == "pending"})
            ):
                nodes = sorted({t.node for t in tasks if t.state == "pending"})
                err_console.print(
                    f"stopped waiting: the queued tasks wait for unavailable node(s) "
                    f"{', '.join(nodes)} (drained or down). Resume them, or collect the rest "
                    f"with 'slurm-pal campaign collect {campaign} --allow-missing'",
                    highlight=False,
                )
                break
            line = _counts_line(tasks)
            if line != last and not as_json:
                console.print(f"{time.strftime('%H:%M:%S')} {line}")
                last = line
            time.sleep(poll)
            tasks, problems = _progress(the_plan, directory, slurm)
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
    _print_progress(tasks, the_plan, problems)


def _node_states(slurm: CampaignSlurm, nodes: set[str]) -> dict[str, str] | None:
    """sinfo's node states, or None (then the queue's reasons decide) when sinfo fails."""
    try:
        return dict(slurm.node_states(nodes))
    except SlurmError as exc:
        err_console.print(f"warning: node states unknown ({exc})", highlight=False)
        return None


def _gpus_from_slurm(
    nodes: str | None, partition: str | None
) -> tuple[list[PlannedGpu], list[str]]:
    """Each node's GPUs as Slurm reports them (device minors 0..N-1), and notes on nodes that
    cannot run a task now (drained, down): their tasks would wait."""
    wanted = set(expand_hostlist(nodes)) if nodes else None
    try:
        found = CliStateReader().nodes(wanted)
    except SlurmQueryError as exc:
        raise CampaignError(
            f"cannot read the nodes from Slurm ({exc}); give them with --nodes HOSTLIST "
            "--gpus-per-node N"
        ) from exc
    if partition:
        found = [n for n in found if partition in n.partitions]
    gpus: list[PlannedGpu] = []
    notes: list[str] = []
    for n in sorted(found, key=lambda n: n.name):
        count = sum(gpu_counts(n.gres).values())
        if count == 0:
            continue
        gpus += [PlannedGpu(n.name, i) for i in range(count)]
        long_state = " ".join([n.state, *(f.lower() for f in n.flags)])
        if node_unavailable(long_state):
            notes.append(
                f"node {n.name} is {long_state.strip()}"
                + (f" ({n.reason})" if n.reason else "")
                + ": its tasks wait until it is resumed (or plan with --exclude)"
            )
    missing = sorted(wanted - {n.name for n in found}) if wanted else []
    if missing:
        raise CampaignError(
            f"Slurm does not know node(s) {', '.join(missing)}"
            + (f" in partition {partition}" if partition else "")
        )
    if not gpus:
        raise CampaignError(
            "Slurm reports no nodes with GPUs"
            + (f" in partition {partition}" if partition else "")
            + (f" among {nodes}" if nodes else "")
        )
    return gpus, notes


def parse_gpu_list(text: str) -> set[GpuKey]:
    """``NODE:INDEX,NODE:INDEX`` -> {(node, index)}; the error shows the expected form."""
    out: set[GpuKey] = set()
    for item in filter(None, (x.strip() for x in text.split(","))):
        node, sep, index = item.rpartition(":")
        if not sep or not node or not index.isdigit():
            raise CampaignError(
                f"--only item {item!r} must look like NODE:INDEX (device minor), e.g. gpu07:2"
            )
        out.add((node, int(index)))
    if not out:
        raise CampaignError("--only names no GPU; give NODE:INDEX,... e.g. gpu07:2,gpu11:0")
    return out


def _print_progress(tasks: list[TaskProgress], the_plan: CampaignPlan, problems: list[str]) -> None:
    if all(t.state == "done" for t in tasks):
        console.print(
            f"campaign {the_plan.campaign}: all {len(tasks)} tasks done; next: "
            f"slurm-pal campaign collect {the_plan.campaign}"
        )
    else:
        console.print(_progress_table(tasks, the_plan))
    for p in problems:
        err_console.print(f"warning: {p}", highlight=False)


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
        tasks, problems = _progress(
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
    _print_progress(tasks, the_plan, problems)


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
        if tolerance is None:
            tolerance = site_campaign_settings(st).tolerance
        the_plan, directory = load_plan(_root(st, root), campaign)
        records, problems = read_records(directory, the_plan.campaign)
        check = check_campaign(
            the_plan.gpus, the_plan.classes, the_plan.repeats, records, tolerance=tolerance
        )
        target = check_campaign_id(store_id or the_plan.campaign)
        blocked = not check.complete or bool(problems)
        result = None
        csv_path = None
        active_before: str | None = None
        with st.store() as store:
            known = {c.id for c in store.campaigns()}
            if not (blocked and not allow_missing) and check.ok_runs:
                csv_path = directory / COLLECTED_DIR / f"{target}.csv"
                text = measurement_rows(check.ok_runs, the_plan.gpu_model).to_csv(index=False)
                same = csv_path.is_file() and csv_path.read_text(encoding="utf-8") == text
                if target in known and same:
                    if as_json:
                        print_json(check.to_dict() | {"campaign": campaign, "unchanged": True})
                    else:
                        console.print(
                            f"campaign {target!r} is already in the store with exactly these "
                            "records; nothing to do"
                        )
                    raise typer.Exit(0)
                if target in known:
                    n = 2
                    while f"{the_plan.campaign}-v{n}" in known:
                        n += 1
                    fail(
                        f"campaign {target!r} is already in the store {st.db_path}; collecting "
                        f"again would mix old and new rows. To ingest the current records as a "
                        f"new version: slurm-pal campaign collect {campaign} "
                        f"--as {the_plan.campaign}-v{n}"
                    )
                csv_path.parent.mkdir(parents=True, exist_ok=True)
                csv_path.write_text(text, encoding="utf-8")
                file = read_campaign_csv(csv_path, gpu_model=the_plan.gpu_model)
                active_before = store.active_campaign_id()
                result = store.ingest(
                    [file],
                    campaign_id=target,
                    class_order=cfg.classes.names,
                    binner=cfg.binning.binner(),
                    description=f"Slurm campaign {the_plan.campaign}: "
                    f"{check.planned_gpus} GPUs planned, {len(check.ok_runs)} ok runs",
                    clock_events=[r.clock_event_row() for r in check.ok_runs],
                )
    report = check.to_dict() | {"campaign": campaign, "record_problems": problems}
    if result is not None:
        report["ingested"] = {
            "store_campaign": result.campaign_id,
            "rows": result.rows,
            "activated": result.activated,
            "csv": str(csv_path),
        }
    if as_json:
        print_json(report)
    else:
        _print_check(check, problems)
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
                else f"; compare with 'slurm-pal campaign diff {active_before} "
                f"{result.campaign_id}', then "
                f"'slurm-pal campaign activate {result.campaign_id}'"
            )
        )


def _print_check(check: CampaignCheck, problems: list[str]) -> None:
    console.print(
        f"{check.planned_gpus} GPUs planned x {len(check.classes)} class(es) x {check.repeats} "
        f"run(s): {len(check.ok_runs)} ok runs"
    )
    if check.missing:
        table = Table(
            title=f"{len(check.missing_gpus)} GPU(s) missing a class", title_justify="left"
        )
        for col in ("node", "GPU", "class", "failed runs"):
            table.add_column(col)
        for m in check.missing:
            table.add_row(m.node, str(m.gpu_index), m.job_class, str(m.failed_runs))
        console.print(table)
    if check.failures:
        table = Table(title=f"{len(check.failures)} failed run(s)", title_justify="left")
        for col in ("node", "GPU", "class", "run", "exit", "reason", "stderr (last line)", "job"):
            table.add_column(col)
        for f in check.failures:
            tail = f.stderr_tail.strip().splitlines()
            table.add_row(
                f.node,
                str(f.gpu_index),
                f.job_class,
                str(f.repeat),
                "-" if f.exit_code is None else str(f.exit_code),
                f.reason,
                tail[-1] if tail else "",
                f.slurm_job_id,
            )
        console.print(table)
    if check.disagreements:
        table = Table(
            title=f"{len(check.disagreements)} GPU/class(es) whose repeats disagree by more than "
            f"{check.tolerance:.0%}: check for throttling (hardware ticket?)",
            title_justify="left",
        )
        for col in ("node", "GPU", "uuid", "class", "runs (s)", "max/min", "SM clock MHz"):
            table.add_column(col)
        for d in check.disagreements:
            clocks = (
                "-"
                if d.sm_clock_range is None
                else (f"{d.sm_clock_range[0]:.0f}-{d.sm_clock_range[1]:.0f}")
            )
            table.add_row(
                d.node,
                str(d.gpu_index),
                d.uuid,
                d.job_class,
                " ".join(f"{x:.4g}" for x in d.durations),
                f"{d.ratio:.3f}",
                clocks,
            )
        console.print(table)
    if check.slowdowns:
        table = Table(
            title=f"{len(check.slowdowns)} GPU(s) hit thermal or hardware clock slowdowns while "
            "measured: a cooling/power fault to fix, not a PM-score (their runs are ingested "
            "as measured; re-measure after the fix with 'campaign plan --only')",
            title_justify="left",
        )
        for col in ("node", "GPU", "uuid", "reasons", "runs", "classes", "worst run"):
            table.add_column(col)
        for sd in check.slowdowns:
            table.add_row(
                sd.node,
                str(sd.gpu_index),
                sd.uuid,
                ", ".join(sd.events),
                f"{sd.runs}/{sd.of_runs}",
                ",".join(sd.classes),
                f"{sd.max_share:.0%} of readings",
            )
        console.print(table)
        only = ",".join(f"{sd.node}:{sd.gpu_index}" for sd in check.slowdowns)
        console.print(f"re-measure them later with: slurm-pal campaign plan --only {only}")
    if check.clock_events_unknown:
        n_runs = sum(k for _, _, k in check.clock_events_unknown)
        err_console.print(
            f"note: {n_runs} run(s) on {len(check.clock_events_unknown)} GPU(s) have no "
            "clock-event readings (no NVML on the node, or a runner from before they were "
            "recorded): whether they hit thermal or hardware slowdowns is unknown",
            highlight=False,
        )
    for node, index, classes_short in _short(check):
        console.print(
            f"{node} GPU {index}: fewer runs than planned for {classes_short} (task cut short: "
            "time limit, node lost?)"
        )
    for node, index, uuids in check.uuid_conflicts:
        err_console.print(f"warning: {node} GPU {index} reported several UUIDs: {', '.join(uuids)}")
    if check.location_ids:
        names = ", ".join(u for _, _, u in check.location_ids[:4])
        more = len(check.location_ids) - 4
        err_console.print(
            f"note: {len(check.location_ids)} GPU(s) have no NVML UUID (NVML unavailable on the "
            f"node) and are named by location ({names}{f', +{more}' if more > 0 else ''}): "
            "their scores follow the slot, so a swapped GPU would go unnoticed",
            highlight=False,
        )
    for r in check.unplanned:
        err_console.print(
            f"warning: record for {r.node} GPU {r.gpu_index} class {r.job_class} run {r.repeat} "
            "is not in the plan; ignored",
            highlight=False,
        )
    for p in problems:
        err_console.print(f"warning: {p}", highlight=False)


def _short(check: CampaignCheck) -> list[tuple[str, int, str]]:
    grouped: dict[tuple[str, int], list[str]] = {}
    for node, index, job_class, n in check.short:
        grouped.setdefault((node, index), []).append(f"{job_class} ({n}/{check.repeats})")
    return [(n, i, ", ".join(c)) for (n, i), c in sorted(grouped.items())]


# -- diff / activate -------------------------------------------------------------------------


def _clock_events(store, campaign_id: str, scores: pd.DataFrame) -> ClockEventSummary:  # type: ignore[no-untyped-def]
    """The stored campaign's slowdowns, its runs named by the UUIDs its scores use."""
    rows = store.clock_events(campaign_id)
    canonical = {u: store.canonical_uuid(campaign_id, u) for u in {r.uuid for r in rows}}
    runs = [replace(r, uuid=canonical[r.uuid]) for r in rows]
    measured = scores.loc[scores["measured"], "uuid"].astype(str)
    return summarize_clock_events(campaign_id, measured, runs)


def _diff(store, old: str, new: str) -> CampaignDiff:  # type: ignore[no-untyped-def]
    for c in (old, new):
        store.resolve_campaign(c)

    def label_scores(campaign_id: str) -> dict[str, dict[str, float]]:
        return {str(r["label"]): dict(r["scores"]) for r in store.labels(campaign_id)}

    old_scores, new_scores = store.gpu_scores(old), store.gpu_scores(new)
    return diff_campaigns(
        old,
        new,
        old_scores,
        new_scores,
        store.gpu_labels(old),
        store.gpu_labels(new),
        label_scores(old),
        label_scores(new),
        old_clock_events=_clock_events(store, old, old_scores),
        new_clock_events=_clock_events(store, new, new_scores),
    )


RESTART_ADVICE = (
    "re-render the Slurm config ('slurm-pal site render') and restart slurmd on these nodes "
    "and slurmctld: gres.conf Type= labels are read at start"
)


@app.command()
def diff(
    ctx: typer.Context,
    old: str = typer.Argument(..., help="Store campaign id (e.g. the active one)."),
    new: str = typer.Argument(..., help="Store campaign id to compare with."),
    as_json: bool = JSON_OPT,
) -> None:
    """GPUs that changed bin, new outliers, and the label changes a switch would make."""
    st = state(ctx)
    with _errors(), st.store() as store:
        d = _diff(store, old, new)
    if as_json:
        print_json(d.to_dict())
        return
    _print_diff(d)


def _print_diff(d: CampaignDiff) -> None:
    console.print(f"campaign [bold]{d.old}[/] -> [bold]{d.new}[/]")
    if d.new_outliers:
        table = Table(
            title=f"{len(d.new_outliers)} new outlier(s): hardware-ticket candidates",
            title_justify="left",
        )
        for col in ("uuid", "node", "GPU", "class", "old bin", "PM-score"):
            table.add_column(col)
        for c in d.new_outliers:
            table.add_row(
                c.uuid, c.node, _idx(c.gpu_index), c.job_class, c.old_bin, fmt_score(c.new_score)
            )
        console.print(table)
    if d.bin_changes:
        table = Table(
            title=f"{len(d.bin_changes)} bin change(s) (GPU x class)", title_justify="left"
        )
        for col in ("uuid", "node", "GPU", "class", "bin", "PM-score"):
            table.add_column(col)
        for c in d.bin_changes:
            table.add_row(
                c.uuid,
                c.node,
                _idx(c.gpu_index),
                c.job_class,
                f"{c.old_bin} -> {c.new_bin}",
                f"{fmt_score(c.old_score)} -> {fmt_score(c.new_score)}",
            )
        console.print(table)
    else:
        console.print("no GPU changed bin")
    if d.cleared_outliers:
        console.print(
            f"{len(d.cleared_outliers)} outlier(s) of {d.old} are no longer outliers: "
            + ", ".join(f"{c.uuid} ({c.job_class})" for c in d.cleared_outliers)
        )
    if d.only_old or d.only_new:
        console.print(
            f"GPUs only in {d.old}: {', '.join(d.only_old) or 'none'}; "
            f"only in {d.new}: {', '.join(d.only_new) or 'none'}"
        )
    _print_diff_slowdowns(d)
    _print_label_changes(d)


UNKNOWN_CLOCK_EVENTS = (
    "no per-run clock-event readings kept: collected before slurm-pal kept them, ingested from "
    "a CSV, or no NVML on the nodes"
)


def _slowdown_state(summary: ClockEventSummary, uuid: str) -> str:
    events = summary.gpu_state(uuid)
    if events is None:
        return "unknown"
    return ", ".join(events) if events else "none"


def _clock_events_line(summary: ClockEventSummary) -> str:
    if summary.status == CLOCK_EVENTS_UNKNOWN:
        return f"unknown ({UNKNOWN_CLOCK_EVENTS})"
    seen = f"{len(summary.slowdowns)} GPU(s)" if summary.slowdowns else "none"
    if summary.unknown_gpus:
        seen += (
            f"; unknown for {len(summary.unknown_gpus)} GPU(s) ({summary.unknown_runs} run(s) "
            "without readings)"
        )
    return seen


def _print_diff_slowdowns(d: CampaignDiff) -> None:
    """GPUs that hit thermal/hardware slowdowns in either campaign; a campaign without
    readings is said to be unknown, never shown as clean."""
    old_s, new_s = d.old_clock_events, d.new_clock_events
    if old_s is None or new_s is None:
        return
    both = (*old_s.slowdowns, *new_s.slowdowns)
    hot = {s.uuid: s for s in both}
    if hot:
        table = Table(
            title=f"{len(hot)} GPU(s) hit thermal or hardware clock slowdowns while measured: "
            "a cooling/power fault, their PM-score there is not what jobs get",
            title_justify="left",
        )
        for col in ("uuid", "node", "GPU", f"in {d.old}", f"in {d.new}", "worst run"):
            table.add_column(col)
        for uuid, s in sorted(hot.items()):
            worst = max(x.max_share for x in both if x.uuid == uuid)
            table.add_row(
                uuid,
                s.node,
                str(s.gpu_index),
                _slowdown_state(old_s, uuid),
                _slowdown_state(new_s, uuid),
                f"{worst:.0%} of readings",
            )
        console.print(table)
    for summary in (old_s, new_s):
        console.print(
            f"thermal/hardware slowdowns in {summary.campaign}: {_clock_events_line(summary)}",
            highlight=False,
        )


def _print_label_changes(d: CampaignDiff) -> None:
    if d.label_changes:
        table = Table(
            title=f"{len(d.label_changes)} GPU(s) change gres.conf Type= label",
            title_justify="left",
        )
        for col in ("uuid", "node", "GPU", "label"):
            table.add_column(col)
        for c in d.label_changes:
            table.add_row(
                c.uuid, c.node, _idx(c.gpu_index), f"{c.old_label or '-'} -> {c.new_label or '-'}"
            )
        console.print(table)
        console.print(
            f"restart needed on {len(d.restart_nodes)} node(s): "
            f"{', '.join(d.restart_nodes)}; {RESTART_ADVICE}"
        )
    else:
        console.print("labels unchanged: switching needs no Slurm restart")
    if d.label_score_changes:
        console.print(
            f"{len(d.label_score_changes)} label score(s) change (advisor table only, no restart)"
        )


def _idx(value: int | None) -> str:
    return "-" if value is None else str(value)


@app.command()
def activate(
    ctx: typer.Context,
    campaign: str = typer.Argument(..., help="Store campaign id."),
    as_json: bool = JSON_OPT,
) -> None:
    """Make a campaign the one the advisor uses; shows what changes against the active one."""
    st = state(ctx)
    with _errors(), st.store() as store:
        store.resolve_campaign(campaign)
        previous = store.active_campaign_id()
        d = _diff(store, previous, campaign) if previous and previous != campaign else None
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
        _print_label_changes(d)


# -- suggest ---------------------------------------------------------------------------------


def read_production_jsonl(path: Path) -> tuple[list[dict], list[dict]]:
    """(hook records, advisor decisions) from a JSON-lines export.

    A line is a Prolog/Epilog record (PROTOCOL.md op ``record``: ``kind`` prolog/epilog), or a
    row of ``advisor_decisions``: ``{"kind": "decision", "job_id", "job": {...}, "answer":
    {...}}``. Errors name the line.
    """
    records: list[dict] = []
    decisions: list[dict] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CampaignError(f"cannot read --records {path}: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise CampaignError(f"{path}:{number}: not JSON ({exc})") from exc
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind in ("prolog", "epilog"):
            records.append(item)
        elif kind == "decision":
            decisions.append(item)
        else:
            raise CampaignError(
                f"{path}:{number}: 'kind' must be prolog, epilog or decision, got {kind!r}"
            )
    return records, decisions


def jobs_from_decisions(decisions: list[dict]) -> tuple[dict[str, JobInfo], dict[str, str]]:
    """Job id -> (history key, class) from the advisor's decisions; why others were left out.

    The key is what the advisor resolved classes by: (user, job name, script sha256).
    """
    jobs: dict[str, JobInfo] = {}
    skipped: dict[str, str] = {}
    for d in decisions:
        job_id = str(d.get("job_id") or "")
        answer = d.get("answer") if isinstance(d.get("answer"), dict) else {}
        job_class = answer.get("class")  # type: ignore[union-attr]
        if not job_id:
            continue
        if not isinstance(job_class, str) or not job_class:
            skipped[job_id] = "the advisor gave it no class"
            continue
        try:
            desc = JobDescription.from_wire(d.get("job") or {})
        except (ValueError, TypeError) as exc:
            skipped[job_id] = f"unreadable job description ({exc})"
            continue
        key = "|".join((desc.user, desc.name, desc.script_sha256 or ""))
        jobs[job_id] = JobInfo(key, job_class)
    return jobs, skipped


def _gpu_ids_from_labels(path: Path) -> dict[tuple[str, int], str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            (str(node), int(g["slurm_index"])): str(g["uuid"])
            for node, gpus in data["nodes"].items()
            for g in gpus
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CampaignError(
            f"cannot read labels {path} (labels.json of 'slurm-pal site render'): {exc}"
        ) from exc


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
    with _errors(), st.store() as store:
        campaign_id = store.resolve_campaign(campaign)
        frame = store.gpu_scores(campaign_id)
        clock = _clock_events(store, campaign_id, frame)
        scores: dict[str, dict[str, float]] = {}
        where: dict[str, tuple[str, int | None]] = {}
        for r in frame.itertuples(index=False):
            scores.setdefault(str(r.uuid), {})[str(r.job_class)] = float(r.pm_score)
            where[str(r.uuid)] = (str(r.node), None if pd.isna(r.gpu_index) else int(r.gpu_index))
        labels_path = labels or (
            Path(st.config.advisor.labels_file) if st.config.advisor.labels_file else None
        )
        if labels_path is not None:
            gpu_ids = _gpu_ids_from_labels(labels_path)
        else:
            gpu_ids = {
                (g.node, g.slurm_index): g.uuid for g in plan_from_store(store, campaign_id).gpus
            }
        if records is None:  # what the advisor service kept (tables job_records and
            hook_records = store.job_records()  # advisor_decisions)
            decisions = [d for d in store.decisions() if d.get("job_id") is not None]
        else:
            hook_records, decisions = read_production_jsonl(records)
        jobs, skipped = jobs_from_decisions(decisions)
        runs, not_paired = runs_from_records(hook_records, jobs, gpu_ids)
        skipped |= {j: why for j, why in not_paired.items() if j not in skipped}
        runs = [
            replace(r, gpus=tuple(store.canonical_uuid(campaign_id, g) for g in r.gpus))
            for r in runs
        ]
        detector = DriftDetector(
            threshold=settings.drift_threshold if threshold is None else threshold,
            min_runs=min_runs or settings.drift_min_runs,
        ).fit(runs, scores)
    skipped |= detector.skipped_
    found = detector.drifting_gpus()
    targets = sorted(
        {where[d.gpu] for d in found if d.gpu in where and where[d.gpu][1] is not None}
    )
    command = _targeted_plan(targets, frame, campaign_id) if targets else None
    hot: list[tuple[str, int | None]] = [(s.node, s.gpu_index) for s in clock.slowdowns]
    hot_command = _targeted_plan(hot, frame, campaign_id, "cooling") if hot else None
    reasons: dict[str, int] = {}
    for why in skipped.values():
        reasons[why] = reasons.get(why, 0) + 1
    if as_json:
        print_json(
            {
                "campaign": campaign_id,
                "threshold": detector.threshold,
                "min_runs": detector.min_runs,
                "jobs_used": len(runs) - len(detector.skipped_),
                "jobs_skipped": reasons,
                "drifting": [
                    d.to_dict()
                    | {
                        "node": where.get(d.gpu, ("", None))[0],
                        "gpu_index": where.get(d.gpu, ("", None))[1],
                        "campaign_slowdown": _json_state(clock, d.gpu),
                    }
                    for d in found
                ],
                "gpus_judged": len(detector.gpus_),
                "suggested_plan": command,
                "clock_events": clock.to_dict(),
                "slowdown_plan": hot_command,
            }
        )
        return
    console.print(
        f"campaign {campaign_id}: {len(runs) - len(detector.skipped_)} production job(s) "
        f"compared, {len(detector.gpus_)} GPU(s) judged (threshold "
        f"{detector.threshold:.1%}, at least {detector.min_runs} runs)"
    )
    for why, n in sorted(reasons.items(), key=lambda x: -x[1]):
        console.print(f"  {n} job(s) left out: {why}", highlight=False)
    _print_campaign_slowdowns(clock, hot_command)
    if not found:
        console.print("no GPU drifts: nothing to re-measure")
        return
    table = Table(
        title=f"{len(found)} GPU(s) slower than their PM-scores say", title_justify="left"
    )
    for col in ("GPU", "node", "index", "runs", "apps", "slowdown", "runs slower", "expected s",
                "observed s", "campaign slowdowns"):  # fmt: skip
        table.add_column(col)
    for d in found:
        node, index = where.get(d.gpu, ("", None))
        table.add_row(
            d.gpu,
            node,
            _idx(index),
            str(d.runs),
            str(d.apps),
            f"{d.median_residual:+.1%}",
            f"{d.share_slower:.0%}",
            f"{d.expected_s:.4g}",
            f"{d.observed_s:.4g}",
            _slowdown_state(clock, d.gpu),
        )
    console.print(table)
    if command:
        console.print(f"re-measure them: {command}", highlight=False, soft_wrap=True)


def _json_state(summary: ClockEventSummary, uuid: str) -> list[str] | None:
    """A GPU's slowdown reasons in the campaign for --json: [] clean, None unknown."""
    events = summary.gpu_state(uuid)
    return None if events is None else list(events)


def _print_campaign_slowdowns(summary: ClockEventSummary, command: str | None) -> None:
    console.print(
        f"thermal/hardware slowdowns while {summary.campaign} measured: "
        f"{_clock_events_line(summary)}",
        highlight=False,
    )
    if summary.slowdowns:
        gpus = ", ".join(
            f"{s.node}:{s.gpu_index} ({', '.join(s.events)})" for s in summary.slowdowns
        )
        console.print(
            f"  {gpus}: PM-scores taken under a cooling/power fault; after the fix, "
            f"re-measure: {command}",
            highlight=False,
            soft_wrap=True,
        )


def _targeted_plan(  # type: ignore[no-untyped-def]
    targets: list[tuple[str, int | None]], frame, campaign_id: str, suffix: str = "recheck"
) -> str:
    """The ``campaign plan`` command that measures just these GPUs (whole nodes held)."""
    nodes = sorted({n for n, _ in targets})
    per_node = frame[frame["node"].isin(nodes)].groupby("node")["gpu_index"].nunique()
    gpus = int(per_node.max()) if len(per_node) else 1
    only = ",".join(f"{n}:{i}" for n, i in targets)
    return (
        f"slurm-pal campaign plan --nodes {compress_hostlist(nodes)} --gpus-per-node {gpus} "
        f"--only {only} --id {campaign_id}-{suffix}"
    )
