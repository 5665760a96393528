"""The advisor engine: one object, built once from the site's settings, that makes every
decision the advisor makes; the service (``slurm-pal serve``) and the simulator's Slurm mode
are its two drivers.

Why an object: the service and the simulator must decide alike, or ``sim run --config`` and
``tune`` predict something other than what ``serve`` does with the same file. Before, each
built its policy and threaded the same keywords through free functions on its own; now both
hold an :class:`AdvisorEngine` and ask it. Pure: no I/O, no lock, no Slurm; the clock is
passed to every call, the caller keeps its view of the cluster (the service: Slurm's last read
less its reservations; the simulator: its own cluster) and applies what comes back.

Events and what answers them:

- a job's submission, as Slurm's ``job_desc`` (the service): :meth:`AdvisorEngine.submit`
  -> :class:`~slurm_pal.engine.advise.Advice` (route, wait, pass or deny, and the state the
  stored decision starts in);
- a round (a job's end, the periodic tick, a held job's bound; in the simulator every arrival
  too) over the pending jobs it steered: :meth:`AdvisorEngine.replan` ->
  :class:`~slurm_pal.engine.replan.ReplanResult` (the updates Slurm must be told; a simulated
  Slurm is told them as they are decided);
- a job's end, as what it ran: :meth:`AdvisorEngine.job_ended` (what the site's jobs run
  teaches the wait rule; :meth:`AdvisorEngine.learn_runtimes` starts it from a history;
  :meth:`AdvisorEngine.use_runtimes` takes a model learned elsewhere: the service learns on
  its store writer's thread and hands copies over);
- one placement request at a moment (underneath both of the above):
  :meth:`AdvisorEngine.place` -> :class:`~slurm_pal.engine.placing.Placement`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.jobchange import ReleaseRules
from slurm_pal.core.placement import PlacementPolicy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.runtimes import EndedJob, RuntimeModel
from slurm_pal.engine.advise import Advice, advise
from slurm_pal.engine.decide import LabelTable
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.placing import Placement, place
from slurm_pal.engine.replan import (
    PendingJob,
    ReplanResult,
    RequestKey,
    SimulatedSlurm,
    plan_replan,
)
from slurm_pal.engine.settings import EngineSettings

__all__ = ["AdvisorEngine"]


class AdvisorEngine:
    """The advisor's decisions under ``settings`` (its policy built from them unless
    ``policy`` is given: the simulator's paper policies); ``version`` goes into the admin
    comments it writes."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        version: str,
        policy: PlacementPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.version = version
        self.policy = policy if policy is not None else settings.build_policy()
        self.runtimes = RuntimeModel()
        self.use_runtimes(self.runtimes)

    def __repr__(self) -> str:
        return f"AdvisorEngine(policy={self.policy.name!r}, pin={self.settings.pin!r})"

    @property
    def rounds_at_job_end(self) -> bool:
        """Does a job's end run a round (``replan_on_epilog``)? Off, the advisor decides only
        at each job's submission, and a job that found no GPUs then is Slurm's to place."""
        return self.settings.replan_on_epilog

    def learn_runtimes(self, ended: Iterable[EndedJob]) -> None:
        """Start the runtime model over from the site's finished jobs (oldest first)."""
        self.runtimes.fit(ended)

    def job_ended(self, job: EndedJob) -> None:
        """A job ran to its end: what it ran teaches the runtime model."""
        self.runtimes.partial_fit(job)

    def use_runtimes(self, model: RuntimeModel) -> None:
        """Weigh waits with ``model`` from now on (the policy is handed it too): a driver
        that learns apart from the threads that decide (the service) hands each new fit
        over, and a rebuilt engine keeps what the one before it learned."""
        self.runtimes = model
        if hasattr(self.policy, "runtimes"):
            # the policy weighs waits with what the site's jobs ran, as the engine learns it
            self.policy.runtimes = model

    def place(
        self,
        request: PlacementRequest,
        cluster: Cluster,
        *,
        now: float | None = None,
        waiting_since: float | None = None,
    ) -> Placement:
        """Where ``request`` goes now among ``cluster``'s free GPUs (no partitions), with
        ``pin`` applied (``Placement.left_to_slurm``). ``waiting_since``: when the engine
        first held the job back; ``cluster``'s clock becomes ``now``."""
        return place(
            self.policy,
            request,
            cluster,
            now=now,
            waiting_since=waiting_since,
            leave_packing=self.settings.leave_packing,
        )

    def submit(
        self,
        job: JobDescription,
        *,
        job_class: str | None,
        class_reason: str,
        cluster: Cluster,
        labels: LabelTable,
        partition_nodes: Mapping[str, Iterable[str]] | None,
        default_partition: str | None,
        token: str,
        now: float,
    ) -> Advice:
        """The answer to a job's submission (``job``: the request as Slurm sent it, parsed
        once at the driver's boundary; ``cluster``: the free GPUs, not changed here: the
        driver takes a route's GPUs)."""
        return advise(
            job,
            job_class=job_class,
            class_reason=class_reason,
            cluster=cluster,
            labels=labels,
            partition_nodes=partition_nodes,
            default_partition=default_partition,
            settings=self.settings,
            policy=self.policy,
            version=self.version,
            token=token,
            now=now,
        )

    def replan(
        self,
        pending: Sequence[PendingJob],
        cluster: Cluster,
        *,
        labels: LabelTable,
        class_order: Sequence[str] | None,
        partition_nodes: Mapping[str, Sequence[str]] | None,
        default_partition: str | None,
        now: float,
        known: MutableMapping[RequestKey, PlacementRequest | None] | None = None,
        release: ReleaseRules | None = None,
        slurm: SimulatedSlurm | None = None,
    ) -> ReplanResult:
        """A round over the steered pending jobs (in Slurm's priority order) on ``cluster``'s
        free GPUs (copied): the updates to write. ``release``: what the Slurm release the
        driver writes to can change in a pending job (None: 22.05's rules). ``slurm``: the
        Slurm a driver simulates (the simulator's Slurm mode): the round runs on ``cluster``
        itself with that Slurm's start rule, and each update is applied to it as decided."""
        return plan_replan(
            pending,
            cluster,
            labels=labels,
            policy=self.policy,
            version=self.version,
            class_order=class_order,
            partition_nodes=partition_nodes,
            default_partition=default_partition,
            known=known,
            release=release,
            leave_packing=self.settings.leave_packing,
            now=now,
            slurm=slurm,
            backfill=self.settings.slurm_backfill,
            backfill_reserves=self.settings.slurm_backfill_reserves,
            overtime_unlimited=self.settings.slurm_overtime_unlimited,
        )
