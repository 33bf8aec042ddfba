// dev/cuda/moe.cu: the mixture-of-experts MLP of llmc/kernels/moe.cuh (routing, gather, the
// experts' products, combine, and the backward of all of it), one version:
//
//   1  llmc/kernels/moe.cuh: one warp per token routes, one block assigns, one product per expert
//
//   ./moe [version] [--check] [--seed N]
//
// Checked against cpu::moe_forward / cpu::moe_backward (llmc/cpu/moe.h) on fresh random bf16 inputs:
// the routing exactly (every choice, every assignment's number, the drops, the experts' row
// offsets), the probabilities and both auxiliary losses within FP32_TOLERANCE, the output, the input
// gradient and every weight gradient (the router's included) within BF16_TOLERANCE. Shapes: dropless;
// a capacity factor that drops; a router whose rows are all equal, so every score ties and the tie
// rule (the lower expert index) sends every token to expert 0 (top 1, the other experts get no row);
// and a larger one with drops and 8 experts. The run repeats its bits. Timed on GPT-2 124M's MLP with
// 8 experts, top 2 (BT 8192), against the bf16 peak for the experts' products; skipped emulated.
#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/cpu/moe.h"
#include "llmc/kernels/moe.cuh"

using bench::DeviceBuffer;
using llmc::floatX;
using llmc::strformat;
using llmc::cpu::MoeShape;

constexpr int NUM_VERSIONS = 1;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {"", "llmc/kernels/moe.cuh: per-expert cuBLASLt products"};

struct Case {
    const char* name;
    MoeShape shape;
    bool equal_router_rows;  // every score ties
};
const Case CASES[] = {
    {"dropless", {64, 64, 256, 4, 2, 0.0f}, false},
    {"capacity 0.5: drops", {64, 64, 256, 4, 2, 0.5f}, false},
    {"every token to expert 0 (ties)", {48, 64, 256, 4, 1, 0.0f}, true},
    {"8 experts, capacity 1.25", {200, 128, 512, 8, 2, 1.25f}, false},
};
constexpr float DBALANCE = 0.3f, DZ = 0.2f;  // large enough to show in the router's gradient

// One layer's weights, fp32 copies of bf16 values: router, fcw, fcb, fcprojw, fcprojb.
struct Weights {
    std::vector<float> t[5];
};
Weights random_weights(const MoeShape& s, bool equal_rows, std::mt19937_64& rng) {
    const size_t E = s.E, C = s.C, F = s.F;
    Weights w;
    w.t[0] = bench::random_bf16(E * C, rng, 0.5f);
    if (equal_rows)
        for (size_t e = 1; e < E; e++) std::copy(w.t[0].begin(), w.t[0].begin() + C, w.t[0].begin() + e * C);
    w.t[1] = bench::random_bf16(E * F * C, rng, 0.1f);
    w.t[2] = bench::random_bf16(E * F, rng, 0.1f);
    w.t[3] = bench::random_bf16(E * C * F, rng, 0.05f);
    w.t[4] = bench::random_bf16(E * C, rng, 0.1f);
    return w;
}

// What one run on the GPU gives back.
struct Result {
    std::vector<int> expert, slot;
    std::vector<float> probs, out, dx, grads[5];
    llmc::MoeSummary summary;
};

