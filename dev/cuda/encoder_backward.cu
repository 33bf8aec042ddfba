// dev/cuda/encoder_backward.cu: token + position embedding forward and backward (llmc/encoder.cuh).
//
//   version 1: forward one thread per channel; backward groups positions by token on the host with
//              std::sort, then one thread per (token, channel) adds its positions' rows in order
//   version 2: llmc/encoder.cuh: forward one thread per 8 channels; EncoderBackward (counting sort on
//              the host, pinned upload; one block per (token, 256 channels), 4 warps sharing the rows)
//
// Tolerances. out is bf16: BF16_TOLERANCE. dwte and dwpe are fp32 sums of the same bf16-exact dout values
// as the CPU's, so only the order of the additions differs: FP32_TOLERANCE (version 1 and version 2's
// dwpe even add in the CPU's order, so they should match it exactly). dwte and dwpe accumulate: they
// start from the same random values on both sides. dwte is checked on the rows of the batch's tokens,
// and its other rows must come back bitwise unchanged; dwpe is checked whole, including 3 rows past T.
//
// Token draws: uniform over GPT-2's vocabulary (short groups), 30% of positions on one token (one very
// long group among short ones), and a 7-token vocabulary (every group long).
// Emulated (dev/emu/), the GPT-2 124M cases are skipped (bench::skip_when_emulated) and the long group
// among short ones is checked at B = 4, T = 256.
#include <algorithm>
#include <chrono>
#include <utility>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/cpu/ops.h"

using llmc::floatX;

// ---------------------------------------------------------------------------------------------
// Version 1.

__global__ void encoder_forward_v1_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                          int B, int T, int C) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)B * T * C) return;
    const size_t bt = index / C;
    const int c = (int)(index % C), t = (int)(bt % T);
    out[index] = __float2bfloat16_rn(__bfloat162float(wte[(size_t)tokens[bt] * C + c]) +
                                     __bfloat162float(wpe[(size_t)t * C + c]));
}

void encoder_forward_v1(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    LLMC_LAUNCH(encoder_forward_v1_kernel, (unsigned)llmc::ceil_div(n, (size_t)256), 256, 0, 0)(out, tokens, wte, wpe, B, T, C);
    CUDA_CHECK_LAUNCH();
}

// The groups of version 1, built independently of EncoderBackward: unique tokens (increasing), offsets
// (unique + 1) into positions, positions increasing within each group.
struct HostGroups {
    std::vector<int> tokens, offsets, positions;
};

HostGroups group_by_token(const std::vector<int>& tokens) {
    std::vector<std::pair<int, int>> pairs(tokens.size());
    for (size_t i = 0; i < tokens.size(); i++) pairs[i] = {tokens[i], (int)i};
    std::sort(pairs.begin(), pairs.end());
    HostGroups g;
    for (size_t i = 0; i < pairs.size(); i++) {
        if (i == 0 || pairs[i].first != pairs[i - 1].first) {
            g.tokens.push_back(pairs[i].first);
            g.offsets.push_back((int)i);
        }
        g.positions.push_back(pairs[i].second);
    }
    g.offsets.push_back((int)pairs.size());
    return g;
}

__global__ void encoder_backward_wte_v1_kernel(float* dwte, const floatX* dout, const int* unique_tokens,
                                               const int* offsets, const int* positions, int num_unique, int C) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)num_unique * C) return;
    const int g = (int)(index / C), c = (int)(index % C);
    float* dst = dwte + (size_t)unique_tokens[g] * C + c;
    float sum = *dst;
    for (int i = offsets[g]; i < offsets[g + 1]; i++) sum += __bfloat162float(dout[(size_t)positions[i] * C + c]);
    *dst = sum;
}

__global__ void encoder_backward_wpe_v1_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)T * C) return;
    const int t = (int)(index / C), c = (int)(index % C);
    float sum = dwpe[index];
    for (int b = 0; b < B; b++) sum += __bfloat162float(dout[((size_t)b * T + t) * C + c]);
    dwpe[index] = sum;
}

// ---------------------------------------------------------------------------------------------
// Harness.

struct Case {
    const char* name;
    int B, T, C;
    int vocab, padded_vocab;  // tokens in [0, vocab); dwte and wte have padded_vocab rows
    double hot_fraction;      // this fraction of positions (in expectation) carries token vocab / 3
    bool timed;
};

std::vector<int> make_tokens(const Case& cs, std::mt19937_64& rng) {
    std::vector<int> tokens = bench::random_tokens((size_t)cs.B * cs.T, cs.vocab, rng);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    if (cs.hot_fraction > 0.0) {
        for (int& token : tokens) {
            if (coin(rng) < cs.hot_fraction) token = cs.vocab / 3;
        }
    }
    return tokens;
}

