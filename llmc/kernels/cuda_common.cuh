// cuda_common.cuh: what every CUDA file of llmc shares. Checked calls (file and line in the error),
// the bf16 activation type, 16-byte vector loads, warp and block reductions in a fixed order (so
// every sum is bitwise reproducible), stochastic rounding, an owning device buffer, and what a GPU
// program does where there is no GPU.
//
// Errors become llmc::Error like everywhere else (utils.h): main() prints them and exits non-zero.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "llmc/utils.h"

namespace llmc {

// The type of parameters and activations on the GPU. Accumulation is always fp32.
using floatX = __nv_bfloat16;

// ---------------------------------------------------------------------------------------------
// Checked calls. Every CUDA runtime and cuBLASLt call goes through one of these, so a failure names
// the call, its file and line. Kernel launches are followed by CUDA_CHECK(cudaGetLastError()).

[[noreturn]] inline void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
    fail(strformat("CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err), cudaGetErrorString(err), call, file,
                   line));
}
[[noreturn]] inline void cublas_fail(cublasStatus_t status, const char* call, const char* file, int line) {
    fail(strformat("cuBLASLt error %s (%d) in %s at %s:%d", cublasLtGetStatusName(status), (int)status, call, file,
                   line));
}

#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t llmc_err_ = (call);                                                      \
        if (llmc_err_ != cudaSuccess) ::llmc::cuda_fail(llmc_err_, #call, __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                           \
    do {                                                                                             \
        cublasStatus_t llmc_status_ = (call);                                                        \
        if (llmc_status_ != CUBLAS_STATUS_SUCCESS) ::llmc::cublas_fail(llmc_status_, #call, __FILE__, __LINE__); \
    } while (0)
// After a kernel launch: catches bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// A kernel launch, `LLMC_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...)`: nvcc's
// `kernel<<<grid, block, shared_bytes, stream>>>(args...)`, spelled so that the emulation build
// (dev/emu/emu.h: the same sources compiled by g++ and run on the CPU) can launch it too. A template
// kernel whose name holds a comma goes in parentheses.
#ifdef LLMC_EMU
#define LLMC_LAUNCH(kernel, grid, block, shared_bytes, stream) \
    ::emu::Launch(kernel, #kernel, grid, block, shared_bytes, stream)
#else
#define LLMC_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#endif

// The current device's name (cudaDeviceProp::name, the key of the kernels' tuned tables); asked
// once: a rank uses one device.
inline const char* device_name() {
    static const std::string name = [] {
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return std::string(prop.name);
    }();
    return name.c_str();
}

// The block's dynamic shared memory (the launch's shared_bytes), 16-byte aligned, as a T array.
template <typename T>
__device__ inline T* dynamic_shared_memory() {
#ifdef LLMC_EMU
    return reinterpret_cast<T*>(::emu::dynamic_shared_base());
#else
    extern __shared__ __align__(16) unsigned char llmc_dynamic_shared[];
    return reinterpret_cast<T*>(llmc_dynamic_shared);
#endif
}

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// 16-byte vectors: one load or store instruction moves 8 bf16 or 4 floats. Pointers must be 16-byte
// aligned; every flat buffer and activation tensor in llmc is allocated that way and tensor widths
// are multiples of 8 elements.

template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];

    __device__ static Packed128 zeros() {
        Packed128 p;
#pragma unroll
        for (int i = 0; i < size; i++) p.v[i] = T(0.0f);
        return p;
    }
    __device__ T& operator[](int i) { return v[i]; }
    __device__ const T& operator[](int i) const { return v[i]; }
};
using x128 = Packed128<floatX>;
using f128 = Packed128<float>;

template <typename T>
__device__ inline Packed128<T> load128(const T* p) {
    return *reinterpret_cast<const Packed128<T>*>(p);
}
// Streaming load: the data will not be read again soon, so it should not displace cached data.
template <typename T>
__device__ inline Packed128<T> load128cs(const T* p) {
    Packed128<T> out;
    *reinterpret_cast<int4*>(&out) = __ldcs(reinterpret_cast<const int4*>(p));
    return out;
}
template <typename T>
__device__ inline void store128(T* p, const Packed128<T>& x) {
    *reinterpret_cast<Packed128<T>*>(p) = x;
}
template <typename T>
__device__ inline void store128cs(T* p, const Packed128<T>& x) {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&x));
}

// ---------------------------------------------------------------------------------------------
// Reductions. The butterfly order is fixed, so results are identical run to run.

constexpr int WARP_SIZE = 32;

__device__ inline float warp_reduce_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffff, x, offset);
    return x;
}
__device__ inline float warp_reduce_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    return x;
}

// A reduction over the whole block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread: each warp reduces, then every warp reduces the warps' results. `shared` holds 32 floats;
// safe to call repeatedly, as it synchronises before reusing `shared`. `identity` fills the lanes
// beyond the block's warp count.
template <float (*warp_reduce)(float)>
__device__ inline float block_reduce(float x, float* shared, float identity) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    x = warp_reduce(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < warps ? shared[lane] : identity;
    return warp_reduce(x);
}
__device__ inline float block_reduce_sum(float x, float* shared) { return block_reduce<warp_reduce_sum>(x, shared, 0.0f); }
__device__ inline float block_reduce_max(float x, float* shared) {
    return block_reduce<warp_reduce_max>(x, shared, -INFINITY);
}

