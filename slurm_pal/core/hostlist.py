"""Slurm hostlist expressions: ``node[01-04,07]`` <-> ``node01 node02 node03 node04 node07``.

Slurm writes node sets this way everywhere (topology.conf, ``scontrol``, ``squeue``,
``--nodelist``), so the pure core needs to read and write them without calling
``scontrol show hostnames``.

Rules implemented (those of Slurm's ``hostlist.c`` for ordinary, one-dimensional node names):

- a hostlist is a comma-separated list of items; commas inside brackets belong to the item;
- an item may hold several bracket groups (``gpu-[1-3]-[1-2]``): the expansion is their cartesian
  product, left group varying slowest;
- a range ``lo-hi`` is zero-padded to the width of ``lo`` (``[08-10]`` -> ``08 09 10``, while
  ``[8-10]`` -> ``8 9 10``).

:func:`compress` folds only the last run of digits of each name, which is what Slurm prints for
ordinary clusters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["compress", "expand"]

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets; reject unbalanced brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for pos, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' in hostlist {text!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:pos])
            start = pos + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_range_list(body: str, whole: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']`` (zero-padded to the width of each ``lo``)."""
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {part!r} in hostlist {whole!r}")
        if not sep:
            values.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise ValueError(f"descending range {part!r} in hostlist {whole!r}")
        width = len(lo)
        values.extend(f"{number:0{width}d}" for number in range(first, last + 1))
    return values


def _expand_item(item: str) -> list[str]:
    names = [""]
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [name + rest for name in names]
            break
        close_at = rest.index("]", open_at)
        prefix = rest[:open_at]
        choices = _expand_range_list(rest[open_at + 1 : close_at], item)
        names = [name + prefix + choice for name in names for choice in choices]
        rest = rest[close_at + 1 :]
    return names


def expand(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist expression into node names, in written order, without duplicates.

    Raises ValueError on a malformed expression (unbalanced brackets, ``[b-a]``, non-digits).
    """
    seen: dict[str, None] = {}
    for item in _split_top_level(hostlist):
        for name in _expand_item(item):
            seen.setdefault(name, None)
    return list(seen)


def _format_runs(numbers: list[str]) -> list[str]:
    """Consecutive numbers that keep the first one's zero-padding -> ``lo-hi`` runs."""
    ordered = sorted(set(numbers), key=lambda text: (int(text), len(text)))
    runs: list[str] = []
    run_start = run_end = ordered[0]
    for text in ordered[1:]:
        width = len(run_start)
        if int(text) == int(run_end) + 1 and f"{int(text):0{width}d}" == text:
            run_end = text
            continue
        runs.append(run_start if run_start == run_end else f"{run_start}-{run_end}")
        run_start = run_end = text
    runs.append(run_start if run_start == run_end else f"{run_start}-{run_end}")
    return runs


def compress(names: Iterable[str]) -> str:
    """Fold node names into a hostlist expression (``expand(compress(x))`` gives back set(x)).

    Names are grouped by what surrounds their last number; groups come out sorted by prefix.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    plain: set[str] = set()
    for name in names:
        if not name or any(char in name for char in "[],"):
            raise ValueError(f"cannot compress node name {name!r}")
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.add(name)
            continue
        prefix, number, suffix = match.groups()
        groups.setdefault((prefix, suffix), []).append(number)
    items = sorted(plain)
    for (prefix, suffix), numbers in sorted(groups.items()):
        runs = _format_runs(numbers)
        if len(runs) == 1 and "-" not in runs[0]:
            items.append(f"{prefix}{runs[0]}{suffix}")
        else:
            items.append(f"{prefix}[{','.join(runs)}]{suffix}")
    return ",".join(items)
