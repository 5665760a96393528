"""Nsight Compute (``ncu --csv``) reader and per-application utilization features.

The real layouts and their pitfalls are in ``shared/notes/ncu-csv-format.md``; in short:

* the table sits inside a text stream: a UTF-8 BOM, CRLF, ``==PROF==``/``==WARNING==``/
  ``==ERROR==`` lines and the application's own prints may come before and after it;
* the "details" page is long (one row per launch x metric) with 12/15/20/21 columns,
  rule rows with empty metric fields, and ragged metric rows shorter than the header;
* the "raw" page is wide (one row per launch, one column per metric) with a units row;
* values are quoted, may carry thousands separators (``"292,928"``), may be ``n/a``, and
  units auto-scale (``ns``/``nsecond``/``us``, ``byte``/``Mbyte``): we convert every time to
  ns and every percentage stays in percent;
* many launches share a kernel name, so launches are keyed by (Process ID, ID), never by
  name (Minos keys by name and reports 2429 % SM for the 162-launch dropout sample).

Errors name the file and line (:class:`NcuParseError`), because the user's next step is to
open that file at that line.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_pal.core.features import UtilizationFeatures, weighted_mean_skipping_missing
from slurm_pal.errors import SlurmPalError

__all__ = [
    "DRAM_METRICS",
    "DURATION_METRIC",
    "SM_THROUGHPUT_METRIC",
    "SPEED_OF_LIGHT_DISPLAY_NAMES",
    "NcuKernel",
    "NcuMetricsMissingError",
    "NcuParseError",
    "NcuReport",
    "application_features",
    "fu_pipe_metric",
    "parse_ncu_csv_text",
    "parse_ncu_number",
    "read_ncu_csv",
]

#: Kernel duration; the weight of every launch.
DURATION_METRIC = "gpu__time_duration.sum"
#: DRAM throughput metrics, in order of preference (PAL's first, Minos's second). They are
#: different metrics, so one application uses exactly one of them for all its launches.
DRAM_METRICS: tuple[str, ...] = (
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
)
#: FU fallback when no pipe metric was collected (what Minos uses); it is an SM-wide
#: throughput (max over SM sub-units, memory pipes included), not a functional-unit figure.
SM_THROUGHPUT_METRIC = "sm__throughput.avg.pct_of_peak_sustained_elapsed"

#: Functional-unit pipe metrics: per-SM (``sm__``) or per-sub-partition (``smsp__``, PAL's
#: ``smsp__pipe_fma_cycles_active``) pipe activity or issued-instruction share, averaged over
#: units (``.avg``), in percent of peak. Families: fma, alu, fp64, fp16, tensor (fp16 is its
#: own pipe on Turing and newer; it is the FU that half-precision code keeps busy).
_FU_PIPE_RE = re.compile(
    r"^(?:sm|smsp)__(?:"
    r"pipe_(?P<pipe>fma|alu|fp64|fp16|tensor)[a-z0-9_]*?_cycles_active"
    r"|inst_executed_pipe_(?P<inst>fma|alu|fp64|fp16|tensor)[a-z0-9_]*"
    r")\.avg\.pct_of_peak_sustained_(?P<basis>active|elapsed)$"
)

_DETAILS_REQUIRED: tuple[str, ...] = (
    "ID",
    "Process ID",
    "Kernel Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
)
_RAW_REQUIRED = ("ID", "Process ID", "Kernel Name")
_SUMMARY_MARKERS = ("Invocations", "Minimum", "Maximum", "Average")
#: Section of the details page that holds the metrics requested with ``--metrics`` (raw names).
_COMMAND_LINE_SECTION = "Command line profiler metrics"
#: What ncu's default sections (``--section SpeedOfLight``, no ``--metrics``) call the metrics
#: the features need: display name -> raw metric. Only rows of a Speed-Of-Light section are
#: read this way, and a launch's raw metric wins over its display row when both are there.
#: "Compute (SM) Throughput" is the SM-wide throughput, not a functional-unit pipe: features
#: built on it say so (see :func:`application_features`).
SPEED_OF_LIGHT_DISPLAY_NAMES: dict[str, str] = {
    "Duration": "gpu__time_duration.sum",
    "DRAM Throughput": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "Compute (SM) Throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
}
#: Launch-identifying columns of the raw page (old and current); every other column is a
#: metric. NVTX columns (``--nvtx``) contain ':' and are identifying too.
_RAW_IDENTIFYING_COLUMNS = frozenset(
    {
        "ID",
        "Process ID",
        "Process Name",
        "Host Name",
        "Kernel Name",
        "Kernel Time",
        "Context",
        "Stream",
        "Block Size",
        "Grid Size",
        "Device",
        "CC",
    }
)
_RAW_METRIC_NAME_RE = re.compile(r"^[a-z0-9_]+__[A-Za-z0-9_.]+$")

_TIME_UNIT_TO_NS: dict[str, float] = {
    "ns": 1.0,
    "nsecond": 1.0,
    "nsec": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "usec": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "msec": 1e6,
    "s": 1e9,
    "second": 1e9,
    "sec": 1e9,
}
_SI_PREFIX: dict[str, float] = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_SCALED_COUNT_RE = re.compile(
    r"^(?P<prefix>[KMGTP]?)(?P<base>byte|cycle|inst|sector|request|warp|thread|block)$"
)
_BYTE_RATE_RE = re.compile(r"^(?P<prefix>[KMGTP]?)byte/(?:s|second)$")
_FREQUENCY_RE = re.compile(r"^(?P<prefix>[KMGTP]?)hz$", re.IGNORECASE)
_CYCLE_RATE_RE = re.compile(r"^cycle/(?P<time>n?s|[num]?second|usecond|msecond)$")

_PLAIN_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_GROUPED_NUMBER_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMERIC_LOOKING_RE = re.compile(r"^[+-]?[\d.,]+(?:[eE][+-]?\d+)?$")
_MISSING_VALUES = frozenset({"", "n/a", "na", "nan", "inf", "-inf", "+inf", "-", "--"})


class NcuParseError(SlurmPalError, ValueError):
    """A Nsight Compute CSV could not be used; says which file, which line and why."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.message}"

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working
        return (type(self), (self.path, self.line, self.message))