void run_forward(int version, const Case& cs, bool check_only, std::mt19937_64& rng) {
    const int B = cs.B, T = cs.T, C = cs.C;
    const size_t BTC = (size_t)B * T * C;
    const std::vector<int> tokens = make_tokens(cs, rng);
    const std::vector<float> wte = bench::random_bf16((size_t)cs.padded_vocab * C, rng),
                             wpe = bench::random_bf16((size_t)T * C, rng);
    std::vector<float> ref_out(BTC);
    llmc::cpu::encoder_forward(ref_out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);

    auto d_tokens = bench::to_device(tokens);
    auto d_wte = bench::to_device_bf16(wte), d_wpe = bench::to_device_bf16(wpe);
    bench::DeviceBuffer<floatX> d_out(BTC, "out");
    auto forward = [&]() {
        if (version == 1) encoder_forward_v1(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C);
        else llmc::encoder_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C, 0);
    };
    bench::poison(d_out.get(), BTC);
    forward();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> out = bench::to_host(d_out.get(), BTC);
    bench::check("forward out", out, ref_out, bench::BF16_TOLERANCE);
    if (version == 2) {
        const auto out_bits = bench::device_bytes(d_out.get(), BTC);
        bench::poison(d_out.get(), BTC);
        forward();
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check_same_bits("forward out, run twice", bench::device_bytes(d_out.get(), BTC), out_bits);
    }
    if (check_only || !cs.timed) return;
    // Bytes: read the tokens, B*T rows of wte, T rows of wpe; write out.
    const double bytes = (double)B * T * sizeof(int) + 2.0 * BTC * sizeof(floatX) + (double)T * C * sizeof(floatX);
    bench::report_memory_bound("forward", bench::time_ms(forward), bytes);
}

