// Tests of the fp32 CPU model as a Llama (llmc/models/cpu_model.h with models/llama/params.h) against
// the float64 PyTorch Llama of dev/ref/make_llama_model_fixture.py: logits, loss, every gradient and
// ten AdamW steps; plus the Llama model file (version 203), determinism and what the shape refuses.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/models/cpu_model.h"
#include "llmc/models/llama/config.h"
#include "llmc/models/model_file.h"
#include "test/model_fixture.h"
#include "test/rel_error.h"

using namespace llmc;
using namespace llmc::test;

namespace {

const Fixture& llama_fixture() {
    static const Fixture f("test/fixtures/llama_tiny_model.bin", "test/fixtures/llama_tiny_state.bin");
    return f;
}

std::string temp_model_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("llmc_test_llama_" + std::to_string(getpid()) + "_" + name))
        .string();
}

}  // namespace

TEST_CASE("a Llama model file's header says its family and shape", "[llama]") {
    const ModelConfig& c = llama_fixture().config;
    CHECK(c.arch == ModelArch::Llama);
    CHECK(c.num_heads == 4);
    CHECK(c.kv_head_count() == 2);
    CHECK(c.mlp_hidden() == 160);
    CHECK(c.rope_theta == 10000.0f);
    CHECK(num_params(c) == 512 * 64 * 2 + 2 * (64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 2 * 160 * 64 + 64 * 160) + 64);
}

TEST_CASE("Llama: forward logits and loss match the PyTorch reference", "[llama]") { check_forward(llama_fixture()); }

TEST_CASE("Llama: gradients match the PyTorch reference tensor by tensor", "[llama]") {
    check_gradients(llama_fixture());
}

TEST_CASE("Llama: ten AdamW steps with grad clipping follow the PyTorch losses", "[llama]") {
    check_adamw_steps(llama_fixture());
}

TEST_CASE("Llama: gradients are bitwise the same whatever the thread count", "[llama]") {
    const Fixture& fx = llama_fixture();
    const int saved = omp_get_max_threads();
    std::vector<std::vector<float>> grads;
    for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        auto model = load_model(fx);
        model->zero_grad();
        model->forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
        grads.emplace_back(model->grads(), model->grads() + model->num_params());
    }
    omp_set_num_threads(saved);
    CHECK(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(grads[0].data(), grads[2].data(), grads[0].size() * sizeof(float)) == 0);
}

TEST_CASE("a Llama model file round-trips exactly and is refused as a GPT-2", "[llama]") {
    const Fixture& fx = llama_fixture();
    auto model = load_model(fx);
    const std::string path = temp_model_path("roundtrip.bin");
    model->save(path);
    {
        File original(fx.model_path, "rb"), written(path, "rb");
        REQUIRE(original.size() == written.size());
        std::vector<char> a(original.size()), b(written.size());
        original.read(a.data(), a.size(), "model");
        written.read(b.data(), b.size(), "model");
        CHECK(a == b);
    }
    ModelConfig gpt2 = fx.config;
    gpt2.arch = ModelArch::GPT2, gpt2.kv_heads = 0, gpt2.ffn_hidden = 0;
    std::vector<float> params(num_params(gpt2));
    CHECK_THROWS_WITH(read_model_file(path, gpt2, params.data()),
                      Catch::Contains("holds a llama model, expected gpt2"));
    ModelConfig other = fx.config;
    other.kv_heads = 4;
    std::vector<float> other_params(num_params(other));
    CHECK_THROWS_WITH(read_model_file(path, other, other_params.data()), Catch::Contains("kv_heads is 2 in the file"));
    std::filesystem::remove(path);
}

TEST_CASE("a Llama model's shape is checked where it is cut", "[llama]") {
    ModelConfig c = llama_fixture().config;
    c.kv_heads = 3;  // does not divide the 4 heads
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("kv_heads (3) must divide num_heads (4)"));
    c.kv_heads = 2;
    CHECK_THROWS_WITH(check_tensor_parallel_shape(c, 4), Catch::Contains("key/value head count"));
    CHECK_NOTHROW(check_tensor_parallel_shape(c, 2));
    c.ffn_hidden = 161;
    CHECK_THROWS_WITH(check_tensor_parallel_shape(c, 2), Catch::Contains("MLP width (--ffn-hidden) (161)"));
}

TEST_CASE("a Llama model allocates what its memory plan says, per kind", "[llama]") {
    const Fixture& fx = llama_fixture();
    for (int stage : {0, 3}) {
        CAPTURE(stage);
        CPUModel model(fx.config, fx.B, fx.T, local_communicator(), stage);
        const ZeroPlan zero(model_layout(fx.config), stage, 0, 1);
        size_t planned[(int)MemoryKind::Count] = {};
        for (const BufferSpec& b : CPUModel::memory_specs(zero, fx.config, fx.B, fx.T)) planned[(int)b.kind] += b.bytes();
        for (int k = 0; k < (int)MemoryKind::Count; k++) {
            CAPTURE(memory_kind_name((MemoryKind)k));
            CHECK(planned[k] == model.allocated_bytes((MemoryKind)k));
        }
    }
}
