"""Which application and class each finished job had, from the advisor's stored decisions
(pure): what makes Prolog/Epilog records comparable runs for drift and suspicion.

The key is what the advisor resolved classes by: (user, job name, script sha256), joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slurm_pal.core.drift import JobInfo
from slurm_pal.engine.jobdesc import JobDescription

__all__ = ["jobs_from_decisions"]


def jobs_from_decisions(
    decisions: Iterable[Mapping[str, object]],
) -> tuple[dict[str, JobInfo], dict[str, str]]:
    """Job id -> (history key, class) from the advisor's decisions; why others were left out."""
    jobs: dict[str, JobInfo] = {}
    skipped: dict[str, str] = {}
    for d in decisions:
        job_id = str(d.get("job_id") or "")
        answer = d.get("answer")
        job_class = answer.get("class") if isinstance(answer, dict) else None
        if not job_id:
            continue
        if not isinstance(job_class, str) or not job_class:
            skipped[job_id] = "the advisor gave it no class"
            continue
        try:
            desc = JobDescription.from_wire(d.get("job") or {})  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            skipped[job_id] = f"unreadable job description ({exc})"
            continue
        key = "|".join((desc.user, desc.name, desc.script_sha256 or ""))
        jobs[job_id] = JobInfo(key, job_class, f"{desc.user}|{desc.name}")
    return jobs, skipped
