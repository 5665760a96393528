"""Running the advisor as a service: `serve health|stats|reload` as real subprocess CLI runs
against a real `slurm-pal serve` process (real socket, real store; no Slurm here, so its reads
fail and are counted), SIGHUP, the Prometheus endpoint and textfile scraped for real, and the
fail-open file job_submit.lua appends to (the rendered plugin under lua5.1)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_pal import __version__
from slurm_pal.adapters.config import ConfigError, load_config
from slurm_pal.advisor.client import AdvisorClient, AdvisorUnavailable
from slurm_pal.advisor.failopen import FailOpenLog, fail_open_path
from slurm_pal.advisor.server import Counters, Histogram
from slurm_pal.site.render import HookSettings, lua_string, plan_site, render_files
from tests.helpers.advisor import make_env

GPU_JOB = {"user": "alice", "uid": 1000, "name": "train", "tres_per_node": "gres:gpu:2"}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`slurm-pal ARGS` as its own process (no site config from the environment)."""
    return subprocess.run(
        [sys.executable, "-m", "slurm_pal.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SLURM_PAL_CONFIG": ""},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{label="v"}': value} (parsed by prometheus-client's parser)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        return samples(answer.read().decode())


@dataclass
class Service:
    root: Path
    db: Path
    config: Path
    labels: Path
    socket: Path
    proc: subprocess.Popen[bytes] | None = None

    def write_config(self, extra_advisor: str = "", tail: str = "") -> None:
        self.config.write_text(
            f'[advisor]\nsocket = "{self.socket}"\nrefresh_s = 3600\nreplan_s = 0\n'
            f'policy = "pal"\nlabels_file = "{self.labels}"\n{extra_advisor}'
            f'[hooks]\nspool_dir = "{self.root / "spool"}"\n{tail}'
        )

    def start(self) -> None:
        log = (self.root / "serve.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "slurm_pal.cli.main", "--db", str(self.db)),
                *("--config", str(self.config), "serve", "--pidfile", str(self.root / "pid")),
            ],
            env={
                **os.environ,
                "SLURM_CONF": str(self.root / "missing.conf"),
                "SLURM_PAL_CONFIG": "",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if AdvisorClient(str(self.socket)).request({"op": "health"}, 1).get("ok"):
                    return
            except AdvisorUnavailable:
                time.sleep(0.1)
        raise AssertionError(f"serve did not answer:\n{self.log()}")

    def ask(self, op: str) -> dict:
        return AdvisorClient(str(self.socket)).request({"op": op}, 10)

    def log(self) -> str:
        return (self.root / "serve.log").read_text()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def service() -> Iterator[Service]:
    root = Path(tempfile.mkdtemp(prefix="spal-ctl-", dir="/tmp"))  # short socket paths
    root.chmod(0o755)
    env = make_env(root)
    svc = Service(root, env.db, root / "site.toml", env.labels_path, root / "adv.sock")
    svc.write_config()
    try:
        yield svc
    finally:
        svc.stop()
        env.close()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# health, options at the subcommand


def test_health_json_when_down_prints_ok_false_and_exits_1(tmp_path: Path) -> None:
    gone = str(tmp_path / "none.sock")
    out = cli("serve", "health", "--json", "--socket", gone)
    assert out.returncode == 1, out.stderr
    answer = json.loads(out.stdout)
    assert answer["ok"] is False and "cannot reach the advisor" in answer["error"]
    assert "Traceback" not in out.stderr
    out = cli("serve", "--socket", gone, "health")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the advisor")


def test_subcommand_options_and_reload_as_cli_runs(service: Service) -> None:
    """`serve health|stats|reload --socket X`, `serve --socket X ...` as before; a reload
    applies what can change live and names what waits for a restart; bad files are refused
    in one line each and the running config kept."""
    service.start()
    sock = str(service.socket)
    out = cli("serve", "health", "--socket", sock, "--json")
    assert out.returncode == 0, out.stderr
    health = json.loads(out.stdout)
    assert health["ok"] is True and health["campaign"] == "example" and health["policy"] == "pal"
    out = cli("serve", "--socket", str(service.root / "none.sock"), "stats", "--socket", sock)
    assert out.returncode == 0 and "decide_total" in out.stdout  # the subcommand's wins

    good = (
        service.config.read_text()
        .replace('policy = "pal"', 'policy = "packed"')
        .replace("replan_s = 0", "replan_s = 7.5")
        .replace("[advisor]\n", "[advisor]\nmax_connections = 9\n")
    )
    service.config.write_text(good)
    out = cli("serve", "reload", "--socket", sock)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("reloaded: ")
    assert "advisor.policy 'pal' -> 'packed'" in out.stdout
    assert "advisor.replan_s 0.0 -> 7.5" in out.stdout
    assert "at restart only: advisor.max_connections" in out.stdout
    assert service.ask("health")["policy"] == "packed"
    (line,) = [ln for ln in service.log().splitlines() if "reloaded config" in ln]
    assert "advisor.policy 'pal' -> 'packed'" in line

    labels = service.labels.read_text()
    breakages = [
        (
            "unknown key 'advisor.polcy'",
            good.replace('policy = "packed"', 'polcy = "random"'),
            labels,
        ),
        ("not valid TOML", '[advisor\npolicy = "random"\n', labels),
        (
            "not a labels.json of `site render`",
            good.replace('"packed"', '"random"'),
            '{"nodes": 3}',
        ),
    ]
    for message, config, labels_text in breakages:
        service.config.write_text(config)
        service.labels.write_text(labels_text)
        out = cli("serve", "reload", "--socket", sock)
        assert out.returncode == 1 and out.stdout == "", out.stdout
        (line,) = out.stderr.strip().splitlines()
        assert "reload refused, running config kept" in line and message in line
        assert service.ask("health")["policy"] == "packed"
    out = cli("serve", "reload", "--socket", sock, "--json")  # still the bad labels
    assert out.returncode == 1 and json.loads(out.stdout)["ok"] is False
    stats = service.ask("stats")
    assert stats["reloads"] == 1 and stats["reloads_refused"] == 4
    refused = [ln for ln in service.log().splitlines() if "reload refused" in ln]
    assert len(refused) == 4 and "Traceback" not in service.log()
    service.labels.write_text(labels)
    out = cli("serve", "reload", "--socket", sock, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["policy"] == "random"


def test_sighup_reloads_the_config_and_keeps_serving(service: Service) -> None:
    service.start()
    assert service.proc is not None
    assert (service.root / "pid").read_text().strip() == str(service.proc.pid)
    service.config.write_text(
        service.config.read_text().replace('policy = "pal"', 'policy = "random"')
    )
    service.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while service.ask("stats")["reloads"] != 1:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.1)
    assert service.ask("health")["policy"] == "random"
    text = service.log()
    assert "SIGHUP: reloading" in text and "advisor.policy 'pal' -> 'random'" in text
    service.config.write_text("[advisor\n")  # a bad file on SIGHUP: one line, still serving
    service.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while service.ask("stats")["reloads_refused"] != 1:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.1)
    assert service.ask("health")["policy"] == "random"
    assert service.proc.poll() is None and "Traceback" not in service.log()


