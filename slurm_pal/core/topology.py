"""Locality levels and their penalties: same node, same leaf switch, across switches.

PAL's paper models two levels: a multi-GPU job pays nothing inside one node (``L_within = 1.0``)
and ``L_across`` (1.7 measured on Frontera) as soon as it spans nodes. Real Slurm sites describe a
switch tree in ``topology.conf``; spanning nodes under one leaf switch is usually cheaper than
crossing the spine. :class:`Topology` generalizes the paper's model to three levels:

- ``within-node`` (penalty ``within_node``, default 1.0);
- ``within-switch``: several nodes under one leaf switch (penalty ``within_switch``, which defaults
  to the across penalty, so a topology that does not price switches behaves like the paper);
- ``across-switches``: nodes under different leaf switches (penalty ``across_switches``, 1.7).

A topology without switches (:meth:`Topology.flat`) has the paper's two levels, the second called
``across-nodes``. The paper's model is also the special case of one switch holding every node.
A node that the topology does not place under any leaf switch counts as its own switch, so
spanning it with any other node is an across-switches allocation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from slurm_pal.core.hostlist import expand

__all__ = [
    "ACROSS_NODES",
    "ACROSS_SWITCHES",
    "DEFAULT_ACROSS_PENALTY",
    "WITHIN_NODE",
    "WITHIN_SWITCH",
    "Level",
    "Topology",
    "parse_topology_conf",
]

WITHIN_NODE = "within-node"
WITHIN_SWITCH = "within-switch"
ACROSS_SWITCHES = "across-switches"
ACROSS_NODES = "across-nodes"
DEFAULT_ACROSS_PENALTY = 1.7
"""PAL's inter-node penalty, measured on TACC Frontera (paper, section IV)."""

NODE_RANK, SWITCH_RANK, CLUSTER_RANK = 0, 1, 2


@dataclass(frozen=True)
class Level:
    """One locality level: ``rank`` 0 is the most local (one node), 2 the whole cluster."""

    name: str
    rank: int
    penalty: float


@dataclass(frozen=True)
class Topology:
    """Which leaf switch each node hangs off, and the penalty of each locality level.

    Penalties must satisfy ``within_node <= within_switch <= across_switches``: a wider
    allocation never communicates faster, and the L x V traversal relies on it.
    """

    leaf_switch: Mapping[str, str] = field(default_factory=dict, hash=False)
    within_node: float = 1.0
    within_switch: float | None = None
    across_switches: float = DEFAULT_ACROSS_PENALTY

    def __post_init__(self) -> None:
        object.__setattr__(self, "leaf_switch", MappingProxyType(dict(self.leaf_switch)))
        penalties = [self.within_node, self.within_switch_penalty, self.across_switches]
        if not all(math.isfinite(p) and p > 0 for p in penalties):
            raise ValueError(f"locality penalties must be finite and > 0, got {penalties}")
        if not penalties[0] <= penalties[1] <= penalties[2]:
            raise ValueError(
                "locality penalties must not decrease with distance: within_node "
                f"{penalties[0]} <= within_switch {penalties[1]} <= across_switches {penalties[2]}"
            )
        levels = self._build_levels()  # derived, cached: levels are read on every placement
        object.__setattr__(self, "_levels", levels)
        object.__setattr__(self, "_level_by_rank", {level.rank: level for level in levels})

    @classmethod
    def flat(
        cls, across_nodes: float = DEFAULT_ACROSS_PENALTY, within_node: float = 1.0
    ) -> Topology:
        """The paper's two-level model: one penalty inside a node, one across nodes."""
        return cls(within_node=within_node, across_switches=across_nodes)

    @classmethod
    def from_topology_conf(
        cls,
        text: str,
        *,
        within_node: float = 1.0,
        within_switch: float | None = None,
        across_switches: float = DEFAULT_ACROSS_PENALTY,
    ) -> Topology:
        """Build from the text of Slurm's ``topology.conf`` (topology/tree); see
        :func:`parse_topology_conf`."""
        return cls(
            leaf_switch=parse_topology_conf(text),
            within_node=within_node,
            within_switch=within_switch,
            across_switches=across_switches,
        )

    @property
    def has_switches(self) -> bool:
        return bool(self.leaf_switch)

    @property
    def within_switch_penalty(self) -> float:
        """The within-switch penalty; unset means the across penalty (switches are not priced)."""
        return self.across_switches if self.within_switch is None else self.within_switch

    @property
    def levels(self) -> tuple[Level, ...]:
        """The locality levels an allocation can reach, most local first."""
        return self._levels  # type: ignore[attr-defined]

    def _build_levels(self) -> tuple[Level, ...]:
        node = Level(WITHIN_NODE, NODE_RANK, self.within_node)
        if not self.has_switches:
            return (node, Level(ACROSS_NODES, CLUSTER_RANK, self.across_switches))
        return (
            node,
            Level(WITHIN_SWITCH, SWITCH_RANK, self.within_switch_penalty),
            Level(ACROSS_SWITCHES, CLUSTER_RANK, self.across_switches),
        )

    def level(self, rank: int) -> Level:
        """The level of a given rank (0 node, 1 switch, 2 cluster)."""
        try:
            return self._level_by_rank[rank]  # type: ignore[attr-defined]
        except KeyError:
            raise ValueError(f"this topology has no level of rank {rank}") from None

    def switch_of(self, node: str) -> str | None:
        """The node's leaf switch, or None when the topology does not place it."""
        return self.leaf_switch.get(node)

    def level_of(self, nodes: set[str] | frozenset[str]) -> Level:
        """The most local level that holds all of ``nodes`` (an allocation's node set)."""
        if len(nodes) <= 1:
            return self.levels[0]
        if self.has_switches:
            switches = {self.leaf_switch.get(node, f"\0{node}") for node in nodes}
            if len(switches) == 1:
                return self.level(SWITCH_RANK)
        return self.level(CLUSTER_RANK)


_KEY_VALUE = re.compile(r"(\w+)=(\S+)")


def parse_topology_conf(text: str) -> dict[str, str]:
    """Read Slurm's ``topology.conf`` (topology/tree) into ``{node: leaf switch}``.

    Leaf switches are the ``SwitchName=... Nodes=<hostlist>`` lines; ``Switches=`` lines build the
    upper tree, which the three-level model does not need (they are checked to name known
    switches). Comments (``#``) and other keys (``LinkSpeed=``) are ignored. Raises ValueError on a
    line without ``SwitchName``, a node under two leaf switches, or an unknown child switch.
    """
    leaf_of: dict[str, str] = {}
    switch_names: set[str] = set()
    children: list[tuple[str, str]] = []
    for line_number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        keys = {key.lower(): value for key, value in _KEY_VALUE.findall(line)}
        switch = keys.get("switchname")
        if switch is None:
            raise ValueError(f"topology.conf line {line_number}: no SwitchName= in {raw_line!r}")
        switch_names.add(switch)
        for node in expand(keys.get("nodes", "")):
            previous = leaf_of.setdefault(node, switch)
            if previous != switch:
                raise ValueError(
                    f"topology.conf line {line_number}: node {node} is under both "
                    f"{previous} and {switch}"
                )
        children.extend((switch, child) for child in expand(keys.get("switches", "")))
    for parent, child in children:
        if child not in switch_names:
            raise ValueError(f"topology.conf: switch {parent} lists unknown switch {child}")
    return leaf_of
