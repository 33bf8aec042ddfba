#!/usr/bin/env bash
# Checkpoints of the CUDA model (part of make test-gpu), one rank, no mpirun needed: a run resumed
# from its step-8 checkpoint ends bitwise equal to the uninterrupted run (model file and every
# loss; the CUDA kernels are deterministic and the stochastic rounding seed is saved), and the CPU
# trainer resumes from the GPU's checkpoint (its fp32 parameters from the master weights).
# Skips with a message where there is no GPU (fails with exit 3 in a GPU session, LLMC_GPU_SESSION=1).
#   test/gpu/run_gpu_ckpt_tests.sh ./train_gpt ./train_gpt_cpu
set -euo pipefail

trainer=${1:-./train_gpt}
cpu_trainer=${2:-./train_gpt_cpu}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_ckpt_tests.sh "$trainer" "$cpu_trainer"
common=("${test_model[@]}" -b 8 -t "$test_T" -x 16 -v 0 -s 0 -l 1e-3 -n 8 -nk 0)
losses() { sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl"; }
# within A B LIMIT WHAT: the last 8 step losses of runs A and B (directories) within LIMIT, relative
within() {
    paste <(losses "$1" | tail -8) <(losses "$2" | tail -8) | awk -v limit="$3" -v what="$4" '
        { d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > worst) worst = d }
        END { printf "%s %s: worst relative loss difference %.2g (limit %s)\n", (worst <= limit ? "ok" : "FAIL"), what, worst, limit
              exit worst <= limit ? 0 : 1 }'
}

echo "== uninterrupted, then resumed from ckpt_00000008"
"$trainer" "${common[@]}" -o "$dir/ref" > "$dir/ref.log"
mkdir -p "$dir/resumed"
cp -r "$dir/ref/ckpt_00000008" "$dir/resumed/"
"$trainer" "${common[@]}" -o "$dir/resumed" -y 1 > "$dir/resumed.log"
grep -q "resumed from $dir/resumed/ckpt_00000008" "$dir/resumed.log" || { cat "$dir/resumed.log"; echo "FAIL no resume"; exit 1; }
cmp "$dir/ref/model.bin" "$dir/resumed/model.bin" || { echo "FAIL model.bin differs after resume"; exit 1; }
diff <(losses "$dir/ref" | tail -8) <(losses "$dir/resumed" | tail -8) || { echo "FAIL losses differ after resume"; exit 1; }
echo "ok resumed CUDA run is bitwise the uninterrupted one"
grep "checkpoint.*MB/s" "$dir/ref.log"

echo "== the CPU trainer continues from the GPU's checkpoint"
mkdir -p "$dir/cpu"
cp -r "$dir/ref/ckpt_00000008" "$dir/cpu/"
"$cpu_trainer" "${common[@]}" -o "$dir/cpu" -y 1 > "$dir/cpu.log"
grep -q "resumed from $dir/cpu/ckpt_00000008" "$dir/cpu.log" || { cat "$dir/cpu.log"; echo "FAIL no resume"; exit 1; }
within "$dir/ref" "$dir/cpu" 2e-2 "CPU after GPU checkpoint"

echo "== the CPU trainer's run, uninterrupted, then continued by the GPU trainer from its checkpoint"
"$cpu_trainer" "${common[@]}" -o "$dir/cpu_ref" > "$dir/cpu_ref.log"
compare_curves() {  # all 16 steps of the GPU and CPU runs, same seed and data
    join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) | awk -v what="$3" '
        { d = ($2 - $3) / $2; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
        END { printf "%s %s: worst relative loss difference %.2g over %d steps (limit 2e-2)\n", (worst <= 2e-2 && n == 16 ? "ok" : "FAIL"), what, worst, n
              exit worst <= 2e-2 && n == 16 ? 0 : 1 }'
}
compare_curves "$dir/cpu_ref" "$dir/ref" "GPU trainer vs CPU trainer"
mkdir -p "$dir/gpu_after_cpu"
cp -r "$dir/cpu_ref/ckpt_00000008" "$dir/gpu_after_cpu/"
"$trainer" "${common[@]}" -o "$dir/gpu_after_cpu" -y 1 > "$dir/gpu_after_cpu.log"
grep -q "resumed from $dir/gpu_after_cpu/ckpt_00000008" "$dir/gpu_after_cpu.log" ||
    { cat "$dir/gpu_after_cpu.log"; echo "FAIL no resume"; exit 1; }
within "$dir/cpu_ref" "$dir/gpu_after_cpu" 2e-2 "GPU after CPU checkpoint"
