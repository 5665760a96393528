"""The wait rule's runtimes in the advisor service: Epilog records in -> the engine's runtime
model -> packed-pm weighs a job's wait against what the site's finished jobs ran, as the
simulator's Slurm mode does; a reload keeps it, a restart warms it from the store.

The service's pieces as in tests/test_advisor_state.py: a store with the example campaign,
labels.json, Slurm faked.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.runtimes import ended_job, ended_jobs
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.runtimes import EndedJob
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.jobdesc import JobDescription
from tests.helpers.advisor import Env, short_env

HOUR = 3600.0


@pytest.fixture
def env() -> Iterator[Env]:
    with short_env("spal-rt-", policy="packed-pm") as the_env:
        yield the_env


def weighed(engine: AdvisorEngine, gpus: int, limit_s: float | None) -> float:
    """What packed-pm weighs a job of ``gpus`` GPUs with this limit as running."""
    request = PlacementRequest(job_id="1", job_class="A", gpus=gpus, time_limit_s=limit_s)
    return engine.policy._expected_runtime_s(request)  # type: ignore[attr-defined]


def wire(gpus: int, minutes: int | None) -> dict[str, object]:
    job: dict[str, object] = {"user": "alice", "uid": 1000, "name": "train",
                              "tres_per_node": f"gres:gpu:{gpus}"}  # fmt: skip
    if minutes is not None:
        job["time_limit"] = minutes
    return JobDescription.from_wire(job).stored()


class Ends:
    """Finished jobs handed to the service as the hooks would: a decision bound to the job
    id in the store, then each node's Prolog and Epilog records."""

    def __init__(self) -> None:
        self.next_id = 5000
        self.now = 1.8e9

    def run(
        self,
        st: AdvisorState,
        runtime_s: float,
        *,
        minutes: int | None,
        gpus: dict[str, list[int]] | None = None,
        exit_code: int = 0,
        bound: bool = True,
    ) -> int:
        self.next_id += 1
        job_id = self.next_id
        gpus = gpus or {"n02": [0]}
        if bound:
            per_node = len(next(iter(gpus.values())))
            with Store(st.store_path) as store:
                store.save_decision(f"t{job_id}", wire(per_node, minutes), {"class": "A"},
                                    state="bound", job_id=job_id)  # fmt: skip
        for node, indices in gpus.items():
            st.apply_record({"job_id": job_id, "node": node, "slurm_gpus": indices,
                             "record_id": f"{job_id}:{node}:prolog", "kind": "prolog",
                             "time": self.now})  # fmt: skip
        self.now += runtime_s
        for node, indices in gpus.items():
            st.apply_record({"job_id": job_id, "node": node, "slurm_gpus": indices,
                             "record_id": f"{job_id}:{node}:epilog", "kind": "epilog",
                             "time": self.now, "exit_code": exit_code})  # fmt: skip
        self.now += 10
        return job_id


def teach(st: AdvisorState, ends: Ends) -> None:
    """20 two-hour-limit jobs that used a tenth of it (three of them killed or failed: they
    count), 20 unlimited two-node jobs of 4 GPUs that ran 20 h."""
    for i in range(20):
        ends.run(st, 0.2 * HOUR, minutes=120, exit_code=15 if i < 3 else 0)
    for _ in range(20):
        ends.run(st, 20 * HOUR, minutes=None, gpus={"n03": [0, 1], "n04": [2, 3]})


def test_records_in_the_policy_weighs_a_wait_at_the_learned_runtime(env: Env) -> None:
    st = env.state()
    # nothing ended yet: the policy's fixed rules (half the limit; an hour)
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(HOUR)
    assert weighed(st.engine, 4, math.inf) == pytest.approx(HOUR)
    ends = Ends()
    for _ in range(19):
        ends.run(st, 0.2 * HOUR, minutes=120)
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(HOUR)  # 19: too few to say
    teach(st, ends)
    # the site's limited jobs use a tenth of their limit; its unlimited 4-GPU jobs run 20 h
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(0.2 * HOUR)
    assert weighed(st.engine, 1, 10 * HOUR) == pytest.approx(HOUR)
    assert weighed(st.engine, 4, math.inf) == pytest.approx(20 * HOUR)
    assert weighed(st.engine, 4, None) == pytest.approx(20 * HOUR)  # no limit given
    assert st.engine.runtimes.learned()["unlimited 2-8 GPUs"] == {"median_s": 20 * HOUR,
                                                                  "jobs": 20}  # fmt: skip
    # each job once: a record sent again, or another node's Epilog, teaches nothing more
    stats = st.runtimes.snapshot()
    assert stats["runtime_jobs_learned"] == 59
    assert stats["runtimes"]["limited"] == {"limit_share": pytest.approx(0.1), "jobs": 39}  # type: ignore[index]


def test_a_job_without_a_decision_teaches_nothing_until_one_is_found(env: Env) -> None:
    st = env.state()
    ends = Ends()
    ends.run(st, 0.2 * HOUR, minutes=120, bound=False)
    assert st.runtimes.snapshot()["runtime_jobs_learned"] == 0


