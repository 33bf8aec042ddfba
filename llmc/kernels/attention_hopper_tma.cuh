// attention_hopper_tma.cuh: attention_hopper.cuh's kernels with their loads taken off the threads
// that compute (FlashAttention-3's warp specialization): the forward here, the backward below. A
// forward block is three warpgroups: one producer, whose single elected thread copies Q once and
// each tile of K and V with TMA (cp.async.bulk.tensor, the 128-byte swizzle made by the copy engine,
// not by the threads) into a ring of shared-memory stages, and two consumers of 64 query rows each,
// which run the same products and the same online softmax as attention_hopper.cuh's forward
// (softmax_tile, finish_rows). Nothing but mbarriers orders them:
//   full[s]  (K and V apart, so S = Q K^T starts while V still lands): the producer arms it with the
//            tile's bytes (arrive.expect_tx); the copy completes it; a consumer waits on it
//   empty[s] every consumer thread arrives once its products on stage s have retired (wgmma's wait);
//            the producer waits on it before refilling the stage
// Each stage's barriers go through one phase per use, so a wait names the parity (use / STAGES) & 1.
// The producer gives its registers to the consumers (setmaxnreg), who hold S (64 fp32 a thread for
// 128 keys), O and P.
//
// The copies read Q, K and V as boxes of one head's 64 columns out of the (rows, 3C) matrix of qkv, a
// tensor map over all B sequences' rows (up to the last one's row T - 1). A box of a sequence's last
// tile may so reach rows of the next sequence (or, in a ring pair, the other chunk), not zeros as the
// cp.async kernel's loads give: they are finite, their scores are masked to -inf (keys >= T are past
// every row's diagonal, or past T), so their probabilities are exactly 0 and add exactly nothing;
// queries >= T are computed and not written. Past the matrix's last row the copy engine fills zeros.
//
// Versions 5 (two stages) and 6 (three) of dev/cuda/attention_forward; the model runs version 5
// with set_attention_kernels(Tma), and either where the tuned table picks it under Auto. Not done
// yet: two consumer warpgroups taking turns on the tensor cores (pingpong), and the softmax of one
// tile overlapped with the products of the next.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "llmc/kernels/attention_hopper.cuh"
#include "llmc/kernels/attention_tiles.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/tma.cuh"
#include "llmc/kernels/wgmma.cuh"

