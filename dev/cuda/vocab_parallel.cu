// vocab_parallel.cu: workbench for the tensor-parallel kernels of the CUDA model, each checked against
// the CPU reference's tensor-parallel functions (llmc/cpu/ops.h) with every rank of a tp group
// simulated on one GPU, one vocabulary slice (or row block) at a time:
//
//   embedding   llmc::embedding_forward_range on each rank's wte rows, summed over the ranks, then
//               llmc::add_positions on each rank's rows (sequence parallel): against
//               cpu::embedding_forward_range + cpu::add_positions, and against the 1-rank
//               llmc::encoder_forward (the same bits: the sum adds zeros only, one rounding after);
//               add_positions at given positions (context parallelism) against cpu::add_positions
//   classifier  llmc::classifier_local_stats on each slice, the stats concatenated in rank order (the
//               all-gather), llmc::classifier_from_stats on each slice: losses and dlogits against
//               cpu::crossentropy_local_stats / crossentropy_from_stats, and against the 1-rank
//               cpu::crossentropy on the whole rows
//   encoder backward  llmc::EncoderBackward with each rank's vocabulary range: against
//               cpu::encoder_backward with the same range
//   bias_residual_add  out = base + sum + bias against the fp32 sum rounded once
//
// One version each (these kernels are not tuned here; the timed kernels they mirror are
// classifier.cu and encoder_backward.cu). tp = 2 and 4 over a vocabulary whose last slice is partly
// padding (and, at tp 4, one slice all padding), so the masking of padded columns is exercised.
// Emulated (dev/emu/), the GPT-2 vocabulary shape is skipped (bench::skip_when_emulated) and that
// vocabulary checked on 8 rows instead.
//   dev/cuda/build/vocab_parallel --check
#include <climits>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/matmul.cuh"
// cpu/gemm.h's `#pragma GCC unroll` hints are for g++; nvcc's front end would warn that it does not know them.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#include "llmc/cpu/ops.h"
#pragma nv_diagnostic pop

using llmc::floatX;

struct Shape {
    const char* name;
    int B, T, C, V, Vp, tp;
};
// Vp / tp is a multiple of 8 (the kernels' 16-byte vectors); V leaves the last slice(s) padding.
const Shape SHAPES[] = {
    {"tp 2: B 2, T 16, C 64, V 250, Vp 256", 2, 16, 64, 250, 256, 2},
    {"tp 4: B 3, T 8, C 32, V 180, Vp 256 (the last slice all padding)", 3, 8, 32, 180, 256, 4},
    {"tp 2: B 4, T 64, C 768, V 50257, Vp 50304", 4, 64, 768, 50257, 50304, 2},
};
// Emulated only, where the GPT-2 vocabulary shape is skipped: that vocabulary on 8 rows, C 64.
const Shape EMULATED_SHAPES[] = {
    {"tp 2: B 2, T 4, C 64, V 50257, Vp 50304", 2, 4, 64, 50257, 50304, 2},
};

