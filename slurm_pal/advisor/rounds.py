"""The re-planning rounds of the running advisor: when a round runs and what it writes.

Three things start a round: the ``replan`` op and the ``advisor.replan_s`` loop (after a Slurm
re-read), an Epilog's record (a job's end: the Epilog waits for the round's answer, so the
updates land before Slurm can start anything on the GPUs it frees), and a held job's bound
coming (its hold ends). Ends that arrive together share one round.

Why apart from the server: the plan itself is pure (the engine's
:meth:`~slurm_pal.engine.engine.AdvisorEngine.replan` on
:func:`~slurm_pal.engine.replan.round_cluster`, the clock passed in); this class coordinates
the rounds, keeps what they wrote since Slurm's last read, sends the updates through the
applier (``adapters/slurm``) and queues the store writes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from slurm_pal.advisor.counters import Counters
from slurm_pal.advisor.jobend import job_gpus
from slurm_pal.engine.replan import (
    PendingJob,
    ReplanResult,
    due_holds,
    pending_as_written,
    round_cluster,
)

if TYPE_CHECKING:
    from slurm_pal.adapters.slurm.update import JobApplier
    from slurm_pal.advisor.state import AdvisorState, View

__all__ = ["HOLDING_STATES", "SLOW_ROUND_S", "RoundCoordinator"]

log = logging.getLogger("slurm_pal.advisor")

#: Job states in which a job holds its GPUs (Slurm keeps them until each node's Epilog ends).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})

#: A re-planning round slower than this logs where its time went (an Epilog waits for it).
SLOW_ROUND_S = 0.25


class RoundCoordinator:
    """The rounds over ``state``'s view: ``applier`` writes them to Slurm, ``reread()`` reads
    Slurm again (counted), ``refresh_now`` wakes the refresh loop after a lost write."""

    def __init__(
        self,
        state: AdvisorState,
        applier: JobApplier,
        counters: Counters,
        *,
        reread: Callable[[], None],
        refresh_now: threading.Event,
        replan_s: float,
    ) -> None:
        self.state = state
        self.applier = applier
        self.counters = counters
        self.replan_s = replan_s
        self._reread = reread
        self._refresh_now = refresh_now
        self._replan_lock = threading.Lock()
        self._end_lock = threading.Lock()  # job ends waiting for a round (coalescing)
        self._ended_jobs: OrderedDict[int, None] = OrderedDict()
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

    # -- what starts a round ----------------------------------------------------------------------
    def loop(self, stopping: threading.Event) -> None:
        """Every ``replan_s`` (idle while it is 0: a reload may set it) until ``stopping``."""
        while not stopping.wait(self.replan_s if self.replan_s > 0 else 1.0):
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
                self._reread()
            return self._counted_round(self.freed_now(frozenset(freed)))

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
            result = self._counted_round(self.freed_now(frozenset()))
            with self._end_lock:
                self._done_round = this_round
                self._last_end_result = result
            if result.failed:  # a write lost to Slurm: the view is stale somewhere
                self._refresh_now.set()  # re-read now, without holding the waiting ends
            return result

    def round_for_due_holds(self) -> None:
        """A held job's bound has come: a round places it now (wherever it fits, outliers
        included), as the simulator does, instead of leaving it to Slurm's next scheduling
        pass after its begin time (up to ``bf_interval``, 30 s by default). Once per job: a
        job that fits nowhere then is left to Slurm like any other."""
        view = self.state.view
        if view is None:
            return
        due = due_holds(view.pending, self.state.wall_clock())
        new = due - self._holds_ended
        self._holds_ended = due
        if not new:
            return
        log.info("bound of held job(s) %s reached: a round places them", sorted(new))
        try:
            self.replan(refresh=False)
        except Exception as exc:
            log.warning("re-planning round at a bound failed: %s", exc)

    def first_end(self, record: Mapping[str, object]) -> bool:
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
            if (
                job_gpus(self.state.view, job_id, self.state.records.recorded_gpus(job_id))
                is not None
            ):
                self._ended_jobs[job_id] = None
                while len(self._ended_jobs) > 10_000:
                    self._ended_jobs.popitem(last=False)
        return True

    def at_job_end(self, record: Mapping[str, object]) -> dict[str, object] | None:
        """Re-plan the pending jobs while the Epilog that sent ``record`` waits for this
        answer: Slurm keeps the ending job's GPUs until its Epilog ends (checked on 22.05), so
        the updates land before Slurm can start anything on them, and pending jobs get
        PM-First/PAL's choice when they start, not only when they were submitted."""
        start = time.perf_counter()
        freed = self.state.released_by(record)
        # A multi-node job's first Epilog frees every node the job held (the view knows them)
        job_id = record.get("job_id")
        whole = (
            job_gpus(self.state.view, job_id, self.state.records.recorded_gpus(job_id))
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

    # -- the GPUs a round counts free -----------------------------------------------------------
    def freed_now(self, extra: frozenset[str]) -> frozenset[str]:
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
            for node, indices in self.state.records.job_gpu_indices(job).items():
                for index in indices:
                    with contextlib.suppress(KeyError):
                        held[labels.uuid_at_slurm_index(node, index)] = job.job_id
        node_of = labels.node_of_uuid

        def still_theirs(uuid: str, job_id: int) -> bool:
            return uuid not in view.busy or node_of(uuid) in on_nodes.get(job_id, ())

        return held, still_theirs

    # -- one round --------------------------------------------------------------------------------
    def _counted_round(self, freed: frozenset[str]) -> ReplanResult:
        start = time.perf_counter()
        result = self._round(freed)
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
        return pending_as_written(view.pending, self._written, self._placed)

    def _round(self, freed: frozenset[str] = frozenset()) -> ReplanResult:
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
        reserved = [r.uuids for token, r in reservations.items() if token not in tokens]
        result = state.engine.replan(
            pending,
            round_cluster(view.base, freed, reserved),
            known=dict(view.requests),  # the round's own: a new job's request is added to it
            labels=view.static.labels,
            class_order=view.static.class_order,
            partition_nodes=view.partition_nodes,
            default_partition=view.default_partition,
            release=getattr(self.applier, "release", None),  # 24.11 replaces typed requests
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
                state.writer.submit_durable(
                    "update_decision", {"token": update.token, "state": "waiting", "answer": answer}
                )
                log.info(
                    "job %d held until %s: %s",
                    update.job_id,
                    _epoch_text(update.decision.wait_until),
                    update.decision.reason,
                )
                continue
            self._hold_placed(update.job_id, update.token, allocation.uuids, placed_at)
            state.writer.submit_durable(
                "update_decision", {"token": update.token, "state": "replanned", "answer": answer}
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


def _epoch_text(epoch: float | None) -> str:
    """An epoch time as the controller's local time, for a log line."""
    if epoch is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _gpus_text(gpus: Mapping[str, Iterable[str]] | None) -> str:
    if not gpus:
        return "(untyped)"
    return ";".join(f"{n}:{'+'.join(labels)}" for n, labels in gpus.items())
