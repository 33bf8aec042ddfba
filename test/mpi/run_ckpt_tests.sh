#!/usr/bin/env bash
# Checkpoints end to end on the CPU trainer under mpirun (issue 10's tests). Every claim is checked
# against an uninterrupted reference run of the same configuration:
#   - kill -9 of the whole job at a random step, then -y 1: the final model file and every step's
#     loss are bitwise those of the reference (1, 2 and 4 ranks; ZeRO 0-3);
#   - a kill while a checkpoint is being written (the writer paused by LLMC_FAULTS=ckpt_pause@8): the
#     incomplete directory is skipped, the previous one used, the result still bitwise the same;
#   - a flipped byte or a truncated rank file: named, skipped, the previous one used, same result;
#   - resharding: resumed on another world size or ZeRO stage (4 -> 2, 2 -> 3, 1 -> 4, ZeRO-1 ->
#     ZeRO-3 and back), every later loss within 1e-5 relative of the reference;
#   - validation: a checkpoint's validation loss is the same resumed on 1, 2 or 4 ranks (bitwise),
#     at tp 2 or pp 2 (within fp32 rounding): -m counts windows of the whole run, not per rank;
#   - a failed write (LLMC_FAULTS=ckpt_fail@8:1 injects ENOSPC; and a real full tmpfs where mounting one
#     is allowed): error with path and reason, directory removed, earlier ones intact, training goes
#     on; with --ckpt-fail-stop 1 the run stops non-zero;
#   - refusals (another seed) and -y 1 with nothing to resume;
#   - the closing line says what was done: nothing left to train after a finished run's resume, no
#     validation under -v 0, the one step's throughput.
#   test/mpi/run_ckpt_tests.sh ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_ckpt_tests.sh: $trainer is not built" >&2; exit 1; }
train_glob='data/default/default_train_*.bin'
compgen -G "$train_glob" >/dev/null || { echo "run_ckpt_tests.sh: no $train_glob (make data)" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1  # ranks share the cores
mpirun=(timeout 300 mpirun --oversubscribe)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 24 steps of a 2-layer model; 12 windows per step, so 1, 2, 3 and 4 ranks all keep the same batch.
common=(-i "$train_glob" -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2 --max-seq-len 64
        -b 2 -t 32 -d 768 -x 24 -l 3e-3 -u 4 -v 0 -s 0 -n 4)

fail() { echo "FAILED: $*" >&2; exit 1; }
run() {  # run NP OUT_DIR [flags...]: the trainer on NP ranks, output in OUT_DIR, its log in OUT_DIR.log
    local np=$1 out=$2
    shift 2
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -o "$out" "$@" >"$out.log" 2>&1 ||
        { cat "$out.log"; fail "run of $np rank(s) into $out exited non-zero"; }
}
losses() {  # "step loss" per training step of a run's metrics.jsonl
    sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl"
}
same_run() {  # same_run REF OUT WHAT: bitwise equal final model and losses
    cmp -s "$1/model.bin" "$2/model.bin" || fail "$3: model.bin differs from the uninterrupted run"
    diff <(losses "$1") <(losses "$2") >/dev/null || fail "$3: losses differ from the uninterrupted run"
    [ "$(losses "$2" | wc -l)" = 24 ] || fail "$3: expected 24 steps in metrics.jsonl"
}
close_run() {  # close_run REF OUT FROM_STEP WHAT: losses after FROM_STEP within 1e-5 relative
    awk -v from="$3" -v what="$4" 'NR == FNR { ref[$1] = $2; next }
        $1 > from { n++; d = $2 - ref[$1]; if (d < 0) d = -d; r = d / (ref[$1] < 0 ? -ref[$1] : ref[$1]);
                    if (r > worst) worst = r }
        END { if (n != 24 - from || worst > 1e-5) { printf "FAILED: %s: %d steps, worst relative difference %g\n", what, n, worst; exit 1 }
              printf "   %d steps, worst relative difference %.2g\n", n, worst }' <(losses "$1") <(losses "$2")
}
# kill_at NP OUT STEP [flags...]: starts a run and kill -9s the whole job once STEP is logged.
kill_at() {
    local np=$1 out=$2 step=$3 pid waited=0
    shift 3
    setsid "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -o "$out" "$@" >"$out.log" 2>&1 &
    pid=$!
    until grep -q "\"step\":$step,.*train_loss" "$out/metrics.jsonl" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { cat "$out.log"; fail "the run into $out ended before step $step"; }
        sleep 0.02
        waited=$((waited + 1))
        [ $waited -lt 6000 ] || fail "step $step never came"
    done
    kill -9 -- "-$pid"
    wait "$pid" 2>/dev/null || true
    [ ! -e "$out/model.bin" ] || fail "the run into $out finished before the kill"
}
reference() {  # the uninterrupted run for NP ranks at ZeRO stage Z, every checkpoint kept: $dir/ref_NP_Z
    [ -e "$dir/ref_$1_$2/model.bin" ] || run "$1" "$dir/ref_$1_$2" -z "$2"
}

echo "== kill -9 at a random step, then -y 1: bitwise the uninterrupted run"
for case in "1 0" "2 0" "2 1" "2 2" "2 3" "4 1" "4 3"; do
    read -r np z <<<"$case"
    reference "$np" "$z"
    step=$((RANDOM % 14 + 5))
    out="$dir/kill_${np}_$z"
    kill_at "$np" "$out" "$step" -z "$z"
    run "$np" "$out" -z "$z" -y 1
    grep -q "resumed from $out/ckpt_" "$out.log" || fail "$out did not resume"
    same_run "$dir/ref_${np}_$z" "$out" "kill at step $step, $np rank(s), ZeRO-$z"
    echo "ok $np rank(s), ZeRO-$z: killed after step $step, $(grep -o 'resumed from [^:]*' "$out.log" | sed 's|.*/||'), bitwise equal"
done

echo "== a kill while a checkpoint is written: the incomplete one is skipped"
out="$dir/pause"
LLMC_FAULTS=ckpt_pause@8 kill_at 2 "$out" 10 -z 1
[ -d "$out/ckpt_00000008" ] && [ ! -e "$out/ckpt_00000008/COMPLETE" ] || fail "expected an incomplete ckpt_00000008"
run 2 "$out" -z 1 -y 1
grep -q "skipping $out/ckpt_00000008: no completion marker" "$out.log" || { cat "$out.log"; fail "ckpt_00000008 not reported"; }
grep -q "resumed from $out/ckpt_00000004" "$out.log" || fail "did not resume from ckpt_00000004"
same_run "$dir/ref_2_1" "$out" "kill during a checkpoint write"
echo "ok killed while ckpt_00000008 was written: skipped, resumed from ckpt_00000004, bitwise equal"

echo "== damaged files are named and skipped"
for damage in flip truncate; do
    out="$dir/damage_$damage"
    mkdir -p "$out"
    cp -r "$dir/ref_2_1/ckpt_00000016" "$dir/ref_2_1/ckpt_00000020" "$out/"
    f="$out/ckpt_00000020/rank_00001.bin"
    if [ $damage = flip ]; then
        printf '\x5a' | dd of="$f" bs=1 seek=1000 conv=notrunc status=none
        expected="rank_00001.bin' has CRC32C"
    else
        truncate -s -100 "$f"
        expected="rank_00001.bin' has [0-9]* bytes; the manifest expects"
    fi
    run 2 "$out" -z 1 -y 1
    grep -q "skipping $out/ckpt_00000020: .*$expected" "$out.log" || { cat "$out.log"; fail "$damage not reported"; }
    grep -q "resumed from $out/ckpt_00000016" "$out.log" || fail "$damage: did not resume from ckpt_00000016"
    cmp -s "$dir/ref_2_1/model.bin" "$out/model.bin" || fail "$damage: model differs"
    echo "ok $damage: $(grep -o "skipping.*" "$out.log" | sed "s|$out/||g")"
done

echo "== resharding: another world size or ZeRO stage, within 1e-5"
for case in "4 1 2 1" "2 1 3 1" "1 0 4 0" "4 1 4 3" "4 3 2 1"; do
    read -r from_np from_z np z <<<"$case"
    reference "$from_np" "$from_z"
    out="$dir/reshard_${from_np}_${from_z}_${np}_$z"
    mkdir -p "$out"
    cp -r "$dir/ref_${from_np}_${from_z}/ckpt_00000012" "$out/"
    echo "-- $from_np rank(s) ZeRO-$from_z -> $np rank(s) ZeRO-$z"
    run "$np" "$out" -z "$z" -y 1
    grep -q "resumed from $out/ckpt_00000012: step 12, written by $from_np rank(s) (pp 1, tp 1) at ZeRO-$from_z" "$out.log" ||
        { cat "$out.log"; fail "did not resume from ckpt_00000012"; }
    close_run "$dir/ref_${from_np}_${from_z}" "$out" 12 "$from_np/ZeRO-$from_z -> $np/ZeRO-$z"
done

echo "== validation: the same windows on any mesh, so a resume elsewhere reports the same loss"
# ckpt_00000012 of the 4-rank run resumed with -x 12: nothing left to train, one validation of its
# weights (-m 5 windows: not a multiple of 2 or 4 ranks). Data parallelism gives the same bits; tensor
# and pipeline parallelism the same loss to fp32 rounding.
val_loss() { sed -nE 's/.*"step":12,.*"val_loss":([-0-9.e+]+).*/\1/p' "$1/metrics.jsonl"; }
reference 4 1
for mesh in "1 1 1 0" "2 1 1 1" "4 1 1 3" "2 2 1 0" "2 1 2 0"; do
    read -r np tp pp z <<<"$mesh"
    out="$dir/val_${np}_${tp}_${pp}_$z"
    run "$np" "$out" -x 12 -n 0 -v 12 -m 5 -j 'data/default/default_val_*.bin' --tp "$tp" --pp "$pp" -z "$z" \
        --resume-from "$dir/ref_4_1/ckpt_00000012"
    [ -n "$(val_loss "$out")" ] || { cat "$out.log"; fail "$np rank(s), tp $tp, pp $pp: no validation after step 12"; }
    echo "   $np rank(s), tp $tp, pp $pp, ZeRO-$z: val loss $(val_loss "$out")"
done
for out in "$dir/val_2_1_1_1" "$dir/val_4_1_1_3"; do
    [ "$(val_loss "$out")" = "$(val_loss "$dir/val_1_1_1_0")" ] || fail "data parallelism changed the validation loss ($out)"
done
for out in "$dir/val_2_2_1_0" "$dir/val_2_1_2_0"; do
    awk -v a="$(val_loss "$out")" -v b="$(val_loss "$dir/val_1_1_1_0")" \
        'BEGIN { d = a - b; exit !((d < 0 ? -d : d) <= 1e-5 * b) }' || fail "$out: val loss beyond fp32 rounding of 1 rank's"
done
echo "ok the validation loss of ckpt_00000012: bitwise the same on 1, 2 and 4 ranks, within 1e-5 at tp 2 and pp 2"
# Nothing was left to train: the closing line says so, and names no training loss or throughput.
grep -qE "^done: resumed at step 12 \| nothing left to train \| val loss [0-9.]+ \(step 12\) \| model saved to" \
    "$dir/val_1_1_1_0.log" || { cat "$dir/val_1_1_1_0.log"; fail "the closing line of a resumed finished run"; }
echo "ok $(grep '^done:' "$dir/val_1_1_1_0.log" | sed "s|$dir/||")"

echo "== the local tier: a node loses its storage, its files come back from the buddy node's replicas"
out="$dir/local"
rc=0
LLMC_FAULTS=kill@11:2 "${mpirun[@]}" -np 4 "$trainer" "${common[@]}" -z 1 -n 8 -o "$out" --local-ckpt-every 2 \
    --local-ckpt-dir "$out.local" --ranks-per-node 2 >"$out.log" 2>&1 || rc=$?
[ $rc != 0 ] && [ ! -e "$out/model.bin" ] && grep -q "^fault injection: rank 2 kills itself (SIGKILL) in step 11" "$out.log" ||
    { cat "$out.log"; fail "the run with kill@11:2 was not killed by it"; }
local_root="$out.local/run_$(sed 's/.*"run_id":"\([^"]*\)".*/\1/' "$out/run.json")"  # one directory per run
[ -e "$local_root/node_00001/ckpt_00000008/COMPLETE" ] || fail "no local checkpoint of step 8 on node 1"
rm -rf "$local_root/node_00001"  # node 1's storage is gone (replaced hardware)
run 4 "$out" -z 1 -n 8 --local-ckpt-every 2 --local-ckpt-dir "$out.local" --ranks-per-node 2 -y 1
grep -q "resumed from $local_root/node_00000/ckpt_000000[01][0-9] (local tier)" "$out.log" || { cat "$out.log"; fail "did not resume from the local tier"; }
grep -q "rank 2 recovered its local checkpoint file from rank 0's replica" "$out.log" || fail "rank 2 did not recover from its buddy"
same_run "$dir/ref_4_1" "$out" "local tier after losing node 1"
echo "ok killed at step 11, node 1's directory deleted: $(grep -o 'resumed from [^:]*' "$out.log" | sed "s|$dir/||"), node 1 recovered from node 0's replicas, bitwise equal"

echo "== failed writes: reported, removed, training goes on (or stops with --ckpt-fail-stop 1)"
out="$dir/enospc"
LLMC_FAULTS=ckpt_fail@8:1 run 2 "$out" -z 2
grep -q "error: checkpoint $out/ckpt_00000008 failed: rank 1: cannot write '$out/ckpt_00000008/rank_00001.bin.tmp': No space left on device" "$out.log" ||
    { cat "$out.log"; fail "the injected write error was not reported with its path and reason"; }
[ ! -e "$out/ckpt_00000008" ] || fail "the failed checkpoint directory was left behind"
[ -e "$out/ckpt_00000004/COMPLETE" ] && [ -e "$out/ckpt_00000024/COMPLETE" ] || fail "expected ckpt 4 and 24 complete"
cmp -s "$dir/ref_2_2/model.bin" "$out/model.bin" 2>/dev/null || { reference 2 2; cmp -s "$dir/ref_2_2/model.bin" "$out/model.bin"; } ||
    fail "training after a failed checkpoint differs"
echo "ok injected ENOSPC on rank 1 at step 8: reported, removed, ckpt 4 intact, training finished the same"
rc=0
LLMC_FAULTS=ckpt_fail@8:1 "${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -o "$dir/stop" --ckpt-fail-stop 1 >"$dir/stop.log" 2>&1 || rc=$?
[ $rc = 7 ] && grep -q "failed and --ckpt-fail-stop is set" "$dir/stop.log" ||
    { cat "$dir/stop.log"; fail "--ckpt-fail-stop 1 did not stop the run with exit code 7 (got $rc)"; }
echo "ok --ckpt-fail-stop 1: exit code $rc (EXIT_CKPT_FAILED)"
small="$dir/small"
mkdir -p "$small"
if mount -t tmpfs -o size=64k tmpfs "$small" 2>/dev/null; then
    rc=0
    "${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -o "$small/out" -x 8 >"$dir/small.log" 2>&1 || rc=$?
    ls -R "$small" >"$dir/small.ls"
    umount "$small"
    grep -q "rank_0000[01].bin.tmp': No space left on device" "$dir/small.log" || { cat "$dir/small.log"; fail "a full tmpfs was not reported"; }
    ! grep -q ckpt_ "$dir/small.ls" || fail "a partial checkpoint was left on the full tmpfs"
    # Every step runs (only the final model.bin cannot be saved): a metrics.jsonl append that meets
    # the disk full while a checkpoint fills it is warned about, not fatal.
    grep -q "^step 8/8" "$dir/small.log" || { cat "$dir/small.log"; fail "training stopped on the full tmpfs"; }
    echo "ok a real full filesystem (64 KiB tmpfs): $(grep -m1 -o 'cannot write.*' "$dir/small.log" | sed "s|$small/||")"
else
    echo "skip a real full filesystem: mounting a tmpfs is not allowed here (the injected error above covers it)"
fi

echo "== refusals and fresh starts"
rc=0
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -o "$dir/ref_2_1" -y 1 --seed 5 >"$dir/seed.log" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "its seed is 1337 but this run's is 5" "$dir/seed.log" ||
    { cat "$dir/seed.log"; fail "another seed was not refused with exit code 1, a configuration error (got $rc)"; }
echo "ok another seed: $(grep -m1 -o 'cannot resume.*' "$dir/seed.log" | sed "s|$dir/||")"
run 1 "$dir/fresh" -y 1 -x 1
grep -q "no complete checkpoint in '$dir/fresh'; starting fresh" "$dir/fresh.log" || fail "-y 1 without checkpoints did not say it starts fresh"
echo "ok -y 1 with no checkpoint starts fresh and says so"
# One step without validation (-v 0): the closing line has that step's throughput and no validation.
grep -qE "^done: train loss [0-9.]+ \| [1-9][0-9]* tok/s mean \| model saved to" "$dir/fresh.log" ||
    { cat "$dir/fresh.log"; fail "the closing line of a one-step run without validation"; }
echo "ok $(grep '^done:' "$dir/fresh.log" | sed "s|$dir/||")"

echo "== model files: llm.c's bf16 (version 5) written with --model-dtype bf16 and read back with -e"
run 1 "$dir/bf16" -x 2 -n 0 --model-dtype bf16
version=$(od -An -t d4 -j 4 -N 4 "$dir/bf16/model.bin" | tr -d ' ')
[ "$version" = 5 ] || fail "--model-dtype bf16 wrote a version $version model file"
"$trainer" -i "$train_glob" -j "" --tokenizer "" -e "$dir/bf16/model.bin" -b 2 -t 32 -x 1 -v 0 -s 0 -o "$dir/from_bf16" >"$dir/from_bf16.log" 2>&1 ||
    { cat "$dir/from_bf16.log"; fail "-e of a bf16 model file"; }
rc=0
"$trainer" "${common[@]}" -o "$dir/bad" --model-dtype f16 >"$dir/bad.log" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "model-dtype must be fp32 or bf16, got 'f16'" "$dir/bad.log" || fail "--model-dtype f16 was not refused"
echo "ok bf16 model.bin (version $version) written, and a run starts from it"
