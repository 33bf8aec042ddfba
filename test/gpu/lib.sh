# test/gpu/lib.sh: what the CUDA model's multi-rank test scripts share. Source it after
# `set -euo pipefail`; then:
#   gpu_checks NAME BINARY...      every BINARY built (else exit 1); without a GPU or mpirun: skipped
#                                  (exit 0), except in a GPU session (LLMC_GPU_SESSION=1), where
#                                  either fails (exit 3 without a GPU, 1 without mpirun); then $dir,
#                                  a scratch directory removed on exit
#   run NAME RANKS B ARGS...       $trainer with ${common[@]} -b B ARGS into $dir/NAME (log $dir/NAME.log)
#   losses NAME                    "step loss" for every training record of a run
#   compare A B LIMIT [STEPS]      B's step losses within LIMIT (relative) of A's same steps (20 of them)
#   gpus_on_node                   how many GPUs this node has (emulated: one per rank, so 8)
# The trainer runs' model and sequence length: test_model and test_T (LLMC_GPU_TEST_MODEL, default
# "-e d4", and LLMC_GPU_TEST_T, default 64; each script's step reads 16 x test_T tokens). On the
# emulator (LLMC_EMULATED=1: the binaries are the emulation build, dev/emu/emu.h, and need no GPU)
# test/emu/run_emu_tests.sh makes both small.

gpu_checks() {
    local name=$1 f
    shift
    for f in "$@"; do
        [ -x "$f" ] || { echo "$name: $f is not built" >&2; exit 1; }
    done
    local session=${LLMC_GPU_SESSION:-0}
    if [ "${LLMC_EMULATED:-0}" != 1 ] && ! nvidia-smi -L > /dev/null 2>&1; then
        [ "$session" = 1 ] && { echo "$name: no GPU: FAIL (LLMC_GPU_SESSION=1)"; exit 3; }
        echo "$name: no GPU: skipped"; exit 0
    fi
    if ! command -v mpirun > /dev/null; then
        [ "$session" = 1 ] && { echo "$name: no mpirun: FAIL (LLMC_GPU_SESSION=1)"; exit 1; }
        echo "$name: no mpirun: skipped"; exit 0
    fi
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
    export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}  # a spinning idle OpenMP thread takes a rank's core
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
}

run() {
    local name=$1 ranks=$2 batch=$3 t0=$SECONDS
    shift 3
    echo "== $name: $ranks rank(s), B $batch $*"
    if [ "$ranks" = 1 ]; then "$trainer" "${common[@]}" -b "$batch" "$@" -o "$dir/$name" > "$dir/$name.log"
    else timeout 300 mpirun --oversubscribe -np "$ranks" "$trainer" "${common[@]}" -b "$batch" "$@" -o "$dir/$name" \
        > "$dir/$name.log"; fi
    echo "   ($name: $((SECONDS - t0)) s)"  # where a suite's time goes (CI's 40 minutes)
}

# metrics.jsonl's keys are written sorted
losses() { sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$dir/$1/metrics.jsonl"; }

compare() {
    join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) | awk -v limit="$3" -v steps="${4:-20}" -v what="$2 vs $1" '
        { d = ($2 - $3) / $2; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
        END { if (n != steps) { print "FAIL " what ": " n " common steps, expected " steps; exit 1 }
              printf "%s %s: worst relative loss difference %.2g over %d steps (limit %s)\n", (worst <= limit ? "ok" : "FAIL"), what, worst, n, limit
              exit worst <= limit ? 0 : 1 }'
}

# resume_check STEP STEPS LIMIT BATCH ARGS...: a 1-rank run of STEPS steps ($dir/ref) checkpoints at
# STEP; a copy of that checkpoint, resumed by $trainer, must end with ref's model.bin bit for bit,
# and resumed by $cpu_trainer, within LIMIT of ref's losses over the remaining steps.
resume_check() {
    local step=$1 steps=$2 limit=$3 batch=$4 ckpt
    shift 4
    ckpt=$(printf 'ckpt_%08d' "$step")
    run ref 1 "$batch" "$@" -n "$step" -nk 0
    mkdir -p "$dir/resumed" "$dir/cpu_resumed"
    cp -r "$dir/ref/$ckpt" "$dir/resumed/"
    cp -r "$dir/ref/$ckpt" "$dir/cpu_resumed/"
    run resumed 1 "$batch" "$@" -n "$step" -nk 0 -y 1
    grep -q "resumed from $dir/resumed/$ckpt" "$dir/resumed.log" || { echo "FAIL: no resume"; exit 1; }
    cmp "$dir/ref/model.bin" "$dir/resumed/model.bin" || { echo "FAIL: model.bin differs after the resume"; exit 1; }
    echo "ok a run resumed at step $step ends bitwise equal to the uninterrupted one"
    echo "== cpu_resumed: train_gpt_cpu from the same checkpoint"
    "$cpu_trainer" "${common[@]}" -b "$batch" "$@" -n "$step" -nk 0 -y 1 -o "$dir/cpu_resumed" > "$dir/cpu_resumed.log"
    grep -q "resumed from $dir/cpu_resumed/$ckpt" "$dir/cpu_resumed.log" || { echo "FAIL: no CPU resume"; exit 1; }
    compare ref cpu_resumed "$limit" $((steps - step))
}

gpus_on_node() {
    if [ "${LLMC_EMULATED:-0}" = 1 ]; then echo 8; else nvidia-smi -L | wc -l; fi
}

read -r -a test_model <<< "${LLMC_GPU_TEST_MODEL:--e d4}"
test_T=${LLMC_GPU_TEST_T:-64}
