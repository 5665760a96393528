"""Prometheus metrics of the running advisor (``[metrics]`` in the site config; off by default).

Why a collector over :class:`~slurm_pal.advisor.counters.Counters` instead of prometheus-client
counters in the code paths: the service keeps one set of counters (``serve stats`` shows the
same figures), the decide path stays free of a second lock, and nothing is registered in the
client's global registry (a private ``CollectorRegistry``, so tests and embedders can run
several services in one process). Values are read at scrape time; the histograms are
cumulative since the service started.

Two ways out: an HTTP endpoint (``metrics.port``, bound to ``metrics.address``, loopback by
default) serving ``/metrics``, or a node_exporter textfile (``metrics.textfile``, ``*.prom``)
rewritten atomically (temporary file in the same folder, then rename) every
``metrics.textfile_s``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from slurm_pal.adapters.config import MetricsConfig
    from slurm_pal.advisor.counters import Histogram
    from slurm_pal.advisor.server import AdvisorServer

__all__ = ["AdvisorCollector", "MetricsExporter", "registry_for", "spool_backlog"]

log = logging.getLogger("slurm_pal.advisor")

PREFIX = "slurm_pal"
DECISION_ACTIONS = ("route", "pass", "wait", "deny")

# counters of Counters.snapshot() exported one to one: name -> (metric name, help)
PLAIN_COUNTERS = {
    "decide_errors": ("decide_errors", "Decide requests answered with an error."),
    "decide_late": (
        "decide_late",
        "Decide requests read past the plugin's deadline and dropped (the job went through "
        "as written).",
    ),
    "decide_repeats": (
        "decide_repeats",
        "Decide answers given again to a repeat of a request decided on the same state.",
    ),
    "answers_undelivered": (
        "answers_undelivered",
        "Routes sent past the plugin's deadline or to a gone peer (reservation released).",
    ),
    "fail_open": (
        "fail_open",
        "GPU jobs job_submit.lua let through as written without an answer (its fail-open "
        "file, counted since the advisor started reading it).",
    ),
    "replans": ("replan_rounds", "Re-planning rounds run (periodic, replan op and job ends)."),
    "replans_at_job_end": ("replan_rounds_job_end", "Re-planning rounds started by a job's end."),
    "replans_coalesced": (
        "replan_rounds_coalesced",
        "Job ends answered by a round another job end started.",
    ),
    "replan_updates": ("slurm_writes", "Pending jobs updated in Slurm (scontrol update)."),
    "replan_failed": (
        "slurm_write_failures",
        "Pending-job updates Slurm refused or that failed.",
    ),
    "routes_released": (
        "routes_released",
        "Routed jobs Slurm left pending on free GPUs for advisor.route_stall_s, handed back "
        "to Slurm as their users wrote them.",
    ),
    "routes_stalled": (
        "routes_stalled",
        "Such routes Slurm cannot hand back (22.05 cannot untype a request): logged only.",
    ),
    "refresh_errors": ("slurm_read_errors", "Slurm reads (sinfo/squeue) that failed."),
    "spool_applied": ("spool_applied", "Spooled records the sweep delivered."),
    "bad_requests": ("bad_requests", "Malformed requests on the socket."),
    "peer_refused": ("peers_refused", "Connections refused by the peer uid check."),
    "connections_refused": (
        "connections_refused",
        "Connections refused past advisor.max_connections.",
    ),
    "connections_closed_for_room": (
        "connections_closed_for_room",
        "Connections still waiting for their request, closed to make room for a new one.",
    ),
    "requests_timed_out": (
        "requests_timed_out",
        "Connections closed because no whole request came within advisor.request_timeout_s.",
    ),
    "reloads": ("reloads", "Reloads of config and labels applied (SIGHUP, serve reload)."),
    "reloads_refused": ("reloads_refused", "Reloads refused (bad config or labels.json)."),
}
HISTOGRAMS = {
    "decide": ("decide_duration_seconds", "The service's own time per decide request."),
    "replan_round": (
        "replan_round_duration_seconds",
        "Re-planning rounds: plan and Slurm writes.",
    ),
    "job_end": (
        "job_end_wait_seconds",
        "How long an Epilog waited for its answer (its round and the record's store write).",
    ),
    "slurm_read": (
        "slurm_read_duration_seconds",
        "Slurm reads (squeue, sinfo, parsed; the pending queue worked out) by the refresh thread.",
    ),
}


def spool_backlog(spool_dir: Path) -> int:
    """Records waiting in the hooks' spool folder (``*.json`` not starting with ``.``)."""
    try:
        return sum(1 for p in spool_dir.glob("*.json") if not p.name.startswith("."))
    except OSError:
        return 0


