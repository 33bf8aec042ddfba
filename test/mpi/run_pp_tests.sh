#!/usr/bin/env bash
# Pipeline parallelism under mpirun:
#   1. test_pp (test_pp.cpp): pp = 2 and 4, 1F1B and interleaved (an uneven --pp-layers too),
#      dp = 2 x pp = 2 and pp = 2 x tp = 2 reproduce the 1-rank run, ZeRO 0-3, planned bytes =
#      allocated bytes on every stage; interleaved pp 2 and 4 with a communicator per edge (NCCL's way);
#   2. the trainer: bad pipeline configs fail naming the flag and the numbers; --plan and
#      --pp-print-schedule print the stages and the schedule; a pp = 2 run prints the same losses as
#      1 rank (and a mesh line without tensor parallelism), and its checkpoints are as big as 1
#      rank's (no copy of the tied embedding), each file what the manifest lists; they resume as 1
#      rank, dp 2 x pp 2, pp 2 x tp 2, pp 4 and dp 2 x pp 2 interleaved (and one written on 1 rank as
#      pp 2) and continue the uninterrupted run;
#   3. the local checkpoint tier on a pp 2 x tp 2 mesh, a node's directory lost;
#   4. a NaN in the last stage's copy of the tied embedding's gradient skips the step everywhere;
#   5. a stage that dies mid-schedule: the other ranks report it and exit, no hang.
#   test/mpi/run_pp_tests.sh build/test_pp ./train_gpt_cpu
set -euo pipefail

bin=${1:-build/test_pp}
trainer=${2:-./train_gpt_cpu}
for b in "$bin" "$trainer"; do [ -x "$b" ] || { echo "run_pp_tests.sh: $b is not built" >&2; exit 1; }; done
source "$(dirname "$0")/lib.sh"

for mesh in "2 2 1 1" "2 2 1 2 1,3,2,2" "4 4 1 1" "4 4 1 2" "4 2 1 1" "4 2 2 1" "2 2 1 2 - edges" "4 4 1 2 - edges"; do
    set -- $mesh
    echo "== mpirun -np $1 $bin (pp $2, tp $3, $4 chunk(s) per rank${5:+, layers $5}${6:+, $6})"
    "${mpirun[@]}" -np "$1" "$bin" "$dir" "$2" "$3" "$4" ${5:+"$5"} ${6:+"$6"}
done

shard="$dir/pp_train_000000.bin"  # 60000 tokens of a 250-token vocabulary, written by test_pp
common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --num-layers 4 --channels 32 --num-heads 4 --max-seq-len 32
        -b 2 -t 32 -d 256 -l 3e-3 -u 2 --heartbeat-s 0 --straggler-factor 0)

# Each bad pipeline must fail (non-zero exit) with a message naming the problem.
expect_failure "a world that pp x tp does not divide" "\-\-pp 2 x \-\-tp 2 does not divide the 6 rank(s)" \
    -np 1 "$trainer" "${common[@]}" -x 1 --pp 2 --tp 2 --plan 6 -o "$dir/bad"
expect_failure "more stages than layers" "makes 8 virtual stages, more than the model's 4 layers" \
    -np 1 "$trainer" "${common[@]}" -x 1 --pp 4 --pp-schedule interleaved --pp-virtual 2 -d 512 --plan 4 -o "$dir/bad"
expect_failure "--pp-layers that do not add up" "\-\-pp-layers '1,2' adds up to 3 layers but the model has 4" \
    -np 2 "$trainer" "${common[@]}" -x 1 --pp 2 --pp-layers 1,2 -o "$dir/bad"
expect_failure "--pp-layers with a stage of no layers" "'0' is not a layer count in \[1, 4\]" \
    -np 2 "$trainer" "${common[@]}" -x 1 --pp 2 --pp-layers 0,4 -o "$dir/bad"
expect_failure "an interleaved schedule whose micro-batches pp does not divide" \
    "needs the step's micro-batch count (-d / (B\*T\*dp) = 3) to be a multiple of \-\-pp 2" \
    -np 1 "$trainer" "${common[@]}" -x 1 --pp 2 --pp-schedule interleaved --pp-virtual 2 -d 192 --plan 2 -o "$dir/bad"
