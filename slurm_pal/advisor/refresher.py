"""The advisor's refresh thread: it reads Slurm into the view every ``advisor.refresh_s``
(stretched while reads are slow), and between reads does the slow chores: a round for held
jobs whose bound has come, the class snapshot, the daily purge, reservation expiry and the
hooks' spool.

Why apart from the server: it is one loop over the state with its own timing rules
(:func:`refresh_pause`); the server only starts and stops it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_pal.advisor import protocol
from slurm_pal.advisor.counters import Counters, format_stats
from slurm_pal.advisor.logtext import about, reason

if TYPE_CHECKING:
    from slurm_pal.advisor.heap import FrozenHeap
    from slurm_pal.advisor.state import AdvisorState

__all__ = ["MAX_READ_SHARE", "RefreshLoop", "refresh_pause", "sweep_spool"]

log = logging.getLogger("slurm_pal.advisor")

MAX_READ_SHARE = 0.25
"""The most of its time the refresh thread spends reading Slurm (see :func:`refresh_pause`)."""


def refresh_pause(refresh_s: float, spent_s: float) -> float:
    """The wait before the next Slurm read: ``refresh_s``, stretched so reading takes at most
    :data:`MAX_READ_SHARE` of the refresh thread's time. Parsing a large queue holds the GIL
    (about a second at 10,000 pending jobs on the 2-core testbed); read back to back, it
    starved the decides (answers past the plugin's timeout) and the job-end rounds. Between
    reads, reservations and the Epilogs' freed GPUs keep the view current."""
    return max(refresh_s, spent_s * (1 / MAX_READ_SHARE - 1))


def sweep_spool(
    spool_dir: Path,
    apply: Callable[[Mapping[str, object]], bool],
    counters: Counters | None = None,
) -> tuple[int, int]:
    """Deliver the hooks' spooled records (``*.json``, not ``.``-files): each is applied like
    a ``record`` op and deleted; a file that is not a valid record is renamed ``*.bad`` with a
    log line. Returns (applied, bad). A store failure leaves the file for the next sweep."""
    applied = bad = 0
    try:
        names = sorted(p for p in spool_dir.glob("*.json") if not p.name.startswith("."))
    except OSError:
        return 0, 0
    for path in names:
        if not path.is_file():
            continue
        try:
            line = path.read_bytes()
            request = protocol.parse_request(
                b'{"v":1,"op":"record","record":' + line.strip() + b"}"
            )
        except OSError as exc:
            log.warning("spool %s unreadable (left for the next sweep): %s", path, _why(exc))
            continue
        except protocol.ProtocolError as exc:
            bad += 1
            log.warning("spool %s is not a valid record (%s): moved to %s.bad", path, exc, path)
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name + ".bad"))
            continue
        record = request.body["record"]
        try:
            duplicate = not apply(record)  # type: ignore[arg-type]
        except Exception as exc:  # the store is busy or broken: try again next sweep
            log.warning(
                "spool %s (%s) not applied, tried again at the next sweep: %s",
                path,
                about(record),  # type: ignore[arg-type]
                _why(exc),
            )
            continue
        applied += 1
        if counters is not None:
            kind = request.body["record"].get("kind")  # type: ignore[attr-defined]
            if kind in ("prolog", "epilog"):  # an Epilog's record spooled: its round was late
                counters.add(f"spool_applied_{kind}")
            counters.add("records_total")
            if duplicate:
                counters.add("records_duplicate")
        with contextlib.suppress(OSError):
            path.unlink()
    if counters is not None:
        counters.add("spool_applied", applied)
        counters.add("spool_bad", bad)
    return applied, bad


