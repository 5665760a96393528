"""The advisor as a site config sets it up, in simulator terms.

``slurm-pal serve --config FILE`` and ``slurm-pal sim run --config FILE`` must decide alike, or
the simulator's verdict says nothing about the service a site deploys. Every ``[advisor]``,
``[classes]`` and ``[locality]`` setting that changes a placement decision is carried here into
:class:`~slurm_pal.sim.engine.SimConfig` keywords; the policy itself is built by
:func:`slurm_pal.core.placement.configured_policy`, the builder the service uses.
"""

from __future__ import annotations

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.core.placement import SETTINGS

__all__ = ["advisor_sim_options"]


def advisor_sim_options(site: SiteConfig) -> dict[str, object]:
    """``SimConfig`` keywords for placement ``advisor`` under ``site``."""
    advisor = site.advisor
    settings = {
        "pack_tolerance": float(advisor.pack_tolerance),
        "avoid_above": float(advisor.avoid_above),
        "wait": advisor.outliers == "wait",
        "max_wait_s": float(advisor.max_wait_s),
    }
    used = SETTINGS.get(advisor.policy, ())  # only what the policy takes: reports read clearly
    return {
        "placement": "advisor",
        "advisor_policy": advisor.policy,
        "advisor_settings": tuple((k, v) for k, v in settings.items() if k in used),
        "locality_penalty": float(site.locality.across_switches),
        "default_class": site.classes.default,
        # Without the Epilog's round the advisor decides at submit; a job that waited starts
        # where Slurm puts it (the periodic replan_s round usually comes too late: testbed).
        "decisions": "every-event" if advisor.replan_on_epilog else "at-submit",
    }
