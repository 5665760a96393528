"""The advisor's state: the view of the cluster (PM-scores and labels from the store, free GPUs
from Slurm), the GPUs it handed out itself (reservations), and the decide path on it.

Why it is shaped like this: ``decide`` runs while slurmctld holds its job-write lock, so the
decide path only touches memory (a :class:`Cluster` whose busy GPUs are already marked). Slurm
and the store are read by the refresh thread, which builds the next view *off* the lock and
swaps it in; the swap then re-applies the reservations still open, so a GPU handed out between
the Slurm read and the swap is never handed out twice. Decisions are written to the store by one
writer thread (:class:`StoreWriter`), after the answer.

:class:`AdvisorState` holds the lock and does the reads and writes; what it computes is pure and
lives elsewhere: the view from a Slurm read (:mod:`.view`), and in the advisor engine, which
the simulator drives too, the reservations (:mod:`slurm_pal.engine.reservations`) and every
decision (:class:`~slurm_pal.engine.engine.AdvisorEngine`, built from the config's
``[advisor]``). The store is loaded by :mod:`.loading`, records are kept by :mod:`.records`
and :mod:`.writer`.

Reservations (PROTOCOL.md "Reservations and re-planning"): a route holds its GPUs under its
token until Slurm shows the job (``r=<token>`` in its admin comment) running or gone, or until
``advisor.reservation_ttl_s`` passes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from slurm_pal import __version__
from slurm_pal.adapters.config import AdvisorConfig, SiteConfig
from slurm_pal.adapters.site_topology import topology_from_config
from slurm_pal.adapters.slurm.state import SlurmStateReader
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.loading import build_specs, load_store, stored_requests
from slurm_pal.advisor.records import RecordBook
from slurm_pal.advisor.records import released_by as _released_by
from slurm_pal.advisor.repeats import REPEAT_S, RepeatAnswers, request_key
from slurm_pal.advisor.runtimes import RuntimeBook
from slurm_pal.advisor.suspects import SuspectBook, decision_hint
from slurm_pal.advisor.view import (
    UNAVAILABLE_FLAGS,
    UNAVAILABLE_STATES,
    Static,
    SteeredQueue,
    View,
    expect_ends,
    node_unavailable,
    static_from,
    view_from,
)
from slurm_pal.advisor.writer import StoreWriter, bind_decision, store_record
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import PlacementPolicy
from slurm_pal.core.resolve import StoreView, resolve
from slurm_pal.engine.advise import Advice, plain_pass
from slurm_pal.engine.decide import Decision, LabelTable
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.reservations import Reservation, Reservations
from slurm_pal.engine.settings import EngineSettings

__all__ = [
    "UNAVAILABLE_FLAGS",
    "UNAVAILABLE_STATES",
    "AdvisorState",
    "Reservation",
    "Static",
    "StoreWriter",
    "View",
    "build_specs",
    "expect_ends",
    "make_engine",
    "make_policy",
    "node_unavailable",
]

log = logging.getLogger("slurm_pal.advisor")

# Tokens name decisions and reservations; they need to be unique, not secret (only root and
# the advisor write admin comments). A PRNG seeded once from os.urandom makes them without a
# system call: os.urandom on every decide released the GIL mid-decision, and the store
# writer's thread then held it for up to the switch interval (5 ms) before the answer went out.
_TOKENS = random.Random()


def _new_token() -> str:
    """12 hex digits, as ``secrets.token_hex(6)`` gave."""
    return f"{_TOKENS.getrandbits(48):012x}"


def make_engine(name: str, advisor: AdvisorConfig) -> AdvisorEngine:
    """The engine the service runs: ``[advisor]``'s settings with policy ``name``."""
    return AdvisorEngine(EngineSettings.from_advisor(advisor, name), version=__version__)


def make_policy(name: str, advisor: AdvisorConfig) -> PlacementPolicy:
    """The configured policy, built as the engine builds it (a reload checks it first)."""
    return EngineSettings.from_advisor(advisor, name).build_policy()


