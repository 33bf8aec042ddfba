#!/usr/bin/env bash
# The pipeline's measured bubble against the formula (dev/bench/pp_bench.cpp), for P = 2 and 4
# stages, m = 4, 8, 16 micro-batches, 1F1B and interleaved. One OpenMP thread per rank; on a machine
# with fewer cores than ranks the stages share cores, so an idle stage lends its core to a busy one
# and the measured idle time reads low (P = 4 on 2 cores).
#   dev/bench/pp_bench.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory build/pp_bench >/dev/null
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1
for P in 2 4; do
    echo "== $P stages ($(getconf _NPROCESSORS_ONLN) cores)"
    mpirun --oversubscribe -np "$P" build/pp_bench "${1:-3}"
done
