// dev/cuda/matmul.cu: the linear layer, out = inp W^T + bias [+ residual] with an optional fused
// GELU, and its backward (dinp, with an optional GELU backward; dweight += ; dbias +=), three ways:
//
//   1  a 16 x 16 shared-memory tiled kernel, one output per thread, fp32 accumulation in k order,
//      and a one-thread-per-column bias gradient: slow, obviously correct, the GPU reference
//   2  cuBLASLt plain products (the llmc launchers with no bias, residual or GELU), then separate
//      passes: bias + residual add, gelu.cuh's GELU kernels, llmc's two-stage bias gradient
//   3  llmc/matmul.cuh's fused epilogues: bias, GELU and residual in cuBLASLt's epilogues
//      (BIAS, GELU_AUX_BIAS, beta = 1), GELU backward in the DGELU epilogue; every weight gradient
//      one product over the whole of k
//   4  llmc/matmul.cuh as the model calls it: version 3 with the weight gradients' k cut into
//      slices where the output is small (split_k.h), the slices' fp32 partials added in order
//
//   ./matmul [version] [--check] [--seed N]
//   ./matmul --tune FILE    time every split of the presets' weight gradients, write the fastest
//                           per shape for this card as llmc/kernels/split_k_table.h to FILE
//
// Version 4's checks cut every weight gradient into CHECKED_SLICES (ragged: the last slice
// shorter), then check the split each shape gets by itself and several others on GPT-2 124M's
// attention projection (SPLIT_SHAPES), each against the CPU and run twice for the same bits.
//
// Checked against cpu::matmul_forward / matmul_backward / gelu_forward / gelu_backward on an odd
// small shape (BT 37, C 64, OC 200) and the GPT-2 124M fc shape (BT 8192, C 768, OC 3072), every
// epilogue combination forward and backward; versions 3 and 4 run each twice and must repeat their bits.
// Emulated (dev/emu/), the 124M shape is skipped (bench::skip_when_emulated) and BT 203, C 40,
// OC 264 checked instead (several partly filled blocks of the bias gradient and of version 1).
// Then pre-activations in [-4.5, -2.5] (W = 0, so pre_gelu = bias exactly), where the tanh and erf
// forms of GELU differ by many bf16 ulps: the distance of the output from each form is printed, not
// checked, since a tanh evaluated with tanh.approx.f32 errs there by as much as the two forms differ.
// Timed on the 124M shapes of every linear layer (BT 8192), against the bf16 tensor-core peak:
// forward 2 BT C OC FLOPs, backward 4 BT C OC (dinp and dweight; the bias gradient and the GELU
// are not counted). The bias gradient is also timed alone against reading dout once.
//
// Tolerances: bf16 outputs (out, pre_gelu, dinp) BF16_TOLERANCE. dbias (fp32) FP32_TOLERANCE: the
// CPU adds BT rows in order, the GPU in another fixed order, both rounding to nearest; for N(0,1)
// values the CPU's own rms error is ~1.6e-6 relative at BT = 8192. dweight: see dweight_tolerance.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/cpu/ops.h"

using bench::DeviceBuffer;
using llmc::ceil_div;
using llmc::floatX;
using llmc::strformat;

constexpr int NUM_VERSIONS = 4;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {
    "", "tiled shared-memory kernel (GPU reference)", "cuBLASLt plain products + separate bias/GELU kernels",
    "llmc/matmul.cuh: cuBLASLt with fused epilogues, weight gradients whole",
    "llmc/matmul.cuh: fused epilogues, weight gradients split along k where the output is small"};
// Version 4's checks cut every weight gradient into this many slices.
constexpr int CHECKED_SLICES = 3;

// One forward call's arguments, as matmul_forward takes them.
struct Forward {
    floatX* out;
    floatX* pre_gelu;
    const floatX* inp;
    const floatX* weight;
    const floatX* bias;
    const floatX* residual;
    int BT, C, OC;
};
// One backward call's arguments, as matmul_backward takes them.
struct Backward {
    floatX* dinp;
    float* dweight;
    float* dbias;
    float* scratch;
    const floatX* dout;
    const floatX* inp;
    const floatX* weight;
    const floatX* pre_gelu;
    int BT, C, OC;
};

// ---------------------------------------------------------------------------------------------
// Version 1: one tiled kernel for all three products.

constexpr int TILE = 16;

// Element (r, c) of an operand is p[r * row_stride + c * col_stride], so W, W^T and dout^T are
// all read in place.
struct Operand {
    const floatX* p;
    size_t row_stride, col_stride;
};

// What happens to each fp32 dot product: out = (acc + bias + residual), or GELU of that with the
// pre-activation kept, or acc * GELU'(dgelu_input); or, for fp32 results, out_accumulate += acc.
struct TiledEpilogue {
    floatX* out = nullptr;
    float* out_accumulate = nullptr;
    const floatX* bias = nullptr;  // per output column
    const floatX* residual = nullptr;
    floatX* pre_gelu = nullptr;
    const floatX* dgelu_input = nullptr;
};

