#!/usr/bin/env bash
# test/emu/run_emu_tests.sh: every CUDA test on the emulator (make test-emu, part of make test). The
# same test programs and scripts a GPU session runs (make test-gpu), built by make/emu.mk, with the
# trainer runs' model made small (4 layers of 64 channels, T = 8; the GPT-2 vocabulary stays):
#   1. the emulator itself: launch limits, races, deadlocks, streams (test_emu), the PTX
#      instructions lane by lane (test_ptx), cuBLASLt (test_cublaslt), NCCL over MPI on 1, 2, 4 ranks;
#   2. the CUDA model against the CPU model (test_cuda_model) and its host-side logic (test_cuda_host);
#   3. every kernel workbench's --check, each launch run under two thread schedules
#      (LLMC_EMU_RACECHECK=1: an output that depends on the schedule is a race and fails);
#   4. data, tensor, pipeline and context parallelism under mpirun (test/mpi/run_gpu_dp_tests.sh,
#      test/gpu/run_gpu_tp_tests.sh with test_tp_cuda, test/gpu/run_gpu_pp_tests.sh with test_pp_cuda,
#      test/gpu/run_gpu_cp_tests.sh with test_cp_cuda: ZeRO 0-3, recomputation, --gpu-comm mpi and
#      nccl, one emulated GPU per rank);
#   5. checkpoints: resume bitwise, the CUDA trainer against the CPU trainer (same seed and data),
#      a checkpoint of either resumed by the other (test/gpu/run_gpu_ckpt_tests.sh);
#   6. mixture of experts: test_moe_cuda (2 ranks, ZeRO 0-3, against 1 rank), the CUDA trainer
#      against the CPU trainer and 2 ranks at ZeRO-3 against 1 (test/gpu/run_gpu_moe_tests.sh; the MoE
#      model and kernels themselves are in 2 and 3);
#   7. FP8 products: the CUDA trainer against the CPU model's simulation, over 2 ranks, resumed
#      (test/gpu/run_gpu_fp8_tests.sh);
#   8. a Llama: the CUDA trainer against the CPU trainer, ZeRO-3 on 2 ranks and -r 3 against 1 rank,
#      resumed (test/gpu/run_gpu_llama_tests.sh).
# Prints each part's seconds; any failure stops it with a non-zero exit.
#   test/emu/run_emu_tests.sh [BUILD_DIR]   (default build/emu; the trainers are ./train_gpt_emu, ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/../.."

emu=${1:-build/emu}
export LLMC_EMULATED=1
export LLMC_GPU_TEST_MODEL="-e d4 --num-layers 4 --channels 64 --num-heads 2"
export LLMC_GPU_TEST_T=8
export OMP_WAIT_POLICY=passive  # a spinning idle OpenMP thread takes the core from a working rank
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

start=$SECONDS
part() {  # part NAME COMMAND...: runs it, then says how long it took
    local name=$1 t0=$SECONDS
    shift
    echo "==== emulated: $name"
    "$@"
    echo "==== emulated: $name: ok ($((SECONDS - t0)) s)"
}
workbenches() {
    local b
    for b in "$emu"/cuda/*; do
        echo "== $b --check (race check on)"
        LLMC_EMU_RACECHECK=1 timeout 600 "$b" --check > "$emu/$(basename "$b").log" 2>&1 ||
            { cat "$emu/$(basename "$b").log"; echo "FAIL $b --check"; return 1; }
        tail -1 "$emu/$(basename "$b").log"
    done
}

part "emulator: limits, races, streams" "$emu/test_emu"
part "emulator: PTX instructions" "$emu/test_ptx"
part "emulator: cuBLASLt" "$emu/test_cublaslt"
part "emulator: NCCL over MPI" dev/emu/run_nccl_test.sh "$emu/test_nccl"
device_comm() { for np in 1 2 3; do timeout 300 mpirun --oversubscribe -np "$np" "$emu/test_device_comm"; done; }
part "device communicators' all_to_all_v" device_comm
part "CUDA model host logic" "$emu/test_cuda_host"
part "CUDA model against the CPU model" "$emu/test_cuda_model"
part "kernel workbenches" workbenches
part "checkpoints, CUDA and CPU trainers" test/gpu/run_gpu_ckpt_tests.sh ./train_gpt_emu ./train_gpt_cpu
part "data parallelism" test/mpi/run_gpu_dp_tests.sh ./train_gpt_emu
part "tensor parallelism" test/gpu/run_gpu_tp_tests.sh "$emu/test_tp_cuda" ./train_gpt_emu
part "pipeline parallelism" test/gpu/run_gpu_pp_tests.sh "$emu/test_pp_cuda" ./train_gpt_emu
part "context parallelism" test/gpu/run_gpu_cp_tests.sh "$emu/test_cp_cuda" ./train_gpt_emu ./train_gpt_cpu
part "mixture of experts" test/gpu/run_gpu_moe_tests.sh "$emu/test_moe_cuda" ./train_gpt_emu ./train_gpt_cpu
part "FP8 products" test/gpu/run_gpu_fp8_tests.sh ./train_gpt_emu ./train_gpt_cpu
part "a Llama" test/gpu/run_gpu_llama_tests.sh ./train_gpt_emu ./train_gpt_cpu
echo "run_emu_tests.sh: all emulated CUDA tests passed ($((SECONDS - start)) s)"