namespace llmc::attention_detail {

// STAGES: the ring's depth, 2 or 3 (dev/cuda/attention_forward versions 5 and 6; the tuned table,
// attention_table.h, picks one per card).
template <int STAGES_>
struct TmaForward {
    static_assert(STAGES_ == 2 || STAGES_ == 3, "a ring of 2 or 3 stages");
    static constexpr int KEYS = 128;
    static constexpr int STAGES = STAGES_;
    static constexpr int THREADS = 128 * (1 + HOPPER_WARPGROUPS);  // the producer, then the consumers
    static constexpr int CONSUMER_THREADS = 128 * HOPPER_WARPGROUPS;
    static constexpr uint32_t KV_BYTES = KEYS * HOPPER_ROW_BYTES;
    // Registers a thread after the hand-over (setmaxnreg): 128 x 24 + 256 x 240 <= 65536.
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
    // The barriers: Q's, then full K, full V and empty for each stage.
    static constexpr int BARRIERS = 1 + 3 * STAGES;
    // Up to 1023 bytes to the first 1024-byte boundary, Q, the stages' K and V, the barriers.
    static constexpr size_t SMEM_BYTES = HOPPER_ATOM_BYTES + HOPPER_Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS;
};

// Grid (B*NH, query tiles of 128), TmaForward<STAGES>::THREADS threads. q_map: the query side's qkv
// as a ((B - 1) q_rows + T, (NH + 2 KVH) HS) matrix, boxes of 128 rows x 64 columns; kv_map: the key side's,
// with kv_rows, boxes of KEYS rows; both in the 128-byte swizzle.
template <int STAGES_, bool CAUSAL>
__global__ void __launch_bounds__(TmaForward<STAGES_>::THREADS, 1)
    attention_forward_tma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                                 floatX* out, float* lse, AttentionRows rows, AttentionHeads heads, float scale_log2, float* amax) {
    using Shape = TmaForward<STAGES_>;
    constexpr int HS = HOPPER_HS, BM = HOPPER_BM, BN = Shape::KEYS, STAGES = Shape::STAGES;
    constexpr uint32_t KV_BYTES = Shape::KV_BYTES;
    uint8_t* smem = dynamic_shared_memory<uint8_t>();
    const uint32_t raw = smem_addr(smem);
    const uint32_t q_s = (raw + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
    const uint32_t k_s = q_s + HOPPER_Q_BYTES;      // [STAGES] tiles
    const uint32_t v_s = k_s + STAGES * KV_BYTES;   // [STAGES] tiles
    const uint32_t bar_s = v_s + STAGES * KV_BYTES;
    // The same places as generic pointers (the copies and the barriers take those).
    auto at = [&](uint32_t shared) { return smem + (shared - raw); };
    uint64_t* q_full = reinterpret_cast<uint64_t*>(at(bar_s));
    uint64_t* k_full = q_full + 1;       // [STAGES]
    uint64_t* v_full = k_full + STAGES;  // [STAGES]
    uint64_t* empty = v_full + STAGES;   // [STAGES]

    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest (last) query tiles start first
    const int T = rows.T;
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);

    if (threadIdx.x == 0) {
        tma::mbarrier_init(q_full, 1);
        for (int s = 0; s < STAGES; s++) {
            tma::mbarrier_init(&k_full[s], 1);
            tma::mbarrier_init(&v_full[s], 1);
            tma::mbarrier_init(&empty[s], Shape::CONSUMER_THREADS);
        }
        tma::fence_barrier_init();
    }
    __syncthreads();  // the last block-wide barrier: the producer's threads leave early

    if (threadIdx.x < 128) {
        tma::setmaxnreg_dec<Shape::PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        tma::prefetch_tensor_map(&q_map);
        tma::prefetch_tensor_map(&kv_map);
        tma::mbarrier_arrive_expect_tx(q_full, HOPPER_Q_BYTES);
        tma::copy_2d(at(q_s), &q_map, h * HS, b * rows.q_rows + q0, q_full);
        const int kv_row0 = b * rows.kv_rows;
        for (int tile = 0; tile < num_tiles; tile++) {
            const int s = tile % STAGES;
            // the stage's previous tile (tile - STAGES) retired by every consumer thread
            if (tile >= STAGES) tma::mbarrier_wait(&empty[s], (tile / STAGES - 1) & 1);
            tma::mbarrier_arrive_expect_tx(&k_full[s], KV_BYTES);
            tma::copy_2d(at(k_s + s * KV_BYTES), &kv_map, heads.k_col(h, HS), kv_row0 + tile * BN, &k_full[s]);
            tma::mbarrier_arrive_expect_tx(&v_full[s], KV_BYTES);
            tma::copy_2d(at(v_s + s * KV_BYTES), &kv_map, heads.v_col(h, HS), kv_row0 + tile * BN, &v_full[s]);
        }
        return;
    }

    tma::setmaxnreg_inc<Shape::CONSUMER_REGS>();
    const int warp = threadIdx.x / 32 - 4, lane = threadIdx.x % 32, group = warp / 4;  // consumer warps 0-7
    const int group_first = q0 + 64 * group;  // this warpgroup's rows: group_first .. + 63
    const int row_first = q0 + 16 * warp;     // this warp's rows: row_first .. + 15
    const bool group_active = group_first < T;
    const uint32_t q_group = q_s + 64 * HOPPER_ROW_BYTES * group;
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    tma::mbarrier_wait(q_full, 0);
    for (int tile = 0; tile < num_tiles; tile++) {
        const int s = tile % STAGES;
        const uint32_t parity = (tile / STAGES) & 1;
        const int key0 = tile * BN;
        // A warpgroup-uniform condition: the four warps issue the same products. A warpgroup with
        // nothing to do still waits for the tile before it frees the stage, so that its arrival can
        // never count towards a later use of the stage.
        const bool active = group_active && (!CAUSAL || key0 <= group_first + 63);
        const uint32_t k_tile = k_s + s * KV_BYTES, v_tile = v_s + s * KV_BYTES;
        uint32_t p[BN / 16][4];
        tma::mbarrier_wait(&k_full[s], parity);
        if (active) {
            float s_acc[BN / 8][4];
            wgmma_a_bt<BN>(s_acc, q_group, k_tile);
            softmax_tile<BN, CAUSAL>(p, s_acc, o, row_max, row_sum, key0, row_first, lane, T, scale_log2);
        }
        tma::mbarrier_wait(&v_full[s], parity);
        if (active) wgmma_a_b<BN>(o, p, v_tile);  // its fence orders o's rescaling before the product
        tma::mbarrier_arrive(&empty[s]);  // this thread's products on the stage have retired
    }
    if (row_first < T) finish_rows(out, lse, o, row_max, row_sum, b, h, NH, rows, row_first, lane, amax);
}

