#!/usr/bin/env bash
# FP8 products of the CUDA model (--fp8 1; part of make test-gpu and make test-emu), ranks sharing
# one GPU through the MPI communicator:
#   1. train_gpt --fp8 1 against train_gpt_cpu --fp8 1 (the CPU model's exact simulation), current
#      and delayed scaling, over 12 steps, within 1e-3 relative per step (emulated: 8e-5; the GPU
#      quantizes bf16 values, the CPU fp32 ones, and the bf16 runs differ by 3e-5); the step line
#      shows the clipping;
#   2. delayed scaling on 2 data-parallel ranks at ZeRO-1 (the step amax the maximum over the
#      ranks) against 1 rank, within 1e-3; and at ZeRO-3, where the weights are cast at every use
#      each rank's slices of the weights are cast once a step and gathered as their codes, with 2
#      micro-batches a rank; and at ZeRO-3 the codes' gather (--fp8-gather 1, the default) gives
#      bitwise the run of gathering bf16 and casting at every use (--fp8-gather 0), its clipping
#      counts too, on 2 ranks (delayed scaling) and 3 (current; slices cut the weights unevenly),
#      over NCCL as well (emulated: a GPU per rank), with a bit flipped on one rank after a skipped
#      step (no rank packs alone), and resumed from a checkpoint ends bitwise as the uninterrupted run;
#   3. a delayed-scaling run resumed from its step-6 checkpoint (the amax histories in its manifest)
#      ends bitwise equal to the uninterrupted run, and train_gpt_cpu continues it;
#   4. --fp8 with --tp is refused.
# Skips with a message where there is no GPU or no mpirun, except in a GPU session
# (LLMC_GPU_SESSION=1), where either is a failure.
#   test/gpu/run_gpu_fp8_tests.sh ./train_gpt ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt}
cpu_trainer=${2:-./train_gpt_cpu}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_fp8_tests.sh "$trainer" "$cpu_trainer"
limit=${LLMC_FP8_LOSS_LIMIT:-1e-3}
common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 12 -v 0 -s 0 -l 1e-3 --gpu-comm mpi --fp8 1)

# 1. against the CPU model's simulation
for scaling in current delayed; do
    run "gpu_$scaling" 1 16 --fp8-scaling "$scaling"
    echo "== cpu_$scaling: train_gpt_cpu, B 16 --fp8-scaling $scaling"
    "$cpu_trainer" "${common[@]}" -b 16 --fp8-scaling "$scaling" -o "$dir/cpu_$scaling" > "$dir/cpu_$scaling.log"
    compare "cpu_$scaling" "gpu_$scaling" "$limit" 12
done
grep -q "fp8 sat [0-9]* flush [0-9.]*%" "$dir/gpu_delayed.log" || { echo "FAIL: no FP8 clipping on the step line"; exit 1; }
echo "ok the step line: $(grep -o 'fp8 sat.*%' "$dir/gpu_delayed.log" | tail -1)"

# 2. delayed scaling over 2 data-parallel ranks
run two_ranks 2 8 --fp8-scaling delayed -z 1
compare gpu_delayed two_ranks "$limit" 12
run zero3 2 4 --fp8-scaling delayed -z 3
compare gpu_delayed zero3 "$limit" 12

