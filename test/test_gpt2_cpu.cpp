// Tests of the fp32 CPU GPT-2 (llmc/models/cpu_model.h) against the float64 PyTorch oracle written by
// dev/ref/make_fixture.py, plus the model file format, init, AdamW ranges and determinism.
// Comparisons use relative error per tensor, ||a - b|| / ||b||, which is +inf whenever `a` holds a
// NaN or an infinity, so a broken computation can never pass.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "llmc/models/cpu_model.h"
#include "llmc/models/model_file.h"
#include "llmc/text/sampler.h"
#include "llmc/utils.h"
#include "test/file_order.h"
#include "test/model_fixture.h"
#include "test/rel_error.h"

using namespace llmc;
using namespace llmc::test;

namespace {

const char* MODEL_PATH = "test/fixtures/gpt2_tiny_model.bin";
const char* STATE_PATH = "test/fixtures/gpt2_tiny_state.bin";
const char* MOE_MODEL_PATH = "test/fixtures/gpt2_moe_tiny_model.bin";  // make_fixture.py --moe
const char* MOE_STATE_PATH = "test/fixtures/gpt2_moe_tiny_state.bin";
const Fixture& fixture() {
    static const Fixture f(MODEL_PATH, STATE_PATH);
    return f;
}
const Fixture& moe_fixture() {
    static const Fixture f(MOE_MODEL_PATH, MOE_STATE_PATH);
    return f;
}

std::vector<char> read_bytes(const std::string& path) {
    File f(path, "rb");
    std::vector<char> bytes(f.size());
    f.read(bytes.data(), bytes.size(), "bytes");
    return bytes;
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    File f(path, "wb");
    f.write(bytes.data(), bytes.size());
    f.close();
}

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("llmc_test_" + std::to_string(getpid()) + "_" + name)).string();
}

// Restores the OpenMP thread count when a test changes it.
struct ThreadCount {
    int saved = omp_get_max_threads();
    explicit ThreadCount(int n) { omp_set_num_threads(n); }
    ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace

TEST_CASE("forward logits and loss match the PyTorch reference", "[gpt2]") { check_forward(fixture()); }

TEST_CASE("next_token_logits is the last position's row of the causal forward", "[gpt2]") {
    const Fixture& fx = fixture();
    CPUModel model(fx.config, fx.B, fx.T);
    model.load(MODEL_PATH);
    const int V = fx.config.vocab_size;
    std::vector<float> out(fx.config.padded_vocab_size);
    for (int T : {1, 5, fx.T}) {
        CAPTURE(T);
        const int b = 1;  // any row: causality means the prefix alone decides position T-1
        model.next_token_logits(fx.inputs.data() + (size_t)b * fx.T, T, out.data());
        const float* expected = fx.logits.data() + ((size_t)b * fx.T + T - 1) * V;
        CHECK(rel_error(out.data(), expected, V) <= 1e-4);
    }
}

TEST_CASE("generate hands each token to the caller as it is drawn (--prompt prints them as they come)", "[gpt2]") {
    const Fixture& fx = fixture();
    CPUModel model(fx.config, fx.B, fx.T);
    model.load(MODEL_PATH);
    std::vector<int> tokens = {fx.inputs[0], fx.inputs[1]};
    std::vector<int> handed;
    Rng rng(7);
    generate(model, tokens, 5, 1.0f, rng, [&](int id) {
        CHECK(id == tokens.back());  // handed over right after it was drawn, before the next one
        handed.push_back(id);
    });
    CHECK(handed == std::vector<int>(tokens.begin() + 2, tokens.end()));
    std::vector<int> again = {fx.inputs[0], fx.inputs[1]};
    Rng same(7);
    generate(model, again, 5, 1.0f, same);
    CHECK(again == tokens);  // the callback changes nothing drawn
}

TEST_CASE("gradients match the PyTorch reference tensor by tensor", "[gpt2]") { check_gradients(fixture()); }

TEST_CASE("ten AdamW steps with grad clipping follow the PyTorch losses", "[gpt2]") { check_adamw_steps(fixture()); }

// The mixture-of-experts model (make_fixture.py --moe: layer 1 of 2 with 4 experts, top 2): the
// same checks, its router's and experts' gradients and the auxiliary losses' included.
TEST_CASE("a mixture-of-experts GPT-2 matches PyTorch: logits, loss, every gradient, ten AdamW steps", "[gpt2][moe]") {
    const Fixture& fx = moe_fixture();
    REQUIRE(fx.config.num_experts == 4);
    REQUIRE(fx.moe.balance_coef > 0);
    check_forward(fx);
    check_gradients(fx);
    check_adamw_steps(fx);
}

TEST_CASE("a mixture-of-experts model file is version 103, round-trips, and is refused as another shape", "[gpt2][moe]") {
    const Fixture& fx = moe_fixture();
    const std::unique_ptr<CPUModel> model = load_model(fx);
    const std::string path = temp_path("moe.bin");
    model->save(path);
    CHECK(read_bytes(path) == read_bytes(fx.model_path));
    std::vector<char> bytes = read_bytes(path);
    CHECK(reinterpret_cast<const int32_t*>(bytes.data())[1] == 103);
    ModelConfig dense = fx.config;
    dense.num_experts = 0;
    std::vector<float> params(num_params(dense));
    CHECK_THROWS_WITH(read_model_file(path, dense, params.data()),
                      Catch::Contains("num_experts is 4 in the file, expected 0"));
    reinterpret_cast<int32_t*>(bytes.data())[8] = 0;  // version 103 with 0 experts
    write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_model_header(path), Catch::Contains("version 103 (with experts) but 0 experts"));
    std::remove(path.c_str());
}

