"""Placement speed: time per decision, the speedup over PAL's enumerating code, one full round.

Setup: clusters of 256, 4,096 and 32,768 GPUs, 8 per node, half of the GPUs busy;
jobs of 1, 2, 4, 8 and 16 GPUs; 4 classes (A-D) with about 10 bins each plus a few outliers.

- ``p50_ms_<G>`` / ``p99_ms_<G>``: one PAL decision (``PALPolicy.place``) on G GPUs;
  ``pmfirst_...`` PM-First's, ``packedpm_...`` the shipped default's (packed-pm, outliers wait).
- ``speedup_vs_enumeration_256``: the same 4-GPU decisions made by a reference written the way
  PAL's ``placement/pal.py`` works (pandas frames, ``itertools.combinations`` over every node
  with enough GPUs under the threshold, the max score of each combination), as a ratio of median
  times per decision, each side timed back to back (warm caches, like the p50/p99 figures and a
  round). ``speedup_interleaved_vs_enumeration_256`` times them request by request in turn, so
  each decision starts with caches the other code just used (a lone decision in a busy advisor).
  ``speedup_vs_python_enumeration_256`` uses a plain-Python version of the same enumeration, to
  separate the algorithm from pandas overhead. Both references must reach the same LV products
  (``reference_mismatches`` counts the decisions where they do not).
- ``p50_ms_32768_switches`` / ``p99_ms_32768_switches``: the same on 32,768 GPUs under 128 leaf
  switches (three locality levels).
- ``round_s_1000x32768``: ``plan_round`` with PAL for 1,000 pending jobs on 32,768 GPUs;
  ``packedpm_round_s_1000x32768`` the same round with the shipped default.

Run ``python benchmarks/placement.py`` (about a minute on 2 cores), ``--quick`` for a smoke run,
``--json`` for one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from slurm_pal.adapters.config import AdvisorConfig
from slurm_pal.core.cluster import Cluster, GpuSpec
from slurm_pal.core.placement import PALPolicy, PMFirstPolicy, configured_policy
from slurm_pal.core.queue import plan_round
from slurm_pal.core.request import PlacementRequest
from slurm_pal.core.topology import Topology

CLASSES = ("A", "B", "C", "D")
JOB_SIZES = (1, 2, 4, 8, 16)
GPUS_PER_NODE = 8
L_ACROSS = 1.7


def make_cluster(n_gpus: int, seed: int = 0, nodes_per_switch: int = 0) -> Cluster:
    """A synthetic cluster: per class 10 K-Means-like bins (spread grows from class D to A) and
    0.5 % outliers with their own score; half of the GPUs busy. With ``nodes_per_switch`` the
    nodes hang off leaf switches (within-switch penalty 1.3, across switches 1.7)."""
    rng = np.random.default_rng(seed)
    n_nodes = n_gpus // GPUS_PER_NODE
    scores: dict[str, np.ndarray] = {}
    for position, name in enumerate(CLASSES):
        spread = 0.12 / (position + 1)
        bins = np.sort(np.round(1.0 + rng.normal(0.0, spread, 10), 4).clip(0.5))
        weights = np.exp(-0.5 * ((bins - 1.0) / spread) ** 2)
        values = rng.choice(bins, size=n_gpus, p=weights / weights.sum())
        outliers = rng.random(n_gpus) < 0.005
        values[outliers] = np.round(rng.uniform(1.5, 3.0, outliers.sum()), 4)
        scores[name] = values
    gpus = [
        GpuSpec(
            uuid=f"GPU-{gpu:06d}",
            node=f"node{gpu // GPUS_PER_NODE:05d}",
            index=gpu % GPUS_PER_NODE,
            model="v100",
            scores={name: float(scores[name][gpu]) for name in CLASSES},
        )
        for gpu in range(n_nodes * GPUS_PER_NODE)
    ]
    topology = Topology.flat(across_nodes=L_ACROSS)
    if nodes_per_switch:
        leaf = {f"node{node:05d}": f"leaf{node // nodes_per_switch}" for node in range(n_nodes)}
        topology = Topology(leaf, within_switch=1.3, across_switches=L_ACROSS)
    cluster = Cluster.from_gpus(gpus, topology)
    busy = rng.choice(cluster.n_gpus, cluster.n_gpus // 2, replace=False)
    cluster.allocate(busy)
    return cluster


def make_requests(
    count: int, seed: int, sizes: tuple[int, ...] = JOB_SIZES
) -> list[PlacementRequest]:
    rng = np.random.default_rng(seed)
    return [
        PlacementRequest(f"job{i}", str(rng.choice(CLASSES)), int(sizes[i % len(sizes)]))
        for i in range(count)
    ]


def time_decisions(
    place: Callable[[PlacementRequest], object], requests: list[PlacementRequest]
) -> list[float]:
    """Seconds per call."""
    durations = []
    for request in requests:
        start = time.perf_counter()
        place(request)
        durations.append(time.perf_counter() - start)
    return durations


def percentile_ms(durations: list[float], q: float) -> float:
    return float(np.percentile(durations, q) * 1000.0)


# --- the enumerating references ---------------------------------------------------------------


def _lv_order(bin_scores: list[float]) -> list[tuple[float, int, float]]:
    """PAL's ``order[key]``: (sf, 1 within / 0 across, product), sorted by product."""
    order = []
    for value in bin_scores:
        order.append((value, 1, 1.0 * value))
        order.append((value, 0, L_ACROSS * value))
    order.sort(key=lambda entry: entry[2])
    return order


