"""The label table: which gres Type label every GPU carries, and Slurm's number for it.

``slurm-pal site render`` writes it as labels.json; the advisor, the Prolog/Epilog hooks and the
CLI read it through :func:`slurm_pal.adapters.labels_file.read_labels` into :class:`LabelTable`,
which checks every entry (one-line errors that name the node and key). Pure and stdlib only: the
hooks import it on every job start.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from slurm_pal.errors import SlurmPalError

__all__ = ["LabelEntry", "LabelTable", "LabelTableError"]

_BAD_TYPE = re.compile(r"[:,=()\s]")


class LabelTableError(SlurmPalError, ValueError):
    """labels.json is not what ``slurm-pal site render`` writes; the message says where."""


@dataclass(frozen=True)
class LabelEntry:
    """One GPU of labels.json: its device ``index``, Slurm's number for it, label and UUID.

    ``declared_model`` is the entry's optional ``model`` key (``site render`` writes the label's
    prefix; an admin may name the model otherwise for accounting, ``site usage``).
    """

    node: str
    index: int
    slurm_index: int
    label: str
    uuid: str
    declared_model: str = ""

    @property
    def model(self) -> str:
        """The GPU model: the label's prefix before the first '-' (``v100-a0b1`` -> ``v100``)."""
        return self.label.split("-", 1)[0]


