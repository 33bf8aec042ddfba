// encoder.cuh: the token + position embedding, forward and backward.
//
// Backward is a scatter-add: each position adds its gradient row into the row of its token, and a
// frequent token collects hundreds of them. Atomics would make the order of those additions, and so
// the bits of the sum, vary from run to run. Instead the host, which knows the tokens before the step,
// groups the positions by token (a counting sort) and uploads the groups; on the device each token's
// row is then the private sum of one block, taken in a fixed order. Position gradients need no
// grouping: dwpe[t] adds the B rows dout[b, t] in order of b.
//
// Vocabulary-parallel form (tensor parallelism): a rank holds wte rows [vocab_begin, vocab_end) only.
// Forward, embedding_forward_range writes the token rows it holds and zeros elsewhere; summed over
// the group (each token's row is held by exactly one rank, so the sum is exact) that is the token
// embedding, and add_positions adds wpe to the rank's rows of it. Backward, prepare() takes the
// range and groups only the positions whose token the rank holds.
#pragma once

#include <algorithm>
#include <climits>
#include <memory>
#include <vector>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

// ---------------------------------------------------------------------------------------------
// Forward: out[b, t, :] = wte[tokens[b, t], :] + wpe[position of t, :], one thread per 8 channels.
// The position of row t of a sequence is t, or positions[t] where the rank holds other positions of
// each sequence than 0..T-1 (context parallelism: its two chunks, context_parallel.h).

__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                       const int* positions, int B, int T, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)B * T * chunks) return;
    const size_t bt = index / chunks;
    const int channel = (int)(index % chunks) * x128::size;
    const int t = positions ? positions[bt % T] : (int)(bt % T);
    const x128 token_row = load128(wte + (size_t)tokens[bt] * C + channel);
    const x128 position_row = load128(wpe + (size_t)t * C + channel);
    x128 result;
#pragma unroll
    for (int i = 0; i < x128::size; i++) {
        result[i] = __float2bfloat16_rn(__bfloat162float(token_row[i]) + __bfloat162float(position_row[i]));
    }
    store128(out + bt * C + channel, result);
}

inline void encoder_check_shape(int B, int T, int C, const char* what) {
    if (B < 1 || T < 1) fail(strformat("%s: B = %d, T = %d; expected both at least 1", what, B, T));
    if (C < 8 || C % 8 != 0) fail(strformat("%s: C = %d channels, expected a positive multiple of 8", what, C));
}

// tokens: B * T ids in [0, rows of wte), on the device; positions: null (row t is position t), or
// the T positions of a sequence's rows, on the device.
inline void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream, const int* positions = nullptr) {
    encoder_check_shape(B, T, C, "encoder_forward");
    const int threads = 256;
    const size_t blocks = ceil_div((size_t)B * T * (C / x128::size), (size_t)threads);
    if (blocks > (size_t)INT_MAX) fail(strformat("encoder_forward: B = %d x T = %d x C = %d is too large", B, T, C));
    LLMC_LAUNCH(encoder_forward_kernel, (unsigned)blocks, threads, 0, stream)(out, tokens, wte, wpe, positions, B, T, C);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel forward: out[r] = wte[tokens[r] - vocab_begin] where the token lies in
// [vocab_begin, vocab_end) (wte holding those rows), else 0; then out[r] = inp[r] + wpe[position of
// row row0 + r] for the rank's rows. One thread per 8 channels each.

__global__ void embedding_forward_range_kernel(floatX* out, const int* tokens, const floatX* wte, int vocab_begin,
                                               int vocab_end, int rows, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * chunks) return;
    const size_t r = index / chunks;
    const int channel = (int)(index % chunks) * x128::size;
    const int token = tokens[r];
    x128 result;
    if (token >= vocab_begin && token < vocab_end) {
        result = load128(wte + (size_t)(token - vocab_begin) * C + channel);
    } else {
#pragma unroll
        for (int i = 0; i < x128::size; i++) result[i] = __float2bfloat16_rn(0.0f);
    }
    store128(out + r * C + channel, result);
}

