"""DCGM profiling fields from ``dcgmi dmon`` text or dcgm-exporter's Prometheus text.

DCGM's profiling (``DCGM_FI_PROF_*``) fields reach the V100/A100 generation, where NVML GPM
does not. We read them from text rather than through DCGM's Python bindings, which are not
on PyPI. The fields used (ids from ``dcgm_fields.h``, ``dcgmi dmon`` column names):

====  ===============================  ======  ============================================
id    field                            dmon    role
====  ===============================  ======  ============================================
1005  DCGM_FI_PROF_DRAM_ACTIVE         DRAMA   DRAM utilization
1004  DCGM_FI_PROF_PIPE_TENSOR_ACTIVE  TENSO   FU pipe (any tensor)
1006  DCGM_FI_PROF_PIPE_FP64_ACTIVE    FP64A   FU pipe
1007  DCGM_FI_PROF_PIPE_FP32_ACTIVE    FP32A   FU pipe
1008  DCGM_FI_PROF_PIPE_FP16_ACTIVE    FP16A   FU pipe (non-tensor half precision)
1016  DCGM_FI_PROF_PIPE_INT_ACTIVE     INTAC   FU pipe (used when present, like NVML's INT)
1002  DCGM_FI_PROF_SM_ACTIVE           SMACT   FU fallback only when no pipe field exists
====  ===============================  ======  ============================================

DCGM reports these as ratios 0..1; we multiply by 100 so they match ncu's and NVML's
percentages. A value above 1 is an error (someone already converted it), not silently
divided. DCGM's "blank" sentinels (>= 2**47) and ``N/A`` mean "no value".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_pal.core.features import (
    UtilizationFeatures,
    busy_time_mean,
    weighted_mean_skipping_missing,
)
from slurm_pal.errors import SlurmPalError

__all__ = [
    "DCGM_FIELDS",
    "DRAM_FIELD",
    "FU_FALLBACK_FIELD",
    "FU_PIPE_FIELDS",
    "DcgmField",
    "DcgmMissingFieldError",
    "DcgmParseError",
    "DcgmSample",
    "dcgm_features",
    "dcgm_features_by_entity",
    "parse_dmon",
    "parse_prometheus",
]


@dataclass(frozen=True)
class DcgmField:
    field_id: int
    name: str  # without the DCGM_FI_PROF_ prefix
    dmon: str

    @property
    def full_name(self) -> str:
        return f"DCGM_FI_PROF_{self.name}"


DCGM_FIELDS: dict[int, DcgmField] = {
    f.field_id: f
    for f in (
        DcgmField(1001, "GR_ENGINE_ACTIVE", "GRACT"),
        DcgmField(1002, "SM_ACTIVE", "SMACT"),
        DcgmField(1003, "SM_OCCUPANCY", "SMOCC"),
        DcgmField(1004, "PIPE_TENSOR_ACTIVE", "TENSO"),
        DcgmField(1005, "DRAM_ACTIVE", "DRAMA"),
        DcgmField(1006, "PIPE_FP64_ACTIVE", "FP64A"),
        DcgmField(1007, "PIPE_FP32_ACTIVE", "FP32A"),
        DcgmField(1008, "PIPE_FP16_ACTIVE", "FP16A"),
        DcgmField(1013, "PIPE_TENSOR_IMMA_ACTIVE", "TIMMA"),
        DcgmField(1014, "PIPE_TENSOR_HMMA_ACTIVE", "THMMA"),
        DcgmField(1015, "PIPE_TENSOR_DFMA_ACTIVE", "TDFMA"),
        DcgmField(1016, "PIPE_INT_ACTIVE", "INTAC"),
    )
}
DRAM_FIELD = 1005
BUSY_FIELD = 1001
"""GR_ENGINE_ACTIVE: the share of each sample the GPU was busy; weights the others."""
FU_PIPE_FIELDS: tuple[int, ...] = (1004, 1006, 1007, 1008, 1016)
FU_FALLBACK_FIELD = 1002

_BY_DMON = {f.dmon: f.field_id for f in DCGM_FIELDS.values()}
_BY_PROMETHEUS = {f.full_name: f.field_id for f in DCGM_FIELDS.values()}
_DCGM_BLANK_THRESHOLD = 2.0**47  # DCGM_FP64_BLANK; blank/not-found/not-supported are above
_RATIO_TOLERANCE = 1e-6
_ENTITY_NAMES = ("GPU", "GPU-I", "GPU-CI", "Switch", "Link", "CPU", "Core", "CX")


class DcgmParseError(SlurmPalError, ValueError):
    """DCGM text could not be used; names the source, the line and why."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source = source
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.message}"

    def __reduce__(self):
        return (type(self), (self.source, self.line, self.message))


