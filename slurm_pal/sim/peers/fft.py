"""FFT-PM: FFT's per-round binary program over (job, GPU type), a type being a PM bin (pure).

FFT (Mo, Xu, Lau, ICS'25; notes section 1) re-decides every round which jobs run on which GPU
type: minimise ``sum_j sum_i (phi_j^i + s_j^i - rho_j theta_j^i) x_j^i`` (Eqs. (6)/(7)) with
``phi_j^i = (t - a_j) theta_j^i / W_j + d_j W_j / theta_j^i``, at most one type per job, no type
oversubscribed, and the GPUs used at least ``K(t)``; ``rho_j`` is the fairness compensation of
Eq. (5). Solved with HiGHS through :func:`scipy.optimize.milp`.

Choices (the paper is silent or ambiguous; notes 1.2):

- *types*: the PM bins of the most variability-sensitive class (first in the class order) on
  the GPUs' *binned* scores, a bin smaller than a node merged into its nearest-score neighbour
  (a type of scattered outliers only makes multi-GPU jobs span nodes). ``theta_j^i`` =
  1 / (worst score of j's class among type i's GPUs) / L when j is larger than a node: what the
  job would progress, in rounds of work per round. A job larger than every type (FFT never
  spans types, but Sia-Philly has 48-GPU jobs on 64 GPUs) may take the pseudo-type "any GPU"
  at the whole cluster's worst score; feasibility stays exact: typed jobs obey their type's
  capacity, and everything together obeys the cluster's;
- *units*: everything in rounds: ``W`` in rounds of median-GPU work, ``t - a_j`` in rounds,
  ``s`` in rounds, ``theta`` in work-rounds per round. The terms are summed unweighted, as
  printed;
- ``W_j`` in ``phi`` is the *remaining* work (the paper's "behaves similarly to SRSF"); in the
  fair rate of Eq. (5) it is the total work (the fair schedule's whole job);
- ``tau_j`` (max-min fair completion, re-estimated at every arrival/completion): the notes'
  approximation ``a_j + W_j / (mean_i theta_j^i x min(1, N / (|A| d_j)))``;
- ``K(t)``: the largest GPU count any feasible choice reaches (a first, small MILP), so the
  program is work-conserving as FFT requires;
- *switching*: a job that ran last round and gets another type pays ``s = migration_seconds``
  in the objective and in progress (it restores its state before computing); a job moved to
  other GPUs of its own type, or resumed after a pause, pays the time in progress only (FFT's
  ``s = 0`` there is its optimistic assumption that the placer keeps the host);
- *host level* (section 4.3): per type, jobs that ran last round on GPUs of that type keep them
  when still available; the others, largest first, go on the fewest nodes (best fit); the
  "any GPU" jobs take what is left the same way. FFT's consolidation of multi-GPU jobs at churn
  in order of migration overhead is not modeled (our jobs have no state sizes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from slurm_pal.core.workload import SimJob
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.peers.base import EPSILON, PeerJob, PeerRun, pack_gpus
from slurm_pal.sim.variability import SimGpus

__all__ = ["FftPm", "RoundProblem", "gpu_types", "solve_round"]

ANY = -1


@dataclass(frozen=True)
class RoundProblem:
    """One round's program: ``cost[k]`` of pair ``(job[k], type[k])``; ``demand[j]`` GPUs per
    job; ``capacity[i]`` GPUs per type; ``total`` GPUs of the cluster (type ``ANY`` = -1 only
    counts against it)."""

    jobs: int
    pairs: tuple[tuple[int, int], ...]
    cost: tuple[float, ...]
    demand: tuple[int, ...]
    capacity: tuple[int, ...]
    total: int


def _constraints(problem: RoundProblem) -> tuple[list, np.ndarray]:
    n = len(problem.pairs)
    rows, cols, vals = [], [], []
    ub: list[float] = []
    r = 0
    for j in range(problem.jobs):  # one type per job
        for k, (job, _) in enumerate(problem.pairs):
            if job == j:
                rows.append(r)
                cols.append(k)
                vals.append(1.0)
        ub.append(1.0)
        r += 1
    for i, cap in enumerate(problem.capacity):  # no type oversubscribed
        for k, (job, kind) in enumerate(problem.pairs):
            if kind == i:
                rows.append(r)
                cols.append(k)
                vals.append(float(problem.demand[job]))
        ub.append(float(cap))
        r += 1
    for k, (job, _) in enumerate(problem.pairs):  # the whole cluster
        rows.append(r)
        cols.append(k)
        vals.append(float(problem.demand[job]))
    ub.append(float(problem.total))
    r += 1
    matrix = coo_array((vals, (rows, cols)), shape=(r, n)).tocsr()
    gpus = np.array([problem.demand[job] for job, _ in problem.pairs], dtype=float)
    return [LinearConstraint(matrix, -np.inf, np.array(ub))], gpus


def solve_round(problem: RoundProblem) -> dict[int, int]:
    """Job -> chosen type (``ANY`` for the pseudo-type) of the optimal program; jobs left out do
    not run. Maximise the GPUs used first (``K(t)``), then minimise the cost at that level."""
    if not problem.pairs:
        return {}
    n = len(problem.pairs)
    constraints, gpus = _constraints(problem)
    integrality = np.ones(n)
    bounds = Bounds(0, 1)
    first = milp(-gpus, constraints=constraints, integrality=integrality, bounds=bounds)
    if not first.success:
        raise RuntimeError(f"FFT round program (K) failed: {first.message}")
    k_t = round(-first.fun)
    second = milp(
        np.array(problem.cost),
        constraints=[*constraints, LinearConstraint(gpus.reshape(1, -1), k_t - 0.5, np.inf)],
        integrality=integrality,
        bounds=bounds,
    )
    if not second.success:
        raise RuntimeError(f"FFT round program failed: {second.message}")
    chosen: dict[int, int] = {}
    for k, value in enumerate(second.x):
        if value > 0.5:
            job, kind = problem.pairs[k]
            chosen[job] = kind
    return chosen


def gpu_types(scores: Sequence[float], per_node: int) -> list[list[int]]:
    """GPUs grouped by binned score (ascending), bins smaller than a node merged into the
    neighbour of nearest score."""
    values = sorted(set(scores))
    groups = [[g for g, s in enumerate(scores) if s == v] for v in values]
    centers = list(values)
    while len(groups) > 1:
        small = [k for k, g in enumerate(groups) if len(g) < per_node]
        if not small:
            break
        k = min(small, key=lambda i: (len(groups[i]), i))
        neighbours = [n for n in (k - 1, k + 1) if 0 <= n < len(groups)]
        target = min(neighbours, key=lambda n: abs(centers[n] - centers[k]))
        size_k, size_t = len(groups[k]), len(groups[target])
        centers[target] = (centers[target] * size_t + centers[k] * size_k) / (size_t + size_k)
        groups[target] = sorted(groups[target] + groups[k])
        del groups[k], centers[k]
    return groups


class FftPm(PeerRun):
    """FFT's round loop with PM bins as GPU types."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        gpus: SimGpus,
        *,
        locality_penalty: float,
        round_seconds: float,
        migration_seconds: float = 30.0,
        class_order: Sequence[str] | None = None,
        name: str = "fft-pm",
    ) -> None:
        super().__init__(
            jobs,
            gpus,
            locality_penalty=locality_penalty,
            placement=name,
            scheduler="fft",
            mode="rounds",
        )
        if not (math.isfinite(migration_seconds) and migration_seconds >= 0):
            raise ValueError(f"migration time must be >= 0 s, got {migration_seconds}")
        if migration_seconds >= round_seconds:
            raise ValueError("migration time must be shorter than a round")
        self.round = round_seconds
        self.migration = migration_seconds
        order = tuple(class_order or gpus.classes)
        self.types = gpu_types(self.scores[order[0]], self.per_node)
        self.rho: dict[int, float] = {}
        self.tau: dict[int, float] = {}
        self.last_type: dict[int, int] = {}
        self.last_gpus: dict[int, tuple[int, ...]] = {}
        self.solver_seconds = 0.0
        self._theta: dict[tuple[str, int, bool], float] = {}

    # --- FFT's quantities ---------------------------------------------------------------------

    def theta(self, job: PeerJob, kind: int) -> float:
        """Work-rounds per round on a type (believed scores, L when larger than a node)."""
        spans = job.spec.gpus > self.per_node
        key = (job.job_class, kind, spans)
        if key not in self._theta:
            values = self.scores[job.job_class]
            gpus = range(self.n_gpus) if kind == ANY else self.types[kind]
            worst = max(values[g] for g in gpus)
            self._theta[key] = 1.0 / (worst * (self.penalty if spans else 1.0))
        return self._theta[key]

    def allowed(self, job: PeerJob) -> list[int]:
        kinds = [i for i, t in enumerate(self.types) if len(t) >= job.spec.gpus]
        return kinds or [ANY]

    def _estimate_tau(self, active: list[PeerJob], t: float) -> None:
        for job in active:
            kinds = self.allowed(job)
            mean_theta = sum(self.theta(job, i) for i in kinds) / len(kinds)
            share = min(1.0, self.n_gpus / (len(active) * job.spec.gpus))
            arrival = job.spec.submit_time / self.round
            self.tau[job.order] = arrival + (job.spec.work / self.round) / (mean_theta * share)

    def problem(self, active: list[PeerJob], t: float) -> RoundProblem:
        pairs, cost = [], []
        for j, job in enumerate(active):
            arrival = job.spec.submit_time / self.round
            left = job.remaining / self.round
            rho = self.rho.get(job.order, 0.0)
            for kind in self.allowed(job):
                theta = self.theta(job, kind)
                phi = (t - arrival) * theta / left + job.spec.gpus * left / theta
                previous = self.last_type.get(job.order)
                switch = (
                    self.migration / self.round
                    if previous is not None and previous != kind
                    else 0.0
                )
                pairs.append((j, kind))
                cost.append(phi + switch - rho * theta)
        return RoundProblem(
            jobs=len(active),
            pairs=tuple(pairs),
            cost=tuple(cost),
            demand=tuple(job.spec.gpus for job in active),
            capacity=tuple(len(t) for t in self.types),
            total=self.n_gpus,
        )

    def _place(self, active: list[PeerJob], chosen: dict[int, int]) -> dict[int, tuple[int, ...]]:
        """Host level: keep last round's GPUs when possible, else fewest nodes in the type."""
        taken: set[int] = set()
        placed: dict[int, tuple[int, ...]] = {}
        for kind in [*range(len(self.types)), ANY]:
            members = [j for j, k in chosen.items() if k == kind]
            pool = set(range(self.n_gpus)) if kind == ANY else set(self.types[kind])
            rest = []
            for j in members:
                old = self.last_gpus.get(active[j].order)
                was_running = active[j].order in self.last_type
                if was_running and old and set(old) <= pool and not (set(old) & taken):
                    placed[j] = old
                    taken.update(old)
                else:
                    rest.append(j)
            for j in sorted(rest, key=lambda j: (-active[j].spec.gpus, active[j].order)):
                gpus = pack_gpus(sorted(pool - taken), active[j].spec.gpus, self.per_node)
                if gpus is not None:
                    placed[j] = gpus
                    taken.update(gpus)
        return placed

    # --- the round loop -----------------------------------------------------------------------

    def run(self, max_time: float = 10 * 365 * 86400.0) -> SimResult:
        import time

        length = self.round
        arrivals = list(reversed(self.jobs))
        active: list[PeerJob] = []
        running: dict[int, tuple[float, float]] = {}  # order -> (rate, overhead s this round)
        now = 0.0
        changed = False
        while arrivals or active:
            if now > max_time:
                break
            if now > 0:
                for job in active:
                    if job.order not in running:
                        continue
                    rate, overhead = running[job.order]
                    done = (length - overhead) * rate
                    if job.remaining <= done * (1 + EPSILON):
                        job.end = now - length + overhead + job.remaining / rate
                        job.remaining = 0.0
                        changed = True
                    else:
                        job.remaining -= done
                active = [job for job in active if job.end is None]
            while arrivals and arrivals[-1].spec.submit_time <= now:
                active.append(arrivals.pop())
                changed = True
            if not active:
                running = {}
                self.last_type = {}
                if arrivals:
                    self.timeline.append((now, 0))
                    now = math.ceil(arrivals[-1].spec.submit_time / length) * length
                continue
            t = now / length
            if changed:
                self._estimate_tau(active, t)
                changed = False
            started = time.perf_counter()
            chosen = solve_round(self.problem(active, t))
            self.solver_seconds += time.perf_counter() - started
            placed = self._place(active, chosen)
            new_running: dict[int, tuple[float, float]] = {}
            new_type: dict[int, int] = {}
            for j, job in enumerate(active):
                ran = job.order in running
                if j not in placed:
                    if ran:
                        job.preemptions += 1
                    continue
                gpus = placed[j]
                old = self.last_gpus.get(job.order)
                overhead = 0.0
                if old is not None and (gpus != old or not ran):
                    overhead = self.migration
                    if ran:
                        job.migrations += 1
                self.note_gpus(job, gpus)
                self.last_gpus[job.order] = gpus
                new_type[job.order] = chosen[j]
                new_running[job.order] = (self.solo_rate(job, gpus), overhead)
                if job.start is None:
                    job.start = now
            self._update_rho(active, chosen, t)
            running, self.last_type = new_running, new_type
            self.timeline.append((now, sum(len(placed[j]) for j in placed)))
            now += length
        self.timeline.append((now, 0))
        return self.result()

    def _update_rho(self, active: list[PeerJob], chosen: dict[int, int], t: float) -> None:
        """Eq. (5): rho += mu (fair rate - rate this round), mu = (t - a) / (tau - a)."""
        for j, job in enumerate(active):
            arrival = job.spec.submit_time / self.round
            span = max(self.tau[job.order] - arrival, EPSILON)
            mu = max(0.0, t - arrival) / span
            fair = (job.spec.work / self.round) / span
            got = self.theta(job, chosen[j]) if j in chosen else 0.0
            rho = self.rho.get(job.order, 0.0)
            self.rho[job.order] = max(0.0, rho + mu * (fair - got))