__device__ inline float load_operand(const Operand& m, int rows, int cols, int r, int c) {
    if (r >= rows || c >= cols) return 0.0f;
    return __bfloat162float(m.p[(size_t)r * m.row_stride + (size_t)c * m.col_stride]);
}

// out (M x N, row-major) = A (M x K) B (K x N), then the epilogue. Block TILE x TILE, one output per
// thread; each step stages a TILE x TILE tile of A and of B in shared memory.
__global__ void tiled_matmul_kernel(Operand a, Operand b, int M, int N, int K, TiledEpilogue e) {
    __shared__ float a_tile[TILE][TILE + 1];  // a_tile[r][c] = A(row0 + r, k0 + c); +1: no bank conflicts
    __shared__ float b_tile[TILE][TILE + 1];  // b_tile[r][c] = B(k0 + r, col0 + c)
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    // Adjacent threads (tx) load along whichever direction of the operand is contiguous in memory;
    // (ar, ac) and (br, bc) are permutations of (ty, tx), so every tile element is loaded once.
    const bool a_k_contiguous = a.col_stride == 1, b_n_contiguous = b.col_stride == 1;
    const int ar = a_k_contiguous ? ty : tx, ac = a_k_contiguous ? tx : ty;
    const int br = b_n_contiguous ? ty : tx, bc = b_n_contiguous ? tx : ty;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        a_tile[ar][ac] = load_operand(a, M, K, row0 + ar, k0 + ac);
        b_tile[br][bc] = load_operand(b, K, N, k0 + br, col0 + bc);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += a_tile[ty][kk] * b_tile[kk][tx];
        __syncthreads();
    }
    const int i = row0 + ty, j = col0 + tx;
    if (i >= M || j >= N) return;
    const size_t idx = (size_t)i * N + j;
    if (e.out_accumulate) {
        e.out_accumulate[idx] += acc;
        return;
    }
    float v = acc;
    if (e.bias) v += __bfloat162float(e.bias[j]);
    if (e.residual) v += __bfloat162float(e.residual[idx]);
    if (e.pre_gelu) {
        e.pre_gelu[idx] = __float2bfloat16_rn(v);
        v = llmc::gelu_value(v);
    }
    if (e.dgelu_input) v *= llmc::gelu_derivative(__bfloat162float(e.dgelu_input[idx]));
    e.out[idx] = __float2bfloat16_rn(v);
}

void tiled_matmul(Operand a, Operand b, int M, int N, int K, const TiledEpilogue& e) {
    const dim3 grid(ceil_div(N, TILE), ceil_div(M, TILE)), block(TILE, TILE);
    LLMC_LAUNCH(tiled_matmul_kernel, grid, block, 0, 0)(a, b, M, N, K, e);
    CUDA_CHECK_LAUNCH();
}

// dbias[j] += sum of column j, one thread per column walking the rows in order.
__global__ void column_sum_kernel(float* dbias, const floatX* dout, int BT, int OC) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= OC) return;
    float sum = 0.0f;
    for (int r = 0; r < BT; r++) sum += __bfloat162float(dout[(size_t)r * OC + j]);
    dbias[j] += sum;
}

void column_sum(float* dbias, const floatX* dout, int BT, int OC) {
    LLMC_LAUNCH(column_sum_kernel, ceil_div(OC, 256), 256, 0, 0)(dbias, dout, BT, OC);
    CUDA_CHECK_LAUNCH();
}

void forward_v1(const Forward& f) {
    TiledEpilogue e;
    e.out = f.out;
    e.bias = f.bias;
    e.residual = f.residual;
    e.pre_gelu = f.pre_gelu;
    // out (BT x OC) = inp (BT x C) W^T: B(k, j) = W[j * C + k]
    tiled_matmul(Operand{f.inp, (size_t)f.C, 1}, Operand{f.weight, 1, (size_t)f.C}, f.BT, f.OC, f.C, e);
}

void backward_v1(const Backward& b) {
    if (b.dbias) column_sum(b.dbias, b.dout, b.BT, b.OC);
    if (b.dinp) {
        TiledEpilogue e;
        e.out = b.dinp;
        e.dgelu_input = b.pre_gelu;
        // dinp (BT x C) = dout (BT x OC) W (OC x C)
        tiled_matmul(Operand{b.dout, (size_t)b.OC, 1}, Operand{b.weight, (size_t)b.C, 1}, b.BT, b.C, b.OC, e);
    }
    TiledEpilogue e;
    e.out_accumulate = b.dweight;
    // dweight (OC x C) += dout^T (OC x BT) inp (BT x C): A(i, k) = dout[k * OC + i]
    tiled_matmul(Operand{b.dout, 1, (size_t)b.OC}, Operand{b.inp, (size_t)b.C, 1}, b.OC, b.C, b.BT, e);
}

// ---------------------------------------------------------------------------------------------
// Version 2: plain cuBLASLt products, then separate elementwise passes.

