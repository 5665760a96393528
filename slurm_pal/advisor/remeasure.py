"""Re-measuring suspect GPUs through Slurm (``advisor.remeasure``; off by default).

On the refresh thread, after each read (:meth:`Remeasurer.tick`): first the results of the
re-measure jobs in flight are judged, then the planner (:func:`~slurm_pal.core.remeasure.
to_remeasure`) picks the suspect (GPU, class) pairs to benchmark now, among the GPUs the view
shows free with their label-mates (:func:`idle_gpus`). Each becomes a one-GPU, one-class,
one-repeat campaign directory (the campaign machinery: ``new_plan``, ``create_campaign``, the
runner and the site's benchmark for the class) submitted as an ordinary job at low priority
(``--nice``), pinned to the GPU as closely as Slurm allows: on its node, every GPU of its gres
label there (``--gres=gpu:<label>:<k>``, labels.json's count), which must include it; the
runner measures that GPU alone (its device minor, checked against its Slurm number).

Sharing the node: a campaign task holds its whole node (``--exclusive``) so that nothing else
runs there while a GPU is measured. A re-measure does not: waiting for a wholly idle node
meant waiting for the end of the month's submissions at a busy site, while the suspicion
kept steering jobs (or, wrong, kept a GPU idle). What the neighbours' jobs can change is
small for the class benchmarks (GEMM and the STREAM triad run from the GPU's own memory after
a warm-up; the host's CPUs, memory and PCIe barely enter), but heat and the node's power
budget are shared, so a busy node can make a GPU a few percent slower than the campaign saw
it; the verdict's margin (``remeasure_slower``, 1.15x) is far above that, and what noise
remains leans towards confirming a suspicion, never towards clearing a real one. A confirmed
run becomes the GPU's score as measured among neighbours; a later recheck measures it again.
Its result is judged against the same GPU's runs of the class in the active campaign (same
benchmark):

- confirmed: a campaign increment (``<active>-r<n>``: the active campaign's measurements with
  that GPU's runs of the class replaced by the new run, binned as the active one was) is
  ingested and activated, the suspicion's row closed, and the service reloads: the GPU's new
  score is placement's, and ``campaign diff`` shows what changed;
- cleared: the suspicion's row is closed and the detector's suspicion set aside
  (:meth:`SuspectBook.settle`).

With budget left after the suspects, the GPUs found slow and their rechecks, a GPU idle now
and not measured for the first class for ``remeasure_routine_s`` (a week) is measured
routinely, and judged as a suspect is: with NVML blind to a fault, the runtimes of the jobs
that land on the GPU are the only other evidence, and a GPU few jobs use, or only wide gangs,
stayed unseen until its repair.

What is in flight lives in this object only: a restart forgets it (the jobs' results are not
judged). What a re-measurement settled is the store's: its closed row says so
(``cleared_why``), and the warm-up at start replays the runs with it
(:meth:`SuspectBook.fit <slurm_pal.advisor.suspects.SuspectBook.fit>`), so a suspicion it
settled is not raised again.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

import pandas as pd

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.store import Store
from slurm_pal.campaigns.planning import PlanRequest, SiteClasses, new_plan
from slurm_pal.campaigns.settings import CampaignSettings
from slurm_pal.campaigns.slurm import CampaignSlurm, SlurmCommands
from slurm_pal.campaigns.workspace import (
    COLLECTED_DIR,
    SBATCH_DIR,
    CampaignPlan,
    Submission,
    add_submission,
    campaigns_root,
    create_campaign,
    job_name,
    read_records,
)
from slurm_pal.core.binning import PMBinner
from slurm_pal.core.campaigns import CSV_COLUMNS, PlannedGpu, RunRecord, measurement_rows
from slurm_pal.core.labels import LabelEntry
from slurm_pal.core.remeasure import (
    CLEARED,
    CONFIRMED,
    Attempt,
    Pin,
    RemeasureLimits,
    Verdict,
    Wanted,
    base_campaign,
    budget_left,
    idle_pins,
    increment_id,
    increment_rows,
    last_settled,
    recovered,
    routine,
    settlements,
    to_remeasure,
    verdict,
    wanted,
)

if TYPE_CHECKING:
    from slurm_pal.advisor.state import AdvisorState
    from slurm_pal.advisor.view import View

__all__ = ["NICE", "Flight", "Remeasurer", "idle_gpus"]

log = logging.getLogger("slurm_pal.advisor")

NICE = 10000
"""``sbatch --nice``: a re-measurement waits behind every ordinary job."""
MISSES = 2
"""Reads that must find a job gone from the queue without a record before it is given up."""
RECHECK_READ_S = 60.0
"""How often the store's confirmed rows are read for GPUs to measure again."""


