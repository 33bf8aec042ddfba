#!/usr/bin/env bash
# A Llama model (--arch llama: RMSNorm, RoPE, 4 query heads sharing 2 key/value heads, SwiGLU, an
# untied head) trained by train_gpt_cpu under mpirun: every axis the CPU model gives it reproduces
# the 1-rank run's losses and gradient norms (same_curve: 1e-5 and 1e-4 relative), for 8 steps:
#   dp 2 with ZeRO-1 and ZeRO-3, tp 2 (sequence parallel), dp 2 x tp 2 with ZeRO-2, pp 2 (1F1B and
#   interleaved, 2 chunks per rank), cp 2 (ring attention with grouped kv heads, RoPE at each rank's
#   global positions) alone, with dp 2 at ZeRO-3, with tp 2 and with pp 2, and a checkpoint of the
#   1-rank run resumed onto tp 2 with ZeRO-3;
# FP8 products train (a finite, falling loss); and what a Llama cannot do yet, or a shape that does not
# divide, is refused by name. The PyTorch oracle for the model itself is test/test_llama_cpu.cpp's.
#
#   test/mpi/run_llama_tests.sh ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_llama_tests.sh: $trainer is not built" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

shard="$dir/llama_train_000000.bin"
walk_shard "$shard" 7 17 3 5

common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --arch llama --num-layers 4 --channels 32 --num-heads 4
        --kv-heads 2 --ffn-hidden 64 --max-seq-len 32 -b 2 -t 32 -d 512 -l 1e-2 -u 2 --heartbeat-s 0
        --straggler-factor 0)

"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 8 -n 4 -o "$dir/one" >"$dir/one.log"
grep -q "^model: d4 (llama) | L 4 | heads 4 (2 kv) | C 32 | SwiGLU 64 | RoPE base 500000 |" "$dir/one.log" || { echo "FAILED: the 1-rank Llama run does not say its family"; cat "$dir/one.log"; exit 1; }
curve "$dir/one/metrics.jsonl" | awk 'NR == 1 { first = $2 } END { exit !($2 < first - 0.3) }' ||
    { echo "FAILED: the 1-rank Llama run does not learn"; curve "$dir/one/metrics.jsonl"; exit 1; }
echo "ok a 1-rank Llama run learns: loss $(curve "$dir/one/metrics.jsonl" | awk 'NR == 1 { a = $2 } END { printf "%.4f -> %.4f", a, $2 }')"

same_as_one() {  # same_as_one NAME NP TRAINER_ARGS...
    local name=$1 np=$2
    shift 2
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 8 -o "$dir/$name" "$@" >"$dir/$name.log"
    same_curve "$dir/one/metrics.jsonl" "$dir/$name/metrics.jsonl" "Llama, $name ($*)"
    echo "ok Llama, $name ($*): 8 steps' losses and gradient norms as 1 rank's"
}
same_as_one dp2_zero1 2 -z 1
same_as_one dp2_zero3 2 -z 3
same_as_one tp2 2 --tp 2
same_as_one dp2_tp2_zero2 4 --tp 2 -z 2
same_as_one pp2 2 --pp 2
same_as_one pp2_interleaved 2 --pp 2 --pp-schedule interleaved --pp-virtual 2
same_as_one cp2 2 --cp 2
same_as_one dp2_cp2_zero3 4 --cp 2 -z 3
same_as_one cp2_tp2 4 --cp 2 --tp 2
same_as_one pp2_cp2 4 --pp 2 --cp 2 -z 1

out="$dir/resumed"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -x 8 --tp 2 -z 3 -o "$out" --resume-from "$dir/one/ckpt_00000004" \
    >"$out.log"
check_resumed "$out.log" "$out/metrics.jsonl" "$dir/one/metrics.jsonl" "$dir/one/ckpt_00000004" 4 \
    "the 1-rank Llama checkpoint resumed onto tp 2, ZeRO-3"
echo "ok the 1-rank Llama checkpoint of step 4 resumed onto tp 2 with ZeRO-3 continues the uninterrupted run"

"${mpirun[@]}" -np 1 "$trainer" "${common[@]}" -x 8 --fp8 1 -o "$dir/fp8" >"$dir/fp8.log"
curve "$dir/fp8/metrics.jsonl" | awk 'NR == 1 { first = $2 } END { exit !($2 < first - 0.3) }' ||
    { echo "FAILED: a Llama run with FP8 products does not learn"; curve "$dir/fp8/metrics.jsonl"; exit 1; }
echo "ok a Llama run with FP8 products learns"

expect_failure "fewer kv heads than tensor ranks" "must divide the model's key/value head count" \
    -np 4 "$trainer" "${common[@]}" -x 1 --tp 4 -o "$dir/bad"
expect_failure "Llama's shape flags on a GPT-2" "give --arch llama" \
    -np 1 "$trainer" -i "$shard" -j "" --tokenizer "" --vocab-size 250 --kv-heads 2 -x 1 -o "$dir/bad"
expect_failure "an odd head size" "head size (channels 36 / heads 4 = 9) must be even" \
    -np 1 "$trainer" "${common[@]}" --channels 36 -x 1 -o "$dir/bad"
