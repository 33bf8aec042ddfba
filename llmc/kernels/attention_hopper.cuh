// attention_hopper.cuh: causal self-attention on Hopper's warpgroup products (wgmma, sm_90a), head
// size 64, forward and backward. The same algorithm as attention.cuh's kernels (online softmax over
// tiles of keys, the log-sum-exp saved; a backward of one kernel for dK, dV and one for dQ, without
// atomics; ring pairs through AttentionRows and CAUSAL), with the products issued by a warpgroup
// (128 threads, 64 rows) instead of a warp. The forward:
//   S (64 x BN keys)   = Q K^T   wgmma m64nBNk16, Q and K from shared memory, 4 steps along HS
//   O (64 x 64)       += P V     wgmma m64n64k16, P from registers (S's accumulators rounded to bf16:
//                                 the accumulator layout is the A fragment layout), V from shared
//                                 memory read MN-major, BN / 16 steps along the keys
// (the backward's products below). A block is two warpgroups (128 rows) that share each tile of the
// other side; the next tile is copied in (cp.async, 16 bytes a thread at a time) while this one is
// used. Each warp still owns 16 rows exactly as attention.cuh's warps do, so the softmax, the masks
// and the epilogues are the same code shape.
//
// Shared tiles hold rows of 64 bf16 (128 bytes) in the 128-byte swizzle wgmma reads: the 16-byte
// chunk c of row r lies at chunk c ^ (r % 8) of that row, each group of 8 rows (1024 bytes) one
// swizzle atom, every tile starting on a 1024-byte boundary. Described to wgmma (wgmma.cuh):
//   read K-major (HS contiguous: Q, K, V, dO as the left factor or as B of a product with a
//     transpose): SBO 1024 (the next 8 rows); the k-th 16 columns start 32 k bytes in
//   read MN-major (HS the N dimension: V, dO, Q, K as B of a product without a transpose): SBO 1024
//     (the next 8 rows, which are K); 64 HS columns are one 128-byte row, so LBO (the next 64
//     columns) is never used; the k-th 16 rows start 2048 k bytes in
//
// What is not done yet (FlashAttention-3's other ideas): a producer warp with TMA and mbarriers,
// the softmax of one tile overlapped with the products of the next, FP8. Selected by
// set_attention_kernels (below): until a GPU session has checked it on the card (test_ptx's wgmma
// cases, the attention workbenches' versions 3 and 4), the default stays mma.sync.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "llmc/kernels/attention_tiles.cuh"
#include "llmc/kernels/attention_tuning.h"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/wgmma.cuh"
#include "llmc/utils.h"

