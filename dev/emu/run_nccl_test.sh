#!/usr/bin/env bash
# The emulated NCCL's test (dev/emu/test_nccl.cpp) on 1, 2 and 4 MPI ranks, then the checks that a
# host buffer, and a receive shorter than its send, stop the emulator with an error naming the call.
# Builds nothing:
#   dev/emu/run_nccl_test.sh build/emu/test_nccl
set -euo pipefail

bin=${1:?usage: run_nccl_test.sh TEST_NCCL_BINARY}
[ -x "$bin" ] || { echo "run_nccl_test.sh: $bin is not built" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "run_nccl_test.sh: no mpirun" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

for np in 1 2 4; do
    echo "== test_nccl: $np rank(s)"
    timeout 300 mpirun --oversubscribe -np "$np" "$bin"
done

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# must_fail NP MODE PATTERN WHAT: the mode ends the launch with an error matching PATTERN
must_fail() {
    echo "== test_nccl $2: $1 rank(s), must fail: $4"
    if timeout 120 mpirun --oversubscribe -np "$1" "$bin" "$2" > "$log" 2>&1; then
        echo "FAIL $4: the launch succeeded"; cat "$log"; exit 1
    fi
    grep -q "$3" "$log" || { echo "FAIL $4: no error matching '$3'"; cat "$log"; exit 1; }
    echo "ok $4: $(grep -m1 "$3" "$log")"
}
must_fail 1 --host-buffer "ncclAllReduce.*not inside one cudaMalloc'd allocation" \
    "a host buffer stops ncclAllReduce"
must_fail 2 --short-receive "ncclRecv.*longer than this receive" "a receive shorter than its send stops ncclRecv"
