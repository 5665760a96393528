"""What a reload (SIGHUP, ``slurm-pal serve reload``) changes in a running advisor.

Why a module: the reload op must check everything before it changes anything (a typo in the
config at 3 a.m. must not leave the service half on the old and half on the new settings), and
say in one log line what changed and what waits for a restart. Reservations, decisions, the
Slurm view and the counters are never touched here.

Live: the placement policy and its settings, class rules, classes, locality penalties,
timings (``refresh_s``, ``replan_s``, ``replan_on_epilog``, ``reservation_ttl_s``), suspicion
(``suspicion``, ``suspicion_days``: the detector starts over, warmed from the store), label
requests, allowed users, the spool folder, retention and labels.json. A restart: what the
service binds or opens once (socket, its group, the connection bound, the TCP listener, the
Slurm backend, the store, the metrics endpoint). ``advisor.submit_timeout_ms`` lives in the
rendered job_submit.lua (``site render``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_pal.adapters.config import ConfigError, SiteConfig, load_config
from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.advisor.connections import allowed_uids
from slurm_pal.advisor.server import ReloadRefused
from slurm_pal.advisor.state import make_policy
from slurm_pal.engine.decide import LabelTable

if TYPE_CHECKING:
    from slurm_pal.advisor.server import AdvisorServer

__all__ = ["LIVE_KEYS", "Overrides", "Reloader", "config_changes"]

LIVE_KEYS = frozenset(
    {
        "advisor.policy",
        "advisor.pack_tolerance",
        "advisor.avoid_above",
        "advisor.outliers",
        "advisor.label_requests",
        "advisor.refresh_s",
        "advisor.replan_s",
        "advisor.replan_on_epilog",
        "advisor.reservation_ttl_s",
        "advisor.suspicion",
        "advisor.suspicion_days",
        "advisor.labels_file",
        "advisor.allowed_users",
        "hooks.spool_dir",
        "store.retention_days",
    }
)
LIVE_SECTIONS = ("classes.", "classification.", "locality.")
RESTART_KEYS = frozenset(
    {
        "advisor.socket",
        "advisor.socket_group",
        "advisor.max_connections",
        "advisor.request_timeout_s",
        "advisor.slurm_backend",
        "advisor.slurm_job_read",
        "advisor.listen",
        "advisor.record_users",
        "advisor.munge_socket",
        "store.path",
    }
)
RESTART_SECTIONS = ("metrics.",)


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(value):
        if f.name == "source":
            continue
        item = getattr(value, f.name)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            yield from _flat(item, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", item


def config_changes(old: SiteConfig, new: SiteConfig) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every key that differs, in file order."""
    before = dict(_flat(old))
    return [(k, before.get(k), v) for k, v in _flat(new) if before.get(k) != v]


def _kind(key: str) -> str:
    if key in LIVE_KEYS or key.startswith(LIVE_SECTIONS):
        return "live"
    if key in RESTART_KEYS or key.startswith(RESTART_SECTIONS):
        return "restart"
    if key == "advisor.submit_timeout_ms":
        return "render"
    return "unused"


@dataclass(frozen=True)
class Overrides:
    """What `serve` was started with on the command line: it wins over the file, on reload
    too."""

    policy: str | None = None
    labels: Path | None = None
    refresh_s: float | None = None
    replan_s: float | None = None


class Reloader:
    """``Reloader(path, overrides)(server)``: re-read the config at ``path`` (None: as at start,
    ``$SLURM_PAL_CONFIG`` or the defaults) and labels.json, check both, then apply what can
    change live. Returns one text per change; :class:`ReloadRefused` when unusable."""

    def __init__(self, config_path: Path | None, overrides: Overrides = Overrides()) -> None:
        self.config_path = config_path
        self.overrides = overrides
        self._labels: LabelTable | None = None

    def labels_path(self, config: SiteConfig) -> str | None:
        if self.overrides.labels is not None:
            return str(self.overrides.labels)
        return config.advisor.labels_file

    def read_labels(self, config: SiteConfig) -> LabelTable | None:
        """labels.json as the reload would load it (None: the store's labels)."""
        path = self.labels_path(config)
        if not path:
            return None
        try:
            return read_labels(path)
        except LabelTableError as exc:
            raise ReloadRefused(str(exc)) from None

    def remember(self, config: SiteConfig) -> None:
        """Note the labels in use at start, so a reload can say whether they changed."""
        try:
            self._labels = self.read_labels(config)
        except ReloadRefused:
            self._labels = None

    def __call__(self, server: AdvisorServer) -> list[str]:
        cli = self.overrides
        pinned = {
            "advisor.policy": cli.policy,
            "advisor.refresh_s": cli.refresh_s,
            "advisor.replan_s": cli.replan_s,
            "advisor.labels_file": cli.labels,
        }
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            raise ReloadRefused(str(exc)) from None
        labels = self.read_labels(new)
        name = cli.policy or new.advisor.policy
        try:
            make_policy(name, new.advisor)  # what set_config builds: refuse before any change
        except (ValueError, KeyError) as exc:
            raise ReloadRefused(f"advisor.policy {name!r}: {exc}") from None
        old = server.state.config
        out: list[str] = []
        later: list[str] = []
        for key, before, after in config_changes(old, new):
            kind = _kind(key)
            if pinned.get(key) is not None:
                out.append(f"{key} {before!r} -> {after!r} (the command line's value kept)")
            elif kind == "live":
                out.append(f"{key} {before!r} -> {after!r}")
            elif kind == "restart":
                later.append(key)
            elif kind == "render":
                later.append(f"{key} (site render)")
        server.state.set_config(new, policy=cli.policy)
        a = new.advisor
        server.refresh_s = a.refresh_s if cli.refresh_s is None else cli.refresh_s
        server.replan_s = a.replan_s if cli.replan_s is None else cli.replan_s
        server.replan_on_epilog = a.replan_on_epilog
        server.allowed = allowed_uids(a.allowed_users)
        server.spool_dir = Path(new.hooks.spool_dir)
        if labels is not None and labels != self._labels:
            out.append(f"labels.json of campaign {labels.campaign} ({len(labels.entries)} GPUs)")
        self._labels = labels
        if later:
            out.append("at restart only: " + ", ".join(later))
        return out