# ---------------------------------------------------------------------------------------------
# metrics


def test_metrics_endpoint_counts_decisions_latency_and_fail_opens(service: Service) -> None:
    port = free_port()
    service.write_config(tail=f"[metrics]\nport = {port}\n")
    service.start()
    failopen = fail_open_path(service.socket)
    mode = failopen.stat().st_mode
    assert stat.S_IMODE(mode) == 0o660  # the plugin (SlurmUser, the socket's group) appends
    before = scrape(port)
    assert before['slurm_pal_decisions_total{action="pass"}'] == 0
    assert before["slurm_pal_decide_duration_seconds_count"] == 0
    assert before["slurm_pal_fail_open_total"] == 0
    assert before["slurm_pal_slurm_read_errors_total"] >= 1  # no Slurm here
    assert before["slurm_pal_slurm_read_duration_seconds_count"] == 0  # failed reads: not timed
    client = AdvisorClient(str(service.socket))
    for _ in range(3):  # no Slurm view: every GPU job passes
        assert client.request({"op": "decide", "job": GPU_JOB}, 10)["action"] == "pass"
    with failopen.open("a") as fh:  # what job_submit.lua appends when it fails open
        fh.write("1764000000 connect /run/x.sock: timeout\n1764000001 receive: closed\n")
    (service.root / "spool").mkdir()
    (service.root / "spool" / "5.n01.epilog.json").write_text("{}")
    after = scrape(port)
    assert after['slurm_pal_decisions_total{action="pass"}'] == 3
    assert after['slurm_pal_decisions_total{action="route"}'] == 0
    assert after["slurm_pal_decide_duration_seconds_count"] == 3
    assert after['slurm_pal_decide_duration_seconds_bucket{le="+Inf"}'] == 3
    assert after["slurm_pal_decide_duration_seconds_sum"] > 0
    assert after["slurm_pal_fail_open_total"] == 2
    assert after["slurm_pal_spool_backlog"] == 1
    assert (
        after[
            f'slurm_pal_advisor_info{{campaign="example",policy="pal",problem="",version="{__version__}"}}'
        ]
        == 1
    )
    stats = service.ask("stats")
    assert stats["fail_open"] == 2 and stats["decide_pass"] == 3
    assert "let 2 GPU job(s) through as written" in service.log()
    assert scrape(port)["slurm_pal_fail_open_total"] == 2  # counted once


def test_metrics_textfile_is_written_atomically_for_node_exporter(service: Service) -> None:
    prom = service.root / "textfile" / "slurm-pal.prom"
    prom.parent.mkdir()
    service.write_config(tail=f'[metrics]\ntextfile = "{prom}"\ntextfile_s = 0.2\n')
    service.start()
    client = AdvisorClient(str(service.socket))
    client.request({"op": "decide", "job": GPU_JOB}, 10)
    deadline = time.monotonic() + 30
    while True:
        values = samples(prom.read_text())
        if values['slurm_pal_decisions_total{action="pass"}'] == 1:
            break
        assert time.monotonic() < deadline, prom.read_text()
        time.sleep(0.1)
    assert values["slurm_pal_decide_duration_seconds_count"] == 1
    service.stop()
    assert [p.name for p in prom.parent.iterdir()] == ["slurm-pal.prom"]  # no temp files


