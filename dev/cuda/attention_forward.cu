// attention_forward.cu: workbench for llmc::attention_forward, causal self-attention that writes the
// output and each query row's log-sum-exp (lse) and never a T x T matrix.
//
//   v1  one warp per query row, a scalar online softmax over its keys: obviously correct, and slow
//       (every key costs a warp-wide reduction and the keys are re-read by every query row)
//   v2  llmc/attention.cuh: FlashAttention-2 on bf16 tensor cores (mma.sync m16n8k16)
//   v3  llmc/attention_hopper.cuh: the same on Hopper's warpgroup products (wgmma m64nNk16), head
//       size 64 on an sm_90 device (the emulator is one); other head sizes and devices skip it;
//       tiles of 128 keys, one block an SM (the shape attention_forward runs: FORWARD_KEYS)
//   v4  v3 with tiles of 64 keys, two blocks an SM (the other shape, timed against it)
//   v5  llmc/attention_hopper_tma.cuh: v3's products and softmax in two consumer warpgroups, fed by
//       a producer warpgroup's TMA copies through a ring of 2 stages and mbarriers (FlashAttention-3's
//       warp specialization); set_attention_kernels(Tma)
//   v6  v5 with 3 stages
//
//   ./attention_forward --tune FILE   time versions 2-6 at T 1024, 2048 and 4096 (8192 tokens of 12
//                                     heads of 64), each checked against version 2, and write the
//                                     fastest per T as llmc/kernels/attention_table.h (read under
//                                     set_attention_kernels(Auto))
//
// Checks, per shape, on the same bf16-exact inputs for every version:
//   out  against llmc::cpu::attention_forward, BF16_TOLERANCE (out is stored in bf16; v2 also rounds
//        the probabilities to bf16 for the P V product).
//   lse  as exp(lse), the softmax denominator sum_j exp(s_j), against a double-precision host sum,
//        row by row (the largest relative error over all rows, not a norm over the tensor, which
//        would dilute one wrong row among thousands). Its relative error is lse's absolute error,
//        which is what the backward's exp(s - lse) feels, and unlike lse's own relative error it
//        stays well-conditioned when lse is near 0 (T = 1). Limit 1e-4: the expected error is about
//        1e-6 (fp32 dot products whose tensor-core rounding is not IEEE-specified, ex2.approx at
//        2 ulp, lse = max ln2 + ln sum), while a wrong mask or index moves a row by far more (one
//        key more or less in a 1000-key row: ~1e-3).
//   determinism: v2-v6 run twice, out and lse bitwise equal; v5 and v6 give v3's out and lse bitwise.
//   the ring-pair entry point: attention_forward_pair over the whole sequence (one causal pair)
//        gives attention_forward's out and lse bitwise (the same kernel instance).
// Ring checks (context parallelism, dev/cuda/attention_ring.cuh): for cp 2 and 4, every simulated
// rank runs its pairs and merges them; out and exp(lse) gathered from the ranks are checked as
// above against the CPU reference of the whole sequence. Timed (GPU): all ranks' pairs and merges
// against attention_forward of the whole sequence, the same FLOPs.
// Counted: 4 B NH T^2 HS / 2 FLOPs (Q K^T and P V over the causal half), against the bf16 peak.
// Emulated (dev/emu/), the GPT-2 124M shape is skipped (bench::skip_when_emulated); the small
// shapes still reach the partial tiles, a single key and every head size.
#include "dev/cuda/attention_ring.cuh"
#include "dev/cuda/common.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/cpu/llama_ops.h"
#include "llmc/cpu/ops.h"

using llmc::floatX;

// ---- v1: one warp per query row ----

