// classifier.cuh: the fused classifier, softmax cross-entropy over the vocabulary and its gradient
// in one kernel, written over the logits in place.
//
// The idea: one block owns one row and reads it twice. The first read keeps a running (max, sum of
// exp(x - max)) per thread, an online softmax, so the row's normaliser needs a single pass; the
// second read turns each logit into (softmax - onehot(target)) * dloss while the row is still in L2.
// The full B x T x V probabilities therefore never exist, and the model can run it on row chunks.
//
// Vocabulary-parallel form (tensor parallelism, Megatron-LM): each rank holds a slice of every row's
// columns and no rank ever sees a whole row. classifier_local_stats reduces the rank's slice of each
// row to three floats (max, sum of exp(x - max), the target's logit where the slice holds it); the
// model all-gathers them over the group; classifier_from_stats combines every rank's three into the
// row's loss and writes the slice's dlogits in place. The same math as cpu::crossentropy_local_stats
// and cpu::crossentropy_from_stats (cpu/ops.h), bf16 logits with fp32 statistics.
#pragma once

#include <cmath>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int CLASSIFIER_BLOCK_SIZE = 1024;

// Threads per row: one per 8-wide vector of the row, in whole warps, at most CLASSIFIER_BLOCK_SIZE
// (GPT-2's 50304 columns take all 1024; a small vocabulary, or slice of one, does not keep threads
// that would find nothing to do). It depends on the row's width alone, so the order of every sum does.
inline int classifier_block_size(int vectors) {
    const int warps = ceil_div(vectors < 1 ? 1 : vectors, WARP_SIZE);
    return warps * WARP_SIZE < CLASSIFIER_BLOCK_SIZE ? warps * WARP_SIZE : CLASSIFIER_BLOCK_SIZE;
}

// The block's online softmax over one row: the max of columns [0, real) of x (vectors 8-wide
// vectors; the columns >= real inside them are masked) and the sum of exp(x - max) over them, both
// returned to every thread. Each thread keeps a running (max, sum relative to it) and rescales once
// per vector, not once per element; a row (or slice) without a real column gives -inf and 0.
__device__ inline void row_softmax_stats(const floatX* x, int vectors, int real, float* shared, float* row_max,
                                         float* row_sum) {
    float thread_max = -INFINITY, thread_sum = 0.0f;  // thread_sum is relative to thread_max
    for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
        const x128 packed = load128(x + (size_t)i * x128::size);
        float chunk_max = -INFINITY;
#pragma unroll
        for (int k = 0; k < x128::size; k++)
            if (i * x128::size + k < real) chunk_max = fmaxf(chunk_max, (float)packed[k]);
        if (chunk_max > thread_max) {
            thread_sum *= expf(thread_max - chunk_max);
            thread_max = chunk_max;
        }
#pragma unroll
        for (int k = 0; k < x128::size; k++)
            if (i * x128::size + k < real) thread_sum += expf((float)packed[k] - thread_max);
    }
    *row_max = block_reduce_max(thread_max, shared);
    // A thread that saw no real column has thread_sum 0, and exp(-inf - -inf) would be NaN: it adds
    // nothing rather than 0 * NaN.
    *row_sum = block_reduce_sum(thread_sum > 0.0f ? thread_sum * expf(thread_max - *row_max) : 0.0f, shared);
}


