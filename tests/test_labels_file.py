"""The one labels.json reader: what ``site render`` writes reads back, anything else is one line
that names the file (and the node and key), and every user (advisor, hooks, CLI) goes through it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.hooks.gpus import device_indices
from slurm_pal.site.render import plan_site

GPU = {"index": 0, "slurm_index": 1, "label": "v100-a0", "uuid": "GPU-a"}


def _rendered(tmp_path: Path) -> tuple[Path, dict[tuple[str, int], int]]:
    """labels.json as ``site render`` writes it for two nodes, and its (node, Slurm's number)
    -> device index."""
    rows = [("u0", "n1", 0, "v100-a1"), ("u1", "n1", 1, "v100-a0"), ("u2", "n2", 0, "v100-a0")]
    frame = pd.DataFrame(
        [
            {"job_class": "A", "uuid": u, "node": n, "gpu_index": i, "gpu_model": "v100"}
            for u, n, i, _ in rows
        ]
    )
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    plan = plan_site("c1", frame, {u: label for u, _, _, label in rows})
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(plan.to_dict()))
    return path, {(g.node, g.slurm_index): g.index for g in plan.gpus}


def test_what_site_render_writes_reads_back(tmp_path: Path) -> None:
    path, devices = _rendered(tmp_path)
    table = read_labels(path)
    assert table.campaign == "c1" and table.nodes == ("n1", "n2")
    assert {(e.node, e.index, e.label, e.uuid) for e in table.entries} == {
        ("n1", 0, "v100-a1", "u0"),
        ("n1", 1, "v100-a0", "u1"),
        ("n2", 0, "v100-a0", "u2"),
    }
    assert all(e.declared_model == "v100" == e.model for e in table.entries)
    assert {(e.node, e.slurm_index): e.index for e in table.entries} == devices


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read labels file"),
        ("{nope", "is not JSON"),
        ("[]", "top level: expected an object"),
        ('{"nodes": 3}', "'nodes': expected an object"),
        ('{"nodes": {}}', "no GPUs listed"),
        (json.dumps({"nodes": {"n1": [{**GPU, "index": -1}]}}), "node 'n1' GPU #0: 'index'"),
        (json.dumps({"nodes": {"n1": [{**GPU, "uuid": ""}]}}), "'uuid' must be a non-empty"),
        (json.dumps({"nodes": {"n1": [{**GPU, "label": "a:b"}]}}), "not a valid gres Type"),
        (json.dumps({"nodes": {"n1": [{**GPU, "model": 3}]}}), "'model' must be a string"),
        (json.dumps({"nodes": {"n1": [GPU, GPU]}}), "index 0 listed twice"),
    ],
)
def test_anything_else_is_one_line_naming_the_file(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "labels.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(LabelTableError) as caught:
        read_labels(path)
    line = str(caught.value)
    assert message in line and str(path) in line and "\n" not in line


def test_a_node_filter_checks_and_keeps_only_those_nodes(tmp_path: Path) -> None:
    """A hook reads its own node's GPUs of a large cluster's file; a broken entry of another
    node does not stop it."""
    path = tmp_path / "labels.json"
    broken = {"nodes": {"n1": [GPU], "n2": [{**GPU, "uuid": 7}]}}
    path.write_text(json.dumps(broken))
    table = read_labels(path, nodes=("n1",))
    assert table.nodes == ("n1",) and table.device_index("n1", 1) == 0
    assert read_labels(path, nodes=("n9",)).entries == ()
    with pytest.raises(LabelTableError, match="node 'n2'"):
        read_labels(path)


def test_hooks_map_slurm_indices_through_the_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, devices = _rendered(tmp_path)
    assert device_indices(path, "n1", [1, 0]) == [devices[("n1", 1)], devices[("n1", 0)]]
    assert device_indices(path, "n1", [5]) == []
    assert "n1" in capsys.readouterr().err
    path.write_text('{"nodes": 3}')
    assert device_indices(path, "n1", [0]) == []
    err = capsys.readouterr().err
    assert "not a labels.json" in err and "Traceback" not in err