__global__ void add_bias_residual_kernel(floatX* out, const floatX* bias, const floatX* residual, int BT, int OC) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * OC) return;
    float v = __bfloat162float(out[idx]);
    if (bias) v += __bfloat162float(bias[idx % OC]);
    if (residual) v += __bfloat162float(residual[idx]);
    out[idx] = __float2bfloat16_rn(v);
}

void forward_v2(llmc::MatmulContext& ctx, const Forward& f) {
    floatX* product = f.pre_gelu ? f.pre_gelu : f.out;
    llmc::matmul_forward(ctx, product, nullptr, f.inp, f.weight, nullptr, nullptr, f.BT, f.C, f.OC, 0);
    if (f.bias || f.residual) {
        const size_t n = (size_t)f.BT * f.OC;
        LLMC_LAUNCH(add_bias_residual_kernel, (unsigned)ceil_div(n, (size_t)256), 256, 0, 0)(product, f.bias, f.residual, f.BT, f.OC);
        CUDA_CHECK_LAUNCH();
    }
    if (f.pre_gelu) llmc::gelu_forward(f.out, f.pre_gelu, (size_t)f.BT * f.OC, 0);
}

void backward_v2(llmc::MatmulContext& ctx, const Backward& b) {
    llmc::matmul_backward(ctx, b.dinp, b.dweight, nullptr, nullptr, b.dout, b.inp, b.weight, nullptr, b.BT, b.C, b.OC,
                          0);
    if (b.dinp && b.pre_gelu) llmc::gelu_backward_inplace(b.dinp, b.pre_gelu, (size_t)b.BT * b.C, 0);
    if (b.dbias) llmc::bias_backward(b.dbias, b.scratch, b.dout, b.BT, b.OC, 0);
}

// ---------------------------------------------------------------------------------------------
// Version 3: the llmc launchers.

void forward_v3(llmc::MatmulContext& ctx, const Forward& f) {
    llmc::matmul_forward(ctx, f.out, f.pre_gelu, f.inp, f.weight, f.bias, f.residual, f.BT, f.C, f.OC, 0);
}

void backward_v3(llmc::MatmulContext& ctx, const Backward& b) {
    llmc::matmul_backward(ctx, b.dinp, b.dweight, b.dbias, b.scratch, b.dout, b.inp, b.weight, b.pre_gelu, b.BT, b.C,
                          b.OC, 0);
}

// Versions 3 and 4 call the same launchers; the context's split of k tells them apart (main).
void forward(int version, llmc::MatmulContext& ctx, const Forward& f) {
    if (version == 1) forward_v1(f);
    else if (version == 2) forward_v2(ctx, f);
    else forward_v3(ctx, f);
}

void backward(int version, llmc::MatmulContext& ctx, const Backward& b) {
    if (version == 1) backward_v1(b);
    else if (version == 2) backward_v2(ctx, b);
    else backward_v3(ctx, b);
}

// How versions split the weight gradients' k: 2 and 3 never; 4 into CHECKED_SLICES for its checks
// and by shape (0) for its timings.
int forced_slices(int version, bool checking) { return version < 4 ? 1 : checking ? CHECKED_SLICES : 0; }

void bias_gradient(int version, float* dbias, float* scratch, const floatX* dout, int BT, int OC) {
    if (version == 1) column_sum(dbias, dout, BT, OC);
    else llmc::bias_backward(dbias, scratch, dout, BT, OC, 0);
}

// ---------------------------------------------------------------------------------------------
// Checks.

// dweight sums K = BT products. The CPU adds them with round-to-nearest FMAs. Tensor cores add each
// 16-product chunk into the fp32 accumulator with truncation rather than rounding (measured on V100,
// T4 and A100; Hopper's is undocumented), an error of one sign for as long as a partial sum keeps
// its sign. For N(0,1) products, K/16 truncations of partial sums of size ~3.2 sqrt(j) (chunk j)
// give at worst a relative rms error of ~1.4 * 2^-24 * (2/3) * 3.2 (K/16)^1.5 / sqrt(K): 3e-6 at
// K = 1024, but 2.3e-5 at K = 8192, past FP32_TOLERANCE (1e-5) yet inside 1e-4, and growing as K:
// 3.7e-4 at K = 131,072. So sums longer than 1024 are held to 1e-4 or twice that bound, whichever is
// larger. On an H200 (2026-11-28) split sums against whole ones at K = 65,536 and 131,072 differed by
// 1.1e-4 to 1.4e-4, the more slices the more (the whole sum's truncations run longest).
double dweight_tolerance(int K) {
    return K <= 1024 ? bench::FP32_TOLERANCE : std::max(1e-4, 2 * 2.3e-5 * K / 8192);
}

// An llmc::Error (say, cuBLASLt rejecting an epilogue) fails this check only, so a single run
// reports on every combination.
void guarded(const std::string& what, const std::function<void()>& fn) {
    try {
        fn();
    } catch (const llmc::Error& e) {
        bench::report_check(what.c_str(), false, e.what());
    }
}

