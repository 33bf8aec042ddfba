// attention_backward.cu: workbench for llmc::attention_backward, the causal self-attention backward
// from the forward's out and lse, deterministic (no atomics), writing all of dqkv.
//
//   v1  scalar, one warp per row: D = rowsum(dout * out); then per query row dq = sum_j dS_tj k_j
//       over its keys, and per key row dk, dv summed over the queries that see it. Each warp owns
//       the row it writes, so it is deterministic too; slow (a warp-wide reduction per pair).
//   v2  llmc/attention.cuh: the same three steps as FlashAttention-2 tiles on bf16 tensor cores.
//   v3  llmc/attention_hopper.cuh: v2's kernels on Hopper's warpgroup products (wgmma), head size 64
//       on an sm_90 device (the emulator is one); other head sizes and devices skip it.
//   v4  llmc/attention_hopper_tma.cuh: v3's kernels with a producer warpgroup copying the tiles
//       with TMA through two stages and mbarriers (set_attention_kernels(Tma)).
//
// The backward's inputs out and lse come from llmc::attention_forward on the GPU, as in training;
// out is checked too (so a forward fault is not blamed on the backward). Checks, per shape, on the
// same bf16-exact inputs for every version:
//   dqkv  against llmc::cpu::attention_backward (from the CPU forward's probabilities), as one
//         tensor, BF16_TOLERANCE: it is stored in bf16, and v2 rounds P and dS to bf16 for the mma.
//         (dq and dk alone can be exactly zero in the reference, e.g. T = 1, where a relative error
//         has no meaning.)
//   determinism: v2-v4 run twice, dqkv bitwise equal; v4 gives v3's dqkv bitwise.
//   the ring-pair entry point: attention_backward_pair over the whole sequence (one causal pair, fp32
//         sums from zero) and attention_backward_pair_finish give attention_backward's dqkv, value for
//         value (the same kernel instances but for the store; a sum from +0 may turn -0 into +0).
// Ring checks (context parallelism, dev/cuda/attention_ring.cuh): for cp 2 and 4, the forward ring's
// out and lse, then every simulated rank's backward pairs, dq summed on the rank and dk, dv on the
// key chunk's owner in fp32; dqkv gathered from the ranks against llmc::cpu::attention_backward of
// the whole sequence, BF16_TOLERANCE. An info line gives the same with the sums rounded to bf16
// after every pair, the precision fp32 sums buy. Timed (GPU): all ranks' pairs against
// attention_backward of the whole sequence.
// Counted: the backward as 2.5x the forward's 4 B NH T^2 HS / 2 FLOPs (the usual convention: dV, dP,
// dQ, dK products plus S recomputed). v2 actually does 3.5x: S and dP are computed in both its
// kernels, the price of having no atomics.
// For each timed shape of GPT-2 size it also prints one line "fwd+bwd ms B= T= NH= HS=: <ms>" for
// llmc's forward plus backward with the version's kernels (dev/bench/attention_vs_sdpa.py runs
// versions 2 and 3 and reads it to compare with torch).
// Emulated (dev/emu/), the GPT-2 124M shape is skipped (bench::skip_when_emulated); the small
// shapes still reach the partial tiles, a single key and every head size.
#include "dev/cuda/attention_ring.cuh"
#include "dev/cuda/common.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/cpu/llama_ops.h"
#include "llmc/cpu/ops.h"

using llmc::floatX;

// ---- v1: one warp per row ----
// Rows are numbered like lse, (b, h, t) with t fastest; each lane holds HS/32 columns.

constexpr int V1_MAX_PER_LANE = 4;  // HS <= 128

struct RowIndex {
    size_t b;
    int h, t;
};
__device__ inline RowIndex row_index(size_t row, int T, int NH) {
    return {row / T / NH, (int)(row / T % NH), (int)(row % T)};
}

