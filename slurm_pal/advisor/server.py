"""``slurm-pal serve``: the advisor on a Unix socket (PROTOCOL.md), with its background work.

Why threads and the stdlib: every sbatch opens one short connection from slurmctld's
job_submit.lua, which waits (with slurmctld's job-write lock held) for one answer line, so
the decide path must be short and never wait for Slurm or SQLite; a thread per connection
keeps a slow or hostile peer from delaying the others. Three background threads do the slow
work: the Slurm refresh (plus the spool sweep and reservation expiry), the re-planning round,
and the store writer (:class:`~slurm_pal.advisor.state.StoreWriter`).

A malformed request gets an error answer and is counted (``bad_requests``); nothing a peer
sends stops the service. Peers are checked with ``SO_PEERCRED``: root, the service's own user
and ``advisor.allowed_users`` are served, others get ``permission denied``.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import grp
import json
import logging
import math
import os
import pwd
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_pal.adapters.slurm.update import JobApplier, ScontrolApplier
from slurm_pal.advisor import protocol
from slurm_pal.advisor.bounded import BoundedThreadingMixIn, ConnectionSlots, LineReader
from slurm_pal.advisor.decide import parse_admin_comment
from slurm_pal.advisor.failopen import FailOpenLog, fail_open_path
from slurm_pal.advisor.heap import FrozenHeap
from slurm_pal.advisor.jobdesc import JobDescError, JobDescription
from slurm_pal.advisor.jobend import job_gpus
from slurm_pal.advisor.logtext import quoted
from slurm_pal.advisor.replan import PendingJob, ReplanResult, plan_replan, with_written
from slurm_pal.advisor.state import AdvisorState, View

__all__ = ["AdvisorServer", "Counters", "ReloadRefused", "peer_uid", "sweep_spool"]

log = logging.getLogger("slurm_pal.advisor")
LATENCY_WINDOW = 2048
MAX_READ_SHARE = 0.25
"""The most of its time the refresh thread spends reading Slurm (see ``_refresh_pause``)."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class ReloadRefused(Exception):
    """A reload whose config or labels.json is unusable: the running config is kept."""


class Counters:
    """PROTOCOL.md's ``stats`` counters; decide latency percentiles over the last requests."""

    NAMES = (
        "decide_total",
        "decide_route",
        "decide_pass",
        "decide_wait",
        "decide_deny",
        "decide_errors",
        "decide_late",
        "answers_undelivered",
        "records_total",
        "records_duplicate",
        "records_rejected",
        "replans",
        "replans_at_job_end",
        "replans_coalesced",
        "replan_updates",
        "replan_failed",
        "refresh_errors",
        "peer_refused",
        "connections_refused",
        "connections_closed_for_room",
        "requests_timed_out",
        "bad_requests",
        "spool_applied",
        "spool_applied_prolog",
        "spool_applied_epilog",
        "spool_bad",
        "fail_open",
        "reloads",
        "reloads_refused",
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)
        self._latency: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._end_rounds: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._reads: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        # Cumulative since start, for the Prometheus endpoint (the windows above are for stats).
        self._histograms = {
            "decide": Histogram(DECIDE_BUCKETS),
            "replan_round": Histogram(ROUND_BUCKETS),
            "job_end": Histogram(ROUND_BUCKETS),
            "slurm_read": Histogram(ROUND_BUCKETS),
        }
        self._clock = clock
        self._started = clock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def decide_ms(self, ms: float) -> None:
        with self._lock:
            self._latency.append(ms)
            self._histograms["decide"].observe(ms / 1000)

    def replan_round_ms(self, ms: float) -> None:
        """How long one re-planning round took (plan and Slurm writes), whatever started it."""
        with self._lock:
            self._histograms["replan_round"].observe(ms / 1000)

    def job_end_ms(self, ms: float) -> None:
        """How long an Epilog waited for its answer: its round (or the one it joined) and the
        record's store write."""
        with self._lock:
            self._end_rounds.append(ms)
            self._histograms["job_end"].observe(ms / 1000)

    def slurm_read_ms(self, ms: float) -> None:
        """How long one Slurm read took (jobs and nodes, parsed, the queue worked out): what a
        large queue costs the refresh thread, and slurmctld with it."""
        with self._lock:
            self._reads.append(ms)
            self._histograms["slurm_read"].observe(ms / 1000)

    def histograms(self) -> dict[str, Histogram]:
        """Copies of the cumulative histograms (seconds): decide, replan_round, job_end,
        slurm_read."""
        with self._lock:
            return {name: h.copy() for name, h in self._histograms.items()}

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            out: dict[str, object] = dict(self._values)
            window = sorted(self._latency)
            ends = sorted(self._end_rounds)
            reads = sorted(self._reads)
        out["decide_ms_p50"] = _percentile(window, 0.50)
        out["decide_ms_p99"] = _percentile(window, 0.99)
        out["decide_window"] = len(window)
        out["job_end_ms_p50"] = _percentile(ends, 0.50)
        out["job_end_ms_p99"] = _percentile(ends, 0.99)
        out["job_end_ms_max"] = ends[-1] if ends else None
        out["slurm_read_ms_p50"] = _percentile(reads, 0.50)
        out["slurm_read_ms_max"] = reads[-1] if reads else None
        out["uptime_s"] = round(self._clock() - self._started, 3)
        return out


