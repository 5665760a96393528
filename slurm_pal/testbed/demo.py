"""The live part of `slurm-pal demo`: a local Slurm with fake GPUs, the bundled example campaign
drawn onto them, the advisor, a small mixed workload through plain sbatch, where each job went
and why, the measured gain over a packing control and a PNG comparing the two arms. The control
runs the same job_submit.lua, Prolog/Epilog and service serving ``policy = "packed"``, so the
arms differ only in the policy (against stock Slurm without that machinery, the control, which
changes no job, measured ~0.91x on this trace: that part is the machinery's, not the placement's).

Why a module: the demo is the README's first command, so it must run from a fresh clone and
say exactly what is missing (root, Slurm packages, the advisor service) instead of failing
somewhere inside Slurm.

Why trace ``demo32``: the shipped policy (packed-pm) differs from Slurm's packing only when a job
would otherwise land on a GPU far slower for its class, and that happens only when the GPUs are
short. The example campaign drawn onto 4 x 4 GPUs has two such GPUs for class A (2.31x, 1.87x);
demo32 offers ~1.4x the work the GPUs can do while it arrives, with compute-bound A and
memory-bound D jobs, so stock Slurm puts A jobs on them and the advisor gives them to D jobs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.testbed.cluster import TestbedError, missing_binaries
from slurm_pal.testbed.emulate import EmulationError
from slurm_pal.testbed.run import (
    CONTROL_POLICY,
    AdvisorArm,
    ArmResult,
    ArmUnavailable,
    RunSettings,
    run_testbed,
)

__all__ = ["DEMO_TRACE", "live_demo", "missing_for_live_demo", "verdict", "write_comparison_png"]

DEMO_TRACE = "demo32"
DEFAULT_PNG = Path("slurm-pal-demo.png")


def missing_for_live_demo() -> list[str]:
    """What this machine lacks for the live demo, each with how to get it (empty: all there)."""
    missing = []
    binaries = missing_binaries()
    if binaries:
        missing.append(
            f"Slurm/munge programs ({', '.join(binaries)}): install them with "
            "'sudo bash scripts/install-slurm.sh' (Debian), or run 'bash scripts/demo.sh' as root"
        )
    if os.geteuid() != 0:
        missing.append(
            "root: the local Slurm runs munged, slurmctld and slurmd as root; "
            "run 'sudo .venv/bin/slurm-pal demo'"
        )
    try:
        AdvisorArm().check()
    except ArmUnavailable as exc:
        missing.append(str(exc))
    return missing


def live_demo(
    console: Console,
    config: SiteConfig,
    *,
    trace: str = DEMO_TRACE,
    trace_seed: int = 0,
    png: Path | None = DEFAULT_PNG,
) -> int:
    """Run both arms on the demo trace in a throw-away folder; print jobs, reasons and gain,
    and write the comparison PNG to ``png`` (None: no PNG). Returns the exit code (0: both
    arms ran)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-pal-demo-", dir="/tmp"))
    root.chmod(0o755)
    arms = ("control", "advisor")
    settings = RunSettings(root=root, trace=trace, trace_seed=trace_seed, arms=arms, config=config)
    say: Callable[[str], None] = lambda m: console.print(f"  {m}", highlight=False, markup=False)  # noqa: E731
    try:
        console.rule("live: a local Slurm 22.05 with 4 nodes x 4 fake GPUs")
        console.print(
            "Every fake GPU gets the per-class speed of one GPU of the example campaign; the job "
            "script sleeps its base time x the worst PM-score of the GPUs Slurm gave it "
            "(SLURM_JOB_GPUS) x 1.7 when it spans nodes. The same jobs (trace "
            f"{trace}, seed {trace_seed}) run twice with plain sbatch, both through "
            f"job_submit.lua, the Prolog/Epilog and `slurm-pal serve`: the control serving policy "
            f"{CONTROL_POLICY} (every job left to Slurm's packing), then the advisor serving "
            f"{settings.advisor_policy}.",
            highlight=False,
        )
        try:
            report = run_testbed(settings, say)
        except (EmulationError, TestbedError) as exc:
            console.print(f"[bold red]live demo failed:[/] {exc}", highlight=False)
            return 1
        results: dict[str, ArmResult] = report["_results"]  # type: ignore[assignment]
        if "advisor" in results:
            _print_jobs(console, results["advisor"], "advisor")
        if "control" in results:
            _print_jobs(console, results["control"], "control")
        _print_gain(console, report)
        if set(results) == set(arms):
            console.print(verdict(report), highlight=False)
            if png is not None:
                _write_png(console, report, png)
        return 0 if set(results) == set(arms) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
        console.print(f"stopped everything the demo started; removed {root}", highlight=False)


