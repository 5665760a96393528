"""Slurm through pyslurm (libslurm in the advisor's own process), and the choice of backend.

Why: every CLI read or write is a process that loads slurm.conf, its plugins and a munge
credential; pyslurm makes the same RPCs from inside the service, so a re-planning round's
updates cost one RPC each and no process.

Which pyslurm: a pyslurm release builds only against the Slurm release it names (its setup.py
refuses any other ``SLURM_VERSION_NUMBER`` major.minor). PyPI has pyslurm 25.11.x (and releases
from 2017/2018); the 22.05 and 24.11 branches are GitHub-only. Debian ships libslurm 22.05
(bookworm), 24.11.5 (trixie) and 26.05.5 (forky, sid): no suite ships 25.11, so no pyslurm
from PyPI builds against a Debian libslurm (checked 2026-11-24). This module is therefore
written against pyslurm 25.11.2's API as its source defines it (``pyslurm/core/job/job.pyx``,
``core/job/submission.pyx``, ``core/node.pyx``, ``core/partition.pyx``) and tested at that
boundary with objects of those shapes (``tests/test_pyslurm_backend.py``), never against a
real libslurm.

What pyslurm's ``Job.modify`` cannot say: it leaves empty strings unset (``cstr.fmalloc``
skips them), so it cannot clear a field (``ExcNodeList=``, ``TresPerNode=``), and it sets the
node count only at submission. Those steps go through ``scontrol`` (one process each).

The choice (``advisor.slurm_backend``): ``cli``; ``pyslurm`` (refused with one clear line when
pyslurm does not import or names another Slurm release than the running one); ``auto``:
pyslurm when it imports and its release matches ``scontrol --version``, else cli, logged with
the reason.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from slurm_pal.adapters.slurm.parse import Gres, parse_gres
from slurm_pal.adapters.slurm.release import SlurmRelease, detect_release, parse_release
from slurm_pal.adapters.slurm.state import (
    CliStateReader,
    JobState,
    NodeState,
    SlurmQueryError,
    SlurmStateReader,
    _split_state,
)
from slurm_pal.adapters.slurm.update import (
    JobApplier,
    JobChange,
    ScontrolBatchApplier,
    scontrol_steps,
    transition_problem,
)
from slurm_pal.core.hostlist import expand
from slurm_pal.errors import SlurmPalError

__all__ = [
    "BackendChoice",
    "BackendError",
    "PyslurmApplier",
    "PyslurmStateReader",
    "choose_backend",
    "pyslurm_release",
    "running_release",
]


class BackendError(SlurmPalError, RuntimeError):
    """The configured Slurm backend cannot be used here; the message says why."""


def running_release(env: Mapping[str, str] | None = None) -> SlurmRelease | None:
    """The release of this host's scontrol (and so of its libslurm): ``scontrol --version``,
    which needs SLURM_CONF to start; None when it cannot be run or read."""

    def run(args: Sequence[str]) -> str:
        try:
            proc = subprocess.run(
                list(args),
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise OSError(str(exc)) from exc
        return proc.stdout if proc.returncode == 0 else ""

    return detect_release(run)


def pyslurm_release(module: ModuleType) -> SlurmRelease | None:
    """The Slurm release a pyslurm build is for: its version (``25.11.2`` is for 25.11)."""
    version = str(getattr(module, "__version__", "")).strip()
    return parse_release(f"slurm {version}") if version else None


# -- reading ----------------------------------------------------------------------------------
def _gres_text(value: Any) -> str:
    """pyslurm's GRES forms -> a Slurm GRES string :func:`parse_gres` reads.

    ``cstr.to_gres_dict``: ``{"gpu:ta": 2}`` or, with indices, ``{"gpu:ta": {"count": 1,
    "indexes": "0,2"}}``; ``TrackableResources``: ``.gres`` maps names to objects with
    ``name``/``count``; a plain string passes through."""
    if not value:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        items = []
        for name, v in value.items():
            if isinstance(v, Mapping):
                items.append(f"{name}:{int(v.get('count', 1))}(IDX:{v.get('indexes', '')})")
            else:
                items.append(f"{name}:{int(v)}")
        return ",".join(items)
    gres = getattr(value, "gres", None)
    if gres:
        return ",".join(f"{g.name}:{int(g.count)}" for g in gres.values())
    return ""


def _words(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return tuple(w for w in value.split(",") if w)
    return tuple(str(w) for w in value)


def _nodes(hostlist: str | None) -> tuple[str, ...]:
    return tuple(expand(hostlist)) if hostlist and hostlist != "(null)" else ()


class PyslurmStateReader:
    """:class:`SlurmStateReader` over pyslurm's ``Jobs.load`` / ``Nodes.load``.

    pyslurm's ``Node`` gives a node's allocated GRES without device indices, so a node's used
    GPUs (which indices) are the union of its running jobs' ``gres_detail`` (the same source
    slurmctld builds ``GresUsed`` from)."""

    def __init__(self, module: ModuleType) -> None:
        self.pyslurm = module

    def _load(self, what: str, load: Callable[[], Any]) -> Any:
        try:
            return load()
        except self.pyslurm.RPCError as exc:
            raise SlurmQueryError(f"pyslurm {what}: {exc}") from exc

    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        states: Iterable[str] | None = None,
        users: Iterable[str] | None = None,
    ) -> list[JobState]:
        loaded = self._load("Jobs.load", self.pyslurm.Jobs.load)
        ids = None if job_ids is None else {int(j) for j in job_ids}
        st = None if states is None else {s.upper() for s in states}
        us = None if users is None else set(users)
        out = []
        for job in loaded.values():
            state = job_state(job)
            if (
                (ids is None or state.job_id in ids)
                and (st is None or state.state in st)
                and (us is None or state.user in us)
            ):
                out.append(state)
        return out

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeState]:
        loaded = self._load("Nodes.load", self.pyslurm.Nodes.load)
        used: dict[str, list[Gres]] = {}
        for job in self.jobs(states=["RUNNING", "SUSPENDED", "COMPLETING"]):
            for node, gres in job.allocated_gres.items():
                used.setdefault(node, []).extend(gres)
        wanted = None if names is None else set(names)
        out = []
        for node in loaded.values():
            if wanted is not None and node.name not in wanted:
                continue
            base, flags = _split_state(str(node.state or ""))
            out.append(
                NodeState(
                    name=node.name,
                    state=base,
                    flags=flags,
                    features=_words(node.active_features or node.available_features),
                    partitions=_words(node.partitions),
                    gres=parse_gres(_gres_text(node.configured_gres)),
                    gres_used=tuple(used.get(node.name, ())),
                    reason=node.reason or "",
                )
            )
        return out

    def default_partition(self) -> str | None:
        """The partition flagged Default (``Partition.is_default``), None when none is."""
        loaded = self._load("Partitions.load", self.pyslurm.Partitions.load)
        for part in loaded.values():
            if part.is_default:
                return str(part.name)
        return None


def job_state(job: Any) -> JobState:
    """One pyslurm ``Job`` -> JobState (the fields :class:`CliStateReader` reads from squeue)."""
    nodes = _nodes(job.allocated_nodes)
    allocated: dict[str, tuple[Gres, ...]] = {}
    if nodes and str(job.state).upper() != "PENDING":
        layout = job.get_resource_layout_per_node() or {}
        for node, detail in layout.items():
            gres = parse_gres(_gres_text(detail.get("gres")))
            if gres:
                allocated[node] = gres
    return JobState(
        job_id=int(job.id),
        state=str(job.state).upper(),
        user=job.user_name or str(job.user_id),
        partition=job.partition or "",
        nodes=nodes,
        name=job.name or "",
        priority=int(job.priority or 0),
        reason=job.state_reason or "",
        tres_per_node=parse_gres(_gres_text(job.gres_per_node)),
        tres_per_job=parse_gres(_gres_text(job.tres_per_job)),
        required_nodes=_nodes(job.required_nodes),
        features=job.constraints or "",
        comment=job.comment or "",
        admin_comment=job.admin_comment or "",
        allocated_gres=allocated,
        time_limit_s=_limit_s(getattr(job, "time_limit", None)),
        end_time=_when(getattr(job, "end_time", None)),
    )


def _limit_s(minutes: object) -> float | None:
    """pyslurm's ``Job.time_limit``: minutes, or None/"UNLIMITED" for none."""
    if isinstance(minutes, int | float) and minutes > 0:
        return float(minutes) * 60.0
    return math.inf if str(minutes).upper() in ("UNLIMITED", "INFINITE") else None


