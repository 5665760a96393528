"""Steady-state sbatch latency at a full queue, with and without the advisor, in one run: what
part of a probe's time is the advisor's.

    sudo .venv/bin/python benchmarks/probe_latency.py                  # ~3-5 min on 2 cores
    sudo .venv/bin/python benchmarks/probe_latency.py --pending 500 --probes 20 --json

The testbed (Debian's Slurm 22.05 on loopback, 4 nodes x 4 fake GPUs, the example campaign
rendered) runs the rendered job_submit.lua, Prolog/Epilog and ``slurm-pal serve`` as shipped
(refresh every ``--refresh-s``). 16 holder jobs take every GPU, then ``--pending`` one-GPU jobs
wait behind them: the steady state of a busy site, where the advisor reads the whole queue at
every refresh and slurmctld's scheduler walks it. Then probes, one every ``--interval`` s (an
admin's or a user's ``sbatch --hold --gres=gpu:1``, timed around the whole call), in
alternating blocks of the two arms on the same slurmctld and queue:

- ``with``: the rendered job_submit.lua asks the running advisor (and the advisor reads
  Slurm as it does at this queue);
- ``without``: job_submit.lua swapped for a pass-through (slurmctld re-reads it when its mtime
  changes) and the advisor's processes stopped (SIGSTOP: no reads, no CPU), as if it were
  not installed.

The first ``--warmup`` probes of each block are not counted. Reported: ``p50_ms_with`` /
``p99_ms_with``, ``p50_ms_without`` / ``p99_ms_without``, ``advisor_share_p50_ms`` (with minus
without) and ``ratio_p50`` / ``ratio_p99`` (with / without), ``advisor_decide_ms_p99`` (the
service's own decide time), ``slurm_read_ms_p50`` (its queue reads), ``n`` per arm,
``fill_s``, and ``probes_decided`` of ``probes_sent_with`` (every probe of a with block
was asked about, none of a without block). Needs root and the Slurm packages
(``bash scripts/install-slurm.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.testbed import LocalSlurm
from slurm_pal.testbed.run import FIFO, AdvisorArm, RunSettings, prepare

PASS_THROUGH = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
return slurm.SUCCESS
"""

_SWAPS = [0]
WRAP = "--wrap=sleep 3600"


def swap_script(tb: LocalSlurm, text: str) -> None:
    """Install a job_submit.lua. slurmctld re-reads it when its mtime (whole seconds) is newer
    than the one it loaded, so every swap gets a strictly later mtime (in the future)."""
    path = tb.root / "etc" / "job_submit.lua"
    path.write_text(text)
    _SWAPS[0] += 1
    later = int(time.time()) + 10 + _SWAPS[0]
    os.utime(path, (later, later))


