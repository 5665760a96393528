"""Benchmark: choosing a class's bins (K sweep 2..11) for large campaigns.

Compares slurm-pal's 1-D K-Means + exact 1-D silhouette with the straightforward scikit-learn
route (KMeans(n_init=10) and silhouette_score per K), in the same process, on synthetic
per-GPU values shaped like a compute-bound class (two modes plus slow outliers).

    python benchmarks/binning.py [--gpus 256,4096,32768] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import silhouette_score

from slurm_pal.core.binning import PMBinner


def campaign(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    slow = rng.random(n) < 0.25
    values = 1.0 + 0.012 * rng.standard_normal(n) + 0.045 * slow
    values[rng.choice(n, size=max(1, n // 200), replace=False)] *= 2.2
    return values


def sklearn_sweep(x: np.ndarray, sample: int | None) -> int:
    """The obvious implementation: sklearn KMeans and silhouette_score for each K."""
    mean, std = x.mean(), x.std(ddof=1)
    regular = x[np.abs(x - mean) <= 3 * std].reshape(-1, 1)
    best_k, best_s = 2, -2.0
    for k in range(2, 12):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            labels = KMeans(n_clusters=k, n_init=10, random_state=0).fit_predict(regular)
        s = silhouette_score(regular, labels, sample_size=sample, random_state=0)
        if s > best_s:
            best_k, best_s = k, s
    return best_k


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="256,4096,32768")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results: dict[str, float | int] = {}
    for n in (int(v) for v in args.gpus.split(",")):
        x = campaign(n)
        ours_s, binner = timed(lambda v: PMBinner(min_gap=0.0).fit(v), x)
        # silhouette_score is O(n^2) memory/time: beyond 4,096 GPUs it only runs on a sample.
        sample = None if n <= 4096 else 4096
        ref_s, ref_k = timed(sklearn_sweep, x, sample)
        results[f"slurm_pal_s_{n}"] = round(ours_s, 4)
        results[f"sklearn_s_{n}"] = round(ref_s, 4)
        results[f"speedup_{n}"] = round(ref_s / ours_s, 1)
        results[f"k_{n}"] = int(binner.k_)
        results[f"sklearn_k_{n}"] = int(ref_k)
        if not args.json:
            note = " (sklearn silhouette on a 4,096 sample)" if sample else ""
            print(
                f"{n:>6} GPUs: slurm-pal {ours_s * 1000:8.1f} ms (K={binner.k_}), "
                f"scikit-learn {ref_s * 1000:9.1f} ms (K={ref_k}){note}: "
                f"{ref_s / ours_s:6.1f}x"
            )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