// A kernel that writes a tensor and measures its largest |value| on the way (the amax FP8's current
// scaling needs, kernels/fp8.cuh): the block's largest `m` joins *amax, one atomic per block
// (atomicMax on the bits: non-negative floats order as their bits). Every thread of the block calls it.
__device__ inline void block_amax_into(float* amax, float m, float* shared) {
    m = block_reduce_max(m, shared);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}
// The same for one warp (all its lanes call it), where a block cannot synchronise.
__device__ inline void warp_amax_into(float* amax, float m) {
    m = warp_reduce_max(m);
    if (threadIdx.x % WARP_SIZE == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

// ---------------------------------------------------------------------------------------------
// Stochastic rounding fp32 -> bf16: rounds up with probability equal to the discarded fraction, so
// the bf16 weights are unbiased copies of the fp32 master weights. The random bits come from a hash
// of (seed, index), so a run is reproducible and independent of the launch configuration.

__host__ __device__ inline uint32_t hash_u32(uint32_t x) {  // "lowbias32" integer hash
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
__host__ __device__ inline uint32_t random_bits(uint32_t seed, uint64_t index) {
    return hash_u32(seed ^ hash_u32((uint32_t)index ^ hash_u32((uint32_t)(index >> 32) + 0x9e3779b9U)));
}

__device__ inline floatX stochastic_round_bf16(float x, uint32_t bits) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000U) == 0x7f800000U) return __float2bfloat16_rn(x);  // inf and NaN stay as they are
    // Adding 16 random low bits and truncating rounds up with probability (low 16 bits) / 2^16.
    u += bits & 0xffffU;
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}

// ---------------------------------------------------------------------------------------------
// Device memory. DeviceBuffer owns one cudaMalloc'd array; an allocation that fails says how much
// was asked for and what for.

template <typename T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t count, const char* what) { allocate(count, what); }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            release();
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }

    void allocate(size_t count, const char* what) {
        release();
        if (count == 0) return;
        cudaError_t err = cudaMalloc(&ptr_, count * sizeof(T));
        if (err != cudaSuccess) {
            ptr_ = nullptr;
            (void)cudaGetLastError();  // clear the sticky-free allocation error
            size_t free_bytes = 0, total_bytes = 0;
            cudaMemGetInfo(&free_bytes, &total_bytes);
            fail(strformat("out of GPU memory allocating %s: %.3f GiB asked, %.3f GiB free of %.3f GiB (%s); reduce "
                           "-b or -t, or turn on recomputation (-r)",
                           what, count * sizeof(T) / 1073741824.0, free_bytes / 1073741824.0,
                           total_bytes / 1073741824.0, cudaGetErrorString(err)));
        }
        count_ = count;
    }
    void release() {
        if (ptr_) cudaFree(ptr_);
        ptr_ = nullptr;
        count_ = 0;
    }

    T* get() const { return ptr_; }
    size_t count() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }

private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// Page-locked host memory: copies from and to it run asynchronously on a stream.
template <typename T>
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    PinnedBuffer(size_t count, const char* what) {
        if (count == 0) return;
        cudaError_t err = cudaMallocHost(&ptr_, count * sizeof(T));
        if (err != cudaSuccess) {
            ptr_ = nullptr;
            (void)cudaGetLastError();
            fail(strformat("cannot allocate %zu bytes of pinned host memory for %s: %s", count * sizeof(T), what,
                           cudaGetErrorString(err)));
        }
        count_ = count;
    }
    ~PinnedBuffer() {
        if (ptr_) cudaFreeHost(ptr_);
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFreeHost(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    T* get() const { return ptr_; }
    size_t count() const { return count_; }

private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// An owned CUDA stream (non-blocking with respect to the legacy default stream).
class CudaStream {
public:
    CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
    ~CudaStream() {
        if (stream_) cudaStreamDestroy(stream_);
    }
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    cudaStream_t get() const { return stream_; }
    void synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

private:
    cudaStream_t stream_ = nullptr;
};

// An owned CUDA event without timing (for ordering work across streams).
class CudaEvent {
public:
    CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
    ~CudaEvent() {
        if (event_) cudaEventDestroy(event_);
    }
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    cudaEvent_t get() const { return event_; }

private:
    cudaEvent_t event_ = nullptr;
};

// Whether this process can see a CUDA device (tests and tools use it to skip with a message).
inline bool cuda_device_present(std::string* why = nullptr) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "0 devices";
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

// What a GPU test or tool does where there is no device: skip (exit status 0), so that `make test-gpu`
// passes on a machine without one, except in a GPU session (LLMC_GPU_SESSION=1, set by
// dev/bench/gpu_session.sh), where a missing GPU is a failure: exit status 3, "no GPU".
inline int no_gpu_exit_status(const char* program, const std::string& why) {
    const char* session = getenv("LLMC_GPU_SESSION");
    const bool fail = session && std::string(session) == "1";
    printf("%s: no CUDA device (%s): %s\n", program, why.c_str(),
           fail ? "FAIL (LLMC_GPU_SESSION=1: no GPU is not a pass)" : "skipped");
    return fail ? 3 : 0;
}

}  // namespace llmc