def _print_jobs(console: Console, result: ArmResult, arm: str) -> None:
    from slurm_pal.engine.decide import parse_admin_comment

    table = Table(title=f"{arm}: where each job went", title_justify="left")
    for column in ("job", "class", "GPUs", "GPUs got (node:Slurm index label)", "slowdown"):
        table.add_column(column)
    if arm == "advisor":
        table.add_column("advisor: LV, why")
    for record in sorted(result.records, key=lambda r: str(r["trace_id"])):
        got = " ".join(f"{n}:{i} {label}" for n, i, label in record["gpus"])  # type: ignore[attr-defined]
        row = [
            f"{record['trace_id']} (#{record['job_id']})",
            str(record["class"]),
            str(record["gpus_asked"]),
            got,
            f"{float(record['slowdown']):.3f}",  # type: ignore[arg-type]
        ]
        if arm == "advisor":
            slurm = result.slurm_jobs.get(str(record["trace_id"]), {})
            parsed = parse_admin_comment(str(slurm.get("admin_comment") or ""))
            row.append(advisor_why(parsed))
        table.add_row(*row)
    console.print(table)
    if arm == "advisor":
        console.print(replanning_summary(result), highlight=False, markup=False)


REPLANNED = "re-planned"
"""What the advisor's reason says when a job end's round (not the submit) placed the job."""


def advisor_why(parsed: Mapping[str, str] | None) -> str:
    """The advisor's action, LV product and the policy's reason, whole (rich wraps it at word
    boundaries on a terminal; a log gets it on one line); marked when re-planning placed it."""
    if parsed is None:
        return "(no advisor comment)"
    why = parsed.get("why", "")
    policy_part = why.split(";")[0].split(", node")[0]
    text = f"{parsed['action']} lv={parsed.get('lv', '-')}: {policy_part}".strip()
    return f"{text} [{REPLANNED} at a job end]" if REPLANNED in why else text


def replanning_summary(result: ArmResult) -> str:
    """What re-planning at job ends did in the advisor arm: its rounds, the queued jobs it
    updated in Slurm (and refused updates), and how many jobs ran where a round put them."""
    from slurm_pal.engine.decide import parse_admin_comment

    stats: Mapping[str, object] = result.extra.get("advisor_stats") or {}  # type: ignore[assignment]
    replanned = sum(
        1
        for job in result.slurm_jobs.values()
        if REPLANNED
        in (parse_admin_comment(str(job.get("admin_comment") or "")) or {}).get("why", "")
    )
    if not stats:
        return f"re-planning at job ends: no advisor statistics; {replanned} job(s) re-planned"
    return (
        f"re-planning at job ends: {stats.get('replans_at_job_end', 0)} round(s) started by a "
        f"job's end ({stats.get('replans', 0)} in all); {stats.get('replan_updates', 0)} "
        f"update(s) of queued jobs sent to Slurm, {stats.get('replan_failed', 0)} refused; "
        f"{replanned} of {len(result.records)} job(s) ran where a round put them"
    )


def _print_gain(console: Console, report: dict[str, object]) -> None:
    arms: dict[str, dict[str, object]] = report["arms"]  # type: ignore[assignment]
    for arm, figures in arms.items():
        console.print(
            f"{arm:>8}: average JCT {figures['avg_jct_s']:.1f} s, "
            f"p99 {figures['p99_jct_s']:.1f} s, makespan {figures['makespan_s']:.1f} s, "
            f"mean slowdown {figures['avg_slowdown']:.3f}",
            highlight=False,
        )
    ratio = report.get("avg_jct_ratio")
    predicted = report.get("sim_predicted_avg_jct_ratio")
    sim: dict[str, object] = report.get("sim") or {}  # type: ignore[assignment]
    if ratio is not None:
        console.print(
            f"measured average JCT advisor ({report.get('policy')}) / {_baseline(report)}: "
            f"[bold]{ratio:.3f}[/] "
            f"({100 * (1 - float(ratio)):+.1f} % for the advisor); the simulator predicted "  # type: ignore[arg-type]
            f"{predicted:.3f}. One run: Slurm's scheduling ticks and this machine's load move "
            "it by several per cent, and p99 and makespan are one job each; "
            "`slurm-pal demo --trace-seed N` draws another workload of the same mix.",
            highlight=False,
        )
    if sim.get("jobs_as_stock") == report.get("jobs"):
        console.print(
            f"In the simulator {report.get('policy')} times every job as packing does on these "
            "GPUs, so 1.0 is the expected ratio.",
            highlight=False,
        )
    for arm, reason in (report.get("unavailable") or {}).items():  # type: ignore[attr-defined]
        console.print(f"[bold red]{arm} arm not run:[/] {reason}", highlight=False)


def _baseline(report: Mapping[str, object]) -> str:
    """The arm the report's ratios are against (reports before the control arm: stock)."""
    return str(report.get("baseline") or "stock")