// One block per row; Vp % 8 == 0, so every row starts 16-byte aligned and splits into whole 8-wide
// vectors, and the columns >= V inside the last vectors are masked rather than handled by a tail.
__global__ void __launch_bounds__(CLASSIFIER_BLOCK_SIZE)
    fused_classifier_kernel(floatX* logits, float* row_loss, const int* targets, float dloss, int V, int Vp,
                            bool write_dlogits) {
    __shared__ float shared[WARP_SIZE];
    const int row = blockIdx.x;
    floatX* x = logits + (size_t)row * Vp;
    const int target = targets[row];
    const bool target_valid = target >= 0 && target < V;
    // Read before any thread overwrites the row; the __syncthreads inside the reductions order it.
    float target_logit = NAN;
    if (threadIdx.x == 0 && target_valid) target_logit = (float)x[target];

    const int num_vecs = Vp / x128::size;
    float row_max, row_sum;
    row_softmax_stats(x, num_vecs, V, shared, &row_max, &row_sum);
    if (threadIdx.x == 0) row_loss[row] = row_max + logf(row_sum) - target_logit;
    if (!write_dlogits) return;

    const float scale = dloss / row_sum;
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
        const x128 packed = load128(x + (size_t)i * x128::size);
        x128 grad;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const int col = i * x128::size + k;
            float g = 0.0f;
            if (col < V) {
                // Rounded like the CPU reference: the product first, then the one-hot subtraction.
                g = __fmul_rn(expf((float)packed[k] - row_max), scale);
                if (col == target) g -= dloss;
            }
            grad[k] = __float2bfloat16_rn(g);
        }
        // Evict-first: the gradient should not push out rows other blocks have yet to read again.
        store128cs(x + (size_t)i * x128::size, grad);
    }
}

// logits: rows x Vp bf16 (columns [V, Vp) are padding). row_loss[r] = -ln softmax(logits[r, :V])[targets[r]];
// with write_dlogits, row r becomes (softmax - onehot(targets[r])) * dloss on [0, V) and 0 on [V, Vp).
// A target outside [0, V) gives the row a NaN loss (loud in the log) instead of an out-of-bounds read.
inline void fused_classifier(floatX* logits, float* row_loss, const int* targets, float dloss, int rows, int V,
                             int Vp, bool write_dlogits, cudaStream_t stream) {
    if (rows < 1) fail(strformat("fused_classifier: rows must be >= 1, got %d", rows));
    if (V < 1 || V > Vp) fail(strformat("fused_classifier: need 1 <= V <= Vp, got V = %d, Vp = %d", V, Vp));
    if (Vp % x128::size != 0)
        fail(strformat("fused_classifier: padded vocab Vp must be a multiple of %d, got %d", x128::size, Vp));
    if ((uintptr_t)logits % 16 != 0) fail("fused_classifier: logits must be 16-byte aligned");
    LLMC_LAUNCH(fused_classifier_kernel, rows, classifier_block_size(Vp / x128::size), 0, stream)(logits, row_loss, targets, dloss, V, Vp,
                                                                        write_dlogits);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel classifier.

// One block per row. The slice has `cols` columns (a multiple of 8), the first `real` of them real
// tokens (real may be <= 0: a slice of padding only, which reports max -inf and sum 0); vocab_begin
// is the slice's first global column.
__global__ void __launch_bounds__(CLASSIFIER_BLOCK_SIZE)
    classifier_local_stats_kernel(float* stats, const floatX* logits, const int* targets, int vocab_begin, int real,
                                  int cols) {
    __shared__ float shared[WARP_SIZE];
    const int row = blockIdx.x;
    const floatX* x = logits + (size_t)row * cols;
    float row_max, row_sum;
    row_softmax_stats(x, cols / x128::size, real, shared, &row_max, &row_sum);
    if (threadIdx.x != 0) return;
    const int t = targets[row] - vocab_begin;
    stats[3 * (size_t)row + 0] = row_max;
    stats[3 * (size_t)row + 1] = row_sum;
    stats[3 * (size_t)row + 2] = t >= 0 && t < real ? (float)x[t] : 0.0f;
}

// One block per row: all_stats holds `ranks` blocks of 3 * rows floats (every rank's stats, rank
// order), the same on every rank, so every rank computes the same loss bits.
__global__ void __launch_bounds__(CLASSIFIER_BLOCK_SIZE)
    classifier_from_stats_kernel(floatX* logits, float* row_loss, const int* targets, const float* all_stats,
                                 int ranks, int rows, float dloss, int V, int vocab_begin, int real, int cols,
                                 bool write_dlogits) {
    const int row = blockIdx.x;
    // Every thread combines the few ranks' stats itself: cheaper than sharing them.
    // The loops stay rolled, and each rank's three stats are loaded before any branch: nvcc 13.0
    // unrolled the plain form 4x with wrong load offsets (st[1] read as st[0], st[2] from the next
    // row), which gave tp 4 and tp 8 an infinite loss on an H200 and an out-of-bounds read under
    // compute-sanitizer, while tp 2 (the loop's remainder path) and the emulator were right.
    float row_max = -INFINITY, target_logit = 0.0f, row_sum = 0.0f;
#pragma unroll 1
    for (int k = 0; k < ranks; k++) row_max = fmaxf(row_max, all_stats[((size_t)k * rows + row) * 3]);
#pragma unroll 1
    for (int k = 0; k < ranks; k++) {
        const float* st = all_stats + ((size_t)k * rows + row) * 3;
        const float st_max = st[0], st_sum = st[1], st_target = st[2];
        if (st_sum > 0.0f) row_sum += st_sum * expf(st_max - row_max);
        target_logit += st_target;
    }
    const int target = targets[row];
    // A target outside [0, V) gives the row a NaN loss (loud in the log), as fused_classifier does.
    if (threadIdx.x == 0) row_loss[row] = target >= 0 && target < V ? row_max + logf(row_sum) - target_logit : NAN;
    if (!write_dlogits) return;

    floatX* x = logits + (size_t)row * cols;
    const int t = target - vocab_begin;
    const float scale = dloss / row_sum;
    const int num_vecs = cols / x128::size;
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
        const x128 packed = load128(x + (size_t)i * x128::size);
        x128 grad;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const int col = i * x128::size + k;
            float g = 0.0f;
            if (col < real) {
                g = __fmul_rn(expf((float)packed[k] - row_max), scale);
                if (col == t) g -= dloss;
            }
            grad[k] = __float2bfloat16_rn(g);
        }
        store128cs(x + (size_t)i * x128::size, grad);
    }
}

