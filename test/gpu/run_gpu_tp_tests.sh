#!/usr/bin/env bash
# Tensor parallelism of the CUDA model (part of make test-gpu), ranks sharing one GPU through the MPI
# communicator (--gpu-comm mpi):
#   1. build/test_tp_cuda with tp 2 (2 ranks) and dp 2 x tp 2 (4 ranks): ZeRO-0..3, sequence
#      parallelism on and off, against the 1-rank CUDA model and the CPU model (test_tp_cuda.cu says
#      what it checks);
#   2. train_gpt through the trainer: --tp 2 with --sp 1 and --sp 0 (and -r 3), and dp 2 x tp 2 at
#      ZeRO-1 and ZeRO-3, reproduce the 1-rank loss curve on the same global batch within bf16 tolerance (2e-2
#      relative per step, the data-parallel suite's limit); a tp run saves a model.bin of the 1-rank
#      size; --plan accepts --tp;
#   3. where the node has 2 GPUs, --tp 2 over NCCL reproduces it too (skipped, with a message, on one).
# Skips with a message where there is no GPU or no mpirun, except in a GPU session
# (LLMC_GPU_SESSION=1), where either is a failure (exit 3 without a GPU, 1 without mpirun).
#   test/gpu/run_gpu_tp_tests.sh build/test_tp_cuda ./train_gpt
set -euo pipefail

test_tp=${1:-build/test_tp_cuda}
trainer=${2:-./train_gpt}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_tp_tests.sh "$test_tp" "$trainer"

# 1. the model against its references
for np in 2 4; do
    echo "== test_tp_cuda: $np ranks, tp 2"
    mkdir -p "$dir/unit$np"
    timeout 600 mpirun --oversubscribe -np "$np" "$test_tp" "$dir/unit$np" 2
done

# 2. the trainer: 1024 tokens per step everywhere, B x T x dp = 16 x 64 x 1 = 8 x 64 x 2
common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
run one 1 16
run tp2_sp1 2 16 --tp 2 --sp 1
run tp2_sp0 2 16 --tp 2 --sp 0
run dp2_tp2_z1 4 8 --tp 2 -z 1
run dp2_tp2_z3 4 8 --tp 2 -z 3
run tp2_r3 2 16 --tp 2 -r 3
grep -q "mesh: 2 rank(s) = dp 1 x pp 1 x tp 2" "$dir/tp2_sp1.log" || { echo "FAIL the --tp 2 run did not print its mesh"; exit 1; }
for name in tp2_sp1 tp2_sp0 dp2_tp2_z1 dp2_tp2_z3 tp2_r3; do compare one "$name" 2e-2; done
compare tp2_sp1 tp2_sp0 2e-2
size_one=$(stat -c %s "$dir/one/model.bin")
size_tp=$(stat -c %s "$dir/tp2_sp1/model.bin")
[ "$size_one" = "$size_tp" ] || { echo "FAIL the tp 2 model.bin has $size_tp bytes, the 1-rank one $size_one"; exit 1; }
echo "ok the tp 2 run saved a whole model.bin ($size_tp bytes, as 1 rank)"
"$trainer" --plan 4 -e d12 --tp 2 > "$dir/plan.log" || { echo "FAIL --plan 4 --tp 2"; cat "$dir/plan.log"; exit 1; }
grep -q "tp 2" "$dir/plan.log" || { echo "FAIL --plan 4 --tp 2 does not mention the mesh"; cat "$dir/plan.log"; exit 1; }
echo "ok --plan 4 --tp 2 plans each rank's piece"

# 3. NCCL needs a GPU per rank
if [ "$(gpus_on_node)" -ge 2 ]; then
    echo "== nccl: mpirun -np 2 --tp 2 --gpu-comm nccl"
    timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 16 --tp 2 -o "$dir/nccl" > "$dir/nccl.log"
    grep -q "collectives over NCCL" "$dir/nccl.log" || { echo "FAIL the NCCL run did not use NCCL"; exit 1; }
    compare one nccl 2e-2
else
    echo "run_gpu_tp_tests.sh: one GPU: --tp 2 over NCCL skipped (it needs a GPU per rank)"
fi