__global__ void add_positions_kernel(floatX* out, const floatX* inp, const floatX* wpe, const int* positions, int row0,
                                     int rows, int T, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * chunks) return;
    const size_t r = index / chunks;
    const int channel = (int)(index % chunks) * x128::size;
    const int row_in_sequence = (int)((row0 + r) % T);
    const int t = positions ? positions[row_in_sequence] : row_in_sequence;
    const x128 x = load128(inp + r * C + channel);
    const x128 position_row = load128(wpe + (size_t)t * C + channel);
    x128 result;
#pragma unroll
    for (int i = 0; i < x128::size; i++)
        result[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(position_row[i]));
    store128(out + r * C + channel, result);
}

inline size_t embedding_blocks(int rows, int C, int threads, const char* what) {
    if (rows < 1) fail(strformat("%s: rows must be >= 1, got %d", what, rows));
    if (C < 8 || C % 8 != 0) fail(strformat("%s: C = %d channels, expected a positive multiple of 8", what, C));
    const size_t blocks = ceil_div((size_t)rows * (C / x128::size), (size_t)threads);
    if (blocks > (size_t)INT_MAX) fail(strformat("%s: %d rows x C = %d is too large", what, rows, C));
    return blocks;
}

// tokens: `rows` ids on the device; wte: rows [vocab_begin, vocab_end) of the embedding.
inline void embedding_forward_range(floatX* out, const int* tokens, const floatX* wte, int vocab_begin, int vocab_end,
                                    int rows, int C, cudaStream_t stream) {
    if (vocab_begin < 0 || vocab_end < vocab_begin)
        fail(strformat("embedding_forward_range: vocabulary range [%d, %d) is empty or negative", vocab_begin,
                       vocab_end));
    const int threads = 256;
    const size_t blocks = embedding_blocks(rows, C, threads, "embedding_forward_range");
    LLMC_LAUNCH(embedding_forward_range_kernel, (unsigned)blocks, threads, 0, stream)(out, tokens, wte, vocab_begin, vocab_end,
                                                                             rows, C);
    CUDA_CHECK_LAUNCH();
}