class NcuMetricsMissingError(NcuParseError):
    """The file parses, but lacks a metric the features need (names the valid choices)."""


@dataclass(frozen=True)
class NcuKernel:
    """One kernel launch. Numbers are in canonical units: ns, percent, byte, Hz, counts."""

    process_id: int
    launch_id: int
    kernel_name: str
    line: int
    metrics: Mapping[str, float]
    units: Mapping[str, str]
    unavailable: frozenset[str] = frozenset()
    text_metrics: Mapping[str, str] = field(default_factory=dict)
    from_display: frozenset[str] = frozenset()
    """Raw metric names whose value came from a section's display name (no raw row)."""

    @property
    def key(self) -> tuple[int, int]:
        """(Process ID, ID): unique within a report, unlike the kernel name."""
        return (self.process_id, self.launch_id)

    @property
    def duration_ns(self) -> float | None:
        return self.metrics.get(DURATION_METRIC)


@dataclass(frozen=True)
class NcuReport:
    """One parsed ncu CSV file."""

    path: str
    layout: str  # "details" or "raw"
    header_columns: int
    header_line: int
    kernels: tuple[NcuKernel, ...]
    messages: tuple[tuple[int, str], ...] = ()  # (line, "==PROF== ...") outside the table

    @property
    def errors(self) -> tuple[tuple[int, str], ...]:
        """``==ERROR==`` lines: the run failed, even if it left a table behind."""
        return tuple(m for m in self.messages if m[1].startswith("==ERROR=="))

    def metric_names(self) -> frozenset[str]:
        """Every raw metric name present (with a value or as ``n/a``) in any launch."""
        names: set[str] = set()
        for kernel in self.kernels:
            names.update(kernel.metrics)
            names.update(kernel.unavailable)
            names.update(kernel.text_metrics)
        return frozenset(names)


