#!/usr/bin/env bash
# dev/bench/gpu_probe.sh: what a machine offers for building and running llmc's CUDA path, read in
# the first step of a GPU session (dev/bench/gpu_session.sh) so that a failed build can be explained
# from the same call's logs: the GPU and driver, the toolkit, the host compiler and make, where
# cuBLASLt, NCCL and MPI were found, the sanitizer, PyTorch, and the two ceilings every figure is
# measured against (bf16 matrix rate, device copy bandwidth), through PyTorch. About 30 s.
# Exit status: 0, or 3 where there is no GPU (the ceilings are then not measured).
#   dev/bench/gpu_probe.sh
set -u
say() { printf '\n== %s\n' "$*"; }
where() { command -v "$1" || echo "$1: not found"; }

say GPU
gpu=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || gpu=0
[ "$gpu" = 1 ] || echo "no GPU: nvidia-smi did not answer"

say "compilers and tools"
where nvcc && nvcc --version | tail -2
where g++ && g++ --version | head -1
where make && make --version | head -1
where compute-sanitizer
where ncu
echo "uname: $(uname -srm); $(. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME")"

say "libraries (as the session found them: CPATH, LIBRARY_PATH, LD_LIBRARY_PATH)"
echo "CPATH=${CPATH:-}"
echo "LIBRARY_PATH=${LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
mpi_flags=$(mpicxx --showme:compile 2> /dev/null)
for header in cublasLt.h nccl.h mpi.h; do
    # shellcheck disable=SC2086
    found=$(echo "#include <$header>" | nvcc -E -x cu $mpi_flags - 2> /dev/null | grep -m1 -o "\"[^\"]*/$header\"")
    echo "$header: ${found:-not found by nvcc, with the include flags of mpicxx}"
done
echo "mpirun: $(where mpirun)  ($(mpirun --version 2> /dev/null | head -1))"
echo "mpicxx --showme:compile: $(mpicxx --showme:compile 2> /dev/null)"

say "python"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-", "gpu", torch.cuda.is_available())' 2>&1

if [ "$gpu" = 1 ]; then
    say "ceilings (PyTorch, CUDA events, median of 10 after 3 warm-ups, random data)"
    python3 - << 'EOF' 2>&1
import torch

def median_ms(f, n=10):
    for _ in range(3):
        f()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record(); f(); e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[n // 2]

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
print(f"bf16 matmul 8192^3: {2 * 8192**3 / median_ms(lambda: a @ b) / 1e9:.0f} TFLOP/s")
x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
print(f"device copy 2 GiB: {2 * x.numel() * 2 / median_ms(lambda: y.copy_(x)) / 1e6:.0f} GB/s (read + write)")  # bytes per ms / 1e6
EOF
fi

say "disk, memory, cores"
df -h . 2>&1 | tail -1
free -g 2>&1 | head -2
nproc
[ "$gpu" = 1 ] || exit 3