def _pmfirst_frame(df: pd.DataFrame, n: int) -> list[int]:
    df = df.copy()
    df["locality_score"] = df.groupby(["sf", "Node_ID"])["Node_ID"].transform("count")
    df["locality_score"] = (df["locality_score"] - n).abs()
    df = df.sort_values(by=["sf", "locality_score"], ascending=[True, True])
    return df["GPU_ID"].head(n).tolist()


class PandasEnumeratingReference:
    """PAL's ``_pal_placement`` as its code does it, on pandas frames of the free GPUs."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.frames = {
            name: pd.DataFrame(
                {
                    "GPU_ID": np.arange(cluster.n_gpus),
                    "Node_ID": cluster.gpu_node,
                    "sf": klass.scores,
                }
            )
            for name, klass in cluster.classes.items()
        }
        self.orders = {
            name: _lv_order(list(klass.bin_scores)) for name, klass in cluster.classes.items()
        }

    def place(self, request: PlacementRequest) -> list[int]:
        n = request.gpus
        df_data = self.frames[request.job_class]
        df_data = df_data[df_data["GPU_ID"].isin(np.flatnonzero(self.cluster.free))]
        if 1 < n <= GPUS_PER_NODE:
            for sf, within, _product in self.orders[request.job_class]:
                df_lsf = df_data[df_data["sf"] <= sf]
                if within:
                    counts = df_lsf["Node_ID"].value_counts()
                    valid_node_ids = counts[counts >= n].index
                    if len(valid_node_ids) > 0:
                        all_combos = []
                        for node_id in valid_node_ids:
                            filt_df = df_lsf[df_lsf["Node_ID"] == node_id]
                            for combo in itertools.combinations(filt_df["GPU_ID"], n):
                                sf_val = filt_df[filt_df["GPU_ID"].isin(combo)]["sf"].max()
                                all_combos.append((combo, sf_val))
                        all_combos.sort(key=lambda pair: pair[1])
                        return list(all_combos[0][0])
                elif df_lsf.shape[0] >= n:
                    return _pmfirst_frame(df_lsf, n)
            return []
        return _pmfirst_frame(df_data, n) if df_data.shape[0] >= n else []


class PythonEnumeratingReference:
    """The same enumeration (every combination of every eligible node) in plain Python."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.orders = {
            name: _lv_order(list(klass.bin_scores)) for name, klass in cluster.classes.items()
        }

    def place(self, request: PlacementRequest) -> list[int]:
        n = request.gpus
        cluster = self.cluster
        scores = cluster.classes[request.job_class].scores
        free = [
            (int(gpu), int(cluster.gpu_node[gpu]), float(scores[gpu]))
            for gpu in np.flatnonzero(cluster.free)
        ]
        if not 1 < n <= GPUS_PER_NODE:
            return [gpu for gpu, _, _ in sorted(free, key=lambda g: g[2])[:n]]
        for sf, within, _product in self.orders[request.job_class]:
            under = [g for g in free if g[2] <= sf]
            if within:
                by_node: dict[int, list[tuple[int, int, float]]] = {}
                for g in under:
                    by_node.setdefault(g[1], []).append(g)
                best: tuple[float, tuple[int, ...]] | None = None
                for gpus in by_node.values():
                    for combo in itertools.combinations(gpus, n):
                        worst = max(g[2] for g in combo)
                        if best is None or worst < best[0]:
                            best = (worst, tuple(g[0] for g in combo))
                if best is not None:
                    return list(best[1])
            elif len(under) >= n:
                counts = Counter((g[2], g[1]) for g in under)
                under.sort(key=lambda g: (g[2], abs(counts[(g[2], g[1])] - n)))
                return [g[0] for g in under[:n]]
        return []


def lv_of(cluster: Cluster, job_class: str, gpu_ids: list[int]) -> float:
    nodes = {int(cluster.gpu_node[g]) for g in gpu_ids}
    worst = float(cluster.classes[job_class].scores[gpu_ids].max())
    return worst * (1.0 if len(nodes) == 1 else L_ACROSS)


# --- the runs ---------------------------------------------------------------------------------


