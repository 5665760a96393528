"""The advisor as a site config sets it up, in simulator terms.

``slurm-pal serve --config FILE`` and ``slurm-pal sim run --config FILE`` must decide alike, or
the simulator's verdict says nothing about the service a site deploys. Every ``[advisor]``,
``[classes]`` and ``[locality]`` setting that changes a placement decision is carried here into
:class:`~slurm_pal.sim.engine.SimConfig` keywords; the policy itself is built by
:func:`slurm_pal.core.placement.configured_policy`, the builder the service uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import ArrayLike

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.core.placement import SETTINGS

__all__ = ["advisor_changes_no_job", "advisor_sim_options"]


def advisor_sim_options(site: SiteConfig) -> dict[str, object]:
    """``SimConfig`` keywords for placement ``advisor`` under ``site``."""
    advisor = site.advisor
    settings = {
        "pack_tolerance": float(advisor.pack_tolerance),
        "avoid_above": float(advisor.avoid_above),
        "wait": advisor.outliers == "wait",
        "max_wait_s": float(advisor.max_wait_s),
        "assumed_runtime_s": float(advisor.assumed_runtime_s),
        "limit_share": float(advisor.limit_share),
    }
    used = SETTINGS.get(advisor.policy, ())  # only what the policy takes: reports read clearly
    return {
        "placement": "advisor",
        "advisor_policy": advisor.policy,
        "advisor_settings": tuple((k, v) for k, v in settings.items() if k in used),
        "locality_penalty": float(site.locality.across_switches),
        "default_class": site.classes.default,
        "advisor_pin": site.advisor.pin,
        # Without the Epilog's round the advisor decides at submit; a job that waited starts
        # where Slurm puts it (the periodic replan_s round usually comes too late: testbed).
        "decisions": "every-event" if advisor.replan_on_epilog else "at-submit",
    }


def advisor_changes_no_job(
    site: SiteConfig, placement_scores: Iterable[Mapping[str, ArrayLike]]
) -> str | None:
    """Why the advisor as ``site`` sets it up places every job exactly as packing does on these
    GPUs (one per simulated cluster), or None when it may change some. A report that shows the
    advisor equal to packing, and recommends packing, must say that nothing was there to
    change, not leave it to be read as a loss of the policy."""
    policy = site.advisor.policy
    if policy == "packed":
        return "advisor.policy is 'packed': the advisor leaves every job to Slurm's packing"
    if policy != "packed-pm":
        return None
    highest: dict[str, float] = {}
    for scores in placement_scores:
        for job_class, values in scores.items():
            highest[job_class] = max(highest.get(job_class, 0.0), float(np.max(values)))
    limit = site.advisor.avoid_above
    if not highest or any(value > limit for value in highest.values()):
        return None
    worst = ", ".join(f"{job_class} {value:.3f}" for job_class, value in highest.items())
    return (
        f"the advisor changes no job here: no GPU's PM-score is above advisor.avoid_above = "
        f"{limit:g} for any class (highest: {worst}), so packed-pm places every job as packing "
        "does and the two give the same result"
    )
