# make/flags.mk: the compilers, flags and GPU architectures every llmc Makefile uses (the top-level
# one and dev/cuda/Makefile), so that changing the architecture list or an optimisation level is one
# edit here. The including Makefile sets ROOT, the repository root relative to its own directory.

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc

# CUDA_ARCH: sm_90a is native code for Hopper (H100/H200); compute_80 is PTX that the driver compiles
# for any other GPU from Ampere on.
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80

# Optimisation and target CPU first (override them with CXXFLAGS=... / NVCCFLAGS=...), then what the
# code needs to compile at all. EXTRA_INC: -I<dir> for headers installed elsewhere.
CXXFLAGS  ?= -O3 -march=native
CXXFLAGS  += -std=c++20 -fopenmp -Wall -Wextra -Werror=return-type -I$(ROOT) $(EXTRA_INC)
LDFLAGS   += -fopenmp
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++20 -I$(ROOT) --expt-relaxed-constexpr $(CUDA_ARCH) $(EXTRA_INC)
# Host side of a CUDA program (the CPU reference code in tests and workbenches runs there too), and
# the libraries every CUDA program of llmc links.
CUDA_HOST_FLAGS := -Xcompiler -fopenmp,-march=native
CUDA_LIBS       := -lcublasLt -lgomp
