// dev/cuda/fp8.cu: FP8 quantization and the FP8 products (llmc/kernels/fp8.cuh, matmul.cuh):
//
//   llmc: fp8_cast (64 x 64 shared-memory tiles, 8 elements a thread: 16-byte loads, 8-byte stores
//      of the codes and of the transpose beside them, amax and clipping counted per block; the
//      element-by-element path for ragged shapes), fp8_current_scale (16-byte loads),
//      fp8_delayed_update, and the products matmul_forward_fp8 / matmul_backward_dinp_fp8 /
//      matmul_backward_dweight_fp8 (cuBLASLt, TN); ZeRO-3's weights gathered as codes
//      (models/cuda/fp8_gather.cuh: fp8_pieces_amax, fp8_pack, fp8_unpack, fp8_scales_from_ranks,
//      fp8_clip_sum) and the byte transpose the backward makes of them (fp8_transpose)
//   version 1 of the cast, timed beside it: 32 x 32 tiles, one element a thread (the first GPU
//      session's, 2026-11-26)
//
//   ./fp8 [--check] [--seed N]
//
// Checked against the CPU: every code of the cast and of its transpose equals llmc/numerics/fp8.h's encode
// of the same value (bit for bit), and so do the amax, the clipping counts and the scales
// (fp8::scale_for_amax); the delayed update follows the history as cpu::Fp8Linears::end_step does;
// the products equal cpu::Fp8Linears' forward and backward on the same bf16 values (the quantized
// operands are then the same, so what remains is the accumulation order and the bf16 rounding of
// the outputs: bf16 outputs within BF16_TOLERANCE, the fp32 weight gradient within
// FP8_ACCUMULATION_TOLERANCE: Hopper's FP8 tensor cores accumulate with fewer bits than fp32, and
// an H200 was 6.3e-5 from the exact sum, 6x FP32_TOLERANCE) and repeat their bits. The gather: every
// rank of a simulated group packs its slices, and the unpacked codes of each whole weight are the
// host's encode of it with the scale of its whole amax, the other parameters their bf16 bits, the
// amaxes and clipping the host's; the byte transpose equals the host's. Timed on a GPU, on
// GPT-2 124M's and 1.5B's fc shapes: the three FP8 products against the bf16 ones (matmul_forward,
// matmul_backward), both against the dense bf16 peak, so FP8's 2x shows as a share above 100%; the
// amax pass and the casts (both versions) against DRAM bandwidth.
#include <cstring>
#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/cpu/fp8_linear.h"
#include "llmc/kernels/fp8.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/models/cuda/fp8_gather.cuh"

using bench::DeviceBuffer;
using llmc::floatX;
using llmc::Fp8Scale;
using llmc::strformat;
namespace fp8 = llmc::fp8;

constexpr int NUM_VERSIONS = 1;

namespace {

// An fp32 result of FP8 operands: the tensor cores' accumulation is not fp32's (see the top).
constexpr double FP8_ACCUMULATION_TOLERANCE = 1e-3;

// The host's quantization of x with `scale`: codes, transposed codes, amax and clipping.
struct HostCast {
    std::vector<uint8_t> q, qt;
    float amax = 0.0f;
    unsigned long long elements = 0, overflows = 0, underflows = 0;
};

HostCast host_cast(const std::vector<float>& x, int rows, int cols, float scale, fp8::Format f) {
    HostCast h;
    h.q.resize(x.size());
    h.qt.resize(x.size());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float v = x[(size_t)r * cols + c], scaled = v * scale;
            const uint8_t code = fp8::encode(scaled, f);
            h.q[(size_t)r * cols + c] = code;
            h.qt[(size_t)c * rows + r] = code;
            h.amax = std::max(h.amax, std::fabs(v));
            h.elements++;
            h.overflows += std::fabs(scaled) > fp8::info(f).largest;
            h.underflows += scaled != 0.0f && (code & 0x7f) == 0;
        }
    return h;
}

template <typename T>
T from_device(const T* d) {
    T out;
    CUDA_CHECK(cudaMemcpy(&out, d, sizeof(T), cudaMemcpyDeviceToHost));
    return out;
}
template <typename T>
void to_device(T* d, const T& value) {
    CUDA_CHECK(cudaMemcpy(d, &value, sizeof(T), cudaMemcpyHostToDevice));
}

