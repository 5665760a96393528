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

``--paced N``: also N decision saves submitted as the service submits them (durable, nobody
waiting), one every ``--every-ms`` as in a burst of submissions, with the shipped writer
(which lingers up to ``SAVE_LINGER_S`` for more before a commit) and with ``linger_s=0`` (a
commit as soon as the queue is empty); reported is the writer's CPU per save (the process's
CPU less the submitting thread's: on the controller, the cores slurmctld needs).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from slurm_pal.advisor.state import StoreWriter
from slurm_pal.advisor.writer import SAVE_LINGER_S

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


def run_paced(folder: Path, saves: int, every_ms: float, linger_s: float) -> dict[str, float]:
    """``saves`` durable decision saves, one every ``every_ms``: the writer's CPU per save."""
    writer = StoreWriter(folder / f"paced-{linger_s}.db", linger_s=linger_s)
    try:
        writer.call(lambda s: None)
        process, mine = time.process_time(), time.thread_time()
        for i in range(saves):
            args = {"token": f"t{i}", "job": JOB, "answer": ANSWER, "state": "waiting"}
            writer.submit_durable("save_decision", args)
            time.sleep(every_ms / 1000)
        writer.call(lambda s: None)
        writer_cpu = (time.process_time() - process) - (time.thread_time() - mine)
    finally:
        writer.close()
    return {"linger_s": linger_s, "writer_cpu_ms_per_save": writer_cpu / saves * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=1000, help="decision saves queued at once")
    parser.add_argument("--paced", type=int, default=0, help="saves submitted one at a time")
    parser.add_argument("--every-ms", type=float, default=4.0, help="between paced saves")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pal-store-writes-") as tmp:
        single = run_arm(Path(tmp), args.burst, max_batch=1)
        grouped = run_arm(Path(tmp), args.burst, max_batch=256)
        paced = [
            run_paced(Path(tmp), args.paced, args.every_ms, linger)
            for linger in (0.0, SAVE_LINGER_S, 0.0, SAVE_LINGER_S)
            if args.paced
        ]
    result: dict[str, object] = {
        "burst": args.burst,
        "one_commit_each": single,
        "grouped": grouped,
        "drain_speedup": single["drain_s"] / grouped["drain_s"],
    }
    if paced:
        result["paced"] = {"saves": args.paced, "every_ms": args.every_ms, "runs": paced}
        base = [r["writer_cpu_ms_per_save"] for r in paced if not r["linger_s"]]
        shipped = [r["writer_cpu_ms_per_save"] for r in paced if r["linger_s"]]
        result["paced"]["lingering_cpu_x_base"] = sum(shipped) / sum(base)  # type: ignore[index]
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
    for run in paced:
        print(
            f"  {args.paced} saves {args.every_ms:g} ms apart, linger {run['linger_s']:g} s:"
            f" writer CPU {run['writer_cpu_ms_per_save']:.3f} ms/save"
        )
    if paced:
        print(f"  lingering: {result['paced']['lingering_cpu_x_base']:.2f}x the CPU")  # type: ignore[index]


if __name__ == "__main__":
    main()
