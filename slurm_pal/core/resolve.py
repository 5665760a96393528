"""Job -> application -> class: which class a submitted job is placed as, and why.

The submit path calls :func:`resolve` (or :func:`resolve_class`) for every GPU job while
slurmctld waits, so it is pure and does no I/O: the advisor loads a :class:`StoreView`
snapshot from the store once and refreshes it now and then, and the site's rules come in
through :class:`ResolveConfig`.

**Resolution order** (the first that applies wins):

1. **Admin rule** from the site config (``[[classification.rules]]``), in file order: a rule
   matches when every condition it sets (user, account, partition, job-name glob) matches.
   A rule gives a class, or an application whose class is then used (a rule naming an
   application the store does not know, or one without a class yet, is skipped).
2. **Measured history**: earlier runs of the same (user, job name, script sha256) whose
   telemetry was measured. Measurements outrank any name the user gives, so a user cannot
   win better GPUs by naming a compute-bound application for a memory-bound job. When the
   name disagrees the result says so (``mismatch``, for the admin comment); every finished
   job whose measurement contradicts its claim is logged for admins (:class:`JobRecord`,
   ``Store.record_job``, ``slurm-pal apps mismatches``).
3. **Named application**: ``pal:app=NAME`` in ``--comment``, else a ``#PAL app=NAME`` line in
   the batch script's leading comment block, if the store knows NAME and it has a class.
   A name only selects a profile that exists; an unknown name is ignored (and said so). A
   user whose earlier jobs named NAME but measured a less compute-bound class is not
   believed about NAME any more (``StoreView.contradicted``), whatever the job is called.
4. **History by name**: the application named by earlier runs of the same key, if known
   (and believed).
5. The site's **default class**.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "APP_NAME_RE",
    "ClassRule",
    "HistoryKey",
    "HistoryRow",
    "HistorySummary",
    "JobRecord",
    "JobRequest",
    "Resolution",
    "ResolveConfig",
    "StoreView",
    "app_from_comment",
    "app_from_script",
    "check_app_name",
    "claimed_app",
    "contradicted_claims",
    "resolve",
    "resolve_class",
    "summarize_history",
]

#: What an application name may look like: it travels in ``--comment`` and Slurm fields.
APP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_COMMENT_APP_RE = re.compile(r"(?:^|[\s,;])pal:app=([^\s,;]*)")
_SCRIPT_APP_RE = re.compile(r"^#PAL\s+(?:.*\s)?app=(\S*)")

Origin = Literal["rule", "history", "app", "history-app", "default"]
#: (user, job name, script sha256); the sha256 is "" for jobs without a batch script.
HistoryKey = tuple[str, str, str]


def check_app_name(name: str) -> str:
    """Return ``name`` if it is a valid application name, else raise ValueError saying why."""
    if not APP_NAME_RE.match(name):
        raise ValueError(
            f"invalid application name {name!r}: use 1-64 characters from letters, digits and "
            "'._+-', starting with a letter or digit (it travels in --comment=pal:app=NAME)"
        )
    return name


def app_from_comment(comment: str | None) -> str | None:
    """The NAME of the first ``pal:app=NAME`` token in a job comment (None if none/invalid)."""
    if not comment:
        return None
    match = _COMMENT_APP_RE.search(comment)
    if match is None or not APP_NAME_RE.match(match.group(1)):
        return None
    return match.group(1)


def app_from_script(script: str | None) -> str | None:
    """The NAME of a ``#PAL app=NAME`` line in the script's leading comment block.

    Like sbatch with ``#SBATCH`` lines, only the comment block at the top counts (blank lines
    and ``#`` lines after the shebang); the first command line ends it, so a ``#PAL`` text
    further down (a heredoc, a commented-out example) is not a directive.
    """
    if not script:
        return None
    for line in script.removeprefix("\ufeff").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return None
        match = _SCRIPT_APP_RE.match(stripped)
        if match is not None:
            return match.group(1) if APP_NAME_RE.match(match.group(1)) else None
    return None


@dataclass(frozen=True)
class JobRequest:
    """What the submit path knows about a job (built from job_submit.lua's fields).

    ``partition`` may be Slurm's comma-separated list; ``script`` may be just the start of
    the batch script (the leading comment block is all that is read); ``script_sha256`` is
    the hash of the whole script ("" or None for jobs without one, e.g. srun).
    """

    user: str
    job_name: str = ""
    account: str = ""
    partition: str = ""
    comment: str = ""
    script: str | None = None
    script_sha256: str | None = None
    script_app: str | None = None
    """A stored request keeps no script: the application its ``#PAL app=`` line named."""

    @property
    def history_key(self) -> HistoryKey:
        return (self.user, self.job_name, self.script_sha256 or "")

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.partition.split(",") if p.strip())


