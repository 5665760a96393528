"""Site configuration (TOML) and where the store lives.

The file is optional: every knob has a default that matches the PAL paper. ``--config`` or
``SLURM_PAL_CONFIG`` names it; ``site-config/slurm-pal.toml`` documents every key. Errors name
the file, the key and what is valid, because an admin fixing a typo at 3 a.m. needs exactly that.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_pal.campaigns.settings import SECTION as CAMPAIGN_SECTION
from slurm_pal.campaigns.settings import (
    CampaignSettings,
    CampaignSettingsError,
    load_campaign_settings,
)
from slurm_pal.core.resolve import ClassRule, ResolveConfig, check_app_name
from slurm_pal.errors import SlurmPalError

ENV_CONFIG = "SLURM_PAL_CONFIG"
ENV_DB = "SLURM_PAL_DB"
SYSTEM_DB = Path("/var/lib/slurm-pal/slurm-pal.db")

if TYPE_CHECKING:
    from slurm_pal.core.binning import PMBinner


class ConfigError(SlurmPalError, ValueError):
    """A configuration problem, naming the file and the key."""


@dataclass(frozen=True)
class StoreConfig:
    path: str | None = None
    """SQLite file; default /var/lib/slurm-pal/slurm-pal.db for root, else the user's data dir."""
    retention_days: float = 90.0
    """The advisor's decisions, job records, job history and class mismatches older than this
    are deleted (`slurm-pal serve` purges once a day); 0 keeps them for ever."""


@dataclass(frozen=True)
class ClassesConfig:
    names: tuple[str, ...] = ("A", "B", "C", "D")
    """Job classes, most compute-bound (most variability-sensitive) first."""
    default: str = "A"
    """Class of a job nothing is known about (PAL assumes the worst: the most sensitive)."""


@dataclass(frozen=True)
class BinningConfig:
    k_min: int = 2
    k_max: int = 11
    outlier_sigma: float = 3.0
    min_gap: float = 0.005
    """Smallest difference between neighbouring bin scores (0.005 = 0.5 %); 0 = the paper."""
    n_init: int = 10
    seed: int = 0
    pal_artifact: bool = False
    """Reproduce PAL's public code (K always 2 plus one cluster per outlier)."""

    def binner(self, *, pal_artifact: bool | None = None) -> PMBinner:
        # scikit-learn loads here, not with the config: every command reads the config, and
        # `serve health` or `version` must start in well under a second.
        from slurm_pal.core.binning import PMBinner

        return PMBinner(
            k_min=self.k_min,
            k_max=self.k_max,
            outlier_sigma=self.outlier_sigma,
            min_gap=self.min_gap,
            n_init=self.n_init,
            random_state=self.seed,
            pal_artifact=self.pal_artifact if pal_artifact is None else pal_artifact,
        )


@dataclass(frozen=True)
class LocalityConfig:
    within_node: float = 1.0
    within_switch: float | None = None
    """Penalty for GPUs on several nodes under one leaf switch; default: across_switches."""
    across_switches: float = 1.7
    topology_file: str | None = None
    """Slurm topology.conf to read the switch tree from (none: one switch, the paper's model)."""


@dataclass(frozen=True)
class ProfilingConfig:
    gpu_model: str = "gpu"
    """Model name for GPUs whose campaign files do not say (e.g. 'v100', 'a100')."""


CLASSIFY_SOURCES = ("auto", "ncu", "nvml", "dcgm")
RULE_CONDITION_KEYS = ("user", "account", "partition", "job_name")
RULE_KEYS = (*RULE_CONDITION_KEYS, "class", "app")


