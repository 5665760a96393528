"""Suspect GPUs in the advisor service: Epilog records in -> the detector -> placement keeps
the class the GPU slows off it from the next decision on, and only that class.

The service's pieces as in tests/test_advisor_state.py: a store with the example campaign,
labels.json (n01's GPUs numbered by Slurm unlike their devices), Slurm faked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.advisor.suspects import FLOOR_ABOVE
from slurm_pal.engine.jobdesc import JobDescription
from tests.helpers.advisor import Env, short_env

RUNTIME_S = 100.0


@pytest.fixture
def env() -> Iterator[Env]:
    with short_env("spal-sus-", policy="pm-first") as the_env:
        yield the_env


def with_mode(env: Env, mode: str) -> Env:
    env.config = replace(env.config, advisor=replace(env.config.advisor, suspicion=mode))
    return env


def job(app: str) -> JobDescription:
    return JobDescription.from_wire(
        {"user": "alice", "uid": 1000, "name": app, "tres_per_node": "gres:gpu:1",
         "comment": f"pal:app={app}"}
    )  # fmt: skip


def first_pick(st: AdvisorState, app: str) -> str:
    """The GPU a one-GPU job of ``app`` gets now (its reservation then given back)."""
    decision = st.decide(job(app), {})
    assert decision.action == "route" and decision.allocation is not None
    st.release_reservation(decision.token)  # type: ignore[arg-type]
    return decision.allocation.uuids[0]


class Jobs:
    """Finished jobs handed to the service as the hooks would: a decision bound to the job
    id in the store, then its Prolog and Epilog records."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.next_id = 1000
        self.place = {e.uuid: (e.node, e.slurm_index) for e in env.table.entries}
        self.now = 1.8e9

    def score(self, st: AdvisorState, uuid: str, job_class: str) -> float:
        static = st.view.static  # type: ignore[union-attr]
        spec = next(s for s in static.specs if s.uuid == uuid)
        return spec.scores[job_class]

    def run(self, st: AdvisorState, uuid: str, app: str, job_class: str, slow: float = 1.0) -> int:
        self.next_id += 1
        job_id = self.next_id
        node, index = self.place[uuid]
        runtime = RUNTIME_S * self.score(st, uuid, job_class) * slow
        with Store(self.env.db) as store:
            store.save_decision(f"t{job_id}", job(app).stored(), {"class": job_class},
                                state="bound", job_id=job_id)  # fmt: skip
        base = {"job_id": job_id, "node": node, "slurm_gpus": [index]}
        st.apply_record({**base, "record_id": f"{job_id}:{node}:prolog", "kind": "prolog",
                         "time": self.now})  # fmt: skip
        self.now += runtime
        st.apply_record({**base, "record_id": f"{job_id}:{node}:epilog", "kind": "epilog",
                         "time": self.now, "exit_code": 0})  # fmt: skip
        self.now += 10
        return job_id


def make_suspect(st: AdvisorState, jobs: Jobs, target: str, app: str, job_class: str) -> None:
    """Normal runs of ``app`` on four other GPUs, then two 2x slow ones on ``target``."""
    others = [u for u in jobs.place if u != target][:4]
    for uuid in others:
        jobs.run(st, uuid, app, job_class)
    for _ in range(2):
        jobs.run(st, target, app, job_class, slow=2.0)


