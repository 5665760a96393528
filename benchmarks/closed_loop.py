"""GPUs that turn slow between campaigns: how fast ordinary jobs find them, and what steering
around them is worth. Simulated.

    python benchmarks/closed_loop.py                      # 6 seeds, tables on stdout
    python benchmarks/closed_loop.py --seeds 3 --json     # one JSON object
    python benchmarks/closed_loop.py --cv 0.1 --rate 4 --visible 0
    python benchmarks/closed_loop.py --arms no-loop remeasure oracle
    python benchmarks/closed_loop.py --fault-classes A D --jct

Every run is the simulator's Slurm mode on a site-like history (Poisson arrivals at 80 % load,
85 % single-GPU jobs of minutes to days, limits from tight to UNLIMITED, 70 % of jobs of
unknown class placed as the default class A) made of repeated runs of applications with a
run-to-run noise (``--cv``). The site's GPUs have their campaign (3 % of them known outliers at
2-3x for class A, ``few_slow_gpus``); after a warm-up week (the history a site's store already
holds; its jobs are not counted) GPUs fault at ``--rate`` per 1,000 GPU-days for a month,
``--factors`` slower for class A (half as much for B, a tenth for C, nothing for D; with
``--fault-classes`` each fault hits a class drawn from those, its neighbours in the class order
less), repaired after ``--repair-days`` on average, ``--visible`` of them showing
thermal/hardware clock slowdowns to NVML. A job keeps the pace it started with.

The loop is the service's, built as ``slurm-pal sim run --faults`` builds it
(``sim/faults.py``): its detector hears each job with the class the advisor placed it as (an
unknown job's default class A, not its true class) and takes NVML's signals as evidence for
every class; a re-measure confirmed is taken incrementally (``SuspicionDetector.rescore``).

Five placements on the same trace, GPUs and faults per seed (``--arms`` picks some):

- ``packing``: Slurm's own (``packed-sticky``);
- ``no-loop``: the advisor as shipped (``packed-pm``, default settings), campaign scores only;
- ``loop``: the same, with every ended job's record fed to ``SuspicionDetector`` and its
  suspects handed to placement as outliers for the classes they hurt;
- ``remeasure``: the same with the service's re-measurements (``advisor.remeasure``, decided
  by ``core/remeasure.py`` with the site's default limits): a suspect GPU's class benchmark,
  run when a round leaves it and its gres label-mates on its node idle (GPUs of one PM
  signature there; the job holds them, other jobs keep the node's other GPUs), confirms (the
  measured time becomes its score) or clears the suspicion; the detector's candidates (half
  the alarm, or tied with a partner) are measured too; a GPU found slow is measured for its
  other classes, kept off for each class it was found 1.3x or more slower for than its
  campaign said, and measured again to see it recover; with budget left, an idle GPU not
  measured for class A for a week (``advisor.remeasure_routine_s``) is measured routinely;
- ``oracle``: the same, told each fault the moment it happens (classes slowed >= 1.3x).

Printed, first: per kind of fault (factor, class hit, whether NVML sees it) the faults each
loop flagged before their repair, the GPU-hours the faults added to the jobs they slowed
>= 1.3x in each arm, and each loop's saving of them as a share of the oracle's (what steering
is for); false suspicions of GPUs no fault touched per 10k records. Then the detection delay
per fault factor (the faulty GPU's jobs of the class it hits, all its jobs and hours from the
fault to suspicion; a fault repaired or still unseen at the end is censored, so median and
p90 are Kaplan-Meier estimates), the re-measure jobs and what they found, and the run time
(not GPU time) the faults added. Average JCT only with ``--jct``: it is no measure of
steering (with 10x the faults a loop "beat" the oracle, which knows more, while saving half
its fault time: JCT also moves with what the schedule does around GPUs marked slow).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.core.workload import SimJob, site_like_workload
from slurm_pal.sim import SimConfig, simulate
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.sim.experiments import PairedRatios
from slurm_pal.sim.faults import FaultPlan, fault_kind
from slurm_pal.sim.loop import application_workload, fault_model
from slurm_pal.sim.variability import few_slow_gpus

CLASSES = ("A", "B", "C", "D")
ARMS = ("packing", "no-loop", "loop", "remeasure", "oracle")
LOOP_OF = {
    "packing": "none",
    "no-loop": "none",
    "loop": "detector",
    "remeasure": "remeasure",
    "oracle": "oracle",
}
LOOPS = ("loop", "remeasure")
"""The arms with a detector: runtime and signal evidence from job ends, and that plus the
service's re-measure jobs on idle GPUs (with their label-mates)."""
TARGETS = {1.5: 5, 2.0: 3}
"""Fault factor -> the median number of the GPU's class-A jobs by which it must be suspect."""
GAP_TARGET = 0.8
COST_UNITS = (("h", "slowed_h", "saved_share"), ("gpu_h", "added_gpu_h", "saved_gpu_share"))
"""What a fault costs, each unit with its per-fault field and its saving's name in the report."""


