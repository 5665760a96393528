"""In-task runner of a profiling campaign: measure one GPU, write one record per run.

Standard library only (plus ``pynvml`` when it imports), and no ``slurm_pal`` imports:
``campaign plan`` copies this file into the campaign directory and the batch script runs it
with the node's ``python3``, so compute nodes need neither slurm-pal nor pandas.

Usage (what the batch script runs; one array task = one GPU index on one node)::

    python3 runner.py --plan campaign.json --node NODE --gpu INDEX

``INDEX`` is the GPU's device minor number (``/dev/nvidia<INDEX>``, what gres.conf ``File=``
names). It checks that Slurm gave it that node and all of its GPUs (``SLURMD_NODENAME``,
``SLURM_JOB_GPUS``), finds the GPU in NVML by minor number, points ``CUDA_VISIBLE_DEVICES`` at
its UUID (so Slurm's index numbering does not matter), and runs each class's benchmark command
``repeats`` times. Benchmark contract: the command prints a line ``PAL_DURATION_S=<seconds>``
on stdout (the last one counts; higher = slower) and may print ``PAL_GPU_UUID=GPU-...`` naming
the device it ran on. While it runs, NVML is sampled for SM clock, temperature and power.

Records go to the campaign's results directory, one JSON file per (node, GPU, class, repeat),
written to a temporary file and renamed, so a rerun of a task replaces its records instead of
adding to them and nobody reads half a file. A failing run writes a failure record (exit code,
reason, stderr tail) and the task exits 1; a task on the wrong node or GPU writes failure
records for all its runs and exits 4.

Not yet run on a GPU: the NVML calls follow the NVML API and are tested against a fake.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = 1
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_WRONG_ALLOCATION = 4
DURATION_RE = re.compile(r"^\s*PAL_DURATION_S\s*=\s*(\S+)\s*$")
UUID_RE = re.compile(r"^\s*PAL_GPU_UUID\s*=\s*(\S+)\s*$")
STDERR_TAIL_CHARS = 2000
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def record_name(node: str, gpu_index: int, job_class: str, repeat: int) -> str:
    """File name of one run's record: the same run always gets the same name."""
    parts = (_SAFE.sub("_", node), f"gpu{gpu_index}", _SAFE.sub("_", job_class), f"r{repeat}")
    return "__".join(parts) + ".json"