namespace llmc {

// The setting of which kernels attention and the ring pairs run (AttentionKernels, attention_tuning.h).
inline AttentionKernels& attention_kernels_setting() {
    static AttentionKernels setting = AttentionKernels::MmaSync;
    return setting;
}
inline void set_attention_kernels(AttentionKernels k) { attention_kernels_setting() = k; }

// Whether the current device runs sm_90a code (compute capability 9.0: H100, H200); asked once (a
// rank uses one device).
inline bool device_has_wgmma() {
    static const bool has = [] {
        int device = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        return major == 9 && minor == 0;
    }();
    return has;
}

namespace attention_detail {

constexpr int HOPPER_HS = 64;
constexpr int HOPPER_ROW_BYTES = HOPPER_HS * 2;      // one swizzle row
constexpr int HOPPER_ATOM_BYTES = 8 * HOPPER_ROW_BYTES;  // 8 rows: the stride between row groups (SBO)
constexpr int HOPPER_WARPGROUPS = 2;
constexpr int HOPPER_BM = 64 * HOPPER_WARPGROUPS;  // query rows per block
constexpr int HOPPER_THREADS = 128 * HOPPER_WARPGROUPS;
constexpr uint32_t HOPPER_Q_BYTES = HOPPER_BM * HOPPER_ROW_BYTES;

// The forward's two shapes: tiles of 128 keys, one block an SM (174 registers a thread, sm_90a's
// ptxas), or of 64 keys, two blocks an SM (at most 128 registers): more warps to hide the softmax
// behind another warpgroup's products, against twice the tiles. The GPU session times both
// (dev/cuda/attention_forward versions 3 and 4); FORWARD_KEYS is the one set_attention_kernels(Wgmma)
// runs, the tuned table (attention_table.h) may pick the other under Auto.
template <int BN>
struct HopperForward {
    static_assert(BN == 64 || BN == 128, "tiles of 64 or 128 keys");
    static constexpr int KEYS = BN;
    static constexpr int BLOCKS_PER_SM = BN == 128 ? 1 : 2;
    static constexpr uint32_t KV_BYTES = BN * HOPPER_ROW_BYTES;
    // Q, two K tiles and two V tiles, and up to 1023 bytes to reach the first 1024-byte boundary.
    static constexpr size_t SMEM_BYTES = HOPPER_Q_BYTES + 4 * KV_BYTES + HOPPER_ATOM_BYTES;
};
constexpr int FORWARD_KEYS = 128;

// Whether attention runs on wgmma (forward and backward): head size 64 and the setting (an explicit
// Wgmma or Tma on a device without it fails rather than running nothing).
inline bool attention_on_wgmma(int HS) {
    const AttentionKernels k = attention_kernels_setting();
    if (HS != HOPPER_HS || k == AttentionKernels::MmaSync) return false;
    const bool has = device_has_wgmma();
    if (k != AttentionKernels::Auto && !has)
        fail(strformat("attention: the wgmma kernels (set_attention_kernels %s) need an sm_90 device (H100, H200)",
                       attention_kernels_name(k)));
    return has;
}

// The forward kernel for head size HS and sequences of T rows, as dev/cuda/attention_forward numbers
// them: 2 mma.sync (attention.cuh), 3 and 4 wgmma with tiles of 128 and 64 keys, 5 and 6 wgmma fed by
// TMA through 2 and 3 stages (attention_hopper_tma.cuh). Wgmma runs FORWARD_KEYS' shape, Tma version
// 5, Auto on sm_90 what the tuned table says for this card and T (version 3 where it has no row).
inline int attention_forward_version(int HS, int T) {
    if (!attention_on_wgmma(HS)) return 2;
    switch (attention_kernels_setting()) {
        case AttentionKernels::Wgmma: return FORWARD_KEYS == 128 ? 3 : 4;
        case AttentionKernels::Tma: return 5;
        default: return tuned_forward_version(device_name(), T, 3);
    }
}

// The byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile.
__device__ inline uint32_t swizzled_chunk(int row, int chunk) {
    return (uint32_t)(row * HOPPER_ROW_BYTES + ((chunk ^ (row % 8)) * 16));
}

// Starts copying rows row0..row0+ROWS-1 of one head's (T, 64) slice (row stride ld elements) into the
// swizzled tile at shared address `tile`; rows at or past T are zero-filled.
template <int ROWS>
__device__ inline void load_rows_swizzled_async(uint32_t tile, const floatX* head, size_t ld, int row0, int T) {
    constexpr int CHUNKS = HOPPER_ROW_BYTES / 16;
    static_assert((ROWS * CHUNKS) % HOPPER_THREADS == 0, "tile copy must divide evenly among the threads");
#pragma unroll
    for (int k = 0; k < ROWS * CHUNKS / HOPPER_THREADS; k++) {
        const int i = k * HOPPER_THREADS + threadIdx.x;
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool valid = row0 + r < T;
        const floatX* src = valid ? head + (size_t)(row0 + r) * ld + c * 8 : head;
        cp_async16(tile + swizzled_chunk(r, c), src, valid);
    }
}

// A K-major operand of 64-element rows (Q, K): its k-th 16 columns.
__device__ inline uint64_t k_major_desc(uint32_t tile, int k) {
    return wgmma::descriptor(tile + 32 * k, 16, HOPPER_ATOM_BYTES, wgmma::Swizzle::Bytes128);
}
// V read MN-major (its 64 columns are N): its k-th 16 rows (keys).
__device__ inline uint64_t mn_major_desc(uint32_t tile, int k) {
    return wgmma::descriptor(tile + 16 * HOPPER_ROW_BYTES * k, 0, HOPPER_ATOM_BYTES, wgmma::Swizzle::Bytes128);
}

// The two kinds of product every kernel here runs, each issued, committed and waited for.
// acc (64 x N) = A (64 x 64, a K-major tile) B^T (B: N rows of 64, a K-major tile): 4 steps along HS.
template <int N>
__device__ inline void wgmma_a_bt(float (&acc)[N / 8][4], uint32_t a_tile, uint32_t b_tile) {
    float (&flat)[N / 2] = reinterpret_cast<float (&)[N / 2]>(acc);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < HOPPER_HS / 16; k++)
        wgmma::mma_ss<N, false, false>(flat, k_major_desc(a_tile, k), k_major_desc(b_tile, k), k > 0);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(flat);
}
// acc (64 x 64) += A (64 x K, register fragments) B (K rows of 64, an MN-major tile): K/16 steps.
template <int K>
__device__ inline void wgmma_a_b(float (&acc)[HOPPER_HS / 8][4], const uint32_t (&a)[K / 16][4], uint32_t b_tile) {
    float (&flat)[HOPPER_HS / 2] = reinterpret_cast<float (&)[HOPPER_HS / 2]>(acc);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < K / 16; k++) wgmma::mma_rs<HOPPER_HS, true>(flat, a[k], mn_major_desc(b_tile, k), true);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(flat);
}

