#!/usr/bin/env bash
# A mixture-of-experts model under mpirun (experts in every second block, a capacity factor that
# drops assignments, both auxiliary losses in the loss), each run against the 1-rank curve of 20
# steps: data parallelism; expert parallelism (--ep 2 on 2 ranks under ZeRO 0-3, --ep 4 on 4 ranks,
# dp 4 in expert groups of 2), which also routes exactly as data parallelism does; pipeline
# parallelism alone and with --ep; tensor parallelism (--tp 2, each expert's MLP cut over the tensor
# group, sequence parallelism on and off) alone and with --ep 2 on 4 ranks, under ZeRO 0 and 3; a
# router that sends every token to the same two experts (one rank's), on 2 expert-parallel ranks,
# with the imbalance in the log; resumes across ep (2 -> 1 and 1 -> 2), from tp 2 x ep 2 to 1 rank,
# and on another rank count, and the local tier at dp 4 x ep 2; the replicas' fingerprints compared
# every 5 steps (among the ranks that hold the same experts); --plan's expert line, with --ep and
# with --tp; bad meshes refused.
#   test/mpi/run_moe_tests.sh ./train_gpt_cpu
set -euo pipefail
trainer=${1:-./train_gpt_cpu}
[ -x "$trainer" ] || { echo "run_moe_tests.sh: $trainer is not built" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

common=(-i 'data/default/default_train_*.bin' -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2
        --max-seq-len 64 --experts 4 --top-k 2 --moe-every 2 --capacity-factor 1.0 --moe-balance-coef 0.1
        -b 2 -t 32 -d 256 -x 20 -v 0 -s 0 -k constant -l 1e-3 --fingerprint-every 5)

"$trainer" "${common[@]}" -o "$dir/one" >"$dir/one.log" 2>&1
grep -q "experts: balance [0-9.]* z [0-9.]* max load [0-9.]* dropped [1-9]" "$dir/one.log" ||
    { echo "FAILED: the step line shows no routing, or no drops at capacity 1.0:"; tail -3 "$dir/one.log"; exit 1; }
grep -q '"experts":{"assigned":' "$dir/one/metrics.jsonl" || { echo "FAILED: metrics.jsonl has no routing record"; exit 1; }
echo "ok the log and metrics.jsonl show the routing: $(grep -o 'experts: .*' "$dir/one.log" | tail -1)"

# run NAME MPIRUN_AND_TRAINER_ARGS...: a run of the mesh flags ${mesh[@]} into $dir/NAME that must
# reproduce the 1-rank curve ($dir/$reference, a run of the same flags but the mesh's).
reference=one
run() {
    local name=$1
    shift
    "${mpirun[@]}" "$@" "$trainer" "${common[@]}" "${mesh[@]}" -o "$dir/$name" >"$dir/$name.log" 2>&1 ||
        { echo "FAILED: $name:"; tail -5 "$dir/$name.log"; exit 1; }
    same_curve "$dir/$reference/metrics.jsonl" "$dir/$name/metrics.jsonl" "MoE, $name against 1 rank"
}
# same_routing A B: rank 0's routing records of two runs, step by step: the same assignments and
# drops, and the same balance loss, z-loss and max load within 1e-5 (the parameters they come from
# differ in their last bits after the first update).
same_routing() {
    "${PYTHON:-/usr/bin/python3}" - "$dir/$1/metrics.jsonl" "$dir/$2/metrics.jsonl" <<'PY'
import json, sys
def routing(path):
    return [json.loads(line)["experts"] for line in open(path) if '"experts"' in line]
a, b = routing(sys.argv[1]), routing(sys.argv[2])
assert a and len(a) == len(b), f"{len(a)} and {len(b)} routing records"
for step, (x, y) in enumerate(zip(a, b), 1):
    assert x["assigned"] == y["assigned"] and x["dropped"] == y["dropped"], f"step {step}: {x} vs {y}"
    for key in ("balance_loss", "z_loss", "max_load"):
        assert abs(x[key] - y[key]) <= 1e-5 * abs(x[key]), f"step {step}: {key} {x[key]} vs {y[key]}"
PY
}

mesh=(-z 0)
run dp2_z0 -np 2
echo "ok MoE: 2 data-parallel ranks under ZeRO-0 reproduce the 1-rank curve"
for z in 0 1 2 3; do
    mesh=(--ep 2 -z "$z")
    run "ep2_z$z" -np 2
    echo "ok MoE: --ep 2 on 2 ranks under ZeRO-$z reproduces the 1-rank curve"
done
grep -q "expert parallel: dp in groups of ep 2, 2 of each MoE block's 4 experts per rank" "$dir/ep2_z0.log" ||
    { echo "FAILED: the mesh line does not show the expert groups"; grep mesh "$dir/ep2_z0.log"; exit 1; }
# Each rank routes its own tokens, so rank 0's routing is data parallelism's to the last digit printed.
same_routing dp2_z0 ep2_z0 || { echo "FAILED: --ep 2 routes otherwise than data parallelism"; exit 1; }
echo "ok MoE: --ep 2 routes, caps and drops as 2 data-parallel ranks do (balance, z, max load, drops)"
mesh=(--ep 4 -z 1)
run ep4_z1 -np 4
echo "ok MoE: --ep 4 on 4 ranks under ZeRO-1 reproduces the 1-rank curve"
mesh=(--ep 2 -z 3)
run dp4_ep2_z3 -np 4
echo "ok MoE: dp 4 in expert groups of 2 (experts reduced and gathered over 2 ranks) under ZeRO-3 reproduces the 1-rank curve"
# The pipeline with experts in both blocks, so that the first stage's MoE block has micro-batches in
# flight (1F1B), each with its own routing and exchange.
mesh=(--moe-every 1)
"$trainer" "${common[@]}" "${mesh[@]}" -o "$dir/every" >/dev/null 2>&1
reference=every
mesh=(--moe-every 1 --pp 2)
run pp2 -np 2
mesh=(--moe-every 1 --pp 2 --ep 2 -z 3)
run pp2_ep2 -np 4
echo "ok MoE: --pp 2 (a MoE block on each stage), and --pp 2 x --ep 2 under ZeRO-3, reproduce the 1-rank curve"

# Tensor parallelism: every tensor rank routes all the tokens alike (the router a replica), each
# expert's fc cut by rows and its projection by columns, their outputs summed over the group.
reference=one
mesh=(--tp 2 -z 0)
run tp2_z0 -np 2
mesh=(--tp 2 --sp 0 -z 3)
run tp2_sp0_z3 -np 2
same_routing one tp2_z0 || { echo "FAILED: --tp 2 routes otherwise than 1 rank"; exit 1; }
echo "ok MoE: --tp 2 (sequence parallel, ZeRO-0; not, ZeRO-3) reproduces the 1-rank curve and routing"
for z in 0 3; do
    mesh=(--tp 2 --ep 2 -z "$z")
    run "tp2_ep2_z$z" -np 4
done
echo "ok MoE: --tp 2 x --ep 2 on 4 ranks under ZeRO-0 and ZeRO-3 reproduces the 1-rank curve"

# A router that sends every token to experts 3 and 2 (both on expert-parallel rank 1): the MoE
# block's LayerNorm bias is 0.1 and its router's rows 3 and 2 are the constants 1.0 and 0.9, so
# each token's scores for them are 6.4 and 5.8 (its normalised row sums to 0) against ~0.2.
"$trainer" "${common[@]}" -x 1 -l 1e-9 -o "$dir/init" >/dev/null 2>&1
"${PYTHON:-/usr/bin/python3}" - "$dir/init/model.bin" "$dir/skewed.bin" <<'PY'
import sys
import numpy as np
src, dst = sys.argv[1:3]
header = np.fromfile(src, dtype=np.int32, count=256)
T, V, L, NH, C, Vp, E, K, every, shared = (int(x) for x in header[2:12])
p = np.fromfile(src, dtype=np.float32, offset=1024)
moe = [l for l in range(L) if l % every == every - 1]
dense = L if shared else L - len(moe)
sizes = [("wte", Vp * C), ("wpe", T * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C),
         ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
         ("fcw", dense * 4 * C * C), ("fcb", dense * 4 * C), ("fcprojw", dense * 4 * C * C), ("fcprojb", dense * C),
         ("lnfw", C), ("lnfb", C), ("routerw", len(moe) * E * C),
         ("experts", len(moe) * E * (8 * C * C + 5 * C))]
at, offset = 0, {}
for name, n in sizes:
    offset[name] = at
    at += n
assert at == p.size, f"{src}: {p.size} parameters, the table has {at}"
for i, l in enumerate(moe):
    p[offset["ln2b"] + l * C:offset["ln2b"] + (l + 1) * C] = 0.1
    router = offset["routerw"] + i * E * C
    p[router + (E - 1) * C:router + E * C] = 1.0
    p[router + (E - 2) * C:router + (E - 1) * C] = 0.9
with open(dst, "wb") as f:
    header.tofile(f)
    p.tofile(f)
PY
skewed=(-i 'data/default/default_train_*.bin' -j "" --tokenizer "" -e "$dir/skewed.bin" -b 2 -t 32 -d 256 -x 8
        -v 0 -s 0 -k constant -l 1e-3)
"$trainer" "${skewed[@]}" -o "$dir/skewed_one" >/dev/null 2>&1
"${mpirun[@]}" -np 2 "$trainer" "${skewed[@]}" --ep 2 -z 2 -o "$dir/skewed_ep2" >"$dir/skewed.log" 2>&1 ||
    { echo "FAILED: the skewed router at --ep 2:"; tail -5 "$dir/skewed.log"; exit 1; }
same_curve "$dir/skewed_one/metrics.jsonl" "$dir/skewed_ep2/metrics.jsonl" "MoE, every token to experts 3 and 2, --ep 2"
grep -q "max load 0.50 dropped 0 busiest rank 1.00" "$dir/skewed.log" ||
    { echo "FAILED: the step line does not show every assignment going to one rank:"; tail -2 "$dir/skewed.log"; exit 1; }
echo "ok MoE: a router that sends every token to experts 3 and 2 works at --ep 2 (the 1-rank curve), the log says: $(grep -o 'experts: .*' "$dir/skewed.log" | tail -1)"

# Resume: 10 steps with a checkpoint, then the rest from it, against the uninterrupted run: on 2
# data-parallel ranks (ZeRO-1), written on 1 rank and resumed at --ep 2, and written at --ep 2 and
# resumed on 1 rank (the files hold whole tensors at their global positions).
# resumed LOG OUT WHAT: the run that wrote LOG resumed from OUT's step-10 checkpoint, and OUT's
# curve (10 steps before it, 10 after) is the uninterrupted one.
resumed() {
    grep -q "resumed from $2/ckpt_00000010: step 10" "$1" || { echo "FAILED: $3: no resume"; tail -5 "$1"; exit 1; }
    same_curve "$dir/one/metrics.jsonl" "$2/metrics.jsonl" "$3"
}
"$trainer" "${common[@]}" -x 10 -n 10 -o "$dir/first" >/dev/null 2>&1
cp -r "$dir/first" "$dir/first_2"
cp -r "$dir/first" "$dir/first_ep2"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" -z 1 -n 10 -y 1 -o "$dir/first_2" >"$dir/resume2.log" 2>&1 ||
    { echo "FAILED: resume on 2 ranks:"; tail -5 "$dir/resume2.log"; exit 1; }
resumed "$dir/resume2.log" "$dir/first_2" "MoE resumed at step 10 on 2 ranks (ZeRO-1)"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" --ep 2 -z 3 -n 10 -y 1 -o "$dir/first_ep2" >"$dir/resume_ep2.log" 2>&1 ||
    { echo "FAILED: resume at --ep 2:"; tail -5 "$dir/resume_ep2.log"; exit 1; }
resumed "$dir/resume_ep2.log" "$dir/first_ep2" "MoE written on 1 rank, resumed at --ep 2 (ZeRO-3)"
"${mpirun[@]}" -np 2 "$trainer" "${common[@]}" --ep 2 -z 2 -x 10 -n 10 -o "$dir/from_ep2" >/dev/null 2>&1
"$trainer" "${common[@]}" -n 10 -y 1 -o "$dir/from_ep2" >"$dir/resume_from_ep2.log" 2>&1
resumed "$dir/resume_from_ep2.log" "$dir/from_ep2" "MoE written at --ep 2 (ZeRO-2), resumed on 1 rank"
"${mpirun[@]}" -np 4 "$trainer" "${common[@]}" --tp 2 --ep 2 -z 1 -x 10 -n 10 -o "$dir/from_tp2_ep2" >/dev/null 2>&1
"$trainer" "${common[@]}" -n 10 -y 1 -o "$dir/from_tp2_ep2" >"$dir/resume_from_tp2_ep2.log" 2>&1
resumed "$dir/resume_from_tp2_ep2.log" "$dir/from_tp2_ep2" "MoE written at --tp 2 x --ep 2 (ZeRO-1), resumed on 1 rank"
echo "ok MoE: a run resumed at step 10 reproduces the uninterrupted one: on 2 ranks, from 1 rank to --ep 2 and back, from --tp 2 x --ep 2 to 1 rank"

# The local checkpoint tier at dp 4 x ep 2 under ZeRO-0 (each rank holds all of its layout, and a
# restore from the rank's own file gathers the rest: the experts' ranges from the rank that holds
# the same experts, the others' from the data-parallel group): killed, a node lost, resumed.
local_tier_kill_resume "dp 4 x ep 2" "$trainer" "${common[@]}" --ep 2 -z 0

# --plan knows the experts: each of 4 ranks at --ep 2 holds 2 of the 4 experts (their optimizer
# state sharded over the 2 ranks that hold the same ones) and sends its all-to-all bytes.
"$trainer" "${common[@]}" --ep 2 -z 1 --plan 4 >"$dir/plan.txt" 2>&1 || { echo "FAILED: --plan at --ep 2"; cat "$dir/plan.txt"; exit 1; }
grep -q "^experts: 2 of each MoE block's 4 on this rank (ep 2): .* ZeRO-1 over the 2 rank(s) that hold the same, .* all-to-all: [0-9.]* [KM]iB sent per step" \
    "$dir/plan.txt" || { echo "FAILED: --plan shows no expert line:"; cat "$dir/plan.txt"; exit 1; }
echo "ok --plan at --ep 2: $(grep '^experts:' "$dir/plan.txt")"
# ... and at --tp 2 x --ep 2 each of 8 ranks holds half of each of its 2 experts' MLP: of one expert
# (8 C^2 + 5 C parameters, C = 64) 4 C^2 + 3 C (efcprojb a replica), 2 x 16576 = 0.03M.
"$trainer" "${common[@]}" --tp 2 --ep 2 -z 1 --plan 8 >"$dir/plan_tp.txt" 2>&1 || { echo "FAILED: --plan at --tp 2 x --ep 2"; cat "$dir/plan_tp.txt"; exit 1; }
grep -q "^experts: 2 of each MoE block's 4 on this rank (ep 2), 1/2 of each one's MLP (tp 2): 0.03M parameters (129.5 KiB in fp32)" \
    "$dir/plan_tp.txt" || { echo "FAILED: --plan at --tp 2 shows no tensor-parallel expert line:"; cat "$dir/plan_tp.txt"; exit 1; }
echo "ok --plan at --tp 2 x --ep 2: $(grep '^experts:' "$dir/plan_tp.txt")"

# Bad meshes: each refused before training, naming the flag and the values.
expect_failure "--ep 3 on 2 data-parallel ranks" "--ep 3 must be >= 1 and divide the 2 data-parallel rank(s)" \
    -np 2 "$trainer" "${common[@]}" --ep 3
expect_failure "--ep 2 with 3 experts" "--ep 2 must divide the model's 3 experts" \
    -np 2 "$trainer" "${common[@]}" --experts 3 --ep 2
expect_failure "--ep 2 on a dense model" "--ep 2 splits a mixture-of-experts model's experts, but the model is dense" \
    -np 2 "$trainer" "${common[@]}" --experts 0 --ep 2
expect_failure "--ep 2 with --cp 2" "not yet context parallelism: drop --cp 2" \
    -np 4 "$trainer" "${common[@]}" --ep 2 --cp 2