// The cast with a scale large enough that some elements saturate and small values that flush, in
// both formats, with and without amax, on a shape (rows x cols) that is not a multiple of the 64 x
// 64 tile: 75 x 53 (not of the 8-element vectors either: the element-by-element path) and 200 x 136
// (the vector path, with tiles cut at the edges).
void check_cast(std::mt19937_64& rng, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    std::vector<float> x = bench::random_bf16(n, rng, 4.0f);
    for (size_t i = 0; i < n; i += 7) x[i] = bench::bf16_round(x[i] * 1e-12f);  // some flush to zero
    DeviceBuffer<floatX> d_x = bench::to_device_bf16(x);
    DeviceBuffer<uint8_t> q(n, "q"), qt(n, "qt");
    DeviceBuffer<Fp8Scale> scale(1, "scale");
    DeviceBuffer<llmc::Fp8Clip> clip(1, "clip");
    for (fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2}) {
        const float s = f == fp8::Format::E4M3 ? 64.0f : 8192.0f;  // amax ~ 14: some saturate in both formats
        printf(" cast %d x %d to %s, scale %g\n", rows, cols, fp8::info(f).name, s);
        Fp8Scale state;
        state.scale = s, state.scale_inv = 1.0f / s;
        to_device(scale.get(), state);
        to_device(clip.get(), llmc::Fp8Clip{});
        bench::poison(q.get(), n);
        bench::poison(qt.get(), n);
        llmc::fp8_cast(q.get(), qt.get(), scale.get(), clip.get(), d_x.get(), rows, cols, f, true, 0);
        const HostCast want = host_cast(x, rows, cols, s, f);
        bench::check_same_bits("codes", bench::device_bytes(q.get(), n), want.q);
        bench::check_same_bits("transposed codes", bench::device_bytes(qt.get(), n), want.qt);
        const Fp8Scale after = from_device(scale.get());
        const llmc::Fp8Clip c = from_device(clip.get());
        bench::report_check("amax", after.step_amax == want.amax, strformat("%g, host %g", after.step_amax, want.amax));
        bench::report_check("clipping counts",
                            c.elements == want.elements && c.overflows == want.overflows &&
                                c.underflows == want.underflows && want.overflows > 0 && want.underflows > 0,
                            strformat("elements %llu saturated %llu flushed %llu; host %llu %llu %llu", c.elements,
                                      c.overflows, c.underflows, want.elements, want.overflows, want.underflows));
        // Without a transpose or an amax the codes are the same and the amax untouched; the
        // transpose alone is the same too.
        to_device(scale.get(), state);
        bench::poison(q.get(), n);
        llmc::fp8_cast(q.get(), nullptr, scale.get(), nullptr, d_x.get(), rows, cols, f, false, 0);
        bench::check_same_bits("codes (no transpose, no amax)", bench::device_bytes(q.get(), n), want.q);
        bench::report_check("amax not recorded", from_device(scale.get()).step_amax == 0.0f, "");
        bench::poison(qt.get(), n);
        llmc::fp8_cast(nullptr, qt.get(), scale.get(), nullptr, d_x.get(), rows, cols, f, false, 0);
        bench::check_same_bits("transposed codes alone", bench::device_bytes(qt.get(), n), want.qt);
    }
}

// fp8_current_scale against fp8::scale_for_amax, for tensors of very different ranges, of 5000
// elements (read 8 at a time) and 4999 (one at a time), the largest one last.
void check_current_scale(std::mt19937_64& rng) {
    printf(" current scaling: the scale of a tensor's own amax\n");
    DeviceBuffer<Fp8Scale> scale(1, "scale");
    for (size_t n : {5000, 4999})
        for (float sigma : {1e-6f, 0.02f, 1.0f, 300.0f})
            for (fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2}) {
                std::vector<float> x = bench::random_bf16(n, rng, sigma);
                x.back() = bench::bf16_round(-8 * sigma);
                float amax = 0.0f;
                for (float v : x) amax = std::max(amax, std::fabs(v));
                to_device(scale.get(), Fp8Scale{});
                DeviceBuffer<floatX> d_x = bench::to_device_bf16(x);
                llmc::fp8_current_scale(scale.get(), d_x.get(), x.size(), f, 0);
                const Fp8Scale got = from_device(scale.get());
                const float want = fp8::scale_for_amax(amax, f, 1.0f);
                bench::report_check(strformat("%zu elements, sigma %g, %s", n, sigma, fp8::info(f).name).c_str(),
                                    got.scale == want && got.scale_inv * want == 1.0f && got.amax_now == 0.0f,
                                    strformat("scale %g (inverse %g), host %g", got.scale, got.scale_inv, want));
            }
}

