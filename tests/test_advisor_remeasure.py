"""Re-measuring suspect GPUs in the service (advisor/remeasure.py): a suspect (GPU, class)
idle with its label-mates gets a pinned, low-priority campaign job (its label's GPUs of the
node, not the whole node); its result confirms the suspicion
(an increment campaign, active, with the GPU's new runs: the service places by it) or clears
it. Slurm faked: its submit writes the run record the campaign task would."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.remeasure import NICE, Remeasurer, idle_gpus
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.campaigns.stored import stored_diff
from slurm_pal.campaigns.workspace import RESULTS_DIR, load_plan
from tests.helpers.advisor import Env, make_env
from tests.test_advisor_suspicion import Jobs, first_pick, make_suspect


class FakeSlurm:
    """submit: the task 'runs' at once (``factor`` x the GPU's campaign time) unless
    ``run`` is off; queued: the jobs not run yet. ``others``: class -> (campaign time,
    benchmark) of the GPU's other classes, which run as the campaign says."""

    def __init__(
        self,
        campaign_time: float,
        benchmark: str,
        factor: float,
        others: dict[str, tuple[float, str]] | None = None,
    ) -> None:
        self.campaign_time, self.benchmark, self.factor = campaign_time, benchmark, factor
        self.others = others or {}
        self.submitted: list[tuple[Path, str]] = []
        self.run = True
        self.waiting: set[str] = set()

    def submit(self, script: Path, *, array: str, cwd: Path) -> str:
        job_id = str(500 + len(self.submitted))
        self.submitted.append((script, array))
        plan, _ = load_plan(cwd.parent, cwd.name)
        if not self.run:
            self.waiting.add(job_id)
            return job_id
        (gpu,) = plan.gpus
        job_class = plan.classes[0]
        seconds, benchmark = self.campaign_time * self.factor, self.benchmark
        if job_class in self.others:
            seconds, benchmark = self.others[job_class]
        record = {
            "schema": 1, "campaign": plan.campaign, "status": "ok", "node": gpu.node,
            "gpu_index": gpu.gpu_index, "job_class": job_class, "repeat": 0,
            "uuid": gpu.uuid, "uuid_source": "assignment", "benchmark": benchmark,
            "duration_s": seconds,
        }  # fmt: skip
        (cwd / RESULTS_DIR / f"{gpu.node}-{gpu.gpu_index}-0.json").write_text(json.dumps(record))
        return job_id

    def queued(self, job_names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {f"{j}_0": ("PENDING", "Priority") for j in self.waiting}

    def node_states(self, nodes: Iterable[str]) -> dict[str, str]:
        return {}


@pytest.fixture
def env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="spal-rm-", dir="/tmp"))
    root.chmod(0o755)
    the_env = make_env(root, policy="pm-first")
    advisor = replace(
        the_env.config.advisor,
        suspicion="steer",
        remeasure=True,
        remeasure_per_hour=1,
        remeasure_routine_s=0.0,  # the suspects alone; routine measurements: their own test
    )
    the_env.config = replace(the_env.config, advisor=advisor)
    yield the_env
    the_env.close()
    shutil.rmtree(root, ignore_errors=True)


def suspect(env: Env) -> tuple[AdvisorState, str, float, str]:
    """A service with one suspect (GPU, A); the GPU's campaign time and benchmark for A."""
    st = env.state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")
    assert [(s.gpu, s.job_class) for s in st.suspects.suspects()] == [(target, "A")]
    with Store(env.db) as store:
        rows = store.measurements("example")
    mine = rows[(rows["uuid"] == target) & (rows["job_class"] == "A")]
    return st, target, float(mine["duration"].median()), str(mine["benchmark"].iloc[0])


