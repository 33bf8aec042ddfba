#!/usr/bin/env bash
# scripts/supervise.sh: a restart supervisor. Runs a training command; when it fails in a way a
# relaunch can get past (llmc/failures/exit_codes.h), relaunches it with -y 1 (resume from the newest complete
# checkpoint) until the run finishes or the restart budget is spent.
#
#   scripts/supervise.sh [options] -- COMMAND...
#   scripts/supervise.sh --max-restarts 5 --log out/run.supervise.log -- \
#       mpirun -np 4 ./train_gpt_cpu -x 5000 -n 100 -o out/run
#
# Options:
#   --max-restarts N   relaunch at most N times (default 10)
#   --log FILE         also append the supervisor's own lines (restarts, causes, summary) to FILE
#   --output-dir DIR   the run's output directory, when the command does not show it (a preset
#                      script sets -o inside itself); default: the command's last -o/--output-dir,
#                      else the trainer's default, out
#   --faults-once      relaunches run without fault injection: LLMC_FAULTS is unset and --faults
#                      dropped from the command after the first launch (for tests: a kill@S fault
#                      would otherwise fire again when the resumed run reaches step S)
#   --restart-delay S  seconds to wait before each relaunch (default 0)
#
# Exit codes decide (exit_codes.h): 0 the run finished; 1 a configuration error: never relaunched
# (the same command fails the same way); 5 diverged and 6 corruption (and 8, a straggler refused by
# the health check): reported, not relaunched (relaunching repeats the failure, or needs a person
# or a scheduler to exclude a node); 2 runtime, 3 collective timeout, 4 dead peer, 7 checkpoint
# write failed and >128 (killed by a signal; mpirun exits 137 when a rank was SIGKILLed): relaunched.
# Any other code (126/127: the command cannot run) is not relaunched.
#
# Each failure is logged with its exit code and meaning, the lines of the job's output that say where
# it failed (the collective-timeout report naming ranks, "error" lines, mpirun's "process rank N ...
# exited on signal" line), and, once the relaunched job has resumed, the steps lost (the last step in
# <output_dir>/metrics.jsonl before the failure minus the step it resumed from) and the time from
# the failure's detection to the relaunched job's first step. The summary at the end gives the
# restarts, their causes, the steps lost and the effective training time (the time of the steps
# kept in metrics.jsonl over the wall time). The supervisor exits 0 when the run finished, else with
# the last exit code.
set -uo pipefail

max_restarts=10
log_file=""
output_dir=""
faults_once=0
restart_delay=0

usage() {
    sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 1
}
while [ $# -gt 0 ]; do
    case "$1" in
    --max-restarts) max_restarts=${2:-}; shift 2 ;;
    --log) log_file=${2:-}; shift 2 ;;
    --output-dir) output_dir=${2:-}; shift 2 ;;
    --faults-once) faults_once=1; shift ;;
    --restart-delay) restart_delay=${2:-}; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "supervise.sh: unknown option '$1' (the command goes after --)" >&2; exit 1 ;;
    esac
done
[[ $max_restarts =~ ^[0-9]+$ ]] || { echo "supervise.sh: --max-restarts must be a count, got '$max_restarts'" >&2; exit 1; }
[[ $restart_delay =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "supervise.sh: --restart-delay must be seconds, got '$restart_delay'" >&2; exit 1; }
[ $# -gt 0 ] || { echo "supervise.sh: no command (give it after --)" >&2; exit 1; }
cmd=("$@")

say() {  # a supervisor line: to stderr and the --log file
    local line="supervise: $*"
    printf '%s\n' "$line" >&2
    if [ -n "$log_file" ]; then printf '%s %s\n' "$(date '+%F %T')" "$line" >>"$log_file"; fi
}

# The output directory: the last -o / --output-dir / --output_dir (or --flag=value) of the command.
if [ -z "$output_dir" ]; then
    prev=""
    for arg in "${cmd[@]}"; do
        case "$prev" in -o | --output-dir | --output_dir) output_dir=$arg ;; esac
        case "$arg" in --output-dir=* | --output_dir=*) output_dir=${arg#*=} ;; esac
        prev=$arg
    done
    if [ -z "$output_dir" ]; then
        output_dir=out
        say "the command has no -o; assuming the trainer's default output directory 'out' (--output-dir sets it)"
    fi
fi
metrics="$output_dir/metrics.jsonl"

exit_meaning() {
    case "$1" in
    0) echo "finished" ;;
    1) echo "configuration error (EXIT_CONFIG)" ;;
    2) echo "runtime error (EXIT_RUNTIME)" ;;
    3) echo "a collective timed out: a rank hung or died (EXIT_COMM_TIMEOUT)" ;;
    4) echo "a rank died (EXIT_PEER_DEAD)" ;;
    5) echo "training diverged (EXIT_DIVERGED)" ;;
    6) echo "parameters diverged across replicas: faulty hardware (EXIT_CORRUPTION)" ;;
    7) echo "a checkpoint failed to write under --ckpt-fail-stop (EXIT_CKPT_FAILED)" ;;
    8) echo "the health check found a straggler and --straggler-action is refuse (EXIT_STRAGGLER)" ;;
    126 | 127) echo "the command cannot be run" ;;
    *) if [ "$1" -gt 128 ]; then echo "killed by signal $(($1 - 128)) ($(kill -l $(($1 - 128)) 2>/dev/null || echo '?'))"
       else echo "unknown exit code"; fi ;;
    esac
}
# restart | stop (a failure relaunching cannot fix) | config (never relaunched)
exit_action() {
    case "$1" in
    1 | 126 | 127) echo config ;;
    2 | 3 | 4 | 7) echo restart ;;
    *) if [ "$1" -gt 128 ]; then echo restart; else echo stop; fi ;;
    esac
}