template <bool CAUSAL, int STAGES = 2>
inline void attention_forward_tma_launch(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv, int B,
                                         const AttentionRows& rows, const AttentionHeads& heads, cudaStream_t stream,
                                         float* amax) {
    constexpr int HS = HOPPER_HS;
    // The matrices end at the last sequence's row T - 1: a pair's chunk may start inside its buffer,
    // so B * q_rows rows from it could reach past the allocation.
    const uint64_t columns = heads.qkv_width(HS), row_bytes = columns * sizeof(floatX);
    const uint64_t q_matrix_rows = (uint64_t)(B - 1) * rows.q_rows + rows.T;
    const uint64_t kv_matrix_rows = (uint64_t)(B - 1) * rows.kv_rows + rows.T;
    const CUtensorMap q_map = tma::make_tensor_map_2d(q_qkv, q_matrix_rows, columns, row_bytes, HOPPER_BM, HS,
                                                      tma::Swizzle::Bytes128);
    using Shape = TmaForward<STAGES>;
    const CUtensorMap kv_map = tma::make_tensor_map_2d(kv_qkv, kv_matrix_rows, columns, row_bytes, Shape::KEYS, HS,
                                                       tma::Swizzle::Bytes128);
    constexpr size_t smem = Shape::SMEM_BYTES;
    auto kernel = attention_forward_tma_kernel<STAGES, CAUSAL>;
    set_smem_limit(kernel, smem, "attention_forward (wgmma, TMA)", HS);
    const dim3 grid(B * heads.NH, ceil_div(rows.T, HOPPER_BM));
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    LLMC_LAUNCH(kernel, grid, Shape::THREADS, smem, stream)(q_map, kv_map, out, lse, rows, heads, scale_log2, amax);
    CUDA_CHECK_LAUNCH();
}

// ---- backward ----
// attention_hopper.cuh's two backward kernels fed the same way: a producer warpgroup and two
// consumer warpgroups of 64 rows (keys in the dK/dV kernel, queries in the dQ kernel) that run their
// products and arithmetic unchanged; the rows a block owns are copied once, the other side's tiles
// of 64 rows stream through two stages. The dK/dV kernel's stages also hold each query tile's lse
// and D (64 floats each), which the producer's first warp loads with ordinary loads and stores:
// each of its 32 threads arrives on the stage's full barrier after its stores (an arrive releases
// them, a consumer's wait acquires them), one of them announcing the tiles' bytes as it does.
// Version 4 of dev/cuda/attention_backward; set_attention_kernels(Tma) runs it.

