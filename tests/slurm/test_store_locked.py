"""A store another process holds locked (an admin's ``sqlite3`` shell in ``BEGIN EXCLUSIVE``,
a backup) while jobs are submitted, run and end, on the real Slurm with the rendered
job_submit.lua and hooks and a real ``slurm-pal serve``: every decision and every
Prolog/Epilog record of those jobs is in the store afterwards, exactly once, and the lock
costs the service's log two lines (one when it starts, one when it ends) and no traceback."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm
from tests.helpers.slurm_lab import (
    AdvisorLab,
    fresh_testbed_dir,
    host_release_only,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
)

pytestmark = pytest.mark.slurm

JOB = "--wrap=sleep 4"  # long enough for a refresh (1 s) to bind it to its decision


@pytest.fixture(scope="module")
def lab() -> Iterator[AdvisorLab]:
    host_release_only("the store's lock does not depend on Slurm's release")
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    out = root / "out"
    out.mkdir()
    sock = root / "adv" / "advisor.sock"
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\npolicy = "pal"\npin = "every-job"\n'
        "refresh_s = 1.0\nreplan_s = 0\nreservation_ttl_s = 30\n"
        f'labels_file = "{work / "site" / "labels.json"}"\n'
        f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
    )
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    site = work / "site"
    labels = render_site(work / "store.db", csv, site, config=config, apps={"resnet": "A"})
    the_lab = AdvisorLab(
        tb=LocalSlurm(root, rendered_nodes(labels), **rendered_hooks(site)),
        root=root,
        db=work / "store.db",
        config=config,
        socket=sock,
        log_path=root / "log" / "advisor.log",
    )
    with the_lab.running():
        yield the_lab


def _submit_while_locked(lab: AdvisorLab, lock_s: float, jobs: int) -> tuple[list[int], int]:
    """Hold the store's write lock for ``lock_s`` from another connection and submit ``jobs``
    jobs spread over it (each runs and ends inside the lock); the job ids and where the
    advisor's log stood when the lock was taken."""
    lab.ensure_advisor()
    lab.cancel_all()
    mark = lab.log_size()
    holder = sqlite3.connect(lab.db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    taken = time.monotonic()
    submitted: list[int] = []
    try:
        # the last job is submitted with time left for it to run and end inside the lock
        spacing = (lock_s - 12.0) / max(jobs - 1, 1)
        for n in range(jobs):
            time.sleep(max(0.0, taken + n * spacing - time.monotonic()))
            submitted.append(lab.sbatch("--gres=gpu:1", "--comment=pal:app=resnet", JOB))
        time.sleep(max(0.0, taken + lock_s - time.monotonic()))
        assert lab.ask("stats")["store_writes_waiting"] > 0  # they did wait
    finally:
        holder.execute("COMMIT")
        holder.close()
    return submitted, mark


def _stored(lab: AdvisorLab, job_ids: list[int]) -> tuple[Counter[str], Counter[tuple]]:
    """Decisions (by token) and records (job, node, kind) in the store for these jobs."""
    with sqlite3.connect(lab.db) as db:
        tokens = Counter(str(r[0]) for r in db.execute("SELECT token FROM advisor_decisions"))
        marks = ",".join("?" * len(job_ids))
        records = Counter(
            (int(j), str(n), str(k))
            for j, n, k in db.execute(
                f"SELECT job_id, node, kind FROM job_records WHERE job_id IN ({marks})", job_ids
            )
        )
    return tokens, records


def _check_nothing_lost(lab: AdvisorLab, job_ids: list[int], mark: int) -> None:
    jobs = lab.jobs()
    tokens = {}
    for job_id in job_ids:
        admin = parse_admin_comment(jobs[job_id].admin_comment)
        assert admin is not None and admin["action"] == "route", jobs[job_id]  # advised
        tokens[job_id] = admin["r"]
    wanted = {(j, jobs[j].nodes[0], k) for j in job_ids for k in ("prolog", "epilog")}
    deadline = time.monotonic() + 60  # the writer writes what waited as soon as it can
    while True:
        stored_tokens, records = _stored(lab, job_ids)
        done = all(stored_tokens[t] for t in tokens.values()) and set(records) >= wanted
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {j: stored_tokens[t] for j, t in tokens.items()} == dict.fromkeys(job_ids, 1)
    assert dict(records) == dict.fromkeys(wanted, 1), records  # every record, exactly once
    with sqlite3.connect(lab.db) as db:
        bound = dict(db.execute("SELECT token, job_id FROM advisor_decisions").fetchall())
    assert {j: bound[t] for j, t in tokens.items()} == {j: j for j in job_ids}
    assert lab.ask("stats")["store_writes_waiting"] == 0
    assert not lab.db.with_name(lab.db.name + ".waiting").exists()  # the journal is cleared
    # The writer logs its "writable again" line after the writes and the journal's removal.
    deadline = time.monotonic() + 10
    while "writable again after" not in lab.advisor_log(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    log = lab.advisor_log(mark)
    levels = ("WARNING", "ERROR", "CRITICAL")
    warnings = [ln for ln in log.splitlines() if ln.split(" ")[1:2] and ln.split(" ")[1] in levels]
    assert len(warnings) == 2, log[-4000:]
    assert "locked by another process since" in warnings[0] and "writes waiting" in warnings[0]
    assert "writable again after" in warnings[1]
    assert "Traceback" not in log and "store write of" not in log


def test_a_store_locked_for_30_s_loses_no_decision_or_record(lab: AdvisorLab) -> None:
    job_ids, mark = _submit_while_locked(lab, 30.0, 6)
    _check_nothing_lost(lab, job_ids, mark)


def test_a_store_locked_for_120_s_loses_no_decision_or_record(lab: AdvisorLab) -> None:
    job_ids, mark = _submit_while_locked(lab, 120.0, 10)
    _check_nothing_lost(lab, job_ids, mark)
