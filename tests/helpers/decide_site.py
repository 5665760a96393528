"""A small labelled cluster for decide/replan tests: four PM signatures (one label each) and
``site(layout)``, which builds the Cluster and its labels.json from node -> label per device."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.engine.decide import LabelTable

# Labels stand for PM signatures: one label, one set of scores.
SCORES = {
    "v100-a0b1": {"A": 0.9, "B": 1.0},
    "v100-a1b0": {"A": 1.0, "B": 0.95},
    "v100-a2b1": {"A": 1.2, "B": 1.0},
    "v100-ax0bx0": {"A": 1.6, "B": 1.3},
}

A0, A1, A2, AX = SCORES


def site(
    layout: Mapping[str, Sequence[str]],
    *,
    busy: Iterable[tuple[str, int]] = (),
    features: Mapping[str, Iterable[str]] | None = None,
    slurm_order: Mapping[str, Sequence[int]] | None = None,
) -> tuple[Cluster, LabelTable]:
    """A cluster and its labels.json: ``layout`` is node -> label of each device index;
    ``slurm_order`` is node -> device indices in Slurm's numbering order."""
    features = features or {}
    specs = []
    nodes: dict[str, list[dict[str, object]]] = {}
    for node, labels in layout.items():
        order = list((slurm_order or {}).get(node, range(len(labels))))
        for index, label in enumerate(labels):
            uuid = f"GPU-{node}-{index}"
            specs.append(
                GpuSpec(uuid, node, index, "v100", SCORES[label], frozenset(features.get(node, ())))
            )
            nodes.setdefault(node, []).append(
                {
                    "index": index,
                    "slurm_index": order.index(index),
                    "label": label,
                    "uuid": uuid,
                    "file": f"/dev/nvidia{index}",
                }
            )
    busy_uuids = [f"GPU-{node}-{index}" for node, index in busy]
    cluster = Cluster.from_gpus(specs, busy=busy_uuids)
    table = LabelTable.from_labels_json({"campaign": "c1", "nodes": nodes})
    return cluster, table
