"""Parsers for what Slurm's command-line tools print (pure: text in, values out).

Formats handled (seen on a real 22.05.8, samples in ``tests/fixtures/slurm/``, and 24.11.5):

* GRES strings: ``gpu:v100-a0b0:2,gpu:v100-a1b0:1`` (configured), ``gpu:tesla:2(S:0-1)``,
  ``gpu:v100-a0b0:1(IDX:0),gpu:v100-a1b0:0(IDX:N/A)`` (used, with the global device indices),
  ``gpu:2(IDX:0,2)`` (untyped; a comma inside the parentheses), ``(null)`` / ``N/A`` (none);
* TRES GPU requests: ``gres:gpu:v100-a0b0:1,gres:gpu:v100-a1b0:1`` (``tres_per_node`` /
  ``tres_per_job``; the ``gres:`` prefix is what 22.05 stores, 24.11 stores ``gres/``);
* ``scontrol show ... -o`` records: ``Key=value`` pairs whose values may contain blanks.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_KEY = re.compile(r"(?<!\S)([A-Za-z][\w:/.\-]*)=")
_ANNOTATION = re.compile(r"\(([^()]*)\)")
_NONE = frozenset({"", "(null)", "n/a", "none"})


@dataclass(frozen=True)
class Gres:
    """One GRES entry: ``name[:type]:count`` plus the device indices when Slurm lists them."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] = ()

    def __str__(self) -> str:
        head = f"{self.name}:{self.type}" if self.type else self.name
        return f"{head}:{self.count}"


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record -> dict (the first of repeated keys wins).

    Values may contain blanks (``OS=Linux 6.1.0 #1 SMP``) and ``=`` after a comma
    (``CfgTRES=cpu=8,mem=2000M``): a key starts only after whitespace.
    """
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt is not None else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses: ``a(IDX:0,2),b`` -> ``['a(IDX:0,2)', 'b']``."""
    if "(" not in text:  # most GRES strings: no character loop (10,000 jobs per Slurm read)
        return [p.strip() for p in text.split(sep) if p.strip()]
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_indices(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3); ``N/A`` or empty -> ()."""
    if text.strip().lower() in _NONE:
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError as exc:
            raise ValueError(f"bad GRES index list {text!r}") from exc
        out.extend(range(first, last + 1))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def parse_gres(text: str | None) -> tuple[Gres, ...]:
    """A GRES string (configured, used or allocated) -> entries; see the module docstring.
    Cached: a read of 10,000 jobs holds a handful of distinct requests (the result is
    immutable)."""
    if text is None or text.strip().lower() in _NONE:
        return ()
    entries: list[Gres] = []
    for item in split_top_level(text):
        indices: tuple[int, ...] = ()
        for note in _ANNOTATION.findall(item):
            key, _, value = note.partition(":")
            if key == "IDX":
                indices = parse_indices(value)
        body = _ANNOTATION.sub("", item).strip()
        body = body.removeprefix("gres:").removeprefix("gres/")
        fields = body.split(":")
        count = 1
        if len(fields) > 1 and fields[-1].isdigit():
            count = int(fields.pop())
        if len(fields) > 2 or not fields[0]:
            raise ValueError(f"bad GRES entry {item!r} in {text!r}")
        gtype = fields[1] if len(fields) == 2 and fields[1].lower() not in _NONE else None
        entries.append(Gres(fields[0], gtype, count, indices))
    return tuple(entries)


def gpu_counts(entries: tuple[Gres, ...]) -> dict[str | None, int]:
    """GPU type -> count (None for untyped GPUs), summing repeated types."""
    out: dict[str | None, int] = {}
    for g in entries:
        if g.name == "gpu":
            out[g.type] = out.get(g.type, 0) + g.count
    return out