TEST_CASE("two half micro-batches with grad_scale 0.5 accumulate the full batch gradient", "[gpt2]") {
    const Fixture& fx = fixture();
    REQUIRE(fx.B % 2 == 0);
    const int half = fx.B / 2;
    CPUModel full(fx.config, fx.B, fx.T), accum(fx.config, half, fx.T);
    full.load(MODEL_PATH);
    accum.load(MODEL_PATH);
    full.zero_grad();
    const float loss = full.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
    accum.zero_grad();
    float half_losses = 0.0f;
    for (int part = 0; part < 2; part++) {
        const size_t at = (size_t)part * half * fx.T;
        half_losses += accum.forward_backward(fx.inputs.data() + at, fx.targets.data() + at, half, fx.T, 0.5f, at > 0);
    }
    CHECK(rel_error(0.5 * half_losses, loss) <= 1e-6);
    const ParamLayout layout = GPT2Params::layout(fx.config);
    const std::vector<float> accum_grads = in_file_order(layout, accum.grads());
    const std::vector<float> full_grads = in_file_order(layout, full.grads());
    for (int t = 0; t < layout.num_tensors(); t++) {
        const std::string tensor = layout.name(t);
        CAPTURE(tensor);
        const FileRange r = file_range(layout, t);
        CHECK(rel_error(accum_grads.data() + r.begin, full_grads.data() + r.begin, r.size) <= 1e-5);
    }
}

