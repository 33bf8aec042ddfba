// moe.cuh: the mixture-of-experts MLP on the GPU (issue 27), forward and backward, computing what
// llmc/cpu/moe.h computes (its header has the math): a linear router, softmax, each token's top K
// experts (ties to the lower index), gates that are the unrenormalized probabilities, capacity drops
// in choice order then token order, Switch Transformer's balance loss and ST-MoE's z-loss.
//
// The one idea: once every expert's tokens sit in one contiguous block of rows (expert-major, in
// token order, as the CPU model numbers them), each expert's MLP is two ordinary products of
// matmul.cuh over its rows, with the bias and GELU in cuBLASLt's epilogue like the dense MLP.
// The kernels around them only move rows:
//   route     one warp per token: its E fp32 scores (dot products with the router's rows), softmax,
//             log-sum-exp and top K
//   assign    one block: capacity (choices taken in choice order, then token order), the
//             expert-major numbering, the balance and z losses; a summary of E + 1 row offsets, the
//             drops, the losses and each expert's share of the choices
//   gather    the tokens' rows into their experts' blocks
//   combine   each token's output: base + the gate-weighted sum of its experts' output rows
// and backward: the gates' gradient with the softmax's (and both auxiliary losses'), the experts'
// products, the experts' input rows added back to their tokens with the router's input gradient,
// and the router's weight gradient.
//
// One product per expert, not a grouped or batched call: a batched call needs the same rows for
// every expert, so it would pad every expert to the busiest one (E times the work when the router
// is lopsided, and dropless routing can be); a grouped call (one launch, a row count per group)
// would fit, but the emulated cuBLASLt (dev/emu/cublaslt.cpp) has none, so nothing here could check
// it: it is the step to take where the E launches per product show in a profile. Per-expert
// products need each expert's row count on the host: the forward copies the E + 1 offsets (and the
// losses, for the log) to pinned memory and waits for the stream, one synchronisation per MoE block
// forward; the backward reuses the forward's offsets and never waits. The router's scores are
// computed here in fp32, not by matmul.cuh: E is small and need not be a multiple of 8 (as
// matmul.cuh's widths must), and fp32 scores make the top-K agree with the fp32 reference except
// at near-ties of the bf16 inputs.
//
// bf16 rows, fp32 accumulation; every sum runs in a fixed order, so the results repeat bit for bit.
#pragma once

#include <algorithm>
#include <vector>

#include "llmc/cpu/moe.h"  // cpu::MoeShape: the shape, and the capacity formula both models use
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/matmul.cuh"

