#!/usr/bin/env bash
# --prompt: a tiny model trained for 2 steps is prompted from an empty working directory. The run
# must print the prompt followed by a continuation, exit 0, write nothing (no output directory),
# print the same text again with the same --seed, and refuse without a BPE directory or tokenizer.
# It prints each token as it is drawn (a reader that stops after the first bytes ends a long
# generation early, by SIGPIPE), and refuses a -g beyond the model's context of 1024 tokens.
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
# The prompt is 6 tokens with the <|endoftext|> before it: at most 1018 can follow in 1024.
"$trainer" "${args[@]}" -g 1019 >"$dir/d.txt" 2>&1 && fail "-g beyond the model's context was accepted"
grep -qF -- "-g 1019 with --prompt: the model attends to 1024 tokens (its max_seq_len) and the prompt takes 6 of them" \
    "$dir/d.txt" && grep -qF "give -g 1018 or less" "$dir/d.txt" || { cat "$dir/d.txt"; fail "-g 1019: no clear refusal"; }
"$trainer" "${args[@]}" -g 1000000000 >"$dir/d.txt" 2>&1 && fail "-g 1000000000 was accepted"
# Streamed: the reader takes the device line, the prompt and a byte of the first token and goes; the
# trainer, 299 tokens (seconds) short of the end, dies writing the next one (SIGPIPE, exit 141),
# where one printing everything at the end would finish (exit 0: its 2 KB go in one write).
{ rc=0; "$trainer" "${args[@]}" -g 300 2>/dev/null || rc=$?; echo "exit $rc" >"$dir/streamed_rc"; } |
    { IFS= read -r device_line; head -c 23; } >"$dir/first.txt"
[ "$(cat "$dir/streamed_rc")" = "exit 141" ] && [ "$(head -c 22 "$dir/first.txt")" = "The meaning of life is" ] ||
    fail "--prompt did not print the tokens as they came: $(cat "$dir/streamed_rc") after head read '$(cat "$dir/first.txt")'"
echo "check_prompt.sh: --prompt continued the text, wrote nothing, repeated itself with the same seed: $(tail -1 "$dir/a.txt")"