def claimed_app(job: JobRequest) -> tuple[str | None, str]:
    """(application the user names, where): the comment first, then the script."""
    name = app_from_comment(job.comment)
    if name is not None:
        return name, "comment"
    name = app_from_script(job.script) if job.script is not None else job.script_app
    if name is not None:
        return name, "script"
    return None, ""


@dataclass(frozen=True)
class ClassRule:
    """An admin rule: every condition set must match; gives a class or an application.

    ``job_name`` is an fnmatch glob (case-sensitive); user and account match exactly;
    ``partition`` matches when it is one of the job's partitions.
    """

    user: str | None = None
    account: str | None = None
    partition: str | None = None
    job_name: str | None = None
    job_class: str | None = None
    app: str | None = None

    def __post_init__(self) -> None:
        if (self.job_class is None) == (self.app is None):
            raise ValueError("a rule gives exactly one of a class or an application")
        if not self.conditions():
            raise ValueError("a rule needs at least one of user, account, partition, job_name")

    def conditions(self) -> list[tuple[str, str]]:
        """The (key, value) conditions this rule sets, for matching and for reasons."""
        keys = ("user", "account", "partition", "job_name")
        return [(k, v) for k in keys if (v := getattr(self, k)) is not None]

    def matches(self, job: JobRequest) -> bool:
        if self.user is not None and job.user != self.user:
            return False
        if self.account is not None and job.account != self.account:
            return False
        if self.partition is not None and self.partition not in job.partitions:
            return False
        return self.job_name is None or fnmatch.fnmatchcase(job.job_name, self.job_name)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.conditions())


@dataclass(frozen=True)
class ResolveConfig:
    """The site's part of resolution: class names (most compute-bound first), default, rules.

    ``history_min_runs``: measured earlier runs needed before history outranks a name.
    """

    class_names: tuple[str, ...] = ("A", "B", "C", "D")
    default_class: str = "A"
    rules: tuple[ClassRule, ...] = ()
    history_min_runs: int = 1

    def __post_init__(self) -> None:
        if not self.class_names:
            raise ValueError("class_names must list at least one class")
        if self.default_class not in self.class_names:
            raise ValueError(
                f"default class {self.default_class!r} is not one of {list(self.class_names)}"
            )
        for number, rule in enumerate(self.rules, start=1):
            if rule.job_class is not None and rule.job_class not in self.class_names:
                raise ValueError(
                    f"rule {number} gives class {rule.job_class!r}; valid classes: "
                    f"{', '.join(self.class_names)}"
                )
        if self.history_min_runs < 1:
            raise ValueError(f"history_min_runs must be >= 1, got {self.history_min_runs}")


@dataclass(frozen=True)
class HistoryRow:
    """One earlier run, as the store keeps it (``measured_class`` None: not measured)."""

    key: HistoryKey
    app: str | None
    measured_class: str | None
    recorded_at: str


@dataclass(frozen=True)
class HistorySummary:
    """What earlier runs of one key say.

    ``measured_class``: the class measured most often (ties: the most recent of those);
    ``app``: the application the most recent run named (if any).
    """

    runs: int
    measured_runs: int
    measured_class: str | None
    measured_class_runs: int
    app: str | None