void check_embedding(const Shape& s, std::mt19937_64& rng) {
    const int BT = s.B * s.T, C = s.C, Vl = s.Vp / s.tp, n = BT / s.tp;
    const std::vector<float> wte = bench::random_bf16((size_t)s.Vp * C, rng);
    const std::vector<float> wpe = bench::random_bf16((size_t)s.T * C, rng);
    const std::vector<int> tokens = bench::random_tokens(BT, s.V, rng);
    bench::DeviceBuffer<int> d_tokens = bench::to_device(tokens);
    bench::DeviceBuffer<floatX> d_wte = bench::to_device_bf16(wte), d_wpe = bench::to_device_bf16(wpe);
    bench::DeviceBuffer<floatX> d_part((size_t)BT * C, "partial embedding");

    // The reduction over ranks, on the host: each rank's partial rows, summed in rank order.
    std::vector<float> sum((size_t)BT * C, 0.0f), ref_part((size_t)BT * C);
    for (int r = 0; r < s.tp; r++) {
        const int begin = r * Vl;
        bench::poison(d_part.get(), (size_t)BT * C);
        llmc::embedding_forward_range(d_part.get(), d_tokens.get(), d_wte.get() + (size_t)begin * C, begin,
                                      begin + Vl, BT, C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> part = bench::to_host(d_part.get(), (size_t)BT * C);
        llmc::cpu::embedding_forward_range(ref_part.data(), tokens.data(), wte.data() + (size_t)begin * C, begin,
                                           begin + Vl, BT, C);
        bench::check_same_bits("embedding_forward_range (one rank's partial rows)", part, ref_part);
        for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
    }
    // Sequence parallel: each rank adds the positions to its n rows of the sum.
    bench::DeviceBuffer<floatX> d_sum = bench::to_device_bf16(sum);
    bench::DeviceBuffer<floatX> d_out((size_t)BT * C, "embedding");
    std::vector<float> ref((size_t)BT * C);
    for (int r = 0; r < s.tp; r++)
        llmc::add_positions(d_out.get() + (size_t)r * n * C, d_sum.get() + (size_t)r * n * C, d_wpe.get(), r * n, n,
                            s.T, C, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> out = bench::to_host(d_out.get(), (size_t)BT * C);
    llmc::cpu::add_positions(ref.data(), sum.data(), wpe.data(), 0, BT, s.T, C);
    for (float& x : ref) x = bench::bf16_round(x);
    bench::check_same_bits("add_positions (each rank's rows) = cpu::add_positions rounded to bf16", out, ref);
    // The 1-rank encoder gives the same bits: the sum over ranks only added zeros.
    llmc::encoder_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), s.B, s.T, C, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check_same_bits("vocabulary-parallel embedding = encoder_forward", out,
                           bench::to_host(d_out.get(), (size_t)BT * C));
    // Context parallelism: the rows hold given positions of each sequence (here in reverse order).
    std::vector<int> positions(s.T);
    for (int t = 0; t < s.T; t++) positions[t] = s.T - 1 - t;
    bench::DeviceBuffer<int> d_positions = bench::to_device(positions);
    for (int r = 0; r < s.tp; r++)
        llmc::add_positions(d_out.get() + (size_t)r * n * C, d_sum.get() + (size_t)r * n * C, d_wpe.get(), r * n, n,
                            s.T, C, 0, d_positions.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    llmc::cpu::add_positions(ref.data(), sum.data(), wpe.data(), 0, BT, s.T, C, positions.data());
    for (float& x : ref) x = bench::bf16_round(x);
    bench::check_same_bits("add_positions at given positions = cpu::add_positions rounded to bf16",
                           bench::to_host(d_out.get(), (size_t)BT * C), ref);
}

void check_classifier(const Shape& s, std::mt19937_64& rng) {
    const int rows = s.B * s.T, Vl = s.Vp / s.tp;
    const std::vector<float> logits = bench::random_bf16((size_t)rows * s.Vp, rng, 2.0f);
    const std::vector<int> targets = bench::random_tokens(rows, s.V, rng);
    const float dloss = 1.0f / rows;
    bench::DeviceBuffer<int> d_targets = bench::to_device(targets);
    bench::DeviceBuffer<float> d_stats((size_t)rows * 3 * s.tp, "every rank's stats");
    bench::DeviceBuffer<float> d_loss(rows, "row_loss");

    // Each rank's slice of the logits (rows x Vl), as the model holds it.
    std::vector<std::vector<float>> slices(s.tp, std::vector<float>((size_t)rows * Vl));
    for (int r = 0; r < s.tp; r++)
        for (int i = 0; i < rows; i++)
            std::copy(logits.begin() + (size_t)i * s.Vp + (size_t)r * Vl,
                      logits.begin() + (size_t)i * s.Vp + (size_t)(r + 1) * Vl, slices[r].begin() + (size_t)i * Vl);
    auto real_of = [&](int r) { return std::clamp(s.V - r * Vl, 0, Vl); };

    std::vector<float> ref_stats((size_t)rows * 3 * s.tp);
    std::vector<bench::DeviceBuffer<floatX>> d_slices;
    for (int r = 0; r < s.tp; r++) {
        d_slices.push_back(bench::to_device_bf16(slices[r]));
        llmc::classifier_local_stats(d_stats.get() + (size_t)r * rows * 3, d_slices[r].get(), d_targets.get(), rows,
                                     r * Vl, real_of(r), Vl, 0);
        llmc::cpu::crossentropy_local_stats(ref_stats.data() + (size_t)r * rows * 3, slices[r].data(), targets.data(),
                                            rows, r * Vl, real_of(r), Vl);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < s.tp; r++) {
        const std::vector<float> stats = bench::to_host(d_stats.get() + (size_t)r * rows * 3, (size_t)rows * 3);
        if (real_of(r) > 0) {
            bench::check("local stats (max, sum of exp, target logit)", stats,
                         std::vector<float>(ref_stats.begin() + (size_t)r * rows * 3,
                                            ref_stats.begin() + (size_t)(r + 1) * rows * 3),
                         bench::FP32_TOLERANCE);
            continue;
        }
        // A slice of padding only: max -inf, sum 0, no target (rel_error would call -inf a failure).
        bool ok = true;
        for (int i = 0; i < rows; i++)
            ok = ok && stats[3 * i] == -INFINITY && stats[3 * i + 1] == 0.0f && stats[3 * i + 2] == 0.0f;
        bench::report_check("local stats of a padding slice", ok, ok ? "max -inf, sum 0, target 0" : "wrong");
    }

    // The 1-rank loss and dlogits of the whole rows: what the slices together must give.
    std::vector<float> whole_loss(rows), whole_dlogits = logits;
    llmc::cpu::crossentropy(whole_loss.data(), whole_dlogits.data(), targets.data(), true, dloss, rows, s.V, s.Vp);
    for (int r = 0; r < s.tp; r++) {
        std::vector<float> ref_loss(rows), ref_dlogits = slices[r];
        llmc::cpu::crossentropy_from_stats(ref_loss.data(), ref_dlogits.data(), targets.data(), ref_stats.data(),
                                           s.tp, true, dloss, rows, r * Vl, real_of(r), Vl);
        bench::poison(d_loss.get(), rows);
        llmc::classifier_from_stats(d_slices[r].get(), d_loss.get(), d_targets.get(), d_stats.get(), s.tp, dloss,
                                    rows, s.V, r * Vl, real_of(r), Vl, true, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> loss = bench::to_host(d_loss.get(), rows);
        const std::vector<float> dlogits = bench::to_host(d_slices[r].get(), (size_t)rows * Vl);
        bench::check("row_loss from every rank's stats", loss, ref_loss, bench::FP32_TOLERANCE);
        bench::check("row_loss = the 1-rank cross-entropy", loss, whole_loss, bench::FP32_TOLERANCE);
        bench::check("dlogits of the slice", dlogits, ref_dlogits, bench::BF16_TOLERANCE);
        std::vector<float> whole_slice((size_t)rows * Vl);
        for (int i = 0; i < rows; i++)
            std::copy(whole_dlogits.begin() + (size_t)i * s.Vp + (size_t)r * Vl,
                      whole_dlogits.begin() + (size_t)i * s.Vp + (size_t)(r + 1) * Vl,
                      whole_slice.begin() + (size_t)i * Vl);
        bench::check("dlogits of the slice = the 1-rank dlogits' columns", dlogits, whole_slice,
                     bench::BF16_TOLERANCE);
    }
}

void check_encoder_backward(const Shape& s, std::mt19937_64& rng) {
    const int BT = s.B * s.T, C = s.C, Vl = s.Vp / s.tp;
    const std::vector<float> dout = bench::random_bf16((size_t)BT * C, rng);
    const std::vector<int> tokens = bench::random_tokens(BT, s.V, rng);
    bench::DeviceBuffer<floatX> d_dout = bench::to_device_bf16(dout);
    llmc::EncoderBackward encoder(s.B, s.T);
    for (int r = 0; r < s.tp; r++) {
        const int begin = r * Vl;
        const std::vector<float> dwte0 = bench::random_f32((size_t)Vl * C, rng), dwpe0 = bench::random_f32((size_t)s.T * C, rng);
        std::vector<float> ref_dwte = dwte0, ref_dwpe = dwpe0;
        llmc::cpu::encoder_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), tokens.data(), s.B, s.T, C, begin,
                                    begin + Vl);
        bench::DeviceBuffer<float> d_dwte = bench::to_device(dwte0), d_dwpe = bench::to_device(dwpe0);
        encoder.prepare(tokens.data(), s.B, s.T, 0, begin, begin + Vl);
        encoder.backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), s.B, s.T, C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check("dwte (this rank's vocabulary rows)", bench::to_host(d_dwte.get(), (size_t)Vl * C), ref_dwte,
                     bench::FP32_TOLERANCE);
        bench::check("dwpe", bench::to_host(d_dwpe.get(), (size_t)s.T * C), ref_dwpe, bench::FP32_TOLERANCE);
    }
}

