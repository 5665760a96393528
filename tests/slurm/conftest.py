"""The real-Slurm fixture: a private Slurm on loopback whose GPU types come from
`slurm-pal site render` of the example campaign (4 nodes x 4 fake GPUs).

The release is $SLURM_PAL_SLURM_RELEASE (unset: the host's Slurm, 22.05 on Debian 12; `24.11`:
the cached Debian 13 build of scripts/install-slurm.sh --release 24.11). scripts/test.sh runs
this directory once per release. The release's programs go first on this process's PATH, so
the advisor's own sinfo/squeue/scontrol calls talk to the same release as the testbed.

Missing Slurm binaries skip these tests locally, but fail them in CI (CI=true), where
`bash .ci/run` installs Slurm through scripts/setup.sh dev."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.adapters.slurm.release import OLDEST, SlurmRelease, detect_release
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm, NodeSpec, missing_binaries
from slurm_pal.testbed.cluster import default_release, release_bin_dir

RELEASE = default_release()
if (_bin := release_bin_dir(RELEASE)) is not None:
    os.environ["PATH"] = f"{_bin}{os.pathsep}{os.environ.get('PATH', '')}"

# What the Prolog sees (root, every node of the job, at allocation: PrologFlags=Alloc).
PROLOG = """#!/bin/sh
echo "JOB_GPUS=$SLURM_JOB_GPUS" > "{root}/log/prolog-$SLURM_JOB_ID-$SLURMD_NODENAME"
exit 0
"""
# A probe, not the advisor: shows what job_submit.lua reads, in the job's admin_comment.
JOB_SUBMIT_LUA = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.comment == "pal:probe" then
    job_desc.admin_comment = "tres_per_node=" .. tostring(job_desc.tres_per_node)
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
"""
FEATURES = {"n01": ("rackA",), "n02": ("rackA",), "n03": ("rackB",), "n04": ("rackB",)}


@dataclass
class SlurmLab:
    tb: LocalSlurm
    db: Path
    render_dir: Path
    labels: dict  # labels.json as rendered
    slurm_labels: dict[str, dict[int, str]]  # node -> {Slurm GPU index: label}
    release: SlurmRelease = OLDEST  # what the testbed's scontrol says it is

    def tres(self, text: str) -> str:
        """``gres:gpu:T:n`` as this release stores it (24.11: ``gres/gpu:T:n``)."""
        return text.replace("gres:", self.release.tres_prefix)

    def cli(self, *args: str, ok: bool = True):
        """`slurm-pal --db DB ARGS` in-process, with SLURM_CONF pointing at the testbed."""
        result = CliRunner().invoke(
            app,
            ["--db", str(self.db), *map(str, args)],
            env={"SLURM_PAL_CONFIG": None, "SLURM_CONF": str(self.tb.conf)},
        )
        if ok and result.exit_code != 0:
            raise AssertionError(
                f"slurm-pal {' '.join(args)} exited {result.exit_code}:\n"
                f"{result.output}\n{result.exception!r}"
            )
        return result


def release_of(tb: LocalSlurm) -> SlurmRelease:
    """The testbed's release as its scontrol reports it (22.05's rules when unreadable)."""
    return detect_release(lambda args: tb.run(args, check=False).stdout) or OLDEST


def stored_tres(tb: LocalSlurm, text: str) -> str:
    """``gres:gpu:T:n`` as the testbed's release stores and prints it (24.11: ``gres/``)."""
    return text.replace("gres:", release_of(tb).tres_prefix)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI needs the real Slurm testbed: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_report_header() -> str:
    bin_dir = release_bin_dir(RELEASE)
    return f"real Slurm: release {RELEASE} ({bin_dir or 'programs on PATH'})"


def require_slurm() -> None:
    """Skip (fail in CI) unless the Slurm binaries are installed and we are root."""
    missing = missing_binaries(RELEASE)
    if missing:
        option = "" if release_bin_dir(RELEASE) is None else f" --release {RELEASE}"
        _unavailable(
            f"Slurm {RELEASE} not installed ({', '.join(missing)} missing): "
            f"bash scripts/install-slurm.sh{option}"
        )
    if os.geteuid() != 0:
        _unavailable("the Slurm testbed runs its daemons as root; run the tests as root")


def testbed_dir() -> Path:
    """A fresh folder for a testbed; not under pytest's 0700 tmp dirs, because munged runs as
    user munge and must reach its socket."""
    root = Path(tempfile.mkdtemp(prefix="spal-tb-", dir="/tmp"))
    root.chmod(0o755)
    return root


@pytest.fixture
def testbed_root() -> Iterator[Path]:
    """A fresh testbed folder (Slurm required); whatever runs in it is stopped afterwards."""
    require_slurm()
    root = testbed_dir()
    try:
        yield root
    finally:
        if (root / "testbed.json").exists():
            LocalSlurm.attach(root).stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmLab]:
    require_slurm()

    work = tmp_path_factory.mktemp("slurm-store")
    db = work / "store.db"
    csv = work / "example.csv"
    generate_example_campaign(nodes=4, gpus_per_node=4, node_prefix="n").to_csv(csv, index=False)
    runner = CliRunner()
    env = {"SLURM_PAL_CONFIG": None}
    for args in (
        ["profile", "ingest", str(csv), "--campaign", "example"],
        ["site", "render", "--out", str(work / "site"), "--device-pattern", "/dev/tty{index}"],
    ):
        result = runner.invoke(app, ["--db", str(db), *args], env=env)
        assert result.exit_code == 0, result.output
    labels = json.loads((work / "site" / "labels.json").read_text())
    nodes = []
    for node, gpus in labels["nodes"].items():
        by_index = {g["index"]: g["label"] for g in gpus}
        types = tuple(by_index[i] for i in sorted(by_index))
        nodes.append(NodeSpec(node, types, FEATURES.get(node, ())))
    slurm_labels = {
        node: {g["slurm_index"]: g["label"] for g in gpus} for node, gpus in labels["nodes"].items()
    }

    root = testbed_dir()
    hooks = root / "hooks"
    hooks.mkdir()
    prolog = hooks / "prolog.sh"
    prolog.write_text(PROLOG.format(root=root))
    prolog.chmod(0o755)
    tb = LocalSlurm(root, nodes, prolog=str(prolog), job_submit_lua=JOB_SUBMIT_LUA)

    def teardown() -> None:
        tb.stop()
        if not os.environ.get("SLURM_PAL_KEEP_TESTBED"):
            shutil.rmtree(root, ignore_errors=True)

    atexit.register(teardown)  # also on an interrupted session; stop() is idempotent
    try:
        tb.start()
        yield SlurmLab(tb, db, work / "site", labels, slurm_labels, release_of(tb))
    finally:
        teardown()
