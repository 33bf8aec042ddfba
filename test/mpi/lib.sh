# test/mpi/lib.sh: what the mpirun test scripts share. Source it after `set -euo pipefail`:
#   mpirun        an array: timeout 300 mpirun --oversubscribe (as root, with Open MPI's consent)
#   dir           a scratch directory, removed on exit
#   expect_failure WHAT PATTERN MPIRUN_ARGS...   the launch must exit non-zero with PATTERN on stderr
#   curve METRICS / same_curve A B WHAT           a run's training curve, and two runs' compared
#   checkpoint_bytes DIR                          a checkpoint's bytes, each file checked to hold what its
#                                                 manifest lists
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1  # ranks share the cores
mpirun=(timeout 300 mpirun --oversubscribe)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

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
# same_curve A B WHAT: every step of B is in A with the loss within 1e-5 and the norm within 1e-4 relative.
same_curve() {
    local expected
    expected=$(curve "$2" | wc -l)
    if ! join <(curve "$1" | sort -k1,1) <(curve "$2" | sort -k1,1) | awk -v n="$expected" '
        function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
        { count++; if (rel($4, $2) > 1e-5 || rel($5, $3) > 1e-4) { print "step " $1 ": " $2 " " $3 " vs " $4 " " $5; bad++ } }
        END { exit !(count == n && n > 0 && bad == 0) }'; then
        echo "FAILED: $3: the curves differ"; exit 1
    fi
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
