"""A submitted job as job_submit.lua sees it, and what it asks in GPUs (pure: dicts in, values out).

Why a module of its own: the Lua side sends ``job_desc`` fields almost raw (PROTOCOL.md, op
``decide``), and every consumer (the decision, the re-planner, the decision log) must read them
the same way. Slurm shapes handled (22.05, ``shared/notes/slurm-testbed.md`` §3):

* ``--gres=gpu:2`` and ``--gpus-per-node=2`` both arrive as ``tres_per_node = "gres:gpu:2"``;
  ``--gpus=2`` as ``tres_per_job``, ``--gpus-per-task`` as ``tres_per_task``, typed
  ``gres:gpu:v100:2``, several entries comma-separated (``gres:gpu:2,gres:shard:1``). Newer
  Slurm writes ``gres/gpu:2``; both prefixes are read.
* ``min_nodes``/``max_nodes``/``num_tasks`` are ``NO_VAL``/``NO_VAL16`` when not given (Lua should
  leave them out; both read as None).
* ``req_nodes``/``exc_nodes`` are hostlist expressions; ``features`` a constraint expression of
  which only plain ``a&b`` (AND) can be modelled (``|``, ``[...]``, ``*count``, ``!``, parentheses
  cannot; ``,`` is rejected by Slurm itself).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from slurm_pal.core.hostlist import expand
from slurm_pal.core.resolve import JobRequest, app_from_script
from slurm_pal.errors import SlurmPalError

__all__ = [
    "NO_VAL",
    "NO_VAL16",
    "SETTABLE",
    "TRES_FIELDS",
    "GpuAsk",
    "JobDescError",
    "JobDescription",
    "TresEntry",
    "feature_set",
    "gpu_ask",
    "node_set",
    "parse_tres",
]

NO_VAL = 4294967294
NO_VAL16 = 65534
_NO_VALUES = frozenset({NO_VAL, NO_VAL16})
_FEATURE_NAME = re.compile(r"^[A-Za-z0-9_.:+/@-]+$")
_UNMODELLED_FEATURE_CHARS = "|[]*!(),"


class JobDescError(SlurmPalError, ValueError):
    """A job field of the wrong type or shape; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"job field {field!r}: {message}")
        self.field = field


_STR_FIELDS = ("name", "comment", "account", "partition")
_OPT_STR_FIELDS = (
    "tres_per_node",
    "tres_per_job",
    "tres_per_task",
    "tres_per_socket",
    "req_nodes",
    "exc_nodes",
    "features",
    "script",
    "array",
    "script_hash",
    "script_app",
)
#: The placement fields ``decide`` may set on a job (``with_set`` refuses others).
SETTABLE = (
    "req_nodes",
    "exc_nodes",
    "tres_per_node",
    "tres_per_job",
    "tres_per_task",
    "min_nodes",
    "max_nodes",
    "begin_time",
)
_OPT_INT_FIELDS = (
    "uid",
    "min_nodes",
    "max_nodes",
    "num_tasks",
    "script_size",
    "job_id",
    "time_limit",
)
_INFINITE = 4294967295


