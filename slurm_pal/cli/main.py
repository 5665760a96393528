"""Entry point of the `slurm-pal` command: one typer app with a sub-app per area."""

from __future__ import annotations

import typer

from slurm_pal import __version__

app = typer.Typer(
    name="slurm-pal",
    help="Variability- and locality-aware GPU placement advisor for Slurm (PM-First / PAL).",
    no_args_is_help=True,
    add_completion=False,
)

# --- sub-apps (one line each; keep this block sorted) ---
# --- end of sub-apps ---


@app.command()
def version() -> None:
    """Print the slurm-pal version."""
    typer.echo(__version__)


if __name__ == "__main__":  # pragma: no cover
    app()