// One tile of the forward's online softmax, for this warp's 16 rows (row_first ..) against keys key0
// .. key0 + BN - 1: the scores s (S's accumulators) masked, the rows' running max and sum updated, o
// rescaled to the new max, and the probabilities rounded into p, the A fragments of P V.
template <int BN, bool CAUSAL>
__device__ __forceinline__ void softmax_tile(uint32_t (&p)[BN / 16][4], float (&s)[BN / 8][4],
                                             float (&o)[HOPPER_HS / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                             int key0, int row_first, int lane, int T, float scale_log2) {
    constexpr int HS = HOPPER_HS;
    // causal: the tile crosses this warp's diagonal; all keys: the tile runs past the last key
    if (CAUSAL ? key0 + BN - 1 > row_first : key0 + BN > T) {
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = key0 + n * 8 + 2 * (lane % 4) + e % 2;
                const int row = row_first + lane / 4 + 8 * (e / 2);
                if (key > (CAUSAL ? row : T - 1)) s[n][e] = -INFINITY;
            }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
        tile_max[0] = fmaxf(tile_max[0], fmaxf(s[n][0], s[n][1]));
        tile_max[1] = fmaxf(tile_max[1], fmaxf(s[n][2], s[n][3]));
    }
    float rescale[2], max_used[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(row_max[r], tile_max[r] * scale_log2);
        // a row with nothing unmasked yet (its keys all later, in this tile) must not compute -inf - -inf
        max_used[r] = new_max == -INFINITY ? 0.0f : new_max;
        rescale[r] = fast_exp2(row_max[r] - max_used[r]);
        row_max[r] = new_max;
        row_sum[r] *= rescale[r];
    }
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] = fast_exp2(fmaf(s[n][e], scale_log2, -max_used[e / 2]));
            row_sum[e / 2] += s[n][e];
        }
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] *= rescale[e / 2];
    acc_to_a<BN>(p, s);
}

// The forward's end for this warp's 16 rows (row_first < T): each row's log-sum-exp into lse, and o
// divided by the row's sum into out (its largest |value| joins *amax where given).
__device__ __forceinline__ void finish_rows(floatX* out, float* lse, float (&o)[HOPPER_HS / 8][4],
                                            const float (&row_max)[2], float (&row_sum)[2], int b, int h, int NH,
                                            const AttentionRows& rows, int row_first, int lane, float* amax) {
    constexpr int HS = HOPPER_HS;
    const int T = rows.T, C = NH * HS;
    float* lse_head = lse + ((size_t)b * NH + h) * rows.q_rows;
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
        inv_sum[r] = 1.0f / row_sum[r];  // >= 1: the row's maximum contributes 2^0
        const int row = row_first + lane / 4 + 8 * r;
        if (lane % 4 == 0 && row < T) lse_head[row] = row_max[r] * LN2 + logf(row_sum[r]);
    }
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] *= inv_sum[e / 2];
    const float largest = write_rows<HS>(out + (size_t)b * rows.q_rows * C + h * HS, C, o, 1.0f, row_first, T, lane);
    if (amax) warp_amax_into(amax, largest);  // FP8's current scaling: the attention projection's input
}

