"""The version moves with the code and reaches what an admin sees: pyproject.toml's version is
the installed one, the CHANGELOG has a section for it, and the advisor writes it into each job's
admin comment and its health (which ``/metrics`` shows as ``slurm_pal_advisor_info{version}``)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import slurm_pal
from slurm_pal.cli.main import app
from slurm_pal.engine.decide import parse_admin_comment
from slurm_pal.engine.jobdesc import JobDescription
from tests.helpers.advisor import Env, short_env

REPO = Path(__file__).resolve().parents[1]
PYPROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_installed_version_is_pyprojects() -> None:
    """A bump without reinstalling (``scripts/setup.sh``) would leave jobs stamped with the old."""
    assert version("slurm-pal") == PYPROJECT_VERSION
    assert slurm_pal.__version__ == PYPROJECT_VERSION
    assert CliRunner().invoke(app, ["version"]).stdout.strip() == PYPROJECT_VERSION


def test_the_changelog_opens_with_this_version() -> None:
    """Semantic versions; the newest section of CHANGELOG.md (after changes not yet released)
    is the version being built."""
    assert re.fullmatch(r"\d+\.\d+\.\d+", PYPROJECT_VERSION), PYPROJECT_VERSION
    headings = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    released = [h for h in headings if h.lower() != "unreleased"]
    assert released and released[0] == PYPROJECT_VERSION, headings[:2]


@pytest.fixture
def env() -> Iterator[Env]:
    with short_env("spal-ver-") as the_env:
        yield the_env


def test_the_advisor_stamps_each_job_and_its_health_with_the_version(env: Env) -> None:
    state = env.state()
    wire = {"user": "alice", "uid": 1000, "name": "train", "tres_per_node": "gres:gpu:1"}
    decision = state.decide(JobDescription.from_wire({**wire, "comment": "pal:app=resnet"}), {})
    assert decision.action == "route"
    comment = parse_admin_comment(str(decision.set_fields["admin_comment"]))
    assert comment is not None and comment["version"] == PYPROJECT_VERSION
    assert state.health()["version"] == PYPROJECT_VERSION
