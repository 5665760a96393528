#!/usr/bin/env bash
# Set everything up and run the main job on embedded defaults (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/slurm-pal demo "$@"
