"""Submit latency: what asking the advisor from job_submit.lua adds to ``sbatch``.

Setup: the Slurm testbed (Debian Slurm 22.05 on loopback, 4 nodes x 4 fake GPUs,
labels from ``site render`` of the example campaign), a real ``slurm-pal serve`` and held GPU
jobs (``sbatch -H --gres=gpu:1 --wrap=true``, one process per submission, timed around the
whole ``sbatch`` call). Three job_submit.lua variants, swapped in blocks (slurmctld re-reads the
script when its mtime changes; the first submissions of a block are warm-up and not counted):

- ``without``: a plain pass-through script (``return slurm.SUCCESS``), the baseline;
- ``fail_open``: the rendered script pointing at a socket that does not exist (the fast
  fail-open path when the advisor is down);
- ``instant_answer``: the rendered script talking to a stand-in that answers every request at
  once with a fixed route (the cost of Lua, lua-socket and the JSON round trip alone);
- ``with_advisor``: the rendered script talking to the running advisor.

Keys of ``--json``: ``median_ms_without``, ``p99_ms_without``, ``median_ms_fail_open``,
``median_ms_instant_answer``,
``median_ms_with_advisor``, ``p99_ms_with_advisor``, ``added_median_ms`` (with advisor minus
without), ``ratio_median`` (with / without), ``advisor_decide_ms_p50``/``p99`` (the service's
own decision time), ``routed``/``passed`` (decisions during the run), ``repeated`` (of those,
answers given again to a repeat of the request before, not decided anew: every submission is
the same job unless ``--distinct`` names each one apart), ``distinct``, ``fail_open_logged``
(slurmctld log lines of the fail-open path: at least the fail_open submissions, warm-up
included), ``n`` per variant. ``--no-advisor`` runs the first three variants only.

Held jobs keep the GPUs the advisor reserved for them, so a round has at most 16 submissions
per variant (12 counted + 2 warm-up by default); after each round every job is cancelled and the
run waits until the advisor has released its reservations. Pass decisions (and why) are printed
on stderr. Needs root and the Slurm packages (``bash scripts/install-slurm.sh``). About two
minutes for the default 150 submissions per variant on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from typer.testing import CliRunner

from slurm_pal.adapters.slurm.state import CliStateReader
from slurm_pal.cli.main import app
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.hooks.spool import DeliveryError, request
from slurm_pal.testbed import LocalSlurm, NodeSpec, missing_binaries

PASS_THROUGH = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""
VARIANTS = ("without", "fail_open", "instant_answer", "with_advisor")
INSTANT = (
    b'{"v":1,"ok":true,"action":"route","set":{"req_nodes":"n01","tres_per_node":"gres:gpu:1",'
    b'"min_nodes":1,"max_nodes":1,"admin_comment":"slurm-pal/bench route"},"class":"A",'
    b'"reason":"fixed","lv":1.0,"token":"t"}\n'
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def render(
    root: Path, sock: Path, absent: Path, instant: Path
) -> tuple[dict[str, str], list[NodeSpec], Path]:
    """Store + example campaign + ``site render`` per socket (advisor, absent, instant)."""
    work = root / "work"
    work.mkdir()
    db = work / "store.db"
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    runner = CliRunner()
    texts: dict[str, str] = {"without": PASS_THROUGH}
    for name, path in (("with_advisor", sock), ("fail_open", absent), ("instant_answer", instant)):
        config = work / f"{name}.toml"
        config.write_text(
            f'[advisor]\nsocket = "{path}"\nreplan_s = 0\nreservation_ttl_s = 0.05\n'
            f'refresh_s = 1.0\nlabels_file = "{work / name / "labels.json"}"\n'
            f'[hooks]\nspool_dir = "{root / "spool"}"\n'
        )
        base = ["--db", str(db), "--config", str(config)]
        steps = [
            ["site", "render", "--out", str(work / name), "--device-pattern", "/dev/tty{index}"]
        ]
        if name == "with_advisor":
            steps.insert(0, ["profile", "ingest", str(csv), "--campaign", "example"])
        for args in steps:
            result = runner.invoke(app, [*base, *args], env={"SLURM_PAL_CONFIG": None})
            if result.exit_code != 0:
                raise SystemExit(f"slurm-pal {' '.join(args)} failed:\n{result.output}")
        texts[name] = (work / name / "job_submit.lua").read_text()
    labels = json.loads((work / "with_advisor" / "labels.json").read_text())
    nodes = []
    for node, gpus in labels["nodes"].items():
        by_index = {g["index"]: g["label"] for g in gpus}
        nodes.append(NodeSpec(node, tuple(by_index[i] for i in sorted(by_index))))
    return texts, nodes, work / "with_advisor.toml"


_SWAPS = [0]


def instant_server(path: Path) -> None:
    """A stand-in that answers every request at once with a fixed route: what job_submit.lua,
    lua-socket and the JSON round trip cost by themselves, without the service."""
    path.parent.mkdir(parents=True, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(64)

    def serve(conn: socket.socket) -> None:
        # every request line of a connection, in turn: job_submit.lua keeps its connection
        with conn, conn.makefile("rb") as lines:
            for _line in lines:
                conn.sendall(INSTANT)

    def loop() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def swap_script(tb: LocalSlurm, text: str) -> None:
    """Install a job_submit.lua. slurmctld re-reads it when its mtime (whole seconds) is newer
    than the one it loaded, so every swap gets a strictly later mtime (in the future)."""
    path = tb.root / "etc" / "job_submit.lua"
    path.write_text(text)
    _SWAPS[0] += 1
    later = int(time.time()) + 10 + _SWAPS[0]
    os.utime(path, (later, later))


def submit_once(tb: LocalSlurm, name: str | None = None) -> float:
    named = [f"--job-name={name}"] if name else []
    start = time.perf_counter()
    proc = subprocess.run(
        ["sbatch", "-H", "--parsable", "--gres=gpu:1", *named, "-o", "/dev/null", "--wrap=true"],
        env=tb.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"sbatch failed: {proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=150, help="submissions per variant")
    parser.add_argument(
        "--block", type=int, default=12, help="submissions per block (<= 16 - warmup: routed)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="uncounted per block")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--no-advisor", action="store_true", help="only the without/fail_open variants"
    )
    parser.add_argument(
        "--distinct",
        action="store_true",
        help="a job name of its own per submission: no request repeats the one before",
    )
    args = parser.parse_args()
    variants = VARIANTS[:3] if args.no_advisor else VARIANTS
    missing = missing_binaries()
    if missing or os.geteuid() != 0:
        raise SystemExit(
            f"needs root and Slurm ({', '.join(missing) or 'not root'}): "
            "sudo bash scripts/install-slurm.sh"
        )
    root = Path(tempfile.mkdtemp(prefix="spal-bench-", dir="/tmp"))
    root.chmod(0o755)
    sock = root / "adv" / "advisor.sock"
    instant = root / "adv" / "instant.sock"
    texts, nodes, config = render(root, sock, root / "adv" / "absent.sock", instant)
    if "instant_answer" in variants:
        instant_server(instant)
    tb = LocalSlurm(root, nodes, job_submit_lua=PASS_THROUGH)
    advisor = None
    times: dict[str, list[float]] = {v: [] for v in variants}
    before: dict = {}
    after: dict = {}
    reasons: dict[str, int] = {}
    try:
        log("starting the testbed")
        tb.start()
        if not args.no_advisor:
            advisor, before = start_advisor(root, config, tb, sock)
        rounds = -(-args.n // args.block)
        serial = 0
        for r in range(rounds):
            for variant in variants:
                swap_script(tb, texts[variant])
                count = min(args.block, args.n - r * args.block)
                for k in range(args.warmup + count):
                    serial += 1
                    ms = submit_once(tb, f"bench{serial}" if args.distinct else None)
                    if k >= args.warmup:
                        times[variant].append(ms)
            for job in CliStateReader(tb.env).jobs():
                parsed = parse_admin_comment(job.admin_comment) or {}
                why = parsed.get("why", "") if parsed.get("action") == "pass" else ""
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
            subprocess.run(["scancel", "-u", "root"], env=tb.env, check=False)
            if advisor is not None:
                wait_released(sock)
            log(f"round {r + 1}/{rounds} done")
        if advisor is not None:
            after = request(str(sock), {"v": 1, "op": "stats"}, 5.0)
        # proof that the fail-open variant ran the rendered script: one log line per job
        ctld_log = (tb.log_dir / "slurmctld.log").read_text(errors="replace")
        after["fail_open_logged"] = ctld_log.count("slurm-pal: job of uid")
    finally:
        if advisor is not None and advisor.poll() is None:
            advisor.terminate()
            try:
                advisor.wait(timeout=20)
            except subprocess.TimeoutExpired:
                advisor.kill()
        tb.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(times, before, after, args)
    if reasons:
        log(f"pass reasons: {reasons}")


def start_advisor(
    root: Path, config: Path, tb: LocalSlurm, sock: Path
) -> tuple[subprocess.Popen, dict]:
    """``slurm-pal serve`` in the foreground, up when it answers health; its first stats."""
    log("starting slurm-pal serve")
    advisor = subprocess.Popen(
        [
            *(sys.executable, "-m", "slurm_pal.cli.main"),
            *("--db", str(root / "work" / "store.db"), "--config", str(config)),
            *("serve", "--foreground"),
        ],
        env={**tb.env, "SLURM_PAL_CONFIG": ""},
        stdout=(root / "log" / "advisor.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if request(str(sock), {"v": 1, "op": "health"}, 1.0).get("ok"):
                break
        except DeliveryError:
            pass
        if advisor.poll() is not None or time.monotonic() > deadline:
            log((root / "log" / "advisor.log").read_text()[-2000:])
            advisor.kill()
            raise SystemExit("slurm-pal serve did not come up")
        time.sleep(0.1)
    return advisor, request(str(sock), {"v": 1, "op": "stats"}, 5.0)


def wait_released(sock: Path, timeout_s: float = 20.0) -> None:
    """Wait until the advisor holds no reservation (it sees the cancelled jobs at its next
    refresh), so every round starts with all GPUs free and the held jobs can be routed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            health = request(str(sock), {"v": 1, "op": "health"}, 2.0)
            if health.get("reservations") == 0 and health.get("free") == health.get("gpus"):
                return
        except DeliveryError:
            pass
        time.sleep(0.2)
    log("advisor still holds reservations; the next round may pass more jobs")


