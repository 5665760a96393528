"""The live part of `slurm-pal demo`: a local Slurm with fake GPUs, the bundled example campaign
drawn onto them, the advisor, a small mixed workload through plain sbatch, where each job went
and why, and the measured gain over stock Slurm.

Why a module: the demo is the README's first command, so it must run from a fresh clone and
say exactly what is missing (root, Slurm packages, the advisor service) instead of failing
somewhere inside Slurm.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.testbed.cluster import TestbedError, missing_binaries
from slurm_pal.testbed.emulate import EmulationError
from slurm_pal.testbed.run import (
    AdvisorArm,
    ArmResult,
    ArmUnavailable,
    RunSettings,
    run_testbed,
)

__all__ = ["live_demo", "missing_for_live_demo"]


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


def live_demo(console: Console, config: SiteConfig, *, trace: str = "demo16") -> int:
    """Run both arms on the demo trace in a throw-away folder; print jobs, reasons and gain.
    Returns the exit code (0: both arms ran)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-pal-demo-", dir="/tmp"))
    root.chmod(0o755)
    arms = ("stock", "advisor")
    settings = RunSettings(root=root, trace=trace, arms=arms, config=config)
    say: Callable[[str], None] = lambda m: console.print(f"  {m}", highlight=False, markup=False)  # noqa: E731
    try:
        console.rule("live: a local Slurm 22.05 with 4 nodes x 4 fake GPUs")
        console.print(
            "Every fake GPU gets the per-class speed of one GPU of the example campaign; the job "
            "script sleeps its base time x the worst PM-score of the GPUs Slurm gave it "
            "(SLURM_JOB_GPUS) x 1.7 when it spans nodes. The same 16 jobs run twice with plain "
            "sbatch: stock Slurm, then job_submit.lua + `slurm-pal serve` with policy "
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
        if "stock" in results:
            _print_jobs(console, results["stock"], "stock")
        _print_gain(console, report)
        return 0 if set(results) == set(arms) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
        console.print(f"stopped everything the demo started; removed {root}", highlight=False)


def _print_jobs(console: Console, result: ArmResult, arm: str) -> None:
    from slurm_pal.advisor.decide import parse_admin_comment

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
            if parsed is None:
                row.append("(no advisor comment)")
            else:
                lv = parsed.get("lv", "-")
                why = parsed.get("why", "").split(";")[0].split(", node")[0]  # the policy's part
                row.append(f"{parsed['action']} lv={lv}: {why[:60]}".strip())
        table.add_row(*row)
    console.print(table)


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
            f"measured average JCT advisor ({report.get('policy')}) / stock: [bold]{ratio:.3f}[/] "
            f"({100 * (1 - float(ratio)):+.1f} % for the advisor); the simulator predicted "  # type: ignore[arg-type]
            f"{predicted:.3f}. One small run: Slurm's scheduling ticks and this machine's load "
            "move it by several per cent; `slurm-pal testbed run` runs the 48-job trace.",
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
