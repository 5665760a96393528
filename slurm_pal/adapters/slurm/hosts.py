"""Which addresses a node has and which nodes a job holds, as Slurm says (``scontrol show``).

Why: a record sent over TCP names its node and job; the advisor accepts it only when the
munge credential was encoded on that node (its ``NodeAddr``/``NodeHostname``, resolved) and
the job ran there. The advisor's periodic view may not hold a job that started and ended
between two reads, so these ask Slurm for one node or one job when the view cannot say.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence

from slurm_pal.adapters.slurm.parse import parse_key_values
from slurm_pal.adapters.slurm.state import CliStateReader, SlurmQueryError
from slurm_pal.core.hostlist import expand

Runner = Callable[[Sequence[str]], str]


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

    def __init__(self, runner: Runner | None = None, env: dict[str, str] | None = None) -> None:
        self._run = runner or CliStateReader(env)._run

    def node_addresses(self, node: str) -> frozenset[str]:
        """The addresses ``node`` may send from (empty when Slurm does not know it)."""
        try:
            names = parse_node_names(self._run(["scontrol", "show", "node", "-o", node]))
        except SlurmQueryError:
            return frozenset()
        return resolve(names.get(node, ()))

    def job_nodes(self, job_id: int) -> tuple[str, ...] | None:
        """The nodes of ``job_id``; None when Slurm no longer knows the job (past MinJobAge).
        Raises :class:`SlurmQueryError` when Slurm cannot be asked (the record is refused and
        stays spooled for a later try, rather than pass unchecked)."""
        try:
            return parse_job_nodes(self._run(["scontrol", "show", "job", "-o", str(job_id)]))
        except SlurmQueryError as exc:
            if "invalid job id" in str(exc).lower():
                return None
            raise
