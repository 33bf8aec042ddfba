# test/mpi/lib.sh: what the mpirun test scripts share. Source it after `set -euo pipefail`:
#   mpirun        an array: timeout 300 mpirun --oversubscribe (as root, with Open MPI's consent)
#   dir           a scratch directory, removed on exit
#   expect_failure WHAT PATTERN MPIRUN_ARGS...   the launch must exit non-zero with PATTERN on stderr
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
