"""Slurm hostlist expressions (``node[01-04,07]`` <-> ``node01 node02 node03 node04 node07``)
through ClusterShell's NodeSet, kept to the part of its syntax Slurm writes.

Slurm writes node sets this way everywhere (topology.conf, ``scontrol``, ``squeue``,
``--nodelist``), so the pure core reads and writes them without calling
``scontrol show hostnames``. NodeSet also knows set operators (``!``, ``&``, ``^``) and
``@group`` names read from files; Slurm has neither, so any character outside Slurm's node-name
alphabet is refused here and groups are never resolved. Several bracket groups in one name
(``gpu-[1-2]-[1-2]``) expand to their cartesian product; ranges keep the zero-padding written
(``[08-10]`` -> ``08 09 10``, ``[8-10]`` -> ``8 9 10``). Commas and whitespace separate names,
as in Slurm.

:func:`compress` folds only the last run of digits of each name (``rack1-n[01-02]``), which is
what Slurm prints for ordinary clusters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

__all__ = ["MAX_NAMES", "compress", "expand"]

# More names than any Slurm cluster has: a bigger expression is a typo or an attack
# (n[1-99999999] in a user's --nodelist would otherwise make the advisor build a hundred million
# numbers: NodeSet keeps a range as the set of its numbers, so ranges are checked before it).
MAX_NAMES = 1 << 16

_HOSTLIST = re.compile(r"[A-Za-z0-9._\-\[\],\s]*")
_NAME = re.compile(r"[A-Za-z0-9._\-]+")
_SEPARATORS = re.compile(r"[\s,]+")
_BRACKETED_RANGE = re.compile(r"(\d+)-(\d+)(?=[^\[\]]*\])")


def expand(hostlist: str) -> list[str]:
    """The node names of a Slurm hostlist expression, sorted (by name pattern, then number),
    without duplicates.

    Raises ValueError, one line, on a malformed expression (unbalanced or nested brackets,
    ``[b-a]``, non-digits in a range, a character Slurm does not use) or one of more than
    :data:`MAX_NAMES` names.
    """
    if not _HOSTLIST.fullmatch(hostlist):
        bad = sorted(set(_HOSTLIST.sub("", hostlist)))
        raise ValueError(f"hostlist {hostlist!r} has characters Slurm does not use: {''.join(bad)}")
    for lo, hi in _BRACKETED_RANGE.findall(hostlist):
        if int(hi) - int(lo) >= MAX_NAMES:
            raise ValueError(f"hostlist {hostlist!r} has a range of more than {MAX_NAMES} names")
    text = _SEPARATORS.sub(",", hostlist).strip(",")
    try:
        nodes = NodeSet(text, resolver=RESOLVER_NOGROUP)
        count = len(nodes)
    except (NodeSetException, ValueError) as exc:
        raise ValueError(f"bad hostlist {hostlist!r}: {exc}") from None
    if count > MAX_NAMES:
        raise ValueError(f"hostlist {hostlist!r} names {count} nodes, more than {MAX_NAMES}")
    return list(nodes)


def compress(names: Iterable[str]) -> str:
    """Fold node names into a hostlist expression (``expand(compress(x))`` gives back set(x)).

    Names are grouped by what surrounds their last number; groups come out sorted.
    """
    return _compress(tuple(names))


# Every routed decision writes its nodes as a hostlist, and a site's decisions name the same few
# node sets again and again: NodeSet parses and folds anew each time, about a tenth of a decide.
@lru_cache(maxsize=4096)
def _compress(names: tuple[str, ...]) -> str:
    for name in names:
        if not _NAME.fullmatch(name):
            raise ValueError(f"cannot compress node name {name!r}")
    if len(set(names)) == 1:
        return names[0]
    nodes = NodeSet(",".join(names), resolver=RESOLVER_NOGROUP)
    nodes.fold_axis = (-1,)
    return str(nodes)
