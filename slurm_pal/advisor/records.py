"""What the running advisor keeps in memory of the hooks' Prolog/Epilog records: which record
ids it was handed (a spooled copy or a retry then starts no round), and the Slurm GPU indices
each job's records named (the brief Slurm read has none), and which GPUs an Epilog's record
gives back.

The records themselves are kept by the store writer (:func:`.writer.store_record`); this
memory is bounded and lost at a restart (the store stays the authority).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_pal.adapters.slurm.state import JobState
    from slurm_pal.advisor.view import View

__all__ = ["RecordBook", "released_by"]

log = logging.getLogger("slurm_pal.advisor")

MAX_KEPT = 100_000
"""The most record ids, and jobs' GPU indices, kept in memory (oldest dropped first)."""


class RecordBook:
    """Record ids seen and GPU indices recorded, per process (thread-safe, bounded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: dict[object, None] = {}  # insertion-ordered, bounded
        # job id -> node -> Slurm GPU indices, as the job's Prolog/Epilog records said (records
        # are authenticated; the brief Slurm read has no indices): insertion-ordered, bounded
        self._gpus: dict[int, dict[str, tuple[int, ...]]] = {}

    def note(self, record: Mapping[str, object]) -> None:
        """Remember a record handed in: its id, and the GPU indices it names on its node."""
        record_id = record.get("record_id")
        if isinstance(record_id, str):
            with self._lock:
                self._recent[record_id] = None
                while len(self._recent) > MAX_KEPT:
                    self._recent.pop(next(iter(self._recent)))
        job_id, node, indices = record.get("job_id"), record.get("node"), record.get("slurm_gpus")
        if (
            isinstance(job_id, int)
            and isinstance(node, str)
            and isinstance(indices, list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
        ):
            with self._lock:
                self._gpus.setdefault(job_id, {})[node] = tuple(indices)
                while len(self._gpus) > MAX_KEPT:
                    self._gpus.pop(next(iter(self._gpus)))

    def seen(self, record: Mapping[str, object]) -> bool:
        """Was this record id handed in before by this process (a spooled copy, a retry)?"""
        with self._lock:
            return record.get("record_id") in self._recent

    def recorded_gpus(self, job_id: int) -> dict[str, tuple[int, ...]]:
        """Node -> the Slurm GPU indices ``job_id``'s records named (empty: none came)."""
        with self._lock:
            return dict(self._gpus.get(job_id, {}))

    def job_gpu_indices(self, job: JobState) -> dict[str, tuple[int, ...]]:
        """Node -> the Slurm GPU indices ``job`` holds: from the read when it has them
        (``squeue --json``), else from the job's records (the brief read has none)."""
        if job.allocated_gres:
            return job.allocated_gpu_indices()
        recorded = self.recorded_gpus(job.job_id)
        if job.nodes:
            recorded = {n: ix for n, ix in recorded.items() if n in job.nodes}
        return recorded


def released_by(view: View | None, record: Mapping[str, object]) -> list[str]:
    """The UUIDs of the GPUs an Epilog record's job gives back on the record's node
    (``slurm_gpus`` are Slurm's indices, mapped through labels.json). Slurm keeps them
    allocated until the Epilog ends, so the view still counts them as used."""
    node, indices = record.get("node"), record.get("slurm_gpus")
    if view is None or not isinstance(node, str) or not isinstance(indices, list):
        return []
    labels = view.static.labels
    uuids = []
    for slurm_index in indices:
        try:
            uuids.append(labels.uuid_at_slurm_index(node, int(slurm_index)))
        except (KeyError, TypeError, ValueError):
            log.warning("epilog of job %s: GPU %s on %s not in labels.json",
                        record.get("job_id"), slurm_index, node)  # fmt: skip
    return uuids
