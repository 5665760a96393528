"""Suspicion on a real Slurm, end to end and short: the rendered job_submit.lua, Prolog and
Epilog, and a real ``slurm-pal serve`` (``advisor.suspicion = "steer"``) on n01 (1 fake GPU),
n02 and n03 (2 each). The campaign says every GPU is alike; since then n01's GPU turned slow:
the one job script sleeps twice as long there (an emulated fault).

Packing sends a one-GPU job to the tightest node, n01, so without suspicion a compute-bound
(class A) job lands there. After the Epilogs of two slow runs there (and three normal runs
elsewhere) the advisor logs the GPU as suspect for class A with the evidence, and steers the
next class-A job off it, while a memory-bound (class D) job still gets it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.slurm_lab import (
    AdvisorLab,
    host_release_only,
    lab_paths,
    render_site,
    require_slurm,
)

pytestmark = pytest.mark.slurm

GPUS = {"n01": 1, "n02": 2, "n03": 2}
NORMAL_S, SLOW_S = 3, 6  # the job script's sleep on a healthy GPU and on n01's: long against
# what Slurm and the hooks add to a run on a loaded machine (1 s against 2 s drowned in it)


def _campaign(path: Path) -> None:
    """Every GPU alike for classes A and D (three repeats, 0.2 % noise)."""
    rng = np.random.default_rng(0)
    rows = ["uuid,duration_s,node,gpu_index,gpu_model,job_class,benchmark"]
    for n, (node, count) in enumerate(GPUS.items()):
        for index in range(count):
            uuid = f"GPU-{n:04d}{index:04d}-0000-0000-0000-000000000000"
            for job_class, bench in (("A", "gemm"), ("D", "stream")):
                for _ in range(3):
                    value = 1.0 + rng.normal(0, 0.002)
                    rows.append(f"{uuid},{value:.5f},{node},{index},v100,{job_class},{bench}")
    path.write_text("\n".join(rows) + "\n")


def _script(path: Path, app: str) -> Path:
    """One batch script per application (one history key): slow on n01, the emulated fault."""
    path.write_text(
        f"#!/bin/sh\n#PAL app={app}\n"
        f'if [ "$SLURMD_NODENAME" = n01 ]; then sleep {SLOW_S}; else sleep {NORMAL_S}; fi\n'
    )
    return path


@pytest.fixture(scope="module")
def lab() -> Iterator[AdvisorLab]:
    host_release_only("the suspicion rules read records the hooks send alike on every release")
    require_slurm()
    paths = lab_paths()
    paths.config.write_text(
        paths.site_toml(
            'policy = "packed-pm"\nsuspicion = "steer"\nrefresh_s = 1.0\nreplan_s = 0\n'
        )
    )
    csv = paths.work / "campaign.csv"
    _campaign(csv)
    labels = render_site(
        paths.db, csv, paths.site, config=paths.config, apps={"resnet": "A", "pagerank": "D"}
    )
    the_lab = AdvisorLab(**paths.lab_fields(labels))
    with the_lab.running():
        yield the_lab


def _ended(lab: AdvisorLab, job_ids: list[int], timeout_s: float = 60) -> None:
    """Wait until every job's Epilog record is stored (the advisor has judged it)."""
    deadline = time.monotonic() + timeout_s
    while not all(any(kind == "epilog" for _, kind in lab.records(j)) for j in job_ids):
        assert time.monotonic() < deadline, {j: lab.records(j) for j in job_ids}
        time.sleep(0.2)


def _node(lab: AdvisorLab, job_id: int) -> str:
    lab.tb.wait_job(job_id, 30, state="RUNNING")
    (node,) = lab.jobs()[job_id].nodes
    return node


def test_slow_runs_make_the_gpu_suspect_and_steer_the_next_sensitive_job_off_it(
    lab: AdvisorLab,
) -> None:
    out = lab.root / "out"
    train = _script(out / "train.sh", "resnet")
    pagerank = _script(out / "pagerank.sh", "pagerank")
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    since = lab.log_size()
    normal = [lab.sbatch("--gres=gpu:1", "-x", "n01", str(train)) for _ in range(3)]
    _ended(lab, normal)
    slow = [lab.sbatch("--gres=gpu:1", "-w", "n01", str(train)) for _ in range(2)]
    _ended(lab, slow)
    log = lab.advisor_log(since)
    lines = [line for line in log.splitlines() if "suspect for class A" in line]
    assert len(lines) == 1, log[-3000:]
    assert "(n01:0)" in lines[0] and "kept off it" in lines[0], lines[0]
    assert f"job {slow[1]} " in lines[0] and "evidence:" in lines[0], lines[0]
    (row,) = lab.ask("stats")["suspect_gpus"]
    assert row["where"] == "n01:0" and list(row["classes"]) == ["A"], row
    # the next class-A job: packing's tightest node is n01, the advisor sends it elsewhere
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    sensitive = lab.sbatch("--gres=gpu:1", str(train))
    assert _node(lab, sensitive) != "n01"
    _ended(lab, [sensitive])
    # a memory-bound job is not slowed there: it still gets n01
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    memory = lab.sbatch("--gres=gpu:1", str(pagerank))
    assert _node(lab, memory) == "n01"
