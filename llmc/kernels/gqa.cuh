// kernels/gqa.cuh: grouped-query attention on the multi-head attention kernels (attention.cuh and
// the Hopper ones), by copying: each key/value head serves G = NH / KVH consecutive query heads
// (Hugging Face's repeat_kv), so before attention a compact qkv row [q: NH*HS | k: KVH*HS | v:
// KVH*HS] is expanded to the [q | k | v] rows of NH heads each that the kernels read (kv head j
// repeated for query heads j*G .. j*G+G-1), and after attention's backward the expanded gradient is
// reduced back: dq copied, each kv head's dk and dv the sum of its G query heads' in head order, in
// fp32, rounded once (cpu/llama_ops.h sums in the same order).
//
// This costs a copy of k and v at G times their size and the same back; a kernel that reads the kv
// head of each query head directly (and sums dk, dv over the group in its own tile loop) saves both,
// and is the next step for the Hopper kernels. With KVH == NH there is nothing to do: the compact
// row is already the kernels' layout, and the model passes qkv to them as it is.
#pragma once

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

inline void gqa_check_shape(int NH, int KVH, int HS, const char* what) {
    if (NH <= 0 || KVH <= 0 || NH % KVH != 0)
        fail(strformat("%s: the kv heads (%d) must divide the heads (%d)", what, KVH, NH));
    if (HS % x128::size != 0)
        fail(strformat("%s: the head size (%d) must be a multiple of %d (16-byte vectors)", what, HS, x128::size));
}

// One thread per 16-byte vector of an expanded row (3 NH HS wide).
__global__ void gqa_expand_kernel(floatX* full, const floatX* qkv, size_t rows, int NH, int KVH, int HS) {
    const size_t heads_width = (size_t)NH * HS, width = 3 * heads_width, compact = (size_t)(NH + 2 * KVH) * HS;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= rows * width) return;
    const size_t row = i / width, col = i % width;
    const size_t part = col / heads_width, within = col % heads_width;  // 0 q, 1 k, 2 v
    const size_t head = within / HS, d = within % HS;
    const size_t from = part == 0 ? col : heads_width + (part - 1) * KVH * HS + head / (NH / KVH) * HS + d;
    store128(full + i, load128(qkv + row * compact + from));
}

// One thread per 16-byte vector of a compact row.
__global__ void gqa_reduce_kernel(floatX* dqkv, const floatX* dfull, size_t rows, int NH, int KVH, int HS) {
    const size_t heads_width = (size_t)NH * HS, width = 3 * heads_width, compact = (size_t)(NH + 2 * KVH) * HS;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= rows * compact) return;
    const size_t row = i / compact, col = i % compact;
    const floatX* from = dfull + row * width;
    if (col < heads_width) {  // dq: the query heads are not grouped
        store128(dqkv + i, load128(from + col));
        return;
    }
    const size_t kv_width = (size_t)KVH * HS, part = (col - heads_width) / kv_width;  // 0 k, 1 v
    const size_t within = (col - heads_width) % kv_width, kv_head = within / HS, d = within % HS;
    const int G = NH / KVH;
    float sum[x128::size] = {};
    for (int g = 0; g < G; g++) {  // the group's query heads in order: one summation order everywhere
        const x128 x = load128(from + (1 + part) * heads_width + (kv_head * G + g) * HS + d);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum[k] += __bfloat162float(x[k]);
    }
    x128 y;
#pragma unroll
    for (int k = 0; k < x128::size; k++) y[k] = __float2bfloat16_rn(sum[k]);
    store128(dqkv + i, y);
}

// full (rows x 3 NH HS) from qkv (rows x (NH + 2 KVH) HS): q as it is, kv head j for query heads
// j*G .. j*G+G-1.
inline void gqa_expand(floatX* full, const floatX* qkv, size_t rows, int NH, int KVH, int HS, cudaStream_t stream) {
    gqa_check_shape(NH, KVH, HS, "gqa_expand");
    const size_t vectors = rows * 3 * NH * HS / x128::size, threads = 256;
    if (vectors == 0) return;
    LLMC_LAUNCH(gqa_expand_kernel, (unsigned)ceil_div(vectors, threads), (unsigned)threads, 0, stream)(
        full, qkv, rows, NH, KVH, HS);
    CUDA_CHECK_LAUNCH();
}

// dqkv (rows x (NH + 2 KVH) HS, overwritten) from dfull (rows x 3 NH HS): dq copied, each kv head's
// dk and dv summed over its group's query heads in head order.
inline void gqa_reduce(floatX* dqkv, const floatX* dfull, size_t rows, int NH, int KVH, int HS, cudaStream_t stream) {
    gqa_check_shape(NH, KVH, HS, "gqa_reduce");
    const size_t vectors = rows * (NH + 2 * KVH) * HS / x128::size, threads = 256;
    if (vectors == 0) return;
    LLMC_LAUNCH(gqa_reduce_kernel, (unsigned)ceil_div(vectors, threads), (unsigned)threads, 0, stream)(
        dqkv, dfull, rows, NH, KVH, HS);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
