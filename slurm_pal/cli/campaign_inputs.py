"""What `slurm-pal campaign` reads from Slurm before it decides: task states from Slurm's queue
and the records, node states, and the GPUs Slurm reports. What the store holds about a campaign
is :mod:`slurm_pal.campaigns.stored`; production drift is :mod:`slurm_pal.campaigns.drift`."""

from pathlib import Path

from slurm_pal.adapters.slurm.parse import gpu_counts
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
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
    GpuKey,
    PlannedGpu,
    TaskProgress,
    node_unavailable,
    task_progress,
)
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