def idle_gpus(view: View) -> dict[str, tuple[Pin, LabelEntry]]:
    """GPU id -> (its pin, its labels.json entry) of the GPUs free in ``view`` with every GPU
    of their label on their node (:func:`~slurm_pal.core.remeasure.idle_pins`), on nodes not
    left out of routing: a re-measure job holds those. The entry gives the device minor (the
    array task id, ``/dev/nvidiaN``) and Slurm's number for it, which need not be the same."""
    cluster = view.base
    entries = {e.uuid: e for e in view.static.labels.entries}
    free = {
        e.uuid
        for e in entries.values()
        if e.uuid in cluster.uuid_index
        and e.node not in view.excluded
        and cluster.free[cluster.uuid_index[e.uuid]]
    }
    pins = idle_pins(((e.uuid, e.node, e.label) for e in entries.values()), free)
    return {gpu: (pin, entries[gpu]) for gpu, pin in pins.items()}


@dataclass
class Flight:
    """One re-measure job: what it measures, its campaign directory and Slurm job."""

    attempt: Attempt
    plan: CampaignPlan
    directory: Path
    job_id: str
    campaign: str  # the active campaign it was submitted against
    pick: Wanted  # why it is measured (a suspect, another class, a recheck, routine)
    misses: int = 0


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


