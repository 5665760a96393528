"""A new campaign's plan from what an admin asked and the site's ``[campaign]`` settings:
which GPUs, which classes, which benchmarks, and the limits of each run. The GPUs themselves
come from the caller (a hostlist, or Slurm's own node list)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_pal.campaigns.settings import CampaignSettings
from slurm_pal.campaigns.workspace import (
    CampaignError,
    CampaignPlan,
    check_campaign_id,
    default_benchmarks,
    default_campaign_id,
    parse_commands,
)
from slurm_pal.core.campaigns import GpuKey, PlannedGpu
from slurm_pal.core.hostlist import expand as expand_hostlist


@dataclass(frozen=True)
class PlanRequest:
    """What the admin asked for; None (or empty) takes the site's ``[campaign]`` setting."""

    classes: str | None = None  # comma-separated; None: every site class
    repeats: int | None = None
    commands: Sequence[str] = ()  # CLASS=COMMAND, over the settings' own commands
    campaign_id: str | None = None
    gpu_model: str | None = None
    time_limit: str | None = None
    run_timeout_s: float | None = None
    python: str | None = None
    sbatch_args: Sequence[str] = ()  # added to the settings' own
    warmup_s: float | None = None
    measure_s: float | None = None


@dataclass(frozen=True)
class SiteClasses:
    """The site config's classes and GPU model, and where they were read (for the errors)."""

    names: tuple[str, ...]
    gpu_model: str
    source: str


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


def gpus_to_measure(
    gpus: list[PlannedGpu], exclude: str | None, only: str | None
) -> tuple[list[PlannedGpu], dict[str, int]]:
    """The GPUs left after ``exclude`` (a hostlist) and ``only`` (NODE:INDEX,...), and, when
    ``only`` picks some, each picked node's GPU count (each task still holds its whole node)."""
    if exclude:
        skip = set(expand_hostlist(exclude))
        gpus = [g for g in gpus if g.node not in skip]
        if not gpus:
            raise CampaignError(f"--exclude {exclude} leaves no node to measure")
    counts: dict[str, int] = {}
    if only:
        wanted = parse_gpu_list(only)
        unknown = sorted(wanted - {g.key for g in gpus})
        if unknown:
            raise CampaignError(
                f"--only names GPU(s) {', '.join(f'{n}:{i}' for n, i in unknown)} that "
                "the planned nodes do not have"
            )
        for g in gpus:
            counts[g.node] = counts.get(g.node, 0) + 1
        gpus = [g for g in gpus if g.key in wanted]
        counts = {n: c for n, c in counts.items() if any(g.node == n for g in gpus)}
    return gpus, counts


def plan_classes(asked: str | None, site: SiteClasses) -> tuple[str, ...]:
    """The classes to measure: those asked, each a site class and named once; else all."""
    names = tuple(c.strip() for c in asked.split(",")) if asked else site.names
    unknown = [c for c in names if c not in site.names]
    if unknown or not names or "" in names:
        raise CampaignError(
            f"unknown class(es) {', '.join(unknown) or '(empty)'}; valid classes: "
            f"{', '.join(site.names)} (classes.names in the site config, {site.source})"
        )
    if len(set(names)) != len(names):
        raise CampaignError(f"--classes names a class twice: {asked}")
    return names


def new_plan(
    request: PlanRequest,
    settings: CampaignSettings,
    site: SiteClasses,
    gpus: Sequence[PlannedGpu],
    node_gpu_counts: dict[str, int],
    partition: str | None,
) -> CampaignPlan:
    """The plan: the request over the settings; a run's warm-up and timed window must fit in
    its timeout, or every run would be cut short."""
    names = plan_classes(request.classes, site)
    commands = {c: cmd for c, cmd in settings.commands if c in names}
    commands |= parse_commands(request.commands)
    plan = CampaignPlan(
        campaign=check_campaign_id(request.campaign_id or default_campaign_id()),
        classes=names,
        repeats=request.repeats or settings.repeats,
        benchmarks=default_benchmarks(names, commands),
        gpus=tuple(gpus),
        gpu_model=request.gpu_model or site.gpu_model,
        partition=partition,
        time_limit=request.time_limit or settings.time_limit,
        run_timeout_s=request.run_timeout_s or settings.run_timeout_s,
        python=request.python or settings.python,
        sbatch_args=(*settings.sbatch_args, *request.sbatch_args),
        node_gpu_counts=node_gpu_counts,
        warmup_s=settings.warmup_s if request.warmup_s is None else request.warmup_s,
        measure_s=settings.measure_s if request.measure_s is None else request.measure_s,
    )
    window_s = plan.warmup_s + plan.measure_s
    if window_s >= plan.run_timeout_s:
        raise CampaignError(
            f"warm-up + timed window ({window_s:g} s) do not fit in one run's timeout "
            f"({plan.run_timeout_s:g} s): raise --run-timeout or shorten them"
        )
    return plan


def shared_benchmark_note(plan: CampaignPlan) -> str | None:
    """A note when several classes run the same default benchmark: they measure one thing."""
    shared = [b.name for b in plan.benchmarks.values()]
    if len(set(shared)) < len(shared):
        return (
            "several classes run the same default benchmark, so they measure the same thing; "
            "give each class its own with --command CLASS=COMMAND"
        )
    return None
