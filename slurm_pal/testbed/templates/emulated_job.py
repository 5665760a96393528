# Emulated GPU job of slurm-pal's testbed (stdlib only: it must start in milliseconds).
# Arguments: class=C base=SECONDS table=PATH records=DIR id=TRACE_ID submit=UNIX_TIME
# It sleeps base x max PM-score of its class over the GPUs Slurm gave it x the locality penalty
# (slurm_pal.testbed.emulate.job_slowdown is the same rule), and writes one JSON record.
import json
import os
import subprocess
import sys
import time

start = time.time()
args = dict(a.split("=", 1) for a in sys.argv[1:])
record = {
    "trace_id": args["id"],
    "job_id": os.environ.get("SLURM_JOB_ID", ""),
    "class": args["class"],
    "base": float(args["base"]),
    "submit": float(args["submit"]),
    "gpus_asked": int(args["gpus"]),
    "nodelist": os.environ.get("SLURM_JOB_NODELIST", ""),
    "start": start,
}
out_path = os.path.join(args["records"], args["id"] + ".json")
try:
    with open(args["table"]) as fh:
        table = json.load(fh)
    n_nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    if n_nodes > 1:  # SLURM_JOB_GPUS of every node: one step task per node prints its own
        out = subprocess.run(
            [
                "srun",
                "-N",
                str(n_nodes),
                "--ntasks-per-node=1",
                "sh",
                "-c",
                'echo "$SLURMD_NODENAME $SLURM_JOB_GPUS"',
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        per_node = {}
        for line in out.splitlines():
            node, _, indices = line.strip().partition(" ")
            if node:
                per_node[node] = [int(x) for x in indices.split(",") if x.strip()]
    else:
        per_node = {
            os.environ["SLURMD_NODENAME"]: [
                int(x) for x in os.environ.get("SLURM_JOB_GPUS", "").split(",") if x.strip()
            ]
        }
    worst, gpus = 0.0, []
    for node in sorted(per_node):
        for index in per_node[node]:
            gpu = table["nodes"][node][str(index)]
            worst = max(worst, float(gpu["scores"][record["class"]]))
            gpus.append([node, index, gpu["label"]])
    used = [n for n, idx in per_node.items() if idx]
    penalty = float(table["within_node" if len(used) <= 1 else "across_nodes"])
    slowdown = worst * penalty
    record.update(gpus=gpus, worst=worst, penalty=penalty, slowdown=slowdown)
    record["sleep_start"] = time.time()
    time.sleep(float(args["base"]) * slowdown)
    record["end"] = time.time()
    status = 0
except Exception as exc:  # the record says what went wrong; the job fails
    record["error"] = f"{type(exc).__name__}: {exc}"
    record["end"] = time.time()
    status = 1
tmp = out_path + ".tmp"
with open(tmp, "w") as fh:
    json.dump(record, fh)
os.replace(tmp, out_path)
sys.exit(status)
