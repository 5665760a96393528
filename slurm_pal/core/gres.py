"""Comparing the GPU types per node a campaign's labels expect with what Slurm reports.

Why in core: ``site check`` (the CLI) and the advisor's view (a node whose gres differs from
labels.json is not routed to) both use it, and the advisor's view must not import the site
renderer. Pure and stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["NodeDiff", "compare_gres", "node_key"]


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