# --------------------------------------------------------------------------------------------
# Values and units


def parse_ncu_number(text: str) -> float | None:
    """Parse an ncu cell: ``"292,928"`` -> 292928.0, ``"n/a"`` -> None.

    Thousands separators must be proper 3-digit groups; anything else made only of digits,
    dots and commas (``"1.234,5"``, ``"12,5"``: a German-locale decimal comma) is rejected
    with ValueError, because guessing would silently be off by 1000x.
    Non-numeric text raises ValueError too; callers decide whether text is legitimate.
    """
    stripped = text.strip()
    if stripped.lower() in _MISSING_VALUES:
        return None
    if _PLAIN_NUMBER_RE.match(stripped):
        return float(stripped)
    if _GROUPED_NUMBER_RE.match(stripped):
        return float(stripped.replace(",", ""))
    if _NUMERIC_LOOKING_RE.match(stripped):
        raise ValueError(
            f"ambiguous number {text!r}: expected plain digits or 3-digit groups with ',' "
            "(a locale with decimal commas is not supported; re-export with ncu's default locale)"
        )
    raise ValueError(f"not a number: {text!r}")


def _expected_dimension(metric: str) -> str | None:
    if ".pct" in metric or metric.endswith("pct"):
        return "percent"
    if "time_duration" in metric:
        return "time"
    return None


def _canonical(metric: str, unit: str, value: float) -> tuple[float, str]:
    """Convert ``value`` in ``unit`` to the canonical unit; raise ValueError on a mismatch."""
    unit = unit.strip()
    expected = _expected_dimension(metric)
    if expected == "percent":
        if unit != "%":
            raise ValueError(
                f"metric {metric} must be in '%', got unit {unit!r} (mixed or unknown units)"
            )
        return value, "%"
    if expected == "time":
        if unit not in _TIME_UNIT_TO_NS:
            raise ValueError(
                f"metric {metric} must be a time, got unit {unit!r}; "
                f"known time units: {sorted(_TIME_UNIT_TO_NS)}"
            )
        return value * _TIME_UNIT_TO_NS[unit], "ns"
    if unit in _TIME_UNIT_TO_NS:
        return value * _TIME_UNIT_TO_NS[unit], "ns"
    if match := _SCALED_COUNT_RE.match(unit):
        return value * _SI_PREFIX[match["prefix"]], match["base"]
    if match := _BYTE_RATE_RE.match(unit):
        return value * _SI_PREFIX[match["prefix"]], "byte/s"
    if match := _FREQUENCY_RE.match(unit):
        return value * _SI_PREFIX[match["prefix"].upper()], "Hz"
    if match := _CYCLE_RATE_RE.match(unit):
        seconds = _TIME_UNIT_TO_NS[match["time"]] / 1e9
        return value / seconds, "Hz"
    return value, unit


def fu_pipe_metric(metric: str) -> tuple[str, str] | None:
    """(family, basis) if ``metric`` is a functional-unit pipe metric, else None.

    >>> fu_pipe_metric("smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active")
    ('fma', 'active')
    """
    match = _FU_PIPE_RE.match(metric)
    if match is None:
        return None
    return (match["pipe"] or match["inst"], match["basis"])


# --------------------------------------------------------------------------------------------
# Records: physical lines -> CSV records with line numbers


def _split_lines(text: str) -> list[str]:
    if text.startswith("\ufeff"):
        text = text[1:]
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _is_header_line(line: str) -> bool:
    stripped = line.strip().lstrip("\ufeff")
    return stripped.startswith('"ID",') or stripped.startswith("ID,")


def _parse_record(record: str) -> list[str]:
    return next(csv.reader([record], strict=True))