struct TmaBackward {
    static constexpr int STAGES = 2;
    static constexpr int THREADS = 128 * (1 + HOPPER_WARPGROUPS);
    static constexpr int CONSUMER_THREADS = 128 * HOPPER_WARPGROUPS;
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
    static constexpr int TILE = HOPPER_BACKWARD_TILE;  // rows of the other side per stage
    // own: the two 128-row tiles a block owns; a stage: two 64-row tiles and 2 x 64 floats; barriers:
    // own, then full and empty per stage
    static constexpr uint32_t OWN_BYTES = 2 * HOPPER_Q_BYTES;
    static constexpr uint32_t STAGE_BYTES = 2 * HOPPER_TILE_BYTES + 2 * TILE * sizeof(float);
    // stages start 1024 bytes apart, so each one's tiles stay on the swizzle's boundary
    static constexpr uint32_t STAGE_STRIDE =
        (STAGE_BYTES + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
    static constexpr int BARRIERS = 1 + 2 * STAGES;
    // Up to 1023 bytes to the first 1024-byte boundary, the own tiles, the stages, the barriers.
    static constexpr size_t SMEM_BYTES = HOPPER_ATOM_BYTES + OWN_BYTES + STAGES * STAGE_STRIDE + 8 * BARRIERS;
};

// The shared-memory plan of a TmaBackward block: the two own tiles, the stages (two tiles each, then
// the floats), the barriers; tiles on 1024-byte boundaries.
struct TmaBackwardSmem {
    uint8_t* smem;
    uint32_t raw, own0, own1, tiles0[TmaBackward::STAGES], tiles1[TmaBackward::STAGES];
    float* floats[TmaBackward::STAGES];
    uint64_t* own_full;
    uint64_t* full;   // [STAGES]
    uint64_t* empty;  // [STAGES]

