# make/emu.mk: the emulation build (dev/emu/emu.h): the CUDA sources compiled by g++ and run on the
# CPU, one emulated H100 per process. Included by the top-level Makefile.
#   make train_gpt_emu   the CUDA trainer, emulated
#   make test-emu        every CUDA test on the emulator (part of make test); see docs/tests.md for its cost
#   make build/emu/bench_train_step  the training-step benchmark, emulated (its --best sweep; not built by test-emu)
EMU_DIR      := $(BUILD)/emu
# -O2, not -O3: the same speed here (fiber switches and the CPU GEMM dominate) for less compile time.
# -march=native: the CPU GEMM behind cuBLASLt needs FMA instructions to be fast. -fno-strict-aliasing:
# CUDA code type-puns (a float vector stored through int4, as nvcc allows), which g++ would miscompile.
# -Wno-psabi: a kernel taking a CUtensorMap (128-byte aligned) by value draws g++'s note on that ABI.
EMU_CXXFLAGS := -std=c++20 -O2 -g -march=native -fno-strict-aliasing -fopenmp -Wall -Wextra -Wno-unknown-pragmas -Wno-psabi -Werror=return-type -DLLMC_EMU \
                -Idev/emu/include -I. -I$(CUDA_HOME)/include $(EXTRA_INC)
