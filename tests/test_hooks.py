"""Prolog/Epilog hooks: records from the hook environment, spool-then-send delivery against a
real Unix-socket server, flush, the hard time limit, the stdlib-only import rule, and NVML
UUIDs + the detached telemetry sampler through a fake at the pynvml boundary."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.fake_pynvml import FakeGpu, FakePynvml

from slurm_pal.hooks import gpus
from slurm_pal.hooks.cli import run_hook
from slurm_pal.hooks.records import HookEnvError, build_record, exit_code, parse_gpus
from slurm_pal.hooks.spool import flush, spooled, write_spool

FAKES = Path(__file__).parent / "fakes"
PROLOG_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURMD_NODENAME": "n01",
    "SLURM_JOB_GPUS": "1,3",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_UID": "1001",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_CONSTRAINTS": "rackA",
    "SLURM_JOB_COMMENT": "pal:app=bert",
}
LABELS = {
    "campaign": "c",
    "nodes": {
        "n01": [
            {"index": 0, "slurm_index": 0, "label": "v100-a0", "uuid": "GPU-0", "file": "x"},
            {"index": 2, "slurm_index": 1, "label": "v100-a0", "uuid": "GPU-2", "file": "x"},
            {"index": 1, "slurm_index": 2, "label": "v100-a1", "uuid": "GPU-1", "file": "x"},
            {"index": 3, "slurm_index": 3, "label": "v100-a2", "uuid": "GPU-3", "file": "x"},
        ]
    },
}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="spal-hk-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Advisor:
    """A stand-in advisor on a real Unix socket: answers each request line with
    ``respond(request)`` (None: never answer) and keeps the requests."""

    def __init__(self, path: Path, respond: Callable[[dict], dict | None]) -> None:
        self.path = path
        self.respond = respond
        self.requests: list[dict] = []
        self.seen: set[str] = set()
        self.held: list[socket.socket] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            request = json.loads(data)
            self.requests.append(request)
            answer = self.respond(request)
            if answer is None:
                self.held.append(conn)
                continue
            conn.sendall((json.dumps(answer) + "\n").encode())
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()
        self.path.unlink(missing_ok=True)


def records_ok(advisor_seen: set[str]) -> Callable[[dict], dict]:
    def respond(request: dict) -> dict:
        rid = request["record"]["record_id"]
        duplicate = rid in advisor_seen
        advisor_seen.add(rid)
        return {"v": 1, "ok": True, "duplicate": duplicate}

    return respond


@pytest.fixture
def advisor(short_dir: Path) -> Iterator[Callable[..., Advisor]]:
    started: list[Advisor] = []

    def start(respond: Callable[[dict], dict | None] | None = None) -> Advisor:
        adv = Advisor(short_dir / "advisor.sock", lambda r: None)
        adv.respond = respond or records_ok(adv.seen)
        started.append(adv)
        return adv

    yield start
    for adv in started:
        adv.close()


# ---------------------------------------------------------------------------------------------
# records


def test_prolog_record_from_the_environment() -> None:
    record = build_record("prolog", PROLOG_ENV, "n01", 1700000000.12345)
    assert record == {
        "record_id": "42:n01:prolog",
        "kind": "prolog",
        "job_id": 42,
        "node": "n01",
        "time": 1700000000.123,
        "slurm_gpus": [1, 3],
        "user": "alice",
        "uid": 1001,
        "partition": "debug",
        "constraints": "rackA",
        "comment": "pal:app=bert",
    }


def test_epilog_record_and_exit_codes() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_EXIT_CODE": "768"}
    record = build_record("epilog", env, "n02", 1.0)
    assert record["record_id"] == "7:n02:epilog" and record["exit_code"] == 3
    assert record["slurm_gpus"] == [] and "user" not in record
    assert exit_code({"SLURM_JOB_EXIT_CODE": "256"}) == 1
    assert exit_code({}) is None
    assert parse_gpus(" 0, 2,x,,5") == [0, 2, 5]
    with pytest.raises(HookEnvError, match="SLURM_JOB_ID"):
        build_record("prolog", {"SLURM_JOB_ID": "abc"}, "n1", 1.0)
    with pytest.raises(ValueError, match="prolog, epilog"):
        build_record("task", PROLOG_ENV, "n1", 1.0)


# ---------------------------------------------------------------------------------------------
# spool + delivery


def test_delivered_record_leaves_no_file(short_dir: Path, advisor) -> None:
    adv = advisor()
    spool = short_dir / "spool"
    record = run_hook(
        "prolog", socket_path=str(adv.path), spool_dir=spool, timeout_s=5, env=PROLOG_ENV
    )
    assert record is not None
    assert [r["record"] for r in adv.requests] == [record]
    assert adv.requests[0]["v"] == 1 and adv.requests[0]["op"] == "record"
    assert spooled(spool) == [] and list(spool.iterdir()) == []


def test_advisor_down_keeps_the_record_and_flush_delivers_it(
    short_dir: Path, advisor, capsys
) -> None:
    spool = short_dir / "spool"
    sock = short_dir / "advisor.sock"
    for job in ("1", "2"):
        env = {**PROLOG_ENV, "SLURM_JOB_ID": job}
        run_hook("epilog", socket_path=str(sock), spool_dir=spool, timeout_s=1, env=env)
    files = spooled(spool)
    assert [p.name for p in files] == ["1.n01.epilog.json", "2.n01.epilog.json"]
    assert json.loads(files[0].read_text())["record_id"] == "1:n01:epilog"
    assert "not delivered" in capsys.readouterr().err
    # still down: flush leaves both
    result = flush(spool, str(sock), 1)
    assert result.delivered == [] and len(result.left) == 2
    (spool / "junk.json").write_text("{not json")
    adv = advisor()
    adv.seen.add("1:n01:epilog")  # already applied once: a duplicate is ok too
    result = flush(spool, str(sock), 5)
    assert sorted(result.delivered) == ["1.n01.epilog.json", "2.n01.epilog.json"]
    assert result.unreadable == ["junk.json"] and result.left == []
    assert [p.name for p in spooled(spool)] == ["junk.json"]


def test_refused_and_stalled_answers_keep_the_file(short_dir: Path, advisor) -> None:
    spool = short_dir / "spool"
    adv = advisor(lambda r: {"v": 1, "ok": False, "error": "bad record"})
    run_hook("prolog", socket_path=str(adv.path), spool_dir=spool, timeout_s=5, env=PROLOG_ENV)
    assert [p.name for p in spooled(spool)] == ["42.n01.prolog.json"]
    adv.respond = lambda r: None  # accepts and never answers
    env = {**PROLOG_ENV, "SLURM_JOB_ID": "43"}
    run_hook("prolog", socket_path=str(adv.path), spool_dir=spool, timeout_s=0.2, env=env)
    assert len(spooled(spool)) == 2 and len(adv.requests) == 2


def test_unwritable_spool_still_delivers(short_dir: Path, advisor, capsys) -> None:
    adv = advisor()
    blocker = short_dir / "file"
    blocker.write_text("")
    run_hook(
        "prolog",
        socket_path=str(adv.path),
        spool_dir=blocker / "spool",
        timeout_s=5,
        env=PROLOG_ENV,
    )
    assert len(adv.requests) == 1
    assert "cannot spool" in capsys.readouterr().err
    assert (
        write_spool(blocker / "spool", {"record_id": "x", "job_id": 1, "node": "n", "kind": "k"})
        is None
    )


# ---------------------------------------------------------------------------------------------
# the process: exit 0 always, a hard limit, stdlib-only imports


def _hook(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_pal.hooks", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_hook_process_exits_0_without_an_advisor_and_on_bad_arguments(short_dir: Path) -> None:
    spool = short_dir / "spool"
    proc = _hook(
        ["prolog", "--socket", str(short_dir / "none.sock"), "--spool-dir", str(spool)],
        PROLOG_ENV,
    )
    assert proc.returncode == 0 and "job 42's prolog record from n01 not delivered" in proc.stderr
    assert [p.name for p in spooled(spool)] == ["42.n01.prolog.json"]
    assert _hook(["epilog", "--bogus"], PROLOG_ENV).returncode == 0
    assert (
        _hook(
            ["prolog", "--socket", "x", "--spool-dir", str(spool)], {"SLURM_JOB_ID": ""}
        ).returncode
        == 0
    )
    assert _hook(["flush", "--bogus"], {}).returncode == 2


def test_hard_time_limit_ends_a_stuck_hook_with_0(short_dir: Path, advisor) -> None:
    adv = advisor(lambda r: None)  # never answers; the deliver timeout is longer than the limit
    spool = short_dir / "spool"
    proc = _hook(
        [
            "epilog",
            *("--socket", str(adv.path), "--spool-dir", str(spool)),
            *("--timeout-ms", "600000", "--limit-s", "0.5"),
        ],
        PROLOG_ENV,
    )
    assert proc.returncode == 0 and "hard time limit" in proc.stderr
    assert [p.name for p in spooled(spool)] == ["42.n01.epilog.json"]  # spooled before sending


def test_hooks_import_only_the_stdlib(short_dir: Path) -> None:
    """slurmd waits for the Prolog: no numpy/pandas/typer/rich/jinja2 on the hook path."""
    proc = subprocess.run(
        [
            *(sys.executable, "-X", "importtime", "-m", "slurm_pal.hooks", "epilog"),
            *("--socket", str(short_dir / "none.sock"), "--spool-dir", str(short_dir / "s")),
        ],
        env={**os.environ, **PROLOG_ENV},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "slurm_pal.hooks.cli" in imported
    heavy = {
        m
        for m in imported
        if m.split(".")[0] in {"numpy", "pandas", "typer", "rich", "jinja2", "sklearn"}
    }
    assert heavy == set()
    # the sampler's path too (the NVML adapter)
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import slurm_pal.hooks.gpus, slurm_pal.adapters.nvml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "slurm_pal.adapters.nvml" in imported
    assert not {m for m in imported if m.split(".")[0] in {"numpy", "pandas"}}


# ---------------------------------------------------------------------------------------------
# NVML: UUIDs and the sampler


class NodeNvml(FakePynvml):
    """The fake plus the two calls the hooks use to list a node's GPUs."""

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetMinorNumber(self, handle) -> int:
        return self._gpu(handle).index


