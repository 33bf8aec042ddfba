// dev/emu/test_ptx.cu: the inline PTX of llmc/kernels/attention.cuh (ldmatrix, mma.sync m16n8k16
// bf16, cp.async, ex2.approx.ftz) and of llmc/kernels/wgmma.cuh (wgmma.mma_async m64nNk16 bf16 with
// every shared-memory layout and swizzle, A in shared memory or registers; fence, commit_group,
// wait_group), of llmc/kernels/tma.cuh (mbarrier phases and tx-count, TMA's 2D tensor copies in every
// swizzle mode with out-of-bound zeros, a wgmma reading a TMA-loaded tile) and the warp shuffles,
// votes and block reductions llmc's kernels use, lane by lane.
// The same file compiles with nvcc: on a GPU it checks the hardware against the same expectations,
// so a pass on both says that the emulator and the GPU agree.
//
// The idea: each kernel is one warp (the block-wide ones one block, wgmma's a warpgroup or two)
// that writes every lane's registers to global memory, and the host checks every register, element
// by element, against tables transcribed here from the PTX ISA's fragment figures, layouts and
// formulas and the CUDA programming guide's shuffle rules, never from dev/emu/ptx.cpp. Operands are
// small integers, exact in bf16 and in every fp32 sum, so every check is an equality.
//
// Build and run, emulated (from the repository root; the emulator's objects as dev/emu/emu.h says):
//   g++ -std=c++20 -O2 -g -fopenmp -march=native -DLLMC_EMU -Idev/emu/include -I. -I/usr/local/cuda/include
//       -x c++ dev/emu/test_ptx.cu -x none build/emu/runtime.o build/emu/fibers.o build/emu/ptx.o
//       build/test/catch_impl.o -o build/emu/test_ptx -lboost_context && build/emu/test_ptx
// On a GPU (no GPU: it skips, or fails under LLMC_GPU_SESSION=1):
//   nvcc -std=c++20 -O2 -I. --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a dev/emu/test_ptx.cu
//       build/test/catch_impl.o -o build/test_ptx -lcublasLt -lgomp && build/test_ptx
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/tma.cuh"
#include "llmc/kernels/wgmma.cuh"
#include "test/catch_session.h"

using namespace llmc;
using namespace llmc::attention_detail;

