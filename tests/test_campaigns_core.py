"""The pure campaign checks: records vs plan, progress, and campaign diffs."""

from __future__ import annotations

import pandas as pd
import pytest

from slurm_pal.core.campaigns import (
    CSV_COLUMNS,
    PlannedGpu,
    RecordError,
    RunClockEvents,
    RunRecord,
    check_campaign,
    diff_campaigns,
    gpus_from_hostlist,
    latest_records,
    measurement_rows,
    node_unavailable,
    progress_counts,
    summarize_clock_events,
    task_progress,
    waiting_for_unavailable_nodes,
)

PLAN = [PlannedGpu("n1", 0), PlannedGpu("n1", 1), PlannedGpu("n2", 0)]


def rec(node: str, idx: int, cls: str, rep: int, dur: float | None = 1.0, **kw) -> RunRecord:
    status = kw.pop("status", "ok" if dur is not None else "failed")
    return RunRecord(
        campaign="c1",
        status=status,
        node=node,
        gpu_index=idx,
        job_class=cls,
        repeat=rep,
        uuid=kw.pop("uuid", f"GPU-{node}-{idx}"),
        duration_s=dur,
        **kw,
    )


def full(durations: dict[tuple[str, int], float], classes=("A", "B"), repeats=2) -> list:
    return [
        rec(n, i, c, r, durations.get((n, i), 1.0))
        for n, i in [g.key for g in PLAN]
        for c in classes
        for r in range(repeats)
    ]


def test_hostlist_plan_expands_nodes_and_indices() -> None:
    gpus = gpus_from_hostlist("gpu[01-02],x7", 2)
    assert [g.key for g in gpus] == [
        ("gpu01", 0),
        ("gpu01", 1),
        ("gpu02", 0),
        ("gpu02", 1),
        ("x7", 0),
        ("x7", 1),
    ]
    with pytest.raises(ValueError, match="at least 1"):
        gpus_from_hostlist("a", 0)
    assert [g.key for g in gpus_from_hostlist("a,a", 1)] == [("a", 0)]


def test_record_validation_names_the_field() -> None:
    good = {
        "schema": 1,
        "campaign": "c",
        "status": "ok",
        "node": "n",
        "gpu_index": 0,
        "job_class": "A",
        "repeat": 0,
        "uuid": "GPU-1",
        "duration_s": 2.5,
        "notes": ["x"],
    }
    r = RunRecord.from_dict(good)
    assert (r.duration_s, r.notes) == (2.5, ("x",))
    for change, message in [
        ({"schema": 2}, "schema"),
        ({"duration_s": None}, "duration_s"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"gpu_index": "0"}, "gpu_index"),
        ({"status": "meh"}, "status"),
        ({"uuid": ""}, "uuid"),
        ({"power_w": "hot"}, "power_w"),
    ]:
        with pytest.raises(RecordError, match=message):
            RunRecord.from_dict(good | change)
    failed = RunRecord.from_dict(good | {"status": "failed", "duration_s": None})
    assert not failed.ok


def test_complete_campaign_has_no_findings() -> None:
    check = check_campaign(PLAN, ["A", "B"], 2, full({}))
    assert check.complete
    assert len(check.ok_runs) == 12
    assert not (check.missing or check.failures or check.disagreements or check.short)


def test_missing_failed_short_and_unplanned() -> None:
    records = [r for r in full({}) if r.key != ("n2", 0)]  # n2:0 never ran
    records = [r for r in records if not (r.key == ("n1", 1) and r.job_class == "B")]
    records.append(rec("n1", 1, "B", 0, None, exit_code=3, reason="benchmark exited with code 3"))
    records.append(rec("n9", 0, "A", 0))  # not planned
    records.append(rec("n1", 0, "Z", 0))  # class not planned
    records = [r for r in records if not (r.key == ("n1", 0) and r.job_class == "A" and r.repeat)]
    check = check_campaign(PLAN, ["A", "B"], 2, records)
    assert not check.complete
    assert check.missing_gpus == (("n1", 1), ("n2", 0))
    assert [(m.node, m.gpu_index, m.job_class, m.failed_runs) for m in check.missing] == [
        ("n1", 1, "B", 1),
        ("n2", 0, "A", 0),
        ("n2", 0, "B", 0),
    ]
    assert [(f.node, f.gpu_index, f.job_class, f.exit_code) for f in check.failures] == [
        ("n1", 1, "B", 3)
    ]
    assert check.short == (("n1", 0, "A", 1),)
    assert sorted((r.node, r.job_class) for r in check.unplanned) == [("n1", "Z"), ("n9", "A")]