@dataclass(frozen=True)
class ClassificationConfig:
    n_classes: int | None = None
    """Classes the job classifier fits (K); default: one per classes.names entry."""
    default_source: str = "auto"
    """Telemetry format `apps classify` reads without --source: auto, ncu, nvml or dcgm."""
    seed: int = 0
    n_init: int = 10
    noise_tolerance: float = 1.0
    """Percentage points (DRAM and FU) within which measurements are one behaviour: `apps
    fit` never splits them into different classes."""
    history_min_runs: int = 1
    """Measured earlier runs of a (user, job name, script) needed before they outrank a name."""
    history_window: int = 20
    """Latest runs per (user, job name, script) that the history summary looks at."""
    rules: tuple[ClassRule, ...] = ()
    """Admin rules ([[classification.rules]]), tried first, in file order."""

    def k(self, names: tuple[str, ...]) -> int:
        """The classifier's K: n_classes, else one per site class."""
        return len(names) if self.n_classes is None else self.n_classes


ADVISOR_POLICIES = ("packed-pm", "pal", "pm-first", "packed", "random")
OUTLIER_CHOICES = ("wait", "last-resort")
PIN_CHOICES = ("steered", "every-job")
BACKFILL_RESERVES = ("head", "nodes")  # core/queue's (a test holds them equal): no numpy here
LABEL_REQUEST_CHOICES = ("translate", "allow", "deny")
SLURM_BACKENDS = ("auto", "cli", "pyslurm")
SLURM_JOB_READS = ("json", "brief")
SUSPICION_CHOICES = ("off", "report", "steer")


