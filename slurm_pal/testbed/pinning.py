"""CPU pinning for the multi-host testbed: the controller host's daemons on their own core(s).

Why: on the 2-core development machine slurmctld, the advisor and the compute hosts' Prolog
and Epilog hooks all share the same cores, so a storm of job ends on the "compute nodes" slows
slurmctld in a way a site, whose controller has its own machine, would not see. Pinning the
controller host to one core and the compute hosts to the other(s) keeps the hooks' CPU off the
controller's, the closest this one kernel gets to separate machines.

A process is pinned at exec (``taskset -c``), so every thread and child it starts later
(slurmctld's threads, the advisor's parsing worker and its ``squeue``, slurmd's slurmstepd and
hooks) inherits the same set.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence

__all__ = ["cpu_list", "parse_cpu_list", "pinned", "split_cpus"]


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """CPUs named as taskset and /proc name them ("0", "1-3", "0,2-3"), sorted, unique."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            raise ValueError(f"empty item in CPU list {text!r}")
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise ValueError(f"not a CPU number or range: {part!r} (in {text!r})") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {part!r} (in {text!r})")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def cpu_list(cpus: Iterable[int]) -> str:
    """The taskset form of a CPU set ("0,2-3")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def split_cpus(
    controller: Sequence[int], allowed: Iterable[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(controller CPUs, every other allowed CPU): the compute hosts get what the controller
    does not, so the two sets never overlap. Both must be non-empty."""
    allowed_set = set(allowed)
    ctl = tuple(sorted(set(controller)))
    if not ctl:
        raise ValueError("the controller needs at least one CPU")
    outside = sorted(set(ctl) - allowed_set)
    if outside:
        raise ValueError(
            f"CPU(s) {cpu_list(outside)} are not available to this process "
            f"(allowed: {cpu_list(allowed_set)})"
        )
    rest = tuple(sorted(allowed_set - set(ctl)))
    if not rest:
        raise ValueError(
            f"no CPU left for the compute hosts: the controller takes every allowed CPU "
            f"({cpu_list(allowed_set)})"
        )
    return ctl, rest


def pinned(cpus: Sequence[int], args: Sequence[str]) -> list[str]:
    """``args`` run on ``cpus`` (``taskset -c``); unchanged when ``cpus`` is empty."""
    if not cpus:
        return list(args)
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/bin:/bin"
    return [shutil.which("taskset", path=path) or "taskset", "-c", cpu_list(cpus), *args]