# 2b. ZeRO-3's weights gathered as FP8 codes against gathered in bf16 and cast at every use: the same bits
fp8_counts() { grep -o '"fp8":{[^}]*}[^}]*}[^}]*}[^}]*}' "$dir/$1/metrics.jsonl"; }
same_run() {  # same_run A B: model.bin and every step's clipping counts equal
    cmp "$dir/$1/model.bin" "$dir/$2/model.bin" || { echo "FAIL $2: model.bin differs from $1's"; exit 1; }
    diff <(fp8_counts "$1") <(fp8_counts "$2") > /dev/null || { echo "FAIL $2: clipping counts differ from $1's"; exit 1; }
    [ "$(fp8_counts "$1" | wc -l)" -eq 12 ] || { echo "FAIL $1: no clipping counts"; exit 1; }
    echo "ok $2 is bitwise $1 (model.bin, 12 steps' clipping counts)"
}
run zero3_bf16_gather 2 4 --fp8-scaling delayed -z 3 --fp8-gather 0
same_run zero3 zero3_bf16_gather
grep -q "^fp8: ZeRO-3 gathers each layer's weights as FP8 codes" "$dir/zero3.log" || { echo "FAIL: no gather line"; exit 1; }
! grep -q "^fp8: ZeRO-3 gathers" "$dir/zero3_bf16_gather.log" || { echo "FAIL: --fp8-gather 0 gathered codes"; exit 1; }
echo "ok $(grep "^fp8: ZeRO-3" "$dir/zero3.log")"
run zero3_three 3 2 --fp8-scaling current -z 3 -d $((12 * test_T))
run zero3_three_bf16_gather 3 2 --fp8-scaling current -z 3 -d $((12 * test_T)) --fp8-gather 0
same_run zero3_three zero3_three_bf16_gather
# ... over NCCL too (its collectives on their own stream: the packing, the gathers and the unpacking
# ordered by events), where the node has a GPU per rank (the emulator's: NCCL refuses two ranks a GPU)
if [ "$(gpus_on_node)" -ge 2 ]; then
    for g in 1 0; do
        echo "== nccl_$g: 2 ranks, --gpu-comm nccl, -z 3 --fp8-gather $g"
        timeout 300 mpirun --oversubscribe -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 4 --fp8-scaling delayed -z 3 \
            --fp8-gather "$g" -o "$dir/nccl_$g" > "$dir/nccl_$g.log"
        grep -q "collectives over NCCL" "$dir/nccl_$g.log" || { echo "FAIL nccl_$g did not use NCCL"; exit 1; }
    done
    same_run nccl_1 nccl_0
fi
# ... with a bit flipped on one rank after a step every rank skipped (its parameters alone changed):
# a packing exchanges amaxes between the ranks, so no rank may pack alone
run zero3_flip 2 4 --fp8-scaling current -z 3 --faults nan_grad@3,flip_bit@3:1 --comm-timeout-s 60
grep -q "update SKIPPED" "$dir/zero3_flip.log" || { echo "FAIL zero3_flip: step 3 not skipped"; exit 1; }
echo "ok a bit flipped on rank 1 after a skipped step: the run goes on"
# ... and resumed from its step-6 checkpoint, it ends as the uninterrupted run did
run zero3_saving 2 4 --fp8-scaling delayed -z 3 -n 6 -nk 0
mkdir -p "$dir/zero3_resumed"
cp -r "$dir/zero3_saving/ckpt_00000006" "$dir/zero3_resumed/"
run zero3_resumed 2 4 --fp8-scaling delayed -z 3 -n 6 -nk 0 -y 1
grep -q "resumed from $dir/zero3_resumed/ckpt_00000006" "$dir/zero3_resumed.log" || { echo "FAIL: no resume"; exit 1; }
cmp "$dir/zero3/model.bin" "$dir/zero3_resumed/model.bin" || { echo "FAIL: ZeRO-3 resumed differs"; exit 1; }
echo "ok ZeRO-3 with gathered codes, resumed at step 6, ends bitwise equal to the uninterrupted run"

# 3. resume from the step-6 checkpoint, on the GPU and on the CPU
resume_check 6 12 "$limit" 16 --fp8-scaling delayed
grep -q '"fp8_scaling"' "$dir/ref/ckpt_00000006/manifest.json" || { echo "FAIL: no FP8 state in the manifest"; exit 1; }

# 4. refused
if "$trainer" "${common[@]}" -b 16 --tp 2 --plan 2 -o "$dir/bad" > "$dir/bad.log" 2>&1; then
    echo "FAIL: --fp8 with --tp ran"; exit 1
fi
grep -q -- "--fp8 1 runs a dense model with data parallelism" "$dir/bad.log" || { cat "$dir/bad.log"; exit 1; }
echo "ok --fp8 with --tp refused: $(grep -m1 -- '--fp8 1' "$dir/bad.log")"
