"""The job's physical GPUs (NVML UUIDs) and its telemetry sampler (stdlib + pynvml only).

Why labels.json: Slurm numbers a node's GPUs by gres Type, not by device file (testbed
NOTES.md, finding 1), so ``SLURM_JOB_GPUS`` index ``i`` is the device whose ``slurm_index`` is
``i`` in labels.json; its device ``index`` is the N of ``/dev/nvidiaN``, which NVML reports as
the minor number. Without labels.json no UUIDs are recorded rather than wrong ones.

The sampler is a detached ``python -m slurm_pal.hooks sample`` started by the Prolog: it runs
:class:`slurm_pal.adapters.nvml.NvmlSampler` (stdlib + pynvml) until SIGTERM, then writes the
job's summary atomically; the Epilog stops it and attaches the summary. The Prolog also hands
it each UUID's Slurm index, so the summary's ``gpu_signals`` (what the suspicion rule reads,
:mod:`slurm_pal.adapters.nvml_signals`) are keyed as the advisor names GPUs, and the Epilog
need not look the UUIDs up again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.hooks.spool import warn

PYNVML_ENV = "SLURM_PAL_PYNVML"  # module to import instead of pynvml (a fake, in tests)
TELEMETRY_DIR = "telemetry"
MAX_SAMPLE_S = 30 * 86400.0  # a sampler never outlives this, whatever happens to the Epilog


def load_nvml() -> Any | None:
    """The pynvml module, or None when it does not import."""
    try:
        return importlib.import_module(os.environ.get(PYNVML_ENV) or "pynvml")
    except Exception:
        return None


def device_indices(labels_path: Path | None, node: str, slurm_gpus: Sequence[int]) -> list[int]:
    """Slurm's GPU indices on ``node`` -> device indices, through labels.json ([] if unknown)."""
    if labels_path is None or not slurm_gpus:
        return []
    try:
        table = read_labels(labels_path, nodes=(node,))
        return [table.device_index(node, i) for i in slurm_gpus]
    except (LabelTableError, KeyError) as exc:
        why = exc.args[0] if isinstance(exc, KeyError) else exc
        warn(f"cannot map Slurm GPU indices {list(slurm_gpus)} on {node} via {labels_path}: {why}")
        return []


def nvml_uuids(nvml: Any, devices: Sequence[int]) -> list[str]:
    """NVML UUIDs of the GPUs with these minor numbers ([] when NVML has no GPUs or any is
    missing: a partial list would pair UUIDs with the wrong indices)."""
    if nvml is None or not devices:
        return []
    try:
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        by_minor: dict[int, str] = {}
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            by_minor[int(nvml.nvmlDeviceGetMinorNumber(handle))] = str(uuid)
        missing = [d for d in devices if d not in by_minor]
        if missing:
            warn(f"NVML has no GPU with minor number(s) {missing}; no UUIDs recorded")
            return []
        return [by_minor[d] for d in devices]
    except Exception as exc:
        warn(f"NVML failed while listing GPUs: {exc}")
        return []
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _paths(spool_dir: Path, job_id: int) -> tuple[Path, Path]:
    folder = spool_dir / TELEMETRY_DIR
    return folder / f"{job_id}.pid", folder / f"{job_id}.json"


def start_sampler(
    python: str,
    spool_dir: Path,
    job_id: int,
    uuids: Sequence[str],
    interval_s: float,
    slurm_gpus: Sequence[int] = (),
) -> int | None:
    """Start the detached sampler (own session, no inherited fds); its pid, or None.
    ``slurm_gpus``: Slurm's index of each UUID, in the same order (keys of ``gpu_signals``)."""
    pid_file, _ = _paths(spool_dir, job_id)
    args = [python, "-s", "-m", "slurm_pal.hooks", "sample", "--job", str(job_id)]
    args += ["--spool-dir", str(spool_dir), "--sample-s", str(interval_s)]
    for uuid in uuids:
        args += ["--uuid", uuid]
    if len(slurm_gpus) == len(uuids):
        for index in slurm_gpus:
            args += ["--slurm-index", str(index)]
    try:
        pid_file.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        pid_file.write_text(f"{proc.pid}\n")
        return proc.pid
    except OSError as exc:
        warn(f"cannot start the telemetry sampler for job {job_id}: {exc}")
        return None


def _is_our_sampler(pid: int, job_id: int) -> bool:
    """The pid still runs ``slurm_pal.hooks sample --job JOB`` (pids get reused)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"slurm_pal.hooks" in args and b"sample" in args and str(job_id).encode() in args


def stop_sampler(spool_dir: Path, job_id: int, wait_s: float) -> dict | None:
    """Stop the job's sampler and return its summary (None if there is none in time)."""
    pid_file, summary = _paths(spool_dir, job_id)
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None and _is_our_sampler(pid, job_id):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while pid is not None and not summary.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        data = None
    for path in (pid_file, summary):
        with contextlib.suppress(OSError):
            path.unlink()
    return data if isinstance(data, dict) else None


def signals_of(result: Any, slurm_gpus: Sequence[int]) -> dict[str, dict]:
    """Each GPU's suspicion readings by Slurm index (``gpu_signals``; GPUs that read nothing
    are left out). ``slurm_gpus`` pairs with the sampled UUIDs by position."""
    gpus = getattr(result, "gpus", ())
    if len(gpus) != len(slurm_gpus):
        return {}
    return {str(i): g.signals for i, g in zip(slurm_gpus, gpus, strict=True) if g.signals}


def summary_of(result: Any) -> dict | None:
    """A :class:`JobUtilization` -> the record's ``telemetry`` (None when nothing measured)."""
    features = getattr(result, "features", None)
    if features is None:
        return None
    out = dataclasses.asdict(features)
    out["samples"] = features.measurements
    errors = result.all_errors()
    if errors:
        out["errors"] = errors[:10]
    return out


def run_sampler(
    spool_dir: Path,
    job_id: int,
    uuids: Sequence[str],
    interval_s: float,
    stop: threading.Event,
    nvml: Any | None = None,
    slurm_gpus: Sequence[int] = (),
) -> dict | None:
    """Sample until ``stop`` is set, then write the summary atomically; returns it. The
    summary is the ``telemetry``, plus ``gpu_signals`` (by Slurm index) that the Epilog moves
    to the record's top level."""
    from slurm_pal.adapters.nvml import NvmlSampler  # stdlib + pynvml only (tested)

    module = nvml if nvml is not None else load_nvml()
    if module is None:
        return None
    sampler = NvmlSampler(module, sleep=lambda s: stop.wait(s))
    result = sampler.sample_job(
        list(uuids), MAX_SAMPLE_S, interval_s, should_stop=lambda: stop.is_set()
    )
    summary = summary_of(result)
    signals = signals_of(result, slurm_gpus)
    if signals:
        summary = {**(summary or {}), "gpu_signals": signals}
    _, path = _paths(spool_dir, job_id)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, path)
    except OSError as exc:
        warn(f"cannot write the telemetry of job {job_id} to {path}: {exc}")
    return summary


def sampler_main(
    spool_dir: Path,
    job_id: int,
    uuids: Sequence[str],
    interval_s: float,
    slurm_gpus: Sequence[int] = (),
) -> int:
    """The detached process: SIGTERM/SIGINT end the sampling at once."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        run_sampler(spool_dir, job_id, uuids, interval_s, stop, slurm_gpus=slurm_gpus)
    except Exception as exc:  # never leave a traceback in slurmd's log for a job
        print(f"slurm-pal sampler for job {job_id}: {exc}", file=sys.stderr)
    return 0
