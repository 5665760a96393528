"""Render the Slurm configuration that exposes PM signatures as GRES types (gres.conf Type=).

Why: Slurm cannot be told "GPU index 2" at submit time, but it can be told "a GPU of type T".
Giving every GPU a ``Type=`` label that stands for its PM signature (see
:mod:`slurm_pal.core.variability`) lets job_submit.lua steer jobs to the GPUs PM-First/PAL would
pick. This module turns the active campaign (per-GPU node, index, model and label) into:

* ``gres.conf``: one line per GPU, ``NodeName=N Name=gpu Type=LABEL File=DEVICE``;
* ``slurm.conf.nodes``: the ``Gres=`` part of each ``NodeName`` line (counts per type);
* ``slurm.conf.snippet``: GresTypes, JobSubmitPlugins, PrologFlags, Prolog/Epilog;
* ``labels.json``: the same plan, machine-readable (``site check``, the testbed, the advisor);
* ``job_submit.lua``: asks the advisor at submit time (socket path, timeout and the site's GPU
  model names rendered in, so it fails open without the advisor);
* ``prolog.sh`` / ``epilog.sh``: call the stdlib-only hooks (``python -m slurm_pal.hooks``) with
  the absolute Python of this install, the socket (or the advisor's TCP address and the node's
  munge socket, ``hooks.advisor``) and the spool dir;
* ``slurm-pal.service``: the systemd unit of ``slurm-pal serve`` on the controller;
  ``slurm-pal-flush.service``/``.timer``: the nodes' ``hook flush`` every minute.

GPUs without a node or index (e.g. rows of the Longhorn sgemm file) cannot be placed in
gres.conf: they are listed as skipped, with the reason.

Slurm's GPU numbering (verified on 22.05.8, tests/slurm): slurmd merges a node's gres.conf lines
of one ``Type`` into one record, types in order of first appearance, lines in file order, and
numbers the GPUs along that list. ``SLURM_JOB_GPUS``, ``CUDA_VISIBLE_DEVICES`` and the ``IDX``
in ``GresUsed``/``gres_detail`` are those numbers, not the device minor: with lines
``A tty0, A tty1, B tty2, A tty3`` the B GPU is index 3. So the lines are written grouped by
type (Slurm's order), and ``labels.json`` records each GPU's ``slurm_index`` next to its
device ``index``; whoever maps a job's GPU indices back to physical GPUs must use it.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined

from slurm_pal.adapters.config import SYSTEM_DB, SiteConfig, split_host_port
from slurm_pal.adapters.labels_file import LabelTableError, read_labels
from slurm_pal.adapters.store import Store
from slurm_pal.core.binning import LabelMerge, Signature, merge_signatures
from slurm_pal.core.gres import NodeDiff as NodeDiff
from slurm_pal.core.gres import compare_gres as compare_gres
from slurm_pal.core.gres import distinct_type_ids
from slurm_pal.core.gres import node_key as _node_key
from slurm_pal.errors import SlurmPalError

DEFAULT_DEVICE_PATTERN = "/dev/nvidia{index}"
DEFAULT_PROLOG = "/etc/slurm/slurm-pal-prolog.sh"
DEFAULT_EPILOG = "/etc/slurm/slurm-pal-epilog.sh"
_BAD_TYPE = re.compile(r"[:,=()\s]")
SCRIPT_PREFIX = 16384  # bytes of the batch script job_submit.lua sends (PROTOCOL.md)
HOOK_LIMIT_S = 10  # a hook is killed after this long, whatever it is doing


class RenderError(SlurmPalError, ValueError):
    """The campaign cannot be rendered as asked; the message says what to change."""


@dataclass(frozen=True)
class HookSettings:
    """What job_submit.lua and the Prolog/Epilog scripts need to know about this install.

    ``python`` is the interpreter of this install (``sys.executable``, not resolved: a venv's
    python is a symlink whose target would lose the venv); ``labels_path`` is where the hooks
    find labels.json to map Slurm's GPU indices to devices (None: the hooks record no UUIDs).
    """

    socket: str = "/run/slurm-pal/advisor.sock"
    submit_timeout_ms: int = 300
    privileged_uids: tuple[int, ...] = (0,)
    python: str = sys.executable
    spool_dir: str = "/var/spool/slurm-pal"
    deliver_timeout_ms: int = 300
    epilog_timeout_ms: int = 900
    telemetry: bool = True
    sample_s: float = 5.0
    labels_path: str | None = None
    advisor: str | None = None  # HOST:PORT: hooks send over TCP with a munge credential
    munge_socket: str = "/run/munge/munge.socket.2"

    @classmethod
    def from_config(
        cls, config: SiteConfig, *, labels_path: str | None = None, python: str | None = None
    ) -> HookSettings:
        """The settings of ``[advisor]`` and ``[hooks]``; allowed users that exist here become
        the uids whose ``scontrol update`` job_submit.lua lets through untouched."""
        uids = {0}
        for user in config.advisor.allowed_users:
            try:
                uids.add(pwd.getpwnam(user).pw_uid)
            except KeyError:
                continue
        return cls(
            socket=config.advisor.socket,
            submit_timeout_ms=config.advisor.submit_timeout_ms,
            privileged_uids=tuple(sorted(uids)),
            python=python or sys.executable,
            spool_dir=config.hooks.spool_dir,
            deliver_timeout_ms=config.hooks.deliver_timeout_ms,
            epilog_timeout_ms=config.hooks.epilog_timeout_ms,
            telemetry=config.hooks.telemetry,
            sample_s=config.hooks.sample_s,
            labels_path=labels_path,
            advisor=config.hooks.advisor,
            munge_socket=config.hooks.munge_socket,
        )


@dataclass(frozen=True)
class ServiceSettings:
    """What the systemd unit of ``slurm-pal serve`` needs: who runs it (SlurmUser: the first
    of ``advisor.allowed_users`` that is not root), its config, store and socket, and whether
    it binds a privileged port (``advisor.listen`` below 1024)."""

    python: str = sys.executable
    user: str = "slurm"
    group: str = "slurm"
    config_path: str | None = None
    db_path: str = "/var/lib/slurm-pal/slurm-pal.db"
    socket: str = "/run/slurm-pal/advisor.sock"
    spool_dir: str = "/var/spool/slurm-pal"
    listen: str | None = None

    @classmethod
    def from_config(
        cls,
        config: SiteConfig,
        *,
        config_path: str | None = None,
        db_path: str | None = None,
        python: str | None = None,
    ) -> ServiceSettings:
        users = [u for u in config.advisor.allowed_users if u != "root"]
        return cls(
            python=python or sys.executable,
            user=users[0] if users else "root",
            group=config.advisor.socket_group,
            config_path=config_path,
            db_path=db_path or config.store.path or str(SYSTEM_DB),
            socket=config.advisor.socket,
            spool_dir=config.hooks.spool_dir,
            listen=config.advisor.listen,
        )

    def hidden_paths(self) -> list[str]:
        """What the unit could not reach, one sentence each with what to pass instead. The unit
        runs with ``PrivateTmp=yes`` (its own empty /tmp and /var/tmp) and ``ProtectHome=yes``
        (no /home, /root or /run/user): a venv, store or config there fails only when systemd
        starts the service, far from the `site render` that chose it."""
        problems = []
        for what, path, instead in (
            ("Python", self.python, "--python /opt/slurm-pal/bin/python (a venv made there)"),
            ("store", self.db_path, "--db /var/lib/slurm-pal/slurm-pal.db (or SLURM_PAL_DB)"),
            ("config", self.config_path, "--config /etc/slurm-pal/slurm-pal.toml"),
        ):
            hidden_by = _hidden_from_the_unit(path)
            if hidden_by:
                problems.append(
                    f"slurm-pal.service cannot reach its {what} {path}: the unit has "
                    f"{hidden_by}; put it elsewhere and render again with {instead}"
                )
        return problems

    @property
    def privileged_port(self) -> bool:
        return self.listen is not None and split_host_port(self.listen)[1] < 1024

    @property
    def runtime_dir(self) -> str | None:
        """systemd's RuntimeDirectory= when the socket is directly under /run/<name>/."""
        parent = Path(self.socket).parent
        return parent.name if parent.parent == Path("/run") else None