@dataclass(frozen=True)
class AdvisorConfig:
    """The advisor service (`slurm-pal serve`) on the controller."""

    socket: str = "/run/slurm-pal/advisor.sock"
    """Unix socket job_submit.lua, the hooks and `serve stats` talk to (line-delimited JSON)."""
    allowed_users: tuple[str, ...] = ("root", "slurm")
    """Peers (SO_PEERCRED uid) the service answers; root and SlurmUser. Others are refused."""
    socket_group: str = "slurm"
    """Group owning the socket (mode 0660), so SlurmUser can connect; root always can."""
    policy: str = "packed-pm"
    """Placement policy: packed-pm (the production default: packing's nodes, the job's best GPUs
    inside them, slow outliers last), pal or pm-first (the paper's policies: they lose to packing
    where jobs never move, benchmarks/README.md "Production"), packed (plain packing), random."""
    pack_tolerance: float = 0.05
    """pal/pm-first accept an LV product this much worse than the best (0.05 = 5 %) to pack:
    Slurm cannot migrate, and unpacked single-GPU picks fragment the nodes (ARCHITECTURE.md)."""
    avoid_above: float = 1.5
    """packed-pm: a GPU whose PM-score for a job's class is above this (1.5 = 50 % slower than
    the median GPU) is an outlier for that job; it is left out when that costs no extra node."""
    outliers: str = "wait"
    """packed-pm, when a job can leave its outliers out only on more nodes, or not at all: wait
    (hold it back while the wait it can expect is shorter than what the outlier would cost it,
    at most max_wait_s) or last-resort (take them)."""
    max_wait_s: float = 86400.0
    """packed-pm with outliers = wait: the longest a job is held back for other GPUs, from when
    it could first have started; Slurm gets it as the job's begin time, so the bound holds even
    when the advisor is gone."""
    assumed_runtime_s: float = 3600.0
    """packed-pm with outliers = wait: what a job without a time limit is weighed as running
    (UNLIMITED, or the partition's default): a wait must cost it less than this x the slowdown.
    The fallback until 20 unlimited jobs have ended: then their median runtime (by size)."""
    limit_share: float = 0.5
    """packed-pm with outliers = wait: the share of its time limit a job with one is weighed as
    running (users ask for more than they use). The fallback until 20 limited jobs have ended:
    then the median share of their limit they used (core/runtimes.py)."""
    pin: str = "steered"
    """Which jobs get their GPUs pinned (GRES type and node list): steered (only those the
    policy places other than packing would, or that could get a GPU it avoids for them; the
    others are left to Slurm, which packs the same without a pin a stale view can hold
    wrong) or every-job (every placed job, as the paper's policies need)."""
    submit_timeout_ms: int = 300
    """How long job_submit.lua waits for an answer before letting the job through as written."""
    label_requests: str = "translate"
    """A job (of a user other than allowed_users and root) that names a PM label itself as
    its GPU type: translate (placed like a request for the label's GPU model), allow (the user
    picks the bin), or deny (refused at submit with a message naming the model to ask for)."""
    max_connections: int = 64
    """Connections served at once (a thread each). When all are taken, the one that has waited
    longest for its request is closed to make room; when all are being answered, a new one is
    refused with a one-line error: job_submit.lua lets the job through as written, a hook
    spools its record."""
    request_timeout_s: float = 1.0
    """A request line must arrive whole within this many seconds of the connection's start (or
    of the previous answer), else the connection is closed: a peer that trickles or idles
    cannot hold a slot. job_submit.lua and the hooks send theirs at once."""
    refresh_s: float = 5.0
    """Seconds between refreshes of the Slurm state (sinfo/squeue)."""
    replan_s: float = 10.0
    """Seconds between re-planning rounds of pending GPU jobs; 0 turns re-planning off."""
    replan_on_epilog: bool = True
    """Re-plan the pending GPU jobs when a job's Epilog reports its end, before Slurm can give
    its GPUs to anyone (Slurm holds them until the Epilog ends): queued jobs then start on the
    GPUs PM-First/PAL picks, not where Slurm would put them."""
    reservation_ttl_s: float = 60.0
    """GPUs handed to a job that Slurm has not shown yet are held this long."""
    route_stall_s: float = 300.0
    """A routed job Slurm leaves pending this long while the GPUs it was routed to stand free
    is handed back to Slurm as its user wrote it (engine/stalled.py): Slurm 24.11 with
    DefCpuPerGPU never starts a job naming several GPU types per node, and CPUs, memory or
    licences may keep one off free GPUs. Longer than a few of Slurm's scheduling passes; 0
    turns it off."""
    slurm_backfill: bool = True
    """The site's Slurm backfills (``SchedulerType=sched/backfill``, Slurm's default): a
    re-planning round goes past a job that fits nowhere yet, as Slurm starts the jobs behind it
    in the holes; false under ``sched/builtin`` (strict FIFO), where nothing behind the head
    starts and re-planning it would only churn."""
    slurm_backfill_reserves: str = "nodes"
    """What the round expects Slurm's backfill to keep free for the jobs that wait: ``nodes``,
    whole nodes for every waiting job over its limit, as sched/backfill plans (measured on
    22.05 and 24.11: tests/slurm/test_backfill_reservations.py), or ``head``, the first one by
    GPU count (EASY, for a scheduler that reserves so). A round that expects less than Slurm
    keeps free mistakes which pending jobs Slurm will start: it leaves one untouched that Slurm
    then starts on a GPU the policy would have kept it off. (The simulated advisor's rounds use
    the simulated Slurm's own rule, so this setting moves no simulated figure.)"""
    slurm_overtime_unlimited: bool = False
    """The site's Slurm lets jobs run past their time limits (``OverTimeLimit=UNLIMITED``):
    its backfill then expects such a job to run a whole limit more, and so does the round
    when it predicts which jobs Slurm starts behind one that fits nowhere. False
    (``OverTimeLimit=0``, Slurm's default): such a job is expected to end now, as Slurm
    kills it."""
    suspicion: str = "report"
    """GPUs that turned slow since their campaign, learnt from every Epilog record
    (core/suspicion.py): off, report (log line, `serve stats`, metrics and the store name
    each suspect GPU and the classes it slows; placement unchanged) or steer (also keeps those
    classes off it from the next decision: its score for them becomes an outlier's). Not steer
    by default: a false suspicion with outliers = wait holds that class's jobs back (up to
    max_wait_s), and the loop's gain is measured in simulation only."""
    suspicion_days: float = 14.0
    """At start and reload, the detector is warmed from the finished jobs the store kept over
    this many days (0: starts cold); at start, the runtimes a wait is weighed against too
    (kept, not re-read, at a reload)."""
    remeasure: bool = False
    """Settle suspect GPUs by measurement (advisor/remeasure.py): the service submits the
    campaign's benchmark for the suspect class (the [campaign] settings, one repeat) as an
    ordinary low-priority job (sbatch --nice) pinned to the GPU's node while that node is
    idle in its view; a result remeasure_slower x the GPU's own campaign time or more confirms
    (a new campaign, the active one with that GPU's runs of the class replaced, is ingested
    and activated), a faster one clears the suspicion. Off by default: it spends GPU time."""
    remeasure_per_hour: int = 2
    """At most this many re-measure jobs submitted in any hour (one in flight per node)."""
    remeasure_retry_s: float = 86400.0
    """A suspect (GPU, class) is benchmarked at most once per this many seconds; one a
    re-measurement found slow is measured again at this pace, to see it recover."""
    remeasure_slower: float = 1.15
    """A re-measurement this many times the GPU's own campaign time (or more) confirms."""
    remeasure_routine_s: float = 604800.0
    """With budget left after the suspects, a GPU not measured for the first class for this
    many seconds is measured routinely (0: never): a fault NVML shows no clock reason for is
    otherwise found only from the runtimes of the jobs that land on it."""
    labels_file: str | None = None
    """labels.json from `site render`; unset: the labels of the active campaign in the store."""
    slurm_backend: str = "auto"
    """How the service reads Slurm and writes its re-plans: cli (sinfo/squeue, scontrol; a
    round's updates through one scontrol where the values allow), pyslurm (libslurm in-process;
    refused at start unless it imports and matches the running Slurm), or auto (pyslurm when
    it would be accepted, else cli). Read once at start (adapters/slurm/pyslurm_backend.py)."""
    slurm_job_read: str = "json"
    """How the cli backend reads jobs: json (``squeue --json``: every field, GPU indices
    included) or brief (``squeue -O`` with the fields the advisor reads: 15-35x less CPU for
    squeue's client at 10,000 jobs, GPU indices of running jobs from the hooks' records on
    22.05). brief is not the default: on the 2-core testbed its cheaper reads ran ~7x as often
    and Epilog records missed their wait in 8 of 10 storm runs (json: 0 of 11; benchmarks/
    README). Read once at start."""
    listen: str | None = None
    """``HOST:PORT`` of a TCP listener for the compute nodes' Prolog/Epilog records (off when
    unset). It serves only the ``record`` op, each record inside a munge credential that is
    checked (uid in record_users, encoding host = the record's node, job on that node)."""
    record_users: tuple[str, ...] = ("root", "slurm")
    """Users whose munge credentials may carry records over TCP: the users the Prolog/Epilog
    (root under slurmd) and EpilogSlurmctld (SlurmUser) run as."""
    munge_socket: str = "/run/munge/munge.socket.2"
    """munged's socket on the controller, for decoding the records' credentials."""


