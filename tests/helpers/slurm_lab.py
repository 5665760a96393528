"""The real-Slurm test setup several tests/slurm modules share: whether the testbed can run
here, a fresh folder for it, the example campaign ingested and `site render`-ed as an admin
would, a testbed running the rendered job_submit.lua, Prolog and Epilog, and a real
``slurm-pal serve`` process beside it (``AdvisorLab``).

The modules differ in what they put around this (one host or several, the advisor's Unix
socket or TCP listener, metrics, the campaign's shape): they say so through the site config
they write, the arguments here, and their own subclass of ``AdvisorLab``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from slurm_pal.adapters.slurm.release import OLDEST, SlurmRelease, detect_release
from slurm_pal.adapters.slurm.state import CliStateReader, JobState
from slurm_pal.cli.main import app
from slurm_pal.hooks.spool import DeliveryError, request
from slurm_pal.testbed import LocalSlurm, NodeSpec, missing_binaries
from slurm_pal.testbed.cluster import default_release, node_specs, release_bin_dir
from tests.helpers.processes import testbed_prefix

# $SLURM_PAL_SLURM_RELEASE (unset: the host's Slurm); tests/slurm/conftest.py puts its
# programs first on PATH.
RELEASE = default_release()

# Switch features of the 4-node example cluster, for --constraint tests.
FEATURES = {"n01": ("rackA",), "n02": ("rackA",), "n03": ("rackB",), "n04": ("rackB",)}


def unavailable(reason: str) -> None:
    """Skip locally, fail in CI (CI=true), where the testbed must run."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI needs the real Slurm testbed: {reason}", pytrace=False)
    pytest.skip(reason)


def host_release_only(why: str) -> None:
    """Skip on a second release (scripts/test.sh runs tests/slurm once per release): for tests
    of the advisor's own logic, whose Slurm calls other tests already cover on every release.
    ``why`` says why the host's release is enough."""
    if RELEASE != "system":
        pytest.skip(f"{why}; the host's release is enough")


def require_slurm() -> None:
    """Skip (fail in CI) unless the Slurm binaries are installed and we are root."""
    missing = missing_binaries(RELEASE)
    if missing:
        option = "" if release_bin_dir(RELEASE) is None else f" --release {RELEASE}"
        unavailable(
            f"Slurm {RELEASE} not installed ({', '.join(missing)} missing): "
            f"bash scripts/install-slurm.sh{option}"
        )
    if os.geteuid() != 0:
        unavailable("the Slurm testbed runs its daemons as root; run the tests as root")


def fresh_testbed_dir() -> Path:
    """A fresh folder for a testbed; not under pytest's 0700 tmp dirs, because munged runs as
    user munge and must reach its socket."""
    root = Path(tempfile.mkdtemp(prefix=Path(testbed_prefix()).name, dir="/tmp"))
    root.chmod(0o755)
    return root


def release_of(tb: LocalSlurm) -> SlurmRelease:
    """The testbed's release as its scontrol reports it (22.05's rules when unreadable)."""
    return detect_release(lambda args: tb.run(args, check=False).stdout) or OLDEST


def stored_tres(tb: LocalSlurm, text: str) -> str:
    """``gres:gpu:T:n`` as the testbed's release stores and prints it (24.11: ``gres/``)."""
    return text.replace("gres:", release_of(tb).tres_prefix)


def free_port() -> int:
    """A TCP port on loopback nobody listens on now (for the advisor's listener or metrics)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render_site(
    db: Path,
    csv: Path,
    out: Path,
    *,
    config: Path | None = None,
    apps: Mapping[str, str] | None = None,
) -> dict:
    """What an admin runs before deploying: `profile ingest` of ``csv`` as campaign
    "example", `apps set` of each app's class, `site render` into ``out`` (the testbed's fake
    GPU devices, /dev/tty{index}). Returns labels.json as rendered."""
    base = ["--db", str(db)] if config is None else ["--db", str(db), "--config", str(config)]
    steps = [
        ["profile", "ingest", str(csv), "--campaign", "example"],
        *(["apps", "set", name, "--class", cls] for name, cls in (apps or {}).items()),
        ["site", "render", "--out", str(out), "--device-pattern", "/dev/tty{index}"],
    ]
    for args in steps:
        result = CliRunner().invoke(app, [*base, *args], env={"SLURM_PAL_CONFIG": None})
        assert result.exit_code == 0, result.output
    return json.loads((out / "labels.json").read_text())


def rendered_nodes(
    labels: dict, features: Mapping[str, Sequence[str]] | None = None
) -> list[NodeSpec]:
    """The testbed's nodes with the GPU types labels.json gives each device, in device order."""
    return node_specs(
        {
            node: [g["label"] for g in sorted(gpus, key=lambda g: g["index"])]
            for node, gpus in labels["nodes"].items()
        },
        features,
    )


