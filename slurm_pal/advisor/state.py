"""The advisor's view of the cluster: PM-scores and labels from the store, free GPUs from Slurm,
and the GPUs it handed out itself (reservations).

Why it is shaped like this: ``decide`` runs while slurmctld holds its job-write lock, so the
decide path only touches memory (a :class:`Cluster` whose busy GPUs are already marked). Slurm
and the store are read by the refresh thread, which builds the next view *off* the lock and
swaps it in; the swap then re-applies the reservations still open, so a GPU handed out between
the Slurm read and the swap is never handed out twice. Decisions are written to the store by one
writer thread (:class:`StoreWriter`), after the answer.

Reservations (PROTOCOL.md "Reservations and re-planning"): a route holds its GPUs under its
token until Slurm shows the job (``r=<token>`` in its admin comment) running or gone, or until
``advisor.reservation_ttl_s`` passes.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from slurm_pal import __version__
from slurm_pal.adapters.config import AdvisorConfig, SiteConfig
from slurm_pal.adapters.labels_file import read_labels
from slurm_pal.adapters.site_topology import topology_from_config
from slurm_pal.adapters.slurm.state import JobState, NodeState, SlurmStateReader
from slurm_pal.adapters.store import Store, StoreError
from slurm_pal.advisor.decide import (
    Decision,
    LabelTable,
    decide,
    format_admin_comment,
    labels_as_models,
    parse_admin_comment,
)
from slurm_pal.advisor.jobdesc import JobDescError, JobDescription
from slurm_pal.advisor.jobend import merge_telemetry
from slurm_pal.advisor.replan import (
    PendingJob,
    RequestKey,
    replannable,
    requests_of,
    steered_job,
)
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import PlacementPolicy, configured_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.resolve import JobRecord, StoreView, claimed_app, resolve
from slurm_pal.site.render import compare_gres, plan_from_store

__all__ = [
    "UNAVAILABLE_FLAGS",
    "UNAVAILABLE_STATES",
    "AdvisorState",
    "Reservation",
    "StoreWriter",
    "View",
    "make_policy",
    "node_unavailable",
]

log = logging.getLogger("slurm_pal.advisor")

UNAVAILABLE_STATES = frozenset({"down", "drained", "drain", "fail", "future", "unknown"})
UNAVAILABLE_FLAGS = frozenset(
    {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "MAINTENANCE"}
)
T = TypeVar("T")


def node_unavailable(node: NodeState) -> str | None:
    """Why a node's GPUs cannot be given out now (down, drained, ...), or None."""
    if node.state in UNAVAILABLE_STATES:
        return f"state {node.state}"
    bad = sorted(set(node.flags) & UNAVAILABLE_FLAGS)
    return f"state {node.state}+{'+'.join(bad)}" if bad else None


def make_policy(name: str, advisor: AdvisorConfig) -> PlacementPolicy:
    """The configured policy, built as the simulator builds placement ``advisor``."""
    return configured_policy(
        name,
        pack_tolerance=advisor.pack_tolerance,
        avoid_above=advisor.avoid_above,
        wait=advisor.outliers == "wait",
        max_wait_s=advisor.max_wait_s,
        assumed_runtime_s=advisor.assumed_runtime_s,
    )


@dataclass
class Reservation:
    """GPUs handed to a routed job that Slurm does not run yet."""

    token: str
    uuids: tuple[str, ...]
    expires: float  # on the state's clock
    job_id: int | None = None
    made: float = 0.0  # on the state's clock: when the answer was made


@dataclass(frozen=True)
class Static:
    """What changes only on reload: campaign, labels, scores (the cluster with every GPU free)."""

    campaign: str
    labels: LabelTable
    specs: tuple[GpuSpec, ...]
    class_order: tuple[str, ...]
    features: Mapping[str, frozenset[str]]
    cluster: Cluster
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class View:
    """One refresh: the static part plus what Slurm said (``base``: Slurm's busy GPUs marked,
    no reservations)."""

    static: Static
    base: Cluster
    taken: float  # clock time of the Slurm read
    excluded: Mapping[str, str]  # node -> why its GPUs are not routed to
    partition_nodes: Mapping[str, tuple[str, ...]] | None
    default_partition: str | None
    jobs: tuple[JobState, ...]
    busy: frozenset[str] = frozenset()
    # The steered pending jobs Slurm would start, in priority order, and each one's placement
    # request, as this read shows them: worked out by the refresh thread, so that a job-end
    # round (an Epilog waits for it) does not walk every pending job again.
    pending: tuple[PendingJob, ...] = ()
    requests: Mapping[RequestKey, PlacementRequest | None] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # token -> the job carrying it in its admin comment (every state): parsed once per read,
    # off the lock decides take
    by_token: Mapping[str, JobState] = field(default_factory=lambda: MappingProxyType({}))
    # job id -> the job: an Epilog's record looks its job up (twice), 48 at once in a storm
    by_id: Mapping[int, JobState] = field(default_factory=lambda: MappingProxyType({}))

    def job(self, job_id: int) -> JobState | None:
        """The job with this id as this read shows it (None: not shown)."""
        if self.by_id or not self.jobs:
            return self.by_id.get(job_id)
        return next((j for j in self.jobs if j.job_id == job_id), None)


