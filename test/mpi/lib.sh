# test/mpi/lib.sh: what the mpirun test scripts share. Source it after `set -euo pipefail`:
#   mpirun        an array: timeout 300 mpirun --oversubscribe (as root, with Open MPI's consent)
#   dir           a scratch directory, removed on exit
#   expect_failure WHAT PATTERN MPIRUN_ARGS...   the launch must exit non-zero with PATTERN on stderr
#   walk_shard FILE SEED MULT INC SPREAD          a training shard of a fixed random walk (250-token vocabulary)
#   run_like_one NAME NP FLAGS...                  $trainer on NP ranks for 20 steps: $dir/one's curve
#   curve METRICS / same_curve A B WHAT [TOLS]    a run's training curve, and two runs' compared
#   checkpoint_bytes DIR                          a checkpoint's bytes, each file checked to hold what its
#                                                 manifest lists
#   check_resumed LOG METRICS FROM CKPT STEP WHAT  a run resumed from CKPT at STEP and continued FROM's curve
#   local_tier_kill_resume WHAT TRAINER_ARGS...    the local checkpoint tier survives a killed rank and a lost node
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1  # ranks share the cores
mpirun=(timeout 300 mpirun --oversubscribe)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# walk_shard FILE SEED MULT INC SPREAD: 30000 tokens of a 250-token vocabulary, the walk
# t -> (t * MULT + INC + a random 0..SPREAD-1) % 250 from seed SEED: learnable, but not trivially.
walk_shard() {
    "${PYTHON:-/usr/bin/python3}" - "$@" <<'PY'
import random, struct, sys
path, (seed, mult, inc, spread) = sys.argv[1], map(int, sys.argv[2:6])
random.seed(seed)
tokens, t = [], 0
for _ in range(30000):
    t = (t * mult + inc + random.randrange(spread)) % 250
    tokens.append(t)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
}

# run_like_one NAME NP FLAGS...: $trainer with "${common[@]}" and FLAGS on NP ranks for 20 steps, into
# $dir/NAME, whose curve must be the 1-rank run's in $dir/one (same_curve).
run_like_one() {
    local name=$1 np=$2
    shift 2
    "${mpirun[@]}" -np "$np" "$trainer" "${common[@]}" -x 20 "$@" -o "$dir/$name" >"$dir/$name.log"
    same_curve "$dir/one/metrics.jsonl" "$dir/$name/metrics.jsonl" "$name against 1 rank"
    echo "ok $name ($np rank(s), $*) reproduces 1 rank's losses and gradient norms for 20 steps"
}

expect_failure() {
    local what=$1 pattern=$2
    shift 2
    local rc=0
    "${mpirun[@]}" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
    if [ "$rc" = 0 ] || ! grep -q -- "$pattern" "$dir/err"; then
        echo "FAILED: $what: exit code $rc, stderr:"; cat "$dir/err"; exit 1
    fi
    echo "ok $what: $(grep -m1 -- "$pattern" "$dir/err")"
}