def run(quick: bool, log: Callable[[str], None]) -> dict[str, float | int | str]:
    sizes = (256, 4096, 32768)
    decisions = 400 if quick else 3000
    results: dict[str, float | int | str] = {"mode": "quick" if quick else "default"}
    pal, pmfirst = PALPolicy(), PMFirstPolicy()
    shipped = configured_policy(
        AdvisorConfig().policy,
        pack_tolerance=AdvisorConfig().pack_tolerance,
        avoid_above=AdvisorConfig().avoid_above,
        wait=AdvisorConfig().outliers == "wait",
    )
    clusters = {}
    for n_gpus in sizes:
        start = time.perf_counter()
        cluster = clusters[n_gpus] = make_cluster(n_gpus, seed=n_gpus)
        log(f"{n_gpus:>6} GPUs: cluster built in {time.perf_counter() - start:.2f} s")
        requests = make_requests(decisions, seed=1)
        for name, policy in (("", pal), ("pmfirst_", pmfirst), ("packedpm_", shipped)):
            durations = time_decisions(lambda r, p=policy, c=cluster: p.place(r, c), requests)
            results[f"{name}p50_ms_{n_gpus}"] = round(percentile_ms(durations, 50), 4)
            results[f"{name}p99_ms_{n_gpus}"] = round(percentile_ms(durations, 99), 4)
            log(
                f"{n_gpus:>6} GPUs: {policy.name:<8} p50 {percentile_ms(durations, 50):.3f} ms, "
                f"p99 {percentile_ms(durations, 99):.3f} ms over {len(durations)} decisions"
            )

    switched = make_cluster(32768, seed=7, nodes_per_switch=32)
    requests = make_requests(decisions, seed=1)
    durations = time_decisions(lambda r: pal.place(r, switched), requests)
    results["p50_ms_32768_switches"] = round(percentile_ms(durations, 50), 4)
    results["p99_ms_32768_switches"] = round(percentile_ms(durations, 99), 4)
    log(
        f" 32768 GPUs under 128 leaf switches: pal p50 {percentile_ms(durations, 50):.3f} ms, "
        f"p99 {percentile_ms(durations, 99):.3f} ms"
    )

    cluster = clusters[256]
    reference_requests = make_requests(30 if quick else 150, seed=2, sizes=(4,))
    references = {
        "": PandasEnumeratingReference(cluster),
        "python_": PythonEnumeratingReference(cluster),
    }
    # Back to back (each side warm, as in p50/p99 and in a round) ...
    ours = time_decisions(lambda r: pal.place(r, cluster), reference_requests)
    theirs = {
        label: time_decisions(reference.place, reference_requests)
        for label, reference in references.items()
    }
    # ... and interleaved (ours, then each reference, request by request): every decision starts
    # with caches the other code just used, as a lone decision in a busy advisor would.
    ours_cold: list[float] = []
    theirs_cold: dict[str, list[float]] = {label: [] for label in references}
    mismatches = 0
    for request in reference_requests:
        start = time.perf_counter()
        mine = pal.place(request, cluster).allocation
        ours_cold.append(time.perf_counter() - start)
        assert mine is not None
        for label, reference in references.items():
            start = time.perf_counter()
            ref_ids = reference.place(request)
            theirs_cold[label].append(time.perf_counter() - start)
            if not np.isclose(mine.lv_product, lv_of(cluster, request.job_class, ref_ids)):
                mismatches += 1
    for label in references:
        ratio = statistics.median(theirs[label]) / statistics.median(ours)
        cold = statistics.median(theirs_cold[label]) / statistics.median(ours_cold)
        results[f"speedup_vs_{label}enumeration_256"] = round(ratio, 1)
        results[f"speedup_interleaved_vs_{label}enumeration_256"] = round(cold, 1)
        results[f"{label}enumeration_median_ms_256"] = round(
            statistics.median(theirs[label]) * 1000, 4
        )
        log(
            f"   256 GPUs, 4-GPU jobs: {label or 'pandas_'}reference median "
            f"{statistics.median(theirs[label]) * 1000:.3f} ms vs PAL "
            f"{statistics.median(ours) * 1000:.3f} ms: {ratio:.1f}x back to back, "
            f"{cold:.1f}x interleaved (PAL {statistics.median(ours_cold) * 1000:.3f} ms)"
        )
    results["pal_median_ms_256_4gpu"] = round(statistics.median(ours) * 1000, 4)
    results["pal_interleaved_median_ms_256_4gpu"] = round(statistics.median(ours_cold) * 1000, 4)
    results["reference_mismatches"] = mismatches

    cluster = clusters[32768]
    queue = make_requests(1000, seed=3)
    for prefix, policy in (("", pal), ("packedpm_", shipped)):
        rounds = []
        for _ in range(1 if quick else 3):
            start = time.perf_counter()
            plan = plan_round(queue, cluster, policy, on_misfit="skip")
            rounds.append(time.perf_counter() - start)
        placed = sum(result.placed for result in plan)
        results[f"{prefix}round_s_1000x32768"] = round(statistics.median(rounds), 4)
        results[f"{prefix}round_jobs_placed"] = placed
        log(
            f" 32768 GPUs: {policy.name}, a round of 1000 jobs ({placed} placed) in "
            f"{statistics.median(rounds):.3f} s"
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args(argv)
    log = (lambda text: print(text, file=sys.stderr)) if args.json else print
    results = run(args.quick, log)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
