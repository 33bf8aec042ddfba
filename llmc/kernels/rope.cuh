// rope.cuh: rotary position embeddings (Llama's RoPE), forward and backward, in place on the q and k
// heads of a bf16 qkv buffer. The definition is cpu::rope_forward / _backward (cpu/llama_ops.h):
//
//   rows of [q: NH*HS | k: KVH*HS | v: KVH*HS], B*T of them; v is left alone. In every q and k head,
//   channel pair (i, i + HS/2), i < HS/2, is rotated by angle(t, i) = pos(t) * theta^(-2i/HS):
//     x[i]        = x[i] cos - x[i + HS/2] sin
//     x[i + HS/2] = x[i + HS/2] cos + x[i] sin
//   Hugging Face's "rotate-half" pairing, not Meta's adjacent pairs (2i, 2i+1). The backward rotates
//   the gradient by -angle (a rotation's inverse is its transpose).
//
// Two steps. rope_table writes the cosines and sines of the T positions once (T * HS floats, laid
// out as cpu::rope_table's: row t is [cos(angle(t, i)), i < HS/2 | sin(angle(t, i)), i < HS/2]):
// the angles are computed in double and only their cosines and sines rounded to fp32, as on the
// CPU, so a position of 131072 is as exact as position 1 (in fp32, pos * inv_freq would be off by
// up to 0.008 rad there). The positions are 0..T-1, or the ones given (context parallelism passes
// each rank's global positions); the table depends on nothing else, so a model builds it once and
// every layer's forward and backward read it. rope_forward / rope_backward then rotate: one thread
// per pair of 8-channel vectors (x[i..i+8), x[i+HS/2..i+HS/2+8)) of one head, 16-byte loads and
// stores, fp32 arithmetic, one rounding to bf16 at the store. Each element is read and written by
// one thread, so the rotation is deterministic and needs no synchronisation.
//
// Where it runs in the CUDA model. The backward is fused: the attention backward's kernels rotate
// the dq and dk they hold in registers back before they store them (attention_backward's `rope`,
// attention_tiles.cuh's write_rows), so rope_backward runs only after the context-parallel ring,
// whose pairs sum their gradients in fp32 first. The forward stays this one pass over q and k before
// attention, on purpose: the qkv product is cuBLASLt's, whose epilogues cannot rotate, and rotating
// in attention's loads would redo it in every kernel that reads the rows (the forward's and both
// backward kernels, each K tile once per query tile that reads it, a rotation pass over shared memory
// and a barrier per tile in compute-bound kernels), where this pass reads and writes q and k once
// (d12 as a Llama at B 32, T 1024: 126 MB a layer, about 0.04 ms of an H200's bandwidth).
// These kernels stay the definition both paths are checked against (dev/cuda/llama_layers.cu,
// dev/cuda/attention_backward.cu).
#pragma once

#include <cstddef>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int ROPE_BLOCK_SIZE = 256;

// HS a multiple of 16: each half of a head is whole 8-channel vectors.
inline void rope_check_shape(int B, int T, int NH, int KVH, int HS, const char* what) {
    if (B < 1 || T < 1) fail(strformat("%s: B = %d, T = %d, expected at least 1 each", what, B, T));
    if (NH < 1 || KVH < 1 || NH % KVH != 0)
        fail(strformat("%s: NH = %d query heads, KVH = %d kv heads; expected KVH >= 1 dividing NH", what, NH, KVH));
    if (HS < 16 || HS % 16 != 0) fail(strformat("%s: HS = %d, expected a positive multiple of 16", what, HS));
}

// ---------------------------------------------------------------------------------------------
// The table: one thread per (t, i).

__global__ void rope_table_kernel(float* cos_sin, int T, int HS, float theta, const int* positions) {
    const int half = HS / 2;
    const int index = blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= T * half) return;
    const int t = index / half, i = index % half;
    // cpu::rope_table's expression, term for term, in double
    const double pos = positions ? positions[t] : t;
    const double angle = pos * pow((double)theta, -2.0 * i / HS);
    cos_sin[(size_t)t * HS + i] = (float)cos(angle);
    cos_sin[(size_t)t * HS + half + i] = (float)sin(angle);
}