def expect_ends(cluster: Cluster, jobs: Sequence[JobState], labels: LabelTable) -> None:
    """When each busy GPU is expected to free: its job's planned end (start + time limit, as
    Slurm reports it; never for an unlimited job). A GPU whose job is not known by index gets
    the latest planned end of the running jobs on its node; one with none stays unknown
    (``inf``), which never justifies a wait."""
    latest: dict[str, float] = {}
    unindexed: set[str] = set()
    for job in jobs:
        if job.state != "RUNNING" or not job.nodes:
            continue
        end = job.end_time if job.time_limit_s != math.inf else None
        when = end if end is not None else math.inf
        indices = job.allocated_gpu_indices()
        for node in job.nodes:
            latest[node] = max(latest.get(node, -math.inf), when)
            if node not in job.allocated_gres:
                unindexed.add(node)
            if node not in cluster.node_index:
                continue
            for index in indices.get(node, ()):
                try:
                    gpu = cluster.uuid_index.get(labels.uuid_at_slurm_index(node, index))
                except KeyError:
                    continue
                if gpu is not None and not cluster.free[gpu]:
                    cluster.busy_until[gpu] = when
    for node in unindexed:
        row = cluster.node_index.get(node)
        if row is None:
            continue
        gpus = [g for g in cluster.node_gpus[row] if g >= 0 and not cluster.free[g]]
        unknown = [g for g in gpus if math.isinf(cluster.busy_until[g])]
        if unknown:
            cluster.busy_until[unknown] = latest[node]


class StoreWriter:
    """One thread that owns a store connection and runs writes (SQLite connections are per
    thread; decisions are written after the answer, records are waited for).

    Two lanes, each in order: ``urgent`` writes (an Epilog's record, which its hook waits for)
    go before the others (decision saves, which nobody waits for: under a burst of submits
    thousands can queue, and an Epilog behind them would miss its wait and spool). A record
    whose job's decision is still queued then finds no claim to compare with; its measured
    class is kept all the same."""

    def __init__(self, store_path: Path, *, max_batch: int = 256) -> None:
        self.store_path = store_path
        self.max_batch = max_batch
        self._queue: queue.PriorityQueue[
            tuple[int, int, Callable[[Store], Any] | None, Future[Any] | None]
        ] = queue.PriorityQueue()
        self._order = itertools.count()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Store], T], *, urgent: bool = False) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((0 if urgent else 1, next(self._order), fn, future))
        return future

    def call(self, fn: Callable[[Store], T], timeout_s: float = 30.0) -> T:
        return self.submit(fn).result(timeout=timeout_s)

    def backlog(self) -> int:
        return self._queue.qsize()

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing.set()
        self._queue.put((2, next(self._order), None, None))
        self._thread.join(timeout=timeout_s)

    def _open(self) -> Store | None:
        """The writer's connection; while another process holds the store locked (a service
        started beside a long write), writes queue and opening is tried again."""
        while True:
            try:
                return Store(self.store_path, timeout_s=1.0)
            except StoreError as exc:
                if "locked" not in str(exc):
                    raise
            if self._closing.wait(0.2):
                return None

    def _run(self) -> None:
        store = self._open()
        if store is None:
            return
        try:
            while True:
                batch = self._next_batch()
                self._run_batch(store, [(fn, fut) for fn, fut in batch if fn and fut])
                if any(fn is None for fn, _ in batch):
                    return
        finally:
            store.close()

    def _next_batch(self) -> list[tuple[Callable[[Store], Any] | None, Future[Any] | None]]:
        """What is queued now, up to ``max_batch``, in lane order. A commit costs an fsync
        (about 7 ms here) whatever it holds, so a burst of decision saves drains in one
        commit instead of queueing for seconds in front of the next Epilog's record."""
        _, _, fn, future = self._queue.get()
        batch = [(fn, future)]
        while fn is not None and len(batch) < self.max_batch:
            try:
                _, _, fn, future = self._queue.get_nowait()
            except queue.Empty:
                break
            batch.append((fn, future))
        return batch

    def _run_batch(
        self, store: Store, batch: list[tuple[Callable[[Store], Any], Future[Any]]]
    ) -> None:
        """Run each write in its own savepoint and the lot in one transaction; results are
        handed out only after the commit, so nobody is told a write is stored before it is."""
        done: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            with store.group():
                for fn, future in batch:
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        with store.atomic():
                            result = fn(store)
                        done.append((future, result, None))
                    except Exception as exc:  # this write only: its savepoint is rolled back
                        done.append((future, None, exc))
        except Exception as exc:  # the commit itself failed: nothing in the batch is stored
            log.warning("store write failed: %s", exc)
            done = [(future, None, exc) for future, _, _ in done]
        for future, result, error in done:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
                log.warning("store write failed: %s", error)