// Grid (B*NH, query tiles of 128); block: 2 warpgroups, 64 query rows each; tiles of BN keys.
template <int BN, bool CAUSAL>
__global__ void __launch_bounds__(HOPPER_THREADS, HopperForward<BN>::BLOCKS_PER_SM)
    attention_forward_wgmma_kernel(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv,
                                   AttentionRows rows, AttentionHeads heads, float scale_log2, float* amax) {
    constexpr int HS = HOPPER_HS, BM = HOPPER_BM;
    constexpr uint32_t KV_BYTES = HopperForward<BN>::KV_BYTES;
    const uint32_t raw = smem_addr(dynamic_shared_memory<uint8_t>());
    const uint32_t q_s = (raw + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
    const uint32_t k_s = q_s + HOPPER_Q_BYTES;  // [2] tiles
    const uint32_t v_s = k_s + 2 * KV_BYTES;    // [2] tiles

    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest (last) query tiles start first
    const int T = rows.T;
    const size_t ld = heads.qkv_width(HS);
    const floatX* q_head = q_qkv + (size_t)b * rows.q_rows * ld + h * HS;
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.k_col(h, HS);
    const floatX* v_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.v_col(h, HS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 4;
    const int group_first = q0 + 64 * group;  // this warpgroup's rows: group_first .. + 63
    const int row_first = q0 + 16 * warp;     // this warp's rows: row_first .. + 15
    const bool group_active = group_first < T;
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);

    load_rows_swizzled_async<BM>(q_s, q_head, ld, q0, T);
    load_rows_swizzled_async<BN>(k_s, k_head, ld, 0, T);
    load_rows_swizzled_async<BN>(v_s, v_head, ld, 0, T);
    cp_async_commit();

    const uint32_t q_group = q_s + 64 * HOPPER_ROW_BYTES * group;
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int tile = 0; tile < num_tiles; tile++) {
        const int buf = tile % 2;
        if (tile + 1 < num_tiles) {
            load_rows_swizzled_async<BN>(k_s + (buf ^ 1) * KV_BYTES, k_head, ld, (tile + 1) * BN, T);
            load_rows_swizzled_async<BN>(v_s + (buf ^ 1) * KV_BYTES, v_head, ld, (tile + 1) * BN, T);
        }
        cp_async_commit();
        cp_async_wait<1>();        // everything but the tile just requested has landed
        wgmma::fence_proxy_async();  // ... and is visible to wgmma's reads of shared memory
        __syncthreads();

        const int key0 = tile * BN;
        // A warpgroup-uniform condition: the four warps issue the same products.
        if (group_active && (!CAUSAL || key0 <= group_first + 63)) {
            const uint32_t k_tile = k_s + buf * KV_BYTES, v_tile = v_s + buf * KV_BYTES;
            float s[BN / 8][4];
            wgmma_a_bt<BN>(s, q_group, k_tile);
            uint32_t p[BN / 16][4];
            softmax_tile<BN, CAUSAL>(p, s, o, row_max, row_sum, key0, row_first, lane, T, scale_log2);
            wgmma_a_b<BN>(o, p, v_tile);  // its fence orders o's rescaling before the product
        }
        __syncthreads();  // the next iteration refills buffer `buf` with tile + 2
    }

    if (row_first < T) finish_rows(out, lse, o, row_max, row_sum, b, h, NH, rows, row_first, lane, amax);
}

template <bool CAUSAL, int BN = FORWARD_KEYS>
inline void attention_forward_wgmma_launch(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv, int B,
                                           const AttentionRows& rows, const AttentionHeads& heads, cudaStream_t stream,
                                           float* amax) {
    constexpr size_t smem = HopperForward<BN>::SMEM_BYTES;
    auto kernel = attention_forward_wgmma_kernel<BN, CAUSAL>;
    set_smem_limit(kernel, smem, "attention_forward (wgmma)", HOPPER_HS);
    const dim3 grid(B * heads.NH, ceil_div(rows.T, HOPPER_BM));
    const float scale_log2 = LOG2E / sqrtf((float)HOPPER_HS);
    LLMC_LAUNCH(kernel, grid, HOPPER_THREADS, smem, stream)(out, lse, q_qkv, kv_qkv, rows, heads, scale_log2, amax);
    CUDA_CHECK_LAUNCH();
}

// ---- backward ----
// The two kernels of attention.cuh's backward, each product on wgmma; a block is two warpgroups of
// 64 rows (keys in the dK/dV kernel, queries in the dQ kernel) sharing tiles of 64 rows of the other
// side. Every product's A operand is a shared tile read K-major or a register fragment, every B a
// shared tile read K-major (for a product with its transpose) or MN-major:
//   dK, dV (a warpgroup owns 64 keys):  S^T = K Q^T, P^T = 2^(S^T scale - lse), dV += P^T dO,
//                                       dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q
//   dQ (a warpgroup owns 64 queries):   S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K
// Gradients are written (GradT floatX) or added (GradT float: the ring pairs' fp32 sums) as there.