// fp8_delayed_update over steps of amaxes, against the last `history` amaxes' scale.
void check_delayed_update() {
    printf(" delayed scaling: 2 tensors, history 3, over 6 steps\n");
    const int tensors = 2, history = 3;
    DeviceBuffer<Fp8Scale> scales(tensors, "scales");
    DeviceBuffer<float> rings((size_t)tensors * history, "histories"), largest(tensors, "largest");
    CUDA_CHECK(cudaMemset(rings.get(), 0, (size_t)tensors * history * sizeof(float)));
    bench::upload(largest.get(), std::vector<float>{448.0f, 57344.0f});
    bench::upload(scales.get(), std::vector<Fp8Scale>(tensors));
    const float amaxes[6][2] = {{1.0f, 3e-5f}, {40.0f, 0.0f}, {0.5f, 2e-5f}, {0.5f, 1e-6f}, {0.7f, 1e-6f}, {0.6f, 1e-6f}};
    std::vector<std::vector<float>> seen(tensors);
    bool ok = true;
    std::string detail;
    for (const auto& step : amaxes) {
        std::vector<Fp8Scale> s(tensors);
        CUDA_CHECK(cudaMemcpy(s.data(), scales.get(), sizeof(Fp8Scale) * tensors, cudaMemcpyDeviceToHost));
        for (int t = 0; t < tensors; t++) s[t].step_amax = step[t];
        bench::upload(scales.get(), s);
        llmc::fp8_delayed_update(scales.get(), rings.get(), largest.get(), tensors, history, 0);
        CUDA_CHECK(cudaMemcpy(s.data(), scales.get(), sizeof(Fp8Scale) * tensors, cudaMemcpyDeviceToHost));
        for (int t = 0; t < tensors; t++) {
            if (step[t] > 0) seen[t].push_back(step[t]);  // a step that did not quantize the tensor is skipped
            const size_t from = seen[t].size() > (size_t)history ? seen[t].size() - history : 0;
            const float m = *std::max_element(seen[t].begin() + from, seen[t].end());
            const float want = fp8::scale_for_amax(m, t == 0 ? fp8::Format::E4M3 : fp8::Format::E5M2, 1.0f);
            if (s[t].scale != want || !s[t].primed || s[t].step_amax != 0.0f) {
                ok = false;
                detail = strformat("tensor %d: scale %g, host %g", t, s[t].scale, want);
            }
        }
    }
    bench::report_check("scales follow the last 3 amaxes", ok, detail);

    // The step amaxes out to an array and back as the maximum over two ranks' arrays.
    std::vector<Fp8Scale> s(tensors);
    s[0].step_amax = 1.0f, s[1].step_amax = 5.0f;
    bench::upload(scales.get(), s);
    DeviceBuffer<float> all(2 * tensors, "both ranks' amaxes");
    llmc::fp8_step_amax_out(all.get(), scales.get(), tensors, 0);
    bench::upload(all.get() + tensors, std::vector<float>{3.0f, 2.0f});  // the other rank's
    llmc::fp8_step_amax_max(scales.get(), all.get(), tensors, 2, 0);
    CUDA_CHECK(cudaMemcpy(s.data(), scales.get(), sizeof(Fp8Scale) * tensors, cudaMemcpyDeviceToHost));
    bench::report_check("step amax: the maximum over the ranks", s[0].step_amax == 3.0f && s[1].step_amax == 5.0f,
                        strformat("%g %g, expected 3 5", s[0].step_amax, s[1].step_amax));
}

