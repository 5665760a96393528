"""What a testbed is made of (its fake nodes) and the one error it raises.

Why a module of its own: every part of the testbed (config files, daemons, jobs) names nodes
and raises :class:`TestbedError`, so both sit below all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_pal.errors import SlurmPalError


class TestbedError(SlurmPalError, RuntimeError):
    """The testbed could not be brought up, queried or torn down; the message says what to do."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class NodeSpec:
    """One fake node: its name, one ``Type=`` label per GPU index (None: untyped), features."""

    name: str
    gpu_types: tuple[str | None, ...] = ()
    features: tuple[str, ...] = ()

    def gres(self) -> str:
        """The NodeName ``Gres=`` value: counts per type, in first-seen order."""
        counts: dict[str | None, int] = {}
        for t in self.gpu_types:
            counts[t] = counts.get(t, 0) + 1
        return ",".join(f"gpu:{t}:{n}" if t else f"gpu:{n}" for t, n in counts.items())


def node_specs(
    gpu_types: Mapping[str, Sequence[str | None]],
    features: Mapping[str, Sequence[str]] | None = None,
) -> list[NodeSpec]:
    """NodeSpecs from ``{node: [type of GPU 0, type of GPU 1, ...]}`` (and optional features)."""
    features = features or {}
    return [
        NodeSpec(name, tuple(types), tuple(features.get(name, ())))
        for name, types in gpu_types.items()
    ]
