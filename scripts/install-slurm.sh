#!/usr/bin/env bash
# Install the Debian packages of the local Slurm testbed (tests/slurm, `slurm-pal testbed`):
# munge, slurmctld, slurmd, the client tools, the basic plugins (job_submit_lua, gres_gpu,
# cons_tres), the Lua 5.1 modules job_submit.lua uses and the lua5.1 interpreter (its unit
# tests, tests/test_job_submit_lua.py). Idempotent: when every package is
# already installed it does nothing (no apt-get update). Needs root, or sudo.
# No daemon is started or enabled: the testbed runs its own private munged/slurmctld/slurmd.
set -euo pipefail

packages=(munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins lua-socket lua-cjson lua-posix lua5.1)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-slurm: this is not a Debian/Ubuntu system (no dpkg/apt-get); install" \
       "${packages[*]} (Slurm 22.05 or newer) with your package manager" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-slurm: all Slurm testbed packages already installed"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-slurm: missing packages: ${missing[*]}" >&2
  echo "install-slurm: run as root (or with password-less sudo):" >&2
  echo "  sudo bash $0" >&2
  exit 1
fi

echo "install-slurm: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends "${packages[@]}" >/dev/null
for b in munged mungekey slurmctld slurmd sbatch sinfo squeue scontrol; do
  command -v "$b" >/dev/null 2>&1 || { echo "install-slurm: $b not found after install" >&2; exit 1; }
done
echo "install-slurm: Slurm $(dpkg-query -W -f='${Version}' slurmctld) ready"
