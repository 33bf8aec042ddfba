#!/usr/bin/env bash
# Data parallelism of the CUDA model (part of make test-gpu): for ZeRO-0, 1, 2 and 3, 2 and 4 ranks
# (emulated: 4 ranks at ZeRO-1 and 3 only)
# sharing one GPU through the MPI communicator (--gpu-comm mpi) reproduce the 1-rank loss curve on
# the same global batch within bf16 tolerance (2e-2 relative per step); a repeated run is bitwise
# identical; 4 ranks at --dp-shard 2 (hybrid sharding, ZeRO-3; on a GPU also ZeRO-1 with FP8's
# delayed scaling, against the flat run) reproduce it too; NCCL at world size 1 (mpirun -np 1)
# leaves the 1-rank losses unchanged. Skips with a message where there is no GPU or no mpirun,
# except in a GPU session (LLMC_GPU_SESSION=1), where either is a failure (exit 3 without a GPU, 1
# without mpirun).
#   test/mpi/run_gpu_dp_tests.sh ./train_gpt
set -euo pipefail

trainer=${1:-./train_gpt}
source "$(dirname "$0")/../gpu/lib.sh"
gpu_checks run_gpu_dp_tests.sh "$trainer"

# 1024 tokens per step on every world size: B x T x ranks = 16 x 64 x 1 = 8 x 64 x 2 = 4 x 64 x 4
common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
# Emulated, 4 ranks run only ZeRO-1 and 3 (the CI's time: a 4-rank run is the suite's dearest; the
# CPU model's test_zero runs 4 ranks at every stage).
four_stages=(0 1 2 3)
[ "${LLMC_EMULATED:-0}" = 1 ] && four_stages=(1 3)
run one 1 16 -z 0
for z in 0 1 2 3; do run "two_z$z" 2 8 -z "$z"; done
for z in "${four_stages[@]}"; do run "four_z$z" 4 4 -z "$z"; done
run two_z2_again 2 8 -z 2
# Hybrid sharding: ZeRO-3 inside 2 groups of 2 ranks (device communicators split for the shard and
# the replica groups), the groups' slices all-reduced; on a GPU also ZeRO-1 with FP8's delayed
# scales, whose amax must be every replica's.
run four_hsdp_z3 4 4 -z 3 --dp-shard 2
[ "${LLMC_EMULATED:-0}" = 1 ] || run four_hsdp_fp8 4 4 -z 1 --dp-shard 2 --fp8 1 --fp8-scaling delayed
[ "${LLMC_EMULATED:-0}" = 1 ] || run four_fp8 4 4 -z 1 --fp8 1 --fp8-scaling delayed

for z in 0 1 2 3; do compare one "two_z$z" 2e-2; done
for z in "${four_stages[@]}"; do compare one "four_z$z" 2e-2; done
compare one four_hsdp_z3 2e-2
[ "${LLMC_EMULATED:-0}" = 1 ] || compare four_fp8 four_hsdp_fp8 2e-2
compare two_z2 two_z2_again 0
# NCCL at world size 1: mpirun -np 1 makes the trainer create an NCCL communicator and all-reduce
# every bucket through it, which must leave the 1-rank run's losses bit for bit unchanged.
echo "== nccl: mpirun -np 1 --gpu-comm nccl"
timeout 300 mpirun -np 1 "$trainer" "${common[@]/mpi/nccl}" -b 16 -o "$dir/nccl" > "$dir/nccl.log"
grep -q "collectives over NCCL" "$dir/nccl.log" || { echo "FAIL the NCCL run did not use NCCL"; exit 1; }
compare one nccl 0
# Where the node has a GPU per rank (and on the emulator), NCCL across 2 ranks too.
if [ "$(gpus_on_node)" -ge 2 ]; then
    echo "== nccl: mpirun -np 2 --gpu-comm nccl, ZeRO-1"
    timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 8 -z 1 -o "$dir/nccl2" > "$dir/nccl2.log"
    grep -q "collectives over NCCL" "$dir/nccl2.log" || { echo "FAIL the 2-rank NCCL run did not use NCCL"; exit 1; }
    compare one nccl2 2e-2
fi