def test_fewer_runs_than_planned_is_incomplete() -> None:
    records = [r for r in full({}) if not (r.key == ("n2", 0) and r.repeat == 1)]
    check = check_campaign(PLAN, ["A", "B"], 2, records)
    assert check.short == (("n2", 0, "A", 1), ("n2", 0, "B", 1))
    assert not check.missing and not check.failures
    assert not check.complete


def test_rerun_record_replaces_the_failure() -> None:
    records = full({})
    failed = rec("n1", 0, "A", 1, None, finished_at=10.0, reason="Xid 79")
    fixed = rec("n1", 0, "A", 1, 1.0, finished_at=20.0)
    check = check_campaign(PLAN, ["A", "B"], 2, [*records, failed])
    assert not check.complete  # the later failure wins over the first ok run (no finished_at)
    check = check_campaign(PLAN, ["A", "B"], 2, [*records, failed, fixed])
    assert check.complete
    assert len(check.ok_runs) == 12  # no duplicate rows
    assert len(latest_records([failed, fixed])) == 1


def test_disagreeing_repeats_are_reported_with_clock_range() -> None:
    records = [r for r in full({}) if not (r.key == ("n2", 0) and r.job_class == "A")]
    records += [
        rec("n2", 0, "A", 0, 1.00, sm_clock_mhz=1530.0),
        rec("n2", 0, "A", 1, 1.12, sm_clock_mhz=1215.0),
    ]
    check = check_campaign(PLAN, ["A", "B"], 2, records, tolerance=0.05)
    assert check.complete  # a finding, not a blocker
    [d] = check.disagreements
    assert (d.node, d.gpu_index, d.job_class, d.uuid) == ("n2", 0, "A", "GPU-n2-0")
    assert d.ratio == pytest.approx(1.12)
    assert d.sm_clock_range == (1215.0, 1530.0)
    assert check_campaign(PLAN, ["A", "B"], 2, records, tolerance=0.15).disagreements == ()
    with pytest.raises(ValueError, match="tolerance"):
        check_campaign(PLAN, ["A"], 1, records, tolerance=-1)


def test_uuid_conflict_blocks() -> None:
    records = full({})
    records[0] = rec("n1", 0, "A", 0, uuid="GPU-other")
    check = check_campaign(PLAN, ["A", "B"], 2, records)
    assert check.uuid_conflicts == (("n1", 0, ("GPU-n1-0", "GPU-other")),)
    assert not check.complete


def test_measurement_rows_are_the_campaign_csv_format() -> None:
    runs = [rec("n2", 0, "A", 1, 2.0), rec("n1", 0, "A", 0, 1.5), rec("n1", 1, "A", 0, None)]
    frame = measurement_rows(runs, "v100")
    assert tuple(frame.columns) == CSV_COLUMNS
    assert frame[["node", "duration_s"]].values.tolist() == [["n1", 1.5], ["n2", 2.0]]
    assert set(frame["gpu_model"]) == {"v100"}