def candidate(env: Env) -> tuple[AdvisorState, str, float, str]:
    """A service with one candidate (GPU, A): a little slow, over half the alarm, not over
    it; the GPU's campaign time and benchmark for A."""
    st = env.state()
    target = first_pick(st, "resnet")
    jobs = Jobs(env)
    for uuid in [u for u in jobs.place if u != target][:4]:
        jobs.run(st, uuid, "resnet", "A")
    for _ in range(3):
        jobs.run(st, target, "resnet", "A", slow=1.25)
    assert [(c.gpu, c.job_class) for c in st.suspects.candidates()] == [(target, "A")]
    with Store(env.db) as store:
        rows = store.measurements("example")
    mine = rows[(rows["uuid"] == target) & (rows["job_class"] == "A")]
    return st, target, float(mine["duration"].median()), str(mine["benchmark"].iloc[0])


def other_classes(env: Env, gpu: str, job_class: str) -> dict[str, tuple[float, str]]:
    """The GPU's campaign time and benchmark for each class but ``job_class``."""
    with Store(env.db) as store:
        rows = store.measurements("example")
    mine = rows[(rows["uuid"] == gpu) & (rows["job_class"] != job_class)]
    return {
        str(c): (float(runs["duration"].median()), str(runs["benchmark"].iloc[0]))
        for c, runs in mine.groupby("job_class")
    }


def measured_classes(slurm: FakeSlurm) -> list[str]:
    """The class of each re-measure job submitted, in order (from its campaign's name)."""
    return [script.parts[-3].split("-")[3] for script, _ in slurm.submitted]


def remeasurer(env: Env, st: AdvisorState, slurm: FakeSlurm) -> Remeasurer:
    return Remeasurer(st, slurm, root=env.root / "campaigns", wall_clock=lambda: 1.9e9)