    __device__ explicit TmaBackwardSmem(uint8_t* base) : smem(base), raw(smem_addr(base)) {
        own0 = (raw + HOPPER_ATOM_BYTES - 1) / HOPPER_ATOM_BYTES * HOPPER_ATOM_BYTES;
        own1 = own0 + HOPPER_Q_BYTES;
        const uint32_t stages = own1 + HOPPER_Q_BYTES;
        for (int s = 0; s < TmaBackward::STAGES; s++) {
            tiles0[s] = stages + s * TmaBackward::STAGE_STRIDE;
            tiles1[s] = tiles0[s] + HOPPER_TILE_BYTES;
            floats[s] = reinterpret_cast<float*>(at(tiles1[s] + HOPPER_TILE_BYTES));
        }
        own_full = reinterpret_cast<uint64_t*>(at(stages + TmaBackward::STAGES * TmaBackward::STAGE_STRIDE));
        full = own_full + 1;
        empty = full + TmaBackward::STAGES;
    }
    __device__ uint8_t* at(uint32_t shared) const { return smem + (shared - raw); }
};
// Sets up the barriers (thread 0) before any thread uses them: own_full and full[] expect `full_arrivals`.
__device__ inline void init_backward_barriers(const TmaBackwardSmem& m, uint32_t full_arrivals) {
    if (threadIdx.x == 0) {
        tma::mbarrier_init(m.own_full, 1);
        for (int s = 0; s < TmaBackward::STAGES; s++) {
            tma::mbarrier_init(&m.full[s], full_arrivals);
            tma::mbarrier_init(&m.empty[s], TmaBackward::CONSUMER_THREADS);
        }
        tma::fence_barrier_init();
    }
    __syncthreads();  // the last block-wide barrier: the producer's threads leave early
}

// dK, dV: grid (B*KVH, key tiles of 128); for each query head of the kv head's group in turn, the
// query tiles from the block's first key (CAUSAL) or 0.
// kv_map: the key side's qkv (128-row boxes); q_map: the query side's (64-row boxes); do_map: dout
// as a (rows, C) matrix (64-row boxes).
template <bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(TmaBackward::THREADS, 1)
    attention_backward_dkv_tma_kernel(const __grid_constant__ CUtensorMap kv_map,
                                      const __grid_constant__ CUtensorMap q_map,
                                      const __grid_constant__ CUtensorMap do_map, GradT* grad_k, size_t grad_ld,
                                      const float* lse, const float* D, AttentionRows rows, AttentionHeads heads, float scale_log2,
                                      float scale, float* amax, const float* rope) {
    constexpr int HS = HOPPER_HS, BN = HOPPER_BM, BQ = TmaBackward::TILE, STAGES = TmaBackward::STAGES;
    const TmaBackwardSmem m(dynamic_shared_memory<uint8_t>());
    // the block's kv head j of sequence b, and the G query heads that read it, in order
    const int NH = heads.NH, KVH = heads.KVH, G = heads.group(), b = blockIdx.x / KVH, j = blockIdx.x % KVH;
    const int kv0 = blockIdx.y * BN;  // the first key tiles, seen by the most queries, start first
    const int T = rows.T;
    const int q_begin = CAUSAL ? kv0 : 0;
    const int num_tiles = ceil_div(T - q_begin, BQ);
    // Step i is query tile i % num_tiles of the group's query head i / num_tiles (attention.cuh's dK/dV).
    const int num_steps = G * num_tiles;
    init_backward_barriers(m, 32);

    if (threadIdx.x < 128) {
        tma::setmaxnreg_dec<TmaBackward::PRODUCER_REGS>();
        if (threadIdx.x >= 32) return;
        const int lane = threadIdx.x;
        if (lane == 0) {
            tma::mbarrier_arrive_expect_tx(m.own_full, TmaBackward::OWN_BYTES);
            tma::copy_2d(m.at(m.own0), &kv_map, (NH + j) * HS, b * rows.kv_rows + kv0, m.own_full);
            tma::copy_2d(m.at(m.own1), &kv_map, (NH + KVH + j) * HS, b * rows.kv_rows + kv0, m.own_full);
        }
        for (int step = 0; step < num_steps; step++) {
            const int s = step % STAGES, q0 = q_begin + step % num_tiles * BQ, h = j * G + step / num_tiles;
            if (step >= STAGES) tma::mbarrier_wait(&m.empty[s], (step / STAGES - 1) & 1);
            // lse and D of the tile's queries (0 past T: finite, and masked out)
            const float* lse_head = lse + ((size_t)b * NH + h) * rows.q_rows;
            const float* d_head = D + ((size_t)b * NH + h) * rows.q_rows;
#pragma unroll
            for (int i = lane; i < BQ; i += 32) {
                const bool valid = q0 + i < T;
                m.floats[s][i] = valid ? lse_head[q0 + i] : 0.0f;
                m.floats[s][BQ + i] = valid ? d_head[q0 + i] : 0.0f;
            }
            if (lane == 0) {
                tma::mbarrier_arrive_expect_tx(&m.full[s], 2 * HOPPER_TILE_BYTES);
                tma::copy_2d(m.at(m.tiles0[s]), &q_map, h * HS, b * rows.q_rows + q0, &m.full[s]);
                tma::copy_2d(m.at(m.tiles1[s]), &do_map, h * HS, b * rows.q_rows + q0, &m.full[s]);
            } else {
                tma::mbarrier_arrive(&m.full[s]);
            }
        }
        return;
    }

    tma::setmaxnreg_inc<TmaBackward::CONSUMER_REGS>();
    const int warp = threadIdx.x / 32 - 4, lane = threadIdx.x % 32, group = warp / 4;
    const int group_first = kv0 + 64 * group;  // this warpgroup's keys
    const int key_first = kv0 + 16 * warp;     // this warp's keys: key_first .. + 15
    const bool group_active = group_first < T;
    const uint32_t k_group = m.own0 + 64 * HOPPER_ROW_BYTES * group, v_group = m.own1 + 64 * HOPPER_ROW_BYTES * group;
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

    tma::mbarrier_wait(m.own_full, 0);
    for (int step = 0; step < num_steps; step++) {
        const int s = step % STAGES, q0 = q_begin + step % num_tiles * BQ;
        tma::mbarrier_wait(&m.full[s], (step / STAGES) & 1);
        // warpgroup-uniform: some query of the tile sees some key of the warpgroup (a warpgroup with
        // nothing to do still waits for the tile, so its arrival never counts towards a later use)
        if (group_active && (!CAUSAL || q0 + BQ - 1 >= group_first)) {
            dkv_tile<BQ, CAUSAL>(dk, dv, k_group, v_group, m.tiles0[s], m.tiles1[s], m.floats[s], m.floats[s] + BQ,
                                 q0, key_first, lane, T, scale_log2);
        }
        tma::mbarrier_arrive(&m.empty[s]);  // this thread's products on the stage have retired
    }
    if (key_first < T) finish_dkv(grad_k, grad_ld, dk, dv, b, j, heads, rows, key_first, lane, scale, amax, rope);
}

// dQ: grid (B*NH, query tiles of 128); the key tiles up to the block's diagonal (CAUSAL) or all.
// q_map: the query side's qkv (128-row boxes); do_map: dout (128-row boxes); kv_map: the key side's
// qkv (64-row boxes).
template <bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(TmaBackward::THREADS, 1)
    attention_backward_dq_tma_kernel(const __grid_constant__ CUtensorMap q_map,
                                     const __grid_constant__ CUtensorMap do_map,
                                     const __grid_constant__ CUtensorMap kv_map, GradT* grad_q, size_t grad_ld,
                                     const float* lse, const float* D, AttentionRows rows, AttentionHeads heads, float scale_log2,
                                     float scale, float* amax, const float* rope) {
    constexpr int HS = HOPPER_HS, BM = HOPPER_BM, BN = TmaBackward::TILE, STAGES = TmaBackward::STAGES;
    const TmaBackwardSmem m(dynamic_shared_memory<uint8_t>());
    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest (last) query tiles start first
    const int T = rows.T;
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);
    init_backward_barriers(m, 1);