def summarize_history(rows: Iterable[HistoryRow]) -> dict[HistoryKey, HistorySummary]:
    """Fold earlier runs into one :class:`HistorySummary` per key (order of rows: any)."""
    by_key: dict[HistoryKey, list[HistoryRow]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    result: dict[HistoryKey, HistorySummary] = {}
    for key, runs in by_key.items():
        runs.sort(key=lambda r: r.recorded_at)
        measured = [r.measured_class for r in runs if r.measured_class is not None]
        counts = Counter(measured)
        best: str | None = None
        if counts:
            top = max(counts.values())
            # Most recent among the most frequent: later runs reflect the current code.
            best = next(c for c in reversed(measured) if counts[c] == top)
        named = [r.app for r in runs if r.app is not None]
        result[key] = HistorySummary(
            runs=len(runs),
            measured_runs=len(measured),
            measured_class=best,
            measured_class_runs=counts[best] if best is not None else 0,
            app=named[-1] if named else None,
        )
    return result


@dataclass(frozen=True)
class StoreView:
    """A snapshot of what the store knows, loaded once by the advisor (no I/O on submit).

    ``apps``: application -> class (None: profiled, not classified yet).
    ``history``: (user, job name, script sha256) -> summary of earlier runs.
    """

    apps: Mapping[str, str | None] = field(default_factory=dict)
    history: Mapping[HistoryKey, HistorySummary] = field(default_factory=dict)
    contradicted: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(user, app) -> finished jobs of that user that named app and measured a less
    compute-bound class than app's: that user's later claims of app are not believed, so
    a new job name or script does not make a claim believable again."""


def contradicted_claims(
    mismatches: Iterable[tuple[str, str, str, str]], class_names: Sequence[str]
) -> dict[tuple[str, str], int]:
    """Count (user, claimed app, claimed class, measured class) rows per (user, app) where
    the claim would have won better GPUs: the claimed class ranks before the measured one.
    Claims that undersold the job (or name classes the site no longer has) do not count."""
    rank = {name: index for index, name in enumerate(class_names)}
    counts: Counter[tuple[str, str]] = Counter()
    for user, app, claimed, measured in mismatches:
        if claimed in rank and measured in rank and rank[claimed] < rank[measured]:
            counts[(user, app)] += 1
    return dict(counts)


@dataclass(frozen=True)
class Resolution:
    """The class a job gets, why, and what the caller may need to record."""

    job_class: str
    reason: str
    origin: Origin
    claimed_app: str | None = None
    claimed_class: str | None = None
    mismatch: bool = False
    """True when measured history overruled a named application of another class."""


def _known_class(view: StoreView, app: str | None, config: ResolveConfig) -> str | None:
    if app is None:
        return None
    job_class = view.apps.get(app)
    return job_class if job_class in config.class_names else None


def resolve(job: JobRequest, view: StoreView, config: ResolveConfig) -> Resolution:
    """The job's class and the reason, by the order in the module docstring."""
    notes: list[str] = []
    for number, rule in enumerate(config.rules, start=1):
        if not rule.matches(job):
            continue
        if rule.job_class is not None:
            reason = f"admin rule {number} ({rule.describe()})"
            return Resolution(rule.job_class, reason, "rule")
        rule_class = _known_class(view, rule.app, config)
        if rule_class is not None:
            reason = f"admin rule {number} ({rule.describe()}): app {rule.app} (class {rule_class})"
            return Resolution(rule_class, reason, "rule")
        notes.append(f"admin rule {number} names app {rule.app}, which has no class: skipped")

    name, where = claimed_app(job)
    claim_class = _known_class(view, name, config)  # the named app's class, believed or not
    name_class = claim_class
    if name is not None and claim_class is None:
        state = "has no class yet" if name in view.apps else "is unknown"
        notes.append(f"named app {name} {state}")
    elif name is not None and (contradicted := view.contradicted.get((job.user, name), 0)):
        name_class = None
        notes.append(
            f"named app {name} not believed: {contradicted} earlier job(s) of {job.user} "
            "naming it measured a less compute-bound class"
        )
    suffix = f"; {'; '.join(notes)}" if notes else ""

    summary = view.history.get(job.history_key)
    if (
        summary is not None
        and summary.measured_class in config.class_names
        and summary.measured_runs >= config.history_min_runs
    ):
        measured = summary.measured_class
        runs = f"{summary.measured_class_runs} of {summary.measured_runs} earlier measured run(s)"
        if claim_class is not None and claim_class != measured:
            reason = (
                f"history: {runs} measured class {measured} "
                f"(claimed {name} -> {claim_class} ignored){suffix}"
            )
            return Resolution(measured, reason, "history", name, claim_class, mismatch=True)
        if name_class is not None:
            reason = f"named app {name} (class {name_class}), confirmed by {runs}{suffix}"
            return Resolution(measured, reason, "history", name, name_class)
        reason = f"history: {runs} measured class {measured}{suffix}"
        return Resolution(measured, reason, "history", name, claim_class)

    if name_class is not None:
        return Resolution(
            name_class,
            f"named app {name} (class {name_class}, from {where})",
            "app",
            name,
            name_class,
        )

    if summary is not None and not view.contradicted.get((job.user, summary.app or "")):
        history_class = _known_class(view, summary.app, config)
        if history_class is not None:
            reason = (
                f"history: earlier runs named app {summary.app} (class {history_class}){suffix}"
            )
            return Resolution(history_class, reason, "history-app")

    reason = f"default class {config.default_class}{suffix}"
    return Resolution(config.default_class, reason, "default", name, claim_class)


def resolve_class(job: JobRequest, view: StoreView, config: ResolveConfig) -> tuple[str, str]:
    """(class, reason) for the submit path; :func:`resolve` has the details."""
    result = resolve(job, view, config)
    return result.job_class, result.reason


@dataclass(frozen=True)
class JobRecord:
    """A finished job as the Epilog/advisor reports it, for the history and the mismatch log.

    ``measured_class`` is the class of the measured (dram_util, fu_util) under the active
    model (None when telemetry failed); ``claimed_class`` the class of ``claimed_app`` when
    the job was submitted.
    """

    job_id: str
    user: str
    job_name: str
    script_sha256: str
    claimed_app: str | None = None
    claimed_class: str | None = None
    measured_class: str | None = None
    dram_util: float | None = None
    fu_util: float | None = None
    source: str | None = None

    @property
    def key(self) -> HistoryKey:
        return (self.user, self.job_name, self.script_sha256)

    @property
    def mismatch(self) -> bool:
        """The named application's class differs from what the job measured."""
        return (
            self.claimed_app is not None
            and self.claimed_class is not None
            and self.measured_class is not None
            and self.claimed_class != self.measured_class
        )
