"""The job description job_submit.lua sends: now in :mod:`slurm_pal.engine.jobdesc` (the
advisor engine, which the service and the simulator both run); re-exported here so imports of
the service's module keep working."""

from slurm_pal.engine.jobdesc import *  # noqa: F403
from slurm_pal.engine.jobdesc import __all__  # noqa: F401
