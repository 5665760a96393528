"""Argument parsing and the hook runs (argparse, not typer: a hook must start fast)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_pal.advisor import munge
from slurm_pal.hooks import gpus
from slurm_pal.hooks.records import HookEnvError, build_record
from slurm_pal.hooks.spool import deliver, flush, warn

DEFAULT_LIMIT_S = 8.0


def run_hook(
    kind: str,
    *,
    socket_path: str | None,
    spool_dir: Path,
    timeout_s: float,
    tcp: str | None = None,
    munge_socket: str = munge.DEFAULT_SOCKET,
    labels: Path | None = None,
    telemetry: bool = True,
    sample_s: float = 5.0,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    sampler_wait_s: float = 1.0,
) -> dict[str, object] | None:
    """One Prolog/Epilog run: build, spool and deliver the record; returns it (None when the
    environment is not a hook's). Never raises for anything the environment holds."""
    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        record = build_record(kind, env, node, time.time())
    except HookEnvError as exc:
        warn(f"{kind}: {exc}; nothing recorded")
        return None
    job_id = int(record["job_id"])  # type: ignore[call-overload]
    slurm_gpus = record["slurm_gpus"]
    assert isinstance(slurm_gpus, list)
    if kind == "prolog" and slurm_gpus:
        devices = gpus.device_indices(labels, node, slurm_gpus)
        uuids = gpus.nvml_uuids(gpus.load_nvml(), devices) if devices else []
        if uuids:
            record["uuids"] = uuids
            if telemetry:
                gpus.start_sampler(python, spool_dir, job_id, uuids, sample_s, slurm_gpus)
    elif kind == "epilog":
        summary = gpus.stop_sampler(spool_dir, job_id, sampler_wait_s) or {}
        signals = summary.pop("gpu_signals", None)
        if isinstance(signals, dict) and signals:
            record["gpu_signals"] = signals
        if summary:
            record["telemetry"] = summary
    deliver(spool_dir, socket_path, record, timeout_s, tcp=tcp, munge_socket=munge_socket)
    return record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m slurm_pal.hooks", description="slurm-pal Prolog/Epilog hooks"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("prolog", "epilog", "flush"):
        p = sub.add_parser(name)
        p.add_argument("--socket", default=None, help="the advisor's Unix socket")
        p.add_argument(
            "--advisor", default=None, help="HOST:PORT of the advisor's TCP listener (munge)"
        )
        p.add_argument("--munge-socket", default=munge.DEFAULT_SOCKET)
        p.add_argument("--spool-dir", required=True, type=Path)
        p.add_argument("--timeout-ms", type=int, default=300)
        if name != "flush":
            p.add_argument("--labels", type=Path, default=None, help="labels.json (site render)")
            p.add_argument("--no-telemetry", action="store_true")
            p.add_argument("--sample-s", type=float, default=5.0)
            p.add_argument("--limit-s", type=float, default=DEFAULT_LIMIT_S)
    s = sub.add_parser("sample")
    s.add_argument("--job", type=int, required=True)
    s.add_argument("--spool-dir", type=Path, required=True)
    s.add_argument("--sample-s", type=float, default=5.0)
    s.add_argument("--uuid", action="append", default=[])
    s.add_argument("--slurm-index", type=int, action="append", default=[])
    return parser


def _hard_limit(limit_s: float) -> None:
    """After ``limit_s`` the process ends with 0, wherever it is (a hook never holds a job)."""

    def bail(*_: object) -> None:
        warn(f"hard time limit of {limit_s:g} s reached; exiting")
        os._exit(0)

    signal.signal(signal.SIGALRM, bail)
    signal.setitimer(signal.ITIMER_REAL, max(limit_s, 0.1))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        # a Prolog/Epilog with bad arguments must still not fail the job
        argv = list(sys.argv[1:] if argv is None else argv)
        return 0 if argv[:1] in (["prolog"], ["epilog"]) else int(exc.code or 0)
    if args.command == "sample":
        return gpus.sampler_main(
            args.spool_dir, args.job, args.uuid, args.sample_s, args.slurm_index
        )
    timeout_s = max(args.timeout_ms, 1) / 1000
    if args.command == "flush":
        result = flush(
            args.spool_dir,
            args.socket,
            timeout_s,
            tcp=args.advisor,
            munge_socket=args.munge_socket,
        )
        print(
            json.dumps(
                {
                    "delivered": len(result.delivered),
                    "left": len(result.left),
                    "unreadable": result.unreadable,
                }
            )
        )
        return 0 if not result.left else 1
    _hard_limit(args.limit_s)
    try:
        run_hook(
            args.command,
            socket_path=args.socket,
            spool_dir=args.spool_dir,
            timeout_s=timeout_s,
            tcp=args.advisor,
            munge_socket=args.munge_socket,
            labels=args.labels,
            telemetry=not args.no_telemetry,
            sample_s=args.sample_s,
            sampler_wait_s=min(1.0, args.limit_s / 4),
        )
    except BaseException as exc:
        warn(f"{args.command} failed: {exc!r}")
    return 0