// Rows are numbered like lse, (b, h, t) with t fastest; each lane holds HS/32 columns of q and out.
__global__ void attention_forward_v1_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH,
                                            int KVH, int HS) {
    constexpr int MAX_PER_LANE = 4;  // HS <= 128
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    const int lane = threadIdx.x % 32, per_lane = HS / 32;
    const int t = (int)(row % T), h = (int)(row / T % NH);
    const size_t b = row / T / NH;
    const int C = NH * HS;
    const size_t ld = (size_t)(NH + 2 * KVH) * HS;
    const floatX* head = qkv + b * T * ld + h * HS;  // q of position 0 of this head
    const floatX* k_head = qkv + b * T * ld + (NH + h / (NH / KVH)) * HS;  // its kv head's k, then v
    const float scale = 1.0f / sqrtf((float)HS);

    float q[MAX_PER_LANE], o[MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; i++) {
        q[i] = i < per_lane ? (float)head[t * ld + lane + 32 * i] : 0.0f;
        o[i] = 0.0f;
    }
    float running_max = -INFINITY, running_sum = 0.0f;
    for (int j = 0; j <= t; j++) {
        const floatX* k = k_head + j * ld;
        const floatX* v = k + KVH * HS;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; i++)
            if (i < per_lane) dot += q[i] * (float)k[lane + 32 * i];
        const float s = llmc::warp_reduce_sum(dot) * scale;
        const float new_max = fmaxf(running_max, s);
        const float rescale = expf(running_max - new_max), p = expf(s - new_max);
        running_sum = running_sum * rescale + p;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; i++)
            if (i < per_lane) o[i] = o[i] * rescale + p * (float)v[lane + 32 * i];
        running_max = new_max;
    }
    floatX* o_row = out + (b * T + t) * C + h * HS;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; i++)
        if (i < per_lane) o_row[lane + 32 * i] = (floatX)(o[i] / running_sum);
    if (lane == 0) lse[row] = running_max + logf(running_sum);
}

void attention_forward_v1(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, int HS,
                          cudaStream_t stream) {
    if (HS % 32 != 0 || HS > 128)
        llmc::fail(llmc::strformat("attention_forward_v1: head size %d must be a multiple of 32, at most 128", HS));
    constexpr int THREADS = 256, ROWS_PER_BLOCK = THREADS / 32;
    const size_t rows = (size_t)B * NH * T;
    LLMC_LAUNCH(attention_forward_v1_kernel, (unsigned)llmc::ceil_div(rows, (size_t)ROWS_PER_BLOCK), THREADS, 0, stream)(
        out, lse, qkv, B, T, NH, KVH, HS);
    CUDA_CHECK_LAUNCH();
}

// ---- the workbench ----

constexpr int NUM_VERSIONS = 6;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {
    "", "one warp per query row, scalar online softmax", "llmc/attention.cuh: FlashAttention-2 on bf16 tensor cores",
    "llmc/attention_hopper.cuh: warpgroup products (wgmma), tiles of 128 keys",
    "llmc/attention_hopper.cuh: warpgroup products (wgmma), tiles of 64 keys",
    "llmc/attention_hopper_tma.cuh: wgmma, a producer warpgroup's TMA copies (warp specialization)",
    "llmc/attention_hopper_tma.cuh: version 5 with a ring of 3 stages"};
// The version llmc::attention_forward and the ring pairs run for each setting of its kernels.
constexpr int LLMC_WGMMA_VERSION = llmc::attention_detail::FORWARD_KEYS == 128 ? 3 : 4;

// The kernels llmc::attention_forward runs for each version (set_attention_kernels).
llmc::AttentionKernels kernels_of(int version) {
    return version >= 5 ? llmc::AttentionKernels::Tma
           : version >= 3 ? llmc::AttentionKernels::Wgmma
                          : llmc::AttentionKernels::MmaSync;
}
// Why version v cannot run this head size here, or null.
const char* unavailable(int version, int HS) {
    if (version < 3) return nullptr;
    if (HS != 64) return "head size 64 only";
    if (!llmc::device_has_wgmma()) return "not an sm_90 device";
    return nullptr;
}