def sbatch(env: dict[str, str], out: Path, *args: str) -> float:
    """Submit one job; milliseconds the whole sbatch call took."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["sbatch", "--parsable", "-o", str(out / "%j.out"), "--chdir", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
    return took


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def wait_until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def signal_advisor(arm: AdvisorArm, sig: signal.Signals) -> None:
    """The service, its parsing worker and what else it started share its session."""
    assert arm.proc is not None
    os.killpg(arm.proc.pid, sig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=3000)
    parser.add_argument("--probes", type=int, default=40, help="Counted probes per block.")
    parser.add_argument("--blocks", type=int, default=2, help="Blocks of each arm.")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--refresh-s", type=float, default=5.0, help="advisor.refresh_s.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        print("probe_latency: needs root and Debian's Slurm (bash scripts/install-slurm.sh)")
        return 2
    log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="spal-probe-", dir="/tmp"))
    root.chmod(0o755)
    settings = RunSettings(
        root=root, nodes=4, arms=("advisor",), multihost=False, refresh_s=args.refresh_s
    )
    prep = prepare(settings, log)
    arm = AdvisorArm()
    out = root / "out"
    out.mkdir()
    out.chmod(0o1777)
    options = arm.testbed_options(prep)
    rendered = str(options["job_submit_lua"])
    tb = LocalSlurm(
        root,
        prep.specs,
        device_pattern=settings.device_pattern,
        extra_conf=(*FIFO, f"MaxJobCount={args.pending * 2 + 2000}"),
        **options,  # type: ignore[arg-type]
    )
    samples: dict[str, list[float]] = {"with": [], "without": []}
    report: dict[str, object] = {"pending": args.pending, "refresh_s": args.refresh_s}
    stopped = False
    try:
        tb.start()
        arm.start(tb, prep, log)
        env = dict(tb.env)
        reader = CliStateReader(env)
        gpus = sum(4 for _ in prep.specs)
        for spec in prep.specs:  # pinned: every GPU taken, whatever the advisor prefers
            for _ in range(4):
                sbatch(env, out, "--gres=gpu:1", "-w", spec.name, "--wrap=sleep 3600")
        wait_until(
            lambda: sum(j.state == "RUNNING" for j in reader.jobs()) == gpus, 120, "the holders"
        )
        log(f"{gpus} holders running; submitting {args.pending} pending jobs")
        started = time.perf_counter()
        with ThreadPoolExecutor(args.submitters) as pool:
            list(
                pool.map(
                    lambda i: sbatch(env, out, "--gres=gpu:1", f"-J=load{i % 50}", WRAP),
                    range(args.pending),
                )
            )
        report["fill_s"] = round(time.perf_counter() - started, 1)
        log(f"filled in {report['fill_s']} s; steady state: probes")
        time.sleep(max(10.0, 2.5 * args.refresh_s))  # the advisor's view holds every job
        decided_before = int(arm.stats(prep).get("decide_total") or 0)  # type: ignore[call-overload]
        for block in range(args.blocks * 2):
            name = ("with", "without")[block % 2] if args.blocks else "with"
            if name == "without":
                swap_script(tb, PASS_THROUGH)
                signal_advisor(arm, signal.SIGSTOP)
                stopped = True
            else:
                swap_script(tb, rendered)
                if stopped:
                    signal_advisor(arm, signal.SIGCONT)
                    stopped = False
            time.sleep(2.0)  # slurmctld re-reads job_submit.lua on the next submission
            for n in range(args.warmup + args.probes):
                took = sbatch(env, out, "--hold", "--gres=gpu:1", "--wrap=true")
                if n >= args.warmup:
                    samples[name].append(took)
                time.sleep(args.interval)
            log(f"block {block + 1}: {name}, p50 {percentile(samples[name], 0.5):.1f} ms so far")
        if stopped:
            signal_advisor(arm, signal.SIGCONT)
            stopped = False
        stats = arm.stats(prep)
        report["advisor_decide_ms_p99"] = stats.get("decide_ms_p99")
        report["slurm_read_ms_p50"] = stats.get("slurm_read_ms_p50")
        # every probe of a with block asked the advisor, none of a without block did
        report["probes_decided"] = int(stats.get("decide_total") or 0) - decided_before  # type: ignore[call-overload]
        report["probes_sent_with"] = args.blocks * (args.warmup + args.probes)
    finally:
        if stopped:
            signal_advisor(arm, signal.SIGCONT)
        arm.stop()
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)
    for name, values in samples.items():
        report[f"n_{name}"] = len(values)
        report[f"p50_ms_{name}"] = round(percentile(values, 0.5), 1)
        report[f"p99_ms_{name}"] = round(percentile(values, 0.99), 1)
    report["advisor_share_p50_ms"] = round(
        float(report["p50_ms_with"]) - float(report["p50_ms_without"]),
        1,  # type: ignore[arg-type]
    )
    report["ratio_p50"] = round(float(report["p50_ms_with"]) / float(report["p50_ms_without"]), 2)  # type: ignore[arg-type]
    report["ratio_p99"] = round(float(report["p99_ms_with"]) / float(report["p99_ms_without"]), 2)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"{args.pending} pending, steady state: sbatch p50 {report['p50_ms_with']} ms / "
            f"p99 {report['p99_ms_with']} ms with the advisor, {report['p50_ms_without']} / "
            f"{report['p99_ms_without']} ms without (n {report['n_with']} each); the advisor's "
            f"share: {report['advisor_share_p50_ms']:+} ms at p50 (x{report['ratio_p50']} p50, "
            f"x{report['ratio_p99']} p99); its own decide p99 {report['advisor_decide_ms_p99']} "
            f"ms, its queue read p50 {report['slurm_read_ms_p50']} ms; probes it decided "
            f"{report['probes_decided']} of the {report['probes_sent_with']} sent with it"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
