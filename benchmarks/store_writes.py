"""The advisor's store writer under a burst: group commit against one commit per write.

    .venv/bin/python benchmarks/store_writes.py              # ~10 s
    .venv/bin/python benchmarks/store_writes.py --burst 5000 --json

Every submit's decision is saved by the one writer thread after the answer; every Epilog's
record is written in the urgent lane and its hook waits for it (up to the Epilog's 900 ms).
A commit waits for the disk (an fsync in WAL mode), so one commit per decision makes a burst
of submits a queue of seconds. Both arms run in this process on the same disk: ``--burst``
decision saves are queued at once, then one urgent record; reported are the time to drain
the burst, the urgent record's wait, and the ratio of the grouped writer (shipped,
``max_batch`` 256) to one commit per write (``max_batch`` 1, the writer before grouping).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from slurm_pal.advisor.state import StoreWriter

JOB = {"user": "alice", "partition": "gpu", "tres_per_node": "gres/gpu:2", "script_hash": "x"}
ANSWER = {"action": "route", "gres": "gpu:v100_a:2", "class": "A"}
RECORD = {"kind": "epilog", "job_id": 1, "node": "n01", "gpus": [0, 1], "record_id": "r1"}


def run_arm(folder: Path, burst: int, max_batch: int) -> dict[str, float]:
    writer = StoreWriter(folder / f"advisor-{max_batch}.db", max_batch=max_batch)
    try:
        writer.call(lambda s: None)  # migrations done before the clock starts
        start = time.perf_counter()
        saves = [
            writer.submit(lambda s, t=f"t{i}": s.save_decision(t, JOB, ANSWER, state="reserved"))
            for i in range(burst)
        ]
        queued = time.perf_counter()
        record = writer.submit(lambda s: s.add_job_record(dict(RECORD)), urgent=True)
        record.result(600)
        record_s = time.perf_counter() - queued
        for future in saves:
            future.result(600)
        drained_s = time.perf_counter() - start
    finally:
        writer.close()
    return {
        "drain_s": drained_s,
        "record_wait_ms": record_s * 1e3,
        "per_write_ms": drained_s / burst * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=1000, help="decision saves queued at once")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pal-store-writes-") as tmp:
        single = run_arm(Path(tmp), args.burst, max_batch=1)
        grouped = run_arm(Path(tmp), args.burst, max_batch=256)
    result = {
        "burst": args.burst,
        "one_commit_each": single,
        "grouped": grouped,
        "drain_speedup": single["drain_s"] / grouped["drain_s"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.burst} decision saves queued at once, then one Epilog record (urgent lane)")
    for name, arm in (("one commit per write", single), ("grouped (shipped)", grouped)):
        print(
            f"  {name:22s} drain {arm['drain_s']:7.3f} s  ({arm['per_write_ms']:.3f} ms/write)"
            f"  record waited {arm['record_wait_ms']:8.1f} ms"
        )
    print(f"  grouped drains the burst {result['drain_speedup']:.1f}x faster")


if __name__ == "__main__":
    main()
