"""The advisor's reservations: now in :mod:`slurm_pal.engine.reservations` (the advisor engine,
which the service and the simulator both run); re-exported here so imports of the service's
module keep working."""

from slurm_pal.engine.reservations import *  # noqa: F403
from slurm_pal.engine.reservations import __all__  # noqa: F401