class AdvisorState:
    """The cluster view, the class-resolution snapshot and the reservations (thread-safe)."""

    def __init__(
        self,
        config: SiteConfig,
        store_path: Path,
        reader: SlurmStateReader,
        *,
        policy: str | None = None,
        labels_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        writer: StoreWriter | None = None,
        repeat_s: float = REPEAT_S,
    ) -> None:
        self.policy_name = policy or config.advisor.policy
        self.config = config  # builds the engine
        self.store_path = Path(store_path)
        self.reader = reader
        self.labels_file = labels_file
        self.clock = clock
        self.wall_clock = wall_clock
        """Epoch seconds: what Slurm's end and begin times are on (the waits' clock)."""
        self.topology = topology_from_config(config.locality, source=config.source)
        self.resolve_config = config.resolve_config()
        self.writer = writer or StoreWriter(self.store_path)
        self.records = RecordBook()  # ids seen, GPU indices recorded (RecordBook's methods)
        self.suspects = SuspectBook(config.advisor, wall_clock)
        self._lock = threading.Lock()
        self.runtimes = RuntimeBook(lambda: self.engine, self._lock, wall_clock)  # for waits
        self._static: Static | None = None
        self._view: View | None = None
        self._cluster: Cluster | None = None  # the view's base plus the reservations
        self._reservations = Reservations()
        self._store_view = StoreView()
        self._classifier: Any = None
        self._campaign: str | None = None
        self._problem = "not loaded yet"
        self._gres_diffs: tuple[str, ...] = ()
        self._bound: dict[str, int] = {}
        self._binding: set[str] = set()  # bind writes queued, not yet run
        self._queue = SteeredQueue()  # the refresh thread's
        self._repeats = RepeatAnswers(repeat_s)  # 0: every request decided anew
        self._allocations = 0  # routes taken from ``_cluster`` in place (_decision_inputs)
        # token -> (the request as decided on, its class, when): what a re-planning round needs
        # of every steered pending job, without reading the store for each one.
        self._requests: dict[str, tuple[JobDescription, str, float]] = {}
        self.last_read_start: float | None = None
        self._refresh_lock = threading.Lock()  # one reload/refresh at a time, in order
        # a record kept in the writer's journal (a locked store): written with what is known now
        self.writer.replayers["record"] = lambda s, a: _write_record(
            self, s, a["record"], self._classifier, self._hint(a["record"])
        )

    # -- loading ----------------------------------------------------------------------------
    @property
    def config(self) -> SiteConfig:
        return self._config

    @config.setter
    def config(self, config: SiteConfig) -> None:
        """A new site config: the engine is rebuilt from it, so every decision after this
        one follows its ``[advisor]`` settings."""
        self._config = config
        self.engine = make_engine(self.policy_name, config.advisor)

    def set_config(self, config: SiteConfig, *, policy: str | None = None) -> None:
        """Take a re-read site config (the ``reload`` op): policy, tolerance, topology, TTL,
        class rules. The cluster is rebuilt by the :meth:`reload` that follows."""
        name = policy or config.advisor.policy
        engine = make_engine(name, config.advisor)
        topology = topology_from_config(config.locality, source=config.source)
        with self._lock:
            self._config = config
            self.runtimes.install(engine)  # what the old engine learned, the new one keeps
            self.policy_name, self.engine = name, engine
            self.topology = topology
            self.resolve_config = config.resolve_config()
            self.suspects.configure(config.advisor)

    def reload(self) -> None:
        """Re-read the store (active campaign, scores, labels, applications, classifier)."""
        with self._refresh_lock:
            loaded = load_store(self.config, self.store_path, self.labels_file)
            self.runtimes.warm(self.store_path, self.config.advisor.suspicion_days)  # at start
            static = None
            if not loaded.problem:
                assert loaded.labels is not None and loaded.campaign is not None
                self.suspects.fit(self.store_path, loaded.campaign, loaded.specs, loaded.labels)
                static = self._static_from(
                    loaded.campaign, loaded.labels, loaded.specs, loaded.skipped, {}
                )
            with self._lock:
                self._store_view = loaded.store_view
                self._classifier = loaded.classifier
                self._campaign = loaded.campaign
                self._problem = loaded.problem
                self._static = static
                if static is None:
                    self._view = None
                    self._cluster = None
        if static is None:
            log.warning("advisor passes every GPU job: %s", loaded.problem)
        else:
            log.info("loaded campaign %s: %d GPUs", loaded.campaign, len(static.specs))

    def store_unavailable(self, why: str) -> None:
        """The store cannot be read yet (locked at start): every GPU job passes, health says
        why, until a :meth:`reload` succeeds."""
        with self._lock:
            self._problem = why
            self._static, self._view, self._cluster = None, None, None

    def refresh_store_view(self) -> None:
        """Only the class-resolution snapshot (history, applications): cheap, done often."""
        with Store(self.store_path) as store:
            view = store.store_view(
                self.config.classification.history_window, self.config.classes.names
            )
        with self._lock:
            self._store_view = view

    def _static_from(
        self,
        campaign: str,
        labels: LabelTable,
        specs: Iterable[GpuSpec],
        skipped: Iterable[str],
        features: Mapping[str, frozenset[str]],
    ) -> Static:
        static = static_from(campaign, labels, specs, skipped, features, topology=self.topology,
                             class_names=self.config.classes.names)  # fmt: skip
        return self.suspects.on_static(static)  # scores with the suspects (steer)

    # -- refresh ----------------------------------------------------------------------------
    def refresh(self) -> View | None:
        """Read Slurm, build the next view off the lock, swap it in. Raises the reader's error
        (the caller counts it; the old view stays)."""
        with self._refresh_lock:
            return self._refresh()

    def _refresh(self) -> View | None:
        static = self._static
        if static is None:
            return None
        # Jobs before nodes: a job that starts between the two reads then shows as PENDING (its
        # reservation kept) while sinfo already counts its GPUs, so for one refresh they count
        # twice. The other order dropped the reservation of a job squeue shows RUNNING before
        # sinfo counted its GPUs, and a GPU looked free that was not (a routed job then waits
        # for it: seen in CI, tests/slurm/test_submit_advisor.py).
        read_start, scored = self.clock(), self.suspects.version
        jobs = self.reader.jobs()
        nodes = self.reader.nodes()
        default_partition = None
        get_default = getattr(self.reader, "default_partition", None)
        if callable(get_default):
            try:
                default_partition = get_default()
            except Exception as exc:  # without it, jobs naming no partition are not restricted
                log.warning("cannot read the default partition: %s", exc)
        taken = self.clock()
        features = {
            n.name: frozenset(n.features) for n in nodes if n.name in static.cluster.node_index
        }
        known = {n: static.features.get(n, frozenset()) for n in features}
        if features != known:
            static = self._static_from(
                static.campaign, static.labels, static.specs, static.skipped, features
            )
        view, mismatched = view_from(static, nodes, jobs, taken, default_partition)
        if mismatched != self._gres_diffs:
            self._gres_diffs = mismatched
            for line in mismatched:
                log.warning("node %s left out of routing (labels.json vs sinfo)", line)
        view = self._queue.with_queue(view, self._view, self.requests_for)
        with self._lock:
            if self._static is not None and self._static.campaign != static.campaign:
                return None  # a reload raced us; the next refresh uses the new campaign
            if self.suspects.version != scored:  # suspects changed since: their scores
                static = self.suspects.on_static(static)
                view = self.suspects.on_view(view, static)
            self._static = static
            self._view = view
            bound = self._reconcile(view, read_start)
            self.last_read_start = read_start
            self._cluster = self._reservations.applied_to(view.base)
        for token, job_id in bound:
            with self._lock:
                if token in self._binding:
                    continue  # still queued from an earlier read: one write per token
                self._binding.add(token)
            self.writer.submit(
                lambda s, t=token, j=job_id: self._bind(s, t, j),  # type: ignore[misc]
                durable=("bind", {"token": token, "job_id": job_id}),
            )
        return view

    def _reconcile(self, view: View, read_start: float | None = None) -> list[tuple[str, int]]:
        """Bind reservations to the jobs Slurm shows; drop those running, gone or expired, and
        those no job carries although they were made well before this Slurm read started (an
        answer nobody received: its job went through as written, or was never submitted).
        Returns the (token, job id) pairs newly bound. Called with the lock held."""
        now = self.clock()
        # A received route becomes a job in the same slurmctld call; allow the plugin's timeout
        # and a second for the read to see it.
        timeout_s = self.config.advisor.submit_timeout_ms / 1000
        orphan_before = None if read_start is None else read_start - timeout_s - 1.0
        seen = view.by_token
        # Every job carrying one of our tokens is bound once (also jobs that already run, and
        # after a restart): the Epilog's record finds the decision through the job id.
        # Until the write succeeds (the decision row may still be in the writer's queue), a
        # token is tried again at every refresh.
        bound = [(t, j.job_id) for t, j in seen.items() if self._bound.get(t) != j.job_id]
        if orphan_before is not None:
            gone = [
                t for t, (_, _, made) in self._requests.items()
                if t not in seen and made < orphan_before
            ]  # fmt: skip
            for token in gone:
                del self._requests[token]
        self._bound = {t: j for t, j in self._bound.items() if t in seen}
        self._reservations.reconcile(seen, now, orphan_before)
        return bound

    def expire(self) -> int:
        """Drop reservations past their TTL now (without a Slurm read); how many."""
        with self._lock:
            gone = self._reservations.expire(self.clock())
            if gone and self._view is not None:
                self._cluster = self._reservations.applied_to(self._view.base)
        return len(gone)

    def _bind(self, store: Store, token: str, job_id: int) -> None:
        """Note a decision's Slurm job id (state ``bound`` unless it was re-planned already);
        runs on the writer thread."""
        try:
            if not bind_decision(store, token, job_id):
                return  # not written yet (or not ours): the next refresh tries again
            with self._lock:
                self._bound[token] = job_id
        finally:
            with self._lock:
                self._binding.discard(token)

    # -- the decide path ---------------------------------------------------------------------
    def decide(
        self,
        job: JobDescription,
        wire: Mapping[str, object],
        defer: list[Callable[[], object]] | None = None,
    ) -> Decision:
        """Resolve the class, decide (:func:`.advise.advise`), reserve on route; the decision
        is stored afterwards by the writer thread (queued by ``defer``'s callables when given,
        so the caller can send the answer first: the writer's Python work competes for the
        GIL). No Slurm call, no store read."""
        return _decide(self, wire, defer, job)[1]

    def decide_wire(
        self, wire: Mapping[str, object], defer: list[Callable[[], object]] | None = None
    ) -> tuple[JobDescription, Decision, bool]:
        """:meth:`decide` for a request off the socket, parsed (JobDescError) and decided only
        if not a repeat of one decided on the same state (:class:`RepeatAnswers`: last item)."""
        return _decide(self, wire, defer, None)

    # -- records -----------------------------------------------------------------------------
    def apply_record(self, record: Mapping[str, object], timeout_s: float = 30.0) -> bool:
        """Keep a Prolog/Epilog record (at most once); an epilog with telemetry also feeds the
        job history. True when the record was new."""
        return self.submit_record(record).result(timeout=timeout_s)

    def submit_record(self, record: Mapping[str, object]) -> Future[bool]:
        """Queue the record's store write; the future says whether it was new. The caller can
        work (a job-end round) while the writer catches up with the decisions queued before."""
        classifier, hint = self._classifier, self._hint(record)
        self.records.note(record)

        def write(store: Store) -> bool:
            return _write_record(self, store, record, classifier, hint)

        return self.writer.submit(write, urgent=True, durable=("record", {"record": record}))

    def _hint(self, record: Mapping[str, object]) -> dict[str, object] | None:
        return decision_hint(self._view, self._requests, record)

    def rescore(self) -> None:
        """The suspects changed: the view's scores follow (reservations re-applied)."""
        with self._lock:
            if self._static is not None:
                self._static = self.suspects.on_static(self._static)
            if self._static is not None and self._view is not None:
                self._view = self.suspects.on_view(self._view, self._static)
                self._cluster = self._reservations.applied_to(self._view.base)

    def requests_for(self, tokens: Iterable[str]) -> dict[str, tuple[JobDescription, str]]:
        """The decided request and class of each token: from memory, and in one store read for
        the ones it does not hold (decided before a restart). Tokens without a readable
        decision are left out."""
        wanted = list(tokens)
        with self._lock:
            found = {t: self._requests[t][:2] for t in wanted if t in self._requests}
        missing = [t for t in wanted if t not in found]
        if missing:
            stored = self.writer.call(lambda s: stored_requests(s, missing), timeout_s=60)
            now = self.clock()
            found.update(stored)
            with self._lock:
                self._requests.update({t: (*r, now) for t, r in stored.items()})
        return found

    def released_by(self, record: Mapping[str, object]) -> list[str]:
        """The UUIDs of the GPUs an Epilog record's job gives back on the record's node
        (:func:`.records.released_by`)."""
        return _released_by(self._view, record)

    # -- reading ------------------------------------------------------------------------------
    @property
    def policy(self) -> PlacementPolicy:  # the engine's: every decision here places with it
        return self.engine.policy

    @property
    def version(self) -> str:  # what the engine writes into admin comments
        return self.engine.version

    @property
    def view(self) -> View | None:
        return self._view

    def cluster_snapshot(self) -> Cluster | None:
        """A copy of the current cluster (reservations applied), for the re-planner/tests."""
        with self._lock:
            return None if self._cluster is None else self._cluster.copy()

    def reservations(self) -> dict[str, Reservation]:
        with self._lock:
            return self._reservations.copies()

    def release_reservation(self, token: str) -> None:
        """Forget a reservation (its job was re-planned; the new one replaces it)."""
        with self._lock:
            if self._reservations.release(token) and self._view is not None:
                self._cluster = self._reservations.applied_to(self._view.base)

    def reserve(self, token: str, uuids: Iterable[str], job_id: int | None) -> None:
        """Hold GPUs for a re-planned job (same TTL as a route)."""
        with self._lock:
            ttl_s = self.engine.settings.reservation_ttl_s
            self._reservations.hold(token, uuids, now=self.clock(), ttl_s=ttl_s, job_id=job_id)
            if self._view is not None:
                self._cluster = self._reservations.applied_to(self._view.base)

    @property
    def store_view(self) -> StoreView:
        return self._store_view

    def health(self) -> dict[str, object]:
        with self._lock:
            view, cluster = self._view, self._cluster
            age = None if view is None else round(self.clock() - view.taken, 3)
            return {
                "version": self.version,
                "campaign": self._campaign,
                "policy": self.policy_name,
                "gpus": 0 if cluster is None else cluster.n_gpus,
                "free": 0 if cluster is None else cluster.n_free,
                "state_age_s": age,
                "reservations": len(self._reservations),
                "excluded_nodes": {} if view is None else dict(view.excluded),
                "problem": self._problem or None,
            }