__global__ void attention_backward_v1_rowdot_kernel(float* D, const floatX* dout, const floatX* out, int B, int T,
                                                    int NH, int HS) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    const int lane = threadIdx.x % 32;
    const RowIndex r = row_index(row, T, NH);
    const size_t offset = (r.b * T + r.t) * NH * HS + r.h * HS;
    float sum = 0.0f;
    for (int d = lane; d < HS; d += 32) sum += (float)dout[offset + d] * (float)out[offset + d];
    sum = llmc::warp_reduce_sum(sum);
    if (lane == 0) D[row] = sum;
}

// dq of query row t: scale * sum over keys j <= t of P_tj (dP_tj - D_t) k_j.
__global__ void attention_backward_v1_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                                const float* lse, const float* D, int B, int T, int NH, int HS) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    const int lane = threadIdx.x % 32, per_lane = HS / 32;
    const RowIndex r = row_index(row, T, NH);
    const int C = NH * HS;
    const size_t ld = 3 * (size_t)C;
    const floatX* head = qkv + r.b * T * ld + r.h * HS;
    const floatX* dO = dout + (r.b * T + r.t) * C + r.h * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    const float row_lse = lse[row], row_d = D[row];

    float q[V1_MAX_PER_LANE], g[V1_MAX_PER_LANE], dq[V1_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < V1_MAX_PER_LANE; i++) {
        q[i] = i < per_lane ? (float)head[r.t * ld + lane + 32 * i] : 0.0f;
        g[i] = i < per_lane ? (float)dO[lane + 32 * i] : 0.0f;
        dq[i] = 0.0f;
    }
    for (int j = 0; j <= r.t; j++) {
        const floatX* k = head + j * ld + C;
        const floatX* v = k + C;
        float qk = 0.0f, gv = 0.0f;
#pragma unroll
        for (int i = 0; i < V1_MAX_PER_LANE; i++) {
            if (i < per_lane) {
                qk += q[i] * (float)k[lane + 32 * i];
                gv += g[i] * (float)v[lane + 32 * i];
            }
        }
        const float p = expf(llmc::warp_reduce_sum(qk) * scale - row_lse);
        const float ds = p * (llmc::warp_reduce_sum(gv) - row_d);
#pragma unroll
        for (int i = 0; i < V1_MAX_PER_LANE; i++)
            if (i < per_lane) dq[i] += ds * (float)k[lane + 32 * i];
    }
    floatX* dq_row = dqkv + (r.b * T + r.t) * ld + r.h * HS;
#pragma unroll
    for (int i = 0; i < V1_MAX_PER_LANE; i++)
        if (i < per_lane) dq_row[lane + 32 * i] = (floatX)(dq[i] * scale);
}

// dk, dv of key row j (the row's t): sums over queries t2 >= j of scale dS_t2j q_t2 and P_t2j dout_t2.
__global__ void attention_backward_v1_dkv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                                 const float* lse, const float* D, int B, int T, int NH, int HS) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    const int lane = threadIdx.x % 32, per_lane = HS / 32;
    const RowIndex r = row_index(row, T, NH);
    const int C = NH * HS;
    const size_t ld = 3 * (size_t)C;
    const floatX* head = qkv + r.b * T * ld + r.h * HS;
    const float* head_lse = lse + (row - r.t);  // this (b, h)'s rows
    const float* head_d = D + (row - r.t);
    const float scale = 1.0f / sqrtf((float)HS);

    float k[V1_MAX_PER_LANE], v[V1_MAX_PER_LANE], dk[V1_MAX_PER_LANE], dv[V1_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < V1_MAX_PER_LANE; i++) {
        k[i] = i < per_lane ? (float)head[r.t * ld + C + lane + 32 * i] : 0.0f;
        v[i] = i < per_lane ? (float)head[r.t * ld + 2 * C + lane + 32 * i] : 0.0f;
        dk[i] = dv[i] = 0.0f;
    }
    for (int t2 = r.t; t2 < T; t2++) {
        const floatX* q = head + t2 * ld;
        const floatX* dO = dout + (r.b * T + t2) * C + r.h * HS;
        float qk = 0.0f, gv = 0.0f;
#pragma unroll
        for (int i = 0; i < V1_MAX_PER_LANE; i++) {
            if (i < per_lane) {
                qk += (float)q[lane + 32 * i] * k[i];
                gv += (float)dO[lane + 32 * i] * v[i];
            }
        }
        const float p = expf(llmc::warp_reduce_sum(qk) * scale - head_lse[t2]);
        const float ds = p * (llmc::warp_reduce_sum(gv) - head_d[t2]);
#pragma unroll
        for (int i = 0; i < V1_MAX_PER_LANE; i++) {
            if (i < per_lane) {
                dv[i] += p * (float)dO[lane + 32 * i];
                dk[i] += ds * (float)q[lane + 32 * i];
            }
        }
    }
    floatX* dk_row = dqkv + (r.b * T + r.t) * ld + C + r.h * HS;
