"""Re-measuring suspect GPUs: which suspect (GPU, class) pairs to benchmark now, what a result
says, and the campaign increment a confirmed result makes. Pure: the service's driver
(``advisor/remeasure.py``) submits the jobs and reads the results.

A suspicion (core/suspicion.py) is an inference from ordinary jobs; the campaign's benchmark
for the class, run alone on the GPU, settles it. The service (``advisor/remeasure.py``) and the
simulator (``sim/loop.py``) both decide here, so what the simulator measures is what the
service would do. The planner is opt-in and rate-limited: at most ``per_hour`` submissions in
any hour, one in flight per GPU, only on GPUs the caller sees idle with their label-mates
(:func:`idle_pins`: Slurm allocates GPUs by gres type and count, never by index, so the job
asks for every GPU of the suspect's label on its node; the node's other GPUs stay with other
jobs), and a (GPU, class) tried at most once per ``retry_s`` whatever came of it. The verdict
compares the new run with the same GPU's own run in the campaign (same benchmark): ``slower``
times that or more confirms. A GPU a re-measurement found slow is measured again now and then
(after every suspect): back to ``1 / slower`` of its (slow) campaign time or less, it
recovered. A GPU found slow for one class is measured for each of its other classes too (after
the suspects): a fault that slows compute-bound jobs 2x often slows the next class 1.5x, and
runtime evidence for that class comes slowly (few of its jobs, each felt less), so without the
benchmark its jobs kept landing on a GPU known to be faulty. Last, with budget left, GPUs not
measured for ``routine_s`` are measured routinely for the first class (:func:`routine`): a
fault that slows a GPU without a clock reason NVML shows is otherwise found only from the
runtimes of the jobs that land on it, and a GPU few jobs used, or only wide gangs, stayed
unseen until its repair.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import pandas as pd

__all__ = [
    "CLEARED",
    "CONFIRMED",
    "Attempt",
    "Pin",
    "RemeasureLimits",
    "Settlement",
    "Verdict",
    "Wanted",
    "base_campaign",
    "budget_left",
    "idle_pins",
    "increment_id",
    "increment_rows",
    "last_settled",
    "recovered",
    "routine",
    "same_campaign",
    "settlements",
    "to_remeasure",
    "unsettled",
    "verdict",
    "wanted",
]

HOUR_S = 3600.0

CONFIRMED = "confirmed by re-measurement"
"""How a suspicion row a re-measurement found slow is closed (the start of its ``cleared_why``)."""
CLEARED = "cleared by re-measurement"
"""How a suspicion row a re-measurement found healthy is closed."""


@dataclass(frozen=True)
class RemeasureLimits:
    """How often the service may benchmark suspects (``advisor.remeasure_*``)."""

    per_hour: int = 2
    retry_s: float = 86400.0
    slower: float = 1.15
    routine_s: float = 604800.0
    """A GPU not measured for the first class for this long is measured with budget left
    (:func:`routine`; 0: only suspects and the GPUs found slow)."""

    @classmethod
    def of(cls, advisor: _AdvisorLimits) -> RemeasureLimits:
        """The site config's ``advisor.remeasure_*`` (the service's and the simulator's)."""
        return cls(
            advisor.remeasure_per_hour,
            advisor.remeasure_retry_s,
            advisor.remeasure_slower,
            advisor.remeasure_routine_s,
        )


class _AdvisorLimits(Protocol):
    @property
    def remeasure_per_hour(self) -> int: ...
    @property
    def remeasure_retry_s(self) -> float: ...
    @property
    def remeasure_slower(self) -> float: ...
    @property
    def remeasure_routine_s(self) -> float: ...


class _Suspect(Protocol):
    @property
    def gpu(self) -> str: ...
    @property
    def job_class(self) -> str: ...
    @property
    def since_s(self) -> float: ...


S = TypeVar("S", bound=_Suspect)


@dataclass(frozen=True)
class Attempt:
    """One re-measurement submitted at ``submitted_s``; ``done`` once its result is judged or
    it is given up."""

    gpu: str
    job_class: str
    node: str
    submitted_s: float
    done: bool = False
    held: tuple[str, ...] = ()  # the GPUs its job holds (its pin's); none said: ``gpu`` alone