def test_task_progress_states() -> None:
    records = full({})
    records = [r for r in records if r.key != ("n2", 0)]
    records = [r for r in records if not (r.key == ("n1", 1) and r.job_class == "B")]
    records.append(rec("n1", 1, "B", 0, None))
    queued = {("n2", 0): ("PENDING", "ReqNodeNotAvail")}
    tasks = task_progress(PLAN, ["A", "B"], 2, records, queued, submitted=[("n2", 0)])
    assert [(t.node, t.gpu_index, t.state, t.ok_runs) for t in tasks] == [
        ("n1", 0, "done", 4),
        ("n1", 1, "failed", 2),
        ("n2", 0, "pending", 0),
    ]
    assert tasks[2].slurm_reason == "ReqNodeNotAvail"
    assert waiting_for_unavailable_nodes(tasks)
    # sinfo outranks a stale reason: a node just resumed is idle (or idle* until it answers).
    assert waiting_for_unavailable_nodes(tasks, {"n2": "drained"})
    assert not waiting_for_unavailable_nodes(tasks, {"n2": "idle"})
    assert not waiting_for_unavailable_nodes(tasks, {"n2": "idle*"})
    assert waiting_for_unavailable_nodes(tasks, {})  # sinfo does not know it: unavailable
    busy = {("n2", 0): ("PENDING", "Resources")}
    assert not waiting_for_unavailable_nodes(task_progress(PLAN, ["A", "B"], 2, records, busy))
    # A task requeued from a node that died: reason None for a while, but the node is down*.
    lost = task_progress(PLAN, ["A", "B"], 2, records, {("n2", 0): ("PENDING", "None")})
    assert not waiting_for_unavailable_nodes(lost)
    assert waiting_for_unavailable_nodes(lost, {"n2": "down*"})
    running = task_progress(PLAN, ["A", "B"], 2, records, {("n2", 0): ("RUNNING", "None")})
    assert not waiting_for_unavailable_nodes(running, {"n2": "draining"})
    assert not waiting_for_unavailable_nodes(task_progress(PLAN, ["A", "B"], 2, records, {}))
    counts = progress_counts(tasks)
    assert (counts["done"], counts["failed"], counts["pending"]) == (1, 1, 1)
    tasks = task_progress(PLAN, ["A", "B"], 2, records, {}, submitted=[("n2", 0)])
    assert tasks[2].state == "incomplete"
    assert task_progress(PLAN, ["A", "B"], 2, records, {})[2].state == "not submitted"


