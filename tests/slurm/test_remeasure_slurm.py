"""Re-measurement on a real Slurm, end to end and short: the rendered job_submit.lua, Prolog
and Epilog, and a real ``slurm-pal serve`` (``advisor.suspicion = "steer"``,
``advisor.remeasure = true``) on n01 (1 fake GPU), n02 and n03 (2 each). The campaign says
every GPU is alike; since then n01's GPU turned slow: the job script and the class-A
benchmark both take twice as long there (an emulated fault).

Two slow runs there after three normal ones elsewhere make it suspect for class A; with no
admin action the advisor then submits the campaign's class-A benchmark as a low-priority job
pinned to n01, judges its record against n01's own campaign run, ingests the increment
``example-r1`` with n01's new class-A runs and places by it: the next class-A job goes
elsewhere on the scores alone. The log tells the story.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.campaigns.stored import stored_diff
from slurm_pal.testbed import LocalSlurm
from tests.helpers.slurm_lab import (
    AdvisorLab,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
)
from tests.slurm.test_suspicion_slurm import _ended, _node, _script

pytestmark = pytest.mark.slurm

GPUS = {"n01": 1, "n02": 2, "n03": 2}
BENCH = "custom:bench.sh"  # the name the campaign runner gives `sh .../bench.sh`
# The class-A benchmark: 1 s a unit on a healthy GPU, 2 on n01's (the same emulated fault).
BENCH_SH = (
    '#!/bin/sh\nif [ "$SLURMD_NODENAME" = n01 ]; then echo PAL_DURATION_S=2; '
    "else echo PAL_DURATION_S=1; fi\n"
)


def _campaign(path: Path) -> None:
    """Every GPU alike for classes A and D (three repeats, 0.2 % noise), class A measured by
    the benchmark the site's [campaign] settings name."""
    rng = np.random.default_rng(0)
    rows = ["uuid,duration_s,node,gpu_index,gpu_model,job_class,benchmark"]
    for n, (node, count) in enumerate(GPUS.items()):
        for index in range(count):
            uuid = f"GPU-{n:04d}{index:04d}-0000-0000-0000-000000000000"
            for job_class, bench in (("A", BENCH), ("D", "stream")):
                for _ in range(3):
                    value = 1.0 + rng.normal(0, 0.002)
                    rows.append(f"{uuid},{value:.5f},{node},{index},v100,{job_class},{bench}")
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def lab() -> Iterator[AdvisorLab]:
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    (root / "out").mkdir()
    bench = root / "out" / "bench.sh"
    bench.write_text(BENCH_SH)
    db = work / "store.db"
    sock = root / "adv" / "advisor.sock"
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\npolicy = "packed-pm"\nsuspicion = "steer"\n'
        f'refresh_s = 1.0\nreplan_s = 0\nlabels_file = "{work / "site" / "labels.json"}"\n'
        f"remeasure = true\nremeasure_per_hour = 2\n"
        f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
        f'[campaign]\nroot = "{root / "campaigns"}"\npython = "{sys.executable}"\n'
        f'time_limit = "2"\nrun_timeout_s = 30\nwarmup_s = 0\nmeasure_s = 1\n'
        f'[campaign.commands]\nA = "sh {bench}"\n'
    )
    csv = work / "campaign.csv"
    _campaign(csv)
    site = work / "site"
    labels = render_site(db, csv, site, config=config, apps={"resnet": "A"})
    the_lab = AdvisorLab(
        tb=LocalSlurm(root, rendered_nodes(labels), **rendered_hooks(site)),
        root=root,
        db=db,
        config=config,
        socket=sock,
        log_path=root / "log" / "advisor.log",
    )
    with the_lab.running():
        yield the_lab


def test_a_suspect_gpu_is_re_measured_through_slurm_and_its_scores_updated(
    lab: AdvisorLab,
) -> None:
    train = _script(lab.root / "out" / "train.sh", "resnet")
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    since = lab.log_size()
    normal = [lab.sbatch("--gres=gpu:1", "-x", "n01", str(train)) for _ in range(3)]
    _ended(lab, normal)
    slow = [lab.sbatch("--gres=gpu:1", "-w", "n01", str(train)) for _ in range(2)]
    _ended(lab, slow)
    deadline = time.monotonic() + 60
    while "loaded campaign example-r1" not in lab.advisor_log(since):  # the service places by it
        assert time.monotonic() < deadline, lab.advisor_log(since)[-4000:]
        time.sleep(0.5)
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
    (row,) = closed
    assert "2.00x its campaign time" in str(row["cleared_why"]), row
    assert "GPU-00000000" in str(diff.to_dict()), diff.to_dict()  # `campaign diff` names it
    stats = lab.ask("stats")
    assert stats["suspect_gpus"] == []  # its scores say it now, no suspicion left
    assert stats["remeasure_last_hour"] == 1 and stats["remeasure_in_flight"] == 0, stats
    # the next class-A job: packing's tightest node is n01; its new score keeps the job off it
    lab.wait_advisor_sees_all_free(sum(GPUS.values()))
    job = lab.sbatch("--gres=gpu:1", str(train))
    assert _node(lab, job) != "n01", (scores.to_string(), lab.advisor_log(since)[-3000:])
