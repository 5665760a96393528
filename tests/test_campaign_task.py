"""The in-task runner, run for real as a subprocess with fake Slurm variables and benchmarks.

The fake benchmark prints ``PAL_DURATION_S`` from a table the test controls (or fails as told);
a fake ``pynvml`` module on PYTHONPATH stands in for NVML where a test needs it. The default
benchmarks are run too: without PyTorch or CuPy (as here) they must say so and exit 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_pal.campaigns import runner
from slurm_pal.campaigns.workspace import (
    BENCH_DIR,
    PLAN_FILE,
    RESULTS_DIR,
    Benchmark,
    CampaignPlan,
    create_campaign,
    default_benchmarks,
    load_plan,
    read_records,
)
from slurm_pal.core.campaigns import PlannedGpu, check_campaign
from tests.helpers.campaign_bench import FAKE_BENCH, write_bench_table

FAKE_PYNVML = r'''
"""Fake pynvml for runner tests: devices from $FAKE_NVML (a JSON list, NVML order)."""
import json, os
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
_DEVICES = json.load(open(os.environ["FAKE_NVML"]))
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(_DEVICES)
def nvmlDeviceGetHandleByIndex(i): return _DEVICES[i]
def nvmlDeviceGetMinorNumber(h): return h["minor"]
def nvmlDeviceGetUUID(h): return h["uuid"]
def nvmlDeviceGetName(h): return h["name"]
def _v(h, key):
    """A value, or {"warm": x, "measure": y}: y once the file $FAKE_NVML_PHASE exists."""
    value = h[key]
    if isinstance(value, dict):
        phase = os.environ.get("FAKE_NVML_PHASE", "")
        return value["measure" if phase and os.path.exists(phase) else "warm"]
    return value
def nvmlDeviceGetClockInfo(h, kind):
    assert kind == NVML_CLOCK_SM
    return _v(h, "clock")
def nvmlDeviceGetTemperature(h, kind): return _v(h, "temp")
def nvmlDeviceGetPowerUsage(h): return _v(h, "power_mw")
def nvmlDeviceGetCurrentClocksEventReasons(h): return _v(h, "reasons")
def nvmlDeviceGetCurrentClocksThrottleReasons(h): return _v(h, "reasons")
if os.environ.get("FAKE_NVML_OLD"):  # pynvml before the clock-event names
    del nvmlDeviceGetCurrentClocksEventReasons
'''


def write_fakes(folder: Path, table: dict[str, object]) -> tuple[Path, Path]:
    """The fake benchmark script and its table folder; returns (script, table folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "fakebench.sh"
    script.write_text(FAKE_BENCH)
    write_bench_table(folder / "table", table)
    return script, folder / "table"


def fake_plan(
    bench: Path,
    gpus: list[PlannedGpu],
    *,
    campaign: str = "t1",
    classes: tuple[str, ...] = ("A", "D"),
    repeats: int = 2,
    python: str = sys.executable,
) -> CampaignPlan:
    command = f"sh {bench}"
    return CampaignPlan(
        campaign=campaign,
        classes=classes,
        repeats=repeats,
        benchmarks={c: Benchmark("fake", command) for c in classes},
        gpus=tuple(gpus),
        gpu_model="v100",
        python=python,
        run_timeout_s=60,
    )


def slurm_env(node: str, task: int, gpus: int, table: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA", "PAL_"))}
    env.update(
        {
            "SLURM_JOB_ID": "900",
            "SLURM_ARRAY_JOB_ID": "900",
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURMD_NODENAME": node,
            "SLURM_JOB_GPUS": ",".join(str(i) for i in range(gpus)),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)),
            "FAKE_BENCH_DIR": str(table),
        }
    )
    env.update(extra)
    return env