def test_a_confirmed_suspicion_becomes_a_campaign_increment(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    st, target, seconds, bench = suspect(env)
    old_score = Jobs(env).score(st, target, "A")
    slurm = FakeSlurm(seconds, bench, factor=2.0)
    rm = remeasurer(env, st, slurm)
    with caplog.at_level(logging.INFO, logger="slurm_pal.advisor"):
        rm.tick()  # submits
        ((script, array),) = slurm.submitted
        text = script.read_text()
        (entry,) = [e for e in env.table.entries if e.uuid == target]
        node, index = entry.node, entry.index  # the device minor, as a campaign task's
        mates = [e for e in env.table.entries if e.node == node and e.label == entry.label]
        assert f"--nodelist={node}" in text and f"--nice={NICE}" in text
        assert f"--gres=gpu:{entry.label}:{len(mates)}\n" in text and "--exclusive" not in text
        assert array == str(index)
        plan, _ = load_plan(script.parent.parent.parent, script.parent.parent.name)
        assert plan.gpus[0].slurm_index == entry.slurm_index  # the runner checks it is held
        rm.tick()  # judges the landed record
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example-r1"
        (closed,) = store.suspicions("example", cleared=True)
        diff = stored_diff(store, "example", "example-r1")
    assert "confirmed by re-measurement" in str(closed["cleared_why"])
    assert "example-r1" in str(closed["cleared_why"])
    assert st.view is not None and st.view.static.campaign == "example-r1"
    assert Jobs(env).score(st, target, "A") > old_score * 1.5  # its new score, from the run
    assert st.suspects.suspects() == []
    assert target in json.dumps(diff.to_dict())  # campaign diff names the GPU
    story = [r.getMessage() for r in caplog.records]
    assert any("re-measure job 500 submitted" in m for m in story)
    assert any("confirmed by re-measurement" in m for m in story)
    rm.tick()
    assert len(slurm.submitted) == 1  # nothing left to measure


def test_a_cleared_suspicion_is_closed_and_no_longer_steered(env: Env) -> None:
    st, target, seconds, bench = suspect(env)
    rm = remeasurer(env, st, FakeSlurm(seconds, bench, factor=1.02))
    rm.tick()
    rm.tick()
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example"
        (closed,) = store.suspicions("example", cleared=True)
    assert str(closed["cleared_why"]).startswith("cleared by re-measurement")
    assert st.suspects.suspects() == []
    assert first_pick(st, "resnet") == target  # steered by again
    st.reload()  # a refit finds it again from the records; the settlement stands
    assert st.suspects.suspects() == []


def test_a_cleared_suspicion_stays_settled_after_a_restart(env: Env) -> None:
    """The verdict lives in the store's closed row: a new service (nothing in memory) replays
    the runs with it, so the suspicion stays settled, and slow runs after it raise a new one."""
    st, target, seconds, bench = suspect(env)
    rm = remeasurer(env, st, FakeSlurm(seconds, bench, factor=1.02))
    rm.tick()
    rm.tick()
    assert st.suspects.suspects() == []
    restarted = env.state()
    assert restarted.suspects.suspects() == []
    assert first_pick(restarted, "resnet") == target
    with Store(env.db) as store:
        assert store.suspicions("example") == []  # the warm-up opened no row again
    jobs = Jobs(env)
    jobs.next_id, jobs.now = 2000, 1.9e9 + 60  # after the verdict
    make_suspect(restarted, jobs, target, "resnet", "A")
    (again,) = restarted.suspects.suspects()
    assert (again.gpu, again.job_class) == (target, "A") and again.since_s > 1.9e9


def test_off_by_default_and_busy_label_mates_wait(env: Env) -> None:
    st, target, seconds, bench = suspect(env)
    slurm = FakeSlurm(seconds, bench, factor=2.0)
    st.config = replace(st.config, advisor=replace(st.config.advisor, remeasure=False))
    remeasurer(env, st, slurm).tick()
    assert slurm.submitted == []
    st.config = replace(st.config, advisor=replace(st.config.advisor, remeasure=True))
    node, _ = Jobs(env).place[target]
    assert st.view is not None
    assert target in idle_gpus(st.view)
    base = st.view.base
    other = next(g for g, u in enumerate(base.uuids)
                 if u != target and base.node_names[base.gpu_node[g]] == node)  # fmt: skip
    base.allocate([other])  # a job on a label-mate (every GPU of n03 has one label)
    assert target not in idle_gpus(st.view)
    remeasurer(env, st, slurm).tick()
    assert slurm.submitted == []
    # n01 has two labels, X (devices 0, 2) and Y (1, 3): a job on a Y GPU leaves X measurable
    by_index = {e.index: e for e in env.table.entries if e.node == "n01"}
    base.allocate([base.uuid_index[by_index[1].uuid]])
    idle = idle_gpus(st.view)
    assert by_index[1].uuid not in idle and by_index[3].uuid not in idle
    pin, entry = idle[by_index[0].uuid]
    assert pin.label == "v100-X" and entry.slurm_index == 0
    assert set(pin.gpus) == {by_index[0].uuid, by_index[2].uuid}


def test_a_job_that_leaves_without_a_result_is_given_up_and_the_budget_holds(env: Env) -> None:
    st, _, seconds, bench = suspect(env)
    slurm = FakeSlurm(seconds, bench, factor=2.0)
    slurm.run = False
    rm = remeasurer(env, st, slurm)
    rm.tick()
    rm.tick()
    assert len(rm.flights) == 1  # still queued
    assert rm.snapshot() == {
        "remeasure": True, "remeasure_in_flight": 1, "remeasure_last_hour": 1
    }  # fmt: skip
    slurm.waiting.clear()  # gone, no record
    rm.tick()
    rm.tick()
    assert rm.flights == [] and len(slurm.submitted) == 1  # per_hour = 1: not again yet
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example"


def test_a_gpu_found_slow_is_measured_again_and_recovers_as_another_increment(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    st, target, seconds, bench = suspect(env)
    old_score = Jobs(env).score(st, target, "A")
    others = other_classes(env, target, "A")
    slurm = FakeSlurm(seconds, bench, factor=2.0, others=others)
    now = [1.9e9]
    rm = Remeasurer(st, slurm, root=env.root / "campaigns", wall_clock=lambda: now[0])
    rm.tick()
    rm.tick()
    assert st.view is not None and st.view.static.campaign == "example-r1"
    for _ in others:  # found slow for A: each other class measured, one an hour (the budget)
        now[0] += 3600
        rm.tick()
        rm.tick()
    assert measured_classes(slurm) == ["A", *sorted(others)]  # as the campaign says: cleared
    assert st.view.static.campaign == "example-r1"
    now[0] += 3600  # not yet: remeasure_retry_s after the confirmation
    rm.tick()
    assert len(slurm.submitted) == 1 + len(others)
    now[0] += 86400
    slurm.factor = 2.0  # still slow: measured again, nothing changes
    rm.tick()
    rm.tick()
    assert measured_classes(slurm)[len(others) + 1 :] == ["A"]
    assert st.view.static.campaign == "example-r1"
    now[0] += 86400
    slurm.factor = 1.0  # repaired: back to its first campaign's time
    with caplog.at_level(logging.INFO, logger="slurm_pal.advisor"):
        rm.tick()
        rm.tick()
    assert measured_classes(slurm)[len(others) + 1 :] == ["A", "A"]
    assert st.view is not None and st.view.static.campaign == "example-r2"
    assert Jobs(env).score(st, target, "A") == pytest.approx(old_score, rel=0.05)
    assert any("recovered for class A" in r.getMessage() for r in caplog.records)
    now[0] += 86400 * 2
    rm.tick()
    assert len(slurm.submitted) == 3 + len(others)


def test_a_candidate_is_measured_and_once_confirmed_kept_for_the_recovery_check(
    env: Env,
) -> None:
    st, _, seconds, bench = candidate(env)
    assert st.suspects.suspects() == []  # never steered by...
    slurm = FakeSlurm(seconds, bench, 2.0)
    rm = remeasurer(env, st, slurm)
    rm.tick()  # ... but measured
    rm.tick()  # and found 2x slow
    assert len(slurm.submitted) == 1
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example-r1"
        (closed,) = store.suspicions("example", cleared=True)
    assert str(closed["cleared_why"]).startswith("confirmed by re-measurement")
    assert st.suspects.candidates() == [] and st.suspects.suspects() == []


def test_a_cleared_candidate_is_not_measured_again_after_a_restart(env: Env) -> None:
    """A candidate found healthy has no suspicion row to close: the verdict gets a row of
    its own, so a restarted service neither lists it again nor spends a re-measure on it."""
    st, _, seconds, bench = candidate(env)
    slurm = FakeSlurm(seconds, bench, 1.02)
    rm = remeasurer(env, st, slurm)
    rm.tick()
    rm.tick()
    assert st.suspects.candidates() == []
    with Store(env.db) as store:
        (closed,) = store.suspicions("example", cleared=True)
    assert str(closed["cleared_why"]).startswith("cleared by re-measurement")
    restarted = env.state()
    assert restarted.suspects.candidates() == [] and restarted.suspects.suspects() == []
    later = Remeasurer(restarted, slurm, root=env.root / "campaigns",
                       wall_clock=lambda: 1.9e9 + 7200)  # fmt: skip
    later.tick()
    assert len(slurm.submitted) == 1  # the first re-measure only


def test_a_gpu_found_slow_for_one_class_is_measured_for_the_next_and_placed_by_it(
    env: Env,
) -> None:
    """The fault slows class B 1.5x too, with no runtime evidence for B: once A is confirmed
    the service measures B as well, and B's new score is placement's."""
    st, target, seconds, bench = suspect(env)
    others = other_classes(env, target, "A")
    b_seconds, b_bench = others["B"]
    old_b = Jobs(env).score(st, target, "B")
    others["B"] = (b_seconds * 1.5, b_bench)
    slurm = FakeSlurm(seconds, bench, factor=2.0, others=others)
    now = [1.9e9]
    rm = Remeasurer(st, slurm, root=env.root / "campaigns", wall_clock=lambda: now[0])
    rm.tick()
    rm.tick()
    now[0] += 3600  # the budget: one an hour here
    rm.tick()
    rm.tick()
    assert measured_classes(slurm) == ["A", "B"]
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example-r2"
        closed = {str(r["job_class"]): r for r in store.suspicions("example-r1", cleared=True)}
    assert closed["B"]["cause"] == "re-measure: slow for another class"
    assert str(closed["B"]["cleared_why"]).startswith("confirmed by re-measurement")
    assert Jobs(env).score(st, target, "B") > old_b * 1.3  # its new score, from the run
    # Under `avoid_above` (1.5) but 1.3x or more its campaign's: a fault, kept off as one.
    assert Jobs(env).score(st, target, "B") <= st.config.advisor.avoid_above
    assert st.view is not None
    cluster = st.view.static.cluster
    gpu = cluster.uuids.index(target)
    assert cluster.classes["B"].scores[gpu] > st.config.advisor.avoid_above
    assert cluster.classes["C"].scores[gpu] == pytest.approx(Jobs(env).score(st, target, "C"))


def test_an_idle_gpu_not_measured_for_a_week_is_measured_routinely(env: Env) -> None:
    """No suspect, no job evidence: the GPU measured longest ago (its campaign's date) is
    benchmarked for the first class; found 2x slow, it is kept off as a suspect confirmed
    would be, and its other classes are measured next; one measured is not again before
    ``remeasure_routine_s`` has passed."""
    st = env.state()
    advisor = replace(st.config.advisor, remeasure_routine_s=7 * 86400.0)
    st.config = replace(st.config, advisor=advisor)
    assert st.view is not None and st.suspects.suspects() == []
    target = min(idle_gpus(st.view))  # all measured at once: the first by id goes first
    with Store(env.db) as store:
        rows = store.measurements("example")
        (made,) = [c.created_at for c in store.campaigns() if c.id == "example"]
    mine = rows[(rows["uuid"] == target) & (rows["job_class"] == "A")]
    others = other_classes(env, target, "A")
    slurm = FakeSlurm(float(mine["duration"].median()), str(mine["benchmark"].iloc[0]), 2.0,
                      others=others)  # fmt: skip
    campaign_s = datetime.fromisoformat(made).timestamp()
    now = [campaign_s + 6 * 86400.0]  # under a week since the campaign: nothing
    rm = Remeasurer(st, slurm, root=env.root / "campaigns", wall_clock=lambda: now[0])
    rm.tick()
    assert slurm.submitted == []
    now[0] = campaign_s + 8 * 86400.0
    rm.tick()
    rm.tick()
    assert measured_classes(slurm) == ["A"]
    with Store(env.db) as store:
        assert store.active_campaign_id() == "example-r1"
        (closed,) = store.suspicions("example", cleared=True)
    assert closed["gpu"] == target and closed["cause"] == "re-measure: routine"
    assert str(closed["cleared_why"]).startswith("confirmed by re-measurement")
    assert st.view.static.cluster.classes["A"].scores[st.view.base.uuid_index[target]] > 1.5
    now[0] += 3600  # the budget: one an hour here; the GPU's other classes come first
    rm.tick()
    assert measured_classes(slurm) == ["A", "B"]
    assert slurm.submitted[-1][1] == slurm.submitted[0][1]  # the same device
    slurm.factor = 1.0
    for _ in range(len(others)):
        now[0] += 3600
        rm.tick()
        rm.tick()
    # then the next GPU measured longest ago, routinely: not the one measured this week
    assert measured_classes(slurm) == ["A", *sorted(others), "A"]
    (first, _), *_, (last, _) = slurm.submitted
    assert first.parts[-3].split("-")[1:3] != last.parts[-3].split("-")[1:3]