@dataclass(frozen=True)
class Pin:
    """What a re-measure job of a GPU holds: on its ``node``, every GPU of its gres ``label``
    there (``gpus``, itself included; ``--gres=gpu:<label>:<len(gpus)>``). Slurm cannot be
    asked for one GPU by index, but a request for all the label's GPUs of the node can only be
    granted with the suspect among them; the label-mates stay unused for the benchmark's few
    minutes, and the node's GPUs of other labels stay with other jobs."""

    node: str
    label: str
    gpus: tuple[str, ...]


def idle_pins(gpus: Iterable[tuple[str, str, str]], free: Collection[str]) -> dict[str, Pin]:
    """GPU -> its :class:`Pin`, for the GPUs that can be measured now: the GPU and every GPU
    of its label on its node are ``free``. ``gpus``: (GPU, node, label) of every GPU (the
    service's labels.json; the simulator's labels, made by the same rule as the site's)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for gpu, node, label in gpus:
        groups.setdefault((node, label), []).append(gpu)
    out: dict[str, Pin] = {}
    for (node, label), members in groups.items():
        if all(g in free for g in members):
            pin = Pin(node, label, tuple(members))
            out |= dict.fromkeys(members, pin)
    return out


@dataclass(frozen=True)
class Wanted:
    """A suspect (GPU, class) and when it became suspect (oldest first is measured first);
    ``other_class``: a class of a GPU a re-measurement found slow for another class (since
    then; after every suspect); ``recheck``: a (GPU, class) a re-measurement found slow,
    measured again to see whether it recovered (after those); ``routine``: a GPU not
    measured for the class since ``since_s`` (last)."""

    gpu: str
    job_class: str
    since_s: float
    recheck: bool = False
    other_class: bool = False
    routine: bool = False

    @property
    def why(self) -> str:
        """Why it is measured, for the admin's log and the suspicion row."""
        if self.recheck:
            return "found slow, to see it recover,"
        if self.routine:
            return "not measured for a while, measured routinely"
        return "found slow for another class, measured" if self.other_class else "suspect"


def wanted(
    suspects: Iterable[_Suspect],
    confirmed: Mapping[tuple[str, str], float],
    scores: Mapping[str, Mapping[str, float]],
    now_s: float,
    limits: RemeasureLimits,
    settled: Mapping[tuple[str, str], float] | None = None,
    campaign: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Wanted]:
    """What :func:`to_remeasure` chooses from: every suspect; then, for each (GPU, class) a
    re-measurement confirmed slow (``confirmed``: -> when) whose active score for the class
    (``scores``: GPU -> class -> score) still says so (``slower`` times its ``campaign`` score
    or more: the campaign the re-measurements increment; without it, ``slower`` or more), each
    other class of the GPU not found slow itself that no re-measurement has confirmed or
    settled (``settled``: -> when, e.g. cleared) since; then each of those confirmed pairs
    ``retry_s`` after the
    confirmation, measured again to see it recover (a suspect pair is measured as a
    suspect)."""
    out = [Wanted(s.gpu, s.job_class, s.since_s) for s in suspects]
    taken = {(w.gpu, w.job_class) for w in out}

    def still_slow(gpu: str, job_class: str) -> bool:
        was = 1.0 if campaign is None else campaign.get(gpu, {}).get(job_class, 1.0)
        return scores.get(gpu, {}).get(job_class, 0.0) >= limits.slower * was

    slow = [
        (gpu, job_class, at)
        for (gpu, job_class), at in sorted(confirmed.items())
        if still_slow(gpu, job_class)
    ]
    settled = settled or {}
    still = {(gpu, job_class) for gpu, job_class, _ in slow}
    for gpu, _, at in slow:
        for other in sorted(scores.get(gpu, {})):
            key = (gpu, other)
            if key in taken or key in still:
                continue
            if max(confirmed.get(key, -math.inf), settled.get(key, -math.inf)) >= at:
                continue
            taken.add(key)
            out.append(Wanted(gpu, other, at, other_class=True))
    out += [
        Wanted(gpu, job_class, at, recheck=True)
        for gpu, job_class, at in slow
        if (gpu, job_class) not in taken and now_s - at >= limits.retry_s
    ]
    return out


