"""The one reader of labels.json (``slurm-pal site render``): the advisor, its reload, the
Prolog/Epilog hooks and the CLI all load it here, so each sees the same checks and the same
one-line errors. Stdlib only (with :mod:`slurm_pal.core.labels`): the hooks import it on every
job start.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from slurm_pal.core.labels import LabelTable, LabelTableError

__all__ = ["LabelTableError", "read_labels"]


def read_labels(path: Path | str, *, nodes: Collection[str] | None = None) -> LabelTable:
    """labels.json at ``path`` as a checked :class:`LabelTable` (only ``nodes``' GPUs if given:
    a hook needs its own node's, not a whole cluster's checked).

    Raises LabelTableError (a ValueError), one line that names the file and, for a bad entry,
    the node and key: unreadable, not JSON, or not what ``site render`` writes.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelTableError(f"cannot read labels file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise LabelTableError(f"labels file {path} is not JSON: {exc}") from None
    try:
        return LabelTable.from_labels_json(data, nodes=nodes)
    except LabelTableError as exc:
        detail = str(exc).removeprefix("labels.json ")
        raise LabelTableError(
            f"labels file {path} is not a labels.json of `site render`: {detail}"
        ) from None