@dataclass
class _KernelBuilder:
    process_id: int
    launch_id: int
    kernel_name: str
    line: int
    metrics: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    unavailable: set[str] = field(default_factory=set)
    text_metrics: dict[str, str] = field(default_factory=dict)
    metric_lines: dict[str, int] = field(default_factory=dict)
    display: dict[str, tuple[float, str]] = field(default_factory=dict)
    from_display: set[str] = field(default_factory=set)

    def merge_display(self) -> None:
        """Fill the raw metrics that only a section's display row gave."""
        for metric, (value, unit) in self.display.items():
            if metric not in self.metrics and metric not in self.unavailable:
                self.metrics[metric] = value
                self.units[metric] = unit
                self.from_display.add(metric)

    def freeze(self) -> NcuKernel:
        return NcuKernel(
            process_id=self.process_id,
            launch_id=self.launch_id,
            kernel_name=self.kernel_name,
            line=self.line,
            metrics=dict(self.metrics),
            units=dict(self.units),
            unavailable=frozenset(self.unavailable),
            text_metrics=dict(self.text_metrics),
            from_display=frozenset(self.from_display),
        )


class _Parser:
    """One pass over the lines; state for the current header (tables can restart)."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.lines = _split_lines(text)
        self.kernels: dict[tuple[int, int], _KernelBuilder] = {}
        self.messages: list[tuple[int, str]] = []
        self.layout: str | None = None
        self.header: list[str] = []
        self.header_line = 0
        self.first_header: tuple[str, int, int] | None = None
        self.columns: dict[str, int] = {}
        self.raw_units: list[str] | None = None
        self.raw_units_pending = False
        self.last_key: tuple[int, int] | None = None

    def error(self, line: int | None, message: str) -> NcuParseError:
        return NcuParseError(self.path, line, message)

    # -- driving loop ------------------------------------------------------------------------

    def run(self) -> NcuReport:
        for line_no, fields in self._records():
            if fields and fields[0].strip().lstrip("\ufeff") == "ID":
                self._start_table(line_no, fields)
            elif self.layout == "details":
                self._details_row(line_no, fields)
            elif self.layout == "raw":
                self._raw_row(line_no, fields)
        return self._finish()

    def _records(self) -> Iterator[tuple[int, list[str]]]:
        """Yield (first line number, fields) for each CSV record of the table(s).

        Lines that are not part of a table (``==PROF==`` lines, application output) are
        collected as messages or skipped. A record may span lines (quoted newlines); a file
        that ends inside a quoted field is truncated.
        """
        pending: list[str] = []
        start = 0
        in_table = False
        for index, line in enumerate(self.lines):
            line_no = index + 1
            if pending:
                pending.append(line)
            else:
                stripped = line.strip()
                if not stripped:
                    continue
                if _is_header_line(line):
                    in_table = True
                elif not (in_table and stripped.startswith('"')):
                    if stripped.startswith("=="):
                        self.messages.append((line_no, stripped))
                    continue
                pending = [line]
                start = line_no
            record = "\n".join(pending)
            if record.count('"') % 2:
                continue  # inside a quoted field: the record goes on on the next line
            pending = []
            try:
                yield start, _parse_record(record.strip())
            except csv.Error as exc:
                raise self.error(start, f"malformed CSV record: {exc}") from exc
        if pending:
            raise self.error(
                start,
                f"the file ends inside a quoted field (truncated file?): {pending[0][:80]!r}",
            )

    # -- headers -----------------------------------------------------------------------------

    def _start_table(self, line_no: int, header: list[str]) -> None:
        header = [h.strip().lstrip("\ufeff") for h in header]
        columns = {name: i for i, name in enumerate(header)}
        if "Metric Value" not in columns and any(m in columns for m in _SUMMARY_MARKERS):
            raise self.error(
                line_no,
                "this is a '--print-summary' table (Invocations/Minimum/Maximum/Average), "
                "which has no per-launch values; export with '--page details' or '--page raw'",
            )
        if "Metric Name" in columns or "Metric Value" in columns:
            layout, required = "details", _DETAILS_REQUIRED
        else:
            layout, required = "raw", _RAW_REQUIRED
        missing = [name for name in required if name not in columns]
        if missing:
            raise self.error(
                line_no,
                f"{layout} header lacks column(s) {missing}; header has {header}",
            )
        if self.layout is not None and layout != self.layout:
            raise self.error(
                line_no,
                f"a {layout} table follows a {self.layout} table in one file; "
                "export one page per file",
            )
        self.layout = layout
        self.header = header
        self.header_line = line_no
        self.columns = columns
        self.raw_units = None
        self.raw_units_pending = layout == "raw"
        if self.first_header is None:
            self.first_header = (layout, len(header), line_no)

    # -- shared cell helpers -----------------------------------------------------------------

    def _cell(self, fields: list[str], column: str) -> str:
        index = self.columns[column]
        return fields[index] if index < len(fields) else ""

    def _launch(self, line_no: int, fields: list[str]) -> _KernelBuilder:
        try:
            launch_id = int(self._cell(fields, "ID"))
            process_id = int(self._cell(fields, "Process ID"))
        except ValueError:
            raise self.error(
                line_no,
                "'ID' and 'Process ID' must be integers, got "
                f"{self._cell(fields, 'ID')!r} and {self._cell(fields, 'Process ID')!r}",
            ) from None
        key = (process_id, launch_id)
        builder = self.kernels.get(key)
        if builder is None:
            builder = _KernelBuilder(
                process_id=process_id,
                launch_id=launch_id,
                kernel_name=self._cell(fields, "Kernel Name"),
                line=line_no,
            )
            self.kernels[key] = builder
        self.last_key = key
        return builder

    def _store(
        self, builder: _KernelBuilder, line_no: int, metric: str, unit: str, raw_value: str
    ) -> None:
        try:
            value = parse_ncu_number(raw_value)
        except ValueError as exc:
            if _NUMERIC_LOOKING_RE.match(raw_value.strip()) or _expected_dimension(metric):
                raise self.error(line_no, f"metric {metric}: {exc}") from None
            builder.text_metrics[metric] = raw_value
            return
        if value is None:
            builder.unavailable.add(metric)
            return
        try:
            canonical_value, canonical_unit = _canonical(metric, unit, value)
        except ValueError as exc:
            raise self.error(line_no, str(exc)) from None
        previous = builder.metrics.get(metric)
        if previous is not None and not math.isclose(previous, canonical_value, rel_tol=1e-9):
            raise self.error(
                line_no,
                f"launch (pid {builder.process_id}, ID {builder.launch_id}) has two values for "
                f"{metric}: {previous:g} (line {builder.metric_lines[metric]}) and "
                f"{canonical_value:g}",
            )
        builder.metrics[metric] = canonical_value
        builder.units[metric] = canonical_unit
        builder.metric_lines.setdefault(metric, line_no)

    def _store_display(
        self,
        builder: _KernelBuilder,
        line_no: int,
        display: str,
        metric: str,
        unit: str,
        raw_value: str,
    ) -> None:
        """A Speed-Of-Light display row, kept aside until the launch's raw rows are known."""
        try:
            value = parse_ncu_number(raw_value)
        except ValueError as exc:
            raise self.error(line_no, f"{display!r} ({metric}): {exc}") from None
        if value is None:
            return
        try:
            builder.display[metric] = _canonical(metric, unit, value)
        except ValueError as exc:
            raise self.error(line_no, f"{display!r}: {exc}") from None

    # -- details page ------------------------------------------------------------------------

    def _details_row(self, line_no: int, fields: list[str]) -> None:
        if len(fields) > len(self.header):
            raise self.error(
                line_no, f"row has {len(fields)} fields but the header has {len(self.header)}"
            )
        needed = self.columns["Metric Value"] + 1
        if len(fields) < needed:
            raise self.error(
                line_no,
                f"row has {len(fields)} fields, fewer than the {needed} needed to reach "
                "'Metric Value' (truncated file?)",
            )
        metric = self._cell(fields, "Metric Name").strip()
        builder = self._launch(line_no, fields)
        if not metric:
            return  # rule row
        section = (
            self._cell(fields, "Section Name").strip() if "Section Name" in self.columns else ""
        )
        if section != _COMMAND_LINE_SECTION and not _RAW_METRIC_NAME_RE.match(metric):
            raw = SPEED_OF_LIGHT_DISPLAY_NAMES.get(metric)
            if raw is not None and "speed of light" in section.lower():
                self._store_display(
                    builder,
                    line_no,
                    metric,
                    raw,
                    self._cell(fields, "Metric Unit"),
                    self._cell(fields, "Metric Value"),
                )
            return  # other display names ("L2 Cache Throughput", ...) are not used
        self._store(
            builder,
            line_no,
            metric,
            self._cell(fields, "Metric Unit"),
            self._cell(fields, "Metric Value"),
        )

    # -- raw page ----------------------------------------------------------------------------

    def _raw_row(self, line_no: int, fields: list[str]) -> None:
        if len(fields) != len(self.header):
            hint = " (truncated file?)" if len(fields) < len(self.header) else ""
            raise self.error(
                line_no,
                f"raw-page row has {len(fields)} fields but the header has "
                f"{len(self.header)}{hint}",
            )
        if self.raw_units_pending:
            self.raw_units_pending = False
            if fields[self.columns["ID"]].strip() != "":
                raise self.error(
                    line_no,
                    "raw-page table has no units row after its header; cannot tell ns from us",
                )
            self.raw_units = fields
            return
        assert self.raw_units is not None
        existing = len(self.kernels)
        builder = self._launch(line_no, fields)
        if len(self.kernels) == existing:
            raise self.error(
                line_no,
                f"launch (pid {builder.process_id}, ID {builder.launch_id}) appears twice "
                f"(first at line {builder.line})",
            )
        for index, name in enumerate(self.header):
            if name in _RAW_IDENTIFYING_COLUMNS or ":" in name:
                continue
            self._store(builder, line_no, name, self.raw_units[index], fields[index])

    # -- end ---------------------------------------------------------------------------------

    def _finish(self) -> NcuReport:
        if self.first_header is None:
            errors = [m for m in self.messages if m[1].startswith("==ERROR==")]
            if errors:
                line, text = errors[0]
                raise self.error(line, f"no Nsight Compute table in the file; ncu reported: {text}")
            # text.split("\n") gives one (empty) line for an empty file: count real lines.
            lines = sum(1 for line in self.lines if line.strip())
            if not lines:
                raise self.error(
                    None, "the file is empty: no Nsight Compute table (ncu --csv output) in it"
                )
            if any("\x00" in line or "\ufffd" in line for line in self.lines[:200]):
                raise self.error(
                    None,
                    "not a text file: a binary report (X.ncu-rep)? export its table with "
                    "'ncu --import X.ncu-rep --csv --page details > X.csv'",
                )
            raise self.error(
                None,
                f"no Nsight Compute table in the file ({lines} non-empty line"
                f"{'' if lines == 1 else 's'}, none starts "
                "with '\"ID\",'); was it written with '-o/--export' (then use "
                "'ncu --import X.ncu-rep --csv') or did the application launch no kernel?",
            )
        layout, n_columns, header_line = self.first_header
        if self.raw_units_pending:
            raise self.error(self.header_line, "raw-page header with no units row (truncated?)")
        if not self.kernels:
            raise self.error(header_line, "table header but no kernel rows (truncated file?)")
        for builder in self.kernels.values():
            builder.merge_display()
        kernels = [builder.freeze() for builder in self.kernels.values()]
        self._check_last_launch_complete(kernels)
        return NcuReport(
            path=self.path,
            layout=layout,
            header_columns=n_columns,
            header_line=header_line,
            kernels=tuple(kernels),
            messages=tuple(self.messages),
        )

    def _check_last_launch_complete(self, kernels: list[NcuKernel]) -> None:
        """A details file cut at a line boundary leaves its last launch with fewer metrics."""
        if self.layout != "details" or len(kernels) < 2 or self.last_key is None:
            return
        last = self.kernels[self.last_key]
        previous = next(
            (k for k in reversed(kernels) if k.key != self.last_key),
            None,
        )
        if previous is None:
            return

        def names(kernel: NcuKernel | _KernelBuilder) -> set[str]:
            return set(kernel.metrics) | set(kernel.unavailable) | set(kernel.text_metrics)

        have, expected = names(last), names(previous)
        if have < expected:
            missing = sorted(expected - have)
            raise self.error(
                max(last.metric_lines.values(), default=last.line),
                f"the last launch (pid {last.process_id}, ID {last.launch_id}) has "
                f"{len(have)} of the {len(expected)} metrics of the launch before it "
                f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}); "
                "the file looks truncated",
            )