# "step loss norm" for every training record of a metrics.jsonl (keys are written sorted), but those
# a rollback or replay superseded.
curve() { grep '"train_loss"' "$1" | grep -v '"superseded"' | sed -E 's/.*"grad_norm":([^,}]*).*"step":([0-9]+).*"train_loss":([^,}]*).*/\2 \3 \1/'; }
# same_curve A B WHAT [LOSS_TOL NORM_TOL]: every step of B is in A with the loss within 1e-5 and the
# norm within 1e-4 relative (or the tolerances given).
same_curve() {
    local expected
    expected=$(curve "$2" | wc -l)
    if ! join <(curve "$1" | sort -k1,1) <(curve "$2" | sort -k1,1) | awk -v n="$expected" -v lt="${4:-1e-5}" -v nt="${5:-1e-4}" '
        function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
        { count++; if (rel($4, $2) > lt + 0 || rel($5, $3) > nt + 0) { print "step " $1 ": " $2 " " $3 " vs " $4 " " $5; bad++ } }
        END { exit !(count == n && n > 0 && bad == 0) }'; then
        echo "FAILED: $3: the curves differ"; exit 1
    fi
}
# check_resumed LOG METRICS FROM CKPT STEP WHAT: the run that wrote LOG and METRICS resumed from the
# checkpoint directory CKPT at STEP, its first step is STEP + 1, and its curve is FROM's (a metrics.jsonl).
check_resumed() {
    local log=$1 metrics=$2 from=$3 ckpt=$4 step=$5 what=$6
    grep -q "resumed from $ckpt: step $step" "$log" || { echo "FAILED: $what: no resume"; cat "$log"; exit 1; }
    [ "$(curve "$metrics" | head -1 | cut -d' ' -f1)" = $((step + 1)) ] ||
        { echo "FAILED: $what: the resumed run did not start at step $((step + 1))"; exit 1; }
    same_curve "$from" "$metrics" "$what"
}
# local_tier_kill_resume WHAT TRAINER_ARGS...: the local checkpoint tier on 4 ranks of TRAINER_ARGS (2
# per node, 8 steps, a local checkpoint every 4 written before the next step starts, so the kill
# always finds step 4's): a whole run, then one whose rank 3 is killed in step 6, node 1's directory
# removed, resumed with -y 1 from step 4's local checkpoint (node 1's files from node 0's replicas):
# the whole run's curve. Leaves the tier in $dir/local_killed and the run in $dir/local_killed.out.
local_tier_kill_resume() {
    local what=$1
    shift
    local run=("${mpirun[@]}" -np 4 "$@" -x 8 --local-ckpt-every 4 --ranks-per-node 2 --ckpt-sync 1)
    "${run[@]}" --local-ckpt-dir "$dir/local_whole" -o "$dir/local_whole.out" >"$dir/local_whole.log"
    "${run[@]}" --local-ckpt-dir "$dir/local_killed" -o "$dir/local_killed.out" --faults kill@6:3 \
        >"$dir/local_killed.log" 2>&1 && { echo "FAILED: $what: the kill did not happen"; exit 1; }
    grep -q "^fault injection: rank 3 kills itself (SIGKILL) in step 6" "$dir/local_killed.log" ||
        { echo "FAILED: $what: the run failed, but not by the injected kill"; cat "$dir/local_killed.log"; exit 1; }
    local root="$dir/local_killed/run_$(sed 's/.*"run_id":"\([^"]*\)".*/\1/' "$dir/local_killed.out/run.json")"
    rm -rf "$root/node_00001"
    "${run[@]}" --local-ckpt-dir "$dir/local_killed" -o "$dir/local_killed.out" -y 1 >"$dir/local_resumed.log"
    grep -q "resumed from $root/node_00000/ckpt_00000004 (local tier): step 4" "$dir/local_resumed.log" ||
        { echo "FAILED: $what: no resume from the local tier"; cat "$dir/local_resumed.log"; exit 1; }
    same_curve "$dir/local_whole.out/metrics.jsonl" "$dir/local_killed.out/metrics.jsonl" "the local tier at $what"
    echo "ok the local tier at $what: killed at step 6, a node's directory lost, resumed from step 4, the same curve"
}
# checkpoint_bytes DIR: the bytes of a checkpoint's rank files, once each file is found to hold exactly
# what the manifest lists for it (its size is the sum of its slices, which lie back to back).
checkpoint_bytes() {
    "${PYTHON:-/usr/bin/python3}" - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
manifest = json.load(open(os.path.join(d, "manifest.json")))
total = 0
for f in manifest["files"]:
    at = 0
    for b in f["buffers"]:
        size = {"f32": 4, "bf16": 2}[b["dtype"]]
        for s in b["slices"]:
            begin, end, offset = s[1:4]
            run, stride = (s[4], s[5]) if len(s) > 4 else (end - begin, end - begin)
            if offset != at:
                sys.exit(f"{f['path']}: a slice of {s[0]} at byte {offset}, expected {at}: unlisted bytes before it")
            at += ((end - begin - run) // stride + 1) * run * size
    on_disk = os.path.getsize(os.path.join(d, f["path"]))
    if not at == f["bytes"] == on_disk:
        sys.exit(f"{f['path']}: {on_disk} bytes, the manifest says {f['bytes']} and lists {at}")
    total += on_disk
print(total)
PY
}
# same_checkpoint_bytes REF OUT WHAT: OUT's checkpoint holds each element once, as REF's does: the
# same bytes in all, each file exactly what its manifest lists.
same_checkpoint_bytes() {
    local ref out
    ref=$(checkpoint_bytes "$1") && out=$(checkpoint_bytes "$2") ||
        { echo "FAILED: $3: a checkpoint's files hold what their manifest does not list"; exit 1; }
    [ "$out" = "$ref" ] || { echo "FAILED: $3: the checkpoint has $out bytes, the reference $ref"; exit 1; }
    echo "ok $3: $out bytes, as the reference, each file exactly what the manifest lists"
}