@dataclass(frozen=True)
class Setup:
    gpus: int
    days: float
    warmup_days: float
    cv: float
    rate: float
    factors: tuple[float, ...]
    repair_days: float
    visible: float
    load: float
    classes: tuple[str, ...] = ()


def workload(setup: Setup, seed: int) -> list[SimJob]:
    """A site-like history over warm-up + month; only the month's jobs are tracked."""
    span = (setup.warmup_days + setup.days) * 86400.0
    estimate = 2 * int(span / 3600.0 * setup.gpus * setup.load / 17.0) + 100
    jobs = site_like_workload(setup.gpus, load=setup.load, n_jobs=estimate, seed=seed)
    jobs = [job for job in jobs if job.submit_time <= span]
    if jobs[-1].submit_time < 0.9 * span:
        raise RuntimeError("the generated history is shorter than asked; raise the estimate")
    start = setup.warmup_days * 86400.0
    jobs = [job if job.submit_time >= start else replace(job, tracked=False) for job in jobs]
    return application_workload(jobs, cv=setup.cv, seed=seed)


def one_run(setup: Setup, seed: int, arm: str) -> dict[str, object]:
    jobs = workload(setup, seed)
    gpus = few_slow_gpus(CLASSES, setup.gpus // 4, 4, seed=seed)
    plan = FaultPlan(
        setup.rate, setup.factors, setup.visible, setup.classes, setup.repair_days,
        setup.warmup_days,
    )  # fmt: skip
    faults = fault_model(
        setup.gpus,
        setup.days,
        per_1000_gpu_days=setup.rate,
        factors=setup.factors,
        repair_days=setup.repair_days,
        visible_share=setup.visible,
        start_days=setup.warmup_days,
        seed=seed,
        classes=setup.classes,
    )
    site = SiteConfig()
    if arm == "packing":
        config = SimConfig(placement="packed-sticky", mode="slurm", seed=seed)
    else:
        config = SimConfig(mode="slurm", seed=seed, **advisor_sim_options(site))  # type: ignore[arg-type]
    # The service's loop (sim/faults.py, as `sim run --faults` builds it): its detector (the
    # advised class, signals accusing every class), re-measures, steering.
    loop = plan.hooks(gpus, faults, site.advisor, seed, loop=LOOP_OF[arm])
    faulty = {loop.uuids[f.gpu] for f in faults}
    started = time.perf_counter()
    result = simulate(jobs, gpus, config, hooks=loop)
    jcts = result.jcts()
    return {
        "seed": seed,
        "arm": arm,
        "avg_jct": float(np.mean(jcts)),
        "jobs": len(jcts),
        "records": loop.records,
        "seconds": time.perf_counter() - started,
        "faults": [
            {
                "kind": fault_kind(o.fault, hit),
                "flagged": o.suspected_s is not None and o.suspected_s < o.fault.repair_s,
                "added_gpu_h": o.slowed_gpu_s / 3600.0,
                "factor": o.fault.factor,
                "visible": o.fault.visible,
                "at_h": o.fault.at_s / 3600.0,
                "repaired_h": o.fault.repair_s / 3600.0
                if math.isfinite(o.fault.repair_s)
                else None,
                "suspected": o.suspected_s is not None,
                "sensitive_jobs": o.sensitive_jobs,
                "jobs": o.jobs,
                "slowed_jobs": o.slowed_jobs,
                "slowed_h": o.slowed_s / 3600.0,
                "late_jobs": o.late_jobs,
                "late_h": o.late_s / 3600.0,
                "mild_h": o.mild_s / 3600.0,
                "hours": (o.delay_s if o.delay_s is not None else _censored_s(o, result)) / 3600.0,
            }
            for o, hit in zip(loop.outcomes, loop.hits, strict=True)
        ],
        "false_suspicions": len(loop.false_suspicions),
        "late_suspicions": len(loop.late_suspicions),
        "weak_suspicions": len(loop.weak_suspicions),
        "probes": loop.probes_run,
        "probe_h": loop.probe_s_spent / 3600.0,
        "confirmed": sum(v.confirmed for *_, again, v in loop.verdicts if not again),
        "cleared": sum(not v.confirmed for *_, again, v in loop.verdicts if not again),
        "cleared_healthy": sum(
            not v.confirmed and gpu not in faulty
            for gpu, *_, again, v in loop.verdicts
            if not again
        ),
        "recovered": sum(v.confirmed for *_, again, v in loop.verdicts if again),
    }


def _censored_s(outcome, result) -> float:
    """How long an unseen fault was watched: to its repair, or to the last job's end."""
    last = max(job.end for job in result.jobs if job.end is not None)
    return max(0.0, min(outcome.fault.repair_s, last) - outcome.fault.at_s)


def km_quantile(times: list[float], events: list[bool], q: float) -> float:
    """Kaplan-Meier: the smallest time by which a share ``q`` of faults is expected seen
    (inf when the curve never gets there). Censored faults count while they were watched."""
    order = sorted(zip(times, events, strict=True), key=lambda p: (p[0], not p[1]))
    at_risk = len(order)
    surviving = 1.0
    for t, event in order:
        if event:
            surviving *= 1.0 - 1.0 / at_risk
            if 1.0 - surviving >= q - 1e-12:
                return float(t)
        at_risk -= 1
    return math.inf


def detection(runs: list[dict[str, object]], arm: str) -> dict[str, object]:
    faults = [f for r in runs if r["arm"] == arm for f in r["faults"]]  # type: ignore[union-attr]
    out: dict[str, object] = {}
    for factor in sorted({f["factor"] for f in faults}):
        for label, keep in (
            ("all", lambda f: True),
            ("runtime-only", lambda f: not f["visible"]),
            ("visible", lambda f: f["visible"]),
        ):
            group = [f for f in faults if f["factor"] == factor and keep(f)]
            if not group:
                continue
            events = [bool(f["suspected"]) for f in group]
            row: dict[str, object] = {"faults": len(group), "suspected": sum(events)}
            for unit in ("sensitive_jobs", "jobs", "hours"):
                times = [float(f[unit]) for f in group]
                row[unit] = {
                    "median": km_quantile(times, events, 0.5),
                    "p90": km_quantile(times, events, 0.9),
                }
            out[f"{factor:g}x {label}"] = row
    return out


def _bootstrap(share, n: int) -> list[float]:
    """95 % interval of ``share`` (a function of the picked seeds) over paired resamples."""
    rng = np.random.default_rng(0)
    boot = [share(rng.integers(0, n, n)) for _ in range(4000)]
    boot = [b for b in boot if math.isfinite(b)]
    return np.quantile(boot, [0.025, 0.975]).tolist() if boot else [math.nan, math.nan]


def _table(runs: list[dict[str, object]], value) -> tuple[list[int], dict[str, np.ndarray]]:
    seeds = sorted({int(r["seed"]) for r in runs})  # type: ignore[call-overload]
    got = {(r["arm"], r["seed"]): value(r) for r in runs}
    arms = [arm for arm in ARMS if all((arm, s) in got for s in seeds)]
    return seeds, {arm: np.array([got[(arm, s)] for s in seeds]) for arm in arms}


def jct_figures(runs: list[dict[str, object]]) -> dict[str, object]:
    seeds, table = _table(runs, lambda r: float(r["avg_jct"]))
    out: dict[str, object] = {
        "seeds": seeds,
        "avg_jct_h": {arm: (v / 3600.0).round(3).tolist() for arm, v in table.items()},
    }
    if "no-loop" not in table:
        return out
    ratios = {
        f"{arm} / no-loop": PairedRatios.of(list(table[arm] / table["no-loop"])).summary()
        for arm in table
        if arm != "no-loop"
    }
    out["ratios"] = ratios
    if "oracle" not in table:
        return out
    out["gap_h"] = float(np.mean(table["no-loop"] - table["oracle"]) / 3600.0)
    # The gap in log terms over the geomeans, with a paired bootstrap over the seeds.
    logs = {arm: np.log(v) for arm, v in table.items()}
    for arm in LOOPS:
        if arm not in table:
            continue
        ratios[f"{arm} / oracle"] = PairedRatios.of(list(table[arm] / table["oracle"])).summary()

        def share(pick: np.ndarray, arm: str = arm) -> float:
            return _recovered(logs["no-loop"], logs[arm], logs["oracle"], pick, np.mean)

        out[f"{arm} gap_recovered"] = share(np.arange(len(seeds)))
        out[f"{arm} gap_recovered_ci95"] = _bootstrap(share, len(seeds))
    return out


def _recovered(
    before: np.ndarray, after: np.ndarray, target: np.ndarray, pick: np.ndarray, reduce
) -> float:
    """The share of the ``before`` -> ``target`` difference that ``after`` closes over the
    seeds ``pick`` (``reduce``: mean of logs for JCT, sum for hours); NaN without a gap."""
    gap = float(reduce(before[pick] - target[pick]))
    won = float(reduce(before[pick] - after[pick]))
    return won / gap if gap > 0 else math.nan


def fault_cost(runs: list[dict[str, object]]) -> dict[str, object]:
    """The run time the faults added to the jobs they slowed >= 1.3x (the jobs the oracle keeps
    off), per arm and seed, and the share of the no-loop -> oracle difference each loop saves
    (summed over seeds; bootstrap over them); the same for GPU time (run time times the job's
    GPUs: a wide job's few runs weigh more, so it moves more between seeds). Less noisy than
    average JCT: it does not see how the rest of the schedule shifted."""
    out: dict[str, object] = {}
    for unit, key, name in COST_UNITS:
        seeds, table = _table(runs, lambda r, key=key: sum(float(f[key]) for f in r["faults"]))
        out[f"added_{unit}"] = {arm: v.round(1).tolist() for arm, v in table.items()}
        for arm in LOOPS:
            if arm not in table or "no-loop" not in table or "oracle" not in table:
                continue

            def share(pick: np.ndarray, arm: str = arm, table=table) -> float:
                return _recovered(table["no-loop"], table[arm], table["oracle"], pick, np.sum)

            out[f"{arm} {name}"] = share(np.arange(len(seeds)))
            out[f"{arm} {name}_ci95"] = _bootstrap(share, len(seeds))
    for arm in LOOPS:
        if any(r["arm"] == arm for r in runs):
            late = sum(float(f["late_h"]) for r in runs if r["arm"] == arm for f in r["faults"])  # type: ignore[union-attr]
            out[f"{arm} after_suspicion_h"] = late
    return out


def per_kind(runs: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """Per kind of fault (factor, class hit, what NVML sees), over the seeds: for each loop
    the faults flagged before their repair, and for each arm the GPU-hours the faults added to
    the jobs they slowed >= 1.3x; each loop's saving against the oracle's (no-loop minus loop
    over no-loop minus oracle; the same faults in every arm of a seed)."""
    out: dict[str, dict[str, object]] = {}
    for r in runs:
        for f in r["faults"]:  # type: ignore[union-attr]
            row = out.setdefault(f["kind"], {"faults": 0, "flagged": {}, "added_gpu_h": {}})
            arm = str(r["arm"])
            if arm == "no-loop":
                row["faults"] += 1  # type: ignore[operator]
            if arm in LOOPS:
                flagged = row["flagged"]
                flagged[arm] = flagged.get(arm, 0) + int(f["flagged"])  # type: ignore[union-attr, attr-defined]
            added = row["added_gpu_h"]
            added[arm] = added.get(arm, 0.0) + float(f["added_gpu_h"])  # type: ignore[union-attr, attr-defined]
    total: dict[str, float] = {}
    for row in out.values():
        for arm, value in row["added_gpu_h"].items():  # type: ignore[union-attr]
            total[arm] = total.get(arm, 0.0) + value
    out["all"] = {"faults": sum(int(row["faults"]) for row in out.values()),  # type: ignore[call-overload]
                  "flagged": {arm: sum(int(row["flagged"].get(arm, 0)) for row in out.values())  # type: ignore[union-attr]
                              for arm in LOOPS if arm in total},
                  "added_gpu_h": total}  # fmt: skip
    for row in out.values():
        added = row["added_gpu_h"]
        base, best = added.get("no-loop"), added.get("oracle")  # type: ignore[union-attr]
        row["saved_of_oracle"] = {
            arm: (base - added[arm]) / (base - best)  # type: ignore[index, operator]
            for arm in LOOPS
            if base is not None and best is not None and arm in added and base - best > 0  # type: ignore[operator]
        }
    return dict(sorted(out.items()))


def loop_counts(runs: list[dict[str, object]], arm: str) -> dict[str, float]:
    keys = ("false_suspicions", "late_suspicions", "weak_suspicions", "records", "probes",
            "probe_h", "confirmed", "cleared", "cleared_healthy", "recovered")  # fmt: skip
    mine = [r for r in runs if r["arm"] == arm]
    return {key: sum(float(r.get(key, 0)) for r in mine) for key in keys}  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--warmup-days", type=float, default=7.0)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--cv", type=float, default=0.07, help="run-to-run noise of an app")
    parser.add_argument("--rate", type=float, default=3.0, help="faults per 1,000 GPU-days")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.5, 2.0])
    parser.add_argument("--repair-days", type=float, default=14.0)
    parser.add_argument("--visible", type=float, default=0.5, help="share NVML sees")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--fault-classes", nargs="+", default=[], choices=CLASSES,
        help="the class each fault slows most, drawn per fault (default: A)",
    )  # fmt: skip
    parser.add_argument("--jct", action="store_true", help="also print average JCT")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    setup = Setup(
        args.gpus,
        args.days,
        args.warmup_days,
        args.cv,
        args.rate,
        tuple(args.factors),
        args.repair_days,
        args.visible,
        args.load,
        tuple(args.fault_classes),
    )
    arms = [arm for arm in ARMS if arm in args.arms]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    tasks = [(s, arm) for s in seeds for arm in arms]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(
            pool.map(one_run, [setup] * len(tasks), [s for s, _ in tasks], [a for _, a in tasks])
        )
    loops = [arm for arm in LOOPS if arm in arms]
    report = {
        "setup": setup.__dict__,
        "per_kind": per_kind(runs),
        "detection": {arm: detection(runs, arm) for arm in loops},
        "counts": {arm: loop_counts(runs, arm) for arm in loops},
        "jct": jct_figures(runs),
        "fault_cost": fault_cost(runs),
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=1, default=float)
        print()
        return 0
    print_report(report, jct=args.jct)
    return 0


