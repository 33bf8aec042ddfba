#!/usr/bin/env bash
# HellaSwag (-h 1, --eval-hellaswag) under mpirun, on the CPU trainer:
#   1. -x 0 evaluates the tiny fixture model (test/fixtures/gpt2_tiny_model.bin) on the fixture's 24
#      synthetic items and counts the items PyTorch's float64 reference counts
#      (hellaswag_tiny_ref.json, dev/ref/hellaswag_ref.py), on 1, 2 and 4 data-parallel ranks, tp 2,
#      pp 2, cp 2 and dp 2 x tp 2 at ZeRO-3; saves no model and says "evaluated only";
#   2. a training run evaluates after steps 0, 5 and 10 (-v 5), each a metrics record and a log
#      line with its time beside a step's, and 2 data-parallel ranks count what 1 rank counts;
#   3. -x 0 with nothing to evaluate is refused, naming -x 0 and what it needs.
# The fixture's smallest margin between an item's two best endings is 0.016, far above the
# rounding by which meshes differ, so the counts must be equal, not just close.
#   test/mpi/run_hellaswag_tests.sh ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_hellaswag_tests.sh: $trainer is not built" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"
python=${PYTHON:-/usr/bin/python3}
fixtures="$(dirname "$0")/../fixtures"
items="$fixtures/hellaswag_tiny.bin"
expected=$(grep -m1 '"correct"' "$fixtures/hellaswag_tiny_ref.json" | tr -dc 0-9)

# A training shard in the tiny model's 500-token vocabulary (the trainer reads -i even at -x 0).
"$python" - "$dir/train.bin" <<'PY'
import struct, sys, random
rng = random.Random(1)
tokens = [rng.randrange(500) for _ in range(20000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *[0] * 253))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
common=(-e "$fixtures/gpt2_tiny_model.bin" -i "$dir/train.bin" -j "" --tokenizer "" --eval-hellaswag "$items"
        -b 4 -t 32 --heartbeat-s 0 --straggler-factor 0)
field() { grep -o "\"$1\":[^,}]*" "$2" | cut -d: -f2; }

evaluate() {  # evaluate NAME NP FLAGS...: -x 0 must count PyTorch's items
    local name=$1 np=$2
    shift 2
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 0 "$@" -o "$dir/$name" >"$dir/$name.log"
    local got
    got=$(field hellaswag_correct "$dir/$name/metrics.jsonl")
    [ "$got" = "$expected" ] && [ "$(field hellaswag_items "$dir/$name/metrics.jsonl")" = 24 ] ||
        { echo "FAILED: $name: $got of 24 items right, PyTorch's reference $expected"; cat "$dir/$name.log"; exit 1; }
    grep -q "^done: evaluated only | hellaswag acc .* (step 0) | no model saved$" "$dir/$name.log" &&
        [ ! -e "$dir/$name/model.bin" ] ||
        { echo "FAILED: $name: -x 0 should evaluate only and save no model"; cat "$dir/$name.log"; exit 1; }
    echo "ok $name ($*): $got/24 items right, PyTorch's count; evaluated only, no model saved"
}
evaluate one 1
evaluate dp2 2
evaluate dp4 4
evaluate tp2 2 --tp 2
evaluate pp2 2 --pp 2
evaluate cp2 2 --cp 2
evaluate dp2_tp2_zero3 4 --tp 2 -z 3

# Evaluated where validation runs: after steps 0, 5 and 10; 2 ranks count what 1 rank counts.
train() {  # train NAME NP
    "${mpirun[@]}" -np "$2" "$trainer" "${common[@]}" -x 10 -v 5 -d 256 -l 1e-3 -o "$dir/$1" >"$dir/$1.log"
    [ "$(field step "$dir/$1/metrics.jsonl" | tr '\n' ' ')" != "" ] &&
        [ "$(grep hellaswag_acc "$dir/$1/metrics.jsonl" | grep -o '"step":[0-9]*' | tr '\n' ' ')" = \
          '"step":0 "step":5 "step":10 ' ] ||
        { echo "FAILED: $1: no HellaSwag records after steps 0, 5 and 10"; cat "$dir/$1/metrics.jsonl"; exit 1; }
    grep -q "^hellaswag acc [0-9.]* ([0-9]*/24 items, after 5 steps) | eval [0-9.]* ms (a step takes [0-9.]* ms)$" \
        "$dir/$1.log" || { echo "FAILED: $1: the HellaSwag log line"; cat "$dir/$1.log"; exit 1; }
}
train train1 1
train train2 2
[ "$(grep hellaswag "$dir/train1/metrics.jsonl" | grep -o '"hellaswag_correct":[0-9]*')" = \
  "$(grep hellaswag "$dir/train2/metrics.jsonl" | grep -o '"hellaswag_correct":[0-9]*')" ] ||
    { echo "FAILED: 2 ranks' HellaSwag counts during training are not 1 rank's"; exit 1; }
echo "ok training with -h 1 -v 5: records and log lines after steps 0, 5 and 10, 2 ranks' counts are 1 rank's"

expect_failure "-x 0 with nothing to evaluate" "\-x 0 trains nothing and only evaluates a model" \
    -np 1 "$trainer" "${common[@]}" -x 0 -h 0 -o "$dir/bad"
