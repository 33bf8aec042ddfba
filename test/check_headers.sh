#!/usr/bin/env bash
# The suffix rule of llmc/: a .h file compiles with the host compiler alone (no nvcc, no CUDA
# headers) and is self-contained (it includes what it uses). Each header is compiled on its own with
# -fsyntax-only; a failure names the header and shows the compiler's first errors.
#   test/check_headers.sh [CXX] [extra flags, e.g. MPI's -I]
set -uo pipefail
cd "$(dirname "$0")/.."
CXX="${1:-g++}"
shift || true
failed=0
for h in $(find llmc -name '*.h' | sort); do
    # a build without MPI (make NO_MPI=1) has no mpi.h for the MPI communicator to include
    [[ ( "$h" == llmc/dist/comm_mpi.h || "$h" == llmc/dist/heartbeat.h ) && " $* " == *" -DLLMC_NO_MPI "* ]] && continue
    if ! out=$(echo "#include \"$h\"" | "$CXX" -std=c++20 -fopenmp -march=native -fsyntax-only -I. "$@" -x c++ - 2>&1); then
        echo "FAIL $h does not compile alone with $CXX (a .h must need no nvcc and include what it uses):"
        echo "$out" | head -5
        failed=1
    fi
done
[ $failed -eq 0 ] && echo "ok every llmc/ .h header compiles alone with $CXX"
exit $failed