Result run_gpu(const MoeShape& s, const std::vector<float>& x, const std::vector<float>& dout, const Weights& w) {
    llmc::MatmulContext ctx;
    DeviceBuffer<char> memory(llmc::MoeMemory::bytes_for(s, 1), "moe memory");
    bench::poison(memory.get(), memory.count());  // a buffer read before it is written is NaN
    llmc::MoeMemory m(s, 1, memory.get());
    DeviceBuffer<floatX> d_x = bench::to_device_bf16(x), d_dout = bench::to_device_bf16(dout);
    DeviceBuffer<floatX> d_w[5];
    DeviceBuffer<float> d_g[5];
    for (int i = 0; i < 5; i++) {
        d_w[i] = bench::to_device_bf16(w.t[i]);
        d_g[i] = bench::to_device(std::vector<float>(w.t[i].size(), 0.0f));
    }
    const size_t N = s.rows, C = s.C;
    DeviceBuffer<floatX> d_out(N * C, "out"), d_dx(N * C, "dx");
    bench::poison(d_out.get(), N * C);
    bench::poison(d_dx.get(), N * C);
    llmc::PinnedBuffer<int> pinned(llmc::moe_summary_words(s.E), "summary");
    const llmc::MoeWeightsBf16 weights{d_w[0].get(), d_w[1].get(), d_w[2].get(), d_w[3].get(), d_w[4].get()};
    const llmc::MoeGradsF32 grads{d_g[0].get(), d_g[1].get(), d_g[2].get(), d_g[3].get(), d_g[4].get()};
    // out = 0 + MoE(x): the base is a zero tensor
    DeviceBuffer<floatX> zero = bench::to_device_bf16(std::vector<float>(N * C, 0.0f));
    Result r;
    r.summary = llmc::moe_forward(ctx, d_out.get(), zero.get(), m.block(0), d_x.get(), weights, s, pinned.get(), 0);
    llmc::moe_backward(ctx, d_dx.get(), false, grads, m.scratch(), d_dout.get(), d_x.get(), m.block(0), r.summary,
                       weights, s, DBALANCE, DZ, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.expert.resize(N * s.K), r.slot.resize(N * s.K);
    CUDA_CHECK(cudaMemcpy(r.expert.data(), m.block(0).expert, r.expert.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(r.slot.data(), m.block(0).slot, r.slot.size() * sizeof(int), cudaMemcpyDeviceToHost));
    r.probs = bench::to_host(m.block(0).probs, N * s.E);
    r.out = bench::to_host(d_out.get(), N * C);
    r.dx = bench::to_host(d_dx.get(), N * C);
    for (int i = 0; i < 5; i++) r.grads[i] = bench::to_host(d_g[i].get(), w.t[i].size());
    return r;
}

void check_routing(const Result& g, const llmc::cpu::MoeRouting& ref, const MoeShape& s) {
    bench::report_check("choices (top-K, ties low)", g.expert == ref.expert,
                        g.expert == ref.expert ? "all equal" : "DIFFER");
    bench::report_check("assignments (slots)", g.slot == ref.slot, g.slot == ref.slot ? "all equal" : "DIFFER");
    bench::report_check("experts' row offsets", g.summary.begin == ref.begin,
                        strformat("%d rows kept of %d", g.summary.assignments(), s.rows * s.K));
    bench::report_check("dropped", g.summary.dropped == ref.dropped,
                        strformat("%d, reference %d", g.summary.dropped, ref.dropped));
    bench::check("probabilities", g.probs, ref.probs, bench::FP32_TOLERANCE);
    bench::check("balance loss", {g.summary.balance_loss}, {(float)ref.balance_loss}, bench::FP32_TOLERANCE);
    bench::check("z loss", {g.summary.z_loss}, {(float)ref.z_loss}, bench::FP32_TOLERANCE);
    bench::check("choice shares", g.summary.share, ref.chosen_share, bench::FP32_TOLERANCE);
}

void check_case(int version, const Case& c, std::mt19937_64& rng) {
    (void)version;
    const MoeShape& s = c.shape;
    printf(" %s: rows %d, C %d, F %d, E %d, K %d, capacity factor %g\n", c.name, s.rows, s.C, s.F, s.E, s.K,
           (double)s.capacity_factor);
    const size_t N = s.rows, C = s.C;
    const std::vector<float> x = bench::random_bf16(N * C, rng), dout = bench::random_bf16(N * C, rng);
    const Weights w = random_weights(s, c.equal_router_rows, rng);

    llmc::cpu::MoeRouting routing;
    llmc::cpu::MoeActivations acts;
    llmc::cpu::MoeScratch scratch;
    std::vector<float> out(N * C), dx(N * C), grads[5];
    for (int i = 0; i < 5; i++) grads[i].assign(w.t[i].size(), 0.0f);
    const llmc::cpu::MoeWeights cw{w.t[0].data(), w.t[1].data(), w.t[2].data(), w.t[3].data(), w.t[4].data()};
    llmc::cpu::MoeGrads cg{grads[0].data(), grads[1].data(), grads[2].data(), grads[3].data(), grads[4].data()};
    llmc::cpu::moe_forward(out.data(), routing, acts, scratch, x.data(), cw, s);
    llmc::cpu::moe_backward(dx.data(), cg, scratch, dout.data(), x.data(), routing, acts, cw, s, DBALANCE, DZ);

    const Result g = run_gpu(s, x, dout, w);
    check_routing(g, routing, s);
    bench::check("output", g.out, out, bench::BF16_TOLERANCE);
    bench::check("input gradient", g.dx, dx, bench::BF16_TOLERANCE);
    const char* names[5] = {"router weight gradient", "fc weight gradient", "fc bias gradient",
                            "fc proj weight gradient", "fc proj bias gradient"};
    for (int i = 0; i < 5; i++) bench::check(names[i], g.grads[i], grads[i], bench::BF16_TOLERANCE);
    const Result again = run_gpu(s, x, dout, w);
    bench::check_same_bits("output, run twice", g.out, again.out);
    bench::check_same_bits("input gradient, run twice", g.dx, again.dx);
    bench::check_same_bits("router gradient, run twice", g.grads[0], again.grads[0]);
}

void time_version(std::mt19937_64& rng) {
    const MoeShape s{8192, 768, 3072, 8, 2, 0.0f};
    printf(" GPT-2 124M MLP, 8 experts, top 2: rows %d\n", s.rows);
    const size_t N = s.rows, C = s.C;
    llmc::MatmulContext ctx;
    DeviceBuffer<char> memory(llmc::MoeMemory::bytes_for(s, 1), "moe memory");
    llmc::MoeMemory m(s, 1, memory.get());
    const Weights w = random_weights(s, false, rng);
    DeviceBuffer<floatX> d_w[5];
    DeviceBuffer<float> d_g[5];
    for (int i = 0; i < 5; i++) {
        d_w[i] = bench::to_device_bf16(w.t[i]);
        d_g[i] = bench::to_device(std::vector<float>(w.t[i].size(), 0.0f));
    }
    DeviceBuffer<floatX> x = bench::to_device_bf16(bench::random_bf16(N * C, rng));
    DeviceBuffer<floatX> dout = bench::to_device_bf16(bench::random_bf16(N * C, rng));
    DeviceBuffer<floatX> out(N * C, "out"), dx(N * C, "dx");
    llmc::PinnedBuffer<int> pinned(llmc::moe_summary_words(s.E), "summary");
    const llmc::MoeWeightsBf16 weights{d_w[0].get(), d_w[1].get(), d_w[2].get(), d_w[3].get(), d_w[4].get()};
    const llmc::MoeGradsF32 grads{d_g[0].get(), d_g[1].get(), d_g[2].get(), d_g[3].get(), d_g[4].get()};
    llmc::MoeSummary summary;
    const double flops = 2.0 * N * s.K * 2.0 * C * s.F;  // the experts' two products, forward
    const float forward_ms = bench::time_ms([&] {
        summary = llmc::moe_forward(ctx, out.get(), x.get(), m.block(0), x.get(), weights, s, pinned.get(), 0);
    });
    bench::report_compute_bound("forward (with its sync)", forward_ms, flops);
    const float backward_ms = bench::time_ms([&] {
        llmc::moe_backward(ctx, dx.get(), false, grads, m.scratch(), dout.get(), x.get(), m.block(0), summary,
                           weights, s, DBALANCE, DZ, 0);
    });
    bench::report_compute_bound("backward", backward_ms, 2.0 * flops);
}

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        for (int version = 1; version <= NUM_VERSIONS; version++) {
            if (!opts.runs(version)) continue;
            std::mt19937_64 rng(opts.seed + version);
            printf("version %d: %s\n", version, VERSION_NAMES[version]);
            for (const Case& c : CASES) check_case(version, c, rng);
            if (!opts.check_only && !bench::EMULATED) time_version(rng);
        }
    });
}
