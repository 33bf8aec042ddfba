#!/usr/bin/env bash
# Data parallelism of the CUDA model (part of make test-gpu): for ZeRO-0, 1, 2 and 3, 2 and 4 ranks
# sharing one GPU through the MPI communicator (--gpu-comm mpi) reproduce the 1-rank loss curve on
# the same global batch within bf16 tolerance (2e-2 relative per step); a repeated run is bitwise
# identical; NCCL at world size 1 (mpirun -np 1) leaves the 1-rank losses unchanged. Skips with a
# message where there is no GPU or no mpirun, except in a GPU session (LLMC_GPU_SESSION=1), where
# either is a failure (exit 3 without a GPU, 1 without mpirun).
#   test/mpi/run_gpu_dp_tests.sh ./train_gpt
set -euo pipefail

trainer=${1:-./train_gpt}
[ -x "$trainer" ] || { echo "run_gpu_dp_tests.sh: $trainer is not built" >&2; exit 1; }
session=${LLMC_GPU_SESSION:-0}
if ! nvidia-smi -L > /dev/null 2>&1; then
    [ "$session" = 1 ] && { echo "run_gpu_dp_tests.sh: no GPU: FAIL (LLMC_GPU_SESSION=1)"; exit 3; }
    echo "run_gpu_dp_tests.sh: no GPU: skipped"; exit 0
fi
if ! command -v mpirun > /dev/null; then
    [ "$session" = 1 ] && { echo "run_gpu_dp_tests.sh: no mpirun: FAIL (LLMC_GPU_SESSION=1)"; exit 1; }
    echo "run_gpu_dp_tests.sh: no mpirun: skipped"; exit 0
fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 1024 tokens per step on every world size: B x T x ranks = 16 x 64 x 1 = 8 x 64 x 2 = 4 x 64 x 4
common=(-e d4 -t 64 -d 1024 -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
run() {  # run NAME RANKS B STAGE
    echo "== $1: $2 rank(s), B $3, ZeRO-$4"
    if [ "$2" = 1 ]; then "$trainer" "${common[@]}" -b "$3" -z "$4" -o "$dir/$1" > "$dir/$1.log"
    else timeout 300 mpirun --oversubscribe -np "$2" "$trainer" "${common[@]}" -b "$3" -z "$4" -o "$dir/$1" > "$dir/$1.log"; fi
}
run one 1 16 0
for z in 0 1 2 3; do
    run "two_z$z" 2 8 "$z"
    run "four_z$z" 4 4 "$z"
done
run two_z2_again 2 8 2

losses() { grep -o '"train_loss":[^,}]*' "$dir/$1/metrics.jsonl" | cut -d: -f2; }
compare() {  # compare A B LIMIT: worst relative difference of the step losses
    paste <(losses "$1") <(losses "$2") | awk -v limit="$3" -v what="$2 vs $1" '
        { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
        END { if (n != 20) { print "FAIL " what ": " n " steps"; exit 1 }
              printf "%s %s: worst relative loss difference %.2g (limit %s)\n", (worst <= limit ? "ok" : "FAIL"), what, worst, limit
              exit worst <= limit ? 0 : 1 }'
}
for z in 0 1 2 3; do
    compare one "two_z$z" 2e-2
    compare one "four_z$z" 2e-2
done
compare two_z2 two_z2_again 0
# NCCL at world size 1: mpirun -np 1 makes the trainer create an NCCL communicator and all-reduce
# every bucket through it, which must leave the 1-rank run's losses bit for bit unchanged.
echo "== nccl: mpirun -np 1 --gpu-comm nccl"
timeout 300 mpirun -np 1 "$trainer" "${common[@]/mpi/nccl}" -b 16 -o "$dir/nccl" > "$dir/nccl.log"
grep -q "collectives over NCCL" "$dir/nccl.log" || { echo "FAIL the NCCL run did not use NCCL"; exit 1; }
compare one nccl 0
