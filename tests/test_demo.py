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


def test_demo_workload_is_the_dl_family_on_a_few_slow_gpus() -> None:
    from slurm_pal.testbed.demo import DEMO_PROFILE, DEMO_SCALE, DEMO_SEED

    jobs = make_trace(DEMO_TRACE, seed=DEMO_SEED, scale=DEMO_SCALE, nodes=8)
    assert DEMO_TRACE == "dl" and DEMO_PROFILE == "few-slow"
    assert jobs != make_trace(DEMO_TRACE, seed=DEMO_SEED + 1, scale=DEMO_SCALE, nodes=8)
    assert any(j.gpus > 4 for j in jobs)  # gangs over whole nodes
    assert all(j.time_limit is not None for j in jobs)  # every job with the limit its user set
    assert {j.job_class for j in jobs} <= set(CLASSES)


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


def test_jobs_table_fits_120_columns_and_says_what_the_advisor_did(tmp_path: Path) -> None:
    import io

    from slurm_pal.cli.common import FullWidthConsole
    from slurm_pal.engine.decide import format_admin_comment
    from slurm_pal.testbed.demo import _print_jobs, short_why

    gang = _record("d07", "A", 0, 1, 90)
    gang |= {
        "gpus_asked": 16,
        "job_id": "1234",
        "worst": 1.01,
        "gpus": [
            [f"n{n:02d}", i, f"gpu-a{n}b0c0d{i}-long-label"] for n in range(1, 5) for i in range(4)
        ],
    }
    comment = format_admin_comment(
        version="0.2.0",
        action="route",
        why="Packed-PM: best-fit nodes, GPUs above 1.5 left out " + "x" * 300,
        gpus={f"n{n:02d}": ["gpu-a1b0c0d0"] * 4 for n in range(1, 5)},
    )
    result = ArmResult(
        "advisor",
        [gang],
        {"d07": {"admin_comment": comment}},
        arm_metrics("advisor", [gang], 4),
        [],
    )
    out = io.StringIO()
    _print_jobs(FullWidthConsole(file=out), result, "advisor")
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 120
    assert any("n01..04 (4)" in line and "kept off slow GPUs" in line for line in lines)
    assert short_why(None) == "(no advisor comment)"
    assert short_why({"action": "wait", "why": "Packed-PM: waits"}) == "held for good GPUs"
    assert short_why({"action": "pass", "why": "left"}) == "left to Slurm's packing"


def test_the_demo_gives_the_range_slurms_ticks_move_its_prediction() -> None:
    import io

    from slurm_pal.cli.common import FullWidthConsole
    from slurm_pal.testbed.demo import _print_gain

    band = {"n": 12, "min": 0.711, "max": 0.887, "median": 0.744, "jitter_s": 0.5}
    report: dict[str, object] = {
        "arms": {},
        "policy": "packed-pm",
        "baseline": "control",
        "avg_jct_ratio": 0.84,
        "runs": [{"predicted": {"latency_avg_jct_ratio": 0.742, "timing_band": band}}],
    }
    out = io.StringIO()
    _print_gain(FullWidthConsole(file=out, width=400), report)
    text = " ".join(out.getvalue().split())
    assert "0.840 (+16.0 % for the advisor); the simulator predicted 0.742" in text
    assert "moved by up to 0.5 s" in text and "0.711-0.887 over 12 draws (median 0.744)" in text
    report["runs"] = [{"predicted": {"latency_avg_jct_ratio": 0.742}}]  # an older report
    out = io.StringIO()
    _print_gain(FullWidthConsole(file=out, width=400), report)
    assert "Slurm's ticks and this machine's load move it" in " ".join(out.getvalue().split())