inline void check_vocab_slice(const char* who, const floatX* logits, int rows, int vocab_begin, int real, int cols) {
    if (rows < 1) fail(strformat("%s: rows must be >= 1, got %d", who, rows));
    if (cols < x128::size || cols % x128::size != 0)
        fail(strformat("%s: the slice's columns must be a positive multiple of %d, got %d", who, x128::size, cols));
    if (real > cols) fail(strformat("%s: real columns (%d) exceed the slice's %d", who, real, cols));
    if (vocab_begin < 0) fail(strformat("%s: vocab_begin must be >= 0, got %d", who, vocab_begin));
    if ((uintptr_t)logits % 16 != 0) fail(strformat("%s: logits must be 16-byte aligned", who));
}

// stats (rows x 3 fp32): each row's (max, sum of exp(x - max), target logit or 0) over the real
// columns of this rank's slice of the logits (rows x cols bf16, global columns [vocab_begin,
// vocab_begin + cols), the first `real` real tokens).
inline void classifier_local_stats(float* stats, const floatX* logits, const int* targets, int rows, int vocab_begin,
                                   int real, int cols, cudaStream_t stream) {
    check_vocab_slice("classifier_local_stats", logits, rows, vocab_begin, real, cols);
    LLMC_LAUNCH(classifier_local_stats_kernel, rows, classifier_block_size(cols / x128::size), 0, stream)(stats, logits, targets, vocab_begin,
                                                                              real, cols);
    CUDA_CHECK_LAUNCH();
}

// row_loss[r] = M + log S - target logit from every rank's stats (all_stats: `ranks` blocks of rows x 3,
// rank order); with write_dlogits the slice becomes (softmax - onehot) * dloss on its real columns
// and 0 on its padding, in place. V: the real vocabulary (a target outside [0, V) gives a NaN loss).
inline void classifier_from_stats(floatX* logits, float* row_loss, const int* targets, const float* all_stats,
                                  int ranks, float dloss, int rows, int V, int vocab_begin, int real, int cols,
                                  bool write_dlogits, cudaStream_t stream) {
    check_vocab_slice("classifier_from_stats", logits, rows, vocab_begin, real, cols);
    if (ranks < 1) fail(strformat("classifier_from_stats: ranks must be >= 1, got %d", ranks));
    LLMC_LAUNCH(classifier_from_stats_kernel, rows, classifier_block_size(cols / x128::size), 0, stream)(
        logits, row_loss, targets, all_stats, ranks, rows, dloss, V, vocab_begin, real, cols, write_dlogits);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
