"""What `slurm-pal campaign` reads before it decides: task states from Slurm's queue and the
records, GPUs from Slurm, stored campaigns (diffs, clock events), production exports and
labels; and the targeted re-measurement command it suggests."""

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd

from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.adapters.slurm.parse import gpu_counts
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.advisor.jobdesc import JobDescription
from slurm_pal.campaigns.slurm import CampaignSlurm, SlurmError
from slurm_pal.campaigns.workspace import (
    CampaignError,
    CampaignPlan,
    job_name,
    read_records,
    read_submissions,
)
from slurm_pal.cli.common import (
    err_console,
)
from slurm_pal.core.campaigns import (
    CampaignDiff,
    ClockEventSummary,
    GpuKey,
    PlannedGpu,
    TaskProgress,
    diff_campaigns,
    node_unavailable,
    summarize_clock_events,
    task_progress,
)
from slurm_pal.core.drift import JobInfo
from slurm_pal.core.hostlist import compress as compress_hostlist
from slurm_pal.core.hostlist import expand as expand_hostlist


def task_states(
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


def node_states(slurm: CampaignSlurm, nodes: set[str]) -> dict[str, str] | None:
    """sinfo's node states, or None (then the queue's reasons decide) when sinfo fails."""
    try:
        return dict(slurm.node_states(nodes))
    except SlurmError as exc:
        err_console.print(f"warning: node states unknown ({exc})", highlight=False)
        return None


def gpus_from_slurm(nodes: str | None, partition: str | None) -> tuple[list[PlannedGpu], list[str]]:
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


def stored_clock_events(store, campaign_id: str, scores: pd.DataFrame) -> ClockEventSummary:  # type: ignore[no-untyped-def]
    """The stored campaign's slowdowns, its runs named by the UUIDs its scores use."""
    rows = store.clock_events(campaign_id)
    canonical = {u: store.canonical_uuid(campaign_id, u) for u in {r.uuid for r in rows}}
    runs = [replace(r, uuid=canonical[r.uuid]) for r in rows]
    measured = scores.loc[scores["measured"], "uuid"].astype(str)
    return summarize_clock_events(campaign_id, measured, runs)


def stored_diff(store, old: str, new: str) -> CampaignDiff:  # type: ignore[no-untyped-def]
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
        old_clock_events=stored_clock_events(store, old, old_scores),
        new_clock_events=stored_clock_events(store, new, new_scores),
    )


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


def gpu_ids_from_labels(path: Path) -> dict[tuple[str, int], str]:
    """(node, Slurm's GPU number) -> UUID from labels.json, to read SLURM_JOB_GPUS."""
    try:
        table = read_labels(path)
    except LabelTableError as exc:
        raise CampaignError(str(exc)) from None
    return {(e.node, e.slurm_index): e.uuid for e in table.entries}


def targeted_plan(  # type: ignore[no-untyped-def]
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
