"""Profiling campaigns through Slurm: checks on the run records and campaign diffs (pure, no I/O).

A campaign plan names the GPUs to measure (node + Slurm GPU index), the job classes and how
many times each class's benchmark runs per GPU. Every run leaves one record (see
:class:`RunRecord`; the in-task runner writes them as JSON). This module answers, from those
records alone:

* :func:`check_campaign` -- which planned GPUs have no successful run for a class (missing),
  which runs failed and why, and which GPUs' repeats disagree beyond a tolerance. A GPU that
  throttles intermittently is a *finding* (a hardware ticket), not noise for the median to
  hide, so disagreements are reported by GPU with their clock range.
  Runs that saw thermal or hardware clock slowdowns (NVML clock-event reasons recorded by
  the runner over the measured window) are a cooling or power fault of that GPU, not its
  PM-score: they are reported as *slowdowns*. Power capping (``sw_power_cap``) is not: it is
  the variability a campaign measures. A run whose record has no clock-event readings (no
  NVML on the node, or a runner from before they were recorded) is *unknown*, never clean.
* :func:`task_progress` -- done / failed / running / pending per task, for ``campaign submit``.
* :func:`diff_campaigns` -- what changes between two campaigns' bins, outliers and labels, and
  so which nodes' gres.conf lines change (a switch of the active campaign needs a Slurm restart
  there); with :func:`summarize_clock_events`, which GPUs hit slowdowns in either campaign.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import pandas as pd

from slurm_pal.core import hostlist
from slurm_pal.errors import SlurmPalError

RECORD_SCHEMA = 1
STATUS_OK = "ok"
STATUS_FAILED = "failed"
ASSIGNED = "assignment"
"""``uuid_source`` of a GPU named by its location (``node/gpuN``) because NVML could not."""
DEFAULT_TOLERANCE = 0.05
"""Repeats of one GPU and class may differ by 5 % (max/min) before they are a finding."""

CSV_COLUMNS = (
    "uuid",
    "node",
    "gpu_index",
    "gpu_model",
    "job_class",
    "benchmark",
    "duration_s",
    "sm_clock_mhz",
    "temperature_c",
    "power_w",
    "started_at",
)
"""The project's own campaign CSV format (``adapters/campaign_csv.py``, format ``slurm-pal``)."""

COOLING_EVENTS: tuple[str, ...] = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
"""Clock-event reasons (the runner's names for NVML's bits) that mean a cooling or power
fault: the GPU ran slower than its power management would have it."""

GpuKey = tuple[str, int]
ClockEvents = tuple[tuple[str, float], ...]
"""(reason, share of the measured window's NVML readings that showed it), sorted by reason."""


class RecordError(SlurmPalError, ValueError):
    """A run record that does not follow the record format; says which field is wrong."""


@dataclass(frozen=True)
class PlannedGpu:
    """One GPU a campaign measures: where Slurm sees it (node, gres index)."""

    node: str
    gpu_index: int
    uuid: str | None = None  # known from an inventory; else NVML tells the task
    slurm_index: int | None = None  # Slurm's number for it (labels.json), where known

    @property
    def key(self) -> GpuKey:
        return (self.node, self.gpu_index)


def gpus_from_hostlist(nodes: str, gpus_per_node: int) -> list[PlannedGpu]:
    """The planned GPUs of ``--nodes HOSTLIST --gpus-per-node N`` (indices 0..N-1 per node).

    The seam for the Slurm state reader: anything that yields :class:`PlannedGpu` works.
    """
    if gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    names = hostlist.expand(nodes)
    if not names:
        raise ValueError(f"no nodes in hostlist {nodes!r}")
    return [PlannedGpu(node, i) for node in names for i in range(gpus_per_node)]