def parse_ncu_csv_text(text: str, path: str = "<text>") -> NcuReport:
    """Parse the text of an ncu CSV (``path`` is only used in error messages)."""
    return _Parser(text, path).run()


def read_ncu_csv(path: str | os.PathLike[str]) -> NcuReport:
    """Read one ncu CSV file (details or raw page), tolerant of BOM, CRLF and preambles."""
    data = Path(path).read_bytes()
    text = data.decode("utf-8-sig", errors="replace")
    return parse_ncu_csv_text(text, os.fspath(path))


# --------------------------------------------------------------------------------------------
# Application features


def _missing_error(
    reports: Sequence[NcuReport], message: str, line: int | None = None
) -> NcuMetricsMissingError:
    first = reports[0]
    others = [r.path for r in reports[1:]]
    suffix = f" (also checked: {', '.join(others)})" if others else ""
    return NcuMetricsMissingError(
        first.path, first.header_line if line is None else line, message + suffix
    )


def _metric_value(kernel: NcuKernel, metric: str) -> float | None:
    return kernel.metrics.get(metric)


def application_features(
    reports: Sequence[NcuReport],
    *,
    dram_metric: str | None = None,
) -> UtilizationFeatures:
    """Kernel-time-weighted DRAM and peak-FU utilization of one application.

    ``reports`` are all the files of one application (e.g. PAL's separate DRAM and FU runs);
    launches are keyed by (file, Process ID, ID). For metric M:
    ``U = sum_i M_i * t_i / sum_i t_i`` over the launches that have M, with ``t_i`` the
    ``gpu__time_duration.sum`` in ns; launches without M are left out of both sums and the
    share of time left out is reported (``*_excluded_fraction``).

    * DRAM: ``dram_metric`` if given, else the first of :data:`DRAM_METRICS` present.
    * FU: per launch, the max over the FU pipe metrics present (see :func:`fu_pipe_metric`;
      ``pct_of_peak_sustained_active`` ones, PAL's basis, when any exist, else ``_elapsed``),
      then the weighted mean. Only when no pipe metric exists in any file does it fall back
      to :data:`SM_THROUGHPUT_METRIC`, and ``fu_source`` says so.
    """
    if not reports:
        raise ValueError("application_features needs at least one NcuReport")
    kernels: list[tuple[NcuReport, NcuKernel]] = [(r, k) for r in reports for k in r.kernels]

    weights: list[float] = []
    for report, kernel in kernels:
        duration = kernel.duration_ns
        if duration is None:
            raise NcuMetricsMissingError(
                report.path,
                kernel.line,
                f"launch (pid {kernel.process_id}, ID {kernel.launch_id}) "
                f"{kernel.kernel_name[:60]!r} has no {DURATION_METRIC} value; it is needed to "
                f"weight by kernel time (collect it with --metrics {DURATION_METRIC},...)",
            )
        weights.append(duration)
    if math.fsum(weights) <= 0:
        raise _missing_error(reports, f"all {DURATION_METRIC} values are zero")

    present = frozenset().union(*(r.metric_names() for r in reports))

    if dram_metric is None:
        dram_metric = next((m for m in DRAM_METRICS if m in present), None)
        if dram_metric is None:
            raise _missing_error(
                reports,
                f"no DRAM throughput metric; need one of {list(DRAM_METRICS)} "
                "(ncu --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,...)",
            )
    elif dram_metric not in present:
        raise _missing_error(
            reports,
            f"requested DRAM metric {dram_metric!r} is not in the file; "
            f"DRAM metrics present: {sorted(m for m in present if 'dram' in m)}",
        )
    try:
        dram = weighted_mean_skipping_missing(
            [_metric_value(k, dram_metric) for _, k in kernels], weights
        )
    except ValueError:
        raise _missing_error(reports, f"{dram_metric} is n/a or missing in every launch") from None

    fu_values, fu_source, missing_message = _fu_per_launch(reports, kernels, present)
    try:
        fu = weighted_mean_skipping_missing(fu_values, weights)
    except ValueError:
        raise _missing_error(reports, missing_message) from None

    dram_source = dram_metric
    if any(dram_metric in k.from_display for _, k in kernels):
        dram_source += " (from the Speed Of Light section's 'DRAM Throughput')"
    return UtilizationFeatures(
        dram_util=dram.mean,
        fu_util=fu.mean,
        source="ncu",
        dram_source=dram_source,
        fu_source=fu_source,
        measurements=len(kernels),
        weight_total=math.fsum(weights),
        weight_unit="ns",
        dram_excluded_fraction=dram.excluded_fraction,
        fu_excluded_fraction=fu.excluded_fraction,
    )