    if (threadIdx.x < 128) {
        tma::setmaxnreg_dec<TmaBackward::PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        tma::mbarrier_arrive_expect_tx(m.own_full, TmaBackward::OWN_BYTES);
        tma::copy_2d(m.at(m.own0), &q_map, h * HS, b * rows.q_rows + q0, m.own_full);
        tma::copy_2d(m.at(m.own1), &do_map, h * HS, b * rows.q_rows + q0, m.own_full);
        for (int tile = 0; tile < num_tiles; tile++) {
            const int s = tile % STAGES;
            if (tile >= STAGES) tma::mbarrier_wait(&m.empty[s], (tile / STAGES - 1) & 1);
            tma::mbarrier_arrive_expect_tx(&m.full[s], 2 * HOPPER_TILE_BYTES);
            tma::copy_2d(m.at(m.tiles0[s]), &kv_map, heads.k_col(h, HS), b * rows.kv_rows + tile * BN, &m.full[s]);
            tma::copy_2d(m.at(m.tiles1[s]), &kv_map, heads.v_col(h, HS), b * rows.kv_rows + tile * BN, &m.full[s]);
        }
        return;
    }

    tma::setmaxnreg_inc<TmaBackward::CONSUMER_REGS>();
    const int warp = threadIdx.x / 32 - 4, lane = threadIdx.x % 32, group = warp / 4;
    const int group_first = q0 + 64 * group;
    const int row_first = q0 + 16 * warp;
    const bool group_active = group_first < T;
    float lse2[2], row_d[2];
    backward_row_stats(lse2, row_d, lse, D, bh, rows, row_first, lane);
    const uint32_t q_group = m.own0 + 64 * HOPPER_ROW_BYTES * group, do_group = m.own1 + 64 * HOPPER_ROW_BYTES * group;
    float dq[HS / 8][4] = {};