def verdict(report: Mapping[str, object]) -> str:
    """One line: did the advisor beat its baseline (average JCT lower, p99 and makespan not
    worse)?"""
    base = _baseline(report)
    ratios = {k: report.get(f"{k}_ratio") for k in ("avg_jct", "p99_jct", "makespan")}
    if any(v is None for v in ratios.values()):
        return "no verdict: an arm did not run"
    avg, p99, makespan = (float(ratios[k]) for k in ("avg_jct", "p99_jct", "makespan"))  # type: ignore[arg-type]
    figures = f"average JCT {avg:.3f}x, p99 {p99:.3f}x, makespan {makespan:.3f}x {base}"
    if avg < 1.0 and p99 <= 1.0 and makespan <= 1.0:
        return f"advisor beat {base}: {figures} ({100 * (1 - avg):.1f} % lower average JCT)"
    return (
        f"advisor did not beat {base} on this run: {figures}. Single runs move by several per "
        "cent with Slurm's scheduling ticks and this machine's load (README, 'The demo')"
    )


def write_comparison_png(report: Mapping[str, object], path: Path) -> Path:
    """Draw the two arms side by side: average JCT, p99 and makespan per arm, and each job's
    JCT under the baseline (the control, or stock) against under the advisor (below the
    diagonal: the advisor was faster), coloured by class. Needs matplotlib (the ``plot``
    extra); raises ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, ArmResult] = report["_results"]  # type: ignore[assignment]
    base = _baseline(report)
    stock, advisor = results[base], results["advisor"]
    fig, (bars, jobs) = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    names = ("average JCT", "p99 JCT", "makespan")
    values = {
        arm: (r.metrics.avg_jct, r.metrics.p99_jct, r.metrics.makespan)
        for arm, r in ((base, stock), ("advisor", advisor))
    }
    width = 0.38
    for shift, (arm, colour) in zip(
        (-width / 2, width / 2), ((base, "#9e9e9e"), ("advisor", "#1f77b4")), strict=True
    ):
        xs = [i + shift for i in range(len(names))]
        drawn = bars.bar(xs, values[arm], width, label=arm, color=colour)
        bars.bar_label(drawn, fmt="%.1f", fontsize=8)
    top = max(max(v) for v in values.values())
    for i, (a, s) in enumerate(zip(values["advisor"], values[base], strict=True)):
        # above both bars' own labels: the advisor / baseline ratio of this figure
        bars.annotate(
            f"{a / s:.2f}x", (i, max(a, s) + 0.09 * top), ha="center", fontsize=9, weight="bold"
        )
    bars.set_xticks(range(len(names)), names)
    bars.set_ylabel(f"seconds (advisor / {base} above each pair)")
    bars.set_ylim(0, top * 1.25)
    bars.legend(loc="upper left")
    bars.set_title(
        f"{report.get('trace')}, {report.get('jobs')} jobs: "
        f"advisor ({report.get('policy')}) vs {base}"
    )

    def jct(result: ArmResult) -> dict[str, tuple[float, str]]:
        return {
            str(r["trace_id"]): (float(r["end"]) - float(r["submit"]), str(r["class"]))  # type: ignore[arg-type]
            for r in result.records
        }

    before, after = jct(stock), jct(advisor)
    colours = {"A": "#d62728", "B": "#ff7f0e", "C": "#2ca02c", "D": "#1f77b4"}
    for job_class in sorted({c for _, c in before.values()}):
        ids = [j for j in before if before[j][1] == job_class and j in after]
        jobs.scatter(
            [before[j][0] for j in ids],
            [after[j][0] for j in ids],
            label=f"class {job_class}",
            color=colours.get(job_class, "#7f7f7f"),
            s=22,
        )
    limit = max([v for v, _ in before.values()] + [v for v, _ in after.values()]) * 1.05
    jobs.plot([0, limit], [0, limit], color="#555555", linewidth=0.8, linestyle="--")
    jobs.set_xlim(0, limit)
    jobs.set_ylim(0, limit)
    jobs.set_xlabel(f"JCT under {base} (s)")
    jobs.set_ylabel("JCT with the advisor (s)")
    jobs.set_title("each job (below the line: faster with the advisor)")
    jobs.legend(loc="upper left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _write_png(console: Console, report: Mapping[str, object], png: Path) -> None:
    try:
        written = write_comparison_png(report, png)
    except ImportError:
        console.print(
            "PNG skipped: matplotlib is not installed (pip install 'slurm-pal[plot]'; "
            "scripts/demo.sh installs it)",
            highlight=False,
        )
        return
    except OSError as exc:
        console.print(f"PNG skipped: cannot write {png}: {exc}", highlight=False)
        return
    console.print(f"wrote {written.resolve()} (the two arms compared)", highlight=False)
