"""A campaign's records into the store: checked, written to one CSV next to them, and ingested
all or nothing (a blocked campaign, with GPUs missing or records broken, only with consent)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.store import IngestResult, Store
from slurm_pal.campaigns.workspace import (
    COLLECTED_DIR,
    CampaignError,
    CampaignPlan,
    check_campaign_id,
    read_records,
)
from slurm_pal.core.binning import PMBinner
from slurm_pal.core.campaigns import CampaignCheck, check_campaign, measurement_rows


@dataclass(frozen=True)
class CollectRequest:
    """How to collect: the repeat tolerance, whether to ingest a blocked campaign, the store
    campaign to write (None: the plan's id), and how the store bins it."""

    tolerance: float
    allow_missing: bool
    store_id: str | None
    class_order: Sequence[str]
    binner: PMBinner


@dataclass(frozen=True)
class Collected:
    """What collecting found and did. ``ingested`` None: nothing was written to the store
    (``unchanged``: because it already holds exactly these records)."""

    check: CampaignCheck
    problems: list[str]  # record files that could not be read
    target: str  # the store campaign
    ingested: IngestResult | None = None
    csv_path: Path | None = None
    active_before: str | None = None  # the store's active campaign before the ingest
    unchanged: bool = False

    @property
    def blocked(self) -> bool:
        return not self.check.complete or bool(self.problems)


def collect_campaign(
    open_store: Callable[[], AbstractContextManager[Store]],
    plan: CampaignPlan,
    directory: Path,
    request: CollectRequest,
    asked: str,
) -> Collected:
    """Check ``plan``'s records, then open the store and ingest them unless blocked or already
    there. ``asked``: the campaign as the admin named it, for the command the errors suggest."""
    records, problems = read_records(directory, plan.campaign)
    check = check_campaign(
        plan.gpus, plan.classes, plan.repeats, records, tolerance=request.tolerance
    )
    target = check_campaign_id(request.store_id or plan.campaign)
    with open_store() as store:
        return ingest_checked(
            store, plan, directory, request, Collected(check, problems, target), asked
        )


def ingest_checked(
    store: Store,
    plan: CampaignPlan,
    directory: Path,
    request: CollectRequest,
    found: Collected,
    asked: str,
) -> Collected:
    """``found`` after ingesting its good runs as one CSV, when it is not blocked (or the
    admin allows it) and the store does not hold these records yet."""
    check, problems, target = found.check, found.problems, found.target
    if (found.blocked and not request.allow_missing) or not check.ok_runs:
        return found
    known = {c.id for c in store.campaigns()}
    csv_path = directory / COLLECTED_DIR / f"{target}.csv"
    text = measurement_rows(check.ok_runs, plan.gpu_model).to_csv(index=False)
    same = csv_path.is_file() and csv_path.read_text(encoding="utf-8") == text
    if target in known and same:
        return Collected(check, problems, target, unchanged=True)
    if target in known:
        # Collecting again into the same campaign would mix old and new rows: a new version.
        n = 2
        while f"{plan.campaign}-v{n}" in known:
            n += 1
        raise CampaignError(
            f"campaign {target!r} is already in the store {store.path}; collecting "
            f"again would mix old and new rows. To ingest the current records as a "
            f"new version: slurm-pal campaign collect {asked} --as {plan.campaign}-v{n}"
        )
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.write_text(text, encoding="utf-8")
    file = read_campaign_csv(csv_path, gpu_model=plan.gpu_model)
    active_before = store.active_campaign_id()
    result = store.ingest(
        [file],
        campaign_id=target,
        class_order=request.class_order,
        binner=request.binner,
        description=f"Slurm campaign {plan.campaign}: "
        f"{check.planned_gpus} GPUs planned, {len(check.ok_runs)} ok runs",
        clock_events=[r.clock_event_row() for r in check.ok_runs],
    )
    return Collected(check, problems, target, result, csv_path, active_before)
