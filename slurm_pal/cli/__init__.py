"""The `slurm-pal` command line (typer)."""