struct Shape {
    const char* name;
    int BT, C, OC;
};
const Shape CHECK_SHAPES[] = {{"odd", 37, 64, 200}, {"124M fc", 8 * 1024, 768, 3072}};
// Emulated only, where the 124M shape is skipped: several bias-gradient row blocks (64 rows) and
// column blocks (256 columns), each partly filled, and a partial K tile for version 1.
const Shape EMULATED_CHECK_SHAPES[] = {{"blocks", 203, 40, 264}};

struct ForwardCase {
    const char* name;
    bool bias, residual, gelu;
};
const ForwardCase FORWARD_CASES[] = {{"plain", false, false, false},      {"bias", true, false, false},
                                     {"residual", false, true, false},    {"bias+residual", true, true, false},
                                     {"gelu", false, false, true},        {"bias+gelu", true, false, true}};

struct BackwardCase {
    const char* name;
    bool dinp, dgelu, dbias;
};
const BackwardCase BACKWARD_CASES[] = {{"dinp+dW+db", true, false, true},
                                       {"dgelu dinp+dW+db", true, true, true},
                                       {"dinp+dW, no db", true, false, false},
                                       {"dW+db, no dinp", false, false, true}};

void check_shape(llmc::MatmulContext& ctx, int version, const Shape& s, std::mt19937_64& rng) {
    const int BT = s.BT, C = s.C, OC = s.OC;
    const size_t n_inp = (size_t)BT * C, n_out = (size_t)BT * OC, n_weight = (size_t)OC * C;
    printf(" %s: BT %d, C %d, OC %d\n", s.name, BT, C, OC);
    if (bench::skip_when_emulated("BT C OC", (double)BT * C * OC)) return;

    // W ~ N(0, 1/C) keeps the pre-activations near N(0, 1), where GELU is curved.
    const std::vector<float> inp = bench::random_bf16(n_inp, rng);
    const std::vector<float> weight = bench::random_bf16(n_weight, rng, 1.0f / std::sqrt((float)C));
    const std::vector<float> bias = bench::random_bf16(OC, rng, 0.5f);
    const std::vector<float> residual = bench::random_bf16(n_out, rng);
    const std::vector<float> dout = bench::random_bf16(n_out, rng);
    const std::vector<float> pre_gelu = bench::random_bf16(n_inp, rng, 1.5f);
    const std::vector<float> dweight_init = bench::random_f32(n_weight, rng);
    const std::vector<float> dbias_init = bench::random_f32(OC, rng);

    DeviceBuffer<floatX> d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight);
    DeviceBuffer<floatX> d_bias = bench::to_device_bf16(bias), d_residual = bench::to_device_bf16(residual);
    DeviceBuffer<floatX> d_dout = bench::to_device_bf16(dout), d_pre_gelu_in = bench::to_device_bf16(pre_gelu);
    DeviceBuffer<floatX> d_out(n_out, "out"), d_pre_gelu_out(n_out, "pre_gelu"), d_dinp(n_inp, "dinp");
    DeviceBuffer<float> d_dweight(n_weight, "dweight"), d_dbias(OC, "dbias");
    DeviceBuffer<float> d_scratch(llmc::matmul_backward_scratch_floats(BT, OC), "scratch");

    for (const ForwardCase& fc : FORWARD_CASES) {
        std::vector<float> ref_pre(n_out);
        llmc::cpu::matmul_forward(ref_pre.data(), inp.data(), weight.data(), fc.bias ? bias.data() : nullptr,
                                  fc.residual ? residual.data() : nullptr, BT, C, OC);
        std::vector<float> ref_out = ref_pre;
        if (fc.gelu) llmc::cpu::gelu_forward(ref_out.data(), ref_pre.data(), n_out);
        const Forward f{d_out.get(),
                        fc.gelu ? d_pre_gelu_out.get() : nullptr,
                        d_inp.get(),
                        d_weight.get(),
                        fc.bias ? d_bias.get() : nullptr,
                        fc.residual ? d_residual.get() : nullptr,
                        BT,
                        C,
                        OC};
        auto run = [&](std::vector<float>& out, std::vector<float>& pre) {
            bench::poison(d_out.get(), n_out);
            bench::poison(d_pre_gelu_out.get(), n_out);
            forward(version, ctx, f);
            CUDA_CHECK(cudaDeviceSynchronize());
            out = bench::to_host(d_out.get(), n_out);
            if (fc.gelu) pre = bench::to_host(d_pre_gelu_out.get(), n_out);
        };
        const std::string label = strformat("fwd %s", fc.name);
        guarded(label, [&] {
            std::vector<float> out, pre;
            run(out, pre);
            bench::check((label + " out").c_str(), out, ref_out, bench::BF16_TOLERANCE);
            if (fc.gelu) bench::check((label + " pre_gelu").c_str(), pre, ref_pre, bench::BF16_TOLERANCE);
            if (version >= 3) {
                std::vector<float> out2, pre2;
                run(out2, pre2);
                // The widened copies compare the bf16 bits: widening keeps every bit.
                bench::check_same_bits((label + " out, run twice").c_str(), out, out2);
                if (fc.gelu) bench::check_same_bits((label + " pre_gelu, run twice").c_str(), pre, pre2);
            }
        });
    }

    std::vector<float> ref_dinp(n_inp), ref_dweight = dweight_init, ref_dbias = dbias_init;
    llmc::cpu::matmul_backward(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(),
                               weight.data(), BT, C, OC);
    std::vector<float> ref_dinp_gelu = ref_dinp;
    llmc::cpu::gelu_backward(ref_dinp_gelu.data(), pre_gelu.data(), n_inp);

    for (const BackwardCase& bc : BACKWARD_CASES) {
        const Backward b{bc.dinp ? d_dinp.get() : nullptr,
                         d_dweight.get(),
                         bc.dbias ? d_dbias.get() : nullptr,
                         d_scratch.get(),
                         d_dout.get(),
                         d_inp.get(),
                         d_weight.get(),
                         bc.dgelu ? d_pre_gelu_in.get() : nullptr,
                         BT,
                         C,
                         OC};
        // dweight and dbias accumulate: both sides start from the same values.
        auto run = [&](std::vector<float>& dinp, std::vector<float>& dweight, std::vector<float>& dbias) {
            bench::upload(d_dweight.get(), dweight_init);
            bench::upload(d_dbias.get(), dbias_init);
            bench::poison(d_dinp.get(), n_inp);
            bench::poison(d_scratch.get(), d_scratch.count());
            backward(version, ctx, b);
            CUDA_CHECK(cudaDeviceSynchronize());
            if (bc.dinp) dinp = bench::to_host(d_dinp.get(), n_inp);
            dweight = bench::to_host(d_dweight.get(), n_weight);
            if (bc.dbias) dbias = bench::to_host(d_dbias.get(), OC);
        };
        const std::string label = strformat("bwd %s", bc.name);
        guarded(label, [&] {
            std::vector<float> dinp, dweight, dbias;
            run(dinp, dweight, dbias);
            if (bc.dinp)
                bench::check((label + " dinp").c_str(), dinp, bc.dgelu ? ref_dinp_gelu : ref_dinp,
                             bench::BF16_TOLERANCE);
            bench::check((label + " dweight").c_str(), dweight, ref_dweight, dweight_tolerance(BT));
            if (bc.dbias) bench::check((label + " dbias").c_str(), dbias, ref_dbias, bench::FP32_TOLERANCE);
            if (version >= 3) {
                std::vector<float> dinp2, dweight2, dbias2;
                run(dinp2, dweight2, dbias2);
                if (bc.dinp) bench::check_same_bits((label + " dinp, run twice").c_str(), dinp, dinp2);
                bench::check_same_bits((label + " dweight, run twice").c_str(), dweight, dweight2);
                if (bc.dbias) bench::check_same_bits((label + " dbias, run twice").c_str(), dbias, dbias2);
            }
        });
    }
}