expect_failure "--pp-virtual without the interleaved schedule" "\-\-pp-virtual 2 needs \-\-pp-schedule interleaved" \
    -np 1 "$trainer" "${common[@]}" -x 1 --pp 2 --pp-virtual 2 --plan 2 -o "$dir/bad"

# --plan prints one line per stage and the bubble; --pp-print-schedule every rank's actions.
"$trainer" "${common[@]}" -x 1 --plan 4 --pp 2 --pp-schedule interleaved --pp-virtual 2 -d 512 --pp-print-schedule 1 \
    >"$dir/plan.log"
grep -q "pipeline: 2 stage(s), interleaved schedule (2 chunks per rank), 4 micro-batch(es) per step" "$dir/plan.log" &&
    grep -qE "^  0 +0-0,2-2\+emb " "$dir/plan.log" && grep -qE "^  1 +1-1,3-3\+head " "$dir/plan.log" &&
    grep -q "bubble: (P - 1) / (m + P - 1) / V = 10.0%" "$dir/plan.log" &&
    grep -q "rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0" "$dir/plan.log" ||
    { echo "FAILED: --plan with --pp"; cat "$dir/plan.log"; exit 1; }
echo "ok --plan 4 --pp 2 --pp-schedule interleaved: every stage's memory, the bubble (10.0%) and the schedule"

# The same run on 1 rank and on a pp = 2 pipeline: the same curve.
"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 8 -n 4 -o "$dir/one" >"$dir/one.log"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -x 8 -n 4 --pp 2 -o "$dir/pp2" >"$dir/pp2.log"
same_curve "$dir/one/metrics.jsonl" "$dir/pp2/metrics.jsonl" "pp 2 against 1 rank"
cmp -s "$dir/one/model.bin" "$dir/pp2/model.bin" || "${PYTHON:-/usr/bin/python3}" - "$dir/one/model.bin" "$dir/pp2/model.bin" <<'PY' ||
import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32, offset=1024) for p in sys.argv[1:3])
d = np.linalg.norm(a - b) / np.linalg.norm(a)
print(f"model.bin: relative difference {d:.2g}")
sys.exit(0 if a.shape == b.shape and d <= 1e-4 else 1)
PY
    { echo "FAILED: the pp 2 run's model.bin is not the 1-rank run's"; exit 1; }
echo "ok the trainer at pp 2 reproduces 1 rank's losses, gradient norms and model.bin for 8 steps"
# Its mesh line says pipeline stages and nothing of tensor parallelism, which it does not use.
grep -q "^mesh: 2 rank(s) = dp 1 x pp 2 x tp 1$" "$dir/pp2.log" && grep -q "^pipeline: 2 stages" "$dir/pp2.log" ||
    { echo "FAILED: the mesh line of a pp 2 run"; cat "$dir/pp2.log"; exit 1; }
echo "ok a pp 2 run's log: the mesh without a word of tensor or sequence parallelism"
# Its checkpoint holds each element once, as the 1-rank one does: the last stage writes no copy of
# the tied embedding (nor its moments). That the checkpoint resumes exactly is shown below.
same_checkpoint_bytes "$dir/one/ckpt_00000004" "$dir/pp2/ckpt_00000004" "the pp 2 checkpoint against the 1-rank one"

# GPT-2's vocabulary: the tied embedding's gradient (50304 x 32 floats) outgrows the first stage's
# activation buffer, so its sum over the first and the last stage travels in pieces, as big as the
# smaller of the two stages' buffers.
"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" --vocab-size 50257 -x 3 -o "$dir/one_gpt2_vocab" >"$dir/one_v.log"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" --vocab-size 50257 -x 3 --pp 2 -o "$dir/pp2_gpt2_vocab" >"$dir/pp2_v.log"
same_curve "$dir/one_gpt2_vocab/metrics.jsonl" "$dir/pp2_gpt2_vocab/metrics.jsonl" "pp 2 with a 50257-token vocabulary"
echo "ok pp 2 with a 50257-token vocabulary: the tied embedding's gradient summed in pieces, 1 rank's curve"

