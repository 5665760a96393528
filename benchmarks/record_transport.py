"""What a job record costs over TCP with munge against the Unix socket, on the real Slurm.

Setup: LocalSlurm (one host, 2 nodes of 2 fake GPUs, its own munged), `slurm-pal serve` with
its TCP listener (``advisor.listen`` on loopback) and a job running on n01, so the advisor's
view shows it there. The same Prolog record of that job is sent ``--records`` times each way
by the hooks' own ``send_record`` (what a Prolog/Epilog and ``hook flush`` call):

- ``unix``: the ``record`` op on the Unix socket;
- ``tcp``: a fresh munge credential per send (``munge``), TCP, and the advisor's checks
  (``unmunge``, uid, the node's addresses from ``scontrol show node`` (cached), the job on
  the node from its view).

After the first, every send is a duplicate (the store keeps the record once), so the figures
are transport and checks, not the store write or a re-planning round.

    python benchmarks/record_transport.py             # 200 records each way
    python benchmarks/record_transport.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.hooks.spool import DeliveryError, request, send_record
from slurm_pal.testbed import LocalSlurm, NodeSpec, missing_binaries


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if missing_binaries():
        print("Slurm not installed: bash scripts/install-slurm.sh", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="spal-rt-", dir="/tmp"))
    root.chmod(0o755)
    work = root / "work"
    work.mkdir()
    sock, address = root / "adv" / "advisor.sock", f"127.0.0.1:{_free_port()}"
    munge_socket = root / "run" / "munge" / "munge.socket.2"
    config, db = work / "site.toml", work / "store.db"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\nrefresh_s = 1.0\nreplan_s = 0\n'
        f'labels_file = "{work / "site" / "labels.json"}"\nlisten = "{address}"\n'
        f'munge_socket = "{munge_socket}"\n[hooks]\nspool_dir = "{root / "spool"}"\n'
    )
    generate_example_campaign(nodes=2, gpus_per_node=2, node_prefix="n").to_csv(
        work / "ex.csv", index=False
    )
    for cli in (
        ["profile", "ingest", str(work / "ex.csv"), "--campaign", "ex"],
        ["site", "render", "--out", str(work / "site"), "--device-pattern", "/dev/tty{index}"],
    ):
        result = CliRunner().invoke(app, ["--db", str(db), "--config", str(config), *cli])
        assert result.exit_code == 0, result.output
    labels = json.loads((work / "site" / "labels.json").read_text())["nodes"]
    nodes = [
        NodeSpec(n, tuple(g["label"] for g in sorted(gpus, key=lambda g: g["index"])))
        for n, gpus in labels.items()
    ]
    tb = LocalSlurm(root, nodes)
    advisor = None
    try:
        tb.start()
        advisor = subprocess.Popen(
            [sys.executable, "-m", "slurm_pal.cli.main", "--db", str(db), "--config",
             str(config), "serve"],
            env={**tb.env, "SLURM_PAL_CONFIG": ""},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(str(sock), {"v": 1, "op": "health"}, 1.0).get("ok"):
                    break
            except DeliveryError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        out = subprocess.run(
            ["sbatch", "--parsable", "-w", "n01", "--gres=gpu:1", "-o", "/dev/null",
             "--wrap=sleep 600"],
            env=tb.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        job = int(out.stdout.strip().split(";")[0])
        while not any(
            j.job_id == job and j.state == "RUNNING" for j in CliStateReader(tb.env).jobs()
        ):
            time.sleep(0.1)
        time.sleep(2.5)  # two advisor refreshes: its view shows the job on n01
        record = {"record_id": f"{job}:n01:prolog", "kind": "prolog", "job_id": job,
                  "node": "n01", "time": time.time(), "slurm_gpus": [0]}  # fmt: skip
        results = {}
        for way in ("unix", "tcp"):
            times = []
            for _ in range(args.records):
                start = time.perf_counter()
                if way == "unix":
                    send_record(str(sock), record, 5.0)
                else:
                    send_record(None, record, 5.0, tcp=address, munge_socket=str(munge_socket))
                times.append((time.perf_counter() - start) * 1000)
            results[way] = {"records": len(times), **_percentiles(times)}
        stats = request(str(sock), {"v": 1, "op": "stats"}, 5.0)
        results["records_rejected"] = stats["records_rejected"]  # type: ignore[assignment]
    finally:
        if advisor is not None:
            advisor.terminate()
            advisor.wait(timeout=30)
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    else:
        for way in ("unix", "tcp"):
            r = results[way]
            print(f"{way:>5}: {r['records']} records, p50 {r['p50_ms']} ms, "
                  f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms")  # fmt: skip
        print(f"records_rejected: {results['records_rejected']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