def print_kinds(report: dict[str, object]) -> None:
    """First: per kind of fault, flagged before repair and the fault GPU-hours saved."""
    kinds = report["per_kind"]
    print("\nper kind of fault (all seeds): flagged before repair; fault GPU-hours (added to")
    print("jobs slowed >= 1.3x) per arm; each loop's saving as a share of the oracle's")
    for kind, row in kinds.items():  # type: ignore[union-attr]
        flagged = "  ".join(f"{arm} {n}/{row['faults']}" for arm, n in row["flagged"].items())
        added = "  ".join(f"{arm} {h:.0f}" for arm, h in row["added_gpu_h"].items())
        saved = "  ".join(f"{arm} {v:.0%}" for arm, v in row["saved_of_oracle"].items())
        print(f"  {kind:<28} flagged: {flagged}")
        print(f"  {'':<28} GPU-h: {added}")
        if saved:
            print(f"  {'':<28} saved of the oracle's: {saved}")
    for arm, n in report["counts"].items():  # type: ignore[union-attr]
        per_10k = 1e4 * n["false_suspicions"] / max(n["records"], 1)
        print(f"  {arm}: false suspicions {n['false_suspicions']:.0f} over {n['records']:.0f} "
              f"records ({per_10k:.2f} per 10k)")  # fmt: skip