UNIT_HIDDEN_FOLDERS = {
    "/tmp": "PrivateTmp=yes",
    "/var/tmp": "PrivateTmp=yes",
    "/home": "ProtectHome=yes",
    "/root": "ProtectHome=yes",
    "/run/user": "ProtectHome=yes",
}
"""Folders the rendered unit's sandbox replaces or hides, and the setting that does it."""


def _hidden_from_the_unit(path: str | None) -> str | None:
    if not path:
        return None
    resolved = Path(os.path.abspath(path))
    for folder, setting in UNIT_HIDDEN_FOLDERS.items():
        if resolved.is_relative_to(folder):
            return setting
    return None


@dataclass(frozen=True)
class RenderedGpu:
    node: str
    index: int  # device index (the campaign's gpu_index, the number in File=)
    slurm_index: int  # Slurm's number for it (SLURM_JOB_GPUS, GresUsed IDX)
    label: str
    uuid: str
    model: str
    file: str
    signature: str = ""  # its PM signature; differs from ``label`` when max_labels merged it


@dataclass(frozen=True)
class SkippedGpu:
    uuid: str
    label: str
    node: str
    reason: str


@dataclass(frozen=True)
class SitePlan:
    """Which GPU gets which Type= label on which node, and which GPUs could not be placed."""

    campaign: str
    device_pattern: str
    gpus: tuple[RenderedGpu, ...]  # per node in Slurm's order (grouped by type)
    skipped: tuple[SkippedGpu, ...]
    merge: LabelMerge | None = None  # signatures -> labels under [site] max_labels (None: unset)

    def node_labels(self) -> dict[str, dict[int, str]]:
        """Node -> {device index: label}."""
        out: dict[str, dict[int, str]] = {}
        for g in self.gpus:
            out.setdefault(g.node, {})[g.index] = g.label
        return out

    def slurm_labels(self) -> dict[str, dict[int, str]]:
        """Node -> {Slurm's GPU index: label}: what a job's SLURM_JOB_GPUS indices mean."""
        out: dict[str, dict[int, str]] = {}
        for g in self.gpus:
            out.setdefault(g.node, {})[g.slurm_index] = g.label
        return out

    def gres_counts(self) -> dict[str, dict[str, int]]:
        """Node -> {label: count}, what Slurm should report as the node's configured Gres."""
        out: dict[str, dict[str, int]] = {}
        for g in self.gpus:
            counts = out.setdefault(g.node, {})
            counts[g.label] = counts.get(g.label, 0) + 1
        return out

    def node_gres(self) -> dict[str, str]:
        """Node -> the NodeName ``Gres=`` value, types sorted."""
        return {
            node: ",".join(f"gpu:{label}:{n}" for label, n in sorted(counts.items()))
            for node, counts in self.gres_counts().items()
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "campaign": self.campaign,
            "device_pattern": self.device_pattern,
            "nodes": {
                node: [
                    {
                        "index": g.index,
                        "slurm_index": g.slurm_index,
                        "label": g.label,
                        "uuid": g.uuid,
                        "file": g.file,
                        "model": g.label.split("-", 1)[0],
                        "signature": g.signature or g.label,
                    }
                    for g in self.gpus
                    if g.node == node
                ]
                for node in self.node_labels()
            },
            "skipped": [asdict(s) for s in self.skipped],
        }


