"""Adapters to the outside world: SQLite store, site config, CSV formats, Slurm, NVML."""
