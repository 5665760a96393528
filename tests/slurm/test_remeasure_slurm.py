"""Re-measurement on a real Slurm, end to end and short: the rendered job_submit.lua, Prolog
and Epilog, and a real ``slurm-pal serve`` (``advisor.suspicion = "steer"``,
``advisor.remeasure = true``) on n01, n02 and n03 (2 fake GPUs each). The campaign says every
GPU is alike for class A; n01's second GPU is slower for class D, so it has a gres label of its
own. Since the campaign n01's first GPU turned slow: the job script and the class-A benchmark
both take twice as long on n01 (an emulated fault).

A long job holds n01's second GPU throughout. Two slow runs on n01's first GPU after three
normal ones elsewhere make it suspect for class A; with no admin action the advisor then
submits the campaign's class-A benchmark as a low-priority job pinned to it (its label's one
GPU on n01, not the node: the neighbour keeps running), judges its record against the GPU's
own campaign run, ingests the increment ``example-r1`` with its new class-A runs and places by
it: the next class-A job goes elsewhere on the scores alone, although n01, with one GPU free,
is packing's tightest node. Found slow for A, the GPU is measured for class D next (as fast as
the campaign says: cleared). The log tells the story.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.campaigns.stored import stored_diff
from tests.helpers.slurm_lab import (
    AdvisorLab,
    host_release_only,
    lab_paths,
    render_site,
    require_slurm,
)
from tests.slurm.test_suspicion_slurm import _ended, _node, _script

pytestmark = pytest.mark.slurm

GPUS = {"n01": 2, "n02": 2, "n03": 2}
BENCH = "custom:bench.sh"  # the name the campaign runner gives `sh .../bench.sh`
# The class-A benchmark: 1 s a unit on a healthy GPU, 2 on n01's (the same emulated fault).
BENCH_SH = (
    '#!/bin/sh\nif [ "$SLURMD_NODENAME" = n01 ]; then echo PAL_DURATION_S=2; '
    "else echo PAL_DURATION_S=1; fi\n"
)
BENCH_D = "custom:bench_d.sh"  # the class-D benchmark: the fault does not slow it
BENCH_D_SH = "#!/bin/sh\necho PAL_DURATION_S=1\n"


def _campaign(path: Path) -> None:
    """Every GPU alike for classes A and D (three repeats, 0.2 % noise) but n01's second, 1.3x
    slower for D (its own PM signature, so its own label); class A measured by the benchmark
    the site's [campaign] settings name."""
    rng = np.random.default_rng(0)
    rows = ["uuid,duration_s,node,gpu_index,gpu_model,job_class,benchmark"]
    for n, (node, count) in enumerate(GPUS.items()):
        for index in range(count):
            uuid = f"GPU-{n:04d}{index:04d}-0000-0000-0000-000000000000"
            for job_class, bench in (("A", BENCH), ("D", BENCH_D)):
                slower = 1.3 if (node, index, job_class) == ("n01", 1, "D") else 1.0
                for _ in range(3):
                    value = slower + rng.normal(0, 0.002)
                    rows.append(f"{uuid},{value:.5f},{node},{index},v100,{job_class},{bench}")
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def lab() -> Iterator[AdvisorLab]:
    host_release_only(
        "re-measuring submits the campaign's pinned jobs, as test_campaign_slurm does on each"
    )
    require_slurm()
    paths = lab_paths()
    root = paths.root
    bench = root / "out" / "bench.sh"
    bench.write_text(BENCH_SH)
    bench_d = root / "out" / "bench_d.sh"
    bench_d.write_text(BENCH_D_SH)
    paths.config.write_text(
        paths.site_toml(
            'policy = "packed-pm"\nsuspicion = "steer"\nrefresh_s = 1.0\nreplan_s = 0\n'
            "remeasure = true\nremeasure_per_hour = 2\n",
            f'[campaign]\nroot = "{root / "campaigns"}"\npython = "{sys.executable}"\n'
            f'time_limit = "2"\nrun_timeout_s = 30\nwarmup_s = 0\nmeasure_s = 1\n'
            f'[campaign.commands]\nA = "sh {bench}"\nD = "sh {bench_d}"\n',
        )
    )
    csv = paths.work / "campaign.csv"
    _campaign(csv)
    labels = render_site(paths.db, csv, paths.site, config=paths.config, apps={"resnet": "A"})
    n01 = {g["index"]: g["label"] for g in labels["nodes"]["n01"]}
    assert n01[0] != n01[1], labels  # the setting: a node-mate of another label
    the_lab = AdvisorLab(**paths.lab_fields(labels))
    with the_lab.running():
        yield the_lab