def _int(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


class AdvisorCollector(Collector):
    """Everything ``serve stats`` and ``serve health`` know, as Prometheus metrics."""

    def __init__(self, server: AdvisorServer) -> None:
        self.server = server

    def describe(self) -> list[Metric]:
        return []  # registering must not run a collection

    def collect(self) -> Iterator[Metric]:
        server = self.server
        server.poll_fail_opens()
        stats = server.counters.snapshot()
        health = server.state.health()

        decisions = CounterMetricFamily(
            f"{PREFIX}_decisions",
            "Decide answers by outcome (route, pass, wait, deny).",
            labels=["action"],
        )
        for action in DECISION_ACTIONS:
            decisions.add_metric([action], _int(stats.get(f"decide_{action}")))
        yield decisions
        for key, (name, text) in PLAIN_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=_int(stats.get(key)))

        records = CounterMetricFamily(
            f"{PREFIX}_records",
            "Prolog/Epilog records by result: stored, duplicate (already stored), rejected "
            "(not a valid record: spooled files set aside as .bad, or refused over TCP).",
            labels=["result"],
        )
        total, duplicate = _int(stats.get("records_total")), _int(stats.get("records_duplicate"))
        records.add_metric(["stored"], total - duplicate)
        records.add_metric(["duplicate"], duplicate)
        rejected = _int(stats.get("spool_bad")) + _int(stats.get("records_rejected"))
        records.add_metric(["rejected"], rejected)
        yield records

        for key, hist in server.counters.histograms().items():
            name, text = HISTOGRAMS[key]
            yield _histogram(f"{PREFIX}_{name}", text, hist)

        gauges: dict[str, tuple[str, float]] = {
            "spool_backlog": (
                "Records waiting in the hooks' spool folder.",
                spool_backlog(server.spool_dir),
            ),
            "store_write_backlog": (
                "Store writes not yet written: queued behind the writer thread, or waiting "
                "for a store another process holds locked (in memory and on disk).",
                server.state.writer.backlog(),
            ),
            "store_locked_seconds": (
                "Seconds the store has been locked by another process (0: it is not).",
                server.state.writer.locked_for(),
            ),
            "gpus": ("GPUs the advisor routes to (active campaign).", _int(health.get("gpus"))),
            "free_gpus": ("GPUs free in the advisor's view.", _int(health.get("free"))),
            "reservations": (
                "Routes holding GPUs until Slurm shows their job.",
                _int(health.get("reservations")),
            ),
            "uptime_seconds": ("Seconds since the service started.", _int(stats.get("uptime_s"))),
        }
        age = health.get("state_age_s")
        gauges["state_age_seconds"] = (
            "Age of the advisor's Slurm view (NaN before the first read).",
            float(age) if isinstance(age, int | float) else math.nan,
        )
        for name, (text, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value)
        suspects = GaugeMetricFamily(
            f"{PREFIX}_suspect_gpus",
            "GPUs suspect of running slower than their campaign says, per job class "
            "(advisor.suspicion; steered around with steer).",
            labels=["class"],
        )
        classes = server.state.config.classes.names
        for job_class, count in server.state.suspects.per_class(classes).items():
            suspects.add_metric([job_class], count)
        yield suspects
        yield from _runtimes(server.state.runtimes.current.learned())
        info = InfoMetricFamily(f"{PREFIX}_advisor", "What the advisor serves.")
        info.add_metric(
            [],
            {
                "version": str(health.get("version") or ""),
                "policy": str(health.get("policy") or ""),
                "campaign": str(health.get("campaign") or ""),
                "problem": str(health.get("problem") or ""),
            },
        )
        yield info


