"""Placement policies behind one interface: ``place(request, cluster) -> PlacementResult``.

``POLICIES`` maps each name to its class; :func:`get_policy` builds one by name with keyword
parameters (``get_policy("random", seed=7)``).
"""

from __future__ import annotations

from typing import Any

from slurm_pal.core.placement.base import Allocation, PlacementPolicy, PlacementResult
from slurm_pal.core.placement.packed import PackedPolicy
from slurm_pal.core.placement.packedpm import PackedPMPolicy
from slurm_pal.core.placement.pal import PALPolicy
from slurm_pal.core.placement.pmfirst import PMFirstPolicy
from slurm_pal.core.placement.random import RandomPolicy

__all__ = [
    "POLICIES",
    "SETTINGS",
    "Allocation",
    "PALPolicy",
    "PMFirstPolicy",
    "PackedPMPolicy",
    "PackedPolicy",
    "PlacementPolicy",
    "PlacementResult",
    "RandomPolicy",
    "configured_policy",
    "get_policy",
]

POLICIES: dict[str, type[PlacementPolicy]] = {
    PMFirstPolicy.name: PMFirstPolicy,
    PALPolicy.name: PALPolicy,
    PackedPolicy.name: PackedPolicy,
    PackedPMPolicy.name: PackedPMPolicy,
    RandomPolicy.name: RandomPolicy,
}


def get_policy(name: str, **params: Any) -> PlacementPolicy:
    """Build the policy called ``name``. ValueError lists the valid names (and says when the
    parameters do not fit the policy)."""
    try:
        policy_class = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; valid: {', '.join(POLICIES)}"
        ) from None
    try:
        return policy_class(**params)
    except TypeError as error:
        raise ValueError(f"bad parameters for placement policy {name!r}: {error}") from None


SETTINGS: dict[str, tuple[str, ...]] = {
    PMFirstPolicy.name: ("pack_tolerance",),
    PALPolicy.name: ("pack_tolerance",),
    PackedPolicy.name: (),
    PackedPMPolicy.name: ("avoid_above", "wait", "max_wait_s", "assumed_runtime_s", "limit_share"),
    RandomPolicy.name: (),
}
"""Which of the site's placement settings (``[advisor]``) each policy takes."""


def configured_policy(name: str, **settings: float | bool) -> PlacementPolicy:
    """The policy ``name`` with the site settings that apply to it (the others are ignored):
    one builder for the advisor service and the simulator, so both run the same policy."""
    wanted = SETTINGS.get(name, ())
    return get_policy(name, **{key: value for key, value in settings.items() if key in wanted})