// A named namespace: the emulator finds a kernel by the name nvcc gives it, and nvcc and g++ name an
// anonymous namespace differently (dev/emu/kernel_table.sh).
namespace ptx_test {

// ---------------------------------------------------------------------------------------------
// Host side: bf16 bits of small integers, device arrays, and a list of the elements that differ.

// The bf16 encoding of x, which must be exact in bf16 (its low 16 fp32 bits zero).
uint16_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    REQUIRE((u & 0xffffu) == 0);
    return (uint16_t)(u >> 16);
}
float bf16_value(uint16_t bits) {
    const uint32_t u = (uint32_t)bits << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
uint32_t pack_halves(uint16_t low, uint16_t high) { return (uint32_t)low | (uint32_t)high << 16; }

// A pseudo-random integer in [-limit, limit], fixed by (index, seed).
int small_int(uint32_t index, uint32_t seed, int limit) {
    return (int)(hash_u32(index * 2654435761u + seed) % (uint32_t)(2 * limit + 1)) - limit;
}

template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(const std::vector<T>& host) : count_(host.size()) {
        REQUIRE(cudaMalloc(&ptr_, bytes()) == cudaSuccess);
        REQUIRE(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    explicit DeviceArray(size_t count) : DeviceArray(std::vector<T>(count)) {}
    ~DeviceArray() { (void)cudaFree(ptr_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    T* get() const { return ptr_; }
    std::vector<T> download() const {
        std::vector<T> host(count_);
        REQUIRE(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
        return host;
    }

private:
    size_t bytes() const { return count_ * sizeof(T); }
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// After a launch: it was accepted, and it ran without a fault.
void finish_launch() {
    REQUIRE(cudaGetLastError() == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

// The elements that differ from what they should be; the report names the first few.
class Mismatches {
public:
    template <typename T>
    void expect(T got, T want, const std::string& where) {
        if (got == want) return;
        if (count_++ < 8)
            report_ += where + ": got " + std::to_string(got) + ", expected " + std::to_string(want) + "\n";
    }
    int count() const { return count_; }
    std::string report() const { return std::to_string(count_) + " element(s) differ\n" + report_; }

private:
    int count_ = 0;
    std::string report_;
};
#define CHECK_NO_MISMATCHES(m)   \
    do {                         \
        INFO((m).report());      \
        CHECK((m).count() == 0); \
    } while (0)

std::string at(const char* what, int lane, int reg, int half) {
    return std::string(what) + " lane " + std::to_string(lane) + " register " + std::to_string(reg) +
           (half ? " high half" : " low half");
}

struct RowCol {
    int row, col;
};

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16. PTX ISA, "Warp-level matrix load instruction:
// ldmatrix": for .x4, threads 0-7 give the addresses of rows 0-7 of matrix 0, threads 8-15 of
// matrix 1, 16-23 of matrix 2, 24-31 of matrix 3; destination register i holds matrix i. The figure
// of the fragment of one 8x8 matrix: each row is held by four consecutive threads, two consecutive
// elements each, the lower column in the lower half. With .trans the matrix is read column-major:
// a thread holds the same positions of the transpose.

// (row, col) of the stored matrix that each lane receives in the low and the high half, typed out.
const RowCol LDMATRIX_LOW[32] = {
    {0, 0}, {0, 2}, {0, 4}, {0, 6}, {1, 0}, {1, 2}, {1, 4}, {1, 6},  // lanes 0-7
    {2, 0}, {2, 2}, {2, 4}, {2, 6}, {3, 0}, {3, 2}, {3, 4}, {3, 6},  // lanes 8-15
    {4, 0}, {4, 2}, {4, 4}, {4, 6}, {5, 0}, {5, 2}, {5, 4}, {5, 6},  // lanes 16-23
    {6, 0}, {6, 2}, {6, 4}, {6, 6}, {7, 0}, {7, 2}, {7, 4}, {7, 6},  // lanes 24-31
};
const RowCol LDMATRIX_HIGH[32] = {
    {0, 1}, {0, 3}, {0, 5}, {0, 7}, {1, 1}, {1, 3}, {1, 5}, {1, 7},
    {2, 1}, {2, 3}, {2, 5}, {2, 7}, {3, 1}, {3, 3}, {3, 5}, {3, 7},
    {4, 1}, {4, 3}, {4, 5}, {4, 7}, {5, 1}, {5, 3}, {5, 5}, {5, 7},
    {6, 1}, {6, 3}, {6, 5}, {6, 7}, {7, 1}, {7, 3}, {7, 5}, {7, 7},
};
const RowCol LDMATRIX_TRANS_LOW[32] = {
    {0, 0}, {2, 0}, {4, 0}, {6, 0}, {0, 1}, {2, 1}, {4, 1}, {6, 1},
    {0, 2}, {2, 2}, {4, 2}, {6, 2}, {0, 3}, {2, 3}, {4, 3}, {6, 3},
    {0, 4}, {2, 4}, {4, 4}, {6, 4}, {0, 5}, {2, 5}, {4, 5}, {6, 5},
    {0, 6}, {2, 6}, {4, 6}, {6, 6}, {0, 7}, {2, 7}, {4, 7}, {6, 7},
};
const RowCol LDMATRIX_TRANS_HIGH[32] = {
    {1, 0}, {3, 0}, {5, 0}, {7, 0}, {1, 1}, {3, 1}, {5, 1}, {7, 1},
    {1, 2}, {3, 2}, {5, 2}, {7, 2}, {1, 3}, {3, 3}, {5, 3}, {7, 3},
    {1, 4}, {3, 4}, {5, 4}, {7, 4}, {1, 5}, {3, 5}, {5, 5}, {7, 5},
    {1, 6}, {3, 6}, {5, 6}, {7, 6}, {1, 7}, {3, 7}, {5, 7}, {7, 7},
};

// 16-byte slots of shared memory; the 32 row addresses use half of them, in a scattered order.
constexpr int LDMATRIX_SLOTS = 64;
int slot_of_row_address(int lane) { return (lane * 23 + 5) % LDMATRIX_SLOTS; }
// The value of element (row, col) of matrix m: 1..256, exact in bf16. Unused slots hold negatives.
float ldmatrix_value(int m, int row, int col) { return (float)(1 + 64 * m + 8 * row + col); }

// With `overwrite`, each lane zeroes the row it addressed right after the instruction: ldmatrix is one
// instruction of the whole warp, which has read every row by then.
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* image, const int* slot_of_lane, bool transpose,
                                bool overwrite) {
    __shared__ __align__(16) uint16_t slots[LDMATRIX_SLOTS * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < LDMATRIX_SLOTS * 8; i += 32) slots[i] = image[i];
    __syncthreads();
    uint32_t r[4];
    const uint32_t address = smem_addr(slots + slot_of_lane[lane] * 8);
    if (transpose) {
        ldmatrix_x4_trans(r, address);
    } else {
        ldmatrix_x4(r, address);
    }
    if (overwrite)
        for (int c = 0; c < 8; c++) slots[slot_of_lane[lane] * 8 + c] = 0;
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}

void check_ldmatrix(bool transpose, bool overwrite) {
    std::vector<uint16_t> image(LDMATRIX_SLOTS * 8);
    for (int s = 0; s < LDMATRIX_SLOTS; s++)
        for (int c = 0; c < 8; c++) image[s * 8 + c] = bf16_bits(-(float)(1 + s));
    std::vector<int> slot_of_lane(32);
    for (int lane = 0; lane < 32; lane++) {
        slot_of_lane[lane] = slot_of_row_address(lane);
        const int m = lane / 8, row = lane % 8;  // the row whose address this lane gives
        for (int c = 0; c < 8; c++) image[slot_of_lane[lane] * 8 + c] = bf16_bits(ldmatrix_value(m, row, c));
    }
    DeviceArray<uint16_t> d_image(image);
    DeviceArray<int> d_slots(slot_of_lane);
    DeviceArray<uint32_t> d_out(32 * 4);
    LLMC_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0)(d_out.get(), d_image.get(), d_slots.get(), transpose,
                                                 overwrite);
    finish_launch();
    const std::vector<uint32_t> out = d_out.download();

    const RowCol* low = transpose ? LDMATRIX_TRANS_LOW : LDMATRIX_LOW;
    const RowCol* high = transpose ? LDMATRIX_TRANS_HIGH : LDMATRIX_HIGH;
    Mismatches m;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const uint32_t r = out[lane * 4 + i];
            m.expect(bf16_value((uint16_t)(r & 0xffffu)), ldmatrix_value(i, low[lane].row, low[lane].col),
                     at("ldmatrix", lane, i, 0));
            m.expect(bf16_value((uint16_t)(r >> 16)), ldmatrix_value(i, high[lane].row, high[lane].col),
                     at("ldmatrix", lane, i, 1));
        }
    CHECK_NO_MISMATCHES(m);
}

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32. PTX ISA, "Matrix fragments for
// mma.m16n8k16 with floating point type", transcribed with the ISA's element numbering:
//   groupID = %laneid >> 2, threadID_in_group = %laneid % 4.
// A (16 x 16): four .b32 registers hold a0..a7, two .bf16 each (a0 in the low half of the first).
//   row = groupID      for ai where 0 <= i < 2 || 4 <= i < 6
//         groupID + 8  otherwise
//   col = (threadID_in_group * 2) + (i & 0x1)      for ai where i < 4
//         (threadID_in_group * 2) + (i & 0x1) + 8  for ai where i >= 4
// B (16 x 8): two .b32 registers hold b0..b3.
//   row = (threadID_in_group * 2) + (i & 0x1)      for bi where i < 2
//         (threadID_in_group * 2) + (i & 0x1) + 8  for bi where i >= 2
//   col = groupID
// C and D (16 x 8, .f32): c0..c3.
//   row = groupID      for ci where i < 2
//         groupID + 8  for ci where i >= 2
//   col = (threadID_in_group * 2) + (i & 0x1)

RowCol a_element(int lane, int i) {
    const int group_id = lane >> 2, thread_in_group = lane % 4;
    const int row = ((0 <= i && i < 2) || (4 <= i && i < 6)) ? group_id : group_id + 8;
    const int col = i < 4 ? thread_in_group * 2 + (i & 0x1) : thread_in_group * 2 + (i & 0x1) + 8;
    return {row, col};
}
RowCol b_element(int lane, int i) {
    const int group_id = lane >> 2, thread_in_group = lane % 4;
    const int row = i < 2 ? thread_in_group * 2 + (i & 0x1) : thread_in_group * 2 + (i & 0x1) + 8;
    return {row, group_id};
}
RowCol c_element(int lane, int i) {
    const int group_id = lane >> 2, thread_in_group = lane % 4;
    return {i < 2 ? group_id : group_id + 8, thread_in_group * 2 + (i & 0x1)};
}

__global__ void mma_kernel(float* d_out, const uint32_t* a_regs, const uint32_t* b_regs, const float* c_in) {
    const int lane = threadIdx.x;
    uint32_t a[4];
    float d[4];
    for (int i = 0; i < 4; i++) a[i] = a_regs[lane * 4 + i], d[i] = c_in[lane * 4 + i];
    mma_bf16_16816(d, a, b_regs[lane * 2], b_regs[lane * 2 + 1]);
    for (int i = 0; i < 4; i++) d_out[lane * 4 + i] = d[i];
}

// Tiles as attention.cuh holds them: row-major bf16 rows with 8 elements of padding.
constexpr int TILE_K = 32, TILE_N = 32, TILE_STRIDE = TILE_K + 8;

// A 16 x 32 tile of rows times K (stored [n][k]: S = A K^T) and times V (stored [k][n]: O = A V),
// through attention.cuh's own load_a_rows, mma_a_bt and mma_a_b. The padding holds NaN, so a read
// past a row's end shows in the result.
__global__ void tile_product_kernel(float* s_out, float* o_out, const uint16_t* a_rows, const uint16_t* k_rows,
                                    const uint16_t* v_rows) {
    __shared__ __align__(16) uint16_t a_tile[16 * TILE_STRIDE];
    __shared__ __align__(16) uint16_t k_tile[TILE_N * TILE_STRIDE];
    __shared__ __align__(16) uint16_t v_tile[TILE_K * TILE_STRIDE];
    const int lane = threadIdx.x;
    const uint16_t nan_bits = 0x7fc0;
    for (int i = lane; i < 16 * TILE_STRIDE; i += 32)
        a_tile[i] = i % TILE_STRIDE < TILE_K ? a_rows[i / TILE_STRIDE * TILE_K + i % TILE_STRIDE] : nan_bits;
    for (int i = lane; i < TILE_N * TILE_STRIDE; i += 32)
        k_tile[i] = i % TILE_STRIDE < TILE_K ? k_rows[i / TILE_STRIDE * TILE_K + i % TILE_STRIDE] : nan_bits;
    for (int i = lane; i < TILE_K * TILE_STRIDE; i += 32)
        v_tile[i] = i % TILE_STRIDE < TILE_N ? v_rows[i / TILE_STRIDE * TILE_N + i % TILE_STRIDE] : nan_bits;
    __syncthreads();
    uint32_t a[TILE_K / 16][4];
    load_a_rows<TILE_K, TILE_STRIDE>(a, reinterpret_cast<const floatX*>(a_tile), 0, lane);
    float s[TILE_N / 8][4] = {}, o[TILE_N / 8][4] = {};
    mma_a_bt<TILE_N, TILE_K, TILE_STRIDE>(s, a, reinterpret_cast<const floatX*>(k_tile), lane);
    mma_a_b<TILE_N, TILE_K, TILE_STRIDE>(o, a, reinterpret_cast<const floatX*>(v_tile), lane);
    for (int n = 0; n < TILE_N / 8; n++)
        for (int i = 0; i < 4; i++) {
            s_out[(lane * (TILE_N / 8) + n) * 4 + i] = s[n][i];
            o_out[(lane * (TILE_N / 8) + n) * 4 + i] = o[n][i];
        }
}

// ---------------------------------------------------------------------------------------------
// cp.async. PTX ISA, "cp.async": with src-size below cp-size the rest of the destination is zero
// filled (src-size 0: nothing is read); "cp.async.wait_group N" waits until at most the N most
// recent committed groups are pending and all earlier ones have completed, their writes visible
// to the executing thread. Nothing is said about a group still pending, so nothing is checked.

constexpr uint32_t SENTINEL = 0xdeadbeefu;
// Words of output per lane, in this order.
enum CpAsyncOut {
    OWN_COPY16 = 0,        // 4 words: the first group's 16-byte copy, after wait_group 1
    OWN_ZERO16 = 4,        // 4 words: the first group's 16-byte zero fill
    OWN_COPY4 = 8,         // the first group's 4-byte copy
    OWN_ZERO4 = 9,         // the first group's 4-byte zero fill
    OWN_SECOND16 = 10,     // 4 words: the second group's copy, after wait_group 0
    NEXT_COPY16 = 14,      // 4 words: lane + 1's first copy, after wait_group 0 and a barrier
    NEXT_SECOND16 = 18,    // 4 words: lane + 1's second copy
    CP_ASYNC_WORDS = 22
};

__global__ void cp_async_kernel(uint32_t* out, const uint32_t* first, const uint32_t* second) {
    __shared__ __align__(16) uint32_t copy16[32 * 4], zero16[32 * 4], second16[32 * 4];
    __shared__ __align__(16) uint32_t copy4[32], zero4[32];
    const int lane = threadIdx.x;
    for (int k = 0; k < 4; k++) copy16[lane * 4 + k] = zero16[lane * 4 + k] = second16[lane * 4 + k] = SENTINEL;
    copy4[lane] = zero4[lane] = SENTINEL;
    __syncthreads();
    cp_async16(smem_addr(copy16 + lane * 4), first + lane * 4, true);
    cp_async16(smem_addr(zero16 + lane * 4), first + lane * 4, false);  // a valid address, not read
    cp_async4(smem_addr(copy4 + lane), first + 128 + lane, true);
    cp_async4(smem_addr(zero4 + lane), first + 128 + lane, false);
    cp_async_commit();
    cp_async16(smem_addr(second16 + lane * 4), second + lane * 4, true);
    cp_async_commit();

    uint32_t* mine = out + lane * CP_ASYNC_WORDS;
    cp_async_wait<1>();
    for (int k = 0; k < 4; k++) {
        mine[OWN_COPY16 + k] = copy16[lane * 4 + k];
        mine[OWN_ZERO16 + k] = zero16[lane * 4 + k];
    }
    mine[OWN_COPY4] = copy4[lane];
    mine[OWN_ZERO4] = zero4[lane];
    cp_async_wait<0>();
    for (int k = 0; k < 4; k++) mine[OWN_SECOND16 + k] = second16[lane * 4 + k];
    __syncthreads();
    const int next = (lane + 1) % 32;
    for (int k = 0; k < 4; k++) {
        mine[NEXT_COPY16 + k] = copy16[next * 4 + k];
        mine[NEXT_SECOND16 + k] = second16[next * 4 + k];
    }
}

// ---------------------------------------------------------------------------------------------
// ex2.approx.ftz.f32 (PTX ISA, "ex2"): at most 2 ulp from the correctly rounded result over the
// full range (so within 2^-21 relative); .ftz flushes subnormal inputs and results to sign-preserving
// zero; -Inf -> +0.0, +-0.0 -> +1.0, +Inf -> +Inf, NaN -> NaN.

__global__ void exp2_kernel(float* y, const float* x, int n) {
    for (int i = threadIdx.x; i < n; i += 32) y[i] = fast_exp2(x[i]);
}

std::vector<float> run_exp2(const std::vector<float>& x) {
    DeviceArray<float> d_x(x), d_y(x.size());
    LLMC_LAUNCH(exp2_kernel, 1, 32, 0, 0)(d_y.get(), d_x.get(), (int)x.size());
    finish_launch();
    return d_y.download();
}

// ---------------------------------------------------------------------------------------------
// Shuffles, by the CUDA C++ programming guide ("Warp Shuffle Functions"): with width below 32 the
// warp is sections of `width` lanes, each with logical lanes 0..width-1.
//   __shfl_sync: srcLane outside [0, width-1] reads srcLane modulo width, within the caller's section.
//   __shfl_up_sync: the source is lane - delta; it does not wrap around width, so the lower delta
//     lanes of a section keep their own value.
//   __shfl_down_sync: lane + delta; the upper delta lanes of a section keep their own value.
//   __shfl_xor_sync: lane ^ laneMask; a lane may read an earlier section, but one whose source lies
//     in a later section gets its own value.

enum class Shuffle { Index, IndexPerLane, Up, Down, Xor };
struct ShuffleCase {
    Shuffle kind;
    int width, arg;
};
// IndexPerLane: lane l asks for srcLane 5 l + arg, beyond the width for most lanes.
__host__ __device__ inline int per_lane_source(int lane, int arg) { return 5 * lane + arg; }

__global__ void shuffle_kernel(int* out, Shuffle kind, int width, int arg) {
    const int lane = threadIdx.x;
    const int mine = 100 + lane;
    int got = -1;
    switch (kind) {
        case Shuffle::Index: got = __shfl_sync(0xffffffffu, mine, arg, width); break;
        case Shuffle::IndexPerLane: got = __shfl_sync(0xffffffffu, mine, per_lane_source(lane, arg), width); break;
        case Shuffle::Up: got = __shfl_up_sync(0xffffffffu, mine, (unsigned)arg, width); break;
        case Shuffle::Down: got = __shfl_down_sync(0xffffffffu, mine, (unsigned)arg, width); break;
        case Shuffle::Xor: got = __shfl_xor_sync(0xffffffffu, mine, arg, width); break;
    }
    out[lane] = got;
}

// The lane whose value `lane` receives, by the guide's rules above.
int shuffle_source(const ShuffleCase& c, int lane) {
    const int section = lane / c.width * c.width;  // the first lane of the caller's section
    const int logical = lane - section;
    switch (c.kind) {
        case Shuffle::Index: return section + c.arg % c.width;
        case Shuffle::IndexPerLane: return section + per_lane_source(lane, c.arg) % c.width;
        case Shuffle::Up: return logical < c.arg ? lane : lane - c.arg;
        case Shuffle::Down: return logical + c.arg >= c.width ? lane : lane + c.arg;
        case Shuffle::Xor: {
            const int source = lane ^ c.arg;
            return source >= section + c.width ? lane : source;
        }
    }
    return -1;
}

__global__ void shuffle_double_kernel(double* out) {
    const int lane = threadIdx.x;
    out[lane] = __shfl_xor_sync(0xffffffffu, 1e12 * lane + 0.5, 5);
}

// Votes: out[32 v + lane] is vote v of lane `lane`.
__global__ void vote_kernel(unsigned* out) {
    const int lane = threadIdx.x;
    out[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    out[32 + lane] = lane < 16 ? __ballot_sync(0x0000ffffu, lane % 2 == 1) : 0;  // lanes 16-31 stay out
    out[64 + lane] = __any_sync(0xffffffffu, lane == 17);
    out[96 + lane] = __all_sync(0xffffffffu, lane != 5);
}

// __syncthreads_count/and/or over a block of `blockDim.x` threads: out[4 t + v].
__global__ void block_vote_kernel(int* out) {
    const int t = threadIdx.x;
    out[4 * t + 0] = __syncthreads_count(t % 5 == 0);
    out[4 * t + 1] = __syncthreads_and(t >= 0) != 0;
    out[4 * t + 2] = __syncthreads_and(t != 3) != 0;
    out[4 * t + 3] = __syncthreads_or(t == (int)blockDim.x - 2) != 0;
}

__global__ void warp_reduce_kernel(float* out) {
    const int lane = threadIdx.x;
    out[lane] = warp_reduce_sum((float)(lane + 1));
    out[32 + lane] = warp_reduce_max((float)((lane * 11) % 32 - 7));  // lane * 11 mod 32: a permutation
}

// Two block reductions in a row through one `shared` (the second must not see the first's partials).
__global__ void block_reduce_kernel(float* out) {
    __shared__ float shared[WARP_SIZE];
    const int t = threadIdx.x;
    out[2 * t] = block_reduce_sum((float)(t % 13 - 6), shared);
    out[2 * t + 1] = block_reduce_max((float)((t * 37) % (int)blockDim.x), shared);
}

// ---------------------------------------------------------------------------------------------
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Instructions"), through llmc/kernels/wgmma.cuh. Transcribed here:
//
// Register fragments ("Matrix Fragments for wgmma.mma_async.m64nNk16"). Figure 149 (accumulator D,
// 64 x N): the warpgroup's warp w (threads 32w .. 32w+31) holds rows 16w .. 16w+15; in each 8-column
// block j the figure repeats one pattern: thread T (lane T % 32) holds d[4j] and d[4j+1] at row
// 16w + (T%32)/4, columns 8j + 2(T%4) and +1, and d[4j+2], d[4j+3] eight rows lower. Figure 148 (A
// in registers, 64 x 16, four .b32 of two bf16 each, a0..a7 low half first): warp w again holds rows
// 16w .. 16w+15, thread T's a0, a1 at row 16w + (T%32)/4, K 2(T%4) and +1; a2, a3 eight rows lower;
// a4, a5 and a6, a7 the same rows at K + 8.
//
// Shared memory ("Shared Memory Matrix Layout", "Canonical Layouts"): an operand is the ISA's table
// of CuTe layouts, (MN, K) coordinates to element offsets, composed with Swizzle<B, 4, 3>; T = 8
// elements of 16 bits per 128 bits, LBO and SBO the descriptor's byte offsets in elements:
//   MN-major  none   ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))
//             32B    ((T,2,m),(8,k)) : ((1,T,LBO),(2T,SBO))      Swizzle<1,4,3>
//             64B    ((T,4,m),(8,k)) : ((1,T,LBO),(4T,SBO))      Swizzle<2,4,3>
//             128B   ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))      Swizzle<3,4,3>
//   K-major   none   ((8,m),(T,2k))  : ((1T,SBO),(1,LBO))
//             32B    ((8,m),(T,2k))  : ((2T,SBO),(1,T))          Swizzle<1,4,3>
//             64B    ((8,m),(T,2k))  : ((4T,SBO),(1,T))          Swizzle<2,4,3>
//             128B   ((8,m),(T,2k))  : ((8T,SBO),(1,T))          Swizzle<3,4,3>
// ("Matrix Descriptor Format": swizzle field 0 none, 1 128B, 2 64B, 3 32B; a pattern starting on its
// 256/512/1024-byte boundary has base offset 0.) What the table leaves to the reader, and the GPU
// decides: the swizzle is read on byte addresses (CuTe's Swizzle<B,M,S>(x) = x ^ ((x & (2^B - 1) <<
// (M + S)) >> S), the 16-byte units of a row permuted), on the address itself (the start included,
// from a 1024-aligned base here), and a K-major swizzled operand's LBO is unused.
// A (M = 64) and B (N) are both MN x K here: A's MN is its row, B's its column. TRANS = 1 is MN-major.

// The element (MN, K) of operand `op` (0: A, 1: B) of a test product, K across all its steps.
float wgmma_value(int seed, int op, int mn, int k) {
    return (float)small_int((uint32_t)(mn * 64 + k), 100 * seed + op, 4);
}

struct RowColOf {
    static RowCol d(int thread, int i) {  // Figure 149
        const int w = thread / 32, lane = thread % 32;
        return {16 * w + lane / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2};
    }
    static RowCol a(int thread, int i) {  // Figure 148, element a_i
        const int w = thread / 32, lane = thread % 32;
        const bool lower = i == 2 || i == 3 || i == 6 || i == 7;
        return {16 * w + lane / 4 + (lower ? 8 : 0), 2 * (lane % 4) + i % 2 + (i >= 4 ? 8 : 0)};
    }
};

// One operand in shared memory as the kernel describes it: byte values from the kernel's
// 1024-aligned base, and the swizzle in bytes (0, 32, 64, 128).
struct SmemOperand {
    bool mn_major = false;
    int swizzle = 0;
    uint32_t start = 0, lbo = 0, sbo = 0;
};

// A CuTe mode, colexicographic, its last extent unbounded.
struct CuteMode {
    std::vector<int64_t> shape, stride;
};
int64_t cute_offset(const CuteMode& m, int64_t x) {
    int64_t offset = 0;
    for (size_t i = 0; i + 1 < m.shape.size(); i++) {
        offset += x % m.shape[i] * m.stride[i];
        x /= m.shape[i];
    }
    return offset + x * m.stride.back();
}
// The table above, for `o` (the unbounded m and k: 0).
void canonical_modes(const SmemOperand& o, CuteMode& mn, CuteMode& k) {
    const int64_t T = 8, LBO = o.lbo / 2, SBO = o.sbo / 2;
    const int64_t W = o.swizzle / 16;  // the swizzle atom's 128-bit units: 2, 4, 8
    if (o.mn_major && o.swizzle == 0)
        mn = {{T, 1, 0}, {1, T, SBO}}, k = {{8, 0}, {1 * T, LBO}};
    else if (o.mn_major)
        mn = {{T, W, 0}, {1, T, LBO}}, k = {{8, 0}, {W * T, SBO}};
    else if (o.swizzle == 0)
        mn = {{8, 0}, {1 * T, SBO}}, k = {{T, 0}, {1, LBO}};
    else
        mn = {{8, 0}, {W * T, SBO}}, k = {{T, 0}, {1, T}};
}
uint32_t cute_swizzle(int swizzle_bytes, uint32_t x) {  // Swizzle<B, 4, 3>
    const int B = swizzle_bytes == 128 ? 3 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 1 : 0;
    const uint32_t yyy_mask = ((1u << B) - 1) << (4 + 3);
    return x ^ ((x & yyy_mask) >> 3);
}
// Byte offset of element (mn, k) from the base; `k` may run past 16 (the next steps' slices).
uint32_t smem_byte(const SmemOperand& o, int mn, int k) {
    CuteMode m, kk;
    canonical_modes(o, m, kk);
    return cute_swizzle(o.swizzle, o.start + (uint32_t)(2 * (cute_offset(m, mn) + cute_offset(kk, k))));
}
// The start of the slice K = 16 s .. 16 s + 15: the unswizzled offset of element (0, 16 s).
uint32_t slice_start(const SmemOperand& o, int s) {
    CuteMode m, kk;
    canonical_modes(o, m, kk);
    return o.start + (uint32_t)(2 * cute_offset(kk, 16 * s));
}

// Places an mn x kk operand at `at` (a multiple of 1024), with gaps, so that LBO and SBO are not
// what a packed layout would have; `k_outer`: the K blocks outermost. Returns the end of its bytes.
SmemOperand place_operand(bool mn_major, int swizzle, int mn, int kk, uint32_t at, bool k_outer, uint32_t* end) {
    SmemOperand o;
    o.mn_major = mn_major, o.swizzle = swizzle;
    if (swizzle == 0) {  // core matrices of 128 bytes; SBO: the next 8 MN, LBO: the next 8 K (both majors)
        o.start = at + 48;
        if (k_outer)
            o.sbo = 128 + 16, o.lbo = (uint32_t)(mn / 8) * o.sbo + 32;
        else
            o.lbo = 128 + 32, o.sbo = (uint32_t)(kk / 8) * o.lbo + 16;
    } else if (!mn_major) {  // atoms of 8 rows of `swizzle` bytes along MN at SBO; LBO unused (the ISA
                             // example's 16, or something else)
        REQUIRE(2 * kk <= swizzle);
        o.start = at, o.lbo = k_outer ? 16 : 2048 + 48, o.sbo = 8 * (uint32_t)swizzle * (k_outer ? 2 : 1);
    } else {  // atoms of 8 K by swizzle/2 MN: along MN at LBO, along K (8 at a time) at SBO
        const uint32_t atom = 8 * (uint32_t)swizzle, atoms_mn = (uint32_t)(mn / (swizzle / 2)),
                       groups_k = (uint32_t)kk / 8;
        o.start = at;
        if (k_outer)
            o.lbo = atom, o.sbo = atoms_mn * atom + atom;
        else
            o.sbo = atom, o.lbo = groups_k * atom + atom;
    }
    uint32_t last = 0;
    for (int i = 0; i < mn; i++)
        for (int k = 0; k < kk; k++) last = std::max(last, smem_byte(o, i, k) + 2);
    *end = (last + 1023) / 1024 * 1024;
    return o;
}

// What the kernel gets: per warpgroup (at most 2) and step (at most 4), each operand's start, and its
// offsets and swizzle; the steps accumulate into the same registers, the first with `scale_d`.
constexpr int WG_MAX_GROUPS = 2, WG_MAX_STEPS = 4;
struct WgmmaOperandArgs {
    uint32_t start[WG_MAX_STEPS];
    uint32_t lbo, sbo;
    int swizzle;  // wgmma::Swizzle's value
};
struct WgmmaArgs {
    WgmmaOperandArgs a[WG_MAX_GROUPS], b[WG_MAX_GROUPS];
    int steps, scale_d, image_elements;
};

uint64_t swizzle_field(int swizzle_bytes) {
    return swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
}

// One warpgroup per 128 threads: the image into dynamic shared memory at a 1024-aligned shared
// address, then `steps` products into the thread's accumulators (loaded from c_in), one commit
// group, wait_group 0, and every accumulator out. A_REGS: A from a_regs ([group][step][thread][4]).
template <int N, bool TRANS_A, bool TRANS_B, bool A_REGS>
__global__ void wgmma_kernel(float* out, const uint16_t* image, const float* c_in, const uint32_t* a_regs,
                             WgmmaArgs args) {
    unsigned char* dynamic = dynamic_shared_memory<unsigned char>();
    const uint32_t pad = (1024u - (smem_addr(dynamic) & 1023u)) & 1023u;
    uint16_t* base = reinterpret_cast<uint16_t*>(dynamic + pad);
    for (int i = threadIdx.x; i < args.image_elements; i += blockDim.x) base[i] = image[i];
    llmc::wgmma::fence_proxy_async();
    __syncthreads();
    const int group = threadIdx.x / 128, thread = threadIdx.x % 128;
    const uint32_t base_address = smem_addr(base);
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = c_in[threadIdx.x * (N / 2) + i];
    // The steps unrolled, so that each step's A fragment has registers of its own, untouched until the
    // wait (a register rewritten for the next step while a wgmma may still read it is undefined).
    uint32_t a[WG_MAX_STEPS][4] = {};
    if (A_REGS) {
#pragma unroll
        for (int s = 0; s < WG_MAX_STEPS; s++)
            for (int r = 0; r < 4; r++)
                if (s < args.steps) a[s][r] = a_regs[((group * WG_MAX_STEPS + s) * 128 + thread) * 4 + r];
    }
    const WgmmaOperandArgs& oa = args.a[group];
    const WgmmaOperandArgs& ob = args.b[group];
    llmc::wgmma::fence_operands(d);
    llmc::wgmma::fence();
#pragma unroll
    for (int s = 0; s < WG_MAX_STEPS; s++) {
        if (s >= args.steps) break;
        const bool scale_d = s > 0 || args.scale_d;
        const uint64_t desc_b =
            llmc::wgmma::descriptor(base_address + ob.start[s], ob.lbo, ob.sbo, (llmc::wgmma::Swizzle)ob.swizzle);
        if constexpr (A_REGS) {
            llmc::wgmma::mma_rs<N, TRANS_B>(d, a[s], desc_b, scale_d);
        } else {
            const uint64_t desc_a =
                llmc::wgmma::descriptor(base_address + oa.start[s], oa.lbo, oa.sbo, (llmc::wgmma::Swizzle)oa.swizzle);
            llmc::wgmma::mma_ss<N, TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d);
        }
    }
    llmc::wgmma::commit_group();
    llmc::wgmma::wait_group<0>();
    llmc::wgmma::fence_operands(d);
    for (int i = 0; i < N / 2; i++) out[threadIdx.x * (N / 2) + i] = d[i];
}

// wait_group 1: two groups into two accumulators; the first is read after wait_group 1 (its group
// complete, the second's maybe not), the second after wait_group 0. Both from the image's first
// warpgroup layout: d1 = A B, d2 = A B + C.
template <bool TRANS_A, bool TRANS_B>
__global__ void wgmma_two_groups_kernel(float* out, const uint16_t* image, const float* c_in, WgmmaArgs args) {
    unsigned char* dynamic = dynamic_shared_memory<unsigned char>();
    const uint32_t pad = (1024u - (smem_addr(dynamic) & 1023u)) & 1023u;
    uint16_t* base = reinterpret_cast<uint16_t*>(dynamic + pad);
    for (int i = threadIdx.x; i < args.image_elements; i += blockDim.x) base[i] = image[i];
    llmc::wgmma::fence_proxy_async();
    __syncthreads();
    const uint32_t base_address = smem_addr(base);
    const WgmmaOperandArgs& oa = args.a[0];
    const WgmmaOperandArgs& ob = args.b[0];
    const uint64_t desc_a =
        llmc::wgmma::descriptor(base_address + oa.start[0], oa.lbo, oa.sbo, (llmc::wgmma::Swizzle)oa.swizzle);
    const uint64_t desc_b =
        llmc::wgmma::descriptor(base_address + ob.start[0], ob.lbo, ob.sbo, (llmc::wgmma::Swizzle)ob.swizzle);
    float d1[32], d2[32];
    for (int i = 0; i < 32; i++) d1[i] = 0.0f, d2[i] = c_in[threadIdx.x * 32 + i];
    llmc::wgmma::fence_operands(d1);
    llmc::wgmma::fence_operands(d2);
    llmc::wgmma::fence();
    llmc::wgmma::mma_ss<64, TRANS_A, TRANS_B>(d1, desc_a, desc_b, false);
    llmc::wgmma::commit_group();
    llmc::wgmma::mma_ss<64, TRANS_A, TRANS_B>(d2, desc_a, desc_b, true);
    llmc::wgmma::commit_group();
    llmc::wgmma::wait_group<1>();
    llmc::wgmma::fence_operands(d1);
    for (int i = 0; i < 32; i++) out[threadIdx.x * 64 + i] = d1[i];
    llmc::wgmma::wait_group<0>();
    llmc::wgmma::fence_operands(d2);
    for (int i = 0; i < 32; i++) out[threadIdx.x * 64 + 32 + i] = d2[i];
}

// A product to check: per warpgroup, each operand's major-ness, swizzle and placement.
struct WgmmaOperandSpec {
    bool mn_major;
    int swizzle;  // bytes
    bool k_outer;
};
struct WgmmaGroupSpec {
    WgmmaOperandSpec a, b;  // a unused with A in registers
};
struct WgmmaSpec {
    int steps = 1;
    bool scale_d = true;
    std::vector<WgmmaGroupSpec> groups;
    int seed = 1;
};
std::string describe(const WgmmaOperandSpec& o) {
    return std::string(o.mn_major ? "MN-major" : "K-major") + " " +
           (o.swizzle ? std::to_string(o.swizzle) + "B swizzle" : std::string("no swizzle")) +
           (o.k_outer ? " (K blocks outer)" : " (MN blocks outer)");
}

// The operands, the image of shared memory and the kernel's arguments for `spec`.
struct WgmmaSetup {
    std::vector<uint16_t> image;
    WgmmaArgs args{};
    std::vector<float> c_in;
    std::vector<uint32_t> a_regs;
    std::string what;
};
template <int N>
WgmmaSetup setup_wgmma(const WgmmaSpec& spec, bool a_in_registers) {
    REQUIRE(spec.steps >= 1);
    REQUIRE(spec.steps <= WG_MAX_STEPS);
    REQUIRE(spec.groups.size() <= (size_t)WG_MAX_GROUPS);
    const int kk = 16 * spec.steps;
    WgmmaSetup s;
    s.what = "m64n" + std::to_string(N) + "k16 x " + std::to_string(spec.steps) + (spec.scale_d ? "" : ", scale-d 0");
    std::vector<std::pair<uint32_t, uint16_t>> writes;  // (byte offset, bf16 bits)
    uint32_t at = 0;
    for (size_t g = 0; g < spec.groups.size(); g++) {
        const WgmmaGroupSpec& gs = spec.groups[g];
        const int seed = spec.seed + (int)g;
        auto place = [&](const WgmmaOperandSpec& os, int op, int mn, WgmmaOperandArgs& args) {
            const SmemOperand o = place_operand(os.mn_major, os.swizzle, mn, kk, at, os.k_outer, &at);
            for (int i = 0; i < mn; i++)
                for (int k = 0; k < kk; k++)
                    writes.push_back({smem_byte(o, i, k), bf16_bits(wgmma_value(seed, op, i, k))});
            for (int st = 0; st < spec.steps; st++) args.start[st] = slice_start(o, st);
            args.lbo = o.lbo, args.sbo = o.sbo, args.swizzle = (int)swizzle_field(o.swizzle);
        };
        if (!a_in_registers) place(gs.a, 0, 64, s.args.a[g]);
        place(gs.b, 1, N, s.args.b[g]);
        s.what += "; warpgroup " + std::to_string(g) + ": A " + (a_in_registers ? "in registers" : describe(gs.a)) +
                  ", B " + describe(gs.b);
    }
    s.image.assign(at / 2, (uint16_t)0x7fc0);  // NaN wherever no element lies
    std::vector<char> used(at / 2, 0);
    int collisions = 0;  // the transcription places every element at an address of its own
    for (const auto& [byte, bits] : writes) {
        collisions += byte % 2 != 0 || used[byte / 2];
        used[byte / 2] = 1;
        s.image[byte / 2] = bits;
    }
    REQUIRE(collisions == 0);
    s.args.steps = spec.steps, s.args.scale_d = spec.scale_d, s.args.image_elements = (int)s.image.size();
    const int threads = 128 * (int)spec.groups.size();
    s.c_in.resize((size_t)threads * (N / 2));
    for (int t = 0; t < threads; t++)
        for (int i = 0; i < N / 2; i++) {
            const RowCol e = RowColOf::d(t % 128, i);
            s.c_in[(size_t)t * (N / 2) + i] =
                spec.scale_d ? (float)small_int((uint32_t)(e.row * 256 + e.col), 50 + spec.seed + t / 128, 50)
                             : std::numeric_limits<float>::quiet_NaN();
        }
    if (a_in_registers) {
        s.a_regs.assign((size_t)WG_MAX_GROUPS * WG_MAX_STEPS * 128 * 4, 0);
        for (int g = 0; g < (int)spec.groups.size(); g++)
            for (int st = 0; st < spec.steps; st++)
                for (int t = 0; t < 128; t++)
                    for (int r = 0; r < 4; r++) {
                        const RowCol lo = RowColOf::a(t, 2 * r), hi = RowColOf::a(t, 2 * r + 1);
                        s.a_regs[(size_t)((g * WG_MAX_STEPS + st) * 128 + t) * 4 + r] =
                            pack_halves(bf16_bits(wgmma_value(spec.seed + g, 0, lo.row, 16 * st + lo.col)),
                                        bf16_bits(wgmma_value(spec.seed + g, 0, hi.row, 16 * st + hi.col)));
                    }
    } else {
        s.a_regs.assign(4, 0);
    }
    return s;
}

// Every accumulator of every thread against the CPU's product, through Figure 149's layout.
template <int N>
void check_wgmma_out(const WgmmaSpec& spec, const WgmmaSetup& s, const std::vector<float>& out, int n_offset,
                     int stride, bool scale_d, Mismatches& m) {
    const int kk = 16 * spec.steps;
    for (int t = 0; t < 128 * (int)spec.groups.size(); t++)
        for (int i = 0; i < N / 2; i++) {
            const RowCol e = RowColOf::d(t % 128, i);
            const int seed = spec.seed + t / 128;
            double want = scale_d ? (double)s.c_in[(size_t)t * (N / 2) + i] : 0.0;
            for (int k = 0; k < kk; k++)
                want += (double)wgmma_value(seed, 0, e.row, k) * wgmma_value(seed, 1, e.col, k);
            m.expect((double)out[(size_t)t * stride + n_offset + i], want,
                     "thread " + std::to_string(t) + " d" + std::to_string(i) + " (row " + std::to_string(e.row) +
                         ", column " + std::to_string(e.col) + ")");
        }
}

template <int N, bool TRANS_A, bool TRANS_B, bool A_REGS>
void check_wgmma(const WgmmaSpec& spec) {
    const WgmmaSetup s = setup_wgmma<N>(spec, A_REGS);
    const int threads = 128 * (int)spec.groups.size();
    DeviceArray<uint16_t> d_image(s.image);
    DeviceArray<float> d_c(s.c_in), d_out((size_t)threads * (N / 2));
    DeviceArray<uint32_t> d_a(s.a_regs);
    const size_t shared = s.image.size() * 2 + 1024;
    auto kernel = wgmma_kernel<N, TRANS_A, TRANS_B, A_REGS>;
    REQUIRE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared) == cudaSuccess);
    LLMC_LAUNCH((wgmma_kernel<N, TRANS_A, TRANS_B, A_REGS>), 1, threads, shared, 0)(d_out.get(), d_image.get(),
                                                                                   d_c.get(), d_a.get(), s.args);
    finish_launch();
    Mismatches m;
    check_wgmma_out<N>(spec, s, d_out.download(), 0, N / 2, spec.scale_d, m);
    INFO(s.what);
    CHECK_NO_MISMATCHES(m);
}
// The instance for the spec's major-ness (one per warpgroup spec: all groups alike here).
template <int N>
void check_wgmma_ss(const WgmmaSpec& spec) {
    const bool ta = spec.groups[0].a.mn_major, tb = spec.groups[0].b.mn_major;
    for (const WgmmaGroupSpec& g : spec.groups) REQUIRE((g.a.mn_major == ta && g.b.mn_major == tb));
    if (!ta && !tb) check_wgmma<N, false, false, false>(spec);
    if (!ta && tb) check_wgmma<N, false, true, false>(spec);
    if (ta && !tb) check_wgmma<N, true, false, false>(spec);
    if (ta && tb) check_wgmma<N, true, true, false>(spec);
}
template <int N>
void check_wgmma_rs(const WgmmaSpec& spec) {
    const bool tb = spec.groups[0].b.mn_major;
    for (const WgmmaGroupSpec& g : spec.groups) REQUIRE(g.b.mn_major == tb);
    if (tb)
        check_wgmma<N, false, true, true>(spec);
    else
        check_wgmma<N, false, false, true>(spec);
}
WgmmaSpec one_group(WgmmaOperandSpec a, WgmmaOperandSpec b, int steps = 1, bool scale_d = true, int seed = 1) {
    WgmmaSpec s;
    s.steps = steps, s.scale_d = scale_d, s.seed = seed;
    s.groups.push_back({a, b});
    return s;
}
constexpr int SWIZZLES[] = {0, 32, 64, 128};


// ---------------------------------------------------------------------------------------------
// mbarrier and TMA (llmc/kernels/tma.cuh). PTX ISA, "Tensors": a tiled copy moves the box whose first
// element is at the coordinates (x: the inner dimension, y: the outer) into shared memory, row after
// row; an element outside the tensor (a coordinate below 0 or past the size) arrives as zero.
// "Tensor swizzling modes": with a W-byte swizzle the 16-byte chunks of each W-byte span of shared
// memory are permuted, chunk c of the span going to c XOR (the 128-byte line's index mod W / 16), so
// the pattern repeats every 8 W bytes (for 128 bytes: the row of 128 bytes r, chunk c at c ^ (r % 8)).
// mbarrier: a phase completes when its arrivals and its tx-count (the bytes announced by expect_tx,
// less those the copies completed) are both done; try_wait.parity is true once the phase with that
// parity has completed. Elements are raw bf16 bits, each its own (position-coded) value.

// The bits of element (row, col) of a test tensor: distinct and never 0 (0 is the fill).
uint16_t tensor_bits(int row, int col, int seed) {
    return (uint16_t)(0x4000 + ((row * 97 + col + seed * 31) & 0x3fff));
}

// The shared-memory byte offset of byte `o` of a row-major box image, swizzled by the ISA's rule
// above for a 1024-aligned destination (W = 0: unswizzled).
uint32_t tma_swizzled_offset(uint32_t o, int swizzle_bytes) {
    if (swizzle_bytes == 0) return o;
    const uint32_t chunks = (uint32_t)swizzle_bytes / 16, chunk = o / 16 % chunks, line = o / 128 % chunks;
    return o - 16 * chunk + 16 * (chunk ^ line);
}

// A 1024-aligned start in dynamic shared memory (the 128-byte swizzle's repeat).
__device__ inline unsigned char* aligned_dynamic_shared() {
    unsigned char* dynamic = dynamic_shared_memory<unsigned char>();
    return dynamic + ((1024u - (smem_addr(dynamic) & 1023u)) & 1023u);
}

// One box at (x, y) into shared memory; every thread waits for it, then the shared image (bytes
// `image_bytes`) goes out as it lies.
__global__ void tma_box_kernel(uint16_t* out, const __grid_constant__ CUtensorMap map, int x, int y, int box_bytes,
                               int image_bytes) {
    __shared__ __align__(8) uint64_t bar;
    uint16_t* tile = reinterpret_cast<uint16_t*>(aligned_dynamic_shared());
    for (int i = threadIdx.x; i < image_bytes / 2; i += blockDim.x) tile[i] = 0xdead;  // no stale zeros
    if (threadIdx.x == 0) {
        llmc::tma::prefetch_tensor_map(&map);
        llmc::tma::mbarrier_init(&bar, 1);
        llmc::tma::fence_barrier_init();
    }
    llmc::wgmma::fence_proxy_async();  // the generic stores above before the copy's async-proxy writes
    __syncthreads();
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_arrive_expect_tx(&bar, (uint32_t)box_bytes);
        llmc::tma::copy_2d(tile, &map, x, y, &bar);
    }
    llmc::tma::mbarrier_wait(&bar, 0);
    for (int i = threadIdx.x; i < image_bytes / 2; i += blockDim.x) out[i] = tile[i];
}

// `phases` boxes, one after another through the same stage and barrier, box p at (0, p box_rows).
// The barrier expects one arrival per warp (lane 0; thread 0's is the arrive.expect_tx), so a phase
// needs four arrivals and the copy's bytes. Before each copy thread 0 records try_wait.parity of
// the preceding phase's parity (it has completed: true, for phase 0 too, the fresh barrier's).
__global__ void tma_phases_kernel(uint16_t* out, int* preceding_done, const __grid_constant__ CUtensorMap map,
                                  int phases, int box_rows, int box_elements) {
    __shared__ __align__(8) uint64_t bar;
    uint16_t* tile = reinterpret_cast<uint16_t*>(aligned_dynamic_shared());
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_init(&bar, blockDim.x / 32);
        llmc::tma::fence_barrier_init();
    }
    __syncthreads();
    for (int p = 0; p < phases; p++) {
        if (threadIdx.x == 0) {
            preceding_done[p] = llmc::tma::mbarrier_try_wait_parity(&bar, (uint32_t)(p + 1) & 1) ? 1 : 0;
            llmc::tma::mbarrier_arrive_expect_tx(&bar, (uint32_t)box_elements * 2);
            llmc::tma::copy_2d(tile, &map, 0, p * box_rows, &bar);
        } else if (threadIdx.x % 32 == 0) {
            llmc::tma::mbarrier_arrive(&bar);
        }
        llmc::tma::mbarrier_wait(&bar, (uint32_t)p & 1);
        for (int i = threadIdx.x; i < box_elements; i += blockDim.x) out[p * box_elements + i] = tile[i];
        __syncthreads();  // every thread has read the stage before the next copy overwrites it
    }
}

// Two boxes, from two maps, completing on one barrier: one expect_tx of both boxes' bytes.
__global__ void tma_two_copies_kernel(uint16_t* out, const __grid_constant__ CUtensorMap map_a,
                                      const __grid_constant__ CUtensorMap map_b, int bytes_a, int bytes_b) {
    __shared__ __align__(8) uint64_t bar;
    unsigned char* tile_a = aligned_dynamic_shared();
    unsigned char* tile_b = tile_a + (bytes_a + 1023) / 1024 * 1024;
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_init(&bar, 1);
        llmc::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_arrive_expect_tx(&bar, (uint32_t)(bytes_a + bytes_b));
        llmc::tma::copy_2d(tile_a, &map_a, 0, 0, &bar);
        llmc::tma::copy_2d(tile_b, &map_b, 8, 2, &bar);
    }
    llmc::tma::mbarrier_wait(&bar, 0);
    const uint16_t* a = reinterpret_cast<const uint16_t*>(tile_a);
    const uint16_t* b = reinterpret_cast<const uint16_t*>(tile_b);
    for (int i = threadIdx.x; i < bytes_a / 2; i += blockDim.x) out[i] = a[i];
    for (int i = threadIdx.x; i < bytes_b / 2; i += blockDim.x) out[bytes_a / 2 + i] = b[i];
}

