"""Which job-end hook can carry the advisor's job-end round: the compute node's Epilog or the
controller's EpilogSlurmctld? Measured on the real Slurm (LocalSlurm, one host, one GPU).

The round must run before Slurm gives the ending job's GPUs to a queued job, so what matters is
(1) whether Slurm keeps the GPUs allocated while the hook runs, and (2) how soon after the job's
end the hook starts. Each sample: job A holds the only GPU and ends; job B waits for it. The
hook under test writes its start time, sleeps ``--hold`` seconds, writes its end time. Timed:

- ``hook_start``: A's script ends (its last timestamp) -> the hook starts;
- ``b_start``: A's script ends -> B's script starts;
- ``held``: whether B started only after the hook had ended (Slurm held the GPU for it).

    python benchmarks/epilog_hooks.py               # 5 samples per hook
    python benchmarks/epilog_hooks.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_pal.testbed import LocalSlurm, NodeSpec, missing_binaries

HOOK = """#!/bin/sh
date +%s.%N > {root}/marks/hook-start-$SLURM_JOB_ID
sleep {hold}
date +%s.%N > {root}/marks/hook-end-$SLURM_JOB_ID
exit 0
"""


def _mark(root: Path, name: str, timeout_s: float = 60.0) -> float:
    path = root / "marks" / name
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"no {path} after {timeout_s:g} s")


def _sbatch(tb: LocalSlurm, root: Path, wrap: str) -> int:
    proc = subprocess.run(
        ["sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", f"--wrap={wrap}"],
        env=tb.env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout.strip().split(";")[0])


def measure(kind: str, samples: int, hold: float) -> dict[str, object]:
    """``kind``: "epilog" (slurm.conf Epilog, on the node) or "epilogslurmctld"."""
    root = Path(tempfile.mkdtemp(prefix="spal-eh-", dir="/tmp"))
    root.chmod(0o755)
    (root / "marks").mkdir(mode=0o777)
    hook = root / "hook.sh"
    hook.write_text(HOOK.format(root=root, hold=hold))
    hook.chmod(0o755)
    extra = ("EpilogSlurmctld=" + str(hook),) if kind == "epilogslurmctld" else ()
    tb = LocalSlurm(
        root,
        [NodeSpec("n01", ("ta",))],
        epilog=str(hook) if kind == "epilog" else None,
        extra_conf=extra,
    )
    rows = []
    try:
        tb.start()
        for n in range(samples):
            a = _sbatch(tb, root, f"sleep 1; date +%s.%N > {root}/marks/a-end-{n}")
            b = _sbatch(tb, root, f"date +%s.%N > {root}/marks/b-start-{n}")
            a_end = _mark(root, f"a-end-{n}")
            hook_start = _mark(root, f"hook-start-{a}")
            hook_end = _mark(root, f"hook-end-{a}")
            b_start = _mark(root, f"b-start-{n}")
            _mark(root, f"hook-end-{b}")  # B's own hook: the cluster is idle again
            rows.append(
                {
                    "hook_start_ms": round((hook_start - a_end) * 1000, 1),
                    "b_start_ms": round((b_start - a_end) * 1000, 1),
                    "held": b_start >= hook_end,
                }
            )
    finally:
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)
    starts = [r["hook_start_ms"] for r in rows]
    b_starts = [r["b_start_ms"] for r in rows]
    return {
        "hook": kind,
        "hold_s": hold,
        "samples": len(rows),
        "hook_start_ms_median": statistics.median(starts),  # type: ignore[type-var]
        "hook_start_ms_max": max(starts),  # type: ignore[type-var]
        "b_start_ms_median": statistics.median(b_starts),  # type: ignore[type-var]
        "held_every_time": all(r["held"] for r in rows),
        "held_count": sum(1 for r in rows if r["held"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the hook sleeps")
    parser.add_argument("--hooks", default="epilog,epilogslurmctld", help="comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = missing_binaries()
    if missing:
        print(f"Slurm not installed ({', '.join(missing)} missing)", file=sys.stderr)
        return 2
    results = [measure(kind, args.samples, args.hold) for kind in args.hooks.split(",")]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(
                f"{r['hook']:>16}: hook starts {r['hook_start_ms_median']} ms after the job "
                f"(max {r['hook_start_ms_max']}); the waiting job starts "
                f"{r['b_start_ms_median']} ms after; GPU held through the hook "
                f"{r['held_count']}/{r['samples']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