class DcgmMissingFieldError(DcgmParseError):
    """The text parses but lacks a field the features need (names the valid choices)."""


@dataclass(frozen=True)
class DcgmSample:
    """One reading of one entity: field id -> percent (0-100). ``N/A`` fields are absent."""

    entity: str  # "GPU 0", "GPU-I 1" (a MIG instance), ...
    values: Mapping[int, float]
    line: int
    uuid: str | None = None
    hostname: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_whole_gpu(self) -> bool:
        return self.entity.startswith("GPU ") and " GI " not in self.entity


def _ratio_to_percent(raw: float, what: str, source: str, line: int) -> float | None:
    if not math.isfinite(raw) or raw >= _DCGM_BLANK_THRESHOLD:
        return None
    if raw < -_RATIO_TOLERANCE or raw > 1.0 + _RATIO_TOLERANCE:
        raise DcgmParseError(
            source,
            line,
            f"{what} = {raw!r} is not a ratio within 0..1 (DCGM profiling fields are ratios; "
            "was it already converted to percent?)",
        )
    return min(max(raw, 0.0), 1.0) * 100.0


# --------------------------------------------------------------------------------------------
# dcgmi dmon


def _header_columns(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t not in ("Entity", "EntityId", "Id", "ID")]


def parse_dmon(text: str, source: str = "<dcgmi dmon>") -> list[DcgmSample]:
    """Parse ``dcgmi dmon -e 1004,1005,...`` output: one sample per entity row, in order.

    Accepts the header spellings seen in real output (``#Entity  TENSO  DRAMA``,
    ``# Entity  GRACT ...`` followed by an ``ID``/``Id`` line, ``# EntityId ...``), repeated
    headers, and ``N/A`` cells. Columns that are not profiling ratio fields (``GPUTL``,
    ``POWER``, ...) are ignored. Anything else is an error that names the line.
    """
    columns: list[str] | None = None
    samples: list[DcgmSample] = []
    for line_no, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if tokens and tokens[0] in ("Entity", "EntityId"):
                columns = _header_columns(tokens)
            continue  # "# ID" and comment lines
        tokens = line.split()
        if tokens in (["ID"], ["Id"]):
            continue
        if tokens[0] not in _ENTITY_NAMES:
            raise DcgmParseError(source, line_no, f"unrecognised line {line[:80]!r}")
        if columns is None:
            raise DcgmParseError(source, line_no, "data row before any '#Entity' header line")
        if len(tokens) < 2 or not tokens[1].isdigit():
            raise DcgmParseError(source, line_no, f"entity without an id: {line[:80]!r}")
        cells = tokens[2:]
        if len(cells) != len(columns):
            raise DcgmParseError(
                source,
                line_no,
                f"row has {len(cells)} values but the header names {len(columns)} columns "
                f"{columns} (truncated?)",
            )
        values: dict[int, float] = {}
        for column, cell in zip(columns, cells, strict=True):
            field_id = _BY_DMON.get(column)
            if field_id is None or cell.upper() == "N/A":
                continue
            try:
                raw = float(cell)
            except ValueError:
                raise DcgmParseError(
                    source, line_no, f"{column} value {cell!r} is not a number"
                ) from None
            percent = _ratio_to_percent(raw, column, source, line_no)
            if percent is not None:
                values[field_id] = percent
        samples.append(DcgmSample(entity=f"{tokens[0]} {tokens[1]}", values=values, line=line_no))
    if columns is None:
        raise DcgmParseError(source, None, "no '#Entity ...' header line: not dcgmi dmon output")
    return samples


# --------------------------------------------------------------------------------------------
# Prometheus text (dcgm-exporter)