def write_record(results_dir: Path, record: dict[str, Any]) -> Path:
    """Write a record atomically (temporary file in the same folder, fsync, rename)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    name = record_name(record["node"], record["gpu_index"], record["job_class"], record["repeat"])
    final = results_dir / name
    tmp = results_dir / f".{name}.{os.getpid()}.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def parse_output(stdout: str) -> tuple[float | None, str | None, str]:
    """(duration, benchmark's GPU UUID, problem) from a benchmark's stdout."""
    duration_text = uuid = None
    for line in stdout.splitlines():
        m = DURATION_RE.match(line)
        if m:
            duration_text = m.group(1)
        m = UUID_RE.match(line)
        if m:
            uuid = m.group(1)
    if duration_text is None:
        return None, uuid, "no 'PAL_DURATION_S=<seconds>' line on the benchmark's stdout"
    try:
        duration = float(duration_text)
    except ValueError:
        return None, uuid, f"PAL_DURATION_S={duration_text!r} is not a number"
    if not duration > 0 or duration == float("inf"):
        return None, uuid, f"PAL_DURATION_S={duration_text} is not a positive duration"
    return duration, uuid, ""


def check_allocation(node_gpus: int, env: dict[str, str]) -> tuple[list[int], str]:
    """The Slurm GPU indices of this allocation, or a problem when it is not the whole node.

    A task measures one GPU but holds all of the node's GPUs, so nothing else runs there and it
    may open the GPU by device: Slurm's own index is not the device minor once gres.conf has
    typed lines (slurmd numbers GPUs grouped by type), so it is not used to pick the GPU.
    """
    text = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or ""
    if not text.strip():
        return [], (
            "SLURM_JOB_GPUS is not set: not inside a Slurm allocation with GPUs (run through "
            "the campaign's batch script, or pass --no-slurm-check for a manual run)"
        )
    try:
        allocated = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return [], f"cannot read SLURM_JOB_GPUS={text!r} (expected indices like 0,1,2)"
    if len(allocated) < node_gpus:
        return allocated, (
            f"the task holds {len(allocated)} GPU(s) (SLURM_JOB_GPUS={text}) but the node has "
            f"{node_gpus} in the plan; the batch script must request them all (--gres=gpu:N)"
        )
    return allocated, ""


def fallback_device(gpu_index: int, allocated: list[int], env: dict[str, str]) -> str:
    """CUDA device for minor ``gpu_index`` when NVML cannot name it by UUID.

    Assumes Slurm's index equals the device minor (true for untyped gres.conf lines in device
    order) and that CUDA_VISIBLE_DEVICES lists the allocated GPUs in the same order.
    """
    visible = [x.strip() for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if gpu_index in allocated and len(visible) == len(allocated):
        return visible[sorted(allocated).index(gpu_index)]
    return str(gpu_index)


class Telemetry:
    """NVML access for one GPU; every call is guarded (no NVML = no telemetry, never a crash)."""

    def __init__(self, nvml: Any, handle: Any, notes: list[str]) -> None:
        self.nvml = nvml
        self.handle = handle
        self.notes = notes

    @classmethod
    def open(cls, gpu_index: int, notes: list[str]) -> Telemetry:
        """Find the GPU whose device minor number (``/dev/nvidia<N>``) is ``gpu_index``."""
        try:
            import pynvml as nvml

            nvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no GPU
            notes.append(f"NVML unavailable ({type(exc).__name__}: {exc})")
            return cls(None, None, notes)
        try:
            # NVML's own index order may differ from the minor numbers (and from Slurm's).
            for i in range(nvml.nvmlDeviceGetCount()):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                    if nvml.nvmlDeviceGetMinorNumber(handle) == gpu_index:
                        return cls(nvml, handle, notes)
                except Exception:  # a GPU this job may not touch
                    continue
            notes.append(f"no NVML device with minor number {gpu_index}")
        except Exception as exc:
            notes.append(f"NVML device lookup failed ({type(exc).__name__}: {exc})")
        return cls(nvml, None, notes)

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def _get(self, func: Callable[..., Any], *args: Any) -> Any:
        try:
            return func(self.handle, *args)
        except Exception:
            return None

    def uuid(self) -> str | None:
        if self.handle is None:
            return None
        value = self._get(self.nvml.nvmlDeviceGetUUID)
        return value.decode() if isinstance(value, bytes) else value

    def name(self) -> str:
        if self.handle is None:
            return ""
        value = self._get(self.nvml.nvmlDeviceGetName)
        return (value.decode() if isinstance(value, bytes) else value) or ""

    def sample(self) -> tuple[float | None, float | None, float | None]:
        """(SM clock MHz, temperature C, power W) now; None for what NVML does not give."""
        if self.handle is None:
            return None, None, None
        n = self.nvml
        clock = self._get(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM)
        temp = self._get(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        power = self._get(n.nvmlDeviceGetPowerUsage)  # milliwatts
        return (
            None if clock is None else float(clock),
            None if temp is None else float(temp),
            None if power is None else float(power) / 1000.0,
        )


class Sampler:
    """Samples telemetry in a thread while a benchmark runs: mean clock/power, max temperature."""

    def __init__(self, telemetry: Telemetry, interval_s: float) -> None:
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.samples: list[tuple[float | None, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.telemetry.sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        if self.telemetry.handle is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()

    def summary(self) -> tuple[float | None, float | None, float | None]:
        def values(i: int) -> list[float]:
            return [s[i] for s in self.samples if s[i] is not None]  # type: ignore[misc]

        clocks, temps, powers = values(0), values(1), values(2)
        return (
            sum(clocks) / len(clocks) if clocks else None,
            max(temps) if temps else None,
            sum(powers) / len(powers) if powers else None,
        )


def expand_command(command: str, python: str, bench_dir: str) -> str:
    """Fill ``{python}`` and ``{bench_dir}``; other braces stay (shell code may use them)."""
    return command.replace("{python}", python).replace("{bench_dir}", bench_dir)


def run_task(
    plan: dict[str, Any],
    plan_dir: Path,
    node: str,
    gpu_index: int,
    *,
    env: dict[str, str],
    slurm_check: bool = True,
) -> int:
    """Run every class x repeat of one GPU; write the records; return the exit code."""
    results_dir = (plan_dir / plan.get("results_dir", "results")).resolve()
    bench_dir = str((plan_dir / plan.get("bench_dir", "bench")).resolve())
    classes = list(plan["classes"])
    repeats = int(plan["repeats"])
    timeout_s = float(plan.get("run_timeout_s", 3600))
    interval_s = float(plan.get("sample_interval_s", 0.5))
    planned = {(g["node"], int(g["gpu_index"])): g for g in plan["gpus"]}
    if (node, gpu_index) not in planned:
        print(
            f"error: GPU {gpu_index} of node {node} is not in this campaign's plan", file=sys.stderr
        )
        return EXIT_USAGE
    job_id = env.get("SLURM_ARRAY_JOB_ID", env.get("SLURM_JOB_ID", ""))
    if "SLURM_ARRAY_TASK_ID" in env:
        job_id = f"{job_id}_{env['SLURM_ARRAY_TASK_ID']}"
    base = {
        "schema": SCHEMA,
        "campaign": plan["campaign"],
        "node": node,
        "gpu_index": gpu_index,
        "slurm_job_id": job_id,
        "hostname": socket.gethostname(),
    }

    problem, allocated = "", []
    if slurm_check:
        here = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        counts = plan.get("node_gpu_counts") or {}
        node_gpus = int(counts.get(node) or sum(1 for key in planned if key[0] == node))
        if here != node:
            problem = f"task runs on node {here!r}, but it measures {node!r}"
        else:
            allocated, problem = check_allocation(node_gpus, env)
    if problem:
        for job_class in classes:
            for repeat in range(repeats):
                write_record(
                    results_dir,
                    {
                        **base,
                        "status": "failed",
                        "job_class": job_class,
                        "repeat": repeat,
                        "uuid": planned[(node, gpu_index)].get("uuid") or f"{node}/gpu{gpu_index}",
                        "uuid_source": "assignment",
                        "reason": problem,
                        "finished_at": time.time(),
                    },
                )
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_WRONG_ALLOCATION

    notes: list[str] = []
    telemetry = Telemetry.open(gpu_index, notes)
    nvml_uuid, gpu_name = telemetry.uuid(), telemetry.name()
    if nvml_uuid:
        device = nvml_uuid  # CUDA accepts UUIDs in CUDA_VISIBLE_DEVICES: no index mapping
    else:
        device = fallback_device(gpu_index, allocated, env)
        notes.append(f"GPU chosen by index (CUDA_VISIBLE_DEVICES={device}), not verified by UUID")
    child_env = dict(env)
    child_env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": device,
            "PAL_CAMPAIGN": str(plan["campaign"]),
            "PAL_NODE": node,
            "PAL_GPU_INDEX": str(gpu_index),
        }
    )
    failed = 0
    try:
        for job_class in classes:
            bench = plan["benchmarks"][job_class]
            command = expand_command(bench["command"], sys.executable, bench_dir)
            for repeat in range(repeats):
                child_env["PAL_CLASS"], child_env["PAL_REPEAT"] = job_class, str(repeat)
                record = _run_once(command, child_env, telemetry, interval_s, timeout_s)
                uuid, source = _choose_uuid(
                    nvml_uuid, record.pop("bench_uuid"), planned[(node, gpu_index)], record
                )
                record.update(
                    {
                        **base,
                        "job_class": job_class,
                        "repeat": repeat,
                        "benchmark": bench.get("name", ""),
                        "command": command,
                        "uuid": uuid,
                        "uuid_source": source,
                        "gpu_name": gpu_name,
                        "cuda_visible_devices": device,
                        "notes": notes + record.get("notes", []),
                    }
                )
                write_record(results_dir, record)
                if record["status"] != "ok":
                    failed += 1
                    print(f"run {job_class}#{repeat} failed: {record['reason']}", file=sys.stderr)
    finally:
        telemetry.close()
    return EXIT_RUN_FAILED if failed else 0


def _choose_uuid(
    nvml_uuid: str | None, bench_uuid: str | None, planned: dict[str, Any], record: dict[str, Any]
) -> tuple[str, str]:
    """NVML's UUID, else the benchmark's, else the plan's (a mismatch fails the run)."""
    if nvml_uuid and bench_uuid and _norm_uuid(nvml_uuid) != _norm_uuid(bench_uuid):
        record["status"] = "failed"
        record["reason"] = (
            f"the benchmark ran on {bench_uuid} but NVML says this task's GPU is {nvml_uuid}: "
            "the benchmark did not honour CUDA_VISIBLE_DEVICES"
        )
    if nvml_uuid:
        return nvml_uuid, "nvml"
    if bench_uuid:
        return (bench_uuid if bench_uuid.startswith("GPU-") else f"GPU-{bench_uuid}"), "benchmark"
    fallback = planned.get("uuid") or f"{planned['node']}/gpu{planned['gpu_index']}"
    return fallback, "assignment"


