"""What pip reads from pyproject.toml: installing must not bury the useful lines under
setuptools' deprecation warnings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_with_its_file_and_a_setuptools_that_reads_it() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    # The TOML-table form ({ text = ... }) makes setuptools >= 77 warn on every build step.
    assert project["license"] == "MIT"
    for pattern in project["license-files"]:
        assert list(REPO.glob(pattern)), f"license-files entry {pattern!r} matches no file"
    requires = pyproject["build-system"]["requires"]
    setuptools_pins = [r for r in requires if r.startswith("setuptools")]
    assert len(setuptools_pins) == 1
    minimum = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools_pins[0])
    assert minimum is not None and int(minimum.group(1)) >= 77, setuptools_pins