def run_runner(
    directory: Path, node: str, gpu: int, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(directory / "runner.py"),
            "--plan",
            str(directory / PLAN_FILE),
            "--node",
            node,
            "--gpu",
            str(gpu),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def campaign(tmp_path: Path) -> tuple[Path, Path]:
    bench, table = write_fakes(tmp_path / "fakes", {"default": [2.0, 2.1], "n1-1-D": [3.0, 3.3]})
    plan = fake_plan(bench, [PlannedGpu("n1", 0), PlannedGpu("n1", 1)])
    return create_campaign(tmp_path / "campaigns", plan), table


def read_json(directory: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (directory / RESULTS_DIR).glob("*.json")}


def test_task_writes_one_record_per_run(campaign: tuple[Path, Path]) -> None:
    directory, table = campaign
    proc = run_runner(directory, "n1", 1, slurm_env("n1", 1, 2, table))
    assert proc.returncode == 0, proc.stderr
    records = read_json(directory)
    assert sorted(records) == [
        "n1__gpu1__A__r0.json",
        "n1__gpu1__A__r1.json",
        "n1__gpu1__D__r0.json",
        "n1__gpu1__D__r1.json",
    ]
    d1 = records["n1__gpu1__D__r1.json"]
    assert (d1["status"], d1["duration_s"], d1["job_class"], d1["repeat"]) == ("ok", 3.3, "D", 1)
    # No NVML here: the location stands in for the UUID, and the record says so.
    assert (d1["uuid"], d1["uuid_source"]) == ("n1/gpu1", "assignment")
    assert any("NVML" in n for n in d1["notes"])
    assert d1["cuda_visible_devices"] == "1"
    assert d1["slurm_job_id"] == "900_1"
    assert d1["started_at"] <= d1["finished_at"]
    assert not list((directory / RESULTS_DIR).glob(".*"))  # no temporary files left
    parsed, problems = read_records(directory, "t1")
    assert problems == [] and len(parsed) == 4


def test_rerun_replaces_records_instead_of_adding(campaign: tuple[Path, Path]) -> None:
    directory, table = campaign
    fail_table = table.parent / "fail"
    write_bench_table(fail_table, {"default": 7})
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 2, fail_table))
    assert proc.returncode == runner.EXIT_RUN_FAILED
    first = read_json(directory)
    assert len(first) == 4 and all(r["status"] == "failed" for r in first.values())
    a0 = first["n1__gpu0__A__r0.json"]
    assert (a0["exit_code"], a0["reason"]) == (7, "benchmark exited with code 7")
    assert "Xid 79" in a0["stderr_tail"]
    assert "failed" in proc.stderr

    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 2, table))
    assert proc.returncode == 0
    second = read_json(directory)
    assert sorted(second) == sorted(first)
    assert all(r["status"] == "ok" for r in second.values())


def test_output_without_duration_is_a_failed_run(tmp_path: Path) -> None:
    bench, table = write_fakes(
        tmp_path / "fakes",
        {"default": [1.0], "n1-0-A": "loss 0.3\nPAL_DURATION_S=fast\n"},
    )
    directory = create_campaign(tmp_path / "c", fake_plan(bench, [PlannedGpu("n1", 0)]))
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, table))
    assert proc.returncode == runner.EXIT_RUN_FAILED
    records = read_json(directory)
    assert records["n1__gpu0__A__r0.json"]["reason"] == "PAL_DURATION_S='fast' is not a number"
    assert records["n1__gpu0__D__r0.json"]["status"] == "ok"  # other classes still ran


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURMD_NODENAME": "n2"}, "task runs on node 'n2'"),
        ({"SLURM_JOB_GPUS": "1"}, "holds 1 GPU(s)"),
        ({"SLURM_JOB_GPUS": ""}, "SLURM_JOB_GPUS is not set"),
    ],
)
def test_wrong_allocation_fails_every_run(
    campaign: tuple[Path, Path], change: dict[str, str], message: str
) -> None:
    directory, table = campaign
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 2, table, **change))
    assert proc.returncode == runner.EXIT_WRONG_ALLOCATION
    assert message in proc.stderr
    records = read_json(directory)
    assert len(records) == 4
    assert all(r["status"] == "failed" and message in r["reason"] for r in records.values())