def routine(
    gpus: Iterable[str],
    job_class: str,
    measured: Mapping[tuple[str, str], float],
    campaign_s: float,
    now_s: float,
    limits: RemeasureLimits,
) -> list[Wanted]:
    """The ``gpus`` (those idle now) whose last measurement for ``job_class`` (``measured``:
    (GPU, class) -> when; never re-measured: the campaign's, ``campaign_s``) is ``routine_s``
    old or older: what :func:`to_remeasure` takes after everything else, oldest first. The
    first class in the site's order is the one a slow GPU costs most; a GPU found slow for it
    is then measured for its other classes (:func:`wanted`)."""
    if not limits.routine_s > 0:
        return []
    out = []
    for gpu in gpus:
        last = measured.get((gpu, job_class), campaign_s)
        if now_s - last >= limits.routine_s:
            out.append(Wanted(gpu, job_class, last, routine=True))
    return out


def budget_left(attempts: Sequence[Attempt], now_s: float, limits: RemeasureLimits) -> int:
    """How many re-measures may be submitted now: ``per_hour`` less those of the last hour."""
    recent = sum(1 for a in attempts if now_s - a.submitted_s < HOUR_S)
    return max(0, limits.per_hour - recent)


@dataclass(frozen=True)
class Settlement:
    """A re-measurement's verdict on (GPU, class) at ``at_s``: ``confirmed`` slow, or healthy."""

    gpu: str
    job_class: str
    at_s: float
    confirmed: bool
    why: str


def settlements(rows: Iterable[Mapping[str, object]]) -> list[Settlement]:
    """The verdicts among the store's suspicion rows (``Store.suspicions(cleared=True)``: the
    rows a re-measurement closed, by the start of their ``cleared_why``), oldest first: what a
    restarted service must know again, or it shows and steers by a suspicion it had settled."""
    out = []
    for row in rows:
        why = str(row.get("cleared_why") or "")
        at = row.get("cleared_s")
        if not isinstance(at, int | float) or not why.startswith((CONFIRMED, CLEARED)):
            continue
        out.append(
            Settlement(
                str(row["gpu"]), str(row["job_class"]), float(at), why.startswith(CONFIRMED), why
            )
        )
    return sorted(out, key=lambda s: s.at_s)


def last_settled(
    found: Iterable[Settlement], confirmed: bool | None = None
) -> dict[tuple[str, str], float]:
    """(GPU, class) -> when a re-measurement last settled it (``confirmed``: only the verdicts
    that found it slow, True, or healthy, False; None: either)."""
    out: dict[tuple[str, str], float] = {}
    for s in found:
        if confirmed is None or s.confirmed == confirmed:
            key = (s.gpu, s.job_class)
            out[key] = max(s.at_s, out.get(key, s.at_s))
    return out


def unsettled(found: Iterable[S], settled: Mapping[tuple[str, str], float]) -> list[S]:
    """``found`` less the suspicions a re-measurement cleared (``settled``: (GPU, class) -> when):
    one raised before it is not shown nor steered by, a later one is."""
    return [s for s in found if s.since_s > settled.get((s.gpu, s.job_class), -math.inf)]


def to_remeasure(
    suspects: Iterable[Wanted],
    idle: Mapping[str, Pin],
    attempts: Sequence[Attempt],
    now_s: float,
    limits: RemeasureLimits,
) -> list[Wanted]:
    """The pairs to benchmark now: suspects, oldest suspicion first, then other classes of GPUs
    found slow, then rechecks, then routine measurements (:class:`Wanted`). ``idle``: GPU ->
    its pin, for the GPUs that can be measured now (:func:`idle_pins`); ``attempts``: what was
    submitted before (in flight unless ``done``). A pick holds its whole pin, so no later pick
    in flight shares a GPU with it; picks on one node with different labels may run side by
    side (the node is shared with production jobs anyway)."""
    budget = budget_left(attempts, now_s, limits)
    busy = {g for a in attempts if not a.done for g in (a.held or (a.gpu,))}
    last: dict[tuple[str, str], float] = {}
    for a in attempts:
        key = (a.gpu, a.job_class)
        last[key] = max(last.get(key, a.submitted_s), a.submitted_s)
    out: list[Wanted] = []
    for s in sorted(
        suspects, key=lambda s: (s.routine, s.recheck, s.other_class, s.since_s, s.gpu, s.job_class)
    ):
        if len(out) >= budget:
            break
        pin = idle.get(s.gpu)
        tried = last.get((s.gpu, s.job_class))
        if pin is None or s.gpu in busy or not busy.isdisjoint(pin.gpus):
            continue
        if tried is not None and now_s - tried < limits.retry_s:
            continue
        out.append(s)
        busy.update(pin.gpus)
    return out


