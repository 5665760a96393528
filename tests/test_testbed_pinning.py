"""The multi-host testbed's CPU pinning: CPU lists read and written as taskset takes them, the
controller's CPUs kept apart from the compute hosts', and the wrapped command line."""

from __future__ import annotations

import pytest

from slurm_pal.testbed.cluster import NodeSpec
from slurm_pal.testbed.multihost import MultiHostSlurm
from slurm_pal.testbed.pinning import cpu_list, parse_cpu_list, pinned, split_cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", (0,)), ("1-3", (1, 2, 3)), ("0,2-3", (0, 2, 3)), ("3,1,1", (1, 3)), (" 0, 1 ", (0, 1))],
)
def test_cpu_lists_read_as_taskset_writes_them(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "-1", "0,,1"])
def test_bad_cpu_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_cpu_list_compresses_runs() -> None:
    assert cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_compute_hosts_get_every_cpu_the_controller_does_not() -> None:
    assert split_cpus((0,), {0, 1}) == ((0,), (1,))
    assert split_cpus((1, 2), range(4)) == ((1, 2), (0, 3))


@pytest.mark.parametrize(
    ("controller", "allowed", "why"),
    [
        ((), {0, 1}, "at least one"),
        ((2,), {0, 1}, "not available"),
        ((0, 1), {0, 1}, "no CPU left"),
    ],
)
def test_split_refuses_what_cannot_be_kept_apart(controller, allowed, why: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=why):
        split_cpus(controller, allowed)


def test_pinned_wraps_only_when_cpus_are_given() -> None:
    assert pinned((), ["slurmctld", "-D"]) == ["slurmctld", "-D"]
    cmd = pinned((0, 1, 3), ["slurmctld", "-D"])
    assert cmd[0].endswith("taskset") and cmd[1:] == ["-c", "0-1,3", "slurmctld", "-D"]


def test_daemons_of_each_host_get_their_side(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tb = MultiHostSlurm(tmp_path, [NodeSpec("n01", ("a",))], controller_cpus=[0], compute_cpus=[1])
    monkeypatch.setattr(tb, "on_host", lambda host, args: [f"on:{host}", *args])
    assert tb.daemon_command("ctl", ["slurmctld"])[2:] == ["-c", "0", "slurmctld"]
    assert tb.daemon_command("n01", ["slurmd"])[2:] == ["-c", "1", "slurmd"]
    assert tb.daemon_command("n01", ["slurmd"])[0] == "on:n01"
    assert tb.controller_cpus == (0,)  # lists (as testbed.json holds them) become tuples
    unpinned = MultiHostSlurm(tmp_path, [NodeSpec("n01", ("a",))])
    monkeypatch.setattr(unpinned, "on_host", lambda host, args: [f"on:{host}", *args])
    assert unpinned.daemon_command("ctl", ["slurmctld"]) == ["on:ctl", "slurmctld"]
