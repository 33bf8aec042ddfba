#!/usr/bin/env bash
# Mixture of experts on the CUDA model (part of make test-gpu and make test-emu):
#   1. build/test_moe_cuda on 2 ranks: ZeRO 0-3 against the 1-rank CUDA model and the CPU model, the
#      planned bytes allocated (test_moe_cuda.cu says what it checks);
# then train_gpt with the test model's blocks 2 and 4 given 4 experts, top 2, and a capacity factor
# of 1 (so some tokens are dropped), 10 steps of 16 sequences, each forward 8 of them (emulated, a
# step takes about a second):
#   2. one rank (two micro-batches of 8) follows train_gpt_cpu's run of the same data, seed and config
#      (fp32 against bf16: within 2e-3 relative per step; 4e-5 emulated), its routing too (balance
#      loss within 1e-2 per step; 6e-4 emulated), and its step lines carry the routing ("experts:
#      balance ... dropped N", N > 0);
#   3. two ranks of 8 sequences each (--gpu-comm mpi) at ZeRO-3 reproduce the one-rank curve (the
#      capacity counts each forward's tokens, so both route the same groups of 8) within
#      LLMC_MOE_RANKS_LIMIT (default 1e-3; bitwise equal emulated);
#   4. --ep 2 (two ranks, each with 2 of the 4 experts) at ZeRO-1 reproduces the one-rank curve within
#      LLMC_MOE_RANKS_LIMIT, its step lines name the busiest rank, and its step-5 checkpoint resumes
#      on one rank within the same limit;
#   5. a checkpoint written at step 5, resumed by train_gpt, ends with the same model.bin bit for
#      bit, and train_gpt_cpu continues it within 2e-3;
#   6. --plan lists the expert activations; --experts with --tp is refused naming both.
# Skips with a message where there is no GPU or no mpirun, except in a GPU session
# (LLMC_GPU_SESSION=1), where either is a failure (exit 3 without a GPU, 1 without mpirun).
#   test/gpu/run_gpu_moe_tests.sh build/test_moe_cuda ./train_gpt ./train_gpt_cpu
set -euo pipefail

test_moe=${1:-build/test_moe_cuda}
trainer=${2:-./train_gpt}
cpu_trainer=${3:-./train_gpt_cpu}
source "$(dirname "$0")/lib.sh"
gpu_checks run_gpu_moe_tests.sh "$test_moe" "$trainer" "$cpu_trainer"
ranks_limit=${LLMC_MOE_RANKS_LIMIT:-1e-3}

# 1. the model on 2 ranks against its references
echo "== test_moe_cuda: 2 ranks"
mkdir -p "$dir/unit"
timeout 600 mpirun --oversubscribe -np 2 "$test_moe" "$dir/unit"

moe=(--experts 4 --top-k 2 --moe-every 2 --capacity-factor 1)
steps=10
base=("${test_model[@]}" "${moe[@]}" -t "$test_T" -d $((16 * test_T)) -x "$steps" -v 0 -s 0 -l 1e-3)

# 2. one rank against the CPU trainer
common=("${base[@]}")
cuda_trainer=$trainer trainer=$cpu_trainer
run cpu 1 8
trainer=$cuda_trainer common=("${base[@]}" --gpu-comm mpi)
run one 1 8
compare cpu one 2e-3 "$steps"
balance() { sed -nE 's/.*"balance_loss":([-0-9.e+]+).*"step":([0-9]+),.*/\2 \1/p' "$dir/$1/metrics.jsonl"; }
join <(balance cpu | sort -k1,1) <(balance one | sort -k1,1) | awk -v steps="$steps" '
    { d = ($2 - $3) / $2; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
    END { if (n != steps) { print "FAIL balance losses: " n " common steps, expected " steps; exit 1 }
          printf "%s one vs cpu: worst relative balance-loss difference %.2g over %d steps (limit 1e-2)\n",
                 (worst <= 1e-2 ? "ok" : "FAIL"), worst, n
          exit worst <= 1e-2 ? 0 : 1 }'
grep -qE "experts: balance [0-9.]+ z [0-9.]+ max load [0-9.]+ dropped [1-9]" "$dir/one.log" ||
    { echo "FAIL the CUDA run's step lines do not show the routing with drops"; tail -n 5 "$dir/one.log"; exit 1; }

# 3. two ranks, ZeRO-3
run z3 2 8 -z 3
compare one z3 "$ranks_limit" "$steps"

# Expert parallelism: 2 ranks in one expert group (each holding 2 of the 4 experts) reproduce the
# one-rank curve; its step-5 checkpoint resumes on 1 rank (checkpoints hold whole tensors).
run ep2 2 8 --ep 2 -z 1 -n 5 -nk 0
compare one ep2 "$ranks_limit" "$steps"
grep -qE "busiest rank [0-9.]+" "$dir/ep2.log" || { echo "FAIL the --ep 2 step lines do not show the busiest rank"; exit 1; }
mkdir -p "$dir/ep2_on_one"
cp -r "$dir/ep2/ckpt_00000005" "$dir/ep2_on_one/"
run ep2_on_one 1 8 -n 5 -nk 0 -y 1
grep -q "resumed from $dir/ep2_on_one/ckpt_00000005" "$dir/ep2_on_one.log" || { echo "FAIL: no resume from ep 2"; exit 1; }
compare ep2 ep2_on_one "$ranks_limit" $((steps - 5))

# A CUDA MoE checkpoint (the experts and router in the model, the routing's state none): resumed on
# the GPU it ends bitwise equal, and the CPU model continues it.
resume_check 5 "$steps" 2e-3 8

# 4. the plan, and the refusal
"$trainer" "${base[@]}" -b 8 --plan 2 -z 3 > "$dir/plan.log"
grep -q "expert activations" "$dir/plan.log" || { echo "FAIL --plan does not list the expert activations"; exit 1; }
if "$trainer" "${base[@]}" -b 8 --tp 2 > "$dir/tp.log" 2>&1; then
    echo "FAIL --experts with --tp 2 was not refused"; exit 1
fi
grep -q -- "--tp 2" "$dir/tp.log" || { echo "FAIL the refusal does not name --tp 2:"; cat "$dir/tp.log"; exit 1; }
echo "run_gpu_moe_tests.sh: all passed"
