"""The real-Slurm fixture: a private Slurm on loopback whose GPU types come from
`slurm-pal site render` of the example campaign (4 nodes x 4 fake GPUs).

The release is $SLURM_PAL_SLURM_RELEASE (unset: the host's Slurm, 22.05 on Debian 12; `24.11`:
the cached Debian 13 build of scripts/install-slurm.sh --release 24.11). scripts/test.sh runs
this directory once per release. The release's programs go first on this process's PATH, so
the advisor's own sinfo/squeue/scontrol calls talk to the same release as the testbed.

Missing Slurm binaries skip these tests locally, but fail them in CI (CI=true), where
`bash .ci/run` installs Slurm through scripts/setup.sh dev. The setup the modules share (the
rendered site, a testbed with its hooks, a running advisor) is in tests/helpers/slurm_lab.py."""

from __future__ import annotations

import atexit
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurm_pal.adapters.slurm.release import OLDEST, SlurmRelease
from slurm_pal.cli.main import app
from slurm_pal.example_campaign import generate_example_campaign
from slurm_pal.testbed import LocalSlurm
from slurm_pal.testbed.cluster import release_bin_dir
from tests.helpers.slurm_lab import (
    FEATURES,
    RELEASE,
    release_of,
    render_site,
    rendered_nodes,
    require_slurm,
)

# Modules that import these from here rather than from tests/helpers/slurm_lab.py still work.
from tests.helpers.slurm_lab import fresh_testbed_dir as testbed_dir
from tests.helpers.slurm_lab import stored_tres as stored_tres

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


def pytest_report_header() -> str:
    bin_dir = release_bin_dir(RELEASE)
    return f"real Slurm: release {RELEASE} ({bin_dir or 'programs on PATH'})"


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
    labels = render_site(db, csv, work / "site")
    nodes = rendered_nodes(labels, FEATURES)
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