constexpr int HOPPER_BACKWARD_TILE = 64;  // rows of the other side per tile
constexpr uint32_t HOPPER_TILE_BYTES = HOPPER_BACKWARD_TILE * HOPPER_ROW_BYTES;
// Two 128-row tiles of the warpgroups' own side, two double-buffered tiles of the other side, two
// double-buffered rows of floats (lse and D, in the dK/dV kernel), and the alignment.
constexpr size_t HOPPER_BACKWARD_SMEM_BYTES =
    2 * HOPPER_Q_BYTES + 4 * HOPPER_TILE_BYTES + 4 * HOPPER_BACKWARD_TILE * sizeof(float) + HOPPER_ATOM_BYTES;

// The backward's tile steps and epilogues, shared by these kernels and attention_hopper_tma.cuh's.

// P^T of this warp's 16 keys (key_first ..) against the query tile q0 .. q0 + BQ - 1, in place of
// S^T's accumulators: 2^(S^T scale - lse) with lse from the tile's floats, masked where a query does
// not see the key (causal) or lies past T.
template <int BQ, bool CAUSAL>
__device__ __forceinline__ void backward_probabilities_t(float (&pt)[BQ / 8][4], const float* lse_tile, int q0,
                                                         int key_first, int lane, int T, bool needs_mask,
                                                         float scale_log2) {
#pragma unroll
    for (int n = 0; n < BQ / 8; n++) {
        const int col = n * 8 + 2 * (lane % 4);
        const float2 lse_pair = *reinterpret_cast<const float2*>(lse_tile + col);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float lse_q = e % 2 ? lse_pair.y : lse_pair.x;
            const float p = fast_exp2(fmaf(pt[n][e], scale_log2, -lse_q * LOG2E));
            const int query = q0 + col + e % 2;
            const int key = key_first + lane / 4 + 8 * (e / 2);
            pt[n][e] = needs_mask && ((CAUSAL && query < key) || query >= T) ? 0.0f : p;
        }
    }
}

// dS^T = P^T (dP^T - D), in place of P^T, D from the tile's floats.
template <int BQ>
__device__ __forceinline__ void backward_ds_t(float (&pt)[BQ / 8][4], const float (&dpt)[BQ / 8][4],
                                              const float* d_tile, int lane) {
#pragma unroll
    for (int n = 0; n < BQ / 8; n++) {
        const float2 d_pair = *reinterpret_cast<const float2*>(d_tile + n * 8 + 2 * (lane % 4));
#pragma unroll
        for (int e = 0; e < 4; e++) pt[n][e] *= dpt[n][e] - (e % 2 ? d_pair.y : d_pair.x);
    }
}

// One query tile of the dK/dV kernel for a warpgroup's 64 keys (k_group, v_group: its rows of K and
// V) against the tile's queries from q0 (q_tile, do_tile: Q and dO; lse_tile, d_tile: their floats):
// S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q.
template <int BQ, bool CAUSAL>
__device__ __forceinline__ void dkv_tile(float (&dk)[HOPPER_HS / 8][4], float (&dv)[HOPPER_HS / 8][4],
                                         uint32_t k_group, uint32_t v_group, uint32_t q_tile, uint32_t do_tile,
                                         const float* lse_tile, const float* d_tile, int q0, int key_first, int lane,
                                         int T, float scale_log2) {
    const bool needs_mask = (CAUSAL && q0 < key_first + 15) || q0 + BQ > T;
    float pt[BQ / 8][4];  // rows: keys, columns: queries
    wgmma_a_bt<BQ>(pt, k_group, q_tile);
    backward_probabilities_t<BQ, CAUSAL>(pt, lse_tile, q0, key_first, lane, T, needs_mask, scale_log2);
    uint32_t p_frag[BQ / 16][4];
    acc_to_a<BQ>(p_frag, pt);
    wgmma_a_b<BQ>(dv, p_frag, do_tile);

    float dpt[BQ / 8][4];
    wgmma_a_bt<BQ>(dpt, v_group, do_tile);
    backward_ds_t<BQ>(pt, dpt, d_tile, lane);
    uint32_t ds_frag[BQ / 16][4];
    acc_to_a<BQ>(ds_frag, pt);
    wgmma_a_b<BQ>(dk, ds_frag, q_tile);
}