def test_manual_run_outside_slurm(campaign: tuple[Path, Path]) -> None:
    directory, table = campaign
    env = slurm_env("n1", 0, 2, table)
    for key in [k for k in env if k.startswith(("SLURM", "CUDA"))]:
        del env[key]
    assert run_runner(directory, "n1", 0, env).returncode == runner.EXIT_WRONG_ALLOCATION
    proc = run_runner(directory, "n1", 0, env, "--no-slurm-check")
    assert proc.returncode == 0, proc.stderr
    records = read_json(directory)
    assert all(r["status"] == "ok" for r in records.values()) and len(records) == 4
    assert records["n1__gpu0__A__r0.json"]["cuda_visible_devices"] == "0"


def test_gpu_outside_the_plan_is_refused(campaign: tuple[Path, Path]) -> None:
    directory, table = campaign
    proc = run_runner(directory, "n1", 5, slurm_env("n1", 5, 2, table))
    assert proc.returncode == runner.EXIT_USAGE
    assert "not in this campaign's plan" in proc.stderr
    assert read_json(directory) == {}


def test_nvml_finds_the_gpu_by_minor_number_and_samples_it(
    campaign: tuple[Path, Path], tmp_path: Path
) -> None:
    directory, table = campaign
    fake_dir = tmp_path / "nvml"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(FAKE_PYNVML)
    devices = [  # NVML order differs from the minor numbers on purpose
        {
            "minor": 1,
            "uuid": "GPU-bbb",
            "name": "V100",
            "clock": 1380,
            "temp": 71,
            "power_mw": 250000,
            "reasons": 0,
        },
        {
            "minor": 0,
            "uuid": "GPU-aaa",
            "name": "V100",
            "clock": 1530,
            "temp": 60,
            "power_mw": 200000,
            "reasons": 0,
        },
    ]
    (fake_dir / "devices.json").write_text(json.dumps(devices))
    env = slurm_env(
        "n1", 1, 2, table, PYTHONPATH=str(fake_dir), FAKE_NVML=str(fake_dir / "devices.json")
    )
    proc = run_runner(directory, "n1", 1, env)
    assert proc.returncode == 0, proc.stderr
    r = read_json(directory)["n1__gpu1__A__r0.json"]
    assert (r["uuid"], r["uuid_source"], r["gpu_name"]) == ("GPU-bbb", "nvml", "V100")
    assert r["cuda_visible_devices"] == "GPU-bbb"  # pinned by UUID, not by index
    assert (r["sm_clock_mhz"], r["temperature_c"], r["power_w"]) == (1380.0, 71.0, 250.0)


def test_benchmark_on_another_gpu_than_nvml_says_fails(
    campaign: tuple[Path, Path], tmp_path: Path
) -> None:
    directory, _ = campaign
    fake_dir = tmp_path / "nvml"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(FAKE_PYNVML)
    devices = [{"minor": 0, "uuid": "GPU-aaa", "name": "V", "clock": 1, "temp": 1, "power_mw": 1}]
    (fake_dir / "devices.json").write_text(json.dumps(devices))
    table = tmp_path / "t"
    write_bench_table(table, {"default": "PAL_GPU_UUID=GPU-zzz\nPAL_DURATION_S=1\n"})
    env = slurm_env(
        "n1", 0, 2, table, PYTHONPATH=str(fake_dir), FAKE_NVML=str(fake_dir / "devices.json")
    )
    proc = run_runner(directory, "n1", 0, env)
    assert proc.returncode == runner.EXIT_RUN_FAILED
    r = read_json(directory)["n1__gpu0__A__r0.json"]
    assert r["status"] == "failed" and "did not honour CUDA_VISIBLE_DEVICES" in r["reason"]


