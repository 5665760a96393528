"""The systemd unit of `slurm-pal serve` and the hooks' TCP mode, as `site render` writes them."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.site.render import (
    HookSettings,
    RenderedGpu,
    ServiceSettings,
    SitePlan,
    render_files,
)

PLAN = SitePlan(
    campaign="c1",
    device_pattern="/dev/nvidia{index}",
    gpus=(RenderedGpu("n1", 0, 0, "v100-a", "u0", "v100", "/dev/nvidia0"),),
    skipped=(),
)


def _unit(service: ServiceSettings) -> configparser.ConfigParser:
    text = render_files(PLAN, service=service)["slurm-pal.service"]
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(text)
    return parser


def test_the_unit_runs_serve_as_slurm_user_restarts_on_failure_and_logs_to_the_journal() -> None:
    service = ServiceSettings(
        python="/opt/slurm-pal/venv/bin/python",
        config_path="/etc/slurm-pal/slurm-pal.toml",
        listen="10.0.0.1:6830",
    )
    unit = _unit(service)
    svc = unit["Service"]
    assert svc["ExecStart"] == (
        "/opt/slurm-pal/venv/bin/python -s -m slurm_pal.cli.main --config "
        "/etc/slurm-pal/slurm-pal.toml --db /var/lib/slurm-pal/slurm-pal.db serve "
        "--socket /run/slurm-pal/advisor.sock"
    )
    assert (svc["User"], svc["Group"], svc["Restart"]) == ("slurm", "slurm", "on-failure")
    assert (svc["StandardOutput"], svc["StandardError"]) == ("journal", "journal")
    assert svc["RuntimeDirectory"] == "slurm-pal" and svc["StateDirectoryMode"] == "0700"
    assert svc["CapabilityBoundingSet"] == ""  # port 6830 needs no capability
    assert svc["ReadWritePaths"] == "-/var/spool/slurm-pal"
    assert "munge.service" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    low = _unit(ServiceSettings(listen="10.0.0.1:683", socket="/var/run/x/advisor.sock"))
    assert low["Service"]["AmbientCapabilities"] == "CAP_NET_BIND_SERVICE"
    assert "RuntimeDirectory" not in low["Service"]  # the socket is not under /run/<name>/


def test_the_unit_takes_its_user_group_socket_and_port_from_the_config() -> None:
    config = SiteConfig()
    service = ServiceSettings.from_config(config, python="/usr/bin/python3")
    assert (service.user, service.group, service.listen) == ("slurm", "slurm", None)
    assert service.db_path == "/var/lib/slurm-pal/slurm-pal.db" and service.config_path is None
    assert "--config" not in _unit(service)["Service"]["ExecStart"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_rendered_unit(tmp_path: Path) -> None:
    # root/root: users that exist here, so verify checks the unit, not this machine's users
    service = ServiceSettings(python=sys.executable, user="root", group="root", listen=":::6830")
    path = tmp_path / "slurm-pal.service"
    path.write_text(render_files(PLAN, service=service)["slurm-pal.service"])
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    # lines about other units on this machine (its own unit files) are not ours
    ours = [ln for ln in proc.stderr.splitlines() if "slurm-pal.service" in ln]
    assert proc.returncode == 0 and ours == [], proc.stderr


def test_hooks_with_an_advisor_address_send_over_tcp_with_munge(tmp_path: Path) -> None:
    hooks = HookSettings(advisor="10.0.0.1:6830", munge_socket="/run/munge/munge.socket.2")
    files = render_files(PLAN, hooks=hooks)
    for name in ("prolog.sh", "epilog.sh"):
        text = files[name]
        assert (
            "--advisor 10.0.0.1:6830" in text and "--munge-socket /run/munge/munge.socket.2" in text
        )
        assert "--socket" not in text
        script = tmp_path / name
        script.write_text(text)
        assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    plain = render_files(PLAN)["epilog.sh"]
    assert "--socket /run/slurm-pal/advisor.sock" in plain and "--advisor" not in plain


def test_nodes_get_a_timer_that_flushes_their_spool_over_tcp(tmp_path: Path) -> None:
    hooks = HookSettings(
        python=sys.executable, advisor="10.0.0.1:6830", spool_dir="/var/spool/slurm-pal"
    )
    files = render_files(PLAN, hooks=hooks)
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(files["slurm-pal-flush.service"])
    assert parser["Service"]["ExecStart"] == (
        f"{sys.executable} -s -m slurm_pal.hooks flush --advisor 10.0.0.1:6830 --munge-socket "
        "/run/munge/munge.socket.2 --spool-dir /var/spool/slurm-pal --timeout-ms 900"
    )
    assert parser["Service"]["Type"] == "oneshot"
    timer = configparser.ConfigParser(strict=True, interpolation=None)
    timer.read_string(files["slurm-pal-flush.timer"])
    assert timer["Timer"]["OnUnitActiveSec"] == "1min"
    if shutil.which("systemd-analyze") is None:
        return
    for name in ("slurm-pal-flush.service", "slurm-pal-flush.timer"):
        (tmp_path / name).write_text(files[name])
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "slurm-pal-flush.timer"),
         str(tmp_path / "slurm-pal-flush.service")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    ours = [ln for ln in proc.stderr.splitlines() if "slurm-pal-flush" in ln]
    assert proc.returncode == 0 and ours == [], proc.stderr


def test_the_rendered_flush_command_runs(tmp_path: Path) -> None:
    """The ExecStart line is a command the hooks' CLI takes (nothing spooled: exit 0)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    hooks = HookSettings(python=sys.executable, advisor="127.0.0.1:9", spool_dir=str(spool))
    unit = render_files(PLAN, hooks=hooks)["slurm-pal-flush.service"]
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    proc = subprocess.run(
        line.split("=", 1)[1].split(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["left"] == 0, proc.stderr


def test_paths_the_sandboxed_unit_cannot_reach_are_named_with_what_to_pass() -> None:
    service = ServiceSettings(
        python="/home/alice/slurm-pal/.venv/bin/python",
        db_path="/tmp/try/slurm-pal.db",
        config_path="/root/site.toml",
    )
    problems = service.hidden_paths()
    assert len(problems) == 3
    python, store, config = problems
    assert "Python /home/alice/slurm-pal/.venv/bin/python" in python
    assert "ProtectHome=yes" in python and "--python /opt/slurm-pal/bin/python" in python
    assert "store /tmp/try/slurm-pal.db" in store and "PrivateTmp=yes" in store
    assert "--db /var/lib/slurm-pal/slurm-pal.db" in store
    assert "config /root/site.toml" in config and "--config /etc/slurm-pal" in config
    # What the unit can see raises nothing ("/tmpfs" is not under /tmp).
    reachable = ServiceSettings(
        python="/opt/slurm-pal/bin/python",
        db_path="/var/lib/slurm-pal/slurm-pal.db",
        config_path="/tmpfs/site.toml",
    )
    assert reachable.hidden_paths() == []