DECIDE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (s) of the decide histogram: a decide is well under a millisecond in memory; the
plugin gives up at advisor.submit_timeout_ms (300 ms)."""
ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (s) of the re-planning round and job-end histograms (the Epilog waits 900 ms)."""


class Histogram:
    """A cumulative histogram (Prometheus' ``le`` buckets, plus sum and count); not locked:
    :class:`Counters` holds its lock around every use."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket; the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def copy(self) -> Histogram:
        twin = Histogram(self.bounds)
        twin.counts, twin.sum, twin.count = list(self.counts), self.sum, self.count
        return twin


#: Job states in which a job holds its GPUs (Slurm keeps them until each node's Epilog ends).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})

#: A re-planning round slower than this logs where its time went (an Epilog waits for it).
SLOW_ROUND_S = 0.25


def refresh_pause(refresh_s: float, spent_s: float) -> float:
    """The wait before the next Slurm read: ``refresh_s``, stretched so reading takes at most
    :data:`MAX_READ_SHARE` of the refresh thread's time. Parsing a large queue holds the GIL
    (about a second at 10,000 pending jobs on the 2-core testbed); read back to back, it
    starved the decides (answers past the plugin's timeout) and the job-end rounds. Between
    reads, reservations and the Epilogs' freed GPUs keep the view current."""
    return max(refresh_s, spent_s * (1 / MAX_READ_SHARE - 1))


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, min(len(values), int(-(-q * len(values) // 1))))
    return round(values[rank - 1], 4)


def allowed_uids(users: Iterable[str]) -> frozenset[int]:
    """Root, this process's user and the named users that exist here."""
    uids = {0, os.geteuid()}
    for user in users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    return frozenset(uids)


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
            log.warning("spool %s unreadable: %s", path, exc)
            continue
        except protocol.ProtocolError as exc:
            bad += 1
            log.warning("spool %s is not a valid record (%s): moved to %s.bad", path, exc, path)
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name + ".bad"))
            continue
        try:
            duplicate = not apply(request.body["record"])  # type: ignore[arg-type]
        except Exception as exc:  # the store is busy or broken: try again next sweep
            log.warning("spool %s not applied: %s", path, exc)
            continue
        applied += 1
        if counters is not None:
            kind = request.body["record"].get("kind")  # type: ignore[union-attr]
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


class _Handler(socketserver.BaseRequestHandler):
    server: _UnixServer

    def handle(self) -> None:
        self.server.advisor.handle_connection(self.request, self.server.slots)


class _UnixServer(BoundedThreadingMixIn, socketserver.UnixStreamServer):
    """One thread per connection, at most ``advisor.max_connections`` at once (the rules of
    :mod:`.bounded`: a request deadline, room made by closing the longest-waiting one, past
    that a one-line refusal)."""

    allow_reuse_address = False

    def __init__(self, path: str, advisor: AdvisorServer) -> None:
        self.advisor = advisor
        self.slots = ConnectionSlots(advisor.max_connections)
        super().__init__(path, _Handler)

    def refuse(self, request: socket.socket) -> None:
        self.advisor.refuse_busy(request)

    def closed_for_room(self) -> None:
        self.advisor.counters.add("connections_closed_for_room")


class AdvisorServer:
    """The service: socket, ops, counters and background threads around an AdvisorState."""

    def __init__(
        self,
        state: AdvisorState,
        socket_path: Path,
        *,
        allowed: Iterable[str] | None = None,
        socket_group: str | None = None,
        refresh_s: float | None = None,
        replan_s: float | None = None,
        replan_on_epilog: bool | None = None,
        spool_dir: Path | None = None,
        applier: JobApplier | None = None,
        reload_config: Callable[[], None] | None = None,
        io_timeout_s: float = 10.0,
        request_timeout_s: float | None = None,
        wall_clock: Callable[[], float] = time.time,
        max_connections: int | None = None,
        listen: str | None = None,
        heap: FrozenHeap | None = None,
    ) -> None:
        """``heap``: freeze the process heap after each Slurm read (:mod:`.heap`; ``serve``
        does; a test process that runs the service in its own heap does not)."""
        cfg = state.config
        self.heap = heap
        self.listen = cfg.advisor.listen if listen is None else listen or None
        self._tcp: Any = None  # transport.RecordListener when advisor.listen is set
        self._ended_jobs: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.max_connections = (
            cfg.advisor.max_connections if max_connections is None else max_connections
        )
        self.wall_clock = wall_clock  # epoch seconds, as the plugin's deadlines are
        self.state = state
        self.socket_path = Path(socket_path)
        self.allowed = allowed_uids(cfg.advisor.allowed_users if allowed is None else allowed)
        self.socket_group = cfg.advisor.socket_group if socket_group is None else socket_group
        self.refresh_s = cfg.advisor.refresh_s if refresh_s is None else refresh_s
        self.replan_s = cfg.advisor.replan_s if replan_s is None else replan_s
        self.replan_on_epilog = (
            cfg.advisor.replan_on_epilog if replan_on_epilog is None else replan_on_epilog
        )
        self.spool_dir = Path(cfg.hooks.spool_dir if spool_dir is None else spool_dir)
        self.applier = applier or ScontrolApplier(getattr(state.reader, "env", None))
        self.reload_config = reload_config
        self._reload_lock = threading.Lock()
        self.io_timeout_s = io_timeout_s  # for sending an answer
        self.request_timeout_s = (
            cfg.advisor.request_timeout_s if request_timeout_s is None else request_timeout_s
        )
        self.counters = Counters()
        self.fail_opens = FailOpenLog(fail_open_path(self.socket_path), self.socket_group)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: _UnixServer | None = None
        self._replan_lock = threading.Lock()
        self._end_lock = threading.Lock()  # job ends waiting for a round (coalescing)
        self._refresh_now = threading.Event()
        self._last_purge: float | None = None
        # job id -> (when, admin comment, tres_per_node, tres_per_job) this service wrote
        self._written: dict[int, tuple[float, str, str, str]] = {}
        # job id -> when a round placed it (routed, or left where Slurm will put it): starting
        # now, as far as the rounds before Slurm's next read are concerned
        self._placed: dict[int, float] = {}
        # held jobs whose bound a round has already acted on (so it acts once per job)
        self._holds_ended: set[int] = set()
        self._freed_at: dict[str, float] = {}  # GPUs job ends freed -> when (state clock)
        self._freed_by: dict[str, int] = {}  # ... -> the job whose end freed them
        self._next_round = 1
        self._done_round = 0
        self._last_end_result: ReplanResult | None = None
        self._store_waiting: str | None = None  # why the store is not open yet

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, open_store: Callable[[], bool] | None = None) -> None:
        """Load the store, read Slurm once, bind the socket, start the threads.

        ``open_store``: the store was locked by another process (``serve``): it is tried
        again until it opens (it returns True; each try waits up to a second for the lock).
        Meanwhile the socket answers: decides and records get an error (the plugin lets the
        job through as written, a hook spools its record), health says why."""
        if open_store is None:
            self.state.reload()
            self._refresh_once()
        else:
            self._store_waiting = f"store {self.state.store_path} is locked by another process"
            self.state.store_unavailable(f"{self._store_waiting}: not advising until it opens")
        if self.listen:  # bound first: a busy port stops the start before the socket exists
            from slurm_pal.advisor.transport import RecordListener

            self._tcp = RecordListener.for_advisor(self, self.listen)
            self._tcp.bind()
        self._bind()
        assert self._server is not None
        try:
            self.fail_opens.prepare()
        except OSError as exc:
            log.warning("cannot create %s (fail-opens not counted): %s", self.fail_opens.path, exc)
        self.poll_fail_opens()
        self._spawn("socket", lambda: self._server.serve_forever(poll_interval=0.2))  # type: ignore[union-attr]
        if self._tcp is not None:
            self._tcp.start()
        if open_store is None:
            self._start_background()
        else:
            log.warning("%s: serving without it (every GPU job fails open)", self._store_waiting)
            self._spawn("store-wait", lambda: self._wait_for_store(open_store))
        log.info(
            "serving on %s (policy %s, refresh %gs, replan %gs, replan on epilog %s, spool %s)",
            self.socket_path,
            self.state.policy_name,
            self.refresh_s,
            self.replan_s,
            "on" if self.replan_on_epilog else "off",
            self.spool_dir,
        )

    def _start_background(self) -> None:
        self._spawn("refresh", self._refresh_loop)
        self._spawn("replan", self._replan_loop)  # idle while replan_s is 0 (reload may set it)

    def _wait_for_store(self, open_store: Callable[[], bool]) -> None:
        """Try the locked store until it opens, then load it, read Slurm and start advising.
        The parsing worker starts meanwhile (a new interpreter: seconds on a busy machine), so
        the read after the release does not wait for it."""
        warm = getattr(self.state.reader, "warm", None)
        if callable(warm):

            def start_worker() -> None:
                began = time.monotonic()
                try:
                    warm()
                except Exception as exc:
                    log.warning("Slurm parsing worker not started: %s", exc)
                else:
                    log.info("Slurm parsing worker up in %.1f s", time.monotonic() - began)

            threading.Thread(target=start_worker, name="worker-start", daemon=True).start()
        while not self._stop.is_set():
            try:
                opened = open_store()
                if opened:
                    self.state.reload()
            except Exception as exc:  # a store that cannot be used: say so, keep trying
                log.warning("store not opened: %s", exc)
                opened = False
            if opened:
                break
            self._stop.wait(0.1)
        else:
            return
        self._refresh_once()
        self._store_waiting = None
        log.info("store %s opened: advising", self.state.store_path)
        self._start_background()

    def stop(self) -> None:
        """Stop the threads, close and remove the socket, flush the store writer."""
        self._stop.set()
        self._refresh_now.set()
        if self._tcp is not None:
            self._tcp.stop()
            self._tcp = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        for thread in self._threads:
            thread.join(timeout=15)
        self._threads.clear()
        self.state.writer.close()
        if self.heap is not None:
            self.heap.release()
        close = getattr(self.state.reader, "close", None)
        if callable(close):
            close()  # its parsing worker, if it has one
        log.info("stopped; socket %s removed", self.socket_path)

    def __enter__(self) -> AdvisorServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _bind(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale socket of a dead service
            else:
                raise RuntimeError(f"another advisor already listens on {path}")
            finally:
                probe.close()
        old = os.umask(0o117)
        try:
            self._server = _UnixServer(str(path), self)
        finally:
            os.umask(old)
        os.chmod(path, 0o660)
        try:
            gid = grp.getgrnam(self.socket_group).gr_gid
        except KeyError:
            log.warning(
                "socket group %r does not exist: socket left in our group", self.socket_group
            )
        else:
            with contextlib.suppress(PermissionError):
                os.chown(path, -1, gid)

    # -- background work ------------------------------------------------------------------------
    def _refresh_once(self) -> None:
        started = time.perf_counter()
        try:
            self.state.refresh()
        except Exception as exc:
            self.counters.add("refresh_errors")
            log.warning("refresh failed (old view kept): %s", exc)
        else:
            self.counters.slurm_read_ms(round((time.perf_counter() - started) * 1000, 1))

    def _purge_when_due(self) -> None:
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

    def _refresh_loop(self) -> None:
        rounds = 0
        pause = self.refresh_s
        while not self._stop.is_set():
            self._refresh_now.wait(pause)  # a refused write wakes it early
            self._refresh_now.clear()
            if self._stop.is_set():
                return
            started = time.perf_counter()
            self._refresh_once()
            self._round_for_due_holds()
            if self.heap is not None:
                self.heap.after_read()
            pause = self._refresh_pause(time.perf_counter() - started, pause)
            self.poll_fail_opens()
            rounds += 1
            if rounds % max(1, round(300 / max(self.refresh_s, 0.001))) == 0:
                log.info("stats %s", format_stats(self.counters.snapshot()))
            if rounds % 6 == 0:
                with contextlib.suppress(Exception):
                    self.state.refresh_store_view()
            self._purge_when_due()
            self.state.expire()
            if self.spool_dir.is_dir():
                sweep_spool(self.spool_dir, self.state.apply_record, self.counters)

    def _round_for_due_holds(self) -> None:
        """A held job's bound has come: a round places it now (wherever it fits, outliers
        included), as the simulator does, instead of leaving it to Slurm's next scheduling
        pass after its begin time (up to ``bf_interval``, 30 s by default). Once per job: a
        job that fits nowhere then is left to Slurm like any other."""
        view = self.state.view
        if view is None:
            return
        now = self.state.wall_clock()
        due = {p.job_id for p in view.pending if p.waiting is not None and p.waiting[1] <= now}
        new = due - self._holds_ended
        self._holds_ended = due
        if not new:
            return
        log.info("bound of held job(s) %s reached: a round places them", sorted(new))
        try:
            self.replan(refresh=False)
        except Exception as exc:
            log.warning("re-planning round at a bound failed: %s", exc)

    def _refresh_pause(self, spent_s: float, previous_s: float) -> float:
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

    def _replan_loop(self) -> None:
        while not self._stop.wait(self.replan_s if self.replan_s > 0 else 1.0):
            if self.replan_s <= 0:
                continue
            try:
                self.replan()
            except Exception as exc:
                log.warning("re-planning round failed: %s", exc)

    def replan(self, refresh: bool = True, freed: Iterable[str] = ()) -> ReplanResult:
        """One re-planning round now (the ``replan`` op and the background loop re-read Slurm
        first); ``freed``: UUIDs to count as free although Slurm still shows them used."""
        with self._replan_lock:
            if refresh:
                self._refresh_once()
            return self._counted_round(self._freed_now(frozenset(freed)))

    def replan_at_job_end(self, freed: Iterable[str], job_id: int | None = None) -> ReplanResult:
        """The round for a job's end, from the advisor's view as it is (no Slurm re-read: the
        Epilog names the GPUs, and GPUs freed by earlier ends since the last read still count).
        Ends that arrive together share one round: each end's GPUs join the next round to
        start, and an end whose round already ran while it waited for the lock returns that
        round's result. A round whose writes fail re-reads Slurm for the next one. ``job_id``:
        the ended job; its GPUs stop counting free once a read shows another job on them."""
        with self._end_lock:
            now = self.state.clock()
            for uuid in freed:
                self._freed_at[uuid] = now
                if job_id is not None:
                    self._freed_by[uuid] = job_id
            ticket = self._next_round
        with self._replan_lock:
            with self._end_lock:
                if self._done_round >= ticket and self._last_end_result is not None:
                    self.counters.add("replans_coalesced")
                    return self._last_end_result
                this_round = self._next_round
                self._next_round += 1
            result = self._counted_round(self._freed_now(frozenset()))
            with self._end_lock:
                self._done_round = this_round
                self._last_end_result = result
            if result.failed:  # a write lost to Slurm: the view is stale somewhere
                self._refresh_now.set()  # re-read now, without holding the waiting ends
            return result

    def _freed_now(self, extra: frozenset[str]) -> frozenset[str]:
        """``extra`` plus the GPUs job ends freed that Slurm's last read may not show free yet
        (added less than 2 s before that read began); older ones are dropped."""
        read_start = self.state.last_read_start
        # A GPU an end freed that the last read shows held by another job was taken since
        # (Slurm started a job there on its own): counting it free would pin a job onto it.
        held, still_theirs = self._held_gpus() if self._freed_by else ({}, lambda u, j: True)
        with self._end_lock:
            if read_start is not None:
                self._freed_at = {u: t for u, t in self._freed_at.items() if t > read_start - 2.0}
            self._freed_at = {
                u: t
                for u, t in self._freed_at.items()
                if (j := self._freed_by.get(u)) is None
                or (held.get(u, j) == j and (u in held or still_theirs(u, j)))
            }
            self._freed_by = {u: j for u, j in self._freed_by.items() if u in self._freed_at}
            return extra | frozenset(self._freed_at)

    def _held_gpus(self) -> tuple[dict[str, int], Callable[[str, int], bool]]:
        """GPU UUID -> the job the view shows holding it (its indices from the read, or from
        its records: the brief read has none), and a test for a GPU no known job holds: is it
        still the ended job's (the read shows it free, or shows that job still on its node,
        its Epilog running), or did a job the advisor knows no indices of take it?"""
        view = self.state.view
        if view is None:
            return {}, lambda uuid, job_id: True
        labels = view.static.labels
        held: dict[str, int] = {}
        on_nodes: dict[int, tuple[str, ...]] = {}
        for job in view.jobs:
            if job.state not in HOLDING_STATES:
                continue
            on_nodes[job.job_id] = job.nodes
            for node, indices in self.state.job_gpu_indices(job).items():
                for index in indices:
                    with contextlib.suppress(KeyError):
                        held[labels.uuid_at_slurm_index(node, index)] = job.job_id
        node_of = labels.node_of_uuid

        def still_theirs(uuid: str, job_id: int) -> bool:
            return uuid not in view.busy or node_of(uuid) in on_nodes.get(job_id, ())

        return held, still_theirs

    def _counted_round(self, freed: frozenset[str]) -> ReplanResult:
        start = time.perf_counter()
        result = self._replan_round(freed)
        self.counters.replan_round_ms((time.perf_counter() - start) * 1000)
        self.counters.add("replans")
        self.counters.add("replan_updates", len(result.applied))
        self.counters.add("replan_failed", len(result.failed))
        return result

    def _pending_jobs(self, view: View) -> list[PendingJob]:
        """The pending jobs this advisor steered and Slurm would start, in priority order,
        as Slurm's last read shows them (worked out with the read: ``view.pending``) and as
        this service updated them since. Costs one look-up per job: an Epilog waits for it."""
        # What this service wrote to jobs after the view's Slurm read: rounds that do not
        # re-read Slurm must see their own updates (else a routed job looks untyped still).
        state = self.state
        read_start = state.last_read_start if state.last_read_start is not None else view.taken
        self._written = {j: w for j, w in self._written.items() if w[0] >= read_start}
        # A job an earlier round placed is starting: that round's ends were answered, so Slurm
        # is free to start it on the GPUs the round counted, and it holds them (a reservation)
        # until a read shows it. Planning it again before then only races Slurm: a write that
        # arrives after the start is refused ("no longer pending"), and wakes a full re-read.
        self._placed = {j: t for j, t in self._placed.items() if t >= read_start}
        if not self._written and not self._placed:
            return list(view.pending)
        pending: list[PendingJob] = []
        for p in view.pending:
            if p.job_id in self._placed:
                continue
            written = self._written.get(p.job_id)
            if written is None:
                pending.append(p)
                continue
            updated = with_written(p, parse_admin_comment(written[1]), written[2], written[3])
            if updated is not None:
                pending.append(updated)
        return pending

    def _replan_round(self, freed: frozenset[str] = frozenset()) -> ReplanResult:
        state = self.state
        view = state.view
        if view is None:
            return ReplanResult()
        started = time.perf_counter()
        reservations = state.reservations()
        pending = self._pending_jobs(view)
        if not pending:
            return ReplanResult()
        gathered = time.perf_counter()
        tokens = {p.token for p in pending}
        cluster = view.base.copy()
        index = cluster.uuid_index
        cluster.release_uuids(u for u in freed if u in index and not cluster.free[index[u]])
        for token, res in reservations.items():
            if token in tokens:
                continue
            ids = [
                cluster.uuid_index[u]
                for u in res.uuids
                if u in cluster.uuid_index and cluster.free[cluster.uuid_index[u]]
            ]
            if ids:
                cluster.allocate(ids)
        known = dict(view.requests)  # the round's own: a new job's request is added to it
        result = plan_replan(
            pending,
            cluster,
            known=known,
            labels=view.static.labels,
            policy=state.policy,
            version=state.version,
            class_order=view.static.class_order,
            partition_nodes=view.partition_nodes,
            default_partition=view.default_partition,
            release=getattr(self.applier, "release", None),  # 24.11 replaces typed requests
            leave_packing=state.config.advisor.pin == "steered",
            now=state.wall_clock(),
        )
        # Each job's steps run in order, the jobs in priority order (the jobs Slurm will start
        # first are updated first); the applier decides how a round goes to Slurm (processes
        # side by side, one scontrol reading them all, or pyslurm RPCs: adapters/slurm).
        changes = [update.change for update in result.updates]
        planned = time.perf_counter()
        errors = self.applier.apply_many(changes)
        written = time.perf_counter()
        placed_at = state.clock()
        for job_id, (token, uuids) in result.in_place.items():
            self._hold_placed(job_id, token, uuids, placed_at)
        if written - started > SLOW_ROUND_S:
            log.info(
                "slow round: %d pending jobs read in %.0f ms, planned in %.0f ms, "
                "%d update(s) written in %.0f ms",
                len(pending),
                (gathered - started) * 1000,
                (planned - gathered) * 1000,
                len(changes),
                (written - planned) * 1000,
            )
        for update, error in zip(result.updates, errors, strict=True):
            if error is not None:
                result.failed[update.job_id] = error
                log.warning("re-plan of job %d failed: %s", update.job_id, error)
                continue
            result.applied.append(update.job_id)
            fields = update.decision.set_fields
            self._written[update.job_id] = (
                state.clock(),
                str(fields.get("admin_comment", "")),
                str(fields.get("tres_per_node", update.pending.tres_per_node)),
                str(fields.get("tres_per_job", update.pending.tres_per_job)),
            )
            answer = update.decision.to_wire()
            allocation = update.decision.allocation
            if allocation is None:  # held: its begin time is the wait's bound
                state.writer.submit(
                    lambda s, t=update.token, a=answer: s.update_decision(
                        t, state="waiting", answer=a
                    )
                )
                log.info(
                    "job %d held until %s: %s",
                    update.job_id,
                    _epoch_text(update.decision.wait_until),
                    update.decision.reason,
                )
                continue
            self._hold_placed(update.job_id, update.token, allocation.uuids, placed_at)
            state.writer.submit(
                lambda s, t=update.token, a=answer: s.update_decision(
                    t, state="replanned", answer=a
                )
            )
            log.info(
                "re-planned job %d: %s -> %s (lv %.4f)",
                update.job_id,
                _gpus_text(update.before),
                _gpus_text(update.chosen),
                allocation.lv_product,
            )
        return result

    def _hold_placed(self, job_id: int, token: str, uuids: Sequence[str], at: float) -> None:
        """A round placed ``job_id`` on ``uuids``: it is starting until Slurm's next read (left
        out of later rounds), its GPUs are held for it, and GPUs an end freed there are given
        away (a later round must not count them free again: the next read may predate its
        start)."""
        self._placed[job_id] = at
        self.state.reserve(token, uuids, job_id)
        with self._end_lock:
            for uuid in uuids:
                self._freed_at.pop(uuid, None)

    # -- connections ----------------------------------------------------------------------------
    def refuse_busy(self, conn: socket.socket) -> None:
        self.counters.add("connections_refused")
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            message = f"busy: {self.max_connections} connections open (advisor.max_connections)"
            conn.sendall(protocol.encode(protocol.error_answer(message)))
            conn.shutdown(socket.SHUT_WR)
            # Read what the peer already sent: closing over unread bytes resets the connection,
            # and the peer would lose the refusal. Non-blocking: this runs on the accept loop.
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while conn.recv(65536):
                    pass

    def handle_connection(self, conn: socket.socket, slots: ConnectionSlots) -> None:
        try:
            uid = peer_uid(conn)
        except OSError:
            uid = -1
        if uid not in self.allowed:
            self.counters.add("peer_refused")
            log.warning("refused peer uid %d", uid)
            with contextlib.suppress(OSError):
                conn.sendall(protocol.encode(protocol.error_answer("permission denied")))
            return
        reader = LineReader(conn)
        while not self._stop.is_set():
            line = self.next_line(conn, reader, slots)
            if line is None:
                return
            after: list[Callable[[], object]] = []
            answer = self.answer(line, after)
            sent = self._send(conn, answer)
            if not sent:
                self._undelivered(answer, "the peer was gone")
            for task in after:  # store writes, once the peer has its answer
                task()
            if not sent:
                return
            slots.waiting(conn)

    def next_line(
        self, conn: socket.socket, reader: LineReader, slots: ConnectionSlots
    ) -> bytes | None:
        """The next whole request line of a connection (Unix socket or TCP), or None when the
        connection is done: closed, given up for room, or a line cut short or over
        ``protocol.MAX_LINE`` (answered with an error first)."""
        line = self.read_request(conn, reader)
        if not line or not slots.answering(conn):
            return None
        conn.settimeout(self.io_timeout_s)
        if line.endswith(b"\n"):
            return line
        self.counters.add("bad_requests")
        if len(line) > protocol.MAX_LINE:
            message = f"request line longer than {protocol.MAX_LINE} bytes"
            if self._send(conn, protocol.error_answer(message)):
                reader.drain()
        else:
            log.info("connection closed mid-request (%d bytes)", len(line))
        return None

    def read_request(self, conn: socket.socket, reader: LineReader) -> bytes | None:
        """The next request line (b"" at the peer's end; an over-long or cut line as it came),
        or None when it did not arrive whole within ``request_timeout_s`` (the peer is told)
        or the connection broke."""
        deadline = time.monotonic() + self.request_timeout_s
        try:
            return reader.readline(protocol.MAX_LINE + 2, deadline)
        except TimeoutError:
            self.counters.add("requests_timed_out")
            message = f"no whole request line within {self.request_timeout_s:g} s"
            with contextlib.suppress(OSError):
                conn.settimeout(1.0)
                conn.sendall(protocol.encode(protocol.error_answer(message)))
            return None
        except OSError:
            return None

    def _send(self, conn: socket.socket, answer: Mapping[str, object]) -> bool:
        try:
            conn.sendall(protocol.encode(answer))
            return True
        except (OSError, ValueError) as exc:
            log.info("answer not sent: %s", exc)
            return False

    def answer(
        self, line: bytes, after: list[Callable[[], object]] | None = None
    ) -> dict[str, object]:
        """The answer to one request line (never raises); work that can wait until the answer
        is sent is appended to ``after`` (done at once without it)."""
        start = time.perf_counter()
        try:
            request = protocol.parse_request(line)
        except protocol.ProtocolError as exc:
            self.counters.add("bad_requests")
            return exc.answer()
        waiting = self._store_waiting
        if waiting is not None and request.op in ("decide", "record"):
            # Nothing to advise with, nowhere to keep a record: the plugin fails open and the
            # hook spools (the spool is swept once the store opens).
            return protocol.error_answer(f"not advising yet: {waiting}")
        try:
            if request.op == "decide":
                return self._decide(request.body, start, after)
            if request.op == "record":
                return self._record(request.body)
            if request.op == "health":
                return {"v": 1, "ok": True, **self.state.health()}
            if request.op == "stats":
                return {"v": 1, "ok": True, **self.counters.snapshot()}
            if request.op == "replan":
                return {"v": 1, "ok": True, **self.replan().summary()}
            if request.op == "reload":
                return {"v": 1, "ok": True, **self.reload()}
        except ReloadRefused as exc:  # logged by reload()
            return protocol.error_answer(f"reload refused, running config kept: {exc}")
        except Exception as exc:  # a bug or a broken store must not end the service
            log.exception("op %s failed", request.op)
            if request.op == "decide":
                self.counters.add("decide_errors")
            return protocol.error_answer(f"{request.op} failed: {exc}")
        return protocol.error_answer(f"unknown op {request.op!r}", protocol.OPS)

    def reload(self) -> dict[str, object]:
        """The ``reload`` op and SIGHUP: re-read the config (``reload_config`` applies what can
        change live and returns the keys that changed), labels.json and the store, then Slurm.
        Reservations, decisions and counters stay. A config ``reload_config`` refuses raises
        :class:`ReloadRefused` after one log line; nothing changes then."""
        with self._reload_lock:
            try:
                changed = self.reload_config() if self.reload_config is not None else None
            except ReloadRefused as exc:
                self.counters.add("reloads_refused")
                log.warning("reload refused, running config kept: %s", exc)
                raise
            self.state.reload()
            self._refresh_once()
            self.counters.add("reloads")
            changed = list(changed or ())
            log.info("reloaded config, labels and store: %s", ", ".join(changed) or "no change")
            return {**self.state.health(), "changed": changed}

    def poll_fail_opens(self) -> int:
        """Count job_submit.lua's new fail-open lines (each refresh, each metrics scrape)."""
        new = self.fail_opens.poll()
        if new:
            self.counters.add("fail_open", new)
        return new

    def _undelivered(self, answer: Mapping[str, object], why: str) -> None:
        """A route nobody received: the job went through as written, so the GPUs reserved for
        it are free again at once (not after the reservation's TTL)."""
        token = answer.get("token")
        if answer.get("action") == "route" and isinstance(token, str):
            self.state.release_reservation(token)
            self.counters.add("answers_undelivered")
            log.info("reservation %s released: answer not received (%s)", token, why)

    def _decide(
        self,
        body: Mapping[str, object],
        start: float,
        after: list[Callable[[], object]] | None = None,
    ) -> dict[str, object]:
        wire = body["job"]
        assert isinstance(wire, dict)
        deadline = body.get("deadline")
        if isinstance(deadline, int | float) and self.wall_clock() > deadline:
            # The plugin has given up and let the job through as written (a pause, swap, GC):
            # deciding now would reserve GPUs for an answer nobody reads.
            self.counters.add("decide_late")
            late = self.wall_clock() - deadline
            return protocol.error_answer(f"request read {late:.3f} s past its deadline")
        try:
            job = JobDescription.from_wire(wire)
        except JobDescError as exc:
            self.counters.add("decide_errors")
            return protocol.error_answer(str(exc))
        decision = self.state.decide(job, wire, after)
        answer = decision.to_wire()
        if isinstance(deadline, int | float):

            def check_deadline(answer: dict[str, object] = answer, limit: float = deadline) -> None:
                if self.wall_clock() > limit:
                    self._undelivered(answer, "sent past the plugin's deadline")

            if after is None:
                check_deadline()
            else:
                after.insert(0, check_deadline)
        self.counters.add("decide_total")
        self.counters.add(f"decide_{decision.action}")
        self.counters.decide_ms((time.perf_counter() - start) * 1000)

        def note() -> None:
            log.info(
                "decide %s user=%s name=%s class=%s token=%s: %s",
                decision.action,
                quoted(job.user),
                quoted(job.name),
                decision.job_class,
                decision.token,
                decision.reason,
            )

        if after is None:
            note()
        else:
            after.append(note)
        return answer

    def apply_record(self, record: dict[str, object], replan: bool = True) -> dict[str, object]:
        """The ``record`` op's answer for a record that came another way (the TCP listener,
        after its checks); ``replan=False``: store it but start no round."""
        waiting = self._store_waiting
        if waiting is not None:
            return protocol.error_answer(f"not advising yet: {waiting}")
        return self._record({"record": record}, replan=replan)

    def _record(self, body: Mapping[str, object], replan: bool = True) -> dict[str, object]:
        record = body["record"]
        assert isinstance(record, dict)
        start = time.perf_counter()
        known = self.state.seen_record(record)
        write = self.state.submit_record(record)
        # The round runs while the store writer catches up (it may hold many decisions queued
        # before this record); the answer waits for both, so an ok means the record is stored.
        round_due = replan and not known and self.replan_on_epilog
        round_due = round_due and record.get("kind") == "epilog" and self._first_end(record)
        replan_answer = None
        if round_due:
            replan_answer = self._replan_at_job_end(record)
        added = write.result(timeout=30.0)
        self.counters.add("records_total")
        if not added:
            self.counters.add("records_duplicate")
        answer: dict[str, object] = {"v": 1, "ok": True, "duplicate": not added}
        if added and replan_answer is not None:
            answer["replan"] = replan_answer
        if record.get("kind") == "epilog":  # what the Epilog waited for: round and write
            self.counters.job_end_ms(round((time.perf_counter() - start) * 1000, 1))
        return answer

    def _first_end(self, record: Mapping[str, object]) -> bool:
        """Is this the first Epilog of its job to start a round? A multi-node job's first one
        frees every node the view shows it on, so the other nodes' records need no round;
        a job the view does not show (it began and ended between two reads) frees only each
        record's own node, so each of its records gets its round."""
        job_id = record.get("job_id")
        if not isinstance(job_id, int):
            return True
        with self._end_lock:
            if job_id in self._ended_jobs:
                return False
            if job_gpus(self.state.view, job_id, self.state.recorded_gpus(job_id)) is not None:
                self._ended_jobs[job_id] = None
                while len(self._ended_jobs) > 10_000:
                    self._ended_jobs.popitem(last=False)
        return True

    def _replan_at_job_end(self, record: Mapping[str, object]) -> dict[str, object] | None:
        """Re-plan the pending jobs while the Epilog that sent ``record`` waits for this
        answer: Slurm keeps the ending job's GPUs until its Epilog ends (checked on 22.05), so
        the updates land before Slurm can start anything on them, and pending jobs get
        PM-First/PAL's choice when they start, not only when they were submitted."""
        start = time.perf_counter()
        freed = self.state.released_by(record)
        # A multi-node job's first Epilog frees every node the job held (the view knows them)
        job_id = record.get("job_id")
        whole = (
            job_gpus(self.state.view, job_id, self.state.recorded_gpus(job_id))
            if isinstance(job_id, int)
            else None
        )
        if whole is not None:
            freed = [*freed, *whole]
        try:
            result = self.replan_at_job_end(freed, job_id if isinstance(job_id, int) else None)
        except Exception as exc:  # the record is kept; re-planning is best effort
            log.warning("re-planning at the end of job %s failed: %s", record.get("job_id"), exc)
            return None
        self.counters.add("replans_at_job_end")
        ms = round((time.perf_counter() - start) * 1000, 1)
        if result.applied or result.kept:
            log.info(
                "end of job %s: re-planned %d job(s), kept %d, in %.1f ms",
                record.get("job_id"), len(result.applied), len(result.kept), ms,
            )  # fmt: skip
        return {"applied": result.applied, "kept": len(result.kept), "ms": ms}


def _epoch_text(epoch: float | None) -> str:
    """An epoch time as the controller's local time, for a log line."""
    if epoch is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _gpus_text(gpus: Mapping[str, Iterable[str]] | None) -> str:
    if not gpus:
        return "(untyped)"
    return ";".join(f"{n}:{'+'.join(labels)}" for n, labels in gpus.items())


def format_stats(stats: Mapping[str, object]) -> str:
    """One log line of the counters (for the periodic journal line)."""
    return json.dumps({k: v for k, v in stats.items() if k not in ("v", "ok")}, sort_keys=True)
