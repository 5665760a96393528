"""The SQLite store on the controller: campaigns, raw measurements, bins, scores and labels;
applications, their classes and the classifier models; finished jobs' history; the advisor's
decisions and records.

One :class:`Store` handle, assembled from one class per responsibility so each part reads on
its own: :mod:`.schema` (connection, migrations, the write transaction), :mod:`.campaigns`,
:mod:`.apps`, :mod:`.history`, :mod:`.advisor` and :mod:`.suspicion`. Compute nodes never open
this file (no SQLite over NFS); they talk to the advisor.
"""

from __future__ import annotations

from slurm_pal.adapters.store.advisor import AdvisorStore
from slurm_pal.adapters.store.apps import Application, AppStore, ClassifierModel
from slurm_pal.adapters.store.campaigns import Campaign, CampaignStore, IngestResult
from slurm_pal.adapters.store.history import HistoryStore
from slurm_pal.adapters.store.schema import (
    DERIVED_TABLES,
    MIGRATIONS,
    SCHEMA_VERSION,
    StoreConnection,
    StoreError,
)
from slurm_pal.adapters.store.suspicion import SuspicionStore


class Store(CampaignStore, AppStore, HistoryStore, AdvisorStore, SuspicionStore, StoreConnection):
    """A handle on the slurm-pal SQLite database. Use as a context manager or call close()."""


__all__ = [
    "DERIVED_TABLES",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Application",
    "Campaign",
    "ClassifierModel",
    "IngestResult",
    "Store",
    "StoreError",
]