// `rows` rows of a B x T batch starting at row row0 (positions restart every T rows; positions as
// encoder_forward's); out may be inp.
inline void add_positions(floatX* out, const floatX* inp, const floatX* wpe, int row0, int rows, int T, int C,
                          cudaStream_t stream, const int* positions = nullptr) {
    if (T < 1 || row0 < 0) fail(strformat("add_positions: T = %d, row0 = %d; expected T >= 1, row0 >= 0", T, row0));
    const int threads = 256;
    const size_t blocks = embedding_blocks(rows, C, threads, "add_positions");
    LLMC_LAUNCH(add_positions_kernel, (unsigned)blocks, threads, 0, stream)(out, inp, wpe, positions, row0, rows, T,
                                                                                   C);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Backward.

constexpr int ENCODER_BACKWARD_WARPS = 4;   // warps sharing one token's positions
constexpr int ENCODER_BACKWARD_UNROLL = 4;  // rows a warp has in flight (8 doubles the registers)
constexpr int ENCODER_TILE_CHANNELS = WARP_SIZE * x128::size;  // channels of one block: 8 per lane
// The counting sort's histogram is indexed by token id; this bounds its size (vocabularies are far smaller).
constexpr int ENCODER_MAX_TOKEN_ID = 1 << 24;

// Block (g, y): token group g, channels [256 y, 256 y + 256). The group's positions are taken in
// batches of 32, batch j by warp j % 4; a warp adds its batches' rows in increasing order, then warp 0
// adds the four warp sums in warp order and adds the result into dwte. A warp reads a batch's 32
// positions with one load (one per lane) and broadcasts them with shuffles, so it waits one memory
// round trip per 4 rows rather than two per row. Groups arrive longest first, so the long sums start
// in the first wave.
__global__ void __launch_bounds__(ENCODER_BACKWARD_WARPS * WARP_SIZE)
    encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* group_token, const int* group_begin,
                                const int* group_count, const int* positions, int C) {
    __shared__ f128 warp_sums[ENCODER_BACKWARD_WARPS][WARP_SIZE][2];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int group = blockIdx.x;
    const int channel = blockIdx.y * ENCODER_TILE_CHANNELS + lane * x128::size;
    const bool active = channel < C;
    const int* group_positions = positions + group_begin[group];
    const int count = group_count[group];

    // Warp 0 fetches the destination now, so the load overlaps the sum instead of following it.
    float* dst = dwte + (size_t)group_token[group] * C + channel;
    f128 dst_lo, dst_hi;
    if (warp == 0 && active) {
        dst_lo = load128(dst);
        dst_hi = load128(dst + 4);
    }

    float sum[x128::size] = {};
    // Every bound below is the same for the whole warp, so the full-mask shuffles see all 32 lanes.
    for (int batch = warp * WARP_SIZE; batch < count; batch += ENCODER_BACKWARD_WARPS * WARP_SIZE) {
        const int batch_rows = min(WARP_SIZE, count - batch);
        const int lane_position = lane < batch_rows ? group_positions[batch + lane] : 0;
        for (int first = 0; first < batch_rows; first += ENCODER_BACKWARD_UNROLL) {
            x128 rows[ENCODER_BACKWARD_UNROLL];
#pragma unroll
            for (int u = 0; u < ENCODER_BACKWARD_UNROLL; u++) {
                const int r = first + u;
                const int position = __shfl_sync(0xffffffff, lane_position, r % WARP_SIZE);
                if (active && r < batch_rows) rows[u] = load128(dout + (size_t)position * C + channel);
            }
#pragma unroll
            for (int u = 0; u < ENCODER_BACKWARD_UNROLL; u++) {
                if (active && first + u < batch_rows) {
#pragma unroll
                    for (int k = 0; k < x128::size; k++) sum[k] += __bfloat162float(rows[u][k]);
                }
            }
        }
    }
    f128 sum_lo, sum_hi;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        sum_lo[k] = sum[k];
        sum_hi[k] = sum[4 + k];
    }
    warp_sums[warp][lane][0] = sum_lo;
    warp_sums[warp][lane][1] = sum_hi;
    __syncthreads();
    if (warp != 0 || !active) return;

    f128 total_lo = warp_sums[0][lane][0], total_hi = warp_sums[0][lane][1];
#pragma unroll
    for (int w = 1; w < ENCODER_BACKWARD_WARPS; w++) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            total_lo[k] += warp_sums[w][lane][0][k];
            total_hi[k] += warp_sums[w][lane][1][k];
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        dst_lo[k] += total_lo[k];
        dst_hi[k] += total_hi[k];
    }
    store128(dst, dst_lo);
    store128(dst + 4, dst_hi);
}

// One thread per (t, 8 channels): dwpe[p] += dout[0, t] + dout[1, t] + ..., added one b at a time into
// the running value, the order of the CPU reference; p is row t's position (positions[t], or t). The
// positions are distinct, so each row of dwpe still has one writer.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, const int* positions, int B, int T,
                                            int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)T * chunks) return;
    const int t = (int)(index / chunks);
    const int channel = (int)(index % chunks) * x128::size;
    float* dst = dwpe + (size_t)(positions ? positions[t] : t) * C + channel;
    f128 lo = load128(dst), hi = load128(dst + 4);
#pragma unroll 4
    for (int b = 0; b < B; b++) {
        const x128 d = load128(dout + ((size_t)b * T + t) * C + channel);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] += __bfloat162float(d[k]);
            hi[k] += __bfloat162float(d[4 + k]);
        }
    }
    store128(dst, lo);
    store128(dst + 4, hi);
}

// Usage per micro-batch, in host order: prepare(tokens of this micro-batch), then backward(). The next
// prepare() may come as soon as backward() has been enqueued: events order the uploads and the kernels.
class EncoderBackward {
public:
    // Device and pinned host buffers for up to max_B * max_T positions.
    EncoderBackward(int max_B, int max_T);