def _decide(
    st: AdvisorState,
    wire: Mapping[str, object],
    defer: list[Callable[[], object]] | None,
    job: JobDescription | None,
) -> tuple[JobDescription, Decision, bool]:
    """AdvisorState's decide path (here to keep the class short): ``job`` parsed already, or
    None to parse ``wire`` unless it repeats a request decided on the same state."""
    token = _new_token()
    # a parsed job is its own key (a caller's wire need not be the job's: tests pass {})
    key = request_key(wire) if job is None else None if job.modify else job
    with st._lock:
        view, cluster = st._view, st._cluster
        if view is None or cluster is None:
            job = job if job is not None else JobDescription.from_wire(wire)
            resolution = resolve(job.job_request(), st._store_view, st.resolve_config)
            why = st._problem if view is None and st._problem else "no Slurm view yet"
            return job, plain_pass(why, resolution.job_class, st.version), False
        kept = st._repeats.take(key, _decision_inputs(st), st.clock())
        if kept is not None:
            advice = kept.under_token(token)
        else:
            job = job if job is not None else JobDescription.from_wire(wire)
            advice = _advise(st, job, view, cluster, token)
        decision, job, starts_as = advice.decision, advice.job, advice.state
        if starts_as is None:
            return job, decision, kept is not None
        if decision.allocation is not None:  # routed, or left to Slurm where it would go
            cluster.allocate(decision.allocation)
            st._allocations += 1
            ttl_s = st.engine.settings.reservation_ttl_s
            st._reservations.hold(token, decision.allocation.uuids, now=st.clock(), ttl_s=ttl_s)
        elif kept is None:  # took no GPUs: right for a repeat until the state moves
            st._repeats.keep(key, _decision_inputs(st), st.clock(), advice)
    answer = decision.to_wire()
    if decision.job_class is not None:
        with st._lock:
            st._requests[token] = (job, decision.job_class, st.clock())

    def save() -> object:
        args = {"token": token, "job": job.stored(), "answer": answer, "state": starts_as}
        return st.writer.submit_durable("save_decision", args)

    if defer is None:
        save()
    else:
        defer.append(save)
    return job, decision, kept is not None