    tma::mbarrier_wait(m.own_full, 0);
    for (int tile = 0; tile < num_tiles; tile++) {
        const int s = tile % STAGES, key0 = tile * BN;
        tma::mbarrier_wait(&m.full[s], (tile / STAGES) & 1);
        if (group_active && (!CAUSAL || key0 <= group_first + 63))
            dq_tile<BN, CAUSAL>(dq, q_group, do_group, m.tiles0[s], m.tiles1[s], lse2, row_d, key0, row_first, lane,
                                T, scale_log2);
        tma::mbarrier_arrive(&m.empty[s]);
    }
    if (row_first < T) finish_dq(grad_q, grad_ld, dq, b, h, rows, row_first, lane, scale, amax, rope);
}

template <bool CAUSAL, typename GradT>
inline void attention_backward_tma_launch(GradT* grad_q, GradT* grad_k, size_t grad_q_ld, size_t grad_k_ld,
                                          const floatX* dout, const floatX* q_qkv, const floatX* kv_qkv,
                                          const float* lse, const float* D, int B, const AttentionRows& rows,
                                          const AttentionHeads& heads, cudaStream_t stream, float* amax,
                                          const float* rope) {
    constexpr int HS = HOPPER_HS;
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * LOG2E;
    const uint64_t C = (uint64_t)heads.NH * HS, width = heads.qkv_width(HS), qkv_bytes = width * sizeof(floatX);
    // as the forward's maps, ending at the last sequence's row T - 1
    const uint64_t q_rows = (uint64_t)(B - 1) * rows.q_rows + rows.T;
    const uint64_t kv_rows = (uint64_t)(B - 1) * rows.kv_rows + rows.T;
    auto map = [&](const floatX* base, uint64_t n_rows, uint64_t cols, uint64_t row_bytes, uint32_t box_rows) {
        return tma::make_tensor_map_2d(base, n_rows, cols, row_bytes, box_rows, HS, tma::Swizzle::Bytes128);
    };
    constexpr int OWN = HOPPER_BM, TILE = TmaBackward::TILE;
    constexpr size_t smem = TmaBackward::SMEM_BYTES;
    const int tiles = ceil_div(rows.T, HOPPER_BM);
    auto dkv = attention_backward_dkv_tma_kernel<CAUSAL, GradT>;
    set_smem_limit(dkv, smem, "attention_backward (wgmma, TMA)", HS);
    LLMC_LAUNCH(dkv, dim3(B * heads.KVH, tiles), TmaBackward::THREADS, smem, stream)(
        map(kv_qkv, kv_rows, width, qkv_bytes, OWN), map(q_qkv, q_rows, width, qkv_bytes, TILE),
        map(dout, q_rows, C, C * sizeof(floatX), TILE), grad_k, grad_k_ld, lse, D, rows, heads, scale_log2, scale,
        amax, rope);
    CUDA_CHECK_LAUNCH();
    auto dq = attention_backward_dq_tma_kernel<CAUSAL, GradT>;
    set_smem_limit(dq, smem, "attention_backward (wgmma, TMA)", HS);
    LLMC_LAUNCH(dq, dim3(B * heads.NH, tiles), TmaBackward::THREADS, smem, stream)(
        map(q_qkv, q_rows, width, qkv_bytes, OWN), map(dout, q_rows, C, C * sizeof(floatX), OWN),
        map(kv_qkv, kv_rows, width, qkv_bytes, TILE), grad_q, grad_q_ld, lse, D, rows, heads, scale_log2, scale, amax,
        rope);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc::attention_detail