def _as_int(field: str, value: object) -> int | None:
    """An integer field; NO_VAL/NO_VAL16 -> None. Lua numbers are doubles, so ``2.0`` is 2."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise JobDescError(field, f"expected an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise JobDescError(field, f"expected an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise JobDescError(field, f"expected an integer, got {type(value).__name__} {value!r}")
    if value in _NO_VALUES:
        return None
    if value < 0:
        raise JobDescError(field, f"expected an integer >= 0, got {value}")
    return value


def _as_str(field: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobDescError(field, f"expected a string, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class JobDescription:
    """The fields of PROTOCOL.md's ``decide`` table; absent fields are None ("" for strings
    that Slurm always has). ``script`` may be only the first 16 KiB (``script_size`` is the
    whole length in bytes)."""

    user: str = ""
    uid: int | None = None
    name: str = ""
    comment: str = ""
    account: str = ""
    partition: str = ""
    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    num_tasks: int | None = None
    req_nodes: str | None = None
    exc_nodes: str | None = None
    features: str | None = None
    script: str | None = None
    script_size: int | None = None
    array: str | None = None
    modify: bool = False
    job_id: int | None = None
    script_hash: str | None = None  # stored form: the script's hash instead of the script
    script_app: str | None = None  # stored form: the application its #PAL line names
    time_limit: int | None = None  # minutes, as job_desc holds it (4294967295: UNLIMITED)

    @property
    def time_limit_s(self) -> float | None:
        """The job's time limit in seconds: what the advisor expects it to run at most
        (``inf``: UNLIMITED; None: not given, the partition's default applies)."""
        if self.time_limit is None or self.time_limit == 0:
            return None
        return math.inf if self.time_limit >= _INFINITE else self.time_limit * 60.0

    @classmethod
    def from_wire(cls, data: Mapping[str, object]) -> JobDescription:
        """Validate the ``job`` object of a decide request. Unknown keys are ignored (a newer
        Lua script may send more); an empty string in an optional field means absent."""
        if not isinstance(data, Mapping):
            raise JobDescError("job", f"expected an object, got {type(data).__name__}")
        values: dict[str, object] = {}
        for key in _STR_FIELDS:
            values[key] = _as_str(key, data.get(key)) or ""
        for key in _OPT_STR_FIELDS:
            values[key] = _as_str(key, data.get(key)) or None
        for key in _OPT_INT_FIELDS:
            values[key] = _as_int(key, data.get(key))
        user = _as_str("user", data.get("user"))
        if not user:
            user = f"uid:{values['uid']}" if values["uid"] is not None else ""
        values["user"] = user
        modify = data.get("modify", False)
        if modify is None:
            modify = False
        if not isinstance(modify, bool):
            raise JobDescError("modify", f"expected true or false, got {modify!r}")
        values["modify"] = modify
        return cls(**values)  # type: ignore[arg-type]

    def to_wire(self) -> dict[str, object]:
        """The inverse of :meth:`from_wire`: absent (None, "" and false) fields left out, like
        the Lua side does."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == "" or value is False:
                continue
            out[f.name] = value
        return out

    def stored(self) -> dict[str, object]:
        """What the store keeps of this request: the wire form without the batch script (users'
        scripts are theirs), with the script's hash and the application its ``#PAL app=`` line
        names, which is all the history, drift and mismatch checks read back."""
        out = self.to_wire()
        out.pop("script", None)
        sha = self.script_sha256
        if sha is not None:
            out["script_hash"] = sha
        app = app_from_script(self.script) if self.script is not None else self.script_app
        if app is not None:
            out["script_app"] = app
        return out

    def with_set(self, set_fields: Mapping[str, object]) -> JobDescription:
        """The job as Slurm holds it after job_submit.lua applied a decide answer's ``set``
        (``""`` clears a string field; ``admin_comment`` is not a job field here). What the
        re-planner and the tests compare against; JobDescError for a value of the wrong type."""
        wire = self.to_wire()
        for key, value in set_fields.items():
            if key == "admin_comment":
                continue
            if key not in SETTABLE:
                raise JobDescError(key, f"not a field decide sets; valid: {', '.join(SETTABLE)}")
            if value == "":
                wire.pop(key, None)
            else:
                wire[key] = value
        return JobDescription.from_wire(wire)

    @property
    def script_sha256(self) -> str | None:
        """The history key's script hash (None without a batch script).

        A complete script (``script_size`` absent or equal to the bytes received) hashes as the
        file itself, so ``slurm-pal apps resolve --script FILE`` finds the same history. A
        script cut to its first 16 KiB hashes the prefix followed by ``"\\0size=<script_size>"``,
        so two long scripts that share a prefix but differ in length do not collide.
        """
        if self.script is None:
            return self.script_hash
        try:  # bytes that were not UTF-8 come back as they were sent (see protocol)
            data = self.script.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = self.script.encode("utf-8", "surrogatepass")
        if self.script_size is not None and self.script_size != len(data):
            data += f"\0size={self.script_size}".encode()
        return hashlib.sha256(data).hexdigest()

    def job_request(self) -> JobRequest:
        """What :func:`slurm_pal.core.resolve.resolve` needs to pick the job's class."""
        return JobRequest(
            user=self.user,
            job_name=self.name,
            account=self.account,
            partition=self.partition,
            comment=self.comment,
            script=self.script,
            script_sha256=self.script_sha256,
            script_app=self.script_app,
        )


@dataclass(frozen=True)
class TresEntry:
    """One comma-separated item of a ``tres_per_*`` string: ``[gres:]name[:type][:count]``.

    ``text`` is the item as written (kept verbatim for anything that is not a GPU)."""

    text: str
    name: str
    type: str | None
    count: int

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"


def _split_items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_tres(text: str | None, field: str = "tres") -> tuple[TresEntry, ...]:
    """Parse a ``tres_per_*`` value. GPU entries must be ``gpu[:type][:count]``; other entries
    (``gres:shard:1``, ``cpu:2``, ``cpu=2``) are kept as written and their count is not read.
    The same few values come back at every round's decision (``gres:gpu:2``): parsed once."""
    if text is None:
        return ()
    return _parse_tres(text, field)


@functools.lru_cache(maxsize=4096)
def _parse_tres(text: str, field: str) -> tuple[TresEntry, ...]:
    entries: list[TresEntry] = []
    for item in _split_items(text):
        body = item
        for prefix in ("gres:", "gres/"):
            if body.startswith(prefix):
                body = body[len(prefix) :]
                break
        name = re.split(r"[:=]", body, maxsplit=1)[0]
        if name != "gpu":
            entries.append(TresEntry(item, name, None, 0))
            continue
        parts = body.split(":")[1:]
        count = 1
        if parts and parts[-1].isdigit():
            count = int(parts.pop())
        if len(parts) > 1 or (parts and not parts[0]) or any(c in item for c in "()= "):
            raise JobDescError(
                field, f"cannot read GPU entry {item!r}; expected gres:gpu[:TYPE][:COUNT]"
            )
        entries.append(TresEntry(item, "gpu", parts[0] if parts else None, count))
    return tuple(entries)


@dataclass(frozen=True)
class GpuAsk:
    """What a job asks in GPUs. Counts are summed over the GPU entries of each field (None:
    the field names no GPU). ``types`` lists every GPU type named, in order, with None for an
    untyped entry when typed ones are present too; ``gpu_type`` is the type when exactly one
    type (and no untyped entry) is named. ``other_gres`` are the non-GPU entries of every field,
    verbatim: whatever the advisor writes back keeps them."""

    per_node: int | None
    per_job: int | None
    per_task: int | None
    gpu_type: str | None
    other_gres: tuple[str, ...]
    per_socket: int | None = None
    types: tuple[str | None, ...] = ()

    @property
    def mixed_types(self) -> bool:
        """Several GPU types (or typed and untyped entries) in one job: not one model."""
        return len(self.types) > 1


TRES_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")


def gpu_ask(job: JobDescription) -> GpuAsk | None:
    """The job's GPU request, or None when it asks no GPUs (a CPU job, or only ``gpu:0``).

    Raises JobDescError (naming the field) for a GPU entry it cannot read."""
    return _gpu_ask(job.tres_per_node, job.tres_per_job, job.tres_per_task, job.tres_per_socket)


@functools.lru_cache(maxsize=4096)
def _gpu_ask(*values: str | None) -> GpuAsk | None:
    """:func:`gpu_ask` of the ``TRES_FIELDS`` values (a round asks it of every pending job)."""
    counts: dict[str, int | None] = {}
    seen_types: dict[str | None, None] = {}
    other: list[str] = []
    total = 0
    for field, value in zip(TRES_FIELDS, values, strict=True):
        entries = parse_tres(value, field)
        gpus = [e for e in entries if e.is_gpu]
        other.extend(e.text for e in entries if not e.is_gpu)
        counts[field] = sum(e.count for e in gpus) if gpus else None
        total += sum(e.count for e in gpus)
        for e in gpus:
            seen_types.setdefault(e.type, None)
    if total == 0:
        return None
    types = tuple(seen_types)
    gpu_type = types[0] if len(types) == 1 else None
    if types == (None,):
        types = ()
    return GpuAsk(
        per_node=counts["tres_per_node"],
        per_job=counts["tres_per_job"],
        per_task=counts["tres_per_task"],
        gpu_type=gpu_type,
        other_gres=tuple(other),
        per_socket=counts["tres_per_socket"],
        types=types,
    )


def node_set(text: str | None, field: str) -> frozenset[str]:
    """A hostlist field (``req_nodes``/``exc_nodes``) -> node names; JobDescError if malformed."""
    if not text:
        return frozenset()
    try:
        return frozenset(expand(text))
    except ValueError as error:
        raise JobDescError(field, str(error)) from None


def feature_set(text: str | None) -> frozenset[str]:
    """A ``--constraint`` that is a plain AND of features (``a&b``) -> the features.

    Raises JobDescError for anything else (OR, matching OR, counts, NOT, grouping, commas):
    the placement model only knows "every node has all these features"."""
    if not text or not text.strip():
        return frozenset()
    bad = sorted({c for c in text if c in _UNMODELLED_FEATURE_CHARS})
    if bad:
        raise JobDescError(
            "features",
            f"constraint {text!r} uses {' '.join(bad)}; only a plain AND of features "
            "(a&b) can be modelled",
        )
    names = [part.strip() for part in text.split("&")]
    for name in names:
        if not _FEATURE_NAME.match(name):
            raise JobDescError("features", f"bad feature name {name!r} in constraint {text!r}")
    return frozenset(names)
