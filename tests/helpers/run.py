"""This test run's identity, set before anything of slurm-pal is imported (tests/conftest.py
imports this first): the marker every process the run starts inherits, and, under
pytest-xdist, whether this process is one of the run's workers.

Every process the suite starts inherits ``LEAK_MARK`` (the testbed's daemons keep every
variable but SLURM_*/SBATCH_*, jobs get sbatch's environment): what still carries it once the
suite is over was left behind. Not SLURM_-prefixed, so the testbed does not drop it.

A worker keeps its controller's mark, and the controller checks once every worker is done
(a worker that finished first would take the daemons of a testbed another worker still uses
for leaks). A worker also drops the terminal size its controller did not have: GNU readline,
once the controller imports it, exports COLUMNS=80 and LINES=24 to every process it starts,
and the CLI's consoles would then cut piped tables at 80 columns."""

from __future__ import annotations

import os
import uuid

__all__ = ["LEAK_MARK", "XDIST_WORKER"]

LEAK_MARK = "SPAL_TEST_RUN"
_UNSET = "SPAL_TEST_UNSET"  # the terminal variables the run's controller did not have
_TERMINAL = ("COLUMNS", "LINES")


def _is_xdist_worker_of_this_run() -> bool:
    """Is this process a pytest-xdist worker of the run whose mark it inherited? The mark
    names the process that set it, and a worker is that process's child; a pytest a test
    starts (tests/test_suite_leaks.py) inherits a worker's variables but is the worker's
    child, so it is a run of its own, with its own mark."""
    mark = os.environ.get(LEAK_MARK, "")
    return "PYTEST_XDIST_WORKER" in os.environ and mark.split("-", 1)[0] == str(os.getppid())


XDIST_WORKER = _is_xdist_worker_of_this_run()
if XDIST_WORKER:
    for _name in os.environ.get(_UNSET, "").split(","):
        if _name in _TERMINAL:
            os.environ.pop(_name, None)
else:
    os.environ[LEAK_MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[_UNSET] = ",".join(name for name in _TERMINAL if name not in os.environ)
