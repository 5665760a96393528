"""Should this site turn the advisor on, and with which settings? The experiment behind
``slurm-pal tune``.

Each candidate (the advisor as the site config sets it up, and sweeps of its knobs: the locality
penalty PAL's L x V matrix assumes, packed-pm's outlier threshold, the number of classes, the
default class) replays the site's trace on simulated GPUs drawn with one seed per draw. Every
run is paired with Slurm's packing (packed-sticky) on the same trace, GPUs and seed, and jobs
always pay the site's true cost of spanning nodes. A candidate is judged by the distribution of
its paired average-JCT ratios: geomean gain with a bootstrap 95 % interval, median, p90 and
worst run. Single runs are chaotic under FIFO + backfill, so the PM-blind ``null`` placement is
listed to show how far the queue's own noise moves them.

The recommendation is honest: a candidate is recommended only when its gain is clear of the
noise (the interval's lower bound above zero); otherwise packing is recommended (the advisor
in pass-through: ``policy = "packed"``), and never a candidate that lost. Nor one measured
without variability: on GPUs that are all alike (no ``--profile``) there is nothing to steer
around, and a candidate whose runs are all the same (one trace on the same GPUs every draw)
gives no noise to be clear of: a deterministic difference is no evidence of a gain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slurm_pal.adapters.config import SiteConfig
from slurm_pal.core.workload import SimJob
from slurm_pal.sim.advisor import advisor_changes_no_job, advisor_sim_options
from slurm_pal.sim.engine import SimConfig
from slurm_pal.sim.experiments import (
    BASELINE,
    FaultRun,
    PairedRatios,
    limits_note,
    run_grid,
    waiting_note,
)
from slurm_pal.sim.variability import SimGpus

TUNABLE = ("advisor", "packed-pm", "pal", "pm-first")
PASS_THROUGH = "packed"

Draw = tuple[list[SimJob], SimGpus]
"""One seed's trace and simulated cluster; every candidate runs on the same draws."""


@dataclass(frozen=True)
class Candidate:
    """One setting of the advisor to try: a policy and the knobs that change its decisions."""

    policy: str
    label: str
    options: dict[str, object]
    settings: dict[str, object]  # what to write into [advisor]/[locality] to get it
    classes: int | None = None
    default_class: str | None = None


REFERENCE = Candidate("packed-sticky", BASELINE, {"placement": BASELINE}, {})
NOISE = Candidate("null", "null (PM-blind: the queue's noise)", {"placement": "null"}, {})


@dataclass(frozen=True)
class TuneSweep:
    """What to try: the policies and the values of each knob. ``counts`` None: all the classes;
    ``defaults`` (None,): the site's default class."""

    policies: Sequence[str]
    penalties: Sequence[float]
    thresholds: Sequence[float]
    counts: Sequence[int] | None = None
    defaults: Sequence[str | None] = (None,)


@dataclass(frozen=True)
class TuneRun:
    """How every candidate runs: the engine's settings shared by all of them."""

    scheduler: str
    mode: str
    round_seconds: float
    pal_artifact: bool
    site_penalty: float  # the site's true cost of spanning nodes, paid by every job
    faults: FaultRun | None = None  # GPUs that turn slow, and the loop every run meets them with


@dataclass(frozen=True)
class TuneResult:
    """What the experiment found: one row per candidate judged against packing (the null
    first), the recommendation and the notes."""

    run: TuneRun
    jobs: int  # in the trace of each draw
    baseline_jct: list[float]  # packing's average JCT on each draw
    rows: list[dict]
    per_run: dict[str, list[float]]  # candidate label -> its per-draw average-JCT ratios
    recommended: dict[str, Any]
    clear_gain: bool  # a candidate was recommended; otherwise packing is
    advisor_changes_no_job: str | None
    notes: list[str]

    def report(self) -> dict[str, object]:
        """All of it as one JSON-ready dict."""
        return {
            "site_penalty": self.run.site_penalty,
            "mode": self.run.mode,
            "scheduler": self.run.scheduler,
            "seeds": len(self.baseline_jct),
            "baseline": {"placement": BASELINE, "avg_jct": self.baseline_jct},
            "recommended": self.recommended,
            "advisor_changes_no_job": self.advisor_changes_no_job,
            "candidates": self.rows,
            "notes": self.notes,
        }


def merged_classes(order: tuple[str, ...], keep: int) -> tuple[tuple[str, str], ...]:
    """Classes beyond the first ``keep`` (most variability-sensitive first) placed as the last
    kept one."""
    return tuple((name, order[keep - 1]) for name in order[keep:])


