"""Pure core: model, binning, classification, placement. No I/O, no Slurm, no SQLite, no CLI."""