// The three products against cpu::Fp8Linears on the same bf16 operands, with current scaling.
void check_products(std::mt19937_64& rng, llmc::MatmulContext& ctx) {
    const int BT = 64, C = 48, OC = 80;
    printf(" products: BT %d, C %d, OC %d\n", BT, C, OC);
    const std::vector<float> inp = bench::random_bf16((size_t)BT * C, rng), w = bench::random_bf16((size_t)OC * C, rng, 0.05f);
    const std::vector<float> bias = bench::random_bf16(OC, rng, 0.1f), dout = bench::random_bf16((size_t)BT * OC, rng, 1e-3f);
    llmc::cpu::Fp8Linears cpu(1, {true, llmc::Fp8Scaling::Current, 4});
    std::vector<float> want_out((size_t)BT * OC), want_dinp((size_t)BT * C), want_dw((size_t)OC * C, 0.0f);
    cpu.forward(0, llmc::FP8_FC, want_out.data(), inp.data(), w.data(), bias.data(), nullptr, BT, C, OC);
    cpu.backward(0, llmc::FP8_FC, want_dinp.data(), want_dw.data(), nullptr, dout.data(), inp.data(), w.data(), BT, C,
                 OC);

    DeviceBuffer<floatX> d_inp = bench::to_device_bf16(inp), d_w = bench::to_device_bf16(w);
    DeviceBuffer<floatX> d_bias = bench::to_device_bf16(bias), d_dout = bench::to_device_bf16(dout);
    DeviceBuffer<Fp8Scale> scales(3, "scales");  // inp, w, dout
    bench::upload(scales.get(), std::vector<Fp8Scale>(3));
    DeviceBuffer<uint8_t> inp8((size_t)BT * C, "inp8"), inp8t((size_t)BT * C, "inp8t");
    DeviceBuffer<uint8_t> w8((size_t)OC * C, "w8"), w8t((size_t)OC * C, "w8t");
    DeviceBuffer<uint8_t> dout8((size_t)BT * OC, "dout8"), dout8t((size_t)BT * OC, "dout8t");
    DeviceBuffer<floatX> out((size_t)BT * OC, "out"), dinp((size_t)BT * C, "dinp");
    DeviceBuffer<float> dw((size_t)OC * C, "dweight");
    auto run = [&] {
        using fp8::Format;
        Fp8Scale* s = scales.get();
        llmc::fp8_current_scale(s + 0, d_inp.get(), (size_t)BT * C, Format::E4M3, 0);
        llmc::fp8_current_scale(s + 1, d_w.get(), (size_t)OC * C, Format::E4M3, 0);
        llmc::fp8_current_scale(s + 2, d_dout.get(), (size_t)BT * OC, Format::E5M2, 0);
        llmc::fp8_cast(inp8.get(), inp8t.get(), s + 0, nullptr, d_inp.get(), BT, C, Format::E4M3, false, 0);
        llmc::fp8_cast(w8.get(), w8t.get(), s + 1, nullptr, d_w.get(), OC, C, Format::E4M3, false, 0);
        llmc::fp8_cast(dout8.get(), dout8t.get(), s + 2, nullptr, d_dout.get(), BT, OC, Format::E5M2, false, 0);
        const llmc::Fp8Tensor i{inp8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s + 0)}, it{inp8t.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s + 0)};
        const llmc::Fp8Tensor wq{w8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s + 1)}, wt{w8t.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s + 1)};
        const llmc::Fp8Tensor d{dout8.get(), CUDA_R_8F_E5M2, llmc::fp8_scale_inv(s + 2)}, dt{dout8t.get(), CUDA_R_8F_E5M2, llmc::fp8_scale_inv(s + 2)};
        bench::poison(out.get(), (size_t)BT * OC);
        bench::poison(dinp.get(), (size_t)BT * C);
        CUDA_CHECK(cudaMemset(dw.get(), 0, (size_t)OC * C * sizeof(float)));
        llmc::matmul_forward_fp8(ctx, out.get(), nullptr, i, wq, d_bias.get(), nullptr, BT, C, OC, 0);
        llmc::matmul_backward_dinp_fp8(ctx, dinp.get(), d, wt, BT, C, OC, 0);
        llmc::matmul_backward_dweight_fp8(ctx, dw.get(), dt, it, BT, C, OC, 0);
        return std::vector<std::vector<float>>{bench::to_host(out.get(), (size_t)BT * OC),
                                               bench::to_host(dinp.get(), (size_t)BT * C),
                                               bench::to_host(dw.get(), (size_t)OC * C)};
    };
    const auto got = run();
    bench::check("forward (bias epilogue)", got[0], want_out, bench::BF16_TOLERANCE);
    bench::check("dinp", got[1], want_dinp, bench::BF16_TOLERANCE);
    bench::check("dweight (fp32)", got[2], want_dw, FP8_ACCUMULATION_TOLERANCE);
    const auto again = run();
    for (int t = 0; t < 3; t++) bench::check_same_bits("run twice", got[t], again[t]);
    // The weight gradient with k cut into 4 slices of 16 rows (split_k.h): the codes' operands advanced
    // along their rows of k, the partials added in order.
    ctx.force_split_k(4);
    const auto split = run(), split_again = run();
    ctx.force_split_k(0);
    bench::check("dweight (fp32), k in 4 slices", split[2], want_dw, FP8_ACCUMULATION_TOLERANCE);
    bench::check_same_bits("dweight, k in 4 slices, run twice", split[2], split_again[2]);
    // The GELU epilogue on the same FP8 operands (the scales and copies of the last run).
    DeviceBuffer<floatX> pre((size_t)BT * OC, "pre_gelu");
    bench::poison(pre.get(), (size_t)BT * OC);
    const Fp8Scale* s = scales.get();
    llmc::matmul_forward_fp8(ctx, out.get(), pre.get(), {inp8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s)},
                             {w8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(s + 1)}, d_bias.get(), nullptr, BT, C, OC, 0);
    std::vector<float> want_gelu(want_out.size());
    llmc::cpu::gelu_forward(want_gelu.data(), want_out.data(), want_out.size());
    bench::check("forward, GELU epilogue: pre_gelu", bench::to_host(pre.get(), (size_t)BT * OC), want_out,
                 bench::BF16_TOLERANCE);
    bench::check("forward, GELU epilogue: out", bench::to_host(out.get(), (size_t)BT * OC), want_gelu,
                 bench::BF16_TOLERANCE);
}

// The byte transpose of codes, on a ragged shape (byte by byte) and a multiple of 8 (8 bytes at a time).
void check_transpose(std::mt19937_64& rng) {
    for (auto [rows, cols] : {std::pair{75, 53}, std::pair{200, 136}}) {
        std::vector<uint8_t> q((size_t)rows * cols), want(q.size());
        for (size_t i = 0; i < q.size(); i++) q[i] = (uint8_t)rng();
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) want[(size_t)c * rows + r] = q[(size_t)r * cols + c];
        DeviceBuffer<uint8_t> d_q(q.size(), "q"), d_qt(q.size(), "qt");
        bench::upload(d_q.get(), q);
        bench::poison(d_qt.get(), q.size());
        llmc::fp8_transpose(d_qt.get(), d_q.get(), rows, cols, 0);
        bench::check_same_bits(strformat("byte transpose %d x %d", rows, cols).c_str(),
                               bench::device_bytes(d_qt.get(), q.size()), want);
    }
}

