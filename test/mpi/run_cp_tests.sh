#!/usr/bin/env bash
# Context parallelism under mpirun:
#   1. test_cp (test_cp.cpp): ring attention equals plain attention (forward and backward) on cp 2
#      and 4; cp 2, cp 4, dp 2 x cp 2 and cp 2 x tp 2 (sequence parallelism on and off) reproduce
#      the 1-rank run at ZeRO 0-3 over dp x cp, planned bytes = allocated bytes, and sampling's
#      next-token logits are 1 rank's;
#   2. the trainer: bad meshes fail naming --cp, -t and what was expected; --plan shows the
#      activations falling with cp and the ring's bytes; cp 2, cp 4, dp 2 x cp 2 and pp 2 x cp 2
#      (ZeRO-0 and 3) print 1 rank's losses for 20 steps (cp 2 its validation losses too), and the
#      mesh line says cp; dp 2 x cp 2 compares the fingerprints of its 4 replicas; a cp 2
#      checkpoint is as big as the 1-rank one (cp ranks hold replicas, written once); a cp 2
#      checkpoint resumes on 1 rank and a 1-rank one on cp 2 (and on dp 2 x cp 2 at ZeRO-3),
#      continuing the uninterrupted run;
#   3. the local checkpoint tier on a dp 2 x cp 2 mesh at ZeRO-1, a node's directory lost.
#   test/mpi/run_cp_tests.sh build/test_cp ./train_gpt_cpu
set -euo pipefail

bin=${1:-build/test_cp}
trainer=${2:-./train_gpt_cpu}
for b in "$bin" "$trainer"; do [ -x "$b" ] || { echo "run_cp_tests.sh: $b is not built" >&2; exit 1; }; done
source "$(dirname "$0")/lib.sh"

for mesh in "2 2" "4 4" "4 2" "4 2 2"; do
    set -- $mesh
    echo "== mpirun -np $1 $bin (cp $2${3:+, tp $3})"
    "${mpirun[@]}" -np "$1" "$bin" "$dir" "$2" ${3:+"$3"}
done

shard="$dir/cp_train_000000.bin"  # 60000 tokens of a 250-token vocabulary, written by test_cp
common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --num-layers 2 --channels 32 --num-heads 4 --max-seq-len 32
        -b 2 -t 32 -d 256 -l 1e-2 -u 2 --heartbeat-s 0 --straggler-factor 0)

# Each bad mesh must fail (non-zero exit) with a message naming the problem.
expect_failure "a sequence that 2 x cp does not divide" \
    "\-\-cp 2 needs -t (seq_len) divisible by 2 x cp = 4 (each rank holds 2 of the 4 equal chunks of a sequence), got -t 30" \
    -np 2 "$trainer" "${common[@]}" -x 1 --cp 2 -t 30 -d 60 -o "$dir/bad"
expect_failure "a world that cp does not divide" "\-\-pp 1 x \-\-cp 2 x \-\-tp 1 does not divide the 3 rank(s)" \
    -np 3 "$trainer" "${common[@]}" -x 1 --cp 2 -o "$dir/bad"
expect_failure "a context rank's rows that sequence parallelism cannot cut" \
    "needs -t / \-\-cp = 20 / 2 divisible by them" \
    -np 1 "$trainer" "${common[@]}" -x 1 --cp 2 --tp 4 -t 20 -d 40 --plan 8 -o "$dir/bad"
expect_failure "a --cp below 1" "\-\-cp must be >= 1, got 0" -np 1 "$trainer" "${common[@]}" -x 1 --cp 0 -o "$dir/bad"

# --plan: the mesh, activations per rank falling with cp, and the ring's bytes.
# Activation bytes per rank at cp N (--plan N --cp N prints KiB, MiB or GiB).
activations() {
    "$trainer" "${common[@]}" -x 1 --plan "$1" --cp "$1" |
        awk '$1 == "activations" { printf "%d\n", $2 * ($3 == "KiB" ? 1024 : $3 == "MiB" ? 1048576 : 1073741824); exit }'
}
a1=$(activations 1) a2=$(activations 2) a4=$(activations 4)
# 1/cp of everything but the ring's blocks, which the split adds (a few percent here).
awk -v a1="$a1" -v a2="$a2" -v a4="$a4" 'BEGIN { exit !(2 * a2 <= 1.05 * a1 && 4 * a4 <= 1.05 * a1) }' ||
    { echo "FAILED: activations per rank at cp 1, 2, 4: $a1 $a2 $a4 bytes, not falling as 1/cp"; exit 1; }
