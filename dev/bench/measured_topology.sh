#!/usr/bin/env bash
# dev/bench/measured_topology.sh: a --topology file whose kernel rates are the ones a GPU session
# measured, in place of the efficiencies llmc/planning/cluster.h assumes. Prints JSON:
#   matmul_tflops      the products of a whole training step: the `bench` stage's profile of the
#                      largest model (bench_d48_best.log, else bench_d12_best.log, or their names
#                      without _best: bench_train_step --profile's table of products); without one,
#                      the `kernels` stage's time_matmul.log
#   attention_tflops   the same profile's attention row; else time_attention_forward.log and
#                      time_attention_backward.log
#   memory_gbps        the memory-bound workbenches: layernorm, gelu, adamw, encoder_backward, global_norm
# A profile's rate is its rows' FLOPs over their time. In the workbenches' logs each case (a shape
# under a workbench, a line of it) counts at its fastest version; a rate is the cases' FLOPs (or
# bytes) over their time, so long kernels weigh more. Which source each rate came from goes to stderr.
#   dev/bench/measured_topology.sh LOGDIR [h100|a100] > out/measured_h100.json
#   ./train_gpt -e d48 -t 1024 -d 1048576 --plan-search 64 --topology out/measured_h100.json
set -euo pipefail
logs=${1:?usage: measured_topology.sh LOGDIR [h100|a100]}
base=${2:-h100}
[ "$base" = h100 ] || [ "$base" = a100 ] || { echo "measured_topology.sh: base must be h100 or a100, got '$base'" >&2; exit 1; }

# rate UNIT FILE...: the time-weighted rate of every case's fastest line in UNIT (TFLOP/s or GB/s)
rate() {
    local unit=$1
    shift
    local files=()
    for f in "$@"; do [ -f "$logs/$f" ] && files+=("$logs/$f"); done
    [ ${#files[@]} -gt 0 ] || { echo "measured_topology.sh: none of $* in $logs" >&2; exit 1; }
    awk -v unit="$unit" '
        FNR == 1 { file = FILENAME }
        /^ [^ ]/ { shape = $0 }
        /^  time / && index($0, " " unit " ") {
            line = $0
            sub(/^  time /, "", line)
            split(line, parts, / +[0-9.]+ ms +/)
            what = parts[1]
            n = split(line, words, / +/)
            for (i = 1; i <= n; i++) if (words[i] == "ms") { ms = words[i - 1]; r = words[i + 1]; break }
            key = file "|" shape "|" what
            r += 0; ms += 0
            if (!(key in best) || r > best[key]) { best[key] = r; time[key] = ms }
        }
        END {
            for (k in best) { work += best[k] * time[k]; total += time[k] }
            if (total == 0) { print "no " unit " timings" > "/dev/stderr"; exit 1 }
            printf "%.1f", work / total
        }' "${files[@]}"
}

# profile_rate FILE PATTERN: the TFLOP/s of the rows of FILE's table of products (bench_train_step
# --profile) whose names match PATTERN, their FLOPs over their time; fails where there are none.
profile_rate() {
    awk -F'|' -v pattern="$2" '
        /^The matrix products/ { in_table = 1; next }
        in_table && /^\| / {
            name = $2
            gsub(/^ +| +$/, "", name)
            if (name ~ pattern && $3 + 0 > 0) { ms += $3; work += $3 * $4 }
        }
        END { if (ms == 0) exit 1; printf "%.1f", work / ms }' "$1"
}
profile=
for f in bench_d48_best.log bench_d12_best.log bench_d48.log bench_d12.log; do
    if [ -f "$logs/$f" ] && profile_rate "$logs/$f" '^attention' > /dev/null; then profile=$logs/$f; break; fi
done
if [ -n "$profile" ]; then
    matmul=$(profile_rate "$profile" '^(qkv|attproj|fc|fcproj|lm head)')
    attention=$(profile_rate "$profile" '^attention')
    echo "measured_topology.sh: products and attention from the step profile in $profile" >&2
else
    matmul=$(rate TFLOP/s time_matmul.log)
    attention=$(rate TFLOP/s time_attention_forward.log time_attention_backward.log)
    echo "measured_topology.sh: products and attention from the workbenches (no step profile in $logs)" >&2
fi
memory=$(rate GB/s time_layernorm.log time_gelu.log time_adamw.log time_encoder_backward.log time_global_norm.log)
printf '{"base": "%s", "matmul_tflops": %s, "attention_tflops": %s, "memory_gbps": %s}\n' \
    "$base" "$matmul" "$attention" "$memory"
