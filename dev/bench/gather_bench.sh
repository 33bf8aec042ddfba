#!/usr/bin/env bash
# ZeRO-3's all-gather of one layer of GPT-2 124M and 1.5B, bf16 against the FP8 codes' packed chunk
# (dev/bench/gather_bench.cpp), over MPI on this machine, for 2 and 4 ranks.
#   dev/bench/gather_bench.sh [repetitions]
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory build/gather_bench >/dev/null
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
for N in 2 4; do
    echo "== $N ranks ($(getconf _NPROCESSORS_ONLN) cores)"
    mpirun --oversubscribe -np "$N" build/gather_bench "${1:-20}"
done
