"""Routes Slurm does not start, handed back to it after each read (the rule and why:
:mod:`slurm_pal.engine.stalled`; this module does the service's part: the view, the write
through the round's applier, the log and the counters)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slurm_pal.advisor.counters import Counters
from slurm_pal.core.jobchange import transition_problem
from slurm_pal.engine.stalled import (
    StallClock,
    free_labels,
    release_change,
    waits_for_resources,
)

if TYPE_CHECKING:
    from slurm_pal.adapters.slurm.state import JobState
    from slurm_pal.adapters.slurm.update import JobApplier
    from slurm_pal.advisor.state import AdvisorState

__all__ = ["RouteReleaser"]

log = logging.getLogger("slurm_pal.advisor")


class RouteReleaser:
    """After each read of Slurm: a routed job left pending on free GPUs for ``after_s``
    (``advisor.route_stall_s``; 0: off) gets its user's request back."""

    def __init__(
        self, state: AdvisorState, applier: JobApplier, counters: Counters, *, after_s: float
    ) -> None:
        self.state = state
        self.applier = applier
        self.counters = counters
        self.stalls = StallClock(after_s)
        self._told: set[int] = set()  # jobs Slurm cannot release, logged once each

    def tick(self) -> None:
        view = self.state.view
        if view is None or self.stalls.after_s <= 0:
            return
        self._told &= {p.job_id for p in view.pending}  # started or gone: forgotten
        labels = view.static.labels
        free = free_labels(labels, view.busy)
        release = getattr(self.applier, "release", None)
        pending = [p for p in view.pending if _for_resources(view.job(p.job_id))]
        for job, stood_s in self.stalls.due(pending, free, view.taken):
            change = release_change(
                job,
                labels,
                version=self.state.version,
                stood_s=stood_s,
                now=self.state.wall_clock(),
            )
            problem = transition_problem(change, release)
            if problem is not None:
                if job.job_id not in self._told:
                    self._told.add(job.job_id)
                    self.counters.add("routes_stalled")
                    log.warning(
                        "job %d: routed, pending %.0f s while its GPUs are free; not released "
                        "(%s): see its Reason in scontrol show job %d",
                        job.job_id,
                        stood_s,
                        problem,
                        job.job_id,
                    )
                continue
            error = self.applier.apply(change)
            if error is not None:
                log.warning("job %d: release of a stalled route failed: %s", job.job_id, error)
                continue
            self.counters.add("routes_released")
            self.state.release_reservation(job.token)
            log.warning(
                "job %d: routed, pending %.0f s while its GPUs were free: released to Slurm "
                "as written",
                job.job_id,
                stood_s,
            )


def _for_resources(job: JobState | None) -> bool:
    """Slurm shows the job pending for resources (a job the read does not show: no)."""
    return job is not None and waits_for_resources(job.reason)
