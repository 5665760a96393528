"""A private, real Slurm (munged + slurmctld + N slurmd) on loopback, inside one directory.

Why: the advisor's promises (typed GRES requests land on the right GPUs, job_submit.lua rewrites
work, the state reader parses what Slurm really prints) can only be checked against a real
Slurm. Debian's Slurm 22.05 is built with ``--enable-multiple-slurmd``, so several ``slurmd -N``
share one host; fake GPUs are tty devices, one gres.conf line per device with its own ``Type=``.

Everything lives under ``root``: configs in ``etc/``, logs in ``log/``, pid files and the munge
socket in ``run/``, Slurm state in ``state/``, the private munge key in ``munge/``, and the
cluster description in ``testbed.json`` (so another process can ``attach`` and stop it). Teardown
signals only the processes named by our pid files whose command line still names our own config
or munge socket (a reused pid is never killed), plus any leftover process whose command line or
environment names our ``slurm.conf``; nothing outside ``root`` is touched.

The daemons run as root (``SlurmUser=root``); munged runs as user ``munge``.

Release: ``LocalSlurm(release=...)``, default ``$SLURM_PAL_SLURM_RELEASE``, else ``system`` (the
host's own Slurm on PATH, 22.05 on Debian 12). Another release (``24.11``) runs the programs in
``$SLURM_PAL_CACHE/slurm-RELEASE/bin`` (default /var/cache/slurm-pal), built by
``scripts/install-slurm.sh --release RELEASE``: Debian binaries patched to use their own root's
loader and libraries, so they run on the host without chroot; slurm.conf then names that root's
PluginDir, and each slurmd runs in a private mount namespace where the compiled-in
``/usr/sbin/slurmstepd`` is that release's slurmstepd.

The class is assembled from one part per concern, each in its own module: the layout (paths,
programs, environment: ``layout.py``), the config files (``config.py``), the client commands
(``commands.py``), the Slurm daemons and teardown (``daemons.py``) and munge (``munge.py``);
what a testbed is made of is ``spec.py``, which programs it runs ``programs.py``. This module
holds the fields and the start-up order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_pal.testbed.commands import TERMINAL_JOB_STATES
from slurm_pal.testbed.config import STATE_FILE, SlurmConfigFiles
from slurm_pal.testbed.munge import MungeDaemon
from slurm_pal.testbed.programs import default_release, missing_binaries, release_bin_dir
from slurm_pal.testbed.spec import NodeSpec, TestbedError, node_specs

__all__ = [
    "TERMINAL_JOB_STATES",
    "LocalSlurm",
    "NodeSpec",
    "TestbedError",
    "default_release",
    "missing_binaries",
    "node_specs",
    "release_bin_dir",
]

MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes; slurmd adds names to its spool


@dataclass
class LocalSlurm(MungeDaemon, SlurmConfigFiles):
    """A private Slurm cluster on loopback rooted at ``root`` (see the module docstring).

    Use as a context manager, or call :meth:`start` and :meth:`stop` (idempotent; ``stop`` is
    safe on a half-started cluster). :meth:`attach` rebuilds the handle from ``root`` in
    another process.
    """

    root: Path
    nodes: Sequence[NodeSpec]
    cluster_name: str = "lab"
    partition: str = "debug"
    device_pattern: str = "/dev/tty{index}"
    cpus: int = 8
    real_memory: int = 2000
    job_submit_lua: str | None = None  # the script's text; enables JobSubmitPlugins=lua
    prolog: str | None = None  # absolute paths of hook scripts (PrologFlags=Alloc with Prolog)
    epilog: str | None = None
    task_prolog: str | None = None
    extra_conf: tuple[str, ...] = ()
    ctld_port: int = 0  # 0: pick free ports at start
    node_ports: dict[str, int] = field(default_factory=dict)
    release: str = field(default_factory=default_release)  # see the module docstring

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.nodes = tuple(self.nodes)
        names = [n.name for n in self.nodes]
        if not names:
            raise TestbedError("a testbed needs at least one node")
        if len(set(names)) != len(names):
            raise TestbedError(f"node names must be unique, got {names}")
        for n in self.nodes:
            for t in n.gpu_types:
                if t is not None and (not t or any(c in t for c in ":,= \t()")):
                    raise TestbedError(
                        f"GPU type {t!r} on {n.name} cannot be a gres Type "
                        "(no ':', ',', '=', '(', ')' or blanks)"
                    )
        if "{index}" not in self.device_pattern:
            raise TestbedError(
                f"device pattern {self.device_pattern!r} must contain '{{index}}' "
                "(e.g. /dev/tty{index})"
            )

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def attach(cls, root: Path | str) -> LocalSlurm:
        """The testbed described by ``root/testbed.json`` (written by :meth:`start`)."""
        path = Path(root).resolve() / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise TestbedError(f"no testbed in {root}: {path} does not exist") from exc
        except (OSError, ValueError) as exc:
            raise TestbedError(f"cannot read {path}: {exc}") from exc
        if data.pop("multihost", False) and cls is LocalSlurm:  # one handle for both kinds
            from slurm_pal.testbed.multihost import MultiHostSlurm

            return MultiHostSlurm.attach(root)
        data["nodes"] = [
            NodeSpec(n["name"], tuple(n["gpu_types"]), tuple(n["features"])) for n in data["nodes"]
        ]
        data["extra_conf"] = tuple(data.get("extra_conf", ()))
        data["root"] = Path(data["root"])
        return cls(**data)

    def start(self, timeout_s: float = 30.0) -> None:
        """Write the configs, start munged, slurmctld and every slurmd; wait until all idle.

        A previous instance in the same directory is stopped first and its state wiped, so a
        start always gives a fresh cluster. On any failure everything started is stopped again.
        """
        self._preflight()
        self.stop()  # stale daemons of an earlier run in this directory
        for attempt in range(2):
            try:
                self._start_once(timeout_s)
                return
            except TestbedError as exc:
                self.stop()
                # Free ports are picked, then released for the daemons: another program may
                # grab one in between. Once, with new ports, before giving up.
                if attempt == 0 and "Address already in use" in str(exc):
                    continue
                raise
            except BaseException:
                self.stop()
                raise

    def _start_once(self, timeout_s: float) -> None:
        self._prepare_dirs()
        self._pick_ports()
        self._write_configs()
        self._start_munged(timeout_s)
        self._start_slurmctld(timeout_s)
        for node in self.nodes:
            self._spawn(
                [
                    *self._stepd_namespace(),
                    self._which("slurmd") or "slurmd",
                    "-N",
                    node.name,
                    "-f",
                    str(self.conf),
                ],
                f"slurmd {node.name}",
            )
        self.wait_idle(timeout_s)

    def _preflight(self) -> None:
        missing = missing_binaries(self.release)
        if missing:
            option = "" if self.bin_dir is None else f" --release {self.release}"
            raise TestbedError(
                f"Slurm {self.release} programs not found: {', '.join(missing)}; "
                f"install them with 'bash scripts/install-slurm.sh{option}' (Debian, as root)"
            )
        if os.geteuid() != 0:
            raise TestbedError(
                "the testbed runs its daemons as root (SlurmUser=root, munged as user munge): "
                "run it as root"
            )
        if len(str(self.munge_socket)) > MAX_SOCKET_PATH:
            raise TestbedError(
                f"testbed directory {self.root} is too long for Unix sockets "
                f"({len(str(self.munge_socket))} > {MAX_SOCKET_PATH} bytes); use a shorter one, "
                "e.g. under /tmp"
            )
        for index in {i for n in self.nodes for i in range(len(n.gpu_types))}:
            if not os.path.exists(self.device(index)):
                raise TestbedError(
                    f"fake GPU device {self.device(index)} does not exist; choose another "
                    "--device-pattern or fewer GPUs per node"
                )
        # munged runs as user 'munge' and must reach its key and socket below root.
        for parent in [self.root, *self.root.parents]:
            if parent.exists() and not os.stat(parent).st_mode & 0o001:
                raise TestbedError(
                    f"{parent} is not searchable by others (mode "
                    f"{oct(os.stat(parent).st_mode & 0o777)}), so munged (user munge) cannot "
                    f"reach its socket; chmod o+x {parent} or put the testbed elsewhere (/tmp)"
                )