namespace llmc {

// The most assignments (token, expert) a call of `s.rows` tokens keeps: every choice when
// dropless, else at most `capacity` per expert.
inline size_t moe_max_assignments(const cpu::MoeShape& s) {
    return std::min((size_t)s.rows * s.K, (size_t)s.E * s.capacity());
}

// A block's routing and its experts' activations, kept from the forward for the backward (device).
// choice (n, k) is token n's k-th best expert; assignment a (expert-major) is choice choice_of[a].
// x and y are this rank's assignments' rows; the experts run on ex, pre, h, ey: the same rows (ex is
// x, ey is y), or under expert parallelism the rows this rank's experts got from the expert group.
struct MoeBlockBuffers {
    float *probs, *lse;        // rows x E, rows
    int *expert, *slot;        // rows x K: the expert, its assignment (-1: dropped)
    int* choice_of;            // assignments
    int* summary;              // MoeSummary's words (moe_summary_words)
    floatX *x, *y;             // assignments x C: gathered input, the experts' output
    floatX *ex, *pre, *h, *ey; // expert rows x C, x F, x F, x C: input, fc, GELU, output
};
// What the backward passes share across blocks (device); dy and dx are the assignments' rows, edy
// and edx (the same buffers without expert parallelism) the experts', staging a source-major copy.
struct MoeScratchBuffers {
    float* dscores;            // rows x E
    floatX *dy, *dx;           // assignments x C
    floatX *edy, *dh, *edx;    // expert rows x C, x F, x C
    floatX* staging;           // expert rows x C (expert parallelism only)
    float* bias;               // the bias gradients' partial sums (matmul_backward's scratch)
};

// The forward's summary on the host: expert e's rows are [begin[e], begin[e + 1]) of the gathered
// blocks; share[e] is e's fraction of the rows x K choices (before capacity).
struct MoeSummary {
    std::vector<int> begin;
    std::vector<float> share;
    int dropped = 0;
    float balance_loss = 0, z_loss = 0;
    int assignments() const { return begin.back(); }
};
// Its device words: begin (E + 1 ints), dropped, balance, z (as floats), share (E floats).
inline size_t moe_summary_words(int E) { return 2 * (size_t)E + 4; }

// One MoE block's weights (bf16) and gradients (fp32): E of each MLP tensor back to back.
struct MoeWeightsBf16 {
    const floatX *router, *fcw, *fcb, *fcprojw, *fcprojb;
};
struct MoeGradsF32 {
    float *router, *fcw, *fcb, *fcprojw, *fcprojb;
};

// The device memory of `blocks` MoE blocks for calls of up to s.rows tokens, cut from one allocation:
// the blocks' buffers, then the shared scratch. Each piece starts on a 256-byte boundary. Under
// expert parallelism over `ep` ranks this rank's experts may get every rank's assignments (when all
// go to them): ep times the rows, in buffers of their own.
class MoeMemory {
public:
    static size_t bytes_for(const cpu::MoeShape& s, int blocks, int ep = 1) {
        return MoeMemory(s, blocks, nullptr, ep).bytes_;
    }
    MoeMemory() = default;
    MoeMemory(const cpu::MoeShape& s, int blocks, char* base, int ep = 1) : base_(base) {
        const size_t N = s.rows, A = moe_max_assignments(s), R = A * ep, C = s.C, F = s.F, E = s.E, K = s.K;
        for (int b = 0; b < blocks; b++) {
            MoeBlockBuffers m;
            take(m.probs, N * E), take(m.lse, N), take(m.expert, N * K), take(m.slot, N * K);
            take(m.choice_of, A), take(m.summary, moe_summary_words(s.E));
            take(m.x, A * C), take(m.y, A * C), take(m.pre, R * F), take(m.h, R * F);
            m.ex = m.x, m.ey = m.y;
            if (ep > 1) take(m.ex, R * C), take(m.ey, R * C);
            blocks_.push_back(m);
        }
        take(scratch_.dscores, N * E), take(scratch_.dy, A * C), take(scratch_.dx, A * C), take(scratch_.dh, R * F);
        scratch_.edy = scratch_.dy, scratch_.edx = scratch_.dx, scratch_.staging = nullptr;
        if (ep > 1) take(scratch_.edy, R * C), take(scratch_.edx, R * C), take(scratch_.staging, R * C);
        take(scratch_.bias, std::max(matmul_backward_scratch_floats((int)R, (int)F),
                                     matmul_backward_scratch_floats((int)R, (int)C)));
    }
    MoeBlockBuffers& block(int b) { return blocks_.at(b); }
    const MoeScratchBuffers& scratch() const { return scratch_; }
    size_t bytes() const { return bytes_; }

private:
    template <typename T>
    void take(T*& p, size_t count) {
        p = base_ ? reinterpret_cast<T*>(base_ + bytes_) : nullptr;
        bytes_ += (count * sizeof(T) + 255) / 256 * 256;
    }
    char* base_ = nullptr;
    size_t bytes_ = 0;
    std::vector<MoeBlockBuffers> blocks_;
    MoeScratchBuffers scratch_{};
};

// ---------------------------------------------------------------------------------------------
// Routing.

constexpr int MOE_WARPS_PER_BLOCK = 4;  // tokens per block of the one-warp-per-token kernels

// The warp's dot product of two bf16 rows of C (a multiple of 8), in the butterfly's fixed order;
// every lane gets it.
__device__ inline float warp_dot_bf16(const floatX* a, const floatX* b, int C) {
    float sum = 0.0f;
    for (int c = (threadIdx.x % WARP_SIZE) * x128::size; c < C; c += WARP_SIZE * x128::size) {
        const x128 u = load128(a + c), v = load128(b + c);
#pragma unroll
        for (int i = 0; i < x128::size; i++) sum += __bfloat162float(u[i]) * __bfloat162float(v[i]);
    }
    return warp_reduce_sum(sum);
}

// One warp per token: scores into probs, then lane 0 turns them into probabilities and picks the
// top K, each the largest not yet taken (strictly larger: the first of equals wins).
__global__ void moe_route_kernel(float* probs, float* lse, int* expert, const floatX* x, const floatX* router,
                                 int rows, int C, int E, int K) {
    const int n = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    if (n >= rows) return;
    float* p = probs + (size_t)n * E;
    for (int e = 0; e < E; e++) {
        const float score = warp_dot_bf16(x + (size_t)n * C, router + (size_t)e * C, C);
        if (threadIdx.x % WARP_SIZE == 0) p[e] = score;
    }
    if (threadIdx.x % WARP_SIZE != 0) return;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, p[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(p[e] - mx);
    lse[n] = mx + logf(sum);
    for (int e = 0; e < E; e++) p[e] = expf(p[e] - mx) / sum;
    int* chosen = expert + (size_t)n * K;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= chosen[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        chosen[k] = best;
    }
}

constexpr int MOE_ASSIGN_THREADS = 256;  // also the tile of choices staged in shared memory

// One block. Pass 1 walks the choices in choice order (every token's first choice, then every
// second...) and keeps each while its expert has room; pass 2 walks them in token order and
// numbers the kept ones expert-major. Thread t owns experts t, t + 256, ...; shared memory holds
// their counters and a tile of the choices. Then the losses and the summary. (A serial walk over
// the rows x K choices per expert: simple and exact; a block-wide scan would be the faster form.)
__global__ void __launch_bounds__(MOE_ASSIGN_THREADS)
    moe_assign_kernel(int* slot, int* choice_of, int* summary, const int* expert, const float* probs,
                      const float* lse, int rows, int E, int K, int capacity) {
    __shared__ int tile[MOE_ASSIGN_THREADS];
    __shared__ float reduce_scratch[WARP_SIZE];
    int* taken = dynamic_shared_memory<int>();  // E each: kept, chosen, next, and the balance terms
    int *chosen = taken + E, *next = taken + 2 * E;
    float* balance_term = reinterpret_cast<float*>(taken + 3 * E);
    const int t = threadIdx.x, choices = rows * K;
    for (int e = t; e < E; e += blockDim.x) taken[e] = chosen[e] = 0;
    for (int c0 = 0; c0 < choices; c0 += blockDim.x) {  // pass 1: choice order, c = k rows + n
        __syncthreads();
        const int c = c0 + t;
        const int at = c < choices ? (c % rows) * K + c / rows : -1;  // choice (n, k) in memory
        tile[t] = at >= 0 ? expert[at] : -1;
        if (at >= 0) slot[at] = -1;
        __syncthreads();
        for (int e = t; e < E; e += blockDim.x)
            for (int i = 0; i < (int)blockDim.x && c0 + i < choices; i++) {
                if (tile[i] != e) continue;
                chosen[e]++;
                if (taken[e] < capacity) {
                    taken[e]++;
                    const int ci = c0 + i;
                    slot[(ci % rows) * K + ci / rows] = 0;  // kept; numbered in pass 2
                }
            }
    }
    __syncthreads();
    if (t == 0) {
        int total = 0, dropped = 0;
        for (int e = 0; e < E; e++) {
            summary[e] = total;
            next[e] = total;
            total += taken[e];
            dropped += chosen[e] - taken[e];
        }
        summary[E] = total;
        summary[E + 1] = dropped;
    }
    for (int c0 = 0; c0 < choices; c0 += blockDim.x) {  // pass 2: token order, c = n K + k
        __syncthreads();
        const int c = c0 + t;
        tile[t] = c < choices && slot[c] == 0 ? expert[c] : -1;
        __syncthreads();
        for (int e = t; e < E; e += blockDim.x)
            for (int i = 0; i < (int)blockDim.x && c0 + i < choices; i++) {
                if (tile[i] != e) continue;
                slot[c0 + i] = next[e];
                choice_of[next[e]++] = c0 + i;
            }
    }
    // balance = E sum_e share_e mean_prob_e; z = mean lse^2; each sum in a fixed order
    float* share = reinterpret_cast<float*>(summary + E + 4);
    for (int e = t; e < E; e += blockDim.x) {
        float mean = 0.0f;
        for (int n = 0; n < rows; n++) mean += probs[(size_t)n * E + e];
        share[e] = (float)chosen[e] / ((float)rows * K);
        balance_term[e] = share[e] * (mean / rows);
    }
    float z = 0.0f;
    for (int n = t; n < rows; n += blockDim.x) z += lse[n] * lse[n];
    z = block_reduce_sum(z, reduce_scratch);  // synchronises: every balance term is written
    if (t == 0) {
        float balance = 0.0f;
        for (int e = 0; e < E; e++) balance += balance_term[e];
        reinterpret_cast<float*>(summary)[E + 2] = (float)E * balance;
        reinterpret_cast<float*>(summary)[E + 3] = z / rows;
    }
}

// ---------------------------------------------------------------------------------------------
// Moving rows: gather (forward), combine (forward), and their backwards.

// x_e[a] = x[token of assignment a]; one thread per 8 channels.
__global__ void moe_gather_kernel(floatX* gathered, const floatX* x, const int* choice_of, int assignments, int C,
                                  int K) {
    const int chunks = C / x128::size;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)assignments * chunks) return;
    const size_t a = i / chunks, c = (i % chunks) * x128::size;
    store128(gathered + a * C + c, load128(x + (size_t)(choice_of[a] / K) * C + c));
}

