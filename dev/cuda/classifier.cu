// classifier.cu: workbench for the fused classifier (llmc/classifier.cuh): per-row softmax
// cross-entropy loss, and with write_dlogits the logits overwritten in place by their gradient.
//
//   v1  one thread per row: max, sum and write passes over the row, scalar loads (the baseline)
//   v2  llmc::fused_classifier: one block per row, online softmax in one 16-byte-vector pass, then
//       the write pass re-reads the row from L2
//
// Checked against llmc::cpu::crossentropy on GPT-2 124M rows (V = 50257, Vp = 50304) and on small
// awkward shapes; timed on 8192 rows (B*T of a GPT-2 micro-batch 8 x 1024). Emulated (dev/emu/),
// the 1024 GPT-2 rows are skipped (bench::skip_when_emulated) and 8 rows of that vocabulary checked.
// Tolerances: row_loss uses FP32_TOLERANCE: the same fp32 formula as the CPU (max + log(sum) -
// target), only the exp implementation (CUDA expf vs fast_exp, both within ~2 ulp) and the
// summation order differ, which moves a loss of ~13 by ~1e-6 at most. dlogits are bf16, so
// BF16_TOLERANCE; they are also checked with the target columns left out, since the -dloss at the
// target dominates the norm and would hide errors in the softmax part.
// Floors: loss only reads the logits once (rows * Vp * 2 bytes); with dlogits the DRAM minimum is
// one read and one write (2 * rows * Vp * 2 bytes), the second read being an L2 hit.
#include "dev/cuda/common.cuh"
#include "llmc/kernels/classifier.cuh"
// cpu/gemm.h's `#pragma GCC unroll` hints are for g++; nvcc's front end would warn that it does not know them.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#include "llmc/cpu/ops.h"
#pragma nv_diagnostic pop

using llmc::floatX;

// ---- v1: one thread per row ----

