#!/usr/bin/env bash
# dev/bench/gpu_session.sh: what a session with a GPU runs. One invocation is one device call, and
# the device's rules shape it (dev/cuda/NOTES.md lists the exact calls):
# - a machine is given back 30 s after a call, so each call builds what its stages run;
# - a command may run 600 s: the stages run under one deadline (BUDGET, default 540 s), each step's
#   timeout is cut to what is left, and steps past it are listed as "skipped: budget spent";
# - at most 8 files come back from $OUT: logs are written outside it and packed after every step
#   into $OUT/logs_<stages>.tar.gz beside $OUT/summary_<stages>.md, so even a call killed at its
#   limit returns both; trainer outputs (model.bin) stay in /tmp;
# - nothing can be fetched there and ../shared does not travel: what the build needs and the device
#   lacks (Catch2 and JSON headers, GNU make, Open MPI) is put into .device/ (git-ignored) by
#   `prepare`, here, and carried with the data (data/default, data/gpt2_tokenizer.bin);
# - skipped is not a pass: LLMC_GPU_SESSION=1 makes every GPU test and tool fail (exit 3) where it
#   would skip, and a missing mpirun or NCCL is a failed step. On a machine with no GPU a stage
#   stops at once with "no GPU" and exit status 3 (GPU_SESSION_DRILL=1 runs its steps anyway, each
#   then failing, to check the script's budget and files on a machine without one).
#
# Here, once (network needed, no GPU):
#   dev/bench/gpu_session.sh prepare    .device/: headers, make, Open MPI (Debian 12 packages)
#   dev/bench/gpu_session.sh prebuild   .device/prebuilt.tar.xz: every stage's programs (saves the device
#                                       minutes nvcc would take there)
#   make data                           data/default and data/gpt2_tokenizer.bin
# On the GPU machine, one call each (carry .device data/default data/gpt2_tokenizer.bin):
#   dev/bench/gpu_session.sh test       probe, build, CUDA model tests, every workbench --check, data
#                                       parallelism under mpirun (ZeRO 0-3, NCCL), checkpoints, mixture
#                                       of experts against the CPU trainer, a short run, compute-sanitizer
#                                       memcheck and racecheck
#   dev/bench/gpu_session.sh sanitize   memcheck and racecheck alone (when `test` ran out of budget)
#   dev/bench/gpu_session.sh train      d4 default run against the CPU trainer, d12 at T = 1024, d4 as a
#                                       Llama, transformers loading the exports (dev/bench/hf_check.py)
#   dev/bench/gpu_session.sh kernels    every workbench's timings, attention against torch's SDPA, and
#                                       the measured rates as a --topology file (measured_topology.json)
#   dev/bench/gpu_session.sh speed      issue 37 in one call: test_ptx, the attention and matmul checks,
#                                       test_cuda_model, d12 B 64 with each attention (mma, wgmma, tma)
#                                       beside llm.c, the kernels' timings, the tuned tables, SDPA
#   dev/bench/gpu_session.sh speed2     the call after it, tables committed: TMA cases one by one, d12 with
#                                       --attention auto beside llm.c, the batch sweep, d48, PyTorch, a Llama
#   dev/bench/gpu_session.sh tp         tensor parallelism: test_tp_cuda (tp 2, dp 2 x tp 2) and the
#                                       trainer's --tp 2 against 1 rank (test/gpu/run_gpu_tp_tests.sh)
#   dev/bench/gpu_session.sh pp         pipeline parallelism: test_pp_cuda (pp 2 1F1B and interleaved,
#                                       dp 2 x pp 2, pp 2 x tp 2) and the trainer's --pp 2 against 1 rank,
#                                       checkpoints across meshes (test/gpu/run_gpu_pp_tests.sh)
#   dev/bench/gpu_session.sh cp         context parallelism: the ring pairs' and the embedding's
#                                       workbenches, test_cp_cuda (cp 2; cp 2 x tp 2, sp on and off;
#                                       pp 2 x cp 2; dp 2 x cp 2) and the trainer's --cp runs and resumes
#                                       against 1 rank (test/gpu/run_gpu_cp_tests.sh)
#   dev/bench/gpu_session.sh fp8        FP8 products (issue 28): the workbench, test_cuda_model's FP8 cases,
#                                       the trainer's --fp8 runs, d12 and d48 in bf16 and in FP8 (current and
#                                       delayed scaling), each with its profile
#   dev/bench/gpu_session.sh bench      the fastest B and -r for d12 and d48 (bench_train_step --best, with the
#                                       winner's profile), PyTorch compiled, llm.c (.device/peers.sh, where the
#                                       session carries one), then one table of the three side by side in the
#                                       summary (dev/bench/side_by_side.py); d24, d36, d12 and d48 with --fp8,
#                                       d12 with 8 experts, d12 as a Llama in llmc and in PyTorch
# Several stages may share a call (`train kernels`); they share its budget and run in the order named
# (`test train sanitize` moves test's memcheck and racecheck after train).
# Exit status: 0 when every step passed, 3 when there is no GPU, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGES=("${@:-test}")
NAME=$(IFS=_; echo "${STAGES[*]}")

