#!/usr/bin/env bash
# Tensor and sequence parallelism under mpirun:
#   1. test_tp (test_tp.cpp): tp = 2, tp = 4 and dp = 2 x tp = 2 reproduce the 1-rank run, ZeRO 0-3,
#      sequence parallelism on and off, planned bytes = allocated bytes;
#   2. the trainer: bad meshes fail naming the flag and the numbers; a tp = 2 run prints the same
#      losses as 1 rank, and its batch and mesh lines count 1 data-parallel rank; its checkpoints are
#      as big as 1 rank's (no replicas), each file what the manifest lists; checkpoints written
#      at tp = 2 resume as tp = 1, dp = 2 x tp = 2 and tp = 4 (and one written at tp = 1 as dp 2 x
#      tp 2 at ZeRO-3) and continue the uninterrupted run.
#   test/mpi/run_tp_tests.sh build/test_tp ./train_gpt_cpu
set -euo pipefail

bin=${1:-build/test_tp}
trainer=${2:-./train_gpt_cpu}
for b in "$bin" "$trainer"; do [ -x "$b" ] || { echo "run_tp_tests.sh: $b is not built" >&2; exit 1; }; done
source "$(dirname "$0")/lib.sh"

for mesh in "2 2" "4 4" "4 2"; do
    set -- $mesh
    echo "== mpirun -np $1 $bin (tp $2)"
    "${mpirun[@]}" -np "$1" "$bin" "$dir" "$2"
done

shard="$dir/tp_train_000000.bin"  # 60000 tokens of a 250-token vocabulary, written by test_tp
common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --num-layers 2 --channels 32 --num-heads 4 --max-seq-len 32
        -b 2 -t 32 -d 256 -l 1e-2 -u 2 --heartbeat-s 0 --straggler-factor 0)

# Each bad mesh must fail (non-zero exit) with a message naming the problem.
expect_failure "a world that tp does not divide" "\-\-tp 2 does not divide the 3 rank(s)" \
    -np 3 "$trainer" "${common[@]}" -x 1 --tp 2 -o "$dir/bad"
expect_failure "heads that tp does not divide" "\-\-tp 3 must divide the model's head count (4)" \
    -np 3 "$trainer" "${common[@]}" -x 1 --tp 3 -o "$dir/bad"
expect_failure "a padded vocabulary that tp does not divide" "must divide the model's padded vocabulary (256)" \
    -np 1 "$trainer" "${common[@]}" -x 1 --num-heads 3 --channels 24 --plan 3 --tp 3 -o "$dir/bad"
expect_failure "a sequence-parallel length that tp does not divide" "needs -t (seq_len) 31 divisible" \
    -np 2 "$trainer" "${common[@]}" -x 1 --tp 2 -b 1 -t 31 -d 62 -o "$dir/bad"

# The same run on 1 rank and on a tp = 2 group (sequence parallel): the same curve.
"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 8 -n 4 -o "$dir/one" >"$dir/one.log"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -x 8 -n 4 --tp 2 -o "$dir/tp2" >"$dir/tp2.log"
same_curve "$dir/one/metrics.jsonl" "$dir/tp2/metrics.jsonl" "tp 2 against 1 rank"
echo "ok the trainer at tp 2 reproduces 1 rank's losses and gradient norms for 8 steps"
# Its start-up lines count the data-parallel ranks (1 here, of 2) and say what the mesh is.
grep -q "^batch: B 2 x T 32 x 1 data-parallel rank(s) x 4 accumulation = 256 tokens per step" "$dir/tp2.log" &&
    grep -q "^mesh: 2 rank(s) = dp 1 x pp 1 x tp 2; tensor parallel with sequence parallelism$" "$dir/tp2.log" ||
    { echo "FAILED: the batch and mesh lines of a tp 2 run"; cat "$dir/tp2.log"; exit 1; }
echo "ok a tp 2 run's log: 1 data-parallel rank of 2, tensor parallel with sequence parallelism"
# Its checkpoint holds each element once, as the 1-rank one does: rank 1 writes no replica of the
# tensors both ranks hold whole (LayerNorms, biases, wpe).
same_checkpoint_bytes "$dir/one/ckpt_00000004" "$dir/tp2/ckpt_00000004" "the tp 2 checkpoint against the 1-rank one"

# Resume step 4's checkpoint onto other splits: steps 5-8 must continue the uninterrupted run.
resume() {  # resume NP TP ZERO FROM
    local np=$1 tp=$2 zero=$3 from=$4 out="$dir/resume_$1_$2_$3"
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 8 --tp "$tp" -z "$zero" -o "$out" \
        --resume-from "$dir/$from/ckpt_00000004" >"$out.log"
    check_resumed "$out.log" "$out/metrics.jsonl" "$dir/$from/metrics.jsonl" "$dir/$from/ckpt_00000004" 4 \
        "$from resumed as np $np tp $tp ZeRO-$zero"
    echo "ok the $from checkpoint resumed as $np rank(s), tp $tp, ZeRO-$zero continues the uninterrupted run"
}
resume 1 1 0 tp2
resume 4 2 1 tp2
resume 4 4 3 tp2
resume 4 2 3 one
