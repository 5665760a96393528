"""``python -m slurm_pal.hooks prolog|epilog|flush|sample`` (what the rendered scripts call)."""

from slurm_pal.hooks.cli import main

raise SystemExit(main())