def test_metrics_port_in_use_stops_serve_with_one_line(service: Service) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        service.write_config(tail=f"[metrics]\nport = {port}\n")
        out = cli("--db", str(service.db), "--config", str(service.config), "serve")
    assert out.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not service.socket.exists()  # the advisor it started was stopped again


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[metrics]\nport = 70000\n", "'metrics.port' must be 1-65535"),
        ('[metrics]\ntextfile = "slurm.prom"\n', "'metrics.textfile' must be an absolute path"),
        ('[metrics]\ntextfile = "/var/x.txt"\n', "ending in .prom"),
        ("[metrics]\ntextfile_s = 0\n", "'metrics.textfile_s' must be > 0"),
        ("[metrics]\nprot = 1\n", "unknown key 'metrics.prot'"),
    ],
)
def test_metrics_config_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "site.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_histograms_are_cumulative_and_counters_feed_them() -> None:
    hist = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.5):
        hist.observe(value)
    assert hist.cumulative() == [(0.001, 2), (0.01, 3), (0.1, 3), (float("inf"), 4)]
    assert hist.count == 4 and hist.sum == pytest.approx(0.5035)
    counters = Counters()
    counters.decide_ms(0.4)
    counters.replan_round_ms(120.0)
    counters.job_end_ms(80.0)
    for ms in (300.0, 2400.0):  # Slurm reads: a large queue takes seconds
        counters.slurm_read_ms(ms)
    got = counters.histograms()
    assert got["decide"].cumulative()[0] == (0.0005, 1)
    assert got["replan_round"].count == 1 and got["replan_round"].sum == pytest.approx(0.12)
    assert got["job_end"].count == 1
    assert got["slurm_read"].count == 2 and got["slurm_read"].sum == pytest.approx(2.7)
    snapshot = counters.snapshot()
    assert snapshot["slurm_read_ms_max"] == 2400.0 and snapshot["slurm_read_ms_p50"] is not None
    got["decide"].observe(1.0)  # a copy: the counters' own histogram is unchanged
    assert counters.histograms()["decide"].count == 1


# ---------------------------------------------------------------------------------------------
# the fail-open file


def test_fail_open_log_counts_whole_lines_once_and_survives_rotation(tmp_path: Path) -> None:
    path = tmp_path / "adv.sock.failopen"
    log = FailOpenLog(path, rotate_bytes=64)
    assert log.poll() == 0  # no file yet
    log.prepare()
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    with path.open("a") as fh:
        fh.write("1 connect: refused\n2 receive: timeout\n3 half a li")
    assert log.poll() == 2 and log.last == "2 receive: timeout"
    assert log.poll() == 0
    with path.open("a") as fh:
        fh.write("ne\n" + "4 a long reason that pushes the file past its rotation size\n")
    assert log.poll() == 2 and log.total == 4
    assert path.stat().st_size == 0  # rotated: an empty file in its place, same mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    with path.open("a") as fh:
        fh.write("5 after rotation\n")
    assert log.poll() == 1 and log.total == 5
    path.write_text("6 truncated by an admin\n")  # shorter than what was read: from the start
    assert log.poll() == 1 and log.total == 6


LUA = shutil.which("lua5.1")
MOCK = """
slurm = {SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534}
slurm.log_info = function(fmt, ...) end
slurm.log_user = function(fmt, ...) end
dofile(%s)
local job = {tres_per_node = "gres:gpu:v100:2", name = "train"}
io.write(tostring(slurm_job_submit(job, {}, 1000)), " ", job.tres_per_node, "\\n")
"""


def test_the_rendered_plugin_appends_a_line_when_it_fails_open(tmp_path: Path) -> None:
    if LUA is None:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("lua5.1 not installed: bash scripts/install-slurm.sh", pytrace=False)
        pytest.skip("lua5.1 not installed")
    frame = pd.DataFrame(
        [{"job_class": "A", "uuid": "u0", "node": "n1", "gpu_index": 0, "gpu_model": "v100"}]
    )
    frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    plan = plan_site("c1", frame, {"u0": "v100-a0"})
    sock = tmp_path / "adv.sock"  # nobody listens: every GPU job fails open
    script = tmp_path / "job_submit.lua"
    hooks = HookSettings(socket=str(sock), submit_timeout_ms=100)
    script.write_text(render_files(plan, hooks=hooks)["job_submit.lua"])
    log = FailOpenLog(fail_open_path(sock))
    log.prepare()
    for _ in range(2):
        proc = subprocess.run(
            [LUA, "-"],
            input=MOCK % lua_string(str(script)),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["0", "gres:gpu:2"]  # accepted, model type translated
    assert log.poll() == 2
    assert str(sock) in (log.last or "")  # the reason: the connect error naming the socket