def plan_site(
    campaign: str,
    gpu_scores: pd.DataFrame,
    gpu_labels: Mapping[str, str],
    *,
    device_pattern: str = DEFAULT_DEVICE_PATTERN,
    nodes: Iterable[str] | None = None,
    max_labels: int | None = None,
    keep_apart_above: float | None = None,
) -> SitePlan:
    """Match every labelled GPU to its node and index (pure; ``gpu_scores`` as the store has it).

    ``nodes`` limits the plan to those nodes (GPUs elsewhere are left out, not skipped).
    ``max_labels`` bounds the Type= labels by merging the closest signatures of the whole
    campaign (:func:`~slurm_pal.core.binning.merge_signatures`; never GPUs on either side of
    ``keep_apart_above``), so a partial render labels its GPUs as a full one would.
    """
    if "{index}" not in device_pattern:
        raise RenderError(
            f"device pattern {device_pattern!r} must contain '{{index}}', e.g. /dev/nvidia{{index}}"
        )
    wanted = None if nodes is None else set(nodes)
    merge = None
    if max_labels is not None:
        try:
            merge = merge_signatures(
                signatures_of(gpu_scores, gpu_labels),
                max_labels,
                keep_apart_above=keep_apart_above,
            )
        except ValueError as exc:
            raise RenderError(f"[site] max_labels: {exc}") from None
    inventory = gpu_scores.drop_duplicates("uuid")[["uuid", "node", "gpu_index", "gpu_model"]]
    candidates: list[RenderedGpu] = []
    skipped: list[SkippedGpu] = []
    for uuid, node, index, model in inventory.itertuples(index=False):
        label = gpu_labels.get(uuid)
        node = "" if pd.isna(node) else str(node)
        if wanted is not None and node not in wanted:
            continue
        if label is None:
            skipped.append(SkippedGpu(uuid, "", node, "no label in this campaign"))
        elif not node:
            skipped.append(SkippedGpu(uuid, label, node, "no node name in the campaign"))
        elif pd.isna(index):
            skipped.append(SkippedGpu(uuid, label, node, "no GPU index in the campaign"))
        elif _BAD_TYPE.search(label):
            skipped.append(
                SkippedGpu(uuid, label, node, "label is not a valid gres Type (:,=() or blanks)")
            )
        else:
            i = int(index)
            file = device_pattern.format(index=i)
            rendered = label if merge is None else merge.labels.get(label, label)
            candidates.append(
                RenderedGpu(node, i, -1, rendered, str(uuid), str(model), file, label)
            )
    by_slot: dict[tuple[str, int], list[RenderedGpu]] = {}
    for g in candidates:
        by_slot.setdefault((g.node, g.index), []).append(g)
    gpus: list[RenderedGpu] = []
    for (node, index), group in by_slot.items():
        if len(group) == 1:
            gpus.append(group[0])
            continue
        others = ", ".join(g.uuid for g in group)
        for g in group:
            reason = f"{node} index {index} is claimed by {len(group)} GPUs ({others})"
            skipped.append(SkippedGpu(g.uuid, g.label, node, reason))
    if wanted is not None:
        unknown = sorted(wanted - {g.node for g in gpus} - {s.node for s in skipped})
        if unknown:
            raise RenderError(
                f"node(s) {', '.join(unknown)} have no GPUs in campaign {campaign!r}; "
                "check --nodes against 'slurm-pal profile gpus'"
            )
    renamed = distinct_type_ids(sorted({g.label for g in gpus}))
    gpus = [replace(g, label=renamed[g.label]) for g in gpus]
    gpus = _slurm_order(gpus)
    skipped.sort(key=lambda s: (_node_key(s.node), s.uuid))
    return SitePlan(campaign, device_pattern, tuple(gpus), tuple(skipped), merge)


