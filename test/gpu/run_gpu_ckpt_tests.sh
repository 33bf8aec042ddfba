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
for b in "$trainer" "$cpu_trainer"; do [ -x "$b" ] || { echo "run_gpu_ckpt_tests.sh: $b is not built" >&2; exit 1; }; done
if ! nvidia-smi -L > /dev/null 2>&1; then
    [ "${LLMC_GPU_SESSION:-0}" = 1 ] && { echo "run_gpu_ckpt_tests.sh: no GPU: FAIL (LLMC_GPU_SESSION=1)"; exit 3; }
    echo "run_gpu_ckpt_tests.sh: no GPU: skipped"; exit 0
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(-e d4 -b 8 -t 64 -x 16 -v 0 -s 0 -l 1e-3 -n 8 -nk 0)
losses() { sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl"; }

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
paste <(losses "$dir/ref" | tail -8) <(losses "$dir/cpu" | tail -8) | awk '
    { d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > worst) worst = d }
    END { printf "%s CPU after GPU checkpoint: worst relative loss difference %.2g (limit 2e-2)\n", (worst <= 2e-2 ? "ok" : "FAIL"), worst
          exit worst <= 2e-2 ? 0 : 1 }'