// out[n] = base[n] + sum over n's kept choices of gate * y[slot], in fp32, rounded once (out may be
// base). One thread per 8 channels.
__global__ void moe_combine_kernel(floatX* out, const floatX* base, const floatX* y, const float* probs,
                                   const int* expert, const int* slot, int rows, int C, int E, int K) {
    const int chunks = C / x128::size;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * chunks) return;
    const size_t n = i / chunks, c = (i % chunks) * x128::size;
    float acc[x128::size];
    const x128 b = load128(base + n * C + c);
    for (int j = 0; j < x128::size; j++) acc[j] = __bfloat162float(b[j]);
    for (int k = 0; k < K; k++) {
        const int s = slot[n * K + k];
        if (s < 0) continue;
        const float gate = probs[n * E + expert[n * K + k]];
        const x128 v = load128(y + (size_t)s * C + c);
        for (int j = 0; j < x128::size; j++) acc[j] += gate * __bfloat162float(v[j]);
    }
    x128 o;
    for (int j = 0; j < x128::size; j++) o[j] = __float2bfloat16_rn(acc[j]);
    store128(out + n * C + c, o);
}

// One warp per token: dy[slot] = gate dout for each kept choice, the gates' gradients (dout . y)
// into the probabilities' gradient beside the balance loss's, then the softmax's backward plus the
// z-loss's: dscores = p (dp - p . dp) + dz 2 lse / rows p.
__global__ void moe_combine_backward_kernel(float* dscores, floatX* dy, const floatX* dout, const floatX* y,
                                            const float* probs, const float* lse, const int* expert, const int* slot,
                                            const float* share, float dbalance, float dz, int rows, int C, int E,
                                            int K) {
    const int n = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    if (n >= rows) return;
    const int lane = threadIdx.x % WARP_SIZE;
    const float* p = probs + (size_t)n * E;
    float* dp = dscores + (size_t)n * E;
    const floatX* d = dout + (size_t)n * C;
    for (int e = lane; e < E; e += WARP_SIZE) dp[e] = dbalance * E * share[e] / rows;
    __syncwarp();
    for (int k = 0; k < K; k++) {
        const int s = slot[n * K + k], e = expert[n * K + k];
        if (s < 0) continue;
        const float gate = p[e];
        for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
            const x128 g = load128(d + c);
            x128 o;
            for (int j = 0; j < x128::size; j++) o[j] = __float2bfloat16_rn(gate * __bfloat162float(g[j]));
            store128(dy + (size_t)s * C + c, o);
        }
        const float dgate = warp_dot_bf16(d, y + (size_t)s * C, C);
        if (lane == 0) dp[e] += dgate;
        __syncwarp();
    }
    float dot = 0.0f;
    for (int e = lane; e < E; e += WARP_SIZE) dot += p[e] * dp[e];
    dot = warp_reduce_sum(dot);
    const float zterm = dz * 2.0f * lse[n] / rows;
    for (int e = lane; e < E; e += WARP_SIZE) dp[e] = p[e] * (dp[e] - dot) + zterm * p[e];
}

