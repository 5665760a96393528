"""The ``[campaign]`` section of the site config: what ``campaign plan/collect/suggest`` use
when their options are not given.

Kept here, next to the campaign code, as a frozen dataclass with its own loader from the raw
TOML table, so ``adapters/config.py`` only has to hand the table over (see
:func:`load_campaign_settings`). Errors name the file, the dotted key and what is valid, like
the rest of the config.

```toml
[campaign]
root = "/shared/slurm-pal/campaigns"   # campaign directories, on a filesystem nodes share
partition = "gpu"
repeats = 3
time_limit = "01:00:00"                # per array task (one GPU, every class and repeat)
run_timeout_s = 1800                   # one benchmark run
warmup_s = 10                          # benchmark warm-up before the timed window
measure_s = 20                         # the timed window (sustained state; see profiling/)
python = "python3"                     # on the compute nodes
sbatch_args = ["--reservation=maint"]
tolerance = 0.05                       # repeats of a GPU disagreeing beyond this: a finding
drift_threshold = 0.05                 # campaign suggest: median slowdown of a drifting GPU
drift_min_runs = 5                     # campaign suggest: fewer production runs: not listed

[campaign.commands]                    # per class "bring your own" benchmark
A = "{python} /apps/resnet/bench.py --steps 200"
```
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from slurm_pal.errors import SlurmPalError

SECTION = "campaign"
_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")


class CampaignSettingsError(SlurmPalError, ValueError):
    """A bad ``[campaign]`` key; the message names the file, the key and what is valid."""


@dataclass(frozen=True)
class CampaignSettings:
    root: str | None = None
    """Folder of campaign directories, shared with the compute nodes. Unset: $SLURM_PAL_CAMPAIGNS,
    else 'campaigns' next to the store."""
    partition: str | None = None
    repeats: int = 3
    time_limit: str = "01:00:00"
    run_timeout_s: float = 1800.0
    python: str = "python3"
    sbatch_args: tuple[str, ...] = ()
    commands: tuple[tuple[str, str], ...] = ()
    """(class, shell command) pairs: each class's own benchmark (prints PAL_DURATION_S=)."""
    tolerance: float = 0.05
    drift_threshold: float = 0.05
    drift_min_runs: int = 5
    warmup_s: float = 10.0
    """Benchmark warm-up, seconds: on H100 sustained GEMM sits at its power cap from the first
    second, but clocks, temperature and cuBLAS's kernel choice settle over seconds."""
    measure_s: float = 20.0
    """Timed window, seconds: a 0.3 s GEMM run reads 4.7 % faster than a job sees on H100 and
    repeats 2.7x noisier than 20 s windows (shared/data/gpu-h100/README.md)."""

    @property
    def command_map(self) -> dict[str, str]:
        return dict(self.commands)


def load_campaign_settings(
    table: Mapping[str, Any], source: str, class_names: Sequence[str]
) -> CampaignSettings:
    """The ``[campaign]`` table of ``source`` -> settings; ``class_names`` checks the commands."""
    if not isinstance(table, Mapping):
        raise CampaignSettingsError(f"{source}: '{SECTION}' must be a table ([{SECTION}])")
    valid = [f.name for f in fields(CampaignSettings)]
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{SECTION}.{key}"
        if key not in valid:
            raise CampaignSettingsError(
                f"{source}: unknown key '{name}'; valid keys here: {', '.join(sorted(valid))}"
            )
        if key == "commands":
            kwargs[key] = _commands(value, source, name, class_names)
        elif key in ("root", "partition", "python", "time_limit"):
            kwargs[key] = _string(value, source, name)
        elif key == "sbatch_args":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise CampaignSettingsError(
                    f"{source}: '{name}' must be a list of non-empty strings, got {value!r}"
                )
            kwargs[key] = tuple(value)
        elif key in ("repeats", "drift_min_runs"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CampaignSettingsError(
                    f"{source}: '{name}' must be a whole number >= 1, got {value!r}"
                )
            kwargs[key] = value
        else:  # run_timeout_s, tolerance, drift_threshold, warmup_s, measure_s
            kwargs[key] = _number(
                value, source, name, positive=key not in ("tolerance", "warmup_s")
            )
    settings = CampaignSettings(**kwargs)
    if not _TIME.match(settings.time_limit):
        raise CampaignSettingsError(
            f"{source}: '{SECTION}.time_limit' is {settings.time_limit!r}; valid: a Slurm time "
            "limit such as '30', '01:00:00', '1-00:00:00' or 'UNLIMITED'"
        )
    return settings


def _string(value: Any, source: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CampaignSettingsError(f"{source}: '{name}' must be a non-empty string, got {value!r}")
    return value


def _number(value: Any, source: str, name: str, *, positive: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        want = "a number > 0" if positive else "a number >= 0"
        raise CampaignSettingsError(f"{source}: '{name}' must be {want}, got {value!r}")
    return float(value)


def _commands(
    value: Any, source: str, name: str, class_names: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise CampaignSettingsError(
            f"{source}: '{name}' must be a table ([{name}]) of CLASS = \"command\""
        )
    out = []
    for job_class, command in value.items():
        if job_class not in class_names:
            raise CampaignSettingsError(
                f"{source}: '{name}.{job_class}': unknown class; valid classes: "
                f"{', '.join(class_names)} (classes.names)"
            )
        if not isinstance(command, str) or not command.strip():
            raise CampaignSettingsError(
                f"{source}: '{name}.{job_class}' must be a shell command printing "
                f"PAL_DURATION_S=<seconds>, got {command!r}"
            )
        out.append((str(job_class), command.strip()))
    return tuple(out)