def _require(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise LabelTableError(f"labels.json {where}: {message}")


@dataclass(frozen=True)
class LabelTable:
    """Which gres Type label every GPU carries (``labels.json`` of ``site render``).

    Device ``index`` is the campaign's (and the cluster's ``GpuSpec.index``); ``slurm_index`` is
    the number Slurm shows in ``SLURM_JOB_GPUS`` (see testbed/NOTES.md finding 1). Labels and
    models are matched case-insensitively by :meth:`is_label`/:meth:`is_model`.
    """

    campaign: str
    entries: tuple[LabelEntry, ...]
    labels: frozenset[str] = field(init=False)
    models: frozenset[str] = field(init=False)
    nodes: tuple[str, ...] = field(init=False)
    _by_device: Mapping[tuple[str, int], LabelEntry] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _by_slurm: Mapping[tuple[str, int], LabelEntry] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _node_of: Mapping[str, str] = field(init=False, repr=False, compare=False, hash=False)
    _lower_labels: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)
    _lower_models: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_device: dict[tuple[str, int], LabelEntry] = {}
        by_slurm: dict[tuple[str, int], LabelEntry] = {}
        for e in self.entries:
            where = f"node {e.node!r}"
            _require((e.node, e.index) not in by_device, where, f"index {e.index} listed twice")
            _require(
                (e.node, e.slurm_index) not in by_slurm,
                where,
                f"slurm_index {e.slurm_index} listed twice",
            )
            by_device[(e.node, e.index)] = e
            by_slurm[(e.node, e.slurm_index)] = e
        labels = frozenset(e.label for e in self.entries)
        models = frozenset(e.model for e in self.entries)
        set_ = object.__setattr__
        set_(self, "labels", labels)
        set_(self, "models", models)
        set_(self, "nodes", tuple(dict.fromkeys(e.node for e in self.entries)))
        set_(self, "_by_device", MappingProxyType(by_device))
        set_(self, "_by_slurm", MappingProxyType(by_slurm))
        set_(self, "_node_of", MappingProxyType({e.uuid: e.node for e in self.entries}))
        set_(self, "_lower_labels", frozenset(label.lower() for label in labels))
        set_(self, "_lower_models", frozenset(model.lower() for model in models))

    @classmethod
    def from_labels_json(
        cls, data: Mapping[str, object], *, nodes: Collection[str] | None = None
    ) -> LabelTable:
        """Read the decoded labels.json; LabelTableError names the node and key that is wrong.

        ``nodes``: keep (and check) only these nodes' GPUs, which is all a hook on one node
        needs of a large cluster's file; a node that is not listed is left out, not an error.
        """
        _require(isinstance(data, Mapping), "top level", "expected an object")
        listed = data.get("nodes")
        _require(isinstance(listed, Mapping), "'nodes'", "expected an object {node: [gpus]}")
        assert isinstance(listed, Mapping)
        if nodes is not None:
            listed = {n: listed[n] for n in nodes if n in listed}
        campaign = data.get("campaign", "")
        _require(isinstance(campaign, str), "'campaign'", "expected a string")
        entries: list[LabelEntry] = []
        for node, gpus in listed.items():
            where = f"node {node!r}"
            _require(isinstance(node, str) and bool(node), where, "bad node name")
            _require(isinstance(gpus, list), where, "expected a list of GPUs")
            for pos, gpu in enumerate(gpus):
                at = f"{where} GPU #{pos}"
                _require(isinstance(gpu, Mapping), at, "expected an object")
                values: dict[str, object] = {}
                for key in ("index", "slurm_index"):
                    value = gpu.get(key)
                    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
                    _require(ok, at, f"{key!r} must be an integer >= 0, got {value!r}")
                    values[key] = value
                for key in ("label", "uuid"):
                    value = gpu.get(key)
                    ok = isinstance(value, str) and bool(value)
                    _require(ok, at, f"{key!r} must be a non-empty string, got {value!r}")
                    values[key] = value
                label = str(values["label"])
                model = gpu.get("model", "")
                _require(isinstance(model, str), at, f"'model' must be a string, got {model!r}")
                _require(
                    not _BAD_TYPE.search(label), at, f"label {label!r} is not a valid gres Type"
                )
                entries.append(
                    LabelEntry(
                        node,
                        int(values["index"]),  # type: ignore[call-overload]
                        int(values["slurm_index"]),  # type: ignore[call-overload]
                        label,
                        str(values["uuid"]),
                        str(model),
                    )
                )
        _require(bool(entries) or nodes is not None, "'nodes'", "no GPUs listed")
        return cls(str(campaign), tuple(entries))

    def _entry(
        self, node: str, index: int, table: Mapping[tuple[str, int], LabelEntry]
    ) -> LabelEntry:
        try:
            return table[(node, index)]
        except KeyError:
            pass
        if node not in self.nodes:
            raise KeyError(f"node {node!r} is not in labels.json (campaign {self.campaign!r})")
        valid = sorted(i for n, i in table if n == node)
        raise KeyError(f"node {node!r} has no GPU {index} in labels.json; valid: {valid}")

    def label(self, node: str, index: int) -> str:
        """The label of the GPU with device ``index`` on ``node``; KeyError lists valid indices."""
        return self._entry(node, index, self._by_device).label

    def slurm_index(self, node: str, index: int) -> int:
        """Slurm's number for the GPU with device ``index``."""
        return self._entry(node, index, self._by_device).slurm_index

    def device_index(self, node: str, slurm_index: int) -> int:
        """The device index of the GPU Slurm numbers ``slurm_index`` (``SLURM_JOB_GPUS``)."""
        return self._entry(node, slurm_index, self._by_slurm).index

    def uuid(self, node: str, index: int) -> str:
        return self._entry(node, index, self._by_device).uuid

    def uuid_at_slurm_index(self, node: str, slurm_index: int) -> str:
        """The UUID of the GPU Slurm numbers ``slurm_index`` (GresUsed IDX, ``SLURM_JOB_GPUS``)."""
        return self._entry(node, slurm_index, self._by_slurm).uuid

    def node_of_uuid(self, uuid: str) -> str | None:
        """The node the GPU with this UUID is on (None: not in labels.json)."""
        return self._node_of.get(uuid)

    def is_label(self, gpu_type: str) -> bool:
        return gpu_type.lower() in self._lower_labels

    def is_model(self, gpu_type: str) -> bool:
        """A GPU model name that is not itself a label (labels take precedence)."""
        return gpu_type.lower() in self._lower_models and not self.is_label(gpu_type)
