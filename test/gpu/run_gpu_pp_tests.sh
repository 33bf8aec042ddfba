#!/usr/bin/env bash
# Pipeline parallelism of the CUDA model (part of make test-gpu), ranks sharing one GPU through the
# MPI communicator (--gpu-comm mpi):
#   1. build/test_pp_cuda at pp 2 (2 ranks, 1F1B), pp 2 interleaved with 2 chunks per rank (2 ranks),
#      dp 2 x pp 2 and pp 2 x tp 2 (4 ranks each): ZeRO-0..3 and -r 3, against the 1-rank CUDA model
#      and the CPU model (test_pp_cuda.cu says what it checks);
#   2. train_gpt through the trainer: --pp 2 (1F1B), --pp 2 interleaved (--pp-virtual 2), and except
#      emulated dp 2 x pp 2 at ZeRO-1 and pp 2 x tp 2, reproduce the 1-rank loss curve on the same global batch within bf16
#      tolerance (2e-2 relative per step, the data-parallel suite's limit); the runs print their mesh
#      and pipeline; a pp run saves a model.bin of the 1-rank size; --plan --pp prints every stage; a
#      --pp 2 run's step-10 checkpoint resumes as 1 rank, and a 1-rank one's as --pp 2, each
#      continuing the run it was written by;
#   3. where the node has 2 GPUs, --pp 2 over NCCL reproduces it too (skipped, with a message, on one).
# Every run reads 1024 tokens per step in 4 micro-batches per pipeline (a multiple of pp, as the
# interleaved schedule needs).
# Skips with a message where there is no GPU or no mpirun, except in a GPU session
# (LLMC_GPU_SESSION=1), where either is a failure (exit 3 without a GPU, 1 without mpirun).
#   test/gpu/run_gpu_pp_tests.sh build/test_pp_cuda ./train_gpt
set -euo pipefail

test_pp=${1:-build/test_pp_cuda}
trainer=${2:-./train_gpt}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_pp_tests.sh "$test_pp" "$trainer"

# 1. the model against its references: RANKS PP TP VIRTUAL
for mesh in "2 2 1 1" "2 2 1 2" "4 2 1 1" "4 2 2 1"; do
    read -r np pp tp chunks <<< "$mesh"
    echo "== test_pp_cuda: $np ranks, pp $pp, tp $tp, $chunks chunk(s) per rank"
    mkdir -p "$dir/unit_${np}_${pp}_${tp}_${chunks}"
    timeout 600 mpirun --oversubscribe -np "$np" "$test_pp" "$dir/unit_${np}_${pp}_${tp}_${chunks}" "$pp" "$tp" "$chunks"
done

# 2. the trainer: 1024 tokens per step everywhere, B x T x dp x micro-batches =
#    4 x 64 x 1 x 4 (1 rank, pp 2, pp 2 x tp 2) = 2 x 64 x 2 x 4 (dp 2 x pp 2)
common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
need() {  # need LOG PATTERN WHAT: the log has a line matching the extended regex PATTERN
    grep -qE "$2" "$dir/$1" || { echo "FAIL $3"; cat "$dir/$1"; exit 1; }
}
run one 1 4 -n 10
run pp2 2 4 --pp 2 -n 10
run pp2_int 2 4 --pp 2 --pp-schedule interleaved --pp-virtual 2
# The 4-rank meshes through the trainer except emulated (the CI's time: test_pp_cuda's units above
# run both meshes against the references there)
four=0
[ "${LLMC_EMULATED:-0}" = 1 ] || four=1
if [ "$four" = 1 ]; then
    run dp2_pp2_z1 4 2 --pp 2 -z 1
    run pp2_tp2 4 4 --pp 2 --tp 2
fi
need pp2.log "mesh: 2 rank\(s\) = dp 1 x pp 2 x tp 1" "the --pp 2 run did not print its mesh"
need pp2.log "pipeline: 2 stages, 1f1b schedule, layers per virtual stage 2,2, 4 micro-batches" \
    "the --pp 2 run did not print its pipeline"
need pp2_int.log "pipeline: 2 stages, interleaved schedule, layers per virtual stage 1,1,1,1, 4 micro-batches" \
    "the interleaved run did not print its pipeline"
