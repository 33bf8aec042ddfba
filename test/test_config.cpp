// Run and model configuration: presets, flag and JSON parsing, validation errors, and the resolved
// config.json feeding back into the same run.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "llmc/config.h"

using namespace llmc;
using Catch::Contains;

namespace {

RunConfig parse(std::vector<const char*> args, int world_size = 1) {
    args.insert(args.begin(), "train_gpt");
    RunConfig cfg;
    bool parsed = parse_run_args(cfg, (int)args.size(), args.data());  // throws on a bad flag
    REQUIRE(parsed);
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

std::string temp_json(const std::string& text) {
    char path[] = "/tmp/llmc_config_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    write_text_file_atomic(path, text);
    return path;
}

}  // namespace

TEST_CASE("presets have GPT-2's published shapes and parameter counts", "[config]") {
    // d12 is GPT-2 124M; counts include the padded vocab (50304 rows), as in llm.c.
    CHECK(num_params(model_preset("d12")) == 124475904);
    ModelConfig d48 = model_preset("d48");
    CHECK((d48.num_layers == 48 && d48.channels == 1600 && d48.num_heads == 25));
    CHECK(num_params(d48) == 1557686400);
    ModelConfig d24 = model_preset("d24");
    CHECK((d24.num_layers == 24 && d24.channels == 1024 && d24.num_heads == 16));
    ModelConfig d36 = model_preset("d36");
    CHECK((d36.num_layers == 36 && d36.channels == 1280 && d36.num_heads == 20));
    for (const char* name : MODEL_PRESET_NAMES) {
        ModelConfig c = model_preset(name);
        CHECK_NOTHROW(c.validate());
        CHECK(c.padded_vocab_size == 50304);
    }
    REQUIRE_THROWS_WITH(model_preset("d7"), Contains("unknown model preset 'd7'"));
}

TEST_CASE("ParamLayout is bucket-major in memory and llm.c order in files", "[config]") {
    ModelConfig c;
    c.max_seq_len = 4;
    c.vocab_size = 10;
    c.padded_vocab_size = 16;
    c.num_layers = 2;
    c.num_heads = 2;
    c.channels = 4;
    const ParamLayout layout = GPT2Params::layout(c);
    using P = GPT2Params;
    // embeddings 16*4 + 4*4 = 80; a layer 4+4+48+12+16+4+4+4+64+16+64+4 = 244; final LayerNorm 8
    REQUIRE(layout.num_params == 80 + 2 * 244 + 8);
    REQUIRE(layout.num_buckets() == 4);
    CHECK(layout.bucket_size(P::EMBEDDING_BUCKET) == 80);
    CHECK(layout.bucket_size(layout.layer_bucket(1)) == 244);
    CHECK(layout.bucket_size(layout.final_bucket()) == 8);
    CHECK(layout.tensor_size(P::QKVW) == 48);   // one layer's slice
    CHECK(layout.offset_in_bucket(P::QKVW) == 8);
    CHECK(layout.offset(P::QKVW, 1) == 80 + 244 + 8);
    CHECK(layout.offset(P::LNFB) == 80 + 2 * 244 + 4);
    CHECK(layout.file_offset(P::LN1B, 1) == 80 + 2 * 4 + 4);  // after wte, wpe, both ln1w, ln1b[0]
    CHECK(layout.file_offset(P::QKVW, 1) == 80 + 2 * 4 + 2 * 4 + 48);
    CHECK(layout.file_offset(P::LNFB) == layout.num_params - 4);
    CHECK(layout.bucket_of(P::WPE, 0) == P::EMBEDDING_BUCKET);
    CHECK(layout.bucket_of(P::FCPROJB, 1) == layout.layer_bucket(1));
    CHECK(layout.bucket_of(P::LNFW, 0) == layout.final_bucket());
    REQUIRE_THROWS_WITH(layout.offset(P::QKVW, 2), Contains("layer 2 of qkvw"));
    REQUIRE_THROWS_WITH(layout.offset(P::WTE, 1), Contains("layer 1 of wte"));

    for (const char* name : {"tiny", "d4", "d12"}) {
        CAPTURE(name);
        const ModelConfig m = std::string(name) == "tiny" ? c : model_preset(name);
        const ParamLayout lay = GPT2Params::layout(m);
        // buckets tile [0, num_params) in order
        size_t at = 0;
        for (int b = 0; b < lay.num_buckets(); b++) {
            CHECK(lay.bucket_begin(b) == at);
            at += lay.bucket_size(b);
        }
        CHECK(at == lay.num_params);
        // so do the segments, each inside its bucket, with its tensor's size and flat offset
        at = 0;
        std::vector<bool> file_covered(lay.num_params, false);
        size_t file_elements = 0;
        for (const ParamLayout::Segment& s : lay.segments()) {
            CAPTURE(lay.name(s.tensor), s.layer);
            REQUIRE(s.begin == at);
            at = s.end;
            CHECK(s.end - s.begin == lay.tensor_size(s.tensor));
            CHECK(s.begin == lay.offset(s.tensor, s.layer));
            const int b = lay.bucket_of(s.tensor, s.layer);
            if (lay.is_per_layer(s.tensor)) CHECK(b == lay.layer_bucket(s.layer));
            CHECK((lay.bucket_begin(b) <= s.begin && s.end <= lay.bucket_begin(b) + lay.bucket_size(b)));
            CHECK(s.begin - lay.bucket_begin(b) == lay.offset_in_bucket(s.tensor));
            // file offsets: each file element covered exactly once
            const size_t f = lay.file_offset(s.tensor, s.layer);
            REQUIRE(f + (s.end - s.begin) <= lay.num_params);
            for (size_t i = f; i < f + (s.end - s.begin); i++) {
                if (file_covered[i]) FAIL("file element " << i << " covered twice");
                file_covered[i] = true;
            }
            file_elements += s.end - s.begin;
        }
        CHECK(at == lay.num_params);
        CHECK(file_elements == lay.num_params);
        CHECK(lay.segments().size() == (size_t)(4 + 12 * m.num_layers));
    }
}

TEST_CASE("flags use llm.c letters and long names, --name=value and - or _ alike", "[config]") {
    RunConfig cfg = parse({"-b", "4", "--seq-len", "32", "--total_batch_tokens=256", "-l", "0.002",
                           "--lr-schedule", "wsd", "-e", "d6", "--shuffle", "0"});
    CHECK(cfg.batch_size == 4);
    CHECK(cfg.seq_len == 32);
    CHECK(cfg.total_batch_tokens == 256);
    CHECK(cfg.grad_accum_steps == 2);
    CHECK(cfg.lr == 0.002f);
    CHECK(cfg.lr_schedule == "wsd");
    CHECK(cfg.model_config.num_layers == 6);
    CHECK_FALSE(cfg.shuffle);
}

TEST_CASE("total batch defaults to B*T*ranks and must be a multiple of it", "[config]") {
    CHECK(parse({"-b", "2", "-t", "16"}, 4).total_batch_tokens == 128);
    CHECK(parse({"-b", "2", "-t", "16", "-d", "512"}, 4).grad_accum_steps == 4);
    REQUIRE_THROWS_WITH(parse({"-b", "2", "-t", "16", "-d", "100"}),
                        Contains("-d (total_batch_tokens) 100 must be a positive multiple of B*T*ranks"));
}

TEST_CASE("the batch is split over the data-parallel ranks of the mesh", "[config]") {
    RunConfig cfg = parse({"-b", "2", "-t", "16"}, 4);
    CHECK((cfg.world_size == 4 && cfg.dims.dp == 4 && cfg.dims.ranks() == 4));
    CHECK(run_config_json(cfg)["resolved"]["dp_size"] == 4);
}

TEST_CASE("invalid values are rejected with the value and the expectation", "[config]") {
    REQUIRE_THROWS_WITH(parse({"--channels", "100", "--num-heads", "3"}),
                        Contains("channels (100) must be divisible by num_heads (3)"));
    REQUIRE_THROWS_WITH(parse({"-b", "x"}), Contains("flag -b expects an integer, got 'x'"));
    REQUIRE_THROWS_WITH(parse({"-b", "0"}), Contains("-b (batch_size) must be positive, got 0"));
    REQUIRE_THROWS_WITH(parse({"-l", "fast"}), Contains("flag -l expects a number, got 'fast'"));
    REQUIRE_THROWS_WITH(parse({"-t", "2048"}), Contains("exceeds the model's max_seq_len 1024"));
    REQUIRE_THROWS_WITH(parse({"--lr-schedule", "step"}), Contains("unknown learning-rate schedule 'step'"));
    REQUIRE_THROWS_WITH(parse({"-e", "d5"}), Contains("unknown model preset 'd5'"));
    REQUIRE_THROWS_WITH(parse({"--beta2", "1"}), Contains("--beta2 must be in [0, 1)"));
    REQUIRE_THROWS_WITH(parse({"--shuffle", "maybe"}), Contains("expects 0 or 1"));
    REQUIRE_THROWS_WITH(parse({"--seed", "-3"}), Contains("expects a non-negative integer"));
}

TEST_CASE("every number flag tells a value that is not a number from one out of its range", "[config]") {
    int numeric = 0;
    for (const RunOption& o : run_options()) {
        const char* huge = std::visit([](auto member) -> const char* {
            using T = std::remove_reference_t<decltype(RunConfig{}.*member)>;
            if constexpr (std::is_same_v<T, float>) return "1e300";
            else if constexpr (std::is_same_v<T, int>) return "99999999999";
            else if constexpr (std::is_same_v<T, uint64_t>) return "99999999999999999999999";
            else return nullptr;
        }, o.field);
        if (!huge) continue;
        numeric++;
        const std::string flag = "--" + std::string(o.name);
        RunConfig cfg;
        std::vector<const char*> out_of_range = {"train_gpt", flag.c_str(), huge};
        CHECK_THROWS_WITH(parse_run_args(cfg, 3, out_of_range.data()),
                          Contains(strformat("flag %s: '%s' is out of range: the option is a ", flag.c_str(), huge)));
        std::vector<const char*> not_a_number = {"train_gpt", flag.c_str(), "12abc"};
        CHECK_THROWS_WITH(parse_run_args(cfg, 3, not_a_number.data()),
                          Contains(strformat("flag %s expects a", flag.c_str())) && !Contains("out of range"));
    }
    CHECK(numeric > 30);
    REQUIRE_THROWS_WITH(parse({"--straggler-factor", "1e300"}),
                        Contains("flag --straggler-factor: '1e300' is out of range: the option is a 32-bit float"));
    REQUIRE_THROWS_WITH(parse({"-l", "1e-50"}), Contains("flag -l: '1e-50' is out of range"));
    CHECK(parse({"-l", "0.5"}).lr == 0.5f);
    std::string config = temp_json(R"({"steps": 99999999999})");
    REQUIRE_THROWS_WITH(parse({"--config", config.c_str()}), Contains("option 'steps': '99999999999' is out of range"));
    remove(config.c_str());
}

TEST_CASE("unknown flags, missing values and missing files are errors", "[config]") {
    REQUIRE_THROWS_WITH(parse({"--batchsize", "4"}), Contains("unknown flag '--batchsize'"));
    REQUIRE_THROWS_WITH(parse({"-b"}), Contains("flag -b needs a value"));
    REQUIRE_THROWS_WITH(parse({"--config", "/nonexistent/run.json"}), Contains("/nonexistent/run.json"));
    RunConfig cfg;
    const char* help[] = {"train_gpt", "--help"};
    CHECK_FALSE(parse_run_args(cfg, 2, help));
}

TEST_CASE("every letter of llm.c's train_gpt2.cu means what it means in llm.c, or is refused saying why", "[config]") {
    // llm.c's flags with a typical value (its scripts/run_gpt2_124M.sh where it uses them) and the
    // field that must then hold llm.c's meaning.
    struct Accepted {
        const char* flag;
        const char* value;
        std::function<bool(const RunConfig&)> means;
    };
    const std::vector<Accepted> accepted = {
        {"-i", "dev/data/fineweb10B/fineweb_train_*.bin", [](auto& c) { return c.train_data == "dev/data/fineweb10B/fineweb_train_*.bin"; }},
        {"-j", "dev/data/fineweb10B/fineweb_val_*.bin", [](auto& c) { return c.val_data == "dev/data/fineweb10B/fineweb_val_*.bin"; }},
        {"-e", "d12", [](auto& c) { return c.model == "d12" && c.model_config.num_layers == 12; }},
        {"-o", "log124M", [](auto& c) { return c.output_dir == "log124M"; }},
        {"-n", "5000", [](auto& c) { return c.checkpoint_every == 5000; }},
        {"-nk", "3", [](auto& c) { return c.checkpoint_keep == 3; }},
        {"-nm", "10000", [](auto& c) { return c.checkpoint_major == 10000; }},
        {"-y", "1", [](auto& c) { return c.resume == 1; }},
        {"-b", "64", [](auto& c) { return c.batch_size == 64; }},
        {"-t", "1024", [](auto& c) { return c.seq_len == 1024; }},
        {"-d", "524288", [](auto& c) { return c.total_batch_tokens == 524288; }},
        {"-x", "18865", [](auto& c) { return c.steps == 18865; }},
        {"-k", "wsd", [](auto& c) { return c.lr_schedule == "wsd"; }},
        {"-l", "0.0006", [](auto& c) { return c.lr == 0.0006f; }},
        {"-u", "700", [](auto& c) { return c.warmup_steps == 700; }},
        {"-q", "0.0", [](auto& c) { return c.final_lr_frac == 0.0f; }},
        {"-c", "0.1", [](auto& c) { return c.weight_decay == 0.1f; }},
        {"-sl", "5.0", [](auto& c) { return c.skip_update_lossz == 5.0f; }},
        {"-sg", "5.0", [](auto& c) { return c.skip_update_gradz == 5.0f; }},
        {"-v", "250", [](auto& c) { return c.val_every == 250; }},
        {"-m", "20", [](auto& c) { return c.val_steps == 20; }},
        {"-s", "20000", [](auto& c) { return c.sample_every == 20000; }},
        {"-g", "144", [](auto& c) { return c.sample_tokens == 144; }},
        {"-z", "1", [](auto& c) { return c.zero_stage == 1; }},
        {"-r", "0", [](auto& c) { return c.recompute == 0; }},
        {"-h", "1", [](auto& c) { return c.hellaswag == 1; }},
        {"-h", "0", [](auto& c) { return c.hellaswag == 0; }},
        // What llmc always does: accepted, nothing to set.
        {"-a", "0", [](auto&) { return true; }},
        {"-w", "1", [](auto&) { return true; }},
    };
    // The rest: refused, and the message names llm.c's meaning and llmc's alternative.
    const std::vector<std::pair<const char*, const char*>> refused = {
        {"-a", "1"}, {"-w", "0"}, {"-f", "1"}, {"-f", "0"}, {"-ge", "2"}, {"-lg", "10"},
        {"-pn", "2"}, {"-pr", "0"}, {"-pg", "8"}, {"-pi", "mpi"}, {"-pm", "tcp"}, {"-ps", "10.0.0.1"},
        {"-pf", "/tmp"}, {"-pp", "/tmp"}, {"-x", "-1"},
    };
    std::set<std::string> letters;
    for (const Accepted& a : accepted) {
        INFO(a.flag << " " << a.value);
        RunConfig cfg = parse({a.flag, a.value});
        CHECK(a.means(cfg));
        letters.insert(a.flag);
    }
    for (const auto& [flag, value] : refused) {
        INFO(flag << " " << value);
        REQUIRE_THROWS_WITH(parse({flag, value}), Contains("llm.c's"));
        letters.insert(flag);
    }
    // Every letter llm.c's parser reads (and its usage text names: -pm, -pp) is covered above.
    const std::set<std::string> llmc_letters = {"-i", "-j", "-e", "-o", "-n", "-y", "-b", "-t", "-d", "-l", "-lg",
                                                "-u", "-q", "-c", "-x", "-v", "-m", "-s", "-ge", "-g", "-a", "-f",
                                                "-w", "-z", "-r", "-h", "-k", "-pi", "-pf", "-ps", "-pn", "-pr",
                                                "-pg", "-sl", "-sg", "-nk", "-nm", "-pm", "-pp"};
    CHECK(letters == llmc_letters);
    // llmc's own options have long names only: every short letter in the table is one of llm.c's.
    for (const RunOption& o : run_options())
        if (o.short_flag[0]) CHECK(llmc_letters.count(o.short_flag) == 1);
    // -h alone, or before another flag, is help; --tokenizer lost its -k.
    RunConfig cfg;
    const char* help_alone[] = {"train_gpt", "-b", "4", "-h"};
    CHECK_FALSE(parse_run_args(cfg, 4, help_alone));
    const char* help_first[] = {"train_gpt", "-h", "-b", "4"};
    CHECK_FALSE(parse_run_args(cfg, 4, help_first));
    CHECK(parse({"--tokenizer", ""}).tokenizer.empty());
    REQUIRE_THROWS_WITH(parse({"-k", "data/gpt2_tokenizer.bin"}), Contains("the tokenizer file is --tokenizer"));
    // llm.c's -pp (a path) beside llmc's --pp (pipeline stages): the refusal tells them apart.
    REQUIRE_THROWS_WITH(parse({"-pp", "2"}), Contains("flag -pp 2 is llm.c's") &&
                                                 Contains("llm.c's -pp is the shared file system path") &&
                                                 Contains("llmc's --pp (two dashes) is something else, the number of "
                                                          "pipeline stages"));
}

TEST_CASE("-h 1 and --eval-hellaswag ask for HellaSwag, and -x 0 evaluates only where something is evaluated",
          "[config][hellaswag]") {
    CHECK(parse({"-h", "1"}).eval_hellaswag == "data/hellaswag/hellaswag_val.bin");
    CHECK(parse({"--eval-hellaswag", "items.bin"}).hellaswag == 1);
    CHECK(parse({"-h", "0", "--eval-hellaswag", "items.bin"}).hellaswag == 0);  // a config.json gives both
    CHECK(parse({}).hellaswag == 0);
    REQUIRE_THROWS_WITH(parse({"-h", "2"}), Contains("-h (hellaswag) must be 0 or 1, got 2"));
    REQUIRE_THROWS_WITH(parse({"-h", "1", "--eval-hellaswag", ""}), Contains("-h 1 needs a HellaSwag file"));
    CHECK(parse({"-x", "0", "-h", "1", "-j", ""}).steps == 0);
    CHECK(parse({"-x", "0"}).steps == 0);  // the default validation data
    for (const std::vector<const char*>& nothing : {std::vector<const char*>{"-x", "0", "-j", ""},
                                                     std::vector<const char*>{"-x", "0", "-h", "1", "-v", "0"}})
        REQUIRE_THROWS_WITH(parse(nothing), Contains("-x 0 trains nothing and only evaluates a model") &&
                                                Contains("nothing is evaluated here"));
    REQUIRE_THROWS_WITH(parse({"-x", "-2"}), Contains("-x (steps) must be positive (or 0 to evaluate only), got -2"));
}

TEST_CASE("--config reads options by long name and later flags override it", "[config]") {
    std::string path = temp_json(R"({"batch_size": 2, "lr": 0.005, "lr_schedule": "linear", "shuffle": false})");
    RunConfig cfg = parse({"--config", path.c_str(), "-b", "4"});
    CHECK(cfg.batch_size == 4);
    CHECK(cfg.lr == 0.005f);
    CHECK(cfg.lr_schedule == "linear");
    CHECK_FALSE(cfg.shuffle);
    CHECK(cfg.config_file == path);
    remove(path.c_str());
}

TEST_CASE("--config rejects unknown keys, wrong types and broken JSON, naming the file", "[config]") {
    std::string unknown = temp_json(R"({"batch_sze": 2})");
    REQUIRE_THROWS_WITH(parse({"--config", unknown.c_str()}), Contains("unknown option 'batch_sze'") && Contains(unknown));
    std::string fractional = temp_json(R"({"batch_size": 2.5})");
    REQUIRE_THROWS_WITH(parse({"--config", fractional.c_str()}), Contains("'batch_size' expects an integer"));
    std::string broken = temp_json(R"({"batch_size": )");
    REQUIRE_THROWS_WITH(parse({"--config", broken.c_str()}), Contains("is not valid JSON") && Contains(broken));
    std::string array = temp_json(R"([1, 2])");
    REQUIRE_THROWS_WITH(parse({"--config", array.c_str()}), Contains("must hold a JSON object"));
    for (auto& p : {unknown, fractional, broken, array}) remove(p.c_str());
}

TEST_CASE("the resolved config.json feeds back into an identical run", "[config]") {
    RunConfig first = parse({"-b", "4", "-t", "32", "-l", "0.0007", "--lr-schedule", "wsd", "--seed", "99"});
    nlohmann::json written = run_config_json(first);
    CHECK(written["lr"].dump() == "0.0007");  // floats are written in their shortest exact form
    CHECK(written["resolved"]["model"]["num_params"] == num_params(first.model_config));
    written.erase("resolved");
    std::string path = temp_json(written.dump());
    RunConfig second = parse({"--config", path.c_str()});
    nlohmann::json rewritten = run_config_json(second);
    rewritten.erase("resolved");
    CHECK(rewritten == written);
    remove(path.c_str());
}

TEST_CASE("float options must be finite and in range; only the timeouts take inf", "[config]") {
    REQUIRE_THROWS_WITH(parse({"-l", "inf"}), Contains("-l (lr) must be in (0, 1], got inf"));
    REQUIRE_THROWS_WITH(parse({"-l", "1e30"}), Contains("-l (lr) must be in (0, 1]"));
    REQUIRE_THROWS_WITH(parse({"-l", "nan"}), Contains("flag -l expects a number, got 'nan'"));
    REQUIRE_THROWS_WITH(parse({"-c", "inf"}), Contains("-c (weight_decay) must be >= 0 and below 1/lr"));
    REQUIRE_THROWS_WITH(parse({"--eps", "inf"}), Contains("--eps must be in (0, 1)"));
    REQUIRE_THROWS_WITH(parse({"--grad-clip", "inf"}), Contains("--grad-clip must be finite"));
    REQUIRE_THROWS_WITH(parse({"--temperature", "inf"}), Contains("--temperature must be finite"));
    REQUIRE_THROWS_WITH(parse({"-sg", "inf"}), Contains("-sg (skip_update_gradz) must be finite"));
    CHECK(std::isinf(parse({"--comm-timeout-s", "inf"}).comm_timeout_s));
    CHECK(parse({"--comm-timeout-s", "1e10"}).comm_timeout_s == 1e10f);
    // an infinite timeout is a deadline far away, not an overflow into the past
    CHECK(deadline_after(INFINITY) > std::chrono::steady_clock::now() + std::chrono::hours(24 * 365 * 50));
    CHECK(deadline_after(1e10) > std::chrono::steady_clock::now());
}

TEST_CASE("integer limits are checked in 64 bits and blamed on the right flag", "[config]") {
    REQUIRE_THROWS_WITH(parse({"--world-size", "-3"}), Contains("--world-size must be a rank count >= 1 (or 0: any)"));
    REQUIRE_THROWS_WITH(parse({"--vocab-size", "2147483647"}), Contains("--vocab-size must be in [1, 16777216]"));
    CHECK(pad_vocab(INT32_MAX) > 0);  // no signed overflow, even before validation refuses it
    REQUIRE_THROWS_WITH(parse({"-b", "70000", "-t", "32768", "--max-seq-len", "32768"}),
                        Contains("-b x -t x ranks = 70000 x 32768 x 1 = 2293760000"));
    REQUIRE_THROWS_WITH(parse({"-b", "40000", "-t", "32768", "--max-seq-len", "32768"}, 2),
                        Contains("x 2 = 2621440000 tokens per micro-batch"));
    REQUIRE_THROWS_WITH(parse({"--channels", "-64"}), Contains("--channels/--max-seq-len must be positive"));
    ModelConfig huge = model_preset("d12");
    huge.num_layers = 1000000000;
    REQUIRE_THROWS_WITH(huge.validate(), Contains("num_layers must be in [1, 4096]"));
}

TEST_CASE("--config types are strict: no bool for an integer, no string for a number, no duplicate key", "[config]") {
    std::string boolean = temp_json(R"({"batch_size": true})");
    REQUIRE_THROWS_WITH(parse({"--config", boolean.c_str()}), Contains("'batch_size' expects an integer, got true"));
    std::string text = temp_json(R"({"lr": "0.1"})");
    REQUIRE_THROWS_WITH(parse({"--config", text.c_str()}), Contains("'lr' expects a number, got \"0.1\""));
    std::string number = temp_json(R"({"model": 12})");
    REQUIRE_THROWS_WITH(parse({"--config", number.c_str()}), Contains("'model' expects a string, got 12"));
    std::string duplicate = temp_json(R"({"batch_size": 2, "seed": 1, "batch_size": 4})");
    REQUIRE_THROWS_WITH(parse({"--config", duplicate.c_str()}),
                        Contains(duplicate) && Contains("key 'batch_size' appears more than once"));
    std::string flags = temp_json(R"({"shuffle": 0, "ckpt_sync": true})");  // booleans: true/false or 0/1
    CHECK_FALSE(parse({"--config", flags.c_str()}).shuffle);
    REQUIRE_THROWS_WITH(parse({"--config", "/tmp"}), Contains("--config: '/tmp' is a directory"));
    for (auto& p : {boolean, text, number, duplicate, flags}) remove(p.c_str());
}

TEST_CASE("--attention: auto by default, one of auto, mma, wgmma, tma, anything else refused by name", "[config]") {
    CHECK(parse({}).attention == "auto");
    for (const char* k : {"auto", "mma", "wgmma", "tma"}) CHECK(parse({"--attention", k}).attention == k);
    CHECK_THROWS_WITH(parse({"--attention", "flash"}), Contains("--attention must be mma, wgmma, tma or auto, got 'flash'"));
}

TEST_CASE("a run's own config.json, \"resolved\" included, is accepted back by --config", "[config]") {
    RunConfig first = parse({"-b", "4", "-t", "32", "--seed", "7", "--comm-timeout-s", "1e10"});
    std::string path = temp_json(run_config_json(first).dump(2));
    RunConfig second = parse({"--config", path.c_str()});
    nlohmann::json a = run_config_json(first), b = run_config_json(second);
    a["resolved"].erase("config_file");
    b["resolved"].erase("config_file");
    CHECK(a == b);
    remove(path.c_str());
}

TEST_CASE("--arch llama makes a preset a Llama; its shape flags follow or override it", "[config][llama]") {
    const RunConfig d12 = parse({"--arch", "llama", "-e", "d12"});
    CHECK(d12.model_config.arch == ModelArch::Llama);
    CHECK(d12.model_config.kv_head_count() == 3);
    CHECK(d12.model_config.mlp_hidden() == 2048);
    CHECK(d12.model_config.rope_theta == 500000.0f);
    // new heads and channels derive new kv heads and MLP width, unless given
    const RunConfig wider = parse({"--arch", "llama", "-e", "d12", "--num-heads", "8", "--channels", "512"});
    CHECK(wider.model_config.kv_head_count() == 2);
    CHECK(wider.model_config.mlp_hidden() == 1536);
    const RunConfig given = parse({"--arch", "llama", "--kv-heads", "4", "--ffn-hidden", "640", "--rope-theta", "1e4"});
    CHECK(given.model_config.kv_head_count() == 4);
    CHECK(given.model_config.mlp_hidden() == 640);
    CHECK(given.model_config.rope_theta == 10000.0f);
    // the published shapes are Llama's without --arch, with Llama 3's context and vocabulary
    const RunConfig llama8b = parse({"-e", "llama3-8b", "-t", "8192", "-b", "1", "--plan", "8"});
    CHECK(llama8b.arch == "llama");
    CHECK(llama8b.model_config.num_layers == 32);
    CHECK(llama8b.model_config.vocab_size == 128256);
    CHECK(num_params(llama8b.model_config) == 8030261248ull);
    CHECK(parse({}).model_config.arch == ModelArch::GPT2);  // the default is unchanged
    CHECK_THROWS_WITH(parse({"--kv-heads", "2"}), Contains("give --arch llama"));
    CHECK_THROWS_WITH(parse({"--arch", "gpt2", "-e", "llama3-8b"}), Contains("is a Llama shape, but --arch is gpt2"));
    CHECK_THROWS_WITH(parse({"--arch", "mamba"}), Contains("--arch must be gpt2 or llama, got 'mamba'"));
    CHECK_THROWS_WITH(parse({"--arch", "llama", "--kv-heads", "3"}), Contains("kv_heads (3) must divide num_heads (4)"));
}
