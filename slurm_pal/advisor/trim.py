"""Keeps the memory of a flood of bad requests bounded and gives it back at once.

Why: a bad request can be large (a line of up to ``protocol.MAX_LINE`` bytes, or JSON just
under it whose ``job`` is a long list, parsed whole before it is refused): under a flood, dozens
are held at a time and the C heap grows by tens of MB. Freed, that memory stays with the
process (glibc keeps freed pages for reuse and returns them only when the top of its heap is
free), so the service looked bloated long after the flood. Once requests were refused,
``malloc_trim`` hands the freed pages back; the service's own data is untouched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable
from typing import Any

from slurm_pal.advisor import protocol

__all__ = [
    "LARGE_LINES_AT_ONCE",
    "LARGE_LINE_BYTES",
    "MAX_ELEMENTS",
    "BadRequestTrimmer",
    "LargeLines",
    "malloc_trim",
]

log = logging.getLogger("slurm_pal.advisor")

LARGE_LINE_BYTES = 64 << 10
"""A request line above this is large (a decide or a record is a few KB)."""
LARGE_LINES_AT_ONCE = 2
"""How many large request lines are parsed and answered at a time (the others wait)."""
MAX_ELEMENTS = 10_000
"""The most JSON values a large request line may hold (a decide holds some tens)."""


def _libc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _libc_trim()


def malloc_trim() -> bool:
    """Hand the C heap's free pages back to the system; False where libc has no
    ``malloc_trim`` (or nothing was handed back)."""
    return bool(_TRIM(0)) if _TRIM is not None else False


class BadRequestTrimmer:
    """Every ``every_s``, when requests were refused since the last look (``refused()``: the
    count so far), trims the heap once they have stopped coming in for that period too (a
    flood's last buffers are free by then)."""

    def __init__(self, refused: Callable[[], int], every_s: float = 0.5) -> None:
        self.refused = refused
        self.every_s = every_s
        self.trims = 0
        self._seen = refused()
        self._pending = False

    def tick(self) -> bool:
        """One look (every ``every_s``); True when it trimmed the heap."""
        now = self.refused()
        if now != self._seen:
            self._seen, self._pending = now, True
            return False  # still coming: trim once they stop
        if not self._pending:
            return False
        self._pending = False
        malloc_trim()
        self.trims += 1
        return True

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.every_s):
            self.tick()


class LargeLines:
    """The service's ``answer``, with at most ``LARGE_LINES_AT_ONCE`` large lines parsed and
    answered at a time, and a large line of more than ``MAX_ELEMENTS`` values refused from a
    count (in C, no parse): a request is a few KB, and a flood of lines near the limit whose
    job is a long list held millions of small objects at once, memory the allocator kept
    fragmented long after."""

    def __init__(self, answer: Callable[..., dict[str, object]], counters: Any) -> None:
        self.answer = answer
        self.counters = counters
        self._slots = threading.BoundedSemaphore(LARGE_LINES_AT_ONCE)

    def __call__(
        self, line: bytes, after: list[Callable[[], object]] | None = None
    ) -> dict[str, object]:
        if len(line) <= LARGE_LINE_BYTES:
            return self.answer(line, after)
        elements = line.count(b",") + line.count(b"[") + line.count(b"{")
        if elements > MAX_ELEMENTS:
            self.counters.add("bad_requests")
            return protocol.error_answer(
                f"request of {len(line)} bytes holds {elements} JSON values or more (at most "
                f"{MAX_ELEMENTS}): refused unparsed"
            )
        with self._slots:
            return self.answer(line, after)
