// Tests of the Llama family's shapes and parameter table (models/llama/config.h, params.h): the
// published Llama 3 sizes counted from the table, the derived dN presets, the config's refusals,
// and the table's tensor-parallel cut.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "llmc/models/llama/config.h"
#include "llmc/models/llama/params.h"

using namespace llmc;

TEST_CASE("Llama 3's published sizes: the table holds 8.03B, 70.55B and 405.85B parameters", "[llama]") {
    // Meta's and Hugging Face's counts (untied embedding and head, 128,256 tokens)
    CHECK(LlamaParams::layout(llama_preset("llama3-8b")).num_params == 8030261248ull);
    CHECK(LlamaParams::layout(llama_preset("llama3-70b")).num_params == 70553706496ull);
    CHECK(LlamaParams::layout(llama_preset("llama3-405b")).num_params == 405853388800ull);
    const ModelConfig c = llama_preset("llama3-8b", 8192);
    CHECK(c.vocab_size == 128256);
    CHECK(c.padded_vocab_size == 128256);
    CHECK(c.kv_head_count() == 8);
    CHECK(c.head_size() == 128);
    CHECK(c.rope_theta == 500000.0f);
}

TEST_CASE("the dN presets made Llama: a quarter of the heads as kv heads where they divide, MLP 8C/3",
          "[llama]") {
    struct Expect {
        const char* name;
        int heads, kv_heads, ffn;
    };
    for (const Expect& e : {Expect{"d4", 4, 1, 768}, Expect{"d6", 6, 1, 1024}, Expect{"d12", 12, 3, 2048},
                            Expect{"d24", 16, 4, 2816}, Expect{"d36", 20, 5, 3584}, Expect{"d48", 25, 5, 4352}}) {
        INFO(e.name);
        const ModelConfig c = llama_preset(e.name, 1024, 50257);
        const ModelConfig g = model_preset(e.name, 1024, 50257);
        CHECK(c.arch == ModelArch::Llama);
        CHECK(c.num_layers == g.num_layers);
        CHECK(c.channels == g.channels);
        CHECK(c.num_heads == e.heads);
        CHECK(c.kv_head_count() == e.kv_heads);
        CHECK(c.mlp_hidden() == e.ffn);
        CHECK(c.vocab_size == 50257);  // the tokenizer's, GPT-2's by default
    }
    CHECK_THROWS_WITH(llama_preset("d13"), Catch::Contains("unknown Llama preset 'd13'"));
}

TEST_CASE("the d12 Llama table: each tensor's shape, no biases, the fused products' blocks", "[llama]") {
    const ModelConfig c = llama_preset("d12", 1024, 50257);
    const ParamTable t = LlamaParams::table(c);
    REQUIRE(t.tensors.size() == LlamaParams::NUM_TENSORS);
    CHECK(t.tensors[LlamaParams::WQ].shape == std::vector<size_t>{768, 768});
    CHECK(t.tensors[LlamaParams::WKV].shape == std::vector<size_t>{2 * 3 * 64, 768});
    CHECK(t.tensors[LlamaParams::WO].shape == std::vector<size_t>{768, 768});
    CHECK(t.tensors[LlamaParams::WGATEUP].shape == std::vector<size_t>{2 * 2048, 768});
    CHECK(t.tensors[LlamaParams::WDOWN].shape == std::vector<size_t>{768, 2048});
    CHECK(t.tensors[LlamaParams::LM_HEAD].shape == std::vector<size_t>{50304, 768});
    for (const TensorSpec& s : t.tensors) {
        INFO(s.name);
        CHECK(s.decayed == (s.shape.size() == 2));  // matrices decay, norm gains do not
    }
    // counted by hand: per layer wq, wkv, wo, wgateup and wdown, two norms; wte, lm_head, norm_f
    const size_t C = 768, per_layer = C * C + 2 * 192 * C + C * C + 3 * C * 2048 + 2 * C;
    CHECK(LlamaParams::layout(c).num_params == 12 * per_layer + 2 * 50304 * C + C);
}

TEST_CASE("the Llama table under tensor parallelism: each rank an equal share of heads, kv heads, units",
          "[llama]") {
    ModelConfig c = llama_preset("d24", 1024, 50257);  // 16 heads, 4 kv heads, MLP 2816
    const size_t whole = LlamaParams::layout(c).num_params;
    size_t sum = 0;
    for (int r = 0; r < 4; r++) {
        const ParamLayout l = LlamaParams::layout(c, TpShard{r, 4});
        sum += l.num_params;
    }
    // the norms are replicas on every rank, everything else is cut in four
    const size_t norms = (2 * 24 + 1) * 1024;
    CHECK(sum == whole + 3 * norms);
}

TEST_CASE("a model config refuses what its family does not have", "[llama]") {
    ModelConfig g = model_preset("d12");
    g.kv_heads = 4;
    CHECK_THROWS_WITH(g.validate(), Catch::Contains("GPT-2 has as many key/value heads as heads (12), got kv_heads 4"));
    g.kv_heads = 0;
    g.ffn_hidden = 2048;
    CHECK_THROWS_WITH(g.validate(), Catch::Contains("GPT-2's MLP is 4 x channels = 3072 wide"));
    ModelConfig l = llama_preset("d12");
    l.kv_heads = 5;
    CHECK_THROWS_WITH(l.validate(), Catch::Contains("kv_heads (5) must divide num_heads (12)"));
    l.kv_heads = 3;
    l.rope_theta = 0.0f;
    CHECK_THROWS_WITH(l.validate(), Catch::Contains("rope_theta must be a positive number"));
    l.rope_theta = 500000.0f;
    l.num_experts = 4;
    CHECK_THROWS_WITH(l.validate(), Catch::Contains("mixture of experts is GPT-2's only"));
    CHECK_THROWS_WITH(parse_arch("mistral", "--arch"), Catch::Contains("--arch must be gpt2 or llama, got 'mistral'"));
    CHECK(parse_arch("llama", "--arch") == ModelArch::Llama);
    CHECK_THROWS_WITH(LlamaParams::table(model_preset("d12")), Catch::Contains("not of the Llama family"));
}
