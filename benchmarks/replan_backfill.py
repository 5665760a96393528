"""What the service's re-planning round costs with each model of Slurm's backfill, in process.

    python benchmarks/replan_backfill.py              # a line per queue length
    python benchmarks/replan_backfill.py --json

The round (``engine/replan.plan_replan``, what ``slurm-pal serve`` runs at each job's end,
inside the Epilog's wait) on 12 nodes x 4 GPUs, every GPU busy with limits ending over the next
hour and a half, and ``--pending`` one-GPU jobs queued (``--gres=gpu:1``, limits of 30-120
min), as ``benchmarks/replan_load.py`` fills a real Slurm. Per queue length, the round's wall
time with ``advisor.slurm_backfill_reserves = "head"`` (EASY: one reservation, by GPU count)
and ``"nodes"`` (Slurm's plan: every waiting job reserved on whole nodes, up to
``bf_max_job_test``), the best of ``--repeats``, and their ratio (``nodes_vs_head``). No Slurm
is needed: the round reads a cluster view, as the service's does after its Slurm read.
"""

from __future__ import annotations

import argparse
import json
import time

from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import get_policy
from slurm_pal.engine.decide import LabelTable
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.engine.replan import PendingJob, plan_replan

NOW = 10_000.0
NODES, PER_NODE = 12, 4


def busy_site() -> tuple[Cluster, LabelTable]:
    """Every GPU busy, one label (no outlier: the round's cost, not its choices)."""
    specs, nodes = [], {}
    for n in range(1, NODES + 1):
        node = f"n{n:02d}"
        for index in range(PER_NODE):
            uuid = f"GPU-{node}-{index}"
            specs.append(GpuSpec(uuid, node, index, "v100", {"A": 1.0, "B": 1.0}))
            entry = {"index": index, "slurm_index": index, "label": "v100-a0", "uuid": uuid}
            nodes.setdefault(node, []).append(entry | {"file": f"/dev/nvidia{index}"})
    cluster = Cluster.from_gpus(specs, busy=[s.uuid for s in specs])
    for position, spec in enumerate(specs):
        end = NOW + 600.0 + 97.0 * position
        cluster.expect_free_at([cluster.uuid_index[spec.uuid]], end, since=NOW - 600.0)
    return cluster, LabelTable.from_labels_json({"campaign": "c1", "nodes": nodes})


def queue(length: int) -> list[PendingJob]:
    """``length`` one-GPU jobs with limits of 30-119 minutes, in priority order."""
    jobs = []
    for j in range(length):
        wire = {"user": "u", "tres_per_node": "gres:gpu:1", "time_limit": 30 + j % 90}
        job = JobDescription.from_wire(wire)
        jobs.append(PendingJob(100 + j, f"t{j}", job, "A", "bench", None, "gres:gpu:1"))
    return jobs


def round_s(pending: list[PendingJob], reserves: str, repeats: int) -> float:
    cluster, labels = busy_site()
    policy = get_policy("packed-pm")
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        plan_replan(
            pending,
            cluster,
            labels=labels,
            policy=policy,
            version="bench",
            now=NOW,
            backfill=True,
            backfill_reserves=reserves,
        )
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", default="500,2000,10000", help="queue lengths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    figures = {}
    for length in (int(n) for n in args.pending.split(",") if n):
        pending = queue(length)
        head, nodes = (round_s(pending, r, args.repeats) for r in ("head", "nodes"))
        figures[str(length)] = {
            "head_s": round(head, 4),
            "nodes_s": round(nodes, 4),
            "nodes_vs_head": round(nodes / head, 2),
        }
    if args.json:
        print(json.dumps(figures))
        return
    for length, row in figures.items():
        print(
            f"{length} pending: head {row['head_s']} s, nodes {row['nodes_s']} s, "
            f"nodes/head {row['nodes_vs_head']}x"
        )


if __name__ == "__main__":
    main()
