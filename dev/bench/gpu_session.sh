#!/usr/bin/env bash
# dev/bench/gpu_session.sh: what a session with a GPU runs, in as few calls of the device as possible.
# Each stage fits in one 10-minute call and writes its logs and a summary under $OUT (default
# out/gpu_session), so nothing is lost when a stage fails or runs out of time.
#
# On this side, once (no GPU needed):
#   dev/bench/gpu_session.sh prepare   copies the headers the GPU machine may lack (Catch2, nlohmann/json)
#                                      into .devtools/include, and llm.c (fetched into peers/llm.c) stays where it is
# On the GPU machine (carry .devtools, data and peers):
#   dev/bench/gpu_session.sh test      build everything, the GPU model tests, every workbench --check
#   dev/bench/gpu_session.sh train     the default training run on the GPU, 200 steps
#   dev/bench/gpu_session.sh kernels   every workbench's timings, attention against torch's flash SDPA
#   dev/bench/gpu_session.sh bench     train-step benchmark d12..d48, PyTorch compiled, llm.c
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:-test}
OUT=${OUT:-out/gpu_session}
mkdir -p "$OUT"
SUMMARY="$OUT/summary_$STAGE.md"

run() {  # run LOG TIMEOUT_S CMD...: one step, its output in $OUT/LOG, its status in the summary
    local log=$1 limit=$2
    shift 2
    echo "== $*"
    timeout "$limit" "$@" > "$OUT/$log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$log"
    echo "| \`$*\` | exit $rc | $log |" >> "$SUMMARY"
    return $rc
}

MAKEARGS=(SKIP_DEPS=1)
INC="-I$PWD/.devtools/include"
command -v mpicxx > /dev/null || MAKEARGS+=(NO_MPI=1)
# NCCL: the toolkit's, else a pip wheel's copy (PyTorch brings one), else none (--gpu-comm mpi only)
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
if ! echo '#include <nccl.h>' | "$NVCC" -E -x cu - > /dev/null 2>&1; then
    nccl_dir=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2> /dev/null || true)
    if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
        INC="$INC -I$nccl_dir/include"
        MAKEARGS+=("NCCL_LIB=-L$nccl_dir/lib -l:libnccl.so.2")
        export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        MAKEARGS+=(NO_NCCL=1)
    fi
fi
MAKEARGS+=("EXTRA_INC=$INC")

case "$STAGE" in
prepare)
    mkdir -p .devtools/include/catch2
    cp /usr/include/catch2/catch.hpp .devtools/include/catch2/
    cp -r /usr/include/nlohmann .devtools/include/
    grep -qx '/.devtools/' .git/info/exclude 2> /dev/null || echo '/.devtools/' >> .git/info/exclude
    [ -d peers/llm.c ] || echo "peers/llm.c is missing: git clone the fetched llm.c mirror there to compare with it"
    echo "prepared: carry .devtools, data and peers"
    exit 0
    ;;
test)
    echo "| step | result | log |" > "$SUMMARY"
    echo "| --- | --- | --- |" >> "$SUMMARY"
    run gpu.log 30 nvidia-smi
    echo "make arguments: ${MAKEARGS[*]}" | tee "$OUT/make_args.txt"
    run build.log 300 make -k -j"$(nproc)" "${MAKEARGS[@]}" train_gpt build/test_gpt2_cuda build/test_cuda_host \
        build/bench_train_step cuda-workbench
    run test_cuda_host.log 30 build/test_cuda_host
    run test_gpt2_cuda.log 90 build/test_gpt2_cuda
    # every workbench, even after one fails (make -C dev/cuda check stops at the first)
    for b in dev/cuda/build/*; do run "check_$(basename "$b").log" 40 "$b" --check; done
    run gpu_dp.log 150 test/mpi/run_gpu_dp_tests.sh ./train_gpt
    ;;
train)
    echo "| step | result | log |" > "$SUMMARY"
    echo "| --- | --- | --- |" >> "$SUMMARY"
    run train_d4.log 300 ./train_gpt -x 200 -o "$OUT/train_d4"
    run train_d12.log 250 ./train_gpt -e d12 -b 16 -t 1024 -x 60 -v 20 -s 0 -l 6e-4 -o "$OUT/train_d12"
    ;;
kernels)
    echo "| step | result | log |" > "$SUMMARY"
    echo "| --- | --- | --- |" >> "$SUMMARY"
    for b in dev/cuda/build/*; do run "time_$(basename "$b").log" 120 "$b"; done
    run attention_vs_sdpa.log 120 python3 dev/bench/attention_vs_sdpa.py --llmc dev/cuda/build/attention_backward
    ;;
bench)
    echo "| step | result | log |" > "$SUMMARY"
    echo "| --- | --- | --- |" >> "$SUMMARY"
    run bench_d12.log 120 build/bench_train_step -e d12 -t 1024 --profile
    run bench_d24.log 100 build/bench_train_step -e d24 -t 1024 -r 1
    run bench_d36.log 100 build/bench_train_step -e d36 -t 1024 -r 2
    run bench_d48.log 120 build/bench_train_step -e d48 -t 1024 -r 3 --profile
    run torch_d12.log 200 python3 dev/bench/torch_gpt2.py --model d12 -t 1024 --find-max-batch
    if [ -d peers/llm.c ]; then
        # llm.c reads the same shard format: 256 int32 header (magic 20240520, version 1, count), uint16 tokens
        python3 -c "
import numpy as np
n = 1 << 22
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, n
with open('$OUT/random_tokens.bin', 'wb') as f:
    f.write(h.tobytes()); f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())"
        run llmc_build.log 300 make -C peers/llm.c train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=0
        run llmc_d12.log 150 peers/llm.c/train_gpt2cu -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" \
            -e d12 -b 16 -t 1024 -x 30 -v 0 -s 0 -r 0 -o "$OUT/llmc_log"
    fi
    ;;
*)
    echo "unknown stage '$STAGE': expected prepare, test, train, kernels or bench" >&2
    exit 2
    ;;
esac
echo "summary: $SUMMARY"
cat "$SUMMARY"
