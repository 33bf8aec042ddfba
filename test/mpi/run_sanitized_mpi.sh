#!/usr/bin/env bash
# The multi-rank paths under AddressSanitizer and UndefinedBehaviorSanitizer (make test-sanitize):
# test_pp built with them runs an interleaved pipeline (2 ranks, uneven layers) and a pipeline of
# tensor-parallel groups with sequence parallelism (4 ranks), ZeRO 0-3 each, so every activation
# slot, message buffer and sequence-parallel row block is touched; test_cp runs ring attention on
# cp 4 and on cp 2 x tp 2 (sequence parallel), ZeRO 0-3 each. Any sanitizer report fails it.
#   test/mpi/run_sanitized_mpi.sh build/sanitize/test_pp build/sanitize/test_cp
set -euo pipefail
bin=${1:-build/sanitize/test_pp}
cp_bin=${2:-build/sanitize/test_cp}
for b in "$bin" "$cp_bin"; do [ -x "$b" ] || { echo "run_sanitized_mpi.sh: $b is not built" >&2; exit 1; }; done
source "$(dirname "$0")/lib.sh"
# Leaks are not checked here: Open MPI's plugins, loaded with dlopen and gone by exit, leave
# allocations the suppressions cannot name (the Catch2 suite checks llmc's own for leaks).
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
for mesh in "2 2 1 2 1,3,2,2" "4 2 2 1"; do
    set -- $mesh
    echo "== sanitized: mpirun -np $1 $bin (pp $2, tp $3, $4 chunk(s) per rank${5:+, layers $5})"
    "${mpirun[@]}" -x ASAN_OPTIONS -x UBSAN_OPTIONS -np "$1" "$bin" "$dir" "$2" "$3" "$4" ${5:+"$5"}
done
for mesh in "4 4" "4 2 2"; do
    set -- $mesh
    echo "== sanitized: mpirun -np $1 $cp_bin (cp $2${3:+, tp $3})"
    "${mpirun[@]}" -x ASAN_OPTIONS -x UBSAN_OPTIONS -np "$1" "$cp_bin" "$dir" "$2" ${3:+"$3"}
done