def _runtimes(learned: Mapping[str, Mapping[str, float | int | None]]) -> Iterator[Metric]:
    """What the wait rule's runtime model learned (NaN: too few jobs to say yet)."""
    jobs = GaugeMetricFamily(
        f"{PREFIX}_runtime_jobs",
        "Finished jobs the learned runtimes rest on (the last 2000 of each kind): limited, "
        "or unlimited of a size.",
        labels=["kind"],
    )
    medians = GaugeMetricFamily(
        f"{PREFIX}_runtime_unlimited_median_seconds",
        "What an unlimited job of a size is weighed as running (the median of those that "
        "ended; NaN: too few yet, the policy's assumed_runtime_s stands).",
        labels=["size"],
    )
    near = GaugeMetricFamily(
        f"{PREFIX}_runtime_limit_share_near",
        "The share of its time limit a job with this limit is weighed as running (the mean "
        "share of the jobs that ended with the nearest limits), at the site's typical limits.",
        labels=["limit_seconds"],
    )
    share = math.nan
    for kind, row in learned.items():
        if "limit_s" in row:
            near.add_metric([f"{float(row['limit_s'] or 0):g}"], _or_nan(row["limit_share"]))
            continue
        jobs.add_metric([kind], float(row.get("jobs") or 0))
        if "limit_share" in row:
            share = _or_nan(row["limit_share"])
        else:
            medians.add_metric([kind.removeprefix("unlimited ")], _or_nan(row.get("median_s")))
    yield jobs
    yield medians
    yield GaugeMetricFamily(
        f"{PREFIX}_runtime_limit_share",
        "The median share of their time limit the limited jobs that ended used, site-wide "
        "(NaN: too few yet, the policy's limit_share stands); a job is weighed by the limits "
        f"nearest its own ({PREFIX}_runtime_limit_share_near).",
        value=share,
    )
    yield near


def _or_nan(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _histogram(name: str, text: str, hist: Histogram) -> HistogramMetricFamily:
    buckets = [
        ("+Inf" if math.isinf(bound) else _bound(bound), float(count))
        for bound, count in hist.cumulative()
    ]
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=hist.sum)


def _bound(value: float) -> str:
    return repr(float(value))


def registry_for(server: AdvisorServer) -> CollectorRegistry:
    """A private registry holding only this service's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AdvisorCollector(server))
    return registry


class MetricsExporter:
    """The configured way out: HTTP endpoint, textfile, both, or nothing."""

    def __init__(self, config: MetricsConfig, server: AdvisorServer) -> None:
        self.config = config
        self.registry = registry_for(server)
        self._http: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.port: int | None = None  # the bound port (metrics.port, or the one picked for 0)

    @property
    def enabled(self) -> bool:
        return bool(self.config.port or self.config.textfile)

    def start(self) -> None:
        """Bind the endpoint and write the textfile once; OSError says why either failed."""
        cfg = self.config
        if cfg.port:
            server, _thread = start_http_server(cfg.port, addr=cfg.address, registry=self.registry)
            self._http = server
            self.port = int(server.server_address[1])
            log.info("metrics on http://%s:%d/metrics", _host(cfg.address), self.port)
        if cfg.textfile:
            self.write_textfile()
            self._thread = threading.Thread(target=self._textfile_loop, name="metrics", daemon=True)
            self._thread.start()
            log.info("metrics written to %s every %gs", cfg.textfile, cfg.textfile_s)

    def write_textfile(self) -> None:
        assert self.config.textfile is not None
        write_to_textfile(self.config.textfile, self.registry)

    def _textfile_loop(self) -> None:
        while not self._stop.wait(self.config.textfile_s):
            try:
                self.write_textfile()
            except OSError as exc:
                log.warning("cannot write %s: %s", self.config.textfile, exc)

    def stop(self) -> None:
        """Close the endpoint; the textfile gets one last write (node_exporter shows its age)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            try:
                self.write_textfile()
            except OSError as exc:
                log.warning("cannot write %s: %s", self.config.textfile, exc)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
