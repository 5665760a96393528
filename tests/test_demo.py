"""The demo's pieces that need no Slurm: its trace has contention, the verdict line, the PNG
(and the message when matplotlib is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.console import Console

from slurm_pal.testbed.demo import DEMO_TRACE, _write_png, verdict, write_comparison_png
from slurm_pal.testbed.emulate import CLASSES, arm_metrics, make_trace
from slurm_pal.testbed.run import ArmResult


def test_demo_trace_offers_more_work_than_the_gpus_while_it_arrives() -> None:
    jobs = make_trace(DEMO_TRACE)
    assert DEMO_TRACE == "demo32" and len(jobs) == 32 == len(make_trace(DEMO_TRACE, seed=3))
    assert jobs != make_trace(DEMO_TRACE, seed=1)
    assert {j.gpus for j in jobs} <= {1, 2, 4} and {j.job_class for j in jobs} <= set(CLASSES)
    arrival = max(j.submit for j in jobs)
    offered = sum(j.gpus * j.base for j in jobs)
    # Contention: 16 GPUs could not run the work in the time it arrives in, so jobs queue and
    # the slow GPUs get used; compute-bound A and memory-bound D make most of it.
    assert offered > 16 * arrival
    classes = [j.job_class for j in jobs]
    assert classes.count("A") + classes.count("D") > len(jobs) / 2


def _record(job: str, cls: str, submit: float, start: float, end: float) -> dict[str, object]:
    return {
        "trace_id": job,
        "class": cls,
        "gpus_asked": 1,
        "gpus": [["n01", 0, "v100-a0"]],
        "submit": submit,
        "start": start,
        "end": end,
        "slowdown": 1.0,
    }


def _report(advisor_end: float) -> dict[str, object]:
    stock = [_record("c0", "A", 0, 0, 10), _record("c1", "D", 1, 1, 6)]
    advisor = [_record("c0", "A", 0, 0, advisor_end), _record("c1", "D", 1, 1, 6)]
    results = {
        arm: ArmResult(arm, recs, {}, arm_metrics(arm, recs, 4), [])
        for arm, recs in (("stock", stock), ("advisor", advisor))
    }
    a, s = results["advisor"].metrics, results["stock"].metrics
    return {
        "trace": DEMO_TRACE,
        "jobs": 2,
        "policy": "packed-pm",
        "avg_jct_ratio": a.avg_jct / s.avg_jct,
        "p99_jct_ratio": a.p99_jct / s.p99_jct,
        "makespan_ratio": a.makespan / s.makespan,
        "_results": results,
    }


def test_verdict_says_whether_the_advisor_beat_stock_on_all_three() -> None:
    assert verdict(_report(5)).startswith("advisor beat stock: average JCT 0.667x")
    worse = verdict(_report(12))
    assert worse.startswith("advisor did not beat stock on this run") and "p99 1.200x" in worse
    assert verdict({"avg_jct_ratio": None}) == "no verdict: an arm did not run"


def test_png_compares_the_arms(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_comparison_png(_report(5), tmp_path / "sub" / "arms.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_without_matplotlib_the_png_is_skipped_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    console = Console(record=True, width=200)
    _write_png(console, _report(5), tmp_path / "arms.png")
    assert "PNG skipped: matplotlib is not installed" in console.export_text()
    assert not (tmp_path / "arms.png").exists()


def test_the_advisor_column_keeps_the_whole_reason_and_marks_re_planned_jobs() -> None:
    from slurm_pal.engine.decide import format_admin_comment, parse_admin_comment
    from slurm_pal.testbed.demo import advisor_why

    reason = (
        "Packed-PM: packing's nodes and counts, GPUs above 1.5 left out for class A (n02:3 at "
        "2.31x); class A: from the application the job named"
    )
    at_submit = format_admin_comment(version="t", action="route", why=reason, lv=1.0)
    text = advisor_why(parse_admin_comment(at_submit))
    # The policy's part is whole: it was cut at 60 characters, mid-word.
    assert text == (
        "route lv=1.0000: Packed-PM: packing's nodes and counts, GPUs above 1.5 left out for "
        "class A (n02:3 at 2.31x)"
    )
    replanned = format_admin_comment(
        version="t", action="route", why=f"{reason}; class A: re-planned; class A at submit"
    )
    assert advisor_why(parse_admin_comment(replanned)).endswith("[re-planned at a job end]")
    assert advisor_why(None) == "(no advisor comment)"


def test_the_demo_says_what_re_planning_at_job_ends_did() -> None:
    from slurm_pal.engine.decide import format_admin_comment
    from slurm_pal.testbed.demo import replanning_summary

    records = [_record("c0", "A", 0, 0, 10), _record("c1", "D", 1, 1, 6)]
    comments = {
        "c0": format_admin_comment(version="t", action="route", why="Packed-PM: x"),
        "c1": format_admin_comment(
            version="t", action="route", why="Packed-PM: y; class D: re-planned; class D at submit"
        ),
    }
    slurm_jobs = {job: {"admin_comment": text} for job, text in comments.items()}
    stats = {"replans_at_job_end": 3, "replans": 4, "replan_updates": 2, "replan_failed": 1}
    result = ArmResult(
        "advisor",
        records,
        slurm_jobs,
        arm_metrics("advisor", records, 4),
        [],
        {"advisor_stats": stats},
    )
    assert replanning_summary(result) == (
        "re-planning at job ends: 3 round(s) started by a job's end (4 in all); 2 update(s) of "
        "queued jobs sent to Slurm, 1 refused; 1 of 2 job(s) ran where a round put them"
    )
