"""A pending job's change of request, as the advisor plans it, and which changes Slurm 22.05
refuses or mishandles (testbed findings, PROTOCOL.md "Reservations and re-planning",
testbed/NOTES.md).

Why in core: the re-planner (pure) decides which changes to send by these rules, and the
Slurm adapter (``adapters/slurm/update.py``) turns the same changes into ``scontrol`` steps;
both import them from here, so planning needs no adapter. Pure and stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["JobChange", "ReleaseRules", "gpu_types", "is_gpu_typed", "transition_problem"]


class ReleaseRules(Protocol):
    """What the transition rules and the round's backfill prediction need to know of a Slurm
    release (:class:`slurm_pal.adapters.slurm.release.SlurmRelease` is one)."""

    @property
    def typed_gres_update_replaces(self) -> bool: ...

    @property
    def backfill_drops_jobs_past_limit(self) -> bool: ...


@dataclass(frozen=True)
class JobChange:
    """A pending job's new request: the ``job_desc`` fields to set (``fields``, as a decide
    answer's ``set``), against the GPU request Slurm holds now (``held_tres``).

    ``only_exclusion``: no GPUs chosen: only a waiting job's hold (its begin time, with its
    admin comment) or an older advisor's exclusion changes.
    ``lift_exclusion_to``: the job waited off nodes and is routed now: its exclusion goes back
    to this (the user's own, possibly empty) before anything else."""

    job_id: int
    fields: Mapping[str, str | int]
    held_tres: str
    n_gpus: int = 0
    only_exclusion: bool = False
    lift_exclusion_to: str | None = None


def gpu_types(tres: str) -> frozenset[str]:
    """The GPU types a Slurm tres string asks for (``gres:gpu:T:n`` -> ``{T}``; ``T:0`` asks for
    none, and does not clear ``T`` on 22.05 either)."""
    types = set()
    for item in tres.split(","):
        parts = item.strip().removeprefix("gres:").removeprefix("gres/").split(":")
        if parts[0] == "gpu" and len(parts) == 3 and parts[2] != "0":
            types.add(parts[1])
    return frozenset(types)


def is_gpu_typed(tres: str) -> bool:
    """Does a Slurm tres string name a GPU type (``gres:gpu:T:n``)?"""
    return bool(gpu_types(tres))


def transition_problem(change: JobChange, release: ReleaseRules | None = None) -> str | None:
    """Why Slurm 22.05 would refuse or mishandle this change of GPU request (checked on the
    testbed, ``tests/slurm/test_advisor_service.py``), or None.

    Refused outright: typed -> untyped in every form tried, and an untyped request turned into
    a typed *per-job* one. Accepted but wrong: an update that drops a GPU type. Slurm merges
    the new typed entries into the job's GRES request and keeps the dropped type's entry with
    its old count (also with an explicit ``T:0``), so ``ta:2 -> tb:2`` runs on 4 GPUs and
    ``ta:3,tb:1 -> ta:4`` is held with BadConstraints on a node without ``tb``. Updates that
    keep every type (new counts, other nodes, added types) are exact.

    ``release`` None means 22.05's rules; from 24.11 on Slurm replaces the request
    (:attr:`ReleaseRules.typed_gres_update_replaces`), so no change is refused here."""
    fields = change.fields
    now = change.held_tres
    if change.only_exclusion or not now:
        return None
    if release is not None and release.typed_gres_update_replaces:
        return None
    gpu_fields = [str(fields[k]) for k in ("tres_per_node", "tres_per_job") if fields.get(k)]
    new_types = frozenset().union(*(gpu_types(v) for v in gpu_fields))
    old_types = gpu_types(now)
    if old_types and gpu_fields and not new_types:
        return "Slurm 22.05 cannot turn a typed GPU request into an untyped one"
    if not old_types and is_gpu_typed(str(fields.get("tres_per_job", ""))):
        return "Slurm 22.05 cannot turn an untyped GPU request into a typed per-job one"
    dropped = old_types - new_types
    if old_types and new_types and dropped:
        return (
            "Slurm 22.05 keeps a dropped GPU type in the job's request "
            f"({', '.join(sorted(dropped))}): the job would get more GPUs or never start"
        )
    return None