if [ "$four" = 1 ]; then
    need dp2_pp2_z1.log "mesh: 4 rank\(s\) = dp 2 x pp 2 x tp 1" "the dp 2 x pp 2 run did not print its mesh"
    need pp2_tp2.log "mesh: 4 rank\(s\) = dp 1 x pp 2 x tp 2" "the pp 2 x tp 2 run did not print its mesh"
fi
echo "ok the pipeline runs print their mesh and schedule"
trainer_runs=(pp2 pp2_int)
[ "$four" = 1 ] && trainer_runs+=(dp2_pp2_z1 pp2_tp2)
for name in "${trainer_runs[@]}"; do compare one "$name" 2e-2; done
size_one=$(stat -c %s "$dir/one/model.bin")
saved=(pp2)
[ "$four" = 1 ] && saved+=(pp2_tp2)
for name in "${saved[@]}"; do
    size=$(stat -c %s "$dir/$name/model.bin")
    [ "$size_one" = "$size" ] || { echo "FAIL the $name model.bin has $size bytes, the 1-rank one $size_one"; exit 1; }
done
echo "ok the pp 2 and pp 2 x tp 2 runs saved a whole model.bin ($size_one bytes, as 1 rank)"

# --plan: rank 0's memory, then one line per pipeline stage (its layers, memory and p2p traffic)
"$trainer" --plan 4 -e d12 --pp 2 > "$dir/plan.log" || { echo "FAIL --plan 4 -e d12 --pp 2"; cat "$dir/plan.log"; exit 1; }
need plan.log "dp 2 x pp 2" "--plan 4 --pp 2 does not mention the mesh"
need plan.log "pipeline: 2 stage\(s\), 1f1b schedule" "--plan 4 --pp 2 prints no pipeline"
need plan.log "^  0 +0-5\+emb " "--plan 4 --pp 2 prints no line for stage 0 (layers 0-5 and the embedding)"
need plan.log "^  1 +6-11\+head " "--plan 4 --pp 2 prints no line for stage 1 (layers 6-11 and the head)"
echo "ok --plan 4 -e d12 --pp 2 plans every stage: $(grep -m1 "bubble" "$dir/plan.log" | sed 's/^ *//')"

# Checkpoints across meshes: step 10 of the pp 2 run resumed as 1 rank, and step 10 of the 1-rank run
# resumed as pp 2; steps 11-20 must continue the run that wrote the checkpoint (bf16 tolerance: the
# other mesh rounds differently).
resume() {  # resume NAME RANKS B FROM WRITTEN_BY ARGS...
    local name=$1 ranks=$2 batch=$3 from=$4 written=$5
    shift 5
    run "$name" "$ranks" "$batch" "$@" --resume-from "$dir/$from/ckpt_00000010"
    need "$name.log" "resumed from $dir/$from/ckpt_00000010: step 10, written by $written" \
        "the $name run did not resume from $from's step 10"
    [ "$(losses "$name" | head -1 | cut -d' ' -f1)" = 11 ] || { echo "FAIL $name did not start at step 11"; exit 1; }
    compare "$from" "$name" 2e-2 10
}
resume pp2_as_one 1 4 pp2 "2 rank\(s\) \(pp 2, tp 1\)"
resume one_as_pp2 2 4 one "1 rank\(s\) \(pp 1, tp 1\)" --pp 2
echo "ok checkpoints cross between 1 rank and pp 2 and continue the run that wrote them"

# 3. NCCL needs a GPU per rank
if [ "$(gpus_on_node)" -ge 2 ]; then
    echo "== nccl: mpirun -np 2 --pp 2 --gpu-comm nccl"
    timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 4 --pp 2 -o "$dir/nccl" > "$dir/nccl.log"
    grep -q "collectives over NCCL" "$dir/nccl.log" || { echo "FAIL the NCCL run did not use NCCL"; exit 1; }
    compare one nccl 2e-2
    echo "== nccl: mpirun -np 2 --pp 2 --pp-schedule interleaved --pp-virtual 2 --gpu-comm nccl"
    timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 4 --pp 2 --pp-schedule interleaved --pp-virtual 2 \
        -o "$dir/nccl_int" > "$dir/nccl_int.log"
    compare one nccl_int 2e-2
else
    echo "run_gpu_pp_tests.sh: one GPU: --pp 2 over NCCL skipped (it needs a GPU per rank)"
fi