// The versions llmc::attention_forward runs (2, LLMC_WGMMA_VERSION, 5) run through it; the others
// are launched directly.
void run_version(int version, floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, int HS) {
    namespace d = llmc::attention_detail;
    llmc::set_attention_kernels(kernels_of(version));
    const llmc::AttentionRows rows{T, T, T};
    const llmc::AttentionHeads heads{NH, KVH};
    if (version == 1) attention_forward_v1(out, lse, qkv, B, T, NH, KVH, HS, 0);
    else if (version == 3 && version != LLMC_WGMMA_VERSION)
        d::attention_forward_wgmma_launch<true, 128>(out, lse, qkv, qkv, B, rows, heads, 0, nullptr);
    else if (version == 4 && version != LLMC_WGMMA_VERSION)
        d::attention_forward_wgmma_launch<true, 64>(out, lse, qkv, qkv, B, rows, heads, 0, nullptr);
    else if (version == 6) d::attention_forward_tma_launch<true, 3>(out, lse, qkv, qkv, B, rows, heads, 0, nullptr);
    else llmc::attention_forward(out, lse, qkv, B, T, NH, KVH, HS, 0);
}

// exp(lse) of every (b, h, t) row, in double from the same bf16-exact inputs.
std::vector<float> reference_softmax_denominators(const std::vector<float>& qkv, int B, int T, int NH, int KVH,
                                                  int HS) {
    const size_t ld = (size_t)(NH + 2 * KVH) * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    std::vector<float> out((size_t)B * NH * T);
#pragma omp parallel for schedule(dynamic, 16)
    for (long long row = 0; row < (long long)out.size(); row++) {
        const int t = (int)(row % T), h = (int)(row / T % NH);
        const size_t b = (size_t)(row / T / NH);
        const float* q = qkv.data() + (b * T + t) * ld + h * HS;
        std::vector<double> s(t + 1);
        double max_s = -INFINITY;
        for (int j = 0; j <= t; j++) {
            const float* k = qkv.data() + (b * T + j) * ld + (NH + h / (NH / KVH)) * HS;
            double dot = 0.0;
            for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
            s[j] = dot * scale;
            max_s = std::max(max_s, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; j++) sum += std::exp(s[j] - max_s);
        out[row] = (float)std::exp(max_s + std::log(sum));
    }
    return out;
}

// max over rows of |exp(lse) - denominator| / denominator; +inf if lse holds a NaN or inf.
void check_denominators(const std::vector<float>& lse, const std::vector<float>& denom_ref, double tolerance) {
    double worst = 0.0;
    for (size_t i = 0; i < lse.size(); i++) {
        if (!std::isfinite(lse[i])) {
            worst = INFINITY;
            break;
        }
        worst = std::max(worst, std::fabs(std::exp((double)lse[i]) - denom_ref[i]) / denom_ref[i]);
    }
    bench::report_check("exp(lse), each row", worst < tolerance,
                        llmc::strformat("max rel. error %.3e (limit %.0e)", worst, tolerance));
}

// KVH < NH: grouped-query attention (each kv head read by NH / KVH query heads).
struct Shape {
    int B, T, NH, KVH, HS;
    bool check;  // false: too large for the CPU reference, timed only
};

void run_shape(const Shape& s, const bench::Options& opt, std::mt19937_64& rng) {
    const int C = s.NH * s.HS;
    const size_t qkv_n = (size_t)s.B * s.T * (s.NH + 2 * s.KVH) * s.HS, out_n = (size_t)s.B * s.T * C;
    const size_t lse_n = (size_t)s.B * s.NH * s.T;
    const double flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
    printf("B=%d T=%d NH=%d KVH=%d HS=%d%s\n", s.B, s.T, s.NH, s.KVH, s.HS, s.check ? "" : " (timed only)");
    if (bench::skip_when_emulated("B NH T^2 HS", (double)s.B * s.NH * s.T * s.T * s.HS)) return;

    const std::vector<float> qkv = bench::random_bf16(qkv_n, rng);
    std::vector<float> out_ref, denom_ref;
    if (s.check) {
        out_ref.resize(out_n);
        std::vector<float> att((size_t)s.B * s.NH * s.T * s.T);
        llmc::cpu::gqa_attention_forward(out_ref.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
        denom_ref = reference_softmax_denominators(qkv, s.B, s.T, s.NH, s.KVH, s.HS);
    }
    bench::DeviceBuffer<floatX> qkv_d = bench::to_device_bf16(qkv);
    bench::DeviceBuffer<floatX> out_d(out_n, "out"), out2_d(out_n, "out (second run)");
    bench::DeviceBuffer<float> lse_d(lse_n, "lse"), lse2_d(lse_n, "lse (second run)");

    std::vector<float> out_v3, lse_v3;
    for (int v = 1; v <= NUM_VERSIONS; v++) {
        if (!opt.runs(v)) continue;
        printf(" version %d: %s\n", v, VERSION_NAMES[v]);
        if (const char* why = unavailable(v, s.HS)) {
            printf("  skipped: %s\n", why);
            continue;
        }
        bench::poison(out_d.get(), out_n);
        bench::poison(lse_d.get(), lse_n);
        run_version(v, out_d.get(), lse_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> out = bench::to_host(out_d.get(), out_n), lse = bench::to_host(lse_d.get(), lse_n);
        if (s.check) {
            bench::check("out", out, out_ref, bench::BF16_TOLERANCE);
            check_denominators(lse, denom_ref, 1e-4);
        }
        // v5 and v6 run v3's arithmetic on the same tiles, fed another way: the same bits
        if (v == 3) out_v3 = out, lse_v3 = lse;
        if (v >= 5 && !out_v3.empty()) {
            bench::check_same_bits("out, as version 3's", out, out_v3);
            bench::check_same_bits("lse, as version 3's", lse, lse_v3);
        }
        if (v >= 2) {
            bench::poison(out2_d.get(), out_n);
            bench::poison(lse2_d.get(), lse_n);
            run_version(v, out2_d.get(), lse2_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS);
            CUDA_CHECK(cudaDeviceSynchronize());
            // The widened copies compare the bf16 bits of out: widening keeps every bit.
            bench::check_same_bits("out, run twice", bench::to_host(out2_d.get(), out_n), out);
            bench::check_same_bits("lse, run twice", bench::to_host(lse2_d.get(), lse_n), lse);
            // the public entry points run this version's kernel: the pair and the amax paths too
            if (v == 2 || v == LLMC_WGMMA_VERSION || v == 5) {
                bench::poison(out2_d.get(), out_n);
                bench::poison(lse2_d.get(), lse_n);
                llmc::attention_forward_pair(out2_d.get(), lse2_d.get(), qkv_d.get(), qkv_d.get(), s.B,
                                             llmc::AttentionRows{s.T, s.T, s.T}, true, s.NH, s.KVH, s.HS, 0);
                CUDA_CHECK(cudaDeviceSynchronize());
                bench::check_same_bits("out, as one causal pair", bench::to_host(out2_d.get(), out_n), out);
                bench::check_same_bits("lse, as one causal pair", bench::to_host(lse2_d.get(), lse_n), lse);
                // FP8's current scaling: given `amax`, the same out, and its largest |value| measured
                bench::check_amax("out", out, [&](float* amax) {
                    bench::poison(out2_d.get(), out_n);
                    llmc::attention_forward(out2_d.get(), lse2_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0,
                                            amax);
                    return bench::to_host(out2_d.get(), out_n);
                });
            }
        }
        if (!opt.check_only) {
            const float ms = bench::time_ms(
                [&] { run_version(v, out_d.get(), lse_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS); });
            bench::report_compute_bound("forward", ms, flops);
        }
    }
}

// ---- context parallelism: the ring's pairs ----

void run_ring(const ring::Shape& s, int version, const bench::Options& opt, std::mt19937_64& rng) {
    const ring::Split split(s.cp, s.T);
    const int C = s.NH * s.HS, width = (s.NH + 2 * s.KVH) * s.HS;
    const size_t local_n = (size_t)s.B * split.local_rows() * C, lse_local_n = (size_t)s.B * s.NH * split.local_rows();
    printf("ring cp=%d: B=%d T=%d NH=%d KVH=%d HS=%d, chunks of %d rows, version %d\n", s.cp, s.B, s.T, s.NH, s.KVH,
           s.HS, split.S, version);
    if (const char* why = unavailable(version, s.HS)) {
        printf("  skipped: %s\n", why);
        return;
    }
    llmc::set_attention_kernels(kernels_of(version));
    if (bench::skip_when_emulated("B NH T^2 HS", (double)s.B * s.NH * s.T * s.T * s.HS)) return;

    const std::vector<float> qkv = bench::random_bf16((size_t)s.B * s.T * width, rng);
    std::vector<float> out_ref((size_t)s.B * s.T * C), att((size_t)s.B * s.NH * s.T * s.T);
    llmc::cpu::gqa_attention_forward(out_ref.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    const std::vector<float> denom_ref = reference_softmax_denominators(qkv, s.B, s.T, s.NH, s.KVH, s.HS);

    const ring::PerRank<floatX> qkv_d = ring::scatter_bf16(qkv, s.B, width, split);
    ring::PerRank<floatX> out_d = ring::allocate<floatX>(split, local_n, "ring out");
    ring::PerRank<float> lse_d = ring::allocate<float>(split, lse_local_n, "ring lse");
    for (int r = 0; r < s.cp; r++) {
        bench::poison(out_d[r].get(), local_n);
        bench::poison(lse_d[r].get(), lse_local_n);
    }
    ring::Forward forward(split, s.B, s.NH, s.KVH, s.HS);
    forward.run(out_d, lse_d, qkv_d);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check("ring out", ring::gather(out_d, s.B, C, split), out_ref, bench::BF16_TOLERANCE);
    check_denominators(ring::gather(lse_d, (size_t)s.B * s.NH, 1, split), denom_ref, 1e-4);

    if (!opt.check_only) {
        const double flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        bench::DeviceBuffer<floatX> qkv_whole = bench::to_device_bf16(qkv), out_whole(out_ref.size(), "out");
        bench::DeviceBuffer<float> lse_whole((size_t)s.B * s.NH * s.T, "lse");
        const float plain_ms = bench::time_ms([&] {
            llmc::attention_forward(out_whole.get(), lse_whole.get(), qkv_whole.get(), s.B, s.T, s.NH, s.KVH, s.HS,
                                    0);
        });
        bench::report_compute_bound("forward, whole sequence", plain_ms, flops);
        const float ring_ms = bench::time_ms([&] { forward.run(out_d, lse_d, qkv_d); });
        bench::report_compute_bound("ring, all ranks' pairs", ring_ms, flops);
    }
}

// ---- --tune: versions 2-6 timed on this card, the fastest per T written as attention_table.h ----

const char* const TABLE_HEAD = R"(// attention_table.h: the attention forward kernel measured fastest, per card and T
// (attention_tuning.h reads it when the kernels are left to choose: set_attention_kernels(Auto)).
//
// Written by the attention workbench on the card itself, in one run:
//   dev/cuda/build/attention_forward --tune llmc/kernels/attention_table.h
// (dev/bench/gpu_session.sh's `kernels` stage runs it and brings the file back.) It times every
// forward kernel of head size 64 at the T it lists, B x T = 8192 tokens of 12 heads, after checking
// each against version 2's output (itself checked against the CPU reference by --check). `version`
// is the workbench's: 2 mma.sync, 3 and 4 wgmma with tiles of 128 and 64 keys, 5 and 6 wgmma fed
// by TMA through 2 and 3 stages.
#pragma once

namespace llmc {

struct AttentionTuned {
    const char* device;  // cudaDeviceProp::name
    int T;
    int version;
};

)";

void tune(const std::string& path, std::mt19937_64& rng) {
    const bench::DeviceCeilings card = bench::device_ceilings();
    constexpr int TOKENS = 8192, NH = 12, HS = 64, C = NH * HS;
    std::string rows;
    for (int T : {1024, 2048, 4096}) {
        const int B = TOKENS / T;
        if (bench::skip_when_emulated("B NH T^2 HS", (double)B * NH * T * T * HS)) continue;
        const size_t out_n = (size_t)B * T * C, lse_n = (size_t)B * NH * T;
        const std::vector<float> qkv = bench::random_bf16(3 * out_n, rng);
        bench::DeviceBuffer<floatX> qkv_d = bench::to_device_bf16(qkv);
        bench::DeviceBuffer<floatX> out_d(out_n, "out");
        bench::DeviceBuffer<float> lse_d(lse_n, "lse");
        printf(" T %d (B %d, %d heads of %d)\n", T, B, NH, HS);
        std::vector<float> out_v2;
        int best = 2;
        float best_ms = 0;
        std::string times;
        for (int v = 2; v <= NUM_VERSIONS; v++) {
            if (unavailable(v, HS)) continue;
            auto run = [&] { run_version(v, out_d.get(), lse_d.get(), qkv_d.get(), B, T, NH, NH, HS); };
            run();
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> out = bench::to_host(out_d.get(), out_n);
            if (v == 2) out_v2 = out;
            else if (!bench::check(llmc::strformat("version %d against 2", v).c_str(), out, out_v2,
                                   bench::BF16_TOLERANCE))
                continue;
            const float ms = bench::time_ms(run, 10);
            bench::report_compute_bound(llmc::strformat("forward, version %d", v).c_str(), ms,
                                        2.0 * B * NH * (double)T * T * HS);
            times += llmc::strformat(" v%d %.3f", v, ms);
            if (v == 2 || ms < best_ms) best = v, best_ms = ms;
        }
        rows += llmc::strformat("    {\"%s\", %d, %d},  // ms:%s\n", card.name, T, best, times.c_str());
    }
    llmc::set_attention_kernels(llmc::AttentionKernels::MmaSync);
    bench::write_tuned_table(path, std::string(TABLE_HEAD) + "inline constexpr AttentionTuned ATTENTION_TUNED[] = {\n" +
                                       (rows.empty() ? "    {\"\", 0, 3},  // (no length was tuned)\n" : rows) +
                                       "};\n\n}  // namespace llmc\n");
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, NUM_VERSIONS, /*tunable=*/true);
    std::mt19937_64 rng(opt.seed);
    if (!opt.tune_path.empty()) return bench::run_and_finish(argv[0], [&] { tune(opt.tune_path, rng); });
    const Shape shapes[] = {
        {2, 17, 3, 1, 64, true},      // one partial tile; 3 query heads on one kv head
        {1, 1, 1, 1, 64, true},       // a single key
        {2, 130, 2, 1, 32, true},     // partial tiles, the other head sizes (grouped, then not)
        {2, 130, 2, 2, 128, true},
        {1, 259, 2, 2, 64, true},     // several tiles, a partial last one
        {1, 200, 4, 2, 64, true},     // several tiles in two groups of two
        {8, 1024, 12, 12, 64, true},  // GPT-2 124M
        {8, 1024, 12, 3, 64, true},   // its shape as a Llama (3 kv heads)
        {2, 4096, 12, 12, 64, false},
    };
    return bench::run_and_finish(argv[0], [&] {
        for (const Shape& s : shapes) {
            if (opt.check_only && !s.check) continue;
            run_shape(s, opt, rng);
        }
        // the ring's pairs run what attention_forward_pair runs: version 2, the wgmma kernel's shape or
        // the TMA-fed one
        for (int v : {2, LLMC_WGMMA_VERSION, 5})
            if (opt.runs(v))
                for (const ring::Shape& s : ring::SHAPES) run_ring(s, v, opt, rng);
    });
}