def _norm_uuid(text: str) -> str:
    return text.lower().removeprefix("gpu-")


def _run_once(
    command: str, env: dict[str, str], telemetry: Telemetry, interval_s: float, timeout_s: float
) -> dict[str, Any]:
    started = time.time()
    with Sampler(telemetry, interval_s) as sampler:
        exit_code, stdout, stderr, timed_out = _run_command(command, env, timeout_s)
    if not sampler.samples:
        sampler.samples.append(telemetry.sample())
    clock, temp, power = sampler.summary()
    duration, bench_uuid, problem = parse_output(stdout)
    if timed_out:
        problem = f"timed out after {timeout_s:g} s"
    elif exit_code != 0:
        problem = f"benchmark exited with code {exit_code}"
    record: dict[str, Any] = {
        "status": "failed" if problem else "ok",
        "reason": problem,
        "exit_code": exit_code,
        "duration_s": None if problem else duration,
        "sm_clock_mhz": clock,
        "temperature_c": temp,
        "power_w": power,
        "started_at": started,
        "finished_at": time.time(),
        "stderr_tail": stderr[-STDERR_TAIL_CHARS:] if problem else "",
        "bench_uuid": bench_uuid,
    }
    return record


def _run_command(
    command: str, env: dict[str, str], timeout_s: float
) -> tuple[int | None, str, str, bool]:
    """Run a shell command in its own process group; on timeout kill the whole group.

    Killing only the shell would leave a hung benchmark on the GPU, spoiling the next run.
    """
    proc = subprocess.Popen(
        command,
        shell=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stdout, stderr, False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, type=Path, help="The campaign's campaign.json.")
    parser.add_argument("--node", required=True, help="Node this task measures.")
    parser.add_argument(
        "--gpu", required=True, type=int, help="Device minor of the GPU to measure."
    )
    parser.add_argument(
        "--no-slurm-check",
        action="store_true",
        help="Run outside Slurm (manual tests): skip the node and SLURM_JOB_GPUS checks.",
    )
    args = parser.parse_args(argv)
    try:
        plan = json.loads(args.plan.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the campaign plan {args.plan}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_task(
        plan,
        args.plan.resolve().parent,
        args.node,
        args.gpu,
        env=dict(os.environ),
        slurm_check=not args.no_slurm_check,
    )


if __name__ == "__main__":
    sys.exit(main())
