"""Trace-driven simulation on the live advisor's placement core (pure: no I/O).

Every GPU choice is made by :func:`slurm_pal.core.placement.get_policy` policies and PAL's queue
cut (:func:`slurm_pal.core.queue.plan_round` / :func:`placement_order`); this module only decides
*when* jobs are (de)allocated: rounds, stickiness, preemption, backfill.

Job model (PAL paper Eq. (1), PAL's artifact): a job holds ``work`` seconds of median-GPU,
single-node time; on GPUs ``G`` it progresses at rate ``1 / (max_g slowdown_g[class] x L)``,
``L`` the locality penalty of the level ``G`` spans (1.0 inside a node). Slowdowns are the
simulated GPUs' *true* values (:class:`~slurm_pal.sim.variability.SimGpus`), the policies see
the binned PM-scores.

Round mode (PAL / Blox, ``blox_new_flow_multi_run.py``): at each boundary ``t = k x R``:

1. running jobs advance by the round that ended; a job whose work is done ends (at ``t`` in
   artifact mode, Blox's one-round JCT granularity; at its exact finish time otherwise) and frees
   its GPUs at ``t``;
2. jobs submitted at or before ``t`` join the queue (a job is never seen mid-round);
3. the scheduler orders all unfinished jobs: FIFO by submit time; LAS by attained service
   (GPU-seconds, Blox's ``round x GPUs`` per round run); SRTF by remaining median-GPU work
   (Blox subtracts GPU-seconds of service from seconds of work; we do not mix units);
4. placement:

   - non-sticky (``packed-nonsticky``, ``random-nonsticky``, ``pm-first``, ``pal``): every
     running job is released, then :func:`plan_round` re-places the queue (``on_misfit="stop"``:
     PAL's code never backfills). For PM-First and PAL the prefix that fits in the cluster is
     sorted by class (PAL's cut); the packed/random baselines keep the scheduler's order. A
     running job placed back on exactly its GPUs continues untouched; on other GPUs it counts a
     migration; not placed, a preemption. Migration is free, as in the artifact's simulation;
   - sticky (``packed-sticky`` = Tiresias, ``random-sticky``): running jobs keep their GPUs.
     Queued jobs are placed in order; one that does not fit preempts running jobs from the tail
     of the order (lowest priority first), one at a time, until it fits; if it still does not,
     the round stops there. PAL's code leaves those victims preempted (artifact mode); the
     corrected mode gives them their GPUs back. Victims later in the order may restart on new
     GPUs in the same round, as in Blox;

5. GPUs in use are sampled for the utilization curve.

Non-sticky rounds ask the policy again only for the part of the queue that changed: the
decisions for a prefix that repeats last round's plan are repeated (the policies are
deterministic and start from an empty cluster each round), except for Random.

Slurm mode (what production will see): event-driven, non-preemptive. At every arrival or
completion the advisor re-plans the pending jobs in scheduler order through
:func:`placement_order` (PAL's cut and class sort): the round is the advisor engine's
(:meth:`slurm_pal.engine.engine.AdvisorEngine.replan`, the call the service's rounds make: its
policy, the held jobs' waits and bound, and ``pin``: a job the engine leaves to Slurm is placed
by this Slurm's own packing), run inside this simulated Slurm (:mod:`slurm_pal.sim.slurmround`),
which is written each update as decided; a job starts the moment it is placed and keeps its
GPUs to the end. When a job does not fit, it gets an EASY-backfill
reservation: the time enough GPUs free up (from the running jobs' end times, i.e. perfect time
limits) and the GPUs left over then; a later job may only start before it if it ends by then
(judged on its median-GPU work: the advisor does not know slowdowns ahead) or fits in the
leftover GPUs. Stickiness does not exist here (``packed-sticky`` == ``packed-nonsticky``).

Hooks (Slurm mode only, :class:`SimHooks`): something outside the engine may change the GPUs'
true slowdowns between events (a GPU that degrades or is repaired; a job keeps the rate it
started with), hear of every job that ends (what the Prolog/Epilog records tell the advisor)
and hand placement new PM-scores (:meth:`Cluster.rescored`), all at event times, before the
round. :mod:`slurm_pal.sim.loop` drives the closed loop through them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from slurm_pal.adapters.slurm.release import parse_release
from slurm_pal.core.cluster import Cluster
from slurm_pal.core.placement import (
    Allocation,
    PlacementPolicy,
    PlacementResult,
    get_policy,
)
from slurm_pal.core.queue import (
    BACKFILL_RESERVES,
    NodeBackfill,
    backfill_reservation,
    expected_end,
    placement_order,
    plan_round,
)
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.runtimes import EndedJob
from slurm_pal.core.topology import WITHIN_NODE, Topology
from slurm_pal.core.workload import SimJob
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.settings import PINS, EngineSettings
from slurm_pal.sim.metrics import JobOutcome, SimResult
from slurm_pal.sim.peers import PEERS, simulate_peer
from slurm_pal.sim.slurmround import SlurmRounds
from slurm_pal.sim.variability import SimGpus

__all__ = [
    "ALL_PLACEMENTS",
    "BACKFILL_RESERVES",
    "DECISIONS",
    "MODES",
    "PAPER_PLACEMENTS",
    "PLACEMENTS",
    "REQUESTS",
    "SCHEDULERS",
    "SLURM_RELEASES",
    "JobEnd",
    "ProbeHooks",
    "SimConfig",
    "SimHooks",
    "simulate",
]

PLACEMENTS: dict[str, tuple[str, bool]] = {
    "packed-sticky": ("packed", True),
    "packed-nonsticky": ("packed", False),
    "random-sticky": ("random", True),
    "random-nonsticky": ("random", False),
    "pm-first": ("pm-first", False),
    "pal": ("pal", False),
    "packed-pm": ("packed-pm", True),
    "null": ("packed", True),
    "advisor": ("", True),
}
"""Simulator placement name -> (core policy name, sticky). PAL and PM-First are non-sticky in
PAL's paper and code; Tiresias = packed-sticky, Gandiva = packed-nonsticky. ``packed-pm`` is the
production default (packing's nodes, outlier GPUs avoided where that costs nothing); ``null`` is
packing with each node's GPUs taken in a seeded random order: the PM-blind null that shows how far
the queue's own noise moves single runs.
``advisor`` is the advisor as a site config sets it up (``SimConfig.advisor_policy`` with
``advisor_settings``; see :func:`slurm_pal.sim.advisor.advisor_sim_options`)."""

PAPER_PLACEMENTS: tuple[str, ...] = (
    "packed-sticky",
    "packed-nonsticky",
    "random-sticky",
    "random-nonsticky",
    "pm-first",
    "pal",
)
"""The PAL paper's six placements (what ``sim run`` compares by default without a site config)."""

ALL_PLACEMENTS: tuple[str, ...] = (*PLACEMENTS, *PEERS)
"""Every name ``SimConfig.placement`` takes: the engine's placements, then the peers
(:mod:`slurm_pal.sim.peers`: scheduler and placement at once, their own clock; ``mode`` does
not apply to them, ``scheduler`` only orders ``gimbal`` and ``pal-share``)."""

SCHEDULERS = ("fifo", "las", "srtf")
MODES = ("rounds", "slurm")
REQUESTS = ("gpus", "gres-per-node")
"""How users ask Slurm for a job that fits in a node (Slurm mode): ``--gpus=N`` (cons_tres may
spread it over nodes) or ``--gres=gpu:N`` (sbatch's one node). Jobs of whole nodes ask
``-N k --gres=gpu:<node's GPUs>`` either way."""
SLURM_RELEASES = ("22.05", "24.11")
"""The releases whose planning of a job past its limit was measured (``slurm_release``)."""
DECISIONS = ("every-event", "at-submit")
"""When the advisor places a job in Slurm mode: at every arrival and job end (the Epilog's
re-planning round, ``advisor.replan_on_epilog``), or only at the job's own submission; a job
that found no GPUs then is started where Slurm's own packing puts it."""
_EPSILON = 1e-9


@dataclass(frozen=True)
class SimConfig:
    """One simulation's knobs. ``pal_artifact`` switches on PAL's quirks that change numbers:
    JCTs counted at round boundaries and sticky preemptions that are not undone when the
    preempting job still does not fit. ``class_order`` ranks classes for PAL's cut (default: the
    GPUs' class order). ``topology`` overrides the flat ``locality_penalty`` model.

    Tuning knobs (what the advisor believes vs what the site is): ``site_locality_penalty`` is
    the true slowdown of a job spanning nodes (default: ``locality_penalty``, which is then
    only what PAL's L x V matrix assumes); ``advised_classes`` maps a job's true class to the
    class the advisor places it as (fewer classes: merged ones), progress still uses the true
    class's slowdowns; ``default_class`` is the class the advisor gives jobs it could not
    identify (``SimJob.known`` False; None: their trace class).

    Peers only: ``migration_seconds`` is what moving or resuming a job costs FFT-PM and
    ``pal-fft`` (state restore, in progress and in FFT's switching penalty); ``xi`` overrides
    every pair's interference factor of the sharing peers (SJF-BSBF's global xi sweep).

    Placement ``advisor`` only: ``advisor_policy``/``advisor_settings`` build the engine's
    policy; ``advisor_pin`` is ``advisor.pin`` (``steered``: a job whose pick is packing's own
    is left to the simulated Slurm's packing; ``every-job``: every placed job is pinned)."""

    placement: str = "pal"
    scheduler: str = "fifo"
    mode: str = "rounds"
    round_seconds: float = 360.0
    locality_penalty: float = 1.7
    seed: int = 0
    pal_artifact: bool = False
    backfill: bool = True
    class_order: tuple[str, ...] | None = None
    topology: Topology | None = None
    site_locality_penalty: float | None = None
    advised_classes: tuple[tuple[str, str], ...] = ()
    default_class: str | None = None
    max_time: float = 10 * 365 * 86400.0
    migration_seconds: float = 30.0
    xi: float | None = None
    advisor_policy: str = "packed-pm"
    advisor_settings: tuple[tuple[str, float | bool], ...] = ()
    decisions: str = "every-event"
    advisor_pin: str = "steered"
    requests: str = "gpus"
    enforce_limits: bool = False
    """Slurm mode: a job still running at its time limit ends there, as Slurm ends it (state
    TIMEOUT, its work lost; not resubmitted). Off: it runs to the end of its work, so what a
    slow GPU costs a job with a tight limit stays counted, as its JCT."""
    backfill_reserves: str = "head"
    """Slurm mode, backfill: what it keeps free for waiting jobs. ``head``: EASY, the first
    waiting job only, by GPU count (the figures in the docs). ``nodes``: as Slurm's
    sched/backfill does, every waiting job it plans, on whole nodes, over its limit."""
    slurm_release: str = "22.05"
    """Slurm mode: the release whose backfill the simulated Slurm plans as, where it differs:
    a job past its limit (not killed) is expected to run a whole limit more by 22.05 to 24.05,
    and counted gone by 24.11 on, which then plans the queue's head now and backfills nothing
    beside it (``SlurmRelease.backfill_drops_jobs_past_limit``)."""

    def __post_init__(self) -> None:
        if self.placement not in ALL_PLACEMENTS:
            raise ValueError(
                f"unknown placement {self.placement!r}; valid: {', '.join(ALL_PLACEMENTS)}"
            )
        if self.scheduler not in SCHEDULERS:
            raise ValueError(
                f"unknown scheduler {self.scheduler!r}; valid: {', '.join(SCHEDULERS)}"
            )
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.decisions not in DECISIONS:
            raise ValueError(f"unknown decisions {self.decisions!r}; valid: {', '.join(DECISIONS)}")
        if self.advisor_pin not in PINS:
            raise ValueError(f"unknown pin {self.advisor_pin!r}; valid: {', '.join(PINS)}")
        if self.requests not in REQUESTS:
            raise ValueError(f"unknown requests {self.requests!r}; valid: {', '.join(REQUESTS)}")
        if self.enforce_limits and self.mode != "slurm":
            raise ValueError("enforce_limits needs mode 'slurm' (the round mode preempts)")
        if self.backfill_reserves not in BACKFILL_RESERVES:
            raise ValueError(
                f"unknown backfill_reserves {self.backfill_reserves!r}; valid: "
                f"{', '.join(BACKFILL_RESERVES)}"
            )
        if parse_release(f"slurm {self.slurm_release}") is None:
            raise ValueError(
                f"unknown Slurm release {self.slurm_release!r}; valid: MAJOR.MINOR such as "
                f"{', '.join(SLURM_RELEASES)}"
            )
        if not (math.isfinite(self.round_seconds) and self.round_seconds > 0):
            raise ValueError(f"round length must be > 0 s, got {self.round_seconds}")
        for penalty in (self.locality_penalty, self.site_locality_penalty):
            if penalty is not None and not (math.isfinite(penalty) and penalty >= 1.0):
                raise ValueError(f"locality penalty must be >= 1.0, got {penalty}")

    @property
    def backfill_drops_jobs_past_limit(self) -> bool:
        release = parse_release(f"slurm {self.slurm_release}")
        return release is not None and release.backfill_drops_jobs_past_limit

    @property
    def sticky(self) -> bool:
        return PLACEMENTS[self.placement][1]

    @property
    def policy_name(self) -> str:
        if self.placement == "advisor":
            return self.advisor_policy
        return PLACEMENTS[self.placement][0]


@dataclass(frozen=True)
class JobEnd:
    """A job that just ended, as its Prolog/Epilog records describe it: its application
    (``SimJob.model``), true class, GPU UUIDs and when it ran, and the class the advisor
    placed it as (what the service's records carry; None: its true class)."""

    job_id: str
    app: str
    job_class: str
    gpus: tuple[str, ...]
    start: float
    end: float
    penalty: float = 1.0
    """The locality penalty its spread costs in the advisor's model (1.0 inside a node)."""
    advised_class: str | None = None

    @property
    def placed_class(self) -> str:
        """The class the advisor placed it as (its true class when not told)."""
        return self.advised_class or self.job_class


class SimHooks(Protocol):
    """What the Slurm mode lets the outside change or see, at each event time."""

    def advance(self, now: float, truth: dict[str, list[float]]) -> None:
        """Apply what happened to the GPUs by ``now`` to ``truth`` (class -> slowdown per
        GPU, mutated in place; jobs starting from now on feel it)."""

    def job_ended(self, job: JobEnd) -> None:
        """A job ended (called before the round that reuses its GPUs)."""

    def scores(self) -> Mapping[str, Sequence[float]] | None:
        """New placement scores (class -> one per GPU) when they changed since the last
        call, else None."""


class ProbeHooks(SimHooks, Protocol):
    """Hooks that also run short pinned jobs of their own (re-measures) on idle GPUs: after
    each round (so they take only GPUs no pending job took: low priority) the engine asks
    ``probes`` which free GPUs to hold for how long, holds them (the GPU time is spent,
    nothing else runs there), and calls ``probe_ended`` when each is done. Hooks without
    these methods run none."""

    def probes(self, now: float, free: Sequence[bool]) -> Sequence[tuple[int, float]]:
        """(GPU index, seconds) to start now, on GPUs ``free`` says are idle."""

    def probe_ended(self, gpu: int, start: float, end: float) -> None:
        """The probe started on ``gpu`` at ``start`` ended at ``end``."""


def _per_node_request(gpus: int, node_gpus: int | None, one_node_gres: bool) -> int | None:
    """GPUs per node of a job as submitted to Slurm (``-N k --gres=gpu:node_gpus`` for whole
    nodes; ``--gres=gpu:N``, one node, for a job that fits when ``one_node_gres``), or None for
    a per-job request (no node size known: the paper's rounds; ``--gpus=N``; an uneven split)."""
    if node_gpus is None:
        return None
    if gpus <= node_gpus:
        return gpus if one_node_gres else None
    return node_gpus if not gpus % node_gpus else None


class _Job:
    """Mutable run state of one job."""

    __slots__ = (
        "alloc",
        "attained",
        "bound",
        "end",
        "first_wait",
        "held_until",
        "last_alloc",
        "max_nodes",
        "migrations",
        "order",
        "preemptions",
        "rate",
        "remaining",
        "request",
        "spec",
        "start",
        "timed_out",
    )

    def __init__(
        self,
        spec: SimJob,
        order: int,
        advised_class: str,
        node_gpus: int | None = None,
        one_node_gres: bool = False,
    ) -> None:
        self.spec = spec
        self.order = order
        limit = spec.time_limit
        # Jobs ask Slurm as users do (-N k --gres=gpu:node_gpus for whole nodes, and with
        # one_node_gres --gres=gpu:N on one node for a job that fits), so the simulated Slurm
        # and the advisor place it within what such a request allows.
        per_node = _per_node_request(spec.gpus, node_gpus, one_node_gres)
        # What the advisor knows of its length: its time limit; without one in the trace, its
        # run time (the scheduler's perfect knowledge).
        self.request = PlacementRequest(
            job_id=str(order),
            job_class=advised_class,
            gpus=spec.gpus,
            gpus_per_node=per_node,
            runtime_s=spec.work if limit is None else None,
            time_limit_s=limit,
        )
        self.remaining = spec.work
        self.timed_out = False
        """Ended at its time limit with work left (``SimConfig.enforce_limits``)."""
        self.first_wait: float | None = None
        """When the policy first held it back although it could have started."""
        self.held_until: float | None = None
        """Its begin time while held: Slurm neither starts it nor reserves for it before."""
        self.bound: float | None = None
        """The latest it could be held to (kept after it starts, for the metrics)."""
        self.alloc: Allocation | None = None
        self.last_alloc: Allocation | None = None
        self.rate = 0.0
        self.start: float | None = None
        self.end: float | None = None
        self.attained = 0.0
        self.preemptions = 0
        self.migrations = 0
        self.max_nodes = 0


class _Simulation:
    """One run: the cluster, the policy, the jobs and the clock."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        gpus: SimGpus,
        config: SimConfig,
        hooks: SimHooks | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks
        self.past_limit_ends_now = config.enforce_limits or config.backfill_drops_jobs_past_limit
        """Whether the simulated Slurm's backfill expects a job past its limit to end at once
        (killed there, or counted gone by 24.11): read once, its rounds ask at every plan."""
        class_order = config.class_order or gpus.classes
        topology = config.topology or Topology.flat(config.locality_penalty)
        self.cluster = Cluster.from_gpus(gpus.specs(), topology, class_order=class_order)
        assert self.cluster.uuids == tuple(s.uuid for s in gpus.specs())
        self.truth = {name: np.asarray(v, dtype=float) for name, v in gpus.true_slowdown.items()}
        self.truth_lists = {name: v.tolist() for name, v in self.truth.items()}
        params: dict[str, object] = {}
        if config.policy_name == "random":
            params["seed"] = config.seed
        if config.placement == "null":
            params["shuffle_seed"] = config.seed
        # Slurm mode decides through the advisor's engine, the object `serve` runs: placement
        # ``advisor`` is the engine as the site config sets it up; any other placement is the
        # engine around that policy, pinning every job it places.
        advisor = config.placement == "advisor"
        self.engine = AdvisorEngine(
            EngineSettings(
                policy=config.policy_name,
                policy_settings=config.advisor_settings if advisor else (),
                pin=config.advisor_pin if advisor else "every-job",
                replan_on_epilog=config.decisions == "every-event",
            ),
            version="sim",
            policy=None if advisor else get_policy(config.policy_name, **params),
        )
        self.policy: PlacementPolicy = self.engine.policy
        advised_targets = {target for _, target in config.advised_classes}
        if config.default_class is not None:
            advised_targets.add(config.default_class)
        unknown = sorted(
            ({j.job_class for j in jobs} | advised_targets) - set(self.cluster.classes)
        )
        if unknown:
            raise ValueError(
                f"jobs of class(es) {', '.join(unknown)} but the GPUs only have scores for "
                f"{', '.join(self.cluster.class_order)}"
            )
        n_gpus = self.cluster.n_gpus
        ordered = sorted(enumerate(jobs), key=lambda pair: (pair[1].submit_time, pair[0]))
        self.unplaceable = [job.job_id for _, job in ordered if job.gpus > n_gpus]
        advised = dict(config.advised_classes)
        default = config.default_class

        def advised_class(job: SimJob) -> str:
            believed = job.job_class if job.known or default is None else default
            return advised.get(believed, believed)

        # Slurm mode only: the paper's rounds place a job's GPUs anywhere (PAL's own spans).
        node_gpus = self.cluster.max_gpus_per_node if config.mode == "slurm" else None
        self.jobs = [
            _Job(job, order, advised_class(job), node_gpus, config.requests == "gres-per-node")
            for order, job in ordered
            if job.gpus <= n_gpus
        ]
        self.site_penalty = config.site_locality_penalty
        self.by_id = {job.request.job_id: job for job in self.jobs}
        self.timeline: list[tuple[float, int]] = []
        self.at_submit_only = not self.engine.rounds_at_job_end
        self.slurm_packing: PlacementPolicy = get_policy("packed")
        # Random draws differ call by call: its rounds are never replayed from the last plan.
        self.replayable = config.policy_name != "random" and config.placement != "null"
        self.last_plan: tuple[list[str], bool] = ([], False)
        # Baselines keep the scheduler's order; PM-aware policies sort the fitting prefix by
        # class, so the most variability-sensitive jobs choose their GPUs first.
        self.cut_order: tuple[str, ...] = (
            self.cluster.class_order if config.policy_name in ("pal", "pm-first") else ()
        )

    # --- shared steps --------------------------------------------------------------------------

    def _rate(self, job: _Job, alloc: Allocation) -> float:
        """Progress rate on ``alloc`` (called for every new allocation, so it also records the
        widest spread the job ran at)."""
        job.max_nodes = max(job.max_nodes, len(alloc.node_names))
        values = self.truth_lists[job.spec.job_class]
        worst = max([values[gpu] for gpu in alloc.gpu_ids])
        penalty = alloc.penalty
        if self.site_penalty is not None and alloc.level != WITHIN_NODE:
            penalty = self.site_penalty
        return 1.0 / (worst * penalty)

    def _start(self, job: _Job, alloc: Allocation, now: float) -> None:
        self.cluster.allocate(alloc.gpu_ids)
        self._started(job, alloc, now)

    def _started(self, job: _Job, alloc: Allocation, now: float) -> None:
        """``job`` runs on ``alloc`` from ``now`` (its GPUs are already allocated)."""
        job.alloc = alloc
        job.rate = self._rate(job, alloc)
        if job.start is None:
            job.start = now

    def _stop(self, job: _Job) -> None:
        assert job.alloc is not None
        self.cluster.release(job.alloc.gpu_ids)
        job.last_alloc = job.alloc
        job.alloc = None

    def _priority(self, jobs: list[_Job]) -> list[_Job]:
        scheduler = self.config.scheduler
        if scheduler == "fifo":
            return sorted(jobs, key=lambda j: (j.spec.submit_time, j.order))
        if scheduler == "las":
            return sorted(jobs, key=lambda j: (j.attained, j.spec.submit_time, j.order))
        return sorted(jobs, key=lambda j: (j.remaining, j.spec.submit_time, j.order))

    def _busy(self) -> int:
        return self.cluster.n_gpus - self.cluster.n_free

    def result(self) -> SimResult:
        outcomes = [
            JobOutcome(
                job_id=job.spec.job_id,
                job_class=job.spec.job_class,
                gpus=job.spec.gpus,
                submit=job.spec.submit_time,
                start=job.start,
                end=job.end,
                work=job.spec.work,
                tracked=job.spec.tracked,
                preemptions=job.preemptions,
                migrations=job.migrations,
                max_nodes=job.max_nodes,
                held_s=_held_s(job),
                held_to_bound=job.bound is not None
                and job.start is not None
                and job.start >= job.bound - _EPSILON,
                placed_on=_placed_on(job.last_alloc),
                timed_out=job.timed_out,
            )
            for job in self.jobs
        ]
        return SimResult(
            placement=self.config.placement,
            scheduler=self.config.scheduler,
            mode=self.config.mode,
            n_gpus=self.cluster.n_gpus,
            gpus_per_node=self.cluster.max_gpus_per_node,
            jobs=tuple(outcomes),
            timeline=tuple(self.timeline),
            unplaceable=tuple(self.unplaceable),
        )

    # --- round mode ----------------------------------------------------------------------------

    def run_rounds(self) -> SimResult:
        length = self.config.round_seconds
        artifact = self.config.pal_artifact
        arrivals = list(reversed(self.jobs))  # pop() yields the next submission
        active: list[_Job] = []
        now = 0.0
        while arrivals or active:
            if now > self.config.max_time:
                break
            if now > 0:
                finished = False
                for job in active:
                    if job.alloc is None:
                        continue
                    job.attained += length * job.spec.gpus
                    done = length * job.rate
                    if job.remaining <= done * (1 + _EPSILON):
                        job.end = now if artifact else now - length + job.remaining / job.rate
                        job.remaining = 0.0
                        self._stop(job)
                        finished = True
                    else:
                        job.remaining -= done
                if finished:
                    active = [job for job in active if job.end is None]
            while arrivals and arrivals[-1].spec.submit_time <= now:
                active.append(arrivals.pop())
            if not active:
                if arrivals:  # idle: jump to the first boundary that sees the next job
                    self.timeline.append((now, 0))
                    now = math.ceil(arrivals[-1].spec.submit_time / length) * length
                continue
            order = self._priority(active)
            if self.config.sticky:
                self._round_sticky(order, now)
            else:
                self._round_nonsticky(order, now)
            self.timeline.append((now, self._busy()))
            now += length
        self.timeline.append((now, self._busy()))
        return self.result()

    def _round_nonsticky(self, order: list[_Job], now: float) -> None:
        # Everything is released before re-planning, so the plan is plan_round's over the queue
        # cut and sorted by PAL's rule on an empty cluster.
        planned = placement_order(
            [job.request for job in order], self.cluster.n_gpus, self.cut_order
        )
        keep = 0
        if self.replayable:
            # A deterministic policy repeats its decisions for a repeated prefix of that queue:
            # jobs in the prefix last round's plan shares with this one keep their GPUs without
            # asking the policy again (same results as re-placing them, tested), and when the
            # whole last plan (up to the job it stopped at) repeats, nothing changes at all.
            ids = [request.job_id for request in planned]
            last, stopped = self.last_plan
            if last and (ids[: len(last)] == last if stopped else ids == last):
                return
            limit = min(len(ids), len(last) - (1 if stopped else 0))
            while keep < limit and ids[keep] == last[keep]:
                keep += 1
        kept = {request.job_id for request in planned[:keep]}
        previous: dict[str, Allocation] = {}
        held: list[int] = []
        for job in order:
            if job.alloc is not None and job.request.job_id not in kept:
                previous[job.request.job_id] = job.alloc
                held.extend(job.alloc.gpu_ids)
                job.alloc = None
        if held:
            self.cluster.release(held)  # one update for every job to re-place
        results = plan_round(
            planned[keep:],
            self.cluster,
            self.policy,
            on_misfit="stop",
            class_order=(),  # already cut and sorted above
            in_place=True,  # the cluster ends the round with every allocation applied
        )
        if self.replayable:
            considered = [request.job_id for request in planned[:keep]]
            stopped = False
            for result in results:
                considered.append(result.request.job_id)
                if result.allocation is None:
                    stopped = True
                    break
            self.last_plan = (considered, stopped)
        for result in results:
            job = self.by_id[result.request.job_id]
            old = previous.get(result.request.job_id)
            alloc = result.allocation
            if alloc is None:
                if old is not None:
                    job.preemptions += 1
                continue
            if old is not None and old.gpu_ids != alloc.gpu_ids:
                job.migrations += 1
            job.alloc = alloc  # plan_round already allocated these GPUs
            job.rate = self._rate(job, alloc)
            if job.start is None:
                job.start = now

    def _round_sticky(self, order: list[_Job], now: float) -> None:
        for position, job in enumerate(order):
            if job.alloc is not None:
                continue
            result = self.policy.place(job.request, self.cluster)
            victims: list[tuple[_Job, Allocation]] = []
            if result.allocation is None:
                for victim in reversed(order[position + 1 :]):
                    if victim.alloc is None:
                        continue
                    victims.append((victim, victim.alloc))
                    self._stop(victim)
                    result = self.policy.place(job.request, self.cluster)
                    if result.allocation is not None:
                        break
            if result.allocation is not None:
                self._start(job, result.allocation, now)
                for victim, _ in victims:
                    victim.preemptions += 1
                continue
            if self.config.pal_artifact:
                for victim, _ in victims:
                    victim.preemptions += 1
            else:
                for victim, alloc in victims:
                    self.cluster.allocate(alloc.gpu_ids)
                    victim.alloc = alloc
            break

    # --- Slurm mode ----------------------------------------------------------------------------

    def run_slurm(self) -> SimResult:
        self.rounds = SlurmRounds(self)
        arrivals = list(reversed(self.jobs))
        pending: list[_Job] = []
        running: list[tuple[float, int, _Job]] = []  # heap of (end, order, job)
        self.deadlines: list[float] = []  # heap: held jobs' begin times (Slurm acts then)
        now = 0.0
        probes = self.probes = _Probes(self)
        while arrivals or pending or running or probes.heap:
            next_arrival = arrivals[-1].spec.submit_time if arrivals else math.inf
            next_end = min(running[0][0] if running else math.inf, probes.next_end())
            while self.deadlines and self.deadlines[0] <= now:
                heapq.heappop(self.deadlines)
            next_deadline = self.deadlines[0] if self.deadlines and pending else math.inf
            now = min(next_arrival, next_end, next_deadline)
            if not math.isfinite(now) or now > self.config.max_time:
                break  # pending jobs that can never start (cannot happen: sizes are checked)
            while running and running[0][0] <= now:
                _, _, job = heapq.heappop(running)
                job.end = now
                job.remaining = 0.0
                self._stop(job)
                # what it ran teaches the engine's runtime model, as its Epilog the service's
                self.engine.job_ended(
                    EndedJob(job.spec.gpus, job.spec.time_limit, job.end - job.start)  # type: ignore[operator]
                )
                if self.hooks is not None:
                    self._ended(job, now)
            probes.end(now)
            while arrivals and arrivals[-1].spec.submit_time <= now:
                pending.append(arrivals.pop())
            if self.hooks is not None:
                self._sync_hooks(now)
            if pending:
                started = self._slurm_plan(self._priority(pending), running, now)
                if started:
                    pending = [job for job in pending if job.alloc is None]
            probes.start(now)
            self.timeline.append((now, self._busy()))
        return self.result()

    def _ended(self, job: _Job, now: float) -> None:
        """Tell the hooks about a job that ended (``_stop`` has released its GPUs)."""
        alloc = job.last_alloc
        assert self.hooks is not None and job.start is not None and alloc is not None
        uuids = tuple(self.cluster.uuids[gpu] for gpu in alloc.gpu_ids)
        spec = job.spec
        what = (spec.job_id, spec.model, spec.job_class, uuids)
        self.hooks.job_ended(JobEnd(*what, job.start, now, alloc.penalty, job.request.job_class))

    def _sync_hooks(self, now: float) -> None:
        """Let the hooks change the GPUs and, when they have new scores, rescore the view."""
        assert self.hooks is not None
        self.hooks.advance(now, self.truth_lists)
        scores = self.hooks.scores()
        if scores is not None:
            self.cluster = self.cluster.rescored(scores)

    def _slurm_plan(
        self, order: list[_Job], running: list[tuple[float, int, _Job]], now: float
    ) -> bool:
        """One round of the advisor's engine at ``now`` (``engine.replan``, the service's
        round), Slurm's FIFO + EASY backfill deciding which placed jobs may start
        (:mod:`slurm_pal.sim.slurmround`)."""
        rule: _EasyBackfill = (
            _NodeBackfill(self, running, now)
            if self.config.backfill_reserves == "nodes"
            else _EasyBackfill(self, running, now)
        )
        self.cluster.clock = now
        self.rounds.run(order, rule, now)
        return rule.started

    def hold(self, job: _Job, now: float, until: float) -> None:
        """The engine held ``job`` at ``now``: its begin time is ``until`` (Slurm acts then)."""
        job.first_wait = now
        job.held_until = job.bound = until
        heapq.heappush(self.deadlines, until)

    def _planned_end(self, job: _Job, actual_end: float) -> float:
        """When Slurm expects ``job`` (running since ``job.start``) to end: start + time limit
        (never, for an unlimited one); without limits in the trace, its actual end."""
        limit = job.spec.time_limit
        if limit is None:
            return actual_end
        assert job.start is not None
        return job.start + limit

    def _reservation(
        self, needed: int, running: list[tuple[float, int, _Job]], now: float
    ) -> tuple[float, int]:
        """When ``needed`` GPUs will be free (by GPU count, from the running jobs' planned
        ends, as Slurm guesses them for jobs past their limits: this Slurm kills none unless
        ``enforce_limits``, as ``OverTimeLimit=UNLIMITED``, and 24.11 counts them gone) and
        how many are left over then. Never (inf) when unlimited jobs hold them: Slurm cannot
        plan around those either."""
        killed = self.past_limit_ends_now
        ends = [
            (
                expected_end(self._planned_end(job, end), job.spec.time_limit, now, killed=killed),
                job.spec.gpus,
            )
            for end, _, job in running
        ]
        ends += [(end, 1) for end, _, _ in self.probes.heap]
        return backfill_reservation(self.cluster.n_free, ends, needed)


class _Probes:
    """The hooks' own short pinned jobs (:class:`ProbeHooks`) in the Slurm mode."""

    def __init__(self, simulation: _Simulation) -> None:
        self.simulation = simulation
        hooks = simulation.hooks
        self.hooks = hooks if hooks is not None and hasattr(hooks, "probes") else None
        self.heap: list[tuple[float, int, float]] = []  # (end, GPU, start)

    def next_end(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def end(self, now: float) -> None:
        while self.heap and self.heap[0][0] <= now:
            _, gpu, began = heapq.heappop(self.heap)
            self.simulation.cluster.release([gpu])
            self.hooks.probe_ended(gpu, began, now)  # type: ignore[union-attr]

    def start(self, now: float) -> None:
        """Hold the idle GPUs the hooks want (after the round: low priority)."""
        if self.hooks is None:
            return
        cluster = self.simulation.cluster
        free = cluster.free.tolist()
        for gpu, seconds in self.hooks.probes(now, free):
            if not free[gpu] or not seconds > 0:
                continue
            free[gpu] = False
            cluster.allocate([gpu])
            cluster.expect_free_at([gpu], now + seconds)
            heapq.heappush(self.heap, (now + seconds, gpu, now))


def _placed_on(alloc: Allocation | None) -> tuple[str, ...]:
    """An allocation's GPUs as ``node:index`` (empty: never placed)."""
    if alloc is None:
        return ()
    return tuple(f"{n}:{i}" for n, i in zip(alloc.nodes, alloc.local_indices, strict=True))


def _held_s(job: _Job) -> float:
    """How long the advisor held ``job`` back (0: never)."""
    if job.first_wait is None:
        return 0.0
    end = job.start if job.start is not None else job.first_wait
    return max(0.0, end - job.first_wait)


class _EasyBackfill:
    """Slurm's start rule in the simulator: jobs start in priority order; the first job that
    cannot start gets a reservation (the time enough GPUs free up, from the running jobs' end
    times, i.e. perfect time limits, and the GPUs left over then); a later job may start before
    it only if it ends by then (judged on its median-GPU work: Slurm does not know slowdowns)
    or fits in the leftover GPUs. Without backfill the round stops at that first job."""

    def __init__(
        self, simulation: _Simulation, running: list[tuple[float, int, _Job]], now: float
    ) -> None:
        self.simulation = simulation
        self.running = running
        self.now = now
        self.shadow: float | None = None
        self.spare = 0
        self.started = False

    def _ends_in_time(self, job: _Job) -> bool:
        limit = job.spec.time_limit
        runtime = job.spec.work if limit is None else limit
        return self.shadow is not None and self.now + runtime <= self.shadow

    def admits(self, request: PlacementRequest) -> bool:
        job = self.simulation.by_id[request.job_id]
        if (
            self.simulation.at_submit_only
            and job.held_until is not None
            and job.held_until > self.now
        ):
            return False  # held to its begin time, and no advisor round routes it before
        return self.shadow is None or self._ends_in_time(job) or job.spec.gpus <= self.spare

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        simulation = self.simulation
        job = simulation.by_id[request.job_id]
        assert result.allocation is not None
        simulation._started(job, result.allocation, self.now)  # GPUs already taken
        job.held_until = None
        end = self.now + job.remaining / job.rate
        limited = job.spec.time_limit is not None and math.isfinite(job.spec.time_limit)
        if limited and simulation.config.enforce_limits:
            killed_at = self.now + job.spec.time_limit  # type: ignore[operator]
            if end > killed_at + _EPSILON:
                end, job.timed_out = killed_at, True
        heapq.heappush(self.running, (end, job.order, job))
        simulation.cluster.expect_free_at(
            result.allocation,
            simulation._planned_end(job, end),
            since=self.now if limited else math.nan,  # a known run time is not shortened
        )
        self.started = True
        if self.shadow is not None and not self._ends_in_time(job):
            self.spare -= job.spec.gpus

    def fence(self, request: PlacementRequest) -> list[int] | None:
        return None  # EASY reserves by GPU count: no GPU is kept from a job's place

    def blocked(self, request: PlacementRequest) -> bool:
        if self.shadow is not None:
            return True
        job = self.simulation.by_id[request.job_id]
        if job.held_until is not None and job.held_until > self.now:
            # Held: its begin time is later, so Slurm does not consider it yet (Reason
            # BeginTime): no reservation, and the jobs behind it go on. A reservation here
            # would hold the queue behind a job the service holds, which Slurm schedules
            # around (tests/slurm/test_bounded_wait.py).
            return True
        if not self.simulation.config.backfill:
            return False
        self.shadow, self.spare = self.simulation._reservation(
            job.spec.gpus, self.running, self.now
        )
        return True


class _NodeBackfill(_EasyBackfill):
    """The simulated Slurm's start rule with ``backfill_reserves="nodes"``: jobs start as
    under :class:`_EasyBackfill`, but what is kept free for the waiting jobs is Slurm's own
    plan (:class:`~slurm_pal.core.queue.NodeBackfill`: every waiting job, on whole nodes, over
    its limit), read from the cluster's expected ends as the simulator sets them."""

    def __init__(
        self, simulation: _Simulation, running: list[tuple[float, int, _Job]], now: float
    ) -> None:
        super().__init__(simulation, running, now)
        killed = simulation.past_limit_ends_now
        self.plan = NodeBackfill(simulation.cluster, now, overtime_unlimited=not killed)

    def admits(self, request: PlacementRequest) -> bool:
        job = self.simulation.by_id[request.job_id]
        held = job.held_until is not None and job.held_until > self.now
        return self.plan.admits(request) and not (self.simulation.at_submit_only and held)

    def placed(self, request: PlacementRequest, result: PlacementResult) -> None:
        super().placed(request, result)
        self.plan.placed(request, result)

    def fence(self, request: PlacementRequest) -> list[int] | None:
        return self.plan.fence(request)

    def blocked(self, request: PlacementRequest) -> bool:
        job = self.simulation.by_id[request.job_id]
        if job.held_until is not None and job.held_until > self.now:
            return True  # not eligible yet: no reservation (as _EasyBackfill)
        if not self.simulation.config.backfill:
            return False
        return self.plan.blocked(request)


def simulate(
    jobs: Sequence[SimJob], gpus: SimGpus, config: SimConfig, *, hooks: SimHooks | None = None
) -> SimResult:
    """Run one trace on one simulated cluster with one placement and scheduler.

    Deterministic: the same jobs, GPUs and config (seed included) give the same result. Jobs
    asking for more GPUs than the cluster has never run; they are listed in
    ``SimResult.unplaceable`` and left out of the metrics. ``hooks`` (Slurm mode only) change
    GPUs, hear of job ends and rescore placement between events (:class:`SimHooks`).
    """
    if hooks is not None and (config.mode != "slurm" or config.placement in PEERS):
        raise ValueError("hooks need the Slurm mode and one of the engine's placements")
    if config.placement in PEERS:
        return simulate_peer(
            jobs,
            gpus,
            config.placement,
            scheduler=config.scheduler,
            round_seconds=config.round_seconds,
            locality_penalty=config.locality_penalty,
            migration_seconds=config.migration_seconds,
            xi=config.xi,
            class_order=config.class_order,
            max_time=config.max_time,
        )
    simulation = _Simulation(jobs, gpus, config, hooks)
    if config.mode == "slurm":
        return simulation.run_slurm()
    return simulation.run_rounds()