// With W = 0 the pre-activation is the bias exactly; biases spread over [-4.5, -2.5], where tanh-GELU
// and erf-GELU differ by 6% (rms, relative) while bf16 rounds to 0.4%. Prints how far the output is
// from the tanh form (cpu::gelu_forward) and from the erf form; only pre_gelu is checked.
void check_gelu_form(llmc::MatmulContext& ctx, int version, std::mt19937_64& rng) {
    const int BT = 4, C = 8, OC = 256;
    const size_t n_out = (size_t)BT * OC;
    std::vector<float> bias(OC);
    for (int j = 0; j < OC; j++) bias[j] = bench::bf16_round(-4.5f + 2.0f * j / (OC - 1));
    const std::vector<float> inp = bench::random_bf16((size_t)BT * C, rng);
    const std::vector<float> weight((size_t)OC * C, 0.0f);
    std::vector<float> ref_pre(n_out), ref_tanh(n_out), ref_erf(n_out);
    for (size_t i = 0; i < n_out; i++) ref_pre[i] = bias[i % OC];
    llmc::cpu::gelu_forward(ref_tanh.data(), ref_pre.data(), n_out);
    for (size_t i = 0; i < n_out; i++)
        ref_erf[i] = (float)(0.5 * ref_pre[i] * (1.0 + std::erf(ref_pre[i] / std::sqrt(2.0))));

    DeviceBuffer<floatX> d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight);
    DeviceBuffer<floatX> d_bias = bench::to_device_bf16(bias);
    DeviceBuffer<floatX> d_out(n_out, "out"), d_pre(n_out, "pre_gelu");
    guarded("gelu form", [&] {
        bench::poison(d_out.get(), n_out);
        bench::poison(d_pre.get(), n_out);
        const Forward f{d_out.get(), d_pre.get(), d_inp.get(), d_weight.get(), d_bias.get(), nullptr, BT, C, OC};
        forward(version, ctx, f);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> out = bench::to_host(d_out.get(), n_out), pre = bench::to_host(d_pre.get(), n_out);
        bench::check("gelu form: pre_gelu = bias", pre, ref_pre, bench::BF16_TOLERANCE);
        const double err_tanh = bench::rel_error(out.data(), ref_tanh.data(), n_out);
        const double err_erf = bench::rel_error(out.data(), ref_erf.data(), n_out);
        printf("  info %-28s rel. error %.3e from the tanh form, %.3e from the erf form\n",
               "gelu form: x in [-4.5,-2.5]", err_tanh, err_erf);
    });
}