def _scores(rows: list[tuple[str, str, str, int, int, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(
        rows, columns=["uuid", "job_class", "node", "gpu_index", "bin", "pm_score"]
    )
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    return frame


def test_diff_bins_outliers_labels_and_restarts() -> None:
    old = _scores(
        [
            ("g1", "A", "n1", 0, 0, 1.0),
            ("g2", "A", "n1", 1, 1, 1.1),
            ("g3", "A", "n2", 0, -1, 2.0),
            ("g4", "A", "n2", 1, 0, 1.0),
        ]
    )
    new = _scores(
        [
            ("g1", "A", "n1", 0, 0, 1.0),
            ("g2", "A", "n1", 1, -1, 1.9),  # became an outlier
            ("g3", "A", "n2", 0, 1, 1.1),  # repaired
            ("g5", "A", "n3", 0, 0, 1.0),  # new GPU
        ]
    )
    old_labels = {"g1": "v-a0", "g2": "v-a1", "g3": "v-ax0", "g4": "v-a0"}
    new_labels = {"g1": "v-a0", "g2": "v-ax0", "g3": "v-a1", "g5": "v-a0"}
    d = diff_campaigns(
        "old",
        "new",
        old,
        new,
        old_labels,
        new_labels,
        {"v-a0": {"A": 1.0}, "v-a1": {"A": 1.1}},
        {"v-a0": {"A": 1.0}, "v-a1": {"A": 1.08}},
    )
    assert [(c.uuid, c.old_bin, c.new_bin) for c in d.bin_changes] == [
        ("g2", "1", "outlier"),
        ("g3", "outlier", "1"),
    ]
    assert [c.uuid for c in d.new_outliers] == ["g2"]
    assert [c.uuid for c in d.cleared_outliers] == ["g3"]
    assert (d.only_old, d.only_new) == (("g4",), ("g5",))
    assert [(c.uuid, c.old_label, c.new_label) for c in d.label_changes] == [
        ("g2", "v-a1", "v-ax0"),
        ("g3", "v-ax0", "v-a1"),
        ("g4", "v-a0", None),
        ("g5", None, "v-a0"),
    ]
    assert d.restart_nodes == ("n1", "n2", "n3")
    assert d.label_score_changes == (("v-a1", "A", 1.1, 1.08),)
    out = d.to_dict()
    assert out["restart_nodes"] == ["n1", "n2", "n3"]
    assert out["new_outliers"][0]["old_score"] == 1.1


def test_diff_of_a_campaign_with_itself_is_empty() -> None:
    frame = _scores([("g1", "A", "n1", 0, 0, 1.0), ("g2", "A", "n1", 1, 1, 1.1)])
    labels = {"g1": "v-a0", "g2": "v-a1"}
    d = diff_campaigns("x", "x", frame, frame, labels, labels)
    assert not (d.bin_changes or d.new_outliers or d.label_changes or d.restart_nodes)


@pytest.mark.parametrize(
    ("node_state", "unavailable"),
    [
        ("idle", False),
        ("mixed", False),
        ("allocated", False),
        ("idle*", False),
        ("completing", False),
        ("drained", True),
        ("draining", True),
        ("down*", True),
        ("fail", True),
        ("maint", True),
        ("inval", True),
    ],
)
def test_node_unavailable(node_state: str, unavailable: bool) -> None:
    assert node_unavailable(node_state) is unavailable


def test_gpus_without_an_nvml_uuid_are_flagged() -> None:
    records = full({})
    records = [
        rec(r.node, r.gpu_index, r.job_class, r.repeat, uuid=f"{r.node}/gpu{r.gpu_index}",
            uuid_source="assignment")
        if r.key == ("n2", 0) else r
        for r in records
    ]  # fmt: skip
    check = check_campaign(PLAN, ["A", "B"], 2, records)
    assert check.complete
    assert check.location_ids == (("n2", 0, "n2/gpu0"),)
    assert check.to_dict()["location_ids"] == [{"node": "n2", "gpu_index": 0, "uuid": "n2/gpu0"}]
    assert check_campaign(PLAN, ["A", "B"], 2, full({})).location_ids == ()


def test_thermal_and_hardware_slowdowns_are_findings_power_capping_is_not() -> None:
    capped = (("sw_power_cap", 1.0),)
    runs = full({}, classes=("A",), repeats=2)
    runs = [
        rec(r.node, r.gpu_index, r.job_class, r.repeat, clock_events=capped)
        if (r.node, r.gpu_index) != ("n2", 0)
        else rec(
            r.node,
            r.gpu_index,
            r.job_class,
            r.repeat,
            clock_events=(("hw_thermal", 0.25), ("sw_power_cap", 1.0), ("sw_thermal", 0.5))
            if r.repeat == 1
            else capped,
        )
        for r in runs
    ]
    check = check_campaign(PLAN, ["A"], 2, runs)
    assert check.complete  # a finding, not missing data
    (slow,) = check.slowdowns
    assert (slow.node, slow.gpu_index, slow.events) == ("n2", 0, ("hw_thermal", "sw_thermal"))
    assert (slow.runs, slow.of_runs, slow.classes, slow.max_share) == (1, 2, ("A",), 0.5)
    assert check.to_dict()["slowdowns"][0]["events"] == ("hw_thermal", "sw_thermal")


def test_record_clock_events_are_read_and_checked() -> None:
    base = {
        "schema": 1,
        "campaign": "c",
        "status": "ok",
        "node": "n",
        "gpu_index": 0,
        "job_class": "A",
        "repeat": 0,
        "uuid": "GPU-1",
        "duration_s": 1.0,
    }
    r = RunRecord.from_dict(base | {"clock_events": {"sw_power_cap": 1.0, "hw_slowdown": 0.1}})
    assert r.clock_events == (("hw_slowdown", 0.1), ("sw_power_cap", 1.0))
    assert r.cooling_events == ("hw_slowdown",)
    assert RunRecord.from_dict(base).clock_events is None  # records from before the field
    # the runner's record when NVML gave no reasons: unknown, not clean
    no_nvml = base | {"clock_events": {}, "clock_event_samples": 0}
    assert RunRecord.from_dict(no_nvml).clock_events is None
    clean = RunRecord.from_dict(base | {"clock_events": {}, "clock_event_samples": 40})
    assert clean.clock_events == () and clean.cooling_events == ()
    with pytest.raises(RecordError, match="clock_events"):
        RunRecord.from_dict(base | {"clock_events": {"sw_thermal": 3}})
    with pytest.raises(RecordError, match="clock_event_samples"):
        RunRecord.from_dict(base | {"clock_events": {}, "clock_event_samples": -1})


def test_runs_without_clock_event_readings_are_unknown_not_clean() -> None:
    runs = [
        r if r.key == ("n1", 0) else rec(r.node, r.gpu_index, r.job_class, r.repeat,
                                         clock_events=())
        for r in full({}, classes=("A",), repeats=2)
    ]  # fmt: skip
    check = check_campaign(PLAN, ["A"], 2, runs)
    assert check.slowdowns == ()
    assert check.clock_events_unknown == (("n1", 0, 2),)
    assert check.to_dict()["clock_events_unknown"] == [{"node": "n1", "gpu_index": 0, "runs": 2}]


def _row(node: str, cls: str, rep: int, events) -> RunClockEvents:  # type: ignore[no-untyped-def]
    return RunClockEvents(node, 0, cls, rep, f"GPU-{node}", events)


def test_clock_event_summary_tells_unknown_partial_and_known_apart() -> None:
    gpus = ["GPU-a", "GPU-b", "GPU-c"]
    old = summarize_clock_events("old", gpus, [])  # kept before the store had the table
    assert (old.status, old.unknown_gpus, old.slowdowns) == ("unknown", tuple(gpus), ())
    assert old.gpu_state("GPU-a") is None

    capped = (("sw_power_cap", 1.0),)
    hot = (("hw_thermal", 0.2), ("sw_power_cap", 1.0))
    rows = [
        _row("a", "A", 0, capped),
        _row("a", "A", 1, hot),
        _row("b", "A", 0, capped),
        _row("b", "A", 1, None),  # one run without readings
        _row("c", "A", 0, capped),
        _row("c", "A", 1, ()),
    ]
    partial = summarize_clock_events("new", gpus, rows)
    assert partial.status == "partial" and partial.unknown_runs == 1
    assert partial.unknown_gpus == ("GPU-b",)  # clean on one run is not clean
    (slow,) = partial.slowdowns
    assert (slow.uuid, slow.events, slow.runs, slow.of_runs) == ("GPU-a", ("hw_thermal",), 1, 2)
    assert [partial.gpu_state(g) for g in gpus] == [("hw_thermal",), None, ()]
    assert partial.gpu_state("GPU-unmeasured") is None and partial.clean_gpus == ("GPU-c",)

    rows[3] = _row("b", "A", 1, capped)
    known = summarize_clock_events("new", gpus, rows)
    assert known.status == "known" and known.unknown_gpus == ()
    assert known.to_dict()["slowdowns"][0]["events"] == ("hw_thermal",)
    # a measured GPU with no stored run at all is unknown too
    assert summarize_clock_events("new", [*gpus, "GPU-d"], rows).unknown_gpus == ("GPU-d",)


def test_diff_carries_both_campaigns_clock_events() -> None:
    frame = _scores([("GPU-a", "A", "a", 0, 0, 1.0)])
    labels = {"GPU-a": "v-a0"}
    old = summarize_clock_events("x", ["GPU-a"], [])
    new = summarize_clock_events("y", ["GPU-a"], [_row("a", "A", 0, (("sw_thermal", 0.5),))])
    d = diff_campaigns("x", "y", frame, frame, labels, labels,
                       old_clock_events=old, new_clock_events=new)  # fmt: skip
    out = d.to_dict()["clock_events"]
    assert out["old"]["status"] == "unknown" and out["old"]["unknown_gpus"] == ["GPU-a"]
    assert out["new"]["status"] == "known"
    assert [s["uuid"] for s in out["new"]["slowdowns"]] == ["GPU-a"]
    plain = diff_campaigns("x", "y", frame, frame, labels, labels).to_dict()
    assert plain["clock_events"] == {"old": None, "new": None}