EMU_SRCS     := $(addprefix dev/emu/,runtime.cpp fibers.cpp ptx.cpp cublaslt.cpp nccl.cpp)
EMU_OBJS     := $(EMU_SRCS:dev/emu/%.cpp=$(EMU_DIR)/lib/%.o)
EMU_HEADERS  := $(wildcard dev/emu/*.h dev/emu/include/*.h)
EMU_LIBS      = -lboost_context -fopenmp $(MPI_LIBS)
# Emulated programs are C++ (-x c++) built from .cu files; the emulator's objects come after.
EMU_LINK      = $(CXX) $(EMU_CXXFLAGS) $(MPI_INC) -x c++ $< -x none $(filter %.o,$^) -o $@ $(EMU_LIBS)

# ---- what nvcc makes of each kernel (dev/emu/kernel_resources.h) ----
# Where nvcc exists, each emulated program links a table of its kernels' __launch_bounds__, registers
# and static shared memory, from nvcc -ptx and ptxas -v for sm_90a on the program's own source, and
# every launch is checked against it. $(call emu_kernels,NAME): that table's object.
EMU_KERNELS := $(EMU_DIR)/kernels
emu_kernels  = $(if $(HAVE_NVCC),$(EMU_KERNELS)/$(1).o)
$(EMU_KERNELS)/%.ptx: CUDA_ARCH := -arch=compute_90a
$(EMU_KERNELS)/train_gpt.ptx: train_gpt.cu $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) -ptx $< -o $@
$(EMU_KERNELS)/test_%.ptx: test/gpu/test_%.cu $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) -ptx $< -o $@
$(EMU_KERNELS)/test_%.ptx: dev/emu/test_%.cu $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(MPI_INC) -ptx $< -o $@
$(EMU_KERNELS)/bench_train_step.ptx: dev/bench/train_step.cu dev/bench/batch_sweep.h $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -ptx $< -o $@
$(EMU_KERNELS)/cuda/%.ptx: dev/cuda/%.cu $(wildcard dev/cuda/*.cuh) $(HEADERS) | deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -ptx $< -o $@
$(EMU_KERNELS)/%.o: $(EMU_KERNELS)/%.ptx dev/emu/kernel_table.sh dev/emu/kernel_resources.h
	$(CUDA_HOME)/bin/ptxas -arch=sm_90a -v $< -o /dev/null 2> $(@:.o=.ptxas) || { cat $(@:.o=.ptxas); exit 1; }
	dev/emu/kernel_table.sh $< $(@:.o=.ptxas) > $(@:.o=_table.cpp)
	$(CXX) $(EMU_CXXFLAGS) -c $(@:.o=_table.cpp) -o $@
# The generated source is X_table.cpp, not X.cpp: make's built-in %.o: %.cpp rule would otherwise
# claim X.o once the .ptx is gone, and call a stale table up to date. Kept (make would delete them
# as intermediate files, and run nvcc again at every relink).
.PRECIOUS: $(EMU_KERNELS)/%.ptx $(EMU_KERNELS)/%.o

$(EMU_DIR)/lib/%.o: dev/emu/%.cpp $(EMU_HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(MPI_INC) -c $< -o $@

train_gpt_emu: train_gpt.cu $(HEADERS) $(EMU_HEADERS) $(EMU_OBJS) $(call emu_kernels,train_gpt) | deps
	$(EMU_LINK)

$(EMU_DIR)/test_cuda_host: test/gpu/test_cuda_host.cu test/gpu/shape_only_comm.h $(HEADERS) $(EMU_HEADERS) $(BUILD)/test/catch_impl.o \
                           $(BUILD)/test/test_main.o $(EMU_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
$(EMU_DIR)/test_cuda_model: test/gpu/test_cuda_model.cu test/rel_error.h test/gpu/shape_only_comm.h $(HEADERS) $(EMU_HEADERS) \
                           $(BUILD)/test/catch_impl.o $(EMU_OBJS) $(call emu_kernels,test_cuda_model) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
$(EMU_DIR)/test_%_cuda: test/gpu/test_%_cuda.cu test/gpu/cuda_test_util.h test/mpi/mpi_test_util.h $(HEADERS) \
                        $(EMU_HEADERS) $(EMU_OBJS) $(call emu_kernels,test_%_cuda) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
# The device communicators launch no kernel of their own: no kernel table.
$(EMU_DIR)/test_device_comm: test/gpu/test_device_comm.cu test/mpi/mpi_test_util.h $(HEADERS) $(EMU_HEADERS) \
                             $(EMU_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
# The emulator's own tests: the PTX instructions lane by lane (also built by nvcc for a GPU), its
# launch limits, race check and stream rules, the emulated cuBLASLt and NCCL.
# test_ptx and test_emu have a main of their own.
# test_ptx (nvcc builds it too) has nvcc's kernel table; test_emu registers tables of its own.
$(EMU_DIR)/test_ptx $(EMU_DIR)/test_emu: $(EMU_DIR)/test_%: dev/emu/test_%.cu $(HEADERS) $(EMU_HEADERS) \
                                         $(BUILD)/test/catch_impl.o $(EMU_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
$(EMU_DIR)/test_ptx: $(call emu_kernels,test_ptx)
$(EMU_DIR)/test_cublaslt: dev/emu/test_cublaslt.cpp $(EMU_HEADERS) $(BUILD)/test/catch_impl.o $(BUILD)/test/test_main.o \
                          $(EMU_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
$(EMU_DIR)/test_nccl: dev/emu/test_nccl.cpp $(EMU_HEADERS) $(EMU_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
# The training-step benchmark, emulated: not a measure of speed, but its --best sweep runs on a small
# emulated device (LLMC_EMU_MEMORY_MIB, dev/emu/runtime.cpp), out-of-memory tries included.
$(EMU_DIR)/bench_train_step: dev/bench/train_step.cu dev/bench/batch_sweep.h $(HEADERS) $(EMU_HEADERS) $(EMU_OBJS) \
                             $(call emu_kernels,bench_train_step) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)
# Every kernel workbench, emulated (its --check skips the shapes too large for a CPU).
EMU_BENCHES  := $(patsubst dev/cuda/%.cu,$(EMU_DIR)/cuda/%,$(filter-out dev/cuda/comm_nccl_check.cu,$(wildcard dev/cuda/*.cu)))
$(EMU_DIR)/cuda/%: dev/cuda/%.cu $(wildcard dev/cuda/*.cuh) test/rel_error.h $(HEADERS) $(EMU_HEADERS) $(EMU_OBJS) \
                   $(call emu_kernels,cuda/%) | deps
	@mkdir -p $(dir $@)
	$(EMU_LINK)

EMU_TESTS := $(addprefix $(EMU_DIR)/,test_emu test_ptx test_cublaslt test_nccl test_cuda_host test_cuda_model \
             test_tp_cuda test_pp_cuda test_cp_cuda test_moe_cuda test_device_comm)
emu-build: $(EMU_TESTS) $(EMU_BENCHES) train_gpt_emu
.PHONY: emu-build test-emu
# OMP_WAIT_POLICY=passive: an idle OpenMP thread that spins takes the core from the one working
# (the emulator's blocks and the CPU GEMM run in OpenMP regions, several ranks share the cores).
test-emu: emu-build train_gpt_cpu default-data
	OMP_WAIT_POLICY=passive test/emu/run_emu_tests.sh

# ---- the emulated suite under AddressSanitizer and UBSan (make test-sanitize) ----
# Device memory is host memory, allocated at its exact size, so ASan sees a kernel's access past the
# end of a tensor; the fibers tell ASan about their stacks (fibers.cpp).
EMU_SAN_DIR   := $(EMU_DIR)/sanitize
EMU_SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
EMU_SAN_OBJS  := $(EMU_SRCS:dev/emu/%.cpp=$(EMU_SAN_DIR)/lib/%.o)
EMU_SAN_LINK   = $(CXX) $(EMU_CXXFLAGS) $(EMU_SAN_FLAGS) $(MPI_INC) -x c++ $< -x none $(filter %.o,$^) -o $@ \
                 $(EMU_LIBS) $(EMU_SAN_FLAGS)
$(EMU_SAN_DIR)/lib/%.o: dev/emu/%.cpp $(EMU_HEADERS) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_SAN_FLAGS) $(MPI_INC) -c $< -o $@
$(EMU_SAN_DIR)/test_cuda_model: test/gpu/test_cuda_model.cu test/rel_error.h test/gpu/shape_only_comm.h $(HEADERS) $(EMU_HEADERS) \
                               $(BUILD)/test/catch_impl.o $(EMU_SAN_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_SAN_LINK)
$(EMU_SAN_DIR)/test_ptx: dev/emu/test_ptx.cu $(HEADERS) $(EMU_HEADERS) $(BUILD)/test/catch_impl.o $(EMU_SAN_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_SAN_LINK)
$(EMU_SAN_DIR)/cuda/%: dev/cuda/%.cu $(wildcard dev/cuda/*.cuh) test/rel_error.h $(HEADERS) $(EMU_HEADERS) $(EMU_SAN_OBJS) | deps
	@mkdir -p $(dir $@)
	$(EMU_SAN_LINK)
EMU_SAN_BENCHES := $(EMU_BENCHES:$(EMU_DIR)/%=$(EMU_SAN_DIR)/%)
.PHONY: test-emu-sanitize
test-emu-sanitize: $(EMU_SAN_DIR)/test_cuda_model $(EMU_SAN_DIR)/test_ptx $(EMU_SAN_BENCHES)
	$(SAN_ENV) OMP_WAIT_POLICY=passive $(EMU_SAN_DIR)/test_ptx
	$(SAN_ENV) OMP_WAIT_POLICY=passive $(EMU_SAN_DIR)/test_cuda_model
	@set -e; for b in $(EMU_SAN_BENCHES); do echo "== $$b --check"; $(SAN_ENV) OMP_WAIT_POLICY=passive $$b --check > $$b.log 2>&1 || \
	    { cat $$b.log; exit 1; }; tail -1 $$b.log; done