// ---------------------------------------------------------------------------------------------
// Timing.

// Uniform values in [-scale, scale) from a hash of the index: filling the 800 MB lm-head tensors
// on the host would take longer than timing them.
__global__ void fill_uniform_kernel(floatX* p, size_t n, uint32_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(llmc::random_bits(seed, i) >> 8) * (1.0f / 16777216.0f);
        p[i] = __float2bfloat16_rn(scale * (2.0f * u - 1.0f));
    }
}

// n = 0 gives an empty buffer (a null pointer): an argument the layer does not have.
DeviceBuffer<floatX> random_device(size_t n, float scale, std::mt19937_64& rng) {
    DeviceBuffer<floatX> d(n, "timing input");
    if (n == 0) return d;
    LLMC_LAUNCH(fill_uniform_kernel, 1024, 256, 0, 0)(d.get(), n, (uint32_t)rng(), scale);
    CUDA_CHECK_LAUNCH();
    return d;
}

struct TimedLayer {
    const char* name;
    int C, OC;
    bool bias, residual, gelu, dgelu;
};
constexpr int TIMING_BT = 8 * 1024;
const TimedLayer TIMED_LAYERS[] = {
    {"qkv", 768, 3 * 768, true, false, false, false},    {"attproj", 768, 768, true, true, false, false},
    {"fc", 768, 4 * 768, true, false, true, false},      {"fcproj", 4 * 768, 768, true, true, false, true},
    {"lm head", 768, 50304, false, false, false, false},
};

void time_layer(llmc::MatmulContext& ctx, int version, const TimedLayer& l, std::mt19937_64& rng) {
    const int BT = TIMING_BT, C = l.C, OC = l.OC;
    const size_t n_inp = (size_t)BT * C, n_out = (size_t)BT * OC, n_weight = (size_t)OC * C;
    printf(" %s: BT %d, C %d, OC %d;%s%s%s%s\n", l.name, BT, C, OC, l.bias ? " bias" : "",
           l.residual ? " residual" : "", l.gelu ? " gelu" : "", l.dgelu ? " dgelu" : "");
    DeviceBuffer<floatX> inp = random_device(n_inp, 1.0f, rng);
    DeviceBuffer<floatX> weight = random_device(n_weight, 0.05f, rng);
    DeviceBuffer<floatX> bias = random_device(OC, 0.5f, rng);
    DeviceBuffer<floatX> residual = random_device(l.residual ? n_out : 0, 1.0f, rng);
    DeviceBuffer<floatX> dout = random_device(n_out, 1.0f, rng);
    DeviceBuffer<floatX> pre_gelu_in = random_device(l.dgelu ? n_inp : 0, 1.5f, rng);
    DeviceBuffer<floatX> out(n_out, "out"), pre_gelu_out(l.gelu ? n_out : 0, "pre_gelu"), dinp(n_inp, "dinp");
    DeviceBuffer<float> dweight(n_weight, "dweight"), dbias(OC, "dbias");
    DeviceBuffer<float> scratch(llmc::matmul_backward_scratch_floats(BT, OC), "scratch");
    CUDA_CHECK(cudaMemset(dweight.get(), 0, dweight.bytes()));
    CUDA_CHECK(cudaMemset(dbias.get(), 0, dbias.bytes()));

    const Forward f{out.get(), pre_gelu_out.get(), inp.get(), weight.get(), l.bias ? bias.get() : nullptr,
                    residual.get(), BT, C, OC};
    const Backward b{dinp.get(), dweight.get(), l.bias ? dbias.get() : nullptr, scratch.get(), dout.get(), inp.get(),
                     weight.get(), pre_gelu_in.get(), BT, C, OC};
    const int repeats = version == 1 ? 3 : 20;  // version 1 takes a tenth of a second per lm-head product
    const double flops = 2.0 * BT * C * OC;
    guarded("forward", [&] {
        bench::report_compute_bound("forward", bench::time_ms([&] { forward(version, ctx, f); }, repeats), flops);
    });
    guarded("backward", [&] {
        bench::report_compute_bound("backward", bench::time_ms([&] { backward(version, ctx, b); }, repeats),
                                    2.0 * flops);
    });
    if (l.bias)
        guarded("bias gradient", [&] {
            const float ms =
                bench::time_ms([&] { bias_gradient(version, dbias.get(), scratch.get(), dout.get(), BT, OC); });
            bench::report_memory_bound("bias gradient (reads dout)", ms, (double)n_out * sizeof(floatX));
        });
}