// The dK/dV kernel's end for this warp's 16 keys (key_first < T) of kv head j: dK (scaled, rotated
// back where `rope` is given) and dV written or added, at grad_k and grad_k + KVH HS of each key row.
template <typename GradT>
__device__ __forceinline__ void finish_dkv(GradT* grad_k, size_t grad_ld, float (&dk)[HOPPER_HS / 8][4],
                                           float (&dv)[HOPPER_HS / 8][4], int b, int j, const AttentionHeads& heads,
                                           const AttentionRows& rows, int key_first, int lane, float scale,
                                           float* amax, const float* rope) {
    constexpr int HS = HOPPER_HS;
    const int T = rows.T;
    GradT* dk_head = grad_k + (size_t)b * rows.kv_rows * grad_ld + j * HS;
    const float largest = fmaxf(write_rows<HS>(dk_head, grad_ld, dk, scale, key_first, T, lane, rope),
                                write_rows<HS>(dk_head + heads.KVH * HS, grad_ld, dv, 1.0f, key_first, T, lane));
    if constexpr (std::is_same_v<GradT, floatX>)  // bf16 gradients: FP8's current scaling measures them
        if (amax) warp_amax_into(amax, largest);
}

// lse in log2 units and D for this thread's rows lane/4 and lane/4 + 8 of the warp's 16 (row_first
// ..), zero past T (finite).
__device__ __forceinline__ void backward_row_stats(float (&lse2)[2], float (&row_d)[2], const float* lse,
                                                   const float* D, int bh, const AttentionRows& rows, int row_first,
                                                   int lane) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_first + lane / 4 + 8 * r;
        lse2[r] = row < rows.T ? lse[(size_t)bh * rows.q_rows + row] * LOG2E : 0.0f;
        row_d[r] = row < rows.T ? D[(size_t)bh * rows.q_rows + row] : 0.0f;
    }
}

// One key tile of the dQ kernel for a warpgroup's 64 queries (q_group, do_group: its rows of Q and
// dO): S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K.
template <int BN, bool CAUSAL>
__device__ __forceinline__ void dq_tile(float (&dq)[HOPPER_HS / 8][4], uint32_t q_group, uint32_t do_group,
                                        uint32_t k_tile, uint32_t v_tile, const float (&lse2)[2],
                                        const float (&row_d)[2], int key0, int row_first, int lane, int T,
                                        float scale_log2) {
    float s[BN / 8][4];
    wgmma_a_bt<BN>(s, q_group, k_tile);
    const bool needs_mask = CAUSAL ? key0 + BN - 1 > row_first : key0 + BN > T;
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = fast_exp2(fmaf(s[n][e], scale_log2, -lse2[e / 2]));
            const int key = key0 + n * 8 + 2 * (lane % 4) + e % 2;
            const int row = row_first + lane / 4 + 8 * (e / 2);
            s[n][e] = needs_mask && key > (CAUSAL ? row : T - 1) ? 0.0f : p;
        }
    float dp[BN / 8][4];
    wgmma_a_bt<BN>(dp, do_group, v_tile);
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] *= dp[n][e] - row_d[e / 2];
    uint32_t ds_frag[BN / 16][4];
    acc_to_a<BN>(ds_frag, s);
    wgmma_a_b<BN>(dq, ds_frag, k_tile);
}

// The dQ kernel's end for this warp's 16 queries (row_first < T): dQ (scaled, rotated back where
// `rope` is given) written or added.
template <typename GradT>
__device__ __forceinline__ void finish_dq(GradT* grad_q, size_t grad_ld, float (&dq)[HOPPER_HS / 8][4], int b, int h,
                                          const AttentionRows& rows, int row_first, int lane, float scale,
                                          float* amax, const float* rope) {
    const float largest = write_rows<HOPPER_HS>(grad_q + (size_t)b * rows.q_rows * grad_ld + h * HOPPER_HS, grad_ld,
                                                dq, scale, row_first, rows.T, lane, rope);
    if constexpr (std::is_same_v<GradT, floatX>)
        if (amax) warp_amax_into(amax, largest);
}