def _why(exc: BaseException) -> str:
    """Why a record was not applied, never empty (a timeout carries no message)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "the store writer did not answer in time (queued writes before it)"
    return reason(exc)


class RefreshLoop:
    """Reads Slurm into ``state`` (:meth:`refresh_once`, also for a reload or the ``replan``
    op) and runs the refresh thread (:meth:`run`). ``due_holds`` starts the round for held
    jobs whose bound has come; ``poll_fail_opens`` counts the plugin's fail-open lines;
    ``wake`` ends the current pause early; ``remeasure`` (suspect GPUs' re-measure jobs) and
    ``after_read`` (stalled routes handed back) run after each read."""

    def __init__(
        self,
        state: AdvisorState,
        counters: Counters,
        *,
        refresh_s: float,
        spool_dir: Path,
        due_holds: Callable[[], None],
        poll_fail_opens: Callable[[], object],
        wake: threading.Event,
        heap: FrozenHeap | None = None,
        remeasure: Callable[[], None] | None = None,
        after_read: Callable[[], None] | None = None,
    ) -> None:
        self.state = state
        self.counters = counters
        self.refresh_s = refresh_s
        self.spool_dir = spool_dir
        self.heap = heap
        self.wake = wake  # set: read Slurm at once (a refused write, a stop)
        self._due_holds = due_holds
        self._poll_fail_opens = poll_fail_opens
        self._remeasure = remeasure  # suspect GPUs' re-measure jobs (advisor/remeasure.py)
        self._after_read = after_read  # stalled routes handed back (advisor/stalls.py)
        self._last_purge: float | None = None

    def refresh_once(self) -> None:
        """Read Slurm into the view; a failed read is counted and logged, the old view kept."""
        started = time.perf_counter()
        try:
            self.state.refresh()
        except Exception as exc:
            self.counters.add("refresh_errors")
            log.warning("refresh failed (old view kept): %s", exc)
        else:
            self.counters.slurm_read_ms(round((time.perf_counter() - started) * 1000, 1))

    def purge_when_due(self) -> None:
        """Once a day (and at start): delete what is older than ``store.retention_days``."""
        days = self.state.config.store.retention_days
        now = time.monotonic()
        if days <= 0 or (self._last_purge is not None and now - self._last_purge < 86400):
            return
        self._last_purge = now

        def purge(store: Any) -> None:
            counts = store.purge_advisor_history(days)
            if any(counts.values()):
                log.info("purged what is older than %g days: %s", days, counts)

        self.state.writer.submit(purge)

    def run(self, stopping: threading.Event) -> None:
        """The refresh thread, until ``stopping`` is set (set ``wake`` too, to wake it)."""
        rounds = 0
        pause = self.refresh_s
        while not stopping.is_set():
            self.wake.wait(pause)  # a refused write wakes it early
            self.wake.clear()
            if stopping.is_set():
                return
            started = time.perf_counter()
            self.refresh_once()
            self._due_holds()
            if self._remeasure is not None:
                self._remeasure()
            if self._after_read is not None:
                try:
                    self._after_read()
                except Exception as exc:  # a failed check must not stop the reads
                    log.warning("check of stalled routes failed: %s", exc)
            if self.heap is not None:
                self.heap.after_read()
            pause = self.pause(time.perf_counter() - started, pause)
            self._poll_fail_opens()
            rounds += 1
            if rounds % max(1, round(300 / max(self.refresh_s, 0.001))) == 0:
                log.info("stats %s", format_stats(self.counters.snapshot()))
            if rounds % 6 == 0:
                with contextlib.suppress(Exception):
                    self.state.refresh_store_view()
            self.purge_when_due()
            self.state.expire()
            if self.spool_dir.is_dir():
                sweep_spool(self.spool_dir, self.state.apply_record, self.counters)

    def pause(self, spent_s: float, previous_s: float) -> float:
        """:func:`refresh_pause`, logged when it starts or stops stretching ``refresh_s``."""
        pause = refresh_pause(self.refresh_s, spent_s)
        if (pause > self.refresh_s) != (previous_s > self.refresh_s):
            if pause > self.refresh_s:
                log.info(
                    "a Slurm read took %.2f s: reading every %.1f s, not every %g s",
                    spent_s,
                    pause + spent_s,
                    self.refresh_s,
                )
            else:
                log.info("Slurm reads are quick again: reading every %g s", self.refresh_s)
        return pause
