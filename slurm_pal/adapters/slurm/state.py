"""What the running Slurm says about nodes and jobs, behind a small interface.

Why an interface: pyslurm would be the fast path, but it only builds against the Slurm release
it was made for (PyPI has 25.11; Debian 12 ships 22.05 and the 22.5.x pyslurm is GitHub-only),
so the pyslurm backend (``pyslurm_backend.py``) is tested at its boundary only and ``auto``
falls back to this one. :class:`CliStateReader` uses
the command-line tools every Slurm has: ``squeue --json`` (which ignores its filter options in
22.05, so filtering happens here, on the client), for nodes ``sinfo --json`` on 22.05 and
``scontrol show nodes --json`` from 23.02 on (:mod:`slurm_pal.adapters.slurm.release`; 24.11's
``sinfo --json`` groups nodes like its table does), and, when the JSON serializer plugin is
missing, ``scontrol show node -o -d``. The parsers read both JSON generations: 22.05's
(openapi v0.0.38: plain strings and numbers) and 24.11's (data_parser v0.0.42: states as lists,
numbers as ``{"set", "infinite", "number"}``, TRES as ``gres/gpu:T:n``).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from slurm_pal.adapters.slurm.parse import Gres, gpu_counts, parse_gres, parse_key_values
from slurm_pal.adapters.slurm.release import OLDEST, SlurmRelease, detect_release
from slurm_pal.core.hostlist import expand
from slurm_pal.errors import SlurmPalError

Runner = Callable[[Sequence[str]], str]
Parser = Callable[[str], Any]

log = logging.getLogger("slurm_pal.adapters.slurm")


class SlurmQueryError(SlurmPalError, RuntimeError):
    """A Slurm command failed or printed something unreadable; the message says which."""


class SlurmTimeoutError(SlurmQueryError):
    """A Slurm command gave no answer in time (slurmctld down or unreachable)."""


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm reports it."""

    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: tuple[str, ...] = ()  # DRAIN, NOT_RESPONDING, ... (upper case)
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    gres: tuple[Gres, ...] = ()  # configured
    gres_used: tuple[Gres, ...] = ()  # allocated, with device indices
    reason: str = ""

    def gpu_types(self) -> dict[str | None, int]:
        """Configured GPUs: type -> count."""
        return gpu_counts(self.gres)

    def used_gpu_indices(self) -> dict[str | None, tuple[int, ...]]:
        """Allocated GPUs: type -> device indices (types with none allocated are left out)."""
        out: dict[str | None, tuple[int, ...]] = {}
        for g in self.gres_used:
            if g.name == "gpu" and g.indices:
                out[g.type] = tuple(sorted({*out.get(g.type, ()), *g.indices}))
        return out


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it (squeue --json)."""

    job_id: int
    state: str  # PENDING, RUNNING, COMPLETED, ...
    user: str
    partition: str
    nodes: tuple[str, ...]  # allocated nodes, expanded (empty while pending)
    name: str = ""
    priority: int = 0
    reason: str = ""
    tres_per_node: tuple[Gres, ...] = ()
    tres_per_job: tuple[Gres, ...] = ()
    required_nodes: tuple[str, ...] = ()
    features: str = ""
    comment: str = ""
    admin_comment: str = ""
    allocated_gres: Mapping[str, tuple[Gres, ...]] = field(default_factory=dict)  # per node
    time_limit_s: float | None = None  # inf: UNLIMITED; None: not set (the partition's)
    end_time: float | None = None  # epoch seconds: a running job's start + time limit

    def allocated_gpu_indices(self) -> dict[str, tuple[int, ...]]:
        """Node -> the global GPU device indices this job holds there."""
        return {
            node: tuple(sorted(i for g in gres if g.name == "gpu" for i in g.indices))
            for node, gres in self.allocated_gres.items()
        }


class SlurmStateReader(Protocol):
    """Read-only view of the cluster, so the advisor does not care where the data comes from."""

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeState]: ...

    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        states: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
    ) -> list[JobState]: ...


class CliStateReader:
    """:class:`SlurmStateReader` over sinfo/squeue/scontrol (see the module docstring)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 10.0,
        runner: Runner | None = None,
        release: SlurmRelease | None = None,
        parse_apart: bool = False,
        brief_jobs: bool = False,
    ) -> None:
        """``parse_apart``: run the commands and parse their JSON in a worker process (the
        service's reader). ``squeue --json`` of 10,000 pending jobs is about 35 MB, and
        ``json.loads`` holds the interpreter lock for its whole parse (0.2-0.3 s), then the
        JobStates take as long again: in the service's own process that stalls every decide
        and every job-end round an Epilog waits for. Unpickling the parsed jobs costs about
        a tenth of that.

        ``brief_jobs``: read jobs with ``squeue -O`` and the fields of :data:`BRIEF_FIELDS`
        only (the service's reader). ``squeue --json`` renders everything about every job: at
        10,000 jobs its client spends 1.2 s of CPU on 32 MB (on the controller, every read),
        the brief form 0.08 s on 0.6 MB. It has no GPU indices of running jobs and none of the
        fields a user writes (name, comment, features, requested nodes): those stay empty."""
        self.env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s
        self._runner = runner or self._run
        self._release = release
        self.parse_apart = parse_apart and runner is None
        self.brief_jobs = brief_jobs
        self._pool: ProcessPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @property
    def release(self) -> SlurmRelease:
        """The tools' release (``scontrol --version``, read once it could be read); 22.05's
        commands while it cannot be (asked again next time: a wrong guess must not stick)."""
        if self._release is None:
            self._release = detect_release(self._runner)
        return self._release or OLDEST

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeState]:
        command = ["sinfo", "--json"]
        if self.release.scontrol_json:
            command = ["scontrol", "show", "nodes", "--json"]
        try:
            found = self._parsed(command, parse_sinfo_json)
        except SlurmTimeoutError:
            raise  # slurmctld does not answer: scontrol would not either
        except SlurmQueryError:  # no serializer/openapi plugin: the text form always works
            found = parse_scontrol_nodes(self._runner(["scontrol", "show", "node", "-o", "-d"]))
        wanted = None if names is None else set(names)
        return [n for n in found if wanted is None or n.name in wanted]

    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        states: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
    ) -> list[JobState]:
        if self.brief_jobs:
            found = self._parsed(["squeue", "--noheader", "-O", BRIEF_FORMAT], parse_squeue_brief)
            if self.release.squeue_json_filters:
                # From 23.02 on --json honours --states: the GPU indices of the jobs holding
                # GPUs cost a read of those jobs only (24.11's Prolog/Epilog environment of a
                # multi-node job names too few of them on all but the first node, so the
                # records cannot stand in for them there).
                holding = self._parsed(
                    ["squeue", "--json", "--states=RUNNING,COMPLETING,SUSPENDED,CONFIGURING"],
                    parse_squeue_json,
                )
                detail = {j.job_id: j.allocated_gres for j in holding if j.allocated_gres}
                found = [
                    replace(j, allocated_gres=detail[j.job_id]) if j.job_id in detail else j
                    for j in found
                ]
        else:
            command = ["squeue", "--json"]
            if self.release.squeue_json_filters:
                command.append("--states=all")  # the default hides ended jobs (22.05 shows all)
            found = self._parsed(command, parse_squeue_json)
        ids = None if job_ids is None else {int(j) for j in job_ids}
        st = None if states is None else {s.upper() for s in states}
        us = None if users is None else set(users)
        return [
            j
            for j in found
            if (ids is None or j.job_id in ids)
            and (st is None or j.state in st)
            and (us is None or j.user in us)
        ]

    def default_partition(self) -> str | None:
        """The partition a job without ``-p`` goes to (``Default=YES``), None when none is.

        ``sinfo --json`` in 22.05 does not say which partition is the default."""
        text = self._runner(["scontrol", "show", "partition", "-o"])
        for line in text.splitlines():
            kv = parse_key_values(line)
            if kv.get("Default", "").upper() == "YES" and kv.get("PartitionName"):
                return kv["PartitionName"]
        return None

    def warm(self) -> None:
        """Start the parsing worker now (a spawned interpreter takes a second or two), so
        the first read that counts does not wait for it."""
        if self.parse_apart:
            self._parsed(["true"], str)

    def close(self) -> None:
        """Stop the parsing worker, if one was started."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _parsed(self, command: Sequence[str], parser: Parser) -> Any:
        """``parser`` over ``command``'s output: in the worker process when ``parse_apart``
        (started at the first read, started again if it died or hung), else here. Where no
        worker can start (no /dev/shm for its semaphores, say) the reads are parsed here."""
        if not self.parse_apart:
            return parser(self._runner(command))
        with self._pool_lock:
            if self._pool is None:
                try:
                    # spawn, not fork: this process has threads, and a forked child inherits
                    # their locks in whatever state they were.
                    context = multiprocessing.get_context("spawn")
                    self._pool = ProcessPoolExecutor(
                        1,
                        mp_context=context,
                        initializer=exit_with_parent,
                        initargs=(os.getpid(),),
                    )
                except (OSError, ImportError) as exc:
                    log.warning("no Slurm parsing worker (%s): reads are parsed in process", exc)
                    self.parse_apart = False
            pool = self._pool
        if pool is None:
            return parser(self._runner(command))
        try:
            future = pool.submit(_read_parsed, self.env, list(command), self.timeout_s, parser)
            # the command has its own timeout inside; this one is for the worker itself
            return future.result(timeout=2 * self.timeout_s + 30)
        except (BrokenProcessPool, FutureTimeout) as exc:
            with self._pool_lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            if isinstance(exc, FutureTimeout):
                raise SlurmTimeoutError(
                    f"the Slurm parsing worker gave no answer for {' '.join(command)}: "
                    "a new one starts at the next read"
                ) from exc
            log.warning("the Slurm parsing worker died: parsing here this time, a new one next")
            return parser(self._runner(command))

    def _run(self, args: Sequence[str]) -> str:
        return run_slurm_command(self.env, args, self.timeout_s)


def exit_with_parent(parent_pid: int) -> None:
    """The parsing worker's initializer: the worker ends when ``parent_pid`` does, however it
    ends. A SIGKILLed service left its worker (about 185 MB) under PID 1 for good, and with
    it multiprocessing's resource tracker, which exits only once every holder of its pipe
    (the worker too) is gone. Not PR_SET_PDEATHSIG: that fires when the *thread* that
    started the worker ends, and a worker can be (re)started from a connection's thread."""
    threading.Thread(
        target=_exit_when_gone, args=(parent_pid,), name="parent-watch", daemon=True
    ).start()