// D (64 x 64) = A (64 x 64) B^T, both K-major (row-major, 64 K per row), each loaded by one TMA box
// with the 128-byte swizzle: rows of 128 bytes, 8 rows (1024 bytes) to a pattern, so wgmma reads them
// with 128-byte-swizzle descriptors, SBO 1024, the start 32 bytes on per 16 K.
__global__ void tma_wgmma_kernel(float* out, const __grid_constant__ CUtensorMap map_a,
                                 const __grid_constant__ CUtensorMap map_b) {
    constexpr uint32_t TILE_BYTES = 64 * 64 * 2;
    __shared__ __align__(8) uint64_t bar;
    unsigned char* tile_a = aligned_dynamic_shared();
    unsigned char* tile_b = tile_a + TILE_BYTES;
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_init(&bar, 1);
        llmc::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        llmc::tma::mbarrier_arrive_expect_tx(&bar, 2 * TILE_BYTES);
        llmc::tma::copy_2d(tile_a, &map_a, 0, 0, &bar);
        llmc::tma::copy_2d(tile_b, &map_b, 0, 0, &bar);
    }
    llmc::tma::mbarrier_wait(&bar, 0);
    float d[32];
    llmc::wgmma::fence_operands(d);
    llmc::wgmma::fence();
#pragma unroll
    for (int s = 0; s < 4; s++) {
        constexpr llmc::wgmma::Swizzle SW128 = llmc::wgmma::Swizzle::Bytes128;
        const uint64_t desc_a = llmc::wgmma::descriptor(smem_addr(tile_a) + 32 * s, 16, 1024, SW128);
        const uint64_t desc_b = llmc::wgmma::descriptor(smem_addr(tile_b) + 32 * s, 16, 1024, SW128);
        llmc::wgmma::mma_ss<64, false, false>(d, desc_a, desc_b, s > 0);
    }
    llmc::wgmma::commit_group();
    llmc::wgmma::wait_group<0>();
    llmc::wgmma::fence_operands(d);
    for (int i = 0; i < 32; i++) out[threadIdx.x * 32 + i] = d[i];
}

