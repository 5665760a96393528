#!/usr/bin/env bash
# Set up (with the test tools) and run the whole test suite, with the host's Slurm (22.05 on
# Debian 12) for the real-Slurm tests, then tests/slurm once more against each release in
# SLURM_PAL_TEST_RELEASES (default: 24.11, the cached Debian 13 build of
# scripts/install-slurm.sh --release 24.11; empty: skip). Extra arguments go to every pytest run.
# The whole suite runs on SLURM_PAL_TEST_WORKERS pytest-xdist workers (default 2; 0: in one
# process), real-Slurm tests included (each testbed has its own namespaces, ports and folder;
# tests/conftest.py's groups keep only what shares a fixture on one worker). Each run lists
# its slowest tests: the real-Slurm ones are CI's critical path.
set -uo pipefail
cd "$(dirname "$0")/.."
releases="${SLURM_PAL_TEST_RELEASES-24.11}"
workers="${SLURM_PAL_TEST_WORKERS-2}"
SLURM_PAL_TEST_RELEASES="$releases" bash scripts/setup.sh dev || exit 1
status=0
start=$(date +%s)
.venv/bin/python -m pytest -n "$workers" --dist loadgroup --durations=12 "$@" || status=$?
echo "test: the suite (host Slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo unknown), $workers workers) took $(( $(date +%s) - start )) s"
for release in $releases; do
  start=$(date +%s)
  SLURM_PAL_SLURM_RELEASE="$release" .venv/bin/python -m pytest --durations=8 "$@" tests/slurm || status=$?
  echo "test: tests/slurm against Slurm $release took $(( $(date +%s) - start )) s"
done
exit "$status"