// ZeRO-3's gather of a layer with its weights as codes (models/cuda/fp8_gather.cuh) for every rank
// of a group, run one after another on this device: each rank measures and packs its slices of every
// layer (its own Fp8WeightGather, as rank r's model makes it), the chunks are laid side by side as an
// all-gather would, and rank 0 unpacks them. Against the host: the scale of each weight from the amax
// of all of it, each code fp8.h's encode, the bf16 parameters' bits, the clipping counts and delayed
// scaling's step amax (the largest of the ranks').
struct GatherGroup {
    llmc::ModelConfig c;
    llmc::ParamLayout layout;
    std::vector<float> params;
    std::vector<llmc::ZeroPlan> plans;
    std::vector<llmc::Fp8WeightGather> gathers;  // rank r's
    std::vector<DeviceBuffer<floatX>> shards;    // rank r's parameter shard
    int tensors() const { return c.num_layers * llmc::FP8_PRODUCTS; }

    // A 2-layer model of `channels`, its parameters random (some to flush, layer 1's fc weight with
    // one large value, which its scale (64x the amax's) saturates), sharded over `world` ranks.
    GatherGroup(std::mt19937_64& rng, int channels, int world, size_t align)
        : c(model(channels)), layout(llmc::GPT2Params::layout(c)), params(bench::random_bf16(layout.num_params, rng, 0.05f)) {
        for (size_t i = 0; i < params.size(); i += 11) params[i] = bench::bf16_round(params[i] * 1e-9f);
        params[layout.offset(llmc::GPT2Params::FCW, 1) + 5] = 30.0f;
        for (int r = 0; r < world; r++) {
            plans.emplace_back(layout, 3, r, world, align);
            gathers.emplace_back(layout, llmc::Fp8BlockWeights(c), plans[r], (cudaStream_t)0);
            std::vector<float> shard(plans[r].shard_num_params, 0.0f);
            for (const llmc::ZeroPlan::Bucket& k : plans[r].buckets)
                for (size_t i = k.owned_begin; i < k.owned_end; i++)
                    shard[k.shard_offset + i - k.owned_begin] = params[k.begin + i];
            shards.push_back(bench::to_device_bf16(shard));
        }
    }
    static llmc::ModelConfig model(int channels) {
        llmc::ModelConfig m = llmc::model_preset("d4", 64, 250);
        m.channels = channels, m.num_heads = channels % 2 ? 5 : 2, m.num_layers = 2;
        return m;
    }
    // Weight t (layer t / 4, product t % 4) on the host, cast with `scale` (host_cast).
    HostCast host_weight(int t, float scale) const {
        const int w = llmc::GPT2Params::LINEAR_WEIGHTS[t % llmc::FP8_PRODUCTS];
        const float* x = params.data() + layout.offset(w, t / llmc::FP8_PRODUCTS);
        return host_cast(std::vector<float>(x, x + layout.tensor_size(w)), 1, (int)layout.tensor_size(w), scale,
                         fp8::Format::E4M3);
    }
};

// The scale each weight's whole amax gives, and layer 1's fc (t 6) 64x that, so that it saturates.
float gather_scale(int t, float amax) { return fp8::scale_for_amax(amax, fp8::Format::E4M3, 1.0f) * (t == 6 ? 64.0f : 1.0f); }