@dataclass(frozen=True)
class HooksConfig:
    """Prolog/Epilog (`slurm-pal hook prolog|epilog`) on the compute nodes."""

    spool_dir: str = "/var/spool/slurm-pal"
    """Job records wait here until the advisor has them; on multi-host clusters put it on a
    shared file system the advisor sweeps, or let `hook flush` deliver over the socket."""
    deliver_timeout_ms: int = 300
    """How long a hook tries to hand its record to the advisor before spooling it."""
    epilog_timeout_ms: int = 900
    """How long the Epilog waits for the advisor's answer: with `advisor.replan_on_epilog` the
    advisor re-plans the queue before answering (the answer's `replan.ms`). A hook returns within
    a second; a round that takes longer still finishes, racing Slurm's next scheduling pass."""
    telemetry: bool = True
    """Sample GPU utilization (NVML) while a job runs; nothing happens on nodes without GPUs."""
    sample_s: float = 5.0
    """Seconds between telemetry samples."""
    advisor: str | None = None
    """``HOST:PORT`` of the advisor's TCP listener (its ``advisor.listen``): hooks on compute
    nodes send their records there, each in a munge credential. Unset: the Unix socket."""
    munge_socket: str = "/run/munge/munge.socket.2"
    """The node's munged socket, for the records' credentials."""