class FftPal(FftPm):
    """PAL placement under FFT's fair scheduler (a combination none of the papers built).

    The round program picks *which* jobs run (SRSF-like term, fairness compensation ``rho``,
    work conservation ``K(t)``) over one type, the whole cluster, with ``theta`` = 1 / (the
    class's median binned score x L when the job is larger than a node); PAL (the core policy,
    L x V, PAL's class cut) then places the chosen jobs on an empty cluster every round, like
    the engine's non-sticky PAL. Moving a job costs ``migration_seconds`` of progress, as in
    FFT-PM (the engine's PAL pays nothing for it)."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        gpus: SimGpus,
        *,
        locality_penalty: float,
        round_seconds: float,
        migration_seconds: float = 30.0,
        class_order: Sequence[str] | None = None,
        name: str = "pal-fft",
    ) -> None:
        from slurm_pal.core.cluster import Cluster
        from slurm_pal.core.placement import get_policy
        from slurm_pal.core.topology import Topology

        super().__init__(
            jobs,
            gpus,
            locality_penalty=locality_penalty,
            round_seconds=round_seconds,
            migration_seconds=migration_seconds,
            class_order=class_order,
            name=name,
        )
        self.types = [list(range(self.n_gpus))]
        order = tuple(class_order or gpus.classes)
        self.empty = Cluster.from_gpus(
            gpus.specs(), Topology.flat(locality_penalty), class_order=order
        )
        self.pal = get_policy("pal")
        self.median = {c: float(np.median(v)) for c, v in self.scores.items()}

    def theta(self, job: PeerJob, kind: int) -> float:
        spans = job.spec.gpus > self.per_node
        return 1.0 / (self.median[job.job_class] * (self.penalty if spans else 1.0))

    def _place(self, active: list[PeerJob], chosen: dict[int, int]) -> dict[int, tuple[int, ...]]:
        from slurm_pal.core.queue import plan_round
        from slurm_pal.core.request import PlacementRequest

        requests = [
            PlacementRequest(job_id=str(j), job_class=active[j].job_class, gpus=active[j].spec.gpus)
            for j in sorted(chosen, key=lambda j: (active[j].spec.submit_time, active[j].order))
        ]
        cluster = self.empty.copy()
        results = plan_round(requests, cluster, self.pal, on_misfit="skip", in_place=True)
        return {
            int(r.request.job_id): r.allocation.gpu_ids for r in results if r.allocation is not None
        }
