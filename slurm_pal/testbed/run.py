"""One trace, its arms, a real Slurm: the measured gain of the advisor over plain packing.

Why: the PAL paper checked its simulator against a real cluster (Table IV). We have no GPUs but
a real Slurm, so the testbed emulates the variability (:mod:`slurm_pal.testbed.emulate`) and
runs the same trace twice on the same emulated cluster:

* ``advisor``: the rendered job_submit.lua asks ``slurm-pal serve`` (PROTOCOL.md), which steers
  jobs to GPU types by class (jobs name their application: ``--comment=pal:app=emu-a``; the
  applications are registered in the store with their class);
* ``control``: the same job_submit.lua, Prolog/Epilog and service, serving ``policy =
  "packed"``: the advisor leaves every job to Slurm's packing. It differs from ``advisor`` only
  in the policy, so the ratio advisor / control is the placement's own effect (the default);
* ``stock``: cons_tres places untyped GPU requests (no job_submit.lua, no hooks, no service):
  what a site has today. Against it the advisor's ratio also holds what the machinery costs or
  shifts in Slurm's timing (on the demo's trace the control measured ~0.91 x stock).

``--repeats N`` runs the arms N times, alternating which goes first (evidence.py), and reports
each repeat's ratio, their median and range, beside the simulator's prediction of the same pair.

Both arms submit with plain ``sbatch`` at the trace's (compressed) arrival times, under strict
FIFO (``sched/builtin``): Slurm's time limits are whole minutes, so backfill cannot be told
when second-long jobs end; the simulator's prediction uses FIFO without backfill as well. The
prediction simulates the advisor the arm serves, from the config file ``serve`` reads
(:func:`slurm_pal.sim.advisor.advisor_sim_options`, as ``sim run --config`` does): the site's
policy (shipped: packed-pm) unless ``--policy`` names another.
Every job writes its own record (GPUs got, slowdown, start and end); ``squeue --json`` (jobs
kept for MinJobAge) gives Slurm's view and the advisor's admin comments.

Both arms run on the multi-host testbed (:mod:`slurm_pal.testbed.multihost`; ``--single-host``:
every daemon on one host): the advisor on the controller host, each node's slurmd and the
hooks on a compute host of their own, the records reaching the advisor over TCP in munge
credentials, as on a cluster.

The advisor arm is a :class:`Arm` like the stock one: what it adds to the testbed (Lua,
Prolog/Epilog) and what it starts and stops around the trace (the service).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

import numpy as np

from slurm_pal.adapters.campaign_csv import read_campaign_csv
from slurm_pal.adapters.config import ADVISOR_POLICIES, SiteConfig, load_config
from slurm_pal.adapters.slurm.state import flat_job_json
from slurm_pal.adapters.store import Store
from slurm_pal.core.workload import SimJob
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.errors import SlurmPalError
from slurm_pal.sim import SimConfig, SimGpus, simulate
from slurm_pal.sim.advisor import advisor_sim_options
from slurm_pal.site.render import HookSettings, plan_from_store, render_files, write_site
from slurm_pal.testbed.cluster import LocalSlurm, NodeSpec, TestbedError
from slurm_pal.testbed.emulate import (
    CLASSES,
    SITE_HOUR_S,
    SITE_TRACES,
    ArmMetrics,
    EmulationError,
    TraceJob,
    arm_metrics,
    campaign_frame,
    drawn_gpus,
    job_slowdown,
    make_trace,
    p99,
    score_table,
)
from slurm_pal.testbed.evidence import (
    LATENCIES_S,
    RATIO_KEYS,
    TIMING_DRAWS,
    TIMING_JITTER_S,
    arm_order,
    baseline_arm,
    calibrated_latency,
    pair_ratios,
    spread,
    summarize_pair,
)
from slurm_pal.testbed.hosts import CONTROLLER_OCTET, SUBNET
from slurm_pal.testbed.multihost import MultiHostSlurm
from slurm_pal.testbed.programs import SYSTEM_RELEASES, default_release

__all__ = [
    "ARMS",
    "CONTROL_POLICY",
    "DEFAULT_ARMS",
    "AdvisorArm",
    "Arm",
    "ArmResult",
    "ArmUnavailable",
    "Prepared",
    "RunSettings",
    "StockArm",
    "app_name",
    "prediction_configs",
    "prepare",
    "public_report",
    "run_arm",
    "run_testbed",
    "simulate_prediction",
]

ARMS = ("stock", "control", "advisor")
DEFAULT_ARMS = ("control", "advisor")
CONTROL_POLICY = "packed"
"""What the control arm's service serves: every job left to Slurm's packing."""
NEVER_STARTS = frozenset({"BadConstraints", "JobHeldAdmin", "JobHeldUser", "PartitionConfig"})
"""Pending reasons after which Slurm will not start a job by itself: the run stops at once."""
FIFO = ("SchedulerType=sched/builtin",)
TESTBED_CPUS = 8
"""CPUs of each testbed node (:class:`LocalSlurm`'s default)."""
BACKFILL = (
    "SchedulerType=sched/backfill",
    "SchedulerParameters=batch_sched_delay=0,bf_interval=1,bf_resolution=1,bf_continue",
    "OverTimeLimit=UNLIMITED",
)
"""The scheduler of the site-like traces, whose jobs carry limits: backfill, as sites run it,
at the testbed's time scale (a pass every second, limits planned to the second; a site's 30 s
and 60 s would be half an hour and an hour of its time here). Slurm plans with the limits but
kills no job past its limit (``OverTimeLimit``): the simulator lets a job slowed past its limit
finish, so both count the same work (on a site the job would be killed and its work lost,
which the comparison leaves out)."""
RECORD_PORT = 7001
"""The advisor's TCP listener for the hooks' records on the multi-host testbed's controller."""
Progress = Callable[[str], None]


class ArmUnavailable(SlurmPalError, RuntimeError):
    """An arm cannot run here (e.g. the advisor service is not installed); says what is missing."""


def app_name(job_class: str) -> str:
    """The application each emulated job names in ``--comment=pal:app=NAME``."""
    return f"emu-{job_class.lower()}"


@dataclass(frozen=True)
class RunSettings:
    """What `slurm-pal testbed run` runs: cluster, profile, trace, arms."""

    root: Path
    nodes: int = 4
    gpus_per_node: int = 4
    node_prefix: str = "n"
    device_pattern: str = "/dev/tty{index}"
    profile: str = "example"
    profile_seed: int = 0
    longhorn_dir: Path | None = None
    trace: str = "mixed48"
    trace_seed: int = 0
    scale: float = 1.0
    arms: tuple[str, ...] = DEFAULT_ARMS
    repeats: int = 1
    """Runs of every arm; the arms alternate which goes first (:func:`arm_order`)."""
    policy: str | None = None
    """The advisor's policy; None: ``advisor.policy`` of ``config`` (shipped: packed-pm), so
    the testbed measures the advisor a site would deploy. ``pal`` reproduces the paper's."""
    replan_s: float = 0.0
    """The advisor's periodic re-planning in the testbed (0 = off, the default): with second-long
    jobs a period is too coarse; ``replan_on_epilog`` re-plans at every job end instead."""
    replan_on_epilog: bool | None = None
    """The advisor re-plans the pending jobs from each job's Epilog, before Slurm reuses its
    GPUs; None: ``advisor.replan_on_epilog`` of ``config`` (shipped: on)."""
    config: SiteConfig = field(default_factory=SiteConfig)
    refresh_s: float = 1.0
    """The advisor's Slurm reads (``advisor.refresh_s``): every second on the testbed, whose
    jobs last seconds; the shipped default is 5 s."""
    redraw: bool | None = None
    """Each repeat draws its own trace (seed ``trace_seed + repeat``), so the repeats sample
    the family rather than one draw of it; None: for the site-like families only."""
    multihost: bool = True
    """Each node on its own compute host beside a controller host (slurm_pal/testbed/
    multihost.py): the hooks send their records to the advisor over TCP with munge, as on a
    cluster. False: every daemon on this host, the hooks on the advisor's Unix socket."""

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise EmulationError(f"unknown arm(s) {bad}; valid: {', '.join(ARMS)}")
        if self.advisor_policy not in ADVISOR_POLICIES:
            raise EmulationError(
                f"unknown policy {self.advisor_policy!r}; valid: {', '.join(ADVISOR_POLICIES)}"
            )
        if self.repeats < 1:
            raise EmulationError(f"repeats must be >= 1, got {self.repeats}")
        if len(set(self.arms)) != len(self.arms):
            raise EmulationError(f"an arm is named twice in {self.arms}")
        if not self.replan_s >= 0:
            raise EmulationError(f"replan_s must be >= 0 (0 = off), got {self.replan_s}")
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise EmulationError("a testbed needs >= 1 node and >= 1 GPU per node")

    @property
    def site_like(self) -> bool:
        """Whether the trace is a site-like family (limits set, a site's hour a minute)."""
        return self.trace in SITE_TRACES

    @property
    def redraws(self) -> bool:
        """Whether each repeat runs a trace of its own."""
        return self.site_like if self.redraw is None else self.redraw

    def trace_seed_of(self, repeat: int) -> int:
        """The trace seed of repeat ``repeat`` (0-based)."""
        return self.trace_seed + repeat if self.redraws else self.trace_seed

    def make_trace(self, repeat: int = 0) -> list[TraceJob]:
        """The trace repeat ``repeat`` runs."""
        return make_trace(
            self.trace,
            seed=self.trace_seed_of(repeat),
            scale=self.scale,
            gpus_per_node=self.gpus_per_node,
            nodes=self.nodes,
        )

    @property
    def time_scale(self) -> float:
        """Testbed seconds per site second: the factor the advisor's time settings
        (``max_wait_s``, ``assumed_runtime_s``) are shrunk by, so it weighs waits as the site's
        would; 1 for the older traces, whose seconds are the testbed's own."""
        return self.scale * SITE_HOUR_S / 3600.0 if self.site_like else 1.0

    @property
    def scheduler(self) -> tuple[str, ...]:
        """slurm.conf lines of the scheduler: backfill where jobs carry limits (as sites
        run), strict FIFO for the older, UNLIMITED traces (backfill cannot plan them)."""
        return BACKFILL if self.site_like else FIFO

    @property
    def cpus_per_gpu(self) -> int | None:
        """With the site-like traces each GPU brings its share of a node's CPUs: cons_tres
        fits jobs by free CPUs, so only then do its picks follow the free GPUs (a 1-GPU job
        went to a node with 3 free GPUs rather than one with 2, since both had 7 free CPUs),
        which is what the packing model of the advisor and the simulator assumes. Asked per
        task (``sbatch_args``), not as ``DefCpuPerGPU``: on Slurm 24.11 a per-node request
        naming several GPU types under ``DefCpuPerGPU`` never starts (Reason=Resources on an
        idle node), and the advisor routes jobs across labels so."""
        return max(1, TESTBED_CPUS // self.gpus_per_node) if self.site_like else None

    @property
    def advisor_policy(self) -> str:
        """The policy the advisor arm serves."""
        return self.config.advisor.policy if self.policy is None else self.policy

    @property
    def baseline(self) -> str | None:
        """The arm the advisor's ratios are taken against (control, else stock)."""
        return baseline_arm(self.arms)

    @property
    def replans_on_epilog(self) -> bool:
        """Whether the advisor arm re-plans at every job's end."""
        if self.replan_on_epilog is None:
            return self.config.advisor.replan_on_epilog
        return self.replan_on_epilog

    @property
    def node_names(self) -> list[str]:
        width = max(2, len(str(self.nodes)))
        return [f"{self.node_prefix}{i + 1:0{width}d}" for i in range(self.nodes)]

    @property
    def work(self) -> Path:
        """Our files, beside (not inside) the folders LocalSlurm wipes at every start."""
        return self.root / "emulation"

    @property
    def socket_path(self) -> Path:
        """The advisor's Unix socket: on the multi-host testbed in the controller's own folder,
        which compute hosts cannot see (their hooks must use TCP)."""
        if self.multihost:
            return self.root / "ctl" / "advisor.sock"
        return self.work / "advisor.sock"

    @property
    def record_address(self) -> str | None:
        """HOST:PORT of the advisor's record listener (multi-host only)."""
        if not self.multihost:
            return None
        return f"{SUBNET}.{CONTROLLER_OCTET}:{RECORD_PORT}"


@dataclass(frozen=True)
class Prepared:
    """The emulated cluster, ingested and rendered: everything both arms share."""

    settings: RunSettings
    db: Path
    config_path: Path
    campaign: str
    site_dir: Path
    table_path: Path
    table: dict[str, object]
    specs: tuple[NodeSpec, ...]
    job_script: Path
    socket_path: Path
    control_config_path: Path | None = None
    """The control arm's config: the advisor's with ``policy = "packed"``."""

    def served_config(self, arm: str = "advisor") -> SiteConfig:
        """The config ``arm``'s ``slurm-pal serve`` runs with (it reads this file and gets no
        overrides): what the simulator's prediction simulates."""
        return load_config(self.arm_config_path(arm))

    def arm_config_path(self, arm: str) -> Path:
        if arm == "control":
            if self.control_config_path is None:
                raise EmulationError("this testbed was prepared without a control config")
            return self.control_config_path
        return self.config_path


def prepare(settings: RunSettings, progress: Progress = lambda _: None) -> Prepared:
    """Draw the profile, ingest it as the campaign of a fresh store, register one application
    per class, render the site (labels, job_submit.lua, hooks) and write the score table."""
    cfg = settings.config
    classes = tuple(c for c in cfg.classes.names if c in CLASSES) or CLASSES
    work = settings.work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    settings.root.chmod(0o755)
    work.chmod(0o755)
    gpus = drawn_gpus(
        settings.profile,
        settings.node_names,
        settings.gpus_per_node,
        seed=settings.profile_seed,
        classes=classes,
        longhorn_dir=settings.longhorn_dir,
    )
    csv = work / "emulated-campaign.csv"
    campaign_frame(gpus, gpu_model=cfg.profiling.gpu_model).to_csv(csv, index=False)
    db = work / "store.db"
    campaign = f"emulated-{settings.profile}-s{settings.profile_seed}"
    socket_path = settings.socket_path
    config_path = work / "slurm-pal.toml"
    config_path.write_text(_site_config(cfg, settings, socket_path))
    # Everything but the policy as the advisor's: the arms then differ in nothing else.
    control_config_path = work / "slurm-pal-control.toml"
    control_config_path.write_text(_site_config(cfg, settings, socket_path, policy=CONTROL_POLICY))
    with Store(db) as store:
        store.ingest(
            [read_campaign_csv(csv, gpu_model=cfg.profiling.gpu_model)],
            campaign_id=campaign,
            class_order=cfg.classes.names,
            binner=cfg.binning.binner(),
            description=f"testbed emulation: {settings.profile} profile, seed "
            f"{settings.profile_seed}",
        )
        for c in classes:
            store.set_application_class(app_name(c), c)
        plan = plan_from_store(store, campaign, device_pattern=settings.device_pattern, config=cfg)
        site_dir = work / "site"
        hooks = HookSettings.from_config(
            load_config(config_path), labels_path=str(site_dir / "labels.json")
        )
        files = render_files(
            plan,
            prolog=str(site_dir / "prolog.sh"),
            epilog=str(site_dir / "epilog.sh"),
            hooks=hooks,
        )
        write_site(site_dir, files)
        labels = json.loads(files["labels.json"])
        table = score_table(
            store.gpu_scores(campaign), labels, across_nodes=cfg.locality.across_switches
        )
    table_path = work / "scores.json"
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    specs = []
    for node, entries in labels["nodes"].items():
        by_index = {int(g["index"]): str(g["label"]) for g in entries}
        specs.append(NodeSpec(node, tuple(by_index[i] for i in sorted(by_index))))
    job_script = work / "emulated_job.py"
    body = resources.files("slurm_pal.testbed").joinpath("templates/emulated_job.py").read_text()
    job_script.write_text(f"#!{_job_python()}\n{body}")
    job_script.chmod(0o755)
    progress(
        f"profile {settings.profile} (seed {settings.profile_seed}) ingested as campaign "
        f"{campaign}: {len(gpus)} GPUs, {len({g.label for g in plan.gpus})} labels"
    )
    return Prepared(
        settings,
        db,
        config_path,
        campaign,
        site_dir,
        table_path,
        table,
        tuple(specs),
        job_script,
        socket_path,
        control_config_path,
    )


def _site_config(
    cfg: SiteConfig, settings: RunSettings, socket_path: Path, *, policy: str | None = None
) -> str:
    """The advisor's config for the testbed: its socket, root only, fast refresh and the run's
    re-planning (compressed time), no telemetry, the run's policy. Every other ``[advisor]``
    setting (pack_tolerance, avoid_above, ...), the classes and the locality penalty are the
    site's, so the served advisor places as the site's would, and the prediction (which reads
    this file) simulates that advisor. ``policy`` overrides the run's (the control arm's)."""
    testbed: dict[str, object] = {
        "socket": str(socket_path),
        "allowed_users": ("root",),
        "socket_group": "root",
        "policy": settings.advisor_policy if policy is None else policy,
        "refresh_s": settings.refresh_s,
        "replan_s": settings.replan_s,
        "replan_on_epilog": settings.replans_on_epilog,
        "reservation_ttl_s": 20.0,
        "labels_file": None,  # serve gets the testbed's labels.json with --labels
        "slurm_backfill": settings.site_like,  # the older traces run strict FIFO
        "slurm_overtime_unlimited": settings.site_like,  # as BACKFILL sets OverTimeLimit
    }
    # The site's waits and runtimes at the testbed's time scale (a site's hour is a minute).
    for key in ("max_wait_s", "assumed_runtime_s"):
        testbed[key] = round(float(getattr(cfg.advisor, key)) * settings.time_scale, 3)
    hooks: dict[str, object] = {"spool_dir": str(settings.work / "spool"), "telemetry": False}
    if settings.record_address is not None:
        # Every host's munged answers at the same path (slurm_pal/testbed/multihost.py).
        munge_socket = str(settings.root / "run" / "munge" / "munge.socket.2")
        testbed |= {"listen": settings.record_address, "munge_socket": munge_socket}
        hooks |= {"advisor": settings.record_address, "munge_socket": munge_socket}
    advisor = {f.name: getattr(cfg.advisor, f.name) for f in dataclasses.fields(cfg.advisor)}
    tables: dict[str, dict[str, object]] = {
        "advisor": advisor | testbed,
        "classes": {"names": cfg.classes.names, "default": cfg.classes.default},
        "hooks": hooks,
        "locality": {"across_switches": cfg.locality.across_switches},
    }
    lines = ["# written by `slurm-pal testbed run`"]
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items() if value is not None]
        lines.append("")
    return "\n".join(lines)


def _toml(value: object) -> str:
    """A config value as TOML (the config holds strings, numbers, booleans and lists of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _job_python() -> str:
    """The interpreter of the job script: the system python3 (starts fastest, stdlib is all it
    needs), else this one."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


# --- arms ---------------------------------------------------------------------------------------


class Arm:
    """One way of running the trace: what the testbed needs and what runs beside it."""

    name = "arm"

    def check(self) -> None:
        """Raise :class:`ArmUnavailable` when this arm cannot run here."""

    def testbed_options(self, prep: Prepared) -> dict[str, object]:
        return {}

    def start(self, tb: LocalSlurm, prep: Prepared, progress: Progress) -> None:
        """Start what the arm needs once Slurm is up."""

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent)."""


class StockArm(Arm):
    """cons_tres on untyped requests, no job_submit.lua: what a site has today."""

    name = "stock"


class AdvisorArm(Arm):
    """The rendered job_submit.lua + Prolog/Epilog and a `slurm-pal serve` on the testbed's
    socket, with the testbed's store and config. Named ``control``, the service reads the
    control config (the same but ``policy = "packed"``): the same machinery, packing's GPUs."""

    def __init__(self, name: str = "advisor") -> None:
        if name not in ("advisor", "control"):
            raise EmulationError(f"an advisor arm is 'advisor' or 'control', not {name!r}")
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.health: dict[str, object] = {}
        """The service's health answer once it is up (its policy: what the prediction must
        simulate)."""

    def check(self) -> None:
        missing = [
            m
            for m in ("slurm_pal.advisor.server", "slurm_pal.advisor.state")
            if importlib.util.find_spec(m) is None
        ]
        if missing:
            raise ArmUnavailable(
                "the advisor service is not installed in this checkout (missing "
                f"{', '.join(missing)}; `slurm-pal serve` needs them)"
            )

    def testbed_options(self, prep: Prepared) -> dict[str, object]:
        lua = prep.site_dir / "job_submit.lua"
        options: dict[str, object] = {"job_submit_lua": lua.read_text()}
        for kind in ("prolog", "epilog"):
            script = prep.site_dir / f"{kind}.sh"
            if script.is_file():
                options[kind] = str(script)
        return options

    def start(self, tb: LocalSlurm, prep: Prepared, progress: Progress) -> None:
        self.check()
        (prep.settings.work / "spool").mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            prep.socket_path.unlink()
        self.log = prep.settings.work / f"{self.name}.log"
        cmd = [
            sys.executable,
            "-m",
            "slurm_pal.cli.main",
            "--db",
            str(prep.db),
            "--config",
            str(prep.arm_config_path(self.name)),
            "serve",
            "--socket",
            str(prep.socket_path),
            "--labels",
            str(prep.site_dir / "labels.json"),
        ]  # no --policy: the config file is the one source of what serve runs
        env = dict(tb.env)
        # PROTOCOL.md: serve may detach unless told --foreground; we own the process we start.
        helptext = subprocess.run(
            [*cmd[:3], "serve", "--help"], env=env, capture_output=True, text=True, check=False
        ).stdout
        if "--foreground" in helptext:
            cmd.append("--foreground")
        if isinstance(tb, MultiHostSlurm):  # on the controller host (and its CPUs), as on a cluster
            cmd = tb.daemon_command(tb.controller, cmd)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30.0
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ArmUnavailable(
                    f"slurm-pal serve exited {self.proc.returncode}: {self._log_tail()}"
                )
            try:
                answer = advisor_request(prep.socket_path, {"v": 1, "op": "health"})
                if answer.get("ok"):
                    self.health = answer
                    progress(
                        f"{self.name}: advisor up (pid {self.proc.pid}): policy "
                        f"{answer.get('policy')}, "
                        f"{answer.get('gpus')} GPUs, campaign {answer.get('campaign')}"
                    )
                    return
                last = str(answer)
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        self.stop()
        raise ArmUnavailable(f"slurm-pal serve did not answer health within 30 s: {last}")

    def stats(self, prep: Prepared) -> dict[str, object]:
        with contextlib.suppress(OSError, ValueError):
            answer = advisor_request(prep.socket_path, {"v": 1, "op": "stats"})
            if answer.get("ok"):
                return {k: v for k, v in answer.items() if k not in ("v", "ok")}
        return {}

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def _log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])


