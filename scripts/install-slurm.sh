#!/usr/bin/env bash
# Install the Slurm testbed (tests/slurm, `slurm-pal testbed`).
#   bash scripts/install-slurm.sh                  # Slurm 22.05: this Debian 12 machine's packages
#   bash scripts/install-slurm.sh --release 24.11  # also Slurm 24.11, from Debian 13 (trixie)
# Debian packages: munge, slurmctld, slurmd, the client tools, the basic plugins (job_submit_lua,
# gres_gpu, cons_tres), the Lua 5.1 modules job_submit.lua uses and the lua5.1 interpreter (its
# unit tests, tests/test_job_submit_lua.py). Idempotent: when every package is already installed
# it does nothing (no apt-get update). Needs root, or sudo.
# No daemon is started or enabled: the testbed runs its own private munged/slurmctld/slurmd.
#
# Another release lives in its own Debian root, built once with debootstrap and cached in
# $SLURM_PAL_CACHE/slurm-RELEASE (default /var/cache/slurm-pal; a second run only checks its stamp).
# Its binaries need their own glibc, so the Slurm and munge programs are patched (patchelf, run
# inside the root) to use that root's dynamic loader and libraries, and bin/ links to them: they
# then run on the host, without chroot, and reach the host's hook scripts, Python venv and Lua
# modules. See slurm_pal/testbed/NOTES.md ("Other Slurm releases").
set -euo pipefail

release=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --release) release="${2:-}"; shift 2 || { echo "install-slurm: --release needs a value" >&2; exit 2; } ;;
    --release=*) release="${1#--release=}"; shift ;;
    *) echo "install-slurm: unknown argument $1 (usage: $0 [--release 22.05|24.11])" >&2; exit 2 ;;
  esac
done
case "$release" in
  ""|22.05) release="" ;;
  24.11) suite=trixie ;;
  *) echo "install-slurm: unknown release $release (known: 22.05 from this machine, 24.11)" >&2; exit 2 ;;
esac

packages=(munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins lua-socket lua-cjson lua-posix lua5.1
  iproute2 util-linux)  # the multi-host testbed: ip netns, nsenter, unshare
[ -n "$release" ] && packages+=(debootstrap)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-slurm: this is not a Debian/Ubuntu system (no dpkg/apt-get); install" \
       "${packages[*]} (Slurm 22.05 or newer) with your package manager" >&2
  exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  as_root=(false)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-slurm: all Slurm testbed packages already installed"
else
  if [ "${as_root[*]}" = false ]; then
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
fi
[ -z "$release" ] && exit 0

# -- another release in its own cached Debian root -------------------------------------------
cache="${SLURM_PAL_CACHE:-/var/cache/slurm-pal}/slurm-$release"
root_packages=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge patchelf)
clients=(sbatch sinfo squeue scontrol scancel srun salloc sacct munge unmunge)
daemons=(slurmctld slurmd slurmstepd munged mungekey)
# The stamp names what was built: another package list or suite rebuilds the root.
want="suite=$suite packages=${root_packages[*]}"
if [ -f "$cache/stamp" ] && [ "$(head -n1 "$cache/stamp")" = "$want" ] && [ -x "$cache/bin/slurmd" ]; then
  echo "install-slurm: Slurm $(sed -n 2p "$cache/stamp") ($suite) already in $cache"
  exit 0
fi
if [ "${as_root[*]}" = false ]; then
  echo "install-slurm: building $cache needs root (or password-less sudo): sudo bash $0 --release $release" >&2
  exit 1
fi
# The mirror this host's apt already uses (its main Debian archive, not -security), unless
# SLURM_PAL_DEBIAN_MIRROR names one.
host_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | grep -v -- '-security' | grep '/debian/*$' | head -n 1 || true
}
mirror="${SLURM_PAL_DEBIAN_MIRROR:-$(host_mirror)}"
if [ -z "$mirror" ]; then
  echo "install-slurm: no Debian mirror in this host's apt sources; set SLURM_PAL_DEBIAN_MIRROR" >&2
  exit 2
fi
start=$(date +%s)
"${as_root[@]}" rm -rf "$cache.new"
"${as_root[@]}" mkdir -p "$cache.new"
echo "install-slurm: building Slurm $release from Debian $suite in $cache (debootstrap, about a minute)"
if ! "${as_root[@]}" debootstrap --variant=minbase --include="$(IFS=,; echo "${root_packages[*]}")" \
     "$suite" "$cache.new/root" "$mirror" >"$cache.new/debootstrap.log" 2>&1; then
  tail -n 20 "$cache.new/debootstrap.log" >&2
  echo "install-slurm: debootstrap of $suite from $mirror failed (log: $cache.new/debootstrap.log)" >&2
  exit 1
fi
"${as_root[@]}" rm -rf "$cache.new/root/var/cache/apt/archives"/*.deb

# Resolve every path inside the root (chroot): Debian's /usr/sbin/slurmd is an absolute symlink
# to /etc/alternatives, which outside the root would name the host's own Slurm.
final="$cache/root"
new="$cache.new/root"
inroot() { "${as_root[@]}" chroot "$new" "$@"; }
libdir=$(cd "$new" && ls -d usr/lib/*-linux-gnu/slurm-wlm | head -n1)
libdir="/${libdir%/slurm-wlm}"
loader=$(inroot sh -c "readlink -f $libdir/ld-linux*.so.2")
rpath="$final$libdir/slurm-wlm:$final$libdir"
for so in $(cd "$new" && ls "${libdir#/}"/slurm-wlm/*.so); do
  inroot patchelf --set-rpath "$rpath" "/$so"
done
"${as_root[@]}" mkdir -p "$cache.new/bin"
for b in "${clients[@]}" "${daemons[@]}"; do
  real=$(inroot sh -c "p=\$(command -v $b || ls /usr/sbin/$b) && readlink -f \"\$p\"") || {
    echo "install-slurm: $b not found in the $suite root" >&2; exit 1; }
  # DT_RPATH (not RUNPATH) also serves the libraries' own dependencies, so none comes from the host.
  inroot patchelf --set-interpreter "$final$loader" --force-rpath --set-rpath "$rpath" "$real"
  "${as_root[@]}" ln -sfn "$final$real" "$cache.new/bin/$b"
done
version=$(inroot dpkg-query -W -f='${Version}' slurmctld)
printf '%s\n%s\n' "$want" "$version" | "${as_root[@]}" tee "$cache.new/stamp" >/dev/null
"${as_root[@]}" rm -rf "$cache"
"${as_root[@]}" mv "$cache.new" "$cache"
"$cache/bin/slurmd" -V >/dev/null || { echo "install-slurm: $cache/bin/slurmd does not run" >&2; exit 1; }
echo "install-slurm: Slurm $version ($suite) ready in $cache ($(( $(date +%s) - start )) s)"
