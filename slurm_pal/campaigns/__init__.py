"""Profiling campaigns through Slurm: plan (job arrays), in-task runner, records, submission.

The pure checks and diffs live in :mod:`slurm_pal.core.campaigns`; this package holds what
touches files and Slurm: :mod:`.workspace` (the campaign directory), :mod:`.runner` (the
stdlib-only in-task runner), :mod:`.slurm` (sbatch/squeue/sinfo), :mod:`.settings` (the site
config's ``[campaign]`` section) and ``profiling/`` (benchmarks and the batch-script template,
shipped as package data). Drift detection from production is pure: :mod:`slurm_pal.core.drift`.
"""