@dataclass(frozen=True)
class RunRecord:
    """One benchmark run on one GPU, as the in-task runner writes it (one JSON file per run).

    ``uuid_source`` says where the UUID came from: ``nvml`` (read on the node), ``benchmark``
    (the benchmark printed ``PAL_GPU_UUID=``) or ``assignment`` (NVML failed; the plan's id or
    a ``node/gpuN`` location id stands in, which the variability pipeline merges by location).
    """

    campaign: str
    status: str
    node: str
    gpu_index: int
    job_class: str
    repeat: int
    uuid: str
    uuid_source: str = "nvml"
    benchmark: str = ""
    command: str = ""
    duration_s: float | None = None
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    stderr_tail: str = ""
    gpu_name: str = ""
    slurm_job_id: str = ""
    notes: tuple[str, ...] = ()
    clock_events: ClockEvents | None = None
    """(reason, share of the window's NVML readings that showed it), e.g. sw_power_cap; None
    when the record has no readings (no NVML, or a runner from before they were recorded)."""
    telemetry_window: str = ""
    """'measured' (from PAL_MEASURE_START) or what else the telemetry covers."""

    @property
    def key(self) -> GpuKey:
        return (self.node, self.gpu_index)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def cooling_events(self) -> tuple[str, ...]:
        """The thermal/hardware slowdown reasons this run saw (see :data:`COOLING_EVENTS`)."""
        return _cooling(self.clock_events)

    def clock_event_row(self) -> RunClockEvents:
        """What the store keeps of this run's clock events (``campaign collect`` ingests it)."""
        return RunClockEvents(
            self.node, self.gpu_index, self.job_class, self.repeat, self.uuid, self.clock_events
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RunRecord:
        """Validate one decoded record; :class:`RecordError` names the bad field."""
        if not isinstance(data, Mapping):
            raise RecordError("a record must be a JSON object")
        if data.get("schema") != RECORD_SCHEMA:
            raise RecordError(f"unknown record schema {data.get('schema')!r} (want 1)")
        for name in ("campaign", "node", "job_class", "uuid"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise RecordError(f"'{name}' must be a non-empty string")
        status = data.get("status")
        if status not in (STATUS_OK, STATUS_FAILED):
            raise RecordError(f"'status' must be 'ok' or 'failed', got {status!r}")
        for name in ("gpu_index", "repeat"):
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RecordError(f"'{name}' must be a whole number >= 0, got {value!r}")
        numbers = {}
        for name in (
            "duration_s",
            "sm_clock_mhz",
            "temperature_c",
            "power_w",
            "started_at",
            "finished_at",
        ):
            value = data.get(name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise RecordError(f"'{name}' must be a number or null, got {value!r}")
            numbers[name] = None if value is None else float(value)
        duration = numbers["duration_s"]
        if status == STATUS_OK and (duration is None or duration <= 0):
            raise RecordError(f"an ok record needs 'duration_s' > 0, got {duration!r}")
        exit_code = data.get("exit_code")
        notes = data.get("notes") or ()
        events = data.get("clock_events")
        if events is not None and (
            not isinstance(events, Mapping)
            or not all(
                isinstance(k, str)
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and 0 <= v <= 1
                for k, v in events.items()
            )
        ):
            raise RecordError(
                f"'clock_events' must map reason names to shares within 0..1, got {events!r:.80}"
            )
        readings = data.get("clock_event_samples")
        if readings is not None and (
            not isinstance(readings, int) or isinstance(readings, bool) or readings < 0
        ):
            raise RecordError(
                f"'clock_event_samples' must be a whole number >= 0, got {readings!r:.80}"
            )
        clock_events: ClockEvents | None = None
        # The runner writes an empty map with 0 readings when NVML gave no reasons: unknown.
        if isinstance(events, Mapping) and (readings != 0 or events):
            clock_events = tuple(sorted((str(k), float(v)) for k, v in events.items()))
        return cls(
            campaign=str(data["campaign"]),
            status=str(status),
            node=str(data["node"]),
            gpu_index=int(data["gpu_index"]),  # type: ignore[call-overload]
            job_class=str(data["job_class"]),
            repeat=int(data["repeat"]),  # type: ignore[call-overload]
            uuid=str(data["uuid"]),
            uuid_source=str(data.get("uuid_source") or ""),
            benchmark=str(data.get("benchmark") or ""),
            command=str(data.get("command") or ""),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            reason=str(data.get("reason") or ""),
            stderr_tail=str(data.get("stderr_tail") or ""),
            gpu_name=str(data.get("gpu_name") or ""),
            slurm_job_id=str(data.get("slurm_job_id") or ""),
            notes=tuple(str(n) for n in notes) if isinstance(notes, list | tuple) else (),
            clock_events=clock_events,
            telemetry_window=str(data.get("telemetry_window") or ""),
            **numbers,
        )


@dataclass(frozen=True)
class Missing:
    """A planned GPU with no successful run of a class (``failed`` runs of it, if any)."""

    node: str
    gpu_index: int
    job_class: str
    failed_runs: int


@dataclass(frozen=True)
class Failure:
    node: str
    gpu_index: int
    job_class: str
    repeat: int
    exit_code: int | None
    reason: str
    stderr_tail: str
    slurm_job_id: str


@dataclass(frozen=True)
class Disagreement:
    """Repeats of one GPU and class that differ by more than the tolerance (max/min)."""

    node: str
    gpu_index: int
    uuid: str
    job_class: str
    durations: tuple[float, ...]
    ratio: float
    sm_clock_range: tuple[float, float] | None  # (min, max) over the runs, when measured


@dataclass(frozen=True)
class Slowdown:
    """A GPU whose runs hit thermal or hardware clock slowdowns: check its cooling/power."""

    node: str
    gpu_index: int
    uuid: str
    events: tuple[str, ...]
    runs: int  # runs that saw any of ``events``
    of_runs: int  # successful runs of this GPU
    classes: tuple[str, ...]
    max_share: float  # largest share of one run's readings with a slowdown reason
    unknown_runs: int = 0  # runs of this GPU without clock-event readings


@dataclass(frozen=True)
class CampaignCheck:
    """What :func:`check_campaign` found; ``ok_runs`` are what would be ingested."""

    planned_gpus: int
    classes: tuple[str, ...]
    repeats: int
    tolerance: float
    ok_runs: tuple[RunRecord, ...]
    failures: tuple[Failure, ...]
    missing: tuple[Missing, ...]
    short: tuple[tuple[str, int, str, int], ...]  # (node, index, class, ok runs) < repeats
    disagreements: tuple[Disagreement, ...]
    unplanned: tuple[RunRecord, ...]  # records for GPUs/classes the plan does not have
    uuid_conflicts: tuple[tuple[str, int, tuple[str, ...]], ...]  # one GPU, several UUIDs
    location_ids: tuple[tuple[str, int, str], ...] = ()
    """(node, index, id) of GPUs no NVML UUID names (``uuid_source`` ``assignment``): their
    scores follow the slot, not the physical GPU, so a swapped board goes unnoticed."""
    slowdowns: tuple[Slowdown, ...] = ()
    """GPUs whose runs saw thermal/hardware slowdowns: a cooling finding, not a PM-score."""
    clock_events_unknown: tuple[tuple[str, int, int], ...] = ()
    """(node, index, runs) of GPUs with ok runs that have no clock-event readings: whether
    they slowed down is unknown, so they are not reported clean."""

    @property
    def complete(self) -> bool:
        """Every planned run of every planned GPU succeeded (and each GPU has one UUID).

        Fewer runs than planned (a task killed by its time limit or a lost node) is incomplete
        too: ``campaign submit`` reruns such tasks.
        """
        return not (self.failures or self.missing or self.short or self.uuid_conflicts)

    @property
    def missing_gpus(self) -> tuple[GpuKey, ...]:
        return tuple(sorted({(m.node, m.gpu_index) for m in self.missing}))

    def to_dict(self) -> dict[str, object]:
        return {
            "planned_gpus": self.planned_gpus,
            "classes": list(self.classes),
            "repeats": self.repeats,
            "tolerance": self.tolerance,
            "ok_runs": len(self.ok_runs),
            "complete": self.complete,
            "missing_gpus": [f"{n}:{i}" for n, i in self.missing_gpus],
            "missing": [asdict(m) for m in self.missing],
            "failures": [asdict(f) for f in self.failures],
            "short": [
                {"node": n, "gpu_index": i, "job_class": c, "ok_runs": k}
                for n, i, c, k in self.short
            ],
            "disagreements": [asdict(d) for d in self.disagreements],
            "unplanned": [f"{r.node}:{r.gpu_index} class {r.job_class}" for r in self.unplanned],
            "uuid_conflicts": [
                {"node": n, "gpu_index": i, "uuids": list(u)} for n, i, u in self.uuid_conflicts
            ],
            "location_ids": [
                {"node": n, "gpu_index": i, "uuid": u} for n, i, u in self.location_ids
            ],
            "slowdowns": [asdict(s) for s in self.slowdowns],
            "clock_events_unknown": [
                {"node": n, "gpu_index": i, "runs": k} for n, i, k in self.clock_events_unknown
            ],
        }


def latest_records(records: Iterable[RunRecord]) -> list[RunRecord]:
    """One record per (node, GPU, class, repeat): the last finished (a rerun replaces a run)."""
    best: dict[tuple[str, int, str, int], RunRecord] = {}
    for r in records:
        key = (r.node, r.gpu_index, r.job_class, r.repeat)
        old = best.get(key)
        if old is None or (r.finished_at or 0.0) >= (old.finished_at or 0.0):
            best[key] = r
    return [best[k] for k in sorted(best)]


def check_campaign(
    planned: Sequence[PlannedGpu],
    classes: Sequence[str],
    repeats: int,
    records: Iterable[RunRecord],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> CampaignCheck:
    """Compare the records with the plan: missing, failed, short and disagreeing GPUs."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0 (0.05 = 5 %), got {tolerance!r}")
    planned_keys = {g.key for g in planned}
    class_set = set(classes)
    runs = latest_records(records)
    unplanned = tuple(
        r
        for r in runs
        if r.key not in planned_keys or r.job_class not in class_set or r.repeat >= repeats
    )
    runs = [
        r for r in runs if r.key in planned_keys and r.job_class in class_set and r.repeat < repeats
    ]
    ok = [r for r in runs if r.ok]
    failures = tuple(
        Failure(
            r.node,
            r.gpu_index,
            r.job_class,
            r.repeat,
            r.exit_code,
            r.reason,
            r.stderr_tail,
            r.slurm_job_id,
        )
        for r in runs
        if not r.ok
    )
    ok_by: dict[tuple[str, int, str], list[RunRecord]] = {}
    for r in ok:
        ok_by.setdefault((r.node, r.gpu_index, r.job_class), []).append(r)
    failed_count: dict[tuple[str, int, str], int] = {}
    for f in failures:
        k = (f.node, f.gpu_index, f.job_class)
        failed_count[k] = failed_count.get(k, 0) + 1

    missing: list[Missing] = []
    short: list[tuple[str, int, str, int]] = []
    disagreements: list[Disagreement] = []
    for gpu in sorted(planned, key=lambda g: g.key):
        for job_class in classes:
            k = (gpu.node, gpu.gpu_index, job_class)
            got = ok_by.get(k, [])
            if not got:
                missing.append(Missing(gpu.node, gpu.gpu_index, job_class, failed_count.get(k, 0)))
                continue
            if len(got) < repeats:
                short.append((gpu.node, gpu.gpu_index, job_class, len(got)))
            durations = [float(r.duration_s) for r in got]  # type: ignore[arg-type]
            ratio = max(durations) / min(durations)
            if ratio > 1.0 + tolerance:
                clocks = [r.sm_clock_mhz for r in got if r.sm_clock_mhz is not None]
                disagreements.append(
                    Disagreement(
                        gpu.node,
                        gpu.gpu_index,
                        got[0].uuid,
                        job_class,
                        tuple(durations),
                        ratio,
                        (min(clocks), max(clocks)) if clocks else None,
                    )
                )

    uuids: dict[GpuKey, set[str]] = {}
    for r in ok:
        uuids.setdefault(r.key, set()).add(r.uuid)
    conflicts = tuple(
        (node, index, tuple(sorted(ids)))
        for (node, index), ids in sorted(uuids.items())
        if len(ids) > 1
    )
    by_location = sorted({(r.node, r.gpu_index, r.uuid) for r in ok if r.uuid_source == ASSIGNED})
    unknown: dict[GpuKey, int] = {}
    for r in ok:
        if r.clock_events is None:
            unknown[r.key] = unknown.get(r.key, 0) + 1
    return CampaignCheck(
        slowdowns=slowdowns(ok),
        clock_events_unknown=tuple((n, i, k) for (n, i), k in sorted(unknown.items())),
        planned_gpus=len(planned_keys),
        classes=tuple(classes),
        repeats=repeats,
        tolerance=tolerance,
        ok_runs=tuple(ok),
        failures=failures,
        missing=tuple(missing),
        short=tuple(short),
        disagreements=tuple(disagreements),
        unplanned=unplanned,
        uuid_conflicts=conflicts,
        location_ids=tuple(by_location),
    )


class _ClockEventRun(Protocol):
    """A measured run as far as slowdowns go: a :class:`RunRecord` or a stored row."""

    @property
    def key(self) -> GpuKey: ...
    @property
    def uuid(self) -> str: ...
    @property
    def job_class(self) -> str: ...
    @property
    def clock_events(self) -> ClockEvents | None: ...
    @property
    def cooling_events(self) -> tuple[str, ...]: ...


def _cooling(events: ClockEvents | None) -> tuple[str, ...]:
    return tuple(name for name, share in events or () if name in COOLING_EVENTS and share)


@dataclass(frozen=True)
class RunClockEvents:
    """One measured run's clock-event reasons as the store keeps them (None: no readings)."""

    node: str
    gpu_index: int
    job_class: str
    repeat: int
    uuid: str
    clock_events: ClockEvents | None

    @property
    def key(self) -> GpuKey:
        return (self.node, self.gpu_index)

    @property
    def cooling_events(self) -> tuple[str, ...]:
        return _cooling(self.clock_events)


def slowdowns(runs: Iterable[_ClockEventRun]) -> tuple[Slowdown, ...]:
    """Per GPU, the runs that saw thermal or hardware slowdown reasons (sorted by GPU)."""
    by_gpu: dict[GpuKey, list[_ClockEventRun]] = {}
    for r in runs:
        by_gpu.setdefault(r.key, []).append(r)
    found = []
    for (node, index), gpu_runs in sorted(by_gpu.items()):
        hit = [r for r in gpu_runs if r.cooling_events]
        if not hit:
            continue
        shares = [
            share for r in hit for name, share in r.clock_events or () if name in COOLING_EVENTS
        ]
        found.append(
            Slowdown(
                node=node,
                gpu_index=index,
                uuid=hit[0].uuid,
                events=tuple(sorted({e for r in hit for e in r.cooling_events})),
                runs=len(hit),
                of_runs=len(gpu_runs),
                classes=tuple(sorted({r.job_class for r in hit})),
                max_share=max(shares),
                unknown_runs=sum(r.clock_events is None for r in gpu_runs),
            )
        )
    return tuple(found)


CLOCK_EVENTS_UNKNOWN = "unknown"
CLOCK_EVENTS_PARTIAL = "partial"
CLOCK_EVENTS_KNOWN = "known"


@dataclass(frozen=True)
class ClockEventSummary:
    """One stored campaign's thermal/hardware slowdowns, and how much of it is known.

    A campaign ingested before the store kept clock events, or from a CSV, has no rows: its
    status is ``unknown`` and every GPU is unknown, not clean.
    """

    campaign: str
    runs: int  # measured runs the store keeps clock events for
    unknown_runs: int  # of them, runs without readings
    slowdowns: tuple[Slowdown, ...]
    unknown_gpus: tuple[str, ...]  # UUIDs with no slowdown and some run without readings
    clean_gpus: tuple[str, ...] = ()  # UUIDs whose every run has readings, none a slowdown

    @property
    def status(self) -> str:
        """``known`` (every run has readings), ``partial`` or ``unknown`` (none has)."""
        if self.runs == self.unknown_runs:
            return CLOCK_EVENTS_UNKNOWN
        if self.unknown_runs or self.unknown_gpus:
            return CLOCK_EVENTS_PARTIAL
        return CLOCK_EVENTS_KNOWN

    def gpu_state(self, uuid: str) -> tuple[str, ...] | None:
        """A GPU's slowdown reasons: () when its runs were clean, None when unknown (also for
        a GPU the campaign did not measure)."""
        for s in self.slowdowns:
            if s.uuid == uuid:
                return s.events
        return () if uuid in self.clean_gpus else None

    def to_dict(self) -> dict[str, object]:
        return {
            "campaign": self.campaign,
            "status": self.status,
            "runs": self.runs,
            "unknown_runs": self.unknown_runs,
            "slowdowns": [asdict(s) for s in self.slowdowns],
            "unknown_gpus": list(self.unknown_gpus),
            "clean_gpus": list(self.clean_gpus),
        }


def summarize_clock_events(
    campaign: str, gpus: Iterable[str], runs: Iterable[RunClockEvents]
) -> ClockEventSummary:
    """Slowdowns of one stored campaign from its runs' rows (UUIDs as the campaign's scores
    name them); ``gpus`` are the campaign's measured GPUs, so a GPU without rows is unknown."""
    runs = list(runs)
    found = slowdowns(runs)
    hot = {s.uuid for s in found}
    known_clean: dict[str, bool] = {}
    for r in runs:
        known_clean[r.uuid] = known_clean.get(r.uuid, True) and r.clock_events is not None
    unknown = sorted(
        u for u in set(gpus) | set(known_clean) if u not in hot and not known_clean.get(u, False)
    )
    return ClockEventSummary(
        campaign=campaign,
        runs=len(runs),
        unknown_runs=sum(r.clock_events is None for r in runs),
        slowdowns=found,
        unknown_gpus=tuple(unknown),
        clean_gpus=tuple(sorted(u for u, clean in known_clean.items() if clean and u not in hot)),
    )


def measurement_rows(runs: Iterable[RunRecord], gpu_model: str) -> pd.DataFrame:
    """Successful runs -> rows of the project's campaign CSV (:data:`CSV_COLUMNS`), sorted."""
    rows = [
        {
            "uuid": r.uuid,
            "node": r.node,
            "gpu_index": r.gpu_index,
            "gpu_model": gpu_model,
            "job_class": r.job_class,
            "benchmark": r.benchmark,
            "duration_s": r.duration_s,
            "sm_clock_mhz": r.sm_clock_mhz,
            "temperature_c": r.temperature_c,
            "power_w": r.power_w,
            "started_at": r.started_at,
        }
        for r in sorted(runs, key=lambda r: (r.node, r.gpu_index, r.job_class, r.repeat))
        if r.ok
    ]
    return pd.DataFrame(rows, columns=list(CSV_COLUMNS))


# -- progress --------------------------------------------------------------------------------

TASK_STATES = ("done", "failed", "running", "pending", "not submitted", "incomplete")


@dataclass(frozen=True)
class TaskProgress:
    """One array task (= one GPU): its state and the Slurm reason when it waits."""

    node: str
    gpu_index: int
    state: str
    ok_runs: int
    failed_runs: int
    slurm_reason: str = ""


def task_progress(
    planned: Sequence[PlannedGpu],
    classes: Sequence[str],
    repeats: int,
    records: Iterable[RunRecord],
    queued: Mapping[GpuKey, tuple[str, str]],
    submitted: Iterable[GpuKey] = (),
) -> list[TaskProgress]:
    """Per task: Slurm's view while it is queued, else what its records say.

    ``queued`` maps a GPU to (Slurm state, reason) for tasks still in the queue; a task that
    left the queue is ``done`` when every run succeeded, ``failed`` when any run failed,
    ``incomplete`` when it was submitted but left runs unwritten (killed, timed out, node
    lost) and ``not submitted`` when nothing was ever submitted for it.
    """
    runs = [r for r in latest_records(records) if r.job_class in set(classes)]
    ok: dict[GpuKey, int] = {}
    failed: dict[GpuKey, int] = {}
    for r in runs:
        if r.repeat >= repeats:
            continue
        target = ok if r.ok else failed
        target[r.key] = target.get(r.key, 0) + 1
    sent = set(submitted)
    out = []
    for gpu in sorted(planned, key=lambda g: g.key):
        n_ok, n_failed = ok.get(gpu.key, 0), failed.get(gpu.key, 0)
        reason = ""
        if gpu.key in queued:
            slurm_state, reason = queued[gpu.key]
            state = "running" if slurm_state in ("RUNNING", "COMPLETING") else "pending"
        elif n_failed:
            state = "failed"
        elif n_ok >= len(classes) * repeats:
            state = "done"
        elif gpu.key in sent or n_ok:
            state = "incomplete"
        else:
            state = "not submitted"
        out.append(TaskProgress(gpu.node, gpu.gpu_index, state, n_ok, n_failed, reason))
    return out


UNAVAILABLE_REASONS = ("ReqNodeNotAvail", "NodeDown", "PartitionDown", "PartitionInactive")


def waiting_for_unavailable_nodes(
    tasks: Iterable[TaskProgress], node_states: Mapping[str, str] | None = None
) -> bool:
    """True when nothing runs and every queued task waits for a node that is drained or down.

    Waiting longer changes nothing then: an admin has to resume the nodes, or collect the rest.
    ``node_states`` (sinfo's, when known) decides over the queue's reasons, which lag in
    Slurm 22.05: a pending job keeps ``ReqNodeNotAvail`` for a scheduling pass after its node
    is resumed, and a job requeued from a node that died shows reason ``None`` for half a
    minute after the node is ``down*``. Without it the reasons decide.
    """
    queued = [t for t in tasks if t.state in ("pending", "running")]
    if not queued or any(t.state != "pending" for t in queued):
        return False
    if node_states is None:
        return all(t.slurm_reason.startswith(UNAVAILABLE_REASONS) for t in queued)
    return all(node_unavailable(node_states.get(t.node, "unknown")) for t in queued)


UNAVAILABLE_NODE_STATES = ("drain", "down", "fail", "maint", "inval", "unknown", "power")


def node_unavailable(node_state: str) -> bool:
    """Whether sinfo's long node state means no job starts there until someone acts (drained,
    down, failing). ``idle*`` (not responding) alone is not: Slurm 22.05 shows a node it has
    just resumed as ``idle*`` until it answers a ping, and a dead one turns ``down*`` later."""
    text = node_state.strip().lower()
    return any(word in text for word in UNAVAILABLE_NODE_STATES)


def progress_counts(tasks: Iterable[TaskProgress]) -> dict[str, int]:
    counts = dict.fromkeys(TASK_STATES, 0)
    for t in tasks:
        counts[t.state] += 1
    return counts


# -- diff ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BinChange:
    uuid: str
    node: str
    gpu_index: int | None
    job_class: str
    old_bin: str
    new_bin: str
    old_score: float
    new_score: float


@dataclass(frozen=True)
class LabelChange:
    uuid: str
    node: str
    gpu_index: int | None
    old_label: str | None
    new_label: str | None


@dataclass(frozen=True)
class CampaignDiff:
    """Two campaigns compared GPU by GPU (by UUID: scores follow the physical GPU)."""

    old: str
    new: str
    bin_changes: tuple[BinChange, ...]
    new_outliers: tuple[BinChange, ...]  # outlier in NEW, not in OLD: hardware-ticket candidates
    cleared_outliers: tuple[BinChange, ...]  # outlier in OLD, not any more
    only_old: tuple[str, ...]  # GPUs gone from the new campaign
    only_new: tuple[str, ...]
    label_changes: tuple[LabelChange, ...]
    label_score_changes: tuple[tuple[str, str, float, float], ...] = field(default=())
    # (label, class, old score, new score) for labels in both campaigns
    old_clock_events: ClockEventSummary | None = None
    new_clock_events: ClockEventSummary | None = None
    """Thermal/hardware slowdowns in each campaign (None: not looked at)."""

    @property
    def restart_nodes(self) -> tuple[str, ...]:
        """Nodes whose gres.conf Type= lines change: slurmd there (and slurmctld) restart."""
        return tuple(sorted({c.node for c in self.label_changes if c.node}))

    def to_dict(self) -> dict[str, object]:
        return {
            "old": self.old,
            "new": self.new,
            "bin_changes": [asdict(c) for c in self.bin_changes],
            "new_outliers": [asdict(c) for c in self.new_outliers],
            "cleared_outliers": [asdict(c) for c in self.cleared_outliers],
            "only_old": list(self.only_old),
            "only_new": list(self.only_new),
            "label_changes": [asdict(c) for c in self.label_changes],
            "label_score_changes": [
                {"label": lb, "job_class": c, "old_score": a, "new_score": b}
                for lb, c, a, b in self.label_score_changes
            ],
            "restart_nodes": list(self.restart_nodes),
            "clock_events": {
                "old": None if self.old_clock_events is None else self.old_clock_events.to_dict(),
                "new": None if self.new_clock_events is None else self.new_clock_events.to_dict(),
            },
        }


def _bin_name(value: object) -> str:
    b = int(value)  # type: ignore[call-overload]
    return "outlier" if b < 0 else str(b)


def _index(value: object) -> int | None:
    return None if value is None or pd.isna(value) else int(value)  # type: ignore[call-overload]


def diff_campaigns(
    old_id: str,
    new_id: str,
    old_scores: pd.DataFrame,
    new_scores: pd.DataFrame,
    old_labels: Mapping[str, str],
    new_labels: Mapping[str, str],
    old_label_scores: Mapping[str, Mapping[str, float]] | None = None,
    new_label_scores: Mapping[str, Mapping[str, float]] | None = None,
    *,
    score_epsilon: float = 1e-9,
    old_clock_events: ClockEventSummary | None = None,
    new_clock_events: ClockEventSummary | None = None,
) -> CampaignDiff:
    """Compare two campaigns' per-GPU rows (``Store.gpu_scores``) and GPU labels.

    Bin numbers are per campaign (K-Means may choose another K), so a change is shown with
    both PM-scores. ``*_label_scores`` (label -> class -> score) add label score changes:
    those only update the advisor's table, while a GPU changing label changes gres.conf.
    ``*_clock_events`` (:func:`summarize_clock_events`) are carried along: a GPU that hit
    thermal/hardware slowdowns in a campaign has a PM-score there that jobs will not see.
    """
    cols = ["uuid", "job_class", "node", "gpu_index", "bin", "pm_score"]
    merged = old_scores[cols].merge(
        new_scores[cols], on=["uuid", "job_class"], how="outer", suffixes=("_old", "_new")
    )
    merged = merged.sort_values(["uuid", "job_class"], kind="stable")
    changes: list[BinChange] = []
    new_out: list[BinChange] = []
    cleared: list[BinChange] = []
    for r in merged.itertuples(index=False):
        in_old, in_new = not pd.isna(r.bin_old), not pd.isna(r.bin_new)
        node = str(r.node_new if in_new else r.node_old)
        index = _index(r.gpu_index_new if in_new else r.gpu_index_old)
        change = BinChange(
            uuid=str(r.uuid),
            node=node,
            gpu_index=index,
            job_class=str(r.job_class),
            old_bin=_bin_name(r.bin_old) if in_old else "-",
            new_bin=_bin_name(r.bin_new) if in_new else "-",
            old_score=float(r.pm_score_old) if in_old else math.nan,
            new_score=float(r.pm_score_new) if in_new else math.nan,
        )
        if in_old and in_new and change.old_bin != change.new_bin:
            changes.append(change)
        if in_new and change.new_bin == "outlier" and change.old_bin != "outlier":
            new_out.append(change)
        if in_old and change.old_bin == "outlier" and change.new_bin != "outlier":
            cleared.append(change)
    old_gpus, new_gpus = set(old_scores["uuid"]), set(new_scores["uuid"])
    where = {
        str(r.uuid): (str(r.node), _index(r.gpu_index))
        for frame in (old_scores, new_scores)
        for r in frame[["uuid", "node", "gpu_index"]].itertuples(index=False)
    }
    label_changes = tuple(
        LabelChange(uuid, *where.get(uuid, ("", None)), old_labels.get(uuid), new_labels.get(uuid))
        for uuid in sorted(set(old_labels) | set(new_labels))
        if old_labels.get(uuid) != new_labels.get(uuid)
    )
    score_changes: list[tuple[str, str, float, float]] = []
    if old_label_scores is not None and new_label_scores is not None:
        for label in sorted(set(old_label_scores) & set(new_label_scores)):
            a, b = old_label_scores[label], new_label_scores[label]
            for job_class in sorted(set(a) & set(b)):
                if abs(float(a[job_class]) - float(b[job_class])) > score_epsilon:
                    score_changes.append(
                        (label, job_class, float(a[job_class]), float(b[job_class]))
                    )
    return CampaignDiff(
        old=old_id,
        new=new_id,
        bin_changes=tuple(changes),
        new_outliers=tuple(new_out),
        cleared_outliers=tuple(cleared),
        only_old=tuple(sorted(old_gpus - new_gpus)),
        only_new=tuple(sorted(new_gpus - old_gpus)),
        label_changes=label_changes,
        label_score_changes=tuple(score_changes),
        old_clock_events=old_clock_events,
        new_clock_events=new_clock_events,
    )