// Every rank measures and packs; the scales, the summed clipping and the step amaxes against the host.
void check_gather_pack(GatherGroup& g, DeviceBuffer<Fp8Scale>& scales, const std::vector<HostCast>& want) {
    const int n = g.tensors(), world = (int)g.gathers.size();
    DeviceBuffer<float> rank_amax((size_t)world * n, "every rank's amaxes");
    for (int r = 0; r < world; r++) g.gathers[r].measure(g.shards[r].get(), rank_amax.get() + (size_t)r * n);
    llmc::fp8_scales_from_ranks(scales.get() + 1, 3, rank_amax.get(), n, world, 0);
    std::vector<Fp8Scale> s(n * 3);
    CUDA_CHECK(cudaMemcpy(s.data(), scales.get(), sizeof(Fp8Scale) * s.size(), cudaMemcpyDeviceToHost));
    bool scales_ok = true;
    for (int t = 0; t < n; t++) {
        scales_ok = scales_ok && s[t * 3 + 1].scale * (t == 6 ? 64.0f : 1.0f) == gather_scale(t, want[t].amax);
        if (t == 6) s[t * 3 + 1].scale = gather_scale(t, want[t].amax), s[t * 3 + 1].scale_inv = 1.0f / s[t * 3 + 1].scale;
    }
    bench::report_check("scales from the ranks' amaxes", scales_ok, "");
    bench::upload(scales.get(), s);
    DeviceBuffer<llmc::Fp8Clip> rank_clips((size_t)world * n, "every rank's clipping"), clips(n, "clips");
    for (int r = 0; r < world; r++)
        g.gathers[r].pack(g.shards[r].get(), scales.get() + 1, 3, rank_clips.get() + (size_t)r * n, true);
    llmc::fp8_clip_sum(clips.get(), rank_clips.get(), n, world, 0);
    std::vector<llmc::Fp8Clip> got(n);
    CUDA_CHECK(cudaMemcpy(got.data(), clips.get(), sizeof(llmc::Fp8Clip) * n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(s.data(), scales.get(), sizeof(Fp8Scale) * s.size(), cudaMemcpyDeviceToHost));
    bool clips_ok = true, step_ok = true;
    for (int t = 0; t < n; t++) {
        clips_ok = clips_ok && got[t].elements == want[t].elements && got[t].overflows == want[t].overflows &&
                   got[t].underflows == want[t].underflows;
        step_ok = step_ok && s[t * 3 + 1].step_amax == want[t].amax;
    }
    bench::report_check("clipping counts summed over the ranks",
                        clips_ok && want[6].overflows > 0 && want[0].underflows > 0, "");
    bench::report_check("step amax: the largest of the ranks' slices", step_ok, "");
}

// Layer l's chunks, packed by every rank, unpacked by rank 0: its codes and its bf16 parameters.
void check_gather_unpack(GatherGroup& g, int l, const std::vector<HostCast>& want) {
    const int b = g.layout.layer_bucket(l);
    const size_t chunk = g.gathers[0].chunk_bytes(b);
    uint8_t* landing = g.gathers[0].landing(l % 2);
    for (size_t r = 0; r < g.gathers.size(); r++)
        CUDA_CHECK(cudaMemcpy(landing + r * chunk, g.gathers[r].packed(b), chunk, cudaMemcpyDeviceToDevice));
    const llmc::ZeroPlan::Bucket& k = g.plans[0].buckets[b];
    DeviceBuffer<floatX> whole(k.padded_extent, "the layer's bf16 buffer");
    bench::poison(whole.get(), k.padded_extent);
    g.gathers[0].unpack(b, l % 2, whole.get());
    for (int p = 0; p < llmc::FP8_PRODUCTS; p++) {
        const std::vector<uint8_t>& codes = want[l * llmc::FP8_PRODUCTS + p].q;
        bench::check_same_bits(strformat("layer %d %s weight's codes", l, llmc::fp8_product_name(p)).c_str(),
                               bench::device_bytes(g.gathers[0].codes(l, (llmc::Fp8Product)p), codes.size()), codes);
    }
    const std::vector<float> got = bench::to_host(whole.get(), k.size);
    const auto& weights = llmc::GPT2Params::LINEAR_WEIGHTS;
    bool plain_ok = true;
    for (int t = 0; t < g.layout.num_tensors(); t++) {
        if (!g.layout.is_per_layer(t) || std::count(std::begin(weights), std::end(weights), t)) continue;
        const size_t at = g.layout.offset_in_bucket(t, l);
        for (size_t i = 0; i < g.layout.tensor_size(t); i++) plain_ok = plain_ok && got[at + i] == g.params[k.begin + at + i];
    }
    bench::report_check(strformat("layer %d's other parameters, bf16", l).c_str(), plain_ok, "");
}

void check_gather(std::mt19937_64& rng, int channels, int world, size_t align) {
    printf(" gather: C %d, %d ranks, slices aligned to %zu\n", channels, world, align);
    GatherGroup g(rng, channels, world, align);
    std::vector<HostCast> want;
    for (int t = 0; t < g.tensors(); t++) {
        const float amax = g.host_weight(t, 1.0f).amax;
        want.push_back(g.host_weight(t, gather_scale(t, amax)));
    }
    DeviceBuffer<Fp8Scale> scales((size_t)g.tensors() * 3, "scales");  // a weight's at t * 3 + 1, as the model's
    bench::upload(scales.get(), std::vector<Fp8Scale>(g.tensors() * 3));
    check_gather_pack(g, scales, want);
    for (int l = 0; l < g.c.num_layers; l++) check_gather_unpack(g, l, want);
}

// Version 1's cast (the first GPU session's): 32 x 32 tiles, one element per thread (2-byte loads,
// 1-byte stores), three block-wide reductions for the clipping counts. Kept to time against llmc's.
// (A named namespace: the emulation build finds kernels by name, which nvcc and g++ give an
// anonymous namespace differently.)
}  // namespace
namespace v1 {
using llmc::Fp8Clip;
using llmc::WARP_SIZE;
using llmc::block_reduce_max;
using llmc::block_reduce_sum;
constexpr int V1_TILE = 32;
constexpr int V1_ROWS_PER_PASS = 8;

constexpr int V1_THREADS = V1_TILE * V1_ROWS_PER_PASS;

__global__ void __launch_bounds__(V1_THREADS)
    cast_kernel(uint8_t* q, uint8_t* qt, Fp8Scale* s, Fp8Clip* clip, const floatX* x, int rows, int cols,
                __nv_fp8_interpretation_t format, float largest, bool record_amax) {
    __shared__ uint8_t tile[V1_TILE][V1_TILE + 4];  // +4: the transposed reads fall in other banks
    __shared__ float shared[WARP_SIZE];
    const int tx = threadIdx.x % V1_TILE, ty = threadIdx.x / V1_TILE;  // a 1-D block: block_reduce's shape
    const int row0 = blockIdx.y * V1_TILE, col0 = blockIdx.x * V1_TILE;
    const float scale = s->scale;
    float amax = 0.0f;
    unsigned overflows = 0, underflows = 0, elements = 0;
    for (int r = ty; r < V1_TILE; r += V1_ROWS_PER_PASS) {
        const int row = row0 + r, col = col0 + tx;
        if (row >= rows || col >= cols) continue;
        const float v = __bfloat162float(x[(size_t)row * cols + col]);
        const float scaled = v * scale;
        const uint8_t code = (uint8_t)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, format);
        amax = fmaxf(amax, fabsf(v));
        elements++;
        overflows += fabsf(scaled) > largest;
        underflows += scaled != 0.0f && (code & 0x7f) == 0;
        q[(size_t)row * cols + col] = code;
        tile[r][tx] = code;
    }
    if (qt) {
        __syncthreads();
        for (int c = ty; c < V1_TILE; c += V1_ROWS_PER_PASS) {
            const int col = col0 + c, row = row0 + tx;
            if (row < rows && col < cols) qt[(size_t)col * rows + row] = tile[tx][c];
        }
    }
    // One atomic per block and counter.
    if (record_amax) {
        amax = block_reduce_max(amax, shared);
        if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(&s->step_amax), __float_as_uint(amax));
    }
    if (clip) {
        const float counts[3] = {(float)elements, (float)overflows, (float)underflows};
        unsigned long long* targets[3] = {&clip->elements, &clip->overflows, &clip->underflows};
        for (int i = 0; i < 3; i++) {
            const float total = block_reduce_sum(counts[i], shared);  // at most 1024: exact in fp32
            if (threadIdx.x == 0 && total > 0.0f) atomicAdd(targets[i], (unsigned long long)total);
        }
    }
}