def _advise(
    st: AdvisorState, job: JobDescription, view: View, cluster: Cluster, token: str
) -> Advice:
    """The engine's answer to ``job`` on ``cluster``, its class resolved (the caller holds
    the state's lock)."""
    resolution = resolve(job.job_request(), st.store_view, st.resolve_config)
    return st.engine.submit(
        job,
        job_class=resolution.job_class,
        class_reason=resolution.reason,
        cluster=cluster,
        labels=view.static.labels,
        partition_nodes=view.partition_nodes,
        default_partition=view.default_partition,
        token=token,
        now=st.wall_clock(),
    )


def _decision_inputs(state: AdvisorState) -> tuple[object, ...]:
    """Everything a decision reads that can change (the caller holds the state's lock): a
    decision taken on these objects, and on as many routes taken from the cluster in place,
    is the decision the same request gets now (:class:`RepeatAnswers`)."""
    engine = state.engine
    return (
        state._allocations,
        state._view,
        state._cluster,
        state.store_view,
        state.resolve_config,
        engine,
        engine.runtimes,
        engine.policy,
    )


def _write_record(
    state: AdvisorState, store: Store, record: Mapping[str, object], classifier: Any, hint: Any
) -> bool:
    """Keep a record (:func:`store_record`); a new one also feeds the suspects and the
    learned runtimes. Runs on the writer thread."""
    added = store_record(store, dict(record), classifier)
    if added and state.suspects.feed(store, record, hint) and state.suspects.steering:
        state.rescore()  # from the next decision on
    if added:  # what it ran weighs the next waits
        state.runtimes.feed(store, record, hint)
    return added
