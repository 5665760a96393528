"""PAL's L x V matrix: every (locality level, PM-score bin) pair and its LV product.

An entry (L, V) stands for "an allocation that spans at most level L and whose slowest GPU has a
PM-score of at most V"; its LV product ``L * V`` is the job's combined slowdown (paper, section
III-C). PAL walks the entries from the smallest product up and takes the first one the free GPUs
can satisfy. Equal products are walked most local level first (a packed allocation is never worse
than a spread one with the same product), then by score.

The matrix is per job class (its bins differ) and small: levels x bins. :meth:`LxVMatrix.rows`
returns it in traversal order for printing or JSON (``slurm-pal advise lxv --class A``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_pal.core.topology import Level

__all__ = ["LxVEntry", "LxVMatrix"]

_PRODUCT_DIGITS = 12
"""Products equal to this many decimals are ties (1.7 * 1.0 vs 1.0 * 1.7 in floating point)."""


@dataclass(frozen=True)
class LxVEntry:
    """One matrix entry; ``rank`` is its 1-based position in the traversal."""

    rank: int
    level: Level
    bin: int
    score: float
    lv_product: float


@dataclass(frozen=True)
class LxVMatrix:
    """The L x V matrix of one class: ``bin_scores`` ascending, ``levels`` most local first."""

    job_class: str
    bin_scores: tuple[float, ...]
    levels: tuple[Level, ...]
    traversal: tuple[LxVEntry, ...]

    @classmethod
    def build(
        cls, job_class: str, bin_scores: tuple[float, ...], levels: tuple[Level, ...]
    ) -> LxVMatrix:
        """Build and order the entries. ``bin_scores`` must be distinct, finite and > 0."""
        scores = tuple(float(v) for v in bin_scores)
        if not all(math.isfinite(v) and v > 0 for v in scores):
            raise ValueError(f"bin scores must be finite and > 0, got {scores}")
        if list(scores) != sorted(set(scores)):
            raise ValueError(f"bin scores must be distinct and ascending, got {scores}")
        cells = [
            (level, bin_index, score, level.penalty * score)
            for level in levels
            for bin_index, score in enumerate(scores)
        ]
        cells.sort(key=lambda cell: (round(cell[3], _PRODUCT_DIGITS), cell[0].rank, cell[2]))
        traversal = tuple(
            LxVEntry(rank=rank, level=level, bin=bin_index, score=score, lv_product=product)
            for rank, (level, bin_index, score, product) in enumerate(cells, start=1)
        )
        return cls(job_class, scores, tuple(levels), traversal)

    def rows(self) -> list[dict[str, object]]:
        """The entries in traversal order as JSON-ready dicts:
        ``rank, level, penalty, bin, bin_score, lv_product``."""
        return [
            {
                "rank": entry.rank,
                "level": entry.level.name,
                "penalty": entry.level.penalty,
                "bin": entry.bin,
                "bin_score": entry.score,
                "lv_product": entry.lv_product,
            }
            for entry in self.traversal
        ]

    def grid(self) -> list[list[float]]:
        """The matrix as the paper prints it: one row per level, one column per bin."""
        return [[level.penalty * v for v in self.bin_scores] for level in self.levels]

    def to_text(self) -> str:
        """A plain-text table of the traversal (rank, level, L, V, LV)."""
        lines = [
            f"L x V traversal for class {self.job_class}",
            "rank  level            L      V      LV",
        ]
        lines.extend(
            f"{e.rank:>4}  {e.level.name:<15} {e.level.penalty:>5.2f} {e.score:>6.3f} "
            f"{e.lv_product:>7.3f}"
            for e in self.traversal
        )
        return "\n".join(lines)
