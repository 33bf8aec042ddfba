#!/usr/bin/env bash
# A Llama on the CUDA model (part of make test-gpu and make test-emu; the model itself against the
# CPU model, kernel by kernel and step by step, is test_cuda_model's "a Llama" cases): train_gpt with
# the test model made a Llama (--arch llama: RMSNorm, RoPE, SwiGLU, an untied head) of 128 channels
# in 4 heads sharing 2 kv heads (so that 2 tensor ranks each hold a group), 8 steps of 16 sequences:
#   1. one rank (two micro-batches of 8) follows train_gpt_cpu's run of the same data, seed and
#      config (fp32 against bf16: within 2e-3 relative per step);
#   2. two ranks (--gpu-comm mpi) reproduce the one-rank curve within LLMC_LLAMA_RANKS_LIMIT
#      (default 1e-3): data parallel at ZeRO-3 (8 sequences each), tensor parallel (--tp 2, with
#      sequence parallelism), pipeline parallel (--pp 2, interleaved, 2 chunks per rank) and context
#      parallel (--cp 2: ring attention on the expanded kv heads, RoPE at the global positions; not
#      emulated, where test_cp_cuda's Llama step checks every gradient of the same path instead);
#   3. a checkpoint written at step 4, resumed by train_gpt, ends with the same model.bin bit for
#      bit, and train_gpt_cpu continues it within 2e-3;
#   4. FP8 products (--fp8 1, delayed scaling) follow train_gpt_cpu's simulation of the same run
#      within 1e-3, and ZeRO-3 on 2 ranks (the weights gathered as their codes) the 1-rank FP8 run
#      within the ranks' limit.
# Skips with a message where there is no GPU or no mpirun, except in a GPU session
# (LLMC_GPU_SESSION=1), where either is a failure (exit 3 without a GPU, 1 without mpirun).
#   test/gpu/run_gpu_llama_tests.sh ./train_gpt ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt}
cpu_trainer=${2:-./train_gpt_cpu}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_llama_tests.sh "$trainer" "$cpu_trainer"
ranks_limit=${LLMC_LLAMA_RANKS_LIMIT:-1e-3}

steps=8
base=("${test_model[@]}" --arch llama --channels 128 --num-heads 4 --kv-heads 2 -t "$test_T" -d $((16 * test_T)) -x "$steps" -v 0 -s 0 -l 1e-3)

# 1. one rank against the CPU trainer
common=("${base[@]}")
cuda_trainer=$trainer trainer=$cpu_trainer
run cpu 1 8
trainer=$cuda_trainer common=("${base[@]}" --gpu-comm mpi)
run one 1 8
grep -q "^model: d4 (llama) | L 4 | heads 4 (2 kv) |" "$dir/one.log" || { echo "FAIL the CUDA run does not say it is a Llama"; head -3 "$dir/one.log"; exit 1; }
compare cpu one 2e-3 "$steps"

# 2. two ranks: data, tensor and pipeline parallel
run z3 2 8 -z 3
compare one z3 "$ranks_limit" "$steps"
run tp2 2 16 --tp 2
compare one tp2 "$ranks_limit" "$steps"
run pp2 2 8 --pp 2 --pp-schedule interleaved --pp-virtual 2
compare one pp2 "$ranks_limit" "$steps"
if [ "${LLMC_EMULATED:-0}" != 1 ]; then  # emulated, test_cp_cuda's Llama step covers the ring (CI's time)
    run cp2 2 8 --cp 2
    compare one cp2 "$ranks_limit" "$steps"
fi

# 3. a checkpoint resumed on the GPU (bitwise) and by the CPU model
resume_check 4 "$steps" 2e-3 8

# 4. FP8 products (delayed scaling): the CPU model's simulation of the same run, and ZeRO-3 on 2
# ranks with the weights' codes gathered against the 1-rank run
common=("${base[@]}" --fp8 1 --fp8-scaling delayed)
trainer=$cpu_trainer
run cpu_fp8 1 8
trainer=$cuda_trainer common=("${common[@]}" --gpu-comm mpi)
run fp8 1 8
compare cpu_fp8 fp8 1e-3 "$steps"
run fp8_zero3 2 4 -z 3
compare fp8 fp8_zero3 "$ranks_limit" "$steps"
