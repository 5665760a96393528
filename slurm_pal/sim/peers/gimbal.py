"""GIMBAL-style packing with a static squeeze (MPS share) model (pure).

What is modeled (GIMBAL, TACO'25, section 5.1 and LGRR/LISS):

- packing rules: at most 2 jobs per GPU; every job on the fewest nodes its size allows
  (``ceil(G / GPUs per node)``, HiveD's optimal topology); a job may only join a *strictly
  larger* running job, or an equal-size one exactly on its GPUs (balanced co-location); a job
  that joined another never hosts a third, and a host's guests never chain, so the cluster
  splits into packing sets, each one host (J_max) plus guests that share only with it;
- the host scheduler under it: GIMBAL is middleware, so the order comes from ``--scheduler``
  (FIFO default; ``srtf`` = shortest work first); non-preemptive, no reservation;
- a *static* squeeze: when a pair forms, the job with the higher compute share (the one GIMBAL's
  JCT priority, -utilization, squeezes) is capped at an MPS share ``x`` in 10 % steps; the other
  job runs freer. With free-competition factors xi_s, xi_o (the interference table):
  ``xi_squeezed(x) = max(xi_s, 1 / x)`` (it cannot run faster than its SM share) and
  ``xi_other(x) = 1 + (xi_o - 1) x`` (less contention). ``x`` minimises the pair's mean
  predicted completion (GIMBAL's JCT local objective, Eq. (1)), and the pair forms only if that
  beats running them one after the other (violators run sequentially);
- LISS: a host whose workers are only partly shared steals samples from the slowed ones, so it
  runs at the mean of its workers' speeds (``combine="liss"``), not its slowest worker's.

What is *not* modeled: GIMBAL's runtime recalibration. Its coordination search measures the
pair for up to 60 s or 5 steps per try, moves MPS limits by 10 % (3.6 s per LGRR switch, 39 s
per LGRR and 9 s per LISS calibration iteration), stops after 3 tries without gain, and redoes
it as jobs come and go; here ``x`` is chosen once, from the model, at pack time, and stays until
one of the pair ends (then the survivor runs alone at full speed). The model's prediction is the
truth, so the static choice is as good as GIMBAL's search would find, minus its overheads.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_pal.sim.peers.base import PeerJob, pack_gpus
from slurm_pal.sim.peers.interference import InterferenceTable, compute_share
from slurm_pal.sim.peers.sharing import SharingRun, share_or_wait
from slurm_pal.sim.peers.sjf import order_jobs

__all__ = ["GimbalPacking", "squeeze"]

SHARES = tuple(round(0.1 * k, 1) for k in range(1, 11))


def squeeze(
    squeezed_left: float, other_left: float, xi_squeezed: float, xi_other: float
) -> tuple[float, float, float, float]:
    """The static LGRR choice: (x, xi of the squeezed job, xi of the other, mean JCT of the
    pair), ``x`` the MPS share in 10 % steps with the lowest mean predicted completion."""
    best: tuple[float, float, float, float] | None = None
    for x in SHARES:
        xs = max(xi_squeezed, 1.0 / x)
        xo = 1.0 + (xi_other - 1.0) * x
        decision = share_or_wait(other_left, squeezed_left, xo, xs)
        mean = sum(decision.concurrent) / 2
        if best is None or mean < best[3] - 1e-12:
            best = (x, xs, xo, mean)
    assert best is not None
    return best


class GimbalPacking:
    """GIMBAL's packing rules and static squeeze under a non-preemptive host scheduler."""

    combine = "liss"

    def __init__(self, name: str, table: InterferenceTable, scheduler: str = "fifo") -> None:
        self.name = name
        self.table = table
        self.scheduler = scheduler
        self._pairs: dict[tuple[int, int], tuple[float, float]] = {}

    def pair_xi(self, new: PeerJob, other: PeerJob) -> tuple[float, float]:
        return self._pairs[(new.order, other.order)]

    def _plan_pair(
        self, run: SharingRun, new: PeerJob, host: PeerJob, gpus: Sequence[int]
    ) -> tuple[float, tuple[float, float]] | None:
        """(mean JCT if packed, (xi new, xi host)) when packing beats waiting, else None."""
        order = run.class_order
        host_left = host.remaining / run.solo_rate(host, host.gpus, believed=True)
        new_time = new.spec.work / run.solo_rate(new, gpus, believed=True)
        xi_new0 = self.table(new.job_class, host.job_class)
        xi_host0 = self.table(host.job_class, new.job_class)
        shared = len(gpus) / len(host.gpus)  # share of the host's workers slowed (LISS mean)
        if compute_share(new.job_class, order) >= compute_share(host.job_class, order):
            xi_new, xi_host = squeeze(new_time, host_left, xi_new0, xi_host0)[1:3]
        else:
            xi_host, xi_new = squeeze(host_left, new_time, xi_host0, xi_new0)[1:3]
        host_eff = 1.0 / ((1 - shared) + shared / xi_host)
        decision = share_or_wait(host_left, new_time, host_eff, xi_new)
        if not decision.share:
            return None
        return sum(decision.concurrent) / 2, (xi_new, xi_host)

    def schedule(self, run: SharingRun, pending: list[PeerJob], now: float) -> None:
        for job in order_jobs(pending, self.scheduler):
            need = job.spec.gpus
            gpus = pack_gpus(run.free_gpus(), need, run.per_node)
            if gpus is not None:
                run.start(job, gpus, now)
                continue
            min_nodes = -(-need // run.per_node)
            best: tuple[float, PeerJob, tuple[int, ...], tuple[float, float]] | None = None
            for host in run.running:
                if host.order in run.guests or host.spec.gpus < need:
                    continue
                open_gpus = [g for g in host.gpus if len(run.occupants[g]) == 1]
                if host.spec.gpus == need:  # balanced co-location only
                    if len(open_gpus) != need:
                        continue
                    chosen: tuple[int, ...] | None = tuple(host.gpus)
                else:
                    chosen = pack_gpus(open_gpus, need, run.per_node)
                if chosen is None or len({run.node(g) for g in chosen}) > min_nodes:
                    continue
                plan = self._plan_pair(run, job, host, chosen)
                if plan is not None and (best is None or plan[0] < best[0]):
                    best = (plan[0], host, chosen, plan[1])
            if best is None:
                continue
            _, host, chosen, factors = best
            self._pairs[(job.order, host.order)] = factors
            run.start(job, chosen, now, self.pair_xi)
