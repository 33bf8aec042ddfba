#!/usr/bin/env bash
# The preset run scripts (scripts/run_*.sh) without a GPU: each runs with PLAN=1 and the CPU trainer
# standing in for train_gpt (same flags, same planner), so every preset's flags are parsed and its
# batch arithmetic resolved for 1 and 8 ranks. Each must print a memory plan and exit 0; its command
# must keep checkpoints (-n) and resume (-y 1); extra flags must reach the trainer after the preset's
# (so they override it); a bad extra flag or a bad rank count must make the script exit non-zero.
# Also dev/bench/measured_topology.sh on a session's timing logs made up here: the rates it reads
# and a --plan that takes them.
#   test/check_scripts.sh [TRAINER]   (default ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "check_scripts.sh: $trainer is not built" >&2; exit 1; }
export PLAN=1 TRAIN_GPT=$trainer
out=$(mktemp)
logs=$(mktemp -d)
trap 'rm -rf "$out" "$logs"' EXIT

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

# Two versions of one matmul case (the faster counts), a second case 3x as long; attention and the
# memory-bound kernels in the workbenches' line format.
line() { printf '  time %-28s %8.4f ms  %7.1f %s  (floor 0.1 ms at 1000 %s: 50.0%%)\n' "$1" "$2" "$3" "$4" "$4"; }
{ echo "version 1: naive"; echo " qkv: BT 8192, C 768, OC 2304; bias"; line forward 2.0 100.0 TFLOP/s
  echo "version 2: cuBLASLt"; echo " qkv: BT 8192, C 768, OC 2304; bias"; line forward 1.0 600.0 TFLOP/s
  line "bias gradient (reads dout)" 0.01 900.0 GB/s; echo " fc: BT 8192, C 768, OC 3072"; line backward 3.0 400.0 TFLOP/s
} >"$logs/time_matmul.log"
{ echo "version 1: flash"; echo " B 8, T 1024"; line forward 1.0 300.0 TFLOP/s; } >"$logs/time_attention_forward.log"
{ echo "version 1: flash"; echo " B 8, T 1024"; line backward 1.0 200.0 TFLOP/s; } >"$logs/time_attention_backward.log"
{ echo "version 1: fused"; echo " BT 8192, C 768"; line forward 1.0 2000.0 GB/s; line backward 1.0 3000.0 GB/s; } >"$logs/time_layernorm.log"
dev/bench/measured_topology.sh "$logs" >"$logs/measured.json" 2>"$out" || fail "measured_topology.sh exited with $?"
cp "$logs/measured.json" "$out"
grep -q '"matmul_tflops": 450.0, "attention_tflops": 250.0, "memory_gbps": 2500.0' "$out" ||
    fail "measured_topology.sh: expected matmul 450 (600 for 1 ms, 400 for 3 ms), attention 250, memory 2500"
"$trainer" -e d12 -b 4 -t 1024 -d 65536 --plan 16 --topology "$logs/measured.json" >"$out" 2>&1 ||
    fail "--plan --topology measured.json exited with $?"
grep -q "^predicted step on $logs/measured.json" "$out" || fail "--plan did not predict on the measured topology"
# With a step profile (bench_train_step --profile) in the logs, its products and attention count
# instead of the workbenches': products 100 FLOP-weighted over 1 + 3 ms (700 and 200 TFLOP/s), the
# phase table above them ignored.
{ echo "| phase | ms | share |"; echo "| attention | 9.00 | 50.0% |"; echo
  echo "The matrix products: FLOPs over time, against the dense bf16 peak (989 TFLOP/s)"
  echo "| product | ms | TFLOP/s | of peak |"; echo "| qkv | 1.00 | 700 | 70.8% |"
  echo "| attproj backward | 3.00 | 200 | 20.2% |"; echo "| attention (forward and backward) | 2.00 | 150 | 15.2% |"
} >"$logs/bench_d12_best.log"
dev/bench/measured_topology.sh "$logs" >"$logs/measured.json" 2>"$out" || fail "measured_topology.sh exited with $?"
cp "$logs/measured.json" "$out"
grep -q '"matmul_tflops": 325.0, "attention_tflops": 150.0, "memory_gbps": 2500.0' "$out" ||
    fail "measured_topology.sh with a step profile: expected matmul 325 (700 for 1 ms, 200 for 3 ms), attention 150"
echo "ok dev/bench/measured_topology.sh: fastest version per case, time-weighted rates, a step profile first, --plan takes them"