// dx[n] (= 0, or += with accumulate) = dscores[n] router + the experts' input gradients of n's kept
// choices, in fp32, rounded once. One thread per 8 channels.
__global__ void moe_scatter_backward_kernel(floatX* dx, const float* dscores, const floatX* router,
                                            const floatX* dxe, const int* slot, int rows, int C, int E, int K,
                                            bool accumulate) {
    const int chunks = C / x128::size;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * chunks) return;
    const size_t n = i / chunks, c = (i % chunks) * x128::size;
    float acc[x128::size] = {};
    if (accumulate) {
        const x128 b = load128(dx + n * C + c);
        for (int j = 0; j < x128::size; j++) acc[j] = __bfloat162float(b[j]);
    }
    for (int e = 0; e < E; e++) {
        const float ds = dscores[n * E + e];
        const x128 w = load128(router + (size_t)e * C + c);
        for (int j = 0; j < x128::size; j++) acc[j] += ds * __bfloat162float(w[j]);
    }
    for (int k = 0; k < K; k++) {
        const int s = slot[n * K + k];
        if (s < 0) continue;
        const x128 v = load128(dxe + (size_t)s * C + c);
        for (int j = 0; j < x128::size; j++) acc[j] += __bfloat162float(v[j]);
    }
    x128 o;
    for (int j = 0; j < x128::size; j++) o[j] = __float2bfloat16_rn(acc[j]);
    store128(dx + n * C + c, o);
}

