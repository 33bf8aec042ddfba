// End to end on the CPU: the real train loop on the default corpus lowers the validation loss well
// below ln(vocab), the loss of a uniform guess; and the run writes its config and metrics.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "llmc/models/gpt2/gpt2_cpu.h"
#include "llmc/train_loop.h"

using namespace llmc;

TEST_CASE("a short CPU training run lowers the validation loss well below ln(vocab)", "[training][data]") {
    const char* shard = "data/default/default_train_000000.bin";
    if (!std::ifstream(shard).good()) FAIL("the default corpus is missing: run `make data` (make test does it first)");

    char dir[] = "/tmp/llmc_train_XXXXXX";
    REQUIRE(mkdtemp(dir));
    RunConfig cfg;
    cfg.output_dir = dir;
    cfg.num_layers = 2;
    cfg.channels = 64;
    cfg.num_heads = 2;
    cfg.max_seq_len = 64;
    cfg.batch_size = 8;
    cfg.seq_len = 32;
    cfg.steps = 200;
    cfg.lr = 4e-3f;
    cfg.warmup_steps = 10;
    cfg.val_every = 100;
    cfg.val_steps = 4;
    cfg.sample_every = 200;
    cfg.sample_tokens = 8;
    resolve_run_config(cfg, 1, nullptr);

    GPT2CPU model(cfg.model_config, cfg.batch_size, cfg.seq_len);
    model.init_random(cfg.seed);
    LocalComm comm;
    TrainSummary summary = Trainer(cfg, model, comm, std::string(dir) + "/metrics.jsonl").run();

    const float uniform_loss = std::log(50257.0f);  // 10.82
    CHECK(std::fabs(summary.first_val_loss - uniform_loss) < 0.5f);  // a fresh model guesses ~uniformly
    // 2 layers of 64 channels reach ~7.5 (about the corpus's unigram entropy) in 200 steps
    CHECK(summary.last_val_loss < uniform_loss - 3.0f);

    // metrics.jsonl holds one record per step plus the three evaluations and two samples
    std::ifstream metrics(std::string(dir) + "/metrics.jsonl");
    int lines = 0, val_lines = 0;
    for (std::string line; std::getline(metrics, line); lines++) {
        auto record = nlohmann::json::parse(line);
        if (record.contains("val_loss")) val_lines++;
    }
    CHECK(val_lines == 3);
    CHECK(lines == 200 + 3 + 2);
    std::string cleanup = std::string("rm -rf ") + dir;
    CHECK(system(cleanup.c_str()) == 0);
}