@dataclass(frozen=True)
class SiteLabelsConfig:
    """``[site]``: what `site render` writes into gres.conf."""

    max_labels: int | None = None
    """At most this many gres Type= labels: the closest PM signatures of one GPU model are
    merged (labels ``<model>-pm<rank>``), `site render` prints the PM-score cost per class.
    Unset: one label per signature."""


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics of `slurm-pal serve` (advisor/metrics.py); off unless port or textfile."""

    port: int = 0
    """HTTP port serving /metrics (0 = off)."""
    address: str = "127.0.0.1"
    """Address the port binds: loopback by default; "0.0.0.0" or "::" lets a remote Prometheus
    scrape (the figures name no users or jobs; firewall it like any exporter)."""
    textfile: str | None = None
    """node_exporter textfile collector file (``*.prom``), rewritten atomically; unset = off."""
    textfile_s: float = 15.0
    """Seconds between rewrites of the textfile."""


@dataclass(frozen=True)
class SiteConfig:
    store: StoreConfig = field(default_factory=StoreConfig)
    classes: ClassesConfig = field(default_factory=ClassesConfig)
    binning: BinningConfig = field(default_factory=BinningConfig)
    locality: LocalityConfig = field(default_factory=LocalityConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    classification: ClassificationConfig = field(default_factory=ClassificationConfig)
    advisor: AdvisorConfig = field(default_factory=AdvisorConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    site: SiteLabelsConfig = field(default_factory=SiteLabelsConfig)
    campaign: CampaignSettings = field(default_factory=CampaignSettings)
    """``[campaign]``: campaigns' defaults (campaigns/settings.py, its own loader)."""
    source: str = "<defaults>"

    def resolve_config(self) -> ResolveConfig:
        """What the pure class resolution needs from the site config."""
        return ResolveConfig(
            class_names=self.classes.names,
            default_class=self.classes.default,
            rules=self.classification.rules,
            history_min_runs=self.classification.history_min_runs,
        )


def load_config(path: Path | str | None = None) -> SiteConfig:
    """Read the site config: ``path``, else $SLURM_PAL_CONFIG, else built-in defaults."""
    if path is None:
        path = os.environ.get(ENV_CONFIG) or None
    if path is None:
        return SiteConfig()
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    campaign = data.pop(CAMPAIGN_SECTION, None)
    config = _build(SiteConfig, data, str(path), prefix="")
    config = dataclasses.replace(config, source=str(path))
    if campaign is not None:
        try:
            settings = load_campaign_settings(campaign, str(path), config.classes.names)
        except CampaignSettingsError as exc:
            raise ConfigError(str(exc)) from None
        config = dataclasses.replace(config, campaign=settings)
    _validate(config)
    return config


