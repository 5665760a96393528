#!/usr/bin/env bash
# The one-command demo (see README): set up the .venv, install Slurm's Debian packages (root or
# password-less sudo), then `slurm-pal demo`: the example campaign, a local Slurm with fake GPUs,
# the advisor, a small workload through plain sbatch, where each job went and why, the effect
# against a packing control (the same plugin, hooks and service), and slurm-pal-demo.png
# comparing the two arms (the `plot` extra, matplotlib, is installed for it; without it the demo
# says the PNG was skipped). Without root or Slurm the
# demo says what is missing. Options go to `slurm-pal demo` (e.g. --offline, --png PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "demo: not root and no password-less sudo: the live part (local Slurm) will be skipped" >&2
  fi
fi
if [ "$(id -u)" -eq 0 ] || [ "${#as_root[@]}" -gt 0 ]; then
  "${as_root[@]}" bash scripts/install-slurm.sh ||
    echo "demo: Slurm could not be installed; the demo says what is missing" >&2
fi
exec "${as_root[@]}" .venv/bin/slurm-pal demo "$@"