def _free_seen(lab: AdvisorLab, free: int) -> None:
    """Wait until the advisor's view shows ``free`` GPUs free and no reservation."""
    deadline = time.monotonic() + 30
    health: dict = {}
    while time.monotonic() < deadline:
        health = lab.ask("health")
        if health.get("free") == free and not health.get("reservations"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the advisor sees {health}")


def test_a_suspect_gpu_is_re_measured_through_slurm_and_its_scores_updated(
    lab: AdvisorLab,
) -> None:
    train = _script(lab.root / "out" / "train.sh", "resnet")
    hold = lab.root / "out" / "hold.sh"
    hold.write_text("#!/bin/sh\nsleep 300\n")
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    since = lab.log_size()
    label = {g["index"]: g["label"] for g in lab_labels(lab)["n01"]}
    # n01's second GPU (its own label) runs a long job throughout
    neighbour = lab.sbatch(f"--gres=gpu:{label[1]}:1", "-w", "n01", str(hold))
    lab.tb.wait_job(neighbour, 30, state="RUNNING")
    normal = [lab.sbatch("--gres=gpu:1", "-x", "n01", str(train)) for _ in range(3)]
    _ended(lab, normal)
    slow = [lab.sbatch("--gres=gpu:1", "-w", "n01", str(train)) for _ in range(2)]
    _ended(lab, slow)
    deadline = time.monotonic() + 60
    while "loaded campaign example-r1" not in lab.advisor_log(since):  # the service places by it
        assert time.monotonic() < deadline, lab.advisor_log(since)[-4000:]
        time.sleep(0.5)
    # the re-measure ran beside the neighbour, which never stopped
    assert lab.jobs()[neighbour].state == "RUNNING"
    with Store(lab.db) as store:
        assert store.active_campaign_id() == "example-r1"
        diff = stored_diff(store, "example", "example-r1")
        closed = store.suspicions("example", cleared=True)
        scores = store.gpu_scores("example-r1")[["job_class", "node", "pm_score", "bin"]]
    log = lab.advisor_log(since)
    story = [
        next((i for i, line in enumerate(log.splitlines()) if text in line), None)
        for text in (
            "suspect for class A (kept off it",
            "re-measure job",
            "confirmed by re-measurement",
            "loaded campaign example-r1",
        )
    ]
    assert None not in story and story == sorted(story), log[-4000:]  # type: ignore[type-var]
    print("\n".join(log.splitlines()[story[0] : story[-1] + 1]))  # type: ignore[index,misc]
    submitted = next(line for line in log.splitlines() if "re-measure job" in line)
    assert "(n01 device 0)" in submitted and BENCH in submitted, submitted
    assert f"holding gpu:{label[0]}:1" in submitted, submitted
    (script,) = (lab.root / "campaigns").glob("rm-n01-0-A-*/sbatch/n01.sbatch")
    text = script.read_text()
    assert f"--gres=gpu:{label[0]}:1\n" in text and "--exclusive" not in text, text
    (row,) = closed
    assert "2.00x its campaign time" in str(row["cleared_why"]), row
    assert "GPU-00000000" in str(diff.to_dict()), diff.to_dict()  # `campaign diff` names it
    # found slow for A: its other class measured too (the budget's second job this hour); the
    # emulated fault slows class A's benchmark only, so D is as the campaign says
    deadline = time.monotonic() + 90
    while "for class D settled" not in lab.advisor_log(since):
        assert time.monotonic() < deadline, lab.advisor_log(since)[-4000:]
        time.sleep(0.5)
    log = lab.advisor_log(since)
    assert "found slow for another class, measured for class D" in log, log[-4000:]
    assert "cleared by re-measurement" in log, log[-4000:]
    stats = lab.ask("stats")
    assert stats["suspect_gpus"] == []  # its scores say it now, no suspicion left
    assert stats["remeasure_last_hour"] == 2 and stats["remeasure_in_flight"] == 0, stats
    # the next class-A job: packing's tightest node is n01 (one GPU free, the re-measured
    # one); its new score keeps the job off it
    _free_seen(lab, sum(GPUS.values()) - 1)
    job = lab.sbatch("--gres=gpu:1", str(train))
    assert _node(lab, job) != "n01", (scores.to_string(), lab.advisor_log(since)[-3000:])
    # A restart keeps what the re-measurements settled (the store's closed rows): class D,
    # found as the campaign says, is not measured again, although the hour's budget starts
    # over and the GPU is idle; it used to be, at the first read after every restart.
    lab.stop_advisor()
    restarted = lab.log_size()
    lab.start_advisor()
    time.sleep(4)  # reads every second (refresh_s = 1), each followed by the planner
    log = lab.advisor_log(restarted)
    assert "re-measure job" not in log, log[-3000:]
    assert lab.ask("stats")["remeasure_last_hour"] == 0
    lab.tb.run(["scancel", str(neighbour)], timeout_s=30, check=False)


def lab_labels(lab: AdvisorLab) -> dict[str, list[dict]]:
    """labels.json's nodes, as rendered for the lab."""
    return json.loads((lab.root / "work" / "site" / "labels.json").read_text())["nodes"]
