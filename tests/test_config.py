"""Site configuration: defaults, the documented example, and errors that name file and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_pal.adapters.config import (
    SYSTEM_DB,
    ConfigError,
    SiteConfig,
    default_db_path,
    load_config,
    resolve_db_path,
)

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_documented_example_equals_the_defaults() -> None:
    """site-config/slurm-pal.toml documents the defaults; keep the two in step."""
    example = load_config(REPO / "site-config" / "slurm-pal.toml")
    assert dataclasses.replace(example, source="<defaults>") == SiteConfig()


def test_every_default_knob_is_documented_in_the_example() -> None:
    text = (REPO / "site-config" / "slurm-pal.toml").read_text()
    sections = (
        "store",
        "classes",
        "binning",
        "locality",
        "profiling",
        "advisor",
        "hooks",
        "metrics",
    )
    for section in sections:
        assert f"[{section}]" in text
        for f in dataclasses.fields(getattr(SiteConfig(), section)):
            assert f"{f.name} =" in text, f"{section}.{f.name} is not documented"


def test_values_are_read(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            '[classes]\nnames = ["X", "Y"]\ndefault = "Y"\n[locality]\nacross_switches = 2\n',
        )
    )
    assert cfg.classes.names == ("X", "Y")
    assert cfg.locality.across_switches == 2.0
    assert cfg.binning.k_max == 11


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[binning]\nk_maks = 3\n", r"unknown key 'binning.k_maks'; valid keys here: .*k_max"),
        ("[bining]\n", r"unknown key 'bining'; valid keys here: advisor, binning, campaign, cl"),
        ("[binning]\nk_max = 'ten'\n", r"'binning.k_max' must be an integer, got 'ten'"),
        ("[binning]\npal_artifact = 1\n", r"'binning.pal_artifact' must be true or false"),
        ('[classes]\ndefault = "Z"\n', r"'classes.default' is 'Z'; valid values: A, B, C, D"),
        ('[classes]\nnames = ["A", "A"]\n', r"duplicates"),
        ("[binning]\nk_min = 1\n", r"k_min"),
        ("[locality]\nacross_switches = 0.5\n", r"'locality.across_switches' must be >= 1.0"),
        ("binning = 3\n", r"'binning' must be a table"),
        ("[binning\n", r"not valid TOML"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_the_campaign_section_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, '[campaign]\nrepeats = 2\n[campaign.commands]\nA = "sh bench.sh"\n')
    got = load_config(path).campaign
    assert got.repeats == 2 and got.command_map == {"A": "sh bench.sh"}
    with pytest.raises(ConfigError, match="campaign.commands.*E"):
        load_config(write(tmp_path, '[campaign.commands]\nE = "sh bench.sh"\n'))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_env_selects_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PAL_CONFIG", str(write(tmp_path, "[binning]\nseed = 9\n")))
    assert load_config().binning.seed == 9


def test_db_path_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(write(tmp_path, f'[store]\npath = "{tmp_path}/cfg.db"\n'))
    monkeypatch.delenv("SLURM_PAL_DB", raising=False)
    assert resolve_db_path(None, cfg) == tmp_path / "cfg.db"
    monkeypatch.setenv("SLURM_PAL_DB", str(tmp_path / "env.db"))
    assert resolve_db_path(None, cfg) == tmp_path / "env.db"
    assert resolve_db_path(tmp_path / "cli.db", cfg) == tmp_path / "cli.db"


def test_default_db_path_depends_on_who_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert default_db_path() == SYSTEM_DB
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", "/home/u/.data")
    assert default_db_path() == Path("/home/u/.data/slurm-pal/slurm-pal.db")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[advisor]\npolicy = "best"\n',
            r"'advisor.policy' is 'best'; valid values: packed-pm, pal",
        ),
        ('[advisor]\nslurm_backend = "x"\n', r"valid values: auto, cli, pyslurm"),
        ('[advisor]\nslurm_job_read = "fast"\n', r"'advisor.slurm_job_read' .* json, brief"),
        ('[advisor]\nsocket = "run/a.sock"\n', r"'advisor.socket' must be an absolute path"),
        ("[advisor]\nsubmit_timeout_ms = 0\n", r"'advisor.submit_timeout_ms' must be > 0"),
        ("[advisor]\nreplan_s = -1\n", r"'advisor.replan_s' must be >= 0"),
        ("[hooks]\nsample_s = 0\n", r"'hooks.sample_s' must be > 0"),
    ],
)
def test_advisor_and_hooks_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_the_config_knows_the_backfill_rules_the_core_models() -> None:
    """The config loads without numpy, so it keeps its own list of the rules; it is core's."""
    from slurm_pal.adapters import config
    from slurm_pal.core import queue

    assert config.BACKFILL_RESERVES == queue.BACKFILL_RESERVES
