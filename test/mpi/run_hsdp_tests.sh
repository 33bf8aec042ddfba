#!/usr/bin/env bash
# Hybrid sharding (--dp-shard N: ZeRO inside groups of N data-parallel ranks, the groups replicas of
# one another) trained by train_gpt_cpu under mpirun, against the 1-rank run (same_curve: losses
# within 1e-5, gradient norms within 1e-4 relative, 20 steps):
#   1. 4 ranks at --dp-shard 2 at ZeRO 0, 1, 2 and 3, and at --dp-shard 1 (plain replicas, each
#      group one rank) at ZeRO-3; --dp-shard 4 on 4 ranks is the flat run, bitwise;
#   2. with the other axes: 8 ranks as dp 4 x tp 2 at --dp-shard 2 (ZeRO-1 and ZeRO-3), 4 ranks as
#      dp 2 x cp 2 at --dp-shard 1 (ZeRO over each context pair, replicated across data), and dp 2 x
#      pp 2 at --dp-shard 1, ZeRO-2; FP8's delayed scales agree over every replica (dp 4 at
#      --dp-shard 2 with --fp8 and delayed scaling reproduces the flat dp 4 run);
#   3. checkpoints: a --dp-shard 2 checkpoint holds each element once (the replicas write nothing),
#      and resumes at --dp-shard 4, at --dp-shard 1 and on 2 ranks, continuing the uninterrupted run;
#      a flat run's checkpoint resumes at --dp-shard 2; the local tier (2 ranks a node, the replicas
#      on node 1) resumes after a rank is killed and node 1's directory is lost;
#   4. bad input: a --dp-shard that does not divide dp, a negative one, one with a mixture of experts.
#   test/mpi/run_hsdp_tests.sh ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_hsdp_tests.sh: $trainer is not built" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

shard="$dir/hsdp_train_000000.bin"
walk_shard "$shard" 11 13 5 7

# -d 512 = 8 ranks x B 2 x T 32: every mesh below takes the same global batch (more accumulation on
# fewer data ranks).
common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --num-layers 2 --channels 32 --num-heads 4 --max-seq-len 32
        -b 2 -t 32 -d 512 -l 1e-2 -u 2 --heartbeat-s 0 --straggler-factor 0)

"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 20 -n 10 -o "$dir/one" >"$dir/one.log"

# 1. The stages, on 4 ranks in 2 groups of 2.
for z in 0 1 2 3; do run_like_one "shard2_z$z" 4 --dp-shard 2 -z "$z" -n 10; done
grep -q "^hybrid sharding: ZeRO inside 2 group(s) of 2 data-parallel rank(s); each bucket's reduced slice all-reduced over its 2 replicas$" \
    "$dir/shard2_z1.log" || { echo "FAILED: the startup line of --dp-shard 2"; cat "$dir/shard2_z1.log"; exit 1; }
run_like_one shard1_z3 4 --dp-shard 1 -z 3
# --dp-shard dp is the flat run itself: the same bits (no replica group, nothing else differs)
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -x 20 -z 2 -o "$dir/flat" >"$dir/flat.log"
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -x 20 -z 2 --dp-shard 4 -o "$dir/shard4" >"$dir/shard4.log"
cmp <(curve "$dir/flat/metrics.jsonl") <(curve "$dir/shard4/metrics.jsonl") >/dev/null ||
    { echo "FAILED: --dp-shard 4 on 4 ranks is not the flat run bitwise"; exit 1; }
grep -q "^hybrid sharding" "$dir/shard4.log" && { echo "FAILED: --dp-shard 4 of 4 says it is hybrid"; exit 1; }
echo "ok --dp-shard 4 on 4 ranks is the flat run, bitwise (no hybrid sharding line)"

