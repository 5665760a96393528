"""What pip reads from pyproject.toml: installing must not bury the useful lines under
setuptools' deprecation warnings."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def test_an_editable_install_prints_no_packaging_warning(tmp_path: Path) -> None:
    """What scripts/setup.sh runs, on a fresh copy of the sources: pip's editable install
    with build isolation (the newest setuptools the index has) says nothing on stderr but
    what the machine's pip configuration itself adds. Its import finder strategy printed an
    "Editable installation ... !!" banner at every fresh setup."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "slurm_pal", source / "slurm_pal",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # pip from this environment, run for the new one (no download of pip itself)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-deps", "-e", str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    lines = [ln for ln in install.stderr.splitlines() if "is ignored: it is neither" not in ln]
    assert not [ln for ln in lines if "Warning" in ln or "!!" in ln], install.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    (pth,) = site.glob("__editable__.slurm_pal-*.pth")
    assert pth.read_text().strip() == str(source)
