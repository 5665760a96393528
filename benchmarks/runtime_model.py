"""How well does the runtime model predict what a limited job runs? Against one site-wide share.

The wait rule weighs a job's wait against its expected runtime times the outlier's slowdown, and
its holders' ends at the share of their limits they are expected to use. This replays each
trace's limited jobs in submit order: every job is predicted from the jobs before it
(:class:`~slurm_pal.core.runtimes.RuntimeModel`, as the engine feeds it), then learned from.
Printed per trace family: the median factor by which each prediction misses the run time (2.0:
half or twice), and the root-mean-square error in hours, for

- ``site-wide``: the median share of their limits all earlier jobs used (the model before);
- ``nearest, median``: the median share of the jobs with the nearest limits (holders' ends);
- ``nearest, mean``: the mean share of the same (a job's own runtime, :meth:`predict`).

Then, as the service sees it: each job predicted from the jobs that had *ended* by its submit
(a job ends its run time after its submit: no queueing), with and without the jobs still
running then counted as censored observations (:meth:`RuntimeModel.predict`'s ``running``).

    python benchmarks/runtime_model.py            # 12 traces of each family with limits
    python benchmarks/runtime_model.py --runs 4
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path

import numpy as np

from slurm_pal.core.runtimes import EndedJob, RunningJob, RuntimeModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import production_gain  # the matrix's own trace families

FAMILIES = ("sia-x2", "site")
"""The families whose jobs have time limits (``sia`` has exact run times, ``philly-vc`` none)."""


def replay(family: str, runs: int) -> dict[str, tuple[float, float]]:
    """Per predictor: (median miss factor, RMSE in hours) over every limited job of ``runs``
    traces that the model could predict."""
    predictors = {
        "site-wide": lambda model, limit: model.limit_share,
        "nearest, median": lambda model, limit: model.share_of(limit),
        "nearest, mean": lambda model, limit: model.mean_share_of(limit),
    }
    errors: dict[str, list[float]] = {name: [] for name in predictors}
    squares: dict[str, list[float]] = {name: [] for name in predictors}
    for run in range(runs):
        model = RuntimeModel()
        for job in sorted(production_gain.trace(family, run), key=lambda j: j.submit_time):
            limit = job.time_limit
            if limit is None or not math.isfinite(limit):
                continue
            ran = min(job.work, limit)
            for name, share_of in predictors.items():
                share = share_of(model, limit)
                if share is not None and share > 0:
                    errors[name].append(abs(math.log(share * limit / ran)))
                    squares[name].append((share * limit - ran) ** 2)
            model.partial_fit(EndedJob(job.gpus, limit, job.work))
    return {
        name: (
            float(math.exp(np.median(errors[name]))),
            float(math.sqrt(np.mean(squares[name]))) / 3600.0,
        )
        for name in predictors
        if errors[name]
    }


def replay_in_time(family: str, runs: int) -> dict[str, tuple[float, float, int]]:
    """Per predictor: (median miss factor, RMSE in hours, jobs predicted) over every limited
    job of ``runs`` traces, each predicted from the jobs ended by its submit (``ended``) or
    from those and the jobs running then (``ended + running``, as the policy predicts;
    ``product-limit only``: the same without the floor of the longest a running job of the
    class has run)."""
    errors: dict[str, list[float]] = {"ended": [], "ended + running": [], "product-limit only": []}
    squares: dict[str, list[float]] = {name: [] for name in errors}
    for run in range(runs):
        model = RuntimeModel()
        ends: list[tuple[float, int, EndedJob]] = []
        running: dict[int, tuple[float, float, int]] = {}  # order -> (submit, limit, gpus)
        jobs = sorted(production_gain.trace(family, run), key=lambda j: j.submit_time)
        for order, job in enumerate(jobs):
            now = job.submit_time
            while ends and ends[0][0] <= now:
                _, done, ended = heapq.heappop(ends)
                running.pop(done, None)
                model.partial_fit(ended)
            limit = job.time_limit
            if limit is not None and math.isfinite(limit):
                ran = min(job.work, limit)
                seen = [RunningJob(g, lim, now - start) for start, lim, g in running.values()]
                share = model.mean_share_of(limit, seen)
                for name, predicted in (
                    ("ended", model.predict(job.gpus, limit)),
                    ("ended + running", model.predict(job.gpus, limit, seen)),
                    ("product-limit only", None if share is None else share * limit),
                ):
                    if predicted is not None and predicted > 0:
                        errors[name].append(abs(math.log(predicted / ran)))
                        squares[name].append((predicted - ran) ** 2)
            ran_for = job.work if limit is None else min(job.work, limit)
            heapq.heappush(ends, (now + ran_for, order, EndedJob(job.gpus, limit, ran_for)))
            running[order] = (now, limit if limit is not None else math.inf, job.gpus)
    return {
        name: (
            float(math.exp(np.median(errors[name]))),
            float(math.sqrt(np.mean(squares[name]))) / 3600.0,
            len(errors[name]),
        )
        for name in errors
        if errors[name]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12, help="traces per family")
    args = parser.parse_args()
    print(f"{'family':8} {'predictor':16} {'median miss':>12} {'RMSE h':>8} {'vs site-wide':>13}")
    for family in FAMILIES:
        figures = replay(family, args.runs)
        base = figures["site-wide"][0]
        for name, (miss, rmse) in figures.items():
            print(f"{family:8} {name:16} {miss:11.2f}x {rmse:8.1f} {miss / base:12.2f}x")
    print("\nfrom the jobs ended by each submit (no queueing), without and with running ones:")
    print(f"{'family':8} {'predictor':16} {'median miss':>12} {'RMSE h':>8} {'jobs':>6}")
    for family in FAMILIES:
        for name, (miss, rmse, count) in replay_in_time(family, args.runs).items():
            print(f"{family:8} {name:16} {miss:11.2f}x {rmse:8.1f} {count:6d}")


if __name__ == "__main__":
    main()