void cast(uint8_t* q, uint8_t* qt, Fp8Scale* s, Fp8Clip* clip, const floatX* x, int rows, int cols, fp8::Format f,
          bool record_amax) {
    const dim3 grid(llmc::ceil_div(cols, V1_TILE), llmc::ceil_div(rows, V1_TILE));
    LLMC_LAUNCH(cast_kernel, grid, V1_THREADS, 0, 0)(q, qt, s, clip, x, rows, cols, llmc::fp8_interpretation(f),
                                                     fp8::info(f).largest, record_amax);
    CUDA_CHECK_LAUNCH();
}
}  // namespace v1
namespace {

// FP8 against bf16 on the fc products of GPT-2 124M and 1.5B (B 8 x T 1024), and the cast's speed.
void time_products(std::mt19937_64& rng, llmc::MatmulContext& ctx) {
    struct Layer {
        const char* name;
        int BT, C, OC;
    };
    for (const Layer& l : {Layer{"124M fc", 8192, 768, 3072}, Layer{"1.5B fc", 8192, 1600, 6400}}) {
        printf(" %s: BT %d, C %d, OC %d\n", l.name, l.BT, l.C, l.OC);
        DeviceBuffer<floatX> inp = bench::to_device_bf16(bench::random_bf16((size_t)l.BT * l.C, rng));
        DeviceBuffer<floatX> w = bench::to_device_bf16(bench::random_bf16((size_t)l.OC * l.C, rng, 0.02f));
        DeviceBuffer<floatX> out((size_t)l.BT * l.OC, "out");
        DeviceBuffer<Fp8Scale> scales(2, "scales");
        bench::upload(scales.get(), std::vector<Fp8Scale>(2));
        DeviceBuffer<uint8_t> inp8((size_t)l.BT * l.C, "inp8"), inp8t((size_t)l.BT * l.C, "inp8t");
        DeviceBuffer<uint8_t> w8((size_t)l.OC * l.C, "w8");
        llmc::fp8_current_scale(scales.get(), inp.get(), (size_t)l.BT * l.C, fp8::Format::E4M3, 0);
        llmc::fp8_current_scale(scales.get() + 1, w.get(), (size_t)l.OC * l.C, fp8::Format::E4M3, 0);
        llmc::fp8_cast(w8.get(), nullptr, scales.get() + 1, nullptr, w.get(), l.OC, l.C, fp8::Format::E4M3, false, 0);
        const double flops = 2.0 * l.BT * l.C * l.OC;
        bench::report_compute_bound("forward, bf16", bench::time_ms([&] {
            llmc::matmul_forward(ctx, out.get(), nullptr, inp.get(), w.get(), nullptr, nullptr, l.BT, l.C, l.OC, 0);
        }), flops);
        const llmc::Fp8Tensor i{inp8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(scales.get())};
        const llmc::Fp8Tensor wq{w8.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(scales.get() + 1)};
        bench::report_compute_bound("forward, fp8 product", bench::time_ms([&] {
            llmc::matmul_forward_fp8(ctx, out.get(), nullptr, i, wq, nullptr, nullptr, l.BT, l.C, l.OC, 0);
        }), flops);
        // the backward's two products, the gradient as random as the input (only the time counts)
        DeviceBuffer<floatX> dout = bench::to_device_bf16(bench::random_bf16((size_t)l.BT * l.OC, rng, 1e-3f));
        DeviceBuffer<floatX> dinp((size_t)l.BT * l.C, "dinp");
        DeviceBuffer<float> dw((size_t)l.OC * l.C, "dweight");
        DeviceBuffer<uint8_t> dout8((size_t)l.BT * l.OC, "dout8"), dout8t((size_t)l.BT * l.OC, "dout8t");
        DeviceBuffer<uint8_t> w8t((size_t)l.OC * l.C, "w8t");
        llmc::fp8_cast(inp8.get(), inp8t.get(), scales.get(), nullptr, inp.get(), l.BT, l.C, fp8::Format::E4M3, false,
                       0);
        llmc::fp8_cast(dout8.get(), dout8t.get(), scales.get(), nullptr, dout.get(), l.BT, l.OC, fp8::Format::E5M2,
                       false, 0);
        llmc::fp8_cast(w8.get(), w8t.get(), scales.get() + 1, nullptr, w.get(), l.OC, l.C, fp8::Format::E4M3, false, 0);
        bench::report_compute_bound("backward dinp, bf16", bench::time_ms([&] {
            llmc::matmul_backward(ctx, dinp.get(), nullptr, nullptr, nullptr, dout.get(), nullptr, w.get(), nullptr,
                                  l.BT, l.C, l.OC, 0);
        }), flops);
        const llmc::Fp8Tensor d{dout8.get(), CUDA_R_8F_E5M2, llmc::fp8_scale_inv(scales.get())};
        const llmc::Fp8Tensor dt{dout8t.get(), CUDA_R_8F_E5M2, llmc::fp8_scale_inv(scales.get())};
        const llmc::Fp8Tensor it{inp8t.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(scales.get())};
        const llmc::Fp8Tensor wt{w8t.get(), CUDA_R_8F_E4M3, llmc::fp8_scale_inv(scales.get() + 1)};
        bench::report_compute_bound("backward dinp, fp8 product", bench::time_ms([&] {
            llmc::matmul_backward_dinp_fp8(ctx, dinp.get(), d, wt, l.BT, l.C, l.OC, 0);
        }), flops);
        bench::report_compute_bound("backward dweight (fp32 +=), bf16", bench::time_ms([&] {
            llmc::matmul_backward(ctx, nullptr, dw.get(), nullptr, nullptr, dout.get(), inp.get(), nullptr, nullptr,
                                  l.BT, l.C, l.OC, 0);
        }), flops);
        bench::report_compute_bound("backward dweight (fp32 +=), fp8 product", bench::time_ms([&] {
            llmc::matmul_backward_dweight_fp8(ctx, dw.get(), dt, it, l.BT, l.C, l.OC, 0);
        }), flops);
        // the casts: current scaling's amax pass, then the cast with and without the transpose
        const size_t n = (size_t)l.BT * l.C;
        bench::report_memory_bound("amax of inp (current scaling)", bench::time_ms([&] {
            llmc::fp8_current_scale(scales.get(), inp.get(), n, fp8::Format::E4M3, 0);
        }), 2.0 * n);
        bench::report_memory_bound("cast inp", bench::time_ms([&] {
            llmc::fp8_cast(inp8.get(), nullptr, scales.get(), nullptr, inp.get(), l.BT, l.C, fp8::Format::E4M3, true, 0);
        }), 3.0 * n);
        bench::report_memory_bound("cast inp + transpose, version 1", bench::time_ms([&] {
            v1::cast(inp8.get(), inp8t.get(), scales.get(), nullptr, inp.get(), l.BT, l.C, fp8::Format::E4M3, true);
        }), 4.0 * n);
        bench::report_memory_bound("cast inp + transpose", bench::time_ms([&] {
            llmc::fp8_cast(inp8.get(), inp8t.get(), scales.get(), nullptr, inp.get(), l.BT, l.C, fp8::Format::E4M3,
                           true, 0);
        }), 4.0 * n);
        DeviceBuffer<llmc::Fp8Clip> clip(1, "clip");
        to_device(clip.get(), llmc::Fp8Clip{});
        bench::report_memory_bound("cast inp + transpose, counting clipping", bench::time_ms([&] {
            llmc::fp8_cast(inp8.get(), inp8t.get(), scales.get(), clip.get(), inp.get(), l.BT, l.C, fp8::Format::E4M3,
                           true, 0);
        }), 4.0 * n);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        std::mt19937_64 rng(opts.seed + 1);
        llmc::MatmulContext ctx;
        printf("llmc/kernels/fp8.cuh and the FP8 products of matmul.cuh\n");
        check_cast(rng, 75, 53);
        check_cast(rng, 200, 136);
        check_current_scale(rng);
        check_delayed_update();
        check_products(rng, ctx);
        check_transpose(rng);
        check_gather(rng, 35, 3, 1);
        check_gather(rng, 64, 2, 8);
        check_gather(rng, 64, 5, 8);
        if (!opts.check_only && !bench::EMULATED) time_products(rng, ctx);
    });
}
