"""The advisor engine's settings: every ``[advisor]`` knob that changes a decision, as plain
values.

Why its own dataclass: the engine imports nothing of ``adapters/`` (where the site config is
read), and the simulator builds the same settings from its own knobs; both then build the
policy the same way (:meth:`EngineSettings.build_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from slurm_pal.core.placement import PlacementPolicy, configured_policy
from slurm_pal.core.queue import BACKFILL_RESERVES

__all__ = ["PINS", "AdvisorKnobs", "EngineSettings"]

PINS = ("steered", "every-job")


class AdvisorKnobs(Protocol):
    """The part of a site's ``[advisor]`` section the engine reads
    (``adapters.config.AdvisorConfig`` is one; read-only, as that dataclass is frozen)."""

    @property
    def policy(self) -> str: ...

    @property
    def pack_tolerance(self) -> float: ...

    @property
    def avoid_above(self) -> float: ...

    @property
    def outliers(self) -> str: ...

    @property
    def max_wait_s(self) -> float: ...

    @property
    def assumed_runtime_s(self) -> float: ...

    @property
    def limit_share(self) -> float: ...

    @property
    def pin(self) -> str: ...

    @property
    def label_requests(self) -> str: ...

    @property
    def allowed_users(self) -> tuple[str, ...]: ...

    @property
    def reservation_ttl_s(self) -> float: ...

    @property
    def replan_on_epilog(self) -> bool: ...

    @property
    def slurm_backfill(self) -> bool: ...

    @property
    def slurm_backfill_reserves(self) -> str: ...

    @property
    def slurm_overtime_unlimited(self) -> bool: ...


@dataclass(frozen=True)
class EngineSettings:
    """What the engine decides with. ``policy_settings``: the keywords
    :func:`~slurm_pal.core.placement.configured_policy` takes (those the policy does not use
    are ignored). ``pin``: ``steered`` leaves a job whose pick is packing's own to Slurm,
    ``every-job`` pins every placed job. ``replan_on_epilog``: a job's end runs a round (off:
    the advisor decides at submit only, and Slurm places what found no GPUs then).
    ``slurm_backfill``: the site's Slurm backfills, so a round goes past a job that fits
    nowhere yet (the simulator's Slurm brings its own start rule and ignores it);
    ``slurm_backfill_reserves`` says what it keeps free then (``nodes``: Slurm's whole-node
    reservations for every waiting job, as sched/backfill plans; ``head``: EASY).
    ``slurm_overtime_unlimited``: the site's Slurm lets jobs run past their limits, so the
    round expects one past its limit to run a whole limit more, as that Slurm's backfill does
    up to 24.05 (the round's ``release`` says when it counts such a job gone instead)."""

    policy: str = "packed-pm"
    policy_settings: tuple[tuple[str, float | bool], ...] = ()
    pin: str = "steered"
    label_requests: str = "translate"
    allowed_users: tuple[str, ...] = ("root", "slurm")
    reservation_ttl_s: float = 60.0
    replan_on_epilog: bool = True
    slurm_backfill: bool = True
    slurm_backfill_reserves: str = "nodes"
    slurm_overtime_unlimited: bool = False

    def __post_init__(self) -> None:
        if self.pin not in PINS:
            raise ValueError(f"unknown pin {self.pin!r}; valid: {', '.join(PINS)}")
        if self.slurm_backfill_reserves not in BACKFILL_RESERVES:
            raise ValueError(
                f"unknown slurm_backfill_reserves {self.slurm_backfill_reserves!r}; "
                f"valid: {', '.join(BACKFILL_RESERVES)}"
            )

    @classmethod
    def from_advisor(cls, advisor: AdvisorKnobs, policy: str | None = None) -> EngineSettings:
        """The settings of a site's ``[advisor]`` section (``policy`` overrides its policy)."""
        return cls(
            policy=policy or advisor.policy,
            policy_settings=(
                ("pack_tolerance", float(advisor.pack_tolerance)),
                ("avoid_above", float(advisor.avoid_above)),
                ("wait", advisor.outliers == "wait"),
                ("max_wait_s", float(advisor.max_wait_s)),
                ("assumed_runtime_s", float(advisor.assumed_runtime_s)),
                ("limit_share", float(advisor.limit_share)),
            ),
            pin=advisor.pin,
            label_requests=advisor.label_requests,
            allowed_users=tuple(advisor.allowed_users),
            reservation_ttl_s=float(advisor.reservation_ttl_s),
            replan_on_epilog=bool(advisor.replan_on_epilog),
            slurm_backfill=bool(advisor.slurm_backfill),
            slurm_backfill_reserves=str(advisor.slurm_backfill_reserves),
            slurm_overtime_unlimited=bool(advisor.slurm_overtime_unlimited),
        )

    @property
    def leave_packing(self) -> bool:
        """A pick that is packing's own, with nothing to avoid, is left to Slurm."""
        return self.pin == "steered"

    def build_policy(self) -> PlacementPolicy:
        return configured_policy(self.policy, **dict(self.policy_settings))