def print_report(report: dict[str, object], jct: bool = False) -> None:
    setup = report["setup"]
    print(f"closed loop, simulated: {setup}")
    print_kinds(report)
    for arm, rows in report["detection"].items():  # type: ignore[union-attr]
        print(
            f"\n{arm}: detection (the GPU's jobs of the class hit / all its jobs / hours, fault ->"
        )
        print(
            "suspect; Kaplan-Meier median and p90, faults repaired or unseen at the end censored)"
        )
        for key, row in rows.items():
            cells = "  ".join(
                f"{unit} {_num(row[unit]['median'])} / {_num(row[unit]['p90'])}"
                for unit in ("sensitive_jobs", "jobs", "hours")
            )
            print(f"  {key:<18} {row['suspected']:>3}/{row['faults']:<3} suspected   {cells}")
        n = report["counts"][arm]  # type: ignore[index]
        print(
            f"  false suspicions (GPUs no fault touched): {n['false_suspicions']:.0f} over "
            f"{n['records']:.0f} job records; after a repair: {n['late_suspicions']:.0f}; "
            f"faulty GPU, class slowed < 1.3x: {n['weak_suspicions']:.0f}"
        )
        if n["probes"]:
            print(
                f"  re-measure jobs: {n['probes']:.0f} ({n['probe_h']:.1f} GPU-h held); "
                f"confirmed {n['confirmed']:.0f}, cleared {n['cleared']:.0f} (of GPUs no fault "
                f"touched: {n['cleared_healthy']:.0f}), recovered {n['recovered']:.0f}"
            )
    print_cost(report)
    if jct:
        print_jct(report)
    print(f"\n{report['wall_s']:.0f} s")


