"""What `slurm-pal campaign` prints: progress, collect checks, diffs, slowdowns and drift,
as rich tables and one-line notes (the commands in :mod:`slurm_pal.cli.campaign` decide what)."""

from rich.table import Table

from slurm_pal.campaigns.workspace import (
    CampaignPlan,
)
from slurm_pal.cli.common import (
    console,
    err_console,
    fmt_score,
)
from slurm_pal.core.campaigns import (
    CLOCK_EVENTS_UNKNOWN,
    CampaignCheck,
    CampaignDiff,
    ClockEventSummary,
    TaskProgress,
    progress_counts,
)
from slurm_pal.core.drift import GpuDrift


def counts_line(tasks: list[TaskProgress]) -> str:
    counts = progress_counts(tasks)
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no tasks"


def progress_table(tasks: list[TaskProgress], the_plan: CampaignPlan) -> Table:
    table = Table(title=f"campaign {the_plan.campaign}: {counts_line(tasks)}", title_justify="left")
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


def print_progress(tasks: list[TaskProgress], the_plan: CampaignPlan, problems: list[str]) -> None:
    if all(t.state == "done" for t in tasks):
        console.print(
            f"campaign {the_plan.campaign}: all {len(tasks)} tasks done; next: "
            f"slurm-pal campaign collect {the_plan.campaign}"
        )
    else:
        console.print(progress_table(tasks, the_plan))
    for p in problems:
        err_console.print(f"warning: {p}", highlight=False)


def print_check(check: CampaignCheck, problems: list[str]) -> None:
    """What `collect` found: a count line, a table per kind of finding, then the notes."""
    console.print(
        f"{check.planned_gpus} GPUs planned x {len(check.classes)} class(es) x {check.repeats} "
        f"run(s): {len(check.ok_runs)} ok runs"
    )
    if check.missing:
        console.print(missing_table(check))
    if check.failures:
        console.print(failures_table(check))
    if check.disagreements:
        console.print(disagreements_table(check))
    if check.slowdowns:
        console.print(slowdowns_table(check))
        only = ",".join(f"{sd.node}:{sd.gpu_index}" for sd in check.slowdowns)
        console.print(f"re-measure them later with: slurm-pal campaign plan --only {only}")
    print_check_notes(check, problems)


def missing_table(check: CampaignCheck) -> Table:
    table = Table(title=f"{len(check.missing_gpus)} GPU(s) missing a class", title_justify="left")
    for col in ("node", "GPU", "class", "failed runs"):
        table.add_column(col)
    for m in check.missing:
        table.add_row(m.node, str(m.gpu_index), m.job_class, str(m.failed_runs))
    return table


def failures_table(check: CampaignCheck) -> Table:
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
    return table


def disagreements_table(check: CampaignCheck) -> Table:
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
    return table


def slowdowns_table(check: CampaignCheck) -> Table:
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
    return table


def print_check_notes(check: CampaignCheck, problems: list[str]) -> None:
    """What the tables do not show: runs without clock readings, tasks cut short, GPUs without
    a UUID, records outside the plan and unreadable record files."""
    if check.clock_events_unknown:
        n_runs = sum(k for _, _, k in check.clock_events_unknown)
        err_console.print(
            f"note: {n_runs} run(s) on {len(check.clock_events_unknown)} GPU(s) have no "
            "clock-event readings (no NVML on the node, or a runner from before they were "
            "recorded): whether they hit thermal or hardware slowdowns is unknown",
            highlight=False,
        )
    for node, index, classes_short in short_runs(check):
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


def short_runs(check: CampaignCheck) -> list[tuple[str, int, str]]:
    grouped: dict[tuple[str, int], list[str]] = {}
    for node, index, job_class, n in check.short:
        grouped.setdefault((node, index), []).append(f"{job_class} ({n}/{check.repeats})")
    return [(n, i, ", ".join(c)) for (n, i), c in sorted(grouped.items())]


RESTART_ADVICE = (
    "re-render the Slurm config ('slurm-pal site render') and restart slurmd on these nodes "
    "and slurmctld: gres.conf Type= labels are read at start"
)


def print_diff(d: CampaignDiff) -> None:
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
                c.uuid,
                c.node,
                fmt_index(c.gpu_index),
                c.job_class,
                c.old_bin,
                fmt_score(c.new_score),
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
                fmt_index(c.gpu_index),
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
    print_diff_slowdowns(d)
    print_label_changes(d)


UNKNOWN_CLOCK_EVENTS = (
    "no per-run clock-event readings kept: collected before slurm-pal kept them, ingested from "
    "a CSV, or no NVML on the nodes"
)


def slowdown_state(summary: ClockEventSummary, uuid: str) -> str:
    events = summary.gpu_state(uuid)
    if events is None:
        return "unknown"
    return ", ".join(events) if events else "none"


def clock_events_line(summary: ClockEventSummary) -> str:
    if summary.status == CLOCK_EVENTS_UNKNOWN:
        return f"unknown ({UNKNOWN_CLOCK_EVENTS})"
    seen = f"{len(summary.slowdowns)} GPU(s)" if summary.slowdowns else "none"
    if summary.unknown_gpus:
        seen += (
            f"; unknown for {len(summary.unknown_gpus)} GPU(s) ({summary.unknown_runs} run(s) "
            "without readings)"
        )
    return seen


def print_diff_slowdowns(d: CampaignDiff) -> None:
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
                slowdown_state(old_s, uuid),
                slowdown_state(new_s, uuid),
                f"{worst:.0%} of readings",
            )
        console.print(table)
    for summary in (old_s, new_s):
        console.print(
            f"thermal/hardware slowdowns in {summary.campaign}: {clock_events_line(summary)}",
            highlight=False,
        )


def print_label_changes(d: CampaignDiff) -> None:
    if d.label_changes:
        table = Table(
            title=f"{len(d.label_changes)} GPU(s) change gres.conf Type= label",
            title_justify="left",
        )
        for col in ("uuid", "node", "GPU", "label"):
            table.add_column(col)
        for c in d.label_changes:
            table.add_row(
                c.uuid,
                c.node,
                fmt_index(c.gpu_index),
                f"{c.old_label or '-'} -> {c.new_label or '-'}",
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


def fmt_index(value: int | None) -> str:
    return "-" if value is None else str(value)


def print_campaign_slowdowns(summary: ClockEventSummary, command: str | None) -> None:
    console.print(
        f"thermal/hardware slowdowns while {summary.campaign} measured: "
        f"{clock_events_line(summary)}",
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


def print_drift(
    found: list[GpuDrift],
    where: dict[str, tuple[str, int | None]],
    clock: ClockEventSummary,
    command: str | None,
) -> None:
    """The drifting GPUs as a table, and the command that re-measures them."""
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
            fmt_index(index),
            str(d.runs),
            str(d.apps),
            f"{d.median_residual:+.1%}",
            f"{d.share_slower:.0%}",
            f"{d.expected_s:.4g}",
            f"{d.observed_s:.4g}",
            slowdown_state(clock, d.gpu),
        )
    console.print(table)
    if command:
        console.print(f"re-measure them: {command}", highlight=False, soft_wrap=True)