_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|})')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _parse_labels(text: str, start: int, source: str, line: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    position = start
    if text[position:].lstrip().startswith("}"):
        return labels, text.index("}", position) + 1
    while True:
        match = _LABEL_RE.match(text, position)
        if match is None:
            raise DcgmParseError(source, line, f"malformed labels in {text[:100]!r}")
        value = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], match.group(2))
        labels[match.group(1)] = value
        position = match.end()
        if match.group(3) == "}":
            return labels, position


def _prometheus_entity(labels: Mapping[str, str]) -> str:
    gpu = labels.get("gpu", labels.get("GPU", "?"))
    instance = labels.get("GPU_I_ID")
    return f"GPU {gpu} GI {instance}" if instance not in (None, "") else f"GPU {gpu}"


def parse_prometheus(text: str, source: str = "<dcgm-exporter>") -> list[DcgmSample]:
    """Parse dcgm-exporter's ``/metrics`` text (Prometheus exposition format).

    Samples of one entity (``gpu`` label, plus ``GPU_I_ID`` for MIG, plus ``Hostname``) are
    merged into one :class:`DcgmSample` per scrape; when a field repeats for an entity, a
    new sample starts, so concatenated scrapes become a time series. Metrics other than the
    profiling fields are ignored.
    """
    open_samples: dict[tuple[str, str | None], tuple[int, dict[int, float], dict[str, str]]] = {}
    finished: list[DcgmSample] = []

    def close(key: tuple[str, str | None]) -> None:
        first_line, values, labels = open_samples.pop(key)
        finished.append(
            DcgmSample(
                entity=key[0],
                values=values,
                line=first_line,
                uuid=labels.get("UUID") or labels.get("uuid"),
                hostname=key[1],
                labels=labels,
            )
        )

    saw_profiling_metric = False
    for line_no, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        name_match = _METRIC_NAME_RE.match(line)
        if name_match is None:
            raise DcgmParseError(source, line_no, f"not a Prometheus sample: {line[:80]!r}")
        name = name_match.group(0)
        position = name_match.end()
        labels: dict[str, str] = {}
        if line.startswith("{", position):
            labels, position = _parse_labels(line, position + 1, source, line_no)
        rest = line[position:].split()
        if not rest or len(rest) > 2:
            raise DcgmParseError(source, line_no, f"expected 'value [timestamp]' in {line[:80]!r}")
        field_id = _BY_PROMETHEUS.get(name)
        if field_id is None:
            continue
        saw_profiling_metric = True
        try:
            raw = float(rest[0])
        except ValueError:
            raise DcgmParseError(
                source, line_no, f"{name} value {rest[0]!r} is not a number"
            ) from None
        key = (_prometheus_entity(labels), labels.get("Hostname"))
        if key in open_samples and field_id in open_samples[key][1]:
            close(key)  # the same field again: the next scrape of this entity
        if key not in open_samples:
            open_samples[key] = (line_no, {}, dict(labels))
        percent = _ratio_to_percent(raw, name, source, line_no)
        if percent is not None:
            open_samples[key][1][field_id] = percent
    for key in list(open_samples):
        close(key)
    if not saw_profiling_metric:
        raise DcgmMissingFieldError(
            source,
            None,
            "no DCGM_FI_PROF_* metric in the text; enable the profiling fields "
            f"{[DCGM_FIELDS[i].full_name for i in (DRAM_FIELD, *FU_PIPE_FIELDS)]} "
            "in dcgm-exporter's counters file",
        )
    finished.sort(key=lambda s: s.line)
    return finished


# --------------------------------------------------------------------------------------------
# Features


def _describe_field(field_id: int) -> str:
    info = DCGM_FIELDS[field_id]
    return f"{info.full_name} ({field_id}, dmon {info.dmon})"


def _select(
    samples: Sequence[DcgmSample], entities: Iterable[str] | None, source: str
) -> list[DcgmSample]:
    if entities is None:
        chosen = [s for s in samples if s.is_whole_gpu]
        wanted = "whole GPUs ('GPU n')"
    else:
        names = set(entities)
        chosen = [s for s in samples if s.entity in names or (s.uuid and s.uuid in names)]
        wanted = f"entities {sorted(names)}"
    if not chosen:
        available = sorted({s.entity for s in samples})
        raise DcgmMissingFieldError(source, None, f"no samples of {wanted}; present: {available}")
    return chosen


