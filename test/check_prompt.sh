#!/usr/bin/env bash
# --prompt: a tiny model trained for 2 steps is prompted from an empty working directory. The run
# must print the prompt followed by a continuation, exit 0, write nothing (no output directory),
# print the same text again with the same --seed, and refuse without a BPE directory or tokenizer.
#   test/check_prompt.sh [TRAINER]   (default ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
trainer=$(realpath "${1:-./train_gpt_cpu}")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL check_prompt.sh: $*"; exit 1; }

"$trainer" --num-layers 1 --channels 32 --num-heads 2 -b 2 -t 32 -x 2 -v 0 -s 0 -o "$dir/train" >"$dir/train.log" 2>&1 ||
    { cat "$dir/train.log"; fail "the training run failed"; }
mkdir "$dir/cwd"
cd "$dir/cwd"
args=(-e "$dir/train/model.bin" --prompt "The meaning of life is" -g 12 --bpe-dir "$root/data/gpt2_bpe"
      --tokenizer "$root/data/gpt2_tokenizer.bin")
"$trainer" "${args[@]}" >"$dir/a.txt" 2>&1 || { cat "$dir/a.txt"; fail "--prompt exited with $?"; }
grep -q '^The meaning of life is.' "$dir/a.txt" || { cat "$dir/a.txt"; fail "the output does not continue the prompt"; }
[ -z "$(ls -A "$dir/cwd")" ] || fail "--prompt wrote into the working directory: $(ls -A "$dir/cwd")"
"$trainer" "${args[@]}" >"$dir/b.txt" 2>&1
cmp -s "$dir/a.txt" "$dir/b.txt" || fail "the same seed printed different text"
"$trainer" "${args[@]}" --bpe-dir "$dir/none" >"$dir/c.txt" 2>&1 && fail "a missing BPE directory was accepted"
grep -q "encoder.json" "$dir/c.txt" || { cat "$dir/c.txt"; fail "the error does not name encoder.json"; }
# An empty prompt (an unset shell variable) samples from <|endoftext|> alone: it never trains nor writes.
before=$(md5sum "$dir/train/model.bin")
"$trainer" "${args[@]}" --prompt "" -o "$dir/train" >"$dir/e.txt" 2>&1 || { cat "$dir/e.txt"; fail "--prompt \"\" exited with $?"; }
[ "$before" = "$(md5sum "$dir/train/model.bin")" ] && [ -z "$(ls -A "$dir/cwd")" ] || fail "--prompt \"\" trained or wrote"
! grep -q "^step " "$dir/e.txt" || fail "--prompt \"\" trained"
echo "check_prompt.sh: --prompt continued the text, wrote nothing, repeated itself with the same seed: $(tail -1 "$dir/a.txt")"