    // Groups the B * T positions by token on the host and uploads the groups on `stream`. Blocks the host
    // only until the previous upload has left the pinned buffer. host_tokens: ids in [0, vocabulary).
    // Under vocabulary parallelism dwte holds rows [vocab_begin, vocab_end) only: the other tokens'
    // positions are left out, and token ids become rows of that slice.
    void prepare(const int* host_tokens, int B, int T, cudaStream_t stream, int vocab_begin = 0,
                 int vocab_end = INT_MAX);

    // For the tokens of the last prepare() (same B and T): dwte (Vp x C) += ..., dwpe (maxT x C; null: none) += ...
    // positions: as encoder_forward's.
    void backward(float* dwte, float* dwpe, const floatX* dout, int B, int T, int C, cudaStream_t stream,
                  const int* positions = nullptr);

    size_t device_bytes() const { return groups_device_.bytes(); }
    // What the constructor will allocate on the device, for the memory planner.
    static size_t device_bytes_for(int max_B, int max_T) { return group_capacity(max_B, max_T) * sizeof(int); }

private:
    struct PinnedFree {
        void operator()(int* p) const { cudaFreeHost(p); }
    };
    struct EventDestroy {
        void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
    };
    using Event = std::unique_ptr<CUevent_st, EventDestroy>;
    struct TokenGroup {
        int token, begin, count;  // positions[begin, begin + count) hold the token's positions, increasing
    };

    // Upload layout, U groups and n = B * T positions: [token U][begin U][count U][positions n]. U <= n,
    // so 4 max_B max_T ints always suffice.
    static size_t group_capacity(int max_B, int max_T) { return 4 * (size_t)max_B * max_T; }
    static Event make_event() {
        cudaEvent_t event = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        return Event(event);
    }

    size_t max_positions_ = 0;
    DeviceBuffer<int> groups_device_;  // the groups in the upload layout above
    std::unique_ptr<int[], PinnedFree> groups_pinned_;
    Event uploaded_;  // the last upload has finished reading the pinned buffer
    Event consumed_;  // the last backward has finished reading the device buffer
    std::vector<int> token_slots_;  // by token id: first its count, then its next free slot in positions
    std::vector<TokenGroup> groups_;
    int prepared_B_ = 0, prepared_T_ = 0;
};

inline EncoderBackward::EncoderBackward(int max_B, int max_T) {
    if (max_B < 1 || max_T < 1) {
        fail(strformat("EncoderBackward: max_B = %d, max_T = %d; expected both at least 1", max_B, max_T));
    }
    max_positions_ = (size_t)max_B * max_T;
    if (max_positions_ > (size_t)INT_MAX / 4) {
        fail(strformat("EncoderBackward: max_B = %d x max_T = %d positions exceed %d", max_B, max_T, INT_MAX / 4));
    }
    const size_t capacity = group_capacity(max_B, max_T);
    groups_device_.allocate(capacity, "encoder backward token groups");
    int* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost(&pinned, capacity * sizeof(int)));
    groups_pinned_.reset(pinned);
    uploaded_ = make_event();
    consumed_ = make_event();
}

