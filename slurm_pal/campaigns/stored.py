"""What the store holds about a campaign, in the core's terms: its clock-event slowdowns, and
how it differs from another campaign."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from slurm_pal.adapters.store import Store
from slurm_pal.core.campaigns import (
    CampaignDiff,
    ClockEventSummary,
    diff_campaigns,
    summarize_clock_events,
)


def stored_clock_events(store: Store, campaign_id: str, scores: pd.DataFrame) -> ClockEventSummary:
    """The stored campaign's slowdowns, its runs named by the UUIDs its scores use."""
    rows = store.clock_events(campaign_id)
    canonical = {u: store.canonical_uuid(campaign_id, u) for u in {r.uuid for r in rows}}
    runs = [replace(r, uuid=canonical[r.uuid]) for r in rows]
    measured = scores.loc[scores["measured"], "uuid"].astype(str)
    return summarize_clock_events(campaign_id, measured, runs)


def stored_diff(store: Store, old: str, new: str) -> CampaignDiff:
    """What changes from campaign ``old`` to ``new``: bins, outliers, labels, slowdowns."""
    for c in (old, new):
        store.resolve_campaign(c)

    def label_scores(campaign_id: str) -> dict[str, dict[str, float]]:
        return {str(r["label"]): dict(r["scores"]) for r in store.labels(campaign_id)}  # type: ignore[call-overload]

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