def _fu_per_launch(
    reports: Sequence[NcuReport],
    kernels: Sequence[tuple[NcuReport, NcuKernel]],
    present: frozenset[str],
) -> tuple[list[float | None], str, str]:
    """Each launch's FU utilization (None: not measured), where it comes from, and what to
    say when no launch has it; :func:`application_features` says which metrics count."""
    pipe_metrics: dict[str, tuple[str, str]] = {
        m: family_basis for m in present if (family_basis := fu_pipe_metric(m)) is not None
    }
    if pipe_metrics:
        bases = {basis for _, basis in pipe_metrics.values()}
        basis = "active" if "active" in bases else "elapsed"
        chosen = sorted(m for m, (_, b) in pipe_metrics.items() if b == basis)
        families = sorted({pipe_metrics[m][0] for m in chosen})
        fu_values: list[float | None] = []
        for _, kernel in kernels:
            values = [kernel.metrics[m] for m in chosen if m in kernel.metrics]
            fu_values.append(max(values) if values else None)
        fu_source = (
            f"pipe:{','.join(families)} (max per launch of {len(chosen)} "
            f".avg.pct_of_peak_sustained_{basis} metrics)"
        )
        missing_message = f"FU pipe metrics {chosen} are n/a or missing in every launch"
    elif SM_THROUGHPUT_METRIC in present:
        fu_values = [_metric_value(k, SM_THROUGHPUT_METRIC) for _, k in kernels]
        fu_source = f"{SM_THROUGHPUT_METRIC} (fallback: no pipe metric)"
        if any(SM_THROUGHPUT_METRIC in k.from_display for _, k in kernels):
            fu_source = (
                f"{SM_THROUGHPUT_METRIC} (fallback: no pipe metric; from the Speed Of Light "
                "section's 'Compute (SM) Throughput': SM throughput only, not a functional "
                "unit; collect the sm__pipe_*_cycles_active metrics for a real FU figure)"
            )
        missing_message = f"{SM_THROUGHPUT_METRIC} is n/a or missing in every launch"
    else:
        raise _missing_error(
            reports,
            "no functional-unit metric; need FU pipe metrics such as "
            "smsp__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active, "
            "sm__pipe_{fma,alu,fp64,fp16,tensor}_cycles_active.avg.pct_of_peak_sustained_*, "
            "sm__inst_executed_pipe_{fma,alu,fp64,fp16,tensor}.avg.pct_of_peak_sustained_*, "
            f"or at least {SM_THROUGHPUT_METRIC}",
        )
    return fu_values, fu_source, missing_message
