"""The live part of `slurm-pal demo`: a local Slurm of 8 hosts x 4 fake GPUs, a few of them far
slower for compute-bound jobs, the advisor, a deep-learning cluster's work (gangs, limits)
through plain sbatch, where each job went and why, the GPU time each arm lost to slow GPUs, the
measured gain over a packing control beside the simulator's prediction, and a PNG comparing the
two arms. The control runs the same job_submit.lua, Prolog/Epilog and service serving ``policy =
"packed"``, so the arms differ only in the policy.

Why a module: the demo is the README's first command, so it must run from a fresh clone and
say exactly what is missing (root, Slurm packages, the advisor service) instead of failing
somewhere inside Slurm.

Why this workload: the shipped policy (packed-pm) differs from Slurm's packing only when a job
would otherwise land on a GPU far slower for its class, and that matters most where a gang
would run at its slowest GPU. The ``dl`` family on the ``few-slow`` site is where the simulator
finds the advisor's gain; the demo runs one draw of it (:data:`DEMO_SEED`) for which the
simulator predicts a clear gain, at a fifth of the benchmark's time scale so both arms take
about four minutes. At that scale its shortest jobs last a few seconds, against Slurm's start
latency of about one: the demo shows what the advisor does and why; the gain a site can expect
is the benchmark's (benchmarks/testbed_gain.py, with jobs five times as long).
"""

from __future__ import annotations

import json
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