@dataclass(frozen=True)
class Verdict:
    """What a re-measurement says: ``confirmed`` (the GPU is slower than its campaign says)
    or cleared; ``ratio``: new run / the campaign's own run of the GPU."""

    confirmed: bool
    ratio: float
    why: str


def verdict(measured_s: float, campaign_s: float, slower: float) -> Verdict:
    """Judge a new benchmark time against the same GPU's time in the campaign."""
    if not (measured_s > 0 and campaign_s > 0):
        raise ValueError(f"durations must be > 0, got {measured_s} and {campaign_s}")
    ratio = measured_s / campaign_s
    if ratio >= slower:
        why = f"re-measured {ratio:.2f}x its campaign time ({measured_s:.3g}s/{campaign_s:.3g}s)"
        return Verdict(True, ratio, why)
    why = (
        f"re-measured {ratio:.2f}x its campaign time ({measured_s:.3g}s/{campaign_s:.3g}s), "
        f"under {slower:g}x: as the campaign says"
    )
    return Verdict(False, ratio, why)


def recovered(measured_s: float, campaign_s: float, slower: float) -> Verdict:
    """Judge a GPU a re-measurement found slow (its campaign time is that run's) measured
    again: ``confirmed`` when it is back, ``slower`` times faster or more."""
    if not (measured_s > 0 and campaign_s > 0):
        raise ValueError(f"durations must be > 0, got {measured_s} and {campaign_s}")
    ratio = measured_s / campaign_s
    times = f"{ratio:.2f}x its campaign time ({measured_s:.3g}s/{campaign_s:.3g}s)"
    if ratio * slower <= 1:
        return Verdict(True, ratio, f"re-measured {times}: recovered")
    return Verdict(False, ratio, f"re-measured {times}: still as slow")


_SUFFIX = re.compile(r"-r(\d+)$")


def base_campaign(campaign_id: str) -> str:
    """The campaign that ``campaign_id`` is an increment of (itself when it is none)."""
    return _SUFFIX.sub("", campaign_id)


def same_campaign(one: str, other: str) -> bool:
    """Whether two campaign ids are one campaign or its re-measure increments
    (:func:`increment_id`): the same measurements but for the GPUs re-measured."""
    return _SUFFIX.sub("", one) == _SUFFIX.sub("", other)


def increment_id(active: str, known: Iterable[str]) -> str:
    """The next increment of campaign ``active``: ``<base>-r<n>`` with ``n`` one past the
    highest known (a campaign id is at most 64 characters; the base is cut to fit)."""
    base = _SUFFIX.sub("", active)
    taken = {
        int(m.group(1)) for k in known if (m := _SUFFIX.search(k)) and _SUFFIX.sub("", k) == base
    }
    n = max(taken, default=0) + 1
    suffix = f"-r{n}"
    return base[: 64 - len(suffix)] + suffix


def increment_rows(
    measurements: pd.DataFrame, gpu: str, job_class: str, new_rows: pd.DataFrame
) -> pd.DataFrame:
    """The campaign's measurement rows with ``gpu``'s runs of ``job_class`` replaced by
    ``new_rows`` (same columns; the other GPUs and classes as they were)."""
    keep = ~((measurements["uuid"].astype(str) == gpu) & (measurements["job_class"] == job_class))
    return pd.concat([measurements[keep], new_rows[list(measurements.columns)]], ignore_index=True)
