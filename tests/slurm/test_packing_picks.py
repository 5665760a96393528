"""Where a real Slurm puts a job of GPUs per node, beside the packing model's pick.

The simulator's Slurm, the testbed's prediction and the service (is a decision packing's own
pick, which it can pass to Slurm?) all take Slurm's choice from ``PackedPolicy``. For jobs of
GPUs per node (``--gres=gpu:g``, on one node or ``-N k``) cons_tres's ``_eval_nodes`` cuts the
usable nodes into blocks of consecutive nodes, takes the tightest block (the fewest free CPUs
among blocks with enough nodes) and then the best-fit node inside it. So with a full node in
the middle, a one-GPU job goes to the lone free node past it, not to the fullest node before
it, which is where a fewest-free-GPUs rule sends it. The jobs ask for CPUs in proportion to
their GPUs, as the testbed's site-like jobs do, so that free CPUs follow free GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import PackedPolicy
from slurm_pal.core.request import PlacementRequest
from slurm_pal.testbed import LocalSlurm
from slurm_pal.testbed.spec import NodeSpec

pytestmark = pytest.mark.slurm

NODES = 5
GPUS = 4
CPUS_PER_GPU = 2  # LocalSlurm's 8 CPUs per node over its 4 GPUs


def _modelled(tb: LocalSlurm, gpus: int, per_node: int) -> set[str]:
    """Packing's nodes for the job, on the GPUs Slurm reports in use right now."""
    specs, busy = [], []
    for node in CliStateReader(tb.env).nodes():
        used = {i for indices in node.used_gpu_indices().values() for i in indices}
        for index in range(GPUS):
            specs.append(GpuSpec(f"{node.name}-{index}", node.name, index, "a", {"A": 1.0}))
            if index in used:
                busy.append(f"{node.name}-{index}")
    cluster = Cluster.from_gpus(sorted(specs, key=lambda g: g.uuid), busy=busy)
    request = PlacementRequest("probe", "A", gpus, gpus_per_node=per_node)
    result = PackedPolicy().place(request, cluster)
    assert result.allocation is not None, result.reason
    return set(result.allocation.node_names)


def _hold(tb: LocalSlurm, held: list[int], node: str, gpus: int) -> None:
    job = tb.submit(
        "-w", node, f"--gres=gpu:{gpus}", f"--cpus-per-task={gpus * CPUS_PER_GPU}",
        "--wrap", "sleep 600",
    )  # fmt: skip
    held.append(job)
    tb.wait_job(job, 30, state="RUNNING")


def _probe(tb: LocalSlurm, nodes: int, per_node: int) -> set[str]:
    """Where Slurm starts ``-N nodes --gres=gpu:per_node`` now (the job is cancelled after)."""
    job = tb.submit(
        "-N", str(nodes), f"--gres=gpu:{per_node}",
        f"--cpus-per-task={per_node * CPUS_PER_GPU}", "--wrap", "sleep 600",
    )  # fmt: skip
    try:
        tb.wait_job(job, 30, state="RUNNING")
        (info,) = CliStateReader(tb.env).jobs(job_ids=[job])
        return set(info.nodes)
    finally:
        tb.run(["scancel", str(job)], check=False)
        tb.wait_job(job, 30)


def _release(tb: LocalSlurm, held: list[int]) -> None:
    for job in held:
        tb.run(["scancel", str(job)], check=False)
    for job in held:
        tb.wait_job(job, 30)
    held.clear()


def test_packing_picks_the_nodes_cons_tres_picks(testbed_root: Path) -> None:
    names = [f"r{i}" for i in range(1, NODES + 1)]
    tb = LocalSlurm(testbed_root, [NodeSpec(name, ("a",) * GPUS) for name in names])
    held: list[int] = []
    tb.start()
    try:
        # r1-r3 partly used (3, 2 and 3 GPUs free), r4 full, r5 free: blocks r1-r3 and r5.
        for node, gpus in (("r1", 1), ("r2", 2), ("r3", 1), ("r4", 4)):
            _hold(tb, held, node, gpus)
        for per_node in (1, 2):
            assert _probe(tb, 1, per_node) == {"r5"}  # the tighter block, not r2 (fewest free)
            assert _modelled(tb, per_node, per_node) == {"r5"}
        _release(tb, held)

        # r3 full, r5 half used: blocks r1-r2 (8 free) and r4-r5 (6 free); three nodes of 2
        # GPUs: none suffices, so the larger block whole (r1, r2), then the best fit of the
        # other (r5, 2 free, not r4 first in it).
        for node, gpus in (("r3", 4), ("r5", 2)):
            _hold(tb, held, node, gpus)
        assert _probe(tb, 3, 2) == {"r1", "r2", "r5"}
        assert _modelled(tb, 6, 2) == {"r1", "r2", "r5"}
    finally:
        _release(tb, held)
        tb.stop()
