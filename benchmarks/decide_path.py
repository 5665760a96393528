"""The submit path's decision in one process: what ``decide`` costs back to back and when
submissions come apart, and where its time goes.

Why: ``job_submit.lua`` waits for this inside slurmctld's locks. The testbed benchmarks
(``submit_latency.py``, ``submit_throughput.py``) measure it with Slurm around it, minutes a run
and noisy; this one isolates the decision (the wire job parsed, the service's engine deciding on
a labelled cluster, the answer encoded), so a change to the decide path can be compared against
the code before it in seconds, on a quiet or a busy machine alike (run both, alternately).

Setup: the example campaign (``--nodes`` x ``--gpus-per-node``, as the testbed: 4 x 4), stored
and labelled as ``slurm-pal serve`` loads it, the engine the site config sets up, every GPU free
(each decision is taken on the same cluster, as one submission at a time sees it). Jobs ask
``--gpus`` GPUs, class A (the class most often steered off slow GPUs).

Prints (``--json``: the same keys): ``back_to_back_us_p50`` / ``_p90``, ``gapped_us_p50`` /
``_p90`` (one decide after each ``--gap-ms`` of sleep: the code and its data go cold, as
between one user's submissions), ``gapped_over_back_to_back`` (p50 ratio), ``action`` (what the
decide answered). ``--profile`` adds cProfile's top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import SiteConfig
from slurm_pal.adapters.store import Store
from slurm_pal.advisor.loading import load_store
from slurm_pal.advisor.state import make_engine
from slurm_pal.advisor.view import Static, static_from
from slurm_pal.core.topology import Topology
from slurm_pal.engine.engine import AdvisorEngine
from slurm_pal.engine.jobdesc import JobDescription
from slurm_pal.example_campaign import generate_example_campaign


def build(nodes: int, gpus_per_node: int, root: Path) -> tuple[AdvisorEngine, Static]:
    """The engine, the free cluster and its labels, as the service loads them."""
    config = SiteConfig()
    csv = root / "campaign.csv"
    generate_example_campaign(nodes=nodes, gpus_per_node=gpus_per_node, node_prefix="n").to_csv(
        csv, index=False
    )
    db = root / "store.db"
    with Store(db) as store:
        store.ingest(
            [read_campaign_csv(csv, gpu_model="v100")],
            campaign_id="example",
            class_order=config.classes.names,
            binner=config.binning.binner(),
        )
        store.set_application_class("resnet", "A")
    loaded = load_store(config, db, None)
    assert loaded.labels is not None and loaded.campaign is not None, loaded.problem
    static = static_from(
        loaded.campaign,
        loaded.labels,
        loaded.specs,
        loaded.skipped,
        {},
        topology=Topology.flat(config.locality.across_switches),
        class_names=config.classes.names,
    )
    engine = make_engine(config.advisor.policy, config.advisor)
    return engine, static


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs each job asks for")
    parser.add_argument("-n", type=int, default=3000, help="back-to-back decides")
    parser.add_argument("--gapped", type=int, default=300, help="decides after a gap")
    parser.add_argument("--gap-ms", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="spal-decide-") as tmp:
        engine, static = build(args.nodes, args.gpus_per_node, Path(tmp))
    wire = {
        "user": "alice",
        "uid": 1000,
        "name": "train",
        "comment": "pal:app=resnet",
        "tres_per_node": f"gres:gpu:{args.gpus}",
        "time_limit": 240,
    }
    cluster, labels = static.cluster, static.labels
    counter = iter(range(10**9))

    def one() -> str:
        job = JobDescription.from_wire(wire)
        advice = engine.submit(
            job,
            job_class="A",
            class_reason="benchmark",
            cluster=cluster,
            labels=labels,
            partition_nodes=None,
            default_partition=None,
            token=f"{next(counter):012x}",
            now=time.time(),
        )
        advice.decision.to_wire()
        return advice.decision.action

    action = one()
    for _ in range(200):
        one()
    back: list[float] = []
    for _ in range(args.n):
        start = time.perf_counter()
        one()
        back.append((time.perf_counter() - start) * 1e6)
    gapped: list[float] = []
    for _ in range(args.gapped):
        time.sleep(args.gap_ms / 1000)
        start = time.perf_counter()
        one()
        gapped.append((time.perf_counter() - start) * 1e6)

    def p(values: list[float], q: float) -> float:
        return round(statistics.quantiles(values, n=100)[int(q * 100) - 1], 1)

    out = {
        "back_to_back_us_p50": p(back, 0.5),
        "back_to_back_us_p90": p(back, 0.9),
        "gapped_us_p50": p(gapped, 0.5),
        "gapped_us_p90": p(gapped, 0.9),
        "gapped_over_back_to_back": round(p(gapped, 0.5) / p(back, 0.5), 2),
        "action": action,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.n):
            one()
        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