// A rows x cols bf16 tensor in device memory, rows `stride` elements apart, each element its own bits.
struct TmaTensor {
    int rows, cols, stride, seed;
    std::vector<uint16_t> host;
    TmaTensor(int r, int c, int s, int sd) : rows(r), cols(c), stride(s), seed(sd), host((size_t)r * s, 0x7fc0) {
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) host[(size_t)i * stride + j] = tensor_bits(i, j, seed);
    }
    // Element (row, col), 0 outside the tensor.
    uint16_t at(int row, int col) const {
        return row < 0 || col < 0 || row >= rows || col >= cols ? 0 : host[(size_t)row * stride + col];
    }
};
CUtensorMap tma_map(const TmaTensor& t, const DeviceArray<uint16_t>& d, int box_rows, int box_cols, int swizzle_bytes) {
    const llmc::tma::Swizzle modes[] = {llmc::tma::Swizzle::None, llmc::tma::Swizzle::Bytes32,
                                        llmc::tma::Swizzle::Bytes64, llmc::tma::Swizzle::Bytes128};
    const int mode = swizzle_bytes == 0 ? 0 : swizzle_bytes == 32 ? 1 : swizzle_bytes == 64 ? 2 : 3;
    return llmc::tma::make_tensor_map_2d(d.get(), (uint64_t)t.rows, (uint64_t)t.cols, (uint64_t)t.stride * 2,
                                         (uint32_t)box_rows, (uint32_t)box_cols, modes[mode]);
}
// Every element of the box at (x, y) at its swizzled place in the shared image `image` (from byte 0).
void check_box_image(const TmaTensor& t, const std::vector<uint16_t>& image, size_t from, int box_rows, int box_cols,
                     int x, int y, int swizzle_bytes, Mismatches& m) {
    for (int r = 0; r < box_rows; r++)
        for (int c = 0; c < box_cols; c++) {
            const uint32_t o = tma_swizzled_offset((uint32_t)(r * box_cols + c) * 2, swizzle_bytes);
            m.expect((int)image[from + o / 2], (int)t.at(y + r, x + c),
                     "box element (" + std::to_string(r) + ", " + std::to_string(c) + ") at shared byte " +
                         std::to_string(o));
        }
}
void check_tma_box(const TmaTensor& t, int box_rows, int box_cols, int x, int y, int swizzle_bytes) {
    DeviceArray<uint16_t> d_tensor(t.host);
    const CUtensorMap map = tma_map(t, d_tensor, box_rows, box_cols, swizzle_bytes);
    const int box_bytes = box_rows * box_cols * 2, image_bytes = (box_bytes + 127) / 128 * 128;
    DeviceArray<uint16_t> d_out((size_t)image_bytes / 2);
    LLMC_LAUNCH(tma_box_kernel, 1, 128, (size_t)image_bytes + 1024, 0)(d_out.get(), map, x, y, box_bytes,
                                                                        image_bytes);
    finish_launch();
    Mismatches m;
    check_box_image(t, d_out.download(), 0, box_rows, box_cols, x, y, swizzle_bytes, m);
    INFO("box " << box_rows << " x " << box_cols << " at (x " << x << ", y " << y << "), swizzle " << swizzle_bytes
                << " bytes, tensor " << t.rows << " x " << t.cols);
    CHECK_NO_MISMATCHES(m);
}

}  // namespace ptx_test