def _node_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(index=i, uuid=f"GPU-{i}", gpm_supported=False, utilization=[(80 + i, 20)])
        for i in range(4)
    ]


def test_uuids_follow_slurm_indices_through_labels_json(short_dir: Path) -> None:
    labels = short_dir / "labels.json"
    labels.write_text(json.dumps(LABELS))
    # Slurm index 1 is device 2 and Slurm index 2 is device 1 (types grouped)
    devices = gpus.device_indices(labels, "n01", [1, 2])
    assert devices == [2, 1]
    nvml = NodeNvml(_node_gpus())
    assert gpus.nvml_uuids(nvml, devices) == ["GPU-2", "GPU-1"]
    assert nvml.initialized is False  # shut down again
    assert gpus.device_indices(labels, "n09", [0]) == []
    assert gpus.device_indices(None, "n01", [0]) == []
    assert gpus.nvml_uuids(NodeNvml(_node_gpus()[:2]), [0, 3]) == []  # partial: none
    assert gpus.nvml_uuids(NodeNvml([], init_error=9), [0]) == []


def test_sampler_runs_until_stopped_and_summarises(short_dir: Path) -> None:
    nvml = NodeNvml(_node_gpus())
    stop = threading.Event()
    done: list[dict | None] = []
    thread = threading.Thread(
        target=lambda: done.append(
            gpus.run_sampler(short_dir, 5, ["GPU-0", "GPU-1"], 0.01, stop, nvml=nvml)
        )
    )
    thread.start()
    while nvml.gpus[0].utilization_reads < 3:
        stop.wait(0.01)
    stop.set()
    thread.join(timeout=30)
    (summary,) = done
    assert summary is not None and summary["source"] == "nvml"
    assert summary["samples"] >= 3 and summary["dram_util"] == pytest.approx(20)
    assert json.loads((short_dir / "telemetry" / "5.json").read_text()) == summary


