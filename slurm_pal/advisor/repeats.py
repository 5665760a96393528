"""Answers kept for requests that repeat: a decision taken on the state as it is still is the
answer an identical request gets now, without deciding again.

Why: ``job_submit.lua`` waits for the decide inside slurmctld's locks, and a decide walks a few
hundred Python calls that go cold within milliseconds of rest (benchmarks/README, "The decide
in one process"): 1-2 ms a submission when submissions come apart. Sites submit the same
request over and over (a loop of ``sbatch job.sh $i``, a sweep through ``--export``: neither
argument reaches ``job_desc``), and once such a burst has filled the GPUs every one of them
is answered alike. An answer that took no GPUs (a pass, a hold) stays right for as long as
nothing it read changes. One that took GPUs changed what the next gets; deciding that next
answer ahead, right after sending this one, was tried and not kept: it spends a second decide's
CPU just when slurmctld, on the same cores, finishes the submission (the submitter waited
longer for its answer on a 2-core machine, though the service answered in half the time).

What "nothing it read changes" means is the caller's: it hands :meth:`RepeatAnswers.keep` and
:meth:`RepeatAnswers.take` the objects a decision reads (the view, the free GPUs, the
engine, ...), compared by identity, so a new Slurm read, a reload or a route taken from the
free GPUs makes every kept answer stale. Time is the one input that moves on its own: an
answer older than :data:`REPEAT_S` is decided again (a hold's weighed wait is against running
jobs' expected ends).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace

from slurm_pal.engine.advise import Advice

__all__ = ["KEPT_REQUESTS", "REPEAT_S", "Kept", "RepeatAnswers", "request_key"]

REPEAT_S = 1.0
"""How long a kept answer stays the answer: short against the view's own age (a Slurm read
every ``advisor.refresh_s``, 5 s shipped) and against what a hold weighs (jobs' remaining run
times)."""

KEPT_REQUESTS = 16
"""Distinct requests kept at once (several users' repeats interleaved); the oldest goes first."""


def request_key(wire: Mapping[str, object]) -> Hashable | None:
    """The request as a key (every field the plugin sent, so two keys are equal only for
    requests the decide cannot tell apart); None for one not to keep: a modification (it
    names its job) or a field that is not a plain value."""
    if wire.get("modify"):
        return None
    try:
        key = tuple(sorted(wire.items()))
        hash(key)
    except TypeError:
        return None
    return key


@dataclass(frozen=True)
class Kept:
    """An answer and what it was decided on."""

    inputs: tuple[object, ...]
    at: float
    advice: Advice

    def under_token(self, token: str) -> Advice:
        """The answer as a decision of its own (every taker gets a new token)."""
        return replace(self.advice, decision=self.advice.decision.with_token(token))


class RepeatAnswers:
    """The kept answers, by request (not thread-safe: the caller holds its lock)."""

    def __init__(self, repeat_s: float = REPEAT_S, size: int = KEPT_REQUESTS) -> None:
        self.repeat_s = repeat_s
        self.size = size
        self._kept: dict[Hashable, Kept] = {}

    def keep(
        self, key: Hashable | None, inputs: tuple[object, ...], now: float, advice: Advice
    ) -> None:
        """Keep ``advice`` for ``key``, decided on ``inputs`` at ``now``; answers kept on
        other inputs can never be taken again and go."""
        if key is None or self.repeat_s <= 0:
            return
        for stale in [k for k, kept in self._kept.items() if not _same(kept.inputs, inputs)]:
            del self._kept[stale]
        self._kept.pop(key, None)  # re-inserted last: the oldest is first to go
        self._kept[key] = Kept(inputs, now, advice)
        while len(self._kept) > self.size:
            del self._kept[next(iter(self._kept))]

    def take(self, key: Hashable | None, inputs: tuple[object, ...], now: float) -> Kept | None:
        """The answer kept for ``key`` if it was decided on ``inputs`` no more than
        ``repeat_s`` ago; None otherwise (decide again)."""
        if key is None:
            return None
        kept = self._kept.get(key)
        if kept is None:
            return None
        if not _same(kept.inputs, inputs) or now - kept.at > self.repeat_s:
            del self._kept[key]
            return None
        return kept


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