def test_hung_benchmark_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    bench, table = write_fakes(tmp_path / "fakes", {"default": [1.0], "n1-0-A": ""})
    # A benchmark that hangs in a child process (as a training script's data loader might).
    (table / "n1-0-A").write_text(f"sleep 60 &\necho $! > {pid_file}\nwait\n")
    plan = dataclasses.replace(
        fake_plan(bench, [PlannedGpu("n1", 0)], repeats=1), run_timeout_s=0.5
    )
    directory = create_campaign(tmp_path / "c", plan)
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, table))
    assert proc.returncode == runner.EXIT_RUN_FAILED
    records = read_json(directory)
    assert records["n1__gpu0__A__r0.json"]["reason"] == "timed out after 0.5 s"
    assert records["n1__gpu0__D__r0.json"]["status"] == "ok"
    child = Path(f"/proc/{pid_file.read_text().strip()}/status")
    assert not child.exists() or "State:\tZ" in child.read_text()  # killed (maybe unreaped)


@pytest.mark.parametrize("name", ["gemm.py", "stream.py"])
def test_default_benchmarks_say_clearly_when_no_framework(tmp_path: Path, name: str) -> None:
    plan = CampaignPlan(
        campaign="d1",
        classes=("A", "D"),
        repeats=1,
        benchmarks=default_benchmarks(("A", "D"), {}),
        gpus=(PlannedGpu("n1", 0),),
    )
    directory = create_campaign(tmp_path, plan)
    proc = subprocess.run(
        [sys.executable, str(directory / BENCH_DIR / name)], capture_output=True, text=True
    )
    assert proc.returncode == 3
    assert "needs PyTorch or CuPy" in proc.stderr and "--command CLASS=CMD" in proc.stderr
    assert "PAL_DURATION_S" not in proc.stdout


def test_default_benchmark_failure_reaches_the_record(tmp_path: Path) -> None:
    plan = CampaignPlan(
        campaign="d1",
        classes=("A", "D"),
        repeats=1,
        benchmarks=default_benchmarks(("A", "D"), {}),
        gpus=(PlannedGpu("n1", 0),),
    )
    directory = create_campaign(tmp_path, plan)
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, tmp_path / "unused"))
    assert proc.returncode == runner.EXIT_RUN_FAILED
    records, _ = read_records(directory, "d1")
    check = check_campaign(plan.gpus, plan.classes, 1, records)
    assert {(f.job_class, f.exit_code) for f in check.failures} == {("A", 3), ("D", 3)}
    assert all("needs PyTorch or CuPy" in f.stderr_tail for f in check.failures)
    assert {r.benchmark for r in records} == {"gemm", "stream"}


def test_parse_output_contract() -> None:
    assert runner.parse_output("x\nPAL_DURATION_S=1.5\nPAL_DURATION_S=2.5\n") == (2.5, None, "")
    assert runner.parse_output("PAL_GPU_UUID=GPU-1\n PAL_DURATION_S = 3 \n") == (3.0, "GPU-1", "")
    assert "no 'PAL_DURATION_S" in runner.parse_output("done in 3 s")[2]
    assert "not a positive" in runner.parse_output("PAL_DURATION_S=0")[2]
    assert "not a positive" in runner.parse_output("PAL_DURATION_S=nan")[2]


def test_record_names_are_stable_and_safe() -> None:
    assert runner.record_name("n1", 2, "A", 0) == "n1__gpu2__A__r0.json"
    assert runner.record_name("a/b", 0, "x y", 1) == "a_b__gpu0__x_y__r1.json"


# --------------------------------------------------------------------------------------------
# The measured window: benchmarks announce it, the runner samples NVML only inside it


def _palbench():
    sys.path.insert(0, str(Path(runner.__file__).parent / "profiling"))
    try:
        import palbench
    finally:
        sys.path.pop(0)
    return palbench