// cos_sin (T * HS floats) for positions 0..T-1, or positions[0..T) (device memory) where given.
inline void rope_table(float* cos_sin, int T, int HS, float theta, const int* positions, cudaStream_t stream) {
    rope_check_shape(1, T, 1, 1, HS, "rope_table");
    if ((size_t)T * HS > 0x7fffffffULL) fail(strformat("rope_table: T = %d x HS = %d is too large", T, HS));
    const int threads = 256;
    LLMC_LAUNCH(rope_table_kernel, ceil_div(T * (HS / 2), threads), threads, 0, stream)(cos_sin, T, HS, theta,
                                                                                        positions);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The rotation. sign +1: the forward; -1: the backward (the gradient rotated back).

__global__ void __launch_bounds__(ROPE_BLOCK_SIZE)
    rope_rotate_kernel(floatX* qkv, const float* cos_sin, int BT, int T, int NH, int KVH, int HS, float sign) {
    const int half = HS / 2, vectors_per_half = half / x128::size, heads = NH + KVH;  // q and k heads only
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)BT * heads * vectors_per_half) return;
    // consecutive threads take consecutive vectors of a head, then the next head: a warp's accesses
    // are contiguous runs of the row
    const int j = (int)(index % vectors_per_half);
    const size_t head_index = index / vectors_per_half;
    const int h = (int)(head_index % heads);
    const int bt = (int)(head_index / heads);
    const size_t row = (size_t)(NH + 2 * KVH) * HS;
    floatX* x = qkv + bt * row + (size_t)h * HS + j * x128::size;  // q heads, then k heads: h * HS either way
    const float* c = cos_sin + (size_t)(bt % T) * HS + j * x128::size;
    const float* s = c + half;
    const f128 cos_v[2] = {load128(c), load128(c + 4)};
    const f128 sin_v[2] = {load128(s), load128(s + 4)};
    const x128 lo = load128(x), hi = load128(x + half);
    x128 lo_out, hi_out;
#pragma unroll
    for (int k = 0; k < x128::size; k++) {
        const float x0 = __bfloat162float(lo[k]), x1 = __bfloat162float(hi[k]);
        const float ck = cos_v[k / 4][k % 4], sk = sign * sin_v[k / 4][k % 4];
        lo_out[k] = __float2bfloat16_rn(x0 * ck - x1 * sk);
        hi_out[k] = __float2bfloat16_rn(x1 * ck + x0 * sk);
    }
    store128(x, lo_out);
    store128(x + half, hi_out);
}

inline void rope_rotate(floatX* qkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS, float sign,
                        cudaStream_t stream, const char* what) {
    rope_check_shape(B, T, NH, KVH, HS, what);
    const size_t vectors = (size_t)B * T * (NH + KVH) * (HS / 2 / x128::size);
    const size_t blocks = ceil_div(vectors, (size_t)ROPE_BLOCK_SIZE);
    if (blocks > 0x7fffffffULL) fail(strformat("%s: B = %d x T = %d is too large for one launch", what, B, T));
    LLMC_LAUNCH(rope_rotate_kernel, (unsigned)blocks, ROPE_BLOCK_SIZE, 0, stream)(qkv, cos_sin, B * T, T, NH, KVH, HS,
                                                                                  sign);
    CUDA_CHECK_LAUNCH();
}

// qkv (B*T rows of (NH + 2 KVH) * HS) in place: its q and k heads rotated, v untouched. cos_sin:
// rope_table's for these T positions.
inline void rope_forward(floatX* qkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                         cudaStream_t stream) {
    rope_rotate(qkv, cos_sin, B, T, NH, KVH, HS, 1.0f, stream, "rope_forward");
}

// dqkv in place: the gradient of the rotated q and k becomes that of the unrotated ones (v's passes).
inline void rope_backward(floatX* dqkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                          cudaStream_t stream) {
    rope_rotate(dqkv, cos_sin, B, T, NH, KVH, HS, -1.0f, stream, "rope_backward");
}

}  // namespace llmc
