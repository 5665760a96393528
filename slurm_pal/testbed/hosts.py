"""Hosts inside one machine: a Linux network, UTS and mount namespace per host on a private
bridge, for the multi-host testbed (:mod:`slurm_pal.testbed.multihost`).

Why: on a real cluster the Prolog and Epilog run on compute nodes that share no socket, spool
dir or munged with the controller. A host here is as separate as one kernel allows: its own
network stack with one address on a bridge (so a TCP peer's address says which host it is),
its own host name (UTS), and its own mounts, through which paths that must be host-local on a
cluster (munged's socket, the hooks' spool dir) get a private directory per host at the same
path, and the controller's private folder is hidden from compute hosts (an empty tmpfs over
it), so nothing reaches the advisor through the file system by accident.

The layout, all created here and removed by :meth:`HostNetwork.down`:

* namespace ``spal-<tag>-sw`` holds the bridge ``br0`` (nothing else: the switch);
* namespace ``spal-<tag>-<host>`` per host: ``lo`` and ``eth0`` (a veth whose peer
  ``p-<host>`` is a port of ``br0``), the host's address on ``SUBNET``, no default route;
* one *anchor* process per host (``sleep infinity``) started by ``nsenter --net=NS unshare
  --uts --mount``: it sets the host name and the mounts and then holds the host's UTS and
  mount namespaces; :meth:`HostNetwork.command` enters all three through it (``nsenter``).

Nothing is added to the machine's own network namespace (no interface, address or route):
traffic stays between the namespaces and on each one's loopback. Subnets may repeat across
testbeds, since each bridge lives in its own namespace. ``<tag>`` comes from the testbed's
folder, so ``down`` finds a testbed's namespaces from its folder alone, even after a crash.
Teardown signals exactly the processes inside our network namespaces (``ip netns pids``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_pal.errors import SlurmPalError

NS_PREFIX = "spal-"
SUBNET = "10.250.0"  # /24, only on bridges inside our own namespaces
CONTROLLER_OCTET = 1
FIRST_COMPUTE_OCTET = 11
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname", "sleep")


class HostsError(SlurmPalError, RuntimeError):
    """The namespaces could not be created, entered or removed; the message says why."""


@dataclass(frozen=True)
class Host:
    """One host: its name (host name in its UTS namespace) and its address on the bridge."""

    name: str
    address: str
    controller: bool = False


def plan_hosts(compute: Sequence[str], controller: str = "ctl") -> list[Host]:
    """The controller at ``SUBNET.1`` and the compute hosts from ``SUBNET.11`` on."""
    names = [controller, *compute]
    if len(set(names)) != len(names):
        raise HostsError(f"host names must be unique (the controller is {controller!r}): {names}")
    if len(compute) > 254 - FIRST_COMPUTE_OCTET:
        raise HostsError(f"at most {254 - FIRST_COMPUTE_OCTET} compute hosts fit in {SUBNET}.0/24")
    for name in names:
        # A namespace name is a file name; the veth port name must fit IFNAMSIZ (15 bytes).
        if not name or len(name) > 12 or not all(c.isalnum() or c in "-_" for c in name):
            raise HostsError(
                f"host name {name!r} must be 1-12 letters, digits, '-' or '_' (it names "
                "a namespace and an interface)"
            )
    hosts = [Host(controller, f"{SUBNET}.{CONTROLLER_OCTET}", controller=True)]
    hosts += [Host(n, f"{SUBNET}.{FIRST_COMPUTE_OCTET + i}") for i, n in enumerate(compute)]
    return hosts


def tag_for(root: Path) -> str:
    """A short tag naming a testbed's namespaces, from its folder (stable across processes)."""
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:6]