// ---------------------------------------------------------------------------------------------
// The split of k (version 4): a weight gradient alone, split several ways, against the CPU.

// Splits checked (0: the one the shape gets by itself) on shapes where the wave model splits: GPT-2
// 124M's attention projection on a GPU (by itself: the tuned table's on a card it lists, none on an
// H200 at this k; else the wave model's 4 slices of 2048 rows; 7 asked for: 1216 rows, the last 896),
// a small output over a short k emulated (16 slices asked for: 13 of 16 rows, the last 11).
const int SPLITS_CHECKED[] = {0, 2, 7, 16};
const Shape SPLIT_SHAPES[] = {{"124M attproj", 8 * 1024, 768, 768}};
const Shape EMULATED_SPLIT_SHAPES[] = {{"small output", 203, 64, 48}};

void check_splits(llmc::MatmulContext& ctx, const Shape& s, std::mt19937_64& rng) {
    const int BT = s.BT, C = s.C, OC = s.OC;
    printf(" split k: %s, BT %d, C %d, OC %d\n", s.name, BT, C, OC);
    if (bench::skip_when_emulated("BT C OC", (double)BT * C * OC)) return;
    const size_t n_weight = (size_t)OC * C;
    const std::vector<float> inp = bench::random_bf16((size_t)BT * C, rng);
    const std::vector<float> dout = bench::random_bf16((size_t)BT * OC, rng);
    const std::vector<float> dweight_init = bench::random_f32(n_weight, rng);
    std::vector<float> ref = dweight_init;
    llmc::cpu::matmul_backward(nullptr, ref.data(), nullptr, dout.data(), inp.data(), nullptr, BT, C, OC);
    DeviceBuffer<floatX> d_inp = bench::to_device_bf16(inp), d_dout = bench::to_device_bf16(dout);
    DeviceBuffer<float> d_dweight(n_weight, "dweight");
    for (int slices : SPLITS_CHECKED) {
        ctx.force_split_k(slices);
        const llmc::SplitK split = ctx.split_k(C, OC, BT);
        const std::string label = strformat("dW, %s: %d slices of %d rows, the last %d", slices ? "asked" : "by shape",
                                            split.slices, split.slice_k, split.last_k(BT));
        guarded(label, [&] {
            auto run = [&] {
                bench::upload(d_dweight.get(), dweight_init);
                llmc::matmul_backward(ctx, nullptr, d_dweight.get(), nullptr, nullptr, d_dout.get(), d_inp.get(),
                                      nullptr, nullptr, BT, C, OC, 0);
                CUDA_CHECK(cudaDeviceSynchronize());
                return bench::to_host(d_dweight.get(), n_weight);
            };
            const std::vector<float> dweight = run();
            bench::check(label.c_str(), dweight, ref, dweight_tolerance(BT));
            bench::check_same_bits((label + ", run twice").c_str(), dweight, run());
        });
    }
    ctx.force_split_k(0);
}

// ---------------------------------------------------------------------------------------------
// --tune: every split of the presets' weight gradients timed on this card; the fastest per shape
// written as llmc/kernels/split_k_table.h.

// The weight gradients of d12 to d48 (C = 768, 1024, 1280, 1600) whose outputs have fewer than two
// waves of 128 x 128 tiles on this card, at B = 8 to 128 sequences of 1024.
struct TunedWeight {
    const char* name;
    int C, OC;
};
const TunedWeight TUNED_WEIGHTS[] = {
    {"d12 qkv", 768, 2304},     {"d12 attproj", 768, 768},    {"d12 fc", 768, 3072},      {"d12 fcproj", 3072, 768},
    {"d24 qkv", 1024, 3072},    {"d24 attproj", 1024, 1024},  {"d24 fc", 1024, 4096},     {"d24 fcproj", 4096, 1024},
    {"d36 qkv", 1280, 3840},    {"d36 attproj", 1280, 1280},  {"d36 fc", 1280, 5120},     {"d36 fcproj", 5120, 1280},
    {"d48 qkv", 1600, 4800},    {"d48 attproj", 1600, 1600},  {"d48 fc", 1600, 6400},     {"d48 fcproj", 6400, 1600},
};
const int TUNED_BT[] = {8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024};
const int TUNED_SLICES[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16};

const char* const TABLE_HEAD = R"(// split_k_table.h: the weight gradients' split of k measured fastest, per card and shape
// (split_k.h reads it; a shape not listed gets the wave model's split).
//
// Written by the matmul workbench on the card itself, in one run:
//   dev/cuda/build/matmul --tune llmc/kernels/split_k_table.h
// (dev/bench/gpu_session.sh's `kernels` stage runs it and brings the file back.) It times every
// split from 1 to 16 of each weight gradient of GPT-2's presets at the batch sizes the benchmarks
// run, after checking each split against the product over the whole of k (itself checked against
// the CPU reference by the workbench's checks). m, n, k are cuBLASLt's: m = C (the product's input
// channels), n = OC (its output channels), k = B x T.
#pragma once

