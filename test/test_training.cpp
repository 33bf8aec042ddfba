// End to end on the CPU: the real train loop on the default corpus lowers the validation loss well
// below ln(vocab), the loss of a uniform guess; and the run writes its config and metrics.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "llmc/models/cpu_model.h"
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

    CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len);
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
    double last_time = 0;
    for (std::string line; std::getline(metrics, line); lines++) {
        auto record = nlohmann::json::parse(line);
        if (record.contains("val_loss")) val_lines++;
        // every record has its wall-clock time, in order; a step record its elapsed time and ETA
        REQUIRE(record.contains("time"));
        CHECK(record["time"].get<double>() >= last_time);
        CHECK(record["time"].get<double>() > 1.7e9);  // seconds since the epoch, not since the start
        last_time = record["time"].get<double>();
        if (record.contains("train_loss")) {
            CHECK(record["elapsed_s"].get<double>() > 0);
            CHECK(record["eta_s"].get<double>() >= 0);
            CHECK_FALSE(record.contains("mfu"));  // no peak on the CPU
            if (record["step"] == 200) CHECK(record["eta_s"].get<double>() == 0);
        }
    }
    CHECK(val_lines == 3);
    CHECK(lines == 200 + 3 + 2);
    std::string cleanup = std::string("rm -rf ") + dir;
    CHECK(system(cleanup.c_str()) == 0);
}

TEST_CASE("MFU: the peak comes from the device name's table, durations read as h:mm:ss", "[training]") {
    CHECK(gpu_peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989);
    CHECK(gpu_peak_bf16_tflops("NVIDIA H100 PCIe") == 756);
    CHECK(gpu_peak_bf16_tflops("NVIDIA H200") == 989);
    CHECK(gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312);
    CHECK(gpu_peak_bf16_tflops("Some Future GPU") == 0);
    // 124M at T 1024: ~0.87 GFLOP per token; 400k tokens/s on one H100 is ~35%
    ModelConfig d12 = model_preset("d12");
    const double mfu = model_flops_utilization(model_flops_per_token(d12, 1024), 4e5, 989, 1);
    CHECK(mfu > 0.3);
    CHECK(mfu < 0.4);
    CHECK(model_flops_utilization(1e9, 1e5, 989, 8) == Approx(1e14 / (989e12 * 8)));
    CHECK(model_flops_utilization(1e9, 1e5, 0, 1) < 0);  // unknown peak: no MFU
    CHECK(format_duration(0) == "0:00:00");
    CHECK(format_duration(59.6) == "0:01:00");
    CHECK(format_duration(3 * 3600 + 25 * 60 + 7) == "3:25:07");
}

TEST_CASE("the closing line says what the run did: no validation, a resume, nothing left to train", "[training]") {
    TrainSummary fresh;
    fresh.steps_run = 8;
    fresh.first_val_step = 0;
    fresh.first_val_loss = 10.8583f;
    fresh.last_val_step = 8;
    fresh.last_val_loss = 10.8158f;
    fresh.last_train_loss = 10.8019f;
    fresh.mean_tokens_per_s = 2480;
    CHECK(summary_text(fresh) ==
          "val loss 10.8583 (step 0) -> 10.8158 (step 8) | train loss 10.8019 | 2480 tok/s mean");

    TrainSummary no_validation = fresh;  // -v 0: no "val loss nan -> nan"
    no_validation.first_val_step = no_validation.last_val_step = -1;
    no_validation.first_val_loss = no_validation.last_val_loss = NAN;
    CHECK(summary_text(no_validation) == "train loss 10.8019 | 2480 tok/s mean");

    TrainSummary resumed = fresh;  // its first validation is the resume step's, not the run's start
    resumed.first_step = resumed.first_val_step = 4;
    CHECK(summary_text(resumed) ==
          "resumed at step 4 | val loss 10.8583 (step 4) -> 10.8158 (step 8) | train loss 10.8019 | 2480 tok/s mean");

    TrainSummary finished;  // a finished run resumed: one validation, no step, no "train loss nan | 0 tok/s"
    finished.first_step = finished.first_val_step = finished.last_val_step = 8;
    finished.first_val_loss = finished.last_val_loss = 10.8158f;
    CHECK(summary_text(finished) == "resumed at step 8 | nothing left to train | val loss 10.8158 (step 8)");
}

TEST_CASE("a one-step run reports that step's throughput, not 0 tok/s", "[training][data]") {
    const char* shard = "data/default/default_train_000000.bin";
    if (!std::ifstream(shard).good()) FAIL("the default corpus is missing: run `make data` (make test does it first)");
    RunConfig cfg;
    cfg.num_layers = 1;
    cfg.channels = 32;
    cfg.num_heads = 2;
    cfg.max_seq_len = 32;
    cfg.batch_size = 2;
    cfg.seq_len = 32;
    cfg.steps = 1;
    cfg.val_every = 0;
    cfg.sample_every = 0;
    resolve_run_config(cfg, 1, nullptr);
    CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len);
    model.init_random(cfg.seed);
    LocalComm comm;
    const TrainSummary summary = Trainer(cfg, model, comm, "").run();  // "": no metrics file
    CHECK(summary.steps_run == 1);
    CHECK(summary.mean_tokens_per_s > 0);
    CHECK(summary.first_val_step == -1);
}
