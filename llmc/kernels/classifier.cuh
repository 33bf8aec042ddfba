// classifier.cuh: the fused classifier, softmax cross-entropy over the vocabulary and its gradient
// in one kernel, written over the logits in place.
//
// The idea: one block owns one row and reads it twice. The first read keeps a running (max, sum of
// exp(x - max)) per thread, an online softmax, so the row's normaliser needs a single pass; the
// second read turns each logit into (softmax - onehot(target)) * dloss while the row is still in L2.
// The full B x T x V probabilities therefore never exist, and the model can run it on row chunks.
#pragma once

#include <cmath>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int CLASSIFIER_BLOCK_SIZE = 1024;


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
    float thread_max = -INFINITY, thread_sum = 0.0f;  // thread_sum is relative to thread_max
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
        const x128 packed = load128(x + (size_t)i * x128::size);
        float chunk_max = -INFINITY;
#pragma unroll
        for (int k = 0; k < x128::size; k++)
            if (i * x128::size + k < V) chunk_max = fmaxf(chunk_max, (float)packed[k]);
        // Rescale once per vector, not once per element; a vector of padding never gets here.
        if (chunk_max > thread_max) {
            thread_sum *= expf(thread_max - chunk_max);
            thread_max = chunk_max;
        }
#pragma unroll
        for (int k = 0; k < x128::size; k++)
            if (i * x128::size + k < V) thread_sum += expf((float)packed[k] - thread_max);
    }
    const float row_max = block_reduce_max(thread_max, shared);
    // A thread that saw no column (V < 8 * blockDim.x) has thread_sum 0 and expf(-inf) = 0.
    const float row_sum = block_reduce_sum(thread_sum * expf(thread_max - row_max), shared);
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
    fused_classifier_kernel<<<rows, CLASSIFIER_BLOCK_SIZE, 0, stream>>>(logits, row_loss, targets, dloss, V, Vp,
                                                                        write_dlogits);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
