"""slurm-pal: PM-First / PAL GPU placement advisor for Slurm."""

__version__ = "0.1.0"
