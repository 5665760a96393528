"""The advisor's Prometheus endpoint and reload on a real Slurm 22.05: a real `slurm-pal serve`
with ``[metrics] port``, the rendered job_submit.lua, Prolog and Epilog, jobs through plain
sbatch, and HTTP GETs of /metrics: decisions by outcome, the decide histogram, Prolog/Epilog
records, the job-end re-planning round, a fail-open while the advisor is down (counted from the
plugin's fail-open file when it is back), and a reload (`serve reload`) that keeps the
reservation of a held job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from slurm_pal.adapters.slurm.state import CliStateReader, JobState
from slurm_pal.advisor.client import AdvisorClient, AdvisorUnavailable
from slurm_pal.advisor.decide import parse_admin_comment
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm, NodeSpec
from tests.slurm.conftest import FEATURES, require_slurm
from tests.slurm.conftest import testbed_dir as fresh_testbed_dir

pytestmark = pytest.mark.slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Site:
    tb: LocalSlurm
    root: Path
    db: Path
    config: Path
    socket: Path
    port: int
    advisor: subprocess.Popen[bytes] | None = None

    def start_advisor(self) -> None:
        log = (self.root / "advisor.log").open("ab")
        self.advisor = subprocess.Popen(
            [
                *(sys.executable, "-m", "slurm_pal.cli.main", "--db", str(self.db)),
                *("--config", str(self.config), "serve"),
            ],
            env={**self.tb.env, "SLURM_PAL_CONFIG": ""},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.advisor.poll() is None, self.log()
            try:
                if self.ask("health").get("ok"):
                    return
            except AdvisorUnavailable:
                time.sleep(0.1)
        raise AssertionError(f"serve did not answer:\n{self.log()}")

    def stop_advisor(self) -> None:
        if self.advisor is not None and self.advisor.poll() is None:
            self.advisor.send_signal(signal.SIGTERM)
            try:
                self.advisor.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.advisor.kill()
                self.advisor.wait()
        self.advisor = None

    def ask(self, op: str) -> dict:
        return AdvisorClient(str(self.socket)).request({"op": op}, 10)

    def log(self) -> str:
        path = self.root / "advisor.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def scrape(self) -> dict[str, float]:
        """GET /metrics, parsed by prometheus-client's own parser."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"].startswith("text/plain")
            text = answer.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def sbatch(self, *args: str) -> int:
        out = self.root / "out"
        cmd = ["sbatch", "--parsable", "-o", str(out / "%j.out"), "--chdir", str(out), *args]
        proc = subprocess.run(cmd, env=self.tb.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
        return int(proc.stdout.strip().split(";")[0])

    def jobs(self) -> dict[int, JobState]:
        return {j.job_id: j for j in CliStateReader(self.tb.env).jobs()}

    def ended(self, job_id: int) -> bool:
        """Gone from squeue or shown in a final state (squeue keeps ended jobs a while)."""
        job = self.jobs().get(job_id)
        return job is None or job.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

    def wait_until(self, what: str, check: object, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"{what}\n{self.log()}\n{self.tb.log_tails()}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    require_slurm()
    root = fresh_testbed_dir()
    work = root / "work"
    work.mkdir()
    out = root / "out"
    out.mkdir()
    db = work / "store.db"
    sock = root / "adv" / "advisor.sock"
    port = _free_port()
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\nrefresh_s = 1.0\nreplan_s = 0\n'
        f'reservation_ttl_s = 600\nlabels_file = "{work / "site" / "labels.json"}"\n'
        f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
        f"[metrics]\nport = {port}\n"
    )
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    base = ["--db", str(db), "--config", str(config)]
    for args in (
        ["profile", "ingest", str(csv), "--campaign", "example"],
        ["site", "render", "--out", str(work / "site"), "--device-pattern", "/dev/tty{index}"],
    ):
        result = CliRunner().invoke(app, [*base, *args], env={"SLURM_PAL_CONFIG": None})
        assert result.exit_code == 0, result.output
    rendered = work / "site"
    labels = json.loads((rendered / "labels.json").read_text())
    nodes = [
        NodeSpec(n, tuple(g["label"] for g in sorted(gpus, key=lambda g: g["index"])), FEATURES[n])
        for n, gpus in labels["nodes"].items()
    ]
    tb = LocalSlurm(
        root,
        nodes,
        job_submit_lua=(rendered / "job_submit.lua").read_text(),
        prolog=str(rendered / "prolog.sh"),
        epilog=str(rendered / "epilog.sh"),
    )
    the_site = Site(tb, root, db, config, sock, port)
    try:
        tb.start()
        the_site.start_advisor()
        yield the_site
    finally:
        the_site.stop_advisor()
        tb.stop()
        if not os.environ.get("SLURM_PAL_KEEP_TESTBED"):
            shutil.rmtree(root, ignore_errors=True)


def test_a_scrape_shows_decisions_records_rounds_and_fail_opens(site: Site) -> None:
    before = site.scrape()
    assert before['slurm_pal_decisions_total{action="route"}'] == 0
    assert before["slurm_pal_decide_duration_seconds_count"] == 0
    assert (
        before[
            'slurm_pal_advisor_info{campaign="example",policy="packed-pm",problem="",version="0.1.0"}'
        ]
        == 1
    )
    assert before["slurm_pal_gpus"] == 16

    # one GPU job through sbatch: routed at submit, its Prolog and Epilog recorded, its end
    # starts a re-planning round before the Epilog's answer
    job_id = site.sbatch("--gres=gpu:1", "--wrap=sleep 1")
    site.wait_until(f"job {job_id} ended", lambda: site.ended(job_id))
    site.wait_until("prolog and epilog stored", lambda: site.ask("stats")["records_total"] >= 2)
    after = site.scrape()
    assert after['slurm_pal_decisions_total{action="route"}'] == 1
    assert after['slurm_pal_decisions_total{action="pass"}'] == 0
    assert after["slurm_pal_decide_duration_seconds_count"] == 1
    assert after['slurm_pal_decide_duration_seconds_bucket{le="+Inf"}'] == 1
    assert after['slurm_pal_records_total{result="stored"}'] == 2
    assert after['slurm_pal_records_total{result="rejected"}'] == 0
    assert after["slurm_pal_replan_rounds_job_end_total"] == 1
    assert after["slurm_pal_replan_round_duration_seconds_count"] >= 1
    assert after["slurm_pal_job_end_wait_seconds_count"] == 1
    assert after["slurm_pal_slurm_write_failures_total"] == 0
    assert after["slurm_pal_spool_backlog"] == 0
    assert after["slurm_pal_fail_open_total"] == 0

    # the advisor down: job_submit.lua lets the job through and appends to its fail-open file;
    # the advisor counts it when it is back
    site.stop_advisor()
    through = site.sbatch("--gres=gpu:1", "--wrap=sleep 1")
    site.wait_until(f"job {through} ended", lambda: site.ended(through))
    site.start_advisor()
    back = site.scrape()
    assert back["slurm_pal_fail_open_total"] == 1
    assert back['slurm_pal_decisions_total{action="route"}'] == 0  # a new process
    assert "let 1 GPU job(s) through as written" in site.log()
    assert str(site.socket) in site.log()  # the reason: connect to the socket failed


def test_reload_keeps_the_reservation_of_a_held_job(site: Site) -> None:
    held = site.sbatch("--hold", "--gres=gpu:2", "--wrap=sleep 300")
    try:
        comment = parse_admin_comment(site.jobs()[held].admin_comment)
        assert comment is not None and comment["action"] == "route"
        site.wait_until("reservation bound", lambda: site.ask("health")["reservations"] == 1)
        site.config.write_text(site.config.read_text().replace("replan_s = 0", "replan_s = 30"))
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "slurm_pal.cli.main", "--config", str(site.config)),
                *("serve", "reload", "--json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**site.tb.env, "SLURM_PAL_CONFIG": ""},
        )
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout)
        assert answer["changed"] == ["advisor.replan_s 0.0 -> 30.0"]
        assert answer["reservations"] == 1 and answer["free"] == 14
        assert site.scrape()["slurm_pal_reloads_total"] == 1
    finally:
        site.tb.run(["scancel", str(held)], check=False)
