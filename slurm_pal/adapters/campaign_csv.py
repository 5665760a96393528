"""Read per-GPU benchmark results (campaign measurements) from CSV, detecting the format.

Two formats are understood, and both become the same canonical table
(:data:`MEASUREMENT_COLUMNS`), one row per benchmark run on one GPU:

``slurm-pal``
    The project's own campaign format (what ``slurm-pal campaign`` jobs write):
    ``uuid, duration_s`` required; ``node, gpu_index, gpu_model, job_class, benchmark,
    sm_clock_mhz, temperature_c, power_w, started_at`` optional.
``longhorn``
    The aggregated per-run files of the PAL artifact (TACC Longhorn V100): ``uuid`` and
    ``perf`` (a duration, higher = slower) plus per-file extras (``cabinet``, ``node``,
    ``device``, ``freq``, ``temp``, ``pwr``, ``ts``, ``exp``). ``uuid`` is an NVIDIA
    ``GPU-...`` UUID in some files and a ``cabinet-node-device`` location in others.

Errors name the file, the line and the column, and nothing is returned half-read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from slurm_pal.errors import FileFormatError

MEASUREMENT_COLUMNS = (
    "job_class",
    "uuid",
    "node",
    "gpu_index",
    "gpu_model",
    "benchmark",
    "duration",
    "sm_clock_mhz",
    "temperature_c",
    "power_w",
    "started_at",
    "source_line",
)
NUMERIC_COLUMNS = ("duration", "sm_clock_mhz", "temperature_c", "power_w", "started_at")

FORMATS = {
    "slurm-pal": "columns uuid, duration_s (optional: node, gpu_index, gpu_model, job_class, "
    "benchmark, sm_clock_mhz, temperature_c, power_w, started_at)",
    "longhorn": "PAL artifact aggregated files: columns uuid, perf (optional: cabinet, node, "
    "device, freq, temp, pwr, ts, exp)",
}


class CampaignFormatError(FileFormatError):
    """A campaign file that cannot be read; says which file, line and column."""


@dataclass(frozen=True)
class CampaignFile:
    """One parsed file: its canonical rows and what identifies it."""

    path: str
    sha256: str
    fmt: str
    rows: pd.DataFrame


def read_campaign_csv(
    path: Path | str, *, job_class: str | None = None, gpu_model: str | None = None
) -> CampaignFile:
    """Parse one campaign CSV into canonical measurement rows.

    ``job_class`` labels every row (required unless the file has a ``job_class`` column; when
    both are given they must agree). ``gpu_model`` fills rows whose file does not name the model.
    """
    path = Path(path)
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise CampaignFormatError(path, f"cannot read: {exc.strerror or exc}") from exc
    if not raw_bytes.strip():
        raise CampaignFormatError(path, "file is empty (expected a CSV header and rows)")
    try:
        table = pd.read_csv(
            path, dtype=str, keep_default_na=False, encoding="utf-8-sig", skipinitialspace=True
        )
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise CampaignFormatError(path, f"not a readable CSV: {exc}") from exc
    except pd.errors.EmptyDataError as exc:
        raise CampaignFormatError(path, "file has no CSV header") from exc
    table.columns = [str(c).strip() for c in table.columns]
    if table.empty:
        raise CampaignFormatError(path, "no data rows after the header")
    fmt = detect_format(table.columns, path)
    rows = _LOADERS[fmt](table, path)
    rows["source_line"] = np.arange(len(table)) + 2  # line 1 is the header
    rows = _apply_class(rows, job_class, path)
    if gpu_model is not None:
        rows["gpu_model"] = rows["gpu_model"].where(rows["gpu_model"] != "", gpu_model)
    rows["gpu_model"] = rows["gpu_model"].replace("", "gpu").str.lower()
    _check_durations(rows, path)
    return CampaignFile(
        path=str(path),
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        fmt=fmt,
        rows=rows[list(MEASUREMENT_COLUMNS)].reset_index(drop=True),
    )


def detect_format(columns: pd.Index | list[str], path: Path | str = "<csv>") -> str:
    """Name the format of a header, or raise listing what each known format needs."""
    cols = set(columns)
    if "duration_s" in cols:
        if "uuid" not in cols:
            raise CampaignFormatError(path, "slurm-pal campaign format needs a 'uuid' column")
        return "slurm-pal"
    if {"uuid", "perf"} <= cols:
        return "longhorn"
    known = "; ".join(f"{name}: {needs}" for name, needs in FORMATS.items())
    raise CampaignFormatError(
        path,
        "no duration column found (expected 'duration_s' or 'perf'). Known formats: "
        f"{known}. Found columns: {', '.join(sorted(cols))}",
    )


# canonical column -> (column in the file, kind); kinds: text, int, number, duration
_NATIVE_COLUMNS = {
    "node": ("node", "text"),
    "gpu_index": ("gpu_index", "int"),
    "gpu_model": ("gpu_model", "text"),
    "job_class": ("job_class", "text"),
    "benchmark": ("benchmark", "text"),
    "duration": ("duration_s", "duration"),
    "sm_clock_mhz": ("sm_clock_mhz", "number"),
    "temperature_c": ("temperature_c", "number"),
    "power_w": ("power_w", "number"),
    "started_at": ("started_at", "number"),
}
_LONGHORN_COLUMNS = {
    "gpu_model": ("model", "text"),
    "job_class": ("job_class", "text"),  # absent: the class comes from --class
    "benchmark": ("exp", "text"),
    "duration": ("perf", "duration"),
    "sm_clock_mhz": ("freq", "number"),
    "temperature_c": ("temp", "number"),
    "power_w": ("pwr", "number"),
    "started_at": ("ts", "number"),
}


def _map_columns(table: pd.DataFrame, path: Path, mapping: dict) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    out["uuid"] = table["uuid"].str.strip()
    for name, (column, kind) in mapping.items():
        if kind == "text":
            out[name] = _text(table, column)
        elif kind == "int":
            out[name] = _integers(table, column, path)
        else:
            out[name] = _numbers(table, column, path, required=kind == "duration")
    return out


def _load_native(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    return _map_columns(table, path, _NATIVE_COLUMNS)


def _load_longhorn(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    out = _map_columns(table, path, _LONGHORN_COLUMNS)
    cabinet = _text(table, "cabinet")
    node_num = _integers(table, "node", path)
    # Only 'device' is a physical index; sgemm's 'dev_id' is a CUDA ordinal inside the job
    # (always 0), so it says nothing about which GPU of the node ran.
    device = _integers(table, "device", path)
    # cabinet/node of -1 (sgemm) mean "location unknown".
    known = (cabinet != "") & (cabinet != "-1") & node_num.notna() & (node_num >= 0)
    out["node"] = np.where(known, cabinet + "-" + node_num.astype("string").fillna(""), "")
    out["gpu_index"] = device.where(known)
    return out


_LOADERS = {"slurm-pal": _load_native, "longhorn": _load_longhorn}


def _first(mask: pd.Series) -> int:
    """Position of the first True row (the caller turns it into a file line)."""
    return int(np.flatnonzero(mask.to_numpy())[0])


def _text(table: pd.DataFrame, column: str) -> pd.Series:
    if column not in table.columns:
        return pd.Series("", index=table.index, dtype=object)
    return table[column].astype(str).str.strip()


def _numbers(table: pd.DataFrame, column: str, path: Path, required: bool = False) -> pd.Series:
    if column not in table.columns:
        return pd.Series(np.nan, index=table.index, dtype=float)
    text = table[column].astype(str).str.strip()
    values = pd.to_numeric(text, errors="coerce")
    bad = values.isna() & ((text != "") | required)
    if bad.any():
        first = _first(bad)
        shown = text.iloc[first] or "(empty)"
        raise CampaignFormatError(
            path, f"column '{column}' has {shown!r}, expected a number", line=first + 2
        )
    return values.astype(float)


def _integers(table: pd.DataFrame, column: str, path: Path) -> pd.Series:
    values = _numbers(table, column, path)
    fractional = values.notna() & (values != values.round())
    if fractional.any():
        first = _first(fractional)
        raise CampaignFormatError(
            path, f"column '{column}' must hold whole numbers", line=first + 2
        )
    return values.astype("Int64")


def _apply_class(rows: pd.DataFrame, job_class: str | None, path: Path) -> pd.DataFrame:
    in_file = rows["job_class"] != ""
    if job_class is None:
        if not in_file.all():
            first = _first(~in_file)
            raise CampaignFormatError(
                path,
                "no job class for this row: pass --class or add a 'job_class' column",
                line=first + 2,
            )
        return rows
    clash = in_file & (rows["job_class"] != job_class)
    if clash.any():
        first = _first(clash)
        raise CampaignFormatError(
            path,
            f"row says class {rows['job_class'].iloc[first]!r} but --class is {job_class!r}",
            line=first + 2,
        )
    rows["job_class"] = job_class
    return rows


def _check_durations(rows: pd.DataFrame, path: Path) -> None:
    bad = ~(rows["duration"] > 0) | ~np.isfinite(rows["duration"])
    if bad.any():
        first = _first(bad)
        raise CampaignFormatError(
            path,
            f"duration must be a positive number of seconds, got {rows['duration'].iloc[first]}",
            line=int(rows["source_line"].iloc[first]),
        )
    empty_uuid = rows["uuid"] == ""
    if empty_uuid.any():
        first = _first(empty_uuid)
        raise CampaignFormatError(path, "empty 'uuid'", line=int(rows["source_line"].iloc[first]))
