#!/usr/bin/env bash
# Context parallelism on this machine (a benchmark, not a test): the CPU model's step time, exposed
# communication (the ring's waits) and activation memory per rank for cp = 1, 2 and 4 at T = 4k, 16k
# and 32k, B 1, on a small model (1 layer, C 32, 2 heads, a 250-token vocabulary, so attention is the
# work), every run on the same cores (cp = 1: one rank with all of them; cp = N: N ranks with
# cores/N threads, at least 1). Prints a Markdown table.
#   dev/bench/cp_bench.sh [./train_gpt_cpu] [extra trainer flags]
set -euo pipefail
trainer=${1:-./train_gpt_cpu}
shift || true
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cores=$(nproc)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# A shard of 200000 pseudo-random tokens below 250 (llm.c's header: magic, version, token count).
"${PYTHON:-/usr/bin/python3}" - "$dir/train.bin" <<'PY'
import random, struct, sys
random.seed(1)
n = 200000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(random.randrange(250) for _ in range(n))))
PY
flags=(-i "$dir/train.bin" -j "" --tokenizer "" --vocab-size 250 --num-layers 1 --channels 32 --num-heads 2
       --max-seq-len 32768 -b 1 -x 4 -v 0 -s 0 --heartbeat-s 0 --straggler-factor 0 "$@")

echo "| T | cp | ranks x threads | step time (median of steps 2-4) | exposed comm | activations per rank |"
echo "| --- | --- | --- | --- | --- | --- |"
for T in 4096 16384 32768; do
    for cp in 1 2 4; do
        threads=$(( cores / cp > 0 ? cores / cp : 1 ))
        acts=$("$trainer" "${flags[@]}" -t "$T" --cp "$cp" --plan "$cp" | awk '$1 == "activations" && NF == 3 {print $2 " " $3}')
        OMP_NUM_THREADS=$threads mpirun --oversubscribe -np "$cp" "$trainer" "${flags[@]}" -t "$T" --cp "$cp" \
            -o "$dir/out" >"$dir/log" 2>&1
        read -r ms comm < <(grep '^step' "$dir/log" | tail -3 | awk -F'|' '{split($5, a, " "); split($6, b, " "); print a[1], b[2]}' |
                            sort -n | sed -n 2p | awk '{printf "%.0f %.0f\n", $1, $2}')
        echo "| $T | $cp | $cp x $threads | $ms ms | $comm ms | $acts |"
    done
done
