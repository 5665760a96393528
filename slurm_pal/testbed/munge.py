"""The testbed's private munged: its own key, socket and folders, owned by user ``munge``.

Why: every Slurm daemon and command authenticates through munge, and the testbed must live
beside a system munged without touching it, so it runs one with its own key on its own
socket (``AuthInfo=socket=...``). munged runs as ``munge`` and refuses folders others may
write, or a socket folder others cannot search.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from slurm_pal.testbed.daemons import SlurmDaemons


def munge_dir(path: Path, mode: int) -> None:
    """A folder owned by ``munge`` with ``mode`` (0700 for the key, 0755 for the socket)."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.chown(path, "munge", "munge")
    path.chmod(mode)


class MungeDaemon(SlurmDaemons):
    """Starts the munged of :class:`~slurm_pal.testbed.cluster.LocalSlurm` (stopped last with
    the other daemons)."""

    def _start_munged(self, timeout_s: float) -> None:
        key = self.root / "munge" / "munge.key"
        # runuser resets nothing we rely on, but name the programs absolutely anyway: the
        # release's munge, not whatever PATH runuser's child would search.
        mungekey = self._which("mungekey") or "mungekey"
        self._spawn(["runuser", "-u", "munge", "--", mungekey, "-c", "-f", "-k", str(key)], "key")
        self._spawn(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                self._which("munged") or "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.pid_files()['munged']}",
                f"--log-file={self.log_dir / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
            "munged",
        )
        self._poll(lambda: self.munge_socket.exists(), timeout_s, "munged socket")
