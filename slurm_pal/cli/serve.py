"""`slurm-pal serve`: run the advisor service, and ask a running one (health, stats, replan,
reload).

The service runs in the foreground (systemd or the testbed own the process; `--foreground`
is accepted for scripts written against PROTOCOL.md). Defaults come from the site config's
``[advisor]`` table; the global ``--db``/``--config`` select the store and the config. SIGHUP
and `serve reload` re-read the config and labels.json (advisor/reload.py); ``[metrics]`` turns
on the Prometheus endpoint or textfile (advisor/metrics.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.table import Table

from slurm_pal.cli.common import AppState, console, fail, print_json, reported_errors, state

if TYPE_CHECKING:  # imported where used: a probe (serve health) must start fast
    from slurm_pal.adapters.slurm.pyslurm_backend import BackendChoice
    from slurm_pal.advisor.server import AdvisorServer
    from slurm_pal.advisor.state import AdvisorState

app = typer.Typer(
    rich_markup_mode=None,
    help="The advisor service on the controller (PROTOCOL.md): run it, or ask a running one.",
    invoke_without_command=True,
)

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
#: Outside systemd's journal (which stamps each line itself) a line carries its time: a slow
#: round or a late answer can only be read against the Epilogs' and Slurm's own logs.
STAMPED_LOG_FORMAT = "%(asctime)s.%(msecs)03d " + LOG_FORMAT


def log_format(environ: Mapping[str, str]) -> str:
    """:data:`LOG_FORMAT` under systemd (``JOURNAL_STREAM`` set), else with a timestamp."""
    return LOG_FORMAT if environ.get("JOURNAL_STREAM") else STAMPED_LOG_FORMAT


def _socket(app_state: AppState, socket: Path | None) -> Path:
    return socket if socket is not None else Path(app_state.config.advisor.socket)


@app.callback()
def serve(
    ctx: typer.Context,
    socket: Path | None = typer.Option(
        None, "--socket", help="Unix socket (default: advisor.socket).", show_default=False
    ),
    policy: str | None = typer.Option(
        None,
        "--policy",
        help="packed-pm, pal, pm-first, packed or random (default: advisor.policy).",
        show_default=False,
    ),
    labels: Path | None = typer.Option(
        None,
        "--labels",
        help="labels.json of `site render` (default: advisor.labels_file, "
        "else the active campaign's labels).",
        show_default=False,
    ),
    refresh_s: float | None = typer.Option(
        None,
        "--refresh-s",
        help="Seconds between Slurm reads (default: advisor.refresh_s).",
        show_default=False,
    ),
    replan_s: float | None = typer.Option(
        None,
        "--replan-s",
        help="Seconds between re-planning rounds, 0 = off (default: advisor.replan_s).",
        show_default=False,
    ),
    pidfile: Path | None = typer.Option(None, "--pidfile", help="Write our pid here."),
    init_store: bool = typer.Option(
        False,
        "--init-store",
        help="Create a new store even where an empty (0-byte) or foreign file is (it is "
        "replaced); without it serve refuses to start on one.",
    ),
    foreground: bool = typer.Option(
        True,
        "--foreground/--no-foreground",
        help="Accepted for compatibility; always runs in the foreground.",
        hidden=True,
    ),
) -> None:
    """Run the advisor service in the foreground until SIGTERM/SIGINT."""
    app_state = state(ctx)
    ctx.obj = app_state
    ctx.meta["socket"] = socket
    if ctx.invoked_subcommand is not None:
        return
    with reported_errors():
        _run(app_state, socket, policy, labels, refresh_s, replan_s, pidfile, init_store)


def _run(
    app_state: AppState,
    socket: Path | None,
    policy: str | None,
    labels: Path | None,
    refresh_s: float | None,
    replan_s: float | None,
    pidfile: Path | None,
    init_store: bool = False,
) -> None:
    """Check the options, open the store, choose the Slurm backend, build the service and run
    it until a signal stops it."""
    from slurm_pal.advisor.logtext import OneLineFormatter

    handler = logging.StreamHandler(sys.stderr)
    # Job names, comments and user names reach the log: one event stays one line.
    handler.setFormatter(OneLineFormatter(log_format(os.environ), datefmt="%Y-%m-%dT%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    _check_options(policy, refresh_s, replan_s)
    store_open = _open_store(app_state.db_path, init_store)
    backend = _slurm_backend(app_state)
    server, advisor_state = _service(
        app_state, socket, policy, labels, refresh_s, replan_s, backend
    )
    _serve_until_stopped(server, advisor_state, app_state, pidfile, store_open)


def _check_options(policy: str | None, refresh_s: float | None, replan_s: float | None) -> None:
    from slurm_pal.adapters.config import ADVISOR_POLICIES

    if policy is not None and policy not in ADVISOR_POLICIES:
        fail(f"unknown policy {policy!r}; valid: {', '.join(ADVISOR_POLICIES)}")
    for name, value in (("--refresh-s", refresh_s), ("--replan-s", replan_s)):
        if value is not None and value < 0:
            fail(f"{name} must be >= 0, got {value}")
    if refresh_s is not None and refresh_s == 0:
        fail("--refresh-s must be > 0")


def _open_store(db_path: Path, init_store: bool) -> bool:
    """Whether the store opened; locked by another process, the service starts without it
    (fail open) and keeps trying."""
    from slurm_pal.adapters.store import StoreError
    from slurm_pal.adapters.store_guard import StoreGuardError, try_open_store

    try:
        return try_open_store(db_path, init=init_store)
    except StoreGuardError as exc:
        fail(str(exc))
    except StoreError as exc:
        fail(f"cannot open the store: {exc}")


def _slurm_backend(app_state: AppState) -> BackendChoice:
    """The Slurm backend, chosen once: a reload keeps the backend the service started with."""
    from slurm_pal.adapters.slurm.pyslurm_backend import BackendError, choose_backend

    advisor = app_state.config.advisor
    try:
        backend = choose_backend(
            advisor.slurm_backend, brief_jobs=advisor.slurm_job_read == "brief"
        )
    except BackendError as exc:
        fail(str(exc))
    logging.getLogger("slurm_pal.advisor").info("Slurm backend: %s (%s)", backend.name, backend.why)
    return backend


def _service(
    app_state: AppState,
    socket: Path | None,
    policy: str | None,
    labels: Path | None,
    refresh_s: float | None,
    replan_s: float | None,
    backend: BackendChoice,
) -> tuple[AdvisorServer, AdvisorState]:
    """The advisor service, not started yet, and its state (whose store writer the caller
    closes when the service cannot start). The options given here outlive a reload."""
    from slurm_pal.advisor.heap import FrozenHeap
    from slurm_pal.advisor.reload import Overrides, Reloader
    from slurm_pal.advisor.server import AdvisorServer
    from slurm_pal.advisor.state import AdvisorState

    config = app_state.config
    advisor_state = AdvisorState(
        config,
        app_state.db_path,
        backend.reader,
        policy=policy,
        labels_file=None if labels is None else str(labels),
    )
    reloader = Reloader(
        app_state.config_path,
        Overrides(policy=policy, labels=labels, refresh_s=refresh_s, replan_s=replan_s),
    )
    reloader.remember(config)
    server = AdvisorServer(
        advisor_state,
        _socket(app_state, socket),
        refresh_s=refresh_s,
        replan_s=replan_s,
        reload_config=lambda: reloader(server),
        applier=backend.applier,
        heap=FrozenHeap(),
    )
    return server, advisor_state


def _serve_until_stopped(
    server: AdvisorServer,
    advisor_state: AdvisorState,
    app_state: AppState,
    pidfile: Path | None,
    store_open: bool,
) -> None:
    """Start the metrics and the service, then wait for SIGTERM/SIGINT (stop) and SIGHUP
    (reload) until stopped; the pidfile lives exactly as long as the service."""
    from slurm_pal.adapters.store_guard import try_open_store
    from slurm_pal.advisor.metrics import MetricsExporter
    from slurm_pal.advisor.server import ReloadRefused

    log = logging.getLogger("slurm_pal.advisor")
    done = threading.Event()
    hangup = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        done.set()

    def reload_signal(_signum: int, _frame: object) -> None:
        hangup.set()  # the main loop reloads: a handler must not wait for the service's locks

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload_signal)
    # Metrics first: once the socket answers health, /metrics answers too (one probe suffices).
    m = app_state.config.metrics
    metrics = MetricsExporter(m, server)
    try:
        metrics.start()
    except OSError as exc:
        advisor_state.writer.close()
        where = f"{m.address}:{m.port}" if m.port else str(m.textfile)
        fail(f"cannot serve metrics on {where}: {exc.strerror or exc}")
    if pidfile is not None:  # before the socket: once health answers, the pid is there
        pidfile.write_text(f"{os.getpid()}\n")
    db_path = app_state.db_path
    try:
        server.start(None if store_open else lambda: try_open_store(db_path))
    except Exception as exc:
        metrics.stop()
        advisor_state.writer.close()
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)
        fail(f"cannot start the advisor: {exc}")
    try:
        while not done.is_set():
            if not hangup.wait(0.5):
                continue
            hangup.clear()
            log.info("SIGHUP: reloading")
            try:
                server.reload()
            except ReloadRefused:
                pass  # logged with its reason; the running config is kept
            except Exception as exc:
                log.warning("reload failed: %s", exc)
    finally:
        metrics.stop()
        server.stop()
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)


SOCKET_OPT = typer.Option(
    None,
    "--socket",
    help="Unix socket of the running advisor (default: `serve --socket`, else advisor.socket).",
    show_default=False,
)


def _ask(ctx: typer.Context, op: str, timeout_s: float, socket: Path | None, as_json: bool) -> dict:
    """The advisor's answer to ``op``; when it is down or answers an error: one line on
    stderr (or ``{"ok": false, "error": ...}`` on stdout with ``--json``) and exit 1."""
    from slurm_pal.advisor.client import AdvisorClient, AdvisorUnavailable

    app_state = state(ctx)
    with reported_errors():
        # the subcommand's --socket, else the group's (meta is shared with the group)
        path = _socket(app_state, socket if socket is not None else ctx.meta.get("socket"))
    try:
        answer = AdvisorClient(str(path)).request({"v": 1, "op": op}, timeout_s)
    except AdvisorUnavailable as exc:
        _refused(str(exc), as_json)
    if not answer.get("ok"):
        _refused(f"the advisor answered: {answer.get('error')}", as_json)
    return answer


def _refused(message: str, as_json: bool) -> NoReturn:
    if as_json:
        print_json({"ok": False, "error": message})
        raise typer.Exit(1)
    fail(message, code=1)


@app.command()
def health(
    ctx: typer.Context,
    socket: Path | None = SOCKET_OPT,
    as_json: bool = typer.Option(
        False, "--json", help='Print the answer as JSON ({"ok": false, "error": ...} when down).'
    ),
) -> None:
    """Is the advisor up, and what does it serve (campaign, policy, GPUs, free GPUs).
    Exit 0 when it answers, 1 when it is down or answers an error."""
    answer = _ask(ctx, "health", 5.0, socket, as_json)
    if as_json:
        print_json(answer)
        return
    _table("advisor health", answer)


@app.command()
def stats(
    ctx: typer.Context,
    socket: Path | None = SOCKET_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the counters as JSON."),
) -> None:
    """The running advisor's counters (decides, records, re-plans, latency p50/p99), the
    runtimes it learned from the jobs that ended (what a wait is weighed against) and the
    GPUs it suspects of running slower than their campaign says."""
    answer = _ask(ctx, "stats", 5.0, socket, as_json)
    if as_json:
        print_json(answer)
        return
    suspects = answer.pop("suspect_gpus", None) or []
    runtimes = answer.pop("runtimes", None) or {}
    _table("advisor stats", answer)
    if runtimes:
        _runtimes_table(runtimes)
    if suspects:
        _suspects_table(suspects)


def _runtimes_table(rows: dict) -> None:
    """What a job is weighed as running: the share of its limit a limited job is expected to
    use (site-wide, and at the site's typical limits, which the jobs nearest them decide), what
    an unlimited one of each size runs; "-" where too few jobs ended to say."""
    table = Table(
        title="learned runtimes (waits are weighed against them)",
        caption="-: too few jobs ended yet; the policy's limit_share or assumed_runtime_s "
        "stands (a size with too few unlimited jobs takes any size's)",
    )
    for column in ("jobs of", "expected", "jobs it rests on"):
        table.add_column(column)
    for kind, row in rows.items():
        share, median = row.get("limit_share"), row.get("median_s")
        if "limit_share" in row:
            expected = "-" if share is None else f"{float(share):.0%} of the limit"
        else:
            expected = "-" if median is None else f"{float(median) / 3600:.2f} h"
        rests_on = str(row.get("jobs", 0))
        if "limit_s" in row:
            rests_on = f"the {rests_on} nearest limits"
        table.add_row(kind, expected, rests_on)
    console.print(table)


def _suspects_table(rows: list[dict]) -> None:
    """One line per suspect (GPU, class): since when, why, the slowdown and the jobs seen."""
    table = Table(title="suspect GPUs")
    for column in ("GPU", "node:gpu", "class", "since (UTC)", "cause", "slowdown", "jobs"):
        table.add_column(column)
    for row in rows:
        for job_class, s in sorted(row.get("classes", {}).items()):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(s["since_s"])))
            slowdown = "-" if s.get("slowdown") is None else f"{s['slowdown']:.2f}x"
            jobs = ",".join(str(j) for j in s.get("evidence", [])) or "-"
            table.add_row(str(row.get("gpu")), str(row.get("where") or "-"), job_class, since,
                          str(s.get("cause")), slowdown, jobs)  # fmt: skip
    console.print(table)


@app.command()
def replan(
    ctx: typer.Context,
    socket: Path | None = SOCKET_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Run one re-planning round now and show what it changed."""
    answer = _ask(ctx, "replan", 120.0, socket, as_json)
    if as_json:
        print_json(answer)
        return
    _table("re-planning round", answer)


@app.command()
def reload(
    ctx: typer.Context,
    socket: Path | None = SOCKET_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """Re-read the config file and labels.json in the running advisor (as SIGHUP does):
    policy settings, timings and the label map change live; reservations and decisions stay.
    A config or labels.json it cannot use is refused (exit 1) and the running one kept."""
    answer = _ask(ctx, "reload", 120.0, socket, as_json)
    if as_json:
        print_json(answer)
        return
    changed = answer.get("changed") or []
    typer.echo("reloaded: " + ("; ".join(map(str, changed)) if changed else "no change"))


def _table(title: str, answer: dict) -> None:
    table = Table(title=title)
    table.add_column("key")
    table.add_column("value")
    for key, value in answer.items():
        if key in ("v", "ok"):
            continue
        table.add_row(key, "-" if value is None else str(value))
    console.print(table)
