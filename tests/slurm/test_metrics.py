"""The advisor's Prometheus endpoint and reload on a real Slurm 22.05: a real `slurm-pal serve`
with ``[metrics] port``, the rendered job_submit.lua, Prolog and Epilog, jobs through plain
sbatch, and HTTP GETs of /metrics: decisions by outcome, the decide histogram, Prolog/Epilog
records, the job-end re-planning round, a fail-open while the advisor is down (counted from the
plugin's fail-open file when it is back), and a reload (`serve reload`) that keeps the
reservation of a held job."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_pal import __version__
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm
from tests.helpers.slurm_lab import (
    FEATURES,
    AdvisorLab,
    free_port,
    fresh_testbed_dir,
    render_site,
    rendered_hooks,
    rendered_nodes,
    require_slurm,
)

pytestmark = pytest.mark.slurm


@dataclass(kw_only=True)
class Site(AdvisorLab):
    port: int  # the Prometheus endpoint's

    def log(self) -> str:
        return self.advisor_log()[-4000:]

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
    port = free_port()
    config = work / "site.toml"
    config.write_text(
        f'[advisor]\nsocket = "{sock}"\nrefresh_s = 1.0\nreplan_s = 0\n'
        f'reservation_ttl_s = 600\nlabels_file = "{work / "site" / "labels.json"}"\n'
        f'[hooks]\nspool_dir = "{root / "spool"}"\ntelemetry = false\n'
        f"[metrics]\nport = {port}\n"
    )
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    labels = render_site(db, csv, work / "site", config=config)
    tb = LocalSlurm(root, rendered_nodes(labels, FEATURES), **rendered_hooks(work / "site"))
    the_site = Site(
        tb=tb,
        root=root,
        db=db,
        config=config,
        socket=sock,
        log_path=root / "advisor.log",
        port=port,
    )
    with the_site.running():
        yield the_site


def test_a_scrape_shows_decisions_records_rounds_and_fail_opens(site: Site) -> None:
    before = site.scrape()
    assert before['slurm_pal_decisions_total{action="route"}'] == 0
    assert before["slurm_pal_decide_duration_seconds_count"] == 0
    assert (
        before[
            f'slurm_pal_advisor_info{{campaign="example",policy="packed-pm",problem="",version="{__version__}"}}'
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
