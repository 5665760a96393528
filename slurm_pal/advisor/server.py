"""``slurm-pal serve``: the advisor on a Unix socket (PROTOCOL.md), with its background work.

Why threads and the stdlib: every sbatch opens one short connection from slurmctld's
job_submit.lua, which waits (with slurmctld's job-write lock held) for one answer line, so
the decide path must be short and never wait for Slurm or SQLite; a thread per connection
keeps a slow or hostile peer from delaying the others. Three background threads do the slow
work: the Slurm refresh (plus the spool sweep and reservation expiry), the re-planning round,
and the store writer (:class:`~slurm_pal.advisor.writer.StoreWriter`).

:class:`AdvisorServer` is the service's lifecycle and its ops; it owns its parts: the socket
(:class:`~slurm_pal.advisor.connections.UnixTransport`), the counters
(:class:`~slurm_pal.advisor.counters.Counters`), the refresh thread
(:class:`~slurm_pal.advisor.refresher.RefreshLoop`) and the re-planning rounds
(:class:`~slurm_pal.advisor.rounds.RoundCoordinator`), around an
:class:`~slurm_pal.advisor.state.AdvisorState`.

A malformed request gets an error answer and is counted (``bad_requests``); nothing a peer
sends stops the service. Peers are checked with ``SO_PEERCRED``: root, the service's own user
and ``advisor.allowed_users`` are served, others get ``permission denied``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from slurm_pal.adapters.slurm.update import JobApplier, ScontrolApplier
from slurm_pal.advisor import protocol
from slurm_pal.advisor.connections import UnixTransport, allowed_uids, peer_uid
from slurm_pal.advisor.counters import Counters, Histogram, format_stats
from slurm_pal.advisor.failopen import FailOpenLog, fail_open_path
from slurm_pal.advisor.heap import FrozenHeap
from slurm_pal.advisor.logtext import quoted
from slurm_pal.advisor.refresher import MAX_READ_SHARE, RefreshLoop, refresh_pause, sweep_spool
from slurm_pal.advisor.remeasure import Remeasurer
from slurm_pal.advisor.rounds import RoundCoordinator
from slurm_pal.advisor.stalls import RouteReleaser
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.advisor.trim import BadRequestTrimmer, LargeLines
from slurm_pal.advisor.writer import WAITING
from slurm_pal.engine.jobdesc import JobDescError
from slurm_pal.engine.replan import ReplanResult
from slurm_pal.errors import SlurmPalError

__all__ = [
    "MAX_READ_SHARE",
    "AdvisorServer",
    "Counters",
    "Histogram",
    "ReloadRefused",
    "allowed_uids",
    "format_stats",
    "peer_uid",
    "refresh_pause",
    "sweep_spool",
]

log = logging.getLogger("slurm_pal.advisor")


class ReloadRefused(SlurmPalError):
    """A reload whose config or labels.json is unusable: the running config is kept."""


class _Part:
    """An attribute of the server that one of its parts keeps (``reload`` and tests set it on
    the server): ``refresh_s = _Part("refresher")`` reads and writes ``refresher.refresh_s``."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class AdvisorServer:
    """The service: its lifecycle and ops, around an AdvisorState; the socket, the counters,
    the refresh thread and the rounds are its parts."""

    refresh_s = _Part("refresher")
    spool_dir = _Part("refresher")
    replan_s = _Part("rounds")
    applier = _Part("rounds")
    allowed = _Part("connections")

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
        reload_config: Callable[[], Iterable[str] | None] | None = None,
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
        self.max_connections = (
            cfg.advisor.max_connections if max_connections is None else max_connections
        )
        self.wall_clock = wall_clock  # epoch seconds, as the plugin's deadlines are
        self.state = state
        self.socket_path = Path(socket_path)
        self.socket_group = cfg.advisor.socket_group if socket_group is None else socket_group
        self.replan_on_epilog = (
            cfg.advisor.replan_on_epilog if replan_on_epilog is None else replan_on_epilog
        )
        self.reload_config = reload_config
        self._reload_lock = threading.Lock()
        self.counters = Counters()
        self.fail_opens = FailOpenLog(fail_open_path(self.socket_path), self.socket_group)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._refresh_now = threading.Event()
        self._store_waiting: str | None = None  # why the store is not open yet
        self.connections = UnixTransport(
            self.socket_path,
            answer=LargeLines(self.answer, self.counters),  # a flood's memory bounded
            undelivered=self._undelivered,
            counters=self.counters,
            allowed=allowed_uids(cfg.advisor.allowed_users if allowed is None else allowed),
            group=self.socket_group,
            max_connections=self.max_connections,
            io_timeout_s=io_timeout_s,
            request_timeout_s=(
                cfg.advisor.request_timeout_s if request_timeout_s is None else request_timeout_s
            ),
            stopping=self._stop,
        )
        self.rounds = RoundCoordinator(
            state,
            applier or ScontrolApplier(getattr(state.reader, "env", None)),
            self.counters,
            reread=self._refresh_once,
            refresh_now=self._refresh_now,
            replan_s=cfg.advisor.replan_s if replan_s is None else replan_s,
        )
        self.remeasurer = Remeasurer(state)  # suspect GPUs' benchmark jobs
        self.releaser = RouteReleaser(  # routes Slurm does not start, handed back
            state,
            self.rounds.applier,
            self.counters,
            after_s=cfg.advisor.route_stall_s,
        )
        self.trimmer = BadRequestTrimmer(  # a flood's memory back at once
            lambda: self.counters.total("bad_requests", "decide_errors")
        )
        self.refresher = RefreshLoop(
            state,
            self.counters,
            refresh_s=cfg.advisor.refresh_s if refresh_s is None else refresh_s,
            spool_dir=Path(cfg.hooks.spool_dir if spool_dir is None else spool_dir),
            due_holds=self.rounds.round_for_due_holds,
            poll_fail_opens=self.poll_fail_opens,
            wake=self._refresh_now,
            heap=heap,
            remeasure=self.remeasurer.tick,  # does nothing unless advisor.remeasure
            after_read=self.releaser.tick,
        )

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
        self.connections.bind()
        try:
            self.fail_opens.prepare()
        except OSError as exc:
            log.warning("cannot create %s (fail-opens not counted): %s", self.fail_opens.path, exc)
        self.poll_fail_opens()
        self._spawn("socket", self.connections.serve_forever)
        self._spawn("trim", lambda: self.trimmer.run(self._stop))
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
        self._spawn("refresh", lambda: self.refresher.run(self._stop))
        # idle while replan_s is 0 (reload may set it)
        self._spawn("replan", lambda: self.rounds.loop(self._stop))

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
        self.connections.close()
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

    # -- the parts' entry points ------------------------------------------------------------------
    def _refresh_once(self) -> None:
        self.refresher.refresh_once()

    def replan(self, refresh: bool = True, freed: Iterable[str] = ()) -> ReplanResult:
        """One re-planning round now (:meth:`RoundCoordinator.replan`)."""
        return self.rounds.replan(refresh, freed)

    def replan_at_job_end(self, freed: Iterable[str], job_id: int | None = None) -> ReplanResult:
        """The round for a job's end (:meth:`RoundCoordinator.replan_at_job_end`)."""
        return self.rounds.replan_at_job_end(freed, job_id)

    # -- ops --------------------------------------------------------------------------------------
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
                stats = self.counters.snapshot() | self.state.suspects.snapshot()
                stats |= self.state.runtimes.snapshot()
                stats |= self.remeasurer.snapshot()
                stats |= self.state.writer.snapshot()
                return {"v": 1, "ok": True, **stats}
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
            job, decision, repeat = self.state.decide_wire(wire, after)
        except JobDescError as exc:
            self.counters.add("decide_errors")
            return protocol.error_answer(str(exc))
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
        if repeat:
            self.counters.add("decide_repeats")
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
        known = self.state.records.seen(record)
        write = self.state.submit_record(record)
        # The round runs while the store writer catches up (it may hold many decisions queued
        # before this record); the answer waits for both, so an ok means the record is stored.
        round_due = replan and not known and self.replan_on_epilog
        round_due = round_due and record.get("kind") == "epilog" and self.rounds.first_end(record)
        replan_answer = None
        if round_due:
            replan_answer = self.rounds.at_job_end(record)
        try:
            added = write.result(timeout=30.0)
        except FutureTimeout:
            # The writer is behind (not a locked store: that answers WAITING within a
            # second): the hook spools the record and it is swept in later.
            return protocol.error_answer(
                f"record {record.get('record_id')} of job {record.get('job_id')} not stored "
                f"within 30 s: {self.state.writer.backlog()} store writes queued before it"
            )
        self.counters.add("records_total")
        if not added:
            self.counters.add("records_duplicate")
        answer: dict[str, object] = {"v": 1, "ok": True, "duplicate": not added}
        if added is WAITING:  # safe in the writer's journal: stored once the lock is released
            answer["waiting"] = True
        if added and replan_answer is not None:
            answer["replan"] = replan_answer
        if record.get("kind") == "epilog":  # what the Epilog waited for: round and write
            self.counters.job_end_ms(round((time.perf_counter() - start) * 1000, 1))
        return answer