# ---- prepare (here, not on the device) ----
# Debian 12's Open MPI and what it needs beyond a base system: hwloc, libevent, PMIx and munge, and
# udev (which hwloc loads) for an image without it. The network transports' plugins (UCX, libfabric,
# PSM, InfiniBand verbs, netlink) are deleted rather than carried with their libraries: ranks on one
# machine talk through shared memory.
MPI_PACKAGES="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhwloc15 libevent-core-2.1-7
              libevent-pthreads-2.1-7 libpmix2 libmunge2 libudev1"
prepare_mpi() {
    local debs mpi=.device/mpi
    debs=$(mktemp -d)
    # shellcheck disable=SC2086
    (cd "$debs" && { apt-get download $MPI_PACKAGES || { apt-get update && apt-get download $MPI_PACKAGES; }; }) ||
        { echo "prepare: apt-get download failed" >&2; return 1; }
    rm -rf "$mpi"
    for deb in "$debs"/*.deb; do dpkg -x "$deb" "$mpi"; done
    rm -rf "$debs"
    local lib=$mpi/usr/lib/x86_64-linux-gnu
    rm -rf "$mpi/usr/share/doc" "$mpi/usr/share/man" "$mpi/usr/share/lintian" "$lib/fortran" \
        "$lib"/libmpi_mpifh* "$lib"/libmpi_usempi* "$lib"/libmpi_java* "$mpi"/usr/bin/mpijava*
    (cd "$lib/openmpi/lib/openmpi3" && rm -f mca_*ucx* mca_*_ofi.so mca_mtl_psm*.so mca_btl_openib.so \
        mca_reachable_netlink.so)
    rm -f "$lib"/libmca_common_{ucx,ofi,verbs}* "$lib"/openmpi/lib/libmca_common_{ucx,ofi,verbs}* \
        "$lib"/openmpi/lib/lib{mpi_mpifh,mpi_usempi,mpi_java}*
    # udev goes last on the library path (carried_mpi.sh): the machine's own, where it has one, is
    # newer, and programs built there may need its newer symbols
    mkdir -p "$mpi/fallback"
    mv "$lib"/libudev.so.1* "$mpi/fallback/"
    # The names Debian gives through alternatives (/etc/alternatives), here as plain links
    for tool in mpirun mpiexec; do ln -sf orterun "$mpi/usr/bin/$tool"; done
    for tool in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$mpi/usr/bin/$tool"; done
    # The unpacked tree must stand alone: every library its programs and plugins load is in it or
    # in a base system (C and C++ runtimes, zlib, udev)
    local base=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2 "
    base+="libstdc++.so.6 libgcc_s.so.1 libz.so.1 "
    local missing=0 f n
    while read -r f; do
        for n in $(readelf -d "$f" 2> /dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
            [[ "$base" == *" $n "* ]] && continue
            [ -n "$(find "$mpi" -name "$n" -print -quit)" ] || { echo "prepare: $f needs $n" >&2; missing=1; }
        done
    done < <(find "$mpi" -type f \( -name "*.so*" -o -perm -u+x \) -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
    [ "$missing" = 0 ] || return 1
    # mpirun from the carried tree alone, in an environment without this machine's settings
    env -i PATH=/usr/bin:/bin HOME=/tmp bash -c "source dev/bench/carried_mpi.sh && mpirun -np 2 echo rank ok" ||
        { echo "prepare: the carried mpirun does not run" >&2; return 1; }
}

if [ "${STAGES[0]}" = prepare ]; then
    set -e
    mkdir -p .device/include/catch2 .device/bin
    cp -p /usr/include/catch2/catch.hpp .device/include/catch2/  # -p: a new copy rebuilds nothing
    cp -rp /usr/include/nlohmann .device/include/
    cp "$(command -v make)" .device/bin/make  # the device image's make is not known to exist
    prepare_mpi
    for f in data/gpt2_tokenizer.bin data/default/.done; do
        [ -f "$f" ] || echo "prepare: $f is missing: run make data here first" >&2
    done
    carry=".device data/default data/gpt2_tokenizer.bin"
    tracked=$(git ls-files -z | du -cb --files0-from=- 2> /dev/null | tail -1 | cut -f1)
    # shellcheck disable=SC2086
    carried=$(du -cb $carry | tail -1 | cut -f1)
    echo "prepared .device; carry: $carry"
    echo "travels: tracked files $((tracked >> 20)) MiB + carried $((carried >> 20)) MiB (limit 64 MiB)"
    exit 0
fi

# ---- prebuild (here, not on the device): the GPU programs, so the device's minutes are not spent on nvcc ----
# The committed and uncommitted tracked files are copied to $PREBUILD_DIR (kept between prebuilds,
# mtimes preserved, so a second prebuild is incremental) and built there for every stage, with the
# host code for any x86-64-v3 processor instead of -march=native (the device's CPU is not this one's).
# The programs are packed into .device/prebuilt.tar.xz at their paths in the tree; on the device the
# build step unpacks them in place and runs make only if one of them cannot load its libraries there.
ALL_TARGETS="train_gpt train_gpt_cpu build/test_cuda_model build/test_ptx build/test_cuda_host build/test_comm
             build/test_moe_cuda build/bench_train_step build/test_tp_cuda build/test_pp_cuda build/test_cp_cuda"
if [ "${STAGES[0]}" = prebuild ]; then
    set -e
    dir=${PREBUILD_DIR:-/tmp/llmc_prebuild}
    mkdir -p "$dir"
    git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$dir"
    portable="-O3 -march=x86-64-v3"  # through the environment: the Makefiles append to CXXFLAGS
    # shellcheck disable=SC2086
    CXXFLAGS=$portable make -C "$dir" -j"$(nproc)" "CUDA_HOST_FLAGS=-Xcompiler -fopenmp,-march=x86-64-v3" \
        $ALL_TARGETS cuda-workbench
    # xz: 54 MB of programs (two architectures' code in each) travel as 8
    # shellcheck disable=SC2086
    tar -C "$dir" -cf - $ALL_TARGETS dev/cuda/build | xz -6 -T0 > .device/prebuilt.tar.xz.tmp
    mv .device/prebuilt.tar.xz.tmp .device/prebuilt.tar.xz
    echo "prebuilt: .device/prebuilt.tar.xz, $(du -h .device/prebuilt.tar.xz | cut -f1)" \
         "(from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + uncommitted changes'))"
    exit 0
fi

# ---- the session's budget, logs and summary ----
RESULTS=${OUT:-out/gpu_session}
LOGS=/tmp/gpu_session/logs_$NAME
RUNS=/tmp/gpu_session/runs  # trainer output directories (model.bin, checkpoints): never in $OUT
BUDGET=${BUDGET:-540}
JOBS=${JOBS:-$(nproc)}
rm -rf "$LOGS" "$RUNS"  # a rerun on the same machine starts clean (a trainer would resume)
mkdir -p "$RESULTS" "$LOGS" "$RUNS"
RESULTS=$(cd "$RESULTS" && pwd)
SUMMARY="$LOGS/summary_$NAME.md"
START=$SECONDS
FAILED=0
export LLMC_GPU_SESSION=1

pack() {  # the summary and one archive of every log: the two files a call returns
    cp "$SUMMARY" "$RESULTS/"
    tar -czf "$RESULTS/logs_$NAME.tar.gz.tmp" -C "$LOGS" . && mv "$RESULTS/logs_$NAME.tar.gz.tmp" "$RESULTS/logs_$NAME.tar.gz"
}
row() { echo "| $1 | $2 | $3 | $4 |" >> "$SUMMARY"; }  # row STEP RESULT SECONDS LOG

step() {  # step LOG LIMIT_S CMD...: one step, its output in $LOGS/LOG, its result in the summary
    local log=$1 limit=$2
    shift 2
    local left=$((BUDGET - 15 - (SECONDS - START)))  # 15 s kept for the last packing
    if [ "$left" -lt 10 ]; then
        row "\`$*\`" "skipped: budget spent" "" ""
        FAILED=1
        pack
        return 124
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $* (limit ${limit} s)"
    local t0=$SECONDS rc result
    timeout -k 5 "$limit" "$@" > "$LOGS/$log" 2>&1
    rc=$?
    tail -n 12 "$LOGS/$log"
    case $rc in
    0) result=ok ;;
    # exit 3 is "no GPU" from llmc's tools, but a Catch2 program exits with its failed test count
    3) [ "$HAVE_GPU" = 1 ] && result="**FAIL** (exit 3)" || result="**no GPU** (exit 3)" ;;
    124 | 137) result="**timed out** at $limit s" ;;
    *) result="**FAIL** (exit $rc)" ;;
    esac
    [ "$rc" = 0 ] || FAILED=1
    row "\`$*\`" "$result" "$((SECONDS - t0))" "$log"
    pack
    return $rc
}
fail_step() {  # fail_step WHAT WHY: a failure found without running anything (missing tool, file)
    echo "FAIL $1: $2"
    row "$1" "**FAIL**: $2" "" ""
    FAILED=1
    pack
}
# A trainer's small outputs (config.json, metrics.jsonl) join the logs; model.bin stays where it is.
keep_run_files() {
    local f
    for f in config.json metrics.jsonl; do [ -f "$RUNS/$1/$f" ] && cp "$RUNS/$1/$f" "$LOGS/${1}_$f"; done
    pack
}

printf '# gpu_session.sh %s\n\n| step | result | s | log |\n| --- | --- | --- | --- |\n' "${STAGES[*]}" > "$SUMMARY"
for stage in "${STAGES[@]}"; do
    case "$stage" in
    test | sanitize | train | kernels | bench | speed | speed2 | tp | pp | cp | fp8) ;;
    *) echo "unknown stage '$stage': expected prepare, prebuild, test, sanitize, train, kernels, bench, speed, speed2, tp, pp, cp or fp8" >&2; exit 2 ;;
    esac
done

HAVE_GPU=1
if ! nvidia-smi -L > "$LOGS/gpu.log" 2>&1; then
    HAVE_GPU=0
    echo "no GPU on this machine (nvidia-smi -L failed): stages '${STAGES[*]}' need one"
    row "nvidia-smi -L" "**no GPU**" "" gpu.log
    if [ "${GPU_SESSION_DRILL:-0}" != 1 ]; then
        printf '\n**no GPU: nothing run** (exit 3)\n' >> "$SUMMARY"
        pack
        cat "$SUMMARY"
        exit 3
    fi
    echo "GPU_SESSION_DRILL=1: running every step anyway; each GPU step must fail"
    FAILED=1
fi

# ---- toolchain: the toolkit, then what .device carries, then the pip wheels PyTorch brings ----
CUDA=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA/bin:$PATH"
export LD_LIBRARY_PATH="$CUDA/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v make > /dev/null || export PATH="$PWD/.device/bin:$PATH"
INC="-I$PWD/.device/include"
MAKEARGS=(SKIP_DEPS=1 -j"$JOBS")
# MPI: the carried Open MPI (known version, known to run from a copy), else the machine's own
if [ -x .device/mpi/usr/bin/orterun ]; then
    # shellcheck source=dev/bench/carried_mpi.sh
    source dev/bench/carried_mpi.sh .device/mpi
fi
if ! command -v mpirun > /dev/null || ! command -v mpicxx > /dev/null; then
    fail_step "MPI" "no mpirun/mpicxx: carry .device (dev/bench/gpu_session.sh prepare); built with NO_MPI=1"
    MAKEARGS+=(NO_MPI=1)
fi
# cuBLAS: the toolkit's, else the pip wheel PyTorch brings (nvidia/cu13: headers, and .so.13 files
# without the unversioned names the linker looks for)
wheel_dir() { python3 -c "import $1 as m; print(list(m.__path__)[0])" 2> /dev/null; }
if [ ! -f "$CUDA/include/cublasLt.h" ]; then
    cu13=$(wheel_dir nvidia.cu13)
    if [ -n "$cu13" ] && [ -f "$cu13/include/cublasLt.h" ]; then
        mkdir -p /tmp/gpu_session/links
        ln -sf "$cu13/lib/libcublasLt.so.13" /tmp/gpu_session/links/libcublasLt.so
        ln -sf "$cu13/lib/libcublas.so.13" /tmp/gpu_session/links/libcublas.so
        export CPATH="$cu13/include${CPATH:+:$CPATH}"
        export LIBRARY_PATH="/tmp/gpu_session/links${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$cu13/lib:$LD_LIBRARY_PATH"
    else
        fail_step "cuBLASLt" "cublasLt.h in neither $CUDA/include nor PyTorch's nvidia.cu13 wheel"
    fi
fi
# NCCL: the toolkit's, else the pip wheel's copy (PyTorch brings one)
if ! echo '#include <nccl.h>' | nvcc -E -x cu - > /dev/null 2>&1; then
    nccl_dir=$(wheel_dir nvidia.nccl)
    if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
        INC="$INC -I$nccl_dir/include"
        MAKEARGS+=("NCCL_LIB=-L$nccl_dir/lib -l:libnccl.so.2")
        export LD_LIBRARY_PATH="$nccl_dir/lib:$LD_LIBRARY_PATH"
    else
        fail_step "NCCL" "nccl.h in neither the toolkit nor PyTorch's nvidia.nccl wheel; built with NO_NCCL=1"
        MAKEARGS+=(NO_NCCL=1)
    fi
fi
MAKEARGS+=("EXTRA_INC=$INC")
for f in data/gpt2_tokenizer.bin data/default/default_train_000000.bin data/default/default_val_000000.bin; do
    [ -f "$f" ] || fail_step "data" "$f missing: carry data/default and data/gpt2_tokenizer.bin"
done
echo "make ${MAKEARGS[*]}" > "$LOGS/make_args.txt"

# ---- build: only what this call's stages run, so no stage depends on an earlier call ----
targets=()
for stage in "${STAGES[@]}"; do
    case "$stage" in
    test) targets+=(train_gpt train_gpt_cpu build/test_cuda_model build/test_ptx build/test_cuda_host build/test_comm
                    build/test_moe_cuda cuda-workbench) ;;
    sanitize) targets+=(build/test_cuda_model) ;;
    train) targets+=(train_gpt train_gpt_cpu) ;;
    kernels) targets+=(cuda-workbench build/test_ptx) ;;
    bench) targets+=(build/bench_train_step) ;;
    speed) targets+=(build/test_ptx build/test_cuda_model build/bench_train_step cuda-workbench) ;;
    speed2) targets+=(build/test_ptx build/bench_train_step cuda-workbench train_gpt train_gpt_cpu) ;;
    tp) targets+=(train_gpt build/test_tp_cuda build/test_cuda_host cuda-workbench) ;;
    pp) targets+=(train_gpt build/test_pp_cuda build/test_cuda_host) ;;
    cp) targets+=(train_gpt train_gpt_cpu build/test_cp_cuda build/test_cuda_host cuda-workbench) ;;
    fp8) targets+=(train_gpt train_gpt_cpu build/test_cuda_model build/bench_train_step cuda-workbench) ;;
    esac
done
step probe.log 60 dev/bench/gpu_probe.sh
# Programs prebuilt on the build machine (`prebuild`) are used when every one loads its libraries
# here; otherwise this call builds them.
use_prebuilt() {
    [ -f .device/prebuilt.tar.xz ] || return 1
    tar -xJf .device/prebuilt.tar.xz || return 1
    local t missing
    for t in $ALL_TARGETS dev/cuda/build/*; do
        missing=$(ldd "$t" 2>&1 | grep "not found")
        [ -z "$missing" ] || { echo "prebuilt $t cannot load here: $missing"; return 1; }
    done
    echo "prebuilt programs load here: make skipped"
}
if use_prebuilt > "$LOGS/prebuilt.log" 2>&1; then
    row "prebuilt programs (.device/prebuilt.tar.xz)" ok "" prebuilt.log
else
    cat "$LOGS/prebuilt.log"
    step build.log 300 make -k "${MAKEARGS[@]}" "${targets[@]}"
fi

# ---- the stages ----
# bench_train_step --best within its step's limit: the sweep stops itself before a try that would end
# past its budget, 30 s short of the limit (at least half of it), so the winner's line and profile are
# printed where the step's timeout would have lost them
best_step() {  # best_step LOG LIMIT_S ARGS...
    local log=$1 limit=$2 left=$((BUDGET - 15 - (SECONDS - START))) sweep_s
    shift 2
    [ "$limit" -gt "$left" ] && limit=$left
    sweep_s=$((limit - 30 > limit / 2 ? limit - 30 : limit / 2))
    step "$log" "$limit" build/bench_train_step --best --best-budget-s "$sweep_s" "$@"
}
# The bench stage's comparison as one table after the steps' (so as not to split theirs): llmc's best
# beside llm.c and PyTorch, from the logs; a log that is missing is a "-" in it
side_by_side() {
    if python3 dev/bench/side_by_side.py "$LOGS" > "$LOGS/side_by_side.md" 2>&1; then
        printf '\n## Tokens/s side by side (dev/bench/side_by_side.py)\n\n' >> "$SUMMARY"
        cat "$LOGS/side_by_side.md" >> "$SUMMARY"
        pack
    else
        fail_step "dev/bench/side_by_side.py" "see side_by_side.md"
    fi
}
# Whether the card agrees with the emulator on wgmma, TMA and mbarriers (test_ptx), then the
# attention kernels built on them against the CPU (forward versions 2-6, backward 2-4)
hopper_checks() {
    step test_ptx.log 30 build/test_ptx
    step check_attention_forward.log 45 dev/cuda/build/attention_forward --check
    step check_attention_backward.log 45 dev/cuda/build/attention_backward --check
}
# This card's tables, to commit from the logs' archive: the weight gradients' split of k
# (llmc/kernels/split_k_table.h) and the attention forward's kernel per T (attention_table.h, read
# under --attention auto); then torch's SDPA (flash and cuDNN) beside llmc's attention, forward and
# backward
tune_tables() {
    step tune_matmul.log 150 dev/cuda/build/matmul --tune "$LOGS/split_k_table.h"
    step tune_attention.log 60 dev/cuda/build/attention_forward --tune "$LOGS/attention_table.h"
    step attention_vs_sdpa.log 180 python3 dev/bench/attention_vs_sdpa.py --llmc dev/cuda/build/attention_backward
}
sanitize() {  # out-of-bounds accesses, uninitialised reads and shared-memory races on the small model
    local san
    san=$(command -v compute-sanitizer || echo "$CUDA/bin/compute-sanitizer")
    if [ ! -x "$san" ]; then fail_step compute-sanitizer "not found"; return; fi
    step memcheck.log 150 "$san" --tool memcheck --leak-check no --error-exitcode 9 build/test_cuda_model "one training step*"
    step racecheck.log 180 "$san" --tool racecheck --error-exitcode 9 build/test_cuda_model "one training step*"
}
for stage in "${STAGES[@]}"; do
    case "$stage" in
    test)
        step test_cuda_host.log 30 build/test_cuda_host
        step test_ptx.log 30 build/test_ptx  # the emulator's PTX bodies against the hardware
        step test_cuda_model.log 120 build/test_cuda_model
        # every workbench, even after one fails (make -C dev/cuda check stops at the first)
        for b in dev/cuda/build/*; do step "check_$(basename "$b").log" 45 "$b" --check; done
        step mpi_comm.log 60 mpirun -np 2 build/test_comm  # the carried MPI, before the GPU runs lean on it
        step gpu_dp.log 180 test/mpi/run_gpu_dp_tests.sh ./train_gpt
        step gpu_ckpt.log 90 test/gpu/run_gpu_ckpt_tests.sh ./train_gpt ./train_gpt_cpu
        step gpu_fp8.log 120 test/gpu/run_gpu_fp8_tests.sh ./train_gpt ./train_gpt_cpu
        step gpu_moe.log 90 test/gpu/run_gpu_moe_tests.sh build/test_moe_cuda ./train_gpt ./train_gpt_cpu
        step gpu_llama.log 60 test/gpu/run_gpu_llama_tests.sh ./train_gpt ./train_gpt_cpu
        step train_smoke.log 60 ./train_gpt -x 30 -v 10 -s 0 -o "$RUNS/train_smoke"
        keep_run_files train_smoke
        # memcheck and racecheck close the stage, unless the call names `sanitize` to place them
        [[ " ${STAGES[*]} " == *" sanitize "* ]] || sanitize
        ;;
    sanitize) sanitize ;;
    tp)
        step test_cuda_host.log 30 build/test_cuda_host
        step check_vocab_parallel.log 45 dev/cuda/build/vocab_parallel --check
        step gpu_tp.log 420 test/gpu/run_gpu_tp_tests.sh build/test_tp_cuda ./train_gpt
        ;;
    pp)
        step test_cuda_host.log 30 build/test_cuda_host
        step gpu_pp.log 450 test/gpu/run_gpu_pp_tests.sh build/test_pp_cuda ./train_gpt
        ;;
    fp8)
        step check_fp8.log 45 dev/cuda/build/fp8 --check
        step time_fp8.log 90 dev/cuda/build/fp8  # the products and casts timed (as in `kernels`)
        for b in gelu layernorm; do  # the kernels that measure their outputs' amax for the casts
            step "check_$b.log" 45 "dev/cuda/build/$b" --check
        done
        step test_cuda_model_fp8.log 120 build/test_cuda_model "FP8*"
        step gpu_fp8.log 120 test/gpu/run_gpu_fp8_tests.sh ./train_gpt ./train_gpt_cpu
        # tokens/s with and without FP8 in the same call (issue 28), each with its profile: the casts
        # ("fp8 amax", "fp8 cast") are timed apart from the products
        for scaling in off current delayed; do
            step "bench_d12_fp8_$scaling.log" 90 build/bench_train_step -e d12 -t 1024 --fp8 $scaling --profile
        done
        for scaling in off current delayed; do
            step "bench_d48_fp8_$scaling.log" 150 build/bench_train_step -e d48 -t 1024 -r 3 --steps 3 --warmup 1 \
                --fp8 $scaling --profile
        done
        ;;
    cp)
        step test_cuda_host.log 30 build/test_cuda_host
        for b in attention_forward attention_backward vocab_parallel; do
            step "check_$b.log" 45 "dev/cuda/build/$b" --check
        done
        step gpu_cp.log 420 test/gpu/run_gpu_cp_tests.sh build/test_cp_cuda ./train_gpt ./train_gpt_cpu
        ;;
    train)
        # the default run (d4) on the GPU and, for its first 20 steps, on the CPU: same seed and data,
        # and the same learning rates (20 steps are all warm-up, which does not depend on -x)
        step train_d4.log 120 ./train_gpt -o "$RUNS/train_d4"  # the default run, as make train
        keep_run_files train_d4
        step train_d4_cpu.log 120 ./train_gpt_cpu -x 20 -v 0 -s 0 -o "$RUNS/train_d4_cpu"
        keep_run_files train_d4_cpu
        step compare_d4.log 10 dev/bench/compare_losses.sh "$RUNS/train_d4_cpu" "$RUNS/train_d4" 20 2e-2
        step train_d12.log 150 ./train_gpt -e d12 -b 16 -t 1024 -x 60 -v 20 -s 0 -l 6e-4 -o "$RUNS/train_d12"
        keep_run_files train_d12
        # the default run as a Llama (make train-llama), then transformers loading both GPU-trained
        # models and the test fixtures through dev/export_hf.py (issue 38): its logits against the
        # float64 reference test/test_export_hf.py holds to llmc's CPU model
        step train_d4_llama.log 120 ./train_gpt --arch llama -o "$RUNS/train_d4_llama"
        keep_run_files train_d4_llama
        step hf_check.log 90 python3 dev/bench/hf_check.py "$RUNS/train_d4/model.bin" "$RUNS/train_d4_llama/model.bin" \
            test/fixtures/gpt2_tiny_model.bin test/fixtures/llama_tiny_model.bin
        ;;
    kernels)
        hopper_checks
        for b in dev/cuda/build/*; do step "time_$(basename "$b").log" 90 "$b"; done
        tune_tables
        # the measured kernel rates as a --topology file for --plan (llmc/planning/cluster.h)
        step measured_topology.json 10 dev/bench/measured_topology.sh "$LOGS"
        ;;
    bench)
        # Issue 37's table first (the budget cuts the last steps): llmc's fastest micro-batch and
        # recomputation (dev/bench/batch_sweep.h, with the winner's profile), llm.c beside it, then
        # the same sweep with the wgmma attention (attention_hopper.cuh, not yet the default), d48,
        # PyTorch compiled. Comparisons with fetched code (llm.c) are not part of this repository: a
        # session that carries peers/ and a git-ignored .device/peers.sh runs it here.
        best_step bench_d12_best.log 150 -e d12 -t 1024 --profile
        [ -f .device/peers.sh ] && step peers.log 300 bash .device/peers.sh "$LOGS"
        best_step bench_d12_wgmma_best.log 150 -e d12 -t 1024 --attention wgmma --profile
        step bench_d12_tma.log 40 build/bench_train_step -e d12 -t 1024 -b 64 --attention tma --profile
        best_step bench_d48_best.log 240 -e d48 -t 1024 --profile
        step torch_d12.log 200 python3 dev/bench/torch_gpt2.py --model d12 -t 1024 --find-max-batch
        # FP8 (issue 28): the blocks' products in FP8, at the largest B that fits (the fp8 stage puts
        # bf16 beside it at the same B)
        step bench_d12_fp8.log 90 build/bench_train_step -e d12 -t 1024 --fp8 current --profile
        step bench_d48_fp8.log 150 build/bench_train_step -e d48 -t 1024 -r 3 --steps 3 --warmup 1 --fp8 current
        step bench_d24.log 90 build/bench_train_step -e d24 -t 1024 -r 1
        step bench_d36.log 90 build/bench_train_step -e d36 -t 1024 -r 2 --steps 5
        # the mixture of experts (issue 27): d12 with 8 experts, top 2, in every block
        step bench_d12_moe.log 90 build/bench_train_step -e d12 -t 1024 --experts 8 --top-k 2 --profile
        # a Llama (issue 38): d12's depth as a Llama (3 kv heads, SwiGLU 2048), beside GPT-2's d12 above
        step bench_d12_llama.log 60 build/bench_train_step -e d12 -t 1024 -b 32 --arch llama --profile
        # and PyTorch's Llama of the same shape and batch, compiled, on the same card
        step torch_d12_llama.log 150 python3 dev/bench/torch_gpt2.py --arch llama --model d12 -t 1024 -b 32
        ;;
    speed)
        # Issue 37 in one call, what decides the most first: whether the card agrees with the
        # emulator on wgmma, TMA and mbarriers and the kernels built on them agree with the CPU; the
        # split-k weight gradients in a whole step against the CPU; d12 at B 64 with each attention
        # beside llm.c's d12 B 64; then the kernels' timings and the tuned tables to commit
        hopper_checks
        step check_matmul.log 45 dev/cuda/build/matmul --check
        step test_cuda_model.log 90 build/test_cuda_model
        for att in mma wgmma tma; do
            step "bench_d12_b64_$att.log" 45 build/bench_train_step -e d12 -t 1024 -b 64 --attention $att --profile
        done
        [ -f .device/peers.sh ] && step peers.log 150 bash .device/peers.sh "$LOGS"
        for b in attention_forward attention_backward matmul; do step "time_$b.log" 60 "dev/cuda/build/$b"; done
        tune_tables
        ;;
    speed2)
        # The call after `speed`, with its tables committed: the TMA cases one process each (a fault
        # is sticky), the backward workbench's versions 3 and 4 at the timed shapes, d12 with the
        # tuned kernels (--attention auto) beside llm.c, a Llama beside PyTorch's (issue 38), the
        # batch sweep, d48, PyTorch's GPT-2, the Llama GPU tests
        for c in "TMA writes zeros for the rows*" "TMA writes zeros for the columns*" "TMA writes zeros for the elements*" \
                 "an mbarrier reused*" "one arrive.expect_tx*" "wgmma reads a TMA*"; do
            step "test_ptx_$(echo "$c" | tr -cd 'a-z' | cut -c1-24).log" 20 build/test_ptx "$c"
        done
        step time_attention_backward.log 60 dev/cuda/build/attention_backward
        step bench_d12_b64_auto.log 45 build/bench_train_step -e d12 -t 1024 -b 64 --attention auto --profile
        [ -f .device/peers.sh ] && step peers.log 150 bash .device/peers.sh "$LOGS"
        step bench_d12_llama.log 45 build/bench_train_step -e d12 -t 1024 -b 32 --arch llama --attention auto --profile
        step torch_d12_llama.log 120 python3 dev/bench/torch_gpt2.py --arch llama --model d12 -t 1024 -b 32
        best_step bench_d12_best.log 100 -e d12 -t 1024 --attention auto
        step bench_d48_b16_auto.log 60 build/bench_train_step -e d48 -t 1024 -b 16 --attention auto --profile
        step torch_d12.log 120 python3 dev/bench/torch_gpt2.py --model d12 -t 1024 -b 64
        step gpu_llama.log 90 test/gpu/run_gpu_llama_tests.sh ./train_gpt ./train_gpt_cpu
        ;;
    esac
done
[[ " ${STAGES[*]} " == *" bench "* || " ${STAGES[*]} " == *" speed2 "* ]] && side_by_side

[ "$FAILED" = 0 ] && verdict="**every step passed**" || verdict="**not a pass**: see the rows above"
printf '\n%s in %d s of a %d s budget\n' "$verdict" $((SECONDS - START)) "$BUDGET" >> "$SUMMARY"
pack
cat "$SUMMARY"
if nvidia-smi -L > /dev/null 2>&1; then exit "$FAILED"; else exit 3; fi