class Remeasurer:
    """The service's re-measurements: :meth:`tick` on each refresh (never raises)."""

    def __init__(
        self,
        state: AdvisorState,
        slurm: CampaignSlurm | None = None,
        root: Path | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.slurm = slurm or SlurmCommands()
        self._root = root
        self.wall_clock = wall_clock
        self.attempts: list[Attempt] = []
        self.flights: list[Flight] = []
        self._confirmed: tuple[float, dict[tuple[str, str], float]] | None = None
        self.measured: dict[tuple[str, str], float] = {}
        """(GPU, class) -> when last submitted for measurement here: the routine
        measurements' clock (a restart forgets it; the campaign's date counts then)."""
        self._campaign_s: tuple[str, float] | None = None  # base campaign -> its date

    @property
    def settings(self) -> CampaignSettings:
        found = getattr(self.state.config, "campaign", None)
        return found if isinstance(found, CampaignSettings) else CampaignSettings()

    @property
    def root(self) -> Path:
        return campaigns_root(self._root, self.state.store_path, self.settings.root)

    def tick(self) -> None:
        """Judge what landed, then submit what is due (``advisor.remeasure`` on only)."""
        if not self.state.config.advisor.remeasure:
            return
        try:
            self.settle()
            self.submit_due()
        except Exception:
            log.exception("re-measurement: tick failed")

    def snapshot(self) -> dict[str, object]:
        """``serve stats``: on or off, re-measure jobs in flight and submitted in the last hour."""
        now = self.wall_clock()
        return {
            "remeasure": self.state.config.advisor.remeasure,
            "remeasure_in_flight": len(self.flights),
            "remeasure_last_hour": sum(1 for t in self.attempts if now - t.submitted_s < 3600),
        }

    # -- submitting -----------------------------------------------------------------------------
    def submit_due(self) -> list[Flight]:
        view = self.state.view
        if view is None:
            return []
        limits = RemeasureLimits.of(self.state.config.advisor)
        idle = idle_gpus(view)
        now = self.wall_clock()
        keep_s = max(3600.0, limits.retry_s)  # what the budget and the retry delay read
        self.attempts = [t for t in self.attempts if not t.done or now - t.submitted_s < keep_s]
        scores = {spec.uuid: spec.scores for spec in view.static.specs}
        book = self.state.suspects
        candidates = wanted(book.suspects() + book.candidates(), self._confirmed_at(now), scores,
                            now, limits, book.settled(), book.campaign_scores())  # fmt: skip
        if budget_left(self.attempts, now, limits):
            first = self.state.config.classes.names[0]
            since = self._campaign_date(view.static.campaign)
            candidates += routine(idle, first, self.measured, since, now, limits)
        picks = to_remeasure(candidates, {g: p for g, (p, _) in idle.items()}, self.attempts,
                             now, limits)  # fmt: skip
        out = []
        for w in picks:
            pin, entry = idle[w.gpu]
            attempt = Attempt(w.gpu, w.job_class, pin.node, now, held=pin.gpus)
            self.attempts.append(attempt)  # counted against the budget even when it fails
            self.measured[(w.gpu, w.job_class)] = now
            try:
                out.append(self._submit(attempt, entry, pin, view.static.campaign, w))
            except Exception as exc:
                self._done(attempt)
                log.warning("re-measurement of GPU %s (%s device %d), class %s, not submitted: %s",
                            w.gpu, pin.node, entry.index, w.job_class, exc)  # fmt: skip
        return out

    def _campaign_date(self, campaign: str) -> float:
        """When the campaign ``campaign`` increments was ingested (epoch seconds; read once per
        campaign): a GPU never re-measured here was last measured then. Unreadable: now, so
        nothing is measured routinely before ``routine_s`` has passed."""
        root = base_campaign(campaign)
        if self._campaign_s is None or self._campaign_s[0] != root:
            when = self.wall_clock()
            try:
                with Store(self.state.store_path) as store:
                    found = [c.created_at for c in store.campaigns() if c.id == root]
                if found:
                    when = datetime.fromisoformat(found[0]).timestamp()
            except Exception:
                log.exception("the date of campaign %s not read", root)
            self._campaign_s = (root, when)
        return self._campaign_s[1]

    def _confirmed_at(self, now: float) -> dict[tuple[str, str], float]:
        """(GPU, class) -> when a re-measurement confirmed it slow (the store's closed rows,
        read once a minute): the GPUs :func:`wanted` measures again, to see them recover."""
        if self._confirmed is None or now - self._confirmed[0] >= RECHECK_READ_S:
            with Store(self.state.store_path) as store:
                found = last_settled(settlements(store.suspicions(cleared=True)), confirmed=True)
            self._confirmed = (now, found)
        return self._confirmed[1]

    def _submit(
        self, attempt: Attempt, entry: LabelEntry, pin: Pin, campaign: str, pick: Wanted
    ) -> Flight:
        cfg = self.state.config
        settings = self.settings
        node, index = attempt.node, entry.index
        stamp = datetime.fromtimestamp(attempt.submitted_s, UTC).strftime("%Y%m%d-%H%M%S")
        cid = _safe(f"rm-{node}-{index}-{attempt.job_class}-{stamp}")[:64]
        request = PlanRequest(
            classes=attempt.job_class, repeats=1, campaign_id=cid, sbatch_args=(f"--nice={NICE}",)
        )
        site = SiteClasses(cfg.classes.names, cfg.profiling.gpu_model, cfg.source)
        gpus = [PlannedGpu(node, index, attempt.gpu, entry.slurm_index)]
        counts = {node: len(pin.gpus)}  # the task holds the label's GPUs of the node, no more
        plan = new_plan(request, settings, site, gpus, counts, settings.partition)
        plan = replace(plan, gpu_type=pin.label)
        directory = create_campaign(self.root, plan)
        script = directory / SBATCH_DIR / f"{node}.sbatch"
        job_id = self.slurm.submit(script, array=str(index), cwd=directory)
        add_submission(directory, Submission(node, job_id, (index,), datetime.now(UTC).isoformat()))
        flight = Flight(attempt, plan, directory, job_id, campaign, pick)
        self.flights.append(flight)
        log.warning(
            "GPU %s (%s device %d) %s for class %s: re-measure job %s submitted "
            "(benchmark %s, low priority, holding gpu:%s:%d, campaign directory %s)",
            attempt.gpu, node, index,
            pick.why, attempt.job_class,
            job_id, plan.benchmarks[attempt.job_class].name, pin.label, len(pin.gpus), directory,
        )  # fmt: skip
        return flight

    def _done(self, attempt: Attempt) -> None:
        self.attempts = [replace(a, done=True) if a is attempt else a for a in self.attempts]
        self.flights = [f for f in self.flights if f.attempt is not attempt]

    # -- results --------------------------------------------------------------------------------
    def settle(self) -> list[tuple[Flight, Verdict | None]]:
        """Judge the flights whose record landed; give up those gone without one."""
        out: list[tuple[Flight, Verdict | None]] = []
        flights = list(self.flights)
        queued = self.slurm.queued(job_name(f.plan.campaign, f.attempt.node) for f in flights)
        for flight in flights:
            records, _ = read_records(flight.directory, flight.plan.campaign)
            ok = [r for r in records if r.ok and r.job_class == flight.attempt.job_class]
            if ok or records:
                self._done(flight.attempt)
                out.append((flight, self._judge(flight, ok) if ok else None))
                if not ok:
                    why = records[0].reason or records[0].status
                    log.warning("re-measure job %s of GPU %s failed: %s", flight.job_id,
                                flight.attempt.gpu, why)  # fmt: skip
                continue
            if any(k.split("_")[0] == flight.job_id for k in queued):
                flight.misses = 0
                continue
            flight.misses += 1
            if flight.misses >= MISSES:
                self._done(flight.attempt)
                out.append((flight, None))
                log.warning("re-measure job %s of GPU %s left the queue without a result",
                            flight.job_id, flight.attempt.gpu)  # fmt: skip
        return out

    def _judge(self, flight: Flight, ok: list[RunRecord]) -> Verdict | None:
        a = flight.attempt
        now = self.wall_clock()
        with Store(self.state.store_path) as store:
            active = store.active_campaign_id()
            if active is None:
                return None
            rows = store.measurements(active)
            names = {u: store.canonical_uuid(active, u) for u in set(rows["uuid"].astype(str))}
            mine = rows[(rows["uuid"].astype(str).map(names) == a.gpu)
                        & (rows["job_class"] == a.job_class)]  # fmt: skip
            bench = ok[0].benchmark
            same = mine[mine["benchmark"] == bench]
            if same.empty:
                log.warning(
                    "re-measure job %s of GPU %s for class %s not judged: campaign %s has no run "
                    "of benchmark %s for it (it ran %s)", flight.job_id, a.gpu, a.job_class,
                    active, bench, ", ".join(sorted(set(mine["benchmark"]))) or "none",
                )  # fmt: skip
                return None
            seen = median(float(r.duration_s) for r in ok)  # type: ignore[arg-type]
            slower = self.state.config.advisor.remeasure_slower
            if flight.pick.recheck:
                v = self._recheck(store, active, flight, ok, same, seen)
            else:
                v = verdict(seen, float(same["duration"].median()), slower)
        if flight.pick.recheck:
            if v.confirmed:  # back to speed: its new scores, from the next decision on
                self.state.reload()
                self.state.refresh()
            return v
        with Store(self.state.store_path) as store:
            done = f"job {flight.job_id}: {v.why}"
            if v.confirmed:
                new_id = self._increment(store, active, flight, ok, str(same["uuid"].iloc[0]))
                why = f"{CONFIRMED} ({done}); its scores are campaign {new_id}'s"
            else:
                why = f"{CLEARED} ({done})"
            cause = "re-measure candidate"
            if flight.pick.other_class:
                cause = "re-measure: slow for another class"
            elif flight.pick.routine:
                cause = "re-measure: routine"
            if not store.close_suspicion(active, a.gpu, a.job_class, now, why):
                # A candidate (never a suspicion): a row for the verdict all the same, so that
                # a GPU found slow is measured again to recover, and a restart knows both.
                store.open_suspicion(
                    active,
                    {
                        "gpu": a.gpu,
                        "job_class": a.job_class,
                        "since_s": now,
                        "onset_s": now,
                        "cause": cause,
                        "slowdown": v.ratio,
                        "runs": 0,
                    },
                )
                store.close_suspicion(active, a.gpu, a.job_class, now, why)
        self.state.suspects.settle(a.gpu, a.job_class, now, why, confirmed=v.confirmed)
        if v.confirmed:  # the increment is active: its scores, the detector refitted, and
            self.state.reload()  # the view on them (not the old scores without the suspicion
            self.state.refresh()  # between: the GPU stays avoided throughout)
            self._confirmed = None  # read again: its other classes are measured next
        else:
            self.state.rescore()  # steering: the class may use the GPU again from now on
        return v

    def _recheck(
        self,
        store: Store,
        active: str,
        flight: Flight,
        ok: list[RunRecord],
        same: pd.DataFrame,
        seen: float,
    ) -> Verdict:
        """A GPU found slow, measured again: back to speed, an increment with the new runs."""
        a = flight.attempt
        v = recovered(
            seen, float(same["duration"].median()), self.state.config.advisor.remeasure_slower
        )
        if not v.confirmed:
            log.info("GPU %s for class %s measured again (job %s): %s", a.gpu, a.job_class,
                     flight.job_id, v.why)  # fmt: skip
            return v
        new_id = self._increment(store, active, flight, ok, str(same["uuid"].iloc[0]))
        self._confirmed = None  # read again
        log.warning("GPU %s recovered for class %s (job %s: %s); its scores are campaign %s's",
                    a.gpu, a.job_class, flight.job_id, v.why, new_id)  # fmt: skip
        return v

    def _increment(
        self, store: Store, active: str, flight: Flight, ok: list[RunRecord], alias: str
    ) -> str:
        """Ingest and activate ``active`` with the GPU's runs of the class replaced by ``ok``."""
        a = flight.attempt
        known = {c.id: c for c in store.campaigns()}
        new_id = increment_id(active, known)
        fresh = measurement_rows(ok, flight.plan.gpu_model).rename(
            columns={"duration_s": "duration"}
        )
        fresh["uuid"] = alias
        old = store.measurements(active).drop(columns=["source_line"])
        rows = increment_rows(old, alias, a.job_class, fresh)
        path = flight.directory / COLLECTED_DIR / f"{new_id}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows.rename(columns={"duration": "duration_s"})[list(CSV_COLUMNS)].to_csv(path, index=False)
        events = [
            e
            for e in store.clock_events(active)
            if not (e.key == (a.node, ok[0].gpu_index) and e.job_class == a.job_class)
        ]
        events += [r.clock_event_row() for r in ok]  # fmt: skip
        store.ingest(
            [read_campaign_csv(path)],
            campaign_id=new_id,
            class_order=self.state.config.classes.names,
            binner=PMBinner(**known[active].binning),  # type: ignore[arg-type]
            description=f"{active} with GPU {a.gpu}'s class {a.job_class} re-measured "
            f"(job {flight.job_id})",
            clock_events=events,
        )
        store.activate(new_id)
        return new_id