def with_unknown_share(jobs: list[SimJob], share: float, seed: int) -> list[SimJob]:
    """A seeded ``share`` of the jobs made unidentified, to weigh the default class on a trace
    whose classes are all known."""
    if share <= 0:
        return jobs
    hidden = np.random.default_rng(seed).random(len(jobs)) < share
    return [replace(j, known=False) if h else j for j, h in zip(jobs, hidden, strict=True)]


def knob_settings(
    policy: str, site: SiteConfig, sweep: TuneSweep
) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    """Each value of ``policy``'s knob: its label, simulator options and site settings."""
    if policy == "packed-pm":
        return [
            (
                f"avoid_above {t:g}",
                {
                    "advisor_settings": (
                        ("avoid_above", t),
                        ("wait", site.advisor.outliers == "wait"),
                    )
                },
                {"avoid_above": t, "outliers": site.advisor.outliers},
            )
            for t in sweep.thresholds
        ]
    return [
        (
            f"L {p:g}",
            {
                "locality_penalty": p,
                "advisor_settings": (("pack_tolerance", site.advisor.pack_tolerance),),
            },
            {"across_switches": p, "pack_tolerance": site.advisor.pack_tolerance},
        )
        for p in sweep.penalties
    ]


def candidates_for(site: SiteConfig, sweep: TuneSweep, order: tuple[str, ...]) -> list[Candidate]:
    """Every setting to try, the configured advisor first."""
    out: list[Candidate] = []
    for policy in sweep.policies:
        for k in sweep.counts or [len(order)]:
            for default in sweep.defaults:
                shared: dict[str, object] = {"advised_classes": merged_classes(order, k)}
                extra = f", {k} classes" if k != len(order) else ""
                if default is not None:
                    shared["default_class"] = default
                    extra += f", default class {default}"
                if policy == "advisor":
                    options = {**advisor_sim_options(site), **shared}
                    label = f"advisor ({site.advisor.policy}, as configured){extra}"
                    out.append(Candidate(policy, label, options, {}, k, default))
                    continue
                for text, knobs, settings in knob_settings(policy, site, sweep):
                    out.append(
                        Candidate(
                            policy,
                            f"{policy}, {text}{extra}",
                            {"placement": "advisor", "advisor_policy": policy, **knobs, **shared},
                            {"policy": policy, **settings},
                            k,
                            default,
                        )
                    )
    return out


def check_sweep(sweep: TuneSweep, order: tuple[str, ...]) -> None:
    """Class counts and default classes the drawn cluster's classes allow (ValueError)."""
    if any(not 1 <= k <= len(order) for k in sweep.counts or ()):
        raise ValueError(f"class counts must be within 1..{len(order)}")
    unknown_names = [name for name in sweep.defaults if name is not None and name not in order]
    if unknown_names:
        raise ValueError(f"unknown default class(es) {', '.join(map(str, unknown_names))}")


@dataclass(frozen=True)
class TuneExperiment:
    """The candidates, the draws they all run on, and how they run: packing first (every
    ratio's denominator), then the null, then the candidates judged."""

    site: SiteConfig
    draws: list[Draw]
    candidates: list[Candidate]
    run: TuneRun

    @property
    def total_runs(self) -> int:
        return len(self.draws) * len(self.candidates)

    def configs(self, seed: int) -> list[SimConfig]:
        """Every candidate's run on draw ``seed``; jobs pay the site's cost of spanning nodes
        whatever penalty a candidate's advisor assumes."""
        common: dict[str, Any] = {
            "scheduler": self.run.scheduler,
            "mode": self.run.mode,
            "round_seconds": self.run.round_seconds,
            "pal_artifact": self.run.pal_artifact,
            "locality_penalty": self.run.site_penalty,
            "site_locality_penalty": self.run.site_penalty,
        }
        return [SimConfig(seed=seed, **{**common, **c.options}) for c in self.candidates]


def tune_experiment(
    site: SiteConfig, draws: list[Draw], sweep: TuneSweep, run: TuneRun
) -> TuneExperiment:
    """The experiment for ``sweep`` on ``draws`` (ValueError: a sweep the classes refuse)."""
    order = draws[0][1].classes
    check_sweep(sweep, order)
    candidates = [REFERENCE, NOISE, *candidates_for(site, sweep, order)]
    return TuneExperiment(site, draws, candidates, run)


def run_tune(
    experiment: TuneExperiment, workers: int, on_done: Callable[[SimConfig], None]
) -> TuneResult:
    """Every candidate on every draw (``on_done`` after each run), judged against packing.
    Only each run's summary is kept: a run's per-job results are large."""
    summaries: dict[int, list[dict]] = {}
    for seed, (jobs, gpus) in enumerate(experiment.draws):
        done = run_grid(
            jobs,
            gpus,
            experiment.configs(seed),
            workers=workers,
            on_done=on_done,
            faults=experiment.run.faults,
        )
        for index, result in enumerate(done):
            summaries.setdefault(index, []).append(result.summary())
    return judged(experiment, summaries)


