"""Pairwise interference: how much slower a job runs while another job shares its GPU (pure).

SJF-BSBF (Eqs. (5)/(6)) models a shared job's iteration time as its solo time x xi, xi measured
per pair (up to 6 in its Fig. 3). We have no co-run measurements yet, so the default table is a
documented model keyed by our job classes, which are ordered from most compute-bound (first) to
most memory-bound (last; PAL's classifier orders them that way):

- class k of n gets a compute share ``c_k = 1 - 0.75 k / (n - 1)`` (A 1.0, B 0.75, C 0.5,
  D 0.25 for four classes) and a memory share ``m_k = 1 - c_k``;
- ``xi(self | other) = 1 + c_self c_other + m_self m_other``: two jobs contend on the resource
  they both use. Two compute-bound jobs time-slice (xi = 2: sharing gains nothing), a
  compute-bound and a memory-bound job overlap well (A with D: 1.25), two memory-bound jobs
  contend on DRAM (D with D: 1.625).

A site replaces it with measured values (``InterferenceTable(pairs=...)``), and a global
``xi`` (SJF-BSBF's Fig. 6b sweep) overrides every pair.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["InterferenceTable", "compute_share"]


def compute_share(job_class: str, class_order: Sequence[str]) -> float:
    """The compute-bound share of a class from its rank (first = most compute-bound)."""
    n = len(class_order)
    if n <= 1:
        return 1.0
    return 1.0 - 0.75 * class_order.index(job_class) / (n - 1)


@dataclass(frozen=True)
class InterferenceTable:
    """``xi(self, other)``: the factor ``self``'s time stretches by while sharing with
    ``other``. ``pairs`` (measured values, ``(self, other) -> xi``) win over the model;
    ``xi`` (> 0), when set, is used for every pair."""

    class_order: tuple[str, ...]
    pairs: Mapping[tuple[str, str], float] = field(default_factory=dict)
    xi: float | None = None

    def __post_init__(self) -> None:
        values = [*self.pairs.values(), *([self.xi] if self.xi is not None else [])]
        for value in values:
            if not (math.isfinite(value) and value >= 1.0):
                raise ValueError(f"interference factors must be >= 1.0, got {value}")
        unknown = {c for pair in self.pairs for c in pair} - set(self.class_order)
        if unknown:
            raise ValueError(
                f"interference pairs name unknown class(es) {', '.join(sorted(unknown))}; "
                f"valid: {', '.join(self.class_order)}"
            )

    def __call__(self, me: str, other: str) -> float:
        if self.xi is not None:
            return self.xi
        if (me, other) in self.pairs:
            return self.pairs[(me, other)]
        c_me = compute_share(me, self.class_order)
        c_other = compute_share(other, self.class_order)
        return 1.0 + c_me * c_other + (1.0 - c_me) * (1.0 - c_other)