// dK, dV: grid (B*KVH, key tiles of 128); for each query head of the kv head's group in turn, the
// query tiles from the block's first key (CAUSAL) or 0.
template <bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(HOPPER_THREADS, 1)
    attention_backward_dkv_wgmma_kernel(GradT* grad_k, size_t grad_ld, const floatX* dout, const floatX* q_qkv,
                                        const floatX* kv_qkv, const float* lse, const float* D, AttentionRows rows,
                                        AttentionHeads heads, float scale_log2, float scale, float* amax,
                                        const float* rope) {
    constexpr int HS = HOPPER_HS, BN = HOPPER_BM, BQ = HOPPER_BACKWARD_TILE;
    const uint32_t raw = smem_addr(dynamic_shared_memory<uint8_t>());
    const uint32_t k_s = (raw + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
    const uint32_t v_s = k_s + HOPPER_Q_BYTES;
    const uint32_t q_s = v_s + HOPPER_Q_BYTES;           // [2] tiles
    const uint32_t do_s = q_s + 2 * HOPPER_TILE_BYTES;   // [2] tiles
    // [2][BQ] floats each, after the tiles
    float* lse_s = reinterpret_cast<float*>(dynamic_shared_memory<uint8_t>() + (do_s + 2 * HOPPER_TILE_BYTES - raw));
    float* d_s = lse_s + 2 * BQ;

    // the block's kv head j of sequence b, and the G query heads that read it, in order
    const int NH = heads.NH, G = heads.group(), b = blockIdx.x / heads.KVH, j = blockIdx.x % heads.KVH;
    const int kv0 = blockIdx.y * BN;  // the first key tiles, seen by the most queries, start first
    const int T = rows.T, C = NH * HS;
    const size_t ld = heads.qkv_width(HS);
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + (NH + j) * HS;
    const floatX* v_head = k_head + heads.KVH * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 4;
    const int group_first = kv0 + 64 * group;  // this warpgroup's keys
    const int key_first = kv0 + 16 * warp;     // this warp's keys: key_first .. + 15
    const bool group_active = group_first < T;
    const int q_begin = CAUSAL ? kv0 : 0;
    const int num_tiles = ceil_div(T - q_begin, BQ);
    // Step i is query tile i % num_tiles of the group's query head i / num_tiles (attention.cuh's dK/dV).
    const int num_steps = G * num_tiles;
    auto load_step = [&](int step, int buf) {
        const QueryHead qh(q_qkv, dout, lse, D, b, j * G + step / num_tiles, rows, heads, HS);
        const int q0 = q_begin + step % num_tiles * BQ;
        load_rows_swizzled_async<BQ>(q_s + buf * HOPPER_TILE_BYTES, qh.q, ld, q0, T);
        load_rows_swizzled_async<BQ>(do_s + buf * HOPPER_TILE_BYTES, qh.dout, C, q0, T);
        load_floats_async<BQ, HOPPER_THREADS>(lse_s + buf * BQ, qh.lse, q0, T);
        load_floats_async<BQ, HOPPER_THREADS>(d_s + buf * BQ, qh.D, q0, T);
    };

    load_rows_swizzled_async<BN>(k_s, k_head, ld, kv0, T);
    load_rows_swizzled_async<BN>(v_s, v_head, ld, kv0, T);
    load_step(0, 0);
    cp_async_commit();

    const uint32_t k_group = k_s + 64 * HOPPER_ROW_BYTES * group, v_group = v_s + 64 * HOPPER_ROW_BYTES * group;
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

    for (int step = 0; step < num_steps; step++) {
        const int buf = step % 2;
        const int q0 = q_begin + step % num_tiles * BQ;
        if (step + 1 < num_steps) load_step(step + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        wgmma::fence_proxy_async();
        __syncthreads();

        // warpgroup-uniform: some query of the tile sees some key of the warpgroup
        if (group_active && (!CAUSAL || q0 + BQ - 1 >= group_first)) {
            const uint32_t q_tile = q_s + buf * HOPPER_TILE_BYTES, do_tile = do_s + buf * HOPPER_TILE_BYTES;
            const float* lse_tile = lse_s + buf * BQ;
            const float* d_tile = d_s + buf * BQ;
            dkv_tile<BQ, CAUSAL>(dk, dv, k_group, v_group, q_tile, do_tile, lse_tile, d_tile, q0, key_first, lane, T,
                                 scale_log2);
        }
        __syncthreads();  // the next iteration refills buffer `buf`
    }

    if (key_first < T) finish_dkv(grad_k, grad_ld, dk, dv, b, j, heads, rows, key_first, lane, scale, amax, rope);
}

// dQ: grid (B*NH, query tiles of 128); the key tiles up to the block's diagonal (CAUSAL) or all.
template <bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(HOPPER_THREADS, 1)
    attention_backward_dq_wgmma_kernel(GradT* grad_q, size_t grad_ld, const floatX* dout, const floatX* q_qkv,
                                       const floatX* kv_qkv, const float* lse, const float* D, AttentionRows rows,
                                       AttentionHeads heads, float scale_log2, float scale, float* amax,
                                       const float* rope) {
    constexpr int HS = HOPPER_HS, BM = HOPPER_BM, BN = HOPPER_BACKWARD_TILE;
    const uint32_t raw = smem_addr(dynamic_shared_memory<uint8_t>());
    const uint32_t q_s = (raw + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
    const uint32_t do_s = q_s + HOPPER_Q_BYTES;
    const uint32_t k_s = do_s + HOPPER_Q_BYTES;         // [2] tiles
    const uint32_t v_s = k_s + 2 * HOPPER_TILE_BYTES;   // [2] tiles

    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest (last) query tiles start first
    const int T = rows.T, C = NH * HS;
    const size_t ld = heads.qkv_width(HS);
    const floatX* q_head = q_qkv + (size_t)b * rows.q_rows * ld + h * HS;
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.k_col(h, HS);
    const floatX* v_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.v_col(h, HS);
    const floatX* do_head = dout + (size_t)b * rows.q_rows * C + h * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 4;
    const int group_first = q0 + 64 * group;
    const int row_first = q0 + 16 * warp;
    const bool group_active = group_first < T;
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);

    load_rows_swizzled_async<BM>(q_s, q_head, ld, q0, T);
    load_rows_swizzled_async<BM>(do_s, do_head, C, q0, T);
    load_rows_swizzled_async<BN>(k_s, k_head, ld, 0, T);
    load_rows_swizzled_async<BN>(v_s, v_head, ld, 0, T);
    cp_async_commit();

    float lse2[2], row_d[2];
    backward_row_stats(lse2, row_d, lse, D, bh, rows, row_first, lane);
    const uint32_t q_group = q_s + 64 * HOPPER_ROW_BYTES * group, do_group = do_s + 64 * HOPPER_ROW_BYTES * group;
    float dq[HS / 8][4] = {};

    for (int tile = 0; tile < num_tiles; tile++) {
        const int buf = tile % 2;
        if (tile + 1 < num_tiles) {
            load_rows_swizzled_async<BN>(k_s + (buf ^ 1) * HOPPER_TILE_BYTES, k_head, ld, (tile + 1) * BN, T);
            load_rows_swizzled_async<BN>(v_s + (buf ^ 1) * HOPPER_TILE_BYTES, v_head, ld, (tile + 1) * BN, T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        wgmma::fence_proxy_async();
        __syncthreads();

        const int key0 = tile * BN;
        if (group_active && (!CAUSAL || key0 <= group_first + 63))
            dq_tile<BN, CAUSAL>(dq, q_group, do_group, k_s + buf * HOPPER_TILE_BYTES, v_s + buf * HOPPER_TILE_BYTES,
                                lse2, row_d, key0, row_first, lane, T, scale_log2);
        __syncthreads();  // the next iteration refills buffer `buf`
    }
    if (row_first < T) finish_dq(grad_q, grad_ld, dq, b, h, rows, row_first, lane, scale, amax, rope);
}

template <bool CAUSAL, typename GradT>
inline void attention_backward_wgmma_launch(GradT* grad_q, GradT* grad_k, size_t grad_q_ld, size_t grad_k_ld,
                                            const floatX* dout, const floatX* q_qkv, const floatX* kv_qkv,
                                            const float* lse, const float* D, int B, const AttentionRows& rows,
                                            const AttentionHeads& heads, cudaStream_t stream, float* amax,
                                            const float* rope) {
    const float scale = 1.0f / sqrtf((float)HOPPER_HS), scale_log2 = scale * LOG2E;
    const int tiles = ceil_div(rows.T, HOPPER_BM);
    auto dkv = attention_backward_dkv_wgmma_kernel<CAUSAL, GradT>;
    set_smem_limit(dkv, HOPPER_BACKWARD_SMEM_BYTES, "attention_backward (wgmma)", HOPPER_HS);
    LLMC_LAUNCH(dkv, dim3(B * heads.KVH, tiles), HOPPER_THREADS, HOPPER_BACKWARD_SMEM_BYTES, stream)(
        grad_k, grad_k_ld, dout, q_qkv, kv_qkv, lse, D, rows, heads, scale_log2, scale, amax, rope);
    CUDA_CHECK_LAUNCH();
    auto dq = attention_backward_dq_wgmma_kernel<CAUSAL, GradT>;
    set_smem_limit(dq, HOPPER_BACKWARD_SMEM_BYTES, "attention_backward (wgmma)", HOPPER_HS);
    LLMC_LAUNCH(dq, dim3(B * heads.NH, tiles), HOPPER_THREADS, HOPPER_BACKWARD_SMEM_BYTES, stream)(
        grad_q, grad_q_ld, dout, q_qkv, kv_qkv, lse, D, rows, heads, scale_log2, scale, amax, rope);
    CUDA_CHECK_LAUNCH();
}

}  // namespace attention_detail

}  // namespace llmc
