"""`slurm-pal advise lxv` on a real store, and the site topology adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_pal.adapters.config import ConfigError, LocalityConfig
from slurm_pal.adapters.site_topology import topology_from_config


def test_lxv_walks_in_lv_order_and_follows_the_penalty(run_cli, example_csv: Path) -> None:
    run_cli("profile", "ingest", example_csv)
    rows = json.loads(run_cli("advise", "lxv", "--class", "A", "--json").output)["traversal"]
    products = [r["lv_product"] for r in rows]
    assert products == sorted(products)
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[0]["level"] == "within-node" and rows[0]["bin_name"] == "bin 0"
    assert {r["bin_name"] for r in rows} >= {"bin 0", "bin 1", "outlier x0", "outlier x1"}
    # A flat topology: two levels x (2 bins + 2 outliers)
    assert len(rows) == 2 * 4
    across = [r for r in rows if r["level"] == "across-nodes"]
    assert all(r["penalty"] == 1.7 for r in across)
    cheap = json.loads(
        run_cli("advise", "lxv", "--class", "A", "--json", "--locality-penalty", "1.0").output
    )["traversal"]
    assert all(r["penalty"] == 1.0 for r in cheap)
    table = run_cli("advise", "lxv", "--class", "A").output
    assert "within-node" in table and "across-nodes" in table


def test_lxv_errors(run_cli, example_csv: Path) -> None:
    result = run_cli("advise", "lxv", "--class", "A", ok=False)
    assert result.exit_code == 2 and "no active campaign" in result.output
    run_cli("profile", "ingest", example_csv)
    result = run_cli("advise", "lxv", "--class", "Q", ok=False)
    assert result.exit_code == 2 and "classes: A, B, C, D" in result.output
    result = run_cli("advise", "lxv", "--class", "A", "--locality-penalty", "0.5", ok=False)
    assert result.exit_code == 2 and "penalties" in result.output


def test_topology_from_config_reads_topology_conf(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\n")
    topo = topology_from_config(
        LocalityConfig(within_switch=1.3, across_switches=1.8, topology_file=str(conf))
    )
    assert [level.name for level in topo.levels] == [
        "within-node",
        "within-switch",
        "across-switches",
    ]
    assert topo.level_of({"n1", "n2"}).penalty == 1.3
    assert topo.level_of({"n1", "n3"}).penalty == 1.8


def test_topology_errors_name_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"site.toml: 'locality.topology_file' .* cannot be read"):
        topology_from_config(
            LocalityConfig(topology_file=str(tmp_path / "nope.conf")), source="site.toml"
        )
    with pytest.raises(ConfigError, match=r"site.toml: \[locality\]: .*must not decrease"):
        topology_from_config(LocalityConfig(within_switch=2.0), source="site.toml")
