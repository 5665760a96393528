"""Where a testbed's files and programs are: paths under its root, the release's programs and
the environment Slurm's commands run in.

Why a base of its own: the config files, the daemons, munge and the client commands all find
their files and programs here, so each of them reads one definition of the layout (a
multi-host testbed keeps the same paths on every host).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from slurm_pal.testbed.programs import SBIN_DIRS, release_bin_dir, which
from slurm_pal.testbed.spec import NodeSpec, TestbedError

# Where Debian's slurmd execs slurmstepd (SBINDIR, compiled in; no setting changes it).
STEPD_PATH = "/usr/sbin/slurmstepd"


class TestbedLayout:
    """Paths and programs of the testbed rooted at ``root`` (a part of
    :class:`~slurm_pal.testbed.cluster.LocalSlurm`, which holds the fields)."""

    __test__ = False  # not a pytest test class

    root: Path
    nodes: Sequence[NodeSpec]
    device_pattern: str
    release: str

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge" / "munge.socket.2"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def device(self, index: int) -> str:
        return self.device_pattern.format(index=index)

    @property
    def bin_dir(self) -> Path | None:
        """This release's programs, first on PATH; None: the host's own Slurm."""
        return release_bin_dir(self.release)

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands: SLURM_CONF set, inherited SLURM_* job vars gone,
        this release's programs first on PATH (jobs inherit it, so srun in a job matches)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        env["SLURM_CONF"] = str(self.conf)
        dirs = [env.get("PATH", ""), *SBIN_DIRS]
        if self.bin_dir is not None:
            dirs.insert(0, str(self.bin_dir))
        env["PATH"] = os.pathsep.join(dirs)
        return env

    def _which(self, name: str) -> str | None:
        return which(name, self.bin_dir)

    def _plugin_dir(self) -> str | None:
        """Another release's PluginDir (Slurm's compiled-in one holds the host's plugins)."""
        slurmd = self._which("slurmd") if self.bin_dir is not None else None
        if slurmd is None:
            return None
        root = Path(slurmd).resolve().parents[2]  # ROOT/usr/sbin/slurmd-wlm
        found = sorted(root.glob("usr/lib/*-linux-gnu/slurm-wlm"))
        return str(found[0]) if found else None

    def _stepd_namespace(self) -> list[str]:
        """For another release: run slurmd in a private mount namespace where the compiled-in
        slurmstepd path is this release's slurmstepd (the host's own stays untouched)."""
        if self.bin_dir is None:
            return []
        stepd = self._which("slurmstepd")
        if stepd is None or not os.path.exists(STEPD_PATH):
            raise TestbedError(
                f"Slurm {self.release} needs {self.bin_dir}/slurmstepd and an existing "
                f"{STEPD_PATH} to mount it over; run 'bash scripts/install-slurm.sh "
                f"--release {self.release}'"
            )
        script = 'mount --bind "$0" "$1" && shift && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            stepd,
            STEPD_PATH,
        ]
