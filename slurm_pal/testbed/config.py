"""A testbed's folders and config files: slurm.conf, gres.conf, job_submit.lua and
``testbed.json`` rendered from the cluster's description, with the ports they name.

Why apart from the daemons: what Slurm is told (one gres.conf line per fake GPU, the hooks,
the ports) is the testbed's contract with the tests; the multi-host testbed changes only the
addresses and ports it renders (:meth:`SlurmConfigFiles._config_context`,
:meth:`SlurmConfigFiles._pick_ports`).
"""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import asdict

from jinja2 import Environment, PackageLoader, StrictUndefined

from slurm_pal.core.hostlist import compress
from slurm_pal.testbed.layout import TestbedLayout
from slurm_pal.testbed.munge import munge_dir

STATE_FILE = "testbed.json"


class SlurmConfigFiles(TestbedLayout):
    """Prepares the folders and renders the configs of
    :class:`~slurm_pal.testbed.cluster.LocalSlurm` (which holds the fields read here)."""

    cluster_name: str
    partition: str
    cpus: int
    real_memory: int
    job_submit_lua: str | None
    prolog: str | None
    epilog: str | None
    task_prolog: str | None
    extra_conf: tuple[str, ...]
    ctld_port: int
    node_ports: dict[str, int]

    def _prepare_dirs(self) -> None:
        for sub in ("state", "log", "run", "munge", "jobs"):
            path = self.root / sub
            if path.exists():
                shutil.rmtree(path)  # stale job state and logs of an earlier run
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for sub in ("etc", "log", "run", "state/ctld", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.root / "state" / f"slurmd-{node.name}").mkdir()
        munge_dir(self.root / "munge", 0o700)
        munge_dir(self.root / "run" / "munge", 0o755)  # o+x, or munged refuses the socket
        munge_log = self.log_dir / "munged.log"
        munge_log.touch()
        shutil.chown(munge_log, "munge", "munge")

    def _pick_ports(self) -> None:
        """Free ports for slurmctld (binds 0.0.0.0) and each slurmd (127.0.0.1)."""
        held: list[socket.socket] = []
        try:
            ctld = _hold_free_port("", held)
            ports = {n.name: _hold_free_port("127.0.0.1", held) for n in self.nodes}
        finally:
            for s in held:
                s.close()
        self.ctld_port, self.node_ports = ctld, ports

    def _write_configs(self) -> None:
        env = Environment(
            loader=PackageLoader("slurm_pal.testbed", "templates"),
            undefined=StrictUndefined,
            keep_trailing_newline=True,
        )
        etc = self.root / "etc"
        if self.job_submit_lua is not None:
            (etc / "job_submit.lua").write_text(self.job_submit_lua)
        context = self._config_context()
        self.conf.write_text(env.get_template("slurm.conf.j2").render(context))
        (etc / "gres.conf").write_text(env.get_template("gres.conf.j2").render(context))
        if self.bin_dir is not None:
            # 24.11's slurmd sets up cgroups for slurmstepd even under proctrack/linuxproc and
            # task/none, and dies on a cgroup v2 host without systemd ("systemd scope for
            # slurmstepd could not be set": seen on the lent GPU machine); nothing here uses them.
            (etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        state = asdict(self)  # type: ignore[call-overload]  # the cluster (LocalSlurm) is a dataclass
        state["root"] = str(self.root)
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    def _config_context(self) -> dict[str, object]:
        """What the slurm.conf and gres.conf templates render (the multi-host testbed adds
        the controller's and each node's host name and address)."""
        nodes = [
            {
                "name": n.name,
                "port": self.node_ports[n.name],
                "gres": n.gres(),
                "features": ",".join(n.features),
                "gpus": [{"type": t, "file": self.device(i)} for i, t in enumerate(n.gpu_types)],
            }
            for n in self.nodes
        ]
        context = {
            "root": str(self.root),
            "cluster_name": self.cluster_name,
            "ctld_port": self.ctld_port,
            "munge_socket": str(self.munge_socket),
            "job_submit_lua": self.job_submit_lua is not None,
            "prolog": self.prolog,
            "epilog": self.epilog,
            "task_prolog": self.task_prolog,
            "extra_conf": self.extra_conf,
            "cpus": self.cpus,
            "real_memory": self.real_memory,
            "nodes": nodes,
            "partition": self.partition,
            "node_list": compress(n.name for n in self.nodes),
            "plugin_dir": self._plugin_dir(),
        }
        return context


def _hold_free_port(host: str, held: list[socket.socket]) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    held.append(s)
    return int(s.getsockname()[1])
