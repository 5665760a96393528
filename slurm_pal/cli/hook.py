"""`slurm-pal hook`: being built this session (see slurm_pal/advisor/PROTOCOL.md)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Being built; see slurm_pal/advisor/PROTOCOL.md.", no_args_is_help=True)