def test_a_reload_keeps_what_was_learned_and_a_restart_warms_it_from_the_store(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    st = env.state()
    teach(st, Ends())
    old = st.engine
    st.set_config(st.config)  # a reload builds a new engine
    st.reload()
    assert st.engine is not old
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(0.2 * HOUR)
    assert weighed(st.engine, 4, math.inf) == pytest.approx(20 * HOUR)
    with caplog.at_level(logging.INFO, logger="slurm_pal.advisor"):
        again = env.state()  # a restart: the store's records over suspicion_days
    assert "runtime model: warmed from 40 finished job(s)" in caplog.text
    assert "limit share 0.10 (at typical limits 2 h: 0.10)" in caplog.text
    assert weighed(again.engine, 1, 2 * HOUR) == pytest.approx(0.2 * HOUR)
    assert weighed(again.engine, 4, math.inf) == pytest.approx(20 * HOUR)
    assert again.runtimes.snapshot()["runtime_jobs_learned"] == 40
    # a job learned in the warm-up is not learned again (its records from another node)
    Ends().run(again, 0.2 * HOUR, minutes=120, gpus={"n01": [0]}, bound=False)  # job 5001
    assert again.runtimes.snapshot()["runtime_jobs_learned"] == 40
    later = Ends()
    later.next_id = 6000
    later.run(again, 0.2 * HOUR, minutes=120)
    assert again.runtimes.snapshot()["runtime_jobs_learned"] == 41
    env.config = replace(env.config, advisor=replace(env.config.advisor, suspicion_days=0))
    cold = env.state()
    assert weighed(cold.engine, 1, 2 * HOUR) == pytest.approx(HOUR)


def test_a_warm_up_that_fails_starts_cold_and_learns_from_the_next_ends(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    teach(env.state(), Ends())

    def broken(*args: object, **kwargs: object) -> list[dict[str, object]]:
        raise RuntimeError("disk on fire")

    with monkeypatch.context() as m, caplog.at_level(logging.ERROR, logger="slurm_pal.advisor"):
        m.setattr(Store, "decisions_for_jobs", broken)
        st = env.state()
    assert "runtime model warm-up failed" in caplog.text
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(HOUR)
    st.reload()  # tried again
    assert weighed(st.engine, 1, 2 * HOUR) == pytest.approx(0.2 * HOUR)


def test_what_one_finished_job_ran() -> None:
    decision = {"job": wire(2, 4294967295)}  # UNLIMITED
    records = [
        {"job_id": 7, "kind": "prolog", "node": "n01", "slurm_gpus": [0, 1], "time": 100.0},
        {"job_id": 7, "kind": "prolog", "node": "n02", "slurm_gpus": [0, 1], "time": 101.0},
        {"job_id": 7, "kind": "epilog", "node": "n02", "slurm_gpus": [0, 1], "time": 400.0},
        {"job_id": 7, "kind": "epilog", "node": "n01", "slurm_gpus": [0, 1], "time": 401.0,
         "exit_code": 9},
    ]  # fmt: skip
    assert ended_job(records, decision) == EndedJob(4, math.inf, 301.0)
    assert ended_job(records, {"job": wire(1, 90)}) == EndedJob(4, 5400.0, 301.0)
    assert ended_job(records, {"job": wire(1, None)}) == EndedJob(4, None, 301.0)
    assert ended_job(records[:2], decision) is None  # still running
    assert ended_job(records, None) is None  # no decision: its limit is unknown
    assert ended_job(records, {"job": {"user": 5}}) is None  # unreadable
    no_gpus = [{**r, "slurm_gpus": []} for r in records]
    assert ended_job(no_gpus, decision) is None
    no_gpus[0]["uuids"] = ["GPU-a", "GPU-b", "GPU-c"]  # NVML's, where Slurm named none
    assert ended_job(no_gpus, decision) == EndedJob(3, math.inf, 301.0)
    other = [{**r, "job_id": 8, "time": float(r["time"]) - 50} for r in records]  # type: ignore[arg-type]
    both = ended_jobs(records + other, [{"job_id": 7, **decision}, {"job_id": 8, **decision}])
    assert [job_id for job_id, _ in both] == [8, 7]  # in order of their end


def test_serve_stats_and_the_metrics_show_what_was_learned(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import slurm_pal.cli.serve as serve_cli
    from slurm_pal.advisor.counters import Counters
    from slurm_pal.advisor.metrics import AdvisorCollector
    from slurm_pal.cli.main import app

    st = env.state()
    teach(st, Ends())
    server = SimpleNamespace(
        poll_fail_opens=lambda: 0, counters=Counters(), state=st, spool_dir=env.root / "spool"
    )
    families = {f.name: f for f in AdvisorCollector(server).collect()}  # type: ignore[arg-type]
    (share,) = families["slurm_pal_runtime_limit_share"].samples
    assert share.value == pytest.approx(0.1)
    medians = {s.labels["size"]: s.value
               for s in families["slurm_pal_runtime_unlimited_median_seconds"].samples}  # fmt: skip
    assert medians["2-8 GPUs"] == pytest.approx(20 * HOUR) and math.isnan(medians["1 GPU"])
    jobs = {s.labels["kind"]: s.value for s in families["slurm_pal_runtime_jobs"].samples}
    assert jobs["limited"] == 20 and jobs["unlimited any size"] == 20
    (near,) = families["slurm_pal_runtime_limit_share_near"].samples
    assert near.labels == {"limit_seconds": "7200"} and near.value == pytest.approx(0.1)

    answer = {"v": 1, "ok": True, "decide_total": 3, **st.runtimes.snapshot()}
    monkeypatch.setattr(serve_cli, "_ask", lambda *args, **kwargs: dict(answer))
    out = CliRunner().invoke(app, ["serve", "stats"]).output
    assert "learned runtimes" in out and "10% of the limit" in out and "20.00 h" in out
    assert "limited, 2 h limit" in out and "nearest limits" in out
    assert "runtime_jobs_learned" in out and "decide_total" in out