def ratios_of(summaries: list[dict], baseline: list[dict], key: str = "avg_jct") -> list[float]:
    """Per-draw ratios against packing on the same draw: lower is better."""
    return [float(s[key]) / float(b[key]) for s, b in zip(summaries, baseline, strict=True)]


def candidate_row(candidate: Candidate, summaries: list[dict], baseline: list[dict]) -> dict:
    """One candidate's paired ratios against packing, summarized."""
    paired = PairedRatios.of(ratios_of(summaries, baseline))
    p99 = ratios_of(summaries, baseline, "p99_jct")
    return {
        "candidate": candidate.label,
        "placement": candidate.policy,
        "settings": candidate.settings,
        "classes": candidate.classes,
        "default_class": candidate.default_class,
        **paired.summary(),
        "p99_jct_geomean_ratio": float(np.exp(np.mean(np.log(p99)))),
        "clear_gain": paired.clear_gain,
        "noise_reference": candidate.policy == "null",
    }


def recommendation(rows: list[dict]) -> dict[str, Any] | None:
    """The judged candidate with the largest gain clear of the noise, or None: packing."""
    winners = sorted(
        (r for r in rows if not r["noise_reference"] and r["clear_gain"]),
        key=lambda r: -float(r["geomean_gain"]),
    )
    return {"advisor": "on", **winners[0]} if winners else None


def gpus_vary(draws: Sequence[Draw]) -> bool:
    """Whether any drawn cluster has GPUs that run a class at different speeds."""
    return any(
        float(np.ptp(values)) > 0
        for _, gpus in draws
        for values in gpus.true_slowdown.values()
        if len(values)
    )


NO_VARIABILITY = (
    "the simulated GPUs do not vary (no --profile: every GPU alike, no outlier to steer "
    "around), so the advisor has nothing to gain over packing; give the campaign with "
    "--profile CLASS=PATH to see what the advisor would do"
)


def pass_through_why(rows: list[dict], variability: bool, runs: int) -> str:
    """Why packing is recommended, in the words an admin can act on."""
    if not variability:
        return NO_VARIABILITY
    still = [r for r in rows if not r["noise_reference"] and not r["runs_vary"]]
    if still and len(still) == sum(1 for r in rows if not r["noise_reference"]):
        return (
            f"the {runs} paired runs of each candidate are identical (the "
            "same trace on the same GPUs in every draw): a difference between identical runs "
            "is no evidence of a gain, so keep packing; give a --profile campaign with more "
            "GPUs than the cluster has, or --poisson traces, for draws that differ"
        )
    return (
        "no candidate's average-JCT gain vs packing is clear of the noise (95 % interval "
        "lower bound > 0)"
    )


def judged(experiment: TuneExperiment, summaries: dict[int, list[dict]]) -> TuneResult:
    """The rows, the recommendation and the notes from each candidate's run summaries
    (index in ``experiment.candidates`` -> one summary per draw)."""
    baseline = summaries[0]
    compared = list(enumerate(experiment.candidates))[1:]
    rows = [candidate_row(c, summaries[i], baseline) for i, c in compared]
    per_run = {c.label: ratios_of(summaries[i], baseline) for i, c in compared}
    variability = gpus_vary(experiment.draws)
    for row in rows:
        ratios = per_run[row["candidate"]]
        row["runs_vary"] = max(ratios) - min(ratios) > 1e-9
        # without variability (in the GPUs or between the runs) there is no noise to be
        # clear of: a deterministic difference is not a gain to act on
        row["clear_gain"] = bool(row["clear_gain"] and row["runs_vary"] and variability)
    winner = recommendation(rows)
    recommended = winner or {
        "advisor": "pass-through",
        "candidate": f"packing (policy = {PASS_THROUGH!r})",
        "settings": {"policy": PASS_THROUGH},
        "why": pass_through_why(rows, variability, len(baseline)),
    }
    scores = (gpus.placement_scores for _, gpus in experiment.draws)
    unchanged = (
        advisor_changes_no_job(experiment.site, scores)
        if any(c.policy == "advisor" for _, c in compared)
        else None
    )
    first_trace = experiment.draws[0][0]
    notes = [limits_note(first_trace)]
    notes += [waiting_note(c.label, summaries[i], per_run[c.label]) for i, c in compared]
    return TuneResult(
        run=experiment.run,
        jobs=len(first_trace),
        baseline_jct=[float(s["avg_jct"]) for s in baseline],
        rows=rows,
        per_run=per_run,
        recommended=recommended,
        clear_gain=winner is not None,
        advisor_changes_no_job=unchanged,
        notes=[note for note in notes if note is not None],
    )