def dcgm_features(
    samples: Sequence[DcgmSample],
    *,
    entities: Iterable[str] | None = None,
    source: str = "<dcgm>",
) -> UtilizationFeatures:
    """Mean DRAM_ACTIVE and mean per-sample max over the FU pipe fields, in percent.

    With GR_ENGINE_ACTIVE (1001) collected, the means are over the GPU's busy time, like
    ncu's kernel time and the NVML sampler (values divided by the sample's engine activity and
    weighted by it; idle samples drop out). Otherwise every sample weighs the same (dmon rows
    and exporter scrapes come at a fixed period).
    ``entities`` picks entities by name ("GPU 0", "GPU-I 1") or UUID; by default all whole
    GPUs are pooled and MIG-instance rows are left out (they would count the same work
    twice). SM_ACTIVE stands in for the FU figure only when no pipe field was collected,
    and ``fu_source`` then says "fallback".
    """
    chosen = _select(samples, entities, source)
    present = {field_id for s in chosen for field_id in s.values}
    if DRAM_FIELD not in present:
        raise DcgmMissingFieldError(
            source,
            chosen[0].line,
            f"no {_describe_field(DRAM_FIELD)} value; collect it, "
            "e.g. 'dcgmi dmon -e 1004,1005,1006,1007,1008'",
        )
    pipes = [f for f in FU_PIPE_FIELDS if f in present]
    if pipes:
        fu_fields = pipes
        fu_source = "dcgm max(" + ",".join(DCGM_FIELDS[f].name for f in pipes) + ")"
    elif FU_FALLBACK_FIELD in present:
        fu_fields = [FU_FALLBACK_FIELD]
        fu_source = "dcgm SM_ACTIVE (fallback: no pipe field)"
    else:
        raise DcgmMissingFieldError(
            source,
            chosen[0].line,
            f"no functional-unit field; need any of {[_describe_field(f) for f in FU_PIPE_FIELDS]}",
        )
    dram_values = [s.values.get(DRAM_FIELD) for s in chosen]
    fu_values: list[float | None] = []
    for sample in chosen:
        values = [sample.values[f] for f in fu_fields if f in sample.values]
        fu_values.append(max(values) if values else None)
    weights = [1.0] * len(chosen)
    if BUSY_FIELD in present:
        busy = [s.values.get(BUSY_FIELD) for s in chosen]
        try:
            dram_b = busy_time_mean(dram_values, busy, weights)
            fu_b = busy_time_mean(fu_values, busy, weights)
        except ValueError:
            pass  # idle throughout: the plain mean below
        else:
            return UtilizationFeatures.over_busy_time(
                dram_b,
                fu_b,
                source="dcgm",
                dram_source=f"dcgm {DCGM_FIELDS[DRAM_FIELD].name} over busy time "
                "(GR_ENGINE_ACTIVE)",
                fu_source=f"{fu_source} over busy time",
                measurements=len(chosen),
                weight_unit="samples",
            )
    dram = weighted_mean_skipping_missing(dram_values, weights)
    fu = weighted_mean_skipping_missing(fu_values, weights)
    return UtilizationFeatures(
        dram_util=dram.mean,
        fu_util=fu.mean,
        source="dcgm",
        dram_source=f"dcgm {DCGM_FIELDS[DRAM_FIELD].name}",
        fu_source=fu_source,
        measurements=len(chosen),
        weight_total=float(len(chosen)),
        weight_unit="samples",
        dram_excluded_fraction=dram.excluded_fraction,
        fu_excluded_fraction=fu.excluded_fraction,
    )


def dcgm_features_by_entity(
    samples: Sequence[DcgmSample], *, source: str = "<dcgm>"
) -> dict[str, UtilizationFeatures]:
    """Features per entity (per GPU, per MIG instance), keyed by entity name."""
    result: dict[str, UtilizationFeatures] = {}
    for entity in dict.fromkeys(s.entity for s in samples):
        result[entity] = dcgm_features(samples, entities=[entity], source=source)
    return result
