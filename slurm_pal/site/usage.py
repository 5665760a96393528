"""GPU usage by GPU model from Slurm accounting, although every gres Type is a PM label.

Why: usage reports by GPU model (``gres/gpu:a100``) stop working once ``Type=`` carries a PM
label (``gres/gpu:a100-a0b1c0d0``, or ``a100-pm2`` with ``[site] max_labels``). Every label
starts with its model's name, and labels.json says which model each label's GPUs are, so the
per-label figures sacct gives roll up to the model again.

Input: ``sacct --allocations --parsable2 --format=JobID,ElapsedRaw,AllocTRES`` (any other
columns are ignored; ``Elapsed`` works too). Slurm only accounts typed GPUs listed in
``AccountingStorageTRES`` (``gres/gpu:LABEL``, which ``site render``'s slurm.conf.snippet
lists); jobs whose AllocTRES only has ``gres/gpu=N`` are counted as ``untyped``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_pal.errors import SlurmPalError

__all__ = ["JobUsage", "ModelUsage", "UsageError", "parse_elapsed", "parse_sacct", "rollup"]

UNTYPED = "(untyped)"
_TYPED = re.compile(r"^gres/gpu:([^=]+)=(\d+)$")
_COUNT = re.compile(r"^gres/gpu=(\d+)$")
_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")


class UsageError(SlurmPalError, ValueError):
    """The accounting input is not what the recipe produces; the message says where."""


@dataclass(frozen=True)
class JobUsage:
    """One job allocation: its GPUs per label and how long it held them."""

    job_id: str
    seconds: int
    gpus: Mapping[str, int]  # label (or UNTYPED) -> GPUs


@dataclass
class ModelUsage:
    """GPU-hours of one GPU model, and of each of its labels."""

    model: str
    jobs: int = 0
    gpu_hours: float = 0.0
    labels: dict[str, float] = field(default_factory=dict)  # label -> GPU-hours


def parse_elapsed(value: str) -> int:
    """Slurm's ``[DD-][HH:]MM:SS`` (or plain seconds, ``ElapsedRaw``) -> seconds."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    m = _ELAPSED.match(text)
    if not m:
        raise ValueError(f"not a Slurm elapsed time: {value!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_sacct(text: str, *, source: str = "sacct") -> list[JobUsage]:
    """GPU jobs of ``sacct -P`` output with its header line (steps, ``JOBID.x``, skipped)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"{source}: empty; run sacct with --parsable2 and its header line")
    header = [h.strip() for h in lines[0].split("|")]
    where = {name.lower(): i for i, name in enumerate(header)}
    if "alloctres" not in where or not ({"elapsedraw", "elapsed"} & set(where)):
        raise UsageError(
            f"{source} line 1: need the columns AllocTRES and ElapsedRaw (or Elapsed) in a "
            f"--parsable2 header, got {lines[0]!r}"
        )
    elapsed_col = where.get("elapsedraw", where.get("elapsed"))
    id_col = where.get("jobid")
    jobs: list[JobUsage] = []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("|")
        if len(cells) < len(header):
            raise UsageError(
                f"{source} line {number}: {len(cells)} columns, header has {len(header)}"
            )
        job_id = cells[id_col].strip() if id_col is not None else str(number)
        if "." in job_id:  # a step: its allocation line counts the GPUs already
            continue
        gpus: dict[str, int] = {}
        total = 0
        for item in cells[where["alloctres"]].split(","):
            item = item.strip()
            if m := _TYPED.match(item):
                gpus[m.group(1)] = gpus.get(m.group(1), 0) + int(m.group(2))
            elif m := _COUNT.match(item):
                total = int(m.group(1))
        typed = sum(gpus.values())
        if total > typed:
            gpus[UNTYPED] = total - typed
        if not gpus:
            continue
        try:
            seconds = parse_elapsed(cells[elapsed_col])  # type: ignore[index]
        except ValueError as exc:
            raise UsageError(f"{source} line {number}: {exc}") from None
        jobs.append(JobUsage(job_id, seconds, gpus))
    return jobs


def rollup(jobs: Iterable[JobUsage], label_models: Mapping[str, str]) -> list[ModelUsage]:
    """GPU-hours per GPU model, most used first. A label's model is what labels.json says, else
    its prefix before the first ``-`` (labels of older campaigns keep their model too)."""
    models: dict[str, ModelUsage] = {}
    for job in jobs:
        seen: set[str] = set()
        for label, count in job.gpus.items():
            if label == UNTYPED:
                model = UNTYPED
            else:
                model = label_models.get(label) or label.split("-", 1)[0]
            usage = models.setdefault(model, ModelUsage(model))
            hours = count * job.seconds / 3600.0
            usage.gpu_hours += hours
            usage.labels[label] = usage.labels.get(label, 0.0) + hours
            if model not in seen:
                usage.jobs += 1
                seen.add(model)
    return sorted(models.values(), key=lambda u: (-u.gpu_hours, u.model))
