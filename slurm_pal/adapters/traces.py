"""Job traces for the simulator: Sia-Philly CSV files and a site's ``sacct --parsable2`` history.

Sia-Philly (``job_id,num_gpus,submit_time,duration,model``): PAL's artifact treats ``duration``
as an iteration count and multiplies it by a per-model iteration time; the model picks the job
class. Both tables are parameters, with PAL's as defaults (``slurm_pal.core.workload``).

sacct: ``sacct --allocations --parsable2 --format=JobID,Submit,Start,End,AllocTRES,NNodes,
JobName,User`` (``ReqTRES``, ``AllocGRES`` or ``ReqGRES`` also work for the GPU count). A job's
work is its observed run time ``End - Start``: what it took on the GPUs it got, the best
estimate of its median-GPU run time a history can give; a job that ran on several nodes
(``NNodes`` > 1) already paid the site's locality penalty, so its time is divided by
``spanned_penalty`` (the simulator charges it again when it spans nodes). Job steps
(``123.batch``) repeat their job and are skipped; jobs without GPUs and jobs that never
started, have not ended, or ended before they started are left out and counted by reason
(:class:`Trace` ``left_out``) so the caller can say how much of the history was replayed;
submit times are made relative to the first submission. ``Timelimit`` (when the history has
it) becomes the job's time limit, ``UNLIMITED`` and ``Partition_Limit`` an unlimited one
(``inf``): what Slurm's backfill plans with, and what the advisor expects of a job.

Errors name the file and the line.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_pal.core.workload import (
    PAL_DEFAULT_CLASS,
    PAL_ITERATION_TIME,
    PAL_MODEL_CLASS,
    SimJob,
    pal_job_class,
)
from slurm_pal.errors import FileFormatError

__all__ = [
    "Trace",
    "TraceFormatError",
    "detect_trace_format",
    "load_trace",
    "read_sacct",
    "read_sacct_trace",
    "read_sia_trace",
    "read_trace",
]

SIA_COLUMNS = ("job_id", "num_gpus", "submit_time", "duration", "model")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class TraceFormatError(FileFormatError):
    """A trace that cannot be read; says which file and line."""


@dataclass(frozen=True)
class Trace:
    """The jobs read from a trace and the rows left out, by reason (``{"still running": 3}``)."""

    jobs: list[SimJob]
    left_out: dict[str, int] = field(default_factory=dict)

    def left_out_text(self) -> str | None:
        """``"left out 3 of 7 jobs: 2 still running, 1 never started"``, or None."""
        dropped = sum(self.left_out.values())
        if not dropped:
            return None
        reasons = ", ".join(f"{n} {why}" for why, n in self.left_out.items())
        return f"left out {dropped} of {dropped + len(self.jobs)} jobs: {reasons}"


def _read_text(path: Path | str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory, not a trace file") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            path, f"not a text trace (byte {exc.start} is not UTF-8); is it binary?"
        ) from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from exc


def detect_trace_format(path: Path | str) -> str:
    """``"sacct"`` when the header is ``|``-separated, else ``"sia"``."""
    head = _read_text(path).lstrip().split("\n", 1)[0]
    return "sacct" if "|" in head else "sia"


def read_sia_trace(
    path: Path | str,
    *,
    iteration_time: Mapping[str, float] = PAL_ITERATION_TIME,
    model_class: Mapping[str, str] = PAL_MODEL_CLASS,
    default_class: str = PAL_DEFAULT_CLASS,
    default_iteration_time: float | None = None,
    track: tuple[int, int] | None = None,
) -> list[SimJob]:
    """Read a Sia-Philly trace. ``work = duration x iteration_time[model]`` (model names are
    matched case-insensitively); a model missing from ``iteration_time`` needs
    ``default_iteration_time`` or the read fails. ``track = (first, last)`` job ids to track
    (default: all)."""
    text = _read_text(path)
    reader = csv.DictReader(io.StringIO(text))
    header = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in SIA_COLUMNS if c not in header]
    if missing:
        raise TraceFormatError(
            path, f"not a Sia-Philly trace: missing column(s) {', '.join(missing)}", line=1
        )
    times = {model.lower(): float(value) for model, value in iteration_time.items()}
    bad = {m: t for m, t in times.items() if not (math.isfinite(t) and t > 0)}
    if bad:
        raise ValueError(f"iteration times must be > 0 seconds, got {bad}")
    jobs: list[SimJob] = []
    for line, row in enumerate(reader, start=2):
        row = {str(k).strip(): (v or "").strip() for k, v in row.items()}
        model = row["model"]
        per_iteration = times.get(model.lower(), default_iteration_time)
        if per_iteration is None:
            raise TraceFormatError(
                path,
                f"no iteration time for model {model!r} (known: {', '.join(sorted(times))}; "
                "give one: sim run --iter-time MODEL=SECONDS)",
                line,
            )
        try:
            job_number = int(row["job_id"])
            gpus = int(float(row["num_gpus"]))
            submit = float(row["submit_time"])
            iterations = float(row["duration"])
        except ValueError as exc:
            raise TraceFormatError(path, f"bad number: {exc}", line) from None
        if not (math.isfinite(iterations) and iterations > 0):
            raise TraceFormatError(
                path, f"job {job_number}: duration must be > 0 iterations, got {iterations:g}", line
            )
        tracked = track is None or track[0] <= job_number <= track[1]
        known = model.lower() in {name.lower() for name in model_class}
        try:
            jobs.append(
                SimJob(
                    job_id=str(job_number),
                    submit_time=submit,
                    gpus=gpus,
                    work=iterations * per_iteration,
                    job_class=pal_job_class(model, model_class, default_class),
                    model=model,
                    tracked=tracked,
                    known=known,
                )
            )
        except ValueError as exc:
            raise TraceFormatError(path, str(exc), line) from None
    if not jobs:
        raise TraceFormatError(path, "no jobs after the header")
    return jobs


def _sacct_time(value: str) -> float | None:
    """Seconds since the epoch of a sacct timestamp, None for Unknown/None/empty."""
    if value in ("", "Unknown", "None", "N/A"):
        return None
    return datetime.fromisoformat(value).timestamp()


_LIMIT = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def sacct_time_limit(value: str) -> float | None:
    """Seconds of a sacct ``Timelimit`` (``2-00:00:00``, ``12:00:00``, ``30:00``, minutes as a
    bare number); ``inf`` for ``UNLIMITED``/``INFINITE``/``Partition_Limit`` (not known here,
    so planned as unlimited); None when empty. ValueError on anything else."""
    text = value.strip()
    if not text:
        return None
    if text.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT"):
        return math.inf
    if text.isdigit():
        return int(text) * 60.0 if int(text) > 0 else math.inf
    match = _LIMIT.match(text)
    if match is None:
        raise ValueError(f"bad Timelimit {value!r} (want [D-]HH:MM:SS, MM:SS or UNLIMITED)")
    days, hours, minutes, seconds = match.groups()
    if days is not None and hours is None:  # D-HH:MM
        hours, minutes, seconds = minutes, seconds, "0"
    total = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes)) * 60 + int(seconds)
    return float(total) if total > 0 else math.inf


def sacct_gpus(tres: str, gres: str = "") -> int:
    """GPU count from a TRES string (``gres/gpu=4``, ``gres/gpu:v100=4``) or, failing that, a
    GRES string (``gpu:4``, ``gpu:v100:4(IDX:0-3)``); 0 when neither names GPUs. Typed and
    untyped TRES entries count the same GPUs, so the untyped one wins when both are present."""
    untyped = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    if untyped:
        return int(untyped.group(1))
    typed = _GPU_TRES.findall(tres)
    if typed:
        return sum(int(n) for n in typed)
    return sum(int(n) for n in _GPU_GRES.findall(gres))


def read_sacct(
    path: Path | str,
    *,
    default_class: str = PAL_DEFAULT_CLASS,
    class_of: Callable[[str, str], str | None] | Mapping[str, str] | None = None,
    spanned_penalty: float = 1.0,
) -> list[SimJob]:
    """Read ``sacct --parsable2`` output (header line, ``|``-separated) into jobs.

    ``class_of(job_name, user)`` (or a ``{job name: class}`` map) names each job's class; jobs it
    does not know get ``default_class``, exactly like unknown jobs in production.
    """
    return read_sacct_trace(
        path, default_class=default_class, class_of=class_of, spanned_penalty=spanned_penalty
    ).jobs


def read_sacct_trace(
    path: Path | str,
    *,
    default_class: str = PAL_DEFAULT_CLASS,
    class_of: Callable[[str, str], str | None] | Mapping[str, str] | None = None,
    spanned_penalty: float = 1.0,
) -> Trace:
    """:func:`read_sacct` plus the jobs it left out, counted by reason."""
    text = _read_text(path)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TraceFormatError(path, "empty sacct output")
    header = [c.strip() for c in lines[0].split("|")]
    column = {name: i for i, name in enumerate(header)}
    needed = ("JobID", "Submit", "Start", "End")
    missing = [c for c in needed if c not in column]
    if missing or not ({"AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES"} & set(column)):
        raise TraceFormatError(
            path,
            "not sacct --parsable2 output with a header: need JobID, Submit, Start, End and one "
            f"of AllocTRES/ReqTRES/AllocGRES/ReqGRES; found {', '.join(header)}",
            line=1,
        )
    lookup: Callable[[str, str], str | None]
    if class_of is None:

        def lookup(name: str, user: str) -> str | None:
            return None
    elif isinstance(class_of, Mapping):
        names = dict(class_of)

        def lookup(name: str, user: str) -> str | None:
            return names.get(name)
    else:
        lookup = class_of

    def field(values: list[str], name: str) -> str:
        index = column.get(name)
        return values[index].strip() if index is not None and index < len(values) else ""

    if not spanned_penalty >= 1.0:
        raise ValueError(f"spanned_penalty must be >= 1.0, got {spanned_penalty}")
    raw: list[tuple[str, float, int, float, str, str, float | None]] = []
    left_out: Counter[str] = Counter()
    for line_number, line in enumerate(lines[1:], start=2):
        values = line.split("|")
        job_id = field(values, "JobID")
        if not job_id or "." in job_id:
            continue  # job steps (123.batch, 123.0) repeat their job's allocation
        tres = field(values, "AllocTRES") or field(values, "ReqTRES")
        gres = field(values, "AllocGRES") or field(values, "ReqGRES")
        gpus = sacct_gpus(tres, gres)
        if gpus < 1:
            left_out["with no GPUs in their TRES/GRES (CPU-only, or not allocated yet)"] += 1
            continue
        try:
            submit = _sacct_time(field(values, "Submit"))
            start = _sacct_time(field(values, "Start"))
            end = _sacct_time(field(values, "End"))
        except ValueError as exc:
            raise TraceFormatError(path, f"bad timestamp: {exc}", line_number) from None
        # Nothing to replay: say why, so a history that lost most of its rows is noticed.
        if submit is None:
            left_out["without a submit time"] += 1
            continue
        if start is None:
            left_out["never started (pending or cancelled)"] += 1
            continue
        if end is None:
            left_out["still running (no end time)"] += 1
            continue
        if end <= start:
            left_out["ended before (or when) they started"] += 1
            continue
        name, user = field(values, "JobName"), field(values, "User")
        try:
            nodes = int(field(values, "NNodes") or 1)
        except ValueError:
            nodes = 1
        work = (end - start) / (spanned_penalty if nodes > 1 else 1.0)
        try:
            limit = sacct_time_limit(field(values, "Timelimit"))
        except ValueError as exc:
            raise TraceFormatError(path, str(exc), line_number) from None
        raw.append((job_id, submit, gpus, work, name, user, limit))
    if not raw:
        reasons = ", ".join(f"{n} {why}" for why, n in left_out.items())
        raise TraceFormatError(
            path, "no finished GPU jobs in the sacct output" + (f" ({reasons})" if reasons else "")
        )
    first = min(submit for _, submit, *_ in raw)
    jobs = [
        SimJob(
            job_id=job_id,
            submit_time=submit - first,
            gpus=gpus,
            work=work,
            job_class=lookup(name, user) or default_class,
            model=name,
            user=user,
            name=name,
            known=lookup(name, user) is not None,
            time_limit=limit,
        )
        for job_id, submit, gpus, work, name, user, limit in raw
    ]
    jobs.sort(key=lambda job: (job.submit_time, job.job_id))
    return Trace(jobs, dict(left_out.most_common()))


def read_trace(path: Path | str, fmt: str = "auto", **options: object) -> list[SimJob]:
    """Read a trace, detecting Sia-Philly CSV vs sacct parsable2 from the header when
    ``fmt == "auto"``. ``options`` go to the reader."""
    return load_trace(path, fmt, **options).jobs


def load_trace(path: Path | str, fmt: str = "auto", **options: object) -> Trace:
    """:func:`read_trace` plus the rows it left out (sacct histories; Sia rows never are)."""
    if fmt == "auto":
        fmt = detect_trace_format(path)
    if fmt == "sia":
        return Trace(read_sia_trace(path, **options))  # type: ignore[arg-type]
    if fmt == "sacct":
        return read_sacct_trace(path, **options)  # type: ignore[arg-type]
    raise ValueError(f"unknown trace format {fmt!r}; valid: auto, sia, sacct")