# Whether metrics.jsonl is this run's: written by an attempt, or the past of a run the command
# resumes. An earlier run's file, left in the directory by a run that failed before its first step,
# says nothing of this one.
metrics_are_ours() { [ "$metrics" -nt "$work/started" ] || has_resume "${run_cmd[@]}"; }
last_step() {  # the last training step this run recorded in metrics.jsonl (0 if none)
    metrics_are_ours || { echo 0; return; }
    local s
    s=$(sed -nE '/"superseded"/d; s/.*"step":([0-9]+),.*"train_loss".*/\1/p' "$metrics" 2>/dev/null | tail -n 1)
    echo "${s:-0}"
}
has_resume() {  # whether the command already resumes (-y 1, --resume 1, --resume-from)
    local prev="" arg
    for arg in "$@"; do
        case "$prev" in -y | --resume) [ "$arg" = 1 ] && return 0 ;; esac
        case "$arg" in --resume=1 | --resume-from | --resume_from | --resume-from=* | --resume_from=*) return 0 ;; esac
        prev=$arg
    done
    return 1
}
without_faults() {  # the command without --faults X / --faults=X, into the array `stripped`
    stripped=()
    local skip=0 arg
    for arg in "$@"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        case "$arg" in --faults) skip=1; continue ;; --faults=*) continue ;; esac
        stripped+=("$arg")
    done
}

