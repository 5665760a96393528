"""Keeps Python's cyclic garbage collector off the advisor's long-lived heap.

Why: every Slurm read builds the next view (at 10,000 pending jobs, some 300,000 objects) and
drops the last one. With the collector's default thresholds that churn triggers one or two
full collections per read, each walking the whole heap with the interpreter lock held: 150-200
ms measured at 10,000 jobs, during which no decide is answered and no job-end round runs (the
plugin gives up after 300 ms, an Epilog after 900 ms). Freezing what exists after each read
(``gc.freeze``) leaves the collector only what was made since; reference counting still frees
the old views as before. Only garbage in reference cycles waits for the next full pass, which
runs once per ``full_every_s``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

__all__ = ["FrozenHeap"]


class FrozenHeap:
    """Freeze the heap after each Slurm read; unfreeze and collect it all once in a while."""

    def __init__(
        self, full_every_s: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.full_every_s = full_every_s
        self.clock = clock
        self._last_full = clock()

    def after_read(self) -> None:
        now = self.clock()
        if now - self._last_full >= self.full_every_s:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
        gc.freeze()

    def release(self) -> None:
        """Hand the heap back to the collector (the service stops)."""
        gc.unfreeze()