def print_jct(report: dict[str, object]) -> None:
    """Average JCT: not a measure of steering (see the module docstring)."""
    jct = report["jct"]
    print("\naverage JCT (h) per seed", jct["seeds"])  # type: ignore[index]
    for arm, values in jct["avg_jct_h"].items():  # type: ignore[index]
        print(f"  {arm:<9} {values}")
    for name, s in jct.get("ratios", {}).items():  # type: ignore[union-attr]
        ratio = 1 - s["geomean_gain"]
        low, high = (1 - s["gain_ci95"][1], 1 - s["gain_ci95"][0])
        print(
            f"  {name:<21} geomean {ratio:.4f} [{low:.4f}, {high:.4f}]  "
            f"worst {s['worst_ratio']:.4f} best {s['best_ratio']:.4f}"
        )
    for arm in LOOPS:
        if f"{arm} gap_recovered" not in jct:  # type: ignore[operator]
            continue
        low, high = jct[f"{arm} gap_recovered_ci95"]  # type: ignore[index]
        print(
            f"  gap no-loop -> oracle {jct['gap_h']:.3f} h on average; {arm} recovers "  # type: ignore[index]
            f"{jct[f'{arm} gap_recovered']:.0%} [{low:.0%}, {high:.0%}] "  # type: ignore[index]
            f"(target >= {GAP_TARGET:.0%})"
        )


def print_cost(report: dict[str, object]) -> None:
    cost = report["fault_cost"]
    for unit, _, name in COST_UNITS:
        what = "run time" if unit == "h" else "GPU time"
        print(f"\n{what} the faults added to jobs they slowed >= 1.3x ({unit}, per seed)")
        for arm, values in cost[f"added_{unit}"].items():  # type: ignore[index]
            print(f"  {arm:<9} {values}  total {sum(values):.0f}")
        for arm in LOOPS:
            if f"{arm} {name}" not in cost:  # type: ignore[operator]
                continue
            low, high = cost[f"{arm} {name}_ci95"]  # type: ignore[index]
            print(
                f"  {arm} saves {cost[f'{arm} {name}']:.0%} [{low:.0%}, {high:.0%}] of the "  # type: ignore[index]
                "no-loop -> oracle difference"
            )
    for arm in LOOPS:
        if f"{arm} after_suspicion_h" in cost:  # type: ignore[operator]
            print(f"  {arm}: {cost[f'{arm} after_suspicion_h']:.0f} h of run time from jobs "  # type: ignore[index]
                  "started after the GPU was suspect")  # fmt: skip


def _num(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
