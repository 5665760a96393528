"""Which addresses a node has and which nodes a job holds, as Slurm says (``scontrol show``).

Why: a record sent over TCP names its node and job; the advisor accepts it only when the
munge credential was encoded on that node (its ``NodeAddr``/``NodeHostname``, resolved) and
the job ran there. The advisor's periodic view may not hold a job that started and ended
between two reads, so these ask Slurm for one node or one job when the view cannot say.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

from slurm_pal.adapters.slurm.parse import parse_key_values
from slurm_pal.adapters.slurm.state import SlurmQueryError
from slurm_pal.core.hostlist import expand

Runner = Callable[[Sequence[str]], tuple[int, str]]
"""argv -> (exit status, stdout and stderr together): scontrol says "not found" on stdout."""


def resolve(names: Iterable[str]) -> frozenset[str]:
    """Every IPv4/IPv6 address the names resolve to (names that do not resolve add none)."""
    out: set[str] = set()
    for name in names:
        if not name or name == "(null)":
            continue
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            continue
        out.update(str(info[4][0]) for info in infos)
    return frozenset(out)


def parse_node_names(text: str) -> dict[str, tuple[str, ...]]:
    """``scontrol show node -o`` -> node -> (NodeAddr, NodeHostname, NodeName), deduplicated."""
    out: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        kv = parse_key_values(line)
        name = kv.get("NodeName")
        if name:
            names = (kv.get("NodeAddr", ""), kv.get("NodeHostName", ""), name)
            out[name] = tuple(dict.fromkeys(n for n in names if n and n != "(null)"))
    return out


def parse_job_nodes(text: str) -> tuple[str, ...] | None:
    """``scontrol show job -o ID`` -> the nodes it holds or held (None: no such job line)."""
    for line in text.splitlines():
        kv = parse_key_values(line)
        if "JobId" not in kv:
            continue
        nodes = kv.get("NodeList", "")
        return tuple(expand(nodes)) if nodes and nodes != "(null)" else ()
    return None


class SlurmHosts:
    """Node addresses and job nodes from ``scontrol`` (with the service's SLURM_CONF)."""

    def __init__(
        self,
        runner: Runner | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._env = dict(os.environ if env is None else env)
        self._timeout_s = timeout_s
        self._run = runner or self._scontrol

    def _scontrol(self, args: Sequence[str]) -> tuple[int, str]:
        try:
            proc = subprocess.run(
                list(args),
                env=self._env,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmQueryError(f"{' '.join(args)}: {exc}") from None
        return proc.returncode, proc.stdout + proc.stderr

    def node_addresses(self, node: str) -> frozenset[str]:
        """The addresses ``node`` may send from (empty when Slurm does not know it: 22.05
        prints "Node X not found" and exits 1). Raises :class:`SlurmQueryError` when Slurm
        cannot be asked (the record is refused and stays spooled for a later try)."""
        status, text = self._run(["scontrol", "show", "node", "-o", node])
        if status != 0:
            if "not found" in text:
                return frozenset()
            raise SlurmQueryError(f"scontrol show node {node} exited {status}: {text[-300:]}")
        return resolve(parse_node_names(text).get(node, ()))

    def job_nodes(self, job_id: int) -> tuple[str, ...] | None:
        """The nodes of ``job_id``; None when Slurm no longer knows the job (past MinJobAge:
        "Invalid job id specified"). Raises :class:`SlurmQueryError` when Slurm cannot be
        asked (the record is refused and stays spooled, rather than pass unchecked)."""
        status, text = self._run(["scontrol", "show", "job", "-o", str(job_id)])
        if status != 0:
            if "invalid job id" in text.lower():
                return None
            raise SlurmQueryError(f"scontrol show job {job_id} exited {status}: {text[-300:]}")
        return parse_job_nodes(text)