void run_backward(int version, const Case& cs, bool check_only, std::mt19937_64& rng) {
    const int B = cs.B, T = cs.T, C = cs.C, maxT = cs.T + 3;  // dwpe rows past T must stay untouched
    const size_t BTC = (size_t)B * T * C, wte_size = (size_t)cs.padded_vocab * C, wpe_size = (size_t)maxT * C;
    const std::vector<int> tokens = make_tokens(cs, rng);
    const std::vector<float> dout = bench::random_bf16(BTC, rng);
    const std::vector<float> dwte_init = bench::random_f32(wte_size, rng), dwpe_init = bench::random_f32(wpe_size, rng);
    std::vector<float> ref_dwte = dwte_init, ref_dwpe = dwpe_init;
    llmc::cpu::encoder_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), tokens.data(), B, T, C);

    const HostGroups groups = group_by_token(tokens);
    const int num_unique = (int)groups.tokens.size();
    int longest = 0;
    for (int g = 0; g < num_unique; g++) longest = std::max(longest, groups.offsets[g + 1] - groups.offsets[g]);
    printf("  %d distinct tokens, longest group %d positions\n", num_unique, longest);

    auto d_dout = bench::to_device_bf16(dout);
    bench::DeviceBuffer<float> d_dwte(wte_size, "dwte"), d_dwpe(wpe_size, "dwpe");
    auto d_unique = bench::to_device(groups.tokens), d_offsets = bench::to_device(groups.offsets),
         d_positions = bench::to_device(groups.positions);
    llmc::EncoderBackward encoder_backward(B, T);
    auto reset = [&]() {
        bench::upload(d_dwte.get(), dwte_init);
        bench::upload(d_dwpe.get(), dwpe_init);
    };
    auto backward = [&]() {
        if (version == 1) {
            const size_t wte_threads = (size_t)num_unique * C, wpe_threads = (size_t)T * C;
            LLMC_LAUNCH(encoder_backward_wte_v1_kernel, (unsigned)llmc::ceil_div(wte_threads, (size_t)256), 256, 0, 0)(
                d_dwte.get(), d_dout.get(), d_unique.get(), d_offsets.get(), d_positions.get(), num_unique, C);
            CUDA_CHECK_LAUNCH();
            LLMC_LAUNCH(encoder_backward_wpe_v1_kernel, (unsigned)llmc::ceil_div(wpe_threads, (size_t)256), 256, 0, 0)(
                d_dwpe.get(), d_dout.get(), B, T, C);
            CUDA_CHECK_LAUNCH();
        } else {
            encoder_backward.backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), B, T, C, 0);
        }
    };
    if (version == 2) {
        // A different batch prepared first: the second prepare() must replace it (and wait for its upload).
        std::vector<int> other(tokens.rbegin(), tokens.rend());
        for (int& token : other) token = (token + 1) % cs.vocab;
        encoder_backward.prepare(other.data(), B, T, 0);
        encoder_backward.prepare(tokens.data(), B, T, 0);
    }
    reset();
    backward();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> dwte = bench::to_host(d_dwte.get(), wte_size);
    std::vector<float> gathered(groups.tokens.size() * C), ref_gathered(groups.tokens.size() * C);
    std::vector<bool> in_batch(cs.padded_vocab, false);
    for (int g = 0; g < num_unique; g++) {
        const size_t row = (size_t)groups.tokens[g] * C;
        std::copy(dwte.begin() + row, dwte.begin() + row + C, gathered.begin() + (size_t)g * C);
        std::copy(ref_dwte.begin() + row, ref_dwte.begin() + row + C, ref_gathered.begin() + (size_t)g * C);
        in_batch[groups.tokens[g]] = true;
    }
    bench::check("dwte, rows of batch tokens", gathered, ref_gathered, bench::FP32_TOLERANCE);
    size_t changed_rows = 0;
    for (int v = 0; v < cs.padded_vocab; v++) {
        const size_t row = (size_t)v * C;
        if (!in_batch[v] && std::memcmp(&dwte[row], &dwte_init[row], C * sizeof(float)) != 0) changed_rows++;
    }
    bench::report_check("dwte, other rows unchanged", changed_rows == 0, llmc::strformat("%zu changed", changed_rows));
    bench::check("dwpe (all maxT rows)", bench::to_host(d_dwpe.get(), wpe_size), ref_dwpe, bench::FP32_TOLERANCE);

    if (version == 2) {
        const auto dwte_bits = bench::device_bytes(d_dwte.get(), wte_size),
                   dwpe_bits = bench::device_bytes(d_dwpe.get(), wpe_size);
        reset();
        encoder_backward.prepare(tokens.data(), B, T, 0);
        backward();
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check_same_bits("dwte, run twice", bench::device_bytes(d_dwte.get(), wte_size), dwte_bits);
        bench::check_same_bits("dwpe, run twice", bench::device_bytes(d_dwpe.get(), wpe_size), dwpe_bits);
    }
    if (check_only || !cs.timed) return;
    // Bytes: read dout once, read and write the dwte rows of the batch's tokens and T rows of dwpe.
    const double bytes = (double)BTC * sizeof(floatX) + 2.0 * num_unique * C * sizeof(float) +
                         2.0 * T * C * sizeof(float);
    bench::report_memory_bound("backward", bench::time_ms(backward), bytes);
    if (version == 2) {
        std::vector<double> host_ms;
        for (int r = 0; r < 20; r++) {
            CUDA_CHECK(cudaDeviceSynchronize());  // so prepare() measures the host work, not a wait
            const auto start = std::chrono::steady_clock::now();
            encoder_backward.prepare(tokens.data(), B, T, 0);
            const auto elapsed = std::chrono::steady_clock::now() - start;
            host_ms.push_back(std::chrono::duration<double, std::milli>(elapsed).count());
        }
        CUDA_CHECK(cudaDeviceSynchronize());  // the last upload reads the pinned buffer freed on return
        std::sort(host_ms.begin(), host_ms.end());
        printf("  host EncoderBackward::prepare   %8.4f ms (median of 20)\n", host_ms[host_ms.size() / 2]);
    }
}

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, 2);
    std::mt19937_64 rng(opts.seed);
    std::vector<Case> cases = {
        {"GPT-2 124M: B = 8, T = 1024, C = 768, uniform tokens", 8, 1024, 768, 50257, 50304, 0.0, true},
        {"GPT-2 124M, 30% of positions on one token", 8, 1024, 768, 50257, 50304, 0.3, true},
        {"long groups: B = 8, T = 1024, C = 768, 7 tokens", 8, 1024, 768, 7, 8, 0.0, false},
        {"awkward: B = 3, T = 37, C = 1600", 3, 37, 1600, 1000, 1024, 0.0, false},
        {"tiny: B = 1, T = 1, C = 8", 1, 1, 8, 5, 8, 0.0, false},
        {"wide: B = 2, T = 5, C = 6400, 3 tokens", 2, 5, 6400, 3, 8, 0.0, false},
    };
    // Emulated only, where the GPT-2 cases are skipped: one long group among short ones, smaller.
    if (bench::EMULATED)
        cases.push_back({"B = 4, T = 256, C = 768, V 3001, 30% of positions on one token", 4, 256, 768, 3001, 3008, 0.3,
                         false});
    for (int version = 1; version <= 2; version++) {
        if (!opts.runs(version)) continue;
        for (const Case& cs : cases) {
            printf("version %d, %s\n", version, cs.name);
            if (bench::skip_when_emulated("B T C + Vp C", (double)cs.B * cs.T * cs.C + (double)cs.padded_vocab * cs.C))
                continue;
            run_forward(version, cs, opts.check_only, rng);
            run_backward(version, cs, opts.check_only, rng);
        }
    }
    return bench::finish(argv[0]);
}
