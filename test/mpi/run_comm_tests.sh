#!/usr/bin/env bash
# Runs the communicator tests (test_comm.cpp): without a launcher, under mpirun with 1 to 4 ranks,
# and the timeout mode, where one rank never joins and the launch must end with the timeout error
# well before that rank would (it sleeps 10 s), and the same inside one of two sub-groups, where the
# other group must carry on. Every run is capped by `timeout 120` so a hang fails
# the test instead of stalling it.
#   test/mpi/run_comm_tests.sh [path/to/test_comm]
set -euo pipefail

bin=${1:-build/test_comm}
[ -x "$bin" ] || { echo "run_comm_tests.sh: $bin is not built (make $bin)" >&2; exit 1; }
# Open MPI refuses to run as root unless told it is intended (containers, CI).
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# More ranks than cores is fine for correctness tests.
mpirun=(timeout 120 mpirun --oversubscribe)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

start=$(now)
echo "== $bin (no launcher: LocalComm)"
timeout 120 "$bin"
echo "   $(since "$start") s"

for n in 1 2 3 4; do
    start=$(now)
    echo "== mpirun -np $n $bin"
    "${mpirun[@]}" -np "$n" "$bin"
    echo "   $(since "$start") s"
done

# Runs `mpirun -np NP $bin MODE`, which must end by MPI_Abort with code 3 well before the absent rank's
# 10 s sleep would; each further argument "out|PATTERN|PROBLEM" or "err|PATTERN|PROBLEM" is a line
# that stdout or stderr must match, and the problem reported when it does not.
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
expect_timeout_abort() {
    local np=$1 mode=$2 check stream pattern rest rc=0 start elapsed
    shift 2
    start=$(now)
    "${mpirun[@]}" -np "$np" "$bin" "$mode" >"$out" 2>"$err" || rc=$?
    elapsed=$(since "$start")
    cat "$out"
    local problems=()
    [ "$rc" = 3 ] || problems+=("exit code $rc, expected 3 (MPI_Abort from the timed-out rank)")
    for check in "$@"; do
        stream=${check%%|*} rest=${check#*|}
        pattern=${rest%%|*}
        grep -q -- "$pattern" "${!stream}" || problems+=("${rest#*|}")
    done
    # A hang guard for this test, not a performance bound.
    awk -v t="$elapsed" 'BEGIN { exit !(t < 9) }' || problems+=("took $elapsed s; the timeout did not end the launch")
    if [ ${#problems[@]} -gt 0 ]; then
        echo "---- stderr of the $mode run:"
        cat "$err"
        printf 'FAILED: %s\n' "${problems[@]}"
        exit 1
    fi
    echo "   $(grep -m1 'timed out' "$err")"
    echo "   ended with exit code 3 after $elapsed s"
}

echo "== mpirun -np 2 $bin --timeout-test (rank 1 never joins; expect exit 3 after ~1.5 s)"
expect_timeout_abort 2 --timeout-test \
    "err|all_reduce of 1024 f32 timed out after 1.5 s on rank 0 of 2|stderr lacks the timeout error naming the all_reduce" \
    "out|^ok .*a later barrier failed at once|no ok line for the broken communicator"

echo "== mpirun -np 4 $bin --group-timeout-test (groups {0,1} {2,3}; rank 3 never joins; expect exit 3)"
expect_timeout_abort 4 --group-timeout-test \
    "err|all_reduce of 1024 f32 timed out after 1.5 s on rank 0 of 2|stderr lacks rank 2's timeout error naming the all_reduce in its group" \
    "out|^ok .*group {0,1} ran .* checked all_reduces while group {2,3} timed out|no ok line for the group that must carry on" \
    "out|^ok .*recv from the absent rank timed out after 1.0 s|no ok line for the recv timeout"
echo "all communicator tests passed"