TEST_CASE("results are bitwise reproducible, whatever the thread count", "[gpt2]") {
    const Fixture& fx = fixture();
    const size_t n = num_params(fx.config);
    auto run = [&](int threads, std::vector<float>& grads, std::vector<float>& params) {
        ThreadCount tc(threads);
        CPUModel model(fx.config, fx.B, fx.T);
        model.load(MODEL_PATH);
        float loss = 0.0f;
        AdamWConfig opt = fx.opt;
        for (int step = 1; step <= 2; step++) {
            model.zero_grad();
            loss = model.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
            const double norm = std::sqrt(model.grad_norm_squared());
            model.adamw_step(opt, step, (float)std::min(1.0, 0.5 / norm));
        }
        grads.assign(model.grads(), model.grads() + n);
        params.assign(model.params(), model.params() + n);
        return loss;
    };
    std::vector<float> grads_a, params_a, grads_b, params_b;
    const int default_threads = omp_get_max_threads();
    const float loss_a = run(default_threads, grads_a, params_a);
    for (int threads : {default_threads, 1, 3}) {
        CAPTURE(threads);
        const float loss_b = run(threads, grads_b, params_b);
        CHECK(std::memcmp(&loss_a, &loss_b, sizeof(float)) == 0);
        CHECK(std::memcmp(grads_a.data(), grads_b.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(params_a.data(), params_b.data(), n * sizeof(float)) == 0);
    }
}

TEST_CASE("evaluate leaves the gradients untouched", "[gpt2]") {
    const Fixture& fx = fixture();
    CPUModel model(fx.config, fx.B, fx.T);
    model.load(MODEL_PATH);
    model.zero_grad();
    model.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
    const size_t n = model.num_params();
    const std::vector<float> before(model.grads(), model.grads() + n);
    const float loss = model.evaluate(fx.inputs.data(), fx.targets.data(), fx.B, fx.T);
    CHECK(rel_error(loss, fx.loss) <= 1e-5);
    CHECK(std::memcmp(before.data(), model.grads(), n * sizeof(float)) == 0);
}

TEST_CASE("bad batches are rejected with the offending value", "[gpt2]") {
    const Fixture& fx = fixture();
    CPUModel model(fx.config, fx.B, fx.T);
    model.load(MODEL_PATH);
    std::vector<int> tokens = fx.inputs;
    tokens[3] = fx.config.vocab_size;
    REQUIRE_THROWS_WITH(model.evaluate(tokens.data(), fx.targets.data(), fx.B, fx.T),
                        Catch::Contains("inputs[3] = 500"));
    REQUIRE_THROWS_WITH(model.evaluate(fx.inputs.data(), fx.targets.data(), fx.B + 1, fx.T),
                        Catch::Contains("B = 5"));
    REQUIRE_THROWS_WITH(CPUModel(fx.config, 1, fx.config.max_seq_len + 1), Catch::Contains("max_T"));
}

TEST_CASE("model files round-trip exactly", "[gpt2]") {
    const Fixture& fx = fixture();
    CPUModel model(fx.config, 1, 8);
    model.load(MODEL_PATH);
    const std::string path = temp_path("roundtrip.bin");
    model.save(path);
    // the writer reproduces the reference file byte for byte
    const std::vector<char> reference = read_bytes(MODEL_PATH);
    CHECK(read_bytes(path) == reference);
    // the parameters after the header are the flat buffer in file order, and back
    const ParamLayout layout = GPT2Params::layout(fx.config);
    const std::vector<float> file_order = in_file_order(layout, model.params());
    REQUIRE(reference.size() == LLMC_HEADER_BYTES + file_order.size() * sizeof(float));
    CHECK(std::memcmp(reference.data() + LLMC_HEADER_BYTES, file_order.data(),
                      file_order.size() * sizeof(float)) == 0);
    std::vector<float> flat(layout.num_params);
    from_file_order(layout, file_order.data(), flat.data());
    CHECK(std::memcmp(flat.data(), model.params(), flat.size() * sizeof(float)) == 0);
    CPUModel again(read_model_header(path), 1, 8);
    again.load(path);
    CHECK(std::memcmp(model.params(), again.params(), model.num_params() * sizeof(float)) == 0);
    std::remove(path.c_str());
}

TEST_CASE("llm.c's bf16 model file (version 5) is written rounded to nearest even and read exactly", "[gpt2]") {
    const Fixture& fx = fixture();
    const size_t n = num_params(fx.config);
    std::vector<float> params(n);
    read_model_file(MODEL_PATH, fx.config, params.data());
    params[0] = 1.0f + 1.0f / 256;  // halfway between 1 and 1 + 2^-7: the tie goes to the even 1
    params[1] = 1.0f + 3.0f / 256;  // halfway between 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6
    params[2] = -2.5f;              // exact in bf16
    const std::string path = temp_path("model_bf16.bin");
    write_model_file(path, fx.config, params.data(), MODEL_FILE_VERSION_BF16);
    const std::vector<char> bytes = read_bytes(path);
    REQUIRE(bytes.size() == LLMC_HEADER_BYTES + 2 * n);
    int32_t version = 0;
    std::memcpy(&version, bytes.data() + 4, sizeof version);
    CHECK(version == 5);

    std::vector<float> back(n);
    read_model_file(path, fx.config, back.data());
    CHECK(back[0] == 1.0f);
    CHECK(back[1] == 1.0f + 4.0f / 256);
    CHECK(back[2] == -2.5f);
    size_t off_by_more = 0;
    for (size_t i = 0; i < n; i++)
        if (!(std::fabs(back[i] - params[i]) <= std::fabs(params[i]) / 256)) off_by_more++;  // half a bf16 ulp
    CHECK(off_by_more == 0);

    // bf16 -> fp32 -> bf16 changes nothing: the same bytes again
    const std::string again = temp_path("model_bf16_again.bin");
    write_model_file(again, fx.config, back.data(), MODEL_FILE_VERSION_BF16);
    CHECK(read_bytes(again) == bytes);
    // a model starts from it (-e file.bin)
    CPUModel model(read_model_header(path), 1, 8);
    model.load(path);
    CHECK(std::memcmp(model.params(), back.data(), n * sizeof(float)) == 0);
    // a truncated bf16 file names its dtype
    write_bytes(path, std::vector<char>(bytes.begin(), bytes.end() - 2));
    REQUIRE_THROWS_WITH(read_model_file(path, fx.config, back.data()),
                        Catch::Contains("truncated") && Catch::Contains("bf16 parameters"));
    REQUIRE_THROWS_WITH(write_model_file(path, fx.config, back.data(), 4), Catch::Contains("version 4"));
    std::remove(path.c_str());
    std::remove(again.c_str());
}

TEST_CASE("model file errors name the file and the problem", "[gpt2]") {
    const Fixture& fx = fixture();
    const std::vector<char> good = read_bytes(MODEL_PATH);
    const std::string path = temp_path("bad_model.bin");
    std::vector<float> params(num_params(fx.config));
    auto with_header_int = [&](int index, int32_t value) {
        std::vector<char> bytes = good;
        std::memcpy(bytes.data() + index * sizeof(int32_t), &value, sizeof(value));
        return bytes;
    };

    SECTION("wrong magic") {
        write_bytes(path, with_header_int(0, 12345));
        REQUIRE_THROWS_WITH(read_model_header(path), Catch::Contains(path) && Catch::Contains("magic number 12345"));
    }
    SECTION("a bf16 (version 5) header on fp32 parameters") {
        write_bytes(path, with_header_int(1, 5));
        REQUIRE_THROWS_WITH(read_model_file(path, fx.config, params.data()), Catch::Contains("bf16"));
    }
    SECTION("unknown version") {
        write_bytes(path, with_header_int(1, 7));
        REQUIRE_THROWS_WITH(read_model_file(path, fx.config, params.data()), Catch::Contains("version 7"));
    }
    SECTION("truncated parameters") {
        std::vector<char> bytes(good.begin(), good.end() - 100);
        write_bytes(path, bytes);
        REQUIRE_THROWS_WITH(read_model_file(path, fx.config, params.data()),
                            Catch::Contains(path) && Catch::Contains("truncated") && Catch::Contains("offset 1024"));
    }
    SECTION("truncated header") {
        write_bytes(path, std::vector<char>(good.begin(), good.begin() + 100));
        REQUIRE_THROWS_WITH(read_model_header(path), Catch::Contains("truncated"));
    }
    SECTION("trailing bytes") {
        std::vector<char> bytes = good;
        bytes.resize(bytes.size() + 8, 0);
        write_bytes(path, bytes);
        REQUIRE_THROWS_WITH(read_model_file(path, fx.config, params.data()), Catch::Contains("8 trailing bytes"));
    }
    SECTION("config mismatch names the field") {
        write_bytes(path, good);
        ModelConfig other = fx.config;
        other.num_layers += 1;
        REQUIRE_THROWS_WITH(read_model_file(path, other, params.data()),
                            Catch::Contains("num_layers is 2 in the file, expected 3"));
        CPUModel model(other, 1, 8);
        REQUIRE_THROWS_WITH(model.load(path), Catch::Contains("num_layers"));
    }
    SECTION("invalid shape in the header") {
        write_bytes(path, with_header_int(5, 5));  // 64 channels over 5 heads
        REQUIRE_THROWS_WITH(read_model_header(path), Catch::Contains(path) && Catch::Contains("num_heads"));
    }
    SECTION("a header of a billion layers fails at once, before any layout is built") {
        write_bytes(path, with_header_int(4, 1000000000));
        REQUIRE_THROWS_WITH(read_model_header(path), Catch::Contains(path) && Catch::Contains("num_layers must be in"));
        write_bytes(path, with_header_int(4, 4000));  // within the limits: the file's size refutes it
        REQUIRE_THROWS_WITH(read_model_header(path), Catch::Contains(path) && Catch::Contains("is truncated") &&
                                                         Catch::Contains("L 4000"));
    }
    SECTION("a NaN anywhere, a padding row of the vocabulary included, is named with its byte offset") {
        // wte is [Vp, C] at byte 1024; its rows >= vocab_size are padding that training never touches
        const size_t C = fx.config.channels, row = fx.config.padded_vocab_size - 1;
        std::vector<char> bytes = good;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        const size_t at = LLMC_HEADER_BYTES + (row * C + 3) * sizeof(float);
        std::memcpy(bytes.data() + at, &nan, sizeof nan);
        write_bytes(path, bytes);
        REQUIRE_THROWS_WITH(read_model_file(path, fx.config, params.data()),
                            Catch::Contains(path) &&
                                Catch::Contains(strformat("wte row %zu column 3 (a padding row", row)) &&
                                Catch::Contains(strformat("byte offset %zu", at)));
    }
    SECTION("non-finite parameters are not saved") {
        read_model_file(MODEL_PATH, fx.config, params.data());
        params.back() = std::numeric_limits<float>::infinity();  // lnfb's last element
        std::remove(path.c_str());
        try {
            write_model_file(path, fx.config, params.data());
            FAIL("a model with an inf parameter was written");
        } catch (const Error& e) {
            CHECK(e.exit_code == EXIT_DIVERGED);
            CHECK_THAT(e.what(), Catch::Contains("lnfb element") && Catch::Contains("is inf"));
        }
        CHECK_FALSE(std::filesystem::exists(path));
    }
    std::remove(path.c_str());
}

TEST_CASE("GPT-2 init is seeded, deterministic and shaped as specified", "[gpt2]") {
    const ModelConfig config = fixture().config;
    const ParamLayout layout = GPT2Params::layout(config);
    std::vector<float> a(layout.num_params), b(layout.num_params), c(layout.num_params);
    init_gpt2_params(config, a.data(), 42);
    {
        ThreadCount tc(1);
        init_gpt2_params(config, b.data(), 42);
    }
    init_gpt2_params(config, c.data(), 43);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);

    const std::vector<float> f = in_file_order(layout, a.data());  // whole tensors, all layers
    auto stddev = [&](int t) {
        const FileRange r = file_range(layout, t);
        double sq = 0.0;
        for (size_t i = 0; i < r.size; i++) sq += (double)f[r.begin + i] * f[r.begin + i];
        return std::sqrt(sq / r.size);
    };
    CHECK(stddev(GPT2Params::QKVW) == Approx(0.02).epsilon(0.02));
    CHECK(stddev(GPT2Params::FCPROJW) == Approx(0.02 / std::sqrt(2.0 * config.num_layers)).epsilon(0.02));
    for (int t : {GPT2Params::LN1W, GPT2Params::LN2W, GPT2Params::LNFW}) {
        const FileRange r = file_range(layout, t);
        for (size_t i = 0; i < r.size; i++) REQUIRE(f[r.begin + i] == 1.0f);
    }
    for (int t : {GPT2Params::QKVB, GPT2Params::FCB, GPT2Params::LNFB}) {
        const FileRange r = file_range(layout, t);
        for (size_t i = 0; i < r.size; i++) REQUIRE(f[r.begin + i] == 0.0f);
    }
    const float* wte = a.data() + layout.offset(GPT2Params::WTE);
    const size_t pad_begin = (size_t)config.vocab_size * config.channels;
    for (size_t i = pad_begin; i < layout.tensor_size(GPT2Params::WTE); i++) REQUIRE(wte[i] == 0.0f);
    CHECK(wte[pad_begin - 1] != 0.0f);
}