def rendered_hooks(site: Path) -> dict[str, str]:
    """The testbed's job_submit.lua, Prolog and Epilog: those `site render` wrote in ``site``."""
    return {
        "job_submit_lua": (site / "job_submit.lua").read_text(),
        "prolog": str(site / "prolog.sh"),
        "epilog": str(site / "epilog.sh"),
    }


def write_campaign(
    path: Path, nodes: Sequence[str], slower: Callable[[str, int, str], float]
) -> None:
    """A campaign CSV of 2 GPUs per node, three repeats per GPU and class (A: gemm, D: stream),
    each ``slower(node, gpu_index, class)`` x 1 with 0.2 % noise (seeded)."""
    rng = np.random.default_rng(0)
    rows = ["uuid,duration_s,node,gpu_index,gpu_model,job_class,benchmark"]
    for n, node in enumerate(nodes):
        for index in range(2):
            uuid = f"GPU-{n:04d}{index:04d}-0000-0000-0000-000000000000"
            for job_class, bench in (("A", "gemm"), ("D", "stream")):
                factor = slower(node, index, job_class)
                for _ in range(3):
                    value = factor * (1.0 + rng.normal(0, 0.002))
                    rows.append(f"{uuid},{value:.5f},{node},{index},v100,{job_class},{bench}")
    path.write_text("\n".join(rows) + "\n")


@dataclass(frozen=True)
class LabPaths:
    """Where an advisor lab keeps things under its testbed folder: ``work/`` the store,
    site.toml and the rendered site, ``out/`` the jobs' output, ``adv/`` the socket."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def db(self) -> Path:
        return self.work / "store.db"

    @property
    def config(self) -> Path:
        return self.work / "site.toml"

    @property
    def site(self) -> Path:
        return self.work / "site"

    @property
    def socket(self) -> Path:
        return self.root / "adv" / "advisor.sock"

    def site_toml(self, advisor: str, extra: str = "") -> str:
        """site.toml with this lab's socket, labels file and spool dir (hook telemetry off),
        ``advisor`` lines added to [advisor] and ``extra`` sections after."""
        return (
            f'[advisor]\nsocket = "{self.socket}"\n'
            f'labels_file = "{self.site / "labels.json"}"\n{advisor}'
            f'[hooks]\nspool_dir = "{self.root / "spool"}"\ntelemetry = false\n{extra}'
        )

    def lab_fields(self, labels: dict, extra_conf: tuple[str, ...] = ()) -> dict[str, Any]:
        """An :class:`AdvisorLab`'s fields for the site rendered from ``labels``."""
        return {
            "tb": LocalSlurm(
                self.root,
                rendered_nodes(labels),
                extra_conf=extra_conf,
                **rendered_hooks(self.site),
            ),
            "root": self.root,
            "db": self.db,
            "config": self.config,
            "socket": self.socket,
            "log_path": self.root / "log" / "advisor.log",
        }


def lab_paths() -> LabPaths:
    """A fresh testbed folder with ``work/`` and ``out/`` made."""
    paths = LabPaths(fresh_testbed_dir())
    paths.work.mkdir()
    (paths.root / "out").mkdir()
    return paths


