"""The testbed itself: argument checks (no Slurm needed) and the up/status/down life cycle
through the CLI on a second, small real cluster, including a restart after a crash."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.cli.main import app
from slurm_pal.testbed import LocalSlurm, NodeSpec, TestbedError


def test_node_spec_gres() -> None:
    assert NodeSpec("n1", ("a", "a", "b", "a")).gres() == "gpu:a:3,gpu:b:1"
    assert NodeSpec("n1", (None, None)).gres() == "gpu:2"
    assert NodeSpec("n1").gres() == ""


@pytest.mark.parametrize(
    ("nodes", "kwargs", "message"),
    [
        ([], {}, "at least one node"),
        ([NodeSpec("n1"), NodeSpec("n1")], {}, "unique"),
        ([NodeSpec("n1", ("a:b",))], {}, "cannot be a gres Type"),
        ([NodeSpec("n1", ("a",))], {"device_pattern": "/dev/tty0"}, "must contain"),
    ],
)
def test_bad_arguments(tmp_path: Path, nodes, kwargs, message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        LocalSlurm(tmp_path, nodes, **kwargs)


def test_attach_needs_a_testbed(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match="no testbed in"):
        LocalSlurm.attach(tmp_path)


def _our_processes(conf: Path) -> list[int]:
    """Live (non-zombie) processes whose command line or environment names this slurm.conf."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if str(conf).encode() in cmd or f"SLURM_CONF={conf}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.slurm
def test_missing_device_is_refused_before_anything_starts(testbed_root: Path) -> None:
    tb = LocalSlurm(
        testbed_root, [NodeSpec("m1", ("a",))], device_pattern="/dev/no-such-gpu{index}"
    )
    with pytest.raises(TestbedError, match="device-pattern"):
        tb.start()
    assert tb.running() == {"slurmd-m1": None, "slurmctld": None, "munged": None}


@pytest.mark.slurm
def test_cli_life_cycle_with_a_crash_in_between(testbed_root: Path) -> None:
    root = testbed_root
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(app, ["testbed", *args, "--dir", str(root)])

    up = cli("up", "--nodes", "2", "--gpus-per-node", "2", "--node-prefix", "m")
    assert up.exit_code == 0, up.output
    assert f"export SLURM_CONF={root}/etc/slurm.conf" in up.output
    status = cli("status")
    assert status.exit_code == 0 and "m01: idle" in " ".join(status.output.split())

    tb = LocalSlurm.attach(root)
    job = tb.submit("-N2", "--gres=gpu:2", "--wrap", "srun sleep 60")
    tb.wait_job(job, 30, state="RUNNING")
    # A crash: slurmctld dies hard, leaving its pid file, job state and running steps.
    os.kill(tb.running()["slurmctld"], signal.SIGKILL)
    again = cli("up", "--nodes", "2", "--gpus-per-node", "2", "--node-prefix", "m")
    assert again.exit_code == 0, again.output
    assert tb.run(["squeue", "-h"]).stdout.strip() == ""  # fresh state, old job gone

    down = cli("down")
    assert down.exit_code == 0 and "slurmctld" in down.output
    assert _our_processes(tb.conf) == []
    assert cli("status").exit_code == 1
    assert cli("down").output.startswith("stopped 0 process(es)")


@pytest.mark.slurm
def test_a_taken_port_is_retried_with_new_ports(
    testbed_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked free, then released for the daemons; if one is taken in between,
    slurmd logs 'Address already in use' and the start is retried once with new ports."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    picks: list[dict[str, int]] = []
    pick = LocalSlurm._pick_ports

    def pick_a_taken_port_first(self: LocalSlurm) -> None:
        pick(self)
        if not picks:
            self.node_ports["m1"] = taken
        picks.append(dict(self.node_ports))

    monkeypatch.setattr(LocalSlurm, "_pick_ports", pick_a_taken_port_first)
    try:
        tb = LocalSlurm(testbed_root, [NodeSpec("m1", (None,))])
        tb.start()
        assert [p["m1"] == taken for p in picks] == [True, False]
        assert tb.node_states() == {"m1": "idle"}
        tb.stop()
    finally:
        holder.close()
