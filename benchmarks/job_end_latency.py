"""Job end -> re-plan latency on the multi-host testbed: how long after a job's script ends on a
compute host the advisor on the controller has re-planned the queue onto its GPUs.

Setup: the multi-host testbed (slurm_pal/testbed/multihost.py: a controller host and
``--hosts`` compute hosts of 2 fake GPUs each, network namespaces on a private bridge, a
munged per host), labels from ``site render`` of the example campaign, the rendered
job_submit.lua, Prolog and Epilog, and ``slurm-pal serve`` on the controller with its TCP
listener; the hooks on the compute hosts send their records there inside munge credentials.
``replan_s`` is an hour, so only job ends start rounds.

Every job holds 2 GPUs (a whole node) until the benchmark creates its release file. The
cluster is filled, then each sample: submit one more such job (it waits: no GPU is free), wait
``--settle`` seconds (a refresh and a scheduling pass), release the oldest running job and time

- ``replan``: release -> the advisor's count of job-end rounds (``replans_at_job_end`` in its
  stats, asked every 3 ms on its Unix socket) goes up, which happens once the round and its
  Slurm updates are done, whether it moved the waiting job or left it to Slurm (``pin =
  "steered"``: packing's own pick). In between: the job's script ending
  (it polls its release file every 10 ms), slurmd running the Epilog, the hook's Python
  start, the munge credential, TCP, the credential's checks, the round and its updates;
- ``start``: release -> the waiting job RUNNING (``scontrol show job`` polled every 20 ms),
  which adds Slurm's scheduling after the Epilog has ended;

and, from the advisor's stats, ``job_end_ms_p50``/``p99``: how long the Epilogs waited for
their answer (the round and the record's store write), as the service measures it.

The waiting job then holds the freed node, so the cluster stays full and every sample is the
same situation. Needs root, the Slurm packages and iproute2 (``bash scripts/install-slurm.sh``).
About 3 s per sample.

    python benchmarks/job_end_latency.py            # 30 samples on 3 compute hosts
    python benchmarks/job_end_latency.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from typer.testing import CliRunner

from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.hooks.spool import DeliveryError, request
from slurm_pal.testbed import NodeSpec, TestbedError, missing_binaries
from slurm_pal.testbed.hosts import missing_tools
from slurm_pal.testbed.multihost import MultiHostSlurm

GPUS_PER_NODE = 2
PORT = 7001


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Bench:
    """The testbed, the advisor and the held jobs of one run."""

    def __init__(self, root: Path, hosts: int) -> None:
        self.root = root
        self.ctl = root / "ctl"
        self.ctl.mkdir(mode=0o755)
        self.out = root / "out"
        self.out.mkdir(mode=0o755)
        self.db = self.ctl / "store.db"
        self.config = self.ctl / "slurm-pal.toml"
        self.socket = self.ctl / "adv" / "advisor.sock"
        self.log_path = self.ctl / "advisor.log"
        site = root / "site"
        munge_socket = root / "run" / "munge" / "munge.socket.2"
        address = f"10.250.0.1:{PORT}"
        self.config.write_text(
            f'[advisor]\nsocket = "{self.socket}"\npolicy = "pal"\nrefresh_s = 1.0\n'
            "replan_s = 3600\nreplan_on_epilog = true\nreservation_ttl_s = 30\n"
            f'labels_file = "{site / "labels.json"}"\nlisten = "{address}"\n'
            f'munge_socket = "{munge_socket}"\n'
            f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
            f'advisor = "{address}"\nmunge_socket = "{munge_socket}"\n'
        )
        csv = self.ctl / "example.csv"
        generate_example_campaign(nodes=hosts, gpus_per_node=GPUS_PER_NODE, node_prefix="n").to_csv(
            csv, index=False
        )
        base = ["--db", str(self.db), "--config", str(self.config)]
        for args in (
            ["profile", "ingest", str(csv), "--campaign", "example"],
            ["apps", "set", "resnet", "--class", "A"],
            ["site", "render", "--out", str(site), "--device-pattern", "/dev/tty{index}"],
        ):
            result = CliRunner().invoke(app, [*base, *args], env={"SLURM_PAL_CONFIG": None})
            if result.exit_code != 0:
                raise SystemExit(f"slurm-pal {' '.join(args)} failed:\n{result.output}")
        labels = json.loads((site / "labels.json").read_text())
        nodes = [
            NodeSpec(node, tuple(g["label"] for g in sorted(gpus, key=lambda g: g["index"])))
            for node, gpus in labels["nodes"].items()
        ]
        self.tb = MultiHostSlurm(
            root,
            nodes,
            job_submit_lua=(site / "job_submit.lua").read_text(),
            prolog=str(site / "prolog.sh"),
            epilog=str(site / "epilog.sh"),
            per_host_dirs=(str(root / "spool"),),
        )
        self.advisor: subprocess.Popen[bytes] | None = None
        self.held: list[tuple[int, Path]] = []
        self.submitted = 0

    def start(self) -> None:
        self.tb.start()
        with self.log_path.open("ab") as out:
            cmd = [sys.executable, "-m", "slurm_pal.cli.main", "--db", str(self.db)]
            cmd += ["--config", str(self.config), "serve", "--foreground"]
            self.advisor = self.tb.popen(
                self.tb.controller,
                cmd,
                env={**self.tb.env, "SLURM_PAL_CONFIG": ""},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.advisor.poll() is not None:
                raise SystemExit(f"slurm-pal serve exited:\n{self.log_path.read_text()}")
            try:
                if self.ask({"op": "health"}).get("ok"):
                    return
            except DeliveryError:
                time.sleep(0.1)
        raise SystemExit("slurm-pal serve did not answer health within 60 s")

    def stop(self) -> None:
        if self.advisor is not None and self.advisor.poll() is None:
            self.advisor.terminate()
            self.advisor.wait(timeout=30)
        self.tb.stop()

    def ask(self, message: dict) -> dict:
        return request(str(self.socket), {"v": 1, **message}, 5.0)

    def submit_held(self) -> int:
        self.submitted += 1
        release = self.out / f"release-{self.submitted}"
        wrap = f"while [ ! -e {release} ]; do sleep 0.01; done"
        cmd = ["sbatch", "--parsable", "-o", "/dev/null", f"--gres=gpu:{GPUS_PER_NODE}", "-N1"]
        job_id = int(self.tb.run([*cmd, "--comment=pal:app=resnet", f"--wrap={wrap}"]).stdout)
        self.held.append((job_id, release))
        return job_id

    def state(self, job_id: int) -> str:
        return self.tb.job_fields(job_id).get("JobState", "")

    def wait_running(self, job_id: int, timeout_s: float = 60.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.state(job_id) == "RUNNING":
                return time.monotonic()
            time.sleep(0.02)
        raise TestbedError(f"job {job_id} not running after {timeout_s:g} s")

    def sample(self, settle_s: float, timeout_s: float = 30.0) -> tuple[float, float] | None:
        """One job end: (release -> round done, release -> waiting job running) in seconds;
        None when no round ran for it within ``timeout_s`` (the advisor missed its end)."""
        waiting = self.submit_held()
        time.sleep(settle_s)
        if self.state(waiting) != "PENDING":
            raise TestbedError(f"job {waiting} did not wait: the cluster was not full")
        ending, release = self.held.pop(0)
        rounds = self.ask({"op": "stats"})["replans_at_job_end"]
        offset = self.log_path.stat().st_size
        t0 = time.monotonic()
        release.touch()
        replan = None
        deadline = t0 + timeout_s
        while replan is None and time.monotonic() < deadline:
            if self.ask({"op": "stats"})["replans_at_job_end"] > rounds:
                replan = time.monotonic() - t0
            else:
                time.sleep(0.003)
        start = self.wait_running(waiting) - t0
        if replan is None:  # say what the advisor did instead
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            log(f"no round for the end of job {ending}; advisor log since:\n{text}")
            return None
        return replan, start


def run(hosts: int, samples: int, settle_s: float) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="spal-jel-", dir="/tmp"))
    root.chmod(0o755)
    bench = Bench(root, hosts)
    replans: list[float] = []
    starts: list[float] = []
    missed = 0
    try:
        bench.start()
        log(f"multi-host testbed up: controller + {hosts} compute hosts; advisor on TCP")
        for job_id in [bench.submit_held() for _ in range(hosts)]:
            bench.wait_running(job_id)
        for i in range(samples):
            got = bench.sample(settle_s)
            if got is None:
                missed += 1
                log(f"sample {i + 1}: no round")
                continue
            replans.append(got[0])
            starts.append(got[1])
            log(f"sample {i + 1}: round done {got[0] * 1000:.0f} ms, job running {got[1]:.2f} s")
        stats = bench.ask({"op": "stats"})
    finally:
        bench.stop()
        if not os.environ.get("SLURM_PAL_KEEP_TESTBED"):
            shutil.rmtree(root, ignore_errors=True)
    ms = [r * 1000 for r in replans]
    return {
        "hosts": hosts,
        "n": len(replans),
        "missed": missed,
        "replan_median_ms": round(statistics.median(ms), 1) if ms else None,
        "replan_p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
        "replan_max_ms": round(max(ms), 1) if ms else None,
        "start_median_s": round(statistics.median(starts), 3) if starts else None,
        "start_p99_s": round(percentile(starts, 0.99), 3) if starts else None,
        "epilog_wait_ms_p50": stats.get("job_end_ms_p50"),
        "epilog_wait_ms_p99": stats.get("job_end_ms_p99"),
        "replans_at_job_end": stats.get("replans_at_job_end"),
        "records_total": stats.get("records_total"),
        "records_rejected": stats.get("records_rejected"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3, help="compute hosts (2 GPUs each)")
    parser.add_argument("--samples", type=int, default=30, help="job ends to time")
    parser.add_argument(
        "--settle", type=float, default=1.5, help="seconds a new job waits before a release"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    missing = missing_binaries() + missing_tools()
    if missing or os.geteuid() != 0:
        raise SystemExit(
            f"needs root and {', '.join(missing) or 'the Slurm packages'}: "
            "bash scripts/install-slurm.sh"
        )
    if args.hosts < 1 or args.samples < 1:
        raise SystemExit("--hosts and --samples must be >= 1")
    result = run(args.hosts, args.samples, args.settle)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