def _exit_when_gone(parent_pid: int) -> None:
    """Wait for ``parent_pid`` to end (its pidfd becomes readable; where pidfds are missing,
    look at the parent pid every second), then end this process at once."""
    try:
        pidfd: int | None = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):
        pidfd = None
    if os.getppid() == parent_pid:  # after the open: a parent gone before it is seen here
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
    os._exit(0)


def _read_parsed(
    env: Mapping[str, str], command: Sequence[str], timeout_s: float, parser: Parser
) -> Any:
    """The parsing worker's task (module level, so it pickles by name)."""
    return parser(run_slurm_command(env, command, timeout_s))


def run_slurm_command(env: Mapping[str, str], args: Sequence[str], timeout_s: float) -> str:
    """A Slurm client command's output; its failure as one :class:`SlurmQueryError` line."""
    conf = env.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        raise SlurmQueryError(
            f"SLURM_CONF={conf} does not exist: point it (or --slurm-conf) at the "
            "cluster's slurm.conf"
        )
    try:
        proc = subprocess.run(
            list(args),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SlurmQueryError(
            f"{args[0]} not found: install the Slurm client tools (slurm-client)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmTimeoutError(
            f"{' '.join(args)} gave no answer within {timeout_s:g} s: is slurmctld up "
            "and SLURM_CONF right?"
        ) from exc
    if proc.returncode != 0:
        raise SlurmQueryError(
            f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
        )
    return proc.stdout


# -- parsers (pure) ---------------------------------------------------------------------------
def _load(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmQueryError(f"{what} did not print JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise SlurmQueryError(f"{what} printed JSON that is not an object")
    errors = data.get("errors") or []
    if errors:
        raise SlurmQueryError(f"{what} reported errors: {errors}")
    return data


def _split_state(state: str) -> tuple[str, tuple[str, ...]]:
    """``IDLE+DRAIN`` / ``down*`` -> (``idle``/``down``, flags)."""
    parts = state.strip().split("+")
    base = parts[0]
    flags = [p.upper() for p in parts[1:]]
    if base.endswith("*"):
        base = base[:-1]
        flags.append("NOT_RESPONDING")
    return base.lower(), tuple(flags)


def _words(text: str | Sequence[str] | None) -> tuple[str, ...]:
    if isinstance(text, list | tuple):  # 24.11: already a list
        return tuple(str(w) for w in text if w)
    if not isinstance(text, str) or text.strip().lower() in ("(null)", "n/a"):
        return ()
    return tuple(w for w in text.split(",") if w)


def _state_text(value: object) -> str:
    """A state as 22.05 prints it (``idle``) or as 24.11 does (``["IDLE", "DRAIN"]``) ->
    ``IDLE+DRAIN`` style text."""
    if isinstance(value, list | tuple):
        return "+".join(str(v) for v in value)
    return str(value or "")


def flat_job_json(job: Mapping[str, Any]) -> dict[str, Any]:
    """One ``squeue --json`` job with 24.11's shapes made 22.05's, for code that reads the raw
    JSON: the state list becomes its base state (``["PENDING", "REQUEUED"]`` -> ``PENDING``),
    ``{"set": true, "number": N}`` becomes N (None when not set)."""
    out = dict(job)
    for key, value in job.items():
        if key == "job_state" and isinstance(value, list | tuple):
            out[key] = str(value[0]) if value else ""
        elif isinstance(value, dict) and "set" in value and "number" in value:
            out[key] = value["number"] if value["set"] else None
    return out


def _number(value: object) -> int:
    """A number as 22.05 prints it (``5``) or as 24.11 does (``{"set": true, "number": 5}``)."""
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set", True) else 0
    return int(value or 0)  # type: ignore[call-overload]


_NO_VAL = 4294967294
_INFINITE = 4294967295


def _time_limit_s(value: object) -> float | None:
    """A time limit in minutes (22.05: ``60``, 4294967295 for INFINITE; 24.11: ``{"set": true,
    "infinite": false, "number": 60}``) -> seconds, ``inf`` for UNLIMITED, None when unset."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return math.inf
        if not value.get("set", True):
            return None
        value = value.get("number")
    try:
        minutes = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    if minutes == _INFINITE:
        return math.inf
    return None if minutes <= 0 or minutes == _NO_VAL else minutes * 60.0


def _epoch(value: object) -> float | None:
    """An epoch time as 22.05 (``1700000000``) or 24.11 (``{"set": true, "number": ...}``)
    prints it; None for unset or 0."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    try:
        seconds = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return float(seconds) if 0 < seconds < _NO_VAL else None


def parse_sinfo_json(text: str) -> list[NodeState]:
    """``sinfo --json`` (22.05, openapi v0.0.38) or ``scontrol show nodes --json`` (23.02 and
    later; 24.11's data_parser v0.0.42) -> one NodeState per node."""
    out: dict[str, NodeState] = {}
    data = _load(text, "node JSON")
    if "nodes" not in data and "sinfo" in data:
        # 23.11+ sinfo groups nodes like its table: not per node (the caller falls back)
        raise SlurmQueryError("sinfo --json of this release lists node groups, not nodes")
    for n in data.get("nodes", []):
        base, flags = _split_state(_state_text(n.get("state")))
        flags += tuple(str(f).upper() for f in n.get("state_flags") or () if f not in flags)
        out.setdefault(
            n["name"],
            NodeState(
                name=n["name"],
                state=base,
                flags=flags,
                features=_words(n.get("active_features") or n.get("features")),
                partitions=tuple(n.get("partitions") or ()),
                gres=parse_gres(n.get("gres")),
                gres_used=parse_gres(n.get("gres_used")),
                reason=n.get("reason") or "",
            ),
        )
    return list(out.values())


def parse_scontrol_nodes(text: str) -> list[NodeState]:
    """``scontrol show node -o -d`` (one node per line) -> NodeStates."""
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv = parse_key_values(line)
        base, flags = _split_state(kv.get("State", ""))
        nodes.append(
            NodeState(
                name=kv["NodeName"],
                state=base,
                flags=flags,
                features=_words(kv.get("ActiveFeatures") or kv.get("AvailableFeatures")),
                partitions=_words(kv.get("Partitions")),
                gres=parse_gres(kv.get("Gres")),
                gres_used=parse_gres(kv.get("GresUsed")),
                reason=kv.get("Reason", ""),
            )
        )
    return nodes


#: ``squeue -O`` fields of the brief job read, each written by Slurm or checked by it at submit
#: (none a user can fill with free text), so a ``|`` after each cannot be forged into a column;
#: the admin comment, last, is written by the advisor and admins only and may hold blanks.
BRIEF_FIELDS = (
    "JobID",
    "State",
    "UserName",
    "Partition",
    "NodeList",
    "PriorityLong",
    "Reason",
    "tres-per-node",
    "tres-per-job",
    "TimeLimit",
    "EndTime",
    "admin_comment",
)
BRIEF_FORMAT = ",".join(f"{name}:|" for name in BRIEF_FIELDS[:-1]) + f",{BRIEF_FIELDS[-1]}:0"
_EMPTY = frozenset({"", "N/A", "(null)"})


def _brief_text(value: str) -> str:
    return "" if value in _EMPTY else value


def _brief_limit(value: str) -> float | None:
    """squeue's ``TimeLimit`` column (``UNLIMITED``, ``1-00:00:00``, ``1:00:00``, ``30:00``)."""
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if (
        not all(p.isdigit() for p in parts)
        or not 1 <= len(parts) <= 3
        or not (days == "" or days.isdigit())
    ):
        return None
    while len(parts) < 3:
        parts.insert(0, "0")
    hours, minutes, seconds = (int(p) for p in parts)
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return float(total) if total > 0 else None


def _brief_time(value: str) -> float | None:
    """squeue's ``EndTime`` column: the controller's local time (``2026-11-26T14:00:00``)."""
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def parse_squeue_brief(text: str) -> list[JobState]:
    """``squeue --noheader -O BRIEF_FORMAT`` (22.05 and 24.11 print it alike; TRES as
    ``gres:`` or ``gres/``) -> JobStates without GPU indices or user-written fields. A line
    that does not read as a job is skipped (logged): one odd job must not cost the read."""
    jobs = []
    columns = len(BRIEF_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", columns - 1)
        try:
            if len(parts) != columns:
                raise ValueError(f"{len(parts)} columns, not {columns}")
            (job_id, state, user, partition, nodes, priority, reason, per_node, per_job) = parts[:9]
            limit, end = parts[9:11]
            nodes = _brief_text(nodes)
            jobs.append(
                JobState(
                    job_id=int(job_id),
                    state=state.split("+")[0].upper(),
                    user=user,
                    partition=_brief_text(partition),
                    nodes=tuple(expand(nodes)) if nodes else (),
                    priority=int(priority) if priority.isdigit() else 0,
                    reason=reason,
                    tres_per_node=parse_gres(_brief_text(per_node)),
                    tres_per_job=parse_gres(_brief_text(per_job)),
                    admin_comment=_brief_text(parts[-1]),
                    time_limit_s=_brief_limit(limit),
                    end_time=_brief_time(end),
                )
            )
        except ValueError as exc:
            log.warning("squeue line left out (%s): %r", exc, line[:200])
    return jobs


def parse_squeue_json(text: str) -> list[JobState]:
    """``squeue --json`` (22.05 or 24.11) -> JobStates; every job slurmctld knows (22.05
    ignores squeue's filters; this reader never passes any)."""
    jobs = []
    for j in _load(text, "squeue --json").get("jobs", []):
        nodes = tuple(expand(j["nodes"])) if j.get("nodes") else ()
        detail = j.get("gres_detail") or []
        allocated = {node: parse_gres(d) for node, d in zip(nodes, detail, strict=False) if d}
        jobs.append(
            JobState(
                job_id=int(j["job_id"]),
                # 24.11 lists the state and its flags: ["PENDING", "REQUEUED"]; base first.
                state=_state_text(j.get("job_state")).split("+")[0].upper(),
                user=j.get("user_name") or str(j.get("user_id", "")),
                partition=j.get("partition") or "",
                nodes=nodes,
                name=j.get("name") or "",
                priority=_number(j.get("priority")),
                reason=j.get("state_reason") or "",
                tres_per_node=parse_gres(j.get("tres_per_node")),
                tres_per_job=parse_gres(j.get("tres_per_job")),
                required_nodes=tuple(expand(j["required_nodes"]))
                if j.get("required_nodes")
                else (),
                features=j.get("features") or "",
                comment=j.get("comment") or "",
                admin_comment=j.get("admin_comment") or "",
                allocated_gres=allocated,
                time_limit_s=_time_limit_s(j.get("time_limit")),
                end_time=_epoch(j.get("end_time")),
            )
        )
    return jobs
