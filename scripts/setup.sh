#!/usr/bin/env bash
# Set up slurm-pal on a Debian machine: the system packages it needs (apt-get) and a virtual
# environment in .venv with slurm-pal installed (editable). Idempotent: a second run is quick.
#   bash scripts/setup.sh        # runtime only
#   bash scripts/setup.sh dev    # plus the test/lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "setup: need root (or sudo) to run: $*" >&2; exit 1; fi
}

apt_packages=()
command -v python3 >/dev/null || apt_packages+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_packages+=(python3-venv)
if [ "${#apt_packages[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${apt_packages[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: slurm-pal needs Python >= 3.11, found $(python3 --version 2>&1)" >&2
  exit 1
fi

# The test suite starts a real Slurm (munge, slurmctld, slurmd) on loopback: install it with dev,
# the host's release and each other release the tests run against (cached after the first run).
if [ "$extras" = "dev" ] && [ -f scripts/install-slurm.sh ]; then
  bash scripts/install-slurm.sh
  for release in ${SLURM_PAL_TEST_RELEASES-24.11}; do
    bash scripts/install-slurm.sh --release "$release"
  done
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
echo "setup: slurm-pal $(.venv/bin/slurm-pal version) ready in $(pwd)/.venv"
