# shellcheck shell=bash
# scripts/preset_common.sh: the shared part of the preset run scripts (scripts/run_*.sh), sourced by
# each of them; not run on its own. A preset script calls
#     preset_run gpu|cpu PRESET_FLAGS... -- "$@"
# where "$@" is its own command line: [RANKS] [extra trainer flags...]. preset_run then
#   - takes RANKS (a positive integer; the number of GPUs for `gpu`, of CPU ranks for `cpu`). Without it:
#     gpu: the GPUs that `nvidia-smi -L` lists, or 8 (one llm.c node) where it lists none; cpu: 1;
#   - passes the preset's flags, then --world-size RANKS, then the extra flags, to the trainer (the last
#     value of a flag wins, so the extra flags override the preset's);
#   - checks that the trainer is built (exits non-zero naming the make target otherwise);
#   - with PLAN=1 in the environment: prints the command it would run, then runs the trainer once with
#     --plan RANKS (the per-rank memory plan; nothing is allocated, no data read) and exits with its
#     status (non-zero for a bad flag or a batch that does not divide over the ranks);
#   - otherwise checks that the training shards exist (naming the commands that make them), prints the
#     command and runs it: the binary itself for one rank, else `mpirun -np RANKS --bind-to none`, as
#     root with Open MPI's OMPI_ALLOW_RUN_AS_ROOT and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM set (unless already
#     set). With several ranks and no OMP_NUM_THREADS, each rank gets nproc/RANKS OpenMP threads.
# Environment: TRAIN_GPT overrides the binary (default ./train_gpt for gpu, ./train_gpt_cpu for cpu;
# CI validates the GPU presets with TRAIN_GPT=./train_gpt_cpu, whose flags and planner are the same).
# Paths are relative to the repository root: preset_run runs from there.

# What the GPT-2 presets share, as in llm.c's runs: FineWeb sample-10BT as made by dev/data/fineweb.py
# (shard 0 validation, the rest training), T 1024, ZeRO-1 (one GPU runs ZeRO-0), no recomputation,
# weight decay 0.1, 700 warmup steps, validation every 250 steps, a 144-token sample every 5000.
# shellcheck disable=SC2034  # used by the scripts that source this file
PRESET_GPT2=(-i "data/fineweb10B/fineweb_train_*.bin" -j "data/fineweb10B/fineweb_val_*.bin"
             -t 1024 -z 1 -r 0 -c 0.1 -u 700 -v 250 -s 5000 -g 144)

# The last value given to the training-data flag (-i, --train-data, --train_data, or --flag=value).
preset_train_glob() {
    local glob="" prev="" arg
    for arg in "$@"; do
        case "$prev" in -i | --train-data | --train_data) glob=$arg ;; esac
        case "$arg" in --train-data=* | --train_data=*) glob=${arg#*=} ;; esac
        prev=$arg
    done
    printf '%s' "$glob"
}

# Exits when the training glob matches nothing, naming the commands that make llmc's own data sets.
preset_check_data() {
    local glob
    glob=$(preset_train_glob "$@")
    # no -i: the trainer's default (data/default), which the trainer checks itself
    if [ -z "$glob" ] || compgen -G "$glob" >/dev/null; then return 0; fi
    echo "error: no training shards match '$glob'" >&2
    case "$glob" in
    data/fineweb10B/*)
        echo "make them (FineWeb sample-10BT: ~10B tokens, ~20 GB; needs python's \`datasets\`) with:" >&2
        echo "    make data && python3 dev/data/fineweb.py --bpe-dir data/gpt2_bpe --out-dir data/fineweb10B" >&2 ;;
    data/default/*)
        echo "make the default corpus with:  make data" >&2 ;;
    esac
    exit 1
}

preset_run() {
    local kind=$1
    shift
    local preset=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do preset+=("$1"); shift; done
    if [ $# -gt 0 ]; then shift; fi  # the --
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

    local ranks bin
    if [ "$kind" = gpu ]; then
        bin=${TRAIN_GPT:-./train_gpt}
        ranks=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        [ "${ranks:-0}" -gt 0 ] || ranks=8
    else
        bin=${TRAIN_GPT:-./train_gpt_cpu}
        ranks=1
    fi
    if [ $# -gt 0 ]; then
        ranks=$1
        shift
    fi
    if ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: the first argument is the number of ranks (a positive integer), got '$ranks'" >&2
        echo "usage: $0 [RANKS] [extra trainer flags...]" >&2
        exit 2
    fi
    local args=("${preset[@]}" --world-size "$ranks" "$@")
    local cmd=("$bin" "${args[@]}")
    if [ "$ranks" -gt 1 ]; then cmd=(mpirun -np "$ranks" --bind-to none "${cmd[@]}"); fi

    if [ ! -x "$bin" ]; then
        case "$bin" in
        ./train_gpt | ./train_gpt_cpu) echo "error: $bin is not built; build it with:  make ${bin#./}" >&2 ;;
        *) echo "error: $bin (TRAIN_GPT) is not an executable file" >&2 ;;
        esac
        exit 1
    fi
    if [ "${PLAN:-0}" = 1 ]; then
        echo "command:$(printf ' %q' "${cmd[@]}")"
        exec "$bin" "${args[@]}" --plan "$ranks"
    fi

    preset_check_data "${args[@]}"
    if [ "$ranks" -gt 1 ]; then
        command -v mpirun >/dev/null || { echo "error: $ranks ranks need mpirun (Open MPI)" >&2; exit 1; }
        if [ "$(id -u)" = 0 ]; then
            export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
            export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
        fi
        if [ -z "${OMP_NUM_THREADS:-}" ]; then
            local threads=$(($(nproc) / ranks))
            export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
        fi
    fi
    echo "command:$(printf ' %q' "${cmd[@]}")"
    exec "${cmd[@]}"
}