// drouter[e][c] += sum over tokens of dscores[n][e] x[n][c], in token order; one thread per (e, c).
__global__ void moe_router_weight_backward_kernel(float* drouter, const float* dscores, const floatX* x, int rows,
                                                  int C, int E) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)E * C) return;
    const int e = (int)(i / C), c = (int)(i % C);
    float sum = 0.0f;
    for (int n = 0; n < rows; n++) sum += dscores[(size_t)n * E + e] * __bfloat162float(x[(size_t)n * C + c]);
    drouter[i] += sum;
}

// ---------------------------------------------------------------------------------------------
// Expert parallelism (CUDAModel's ExpertRows, over the expert group): after the routing, this rank's
// assignments' rows go to the ranks of their experts, and the rows of this rank's experts come in.

class MoeExchange {
public:
    virtual ~MoeExchange() = default;
    // Plans a block's exchange from its routing (a collective over the expert group).
    virtual void plan(const MoeSummary& m) = 0;
    // The rows of this rank's experts, expert-major: local expert j's are [local_begin()[j], [j + 1]).
    virtual const std::vector<int>& local_begin() const = 0;
    // mine (this rank's assignments' rows, expert-major) to theirs (the rows of this rank's experts),
    // and back; both C wide.
    virtual void dispatch(const floatX* mine, floatX* theirs, int C, cudaStream_t stream) = 0;
    virtual void give_back(const floatX* theirs, floatX* mine, int C, cudaStream_t stream) = 0;
};