@dataclass(kw_only=True)
class AdvisorLab:
    """A testbed and the ``slurm-pal serve`` process that advises it, as a site runs them."""

    tb: LocalSlurm
    root: Path
    db: Path
    config: Path
    socket: Path  # the advisor's Unix socket
    log_path: Path  # the advisor's stdout and stderr
    submit_user: str | None = None  # who runs sbatch by default (None: root)
    advisor: subprocess.Popen[bytes] | None = None

    # -- the advisor ------------------------------------------------------------------------
    def ask(self, message: dict | str, timeout_s: float = 10.0) -> dict:
        """One request on the advisor's Unix socket: a message, or just its op."""
        body = {"op": message} if isinstance(message, str) else message
        return request(str(self.socket), {"v": 1, **body}, timeout_s)

    def _spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` where the advisor runs (here: this host)."""
        return subprocess.Popen(argv, **kwargs)

    def start_advisor(self) -> None:
        """`slurm-pal serve` with the lab's store and config, once it answers health."""
        self.stop_advisor()
        argv = [sys.executable, "-m", "slurm_pal.cli.main", "--db", str(self.db)]
        argv += ["--config", str(self.config), "serve"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.advisor = self._spawn(
                argv,
                env={**self.tb.env, "SLURM_PAL_CONFIG": ""},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.advisor.poll() is not None:
                raise AssertionError(f"slurm-pal serve exited:\n{self.advisor_log()[-3000:]}")
            try:
                if self.ask("health", 1.0).get("ok"):
                    return
            except DeliveryError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"slurm-pal serve did not answer:\n{self.advisor_log()[-3000:]}")

    def ensure_advisor(self) -> None:
        """Start the advisor again if a test stopped or killed it."""
        if self.advisor is None or self.advisor.poll() is not None:
            self.start_advisor()

    def stop_advisor(self, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with ``kill``, or when it does not stop within 30 s)."""
        if self.advisor is not None and self.advisor.poll() is None:
            if kill:
                self.advisor.kill()
            else:
                self.advisor.terminate()
            try:
                self.advisor.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.advisor.kill()
                self.advisor.wait(timeout=30)
        self.advisor = None

    def advisor_log(self, since: int = 0) -> str:
        """The advisor's output from byte ``since`` on."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[since:].decode(errors="replace")

    def log_size(self) -> int:
        """Where the advisor's output ends now (for ``advisor_log(since)``)."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def wait_advisor_sees_all_free(self, gpus: int) -> None:
        """The advisor's view refreshes every refresh_s: wait until it shows all ``gpus`` free
        and no reservation, so a test's decisions start from the state the test assumes."""
        deadline = time.monotonic() + 30
        health: dict = {}
        while time.monotonic() < deadline:
            health = self.ask("health")
            if health.get("free") == health.get("gpus") == gpus and not health.get("reservations"):
                return
            time.sleep(0.2)
        raise AssertionError(f"the advisor still sees busy GPUs: {health}")

    @contextmanager
    def running(self) -> Iterator[None]:
        """Slurm and the advisor up for the block; afterwards both stopped (also after a
        failed start) and the folder removed, unless SLURM_PAL_KEEP_TESTBED is set."""
        try:
            self.tb.start()
            self.start_advisor()
            yield
        finally:
            self.stop_advisor()
            self.tb.stop()
            if not os.environ.get("SLURM_PAL_KEEP_TESTBED"):
                shutil.rmtree(self.root, ignore_errors=True)

    # -- Slurm and the store -----------------------------------------------------------------
    def cancel_all(self, users: Sequence[str] = ("root",)) -> None:
        """Cancel every job of ``users``; wait until no job is alive and every node is idle."""
        for user in users:
            subprocess.run(["scancel", "--full", "-u", user], env=self.tb.env, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = [j for j in self.jobs().values() if j.state in ("PENDING", "RUNNING")]
            if not live and set(self.tb.node_states().values()) <= {"idle"}:
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs still alive: {self.tb.node_states()}")

    def sbatch(self, *args: str, user: str | None = None) -> int:
        """Submit as ``user`` (default ``submit_user``), output in root/out; the job id."""
        user = user or self.submit_user
        out = self.root / "out"
        cmd = ["sbatch", "--parsable", "-o", f"{out}/%j.out", "--chdir", str(out), *args]
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        proc = self.tb.run(cmd, timeout_s=60, check=False)
        assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
        return int(proc.stdout.strip().split(";")[0])

    def jobs(self) -> dict[int, JobState]:
        """Slurm's jobs by id, read as the advisor reads them."""
        return {j.job_id: j for j in CliStateReader(self.tb.env).jobs()}

    def records(self, job_id: int) -> list[tuple[str, str]]:
        """(node, kind) of every stored Prolog/Epilog record of the job, one row per record."""
        with sqlite3.connect(self.db) as db:
            rows = db.execute(
                "SELECT node, kind FROM job_records WHERE job_id = ? ORDER BY node, kind",
                (job_id,),
            ).fetchall()
        return [(str(n), str(k)) for n, k in rows]
