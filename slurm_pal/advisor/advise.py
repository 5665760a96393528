"""The submit-time advice: now in :mod:`slurm_pal.engine.advise` (the advisor engine,
which the service and the simulator both run); re-exported here so imports of the service's
module keep working."""

from slurm_pal.engine.advise import *  # noqa: F403
from slurm_pal.engine.advise import __all__  # noqa: F401