TEST_CASE("AdamW over split ranges equals one update over the whole buffer", "[gpt2]") {
    const ModelConfig config = fixture().config;
    const ParamLayout layout = GPT2Params::layout(config);
    const size_t n = layout.num_params;
    std::vector<float> p(n), g(n), m(n), v(n);
    Rng rng(7);
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)rng.normal();
        g[i] = (float)rng.normal();
        m[i] = 0.1f * (float)rng.normal();
        v[i] = rng.uniform();
    }
    AdamWConfig opt;
    opt.weight_decay = 0.1f;
    std::vector<float> p2 = p, m2 = m, v2 = v;
    adamw_update(layout, p.data(), g.data(), m.data(), v.data(), 0, n, opt, 3, 0.7f);
    // split mid-way through layer 0's qkvw (decayed) and mid-way through layer 1's qkvb (not decayed)
    const size_t cut1 = layout.offset(GPT2Params::QKVW, 0) + 1001, cut2 = layout.offset(GPT2Params::QKVB, 1) + 17;
    for (auto [lo, hi] : {std::pair{size_t(0), cut1}, std::pair{cut1, cut2}, std::pair{cut2, n}})
        adamw_update(layout, p2.data(), g.data(), m2.data(), v2.data(), lo, hi, opt, 3, 0.7f);
    CHECK(std::memcmp(p.data(), p2.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(m.data(), m2.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(v.data(), v2.data(), n * sizeof(float)) == 0);
    CHECK(sum_squares(g.data(), 0, cut1) + sum_squares(g.data(), cut1, n) == Approx(sum_squares(g.data(), 0, n)));
    REQUIRE_THROWS_WITH(adamw_update(layout, p.data(), g.data(), m.data(), v.data(), 0, n + 1, opt, 1, 1.0f),
                        Catch::Contains("not within"));
    REQUIRE_THROWS_WITH(adamw_update(layout, p.data(), g.data(), m.data(), v.data(), 0, n, opt, 0, 1.0f),
                        Catch::Contains("step must be >= 1"));
}

TEST_CASE("AdamW decays exactly the matrices, segment by segment", "[gpt2]") {
    const ModelConfig config = fixture().config;
    const ParamLayout layout = GPT2Params::layout(config);
    const size_t n = layout.num_params;
    // zero gradients and moments: the update is the decay alone
    std::vector<float> p(n, 1.0f), g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
    AdamWConfig opt;
    opt.lr = 0.5f;
    opt.weight_decay = 0.1f;
    adamw_update(layout, p.data(), g.data(), m.data(), v.data(), 0, n, opt, 1, 1.0f);
    for (const ParamLayout::Segment& s : layout.segments()) {
        const std::string tensor = layout.name(s.tensor);
        CAPTURE(tensor, s.layer);
        const float expected = layout.is_decayed(s.tensor) ? 0.95f : 1.0f;
        CHECK(std::all_of(p.begin() + s.begin, p.begin() + s.end, [&](float x) { return x == expected; }));
    }
}

TEST_CASE("the packed GEMM matches a float64 product for every layout and edge", "[gpt2]") {
    // Shapes chosen to hit partial register tiles, several KC blocks, several NC blocks, and both
    // B-packing modes (the whole of K at once, and one KC block at a time when K x N is large).
    struct Shape { int M, N, K; };
    const Shape shapes[] = {{1, 1, 1}, {13, 37, 5}, {29, 70, 300}, {50, 1100, 40}, {13, 2100, 1100}, {100, 33, 700}};
    Rng rng(11);
    for (const Shape& sh : shapes) {
        for (int variant = 0; variant < 8; variant++) {
            const bool a_t = variant & 1, b_t = variant & 2, accumulate = variant & 4;
            CAPTURE(sh.M, sh.N, sh.K, a_t, b_t, accumulate);
            std::vector<float> a((size_t)sh.M * sh.K), b((size_t)sh.K * sh.N), c((size_t)sh.M * sh.N);
            for (auto& x : a) x = (float)rng.normal();
            for (auto& x : b) x = (float)rng.normal();
            for (auto& x : c) x = (float)rng.normal();
            std::vector<float> expected(c.size());
            for (int i = 0; i < sh.M; i++)
                for (int j = 0; j < sh.N; j++) {
                    double sum = accumulate ? c[(size_t)i * sh.N + j] : 0.0;
                    for (int k = 0; k < sh.K; k++)
                        sum += (double)(a_t ? a[(size_t)k * sh.M + i] : a[(size_t)i * sh.K + k]) *
                               (b_t ? b[(size_t)j * sh.K + k] : b[(size_t)k * sh.N + j]);
                    expected[(size_t)i * sh.N + j] = (float)sum;
                }
            const cpu::MatRef ar{a.data(), (size_t)(a_t ? sh.M : sh.K), a_t};
            const cpu::MatRef br{b.data(), (size_t)(b_t ? sh.K : sh.N), b_t};
            cpu::gemm(sh.M, sh.N, sh.K, ar, br, c.data(), sh.N, accumulate);
            CHECK(rel_error(c.data(), expected.data(), c.size()) <= 1e-6);
        }
    }
}

TEST_CASE("fast_exp passes a NaN on as NaN, without converting it to an integer", "[gpt2]") {
    // A NaN logit or attention score must reach the guards as NaN; converting it to int on the
    // way would be undefined behaviour (make test-sanitize runs this under UBSan).
    CHECK(std::isnan(cpu::fast_exp(std::numeric_limits<float>::quiet_NaN())));
    CHECK(cpu::fast_exp(0.0f) == 1.0f);
    CHECK(cpu::fast_exp(-1000.0f) == cpu::fast_exp(-87.0f));  // clamped to the normal range, as before
    CHECK(std::fabs(cpu::fast_exp(1.0f) - 2.7182817f) < 1e-6f);
}

// The shared expert (--moe-shared 1) is the block's dense MLP, added beside the routed experts:
// with every expert's weights zero and the auxiliary losses off, the model is GPT-2 itself, its
// loss the dense fixture's and its GPT-2 tensors' gradients the dense model's.
TEST_CASE("with zero experts beside it, a shared-expert MoE model is its dense GPT-2", "[gpt2][moe]") {
    const Fixture& fx = fixture();
    ModelConfig c = fx.config;
    c.num_experts = 2, c.moe_top_k = 1, c.moe_every = 1, c.moe_shared = 1;
    CPUModel dense(fx.config, fx.B, fx.T), moe(c, fx.B, fx.T);
    dense.load(MODEL_PATH);
    moe.init_random(1);
    moe.set_moe_options({0, 0, 0});
    const ParamLayout& d = dense.layout();
    const ParamLayout& m = moe.layout();
    for (const ParamLayout::Segment& s : m.segments()) {
        float* to = moe.params() + s.begin;
        if (s.tensor < GPT2Params::NUM_GPT2_TENSORS)
            std::copy_n(dense.params() + d.offset(s.tensor, s.layer), s.end - s.begin, to);
        else if (s.tensor != GPT2Params::ROUTERW)  // the router may route anywhere: the experts add 0
            std::fill(to, to + (s.end - s.begin), 0.0f);
    }
    dense.zero_grad();
    moe.zero_grad();
    const float dense_loss = dense.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
    const float moe_loss = moe.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
    CHECK(rel_error(moe_loss, dense_loss) <= 1e-6);
    for (int t = 0; t < GPT2Params::NUM_GPT2_TENSORS; t++)
        for (int l = 0; l < (d.is_per_layer(t) ? c.num_layers : 1); l++) {
            CAPTURE(d.name(t), l);
            CHECK(rel_error(moe.grads() + m.offset(t, l), dense.grads() + d.offset(t, l), d.tensor_size(t)) <= 1e-5);
        }
}
