"""Loading what the advisor serves from the store: the active campaign, its scores, the labels
(labels.json, else the store's plan), the class-resolution snapshot and the classifier.

Why apart from the state: this is the store (and the site plan's label rendering) read once per
start or reload; the view built from it (:mod:`.view`) is pure.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.adapters.labels_file import read_labels
from slurm_pal.adapters.store import Store
from slurm_pal.core.cluster import GpuSpec
from slurm_pal.core.resolve import StoreView
from slurm_pal.engine.decide import LabelTable
from slurm_pal.engine.jobdesc import JobDescError, JobDescription
from slurm_pal.site.render import plan_from_store

__all__ = ["Loaded", "build_specs", "load_store", "stored_requests"]

log = logging.getLogger("slurm_pal.advisor")


@dataclass(frozen=True)
class Loaded:
    """One read of the store: ``labels`` and ``specs`` are set when ``problem`` is empty."""

    store_view: StoreView
    classifier: Any
    campaign: str | None
    problem: str
    labels: LabelTable | None = None
    specs: tuple[GpuSpec, ...] = ()
    skipped: tuple[str, ...] = ()


def load_store(config: SiteConfig, store_path: Path, labels_file: str | None) -> Loaded:
    """Read the store (active campaign, scores, labels, applications, classifier)."""
    labels: LabelTable | None = None
    specs: list[GpuSpec] = []
    skipped: list[str] = []
    with Store(store_path) as store:
        store_view = store.store_view(config.classification.history_window, config.classes.names)
        model = store.active_classifier()
        campaign = store.active_campaign_id()
        problem = ""
        if campaign is None:
            problem = "no active campaign"
        else:
            labels = _labels_from(config, store, labels_file)
            specs, skipped = build_specs(campaign, store, labels)
            if skipped:
                log.warning("%d GPU(s) not routed to: %s", len(skipped), "; ".join(skipped))
            if not specs:
                problem = f"campaign {campaign}: no GPU has both scores and a label"
    classifier = None
    if model is not None:
        from slurm_pal.core.classifier import JobClassifier

        try:
            classifier = JobClassifier.from_dict(model.model)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("active classifier %s unusable: %s", model.id, exc)
    return Loaded(store_view, classifier, campaign, problem, labels, tuple(specs), tuple(skipped))


def _labels_from(config: SiteConfig, store: Store, labels_file: str | None) -> LabelTable:
    path = labels_file if labels_file is not None else config.advisor.labels_file
    if path:
        return read_labels(path)
    return LabelTable.from_labels_json(plan_from_store(store, config=config).to_dict())


def build_specs(campaign: str, store: Store, labels: LabelTable) -> tuple[list[GpuSpec], list[str]]:
    """One GpuSpec per GPU that has scores and a label (same node, index and UUID), and the
    GPUs left out, with the reason."""
    scores = store.gpu_scores(campaign)
    per_gpu: dict[str, dict[str, Any]] = {}
    for row in scores.itertuples(index=False):
        entry = per_gpu.setdefault(
            row.uuid,
            {"node": row.node, "index": row.gpu_index, "model": row.gpu_model, "scores": {}},
        )
        entry["scores"][row.job_class] = float(row.pm_score)
    specs: list[GpuSpec] = []
    skipped: list[str] = []
    for uuid, g in per_gpu.items():
        node, index = str(g["node"] or ""), g["index"]
        if not node or index is None or (isinstance(index, float) and math.isnan(index)):
            skipped.append(f"{uuid}: no node/index in campaign {campaign}")
            continue
        try:
            labelled = labels.uuid(node, int(index))
        except KeyError as exc:
            skipped.append(f"{uuid}: {exc.args[0]}")
            continue
        if labelled != uuid:
            skipped.append(f"{uuid}: labels.json has {labelled} at {node} index {index}")
            continue
        specs.append(GpuSpec(uuid, node, int(index), str(g["model"]), dict(g["scores"])))
    return specs, skipped


def stored_requests(store: Store, tokens: Iterable[str]) -> dict[str, tuple[JobDescription, str]]:
    """The request as decided and the class of each token's stored decision (one read per
    token; a decision without a class or a readable request is left out): what a round needs
    of the jobs decided before a restart."""
    found: dict[str, tuple[JobDescription, str]] = {}
    for token in tokens:
        row = store.decision(token)
        if row is None:
            continue
        answer = row["answer"]
        job_class = answer.get("class") if isinstance(answer, dict) else None
        if not job_class:
            continue
        try:
            found[token] = (JobDescription.from_wire(row["job"]), str(job_class))  # type: ignore[arg-type]
        except JobDescError:
            continue
    return found