work=$(mktemp -d)
touch "$work/started"
job_pid=""
# shellcheck disable=SC2317  # invoked by the traps below
on_signal() {
    say "interrupted ($1): stopping the job"
    if [ -n "$job_pid" ]; then kill -TERM "$job_pid" 2>/dev/null; wait "$job_pid" 2>/dev/null; fi
    rm -rf "$work"
    exit 130
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'rm -rf "$work"' EXIT

# Copies the job's output to stdout and to the attempt's log; at the first training step after a
# relaunch, logs the recovery: the resume step, the steps lost and the time since the failure.
# Arguments: ATTEMPT_LOG FAILED_AT (EPOCHREALTIME of the failure, "" on the first launch) LOST_FROM
# (the last step before the failure).
relay() {
    local attempt_log=$1 failed_at=$2 lost_from=$3 line resumed=0 seen_step=0 tier=""
    while IFS= read -r line; do
        printf '%s\n' "$line"
        printf '%s\n' "$line" >>"$attempt_log"
        if [[ $line =~ resumed\ from\ .*:\ step\ ([0-9]+) ]]; then
            resumed=${BASH_REMATCH[1]}
            if [[ $line == *"(local tier)"* ]]; then tier=" (local tier)"; fi
        fi
        if [ $seen_step = 0 ] && [[ $line =~ ^step\ +[0-9]+/[0-9]+\ \| ]]; then
            seen_step=1
            if [ -n "$failed_at" ]; then
                local now=$EPOCHREALTIME lost=$((lost_from - resumed))
                [ $lost -ge 0 ] || lost=0
                local secs
                secs=$(awk -v a="$failed_at" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
                echo "$resumed $lost $secs" >"$attempt_log.recovery"
                say "recovered: resumed from step $resumed$tier, $lost step(s) lost (last step before the failure: $lost_from), first step ${secs} s after the failure"
            fi
        fi
    done
}

start_time=$EPOCHREALTIME
attempt=0
restarts=0
rc=0
failed_at=""
lost_from=0
causes=()
total_lost=0
total_recovery=0
run_cmd=("${cmd[@]}")
while :; do
    attempt=$((attempt + 1))
    attempt_log="$work/attempt_$attempt.log"
    : >"$attempt_log"
    say "attempt $attempt: $(printf '%q ' "${run_cmd[@]}")"
    mkfifo "$work/fifo"
    relay "$attempt_log" "$failed_at" "$lost_from" <"$work/fifo" &
    relay_pid=$!
    "${run_cmd[@]}" >"$work/fifo" 2>&1 &
    job_pid=$!
    wait "$job_pid"
    rc=$?
    job_pid=""
    wait "$relay_pid"
    rm -f "$work/fifo"
    if [ -f "$attempt_log.recovery" ]; then
        read -r _ lost secs <"$attempt_log.recovery"
        total_lost=$((total_lost + lost))
        total_recovery=$(awk -v a="$total_recovery" -v b="$secs" 'BEGIN { print a + b }')
    fi
    [ $rc = 0 ] && { say "attempt $attempt: the run finished"; break; }

    failed_at=$EPOCHREALTIME
    # The steps since the newest checkpoint are lost. When this attempt failed before its first
    # step, the previous failure's steps are still unrecovered: keep the later of the two.
    step_now=$(last_step)
    if [ $attempt = 1 ] || [ -f "$attempt_log.recovery" ] || [ "$step_now" -gt "$lost_from" ]; then lost_from=$step_now; fi
    meaning=$(exit_meaning $rc)
    say "attempt $attempt failed: exit code $rc, $meaning; last step in $metrics: $step_now"
    # Where it failed: a report naming ranks, mpirun's line for a rank that died, the last errors.
    where=$(grep -aiE 'never arrived|did not arrive|timed out|timeout|report|exited on signal|^error|[^a-z]error[ :(]|fault injection' \
                "$attempt_log" | sed -E 's/^ +//' | awk '!seen[$0]++' | tail -n 6)
    if [ -n "$where" ]; then
        while IFS= read -r line; do say "    $line"; done <<<"$where"
    fi
    rank=$(sed -nE 's/.*process rank ([0-9]+) with PID .* exited on signal ([0-9]+).*/rank \1 (signal \2)/p' "$attempt_log" | head -n 1)
    causes+=("attempt $attempt: exit $rc, $meaning${rank:+, $rank}")

    case $(exit_action $rc) in
    config) say "not relaunching: $meaning; the same command would fail the same way (fix it and run again)"; break ;;
    stop) say "not relaunching: $meaning; this needs a person (see docs/failures.md)"; break ;;
    esac
    if [ $restarts -ge "$max_restarts" ]; then
        say "not relaunching: the restart budget (--max-restarts $max_restarts) is spent"
        break
    fi
    restarts=$((restarts + 1))
    if [ $faults_once = 1 ]; then
        unset LLMC_FAULTS
        without_faults "${run_cmd[@]}"
        run_cmd=("${stripped[@]}")
    fi
    if ! has_resume "${run_cmd[@]}"; then run_cmd+=(-y 1); fi
    if [ "$restart_delay" != 0 ]; then sleep "$restart_delay"; fi
    say "restart $restarts of at most $max_restarts: relaunching with -y 1"
done

wall=$(awk -v a="$start_time" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
steps_s=0
if metrics_are_ours; then
    steps_s=$(awk '/"train_loss"/ && !/"superseded"/ && match($0, /"step_ms":[0-9.e+-]+/) { t += substr($0, RSTART + 10, RLENGTH - 10) }
                   END { printf "%.1f", t / 1000 }' "$metrics" 2>/dev/null)
fi
steps_s=${steps_s:-0}
say "summary: $([ $rc = 0 ] && echo "finished" || echo "FAILED (exit code $rc)") after $attempt attempt(s), $restarts restart(s)"
for c in "${causes[@]}"; do say "    $c"; done
say "    steps lost: $total_lost; failure to first step after restart: ${total_recovery} s in all"
say "    effective training time: ${steps_s} s of steps kept in $metrics over ${wall} s wall ($(awk -v a="$steps_s" -v b="$wall" 'BEGIN { printf "%.0f", (b > 0 ? 100 * a / b : 0) }')%)"
exit $rc