namespace llmc {

struct SplitKTuned {
    const char* device;  // cudaDeviceProp::name
    int m, n, k;
    int slices;          // 1: no split
};

)";

void tune(llmc::MatmulContext& ctx, const std::string& path, std::mt19937_64& rng) {
    const bench::DeviceCeilings card = bench::device_ceilings();
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::string rows;
    for (const TunedWeight& w : TUNED_WEIGHTS) {
        const long tiles = (long)ceil_div(w.C, 128) * ceil_div(w.OC, 128);
        if (tiles >= 2L * sms) continue;
        for (int BT : TUNED_BT) {
            if (bench::skip_when_emulated("BT C OC", (double)BT * w.C * w.OC)) continue;
            const size_t n_weight = (size_t)w.OC * w.C;
            DeviceBuffer<floatX> inp = random_device((size_t)BT * w.C, 1.0f, rng);
            DeviceBuffer<floatX> dout = random_device((size_t)BT * w.OC, 1.0f, rng);
            DeviceBuffer<float> dweight(n_weight, "dweight");
            auto product = [&] {
                llmc::matmul_backward(ctx, nullptr, dweight.get(), nullptr, nullptr, dout.get(), inp.get(), nullptr,
                                      nullptr, BT, w.C, w.OC, 0);
            };
            auto result = [&] {
                CUDA_CHECK(cudaMemset(dweight.get(), 0, dweight.bytes()));
                product();
                CUDA_CHECK(cudaDeviceSynchronize());
                return bench::to_host(dweight.get(), n_weight);
            };
            const double flops = 2.0 * BT * w.C * w.OC;
            printf(" %s: BT %d (%ld tiles on %d SMs)\n", w.name, BT, tiles, sms);
            std::vector<float> whole;
            int best = 1, last = 0;
            float best_ms = 0, whole_ms = 0;
            for (int asked : TUNED_SLICES) {
                ctx.force_split_k(asked);
                const int slices = ctx.split_k(w.C, w.OC, BT).slices;
                if (slices == last) continue;  // k or the partials allow no more
                last = slices;
                const std::vector<float> got = result();
                if (slices == 1) whole = got;
                else if (!bench::check(strformat("%d slices against 1", slices).c_str(), got, whole,
                                       dweight_tolerance(BT)))
                    continue;
                const float ms = bench::time_ms(product, 10);
                bench::report_compute_bound(strformat("dW, %d slices", slices).c_str(), ms, flops);
                if (slices == 1) whole_ms = ms;
                if (slices == 1 || ms < best_ms) best = slices, best_ms = ms;
            }
            rows += strformat("    {\"%s\", %d, %d, %d, %d},  // %s: %.3f ms whole, %.3f ms split\n", card.name, w.C,
                              w.OC, BT, best, w.name, whole_ms, best_ms);
        }
    }
    ctx.force_split_k(0);
    const std::string table = std::string(TABLE_HEAD) + "inline constexpr SplitKTuned SPLIT_K_TUNED[] = {\n" +
                              (rows.empty() ? "    {\"\", 0, 0, 0, 1},  // (no shape was tuned)\n" : rows) +
                              "};\n\n}  // namespace llmc\n";
    bench::write_tuned_table(path, table);
}

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, NUM_VERSIONS, /*tunable=*/true);
    return bench::run_and_finish(argv[0], [&] {
        llmc::MatmulContext ctx;
        if (!opts.tune_path.empty()) {
            std::mt19937_64 rng(opts.seed);
            tune(ctx, opts.tune_path, rng);
            return;
        }
        for (int version = 1; version <= NUM_VERSIONS; version++) {
            if (!opts.runs(version)) continue;
            std::mt19937_64 rng(opts.seed + version);  // `./matmul 3 --seed N` repeats version 3 of a full run
            printf("version %d: %s\n", version, VERSION_NAMES[version]);
            ctx.force_split_k(forced_slices(version, true));
            for (const Shape& s : CHECK_SHAPES) check_shape(ctx, version, s, rng);
            if (bench::EMULATED)
                for (const Shape& s : EMULATED_CHECK_SHAPES) check_shape(ctx, version, s, rng);
            check_gelu_form(ctx, version, rng);
            if (version == 4) {
                for (const Shape& s : SPLIT_SHAPES) check_splits(ctx, s, rng);
                if (bench::EMULATED)
                    for (const Shape& s : EMULATED_SPLIT_SHAPES) check_splits(ctx, s, rng);
            }
            ctx.force_split_k(forced_slices(version, false));
            if (!opts.check_only)
                for (const TimedLayer& l : TIMED_LAYERS) time_layer(ctx, version, l, rng);
        }
    });
}