def advisor_request(path: Path, request: Mapping[str, object], timeout_s: float = 2.0) -> dict:
    """One JSON line to the advisor's socket, one back (PROTOCOL.md)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def make_arm(name: str) -> Arm:
    if name == "stock":
        return StockArm()
    if name in ("advisor", "control"):
        return AdvisorArm(name)
    raise EmulationError(f"unknown arm {name!r}; valid: {', '.join(ARMS)}")


# --- running ------------------------------------------------------------------------------------


@dataclass
class ArmResult:
    """One arm's job records, Slurm's view of the jobs and the figures."""

    arm: str
    records: list[dict[str, object]]
    slurm_jobs: dict[str, dict[str, object]]  # trace id -> squeue --json fields
    metrics: ArmMetrics
    duration_errors: list[float]  # per job: measured sleep / emulated - 1
    extra: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        errors = [abs(e) for e in self.duration_errors]
        slurm_jcts = [
            float(j["end_time"]) - float(j["submit_time"])  # type: ignore[arg-type]
            for j in self.slurm_jobs.values()
            if j.get("end_time") and j.get("submit_time")
        ]
        return {
            **self.metrics.to_dict(),
            "slurm_avg_jct_s": round(float(np.mean(slurm_jcts)), 3) if slurm_jcts else None,
            "max_duration_error": round(max(errors), 5) if errors else None,
            **self.extra,
        }


def sbatch_args(job: TraceJob, prep: Prepared, records: Path, submit: float) -> list[str]:
    """Plain sbatch options of a trace job: untyped GPUs per node, whole nodes above one
    node, the application named in the comment; the same in both arms."""
    gpn = prep.settings.gpus_per_node
    args = [
        "-J",
        f"emu-{job.job_id}",
        "-o",
        str(records / f"{job.job_id}.out"),
        f"--comment=pal:app={app_name(job.job_class)}",
        f"--gres=gpu:{job.per_node(gpn)}",
    ]
    if job.time_limit is not None:
        args.append(f"--time={round(job.time_limit / 60.0)}")
    cpus_per_gpu = prep.settings.cpus_per_gpu
    if cpus_per_gpu is not None:  # one task per node: the node's share for its GPUs
        args.append(f"--cpus-per-task={cpus_per_gpu * job.per_node(gpn)}")
    if job.nodes(gpn) > 1:
        args += ["-N", str(job.nodes(gpn))]
    return [
        *args,
        str(prep.job_script),
        f"class={job.job_class}",
        f"base={job.base}",
        f"gpus={job.gpus}",
        f"table={prep.table_path}",
        f"records={records}",
        f"id={job.job_id}",
        f"submit={submit:.6f}",
    ]


def run_arm(
    arm: Arm,
    prep: Prepared,
    trace: Sequence[TraceJob],
    progress: Progress = lambda _: None,
    *,
    timeout_s: float | None = None,
) -> ArmResult:
    """Start a fresh Slurm, run the trace through ``arm``, stop everything, return the results."""
    arm.check()
    records = prep.settings.work / f"records-{arm.name}"
    if records.exists():
        shutil.rmtree(records)
    records.mkdir(parents=True)
    records.chmod(0o777)
    options: dict[str, object] = {
        "device_pattern": prep.settings.device_pattern,
        "extra_conf": prep.settings.scheduler,
        **arm.testbed_options(prep),
    }
    tb: LocalSlurm
    if prep.settings.multihost:
        spool = str(prep.settings.work / "spool")  # each compute host's own
        tb = MultiHostSlurm(prep.settings.root, prep.specs, per_host_dirs=(spool,), **options)  # type: ignore[arg-type]
    else:
        tb = LocalSlurm(prep.settings.root, prep.specs, **options)  # type: ignore[arg-type]
    if timeout_s is None:
        longest = max(float(prep.table["across_nodes"]), 1.0) * 3.0  # type: ignore[arg-type]
        timeout_s = max(j.submit for j in trace) + longest * sum(j.base for j in trace) + 60
    jobs: dict[str, int] = {}
    extra: dict[str, object] = {}
    watcher = _GresWatcher()
    try:
        tb.start()
        arm.start(tb, prep, progress)
        # slurmctld's first scheduling pass comes ~3 s after it starts: a CPU-only job that
        # has run means the trace's first jobs wait no longer than later ones.
        tb.wait_job(tb.submit("-J", "warm-up", "-o", "/dev/null", "--wrap", "true"), 30.0)
        progress(f"{arm.name}: Slurm up; submitting {len(trace)} jobs with plain sbatch")
        watcher.start(tb)
        t0 = time.time()
        for job in sorted(trace, key=lambda j: j.submit):
            delay = t0 + job.submit - time.time()
            if delay > 0:
                time.sleep(delay)
            submit = time.time()
            jobs[job.job_id] = tb.submit(*sbatch_args(job, prep, records, submit))
        deadline = time.monotonic() + timeout_s
        done: set[str] = set()
        while len(done) < len(trace):
            done = {p.stem for p in records.glob("*.json")}
            if watcher.stuck:
                raise TestbedError(
                    f"{arm.name}: Slurm will never start "
                    + "; ".join(watcher.stuck.values())
                    + (f" (advisor log: {arm.log})" if isinstance(arm, AdvisorArm) else "")
                )
            if time.monotonic() > deadline:
                missing = sorted(set(jobs) - done)
                raise TestbedError(
                    f"{arm.name}: {len(missing)} job(s) without a record after {timeout_s:.0f} "
                    f"s: {missing[:10]}; job output in {records}"
                )
            time.sleep(1.0)
        progress(f"{arm.name}: all {len(trace)} jobs ended after {time.time() - t0:.0f} s")
        watcher.stop()
        slurm_jobs = _ended_jobs(tb, jobs)
        for trace_id, ended in slurm_jobs.items():  # ended jobs show no gres_detail any more
            ended["gres_detail"] = watcher.gres.get(jobs[trace_id], ended.get("gres_detail"))
        (prep.settings.work / f"slurm-jobs-{arm.name}.json").write_text(
            json.dumps(slurm_jobs, indent=1) + "\n"
        )
        if isinstance(arm, AdvisorArm):
            extra["advisor_stats"] = arm.stats(prep)
            extra["served_policy"] = arm.health.get("policy")
        by_job_id = {job_id: trace_id for trace_id, job_id in jobs.items()}
        extra["holds"] = {
            by_job_id[job_id]: since
            for job_id, since in watcher.held_since.items()
            if job_id in by_job_id
        }
    finally:
        watcher.stop()
        arm.stop()
        tb.stop()
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    failed = [r for r in recs if "error" in r]
    if failed:
        raise TestbedError(
            f"{arm.name}: {len(failed)} emulated job(s) failed: "
            + "; ".join(f"{r['trace_id']}: {r['error']}" for r in failed[:5])
        )
    errors = []
    for r in recs:
        expected = float(r["base"]) * float(r["slowdown"])
        errors.append((float(r["end"]) - float(r["sleep_start"])) / expected - 1.0)
    extra["holds"] = hold_figures(extra.get("holds", {}), recs)  # type: ignore[arg-type]
    metrics = arm_metrics(arm.name, recs, prep.settings.gpus_per_node)
    return ArmResult(arm.name, recs, slurm_jobs, metrics, errors, extra)


def hold_figures(
    held_since: Mapping[str, float], records: Sequence[Mapping[str, object]]
) -> dict[str, object]:
    """The advisor's real holds in one arm: jobs Slurm kept pending under a ``wait`` comment
    (a begin time), each held from when it could first have started to its start (as the
    simulator counts ``held_s``), and the slowest GPU each then got for its class."""
    by_id = {str(r["trace_id"]): r for r in records}
    jobs = {}
    for trace_id, since in sorted(held_since.items()):
        record = by_id.get(trace_id)
        if record is None:
            continue
        jobs[trace_id] = {
            "held_s": round(max(0.0, float(record["start"]) - since), 1),  # type: ignore[arg-type]
            "worst": round(float(record.get("worst", record["slowdown"])), 3),  # type: ignore[arg-type]
        }
    return {
        "held_jobs": len(jobs),
        "held_total_s": round(sum(float(j["held_s"]) for j in jobs.values()), 1),
        "jobs": jobs,
    }


class _GresWatcher:
    """Polls ``squeue --json`` while the trace runs: the GPUs (``gres_detail``) Slurm gave each
    job are only shown while it runs."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.gres: dict[int, list[str]] = {}
        self.stuck: dict[int, str] = {}  # job id -> why Slurm will never start it
        self.held_since: dict[int, float] = {}
        """Job id -> when the advisor held it (its admin comment's ``since``: when it could
        first have started), for every job seen pending with a ``wait`` comment."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, tb: LocalSlurm) -> None:
        self._thread = threading.Thread(target=self._loop, args=(tb,), daemon=True)
        self._thread.start()

    def _loop(self, tb: LocalSlurm) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TestbedError, ValueError, KeyError):
                out = tb.run(["squeue", "--json"], timeout_s=10, check=False).stdout
                for job in map(flat_job_json, json.loads(out).get("jobs", [])):
                    if job.get("job_state") == "RUNNING" and job.get("gres_detail"):
                        self.gres[int(job["job_id"])] = list(job["gres_detail"])
                    comment = parse_admin_comment(str(job.get("admin_comment") or ""))
                    if (
                        job.get("job_state") == "PENDING"
                        and comment is not None
                        and comment.get("action") == "wait"
                    ):
                        since = comment.get("since")
                        self.held_since.setdefault(
                            int(job["job_id"]), float(since) if since else time.time()
                        )
                    reason = str(job.get("state_reason") or "")
                    if job.get("job_state") == "PENDING" and reason in NEVER_STARTS:
                        self.stuck[int(job["job_id"])] = (
                            f"job {job['job_id']} ({job.get('name')}) pending with reason "
                            f"{reason}: tres_per_node={job.get('tres_per_node')!r} "
                            f"required_nodes={job.get('required_nodes')!r} "
                            f"admin_comment={job.get('admin_comment')!r}"
                        )
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None


LEFT_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"})


def _ended_jobs(
    tb: LocalSlurm, jobs: Mapping[str, int], timeout_s: float = 30.0
) -> dict[str, dict[str, object]]:
    """Slurm's record of our jobs once they have left: a job writes its record before it exits,
    and with the hooks its Epilog (up to the advisor's round) still runs, so Slurm shows it
    COMPLETING for a moment after the last record appears."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = _squeue_jobs(tb, jobs)
        if time.monotonic() > deadline or not any(
            j.get("job_state") in LEFT_STATES for j in found.values()
        ):
            return found
        time.sleep(0.5)


def _squeue_jobs(tb: LocalSlurm, jobs: Mapping[str, int]) -> dict[str, dict[str, object]]:
    """Slurm's record of our jobs (kept for MinJobAge after they end; 22.05 ignores the
    ``--states=all`` 24.11 needs to show them), in 22.05's JSON shapes, with each job's time
    limit as squeue prints it (``UNLIMITED``, ``1:00:00``): 22.05's JSON prints an unlimited
    one as null, like an unset one."""
    try:
        out = tb.run(["squeue", "--json", "--states=all"], timeout_s=30).stdout
        data = json.loads(out)
        listed = tb.run(["squeue", "--states=all", "-h", "-o", "%i|%l"], timeout_s=30).stdout
    except (TestbedError, ValueError):
        return {}
    by_id = {int(j["job_id"]): flat_job_json(j) for j in data.get("jobs", [])}
    limits = dict(line.split("|", 1) for line in listed.splitlines() if "|" in line)
    keep = (
        "job_id",
        "job_state",
        "submit_time",
        "start_time",
        "end_time",
        "nodes",
        "admin_comment",
        "comment",
        "gres_detail",
        "tres_per_node",
        "required_nodes",
    )
    return {
        trace_id: {k: by_id[jid].get(k) for k in keep}
        | {"time_limit": limits.get(str(jid), "").strip() or None}
        for trace_id, jid in jobs.items()
        if jid in by_id
    }


# --- the simulator's prediction -----------------------------------------------------------------


SLURM_TIME_LIMIT_S = math.inf
"""The time limit Slurm gives every trace job: sbatch asks for none (:func:`sbatch_args`) and
the testbed's partition has ``MaxTime=INFINITE`` and no ``DefaultTime``, so each is UNLIMITED.
The served advisor reads that from Slurm and expects no end of a running job, so it never holds
a job for GPUs that free soon. The prediction gives the simulated jobs the same limit: a trace
without limits would have the simulator know each job's run time exactly, and hold jobs the
served advisor does not (mixed48: predicted 0.775 with exact run times, measured 1.002)."""


def sim_jobs(trace: Sequence[TraceJob], *, extra_s: float = 0.0) -> list[SimJob]:
    """The trace as the simulator takes it, each job with the time limit Slurm gives it on the
    testbed (``extra_s``: seconds added to each job's run time)."""
    return [
        SimJob(
            j.job_id,
            j.submit,
            j.gpus,
            j.base + extra_s,
            j.job_class,
            time_limit=SLURM_TIME_LIMIT_S if j.time_limit is None else j.time_limit,
        )
        for j in trace
    ]


def sim_gpus(prep: Prepared) -> SimGpus:
    """The emulated GPUs as the simulator takes them: the store's PM-scores are both what the
    policies see and what jobs feel (the job script sleeps by them too). Classes in the
    config's order, which is the campaign's and so the served advisor's.

    Each node's GPUs in Slurm's order (labels.json's ``slurm_index``): cons_tres gives a job the
    lowest free Slurm indices of a node, and Slurm numbers a node's GPUs grouped by type, not
    in the campaign's order. Packing in the simulator takes the lowest local index first, so in
    the campaign's order it would put jobs on other GPUs of the node than Slurm does (on the
    example profile, an A job on n02's 2.31x GPU where Slurm gives it a median one)."""
    nodes = cast("dict[str, dict[str, dict]]", prep.table["nodes"])
    gpn = prep.settings.gpus_per_node
    present = {c for n in nodes.values() for g in n.values() for c in g["scores"]}
    named = [c for c in prep.settings.config.classes.names if c in present]
    classes = named + sorted(present - set(named))
    by_slot: dict[tuple[str, int], dict[str, float]] = {}
    for node, gpus in nodes.items():
        for gpu in gpus.values():
            by_slot[(node, int(gpu["index"]))] = gpu["scores"]
    order = [(node, i) for node in prep.settings.node_names for i in slurm_order(prep, node)]
    scores = {c: np.array([by_slot[slot][c] for slot in order]) for c in classes}
    return SimGpus(len(prep.settings.node_names), gpn, scores, scores, source="testbed emulation")


def slurm_order(prep: Prepared, node: str) -> list[int]:
    """A node's campaign indices in Slurm's order (by ``slurm_index`` in labels.json; the
    campaign's order where labels.json is absent or does not list the node)."""
    gpn = prep.settings.gpus_per_node
    path = prep.site_dir / "labels.json"
    entries = json.loads(path.read_text())["nodes"].get(node) if path.is_file() else None
    if not entries:
        return list(range(gpn))
    ranked = sorted(entries, key=lambda g: int(g.get("slurm_index", g["index"])))
    return [int(g["index"]) for g in ranked]


def testbed_release() -> str:
    """The Slurm release the testbed's daemons are (``$SLURM_PAL_SLURM_RELEASE``; the host's own
    is 22.05), as ``SimConfig.slurm_release`` takes it: the prediction plans as it does."""
    release = default_release()
    return "22.05" if release in SYSTEM_RELEASES else release


def prediction_configs(prep: Prepared) -> dict[str, SimConfig]:
    """The simulations behind the prediction. ``stock``: Slurm's packing. ``advisor``: placement
    ``advisor`` from :func:`advisor_sim_options` of the config the served advisor reads, the
    composition ``sim run --config`` uses (the advisor believes the config's locality penalty,
    jobs pay the site's: here the emulation's). ``advisor_at_submit``: the same advisor deciding
    only at each job's submission (Slurm places a job that waited), what the advisor does
    without the Epilog's re-planning. ``control``: the control arm's service, simulated from its
    own config the same way (when the testbed was prepared with one). All in Slurm mode, with
    backfill where the testbed runs it, as the testbed's release plans it, reserving nodes for
    every waiting job as its sched/backfill does (``backfill_reserves="nodes"``, measured on
    22.05 and 24.11: tests/slurm/test_backfill_reservations.py), jobs asked for as
    ``sbatch_args`` submits them."""
    penalty = float(prep.table["across_nodes"])  # type: ignore[arg-type]
    # the trace's jobs are submitted with --gres=gpu:N per node (sbatch_args)
    testbed = {
        "mode": "slurm",
        "backfill": prep.settings.site_like,
        "requests": "gres-per-node",
        "slurm_release": testbed_release(),
        "backfill_reserves": "nodes",
    }
    site = {"site_locality_penalty": penalty}
    advisor = advisor_sim_options(prep.served_config()) | testbed | site
    configs = {
        "stock": SimConfig(placement="packed-sticky", locality_penalty=penalty, **testbed),  # type: ignore[arg-type]
        "advisor": SimConfig(**advisor),  # type: ignore[arg-type]
        "advisor_at_submit": SimConfig(**(advisor | {"decisions": "at-submit"})),  # type: ignore[arg-type]
    }
    if prep.control_config_path is not None:
        control = advisor_sim_options(prep.served_config("control")) | testbed | site
        configs["control"] = SimConfig(**control)  # type: ignore[arg-type]
    return configs


PREDICTED = ("avg_jct", "p99_jct", "makespan", "avg_wait")


def latency_figures(
    prep: Prepared, trace: Sequence[TraceJob], latency_s: float, arms: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Each arm simulated with Slurm's scheduling latency modelled: every job holds its GPUs
    ``latency_s`` longer than it runs (its Epilog, then the next scheduling pass, before Slurm
    gives them to another job), and its JCT is counted to the end of its run, as the job's own
    record counts it on the testbed. The simulator itself has no such delay; this is its
    nearest form through the trace alone."""
    jobs = sim_jobs(trace, extra_s=latency_s)
    configs = prediction_configs(prep)
    gpus = sim_gpus(prep)
    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        result = simulate(jobs, gpus, configs[arm])
        # the hold's extra share of each job's time on its GPUs, at the job's own slowdown
        ends = [j.end - latency_s * (j.end - j.start) / j.work for j in result.jobs]  # type: ignore[operator]
        jcts = [end - j.submit for end, j in zip(ends, result.jobs, strict=True)]
        out[arm] = {
            "avg_jct": round(float(np.mean(jcts)), 3),
            "p99_jct": round(p99(jcts), 3),
            "makespan": round(max(ends) - min(j.submit for j in result.jobs), 3),
            "avg_wait": round(float(np.mean([j.start - j.submit for j in result.jobs])), 3),  # type: ignore[operator]
        }
    return out


def latency_prediction(
    prep: Prepared,
    trace: Sequence[TraceJob],
    baseline: str,
    measured_baseline_avg_jct_s: float | None = None,
    latencies: Sequence[float] = LATENCIES_S,
) -> dict[str, object]:
    """The pair advisor / ``baseline`` simulated at each latency of ``latencies``: the ratios
    per latency, the average JCT ratio's median and range over them (how much the prediction
    moves with a delay the simulator does not know), and, given the baseline's measured average
    JCT, the ratios at the latency that reproduces it (:func:`calibrated_latency`)."""
    grid = []
    for d in latencies:
        figures = latency_figures(prep, trace, d, ("advisor", baseline))
        ratios = {
            f"{k}_ratio": round(figures["advisor"][k] / figures[baseline][k], 4) for k in RATIO_KEYS
        }
        grid.append({"latency_s": d, f"{baseline}_avg_jct_s": figures[baseline]["avg_jct"]})
        grid[-1] |= ratios
    out: dict[str, object] = {
        "grid": grid,
        "avg_jct_ratio_band": spread([g["avg_jct_ratio"] for g in grid]),
    }
    if measured_baseline_avg_jct_s is not None:
        d = calibrated_latency(
            {g["latency_s"]: g[f"{baseline}_avg_jct_s"] for g in grid}, measured_baseline_avg_jct_s
        )
        out["calibrated"] = next(g for g in grid if g["latency_s"] == d)
    return out


def simulate_prediction(prep: Prepared, trace: Sequence[TraceJob]) -> dict[str, object]:
    """The simulator's figures for each of :func:`prediction_configs` on the same trace and
    GPUs, the ratios advisor / stock (``at_submit_*``: of the at-submit advisor), what the
    advisor ran with, and ``jobs_as_stock``: how many jobs the simulated advisor starts and ends
    exactly as packing does (all of them: its policy picks packing's GPUs on these GPUs, so a
    ratio of 1 is the expected outcome, not a failure)."""
    jobs = sim_jobs(trace)
    gpus = sim_gpus(prep)
    configs = prediction_configs(prep)
    results = {arm: simulate(jobs, gpus, config) for arm, config in configs.items()}
    out: dict[str, object] = {}
    for arm, result in results.items():
        config = configs[arm]
        s = result.summary()
        placement = config.placement
        if placement == "advisor":
            placement = f"advisor ({config.advisor_policy}, {config.decisions})"
        out[arm] = {k: round(float(s[k]), 3) for k in PREDICTED} | {  # type: ignore[arg-type]
            "spread_jobs": s["spread_jobs"],
            "placement": placement,
            "held_jobs": s["held_jobs"],
            "held_total_s": round(sum(j.held_s for j in result.jobs), 1),
            "jobs": {
                j.job_id: [
                    round(j.start, 1),
                    round(j.end - j.submit, 1),
                    round((j.end - j.start) / j.work, 3),
                    _nodes_text(j.placed_on),
                ]
                for j in result.jobs
                if j.start is not None and j.end is not None and j.work > 0
            },
        }
    stock = out["stock"]
    for key in ("avg_jct", "p99_jct", "makespan"):
        for prefix, arm in (("", "advisor"), ("at_submit_", "advisor_at_submit")):
            out[f"{prefix}{key}_ratio"] = round(out[arm][key] / stock[key], 4)  # type: ignore[index]
    # The pairs the testbed measures, named arm/baseline, so a report puts each beside its own.
    pairs: dict[str, dict[str, float]] = {}
    for arm, base in (("advisor", "stock"), ("advisor", "control"), ("control", "stock")):
        if arm in out and base in out:
            pairs[f"{arm}/{base}"] = {
                f"{key}_ratio": round(out[arm][key] / out[base][key], 4)  # type: ignore[index]
                for key in RATIO_KEYS
            }
    out["pairs"] = pairs
    advisor = configs["advisor"]
    out["advisor_policy"] = advisor.advisor_policy
    out["advisor_settings"] = dict(advisor.advisor_settings)
    out["decisions"] = advisor.decisions
    timed = {(j.job_id, j.start, j.end) for j in results["stock"].jobs}
    out["jobs_as_stock"] = sum((j.job_id, j.start, j.end) in timed for j in results["advisor"].jobs)
    if "control" in results:
        out["control_jobs_as_stock"] = sum(
            (j.job_id, j.start, j.end) in timed for j in results["control"].jobs
        )
    return out


# --- the whole run ------------------------------------------------------------------------------


def run_testbed(settings: RunSettings, progress: Progress = lambda _: None) -> dict[str, object]:
    """Prepare, predict, run every arm, compare. Arms that cannot run here are reported (with
    the reason) and their ratios are None; the testbed is stopped whatever happens."""
    with _terminate_as_exit():
        return _run_testbed(settings, progress)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit, so the arms' ``finally`` stop Slurm and the service (a
    background process ignores SIGINT; SIGTERM is what it gets)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_testbed(settings: RunSettings, progress: Progress) -> dict[str, object]:
    trace = settings.make_trace(0)
    prep = prepare(settings, progress)
    prediction = simulate_prediction(prep, trace)
    baseline = settings.baseline
    pairs: dict[str, dict[str, float]] = prediction["pairs"]  # type: ignore[assignment]
    predicted = pairs.get(f"advisor/{baseline}", {})
    progress(
        f"simulator (Slurm mode, {'backfill' if settings.site_like else 'FIFO'}), "
        f"advisor {prediction['advisor_policy']} deciding "
        f"{prediction['decisions']}: predicted avg JCT ratio advisor/control "
        f"{pairs['advisor/control']['avg_jct_ratio']}, advisor/stock "
        f"{prediction['avg_jct_ratio']} (deciding at submit only: "
        f"{prediction['at_submit_avg_jct_ratio']}); {prediction['jobs_as_stock']} of "
        f"{len(trace)} jobs timed as under packing"
        + (" (repeat 1's trace; each repeat draws its own)" if settings.redraws else "")
    )
    report: dict[str, object] = {
        "trace": settings.trace,
        "trace_seed": settings.trace_seed,
        "scale": settings.scale,
        "jobs": len(trace),
        "profile": settings.profile,
        "profile_seed": settings.profile_seed,
        "cluster": f"{settings.nodes}x{settings.gpus_per_node}",
        "policy": settings.advisor_policy,
        "control_policy": CONTROL_POLICY,
        "baseline": baseline,
        "repeats": settings.repeats,
        "replan_s": settings.replan_s,
        "replan_on_epilog": settings.replans_on_epilog,
        "hosts": (
            f"controller + {settings.nodes} compute hosts (records over TCP, munge)"
            if settings.multihost
            else "one host (loopback; records on the Unix socket)"
        ),
        "locality_penalty": prep.table["across_nodes"],
        "campaign": prep.campaign,
        "root": str(settings.root),
        "arms": {},
        "unavailable": {},
    }
    runnable = []
    for name in settings.arms:
        try:
            make_arm(name).check()
        except ArmUnavailable as exc:
            report["unavailable"][name] = str(exc)  # type: ignore[index]
            progress(f"{name}: skipped: {exc}")
            continue
        runnable.append(name)
    runs: list[dict[str, object]] = []
    results: dict[str, ArmResult] = {}
    for repeat in range(settings.repeats):
        order = arm_order(runnable, repeat)
        trace_r, prediction_r = trace, prediction
        if settings.redraws and repeat > 0:
            trace_r = settings.make_trace(repeat)
            prediction_r = simulate_prediction(prep, trace_r)
        if settings.repeats > 1:
            progress(
                f"repeat {repeat + 1}/{settings.repeats}: arms in order {', '.join(order)}"
                f" (trace seed {settings.trace_seed_of(repeat)})"
            )
        results = {}
        for name in order:
            results[name] = run_arm(make_arm(name), prep, trace_r, progress)
        figures = {name: results[name].to_dict() for name in runnable}
        run: dict[str, object] = {
            "order": list(order),
            "trace_seed": settings.trace_seed_of(repeat),
            "arms": figures,
        }
        for arm, base in (("advisor", "stock"), ("advisor", "control"), ("control", "stock")):
            if arm in figures and base in figures:
                run[f"{arm}/{base}"] = pair_ratios(figures[arm], figures[base])  # type: ignore[arg-type]
        if baseline is not None and baseline in figures and "advisor" in figures:
            run["predicted"] = repeat_prediction(
                prep,
                trace_r,
                prediction_r,
                baseline,
                float(figures[baseline]["avg_jct_s"]),  # type: ignore[arg-type]
            )
            run["measured_jobs"] = {
                arm: measured_jobs(results[arm]) for arm in ("advisor", baseline)
            }
        runs.append(run)
        if settings.repeats > 1:
            _keep_repeat(prep, runnable, repeat)
            this_pair: Mapping[str, object] = run.get(f"advisor/{baseline}") or {}  # type: ignore[assignment]
            expected: Mapping[str, object] = run.get("predicted") or {}  # type: ignore[assignment]
            progress(
                f"repeat {repeat + 1}: avg JCT advisor/{baseline} "
                f"{this_pair.get('avg_jct_ratio')} (simulator "
                f"{expected.get('avg_jct_ratio')}, with Slurm's latency "
                f"{expected.get('latency_avg_jct_ratio')})"
            )
    report["arms"] = runs[-1]["arms"] if runs else {}
    report["runs"] = runs
    report["pairs"] = {
        pair: summarize_pair([r[pair] for r in runs if pair in r], pairs.get(pair, {}))  # type: ignore[misc]
        for pair in ("advisor/control", "advisor/stock", "control/stock")
        if runs and pair in runs[0]
    }
    # The headline: the advisor against its baseline, median over the repeats.
    head = report["pairs"].get(f"advisor/{baseline}", {})  # type: ignore[attr-defined]
    for key in RATIO_KEYS:
        name = f"{key}_ratio"
        report[name] = head[name]["median"] if name in head else None
        report[f"sim_predicted_{name}"] = predicted.get(name)
        report[f"{name}_range"] = [head[name]["min"], head[name]["max"]] if name in head else None
    report["sim_at_submit_avg_jct_ratio"] = prediction.get("at_submit_avg_jct_ratio")
    if baseline is not None and runs and baseline in runs[0]["arms"]:  # type: ignore[operator]
        # Slurm's scheduling latency, which the simulator lacks, modelled and calibrated on the
        # baseline arm alone: the prediction beside the measurement, and how far it moves.
        measured_base = spread([r["arms"][baseline]["avg_jct_s"] for r in runs])["median"]  # type: ignore[index]
        model = latency_prediction(prep, trace, baseline, measured_base)  # type: ignore[arg-type]
        report["latency_model"] = model
        calibrated: dict[str, float] = model["calibrated"]  # type: ignore[assignment]
        report["sim_latency_s"] = calibrated["latency_s"]
        for key in RATIO_KEYS:
            report[f"sim_latency_{key}_ratio"] = calibrated[f"{key}_ratio"]
    measured = report["avg_jct_ratio"]
    sim_ratio = predicted.get("avg_jct_ratio")
    report["prediction_error"] = (
        None
        if measured is None or sim_ratio is None
        else round(float(sim_ratio) / float(measured) - 1.0, 4)  # type: ignore[arg-type]
    )
    report["sim"] = prediction
    report["_results"] = results  # the last repeat's, for callers that show jobs; not in JSON
    return report


def timing_band(
    prep: Prepared,
    trace: Sequence[TraceJob],
    baseline: str,
    latency_s: float,
    *,
    jitter_s: float = TIMING_JITTER_S,
    draws: int = TIMING_DRAWS,
    seed: int = 0,
) -> dict[str, object]:
    """The predicted advisor / ``baseline`` average-JCT ratio over ``draws`` copies of the
    trace whose submissions each move by up to ``jitter_s`` either way (seeded), at
    ``latency_s``: how far one run can land from the prediction by Slurm's ticks alone. With
    jobs of seconds, a job that starts a fraction of a second earlier can find other nodes
    free, and the queue behind it follows (the demo's control once started a 1-GPU job at 36 s
    and once at 80 s, as a job's end fell just before or after another's start)."""
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(draws):
        moved = [
            dataclasses.replace(job, submit=max(0.0, job.submit + rng.uniform(-jitter_s, jitter_s)))
            for job in trace
        ]
        moved.sort(key=lambda job: job.submit)
        figures = latency_figures(prep, moved, latency_s, ("advisor", baseline))
        ratios.append(figures["advisor"]["avg_jct"] / figures[baseline]["avg_jct"])
    return spread(ratios) | {"jitter_s": jitter_s}


def repeat_prediction(
    prep: Prepared,
    trace: Sequence[TraceJob],
    prediction: Mapping[str, object],
    baseline: str,
    measured_baseline_avg_jct_s: float,
) -> dict[str, object]:
    """The simulator's figures for one repeat's trace: the pair advisor / ``baseline``
    (``avg_jct_ratio``), the same with Slurm's start latency and the Epilog round modelled and
    calibrated on the baseline arm's measured average JCT (``latency_avg_jct_ratio``, the
    prediction the measurement is judged against), how far Slurm's ticks alone move it
    (``timing_band``), and what the simulated advisor held."""
    pairs: Mapping[str, Mapping[str, float]] = prediction["pairs"]  # type: ignore[assignment]
    model = latency_prediction(prep, trace, baseline, measured_baseline_avg_jct_s)
    calibrated: Mapping[str, float] = model["calibrated"]  # type: ignore[assignment]
    advisor: Mapping[str, object] = prediction["advisor"]  # type: ignore[assignment]
    return {
        "avg_jct_ratio": pairs[f"advisor/{baseline}"]["avg_jct_ratio"],
        "latency_s": calibrated["latency_s"],
        "latency_avg_jct_ratio": calibrated["avg_jct_ratio"],
        "timing_band": timing_band(prep, trace, baseline, calibrated["latency_s"]),
        "held_jobs": advisor.get("held_jobs"),
        "held_total_s": advisor.get("held_total_s"),
        "jobs": {arm: prediction[arm]["jobs"] for arm in ("advisor", baseline)},  # type: ignore[index]
    }


def _nodes_text(gpus: Sequence[str]) -> str:
    """``n01:0,n01:1,n02:0`` -> ``n01:0+1 n02:0``: where a job ran, short."""
    by_node: dict[str, list[str]] = {}
    for gpu in gpus:
        node, _, index = str(gpu).rpartition(":")
        by_node.setdefault(node, []).append(index)
    return " ".join(f"{node}:{'+'.join(indices)}" for node, indices in by_node.items())


def measured_jobs(result: ArmResult) -> dict[str, list[object]]:
    """Each job of an arm as :func:`simulate_prediction` gives the simulated ones: [start since
    the first submit, JCT, slowdown], for reading a repeat job by job beside the simulator."""
    first = min(float(r["submit"]) for r in result.records)  # type: ignore[arg-type]
    return {
        str(r["trace_id"]): [
            round(float(r["start"]) - first, 1),  # type: ignore[arg-type]
            round(float(r["end"]) - float(r["submit"]), 1),  # type: ignore[arg-type]
            round(float(r["slowdown"]), 3),  # type: ignore[arg-type]
            _nodes_text([f"{g[0]}:{g[1]}" for g in r.get("gpus", ())]),  # type: ignore[attr-defined]
        ]
        for r in result.records
    }


def _keep_repeat(prep: Prepared, arms: Sequence[str], repeat: int) -> None:
    """Move a repeat's records, Slurm's view and the services' logs into ``repeat-N/`` (the
    next repeat writes the same names)."""
    kept = prep.settings.work / f"repeat-{repeat + 1}"
    kept.mkdir(exist_ok=True)
    for arm in arms:
        for name in (f"records-{arm}", f"slurm-jobs-{arm}.json", f"{arm}.log"):
            path = prep.settings.work / name
            if path.is_dir():
                shutil.copytree(path, kept / name, dirs_exist_ok=True)
            elif path.exists():
                shutil.copy2(path, kept)


def public_report(report: Mapping[str, object]) -> dict[str, object]:
    """The report without in-memory objects (what --json prints)."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def check_record(prep: Prepared, record: Mapping[str, object]) -> float:
    """The slowdown the package computes for a record's GPUs (tests compare it to the job's)."""
    per_node: dict[str, list[int]] = {}
    for node, index, _label in record["gpus"]:  # type: ignore[attr-defined]
        per_node.setdefault(node, []).append(int(index))
    return job_slowdown(prep.table, str(record["class"]), per_node).factor
