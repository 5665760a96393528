"""Memory of a flood of bad requests: what 1,500 malformed requests (over-long lines of
garbage, lines that are not JSON, lines cut short) cost a real ``slurm-pal serve`` in resident
memory, and whether it comes back at once.

Setup: a throw-away store, ``slurm-pal serve`` on a Unix socket (no campaign, no Slurm
needed: a bad request never gets that far), ``--clients`` threads sending the requests.
The service's VmRSS is read from /proc before the flood, at its peak (sampled every 50 ms),
right after the last answer and ``--settle`` seconds later. About 20 s on 2 cores.

Keys of ``--json``: ``rss_mb_before``, ``rss_mb_peak``, ``rss_mb_after``,
``rss_mb_settled``, ``added_mb_after`` (after minus before), ``added_mb_peak``,
``refused`` (the service's bad_requests + decide_errors: every request was seen), ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from slurm_pal.hooks.spool import DeliveryError, request


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bad_requests() -> list[bytes]:
    """The kinds of malformed request, sent in turn: over-long, not JSON, cut short, and JSON
    just under the line limit whose job is not a job (parsed whole before it is refused)."""
    junk = ",".join(f'"{os.urandom(4).hex()}"' for _ in range(80_000))
    return [
        os.urandom(16).hex().encode() * ((3 << 20) // 32) + b"\n",  # 3 MiB, one line
        b"{not json " + os.urandom(64).hex().encode() * 200 + b"\n",
        b'{"v":1,"op":"deci' + b"d" * 50_000,  # the peer closes mid-line
        b'{"v":1,"op":"decide","job":{"min_nodes":[' + junk.encode() + b"]}}\n",
    ]


def send(path: str, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        try:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass
        except OSError:
            pass  # the service may close an over-long line's connection early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--kinds", default="0,1,2,3", help="Which kinds of bad request (0-3).")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="spal-flood-", dir="/tmp"))
    root.chmod(0o700)
    cli = [sys.executable, "-m", "slurm_pal.cli.main", "--db", str(root / "s.db")]
    env = {**os.environ, "SLURM_PAL_CONFIG": ""}
    sock = root / "a.sock"
    config = root / "c.toml"
    config.write_text(f'[advisor]\nsocket = "{sock}"\n[hooks]\nspool_dir = "{root / "spool"}"\n')
    log = (root / "serve.log").open("wb")
    serve = subprocess.Popen([*cli, "--config", str(config), "serve"], stdout=log,
                             stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(str(sock), {"v": 1, "op": "health"}, 1.0).get("ok"):
                    break
            except DeliveryError:
                pass
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit(f"serve did not start: {(root / 'serve.log').read_text()}")
            time.sleep(0.1)
        time.sleep(2.0)  # its start-up work done
        before = rss_mb(serve.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], rss_mb(serve.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        counter = iter(range(args.requests))
        kinds = [bad_requests()[int(k)] for k in args.kinds.split(",")]
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                send(str(sock), kinds[n % len(kinds)])

        started = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
        done.set()
        sampler.join()
        after = rss_mb(serve.pid)
        time.sleep(args.settle)
        settled = rss_mb(serve.pid)
        stats = request(str(sock), {"v": 1, "op": "stats"}, 10.0)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "requests": args.requests,
        "clients": args.clients,
        "seconds": round(seconds, 1),
        "refused": int(stats.get("bad_requests") or 0) + int(stats.get("decide_errors") or 0),
        "rss_mb_before": round(before, 1),
        "rss_mb_peak": round(peak[0], 1),
        "rss_mb_after": round(after, 1),
        "rss_mb_settled": round(settled, 1),
        "added_mb_peak": round(peak[0] - before, 1),
        "added_mb_after": round(after - before, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.requests} bad requests from {args.clients} clients in {seconds:.1f} s "
        f"({result['refused']} refused): serve's RSS {before:.0f} MB "
        f"before, peak +{peak[0] - before:.0f} MB, right after +{after - before:.1f} MB, "
        f"{args.settle:g} s later +{settled - before:.1f} MB"
    )


if __name__ == "__main__":
    main()
