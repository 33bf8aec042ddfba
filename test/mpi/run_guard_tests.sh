#!/usr/bin/env bash
# Numerical guards and silent-data-corruption checks end to end on the CPU trainer under mpirun
# (issue 11, parts 1 and 5), with faults injected by --faults (llmc/failures/faults.h):
#   - nan_grad@5:1 (a NaN in rank 1's gradient after the ZeRO-0 all-reduce, so only rank 1's local
#     norm is NaN): step 5 is skipped on every rank and logged with its data position; steps 1-5
#     have the losses of an uninterrupted run; the state after step 5 is bitwise the state after
#     step 4 (every rank's checkpoint file, AdamW moments included) where the uninterrupted run's
#     differs; the run goes on finite; the same NaN on rank 0 instead gives the very same run;
#   - NaNs at steps 6, 7, 8 with --max-skips 3: rollback to the step-4 checkpoint, the data loader
#     kept where it was (step 5 is run again on other batches), the run finishes, and metrics.jsonl
#     reads as one curve (the abandoned steps marked superseded, for plot_metrics.py too); with no
#     checkpoint the run stops with EXIT_DIVERGED (5);
#   - flip_bit@5:1 on 3 ZeRO-0 replicas with --fingerprint-every 2: rank 1 named after step 6,
#     replay from the step-4 checkpoint, classified transient, and the final model and the curve
#     (read as one) those of an uninterrupted run; the flip listed twice (so it strikes the replay too): rank 1 reported
#     faulty, EXIT_CORRUPTION (6); with no checkpoint: EXIT_CORRUPTION at once.
#   test/mpi/run_guard_tests.sh ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_guard_tests.sh: $trainer is not built" >&2; exit 1; }
train_glob='data/default/default_train_*.bin'
compgen -G "$train_glob" >/dev/null || { echo "run_guard_tests.sh: no $train_glob (make data)" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"
unset LLMC_FAULTS
mpirun=(timeout 120 mpirun --oversubscribe)  # short runs: a hang fails sooner

# 10 steps of a 2-layer model; 12 windows per step, so 2 and 3 ranks keep the same batch.
common=(-i "$train_glob" -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2 --max-seq-len 64
        -b 2 -t 32 -d 768 -x 10 -l 3e-3 -u 4 -v 0 -s 0)

fail() { echo "FAILED: $*" >&2; exit 1; }
run() {  # run NP OUT EXPECTED_RC [flags...]: the trainer on NP ranks, its log in OUT.log
    local np=$1 out=$2 want=$3 rc=0
    shift 3
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -o "$out" "$@" >"$out.log" 2>&1 || rc=$?
    [ "$rc" = "$want" ] || { cat "$out.log"; fail "run of $np rank(s) into $out exited $rc, expected $want"; }
}
losses() {  # "step loss" per training step of a run's metrics.jsonl
    sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl"
}
has() {  # has FILE PATTERN WHAT
    grep -qE "$2" "$1" || { cat "$1"; fail "$3: no line matching '$2' in $1"; }
}
rank_files() {  # rank_files RUN STEP: the rank files of that checkpoint
    echo "$1/ckpt_$(printf %08d "$2")"/rank_*.bin
}
one_curve() {  # one_curve RUN WHAT: the records not superseded, and plot_metrics.py, read steps 1-10 once each
    local kept plotted
    kept=$(grep '"train_loss"' "$1/metrics.jsonl" | grep -v '"superseded"' | sed -E 's/.*"step":([0-9]+),.*/\1/' | xargs)
    plotted=$(/usr/bin/python3 -c 'import sys; sys.path.insert(0, "dev"); import plot_metrics
print(*(r["step"] for r in plot_metrics.read_run(sys.argv[1])[0]))' "$1/metrics.jsonl")
    [ "$kept" = "$(seq -s ' ' 1 10)" ] && [ "$plotted" = "$kept" ] ||
        { cat "$1/metrics.jsonl"; fail "$2: the steps read as '$kept' (plot_metrics.py: '$plotted'), expected 1-10 once each"; }
}
same_state() {  # same_state RUN STEP_A STEP_B: whether every rank file of the two checkpoints is equal
    local a b
    for a in $(rank_files "$1" "$2"); do
        b="$1/ckpt_$(printf %08d "$3")/$(basename "$a")"
        cmp -s "$a" "$b" || return 1
    done
}

echo "== NaN gradient on one rank: that step skipped everywhere, the run otherwise unchanged"
run 2 "$dir/ref" 0 -n 1
run 2 "$dir/nan1" 0 -n 1 --faults nan_grad@5:1
has "$dir/nan1.log" '^guard: step 5 update skipped: non-finite gradient norm .*data position epoch 0 shard 0 round 4 batch 0; 1 skipped so far, 1 in a row' \
    "skip logged with step and data position"
has "$dir/nan1.log" '^step +5/10 .*update SKIPPED' "skipped step line"
has "$dir/nan1/metrics.jsonl" '"event":"skip".*"step":5|"step":5.*"event":"skip"' "skip record in metrics.jsonl"
[ "$(grep -c 'update skipped' "$dir/nan1.log")" = 1 ] || fail "expected exactly one skipped step"
diff <(losses "$dir/ref" | head -5) <(losses "$dir/nan1" | head -5) >/dev/null ||
    fail "steps 1-5 losses differ from the uninterrupted run"
[ "$(losses "$dir/nan1" | wc -l)" = 10 ] || fail "expected 10 finite losses (steps 6-10 too)"
same_state "$dir/nan1" 4 5 || fail "the state after the skipped step 5 differs from the state after step 4 (an update ran)"
same_state "$dir/ref" 4 5 && fail "sanity: the uninterrupted run's state after step 5 equals that after step 4"
same_state "$dir/nan1" 5 6 && fail "the update of step 6 did not run"
run 2 "$dir/nan0" 0 --faults nan_grad@5:0
cmp -s "$dir/nan0/model.bin" "$dir/nan1/model.bin" || fail "a NaN on rank 0 instead of rank 1 gave another model"
diff <(losses "$dir/nan0") <(losses "$dir/nan1") >/dev/null || fail "a NaN on rank 0 instead of rank 1 gave other losses"
echo "   step 5 skipped on both ranks; steps 1-5 as the uninterrupted run; state after 5 == after 4"

echo "== K NaNs in a row: rollback to the newest checkpoint, data loader kept, training goes on"
run 2 "$dir/roll" 0 -z 1 -n 4 --max-skips 3 --faults nan_grad@6:1,nan_grad@7:1,nan_grad@8:1
for s in 6 7 8; do has "$dir/roll.log" "^guard: step $s update skipped" "skip of step $s"; done
has "$dir/roll.log" '^rollback: 3 updates skipped in a row \(steps 6-8\); rolled back from step 8 to .*/ckpt_00000004 \(step 4\); data position kept.*round 8 batch 0' \
    "rollback logged"
has "$dir/roll/metrics.jsonl" '"event":"rollback"' "rollback record"
# Step 5 ran twice: after the rollback on the batches after step 8's, so with another loss.
[ "$(losses "$dir/roll" | awk '$1 == 5' | sort -u | wc -l)" = 2 ] || fail "step 5 after the rollback read the same batches"
[ "$(losses "$dir/roll" | tail -1 | cut -d' ' -f1)" = 10 ] || fail "the run did not finish its 10 steps after the rollback"
# The abandoned steps 5-8 stay in metrics.jsonl, marked superseded; the skip events stay as they are.
[ "$(grep '"train_loss"' "$dir/roll/metrics.jsonl" | grep -c '"superseded":true')" = 4 ] || fail "expected steps 5-8 superseded"
[ "$(grep '"event":"skip"' "$dir/roll/metrics.jsonl" | grep -vc '"superseded"')" = 3 ] || fail "expected 3 skip events kept"
one_curve "$dir/roll" "after the rollback"
echo "   rolled back to step 4 with the data position kept; finished; metrics.jsonl reads as one curve"
run 2 "$dir/diverged" 5 --max-skips 3 --faults nan_grad@3:1,nan_grad@4:1,nan_grad@5:1
has "$dir/diverged.log" 'training diverged: 3 updates skipped in a row \(steps 3-5\) and there is no checkpoint' \
    "no checkpoint: diverged"
echo "   without a checkpoint: exit 5 (EXIT_DIVERGED)"

echo "== flipped parameter bit on one replica: named, replayed, transient"
run 3 "$dir/ref3" 0 -n 4
run 3 "$dir/flip" 0 -n 4 --fingerprint-every 2 --faults flip_bit@5:1
has "$dir/flip.log" '^fingerprint MISMATCH after step 6: rank\(s\) 1 diverge from their replicas' "rank 1 named"
has "$dir/flip.log" '^rollback: replicas diverged after step 6 .*ckpt_00000004 \(step 4\); data position restored' "replay"
has "$dir/flip.log" '^fingerprint: replayed to step 6 and the replicas agree: the divergence of rank\(s\) 1 at step 6 was transient' \
    "transient"
cmp -s "$dir/ref3/model.bin" "$dir/flip/model.bin" || fail "after the replay the final model differs from the uninterrupted run"
one_curve "$dir/flip" "after the replay"
diff <(curve "$dir/ref3/metrics.jsonl" | cut -d' ' -f1,2) <(curve "$dir/flip/metrics.jsonl" | cut -d' ' -f1,2) >/dev/null ||
    fail "after the replay the curve differs from the uninterrupted run's"
echo "   rank 1 named after step 6 (flip after step 5), replayed, transient; final model and curve those of the uninterrupted run"
run 3 "$dir/faulty" 6 -n 4 --fingerprint-every 2 --faults flip_bit@5:1,flip_bit@5:1
has "$dir/faulty.log" 'silent data corruption: rank\(s\) 1 diverged from their replicas at step 6 and again at step 6 of the replay: faulty' \
    "persistent"
echo "   the same flip in the replay: rank 1 reported faulty, exit 6 (EXIT_CORRUPTION)"
run 3 "$dir/nockpt" 6 --fingerprint-every 2 --faults flip_bit@5:1
has "$dir/nockpt.log" 'rank\(s\) 1 diverged from their replicas at step 6 and there is no checkpoint' "no checkpoint"
echo "   without a checkpoint: exit 6 at once"

echo "== checkpoints written after the last verified fingerprint"
run 3 "$dir/keep_verified" 0 -n 2 -nk 1 --fingerprint-every 4 --faults flip_bit@6:1
has "$dir/keep_verified.log" '^rollback: replicas diverged after step 8 .*ckpt_00000004 \(step 4\)' \
    "-nk 1 kept the newest verified checkpoint"
cmp -s "$dir/ref3/model.bin" "$dir/keep_verified/model.bin" || fail "after the replay the final model differs"
echo "   -nk 1 with fingerprints every 4 steps: ckpt 4 (verified) kept beside ckpt 6; the flip after step 6 replayed from it"
run 3 "$dir/unverified" 6 -n 2 --fingerprint-every 4 --faults flip_bit@1:1
has "$dir/unverified.log" 'removed 1 checkpoint directory written after step 0' "unverified checkpoint removed"
[ ! -e "$dir/unverified/ckpt_00000002" ] || fail "ckpt_00000002, written after the flip, was kept"
run 3 "$dir/unverified" 0 -n 2 --fingerprint-every 4 -y 1
! grep -q "resumed from" "$dir/unverified.log" || fail "-y 1 resumed from a checkpoint written after the corruption"
cmp -s "$dir/ref3/model.bin" "$dir/unverified/model.bin" || fail "the fresh start after exit 6 differs from the uninterrupted run"
echo "   no verified checkpoint: exit 6 removes ckpt 2 (written after the flip); -y 1 starts afresh, the uninterrupted model"
echo "guard tests passed"