def _build(cls: type, table: dict[str, Any], source: str, prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(
                f"{source}: unknown key '{name}'; valid keys here: {', '.join(sorted(fields))}"
            )
        hint = hints[key]
        if cls is ClassificationConfig and key == "rules":
            kwargs[key] = _build_rules(value, source, name)
        elif dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{name}' must be a table ([{name}])")
            kwargs[key] = _build(hint, value, source, prefix=f"{name}.")  # type: ignore[arg-type]
        else:
            kwargs[key] = _coerce(hint, value, source, name)
    return cls(**kwargs)


def _build_rules(value: Any, source: str, name: str) -> tuple[ClassRule, ...]:
    """``[[classification.rules]]`` tables -> ClassRule; errors name the rule by its number."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{source}: '{name}' must be tables written as [[{name}]]")
    rules = []
    for number, table in enumerate(value, start=1):
        where = f"{source}: rule {number} of [[{name}]]"
        unknown = sorted(set(table) - set(RULE_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: "
                f"{', '.join(sorted(RULE_KEYS))}"
            )
        for key, item in table.items():
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{where}: '{key}' must be a non-empty string, got {item!r}")
        if not any(k in table for k in RULE_CONDITION_KEYS):
            raise ConfigError(
                f"{where}: needs at least one condition: {', '.join(RULE_CONDITION_KEYS)}"
            )
        if ("class" in table) == ("app" in table):
            raise ConfigError(f"{where}: give exactly one of 'class' or 'app'")
        if "app" in table:
            try:
                check_app_name(table["app"])
            except ValueError as exc:
                raise ConfigError(f"{where}: 'app': {exc}") from None
        rules.append(
            ClassRule(
                user=table.get("user"),
                account=table.get("account"),
                partition=table.get("partition"),
                job_name=table.get("job_name"),
                job_class=table.get("class"),
                app=table.get("app"),
            )
        )
    return tuple(rules)


def _coerce(hint: Any, value: Any, source: str, name: str) -> Any:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
        is_list = typing.get_origin(option) is tuple and isinstance(value, list)
        if is_list and all(isinstance(v, str) for v in value):
            return tuple(value)
    wanted = " or ".join(_type_name(o) for o in options if o is not type(None))
    raise ConfigError(f"{source}: '{name}' must be {wanted}, got {value!r}")


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, str(hint)
    )


def _validate(config: SiteConfig) -> None:
    src = config.source
    names = config.classes.names
    if not names:
        raise ConfigError(f"{src}: 'classes.names' must list at least one class")
    if len(set(names)) != len(names):
        raise ConfigError(f"{src}: 'classes.names' has duplicates: {list(names)}")
    if config.classes.default not in names:
        raise ConfigError(
            f"{src}: 'classes.default' is {config.classes.default!r}; valid values: "
            f"{', '.join(names)}"
        )
    max_labels = config.site.max_labels
    if max_labels is not None and max_labels < 1:
        raise ConfigError(f"{src}: 'site.max_labels' must be >= 1 (or unset), got {max_labels}")
    b = config.binning
    if not 2 <= b.k_min <= b.k_max:
        raise ConfigError(
            f"{src}: need 2 <= 'binning.k_min' <= 'binning.k_max', got {b.k_min}, {b.k_max}"
        )
    if b.outlier_sigma <= 0:
        raise ConfigError(f"{src}: 'binning.outlier_sigma' must be > 0, got {b.outlier_sigma}")
    if b.min_gap < 0:
        raise ConfigError(f"{src}: 'binning.min_gap' must be >= 0, got {b.min_gap}")
    if b.n_init < 1:
        raise ConfigError(f"{src}: 'binning.n_init' must be >= 1, got {b.n_init}")
    _validate_classification(config)
    _validate_advisor(config)
    _validate_metrics(config)
    loc = config.locality
    for key in ("within_node", "within_switch", "across_switches"):
        value = getattr(loc, key)
        if value is not None and value < 1.0:
            raise ConfigError(f"{src}: 'locality.{key}' must be >= 1.0 (a slowdown), got {value}")


def _validate_classification(config: SiteConfig) -> None:
    src, names, c = config.source, config.classes.names, config.classification
    if c.n_classes is not None and not 1 <= c.n_classes <= len(names):
        raise ConfigError(
            f"{src}: 'classification.n_classes' must be within 1..{len(names)} (the number of "
            f"classes.names: {', '.join(names)}), got {c.n_classes}"
        )
    if c.default_source not in CLASSIFY_SOURCES:
        raise ConfigError(
            f"{src}: 'classification.default_source' is {c.default_source!r}; valid values: "
            f"{', '.join(CLASSIFY_SOURCES)}"
        )
    if not 0 <= c.noise_tolerance < 100:
        raise ConfigError(
            f"{src}: 'classification.noise_tolerance' must be within 0..100 percentage points, "
            f"got {c.noise_tolerance}"
        )
    for key in ("n_init", "history_min_runs", "history_window"):
        if getattr(c, key) < 1:
            raise ConfigError(f"{src}: 'classification.{key}' must be >= 1, got {getattr(c, key)}")
    if c.history_window < c.history_min_runs:
        raise ConfigError(
            f"{src}: 'classification.history_window' ({c.history_window}) must be >= "
            f"'classification.history_min_runs' ({c.history_min_runs})"
        )
    for number, rule in enumerate(c.rules, start=1):
        if rule.job_class is not None and rule.job_class not in names:
            raise ConfigError(
                f"{src}: rule {number} of [[classification.rules]]: 'class' is "
                f"{rule.job_class!r}; valid values: {', '.join(names)}"
            )


def _validate_advisor(config: SiteConfig) -> None:
    src, a, h = config.source, config.advisor, config.hooks
    if not config.store.retention_days >= 0:
        raise ConfigError(
            f"{src}: 'store.retention_days' must be >= 0 (0 = keep for ever), got "
            f"{config.store.retention_days}"
        )
    if a.policy not in ADVISOR_POLICIES:
        raise ConfigError(
            f"{src}: 'advisor.policy' is {a.policy!r}; valid values: {', '.join(ADVISOR_POLICIES)}"
        )
    if a.slurm_backend not in SLURM_BACKENDS:
        raise ConfigError(
            f"{src}: 'advisor.slurm_backend' is {a.slurm_backend!r}; valid values: "
            f"{', '.join(SLURM_BACKENDS)}"
        )
    if a.slurm_job_read not in SLURM_JOB_READS:
        raise ConfigError(
            f"{src}: 'advisor.slurm_job_read' is {a.slurm_job_read!r}; valid values: "
            f"{', '.join(SLURM_JOB_READS)}"
        )
    if not a.socket.startswith("/"):
        raise ConfigError(f"{src}: 'advisor.socket' must be an absolute path, got {a.socket!r}")
    for key, value in (("advisor.listen", a.listen), ("hooks.advisor", h.advisor)):
        if value is not None and _host_port_problem(value):
            raise ConfigError(f"{src}: '{key}' {_host_port_problem(value)}")
    positive = {
        "advisor.submit_timeout_ms": a.submit_timeout_ms,
        "advisor.refresh_s": a.refresh_s,
        "advisor.reservation_ttl_s": a.reservation_ttl_s,
        "advisor.max_connections": a.max_connections,
        "advisor.request_timeout_s": a.request_timeout_s,
        "hooks.deliver_timeout_ms": h.deliver_timeout_ms,
        "hooks.epilog_timeout_ms": h.epilog_timeout_ms,
        "hooks.sample_s": h.sample_s,
    }
    for key, amount in positive.items():
        if amount <= 0:
            raise ConfigError(f"{src}: '{key}' must be > 0, got {amount}")
    if a.pack_tolerance < 0:
        raise ConfigError(
            f"{src}: 'advisor.pack_tolerance' must be >= 0 (0 = the paper), got {a.pack_tolerance}"
        )
    if a.route_stall_s < 0:
        raise ConfigError(
            f"{src}: 'advisor.route_stall_s' must be >= 0 (0 = off), got {a.route_stall_s}"
        )
    if a.replan_s < 0:
        raise ConfigError(f"{src}: 'advisor.replan_s' must be >= 0 (0 = off), got {a.replan_s}")
    if a.label_requests not in LABEL_REQUEST_CHOICES:
        raise ConfigError(
            f"{src}: 'advisor.label_requests' is {a.label_requests!r}; valid values: "
            f"{', '.join(LABEL_REQUEST_CHOICES)}"
        )
    if a.suspicion not in SUSPICION_CHOICES:
        raise ConfigError(
            f"{src}: 'advisor.suspicion' is {a.suspicion!r}; valid values: "
            f"{', '.join(SUSPICION_CHOICES)}"
        )
    if not (math.isfinite(a.suspicion_days) and a.suspicion_days >= 0):
        raise ConfigError(
            f"{src}: 'advisor.suspicion_days' must be >= 0 (0 = start cold), got {a.suspicion_days}"
        )
    if a.remeasure_per_hour < 0 or not (
        math.isfinite(a.remeasure_retry_s) and a.remeasure_retry_s >= 0
    ):
        raise ConfigError(
            f"{src}: 'advisor.remeasure_per_hour' and 'advisor.remeasure_retry_s' must be >= 0, "
            f"got {a.remeasure_per_hour} and {a.remeasure_retry_s}"
        )
    if not (math.isfinite(a.remeasure_routine_s) and a.remeasure_routine_s >= 0):
        raise ConfigError(
            f"{src}: 'advisor.remeasure_routine_s' must be >= 0 (0 = never), "
            f"got {a.remeasure_routine_s}"
        )
    if not (math.isfinite(a.remeasure_slower) and a.remeasure_slower > 1):
        raise ConfigError(
            f"{src}: 'advisor.remeasure_slower' must be > 1, got {a.remeasure_slower}"
        )
    if a.slurm_backfill_reserves not in BACKFILL_RESERVES:
        raise ConfigError(
            f"{src}: 'advisor.slurm_backfill_reserves' is {a.slurm_backfill_reserves!r}; valid "
            f"values: {', '.join(BACKFILL_RESERVES)}"
        )
    if a.pin not in PIN_CHOICES:
        raise ConfigError(
            f"{src}: 'advisor.pin' is {a.pin!r}; valid values: {', '.join(PIN_CHOICES)}"
        )
    if a.outliers not in OUTLIER_CHOICES:
        raise ConfigError(
            f"{src}: 'advisor.outliers' is {a.outliers!r}; valid values: "
            f"{', '.join(OUTLIER_CHOICES)}"
        )
    if not a.avoid_above >= 1.0:
        raise ConfigError(
            f"{src}: 'advisor.avoid_above' must be a PM-score >= 1.0 (1.0 = the median GPU), "
            f"got {a.avoid_above}"
        )
    if not (math.isfinite(a.assumed_runtime_s) and a.assumed_runtime_s > 0):
        raise ConfigError(
            f"{src}: 'advisor.assumed_runtime_s' must be > 0 seconds, got {a.assumed_runtime_s}"
        )
    if not 0 < a.limit_share <= 1:
        raise ConfigError(
            f"{src}: 'advisor.limit_share' must be a share of the time limit in (0, 1], "
            f"got {a.limit_share}"
        )
    if not (math.isfinite(a.max_wait_s) and 0 <= a.max_wait_s <= 7 * 86400):
        raise ConfigError(
            f"{src}: 'advisor.max_wait_s' must be 0-604800 seconds (0 = never wait), "
            f"got {a.max_wait_s}"
        )


def _validate_metrics(config: SiteConfig) -> None:
    src, m = config.source, config.metrics
    if not 0 <= m.port <= 65535:
        raise ConfigError(f"{src}: 'metrics.port' must be 1-65535 (0 = off), got {m.port}")
    if not m.address:
        raise ConfigError(f"{src}: 'metrics.address' must be an IP address, got ''")
    if m.textfile is not None and not (m.textfile.startswith("/") and m.textfile.endswith(".prom")):
        raise ConfigError(
            f"{src}: 'metrics.textfile' must be an absolute path ending in .prom (what "
            f"node_exporter's textfile collector reads), got {m.textfile!r}"
        )
    if m.textfile_s <= 0:
        raise ConfigError(f"{src}: 'metrics.textfile_s' must be > 0, got {m.textfile_s}")


def split_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError saying what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"must be HOST:PORT (port 1-65535), got {value!r}")
    return host, int(port)


def _host_port_problem(value: str) -> str | None:
    try:
        _, port = split_host_port(value)
    except ValueError as exc:
        return str(exc)
    return None if port else f"must be HOST:PORT (port 1-65535), got {value!r}"


def default_db_path() -> Path:
    """/var/lib/slurm-pal for root (the controller), the XDG data dir for everyone else."""
    if os.geteuid() == 0:
        return SYSTEM_DB
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "slurm-pal" / "slurm-pal.db"


def resolve_db_path(cli_value: Path | str | None, config: SiteConfig) -> Path:
    """--db, else $SLURM_PAL_DB, else the config's store.path, else :func:`default_db_path`."""
    for candidate in (cli_value, os.environ.get(ENV_DB) or None, config.store.path):
        if candidate:
            return Path(candidate).expanduser()
    return default_db_path()