def _labels_from(config: SiteConfig, store: Store, labels_file: str | None) -> LabelTable:
    path = labels_file if labels_file is not None else config.advisor.labels_file
    if path:
        return read_labels(path)
    return LabelTable.from_labels_json(plan_from_store(store, config=config).to_dict())


def build_specs(campaign: str, store: Store, labels: LabelTable) -> tuple[list[GpuSpec], list[str]]:
    """One GpuSpec per GPU that has scores and a label (same node, index and UUID), and the
    GPUs left out, with the reason."""
    scores = store.gpu_scores(campaign)
    per_gpu: dict[str, dict[str, Any]] = {}
    for row in scores.itertuples(index=False):
        entry = per_gpu.setdefault(
            row.uuid,
            {"node": row.node, "index": row.gpu_index, "model": row.gpu_model, "scores": {}},
        )
        entry["scores"][row.job_class] = float(row.pm_score)
    specs: list[GpuSpec] = []
    skipped: list[str] = []
    for uuid, g in per_gpu.items():
        node, index = str(g["node"] or ""), g["index"]
        if not node or index is None or (isinstance(index, float) and math.isnan(index)):
            skipped.append(f"{uuid}: no node/index in campaign {campaign}")
            continue
        try:
            labelled = labels.uuid(node, int(index))
        except KeyError as exc:
            skipped.append(f"{uuid}: {exc.args[0]}")
            continue
        if labelled != uuid:
            skipped.append(f"{uuid}: labels.json has {labelled} at {node} index {index}")
            continue
        specs.append(GpuSpec(uuid, node, int(index), str(g["model"]), dict(g["scores"])))
    return specs, skipped


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
    ) -> None:
        self.config = config
        self.store_path = Path(store_path)
        self.reader = reader
        self.policy_name = policy or config.advisor.policy
        self.policy = make_policy(self.policy_name, config.advisor)
        self.labels_file = labels_file
        self.clock = clock
        self.wall_clock = wall_clock
        """Epoch seconds: what Slurm's end and begin times are on (the waits' clock)."""
        self.topology = topology_from_config(config.locality, source=config.source)
        self.resolve_config = config.resolve_config()
        self.writer = writer or StoreWriter(self.store_path)
        self.version = __version__
        self._lock = threading.Lock()
        self._static: Static | None = None
        self._view: View | None = None
        self._cluster: Cluster | None = None  # the view's base plus the reservations
        self._reservations: dict[str, Reservation] = {}
        self._store_view = StoreView()
        self._classifier: Any = None
        self._campaign: str | None = None
        self._problem = "not loaded yet"
        self._gres_diffs: tuple[str, ...] = ()
        self._bound: dict[str, int] = {}
        self._binding: set[str] = set()  # bind writes queued, not yet run
        # The last read's parsed admin comments and steered pending jobs (refresh thread only)
        self._queue_cache: tuple[
            dict[str, dict[str, str] | None], dict[tuple[object, ...], PendingJob]
        ] = ({}, {})
        # token -> (the request as decided on, its class, when): what a re-planning round needs
        # of every steered pending job, without reading the store for each one.
        self._requests: dict[str, tuple[JobDescription, str, float]] = {}
        self.last_read_start: float | None = None
        self._recent_records: dict[object, None] = {}  # insertion-ordered, bounded
        # job id -> node -> Slurm GPU indices, as the job's Prolog/Epilog records said (records
        # are authenticated; the brief Slurm read has no indices): insertion-ordered, bounded
        self._record_gpus: dict[int, dict[str, tuple[int, ...]]] = {}
        self._refresh_lock = threading.Lock()  # one reload/refresh at a time, in order

    # -- loading ----------------------------------------------------------------------------
    def set_config(self, config: SiteConfig, *, policy: str | None = None) -> None:
        """Take a re-read site config (the ``reload`` op): policy, tolerance, topology, TTL,
        class rules. The cluster is rebuilt by the :meth:`reload` that follows."""
        name = policy or config.advisor.policy
        new_policy = make_policy(name, config.advisor)
        topology = topology_from_config(config.locality, source=config.source)
        with self._lock:
            self.config = config
            self.policy_name, self.policy = name, new_policy
            self.topology = topology
            self.resolve_config = config.resolve_config()

    def reload(self) -> None:
        """Re-read the store (active campaign, scores, labels, applications, classifier)."""
        with self._refresh_lock:
            self._reload()

    def _reload(self) -> None:
        with Store(self.store_path) as store:
            store_view = store.store_view(
                self.config.classification.history_window, self.config.classes.names
            )
            model = store.active_classifier()
            campaign = store.active_campaign_id()
            static: Static | None = None
            problem = ""
            if campaign is None:
                problem = "no active campaign"
            else:
                labels = _labels_from(self.config, store, self.labels_file)
                specs, skipped = build_specs(campaign, store, labels)
                if skipped:
                    log.warning("%d GPU(s) not routed to: %s", len(skipped), "; ".join(skipped))
                if specs:
                    static = self._static_from(campaign, labels, specs, skipped, {})
                else:
                    problem = f"campaign {campaign}: no GPU has both scores and a label"
        classifier = None
        if model is not None:
            from slurm_pal.core.classifier import JobClassifier

            try:
                classifier = JobClassifier.from_dict(model.model)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("active classifier %s unusable: %s", model.id, exc)
        with self._lock:
            self._store_view = store_view
            self._classifier = classifier
            self._campaign = campaign
            self._problem = problem
            self._static = static
            if static is None:
                self._view = None
                self._cluster = None
        if problem:
            log.warning("advisor passes every GPU job: %s", problem)
        else:
            log.info("loaded campaign %s: %d GPUs", campaign, len(static.specs))  # type: ignore[union-attr]

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
        specs = tuple(replace(s, node_features=features.get(s.node, frozenset())) for s in specs)
        classes = {c for s in specs for c in s.scores}
        names = self.config.classes.names
        order = tuple(c for c in names if c in classes) + tuple(sorted(classes - set(names)))
        cluster = Cluster.from_gpus(specs, self.topology, class_order=order)
        return Static(
            campaign,
            labels,
            specs,
            order,
            MappingProxyType(dict(features)),
            cluster,
            tuple(skipped),
        )

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
        read_start = self.clock()
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
        view = self._view_from(static, nodes, jobs, taken, default_partition)
        view = self._with_queue(view, self._view)
        with self._lock:
            if self._static is not None and self._static.campaign != static.campaign:
                return None  # a reload raced us; the next refresh uses the new campaign
            self._static = static
            self._view = view
            bound = self._reconcile(view, read_start)
            self.last_read_start = read_start
            self._cluster = self._with_reservations(view.base)
        for token, job_id in bound:
            with self._lock:
                if token in self._binding:
                    continue  # still queued from an earlier read: one write per token
                self._binding.add(token)
            self.writer.submit(lambda s, t=token, j=job_id: self._bind(s, t, j))
        return view

    def _with_queue(self, view: View, previous: View | None) -> View:
        """``view`` with its steered pending queue and their placement requests (each job's GPU
        ask is read once: the previous view's requests are reused while the campaign is the
        same)."""
        # What the last read worked out is reused for every job Slurm shows unchanged: at
        # 10,000 pending jobs, parsing each admin comment and building each job again cost
        # 0.14 s per read, most of a read's own work.
        comments, known_jobs = self._queue_cache
        parsed_now: dict[str, dict[str, str] | None] = {}
        jobs_now: dict[tuple[object, ...], PendingJob] = {}
        steered: list[tuple[JobState, dict[str, str], tuple[object, ...]]] = []
        by_token: dict[str, JobState] = {}
        for job in view.jobs:
            text = job.admin_comment
            if not text:
                continue
            if text in parsed_now:
                parsed = parsed_now[text]
            else:
                parsed = comments[text] if text in comments else parse_admin_comment(text)
                parsed_now[text] = parsed
            if parsed is None or not parsed.get("r"):
                continue
            by_token[parsed["r"]] = job
            if job.state == "PENDING" and replannable(job.reason, parsed["action"] == "wait"):
                key = (
                    job.job_id,
                    text,
                    job.tres_per_node,
                    job.tres_per_job,
                    job.priority,
                    job.time_limit_s,
                )
                steered.append((job, parsed, key))
        by_id = MappingProxyType({job.job_id: job for job in view.jobs})
        view = replace(view, by_token=MappingProxyType(by_token), by_id=by_id)
        if not steered:
            self._queue_cache = (parsed_now, jobs_now)
            return view
        new = [p["r"] for _, p, key in steered if key not in known_jobs]
        known = self.requests_for(new) if new else {}
        pending = []
        for job, parsed, key in steered:
            same = known_jobs.get(key)
            if same is None:
                found = known.get(parsed["r"])
                if found is None:
                    continue
                original, job_class = found
                same = steered_job(job, parsed, original, job_class)
            jobs_now[key] = same
            pending.append(same)
        self._queue_cache = (parsed_now, jobs_now)
        pending.sort(key=lambda p: (-p.priority, p.job_id))
        reuse = previous is not None and previous.static.campaign == view.static.campaign
        cache: dict[RequestKey, PlacementRequest | None] = {}
        if reuse:
            assert previous is not None
            old = previous.requests
            for p in pending:
                key = (p.token, p.job_id, p.job_class)
                if key in old:
                    cache[key] = old[key]
        requests_of(pending, labels=view.static.labels, cluster=view.base, known=cache)
        return replace(view, pending=tuple(pending), requests=MappingProxyType(cache))

    def _view_from(
        self,
        static: Static,
        nodes: list[NodeState],
        jobs: list[JobState],
        taken: float,
        default_partition: str | None,
    ) -> View:
        cluster = static.cluster
        labels = static.labels
        excluded: dict[str, str] = {}
        live = {n.name: n for n in nodes}
        expected: dict[str, dict[str, int]] = {}
        for e in labels.entries:
            if e.node in cluster.node_index:
                counts = expected.setdefault(e.node, {})
                counts[e.label] = counts.get(e.label, 0) + 1
        _, diffs = compare_gres(expected, {n: live[n].gpu_types() for n in live})
        for d in diffs:
            excluded[d.node] = (
                "unknown to Slurm" if d.live is None else f"gres {d.live} != labels {d.expected}"
            )
        diff_text = tuple(f"{n}: {why}" for n, why in sorted(excluded.items()))
        if diff_text != self._gres_diffs:
            self._gres_diffs = diff_text
            for line in diff_text:
                log.warning("node %s left out of routing (labels.json vs sinfo)", line)
        for name, node in live.items():
            why = node_unavailable(node)
            if why is not None and name in cluster.node_index:
                excluded.setdefault(name, why)
        busy: set[str] = set()
        for name, node in live.items():
            if name not in cluster.node_index or name in excluded:
                continue
            for _type, indices in node.used_gpu_indices().items():
                for slurm_index in indices:
                    try:
                        busy.add(labels.uuid_at_slurm_index(name, slurm_index))
                    except KeyError as exc:
                        log.warning("busy GPU not in labels.json: %s", exc.args[0])
        for name in excluded:
            for gpu in cluster.node_gpus[cluster.node_index[name]]:
                if gpu >= 0:
                    busy.add(cluster.uuids[gpu])
        base = cluster.copy()
        ids = sorted(cluster.uuid_index[u] for u in busy if u in cluster.uuid_index)
        if ids:
            base.allocate(ids)
        expect_ends(base, jobs, labels)
        partitions: dict[str, list[str]] = {}
        for node in nodes:
            for p in node.partitions:
                partitions.setdefault(p, []).append(node.name)
        return View(
            static=static,
            base=base,
            taken=taken,
            excluded=MappingProxyType(excluded),
            partition_nodes=MappingProxyType({p: tuple(v) for p, v in partitions.items()})
            if partitions
            else None,
            default_partition=default_partition,
            jobs=tuple(jobs),
            busy=frozenset(busy),
        )

    def _reconcile(self, view: View, read_start: float | None = None) -> list[tuple[str, int]]:
        """Bind reservations to the jobs Slurm shows; drop those running, gone or expired, and
        those no job carries although they were made well before this Slurm read started (an
        answer nobody received: its job went through as written, or was never submitted).
        Returns the (token, job id) pairs newly bound. Called with the lock held."""
        now = self.clock()
        # A received route becomes a job in the same slurmctld call; allow the plugin's timeout
        # and a second for the read to see it.
        orphan_before = (
            None
            if read_start is None
            else read_start - self.config.advisor.submit_timeout_ms / 1000 - 1.0
        )
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
        for token, res in list(self._reservations.items()):
            job = seen.get(token)
            if job is not None:
                if job.state != "PENDING":
                    del self._reservations[token]  # running: Slurm counts it; ended: free
                    log.info("reservation %s released: job %d %s", token, job.job_id, job.state)
                    continue
                res.job_id = job.job_id
            elif res.job_id is not None:
                del self._reservations[token]  # the job left squeue
                continue
            elif orphan_before is not None and res.made < orphan_before:
                del self._reservations[token]
                log.info("reservation %s dropped: no job carries it", token)
                continue
            if now >= res.expires:
                del self._reservations[token]
                log.info("reservation %s expired (job %s)", token, res.job_id)
        return bound

    def _with_reservations(self, base: Cluster) -> Cluster:
        cluster = base.copy()
        for res in self._reservations.values():
            ids = [
                cluster.uuid_index[u]
                for u in res.uuids
                if u in cluster.uuid_index and cluster.free[cluster.uuid_index[u]]
            ]
            if ids:
                cluster.allocate(ids)
        return cluster

    def expire(self) -> int:
        """Drop reservations past their TTL now (without a Slurm read); how many."""
        with self._lock:
            now = self.clock()
            gone = [t for t, r in self._reservations.items() if now >= r.expires]
            for token in gone:
                del self._reservations[token]
                log.info("reservation %s expired", token)
            if gone and self._view is not None:
                self._cluster = self._with_reservations(self._view.base)
        return len(gone)

    def _bind(self, store: Store, token: str, job_id: int) -> None:
        """Note a decision's Slurm job id (state ``bound`` unless it was re-planned already);
        runs on the writer thread."""
        try:
            row = store.decision(token)
            if row is None:
                return  # not written yet (or not ours): the next refresh tries again
            fresh = row["state"] in ("reserved", "waiting")
            store.update_decision(token, job_id=job_id, state="bound" if fresh else None)
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
        """Resolve the class, decide, reserve on route; the decision is stored afterwards by
        the writer thread (queued by ``defer``'s callables when given, so the caller can send
        the answer first: the writer's Python work competes for the GIL). No Slurm call, no
        store read."""
        token = secrets.token_hex(6)
        with self._lock:
            resolution = resolve(job.job_request(), self._store_view, self.resolve_config)
            view, cluster = self._view, self._cluster
            if view is None or cluster is None:
                why = self._problem if self._view is None and self._problem else "no Slurm view yet"
                return self._plain_pass(why, resolution.job_class)
            job, denied = self._label_policy(job, view.static.labels)
            if denied is not None:
                return Decision("deny", MappingProxyType({}), resolution.job_class, denied)
            decision = decide(
                job,
                job_class=resolution.job_class,
                class_reason=resolution.reason,
                cluster=cluster,
                labels=view.static.labels,
                policy=self.policy,
                version=self.version,
                token=token,
                partition_nodes=view.partition_nodes,
                default_partition=view.default_partition,
                leave_packing=self.config.advisor.pin == "steered",
                now=self.wall_clock(),
            )
            if decision.allocation is not None:  # routed, or left to Slurm where it would go
                cluster.allocate(decision.allocation)
                made = self.clock()
                self._reservations[token] = Reservation(
                    token,
                    decision.allocation.uuids,
                    made + self.config.advisor.reservation_ttl_s,
                    made=made,
                )
                state = "reserved"
            elif decision.action == "wait":
                state = "waiting"  # kept off GPUs the policy avoids; re-planning routes it
            elif decision.retry and decision.request is not None:
                decision = self._waiting(decision, token)
                state = "waiting"
            else:
                return decision
        answer = decision.to_wire()
        if decision.job_class is not None:
            with self._lock:
                self._requests[token] = (job, decision.job_class, self.clock())

        def save() -> object:
            return self.writer.submit(
                lambda s: s.save_decision(token, job.stored(), answer, state=state)
            )

        if defer is None:
            save()
        else:
            defer.append(save)
        return decision

    def _label_policy(
        self, job: JobDescription, labels: LabelTable
    ) -> tuple[JobDescription, str | None]:
        """``advisor.label_requests`` for a job that names a PM label itself (a user could
        otherwise pick the fastest bin): allow it, translate it to the label's GPU model (the
        job is then placed like any other; what is stored is the translated request), or deny
        it. The advisor's own users (``allowed_users``, root) are always allowed."""
        rule = self.config.advisor.label_requests
        if rule == "allow" or job.user in self.config.advisor.allowed_users or job.uid == 0:
            return job, None
        fields = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")
        named = {f: getattr(job, f) for f in fields if getattr(job, f)}
        translated = {f: labels_as_models(v, labels) for f, v in named.items()}
        if translated == named:
            return job, None
        if rule == "deny":
            return job, (
                "GPU types here are PM labels the advisor assigns; ask for the GPU model "
                f"instead ({', '.join(sorted(set(translated.values())))})"
            )
        return replace(job, **translated), None

    def _waiting(self, decision: Decision, token: str) -> Decision:
        """A pass because nothing fits now: its admin comment carries ``r=<token>`` so the
        re-planner finds the original request when GPUs free up (PROTOCOL.md deviation)."""
        fields = dict(decision.set_fields)
        fields["admin_comment"] = format_admin_comment(
            version=self.version,
            action="pass",
            token=token,
            job_class=decision.job_class,
            why=decision.reason,
        )
        return replace(decision, set_fields=MappingProxyType(fields), token=token)

    def _plain_pass(self, why: str, job_class: str | None) -> Decision:
        fields = {
            "admin_comment": format_admin_comment(version=self.version, action="pass", why=why)
        }
        return Decision("pass", MappingProxyType(fields), job_class, why)

    # -- records -----------------------------------------------------------------------------
    def apply_record(self, record: Mapping[str, object], timeout_s: float = 30.0) -> bool:
        """Keep a Prolog/Epilog record (at most once); an epilog with telemetry also feeds the
        job history. True when the record was new."""
        return self.submit_record(record).result(timeout=timeout_s)

    def submit_record(self, record: Mapping[str, object]) -> Future[bool]:
        """Queue the record's store write; the future says whether it was new. The caller can
        work (a job-end round) while the writer catches up with the decisions queued before."""
        classifier = self._classifier
        record_id = record.get("record_id")
        if isinstance(record_id, str):
            with self._lock:
                self._recent_records[record_id] = None
                while len(self._recent_records) > 100_000:
                    self._recent_records.pop(next(iter(self._recent_records)))
        job_id, node, indices = record.get("job_id"), record.get("node"), record.get("slurm_gpus")
        if (
            isinstance(job_id, int)
            and isinstance(node, str)
            and isinstance(indices, list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
        ):
            with self._lock:
                self._record_gpus.setdefault(job_id, {})[node] = tuple(indices)
                while len(self._record_gpus) > 100_000:
                    self._record_gpus.pop(next(iter(self._record_gpus)))
        return self.writer.submit(lambda s: _apply_record(s, dict(record), classifier), urgent=True)

    def recorded_gpus(self, job_id: int) -> dict[str, tuple[int, ...]]:
        """Node -> the Slurm GPU indices ``job_id``'s records named (empty: none came)."""
        with self._lock:
            return dict(self._record_gpus.get(job_id, {}))

    def job_gpu_indices(self, job: JobState) -> dict[str, tuple[int, ...]]:
        """Node -> the Slurm GPU indices ``job`` holds: from the read when it has them
        (``squeue --json``), else from the job's records (the brief read has none)."""
        if job.allocated_gres:
            return job.allocated_gpu_indices()
        recorded = self.recorded_gpus(job.job_id)
        if job.nodes:
            recorded = {n: ix for n, ix in recorded.items() if n in job.nodes}
        return recorded

    def seen_record(self, record: Mapping[str, object]) -> bool:
        """Was this record id handed in before by this process (a spooled copy, a retry)?
        The store stays the authority; this only spares a round for a known duplicate."""
        with self._lock:
            return record.get("record_id") in self._recent_records

    def requests_for(self, tokens: Iterable[str]) -> dict[str, tuple[JobDescription, str]]:
        """The decided request and class of each token: from memory, and in one store read for
        the ones it does not hold (decided before a restart). Tokens without a readable
        decision are left out."""
        wanted = list(tokens)
        with self._lock:
            found = {t: self._requests[t][:2] for t in wanted if t in self._requests}
        missing = [t for t in wanted if t not in found]
        if missing:
            rows = self.writer.call(lambda s: {t: s.decision(t) for t in missing}, timeout_s=60)
            now = self.clock()
            for token, row in rows.items():
                if row is None:
                    continue
                answer = row["answer"]
                job_class = answer.get("class") if isinstance(answer, dict) else None
                if not job_class:
                    continue
                try:
                    job = JobDescription.from_wire(row["job"])
                except JobDescError:
                    continue
                found[token] = (job, str(job_class))
                with self._lock:
                    self._requests[token] = (job, str(job_class), now)
        return found

    def released_by(self, record: Mapping[str, object]) -> list[str]:
        """The UUIDs of the GPUs an Epilog record's job gives back on the record's node
        (``slurm_gpus`` are Slurm's indices, mapped through labels.json). Slurm keeps them
        allocated until the Epilog ends, so the view still counts them as used."""
        view = self._view
        node, indices = record.get("node"), record.get("slurm_gpus")
        if view is None or not isinstance(node, str) or not isinstance(indices, list):
            return []
        labels = view.static.labels
        uuids = []
        for slurm_index in indices:
            try:
                uuids.append(labels.uuid_at_slurm_index(node, int(slurm_index)))
            except (KeyError, TypeError, ValueError):
                log.warning("epilog of job %s: GPU %s on %s not in labels.json",
                            record.get("job_id"), slurm_index, node)  # fmt: skip
        return uuids

    # -- reading ------------------------------------------------------------------------------
    @property
    def view(self) -> View | None:
        return self._view

    def cluster_snapshot(self) -> Cluster | None:
        """A copy of the current cluster (reservations applied), for the re-planner/tests."""
        with self._lock:
            return None if self._cluster is None else self._cluster.copy()

    def reservations(self) -> dict[str, Reservation]:
        with self._lock:
            return {t: replace(r) for t, r in self._reservations.items()}

    def release_reservation(self, token: str) -> None:
        """Forget a reservation (its job was re-planned; the new one replaces it)."""
        with self._lock:
            if self._reservations.pop(token, None) is not None and self._view is not None:
                self._cluster = self._with_reservations(self._view.base)

    def reserve(self, token: str, uuids: Iterable[str], job_id: int | None) -> None:
        """Hold GPUs for a re-planned job (same TTL as a route)."""
        with self._lock:
            made = self.clock()
            self._reservations[token] = Reservation(
                token, tuple(uuids), made + self.config.advisor.reservation_ttl_s, job_id, made
            )
            if self._view is not None:
                self._cluster = self._with_reservations(self._view.base)

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


def _apply_record(store: Store, record: dict[str, object], classifier: Any) -> bool:
    added = store.add_job_record(record)
    telemetry = record.get("telemetry")
    if not added or record.get("kind") != "epilog" or not isinstance(telemetry, dict):
        return added
    job_id = int(record["job_id"])  # type: ignore[call-overload]
    # A multi-node job: one history row from every node's summary so far (merged, not the
    # last node's alone); each later node's record replaces it with the fuller merge.
    telemetry = merge_telemetry(store.job_records(job_id)) or telemetry
    row = store.decision_for_job(job_id)
    if row is None:
        log.info("epilog of job %d: no advisor decision for it, history not updated", job_id)
        return added
    try:
        dram = float(telemetry["dram_util"])
        fu = float(telemetry["fu_util"])
        job = JobDescription.from_wire(row["job"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("epilog of job %d: telemetry unusable: %s", job_id, exc)
        return added
    request = job.job_request()
    app, _ = claimed_app(request)
    claimed_class = None
    if app is not None:
        known = store.application(app)
        claimed_class = None if known is None else known.job_class
    measured = None
    if classifier is not None:
        measured = str(classifier.predict([[dram, fu]])[0])
    store.record_job(
        JobRecord(
            job_id=str(job_id),
            user=request.user,
            job_name=request.job_name,
            script_sha256=request.script_sha256 or "",
            claimed_app=app,
            claimed_class=claimed_class,
            measured_class=measured,
            dram_util=dram,
            fu_util=fu,
            source=str(telemetry.get("source")) if telemetry.get("source") else None,
        )
    )
    log.info("job %d measured class %s (dram %.1f, fu %.1f)", job_id, measured, dram, fu)
    return added