# 2. With the other axes.
run_like_one dp4_tp2_z1 8 --tp 2 --dp-shard 2 -z 1
run_like_one dp4_tp2_z3 8 --tp 2 --dp-shard 2 -z 3
# (ring attention's sums differ from 1 rank's attention in the last bits: with this shard the flat
# dp 2 x cp 2 run's norm is 1.01e-4 off 1 rank's at step 12, so this mesh is held to the flat run's
# curve within the usual tolerances, and to 1 rank's with the norm within 2e-4)
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -x 20 --cp 2 -z 3 -o "$dir/dp2_cp2_flat" >"$dir/dp2_cp2_flat.log"
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -x 20 --cp 2 --dp-shard 1 -z 3 -o "$dir/dp2_cp2" >"$dir/dp2_cp2.log"
same_curve "$dir/dp2_cp2_flat/metrics.jsonl" "$dir/dp2_cp2/metrics.jsonl" "dp 2 x cp 2 at --dp-shard 1 against flat"
same_curve "$dir/one/metrics.jsonl" "$dir/dp2_cp2/metrics.jsonl" "dp 2 x cp 2 at --dp-shard 1 against 1 rank" 1e-5 2e-4
echo "ok dp2_cp2 (4 ranks, --cp 2 --dp-shard 1 -z 3) reproduces the flat dp 2 x cp 2 run, and 1 rank's curve"
run_like_one dp2_pp2 4 --pp 2 --dp-shard 1 -z 2
# FP8 with delayed scaling: each step's scales come from the amax of every rank's casts, so the
# replicas must take theirs over the shard groups too (the flat 4-rank run is the reference: its
# micro-batches are the same, 1 rank's are not)
fp8=(--fp8 1 --fp8-scaling delayed -x 20 -z 1)
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" "${fp8[@]}" -o "$dir/flat_fp8" >"$dir/flat_fp8.log"
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" "${fp8[@]}" --dp-shard 2 -o "$dir/fp8" >"$dir/fp8.log"
same_curve "$dir/flat_fp8/metrics.jsonl" "$dir/fp8/metrics.jsonl" "FP8 with delayed scaling at --dp-shard 2"
echo "ok FP8 with delayed scaling at --dp-shard 2 (the scales' amax over every replica) reproduces the flat run"

# 3. Checkpoints: the replicas write nothing, so the files hold each element once, as 1 rank's.
same_checkpoint_bytes "$dir/one/ckpt_00000010" "$dir/shard2_z2/ckpt_00000010" \
    "the --dp-shard 2 checkpoint against the 1-rank one"
resume() {  # resume NAME FROM NP FLAGS...: step 10's checkpoint of FROM, continued to step 20
    local name=$1 from=$2 np=$3 out="$dir/resume_$1"
    shift 3
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 20 "$@" -o "$out" \
        --resume-from "$dir/$from/ckpt_00000010" >"$out.log"
    check_resumed "$out.log" "$out/metrics.jsonl" "$dir/$from/metrics.jsonl" "$dir/$from/ckpt_00000010" 10 \
        "$from resumed as $name"
    echo "ok the $from checkpoint resumed on $np rank(s) with $* continues the uninterrupted run"
}
resume shard4 shard2_z2 4 -z 2 --dp-shard 4
resume shard1 shard2_z3 4 -z 3 --dp-shard 1
resume two shard2_z1 2 -z 1
resume from_flat one 4 -z 3 --dp-shard 2

# The local checkpoint tier (2 ranks a node): node 1 holds the replica group, which writes nothing;
# losing its directory loses nothing.
local_tier_kill_resume "dp 4 at --dp-shard 2, ZeRO-1" "$trainer" "${common[@]}" --dp-shard 2 -z 1

# 4. Bad input, each refused by name.
expect_failure "a --dp-shard that does not divide dp" \
    "\-\-dp-shard 3 must be 0 or divide the 4 data-parallel rank(s)" -np 4 "$trainer" "${common[@]}" -x 1 --dp-shard 3 -o "$dir/bad"
expect_failure "a negative --dp-shard" "\-\-dp-shard -1 must be 0 or divide" \
    -np 1 "$trainer" "${common[@]}" -x 1 --dp-shard -1 -o "$dir/bad"
expect_failure "--dp-shard with a mixture of experts" "\-\-dp-shard 1 with a mixture-of-experts model (4 experts) is not supported yet" \
    -np 2 "$trainer" "${common[@]}" -x 1 --experts 4 --dp-shard 1 -o "$dir/bad"
