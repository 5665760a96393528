"""In-task runner of a profiling campaign: measure one GPU, write one record per run.

Standard library only (plus ``pynvml`` when it imports), and no ``slurm_pal`` imports:
``campaign plan`` copies this file into the campaign directory and the batch script runs it
with the node's ``python3``, so compute nodes need neither slurm-pal nor pandas.

Usage (what the batch script runs; one array task = one GPU index on one node)::

    python3 runner.py --plan campaign.json --node NODE --gpu INDEX

``INDEX`` is the GPU's device minor number (``/dev/nvidia<INDEX>``, what gres.conf ``File=``
names). It checks that Slurm gave it that node and all of its GPUs (``SLURMD_NODENAME``,
``SLURM_JOB_GPUS``; a re-measure's plan holds only the GPUs of one gres type, and names the
GPU's Slurm number, which must be among them), finds the GPU in NVML by minor number, points
``CUDA_VISIBLE_DEVICES`` at its UUID (so Slurm's index numbering does not matter), and runs
each class's benchmark command ``repeats`` times. Benchmark contract (``profiling/README.md``):
the command prints a line ``PAL_DURATION_S=<seconds>`` on stdout (time per representative
unit of work; the last one counts; higher = slower), should print ``PAL_MEASURE_START`` when its
warm-up is over and the timed window starts, and may print ``PAL_GPU_UUID=GPU-...`` naming the
device it ran on. The runner passes the plan's ``PAL_WARMUP_S``/``PAL_MEASURE_S`` in the
environment.

NVML is sampled while the benchmark runs; the record's SM clock (mean), power (mean),
temperature (max) and clock-event reasons (share of samples per reason: ``sw_power_cap``,
``hw_slowdown``, ``sw_thermal``, ``hw_thermal``, ``hw_power_brake``, ...) cover the measured
window only (from ``PAL_MEASURE_START`` to the end), so the idle start-up does not dilute
them; without that line they cover the whole run and ``telemetry_window`` says so.

Records go to the campaign's results directory, one JSON file per (node, GPU, class, repeat),
written to a temporary file and renamed, so a rerun of a task replaces its records instead of
adding to them and nobody reads half a file. A failing run writes a failure record (exit code,
reason, stderr tail) and the task exits 1; a task on the wrong node or GPU writes failure
records for all its runs and exits 4.

Ran on an H200 (tests/fixtures/gpu-h200): windowed telemetry, clock-event reasons
(``sw_power_cap`` throughout a GEMM, none under STREAM); tested against a fake elsewhere.
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
from typing import Any, NamedTuple

SCHEMA = 1
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_WRONG_ALLOCATION = 4
DURATION_RE = re.compile(r"^\s*PAL_DURATION_S\s*=\s*(\S+)\s*$")
UUID_RE = re.compile(r"^\s*PAL_GPU_UUID\s*=\s*(\S+)\s*$")
MEASURE_START_RE = re.compile(r"^\s*PAL_MEASURE_START\b")
WINDOW_MEASURED = "measured"
WINDOW_WHOLE_RUN = "whole run (the benchmark printed no PAL_MEASURE_START line)"
#: NVML clock-event (formerly "throttle") reason bits, nvml.h ``nvmlClocksEventReason*``.
CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock_setting"),
)
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


def decode_clock_events(mask: int) -> list[str]:
    """NVML clock-event reason bits -> names; unknown bits as ``bit_0x...``."""
    names = [name for bit, name in CLOCK_EVENT_BITS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def fallback_device(
    gpu_index: int, allocated: list[int], env: dict[str, str], slurm_index: int | None = None
) -> str:
    """CUDA device for minor ``gpu_index`` when NVML cannot name it by UUID.

    Assumes CUDA_VISIBLE_DEVICES lists the allocated GPUs in Slurm's order, and, unless the
    plan gives the GPU's ``slurm_index`` (labels.json), that Slurm's index equals the device
    minor (true for untyped gres.conf lines in device order).
    """
    visible = [x.strip() for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    number = gpu_index if slurm_index is None else slurm_index
    if number in allocated and len(visible) == len(allocated):
        return visible[sorted(allocated).index(number)]
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

    def clock_events(self) -> int | None:
        """The clock-event reason bitmask now (newer NVML name first, then the old one)."""
        if self.handle is None:
            return None
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            func = getattr(self.nvml, name, None)
            if func is not None:
                value = self._get(func)
                if value is not None:
                    return int(value)
        return None

    def sample(self) -> Sample:
        """SM clock MHz, temperature C, power W and clock-event bits now (None: not given)."""
        now = time.monotonic()
        if self.handle is None:
            return Sample(now, None, None, None, None)
        n = self.nvml
        clock = self._get(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM)
        temp = self._get(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        power = self._get(n.nvmlDeviceGetPowerUsage)  # milliwatts
        return Sample(
            now,
            None if clock is None else float(clock),
            None if temp is None else float(temp),
            None if power is None else float(power) / 1000.0,
            self.clock_events(),
        )


class Sample(NamedTuple):
    """One telemetry reading; None for what NVML did not give."""

    at: float  # time.monotonic()
    clock: float | None  # SM clock, MHz
    temp: float | None  # GPU temperature, C
    power: float | None  # board power, W
    events: int | None  # clock-event reason bits


def summarize(samples: list[Sample], since: float | None) -> dict[str, Any]:
    """Record fields from the samples taken at or after ``since`` (all when None).

    Mean SM clock and power, max temperature, and per clock-event reason the share of the
    readings that showed it (power capping is the variability a campaign measures; thermal
    and hardware slowdowns are cooling faults that ``campaign collect`` reports).
    """
    window = [s for s in samples if since is None or s.at >= since]
    if not window and samples:  # a window shorter than one interval: its last reading
        window = samples[-1:]
    clocks = [s.clock for s in window if s.clock is not None]
    temps = [s.temp for s in window if s.temp is not None]
    powers = [s.power for s in window if s.power is not None]
    masks = [s.events for s in window if s.events is not None]
    counts: dict[str, int] = {}
    for mask in masks:
        for name in decode_clock_events(mask):
            counts[name] = counts.get(name, 0) + 1
    return {
        "sm_clock_mhz": sum(clocks) / len(clocks) if clocks else None,
        "temperature_c": max(temps) if temps else None,
        "power_w": sum(powers) / len(powers) if powers else None,
        "clock_events": {k: round(v / len(masks), 4) for k, v in sorted(counts.items())},
        "clock_event_samples": len(masks),
        "telemetry_samples": len(window),
    }


class Sampler:
    """Samples telemetry in a thread while a benchmark runs (timestamped readings)."""

    def __init__(self, telemetry: Telemetry, interval_s: float) -> None:
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.samples: list[Sample] = []
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


def expand_command(command: str, python: str, bench_dir: str) -> str:
    """Fill ``{python}`` and ``{bench_dir}``; other braces stay (shell code may use them)."""
    return command.replace("{python}", python).replace("{bench_dir}", bench_dir)


def allocation_problem(
    plan: dict[str, Any],
    planned: dict[tuple[str, int], dict[str, Any]],
    node: str,
    gpu_index: int,
    env: dict[str, str],
) -> tuple[list[int], str]:
    """The GPUs Slurm gave this task (its numbers) and why the task cannot measure GPU
    ``gpu_index`` of ``node`` ("" when it can): it runs elsewhere, or does not hold that GPU."""
    here = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    counts = plan.get("node_gpu_counts") or {}
    node_gpus = int(counts.get(node) or sum(1 for key in planned if key[0] == node))
    slurm_index = planned[(node, gpu_index)].get("slurm_index")
    if here != node:
        return [], f"task runs on node {here!r}, but it measures {node!r}"
    allocated, problem = check_allocation(node_gpus, env)
    if not problem and slurm_index is not None and int(slurm_index) not in allocated:
        # a task holding only some of the node's GPUs must hold the one it measures
        problem = (
            f"the task does not hold GPU {gpu_index} (Slurm's number {slurm_index}; "
            f"SLURM_JOB_GPUS={','.join(map(str, allocated))})"
        )
    return allocated, problem


def _record_refusal(
    results_dir: Path,
    base: dict[str, Any],
    classes: list[str],
    repeats: int,
    uuid: str,
    problem: str,
) -> None:
    """Every planned run of the GPU recorded as failed with ``problem``: the campaign says why
    none ran rather than missing them."""
    for job_class in classes:
        for repeat in range(repeats):
            write_record(
                results_dir,
                {
                    **base,
                    "status": "failed",
                    "job_class": job_class,
                    "repeat": repeat,
                    "uuid": uuid,
                    "uuid_source": "assignment",
                    "reason": problem,
                    "finished_at": time.time(),
                },
            )


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

    problem = ""
    allocated: list[int] = []
    if slurm_check:
        allocated, problem = allocation_problem(plan, planned, node, gpu_index, env)
    if problem:
        uuid = planned[(node, gpu_index)].get("uuid") or f"{node}/gpu{gpu_index}"
        _record_refusal(results_dir, base, classes, repeats, uuid, problem)
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_WRONG_ALLOCATION

    notes: list[str] = []
    telemetry = Telemetry.open(gpu_index, notes)
    nvml_uuid, gpu_name = telemetry.uuid(), telemetry.name()
    if nvml_uuid:
        device = nvml_uuid  # CUDA accepts UUIDs in CUDA_VISIBLE_DEVICES: no index mapping
    else:
        known = planned[(node, gpu_index)].get("slurm_index")
        device = fallback_device(gpu_index, allocated, env, None if known is None else int(known))
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
    for key, name in (("warmup_s", "PAL_WARMUP_S"), ("measure_s", "PAL_MEASURE_S")):
        if plan.get(key) is not None:
            child_env[name] = f"{float(plan[key]):g}"
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
    measure_start: list[float] = []  # monotonic time the benchmark's timed window began

    def watch(line: str) -> None:
        if not measure_start and MEASURE_START_RE.match(line):
            measure_start.append(time.monotonic())
            telemetry_now.append(telemetry.sample())  # the window's first reading, at once

    telemetry_now: list[Sample] = []
    with Sampler(telemetry, interval_s) as sampler:
        exit_code, stdout, stderr, timed_out = _run_command(command, env, timeout_s, watch)
    samples = sorted(sampler.samples + telemetry_now, key=lambda x: x.at)
    if not samples:
        samples.append(telemetry.sample())
    since = measure_start[0] if measure_start else None
    summary = summarize(samples, since)
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
        **summary,
        "telemetry_window": WINDOW_MEASURED if since is not None else WINDOW_WHOLE_RUN,
        "measure_start_s": None if since is None else round(since - samples[0].at, 3),
        "started_at": started,
        "finished_at": time.time(),
        "stderr_tail": stderr[-STDERR_TAIL_CHARS:] if problem else "",
        "bench_uuid": bench_uuid,
    }
    return record


def _run_command(
    command: str,
    env: dict[str, str],
    timeout_s: float,
    on_stdout_line: Callable[[str], None] | None = None,
) -> tuple[int | None, str, str, bool]:
    """Run a shell command in its own process group; on timeout kill the whole group.

    Stdout is read line by line as it comes, so ``on_stdout_line`` sees ``PAL_MEASURE_START``
    when the benchmark prints it (the telemetry window starts there). Killing only the shell
    on a timeout would leave a hung benchmark on the GPU, spoiling the next run.
    """
    proc = subprocess.Popen(
        command,
        shell=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    out: list[str] = []
    err: list[str] = []

    def pump(stream: Any, sink: list[str], callback: Callable[[str], None] | None) -> None:
        for line in stream:
            sink.append(line)
            if callback is not None:
                with contextlib.suppress(Exception):
                    callback(line)
        stream.close()

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, out, on_stdout_line), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, None), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for reader in readers:
        reader.join()
    return (None if timed_out else proc.returncode), "".join(out), "".join(err), timed_out


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