#pragma unroll
    for (int i = 0; i < V1_MAX_PER_LANE; i++) {
        if (i < per_lane) {
            dk_row[lane + 32 * i] = (floatX)(dk[i] * scale);
            dk_row[C + lane + 32 * i] = (floatX)dv[i];
        }
    }
}

void attention_backward_v1(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                           const float* lse, int B, int T, int NH, int HS, cudaStream_t stream) {
    if (HS % 32 != 0 || HS > 128)
        llmc::fail(llmc::strformat("attention_backward_v1: head size %d must be a multiple of 32, at most 128", HS));
    constexpr int THREADS = 256, ROWS_PER_BLOCK = THREADS / 32;
    const size_t rows = (size_t)B * NH * T;
    const unsigned blocks = (unsigned)llmc::ceil_div(rows, (size_t)ROWS_PER_BLOCK);
    LLMC_LAUNCH(attention_backward_v1_rowdot_kernel, blocks, THREADS, 0, stream)(scratch, dout, out, B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(attention_backward_v1_dq_kernel, blocks, THREADS, 0, stream)(dqkv, dout, qkv, lse, scratch, B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(attention_backward_v1_dkv_kernel, blocks, THREADS, 0, stream)(dqkv, dout, qkv, lse, scratch, B, T, NH, HS);
    CUDA_CHECK_LAUNCH();
}

// ---- the workbench ----

constexpr int NUM_VERSIONS = 4;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {
    "", "one warp per row, scalar", "llmc/attention.cuh: FlashAttention-2 tiles on bf16 tensor cores, no atomics",
    "llmc/attention_hopper.cuh: the same tiles on warpgroup products (wgmma)",
    "llmc/attention_hopper_tma.cuh: version 3 fed by a producer warpgroup's TMA copies"};

// Why version v cannot run this head size here, or null.
const char* unavailable(int version, int HS, int NH, int KVH) {
    if (version == 1 && KVH != NH) return "multi-head only (the CPU reference checks the grouped heads)";
    if (version < 3) return nullptr;
    if (HS != 64) return "head size 64 only";
    if (!llmc::device_has_wgmma()) return "not an sm_90 device";
    return nullptr;
}

// Versions 2-4 call llmc::attention_backward with its kernels set to mma.sync, wgmma or tma.
void select_kernels(int version) {
    llmc::set_attention_kernels(version == 4   ? llmc::AttentionKernels::Tma
                                : version == 3 ? llmc::AttentionKernels::Wgmma
                                               : llmc::AttentionKernels::MmaSync);
}

void run_version(int version, floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                 const float* lse, int B, int T, int NH, int KVH, int HS) {
    select_kernels(version);
    if (version == 1) attention_backward_v1(dqkv, scratch, dout, qkv, out, lse, B, T, NH, HS, 0);
    else llmc::attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, NH, KVH, HS, 0);
}

// KVH < NH: grouped-query attention (each kv head's dk, dv summed over its NH / KVH query heads).
struct Shape {
    int B, T, NH, KVH, HS;
    bool check;      // false: too large for the CPU reference, timed only
    bool headline;   // print the "fwd+bwd ms" line compared with torch
};

// RoPE's backward fused into the stores (attention_backward's `rope`: a Llama's q and k are rotated
// ones): dqkv must be the reference's rotated back by cpu::rope_backward, and the fused amax that of
// what is stored.
void check_rope_path(const std::vector<float>& dqkv_ref, floatX* dqkv, float* scratch, const floatX* dout,
                     const floatX* qkv, const floatX* out, const float* lse, const Shape& s) {
    constexpr float THETA = 10000.0f;  // angles up to T radians at i = 0, a full turn within 7 positions
    const size_t n = dqkv_ref.size();
    std::vector<float> rotated = dqkv_ref;
    llmc::cpu::rope_backward(rotated.data(), s.B, s.T, s.NH, s.KVH, s.HS, THETA);
    bench::DeviceBuffer<float> table((size_t)s.T * s.HS, "rope table");
    llmc::rope_table(table.get(), s.T, s.HS, THETA, nullptr, 0);
    auto run = [&](float* amax) {
        bench::poison(dqkv, n);
        llmc::attention_backward(dqkv, scratch, dout, qkv, out, lse, s.B, s.T, s.NH, s.KVH, s.HS, 0, amax,
                                 table.get());
        return bench::to_host(dqkv, n);
    };
    const std::vector<float> got = run(nullptr);
    bench::check("dqkv with RoPE's backward", got, rotated, bench::BF16_TOLERANCE);
    bench::check_amax("dqkv with RoPE's backward", got, run);
}

// attention_backward_pair over the whole sequence as one causal pair must give `dqkv`, the whole-
// sequence call's, value for value.
void check_pair_path(const std::vector<float>& dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                     const float* lse, const Shape& s) {
    const size_t C = (size_t)s.NH * s.HS, KV = 2 * (size_t)s.KVH * s.HS, rows = (size_t)s.B * s.T;
    bench::DeviceBuffer<float> D(llmc::attention_backward_scratch_floats(s.B, s.T, s.NH), "D");
    bench::DeviceBuffer<float> dq(rows * C, "dq (fp32)"), dkv(rows * KV, "dk, dv (fp32)");
    bench::DeviceBuffer<floatX> pair_dqkv(rows * (C + KV), "dqkv (pair)");
    CUDA_CHECK(cudaMemset(dq.get(), 0, rows * C * sizeof(float)));
    CUDA_CHECK(cudaMemset(dkv.get(), 0, rows * KV * sizeof(float)));
    bench::poison(pair_dqkv.get(), rows * (C + KV));
    llmc::attention_backward_rowdot(D.get(), dout, out, s.B, s.T, s.NH, s.HS, 0);
    llmc::attention_backward_pair(dq.get(), dkv.get(), dout, qkv, qkv, lse, D.get(), s.B,
                                  llmc::AttentionRows{s.T, s.T, s.T}, true, s.NH, s.KVH, s.HS, 0);
    llmc::attention_backward_pair_finish(pair_dqkv.get(), dq.get(), dkv.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = bench::to_host(pair_dqkv.get(), rows * (C + KV));
    size_t different = 0;
    for (size_t i = 0; i < got.size(); i++) different += !(got[i] == dqkv[i]);  // NaN counts as different
    bench::report_check("dqkv, as one causal pair", different == 0,
                        different == 0 ? "equal values" : llmc::strformat("%zu of %zu values differ", different, got.size()));
}

void run_shape(const Shape& s, const bench::Options& opt, std::mt19937_64& rng) {
    const int C = s.NH * s.HS;
    const size_t qkv_n = (size_t)s.B * s.T * (s.NH + 2 * s.KVH) * s.HS, out_n = (size_t)s.B * s.T * C;
    const size_t lse_n = (size_t)s.B * s.NH * s.T;
    const size_t scratch_n = llmc::attention_backward_scratch_floats(s.B, s.T, s.NH);
    const double forward_flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
    printf("B=%d T=%d NH=%d KVH=%d HS=%d%s\n", s.B, s.T, s.NH, s.KVH, s.HS, s.check ? "" : " (timed only)");
    if (bench::skip_when_emulated("B NH T^2 HS", (double)s.B * s.NH * s.T * s.T * s.HS)) return;

    const std::vector<float> qkv = bench::random_bf16(qkv_n, rng), dout = bench::random_bf16(out_n, rng);
    bench::DeviceBuffer<floatX> qkv_d = bench::to_device_bf16(qkv), dout_d = bench::to_device_bf16(dout);
    bench::DeviceBuffer<floatX> out_d(out_n, "out"), dqkv_d(qkv_n, "dqkv"), dqkv2_d(qkv_n, "dqkv (second run)");
    bench::DeviceBuffer<float> lse_d(lse_n, "lse"), scratch_d(scratch_n, "scratch");
    select_kernels(2);
    llmc::attention_forward(out_d.get(), lse_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<float> dqkv_ref;
    if (s.check) {
        std::vector<float> out_ref(out_n), att((size_t)s.B * s.NH * s.T * s.T);
        llmc::cpu::gqa_attention_forward(out_ref.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
        bench::check("forward out (backward input)", bench::to_host(out_d.get(), out_n), out_ref,
                     bench::BF16_TOLERANCE);
        dqkv_ref.resize(qkv_n);
        llmc::cpu::gqa_attention_backward(dqkv_ref.data(), dout.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                                          s.HS);
    }

    std::vector<float> dqkv_v3;
    for (int v = 1; v <= NUM_VERSIONS; v++) {
        if (!opt.runs(v)) continue;
        printf(" version %d: %s\n", v, VERSION_NAMES[v]);
        if (const char* why = unavailable(v, s.HS, s.NH, s.KVH)) {
            printf("  skipped: %s\n", why);
            continue;
        }
        bench::poison(dqkv_d.get(), qkv_n);
        bench::poison(scratch_d.get(), scratch_n);
        run_version(v, dqkv_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out_d.get(), lse_d.get(), s.B, s.T,
                    s.NH, s.KVH, s.HS);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> dqkv = bench::to_host(dqkv_d.get(), qkv_n);
        if (s.check) bench::check("dqkv", dqkv, dqkv_ref, bench::BF16_TOLERANCE);
        // v4 runs v3's arithmetic on the same tiles, fed another way: the same bits
        if (v == 3) dqkv_v3 = dqkv;
        if (v == 4 && !dqkv_v3.empty()) bench::check_same_bits("dqkv, as version 3's", dqkv, dqkv_v3);
        if (v >= 2) {
            bench::poison(dqkv2_d.get(), qkv_n);
            bench::poison(scratch_d.get(), scratch_n);
            run_version(v, dqkv2_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out_d.get(), lse_d.get(), s.B,
                        s.T, s.NH, s.KVH, s.HS);
            CUDA_CHECK(cudaDeviceSynchronize());
            // The widened copies compare the bf16 bits: widening keeps every bit.
            bench::check_same_bits("dqkv, run twice", bench::to_host(dqkv2_d.get(), qkv_n), dqkv);
            // FP8's current scaling: given `amax`, the same dqkv, and its largest |value| measured
            // (dq by one kernel, dk and dv by the other)
            bench::check_amax("dqkv", dqkv, [&](float* amax) {
                bench::poison(dqkv2_d.get(), qkv_n);
                llmc::attention_backward(dqkv2_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out_d.get(),
                                         lse_d.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0, amax);
                return bench::to_host(dqkv2_d.get(), qkv_n);
            });
            check_pair_path(dqkv, dout_d.get(), qkv_d.get(), out_d.get(), lse_d.get(), s);
            if (s.check)
                check_rope_path(dqkv_ref, dqkv2_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out_d.get(),
                                lse_d.get(), s);
        }
        if (!opt.check_only) {
            const float ms = bench::time_ms([&] {
                run_version(v, dqkv_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out_d.get(), lse_d.get(),
                            s.B, s.T, s.NH, s.KVH, s.HS);
            });
            bench::report_compute_bound("backward", ms, 2.5 * forward_flops);
            if (v >= 2 && s.headline) {
                // into buffers of its own: the versions after this one read out_d and lse_d as version
                // 2's forward wrote them (a version's forward differs in its last bits)
                bench::DeviceBuffer<floatX> out2_d(out_n, "out (timed)");
                bench::DeviceBuffer<float> lse2_d(lse_n, "lse (timed)");
                const float both_ms = bench::time_ms([&] {
                    llmc::attention_forward(out2_d.get(), lse2_d.get(), qkv_d.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
                    llmc::attention_backward(dqkv_d.get(), scratch_d.get(), dout_d.get(), qkv_d.get(), out2_d.get(),
                                             lse2_d.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
                });
                if (s.KVH == s.NH) printf("fwd+bwd ms B=%d T=%d NH=%d HS=%d: %.4f\n", s.B, s.T, s.NH, s.HS, both_ms);
                else printf("fwd+bwd ms B=%d T=%d NH=%d KVH=%d HS=%d: %.4f\n", s.B, s.T, s.NH, s.KVH, s.HS, both_ms);
            }
        }
    }
}

// ---- context parallelism: the ring's pairs ----

void run_ring(const ring::Shape& s, int version, const bench::Options& opt, std::mt19937_64& rng) {
    const ring::Split split(s.cp, s.T);
    const int C = s.NH * s.HS, width = (s.NH + 2 * s.KVH) * s.HS;
    const size_t local_rows = (size_t)s.B * split.local_rows(), lse_local_n = (size_t)s.B * s.NH * split.local_rows();
    printf("ring cp=%d: B=%d T=%d NH=%d KVH=%d HS=%d, chunks of %d rows, version %d\n", s.cp, s.B, s.T, s.NH, s.KVH,
           s.HS, split.S, version);
    if (const char* why = unavailable(version, s.HS, s.NH, s.KVH)) {
        printf("  skipped: %s\n", why);
        return;
    }
    select_kernels(version);
    if (bench::skip_when_emulated("B NH T^2 HS", (double)s.B * s.NH * s.T * s.T * s.HS)) return;

    const size_t qkv_n = (size_t)s.B * s.T * width, out_n = (size_t)s.B * s.T * C;
    const std::vector<float> qkv = bench::random_bf16(qkv_n, rng), dout = bench::random_bf16(out_n, rng);
    std::vector<float> out_ref(out_n), att((size_t)s.B * s.NH * s.T * s.T), dqkv_ref(qkv_n);
    llmc::cpu::gqa_attention_forward(out_ref.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    llmc::cpu::gqa_attention_backward(dqkv_ref.data(), dout.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                                      s.HS);

    const ring::PerRank<floatX> qkv_d = ring::scatter_bf16(qkv, s.B, width, split);
    const ring::PerRank<floatX> dout_d = ring::scatter_bf16(dout, s.B, C, split);
    ring::PerRank<floatX> out_d = ring::allocate<floatX>(split, local_rows * C, "ring out");
    ring::PerRank<float> lse_d = ring::allocate<float>(split, lse_local_n, "ring lse");
    ring::PerRank<floatX> dqkv_d = ring::allocate<floatX>(split, local_rows * width, "ring dqkv");
    ring::Forward forward(split, s.B, s.NH, s.KVH, s.HS);
    forward.run(out_d, lse_d, qkv_d);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check("ring out (backward input)", ring::gather(out_d, s.B, C, split), out_ref, bench::BF16_TOLERANCE);

    ring::Backward backward(split, s.B, s.NH, s.KVH, s.HS);
    for (int r = 0; r < s.cp; r++) bench::poison(dqkv_d[r].get(), local_rows * width);
    backward.run(dqkv_d, dout_d, qkv_d, out_d, lse_d);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> dqkv = ring::gather(dqkv_d, s.B, width, split);
    bench::check("ring dqkv", dqkv, dqkv_ref, bench::BF16_TOLERANCE);
    // the same ring, run again: its fp32 sums are in a fixed order
    for (int r = 0; r < s.cp; r++) bench::poison(dqkv_d[r].get(), local_rows * width);
    backward.run(dqkv_d, dout_d, qkv_d, out_d, lse_d);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check_same_bits("ring dqkv, run twice", ring::gather(dqkv_d, s.B, width, split), dqkv);

    if (opt.check_only) {
        // what bf16 sums would cost: measured, not checked (a host round trip per pair)
        backward.run(dqkv_d, dout_d, qkv_d, out_d, lse_d, /*round_to_bf16=*/true);
        CUDA_CHECK(cudaDeviceSynchronize());
        const double fp32_err = llmc::rel_error(dqkv.data(), dqkv_ref.data(), qkv_n);
        const std::vector<float> rounded = ring::gather(dqkv_d, s.B, width, split);
        printf("  info ring dqkv, bf16 sums        rel. error %.3e (fp32 sums: %.3e)\n",
               llmc::rel_error(rounded.data(), dqkv_ref.data(), qkv_n), fp32_err);
    } else {
        const double forward_flops = 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS;
        bench::DeviceBuffer<floatX> qkv_whole = bench::to_device_bf16(qkv), dout_whole = bench::to_device_bf16(dout);
        bench::DeviceBuffer<floatX> out_whole(out_n, "out"), dqkv_whole(qkv_n, "dqkv");
        bench::DeviceBuffer<float> lse_whole((size_t)s.B * s.NH * s.T, "lse"), scratch((size_t)s.B * s.NH * s.T, "D");
        llmc::attention_forward(out_whole.get(), lse_whole.get(), qkv_whole.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
        const float plain_ms = bench::time_ms([&] {
            llmc::attention_backward(dqkv_whole.get(), scratch.get(), dout_whole.get(), qkv_whole.get(),
                                     out_whole.get(), lse_whole.get(), s.B, s.T, s.NH, s.KVH, s.HS, 0);
        });
        bench::report_compute_bound("backward, whole sequence", plain_ms, 2.5 * forward_flops);
        const float ring_ms = bench::time_ms([&] { backward.run(dqkv_d, dout_d, qkv_d, out_d, lse_d); });
        bench::report_compute_bound("ring, all ranks' pairs", ring_ms, 2.5 * forward_flops);
    }
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, NUM_VERSIONS);
    std::mt19937_64 rng(opt.seed);
    const Shape shapes[] = {
        {2, 17, 3, 1, 64, true, false},      // one partial tile; 3 query heads on one kv head
        {1, 1, 1, 1, 64, true, false},       // a single key
        {2, 130, 2, 1, 32, true, false},     // partial tiles, the other head sizes (grouped, then not)
        {2, 130, 2, 2, 128, true, false},
        {1, 259, 2, 2, 64, true, false},     // several tiles, a partial last one
        {1, 200, 4, 2, 64, true, false},     // several tiles in two groups of two
        {8, 1024, 12, 12, 64, true, true},   // GPT-2 124M
        {8, 1024, 12, 3, 64, true, true},    // its shape as a Llama (3 kv heads)
        {2, 4096, 12, 12, 64, false, true},
    };
    return bench::run_and_finish(argv[0], [&] {
        for (const Shape& s : shapes) {
            if (opt.check_only && !s.check) continue;
            run_shape(s, opt, rng);
        }
        for (int v = 2; v <= NUM_VERSIONS; v++)
            if (opt.runs(v))
                for (const ring::Shape& s : ring::SHAPES) run_ring(s, v, opt, rng);
    });
}