# Resume step 4's checkpoint onto other splits: steps 5-8 must continue the uninterrupted run.
resume() {  # resume NP PP TP ZERO FROM [EXTRA...]
    local np=$1 pp=$2 tp=$3 zero=$4 from=$5 out="$dir/resume_$1_$2_$3_$4"
    shift 5
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 8 --pp "$pp" --tp "$tp" -z "$zero" -o "$out" "$@" \
        --resume-from "$dir/$from/ckpt_00000004" >"$out.log"
    check_resumed "$out.log" "$out/metrics.jsonl" "$dir/$from/metrics.jsonl" "$dir/$from/ckpt_00000004" 4 \
        "$from resumed as np $np pp $pp tp $tp ZeRO-$zero $*"
    echo "ok the $from checkpoint resumed as $np rank(s), pp $pp, tp $tp, ZeRO-$zero${*:+ $*} continues the uninterrupted run"
}
resume 1 1 1 0 pp2
resume 4 2 1 1 pp2
resume 4 2 2 3 pp2
resume 4 4 1 0 pp2
resume 4 2 1 2 pp2 --pp-schedule interleaved --pp-virtual 2
resume 2 2 1 0 one

# The local checkpoint tier on a pp 2 x tp 2 mesh (2 ranks per node): killed in step 6, node 1's
# directory lost, resumed from step 4's local checkpoint (its files from node 0's replicas), ZeRO-0
# (each rank restores its owned part and its data-parallel group shares them): the uninterrupted curve.
local_tier_kill_resume "pp 2 x tp 2" "$trainer" "${common[@]}" --pp 2 --tp 2 -z 0
# The same run continued on another mesh: the local files are not this mesh's pieces: skipped, named,
# and the run starts fresh.
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -x 1 --pp 4 -z 0 --ranks-per-node 2 --local-ckpt-every 4 \
    --local-ckpt-dir "$dir/local_killed" -o "$dir/local_killed.out" -y 1 >"$dir/local_other.log"
grep -q "skipping the local tier's ckpt_00000008: .*written at tp 2, pp 2 (layers 2,2) and this run is tp 1, pp 4" \
    "$dir/local_other.log" || { echo "FAILED: the local tier on another mesh"; cat "$dir/local_other.log"; exit 1; }
echo "ok the local tier on another mesh (pp 4): skipped with the reason, the run starts fresh"

# A NaN in the last stage's gradient (nan_grad@3:1 poisons the first element of its first bucket:
# its copy of the tied embedding, which the norm counts on the first stage) still skips step 3 on
# every rank, and the run goes on to a finite model.
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -x 6 --pp 2 --faults nan_grad@3:1 -v 3 -j "$shard" -o "$dir/nan" \
    >"$dir/nan.log" 2>&1 || { echo "FAILED: a NaN in a stage's copy"; cat "$dir/nan.log"; exit 1; }
grep -q "guard: step 3 update skipped: non-finite gradient norm" "$dir/nan.log" &&
    grep -q "val loss [0-9.]* (after 6 steps)" "$dir/nan.log" ||
    { echo "FAILED: a NaN in the last stage's copy of wte was not skipped"; cat "$dir/nan.log"; exit 1; }
echo "ok a NaN in the last stage's copy of the tied embedding: step 3 skipped on every rank, the run ends finite"

# A stage that dies mid-schedule (rank 1 killed in step 3): the others see it through the heartbeat
# or a timed-out message, report, and the launch ends non-zero well before mpirun's own timeout.
rc=0
start=$SECONDS
timeout 120 mpirun --oversubscribe -np 2 "$trainer" "${common[@]}" -x 8 --pp 2 --heartbeat-s 0.2 --peer-dead-s 2 \
    --comm-timeout-s 30 --faults kill@3:1 -o "$dir/dead" >"$dir/dead.log" 2>&1 || rc=$?
elapsed=$((SECONDS - start))
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -qiE "dead|did not join|rank 1" "$dir/dead.log" ||
    ! grep -q "^fault injection: rank 1 kills itself (SIGKILL) in step 3" "$dir/dead.log"; then
    echo "FAILED: a dead pipeline stage: exit code $rc after ${elapsed}s"; cat "$dir/dead.log"; exit 1
fi
echo "ok a pipeline stage killed in step 3: the launch ends with exit code $rc after ${elapsed}s: $(grep -m1 -iE "dead|did not join" "$dir/dead.log")"
