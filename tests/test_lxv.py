"""The L x V matrix: the paper's worked example, tie-breaking, rows for the CLI."""

from __future__ import annotations

import pytest

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.lxv import LxVMatrix
from slurm_pal.core.placement import get_policy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology

PAPER_BINS = (0.89, 0.94, 1.06, 2.55)
HALF_CENT = 0.005 + 1e-9
"""The paper prints products to two decimals (1.335 as 1.34)."""


def paper_matrix() -> LxVMatrix:
    return LxVMatrix.build("A", PAPER_BINS, Topology.flat(across_nodes=1.5).levels)


def test_paper_worked_example_traversal_order() -> None:
    """Section III-C: bins 0.89, 0.94, 1.06, 2.55 and L_across = 1.5.

    The paper prints the order (1, 0.89) -> (1, 0.94) -> (1, 1.06) -> (1.5, 1.34) -> (1.5, 1.41)
    -> (1.5, 1.59) -> (1.5, 3.88) as (L, LV) pairs. Its matrix has eight entries and the printed
    list seven: the within-node entry of bin 4 (LV 2.55, which PAL's code also walks) sits between
    1.59 and the last one, and the last product is 1.5 x 2.55 = 3.825 (printed 3.88).
    """
    traversal = [(e.level.penalty, e.score) for e in paper_matrix().traversal]
    assert traversal == [
        (1.0, 0.89),
        (1.0, 0.94),
        (1.0, 1.06),
        (1.5, 0.89),
        (1.5, 0.94),
        (1.5, 1.06),
        (1.0, 2.55),
        (1.5, 2.55),
    ]
    paper_printed = [(1, 0.89), (1, 0.94), (1, 1.06), (1.5, 1.34), (1.5, 1.41), (1.5, 1.59)]
    ours = [(e.level.penalty, e.lv_product) for e in paper_matrix().traversal if e.rank != 7]
    assert ours[:6] == [(L, pytest.approx(lv, abs=HALF_CENT)) for L, lv in paper_printed]
    assert ours[6] == (1.5, pytest.approx(3.825))  # printed "3.88" in the paper


def test_paper_matrix_grid_matches_the_printed_matrix() -> None:
    printed = [[0.89, 0.94, 1.06, 2.55], [1.34, 1.41, 1.59, 3.825]]  # 3.825 printed "3.88"
    assert paper_matrix().grid() == [
        [pytest.approx(v, abs=HALF_CENT) for v in row] for row in printed
    ]


def test_rows_are_json_ready_and_ranked() -> None:
    rows = paper_matrix().rows()
    assert [row["rank"] for row in rows] == list(range(1, 9))
    assert rows[3] == {
        "rank": 4,
        "level": "across-nodes",
        "penalty": 1.5,
        "bin": 0,
        "bin_score": 0.89,
        "lv_product": pytest.approx(1.335),
    }
    assert "across-nodes" in paper_matrix().to_text()


def test_equal_products_walk_the_more_local_level_first() -> None:
    topology = Topology({"n1": "s0", "n2": "s0"}, within_switch=1.7, across_switches=1.7)
    matrix = LxVMatrix.build("A", (1.0, 1.7), topology.levels)
    names = [(e.level.name, e.score) for e in matrix.traversal]
    # 1.0 x 1.7 (within-node, bin 2) == 1.7 x 1.0 (within-switch and across, bin 1)
    assert names == [
        ("within-node", 1.0),
        ("within-node", 1.7),
        ("within-switch", 1.0),
        ("across-switches", 1.0),
        ("within-switch", 1.7),
        ("across-switches", 1.7),
    ]


def test_three_levels_interleave_by_product() -> None:
    topology = Topology({"n1": "s0"}, within_switch=1.2, across_switches=2.0)
    matrix = LxVMatrix.build("A", (0.9, 1.0, 1.5), topology.levels)
    products = [e.lv_product for e in matrix.traversal]
    assert products == sorted(products)
    assert len(products) == 9


@pytest.mark.parametrize("bins", [(1.0, 0.9), (1.0, 1.0), (0.0, 1.0), (float("nan"),)])
def test_bad_bins_are_rejected(bins: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        LxVMatrix.build("A", bins, Topology.flat().levels)


def _cluster(layout: dict[str, list[float]]) -> Cluster:
    gpus = [
        GpuSpec(f"{node}-{i}", node, i, "v100", {"A": score})
        for node, scores in layout.items()
        for i, score in enumerate(scores)
    ]
    return Cluster.from_gpus(gpus, Topology.flat(across_nodes=1.5))


def test_cluster_lxv_uses_its_bins_and_levels() -> None:
    cluster = _cluster({"n0": [0.89, 2.55], "n1": [0.94, 1.06]})
    assert cluster.lxv("A").rows() == paper_matrix().rows()
    with pytest.raises(KeyError):
        cluster.lxv("Z")


def test_pal_prefers_spreading_over_the_slow_bin_as_in_the_paper() -> None:
    """No node has two GPUs in bins 1-3: PAL spreads (LV 1.41) rather than use bin 4 (2.55)."""
    cluster = _cluster({"n0": [0.89, 2.55, 2.55, 2.55], "n1": [0.94, 2.55, 2.55, 2.55]})
    result = get_policy("pal").place(PlacementRequest("j", "A", 2), cluster)
    assert result.allocation is not None
    assert result.allocation.lv_product == pytest.approx(1.41)
    assert result.allocation.level == "across-nodes"


def test_pal_packs_where_pm_first_spreads_as_in_the_paper() -> None:
    """A node with two bin-3 GPUs: PAL packs (LV 1.06), PM-First takes 0.89 + 0.94 across."""
    cluster = _cluster(
        {"n0": [0.89, 2.55, 2.55], "n1": [0.94, 2.55, 2.55], "n2": [1.06, 1.06, 2.55]}
    )
    request = PlacementRequest("j", "A", 2)
    pal = get_policy("pal").place(request, cluster).allocation
    pm_first = get_policy("pm-first").place(request, cluster).allocation
    assert pal is not None and pm_first is not None
    assert (pal.node_names, pal.lv_product) == (("n2",), 1.06)
    assert pm_first.node_names == ("n0", "n1")
    assert pm_first.lv_product == pytest.approx(1.5 * 0.94)