class StepClock:
    """Each step of the fake workload takes exactly 10 ms of this clock (no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        self.now += 0.01


@pytest.mark.parametrize("iters", [None, 7])
def test_window_starts_after_warm_up_and_reports_time_per_iteration(iters) -> None:
    palbench = _palbench()
    clock = StepClock()
    lines: list[tuple[str, int]] = []
    window = palbench.run_window(
        clock.step,
        lambda: None,
        warmup_s=0.5,
        measure_s=2.0,
        iters=iters,
        clock=lambda: clock.now,
        emit=lambda line: lines.append((line, clock.steps)),
    )
    assert lines == [("PAL_MEASURE_START", window.warmup_iterations)]
    assert window.warmup_seconds >= 0.5 and window.warmup_iterations >= 3
    assert window.iterations == clock.steps - window.warmup_iterations
    if iters is None:
        assert window.seconds >= 2.0
    else:
        assert window.iterations == 7
    assert window.per_iteration_s == pytest.approx(0.01)
    out: list[str] = []
    palbench.report(window, "GPU-x", emit=out.append)
    assert out[0] == "PAL_GPU_UUID=GPU-x"
    assert runner.parse_output("\n".join(out)) == (pytest.approx(0.01), "GPU-x", "")


def test_benchmark_refuses_a_bad_window_from_the_environment(tmp_path: Path) -> None:
    plan = CampaignPlan(
        campaign="d1",
        classes=("A",),
        repeats=1,
        benchmarks=default_benchmarks(("A",), {}),
        gpus=(PlannedGpu("n1", 0),),
    )
    directory = create_campaign(tmp_path, plan)
    proc = subprocess.run(
        [sys.executable, str(directory / BENCH_DIR / "gemm.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "PAL_MEASURE_S": "twenty"},
    )
    assert proc.returncode == 2
    assert "PAL_MEASURE_S='twenty' is not a number of seconds" in proc.stderr


def test_clock_event_bits_decode_to_names() -> None:
    assert runner.decode_clock_events(0x4) == ["sw_power_cap"]
    assert runner.decode_clock_events(0x4 | 0x40 | 0x8) == [
        "sw_power_cap",
        "hw_slowdown",
        "hw_thermal",
    ]
    assert runner.decode_clock_events(0x1000) == ["bit_0x1000"]
    assert runner.decode_clock_events(0) == []


def _window_campaign(tmp_path: Path, script: str, **device: object) -> tuple[Path, dict]:
    bench = tmp_path / "bench.sh"
    bench.write_text(script)
    plan = dataclasses.replace(
        fake_plan(bench, [PlannedGpu("n1", 0)], classes=("A",), repeats=1),
        warmup_s=0.25,
        measure_s=0.5,
    )
    directory = create_campaign(tmp_path / "c", plan)
    plan_file = directory / PLAN_FILE
    data = json.loads(plan_file.read_text())
    plan_file.write_text(json.dumps(data | {"sample_interval_s": 0.02}))
    fake_dir = tmp_path / "nvml"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(FAKE_PYNVML)
    devices = [{"minor": 0, "uuid": "GPU-aaa", "name": "H100"} | device]
    (fake_dir / "devices.json").write_text(json.dumps(devices))
    env = {
        "PYTHONPATH": str(fake_dir),
        "FAKE_NVML": str(fake_dir / "devices.json"),
        "FAKE_NVML_PHASE": str(tmp_path / "measuring"),
    }
    return directory, env


# Warm-up readings (idle clocks, 0x1 = GPU idle) until the benchmark creates the phase file
# and prints PAL_MEASURE_START; from then on power-capped (0x4) and thermally slowed (0x20).
WINDOW_BENCH = """
echo "PAL_WARMUP_S=$PAL_WARMUP_S PAL_MEASURE_S=$PAL_MEASURE_S"
sleep 0.2
touch "$FAKE_NVML_PHASE"
echo PAL_MEASURE_START
sleep 0.3
echo PAL_DURATION_S=0.0016
"""
PHASED = {
    "clock": {"warm": 345, "measure": 1290},
    "temp": {"warm": 30, "measure": 61},
    "power_mw": {"warm": 70000, "measure": 700000},
    "reasons": {"warm": 0x1, "measure": 0x4 | 0x20},
}


@pytest.mark.parametrize("old_pynvml", [False, True])
def test_runner_samples_only_the_measured_window(tmp_path: Path, old_pynvml: bool) -> None:
    directory, extra = _window_campaign(tmp_path, WINDOW_BENCH, **PHASED)
    if old_pynvml:
        extra["FAKE_NVML_OLD"] = "1"
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, tmp_path, **extra))
    assert proc.returncode == 0, proc.stderr
    r = read_json(directory)["n1__gpu0__A__r0.json"]
    assert r["telemetry_window"] == runner.WINDOW_MEASURED
    assert (r["sm_clock_mhz"], r["temperature_c"], r["power_w"]) == (1290.0, 61.0, 700.0)
    assert r["clock_events"] == {"sw_power_cap": 1.0, "sw_thermal": 1.0}
    assert r["duration_s"] == pytest.approx(0.0016)
    assert r["measure_start_s"] >= 0


def test_runner_says_when_a_benchmark_has_no_measure_start_line(tmp_path: Path) -> None:
    script = 'touch "$FAKE_NVML_PHASE"\necho PAL_DURATION_S=1.5\n'
    directory, extra = _window_campaign(tmp_path, script, **PHASED)
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, tmp_path, **extra))
    assert proc.returncode == 0, proc.stderr
    r = read_json(directory)["n1__gpu0__A__r0.json"]
    assert r["telemetry_window"] == runner.WINDOW_WHOLE_RUN
    assert r["measure_start_s"] is None


def test_runner_passes_the_plans_window_to_the_benchmark(tmp_path: Path) -> None:
    script = 'echo "PAL_DURATION_S=$PAL_MEASURE_S"\n'
    directory, extra = _window_campaign(tmp_path, script, **PHASED)
    proc = run_runner(directory, "n1", 0, slurm_env("n1", 0, 1, tmp_path, **extra))
    assert proc.returncode == 0, proc.stderr
    assert read_json(directory)["n1__gpu0__A__r0.json"]["duration_s"] == 0.5


def test_a_re_measure_task_holds_only_its_labels_gpus_and_must_hold_the_measured_one(
    tmp_path: Path,
) -> None:
    """A re-measure's plan (``gpu_type``): the script asks for the node's 2 GPUs of the label,
    not the whole node; the task holds those 2 (Slurm's numbers 1 and 3 of a 4-GPU node) and
    measures device 2, whose Slurm number (3) must be among them."""
    bench, table = write_fakes(tmp_path / "fakes", {"default": [2.0]})
    plan = dataclasses.replace(
        fake_plan(bench, [PlannedGpu("n1", 2, None, 3)], classes=("A",), repeats=1),
        node_gpu_counts={"n1": 2},
        gpu_type="v100-b",
    )
    directory = create_campaign(tmp_path / "campaigns", plan)
    assert load_plan(tmp_path / "campaigns", plan.campaign)[0] == plan  # campaign.json keeps it
    script = (directory / "sbatch" / "n1.sbatch").read_text()
    assert "#SBATCH --gres=gpu:v100-b:2\n" in script and "--exclusive" not in script
    holds = {"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}
    proc = run_runner(directory, "n1", 2, slurm_env("n1", 2, 2, table, **holds))
    assert proc.returncode == 0, proc.stderr
    (record,) = read_json(directory).values()
    assert record["status"] == "ok"
    assert record["cuda_visible_devices"] == "1"  # no NVML: its place among the job's GPUs
    wrong = {"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    proc = run_runner(directory, "n1", 2, slurm_env("n1", 2, 2, table, **wrong))
    assert proc.returncode == runner.EXIT_WRONG_ALLOCATION
    assert "does not hold GPU 2 (Slurm's number 3" in proc.stderr
