#!/usr/bin/env bash
# ZeRO end to end under mpirun (test_zero.cpp with 1-4 ranks), then bad launches of the trainer:
# a --world-size that disagrees with the launch, and more ranks than a shard has windows for; then
# the OpenMP threads per rank.
#   test/mpi/run_zero_tests.sh build/test_zero ./train_gpt_cpu
set -euo pipefail

bin=${1:-build/test_zero}
trainer=${2:-./train_gpt_cpu}
for b in "$bin" "$trainer"; do [ -x "$b" ] || { echo "run_zero_tests.sh: $b is not built" >&2; exit 1; }; done
source "$(dirname "$0")/lib.sh"

for n in 1 2 3 4; do
    echo "== mpirun -np $n $bin"
    "${mpirun[@]}" -np "$n" "$bin" "$dir"
done

# Each bad launch must fail (non-zero exit) with a message naming the problem.
shard="$dir/zero_train_000000.bin"  # 60000 tokens, written by test_zero
common=(-i "$shard" -j "" --tokenizer "" --vocab-size 250 --num-layers 1 --channels 32 --num-heads 2 -x 1 -o "$dir/out_run")
expect_failure "a world size that disagrees with the config" "world-size is 4 but the job was launched with 2" \
    -np 2 "$trainer" "${common[@]}" -b 2 -t 16 --world-size 4
expect_failure "more ranks than the data has windows for" "too few for one round of windows" \
    -np 4 "$trainer" "${common[@]}" -b 64 -t 512 --max-seq-len 512

# Threads per rank: without OMP_NUM_THREADS, 2 ranks on this machine share its cores (at least 1
# thread each); with it, it wins. The startup line says which.
cores=$(getconf _NPROCESSORS_ONLN)  # what std::thread::hardware_concurrency reports
per_rank=$(( cores / 2 > 0 ? cores / 2 : 1 ))
env -u OMP_NUM_THREADS "${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -b 2 -t 16 >"$dir/out" 2>&1
grep -q "device: CPU, $per_rank OpenMP thread(s) per rank ($cores core(s) / 2 rank(s) on this node" "$dir/out" ||
    { echo "FAILED: 2 ranks on $cores cores should start $per_rank thread(s) each:"; cat "$dir/out"; exit 1; }
"${mpirun[@]}" -np 2 -x OMP_NUM_THREADS=3 "$trainer" "${common[@]}" -b 2 -t 16 >"$dir/out" 2>&1
grep -q "device: CPU, 3 OpenMP thread(s) per rank (OMP_NUM_THREADS)" "$dir/out" ||
    { echo "FAILED: OMP_NUM_THREADS=3 should win:"; cat "$dir/out"; exit 1; }
echo "ok threads per rank: $per_rank each for 2 ranks on $cores cores; OMP_NUM_THREADS wins"
