"""What every peer runner shares: the jobs' run state, the GPUs' truth and scores, locality,
and turning the run into a :class:`~slurm_pal.sim.metrics.SimResult` (pure).

The peers (FFT-PM, SJF-BSBF, SJF-FFS, GIMBAL-style, and their combinations with PAL) are
scheduler and placement at once, so they run their own loops here instead of the engine's
round/Slurm loops; the engine's existing policies are untouched (their numbers are pinned).
The job model is the engine's: ``work`` median-GPU one-node seconds, progress at
``1 / (max_g true slowdown x L)``; peers that share GPUs divide that by the interference
factor (:mod:`slurm_pal.sim.peers.interference`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slurm_pal.core.workload import SimJob
from slurm_pal.sim.metrics import JobOutcome, SimResult
from slurm_pal.sim.variability import SimGpus

__all__ = ["PeerJob", "PeerRun"]

EPSILON = 1e-9


class PeerJob:
    """Mutable run state of one job under a peer policy."""

    __slots__ = (
        "end",
        "gpus",
        "max_nodes",
        "migrations",
        "order",
        "preemptions",
        "rate",
        "remaining",
        "spec",
        "start",
    )

    def __init__(self, spec: SimJob, order: int) -> None:
        self.spec = spec
        self.order = order
        self.remaining = spec.work
        self.gpus: tuple[int, ...] = ()
        self.rate = 0.0
        self.start: float | None = None
        self.end: float | None = None
        self.preemptions = 0
        self.migrations = 0
        self.max_nodes = 0

    @property
    def job_class(self) -> str:
        return self.spec.job_class


class PeerRun:
    """The inputs every peer needs, checked the way the engine checks them."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        gpus: SimGpus,
        *,
        locality_penalty: float,
        placement: str,
        scheduler: str,
        mode: str,
    ) -> None:
        self.sim_gpus = gpus
        self.placement = placement
        self.scheduler = scheduler
        self.mode = mode
        self.n_gpus = gpus.n_gpus
        self.per_node = gpus.gpus_per_node
        self.penalty = locality_penalty
        self.truth = {c: np.asarray(v, dtype=float).tolist() for c, v in gpus.true_slowdown.items()}
        self.scores = {
            c: np.asarray(v, dtype=float).tolist() for c, v in gpus.placement_scores.items()
        }
        unknown = sorted({j.job_class for j in jobs} - set(self.truth))
        if unknown:
            raise ValueError(
                f"jobs of class(es) {', '.join(unknown)} but the GPUs only have scores for "
                f"{', '.join(gpus.classes)}"
            )
        ordered = sorted(enumerate(jobs), key=lambda pair: (pair[1].submit_time, pair[0]))
        self.unplaceable = [job.job_id for _, job in ordered if job.gpus > self.n_gpus]
        self.jobs = [PeerJob(job, order) for order, job in ordered if job.gpus <= self.n_gpus]
        self.timeline: list[tuple[float, int]] = []

    def node(self, gpu: int) -> int:
        return gpu // self.per_node

    def locality(self, gpus: Sequence[int]) -> float:
        """L of a GPU set: 1.0 inside one node, the across-nodes penalty otherwise."""
        first = gpus[0] // self.per_node
        return 1.0 if all(g // self.per_node == first for g in gpus) else self.penalty

    def solo_rate(self, job: PeerJob, gpus: Sequence[int], *, believed: bool = False) -> float:
        """Progress rate alone on ``gpus``: true slowdowns, or the binned scores the policy
        sees when ``believed``."""
        values = (self.scores if believed else self.truth)[job.job_class]
        return 1.0 / (max(values[g] for g in gpus) * self.locality(gpus))

    def note_gpus(self, job: PeerJob, gpus: tuple[int, ...]) -> None:
        job.gpus = gpus
        job.max_nodes = max(job.max_nodes, len({self.node(g) for g in gpus}))

    def result(self) -> SimResult:
        outcomes = tuple(
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
            )
            for job in self.jobs
        )
        return SimResult(
            placement=self.placement,
            scheduler=self.scheduler,
            mode=self.mode,
            n_gpus=self.n_gpus,
            gpus_per_node=self.per_node,
            jobs=outcomes,
            timeline=tuple(self.timeline),
            unplaceable=tuple(self.unplaceable),
        )


def pack_gpus(available: Sequence[int], count: int, per_node: int) -> tuple[int, ...] | None:
    """``count`` GPUs of ``available`` on the fewest nodes: a job that fits a node goes to the
    fullest node that still fits it (best fit); a larger one takes whole nodes, most free first,
    and the remainder from the node whose free count fits it most tightly. None if too few."""
    if count > len(available):
        return None
    by_node: dict[int, list[int]] = {}
    for gpu in sorted(available):
        by_node.setdefault(gpu // per_node, []).append(gpu)
    fits = [(len(g), n) for n, g in by_node.items() if len(g) >= count]
    if fits:
        _, node = min(fits)
        return tuple(by_node[node][:count])
    chosen: list[int] = []
    nodes = sorted(by_node, key=lambda n: (-len(by_node[n]), n))
    while len(chosen) < count:
        need = count - len(chosen)
        tight = [n for n in nodes if len(by_node[n]) >= need]
        node = min(tight, key=lambda n: (len(by_node[n]), n)) if tight else nodes[0]
        take = by_node[node][:need]
        chosen.extend(take)
        nodes.remove(node)
    return tuple(sorted(chosen))