def signatures_of(gpu_scores: pd.DataFrame, gpu_labels: Mapping[str, str]) -> list[Signature]:
    """Each label of the campaign as a :class:`Signature`: model (the label's prefix), PM-score
    per class (the same for all its GPUs) and GPU count."""
    frame = gpu_scores[gpu_scores["uuid"].isin(list(gpu_labels))]
    frame = frame.assign(label=frame["uuid"].map(gpu_labels))
    out = []
    for label, rows in frame.groupby("label", sort=True):
        scores = rows.groupby("job_class", sort=False)["pm_score"].mean()
        out.append(
            Signature(
                str(label),
                str(label).split("-", 1)[0],
                {str(c): float(v) for c, v in scores.items()},
                int(rows["uuid"].nunique()),
            )
        )
    return out


def plan_from_store(
    store: Store,
    campaign: str | None = None,
    *,
    device_pattern: str = DEFAULT_DEVICE_PATTERN,
    nodes: Iterable[str] | None = None,
    config: SiteConfig | None = None,
) -> SitePlan:
    """The plan for a stored campaign (the active one by default); ``config`` gives
    ``[site] max_labels`` (and ``advisor.avoid_above``, which merging keeps apart)."""
    campaign_id = store.resolve_campaign(campaign)
    max_labels = None if config is None else config.site.max_labels
    return plan_site(
        campaign_id,
        store.gpu_scores(campaign_id),
        store.gpu_labels(campaign_id),
        device_pattern=device_pattern,
        nodes=nodes,
        max_labels=max_labels,
        keep_apart_above=None if max_labels is None else config.advisor.avoid_above,  # type: ignore[union-attr]
    )