using namespace ptx_test;

// =============================================================================================

TEST_CASE("ldmatrix.x4 gives every lane row laneid/4, columns 2(laneid%4) and +1, of matrix i in register i") {
    check_ldmatrix(false, false);
}

TEST_CASE("ldmatrix.x4.trans gives every lane the transposed positions, from scattered row addresses") {
    check_ldmatrix(true, false);
}

TEST_CASE("ldmatrix reads every row at the instruction: a lane overwriting its row after it changes no register") {
    check_ldmatrix(false, true);
    check_ldmatrix(true, true);
}

TEST_CASE("mma.m16n8k16 bf16 computes D = A B + C with the ISA's fragment layout in every lane") {
    float A[16][16], B[16][8], C[16][8];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) A[r][k] = (float)small_int(r * 16 + k, 1, 8);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = (float)small_int(k * 8 + n, 2, 8);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) C[r][n] = (float)small_int(r * 8 + n, 3, 100);
    std::vector<uint32_t> a_regs(32 * 4), b_regs(32 * 2);
    std::vector<float> c_in(32 * 4);
    for (int lane = 0; lane < 32; lane++) {
        for (int reg = 0; reg < 4; reg++) {
            const RowCol lo = a_element(lane, 2 * reg), hi = a_element(lane, 2 * reg + 1);
            a_regs[lane * 4 + reg] = pack_halves(bf16_bits(A[lo.row][lo.col]), bf16_bits(A[hi.row][hi.col]));
        }
        for (int reg = 0; reg < 2; reg++) {
            const RowCol lo = b_element(lane, 2 * reg), hi = b_element(lane, 2 * reg + 1);
            b_regs[lane * 2 + reg] = pack_halves(bf16_bits(B[lo.row][lo.col]), bf16_bits(B[hi.row][hi.col]));
        }
        for (int i = 0; i < 4; i++) c_in[lane * 4 + i] = C[c_element(lane, i).row][c_element(lane, i).col];
    }
    DeviceArray<uint32_t> d_a(a_regs), d_b(b_regs);
    DeviceArray<float> d_c(c_in), d_d(32 * 4);
    LLMC_LAUNCH(mma_kernel, 1, 32, 0, 0)(d_d.get(), d_a.get(), d_b.get(), d_c.get());
    finish_launch();
    const std::vector<float> d = d_d.download();

    Mismatches m;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const RowCol e = c_element(lane, i);
            double want = C[e.row][e.col];
            for (int k = 0; k < 16; k++) want += (double)A[e.row][k] * B[k][e.col];
            m.expect((double)d[lane * 4 + i], want, "d" + std::to_string(i) + " of lane " + std::to_string(lane));
        }
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("attention's ldmatrix-fed products (load_a_rows, mma_a_bt, mma_a_b) equal a plain matmul") {
    std::vector<uint16_t> a_rows(16 * TILE_K), k_rows(TILE_N * TILE_K), v_rows(TILE_K * TILE_N);
    std::vector<float> A(a_rows.size()), K(k_rows.size()), V(v_rows.size());
    for (size_t i = 0; i < A.size(); i++) A[i] = (float)small_int((uint32_t)i, 4, 4), a_rows[i] = bf16_bits(A[i]);
    for (size_t i = 0; i < K.size(); i++) K[i] = (float)small_int((uint32_t)i, 5, 4), k_rows[i] = bf16_bits(K[i]);
    for (size_t i = 0; i < V.size(); i++) V[i] = (float)small_int((uint32_t)i, 6, 4), v_rows[i] = bf16_bits(V[i]);
    DeviceArray<uint16_t> d_a(a_rows), d_k(k_rows), d_v(v_rows);
    DeviceArray<float> d_s(32 * TILE_N / 8 * 4), d_o(32 * TILE_N / 8 * 4);
    LLMC_LAUNCH(tile_product_kernel, 1, 32, 0, 0)(d_s.get(), d_o.get(), d_a.get(), d_k.get(), d_v.get());
    finish_launch();
    const std::vector<float> s = d_s.download(), o = d_o.download();

    Mismatches m;
    for (int lane = 0; lane < 32; lane++)
        for (int n8 = 0; n8 < TILE_N / 8; n8++)
            for (int i = 0; i < 4; i++) {
                const RowCol e = c_element(lane, i);
                const int col = n8 * 8 + e.col;
                double want_s = 0, want_o = 0;
                for (int k = 0; k < TILE_K; k++) {
                    want_s += (double)A[e.row * TILE_K + k] * K[col * TILE_K + k];
                    want_o += (double)A[e.row * TILE_K + k] * V[k * TILE_N + col];
                }
                const std::string where = "lane " + std::to_string(lane) + " block " + std::to_string(n8) +
                                          " element " + std::to_string(i) + " (row " + std::to_string(e.row) +
                                          ", column " + std::to_string(col) + ")";
                m.expect((double)s[(lane * (TILE_N / 8) + n8) * 4 + i], want_s, "S = A K^T " + where);
                m.expect((double)o[(lane * (TILE_N / 8) + n8) * 4 + i], want_o, "O = A V " + where);
            }
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("cp.async: wait_group 1 lands all but the newest group, zero fills included; wait_group 0 lands all") {
    std::vector<uint32_t> first(128 + 32), second(128);
    for (size_t i = 0; i < first.size(); i++) first[i] = 0x10000u + (uint32_t)i;
    for (size_t i = 0; i < second.size(); i++) second[i] = 0x20000u + (uint32_t)i;
    DeviceArray<uint32_t> d_first(first), d_second(second), d_out(32 * CP_ASYNC_WORDS);
    LLMC_LAUNCH(cp_async_kernel, 1, 32, 0, 0)(d_out.get(), d_first.get(), d_second.get());
    finish_launch();
    const std::vector<uint32_t> out = d_out.download();

    Mismatches m;
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t* mine = out.data() + lane * CP_ASYNC_WORDS;
        const int next = (lane + 1) % 32;
        const std::string who = "lane " + std::to_string(lane) + " ";
        for (int k = 0; k < 4; k++) {
            const std::string word = " word " + std::to_string(k);
            m.expect(mine[OWN_COPY16 + k], first[lane * 4 + k], who + "16-byte copy after wait_group 1" + word);
            m.expect(mine[OWN_ZERO16 + k], 0u, who + "16-byte zero fill after wait_group 1" + word);
            m.expect(mine[OWN_SECOND16 + k], second[lane * 4 + k], who + "second group after wait_group 0" + word);
            m.expect(mine[NEXT_COPY16 + k], first[next * 4 + k], who + "lane + 1's first copy after a barrier" + word);
            m.expect(mine[NEXT_SECOND16 + k], second[next * 4 + k],
                     who + "lane + 1's second copy after a barrier" + word);
        }
        m.expect(mine[OWN_COPY4], first[128 + lane], who + "4-byte copy after wait_group 1");
        m.expect(mine[OWN_ZERO4], 0u, who + "4-byte zero fill after wait_group 1");
    }
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("ex2.approx.ftz: 2^x within 2^-21 relative; -inf -> 0, subnormal inputs -> 1, results below FLT_MIN -> 0") {
    const float ordinary[] = {-125.75f, -100.3f, -20.5f, -3.25f, -1.0f, -0.5f, -1e-3f, 1e-3f,  0.3f,
                              1.0f,     2.5f,    7.77f,  15.0f,  31.9f, 64.125f, 100.01f, 126.99f, 127.5f};
    const std::vector<float> x(std::begin(ordinary), std::end(ordinary));
    const std::vector<float> y = run_exp2(x);
    for (size_t i = 0; i < x.size(); i++) {
        const double exact = std::exp2((double)x[i]);
        INFO("2^" << x[i] << " = " << y[i] << ", exactly " << exact);
        CHECK(std::abs(y[i] - exact) / exact < std::ldexp(1.0, -21));
    }

    const float inf = std::numeric_limits<float>::infinity();
    const float tiny = std::numeric_limits<float>::denorm_min();
    struct Special {
        float x, y;
    };
    const Special special[] = {
        {-inf, 0.0f},       {0.0f, 1.0f},       {-0.0f, 1.0f},       {tiny, 1.0f},    {-tiny, 1.0f},
        {1e-40f, 1.0f},     {-1e-40f, 1.0f},    {FLT_MIN * 0.5f, 1.0f},                   // subnormal inputs
        {-126.5f, 0.0f},    {-127.0f, 0.0f},    {-130.0f, 0.0f},     {-149.0f, 0.0f}, {-150.0f, 0.0f},
        {-1000.0f, 0.0f},   {inf, inf},         {128.0f, inf},       {1000.0f, inf},
    };
    std::vector<float> sx;
    for (const Special& s : special) sx.push_back(s.x);
    const std::vector<float> sy = run_exp2(sx);
    for (size_t i = 0; i < sx.size(); i++) {
        INFO("2^" << sx[i] << " = " << sy[i] << ", expected " << special[i].y);
        CHECK(sy[i] == special[i].y);
        CHECK(!std::signbit(sy[i]));
    }
    const std::vector<float> nan = run_exp2({std::numeric_limits<float>::quiet_NaN()});
    CHECK(std::isnan(nan[0]));
}

TEST_CASE("__shfl_sync, _up, _down and _xor with widths 8, 16 and 32 follow the programming guide") {
    const ShuffleCase cases[] = {
        {Shuffle::Index, 8, 3},  {Shuffle::Index, 8, 13},  {Shuffle::IndexPerLane, 8, 1},  {Shuffle::Up, 8, 1},
        {Shuffle::Up, 8, 3},     {Shuffle::Down, 8, 2},    {Shuffle::Down, 8, 7},          {Shuffle::Xor, 8, 1},
        {Shuffle::Xor, 8, 5},    {Shuffle::Xor, 8, 9},     {Shuffle::Xor, 8, 16},          {Shuffle::Xor, 8, 24},
        {Shuffle::Index, 16, 13}, {Shuffle::Index, 16, 21}, {Shuffle::IndexPerLane, 16, 3}, {Shuffle::Up, 16, 5},
        {Shuffle::Down, 16, 5},  {Shuffle::Down, 16, 15},  {Shuffle::Xor, 16, 3},          {Shuffle::Xor, 16, 17},
        {Shuffle::Xor, 16, 16},  {Shuffle::Index, 32, 31}, {Shuffle::IndexPerLane, 32, 2}, {Shuffle::Up, 32, 1},
        {Shuffle::Down, 32, 1},  {Shuffle::Xor, 32, 31},
    };
    const char* names[] = {"__shfl_sync", "__shfl_sync (srcLane per lane)", "__shfl_up_sync", "__shfl_down_sync",
                           "__shfl_xor_sync"};
    DeviceArray<int> d_out(32);
    for (const ShuffleCase& c : cases) {
        LLMC_LAUNCH(shuffle_kernel, 1, 32, 0, 0)(d_out.get(), c.kind, c.width, c.arg);
        finish_launch();
        const std::vector<int> out = d_out.download();
        Mismatches m;
        for (int lane = 0; lane < 32; lane++)
            m.expect(out[lane], 100 + shuffle_source(c, lane), "lane " + std::to_string(lane));
        INFO(names[(int)c.kind] << ", width " << c.width << ", argument " << c.arg);
        CHECK_NO_MISMATCHES(m);
    }

    DeviceArray<double> d_double(32);
    LLMC_LAUNCH(shuffle_double_kernel, 1, 32, 0, 0)(d_double.get());
    finish_launch();
    const std::vector<double> got = d_double.download();
    for (int lane = 0; lane < 32; lane++) CHECK(got[lane] == 1e12 * (lane ^ 5) + 0.5);
}

TEST_CASE("__ballot_sync, __any_sync and __all_sync, a partial mask included") {
    DeviceArray<unsigned> d_out(4 * 32);
    LLMC_LAUNCH(vote_kernel, 1, 32, 0, 0)(d_out.get());
    finish_launch();
    const std::vector<unsigned> out = d_out.download();
    for (int lane = 0; lane < 32; lane++) {
        INFO("lane " << lane);
        CHECK(out[lane] == 0x49249249u);  // lanes 0, 3, 6, ..., 30
        CHECK(out[32 + lane] == (lane < 16 ? 0x0000aaaau : 0u));  // odd lanes of 0-15
        CHECK(out[64 + lane] != 0);
        CHECK(out[96 + lane] == 0);
    }
}

TEST_CASE("__syncthreads_count, _and and _or give every thread of a 1024-thread block the block's answer") {
    DeviceArray<int> d_out(4 * 1024);
    LLMC_LAUNCH(block_vote_kernel, 1, 1024, 0, 0)(d_out.get());
    finish_launch();
    const std::vector<int> out = d_out.download();
    Mismatches m;
    for (int t = 0; t < 1024; t++) {
        const std::string who = "thread " + std::to_string(t);
        m.expect(out[4 * t + 0], 205, who + " count of t % 5 == 0");  // 0, 5, ..., 1020
        m.expect(out[4 * t + 1], 1, who + " and of true");
        m.expect(out[4 * t + 2], 0, who + " and of t != 3");
        m.expect(out[4 * t + 3], 1, who + " or of t == 1022");
    }
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("warp_reduce_sum and warp_reduce_max give every lane the warp's sum and maximum") {
    DeviceArray<float> d_out(64);
    LLMC_LAUNCH(warp_reduce_kernel, 1, 32, 0, 0)(d_out.get());
    finish_launch();
    const std::vector<float> out = d_out.download();
    for (int lane = 0; lane < 32; lane++) {
        INFO("lane " << lane);
        CHECK(out[lane] == 528.0f);     // 1 + 2 + ... + 32
        CHECK(out[32 + lane] == 24.0f);  // 31 - 7
    }
}

TEST_CASE("block_reduce_sum and block_reduce_max give every thread the block's result, twice in a row") {
    for (int threads : {1024, 96}) {
        DeviceArray<float> d_out(2 * (size_t)threads);
        LLMC_LAUNCH(block_reduce_kernel, 1, threads, 0, 0)(d_out.get());
        finish_launch();
        const std::vector<float> out = d_out.download();
        double sum = 0;
        for (int t = 0; t < threads; t++) sum += t % 13 - 6;
        Mismatches m;
        for (int t = 0; t < threads; t++) {
            m.expect((double)out[2 * t], sum, "sum, thread " + std::to_string(t));
            m.expect((double)out[2 * t + 1], (double)(threads - 1), "max, thread " + std::to_string(t));
        }
        INFO(threads << " threads");
        CHECK_NO_MISMATCHES(m);
    }
}

TEST_CASE("wgmma m64n64k16 from shared memory: A and B K-major and MN-major, every swizzle mode of each") {
    int index = 0;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (int sa : SWIZZLES)
                for (int sb : SWIZZLES) {
                    const bool k_outer = index++ % 2 == 0;
                    check_wgmma_ss<64>(one_group({ta, sa, k_outer}, {tb, sb, !k_outer}, 1, true, index));
                }
}

TEST_CASE("wgmma m64n128k16 and m64n256k16 from shared memory: every accumulator register of every thread") {
    check_wgmma_ss<128>(one_group({false, 128, true}, {true, 64, false}));
    check_wgmma_ss<128>(one_group({true, 0, false}, {false, 32, true}, 1, true, 2));
    check_wgmma_ss<256>(one_group({false, 64, false}, {true, 128, true}, 1, true, 3));
    check_wgmma_ss<256>(one_group({true, 32, true}, {false, 0, false}, 1, true, 4));
}

TEST_CASE("wgmma with A in registers (Figure 148's fragment): B K-major and N-major in every swizzle mode") {
    int index = 0;
    for (bool tb : {false, true})
        for (int sb : SWIZZLES) {
            index++;
            check_wgmma_rs<64>(one_group({false, 0, false}, {tb, sb, index % 2 == 0}, 1, true, index));
        }
    check_wgmma_rs<128>(one_group({false, 0, false}, {false, 0, true}, 1, true, 9));
    check_wgmma_rs<256>(one_group({false, 0, false}, {true, 128, false}, 1, true, 10));
}

TEST_CASE("wgmma with scale-d false: D = A B, the accumulators (NaN) not read") {
    check_wgmma_ss<64>(one_group({false, 128, true}, {true, 32, false}, 1, false));
    check_wgmma_ss<64>(one_group({true, 0, false}, {false, 64, true}, 2, false, 2));
    check_wgmma_rs<64>(one_group({false, 0, false}, {false, 128, false}, 1, false, 3));
}

TEST_CASE("wgmma along K: products accumulate, each start moved within the swizzled rows or by LBO or SBO") {
    check_wgmma_ss<128>(one_group({false, 128, true}, {false, 128, false}, 4));  // start + 32, 64, 96 bytes
    check_wgmma_ss<64>(one_group({false, 64, false}, {false, 64, true}, 2, true, 2));
    check_wgmma_ss<64>(one_group({true, 128, true}, {true, 128, false}, 2, true, 3));  // + 2 SBO
    check_wgmma_ss<64>(one_group({false, 0, true}, {false, 0, false}, 3, true, 4));    // + 2 LBO
    check_wgmma_ss<64>(one_group({true, 0, false}, {true, 0, true}, 3, true, 5));
    check_wgmma_ss<256>(one_group({false, 128, false}, {true, 32, true}, 4, true, 6));
    check_wgmma_rs<64>(one_group({false, 0, false}, {false, 128, true}, 4, true, 7));
    check_wgmma_rs<128>(one_group({false, 0, false}, {true, 64, false}, 2, true, 8));
}

TEST_CASE("wgmma by two warpgroups: each warp's rows are 16 (warp % 4) onwards of its own warpgroup's product") {
    WgmmaSpec ss;
    ss.groups = {{{false, 128, true}, {true, 64, false}}, {{false, 64, false}, {true, 0, true}}};
    ss.steps = 2;
    check_wgmma_ss<64>(ss);
    WgmmaSpec rs;
    rs.groups = {{{false, 0, false}, {false, 64, true}}, {{false, 0, false}, {false, 0, false}}};
    rs.seed = 5;
    check_wgmma_rs<128>(rs);
}

TEST_CASE("wgmma.wait_group 1 completes the older of two commit groups, wait_group 0 the newer") {
    const WgmmaSpec spec = one_group({false, 128, true}, {true, 128, false});
    const WgmmaSetup s = setup_wgmma<64>(spec, false);
    DeviceArray<uint16_t> d_image(s.image);
    DeviceArray<float> d_c(s.c_in), d_out(128 * 64);
    const size_t shared = s.image.size() * 2 + 1024;
    LLMC_LAUNCH((wgmma_two_groups_kernel<false, true>), 1, 128, shared, 0)(d_out.get(), d_image.get(), d_c.get(),
                                                                          s.args);
    finish_launch();
    const std::vector<float> out = d_out.download();
    Mismatches first, second;
    check_wgmma_out<64>(spec, s, out, 0, 64, false, first);
    check_wgmma_out<64>(spec, s, out, 32, 64, true, second);
    INFO("the first group, read after wait_group 1");
    CHECK_NO_MISMATCHES(first);
    INFO("the second group, read after wait_group 0");
    CHECK_NO_MISMATCHES(second);
}

TEST_CASE("TMA copies a 2D box into shared memory row after row, unswizzled or in each swizzle mode") {
    const TmaTensor t(40, 72, 80, 1);
    check_tma_box(t, 16, 24, 8, 3, 0);
    check_tma_box(t, 5, 72, 0, 35, 0);
    check_tma_box(t, 16, 64, 8, 3, 128);  // two 1024-byte patterns
    check_tma_box(t, 8, 64, 0, 0, 128);
    check_tma_box(t, 16, 32, 40, 7, 64);
    check_tma_box(t, 24, 16, 16, 1, 32);
}

// Out-of-bound boxes, one case each: a fault is sticky for the process, so the GPU session runs each
// case alone to name its box. Rows past the end (the attention kernels' last tiles) are the first
// case. All three passed on an H200 (2026-11-28); a box wholly outside the tensor made it fault
// ("illegal instruction"), which the emulator now does too (not tested here: the fault would end
// the process's later cases on a GPU).
TEST_CASE("TMA writes zeros for the rows past the tensor's end") {
    check_tma_box(TmaTensor(40, 72, 80, 2), 16, 64, 0, 40 - 5, 128);
}
TEST_CASE("TMA writes zeros for the columns and rows past the tensor's end") {
    const TmaTensor t(40, 72, 80, 2);
    check_tma_box(t, 16, 32, 72 - 8, 40 - 5, 0);
    check_tma_box(t, 16, 64, 72 - 24, 40 - 3, 128);
}
TEST_CASE("TMA writes zeros for the elements before the tensor's start (negative coordinates)") {
    const TmaTensor t(40, 72, 80, 2);
    check_tma_box(t, 8, 32, -8, -2, 0);
    check_tma_box(t, 8, 64, -16, 36, 128);
}


TEST_CASE("an mbarrier reused over four phases: parity 0, 1, 0, 1, arrivals from every warp and a copy each") {
    constexpr int PHASES = 4, BOX_ROWS = 8, BOX_COLS = 64, BOX = BOX_ROWS * BOX_COLS;
    const TmaTensor t(PHASES * BOX_ROWS, 64, 64, 3);
    DeviceArray<uint16_t> d_tensor(t.host);
    const CUtensorMap map = tma_map(t, d_tensor, BOX_ROWS, BOX_COLS, 0);
    DeviceArray<uint16_t> d_out((size_t)PHASES * BOX);
    DeviceArray<int> d_done(std::vector<int>(PHASES, -1));
    LLMC_LAUNCH(tma_phases_kernel, 1, 128, BOX * 2 + 1024, 0)(d_out.get(), d_done.get(), map, PHASES, BOX_ROWS, BOX);
    finish_launch();
    const std::vector<uint16_t> out = d_out.download();
    const std::vector<int> done = d_done.download();
    Mismatches m;
    for (int p = 0; p < PHASES; p++) {
        m.expect(done[p], 1, "phase " + std::to_string(p) + ": try_wait.parity of the preceding phase");
        for (int r = 0; r < BOX_ROWS; r++)
            for (int c = 0; c < BOX_COLS; c++)
                m.expect((int)out[(size_t)p * BOX + r * BOX_COLS + c], (int)t.at(p * BOX_ROWS + r, c),
                         "phase " + std::to_string(p) + " element (" + std::to_string(r) + ", " +
                             std::to_string(c) + ")");
    }
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("one arrive.expect_tx of two boxes' bytes: the phase completes when both copies have landed") {
    const TmaTensor ta(64, 64, 64, 4), tb(20, 48, 56, 5);
    DeviceArray<uint16_t> da(ta.host), db(tb.host);
    const CUtensorMap map_a = tma_map(ta, da, 64, 64, 128), map_b = tma_map(tb, db, 16, 16, 32);
    const int bytes_a = 64 * 64 * 2, bytes_b = 16 * 16 * 2;
    DeviceArray<uint16_t> d_out((size_t)(bytes_a + bytes_b) / 2);
    LLMC_LAUNCH(tma_two_copies_kernel, 1, 64, 2 * 1024 + bytes_a + bytes_b, 0)(d_out.get(), map_a, map_b, bytes_a,
                                                                               bytes_b);
    finish_launch();
    const std::vector<uint16_t> out = d_out.download();
    Mismatches m;
    check_box_image(ta, out, 0, 64, 64, 0, 0, 128, m);
    check_box_image(tb, out, (size_t)bytes_a / 2, 16, 16, 8, 2, 32, m);
    CHECK_NO_MISMATCHES(m);
}

TEST_CASE("wgmma reads a TMA-loaded 128-byte-swizzled K-major tile through a 128-byte-swizzle descriptor") {
    // A[m][k] and B[n][k], small integers (exact in bf16 and in every sum).
    std::vector<uint16_t> a(64 * 64), b(64 * 64);
    for (int i = 0; i < 64; i++)
        for (int k = 0; k < 64; k++) {
            a[i * 64 + k] = bf16_bits(wgmma_value(7, 0, i, k));
            b[i * 64 + k] = bf16_bits(wgmma_value(7, 1, i, k));
        }
    DeviceArray<uint16_t> da(a), db(b);
    DeviceArray<float> d_out(128 * 32);
    const llmc::tma::Swizzle sw = llmc::tma::Swizzle::Bytes128;
    const CUtensorMap map_a = llmc::tma::make_tensor_map_2d(da.get(), 64, 64, 128, 64, 64, sw);
    const CUtensorMap map_b = llmc::tma::make_tensor_map_2d(db.get(), 64, 64, 128, 64, 64, sw);
    LLMC_LAUNCH(tma_wgmma_kernel, 1, 128, 2 * 64 * 64 * 2 + 1024, 0)(d_out.get(), map_a, map_b);
    finish_launch();
    const std::vector<float> out = d_out.download();
    Mismatches m;
    for (int t = 0; t < 128; t++)
        for (int i = 0; i < 32; i++) {
            const RowCol e = RowColOf::d(t, i);
            double want = 0;
            for (int k = 0; k < 64; k++) want += (double)wgmma_value(7, 0, e.row, k) * wgmma_value(7, 1, e.col, k);
            m.expect((double)out[(size_t)t * 32 + i], want,
                     "thread " + std::to_string(t) + " d" + std::to_string(i) + " (row " + std::to_string(e.row) +
                         ", column " + std::to_string(e.col) + ")");
        }
    CHECK_NO_MISMATCHES(m);
}

int main(int argc, char** argv) {
    std::string why;
    if (!cuda_device_present(&why)) return no_gpu_exit_status("test_ptx", why);
    return run_catch_session(argc, argv);
}
