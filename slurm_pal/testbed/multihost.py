"""A private Slurm on several hosts inside one machine: slurmctld on a controller host, one
slurmd per compute host, each host a set of namespaces on a private bridge
(:mod:`slurm_pal.testbed.hosts`), one munge key and a munged per host.

Why: with every daemon on one host (:class:`~slurm_pal.testbed.cluster.LocalSlurm`) the
Prolog and Epilog reach the advisor's Unix socket and spool dir through the shared file
system, and every munge credential says 127.0.0.1. Here, as on a cluster, a compute host has
its own address and host name, its own munged (credentials carry its address, ``munged
--origin``), its own hooks' spool dir, and cannot see the controller's private folder
(``ctl/``: the advisor's socket, store and log), so a record reaches the advisor only over
the network. Job output folders and the rendered site files stay shared, as on a cluster with
a shared file system.

Slurm sees ``NodeName=n01 NodeHostname=n01 NodeAddr=10.250.0.11 Port=6818`` per node and
``SlurmctldHost=ctl(10.250.0.1)``; every host reads the same slurm.conf; the munge socket path
is the same on every host and leads to that host's own munged. Client commands
(:meth:`MultiHostSlurm.run`) run on the controller, which doubles as the login node.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_pal.testbed.cluster import LocalSlurm, TestbedError
from slurm_pal.testbed.hosts import HostNetwork, HostsError, plan_hosts
from slurm_pal.testbed.munge import munge_dir
from slurm_pal.testbed.pinning import pinned

CTLD_PORT = 6817
SLURMD_PORT = 6818


@dataclass
class MultiHostSlurm(LocalSlurm):
    """:class:`LocalSlurm` with a host per node and a controller host (module docstring).

    ``per_host_dirs``: folders (absolute) every host gets its own copy of at the same path
    (e.g. the hooks' spool dir). ``controller_dir`` (default ``root/ctl``) is visible on the
    controller only: put the advisor's socket, store and log there. ``controller_cpus`` /
    ``compute_cpus``: the CPUs the controller host's daemons (munged, slurmctld, and whatever
    is started with :meth:`daemon_command`) and the compute hosts' daemons (munged, slurmd,
    hence slurmstepd, the jobs and the Prolog/Epilog) are pinned to
    (:mod:`slurm_pal.testbed.pinning`); empty: not pinned.
    """

    controller: str = "ctl"
    per_host_dirs: tuple[str, ...] = ()
    controller_cpus: tuple[int, ...] = ()
    compute_cpus: tuple[int, ...] = ()
    multihost: bool = True  # marks testbed.json, so `testbed down` knows what it attaches to

    def __post_init__(self) -> None:
        super().__post_init__()
        self.per_host_dirs = tuple(str(p) for p in self.per_host_dirs)
        self.controller_cpus = tuple(int(c) for c in self.controller_cpus)
        self.compute_cpus = tuple(int(c) for c in self.compute_cpus)
        try:
            self._hosts = plan_hosts([n.name for n in self.nodes], self.controller)
        except HostsError as exc:
            raise TestbedError(str(exc)) from None

    # -- hosts ---------------------------------------------------------------------------------
    @property
    def controller_dir(self) -> Path:
        return self.root / "ctl"

    @property
    def network(self) -> HostNetwork:
        return HostNetwork(
            self.root,
            self._hosts,
            per_host=[self.munge_socket.parent, *map(Path, self.per_host_dirs)],
            controller_only=[self.controller_dir],
        )

    def address(self, host: str) -> str:
        """The host's address on the testbed's bridge."""
        return self.network.host(host).address

    def on_host(self, host: str, args: Sequence[str]) -> list[str]:
        """The command line that runs ``args`` on ``host``."""
        try:
            return self.network.command(host, args)
        except HostsError as exc:
            raise TestbedError(str(exc)) from None

    def daemon_command(self, host: str, args: Sequence[str]) -> list[str]:
        """The command line that runs a daemon on ``host``, pinned to the host's CPUs
        (``controller_cpus`` / ``compute_cpus``; empty: not pinned). Client commands
        (:meth:`run`, :meth:`on_host`) stay unpinned: they stand for a login node."""
        cpus = self.controller_cpus if host == self.controller else self.compute_cpus
        return self.on_host(host, pinned(cpus, args))

    def popen(self, host: str, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a long-running process on ``host`` (Slurm's environment unless ``env``)."""
        kwargs.setdefault("env", self.env)
        return subprocess.Popen(self.on_host(host, args), **kwargs)

    def pid_files(self) -> dict[str, Path]:
        run = self.root / "run"
        files = {f"slurmd-{n.name}": run / f"slurmd-{n.name}.pid" for n in self.nodes}
        files["slurmctld"] = run / "slurmctld.pid"
        for host in self._hosts:  # "munged" is the controller's (LocalSlurm stops it last)
            key = "munged" if host.controller else f"munged-{host.name}"
            files[key] = self.root / "hosts" / host.name / "munged.pid"
        return files

    def _marker(self, daemon: str) -> str:
        return str(self.munge_socket) if daemon.startswith("munged") else str(self.conf)

    # -- Slurm commands run on the controller ------------------------------------------------
    def run(
        self, args: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command on the controller host (the login node)."""
        return super().run(self.on_host(self.controller, args), timeout_s=timeout_s, check=check)

    # -- lifecycle ------------------------------------------------------------------------------
    def _preflight(self) -> None:
        super()._preflight()
        from slurm_pal.testbed.hosts import missing_tools

        missing = missing_tools()
        if missing:
            raise TestbedError(
                f"programs for the multi-host testbed not found: {', '.join(missing)}; "
                "install iproute2 and util-linux (bash scripts/install-slurm.sh)"
            )

    def _pick_ports(self) -> None:
        # Every host has its own address: Slurm's standard ports never collide.
        self.ctld_port = CTLD_PORT
        self.node_ports = {n.name: SLURMD_PORT for n in self.nodes}

    def _config_context(self) -> dict[str, object]:
        context = super()._config_context()
        ctl = self.network.controller
        context["ctld_host"], context["ctld_addr"] = ctl.name, ctl.address
        for node in context["nodes"]:  # type: ignore[attr-defined]
            node["hostname"] = node["name"]
            node["addr"] = self.address(node["name"])
        return context

    def _start_once(self, timeout_s: float) -> None:
        self._prepare_dirs()
        shutil.rmtree(self.root / "hosts", ignore_errors=True)
        self.controller_dir.mkdir(mode=0o755, exist_ok=True)
        for path in map(Path, self.per_host_dirs):
            path.mkdir(parents=True, exist_ok=True)
        self._pick_ports()
        self._write_configs()
        try:
            self.network.up(timeout_s)
        except HostsError as exc:
            raise TestbedError(str(exc)) from None
        self._start_munged(timeout_s)
        slurmctld = self._which("slurmctld") or "slurmctld"
        self._spawn(self.daemon_command(self.controller, [slurmctld, "-f", str(self.conf)]), "ctld")

        def answers() -> bool:
            return self.run(["scontrol", "ping"], check=False, timeout_s=5).returncode == 0

        self._poll(answers, timeout_s, "slurmctld answering 'scontrol ping'")
        for node in self.nodes:
            slurmd = self._which("slurmd") or "slurmd"
            args = [*self._stepd_namespace(), slurmd, "-N", node.name, "-f", str(self.conf)]
            self._spawn(self.daemon_command(node.name, args), f"slurmd on host {node.name}")
        self.wait_idle(timeout_s)

    def _start_munged(self, timeout_s: float) -> None:
        """One key for the cluster; a munged per host, on that host, whose credentials carry
        the host's address (``--origin``)."""
        key = self.root / "munge" / "munge.key"
        mungekey = self._which("mungekey") or "mungekey"
        self._spawn(["runuser", "-u", "munge", "--", mungekey, "-c", "-f", "-k", str(key)], "key")
        network = self.network
        for host in self._hosts:
            hdir = self.root / "hosts" / host.name
            munge_dir(hdir / "munge", 0o700)
            log = self.log_dir / f"munged-{host.name}.log"
            log.touch()
            shutil.chown(log, "munge", "munge")
            pid_file = self.pid_files()["munged" if host.controller else f"munged-{host.name}"]
            shutil.chown(hdir, "munge", "munge")  # munged writes its pid file here
            args = [
                "runuser",
                "-u",
                "munge",
                "--",
                self._which("munged") or "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={pid_file}",
                f"--log-file={log}",
                f"--seed-file={hdir / 'munge' / 'munged.seed'}",
                f"--origin={host.address}",
            ]
            self._spawn(self.daemon_command(host.name, args), f"munged on host {host.name}")
        # Each host's socket is the file in its own directory behind the shared path.
        sockets = [network.local_dir(h.name, 0) / self.munge_socket.name for h in self._hosts]
        self._poll(lambda: all(s.exists() for s in sockets), timeout_s, "every host's munged")

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Stop Slurm as :class:`LocalSlurm` does (jobs cancelled, slurmctld first), then
        every process left in the testbed's namespaces (an advisor, a job's orphans), then the
        namespaces themselves. Safe on a half-started or already stopped testbed."""
        stopped: list[str] = []
        try:
            if self.network.is_up():
                stopped = super().stop(timeout_s)
        finally:
            try:
                removed = self.network.down(timeout_s)
            except HostsError as exc:
                raise TestbedError(str(exc)) from None
        return stopped + removed
