"""How long `slurm-pal` takes to start: `version`, and `serve health` as a monitoring probe.

Every start of the command pays for what it imports. A health probe runs every few seconds,
and anything that imports the package (a hook, a check) pays the same, so the target is under
0.3 s on the 2-core development machine. Each command runs ``--runs`` times in its own
process; the figure is the median wall time, also as a ratio against ``python -c pass`` (the
interpreter's own start-up on the same machine at the same moment).

- ``version``: `slurm-pal version`;
- ``serve health --json``: against a stand-in advisor on a Unix socket in this process, which
  answers the health op with a fixed object (the probe's work is start-up, connect and print;
  the real advisor answers from memory in well under a millisecond);
- ``serve health (down)``: with no advisor behind the socket (exit 1, one line).

It also lists which heavy libraries each command imported (``-X importtime``), so a slow
start names its cause.

    python benchmarks/startup.py               # 10 runs each
    python benchmarks/startup.py --runs 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HEAVY = ("numpy", "pandas", "scipy", "sklearn", "matplotlib", "jinja2")
HEALTH = {"v": 1, "ok": True, "campaign": "bench", "policy": "packed-pm", "gpus": 16, "free": 16}


def _command() -> list[str]:
    """The installed `slurm-pal` next to this interpreter, as an admin runs it."""
    script = Path(sys.executable).with_name("slurm-pal")
    return [str(script)] if script.exists() else [sys.executable, "-m", "slurm_pal.cli.main"]


def _stand_in_advisor(path: str, stop: threading.Event) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    server.settimeout(0.2)

    def serve() -> None:
        with server:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.recv(65536)
                    conn.sendall((json.dumps(HEALTH) + "\n").encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _time(argv: list[str], runs: int, env: dict[str, str]) -> dict[str, object]:
    walls = []
    codes = set()
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, env=env, check=False)
        walls.append(time.perf_counter() - started)
        codes.add(done.returncode)
    return {
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "exit_codes": sorted(codes),
    }


def _heavy_imports(argv: list[str], env: dict[str, str]) -> list[str]:
    python_argv = [sys.executable, "-X", "importtime", "-m", "slurm_pal.cli.main", *argv]
    done = subprocess.run(python_argv, capture_output=True, text=True, env=env, check=False)
    found = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            if name.split(".")[0] in HEAVY:
                found.add(name.split(".")[0])
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_PAL_")}
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="slurm-pal-startup-") as tmp:
        env["SLURM_PAL_DB"] = str(Path(tmp) / "none.db")
        live, down = str(Path(tmp) / "advisor.sock"), str(Path(tmp) / "down.sock")
        stop = threading.Event()
        thread = _stand_in_advisor(live, stop)
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], None),
            "version": ([*_command(), "version"], ["version"]),
            "serve health --json": (
                [*_command(), "serve", "health", "--json", "--socket", live],
                ["serve", "health", "--json", "--socket", live],
            ),
            "serve health (down)": (
                [*_command(), "serve", "health", "--socket", down],
                ["serve", "health", "--socket", down],
            ),
        }
        try:
            for name, (argv, cli_args) in cases.items():
                results[name] = _time(argv, args.runs, env)
                if cli_args is not None:
                    results[name]["heavy_imports"] = _heavy_imports(cli_args, env)
        finally:
            stop.set()
            thread.join()
    baseline = float(results["python -c pass"]["median_s"])  # type: ignore[arg-type]
    for figures in results.values():
        figures["x_python"] = round(float(figures["median_s"]) / baseline, 1)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps({"runs": args.runs, "results": results}, indent=2))
        return 0
    print(f"start-up, median of {args.runs} runs (target under 0.3 s)")
    for name, figures in results.items():
        heavy = figures.get("heavy_imports")
        extra = "" if heavy is None else f"  heavy imports: {', '.join(heavy) or 'none'}"  # type: ignore[arg-type]
        print(
            f"  {name:22} {figures['median_s']:6.3f} s (min {figures['min_s']:.3f}, "
            f"{figures['x_python']}x python, exit {figures['exit_codes']}){extra}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