def _when(epoch: object) -> float | None:
    """pyslurm's epoch seconds (None or 0: unset)."""
    return float(epoch) if isinstance(epoch, int | float) and epoch > 0 else None


# -- writing ----------------------------------------------------------------------------------
# scontrol keyword -> JobSubmitDescription attribute (submission.pyx, _create_job_submit_desc:
# gres_per_node -> tres_per_node, gpus -> tres_per_job, both through cstr.from_gres_dict, which
# takes "gres:gpu:T:n" strings).
_DESC_KEYS = {
    "ReqNodeList": "required_nodes",
    "ExcNodeList": "excluded_nodes",
    "TresPerNode": "gres_per_node",
    "TresPerJob": "gpus",
    "AdminComment": "admin_comment",
}


def modify_kwargs(step: Sequence[str]) -> dict[str, str] | None:
    """An ``update JobId=N K=V ...`` step as ``JobSubmitDescription`` keywords, or None when
    pyslurm's update cannot express it (an empty value clears a field; NumNodes)."""
    out = {}
    for word in step[2:]:
        key, _, value = word.partition("=")
        attr = _DESC_KEYS.get(key)
        if attr is None or not value:
            return None
        out[attr] = value
    return out


class PyslurmApplier:
    """:class:`~slurm_pal.adapters.slurm.update.JobApplier` through ``Job(id).modify``: a
    round's updates are RPCs from this process, one after another (slurmctld serializes job
    updates anyway); steps pyslurm cannot express go to ``fallback`` (scontrol)."""

    def __init__(
        self,
        module: ModuleType,
        fallback: ScontrolBatchApplier,
        release: SlurmRelease | None = None,
    ) -> None:
        self.pyslurm = module
        self.fallback = fallback
        self.release = release if release is not None else pyslurm_release(module)

    def apply(self, change: JobChange) -> str | None:
        problem = transition_problem(change, self.release)
        if problem is not None:
            return problem
        for step in scontrol_steps(change, self.release):
            kwargs = modify_kwargs(step)
            if kwargs is None:
                error = self.fallback.apply_step(step)
            else:
                error = self._modify(change.job_id, kwargs)
            if error is not None:
                return error
        return None

    def apply_many(self, changes: Sequence[JobChange]) -> list[str | None]:
        return [self.apply(change) for change in changes]

    def _modify(self, job_id: int, kwargs: Mapping[str, str]) -> str | None:
        try:
            self.pyslurm.Job(job_id).modify(self.pyslurm.JobSubmitDescription(**kwargs))
        except self.pyslurm.RPCError as exc:
            fields = " ".join(f"{k}={v}" for k, v in kwargs.items())
            return f"pyslurm modify job {job_id} {fields}: {exc}"
        return None