def lua_string(value: object) -> str:
    """A Lua 5.1 double-quoted string literal (every byte outside printable ASCII escaped)."""
    out = []
    for byte in str(value).encode():
        ch = chr(byte)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def render_files(
    plan: SitePlan,
    *,
    prolog: str = DEFAULT_PROLOG,
    epilog: str = DEFAULT_EPILOG,
    hooks: HookSettings | None = None,
    service: ServiceSettings | None = None,
) -> dict[str, str]:
    """File name -> content for everything ``site render`` writes."""
    hooks = hooks or HookSettings()
    service = service or ServiceSettings(python=hooks.python)
    if not plan.gpus:
        raise RenderError(
            f"campaign {plan.campaign!r} has no GPU with a node and index to render"
            + (f" ({len(plan.skipped)} skipped)" if plan.skipped else "")
        )
    env = Environment(
        loader=PackageLoader("slurm_pal.site", "templates"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["lua_str"] = lua_string
    env.filters["sh_quote"] = lambda v: shlex.quote(str(v))
    labels = sorted({g.label for g in plan.gpus})
    context = {
        "campaign": plan.campaign,
        "gpus": plan.gpus,
        "skipped": plan.skipped,
        "nodes": sorted(plan.node_gres().items(), key=lambda kv: _node_key(kv[0])),
        "prolog": prolog,
        "epilog": epilog,
        "socket_path": hooks.socket,
        "timeout_ms": hooks.submit_timeout_ms,
        "timeout_s": f"{hooks.submit_timeout_ms / 1000:.3f}",
        "script_prefix": SCRIPT_PREFIX,
        "models": sorted({label.split("-", 1)[0].lower() for label in labels}),
        "labels": labels,
        "privileged_uids": sorted(set(hooks.privileged_uids) | {0}),
        "hooks": hooks,
        "hook_limit_s": HOOK_LIMIT_S,
        "service": service,
    }
    return {
        "gres.conf": env.get_template("gres.conf.j2").render(context),
        "slurm.conf.nodes": env.get_template("slurm.conf.nodes.j2").render(context),
        "slurm.conf.snippet": env.get_template("slurm.conf.snippet.j2").render(context),
        "labels.json": json.dumps(plan.to_dict(), indent=2) + "\n",
        "job_submit.lua": env.get_template("job_submit.lua.j2").render(context),
        "prolog.sh": env.get_template("prolog.sh.j2").render(context, kind="prolog"),
        "epilog.sh": env.get_template("epilog.sh.j2").render(context, kind="epilog"),
        "slurm-pal.service": env.get_template("slurm-pal.service.j2").render(context),
        "slurm-pal-flush.service": env.get_template("slurm-pal-flush.service.j2").render(context),
        "slurm-pal-flush.timer": env.get_template("slurm-pal-flush.timer.j2").render(context),
    }


EXECUTABLE = frozenset({"prolog.sh", "epilog.sh"})


def write_site(out_dir: Path, files: Mapping[str, str]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        if name in EXECUTABLE:
            path.chmod(0o755)
        written.append(path)
    return written


def load_labels(path: Path) -> dict[str, dict[int, str]]:
    """Node -> {index: label} from a rendered ``labels.json`` (read and checked by
    :func:`slurm_pal.adapters.labels_file.read_labels`)."""
    try:
        table = read_labels(path)
    except LabelTableError as exc:
        raise RenderError(str(exc)) from None
    per_node: dict[str, dict[int, str]] = {}
    for e in table.entries:
        per_node.setdefault(e.node, {})[e.index] = e.label
    return per_node


def _slurm_order(gpus: list[RenderedGpu]) -> list[RenderedGpu]:
    """Per node: device order, then grouped by type as slurmd merges them; number them."""
    by_node: dict[str, list[RenderedGpu]] = {}
    for g in sorted(gpus, key=lambda g: (_node_key(g.node), g.index)):
        by_node.setdefault(g.node, []).append(g)
    out: list[RenderedGpu] = []
    for node_gpus in by_node.values():
        first_seen = {
            label: n for n, label in reversed(list(enumerate(g.label for g in node_gpus)))
        }
        grouped = sorted(node_gpus, key=lambda g: (first_seen[g.label], g.index))
        out.extend(replace(g, slurm_index=i) for i, g in enumerate(grouped))
    return out
