#!/usr/bin/env bash
# An output directory belongs to one run (llmc/ckpt/output_dir.h), end to end on the CPU trainer:
#   - a fresh run into a directory holding another run's checkpoints is refused and changes nothing;
#     -y 1 continues the directory's own run; --overwrite 1 deletes the old checkpoints first;
#   - --resume-from a directory that does not exist is an error (not a fresh start);
#   - --resume-from another run's checkpoint into a directory of a third run is refused, into an empty
#     directory it continues that run (same run id);
#   - a checkpoint whose directory name disagrees with its marker and manifest is skipped, with why;
#   - a directory locked by another process is refused, naming it;
#   - two runs sharing --local-ckpt-dir keep their local checkpoints apart (run_<id>/node_00000);
#   - -y 1 on 2 ranks continues a 1-rank run of 4 windows per step without -d: it keeps the run's
#     total batch (the example in docs/checkpoints.md).
#   test/check_output_dir.sh [TRAINER]   (default ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=$(realpath "${1:-./train_gpt_cpu}")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
unset LLMC_FAULTS
fail() { echo "FAIL check_output_dir.sh: $*"; exit 1; }

tiny=(-j "" --tokenizer "" --num-layers 1 --channels 32 --num-heads 2 -b 2 -t 32 -v 0 -s 0 -n 2)
# ok NAME ARGS...: a run that must succeed; its log is $dir/NAME.log.
ok() {
    local name=$1
    shift
    "$trainer" "${tiny[@]}" "$@" >"$dir/$name.log" 2>&1 || { cat "$dir/$name.log"; fail "$name: exit $?"; }
}
# refused NAME MESSAGE OUT ARGS...: a run into OUT that must fail naming MESSAGE and leave OUT as it was.
refused() {
    local name=$1 message=$2 out=$3 before rc=0
    shift 3
    before=$(cd "$out" && find . -printf '%p %s %T@\n' | sort && cat run.json)
    "$trainer" "${tiny[@]}" -o "$out" "$@" >"$dir/$name.log" 2>&1 || rc=$?
    [ "$rc" != 0 ] || { cat "$dir/$name.log"; fail "$name: exit 0 (expected a refusal naming '$message')"; }
    grep -qF -- "$message" "$dir/$name.log" || { cat "$dir/$name.log"; fail "$name: the message does not name '$message'"; }
    [ "$before" = "$(cd "$out" && find . -printf '%p %s %T@\n' | sort && cat run.json)" ] ||
        fail "$name: the output directory was changed"
}
run_id() { sed 's/.*"run_id":"\([^"]*\)".*/\1/' "$1/run.json"; }
manifest_run_id() { grep -o '"run_id": *"[^"]*"' "$1/manifest.json" | sed 's/.*"\([^"]*\)"$/\1/'; }

ok first -x 4 -o "$dir/out"
first=$(run_id "$dir/out")
[ -n "$first" ] && [ "$(manifest_run_id "$dir/out/ckpt_00000004")" = "$first" ] || fail "no run id in run.json and the manifest"
refused fresh "holds another run's checkpoints" "$dir/out" -x 4
ok continue -x 6 -y 1 -o "$dir/out"
grep -q "resumed from $dir/out/ckpt_00000004" "$dir/continue.log" || { cat "$dir/continue.log"; fail "-y 1 did not continue"; }
[ "$(run_id "$dir/out")" = "$first" ] && [ "$(manifest_run_id "$dir/out/ckpt_00000006")" = "$first" ] ||
    fail "-y 1 changed the run id"
echo "ok a fresh run into another run's directory is refused; -y 1 continues run $first"

refused typo "no such checkpoint directory" "$dir/out" -x 6 --resume-from "$dir/out/ckpt_00000099"
echo "ok --resume-from a directory that does not exist: $(grep -o "resume-from.*" "$dir/typo.log" | head -1)"

ok other -x 4 -o "$dir/other"
refused foreign "holds another run's checkpoints" "$dir/out" -x 6 --resume-from "$dir/other/ckpt_00000002"
ok adopt -x 4 -o "$dir/empty" --resume-from "$dir/other/ckpt_00000002"
[ "$(run_id "$dir/empty")" = "$(run_id "$dir/other")" ] || fail "--resume-from into an empty directory took another run id"
echo "ok --resume-from another run's checkpoint: refused into a third run's directory, continued into an empty one"

cp -r "$dir/out" "$dir/renamed"
cp -r "$dir/renamed/ckpt_00000004" "$dir/renamed/ckpt_00000008"
ok renamed -x 8 -y 1 -o "$dir/renamed"
grep -q "skipping $dir/renamed/ckpt_00000008: .* is named for step 8, but its marker says step 4" "$dir/renamed.log" ||
    { cat "$dir/renamed.log"; fail "ckpt_00000008 holding step 4 was not skipped"; }
grep -q "resumed from $dir/renamed/ckpt_00000006" "$dir/renamed.log" || fail "did not resume from ckpt_00000006"
echo "ok a directory named ckpt_00000008 holding step 4: skipped, resumed from ckpt_00000006"

ok overwrite -x 2 -o "$dir/out" --overwrite 1
grep -q "removed 3 checkpoint(s), ckpt_00000002 ... ckpt_00000006, of run $first" "$dir/overwrite.log" ||
    { cat "$dir/overwrite.log"; fail "--overwrite 1 did not say what it removed"; }
[ "$(run_id "$dir/out")" != "$first" ] && [ ! -e "$dir/out/ckpt_00000006" ] || fail "--overwrite 1 kept the old run"
echo "ok --overwrite 1: the old run's 3 checkpoints removed, a new run id"

rc=0
flock "$dir/out/.lock" "$trainer" "${tiny[@]}" -x 4 -y 1 -o "$dir/out" >"$dir/locked.log" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "output directory '$dir/out' is in use by another run" "$dir/locked.log" ||
    { cat "$dir/locked.log"; fail "a locked output directory was used"; }
echo "ok a locked output directory is refused"

ok local_a -x 2 -o "$dir/la" --local-ckpt-every 2 --local-ckpt-dir "$dir/local"
ok local_b -x 2 -o "$dir/lb" --local-ckpt-every 2 --local-ckpt-dir "$dir/local"
for out in la lb; do
    [ -e "$dir/local/run_$(run_id "$dir/$out")/node_00000/ckpt_00000002/COMPLETE" ] ||
        fail "no local checkpoint under $dir/local/run_<$out's run id>/: $(ls "$dir/local")"
done
echo "ok two runs sharing --local-ckpt-dir: $(ls "$dir/local" | tr '\n' ' ')"
if command -v mpirun >/dev/null; then
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
    ok ranks1 -x 4 -d 256 -o "$dir/ranks"
    timeout 120 mpirun --oversubscribe -np 2 "$trainer" "${tiny[@]}" -x 6 -y 1 -o "$dir/ranks" >"$dir/ranks2.log" 2>&1 ||
        { cat "$dir/ranks2.log"; fail "-y 1 on 2 ranks failed"; }
    grep -q "resume: -d 256 (total_batch_tokens) from '$dir/ranks/config.json'" "$dir/ranks2.log" &&
        grep -q "resumed from $dir/ranks/ckpt_00000004" "$dir/ranks2.log" || { cat "$dir/ranks2.log"; fail "no resume on 2 ranks"; }
    echo "ok a 1-rank run (-d 256, 4 windows) continued on 2 ranks without -d: its total batch kept"
fi
echo "check_output_dir.sh: passed"
