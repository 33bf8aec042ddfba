#!/usr/bin/env bash
# The preset run scripts (scripts/run_*.sh) without a GPU: each runs with PLAN=1 and the CPU trainer
# standing in for train_gpt (same flags, same planner), so every preset's flags are parsed and its
# batch arithmetic resolved for 1 and 8 ranks. Each must print a memory plan and exit 0; its command
# must keep checkpoints (-n) and resume (-y 1); extra flags must reach the trainer after the preset's
# (so they override it); a bad extra flag or a bad rank count must make the script exit non-zero.
#   test/check_scripts.sh [TRAINER]   (default ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "check_scripts.sh: $trainer is not built" >&2; exit 1; }
export PLAN=1 TRAIN_GPT=$trainer
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() {
    echo "FAIL $*"
    sed 's/^/    /' "$out"
    exit 1
}

scripts=(scripts/run_*.sh)
[ ${#scripts[@]} -ge 5 ] || { echo "FAIL expected 5 or more scripts/run_*.sh, found ${#scripts[@]}"; exit 1; }
for s in "${scripts[@]}"; do
    [ -x "$s" ] || { echo "FAIL $s is not executable"; exit 1; }
    for ranks in 1 8; do
        "$s" "$ranks" >"$out" 2>&1 || fail "$s $ranks exited with $?"
        grep -q "^memory plan per rank: .* $ranks rank(s)" "$out" || fail "$s $ranks printed no memory plan for $ranks rank(s)"
        grep -q "^command: .* -n [1-9]" "$out" || fail "$s $ranks: its command writes no checkpoints (-n)"
        grep -q "^command: .* -y 1" "$out" || fail "$s $ranks: its command does not resume (-y 1)"
    done
    # extra flags come last, so they win: B 2 x T 64 whatever the preset says
    "$s" 2 -b 2 -t 64 -d 0 >"$out" 2>&1 || fail "$s 2 -b 2 -t 64 -d 0 exited with $?"
    grep -q "^memory plan per rank: .* B 2 x T 64, 1 accumulation step(s), 2 rank(s)" "$out" ||
        fail "$s: extra flags -b 2 -t 64 -d 0 did not override the preset's"
    if "$s" 1 --no-such-flag 1 >"$out" 2>&1; then fail "$s 1 --no-such-flag 1 exited 0"; fi
    grep -q "unknown flag '--no-such-flag'" "$out" || fail "$s 1 --no-such-flag 1: no message naming the flag"
    if "$s" zero >"$out" 2>&1; then fail "$s zero (not a rank count) exited 0"; fi
    echo "ok $s: plans for 1 and 8 ranks, extra flags override, a bad flag or rank count fails"
done
