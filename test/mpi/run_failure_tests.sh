#!/usr/bin/env bash
# Hang and death diagnosis (docs/failures.md, "A rank hangs or dies"), with the CPU trainer under mpirun, 2 ranks
# and fault injection (llmc/failures/faults.h):
#   hung rank     rank 1 hangs in step 5; rank 0's collective times out after --comm-timeout-s 3 and
#                 its report names rank 1 as not arrived, alive, at step 5, with its last completed
#                 collective; rank 1 prints its flight record when mpirun ends it; exit code 3; the job
#                 ends within the timeout + 4 s of the hang; no process is left.
#   killed rank   rank 1 is SIGKILLed in step 5; mpirun ends the job (its message names rank 1) and
#                 rank 0 prints its flight record from its SIGTERM handler; within 5 s; non-zero
#                 exit; no process left.
#   killed rank, launcher keeps the job (--mca orte_abort_on_non_zero_status 0): rank 0's heartbeat
#                 declares rank 1 dead after --peer-dead-s 5, names it as not arrived, and the job
#                 ends by MPI_Abort with code 4 (EXIT_PEER_DEAD) within 5 + 4 s of the kill, well
#                 before the 30 s collective timeout; no process left.
# Every stderr line is timestamped as it arrives, so detection is timed from the fault's own line.
#   test/mpi/run_failure_tests.sh [path/to/train_gpt_cpu]
set -euo pipefail

bin=${1:-./train_gpt_cpu}
[ -x "$bin" ] || { echo "run_failure_tests.sh: $bin is not built (make train_gpt_cpu)" >&2; exit 1; }
ls data/default/default_train_*.bin >/dev/null 2>&1 || { echo "run_failure_tests.sh: no data (make data)" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tiny=(-i 'data/default/default_train_*.bin' -j "" --tokenizer "" --num-layers 2 --channels 64 --num-heads 2
      --max-seq-len 64 -b 2 -t 32 -x 40 -v 0 -s 0)

failures=0
problem() { echo "FAILED: $*"; failures=$((failures + 1)); }
# Seconds from the first stderr line matching $1 to $2 (an $EPOCHREALTIME).
since_line() {
    local t
    t=$(grep -m1 -- "$1" "$tmp/err" | cut -d' ' -f1)
    [ -n "$t" ] || { echo 999; return; }
    awk -v a="$t" -v b="$2" 'BEGIN { printf "%.2f", b - a }'
}
below() { awk -v x="$1" -v y="$2" 'BEGIN { exit !(x < y) }'; }

# Runs the trainer under mpirun with fault $1, mpirun options $2 and trainer flags after; sets rc,
# end (time the launch ended) and the logs $tmp/out and $tmp/err (stderr, each line timestamped).
run_job() {
    local faults=$1 mpirun_opts=$2
    shift 2
    local dir="$tmp/run_${faults//[@:]/_}"
    rc=0
    # shellcheck disable=SC2086
    LLMC_FAULTS=$faults timeout 60 mpirun $mpirun_opts --oversubscribe -np 2 "$bin" "${tiny[@]}" -o "$dir" "$@" \
        >"$tmp/out" 2> >(while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$tmp/err") \
        || rc=$?
    end=$EPOCHREALTIME
    sleep 1  # the process substitution finishes its last lines; killed ranks are reaped
    if pgrep -f -- "$dir" >/dev/null; then
        problem "processes left behind: $(pgrep -af -- "$dir" | awk 'NR <= 3')"
        pkill -KILL -f -- "$dir" || true
    fi
}
expect_err() {  # a stderr line must match
    grep -q -- "$1" "$tmp/err" || problem "$2"
}
show() {
    echo "---- stderr (timestamps cut):"
    # awk reads to the end: head would close the pipe early and, under pipefail, fail the script (141)
    cut -d' ' -f2- "$tmp/err" | sed 's/^/   /' | grep -v '^   $' | awk -v n="${1:-40}" 'NR <= n'
}

echo "== hung rank: LLMC_FAULTS=hang@5:1, --comm-timeout-s 3 (expect the report naming rank 1, exit 3)"
run_job hang@5:1 "" --comm-timeout-s 3
show 30
[ "$rc" = 3 ] || problem "exit code $rc, expected 3 (EXIT_COMM_TIMEOUT)"
expect_err "error (rank 0): .* timed out after 3.0 s on rank 0 of 2" "no timeout error from rank 0"
expect_err "not arrived at #[0-9]* on communicator 0 (the world): rank 1$" "the report does not name rank 1 as not arrived"
expect_err "rank 1: alive (heard .*), at step 5, in no collective; last completed: #[0-9]* .* at step [45]," \
    "the report does not show rank 1 alive at step 5 with its last completed collective"
expect_err "rank 0 (this rank): alive, at step 5, waiting in #" "the report does not say what rank 0 waited on"
expect_err "rank 1 was terminated by a signal" "rank 1 printed no flight record when the launcher ended it"
t=$(since_line "fault injection: rank 1 hangs in step 5" "$end")
below "$t" 7 || problem "the job ended $t s after the hang; expected within the 3 s timeout + 4 s"
echo "   ended with exit code $rc, $t s after rank 1 hung"

echo "== killed rank: LLMC_FAULTS=kill@5:1 under plain mpirun (expect mpirun to end the job, naming rank 1)"
run_job kill@5:1 "" --comm-timeout-s 60
show 12
[ "$rc" != 0 ] || problem "exit code 0 after a rank was killed"
expect_err "mpirun noticed that process rank 1 .* exited on signal 9" "mpirun's message naming rank 1 is missing"
expect_err "rank 0 was terminated by a signal .* at step 5" "rank 0 printed no flight record (at step 5) when mpirun ended it"
t=$(since_line "fault injection: rank 1 kills itself" "$end")
below "$t" 5 || problem "the job ended $t s after the kill; expected within 5 s"
echo "   ended with exit code $rc, $t s after rank 1 was killed"

echo "== killed rank, mpirun keeps the job (--mca orte_abort_on_non_zero_status 0): the heartbeat must see it"
run_job kill@5:1 "--mca orte_abort_on_non_zero_status 0" --comm-timeout-s 30
show 12
[ "$rc" != 0 ] || problem "exit code 0 after a rank was killed"
expect_err "rank 0: peer dead: rank 1 (no heartbeat for [0-9.]* s) is gone" "rank 0's heartbeat did not declare rank 1 dead"
expect_err "not arrived at #[0-9]* on communicator 0 (the world): rank 1$" "the report does not name rank 1 as not arrived"
expect_err "rank 1: DEAD" "the report does not mark rank 1 dead"
# The collective fails with the peer-dead error (exit code 4, EXIT_PEER_DEAD, for MPI_Abort). mpirun's
# own "MPI_ABORT ... with errorcode 4" notice is not checked: under load Open MPI 4.1 sometimes
# loses it ("ORTE_ERROR_LOG: Data unpack would read past end of buffer ... show_help.c").
expect_err "error (rank 0): .* failed on rank 0 of 2: peer dead: rank 1" "rank 0's collective did not fail with the peer-dead error"
t=$(since_line "fault injection: rank 1 kills itself" "$end")
below "$t" 9 || problem "the job ended $t s after the kill; expected within --peer-dead-s 5 + 4 s"
echo "   ended with exit code $rc (mpirun reports the killed rank's signal), $t s after rank 1 was killed"

if [ "$failures" -gt 0 ]; then
    echo "$failures failure test check(s) FAILED"
    exit 1
fi
echo "all failure tests passed"