// ---------------------------------------------------------------------------------------------
// The launchers.

namespace moe_detail {

constexpr int ROW_THREADS = 256;

inline void check_shape(const cpu::MoeShape& s) {
    if (s.rows < 1 || s.E < 1 || s.K < 1 || s.K > s.E)
        fail(strformat("moe: rows %d, experts %d, top-k %d: expected rows >= 1 and 1 <= top-k <= experts", s.rows,
                       s.E, s.K));
    if (s.C % 8 != 0 || s.F % 8 != 0)
        fail(strformat("moe: C %d and F %d must be multiples of 8 (16-byte vector loads)", s.C, s.F));
}
inline unsigned row_blocks(size_t rows, int C) { return (unsigned)ceil_div(rows * (C / x128::size), (size_t)ROW_THREADS); }
inline unsigned token_blocks(int rows) { return (unsigned)ceil_div(rows, MOE_WARPS_PER_BLOCK); }

// The summary's words, copied to `pinned` (moe_summary_words) once the stream has computed them.
inline MoeSummary download_summary(const int* summary, int* pinned, int E, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(pinned, summary, moe_summary_words(E) * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    MoeSummary m;
    m.begin.assign(pinned, pinned + E + 1);
    m.dropped = pinned[E + 1];
    const float* words = reinterpret_cast<const float*>(pinned);
    m.balance_loss = words[E + 2], m.z_loss = words[E + 3];
    m.share.assign(words + E + 4, words + 2 * E + 4);
    return m;
}

}  // namespace moe_detail

// Routing: probabilities, log-sum-exps, choices, the capacity's drops and the expert-major numbering
// of block `b` for the tokens x (rows x C); returns the summary (a stream synchronisation).
inline MoeSummary moe_route(MoeBlockBuffers& b, const floatX* x, const floatX* router, const cpu::MoeShape& s,
                            int* pinned, cudaStream_t stream) {
    using namespace moe_detail;
    check_shape(s);
    LLMC_LAUNCH(moe_route_kernel, token_blocks(s.rows), MOE_WARPS_PER_BLOCK * WARP_SIZE, 0, stream)(
        b.probs, b.lse, b.expert, x, router, s.rows, s.C, s.E, s.K);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(moe_assign_kernel, 1, MOE_ASSIGN_THREADS, 4 * s.E * sizeof(int), stream)(
        b.slot, b.choice_of, b.summary, b.expert, b.probs, b.lse, s.rows, s.E, s.K, s.capacity());
    CUDA_CHECK_LAUNCH();
    return download_summary(b.summary, pinned, s.E, stream);
}

// out (rows x C) = base + the experts' outputs weighted by their gates (out may be base). Keeps in
// `b` what moe_backward reads; returns the routing's summary. With `exchange` (expert parallelism)
// the rows run at their experts' ranks and w holds this rank's experts only.
inline MoeSummary moe_forward(MatmulContext& ctx, floatX* out, const floatX* base, MoeBlockBuffers& b, const floatX* x,
                              const MoeWeightsBf16& w, const cpu::MoeShape& s, int* pinned, cudaStream_t stream,
                              MoeExchange* exchange = nullptr) {
    using namespace moe_detail;
    const MoeSummary m = moe_route(b, x, w.router, s, pinned, stream);
    const size_t C = s.C, F = s.F;
    if (m.assignments() > 0) {
        LLMC_LAUNCH(moe_gather_kernel, row_blocks(m.assignments(), s.C), ROW_THREADS, 0, stream)(
            b.x, x, b.choice_of, m.assignments(), s.C, s.K);
        CUDA_CHECK_LAUNCH();
    }
    if (exchange) {
        exchange->plan(m);
        exchange->dispatch(b.x, b.ex, s.C, stream);
    }
    // this rank's experts (all of them without expert parallelism), their weights numbered from 0
    const std::vector<int>& begin = exchange ? exchange->local_begin() : m.begin;
    for (int e = 0; e + 1 < (int)begin.size(); e++) {
        const size_t at = begin[e];
        const int rows = begin[e + 1] - begin[e];
        if (rows == 0) continue;
        matmul_forward(ctx, b.h + at * F, b.pre + at * F, b.ex + at * C, w.fcw + e * F * C, w.fcb + e * F, nullptr,
                       rows, s.C, s.F, stream);
        matmul_forward(ctx, b.ey + at * C, nullptr, b.h + at * F, w.fcprojw + e * C * F, w.fcprojb + e * C, nullptr,
                       rows, s.F, s.C, stream);
    }
    if (exchange) exchange->give_back(b.ey, b.y, s.C, stream);
    LLMC_LAUNCH(moe_combine_kernel, row_blocks(s.rows, s.C), ROW_THREADS, 0, stream)(
        out, base, b.y, b.probs, b.expert, b.slot, s.rows, s.C, s.E, s.K);
    CUDA_CHECK_LAUNCH();
    return m;
}

// dx (rows x C; overwritten, or added to with `accumulate`) and the weights' gradients (accumulated)
// from dout, and from the auxiliary losses' weights in the model's loss (d loss / d balance, d loss
// / d z). `b`, `m` and `exchange` (planned) are the forward's of the same tokens x.
inline void moe_backward(MatmulContext& ctx, floatX* dx, bool accumulate, const MoeGradsF32& g,
                         const MoeScratchBuffers& scratch, const floatX* dout, const floatX* x, const MoeBlockBuffers& b,
                         const MoeSummary& m, const MoeWeightsBf16& w, const cpu::MoeShape& s, float dbalance, float dz,
                         cudaStream_t stream, MoeExchange* exchange = nullptr) {
    using namespace moe_detail;
    check_shape(s);
    const size_t C = s.C, F = s.F;
    const float* share = reinterpret_cast<const float*>(b.summary + s.E + 4);
    LLMC_LAUNCH(moe_combine_backward_kernel, token_blocks(s.rows), MOE_WARPS_PER_BLOCK * WARP_SIZE, 0, stream)(
        scratch.dscores, scratch.dy, dout, b.y, b.probs, b.lse, b.expert, b.slot, share, dbalance, dz, s.rows, s.C,
        s.E, s.K);
    CUDA_CHECK_LAUNCH();
    if (exchange) exchange->dispatch(scratch.dy, scratch.edy, s.C, stream);
    const std::vector<int>& begin = exchange ? exchange->local_begin() : m.begin;
    for (int e = 0; e + 1 < (int)begin.size(); e++) {  // each expert's MLP backward, GELU's in the DGELU epilogue
        const size_t at = begin[e];
        const int rows = begin[e + 1] - begin[e];
        if (rows == 0) continue;
        matmul_backward(ctx, scratch.dh + at * F, g.fcprojw + e * C * F, g.fcprojb + e * C, scratch.bias,
                        scratch.edy + at * C, b.h + at * F, w.fcprojw + e * C * F, b.pre + at * F, rows, s.F, s.C,
                        stream);
        matmul_backward(ctx, scratch.edx + at * C, g.fcw + e * F * C, g.fcb + e * F, scratch.bias, scratch.dh + at * F,
                        b.ex + at * C, w.fcw + e * F * C, nullptr, rows, s.C, s.F, stream);
    }
    if (exchange) exchange->give_back(scratch.edx, scratch.dx, s.C, stream);
    LLMC_LAUNCH(moe_scatter_backward_kernel, row_blocks(s.rows, s.C), ROW_THREADS, 0, stream)(
        dx, scratch.dscores, w.router, scratch.dx, b.slot, s.rows, s.C, s.E, s.K, accumulate);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(moe_router_weight_backward_kernel, (unsigned)ceil_div((size_t)s.E * C, (size_t)ROW_THREADS),
                ROW_THREADS, 0, stream)(g.router, scratch.dscores, x, s.rows, s.C, s.E);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