DEMO_TRACE = "dl"
DEMO_SEED = 18
"""The draw of ``dl`` the demo runs by default: one for which the simulator predicts a clear gain
(about 0.72-0.74 at the demo's scale, planned as Slurm's backfill plans; 0.69-0.89 as Slurm's
ticks move its submissions); ``--trace-seed`` draws others, some with none."""
DEMO_SCALE = 0.2
DEMO_PROFILE = "few-slow"
DEMO_NODES = 8
DEFAULT_PNG = Path("slurm-pal-demo.png")
DETAILS_NAME = "slurm-pal-demo-jobs.json"
"""Every job of both arms in full (GPUs, slowdowns, the advisor's comment): the tables show a
line each, within 120 columns."""
TABLE_WIDTH = 120


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
    trace_seed: int = DEMO_SEED,
    png: Path | None = DEFAULT_PNG,
    details: Path | None = None,
) -> int:
    """Run both arms on the demo trace in a throw-away folder; print jobs, reasons and gain,
    write the comparison PNG to ``png`` (None: no PNG) and every job in full to ``details``
    (default: beside the PNG, else in this folder). Returns the exit code (0: both arms ran)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-pal-demo-", dir="/tmp"))
    root.chmod(0o755)
    arms = ("control", "advisor")
    settings = RunSettings(
        root=root,
        trace=trace,
        trace_seed=trace_seed,
        scale=DEMO_SCALE,
        nodes=DEMO_NODES,
        profile=DEMO_PROFILE,
        arms=arms,
        config=config,
    )
    if details is None:
        details = (png.parent if png is not None else Path.cwd()) / DETAILS_NAME
    say: Callable[[str], None] = lambda m: console.print(f"  {m}", highlight=False, markup=False)  # noqa: E731
    try:
        console.rule(f"live: a local Slurm with {DEMO_NODES} hosts x 4 fake GPUs")
        console.print(
            f"A few fake GPUs are 2-3x slower for compute-bound jobs (profile {DEMO_PROFILE}); "
            "each job sleeps its base time x the worst PM-score of the GPUs Slurm gave it "
            "(SLURM_JOB_GPUS) x 1.7 when it spans nodes. The same jobs (trace "
            f"{trace}, seed {trace_seed}: gangs of up to 16 GPUs, each with the --time its user "
            f"set, at {DEMO_SCALE:g} of the benchmark's time scale) run twice with plain sbatch, "
            f"both through job_submit.lua, the Prolog/Epilog and `slurm-pal serve`: the control "
            f"serving policy {CONTROL_POLICY} (every job left to Slurm's packing), then the "
            f"advisor serving {settings.advisor_policy}.",
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
        _write_details(console, results, details)
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
    for column in ("job", "class", "GPUs", "nodes", "slowest GPU", "slowdown", "JCT s"):
        table.add_column(column, no_wrap=True)
    if arm == "advisor":
        table.add_column("advisor did", overflow="fold")
    for record in sorted(result.records, key=lambda r: str(r["trace_id"])):
        nodes = sorted({str(n) for n, _i, _label in record["gpus"]})  # type: ignore[attr-defined]
        row = [
            f"{record['trace_id']} #{record['job_id']}",
            str(record["class"]),
            str(record["gpus_asked"]),
            nodes[0] if len(nodes) == 1 else f"{nodes[0]}..{nodes[-1][-2:]} ({len(nodes)})",
            f"{float(record.get('worst', record['slowdown'])):.2f}x",  # type: ignore[arg-type]
            f"{float(record['slowdown']):.2f}",  # type: ignore[arg-type]
            f"{float(record['end']) - float(record['submit']):.0f}",  # type: ignore[arg-type]
        ]
        if arm == "advisor":
            slurm = result.slurm_jobs.get(str(record["trace_id"]), {})
            parsed = parse_admin_comment(str(slurm.get("admin_comment") or ""))
            row.append(short_why(parsed))
        table.add_row(*row)
    console.print(table, width=TABLE_WIDTH)
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


def short_why(parsed: Mapping[str, str] | None) -> str:
    """The advisor's action and the gist of its reason, in a table cell: left to Slurm, kept
    off slow GPUs, held for good ones (the full comment is in the details file)."""
    if parsed is None:
        return "(no advisor comment)"
    why = parsed.get("why", "")
    action = parsed["action"]
    replanned = f" ({REPLANNED})" if REPLANNED in why else ""
    if action == "pass":
        return "left to Slurm's packing" + replanned
    if action == "wait":
        return "held for good GPUs" + replanned
    if "left out" in why or "above" in why:
        return "kept off slow GPUs" + replanned
    gist = why.split(";")[0].split(": ", 1)[-1].split(",")[0]
    return f"pinned ({gist[:30]}){replanned}"


def _write_details(console: Console, results: Mapping[str, ArmResult], path: Path) -> None:
    """Every job of both arms in full to ``path`` (JSON), named in one line."""
    jobs = {
        arm: [
            {**record, "slurm": result.slurm_jobs.get(str(record["trace_id"]), {})}
            for record in sorted(result.records, key=lambda r: str(r["trace_id"]))
        ]
        for arm, result in results.items()
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(jobs, indent=1, default=str) + "\n")
    except OSError as exc:
        console.print(f"job details not written: cannot write {path}: {exc}", highlight=False)
        return
    console.print(
        f"every job in full (GPUs, slowdowns, the advisor's comments): {path.resolve()}",
        highlight=False,
    )


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
            f"mean slowdown {figures['avg_slowdown']:.3f}, GPU time lost to slow GPUs "
            f"{figures.get('slow_gpu_s', 0.0):.0f} GPU-s of {figures.get('busy_gpu_s', 0.0):.0f}",
            highlight=False,
        )
    held: Mapping[str, object] = (arms.get("advisor") or {}).get("holds") or {}  # type: ignore[assignment]
    if held:
        console.print(
            f"advisor held {held.get('held_jobs', 0)} job(s) for good GPUs "
            f"({held.get('held_total_s', 0)} s in all) by giving them a begin time",
            highlight=False,
        )
    ratio = report.get("avg_jct_ratio")
    runs: list[Mapping[str, object]] = report.get("runs") or []  # type: ignore[assignment]
    expected: Mapping[str, object] = (runs[-1].get("predicted") if runs else None) or {}  # type: ignore[assignment]
    predicted = expected.get("latency_avg_jct_ratio", report.get("sim_predicted_avg_jct_ratio"))
    sim: dict[str, object] = report.get("sim") or {}  # type: ignore[assignment]
    band: Mapping[str, object] = expected.get("timing_band") or {}  # type: ignore[assignment]
    if ratio is not None:
        moved = (
            f"; with each submission moved by up to {band['jitter_s']:g} s, as Slurm's ticks "
            f"move it, {band['min']:.3f}-{band['max']:.3f} over {band['n']} draws (median "
            f"{band['median']:.3f}): one run of jobs this short lands anywhere in that range"
            if band.get("n")
            else ". One run of short jobs: Slurm's ticks and this machine's load move it"
        )
        console.print(
            f"measured average JCT advisor ({report.get('policy')}) / {_baseline(report)}: "
            f"[bold]{ratio:.3f}[/] "
            f"({100 * (1 - float(ratio)):+.1f} % for the advisor); the simulator predicted "  # type: ignore[arg-type]
            f"{float(predicted):.3f} with Slurm's start latency modelled{moved}. The "  # type: ignore[arg-type]
            "benchmark's repeated runs of jobs five times as long are in benchmarks/README.md "
            "('Real Slurm: site-like work'); `slurm-pal demo --trace-seed N` draws another "
            "workload of the same mix.",
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
    arms: Mapping[str, Mapping[str, object]] = report.get("arms") or {}  # type: ignore[assignment]
    if "slow_gpu_s" in (arms.get("advisor") or {}) and "slow_gpu_s" in (arms.get(base) or {}):
        figures += (
            f"; GPU time lost to slow GPUs {float(arms['advisor']['slow_gpu_s']):.0f} GPU-s "  # type: ignore[arg-type]
            f"against {float(arms[base]['slow_gpu_s']):.0f}"  # type: ignore[arg-type]
        )
    if avg < 1.0 and p99 <= 1.0 and makespan <= 1.0:
        return f"advisor beat {base}: {figures} ({100 * (1 - avg):.1f} % lower average JCT)"
    return (
        f"advisor did not beat {base} on this run: {figures}. Single runs move by several per "
        "cent with Slurm's scheduling ticks and this machine's load (docs/testbed.md)"
    )


def write_comparison_png(report: Mapping[str, object], path: Path) -> Path:
    """Draw the two arms side by side: average JCT, p99 and makespan per arm, the GPU time each
    lost to slow GPUs, and each job's JCT under the baseline (the control, or stock) against
    under the advisor (below the diagonal: the advisor was faster), coloured by class. Needs
    matplotlib (the ``plot`` extra); raises ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, ArmResult] = report["_results"]  # type: ignore[assignment]
    base = _baseline(report)
    stock, advisor = results[base], results["advisor"]
    fig, (bars, lost, jobs) = plt.subplots(
        1, 3, figsize=(14, 4.6), layout="constrained", width_ratios=(3, 1.3, 3)
    )
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

    lost_values = [r.metrics.slow_gpu_s for r in (stock, advisor)]
    drawn = lost.bar([base, "advisor"], lost_values, color=["#9e9e9e", "#1f77b4"])
    lost.bar_label(drawn, fmt="%.0f", fontsize=8)
    lost.set_ylabel("GPU-seconds")
    lost.set_title("GPU time lost to slow GPUs")
    lost.set_ylim(0, max(max(lost_values), 1.0) * 1.2)

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