__global__ void classifier_v1_kernel(floatX* logits, float* row_loss, const int* targets, float dloss, int rows,
                                     int V, int Vp, bool write_dlogits) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    floatX* x = logits + (size_t)row * Vp;
    const int target = targets[row];
    float row_max = -INFINITY;
    for (int v = 0; v < V; v++) row_max = fmaxf(row_max, (float)x[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += expf((float)x[v] - row_max);
    row_loss[row] = row_max + logf(sum) - (float)x[target];
    if (!write_dlogits) return;
    const float scale = dloss / sum;
    for (int v = 0; v < V; v++) {
        float g = expf((float)x[v] - row_max) * scale;
        if (v == target) g -= dloss;
        x[v] = __float2bfloat16_rn(g);
    }
    for (int v = V; v < Vp; v++) x[v] = __float2bfloat16_rn(0.0f);
}

void classifier_v1(floatX* logits, float* row_loss, const int* targets, float dloss, int rows, int V, int Vp,
                   bool write_dlogits, cudaStream_t stream) {
    const int block_size = 128;
    LLMC_LAUNCH(classifier_v1_kernel, llmc::ceil_div(rows, block_size), block_size, 0, stream)(logits, row_loss, targets, dloss,
                                                                                      rows, V, Vp, write_dlogits);
    CUDA_CHECK_LAUNCH();
}

// ---- versions ----

using ClassifierFn = void (*)(floatX*, float*, const int*, float, int, int, int, bool, cudaStream_t);
struct Version {
    const char* name;
    ClassifierFn fn;
};
const Version VERSIONS[] = {
    {"v1 one thread per row", classifier_v1},
    {"v2 llmc::fused_classifier", llmc::fused_classifier},
};
constexpr int NUM_VERSIONS = sizeof(VERSIONS) / sizeof(VERSIONS[0]);

struct Shape {
    const char* name;
    int rows, V, Vp;
    int timed_rows;  // 0: not timed; else the check rows are tiled up to this many for timing
};
const Shape SHAPES[] = {
    {"GPT-2 124M, 1024 rows", 1024, 50257, 50304, 8192},
    {"3 rows, V 100, Vp 128", 3, 100, 128, 0},
    {"37 rows, V 9001, Vp 9008", 37, 9001, 9008, 0},
};
// Emulated only, where the GPT-2 shape is skipped: its vocabulary on a few rows.
const Shape EMULATED_SHAPES[] = {
    {"8 rows, V 50257, Vp 50304", 8, 50257, 50304, 0},
};

// The gradient with the target column of each row zeroed, so the softmax part is compared on its own.
std::vector<float> without_targets(std::vector<float> dlogits, const std::vector<int>& targets, int Vp) {
    for (size_t r = 0; r < targets.size(); r++) dlogits[r * Vp + targets[r]] = 0.0f;
    return dlogits;
}

void run_shape(const Version& version, const Shape& s, const bench::Options& opt, std::mt19937_64& rng) {
    printf("%s, %s\n", version.name, s.name);
    if (bench::skip_when_emulated("rows Vp", (double)s.rows * s.Vp)) return;
    const size_t elems = (size_t)s.rows * s.Vp;
    // The padding columns hold random values too: the kernel must ignore them and write zeros.
    const std::vector<float> logits = bench::random_bf16(elems, rng, 2.0f);
    const std::vector<int> targets = bench::random_tokens(s.rows, s.V, rng);
    const float dloss = 1.0f / s.rows;

    std::vector<float> ref_loss(s.rows), ref_dlogits = logits;
    llmc::cpu::crossentropy(ref_loss.data(), ref_dlogits.data(), targets.data(), true, dloss, s.rows, s.V, s.Vp);

    bench::DeviceBuffer<floatX> d_logits = bench::to_device_bf16(logits);
    bench::DeviceBuffer<int> d_targets = bench::to_device(targets);
    bench::DeviceBuffer<float> d_loss(s.rows, "row_loss");

    // Loss only: the logits stay as they were.
    bench::poison(d_loss.get(), s.rows);
    version.fn(d_logits.get(), d_loss.get(), d_targets.get(), dloss, s.rows, s.V, s.Vp, false, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check("row_loss (loss only)", bench::to_host(d_loss.get(), s.rows), ref_loss, bench::FP32_TOLERANCE);
    bench::check_same_bits("logits untouched", bench::to_host(d_logits.get(), elems), logits);

    // Loss and dlogits in place.
    bench::poison(d_loss.get(), s.rows);
    version.fn(d_logits.get(), d_loss.get(), d_targets.get(), dloss, s.rows, s.V, s.Vp, true, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> loss = bench::to_host(d_loss.get(), s.rows);
    const std::vector<float> dlogits = bench::to_host(d_logits.get(), elems);
    bench::check("row_loss", loss, ref_loss, bench::FP32_TOLERANCE);
    bench::check("dlogits", dlogits, ref_dlogits, bench::BF16_TOLERANCE);
    bench::check("dlogits off the targets", without_targets(dlogits, targets, s.Vp),
                 without_targets(ref_dlogits, targets, s.Vp), bench::BF16_TOLERANCE);

    // Determinism: the same input again gives the same bits.
    bench::DeviceBuffer<floatX> d_again = bench::to_device_bf16(logits);
    bench::poison(d_loss.get(), s.rows);
    version.fn(d_again.get(), d_loss.get(), d_targets.get(), dloss, s.rows, s.V, s.Vp, true, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check_same_bits("row_loss, second run", bench::to_host(d_loss.get(), s.rows), loss);
    bench::check_same_bits("dlogits, second run", bench::to_host(d_again.get(), elems), dlogits);

    if (opt.check_only || s.timed_rows == 0) return;
    // Timing rows: the checked logits tiled (value statistics are what matter for speed). Repeated
    // in-place runs turn them into gradients of gradients, which costs the same.
    const int rows = s.timed_rows;
    bench::DeviceBuffer<floatX> d_big((size_t)rows * s.Vp, "timing logits");
    bench::DeviceBuffer<int> d_big_targets(rows, "timing targets");
    bench::DeviceBuffer<float> d_big_loss(rows, "timing row_loss");
    bench::DeviceBuffer<floatX> d_fresh = bench::to_device_bf16(logits);
    for (int r = 0; r < rows; r += s.rows) {
        const int n = std::min(s.rows, rows - r);
        CUDA_CHECK(cudaMemcpy(d_big.get() + (size_t)r * s.Vp, d_fresh.get(), (size_t)n * s.Vp * sizeof(floatX),
                              cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaMemcpy(d_big_targets.get() + r, d_targets.get(), n * sizeof(int), cudaMemcpyDeviceToDevice));
    }
    const double bytes_read = (double)rows * s.Vp * sizeof(floatX);
    char label[64];
    snprintf(label, sizeof(label), "%d rows, loss only", rows);
    bench::report_memory_bound(label, bench::time_ms([&] {
        version.fn(d_big.get(), d_big_loss.get(), d_big_targets.get(), dloss, rows, s.V, s.Vp, false, 0);
    }), bytes_read);
    snprintf(label, sizeof(label), "%d rows, loss + dlogits", rows);
    bench::report_memory_bound(label, bench::time_ms([&] {
        version.fn(d_big.get(), d_big_loss.get(), d_big_targets.get(), dloss, rows, s.V, s.Vp, true, 0);
    }), 2.0 * bytes_read);
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        for (int v = 1; v <= NUM_VERSIONS; v++) {
            if (!opt.runs(v)) continue;
            std::mt19937_64 rng(opt.seed);  // per version, so `classifier 2 --seed N` sees the same inputs
            for (const Shape& s : SHAPES) run_shape(VERSIONS[v - 1], s, opt, rng);
            if (bench::EMULATED)
                for (const Shape& s : EMULATED_SHAPES) run_shape(VERSIONS[v - 1], s, opt, rng);
        }
    });
}
