#!/usr/bin/env bash
# Tensor parallelism on this machine (a benchmark, not a test): the CPU model's step time, exposed
# tensor-group communication and activation memory per rank for tp = 1, 2 and 4 at d12, every run
# on the same cores (tp = 1: one rank with all of them; tp = N: N ranks with cores/N threads, at
# least 1). Prints a Markdown table.
#   dev/bench/tp_bench.sh [./train_gpt_cpu] [extra trainer flags]
set -euo pipefail
trainer=${1:-./train_gpt_cpu}
shift || true
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cores=$(nproc)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(-e d12 -b 4 -t 128 -x 4 -v 0 -s 0 --heartbeat-s 0 --straggler-factor 0 "$@")

echo "| tp | sp | ranks x threads | step time (mean of steps 2-4) | exposed comm per step | activations per rank |"
echo "| --- | --- | --- | --- | --- | --- |"
for run in "1 1" "2 1" "2 0" "4 1" "4 0"; do
    set -- $run
    tp=$1 sp=$2 threads=$(( cores / $1 > 0 ? cores / $1 : 1 ))
    acts=$("$trainer" "${flags[@]}" --tp "$tp" --sp "$sp" --plan "$tp" | awk '$1 == "activations" && NF == 3 {print $2 " " $3}')
    OMP_NUM_THREADS=$threads mpirun --oversubscribe -np "$tp" "$trainer" "${flags[@]}" --tp "$tp" --sp "$sp" \
        -o "$dir/out" >"$dir/log" 2>&1
    read -r ms comm < <(grep '^step' "$dir/log" | tail -3 | awk -F'|' '{split($5, a, " "); split($6, b, " "); t += a[1]; c += b[2]} END {printf "%.0f %.0f\n", t / NR, c / NR}')
    echo "| $tp | $( [ "$tp" = 1 ] && echo - || echo "$sp" ) | $tp x $threads | $ms ms | $comm ms | $acts |"
done