# -- choice ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BackendChoice:
    """The reader and applier the service uses, and why."""

    name: str  # cli | pyslurm
    reader: SlurmStateReader
    applier: JobApplier
    why: str


def _import_pyslurm() -> ModuleType:
    return importlib.import_module("pyslurm")


def choose_backend(
    setting: str,
    env: Mapping[str, str] | None = None,
    *,
    import_pyslurm: Callable[[], ModuleType] = _import_pyslurm,
    release: Callable[[Mapping[str, str] | None], SlurmRelease | None] = running_release,
    brief_jobs: bool = False,
) -> BackendChoice:
    """The backend ``advisor.slurm_backend`` asks for (see the module docstring);
    ``brief_jobs``: the cli reader reads jobs with ``squeue -O`` (``advisor.slurm_job_read``)."""
    env = dict(os.environ if env is None else env)
    cli_applier = ScontrolBatchApplier(env)
    if setting == "cli":
        return BackendChoice(
            "cli",
            CliStateReader(env, parse_apart=True, brief_jobs=brief_jobs),
            cli_applier,
            "advisor.slurm_backend = cli",
        )
    try:
        module = import_pyslurm()
    except Exception as exc:  # ImportError, or libslurm missing/mismatched at load (OSError)
        problem: str | None = f"pyslurm does not import ({type(exc).__name__}: {exc})"
        module = None
    else:
        assert module is not None
        wanted, running = pyslurm_release(module), release(env)
        if running is None:
            problem = "the running Slurm release is unknown (scontrol --version failed)"
        elif wanted is None or wanted.series != running.series:
            series = "an unknown release" if wanted is None else wanted.series
            problem = f"pyslurm {module.__version__} is for Slurm {series}, this is Slurm {running}"
        else:
            problem = None
    if problem is None and module is not None:
        why = f"pyslurm {module.__version__} matches Slurm {running}"
        return BackendChoice(
            "pyslurm", PyslurmStateReader(module), PyslurmApplier(module, cli_applier), why
        )
    if setting == "pyslurm":
        raise BackendError(
            f"advisor.slurm_backend = pyslurm, but {problem}; use auto or cli "
            "(docs/admin.md, 'Slurm backends')"
        )
    return BackendChoice(
        "cli",
        CliStateReader(env, parse_apart=True, brief_jobs=brief_jobs),
        cli_applier,
        f"auto: {problem}",
    )
