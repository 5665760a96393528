"""The site's locality model: penalties from the site config, switches from topology.conf."""

from __future__ import annotations

from pathlib import Path

from slurm_pal.adapters.config import ConfigError, LocalityConfig
from slurm_pal.core.topology import Topology


def topology_from_config(
    locality: LocalityConfig, *, source: str = "<config>", across_override: float | None = None
) -> Topology:
    """Build the :class:`Topology` the site configured (flat, the paper's model, without a file).

    ``across_override`` replaces the across penalty (a what-if from the command line).
    """
    across = locality.across_switches if across_override is None else across_override
    try:
        if locality.topology_file is None:
            return Topology(
                within_node=locality.within_node,
                within_switch=locality.within_switch,
                across_switches=across,
            )
        path = Path(locality.topology_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(
                f"{source}: 'locality.topology_file' {path} cannot be read: {exc.strerror or exc}"
            ) from exc
        return Topology.from_topology_conf(
            text,
            within_node=locality.within_node,
            within_switch=locality.within_switch,
            across_switches=across,
        )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{source}: [locality]: {exc}") from exc
