"""A route Slurm does not start, on a real Slurm with ``DefCpuPerGPU`` (the rendered
job_submit.lua and hooks, a real ``slurm-pal serve``): Slurm 24.11 never starts a job whose
per-node request names several GPU types under it, so the advisor hands the job back as its
user wrote it once it has stood ``advisor.route_stall_s`` on free GPUs, and Slurm runs it.
On 22.05, which starts such a job, the route is kept and nothing is handed back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from slurm_pal.engine.decide import parse_admin_comment
from tests.helpers.slurm_lab import (
    AdvisorLab,
    lab_paths,
    release_of,
    render_site,
    require_slurm,
    write_campaign,
)

pytestmark = pytest.mark.slurm

STALL_S = 15
NODES = ("n01", "n02", "n03")


def _campaign(path: Path) -> None:
    """Three nodes of two GPUs: n01's both 2.3x slower for class A (outliers), the others'
    second GPU 1.15x (another PM bin, no outlier), so a 2-GPU class-A job is routed off
    packing's pick (n01) to the two labels of another node."""
    slower = {("n01", "A"): (2.3, 2.3), ("n02", "A"): (1.0, 1.15), ("n03", "A"): (1.0, 1.15)}
    write_campaign(path, NODES, lambda node, index, cls: slower.get((node, cls), (1, 1))[index])


@pytest.fixture(scope="module")
def lab() -> Iterator[AdvisorLab]:
    require_slurm()
    paths = lab_paths()
    paths.config.write_text(
        paths.site_toml(
            f'policy = "packed-pm"\nrefresh_s = 1.0\nreplan_s = 0\nroute_stall_s = {STALL_S}\n'
        )
    )
    csv = paths.work / "campaign.csv"
    _campaign(csv)
    labels = render_site(paths.db, csv, paths.site, config=paths.config, apps={"resnet": "A"})
    the_lab = AdvisorLab(**paths.lab_fields(labels, extra_conf=("DefCpuPerGPU=2",)))
    with the_lab.running():
        yield the_lab


def _when(lab: AdvisorLab, job_id: int, key: str) -> float:
    return datetime.fromisoformat(lab.tb.job_fields(job_id)[key]).timestamp()


def test_a_route_slurm_leaves_pending_on_free_gpus_is_handed_back_and_runs(
    lab: AdvisorLab,
) -> None:
    job = lab.sbatch("--gres=gpu:2", "-t", "10", "--comment=pal:app=resnet", "--wrap", "sleep 3")
    route = parse_admin_comment(lab.jobs()[job].admin_comment)
    assert route is not None and route["action"] == "route", lab.jobs()[job]
    ((_node, labels),) = [part.split(":") for part in route["gpus"].split(";")]
    assert len(set(labels.split("+"))) == 2, route  # two GPU types on one node
    lab.tb.wait_job(job, 120, state="RUNNING")
    waited = _when(lab, job, "StartTime") - _when(lab, job, "SubmitTime")
    comment = parse_admin_comment(lab.jobs()[job].admin_comment)
    assert comment is not None
    print(f"started {waited:.0f} s after its submission: {comment['action']}, {comment['why']}")
    if release_of(lab.tb).typed_gres_update_replaces:  # 24.11: the route never starts
        assert comment["action"] == "pass" and "released" in comment, comment
        assert comment["r"] == route["r"]  # its records still find its decision
        assert waited >= STALL_S - 1, waited
        assert "released to Slurm as written" in lab.advisor_log(0)
    else:  # 22.05 starts it where it was routed
        assert comment == route, comment
        assert waited < STALL_S, waited
    deadline = time.monotonic() + 60
    while lab.jobs()[job].state not in ("COMPLETED",):
        assert time.monotonic() < deadline, lab.jobs()[job]
        time.sleep(0.5)
