"""GPUs that run slower in production than their PM-scores say: what ``campaign suggest``
finds, and the targeted campaigns that would re-measure them.

Each job's runtime is compared with the same application's runs on other GPUs, scaled by the
PM-scores of the GPUs used (the slowest one sets the pace); a GPU whose runs are consistently
slower by more than the threshold drifts. GPUs that hit thermal or hardware slowdowns while the
campaign measured them are listed too: their PM-scores were taken under a cooling fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.adapters.store import Store
from slurm_pal.campaigns.stored import stored_clock_events
from slurm_pal.campaigns.workspace import CampaignError
from slurm_pal.core.campaigns import ClockEventSummary
from slurm_pal.core.drift import DriftDetector, GpuDrift, runs_from_records
from slurm_pal.core.hostlist import compress as compress_hostlist
from slurm_pal.engine.runs import jobs_from_decisions
from slurm_pal.site.render import plan_from_store

GpuPlace = tuple[str, int | None]
"""(node, device minor) of a GPU; None where the campaign did not record the minor."""


@dataclass(frozen=True)
class DriftRequest:
    """Where the production runs come from and how strict the judgment is. ``records`` None:
    what the advisor service kept in the store; ``labels`` None: the site's labels file, else
    the campaign's own labels."""

    campaign: str | None
    records: Path | None
    labels: Path | None
    threshold: float
    min_runs: int


@dataclass(frozen=True)
class DriftFindings:
    """The drifting GPUs, the campaign's slowdowns, and the plans that re-measure them."""

    campaign_id: str
    detector: DriftDetector
    jobs_used: int
    reasons: dict[str, int]  # why jobs were left out -> how many
    found: list[GpuDrift]
    where: dict[str, GpuPlace]  # GPU UUID -> its place
    clock: ClockEventSummary
    command: str | None  # the campaign plan that re-measures the drifting GPUs
    hot_command: str | None  # ... and the one for GPUs that slowed down during the campaign

    def to_dict(self) -> dict[str, object]:
        return {
            "campaign": self.campaign_id,
            "threshold": self.detector.threshold,
            "min_runs": self.detector.min_runs,
            "jobs_used": self.jobs_used,
            "jobs_skipped": self.reasons,
            "drifting": [
                d.to_dict()
                | {
                    "node": self.where.get(d.gpu, ("", None))[0],
                    "gpu_index": self.where.get(d.gpu, ("", None))[1],
                    "campaign_slowdown": slowdown_reasons(self.clock, d.gpu),
                }
                for d in self.found
            ],
            "gpus_judged": len(self.detector.gpus_),
            "suggested_plan": self.command,
            "clock_events": self.clock.to_dict(),
            "slowdown_plan": self.hot_command,
        }


def slowdown_reasons(summary: ClockEventSummary, uuid: str) -> list[str] | None:
    """A GPU's slowdown reasons while the campaign measured it: [] clean, None unknown."""
    events = summary.gpu_state(uuid)
    return None if events is None else list(events)


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


def gpu_ids_from_labels(path: Path) -> dict[tuple[str, int], str]:
    """(node, Slurm's GPU number) -> UUID from labels.json, to read SLURM_JOB_GPUS."""
    try:
        table = read_labels(path)
    except LabelTableError as exc:
        raise CampaignError(str(exc)) from None
    return {(e.node, e.slurm_index): e.uuid for e in table.entries}


def targeted_plan(
    targets: list[GpuPlace], frame: pd.DataFrame, campaign_id: str, suffix: str = "recheck"
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


def production_drift(store: Store, request: DriftRequest, config: SiteConfig) -> DriftFindings:
    """Production runs against the campaign's PM-scores: which GPUs drift, and the plans."""
    campaign_id = store.resolve_campaign(request.campaign)
    frame = store.gpu_scores(campaign_id)
    clock = stored_clock_events(store, campaign_id, frame)
    scores: dict[str, dict[str, float]] = {}
    where: dict[str, GpuPlace] = {}
    for r in frame.itertuples(index=False):
        scores.setdefault(str(r.uuid), {})[str(r.job_class)] = float(r.pm_score)
        where[str(r.uuid)] = (str(r.node), None if pd.isna(r.gpu_index) else int(r.gpu_index))
    labels_path = request.labels or (
        Path(config.advisor.labels_file) if config.advisor.labels_file else None
    )
    if labels_path is not None:
        gpu_ids = gpu_ids_from_labels(labels_path)
    else:
        gpu_ids = {
            (g.node, g.slurm_index): g.uuid
            for g in plan_from_store(store, campaign_id, config=config).gpus
        }
    if request.records is None:  # what the advisor service kept (tables job_records and
        hook_records = store.job_records()  # advisor_decisions)
        decisions = [d for d in store.decisions() if d.get("job_id") is not None]
    else:
        hook_records, decisions = read_production_jsonl(request.records)
    jobs, skipped = jobs_from_decisions(decisions)
    runs, not_paired = runs_from_records(hook_records, jobs, gpu_ids)
    skipped |= {j: why for j, why in not_paired.items() if j not in skipped}
    runs = [
        replace(r, gpus=tuple(store.canonical_uuid(campaign_id, g) for g in r.gpus)) for r in runs
    ]
    detector = DriftDetector(threshold=request.threshold, min_runs=request.min_runs).fit(
        runs, scores
    )
    skipped |= detector.skipped_
    found = detector.drifting_gpus()
    targets = sorted(
        {where[d.gpu] for d in found if d.gpu in where and where[d.gpu][1] is not None}
    )
    hot: list[GpuPlace] = [(s.node, s.gpu_index) for s in clock.slowdowns]
    reasons: dict[str, int] = {}
    for why in skipped.values():
        reasons[why] = reasons.get(why, 0) + 1
    return DriftFindings(
        campaign_id=campaign_id,
        detector=detector,
        jobs_used=len(runs) - len(detector.skipped_),
        reasons=reasons,
        found=found,
        where=where,
        clock=clock,
        command=targeted_plan(targets, frame, campaign_id) if targets else None,
        hot_command=targeted_plan(hot, frame, campaign_id, "cooling") if hot else None,
    )