def report(
    times: dict[str, list[float]], before: dict, after: dict, args: argparse.Namespace
) -> None:
    result: dict[str, float | int] = {}
    for variant in times:
        result[f"median_ms_{variant}"] = round(statistics.median(times[variant]), 2)
        result[f"p99_ms_{variant}"] = round(percentile(times[variant], 0.99), 2)
    other = "median_ms_with_advisor" if "with_advisor" in times else "median_ms_fail_open"
    result["added_median_ms"] = round(result[other] - result["median_ms_without"], 2)
    result["ratio_median"] = round(result[other] / result["median_ms_without"], 3)
    result["advisor_decide_ms_p50"] = after.get("decide_ms_p50", float("nan"))
    result["advisor_decide_ms_p99"] = after.get("decide_ms_p99", float("nan"))
    result["routed"] = int(after.get("decide_route", 0)) - int(before.get("decide_route", 0))
    result["passed"] = int(after.get("decide_pass", 0)) - int(before.get("decide_pass", 0))
    result["repeated"] = int(after.get("decide_repeats", 0)) - int(before.get("decide_repeats", 0))
    result["distinct"] = args.distinct
    result["fail_open_logged"] = int(after.get("fail_open_logged", 0))
    result["n"] = args.n
    if args.json:
        print(json.dumps(result))
        return
    names = ", a job name of its own each" if args.distinct else ""
    print(f"sbatch -H --gres=gpu:1 --wrap=true{names}, {args.n} submissions per variant")
    for variant in times:
        print(
            f"  {variant:<13} median {result[f'median_ms_{variant}']:7.2f} ms"
            f"   p99 {result[f'p99_ms_{variant}']:7.2f} ms"
        )
    print(
        f"  added by the advisor: {result['added_median_ms']:+.2f} ms median "
        f"(x{result['ratio_median']}); service decide p50 {result['advisor_decide_ms_p50']} ms, "
        f"p99 {result['advisor_decide_ms_p99']} ms; {result['routed']} routed, "
        f"{result['passed']} passed ({result['repeated']} answers given again to a repeat); "
        f"{result['fail_open_logged']} fail-open log lines"
    )


if __name__ == "__main__":
    main()
