"""Comparing the GPU types per node a campaign's labels expect with what Slurm reports.

Why in core: ``site check`` (the CLI) and the advisor's view (a node whose gres differs from
labels.json is not routed to) both use it, and the advisor's view must not import the site
renderer. Pure and stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["NodeDiff", "compare_gres", "distinct_type_ids", "node_key", "slurm_type_id"]


@dataclass(frozen=True)
class NodeDiff:
    node: str
    expected: dict[str, int]  # label -> count from the campaign
    live: dict[str, int] | None  # None: Slurm does not know the node


def compare_gres(
    expected: Mapping[str, Mapping[str, int]], live: Mapping[str, Mapping[str | None, int]]
) -> tuple[list[str], list[NodeDiff]]:
    """(nodes that match, nodes that differ) between rendered and live GPU types per node."""
    same: list[str] = []
    diffs: list[NodeDiff] = []
    for node in sorted(expected, key=node_key):
        want = dict(expected[node])
        if node not in live:
            diffs.append(NodeDiff(node, want, None))
            continue
        have = {("(untyped)" if t is None else t): n for t, n in live[node].items()}
        if have == want:
            same.append(node)
        else:
            diffs.append(NodeDiff(node, want, have))
    return same, diffs


def node_key(name: str) -> tuple[str, int, str]:
    """Sort key of a node name: its prefix, then its number (``n2`` before ``n10``)."""
    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def slurm_type_id(name: str) -> int:
    """The 32-bit number Slurm keeps a gres name or Type under (``gres_build_id`` in Slurm's
    src/common/gres.c): each byte shifted by 0, 8, 16, 24 bits in turn and summed. Slurm
    compares types by this number alone, so two types with one number are one type to it."""
    value = 0
    for i, byte in enumerate(name.encode()):
        value = (value + (byte << (8 * (i % 4)))) & 0xFFFFFFFF
    return value


def distinct_type_ids(labels: list[str]) -> dict[str, str]:
    """Each label -> a label Slurm cannot confuse with any other of ``labels``.

    Why: labels like ``gpu-a1b3c2d0`` and ``gpu-a2b2c1d1`` have the same :func:`slurm_type_id`
    (the digits at positions 1 and 3 modulo 4 add up alike), so slurmd merges the two types of
    a node into one and drains it ("gres/gpu count reported lower than configured"), and a job
    asking for one may get the other. Labels are taken in sorted order; the first keeps its
    name, each later one that collides gets the first suffix ``-2``, ``-3``, ... that makes its
    number unique (deterministic: the same labels always render the same names)."""
    taken: set[int] = set()
    out: dict[str, str] = {}
    names = set(labels)
    for label in sorted(names):
        name, n = label, 1
        while slurm_type_id(name) in taken or (name != label and name in names):
            n += 1
            name = f"{label}-{n}"
        taken.add(slurm_type_id(name))
        out[label] = name
    return out