"$trainer" "${common[@]}" -x 1 --plan 4 --cp 2 >"$dir/plan.log"
grep -q "memory plan per rank: .* dp 2 x cp 2 (T 16 per rank) ranks" "$dir/plan.log" &&
    grep -q "in its data-parallel x context group and .* around its context ring (ring attention)" "$dir/plan.log" ||
    { echo "FAILED: --plan 4 --cp 2"; cat "$dir/plan.log"; exit 1; }
echo "ok --plan: activations per rank $a1, $a2, $a4 bytes at cp 1, 2, 4 (1/cp, within 5%); the mesh and the ring's bytes"

# The same run on 1 rank and split over contexts: the same curve.
# The 1-rank and cp 2 runs also validate (on the training shard) every 10 steps.
"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 20 -n 10 -j "$shard" -v 10 -m 2 -o "$dir/one" >"$dir/one.log"
run_like_one cp2 2 --cp 2 -n 10 -j "$shard" -v 10 -m 2
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }
paste <(val_losses "$dir/one/metrics.jsonl") <(val_losses "$dir/cp2/metrics.jsonl") |
    awk '{ n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++ } END { exit !(n == 3 && !bad) }' ||
    { echo "FAILED: cp 2's validation losses are not 1 rank's"; exit 1; }
echo "ok cp 2's validation losses (steps 0, 10, 20) are 1 rank's"
run_like_one cp4 4 --cp 4
run_like_one dp2_cp2 4 --cp 2 -z 1 --fingerprint-every 10
grep -q "^fingerprint: the 4 replicas agree after step 20" "$dir/dp2_cp2.log" ||
    { echo "FAILED: dp 2 x cp 2 compared no fingerprints of its 4 replicas"; cat "$dir/dp2_cp2.log"; exit 1; }
echo "ok dp 2 x cp 2: the fingerprints of all 4 replicas (data and context ranks) agree"
run_like_one pp2_cp2 4 --cp 2 --pp 2
run_like_one pp2_cp2_zero3 4 --cp 2 --pp 2 -z 3
grep -q "^mesh: 2 rank(s) = dp 1 x pp 1 x cp 2 x tp 1; context parallel, 16 of each sequence's 32 positions per rank, ring attention, ZeRO over dp x cp$" "$dir/cp2.log" &&
    grep -q "^batch: B 2 x T 32 x 1 data-parallel rank(s) x 4 accumulation = 256 tokens per step" "$dir/cp2.log" ||
    { echo "FAILED: the mesh and batch lines of a cp 2 run"; cat "$dir/cp2.log"; exit 1; }
echo "ok a cp 2 run's log: 1 data-parallel rank of 2, the mesh with cp 2 and 16 positions per rank"
# The context ranks hold replicas: the checkpoint holds each element once, as the 1-rank one.
same_checkpoint_bytes "$dir/one/ckpt_00000010" "$dir/cp2/ckpt_00000010" "the cp 2 checkpoint against the 1-rank one"

# Resume step 10's checkpoint onto another split: steps 11-20 must continue the uninterrupted run.
resume() {  # resume NP CP ZERO FROM
    local np=$1 cp=$2 zero=$3 from=$4 out="$dir/resume_$1_$2_$3_$4"
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 20 --cp "$cp" -z "$zero" -o "$out" \
        --resume-from "$dir/$from/ckpt_00000010" >"$out.log"
    check_resumed "$out.log" "$out/metrics.jsonl" "$dir/$from/metrics.jsonl" "$dir/$from/ckpt_00000010" 10 \
        "$from resumed as np $np cp $cp ZeRO-$zero"
    echo "ok the $from checkpoint resumed as $np rank(s), cp $cp, ZeRO-$zero continues the uninterrupted run"
}
resume 1 1 0 cp2
resume 2 2 0 one
resume 4 2 3 one

# The local checkpoint tier on a dp 2 x cp 2 mesh at ZeRO-1, whose shards span all 4 ranks: the
# missing node's shards are shared over the dp x cp group.
local_tier_kill_resume "dp 2 x cp 2, ZeRO-1" "$trainer" "${common[@]}" --cp 2 -z 1
