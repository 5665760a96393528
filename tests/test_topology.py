"""Locality levels, penalties and topology.conf parsing."""

from __future__ import annotations

import pytest

from slurm_pal.core.topology import Topology, parse_topology_conf

TOPOLOGY_CONF = """
# two leaf switches under a spine
SwitchName=s0 Nodes=node[01-02] LinkSpeed=100
SwitchName=s1 Nodes=node[03-04,07]
SwitchName=top Switches=s[0-1]
"""


def test_parse_topology_conf_maps_nodes_to_leaf_switches() -> None:
    assert parse_topology_conf(TOPOLOGY_CONF) == {
        "node01": "s0",
        "node02": "s0",
        "node03": "s1",
        "node04": "s1",
        "node07": "s1",
    }


def test_parse_handles_multi_dimensional_hostlists() -> None:
    leaf = parse_topology_conf("SwitchName=rack1 Nodes=gpu-[1-2]-[1-2]")
    assert sorted(leaf) == ["gpu-1-1", "gpu-1-2", "gpu-2-1", "gpu-2-2"]


@pytest.mark.parametrize(
    "text",
    [
        "Nodes=node[01-02]",
        "SwitchName=s0 Nodes=n1\nSwitchName=s1 Nodes=n1",
        "SwitchName=top Switches=s9",
        "SwitchName=s0 Nodes=n[2-1]",
    ],
)
def test_parse_rejects_broken_files(text: str) -> None:
    with pytest.raises(ValueError):
        parse_topology_conf(text)


def test_flat_topology_is_the_papers_two_level_model() -> None:
    topology = Topology.flat(across_nodes=1.5)
    assert [(lv.name, lv.penalty) for lv in topology.levels] == [
        ("within-node", 1.0),
        ("across-nodes", 1.5),
    ]
    assert topology.level_of(frozenset({"a"})).name == "within-node"
    assert topology.level_of(frozenset({"a", "b"})).penalty == 1.5


def test_switch_topology_has_three_levels_and_defaults() -> None:
    topology = Topology.from_topology_conf(TOPOLOGY_CONF)
    assert [(lv.name, lv.penalty) for lv in topology.levels] == [
        ("within-node", 1.0),
        ("within-switch", 1.7),  # unpriced switches cost what crossing them costs
        ("across-switches", 1.7),
    ]
    priced = Topology.from_topology_conf(TOPOLOGY_CONF, within_switch=1.2, across_switches=2.0)
    assert priced.level_of(frozenset({"node01", "node02"})).penalty == 1.2
    assert priced.level_of(frozenset({"node01", "node03"})).penalty == 2.0
    # a node the file does not place is its own switch
    assert priced.level_of(frozenset({"node01", "elsewhere"})).name == "across-switches"
    assert priced.level_of(frozenset({"node04"})).name == "within-node"


@pytest.mark.parametrize(
    "penalties",
    [
        {"within_node": 1.5, "across_switches": 1.2},
        {"within_switch": 2.0, "across_switches": 1.7},
        {"within_node": 0.0},
        {"across_switches": float("inf")},
    ],
)
def test_penalties_must_grow_with_distance(penalties: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Topology({"n1": "s0"}, **penalties)


def test_topology_mapping_is_frozen() -> None:
    mapping = {"n1": "s0"}
    topology = Topology(mapping)
    mapping["n2"] = "s1"
    assert topology.switch_of("n2") is None
    with pytest.raises(TypeError):
        topology.leaf_switch["n3"] = "s0"  # type: ignore[index]