FAKE_MODULE = """
import sys
sys.path.insert(0, {fakes!r})
from fake_pynvml import FakeGpu, FakePynvml

class NodeNvml(FakePynvml):
    def nvmlDeviceGetCount(self):
        return len(self.gpus)
    def nvmlDeviceGetMinorNumber(self, handle):
        return self._gpu(handle).index
    def nvmlDeviceGetUtilizationRates(self, handle):
        open({marker!r}, "a").write("x")
        return super().nvmlDeviceGetUtilizationRates(handle)

_fake = NodeNvml([FakeGpu(index=i, uuid="GPU-%d" % i, gpm_supported=False,
                          utilization=[(90, 30)], clock_reasons=[0x8 if i == 3 else 0x4],
                          sm_clocks=[1000 + i], max_sm_clock=1980) for i in range(4)])

def __getattr__(name):
    return getattr(_fake, name)
"""


def test_prolog_starts_the_sampler_and_epilog_attaches_its_summary(
    short_dir: Path, advisor
) -> None:
    """The whole path in processes: Prolog (UUIDs via labels.json, detached sampler),
    samples taken, Epilog (sampler stopped, telemetry in the record), both delivered."""
    adv = advisor()
    labels = short_dir / "labels.json"
    labels.write_text(json.dumps(LABELS))
    marker = short_dir / "sampled"
    mod_dir = short_dir / "mods"
    mod_dir.mkdir()
    (mod_dir / "node_nvml.py").write_text(FAKE_MODULE.format(fakes=str(FAKES), marker=str(marker)))
    env = {
        **PROLOG_ENV,
        "PYTHONPATH": f"{mod_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "SLURM_PAL_PYNVML": "node_nvml",
    }
    spool = short_dir / "spool"
    common = ["--socket", str(adv.path), "--spool-dir", str(spool), "--labels", str(labels)]
    proc = _hook(["prolog", *common, "--sample-s", "0.02"], env)
    assert proc.returncode == 0, proc.stderr
    prolog = adv.requests[0]["record"]
    assert prolog["uuids"] == ["GPU-2", "GPU-3"]  # Slurm indices 1, 3 -> devices 2, 3
    pid = int((spool / "telemetry" / "42.pid").read_text())
    while not (marker.exists() and len(marker.read_text()) >= 4):
        threading.Event().wait(0.02)
    proc = _hook(["epilog", *common], {**env, "SLURM_JOB_EXIT_CODE2": "0:0"})
    assert proc.returncode == 0, proc.stderr
    epilog = adv.requests[1]["record"]
    assert epilog["record_id"] == "42:n01:epilog" and epilog["exit_code"] == 0
    telemetry = epilog["telemetry"]
    assert telemetry["source"] == "nvml" and telemetry["samples"] >= 2
    assert telemetry["dram_util"] == pytest.approx(30) and telemetry["fu_util"] == pytest.approx(90)
    # the suspicion readings, keyed by Slurm index (1 -> device 2, 3 -> device 3), not telemetry
    assert "gpu_signals" not in telemetry
    signals = epilog["gpu_signals"]
    assert set(signals) == {"1", "3"} and signals["3"]["clock_events"] == {"hw_slowdown": 1.0}
    assert signals["1"]["clock_events"] == {"sw_power_cap": 1.0}
    assert signals["1"]["sm_clock_mhz"] == 1002 and signals["1"]["sm_clock_max_mhz"] == 1980
    assert not (spool / "telemetry" / "42.pid").exists() and spooled(spool) == []
    # the sampler is gone (reaped by init or a zombie of nobody we know). It writes its summary
    # and then exits, so the Epilog can return while it is still finishing: wait for the exit
    # (a few ms; the bound only keeps a sampler that never exits from hanging the test).
    deadline = time.monotonic() + 30
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            state = "gone"
        if state in ("gone", "Z", "X") or time.monotonic() > deadline:
            break
        threading.Event().wait(0.01)
    assert state in ("gone", "Z", "X")


