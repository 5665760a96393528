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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from slurm_pal.adapters.slurm.parse import parse_key_values
from slurm_pal.core.hostlist import compress

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
# Where Debian's slurmd execs slurmstepd (SBINDIR, compiled in; no setting changes it).
STEPD_PATH = "/usr/sbin/slurmstepd"
STATE_FILE = "testbed.json"
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes; slurmd adds names to its spool
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)


class TestbedError(RuntimeError):
    """The testbed could not be brought up, queried or torn down; the message says what to do."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class NodeSpec:
    """One fake node: its name, one ``Type=`` label per GPU index (None: untyped), features."""

    name: str
    gpu_types: tuple[str | None, ...] = ()
    features: tuple[str, ...] = ()

    def gres(self) -> str:
        """The NodeName ``Gres=`` value: counts per type, in first-seen order."""
        counts: dict[str | None, int] = {}
        for t in self.gpu_types:
            counts[t] = counts.get(t, 0) + 1
        return ",".join(f"gpu:{t}:{n}" if t else f"gpu:{n}" for t, n in counts.items())


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
    return [b for b in REQUIRED_BINARIES if _which(b, bin_dir) is None]


def _which(name: str, bin_dir: Path | None = None) -> str | None:
    dirs = [os.environ.get("PATH", ""), *SBIN_DIRS]
    if bin_dir is not None:
        dirs.insert(0, str(bin_dir))
    return shutil.which(name, path=os.pathsep.join(dirs))


@dataclass
class LocalSlurm:
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

    # -- paths -----------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge" / "munge.socket.2"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def pid_files(self) -> dict[str, Path]:
        """Daemon name -> pid file."""
        run = self.root / "run"
        files = {f"slurmd-{n.name}": run / f"slurmd-{n.name}.pid" for n in self.nodes}
        files["slurmctld"] = run / "slurmctld.pid"
        files["munged"] = run / "munge" / "munged.pid"
        return files

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

    def device(self, index: int) -> str:
        return self.device_pattern.format(index=index)

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

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Cancel jobs, stop our daemons (SIGTERM, then SIGKILL), leave no stray process.

        Returns what was stopped, e.g. ``["slurmd-n01 (pid 123)", ...]``.
        """
        stopped: list[str] = []
        if self._alive("slurmctld") is not None:
            self._cancel_all_jobs(min(timeout_s, 5.0))
        # slurmctld first: stopped while it still talks to dying slurmd, it waits out the RPC
        # timeouts (MessageTimeout, 10 s). munged last: everyone authenticates through it.
        slurm_daemons = [d for d in self.pid_files() if d.startswith("slurmd-")]
        for group in (["slurmctld"], slurm_daemons, ["munged"]):
            pids = {d: p for d in group if (p := self._alive(d)) is not None}
            for name, pid in pids.items():
                _signal(pid, signal.SIGTERM)
                stopped.append(f"{name} (pid {pid})")
            for pid in self._stray_pids() if group is slurm_daemons else ():
                # Orphans of a crashed node or step (srun even ignores SIGTERM): no grace.
                stopped.append(f"{_program(pid)} (pid {pid})")
                _signal(pid, signal.SIGKILL)
            left = _wait_gone(pids.values(), timeout_s)
            if group is slurm_daemons:  # job processes orphaned while their steps went down
                left += [p for p in self._stray_pids() if p not in left]
            for pid in left:
                _signal(pid, signal.SIGKILL)
            if left and _wait_gone(left, 5.0):
                raise TestbedError(
                    f"processes {sorted(left)} of the testbed in {self.root} survived SIGKILL; "
                    "check them with 'ps -fp PID'"
                )
        return stopped

    def running(self) -> dict[str, int | None]:
        """Daemon name -> pid if it is running (our pid file and our command line), else None."""
        return {d: self._alive(d) for d in self.pid_files()}

    # -- using the cluster -----------------------------------------------------------------
    def run(
        self, args: Sequence[str], *, timeout_s: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (SLURM_CONF set)."""
        try:
            proc = subprocess.run(
                list(args),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=self.root,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"{' '.join(args)} did not finish within {timeout_s:g} s") from exc
        except FileNotFoundError as exc:
            raise TestbedError(
                f"{args[0]} not found; install Slurm with scripts/install-slurm.sh"
            ) from exc
        if check and proc.returncode != 0:
            raise TestbedError(
                f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
            )
        return proc

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo's long state (``idle``, ``mixed``, ``allocated``, ``down*``...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=10).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Poll sinfo until every node is idle; a clear error with log tails otherwise."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        last_error = ""
        while time.monotonic() < deadline:
            try:
                states = self.node_states()
                last_error = ""
            except TestbedError as exc:
                last_error = str(exc)
            if states and all(states.get(n.name) == "idle" for n in self.nodes):
                return
            self._check_started_daemons()
            time.sleep(0.2)
        raise TestbedError(
            f"nodes not idle after {timeout_s:g} s: {states or last_error}\n" + self.log_tails()
        )

    def submit(self, *args: str) -> int:
        """``sbatch --parsable ARGS`` -> job id (output files default to the testbed's jobs/)."""
        jobs = self.root / "jobs"
        jobs.mkdir(exist_ok=True)
        opts = list(args)
        if not any(a.startswith(("-o", "--output")) for a in opts):
            opts = ["-o", str(jobs / "%j.out"), *opts]
        out = self.run(["sbatch", "--parsable", *opts]).stdout.strip()
        try:
            return int(out.split(";")[0])
        except ValueError as exc:
            raise TestbedError(f"sbatch printed {out!r}, not a job id") from exc

    def job_fields(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o -d ID`` as a dict (known for MinJobAge after it ends)."""
        out = self.run(["scontrol", "show", "job", "-o", "-d", str(job_id)], timeout_s=10).stdout
        return parse_key_values(out)

    def wait_job(self, job_id: int, timeout_s: float = 30.0, *, state: str | None = None) -> str:
        """Poll until the job reaches ``state`` (default: any end state); return its state."""
        deadline = time.monotonic() + timeout_s
        current = ""
        while time.monotonic() < deadline:
            current = self.job_fields(job_id).get("JobState", "")
            if (state is not None and current == state) or (
                state is None and current in TERMINAL_JOB_STATES
            ):
                return current
            if state is not None and current in TERMINAL_JOB_STATES:
                break
            time.sleep(0.2)
        raise TestbedError(
            f"job {job_id} is {current or 'unknown'} after {timeout_s:g} s, wanted "
            f"{state or 'an end state'}; fields: {self.job_fields(job_id)}"
        )

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon log, for error messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")) if self.log_dir.is_dir() else ():
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {log} ---\n" + "\n".join(tail))
        return "\n".join(parts) or f"(no logs in {self.log_dir})"

    # -- internals ---------------------------------------------------------------------------
    def _which(self, name: str) -> str | None:
        return _which(name, self.bin_dir)

    def _plugin_dir(self) -> str | None:
        """Another release's PluginDir (Slurm's compiled-in one holds the host's plugins)."""
        slurmd = self._which("slurmd") if self.bin_dir is not None else None
        if slurmd is None:
            return None
        root = Path(slurmd).resolve().parents[2]  # ROOT/usr/sbin/slurmd-wlm
        found = sorted(root.glob("usr/lib/*-linux-gnu/slurm-wlm"))
        return str(found[0]) if found else None

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
        _munge_dir(self.root / "munge", 0o700)
        _munge_dir(self.root / "run" / "munge", 0o755)  # o+x, or munged refuses the socket
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
        state = asdict(self)
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

    def _start_slurmctld(self, timeout_s: float) -> None:
        self._spawn(["slurmctld", "-f", str(self.conf)], "slurmctld")

        def answers() -> bool:
            return self.run(["scontrol", "ping"], check=False, timeout_s=5).returncode == 0

        self._poll(answers, timeout_s, "slurmctld answering 'scontrol ping'")

    def _spawn(self, args: list[str], what: str) -> None:
        """Run a command that daemonizes (or finishes) quickly; fail with its output and logs."""
        exe = self._which(args[0])
        try:
            proc = subprocess.run(
                [exe or args[0], *args[1:]],
                env=self.env,
                cwd=self.root,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise TestbedError(f"starting {what} did not return within 30 s") from exc
        if proc.returncode != 0:
            raise TestbedError(
                f"starting {what} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()}\n{self.log_tails()}"
            )

    def _poll(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            self._check_started_daemons()
            time.sleep(0.1)
        raise TestbedError(
            f"timed out after {timeout_s:g} s waiting for {what}\n{self.log_tails()}"
        )

    def _check_started_daemons(self) -> None:
        """Fail fast, with the logs, when a daemon that wrote its pid file has died again
        (a port taken after all, a config it rejects) instead of waiting out the timeout."""
        for daemon, pid_file in self.pid_files().items():
            # A pid file still being written (empty), or naming the parent that is handing over
            # to its daemonized child, says nothing yet: look again a moment later.
            if _read_pid(pid_file) is not None and self._alive(daemon) is None:
                time.sleep(0.5)
            if _read_pid(pid_file) is not None and self._alive(daemon) is None:
                raise TestbedError(
                    f"{daemon} exited during start-up (see {self.log_dir})\n{self.log_tails()}"
                )
        for log in self.log_dir.glob("slurm*.log"):  # slurmd dies before writing a pid file
            with contextlib.suppress(OSError):
                if b"Address already in use" in log.read_bytes():
                    raise TestbedError(
                        f"a port was taken ({log.name}: Address already in use)\n"
                        + self.log_tails()
                    )

    def _marker(self, daemon: str) -> str:
        return str(self.munge_socket) if daemon == "munged" else str(self.conf)

    def _alive(self, daemon: str) -> int | None:
        pid = _read_pid(self.pid_files()[daemon])
        return pid if pid is not None and _running_with(pid, self._marker(daemon)) else None

    def _stray_pids(self) -> list[int]:
        """Our processes that no pid file names: Slurm daemons whose command line names our
        slurm.conf, and slurmstepd and job processes whose environment does (job processes
        carry SLURM_JOB_ID; a user's shell that merely exports our SLURM_CONF is left alone).
        After a crash, slurmd and slurmstepd die without killing the jobs' processes."""
        conf = str(self.conf).encode()
        known = {p for d in self.pid_files() if (p := self._alive(d)) is not None}
        strays = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in known or pid == os.getpid() or _state(pid) in ("Z", ""):
                continue
            args = _read_proc(pid, "cmdline").split(b"\0")
            slurm = os.path.basename(args[0]).startswith(b"slurm")
            if slurm and _names(args, conf):
                strays.append(pid)
                continue
            env = _read_proc(pid, "environ").split(b"\0")
            if b"SLURM_CONF=" + conf in env and (
                slurm or any(v.startswith(b"SLURM_JOB_ID=") for v in env)
            ):
                strays.append(pid)
                continue
            # 24.11's slurmstepd clears its environment and renames its command line
            # ("slurmstepd: [1.batch]"); its working folder is still ours.
            if args[0].startswith(b"slurmstepd") and _cwd_under(pid, self.root):
                strays.append(pid)
        return strays

    def _cancel_all_jobs(self, timeout_s: float) -> None:
        try:
            out = self.run(["squeue", "-h", "-o", "%i"], timeout_s=timeout_s, check=False).stdout
            ids = [j for j in out.split() if j.strip()]
            if ids:
                self.run(["scancel", *ids], timeout_s=timeout_s, check=False)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and any(
                    b"slurmstepd" in _read_proc(p, "cmdline") for p in self._stray_pids()
                ):
                    time.sleep(0.1)
        except TestbedError:
            pass  # slurmctld is going down anyway; leftover steps are killed as strays


def _munge_dir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    shutil.chown(path, "munge", "munge")
    path.chmod(mode)


def _hold_free_port(host: str, held: list[socket.socket]) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    held.append(s)
    return int(s.getsockname()[1])


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cwd_under(pid: int, root: Path) -> bool:
    """Is the process's working folder (deleted or not) inside ``root``?"""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
    except OSError:
        return False
    return cwd == str(root) or cwd.startswith(f"{root}/")


def _read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    """The one-letter process state ('' when gone). Zombies count as stopped: PID 1 reaps late."""
    stat = _read_proc(pid, "stat").decode(errors="replace")
    return stat.rsplit(")", 1)[1].split()[0] if ")" in stat else ""


def _program(pid: int) -> str:
    args = _read_proc(pid, "cmdline").split(b"\0")
    return os.path.basename(args[0]).decode(errors="replace") or f"pid-{pid}"


def _names(args: list[bytes], marker: bytes) -> bool:
    """Whether a command line names ``marker`` as an argument (``-f X`` or ``--opt=X``)."""
    return any(a == marker or a.endswith(b"=" + marker) for a in args)


def _running_with(pid: int, marker: str) -> bool:
    args = _read_proc(pid, "cmdline").split(b"\0")
    return _state(pid) not in ("", "Z") and _names(args, marker.encode())


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait until the processes are gone or zombies; return those still running."""
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        left = [p for p in left if _state(p) not in ("", "Z")]
        if left:
            time.sleep(0.05)
    return [p for p in left if _state(p) not in ("", "Z")]


def node_specs(
    gpu_types: Mapping[str, Sequence[str | None]],
    features: Mapping[str, Sequence[str]] | None = None,
) -> list[NodeSpec]:
    """NodeSpecs from ``{node: [type of GPU 0, type of GPU 1, ...]}`` (and optional features)."""
    features = features or {}
    return [
        NodeSpec(name, tuple(types), tuple(features.get(name, ())))
        for name, types in gpu_types.items()
    ]