def test_a_suspect_gpu_is_kept_off_its_class_from_the_next_decision(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")  # class A's first choice
    pick_d = first_pick(st, "pagerank")  # class D's: the same GPU here
    assert pick_d == target
    score_d = Jobs(env).score(st, target, "D")
    jobs = Jobs(env)
    with caplog.at_level(logging.INFO, logger="slurm_pal.advisor"):
        make_suspect(st, jobs, target, "resnet", "A")
    assert [(s.gpu, s.job_class) for s in st.suspects.suspects()] == [(target, "A")]
    line = next(r.getMessage() for r in caplog.records if "suspect for class A" in r.getMessage())
    assert target in line and "kept off it" in line and "evidence: job 1005" in line
    assert 'app="alice|resnet|' in line  # the user's values quoted
    # the next decision: class A elsewhere, class D as before
    assert first_pick(st, "resnet") != target
    assert first_pick(st, "pagerank") == pick_d
    cluster = st.cluster_snapshot()
    assert cluster is not None
    gpu = cluster.uuid_index[target]
    assert cluster.classes["A"].scores[gpu] >= env.config.advisor.avoid_above + FLOOR_ABOVE
    assert cluster.classes["D"].scores[gpu] == pytest.approx(score_d)
    # survives the periodic refresh and a config reload
    st.refresh()
    assert first_pick(st, "resnet") != target
    st.set_config(st.config)
    st.reload()
    st.refresh()
    assert first_pick(st, "resnet") != target
    assert first_pick(st, "pagerank") == pick_d


def test_admins_see_it_in_stats_the_store_and_after_a_restart(env: Env) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")
    stats = st.suspects.snapshot()
    assert stats["suspicion"] == "steer"
    (row,) = stats["suspect_gpus"]  # type: ignore[misc]
    assert row["gpu"] == target and set(row["classes"]) == {"A"}
    assert row["classes"]["A"]["cause"] == "runtime" and row["classes"]["A"]["runs"] == 2
    assert st.suspects.per_class(["A", "B", "C", "D"]) == {"A": 1, "B": 0, "C": 0, "D": 0}
    with Store(env.db) as store:
        (kept,) = store.suspicions("example")
    assert kept["gpu"] == target and kept["job_class"] == "A" and kept["cleared_s"] is None
    assert [e["job_id"] for e in kept["evidence"]] == ["1005", "1006"]  # type: ignore[union-attr]
    # a restart warms the detector from the stored records: suspect at once, same row
    again = env.state()
    assert [(s.gpu, s.job_class) for s in again.suspects.suspects()] == [(target, "A")]
    assert first_pick(again, "resnet") != target
    assert again.suspects.snapshot()["suspicion_jobs_judged"] == 6
    with Store(env.db) as store:
        assert len(store.suspicions("example", cleared=True)) == 1


def test_report_mode_tells_but_does_not_steer(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    st = with_mode(env, "report").state()
    target = first_pick(st, "resnet")
    with caplog.at_level(logging.WARNING, logger="slurm_pal.advisor"):
        make_suspect(st, Jobs(env), target, "resnet", "A")
    assert [(s.gpu, s.job_class) for s in st.suspects.suspects()] == [(target, "A")]
    assert any("report only" in r.getMessage() for r in caplog.records)
    assert first_pick(st, "resnet") == target


def test_off_judges_nothing_and_closes_what_the_store_held(env: Env) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")
    off = with_mode(env, "off").state()
    assert off.suspects.suspects() == [] and first_pick(off, "resnet") == target
    assert off.suspects.snapshot()["suspect_gpus"] == []
    with Store(env.db) as store:
        assert store.suspicions("example") == []
        (closed,) = store.suspicions("example", cleared=True)
    assert closed["cleared_why"] == "suspicion off"


def test_a_record_carrying_a_clock_fault_makes_the_gpu_suspect_at_once(env: Env) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    jobs = Jobs(env)
    node, index = jobs.place[target]
    jobs.next_id += 1
    job_id = jobs.next_id
    with Store(env.db) as store:
        store.save_decision("tsig", job("resnet").stored(), {"class": "A"}, job_id=job_id)
    base = {"job_id": job_id, "node": node, "slurm_gpus": [index]}
    st.apply_record({**base, "record_id": "s:p", "kind": "prolog", "time": 1.0})
    signals = {str(index): {"clock_events": {"hw_slowdown": 0.5, "sw_power_cap": 0.2}}}
    st.apply_record({**base, "record_id": "s:e", "kind": "epilog", "time": 50.0,
                     "gpu_signals": signals})  # fmt: skip
    found = {(s.gpu, s.job_class) for s in st.suspects.suspects()}
    assert (target, "A") in found and len({g for g, _ in found}) == 1
    assert first_pick(st, "resnet") != target


def signal_run(st: AdvisorState, jobs: Jobs, uuid: str, readings: dict) -> None:
    """A class-A job on ``uuid`` whose Epilog carries these NVML readings (runtime normal)."""
    jobs.next_id += 1
    job_id = jobs.next_id
    node, index = jobs.place[uuid]
    with Store(jobs.env.db) as store:
        store.save_decision(f"t{job_id}", job("resnet").stored(), {"class": "A"}, job_id=job_id)
    base = {"job_id": job_id, "node": node, "slurm_gpus": [index]}
    st.apply_record({**base, "record_id": f"{job_id}:p", "kind": "prolog", "time": jobs.now})
    jobs.now += RUNTIME_S
    st.apply_record({**base, "record_id": f"{job_id}:e", "kind": "epilog", "time": jobs.now,
                     "exit_code": 0, "gpu_signals": {str(index): readings}})  # fmt: skip


def test_a_busy_clock_below_the_models_other_gpus_makes_it_suspect(env: Env) -> None:
    """What the hooks send (busy SM clock in MHz): the service compares it with the same
    model's other GPUs; power capping excuses a low clock, hardware slowdown does not."""
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    jobs = Jobs(env)
    others = [u for u in jobs.place if u != target][:4]
    uncapped = {"clock_events": {"sw_power_cap": 0.1}, "event_samples": 20,
                "sm_clock_max_mhz": 1530.0}  # fmt: skip
    for n, uuid in enumerate(others):
        signal_run(st, jobs, uuid, {**uncapped, "sm_clock_mhz": 1530.0 - 15 * n})
    capped = {"clock_events": {"sw_power_cap": 0.9}, "event_samples": 20, "sm_clock_mhz": 900.0,
              "sm_clock_max_mhz": 1530.0}  # fmt: skip
    signal_run(st, jobs, target, capped)
    assert st.suspects.suspects() == []  # a power-capped low clock accuses no one
    signal_run(st, jobs, target, {**uncapped, "sm_clock_mhz": 900.0})
    (found,) = {s.gpu for s in st.suspects.suspects()}
    assert found == target and "not power capped" in st.suspects.suspects()[0].cause
    assert first_pick(st, "resnet") != target


def test_a_pending_row_remap_makes_the_gpu_suspect_and_old_records_stay_valid(env: Env) -> None:
    st = with_mode(env, "report").state()
    jobs = Jobs(env)
    one, two = list(jobs.place)[:2]
    signal_run(st, jobs, one, {"clock_events": {"sw_power_cap": 1.0}, "sm_clock_ratio": 0.99})
    signal_run(st, jobs, two, {"clock_events": {}, "memory_faults": ["row_remap_pending"]})
    bad = {"clock_events": {"hw_slowdown": 7}, "sm_clock_mhz": "fast"}  # malformed: left out
    signal_run(st, jobs, one, bad)
    assert [(s.gpu, s.cause) for s in st.suspects.suspects()][:1] == [
        (two, "signal: row remapping pending (reset the GPU to apply it)")
    ]
    assert {s.gpu for s in st.suspects.suspects()} == {two}


def test_a_pcie_link_trained_down_makes_the_gpu_suspect(env: Env) -> None:
    st = with_mode(env, "report").state()
    jobs = Jobs(env)
    one = next(iter(jobs.place))
    signal_run(st, jobs, one, {"link_faults": ["pcie_width_degraded"], "pcie_width": [8, 16]})
    found = st.suspects.suspects()
    assert {s.gpu for s in found} == {one}
    assert all("PCIe link narrower" in s.cause for s in found)


def test_a_short_jobs_epilog_before_its_decision_is_bound(env: Env) -> None:
    """The store binds a decision to its job id at a later refresh; the decide path's memory
    and the job's admin comment in the last read stand in for it."""
    from tests.helpers.advisor import FakeJob

    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    jobs = Jobs(env)
    for uuid in [u for u in jobs.place if u != target][:4]:
        jobs.run(st, uuid, "resnet", "A")
    node, index = jobs.place[target]
    for n in range(2):
        decision = st.decide(job("resnet"), {})
        comment = str(decision.set_fields["admin_comment"])
        st.release_reservation(decision.token)  # type: ignore[arg-type]
        job_id = 5000 + n
        env.slurm.jobs.append(FakeJob(job_id, "COMPLETING", admin_comment=comment))
        st.refresh()
        base = {"job_id": job_id, "node": node, "slurm_gpus": [index]}
        runtime = 2 * RUNTIME_S * jobs.score(st, target, "A")
        st.apply_record({**base, "record_id": f"{job_id}:p", "kind": "prolog", "time": 1e9})
        st.apply_record({**base, "record_id": f"{job_id}:e", "kind": "epilog",
                         "time": 1e9 + runtime})  # fmt: skip
    assert [(s.gpu, s.job_class) for s in st.suspects.suspects()] == [(target, "A")]


def test_the_metrics_count_suspect_gpus_per_class(env: Env) -> None:
    from types import SimpleNamespace

    from slurm_pal.advisor.counters import Counters
    from slurm_pal.advisor.metrics import AdvisorCollector

    st = with_mode(env, "report").state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")
    server = SimpleNamespace(
        poll_fail_opens=lambda: 0, counters=Counters(), state=st, spool_dir=env.root / "spool"
    )
    families = {f.name: f for f in AdvisorCollector(server).collect()}  # type: ignore[arg-type]
    samples = {s.labels["class"]: s.value for s in families["slurm_pal_suspect_gpus"].samples}
    assert samples == {"A": 1, "B": 0, "C": 0, "D": 0}


def test_serve_stats_shows_a_table_of_suspect_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import slurm_pal.cli.serve as serve_cli
    from slurm_pal.cli.main import app

    answer = {
        "v": 1, "ok": True, "decide_total": 3, "suspicion": "steer",
        "suspect_gpus": [{"gpu": "GPU-x", "where": "n03:0", "classes": {"A": {
            "since_s": 1.8e9, "cause": "runtime", "slowdown": 2.0, "runs": 2,
            "evidence": ["1005", "1006"]}}}],
    }  # fmt: skip
    monkeypatch.setattr(serve_cli, "_ask", lambda *args, **kwargs: dict(answer))
    out = CliRunner().invoke(app, ["serve", "stats"]).output
    assert "suspect GPUs" in out and "GPU-x" in out and "n03:0" in out
    assert "2027-01-15" in out and "2.00x" in out and "1005,1006" in out
    assert "decide_total" in out


def test_a_warm_up_that_fails_starts_cold(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")

    def broken(*args: object, **kwargs: object) -> list[dict[str, object]]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Store, "job_records", broken)
    with caplog.at_level(logging.ERROR, logger="slurm_pal.advisor"):
        again = env.state()
    assert "suspicion warm-up failed" in caplog.text
    assert again.suspects.suspects() == [] and first_pick(again, "resnet") == target


def test_a_re_measure_increment_is_taken_without_replaying_the_store(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = with_mode(env, "steer").state()
    target = first_pick(st, "resnet")
    make_suspect(st, Jobs(env), target, "resnet", "A")
    book = st.suspects
    assert [(s.gpu, s.job_class) for s in book.suspects()] == [(target, "A")]
    static = st.view.static  # type: ignore[union-attr]
    # The increment a confirmed re-measurement makes: the GPU's class-A score is the 2x
    # measured; every other score as it was.
    specs = [
        replace(s, scores={**s.scores, "A": s.scores["A"] * 2.0}) if s.uuid == target else s
        for s in static.specs
    ]

    read = []
    original = Store.job_records

    def counted(self: Store, *args: object, **kwargs: object) -> list[dict[str, object]]:
        read.append(args)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "job_records", counted)
    campaign = book._campaign
    assert campaign is not None
    book.fit(env.db, f"{campaign}-r1", specs, env.table)
    assert book.suspects() == []  # its score explains the slow runs now
    assert book._campaign == f"{campaign}-r1"
    assert (
        book._base[target]["A"]
        == 2.0 * static.specs[[s.uuid for s in static.specs].index(target)].scores["A"]
    )
