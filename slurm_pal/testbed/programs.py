"""Which Slurm and munge programs a testbed runs: the host's own, or a cached other release.

Why apart from the cluster: the tests and the CLI ask whether a machine can run a testbed
(:func:`missing_binaries`) without building one. Another release (``24.11``) runs the programs
in ``$SLURM_PAL_CACHE/slurm-RELEASE/bin`` (default /var/cache/slurm-pal), built by
``scripts/install-slurm.sh --release RELEASE``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REQUIRED_BINARIES = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "sbatch",
    "sinfo",
    "squeue",
    "scontrol",
    "scancel",
    "runuser",
)
SBIN_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
RELEASE_ENV = "SLURM_PAL_SLURM_RELEASE"
CACHE_ENV = "SLURM_PAL_CACHE"
DEFAULT_CACHE = "/var/cache/slurm-pal"
SYSTEM_RELEASES = ("", "system", "22.05")  # the host's own Slurm (Debian 12: 22.05)


def default_release() -> str:
    """The release a testbed runs when none is given: ``$SLURM_PAL_SLURM_RELEASE`` or system."""
    return os.environ.get(RELEASE_ENV, "").strip() or "system"


def release_bin_dir(release: str | None = None) -> Path | None:
    """The folder of ``release``'s Slurm and munge programs; None for the host's own Slurm."""
    release = default_release() if release is None else release
    if release in SYSTEM_RELEASES:
        return None
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE) / f"slurm-{release}" / "bin"


def missing_binaries(release: str | None = None) -> list[str]:
    """Slurm/munge programs this machine lacks for ``release`` (default: see the module
    docstring); install them with scripts/install-slurm.sh [--release RELEASE]."""
    bin_dir = release_bin_dir(release)
    return [b for b in REQUIRED_BINARIES if which(b, bin_dir) is None]


def which(name: str, bin_dir: Path | None = None) -> str | None:
    """``name`` on PATH and the sbin folders, ``bin_dir`` (a release's programs) first."""
    dirs = [os.environ.get("PATH", ""), *SBIN_DIRS]
    if bin_dir is not None:
        dirs.insert(0, str(bin_dir))
    return shutil.which(name, path=os.pathsep.join(dirs))