def test_no_nvml_means_no_uuids_and_no_sampler(short_dir: Path, advisor) -> None:
    adv = advisor()
    labels = short_dir / "labels.json"
    labels.write_text(json.dumps(LABELS))
    env = {**PROLOG_ENV, "SLURM_PAL_PYNVML": "no_such_module_here"}
    spool = short_dir / "spool"
    proc = _hook(
        ["prolog", "--socket", str(adv.path), "--spool-dir", str(spool), "--labels", str(labels)],
        env,
    )
    assert proc.returncode == 0
    assert "uuids" not in adv.requests[0]["record"]
    assert not (spool / "telemetry").exists()


def test_slurm_pal_hook_cli_flush(short_dir: Path, advisor, run_cli) -> None:
    spool = short_dir / "spool"
    write_spool(spool, build_record("epilog", PROLOG_ENV, "n01", 1.0))
    sock = short_dir / "advisor.sock"
    left = run_cli("hook", "flush", "--socket", sock, "--spool-dir", spool, "--json", ok=False)
    assert left.exit_code == 1 and _json_tail(left.output)["left"] == ["42.n01.epilog.json"]
    adv = advisor()
    done = run_cli("hook", "flush", "--socket", sock, "--spool-dir", spool, "--json")
    assert _json_tail(done.output)["delivered"] == ["42.n01.epilog.json"]
    assert adv.requests[0]["record"]["record_id"] == "42:n01:epilog"


def _json_tail(output: str) -> dict:
    """The JSON object printed last (the runner mixes the hooks' stderr warnings in)."""
    return json.loads(output[output.index("\n{") + 1 :] if not output.startswith("{") else output)
