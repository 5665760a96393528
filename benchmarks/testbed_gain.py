"""The advisor's measured gain over stock Slurm on the real-Slurm testbed, against the simulator.

Runs `slurm-pal testbed run` (both arms on the same emulated cluster and trace) ``--repeats``
times and prints, per run and over the runs, the measured ratios advisor / stock and the
simulator's prediction for the same trace, cluster, profile and penalty. The advisor runs as
the site config sets it up (``--config``, else $SLURM_PAL_CONFIG, else the shipped defaults:
packed-pm); ``--policy pal`` reproduces the paper's policy. Needs root and Slurm
(scripts/install-slurm.sh); each run takes a few minutes.

    nice python benchmarks/testbed_gain.py --repeats 3
    nice python benchmarks/testbed_gain.py --repeats 3 --policy pal
    nice python benchmarks/testbed_gain.py --repeats 3 --profile longhorn --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from slurm_pal.adapters.config import ConfigError, load_config
from slurm_pal.testbed.cluster import TestbedError
from slurm_pal.testbed.emulate import EmulationError
from slurm_pal.testbed.run import RunSettings, public_report, run_testbed

KEYS = ("avg_jct_ratio", "p99_jct_ratio", "makespan_ratio")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", default="mixed48")
    parser.add_argument("--trace-seed", type=int, default=0)
    parser.add_argument("--profile", default="example")
    parser.add_argument("--profile-seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--config", type=Path, default=None, help="site config (default: $SLURM_PAL_CONFIG)"
    )
    parser.add_argument(
        "--policy", default=None, help="the advisor's policy (default: the config's advisor.policy)"
    )
    parser.add_argument("--replan-s", type=float, default=0.0, help="advisor re-planning (0: off)")
    parser.add_argument(
        "--no-replan-on-epilog",
        action="store_const",
        const=False,
        default=None,
        dest="replan_on_epilog",
        help="the advisor decides at submit only (default: the config's replan_on_epilog)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="testbed folder (default: temp)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    root = args.dir or Path(tempfile.mkdtemp(prefix="spal-gain-", dir="/tmp"))
    try:
        settings = RunSettings(
            root=root,
            trace=args.trace,
            trace_seed=args.trace_seed,
            profile=args.profile,
            profile_seed=args.profile_seed,
            scale=args.scale,
            policy=args.policy,
            replan_s=args.replan_s,
            replan_on_epilog=args.replan_on_epilog,
            config=load_config(args.config),
        )
    except (ConfigError, EmulationError) as exc:
        parser.error(str(exc))
    runs = []
    for i in range(args.repeats):
        t0 = time.monotonic()
        try:
            report = public_report(run_testbed(settings, say))
        except (TestbedError, EmulationError) as exc:  # one bad run is a finding, not the end
            say(f"run {i + 1}/{args.repeats} failed: {exc}")
            runs.append({"error": str(exc)})
            shutil.rmtree(root / f"run-{i + 1}", ignore_errors=True)
            shutil.copytree(settings.work, root / f"run-{i + 1}")
            continue
        report["wall_s"] = round(time.monotonic() - t0, 1)
        kept = root / f"run-{i + 1}"  # the next run wipes the emulation folder
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(settings.work, kept)
        runs.append(report)
        say(
            f"run {i + 1}/{args.repeats}: "
            + ", ".join(f"{k} {report[k]}" for k in (*KEYS, "sim_predicted_avg_jct_ratio"))
        )
    ok = [r for r in runs if "error" not in r]
    if not ok:
        print(json.dumps({"errors": [r["error"] for r in runs]}, indent=2))
        return 1
    summary: dict[str, object] = {
        "trace": args.trace,
        "profile": args.profile,
        "repeats": args.repeats,
        "policy": ok[0]["policy"],
        "decisions": ok[0]["sim"]["decisions"],  # type: ignore[index]
        "sim_jobs_as_stock": ok[0]["sim"]["jobs_as_stock"],  # type: ignore[index]
        "sim_predicted_avg_jct_ratio": ok[0]["sim_predicted_avg_jct_ratio"],
        "sim_predicted_p99_jct_ratio": ok[0]["sim_predicted_p99_jct_ratio"],
        "sim_predicted_makespan_ratio": ok[0]["sim_predicted_makespan_ratio"],
        "sim_at_submit_avg_jct_ratio": ok[0].get("sim_at_submit_avg_jct_ratio"),
    }
    for key in KEYS:
        values = [float(r[key]) for r in ok if r.get(key) is not None]
        summary[key] = values
        summary[f"{key}_mean"] = round(statistics.fmean(values), 4) if values else None
    mean = summary["avg_jct_ratio_mean"]
    if mean:
        predicted = float(summary["sim_predicted_avg_jct_ratio"])  # type: ignore[arg-type]
        summary["prediction_error_mean"] = round(predicted / float(mean) - 1.0, 4)  # type: ignore[arg-type]
    summary["failed_runs"] = [r["error"] for r in runs if "error" in r]
    summary["runs"] = [
        {k: r.get(k) for k in (*KEYS, "prediction_error", "wall_s", "arms")} for r in ok
    ]
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key in KEYS:
            print(f"{key}: runs {summary[key]}, mean {summary[f'{key}_mean']}")
        print(
            f"simulator, advisor {summary['policy']} deciding {summary['decisions']}: "
            f"avg_jct_ratio {summary['sim_predicted_avg_jct_ratio']} "
            f"({summary['sim_jobs_as_stock']} of {ok[0]['jobs']} jobs timed as under packing)"
        )
        print(f"simulator, decisions at submit: {summary['sim_at_submit_avg_jct_ratio']}")
        if "prediction_error_mean" in summary:
            print(f"simulator vs measured mean: {100 * summary['prediction_error_mean']:+.1f} %")  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