inline void EncoderBackward::prepare(const int* host_tokens, int B, int T, cudaStream_t stream, int vocab_begin,
                                     int vocab_end) {
    if (B < 1 || T < 1 || (size_t)B * T > max_positions_) {
        fail(strformat("EncoderBackward::prepare: B = %d, T = %d; expected 1 <= B * T <= %zu (max_B * max_T)", B, T,
                       max_positions_));
    }
    if (vocab_begin < 0 || vocab_end <= vocab_begin)
        fail(strformat("EncoderBackward::prepare: vocabulary range [%d, %d) is empty or negative", vocab_begin,
                       vocab_end));
    const int n = B * T;
    int max_token = 0;
    for (int i = 0; i < n; i++) {
        const int token = host_tokens[i];
        if (token < 0 || token >= ENCODER_MAX_TOKEN_ID) {
            fail(strformat("EncoderBackward::prepare: token %d at position %d is outside [0, %d)", token, i,
                           ENCODER_MAX_TOKEN_ID));
        }
        max_token = std::max(max_token, token);
    }
    auto held = [&](int token) { return token >= vocab_begin && token < vocab_end; };

    // Counting sort: count each held token, give each present token a group and a range of slots in
    // token order, then drop the positions into their slots in increasing order.
    token_slots_.assign((size_t)max_token + 1, 0);
    int held_positions = 0;
    for (int i = 0; i < n; i++)
        if (held(host_tokens[i])) {
            token_slots_[host_tokens[i]]++;
            held_positions++;
        }
    groups_.clear();
    int next_slot = 0;
    for (int token = 0; token <= max_token; token++) {
        const int count = token_slots_[token];
        if (count == 0) continue;
        groups_.push_back({token - vocab_begin, next_slot, count});
        token_slots_[token] = next_slot;
        next_slot += count;
    }
    // Longest groups first, so that their long sums start in the first wave of blocks.
    std::sort(groups_.begin(), groups_.end(), [](const TokenGroup& a, const TokenGroup& b) {
        return a.count != b.count ? a.count > b.count : a.token < b.token;
    });

    const int num_groups = (int)groups_.size();
    CUDA_CHECK(cudaEventSynchronize(uploaded_.get()));  // the previous upload has read the pinned buffer
    int* pinned = groups_pinned_.get();
    for (int g = 0; g < num_groups; g++) {
        pinned[g] = groups_[g].token;
        pinned[num_groups + g] = groups_[g].begin;
        pinned[2 * num_groups + g] = groups_[g].count;
    }
    int* positions = pinned + 3 * num_groups;
    for (int i = 0; i < n; i++)
        if (held(host_tokens[i])) positions[token_slots_[host_tokens[i]]++] = i;

    CUDA_CHECK(cudaStreamWaitEvent(stream, consumed_.get(), 0));  // the previous backward has read the groups
    const size_t upload = 3 * (size_t)num_groups + held_positions;
    if (upload > 0)
        CUDA_CHECK(cudaMemcpyAsync(groups_device_.get(), pinned, upload * sizeof(int), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaEventRecord(uploaded_.get(), stream));
    prepared_B_ = B;
    prepared_T_ = T;
}

inline void EncoderBackward::backward(float* dwte, float* dwpe, const floatX* dout, int B, int T, int C,
                                      cudaStream_t stream, const int* positions) {
    if (prepared_B_ == 0) fail("EncoderBackward::backward: no prepare() before it");
    if (B != prepared_B_ || T != prepared_T_) {
        fail(strformat("EncoderBackward::backward: B = %d, T = %d, but the last prepare() had B = %d, T = %d", B, T,
                       prepared_B_, prepared_T_));
    }
    encoder_check_shape(B, T, C, "EncoderBackward::backward");
    CUDA_CHECK(cudaStreamWaitEvent(stream, uploaded_.get(), 0));

    const int num_groups = (int)groups_.size();
    const int* groups = groups_device_.get();
    // A vocabulary slice may hold none of the batch's tokens: then there is no wte block to launch.
    if (num_groups > 0) {
        const dim3 wte_blocks(num_groups, ceil_div(C, ENCODER_TILE_CHANNELS));
        LLMC_LAUNCH(encoder_backward_wte_kernel, wte_blocks, ENCODER_BACKWARD_WARPS * WARP_SIZE, 0, stream)(
            dwte, dout, groups, groups + num_groups, groups + 2 * num_groups, groups + 3 * num_groups, C);
        CUDA_CHECK_LAUNCH();
    }

    if (dwpe) {  // a model without a position table (Llama: rotary positions) passes null
        const int threads = 256;
        const int wpe_blocks = (int)ceil_div((size_t)T * (C / x128::size), (size_t)threads);
        LLMC_LAUNCH(encoder_backward_wpe_kernel, wpe_blocks, threads, 0, stream)(dwpe, dout, positions, B, T, C);
        CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaEventRecord(consumed_.get(), stream));
}

}  // namespace llmc