void check_bias_residual_add(const Shape& s, std::mt19937_64& rng) {
    const int rows = s.B * s.T / s.tp, C = s.C;
    const std::vector<float> sum = bench::random_bf16((size_t)rows * C, rng), base = bench::random_bf16((size_t)rows * C, rng);
    const std::vector<float> bias = bench::random_bf16(C, rng);
    bench::DeviceBuffer<floatX> d_sum = bench::to_device_bf16(sum), d_base = bench::to_device_bf16(base);
    bench::DeviceBuffer<floatX> d_bias = bench::to_device_bf16(bias);
    std::vector<float> ref((size_t)rows * C);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < C; c++)
            ref[(size_t)r * C + c] = bench::bf16_round(base[(size_t)r * C + c] + sum[(size_t)r * C + c] + bias[c]);
    llmc::bias_residual_add(d_sum.get(), d_sum.get(), d_bias.get(), d_base.get(), rows, C, 0);  // in place
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check_same_bits("bias_residual_add (in place) = base + sum + bias rounded once",
                           bench::to_host(d_sum.get(), (size_t)rows * C), ref);
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, 1);
    return bench::run_and_finish(argv[0], [&] {
        std::mt19937_64 rng(opt.seed);
        auto run = [&](const Shape& s) {
            printf("%s\n", s.name);
            if (bench::skip_when_emulated("B T Vp + Vp C", (double)s.B * s.T * s.Vp + (double)s.Vp * s.C)) return;
            check_embedding(s, rng);
            check_classifier(s, rng);
            check_encoder_backward(s, rng);
            check_bias_residual_add(s, rng);
        };
        for (const Shape& s : SHAPES) run(s);
        if (bench::EMULATED)
            for (const Shape& s : EMULATED_SHAPES) run(s);
    });
}
