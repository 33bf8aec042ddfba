#!/usr/bin/env bash
# A mixture-of-experts model under mpirun: 2 data-parallel ranks reproduce the 1-rank curve under
# ZeRO 0-3 (experts in every second block, a capacity factor that drops assignments, both auxiliary
# losses in the loss); a resumed run reproduces the uninterrupted one, also on another rank count;
# and the log shows the routing.
#   test/mpi/run_moe_tests.sh ./train_gpt_cpu
set -euo pipefail
trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_moe_tests.sh: $trainer is not built" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

common=(-i 'data/default/default_train_*.bin' -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2
        --max-seq-len 64 --experts 4 --top-k 2 --moe-every 2 --capacity-factor 1.0 --moe-balance-coef 0.1
        -b 2 -t 32 -d 256 -x 8 -v 0 -s 0 -k constant -l 1e-3)

"$trainer" "${common[@]}" -o "$dir/one" >"$dir/one.log" 2>&1
grep -q "experts: balance [0-9.]* z [0-9.]* max load [0-9.]* dropped [1-9]" "$dir/one.log" ||
    { echo "FAILED: the step line shows no routing, or no drops at capacity 1.0:"; tail -3 "$dir/one.log"; exit 1; }
grep -q '"experts":{"assigned":' "$dir/one/metrics.jsonl" || { echo "FAILED: metrics.jsonl has no routing record"; exit 1; }
echo "ok the log and metrics.jsonl show the routing: $(grep -o 'experts: .*' "$dir/one.log" | tail -1)"

for z in 0 1 2 3; do
    "${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -z "$z" -o "$dir/two_z$z" >"$dir/two.log" 2>&1 ||
        { echo "FAILED: 2 ranks, ZeRO-$z:"; tail -5 "$dir/two.log"; exit 1; }
    same_curve "$dir/one/metrics.jsonl" "$dir/two_z$z/metrics.jsonl" "MoE, 2 ranks ZeRO-$z against 1 rank"
    echo "ok MoE: 2 ranks under ZeRO-$z reproduce the 1-rank curve"
done

# Resume: 4 steps with a checkpoint, then the rest from it (on 1 rank, and on 2), against the
# uninterrupted run.
"$trainer" "${common[@]}" -x 4 -n 4 -o "$dir/first" >/dev/null 2>&1
cp -r "$dir/first" "$dir/first_2"
"$trainer" "${common[@]}" -n 4 -y 1 -o "$dir/first" >"$dir/resume.log" 2>&1
grep -q "resum" "$dir/resume.log" || { echo "FAILED: the run did not resume"; tail -5 "$dir/resume.log"; exit 1; }
same_curve "$dir/one/metrics.jsonl" "$dir/first/metrics.jsonl" "MoE resumed at step 4 on 1 rank"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -z 1 -n 4 -y 1 -o "$dir/first_2" >"$dir/resume2.log" 2>&1 ||
    { echo "FAILED: resume on 2 ranks:"; tail -5 "$dir/resume2.log"; exit 1; }
same_curve "$dir/one/metrics.jsonl" "$dir/first_2/metrics.jsonl" "MoE resumed at step 4 on 2 ranks (ZeRO-1)"
echo "ok MoE: a run resumed at step 4, on 1 rank or on 2, reproduces the uninterrupted one"