def missing_tools() -> list[str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin:/usr/bin:/bin"
    return [t for t in REQUIRED_TOOLS if shutil.which(t, path=path) is None]


def namespaces(prefix: str = NS_PREFIX) -> list[str]:
    """Network namespaces (``ip netns``) whose names start with ``prefix``."""
    out = _ip(["netns", "list"], check=False).stdout
    return sorted({line.split()[0] for line in out.splitlines() if line.startswith(prefix)})


@dataclass
class HostNetwork:
    """The namespaces of one testbed (see the module docstring).

    ``per_host``: folders that are host-local on a cluster; every host gets its own directory
    (``state_dir/<host>/<index>``) mounted at that path. ``controller_only``: folders compute
    hosts must not see (an empty tmpfs on top). Both must exist before :meth:`up`.
    """

    root: Path
    hosts: Sequence[Host]
    per_host: Sequence[Path] = ()
    controller_only: Sequence[Path] = ()
    hosts_file_extra: Mapping[str, str] = field(default_factory=dict)
    tag: str = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.hosts = tuple(self.hosts)
        self.tag = self.tag or tag_for(self.root)

    # -- names and paths ---------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{NS_PREFIX}{self.tag}-sw"

    def netns(self, host: str) -> str:
        return f"{NS_PREFIX}{self.tag}-{host}"

    @property
    def state_dir(self) -> Path:
        return self.root / "hosts"

    def anchor_pid_file(self, host: str) -> Path:
        return self.state_dir / host / "anchor.pid"

    def local_dir(self, host: str, index: int) -> Path:
        """The directory host ``host`` sees at ``per_host[index]``."""
        return self.state_dir / host / f"local{index}"

    @property
    def controller(self) -> Host:
        return next(h for h in self.hosts if h.controller)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise HostsError(f"no host {name!r} in this testbed: {[h.name for h in self.hosts]}")

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self, timeout_s: float = 10.0) -> None:
        """Create the switch and every host; on any failure remove what was created."""
        missing = missing_tools()
        if missing:
            raise HostsError(
                f"programs not found: {', '.join(missing)}; install iproute2 and util-linux "
                "(bash scripts/install-slurm.sh)"
            )
        if os.geteuid() != 0:
            raise HostsError("creating network namespaces needs root")
        self.down()  # leftovers of an earlier run in this folder
        try:
            self._up(timeout_s)
        except BaseException:
            self.down()
            raise

    def _up(self, timeout_s: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        hosts_file = self.state_dir / "etc-hosts"
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address} {h.name}" for h in self.hosts]
        lines += [f"{addr} {name}" for name, addr in self.hosts_file_extra.items()]
        hosts_file.write_text("\n".join(lines) + "\n")
        hosts_file.chmod(0o644)
        _ip(["netns", "add", self.switch])
        _ip(["-n", self.switch, "link", "set", "lo", "up"])
        _ip(["-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _ip(["-n", self.switch, "link", "set", "br0", "up"])
        for host in self.hosts:
            ns = self.netns(host.name)
            port = f"p-{host.name}"
            _ip(["netns", "add", ns])
            _ip(["-n", ns, "link", "set", "lo", "up"])
            _ip(
                [
                    "-n",
                    self.switch,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "eth0",
                    "netns",
                    ns,
                ]
            )
            _ip(["-n", self.switch, "link", "set", port, "master", "br0", "up"])
            _ip(["-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _ip(["-n", ns, "link", "set", "eth0", "up"])
            self._start_anchor(host, hosts_file)
        deadline = time.monotonic() + timeout_s
        for host in self.hosts:
            while self.anchor(host.name) is None:
                if time.monotonic() > deadline:
                    log = self.state_dir / host.name / "anchor.log"
                    raise HostsError(
                        f"host {host.name} did not come up within {timeout_s:g} s: "
                        + (log.read_text(errors="replace").strip() if log.exists() else "")
                    )
                time.sleep(0.02)

    def _start_anchor(self, host: Host, hosts_file: Path) -> None:
        """The process holding the host's UTS and mount namespaces (see the module docstring).
        Its pid file is written last, so a pid file means the host is ready."""
        hdir = self.state_dir / host.name
        hdir.mkdir(parents=True, exist_ok=True)
        pid_file = self.anchor_pid_file(host.name)
        pid_file.unlink(missing_ok=True)
        steps = [f"hostname {shlex.quote(host.name)}", f"mount --bind {hosts_file} /etc/hosts"]
        for index, path in enumerate(self.per_host):
            local = self.local_dir(host.name, index)
            local.mkdir(parents=True, exist_ok=True)
            shutil.copystat(path, local)
            st = os.stat(path)
            os.chown(local, st.st_uid, st.st_gid)
            steps.append(f"mount --bind {shlex.quote(str(local))} {shlex.quote(str(path))}")
        if not host.controller:
            for path in self.controller_only:
                steps.append(f"mount -t tmpfs -o size=1m,mode=0700 none {shlex.quote(str(path))}")
        tmp = pid_file.with_suffix(".tmp")
        steps.append(f"echo $$ > {tmp} && mv {tmp} {pid_file}")
        steps.append("exec sleep infinity")
        with (hdir / "anchor.log").open("wb") as log:
            subprocess.Popen(
                [
                    # nsenter, not `ip netns exec`: that remounts /sys for the namespace,
                    # which hides /sys/fs/cgroup, and slurmd will not start without it.
                    *_tool("nsenter"),
                    f"--net=/run/netns/{self.netns(host.name)}",
                    "--",
                    "unshare",
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-ec",
                    "; ".join(steps),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def anchor(self, host: str) -> int | None:
        """The pid of the host's anchor process, if it runs inside the host's namespace."""
        try:
            pid = int(self.anchor_pid_file(host).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid in self.pids(host) else None

    def pids(self, host: str) -> list[int]:
        """Every process in the host's network namespace (ours by construction)."""
        return _netns_pids(self.netns(host))

    def command(self, host: str, args: Sequence[str]) -> list[str]:
        """``args`` run on ``host``: in its network, UTS and mount namespaces."""
        pid = self.anchor(host)
        if pid is None:
            raise HostsError(f"host {host} of the testbed in {self.root} is not up")
        return [*_tool("nsenter"), f"--target={pid}", "--net", "--uts", "--mount", "--", *args]

    def is_up(self) -> bool:
        return all(self.anchor(h.name) is not None for h in self.hosts)

    def down(self, timeout_s: float = 10.0) -> list[str]:
        """Stop every process in our namespaces (SIGTERM, then SIGKILL) and delete them.
        Returns what was removed; safe to call on a half-created or absent network."""
        return remove_namespaces(namespaces(f"{NS_PREFIX}{self.tag}-"), timeout_s)


def remove_namespaces(names: Iterable[str], timeout_s: float = 10.0) -> list[str]:
    """Kill the processes inside these network namespaces, then delete the namespaces."""
    names = list(names)
    removed: list[str] = []
    pids = {p for ns in names for p in _netns_pids(ns) if p != os.getpid()}
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    left = _wait_gone(pids, timeout_s)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    if left and _wait_gone(left, 5.0):
        raise HostsError(f"processes {sorted(left)} in namespaces {names} survived SIGKILL")
    for ns in names:
        proc = _ip(["netns", "del", ns], check=False)
        if proc.returncode != 0 and ns in namespaces(ns):
            raise HostsError(f"cannot delete network namespace {ns}: {proc.stderr.strip()}")
        removed.append(ns)
    if pids:
        removed.append(f"{len(pids)} more process(es) in the namespaces")
    return removed


def _tool(name: str) -> list[str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin:/usr/bin:/bin"
    return [shutil.which(name, path=path) or name]


def _ip(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            [*_tool("ip"), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsError(f"ip {' '.join(args)} did not run: {exc}") from None
    if check and proc.returncode != 0:
        raise HostsError(f"ip {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout}")
    return proc


def _netns_pids(ns: str) -> list[int]:
    """Processes in network namespace ``ns`` (none when it does not exist), zombies left out."""
    path = Path("/run/netns") / ns
    try:
        target = os.stat(path)
    except OSError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino) and _state(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _state(pid: int) -> str:
    """The one-letter state of a live process; '' when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return ""
    letter = stat.rsplit(")", 1)[1].split()[0] if ")" in stat else ""
    return "" if letter == "Z" else letter


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        left = [p for p in left if _state(p)]
        if left:
            time.sleep(0.05)
    return [p for p in left if _state(p)]
