"""The advisor's measured effect on the real-Slurm testbed against a packing control, beside the
simulator's prediction of the same pair.

Runs `slurm-pal testbed run` with ``--repeats`` (both arms on the same emulated cluster and
trace, alternating which goes first) and prints, per repeat and over the repeats (median,
min-max), the measured ratios advisor / control and the simulator's prediction of that pair for
the same trace, cluster, profile and penalty. The control runs the same job_submit.lua,
Prolog/Epilog and `slurm-pal serve` as the advisor, serving ``policy = "packed"``, so the two
arms differ only in the policy. ``--arms stock,control,advisor`` adds stock Slurm (no plugin,
hooks or service) and the ratios against it. The advisor runs as the site config sets it up
(``--config``, else $SLURM_PAL_CONFIG, else the shipped defaults: packed-pm). Needs root and
Slurm (scripts/install-slurm.sh); each arm takes one to four minutes.

The site-like families (``--trace dl``, a deep-learning cluster's gangs; ``--trace campus``, a
university site's single-GPU jobs) carry the limits users set, run minutes (a site's hour is a
testbed minute) under backfill on 8 nodes x 4 GPUs, and draw a new trace for every repeat
(seed ``--trace-seed`` + repeat). Per repeat the JSON gives the measured ratio advisor / control
and the simulator's prediction of the same pair and trace (``predicted``: with Slurm's start
latency and the Epilog round modelled, calibrated on the control arm), the advisor's real holds
(jobs Slurm kept pending under a begin time) beside the simulated advisor's, and the GPU-seconds
each arm lost to slow GPUs; then the median, range and a bootstrap interval over the repeats.
Each arm takes 4-12 minutes on the site-like families.

    python benchmarks/testbed_gain.py --trace dl --profile few-slow --repeats 5 --json
    python benchmarks/testbed_gain.py --trace campus --profile few-slow --repeats 3
    python benchmarks/testbed_gain.py --trace dl --profile longhorn --repeats 3
    python benchmarks/testbed_gain.py --trace demo32 --scale 2 --repeats 5
    python benchmarks/testbed_gain.py --repeats 3 --arms stock,control,advisor
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from slurm_pal.adapters.config import ConfigError, load_config
from slurm_pal.testbed.cluster import TestbedError
from slurm_pal.testbed.emulate import SITE_TRACES, EmulationError
from slurm_pal.testbed.evidence import repeat_summary
from slurm_pal.testbed.run import RunSettings, public_report, run_testbed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", default="mixed48")
    parser.add_argument("--trace-seed", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=None, help="default: 8 for dl/campus, else 4")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--profile", default="example")
    parser.add_argument("--profile-seed", type=int, default=0)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="stretch arrivals and durations: Slurm's scheduling latency (not simulated) "
        "then weighs less",
    )
    parser.add_argument("--arms", default="control,advisor", help="control, advisor, stock")
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
    parser.add_argument("--single-host", action="store_true", help="every daemon on one host")
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
            nodes=args.nodes or (8 if args.trace in SITE_TRACES else 4),
            gpus_per_node=args.gpus_per_node,
            profile=args.profile,
            profile_seed=args.profile_seed,
            scale=args.scale,
            arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
            repeats=args.repeats,
            policy=args.policy,
            replan_s=args.replan_s,
            replan_on_epilog=args.replan_on_epilog,
            config=load_config(args.config),
            multihost=not args.single_host,
        )
    except (ConfigError, EmulationError) as exc:
        parser.error(str(exc))
    t0 = time.monotonic()
    try:
        report = public_report(run_testbed(settings, say))
    except (TestbedError, EmulationError) as exc:
        print(json.dumps({"error": str(exc), "root": str(root)}, indent=2))
        return 1
    report["wall_s"] = round(time.monotonic() - t0, 1)
    if report.get("baseline"):
        report |= repeat_summary(report["runs"], str(report["baseline"]))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"trace {report['trace']} (seed {report['trace_seed']}, scale {report['scale']}), "
        f"{report['repeats']} repeats, advisor {report['policy']} vs control "
        f"{report['control_policy']}; kept in {root}/emulation/repeat-N"
    )
    if "sim_latency_s" in report:
        band = report["latency_model"]["avg_jct_ratio_band"]  # type: ignore[index]
        print(
            f"simulator with Slurm's latency modelled ({report['sim_latency_s']} s per job, "
            f"calibrated on the {report['baseline']} arm): avg_jct_ratio "
            f"{report['sim_latency_avg_jct_ratio']}; over 0-2 s {band['min']}-{band['max']}"
        )
    for number, repeat in enumerate(report.get("repeats", []), 1):  # type: ignore[arg-type]
        print(
            f"repeat {number} (trace seed {repeat['trace_seed']}): measured "
            f"{repeat['measured']}, predicted {repeat['predicted']} (without Slurm's latency "
            f"{repeat['predicted_plain']}; submissions moved by Slurm's ticks "
            f"{repeat.get('predicted_band')}); holds {repeat['holds']['measured']} vs simulated "
            f"{repeat['holds']['simulated']}; GPU-s lost to slow GPUs {repeat['slow_gpu_s']}"
        )
        for job, arms in (repeat.get("jobs_apart") or {}).items():
            for arm, pair in arms.items():
                print(
                    f"  {job} {arm}: [start, JCT, slowdown] measured {pair['measured']}, "
                    f"simulated {pair['simulated']}"
                )
    if "median_measured" in report:
        ci = report["measured_ci95"]
        print(
            f"advisor/{report['baseline']} avg JCT: median measured {report['median_measured']} "
            f"(range {report['measured_range']}, geomean {report['geomean_measured']}, 95 % "
            f"bootstrap {ci}), median predicted {report['median_predicted']}; holds "
            f"{report['holds_measured']} vs simulated {report['holds_simulated']}"
        )
    for pair, figures in report["pairs"].items():  # type: ignore[union-attr]
        for key, f in figures.items():
            print(
                f"{pair} {key}: runs {f['runs']}, median {f['median']} ({f['min']}-{f['max']}), "
                f"simulator {f['sim']}, measured median vs simulator "
                + ("-" if f["vs_sim"] is None else f"{100 * f['vs_sim']:+.1f} %")
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
