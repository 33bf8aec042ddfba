// Tests for llmc/ckpt/: CRC32C, the manifest (format, parsing, errors), the mapping of flat ranges
// to tensor slices, and a checkpoint written and read back in one process. Resume on other world
// sizes, kills and injected failures run under mpirun in test/mpi/run_ckpt_tests.sh.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "llmc/ckpt/checkpoint.h"
#include "llmc/dist/zero_plan.h"
#include "llmc/training/metrics.h"
#include "llmc/models/cpu_model.h"

using namespace llmc;
using Catch::Contains;

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char name[] = "/tmp/llmc_ckpt_XXXXXX";
        if (!mkdtemp(name)) fail("mkdtemp failed");
        path = name;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

// What the code under test prints to stderr while this is alive (read by text()), through a pipe,
// which a file-size limit does not touch (a few KiB at most: the pipe must not fill up).
class StderrCapture {
public:
    StderrCapture() {
        REQUIRE(pipe(fds_) == 0);
        fflush(stderr);
        saved_ = dup(2);
        dup2(fds_[1], 2);
        close(fds_[1]);
    }
    ~StderrCapture() { text(); }
    std::string text() {
        if (saved_ >= 0) {
            fflush(stderr);
            dup2(saved_, 2);  // the pipe's last write end closes: the read below ends
            close(saved_);
            saved_ = -1;
            char buf[4096];
            for (ssize_t n; (n = read(fds_[0], buf, sizeof buf)) > 0;) text_.append(buf, (size_t)n);
            close(fds_[0]);
        }
        return text_;
    }

private:
    int fds_[2] = {-1, -1};
    int saved_ = -1;
    std::string text_;
};

ModelConfig tiny_model() {
    ModelConfig c;
    c.num_layers = 2;
    c.num_heads = 2;
    c.channels = 32;
    c.max_seq_len = 16;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    return c;
}

RunConfig tiny_run(const std::string& dir) {
    RunConfig cfg;
    cfg.output_dir = dir;
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.channels = 32;
    cfg.max_seq_len = 16;
    cfg.vocab_size = 100;
    cfg.batch_size = 2;
    cfg.seq_len = 8;
    cfg.steps = 10;
    cfg.checkpoint_every = 5;
    resolve_run_config(cfg, 1, nullptr);
    return cfg;
}

// A model with a non-trivial optimizer state: a few AdamW steps on random tokens.
void train_a_little(CPUModel& model, int steps, uint64_t seed) {
    std::mt19937 gen((unsigned)seed);
    std::vector<int> tokens(2 * 8 + 1);
    for (int s = 0; s < steps; s++) {
        for (int& t : tokens) t = (int)(gen() % 100);
        model.zero_grad();
        model.forward_backward(tokens.data(), tokens.data() + 1, 2, 8, 1.0f, true);
        model.adamw_step(AdamWConfig{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, s + 1, 1.0f);
    }
}

// Checkpoints of the model's state after each of `steps`, written by one writer, all complete.
void write_checkpoints(const RunConfig& cfg, CPUModel& model, Communicator& comm, std::initializer_list<int> steps) {
    CheckpointWriter writer(cfg, run_config_json(cfg), model.sharded_state(), model.layout(), comm);
    for (int step : steps) writer.save(TrainState{step, {}, {}});
    writer.finish();
}

std::vector<char> snapshot(ShardedState& state) {
    std::vector<char> bytes(state.snapshot_bytes());
    state.start_snapshot(bytes.data());
    state.wait_snapshot();
    return bytes;
}

}  // namespace

TEST_CASE("crc32c: known values, chunking, and the hardware and table paths agree", "[checkpoint]") {
    REQUIRE(crc32c(0, "123456789", 9) == 0xE3069283u);
    REQUIRE(crc32c(0, "123456789", 9, true) == 0xE3069283u);
    std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
    REQUIRE(crc32c(0, zeros.data(), 32) == 0x8A9136AAu);  // RFC 3720's test vectors
    REQUIRE(crc32c(0, ones.data(), 32) == 0x62A8AB43u);
    std::mt19937 gen(7);
    std::vector<uint8_t> data(10007);
    for (auto& b : data) b = (uint8_t)gen();
    const uint32_t whole = crc32c(0, data.data(), data.size());
    REQUIRE(crc32c(0, data.data(), data.size(), true) == whole);
    for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, data.size()})
        REQUIRE(crc32c(crc32c(0, data.data(), cut), data.data() + cut, data.size() - cut) == whole);
    data[5000] ^= 1;
    REQUIRE(crc32c(0, data.data(), data.size()) != whole);
}

TEST_CASE("checkpoint: every rank's file slices tile every tensor exactly once, for any world size and stage",
          "[checkpoint]") {
    const ParamLayout layout = GPT2Params::layout(tiny_model());
    const std::vector<ManifestTensor> tensors = manifest_tensors(layout);
    REQUIRE(tensors[GPT2Params::QKVW].shape == std::vector<uint64_t>{2, 96, 32});  // per-layer: L first
    const std::vector<StateBuffer> buffers = {{STATE_PARAMS, StateDtype::BF16}, {STATE_ADAM_M, StateDtype::F32}};
    for (int world : {1, 2, 3, 7}) {
        std::vector<std::vector<char>> covered(tensors.size());
        for (size_t t = 0; t < tensors.size(); t++) covered[t].assign(tensors[t].elements(), 0);
        for (int rank = 0; rank < world; rank++) {
            ZeroPlan plan(layout, 1, rank, world);
            std::vector<FlatRange> owned;
            for (const auto& k : plan.buckets)
                if (k.owned_end > k.owned_begin) owned.push_back({k.begin + k.owned_begin, k.begin + k.owned_end});
            ManifestFile f = describe_rank_file(layout, buffers, owned, rank, rank_file_name(rank));
            uint64_t at = 0;
            for (const ManifestBuffer& b : f.buffers)
                for (const ManifestSlice& s : b.slices) {
                    REQUIRE(s.byte_offset == at);  // back to back, in order
                    at += (s.end - s.begin) * state_dtype_bytes(b.dtype);
                    if (b.name == STATE_PARAMS)
                        for (uint64_t e = s.begin; e < s.end; e++) covered[s.tensor][e]++;
                }
            REQUIRE(at == f.bytes);
        }
        for (size_t t = 0; t < tensors.size(); t++)
            for (char c : covered[t]) REQUIRE(c == 1);
    }
    // A flat range cut at tensor boundaries names the global (layer-major) elements.
    const size_t qkvw1 = layout.offset(GPT2Params::QKVW, 1);
    std::vector<TensorPiece> pieces = tensor_pieces(layout, {qkvw1 + 10, qkvw1 + layout.tensor_size(GPT2Params::QKVW) + 5});
    REQUIRE(pieces.size() == 2);
    REQUIRE(pieces[0].tensor == GPT2Params::QKVW);
    REQUIRE(pieces[0].begin == layout.tensor_size(GPT2Params::QKVW) + 10);
    REQUIRE(pieces[0].end == 2 * layout.tensor_size(GPT2Params::QKVW));
    REQUIRE(pieces[1].tensor == GPT2Params::QKVB);
    REQUIRE(pieces[1].begin == layout.tensor_size(GPT2Params::QKVB));
    REQUIRE(pieces[1].end - pieces[1].begin == 5);
}

TEST_CASE("checkpoint: a checkpoint written and resumed in one process restores the whole state bitwise",
          "[checkpoint]") {
    TempDir dir;
    for (bool sync : {false, true}) {
        CAPTURE(sync);
        RunConfig cfg = tiny_run(dir.path);
        cfg.ckpt_sync = sync;
        LocalComm comm;
        CPUModel model(cfg.model_config, 2, 8);
        model.init_random(1);
        train_a_little(model, 3, 1);
        TrainState t{5, DataLoaderState{1, 2, 3, 0}, {1, 2, 3, 0xFFFFFFFFFFFFFFFFull}};
        {
            CheckpointWriter writer(cfg, run_config_json(cfg), model.sharded_state(), model.layout(), comm);
            REQUIRE(writer.due(5));
            REQUIRE(writer.due(10));  // the last step
            REQUIRE(!writer.due(7));
            writer.save(t);
            writer.finish();
            std::vector<CheckpointReport> reports = writer.take_finished();
            REQUIRE(reports.size() == 1);
            REQUIRE(reports[0].ok);
            REQUIRE(reports[0].bytes == model.sharded_state().snapshot_bytes());
            // and --plan counts the same host memory
            REQUIRE(reports[0].bytes == checkpoint_snapshot_bytes(ZeroPlan(model.layout(), 0, 0, 1), FP32_PARAMETERS));
        }
        const std::string ckpt = dir.path + "/ckpt_00000005";
        REQUIRE(std::filesystem::exists(ckpt + "/COMPLETE"));
        REQUIRE(std::filesystem::exists(ckpt + "/rank_00000.bin"));

        std::optional<ResumePoint> p = find_resume_checkpoint(cfg, comm);
        REQUIRE(p);
        REQUIRE(p->dir == ckpt);
        REQUIRE(p->manifest.step == 5);
        REQUIRE(p->manifest.data == t.data);
        REQUIRE(p->manifest.sampler_rng == t.sampler_rng);
        REQUIRE(p->manifest.model.channels == 32);
        check_resume_compatible(*p, cfg);

        CPUModel other(cfg.model_config, 2, 8);
        other.init_random(2);
        train_a_little(other, 1, 2);
        REQUIRE(snapshot(other.sharded_state()) != snapshot(model.sharded_state()));
        load_checkpoint(*p, other.sharded_state(), other.layout());
        REQUIRE(snapshot(other.sharded_state()) == snapshot(model.sharded_state()));
        // and it trains on identically
        train_a_little(model, 2, 9);
        train_a_little(other, 2, 9);
        REQUIRE(snapshot(other.sharded_state()) == snapshot(model.sharded_state()));
        std::filesystem::remove_all(ckpt);
    }
}

TEST_CASE("checkpoint: a resumed run must keep the model shape, seed, B*T, total batch and shuffling",
          "[checkpoint]") {
    TempDir dir;
    RunConfig cfg = tiny_run(dir.path);
    LocalComm comm;
    CPUModel model(cfg.model_config, 2, 8);
    model.init_random(1);
    write_checkpoints(cfg, model, comm, {5});
    ResumePoint p = *find_resume_checkpoint(cfg, comm);
    RunConfig other = cfg;
    other.seed = 7;
    REQUIRE_THROWS_WITH(check_resume_compatible(p, other), Contains("seed is 1337 but this run's is 7"));
    other = cfg;
    other.model_config.channels = 64;
    REQUIRE_THROWS_WITH(check_resume_compatible(p, other), Contains("model channels is 32 but this run's is 64"));
    other = cfg;
    other.batch_size = 4;
    REQUIRE_THROWS_WITH(check_resume_compatible(p, other), Contains("B*T (window size) is 2*8 but this run's is 4*8"));
    other.seq_len = 4;  // same window: allowed
    check_resume_compatible(p, other);
    other = cfg;
    other.total_batch_tokens = 32;
    REQUIRE_THROWS_WITH(check_resume_compatible(p, other), Contains("total_batch_tokens is 16 but this run's is 32"));
    other = cfg;
    other.shuffle = false;
    REQUIRE_THROWS_WITH(check_resume_compatible(p, other), Contains("shuffle"));
    other = cfg;
    other.steps = 50;  // steps, lr and intervals may change
    other.lr = 1e-2f;
    check_resume_compatible(p, other);
    // A model of another shape cannot read it at all.
    ModelConfig wider = tiny_model();
    wider.channels = 64;
    CPUModel big(wider, 2, 8);
    REQUIRE_THROWS_WITH(load_checkpoint(p, big.sharded_state(), big.layout()),
                        Contains("tensor 'wte' has shape [128,32]; this model's is [128,64]"));
}

TEST_CASE("checkpoint: damaged checkpoints are named and skipped for the previous one", "[checkpoint]") {
    TempDir dir;
    RunConfig cfg = tiny_run(dir.path);
    LocalComm comm;
    CPUModel model(cfg.model_config, 2, 8);
    model.init_random(1);
    write_checkpoints(cfg, model, comm, {5, 10});
    const std::string newest = dir.path + "/ckpt_00000010";
    auto resumed_step = [&]() {
        std::optional<ResumePoint> p = find_resume_checkpoint(cfg, comm);
        return p ? p->manifest.step : -1;
    };
    REQUIRE(resumed_step() == 10);
    auto damage = [&](const std::string& file, auto how) {
        const std::string path = newest + "/" + file;
        std::string bytes = read_text_file(path);
        how(bytes);
        File f(path, "wb");
        f.write(bytes.data(), bytes.size());
        f.close();
    };
    const std::string saved = read_text_file(newest + "/rank_00000.bin");
    const std::string saved_manifest = read_text_file(newest + "/manifest.json");
    auto restore = [&]() {
        damage("rank_00000.bin", [&](std::string& b) { b = saved; });
        damage("manifest.json", [&](std::string& b) { b = saved_manifest; });
        REQUIRE(resumed_step() == 10);
    };

    SECTION("a flipped byte") {
        damage("rank_00000.bin", [](std::string& b) { b[b.size() / 2] ^= 0x10; });
        REQUIRE(resumed_step() == 5);
        restore();
    }
    SECTION("a truncated file") {
        damage("rank_00000.bin", [](std::string& b) { b.resize(b.size() - 4); });
        REQUIRE(resumed_step() == 5);
        restore();
    }
    SECTION("a corrupt manifest") {
        damage("manifest.json", [](std::string& b) { b.resize(b.size() / 2); });
        REQUIRE(resumed_step() == 5);
        restore();
    }
    SECTION("a FIFO as manifest.json (opening it to read would wait for a writer for ever)") {
        std::filesystem::remove(newest + "/manifest.json");
        REQUIRE(mkfifo((newest + "/manifest.json").c_str(), 0644) == 0);
        Manifest m;
        std::string text;
        CHECK(detail::manifest_problem(newest, "", &m, &text) ==
              "'" + newest + "/manifest.json' is a FIFO (named pipe), expected a regular file");
        REQUIRE(resumed_step() == 5);
    }
    SECTION("no marker") {
        std::filesystem::remove(newest + "/COMPLETE");
        REQUIRE(resumed_step() == 5);
        std::filesystem::remove(dir.path + "/ckpt_00000005/COMPLETE");
        REQUIRE(resumed_step() == -1);  // nothing usable: a fresh start
    }
    SECTION("--resume-from picks a directory, or the newest usable one before it") {
        cfg.resume_from = dir.path + "/ckpt_00000005/";
        REQUIRE(resumed_step() == 5);
        cfg.resume_from = dir.path + "/ckpt_00000007";  // absent: the newest before it
        REQUIRE(resumed_step() == 5);
        cfg.resume_from = dir.path + "/elsewhere";
        REQUIRE_THROWS_WITH(resumed_step(), Contains("expected a checkpoint directory named ckpt_<8 digits>"));
    }
}

TEST_CASE("checkpoint: retention keeps the newest -nk and every -nm-th step, and removes debris", "[checkpoint]") {
    TempDir dir;
    RunConfig cfg = tiny_run(dir.path);
    cfg.steps = 100;
    cfg.checkpoint_every = 1;
    cfg.checkpoint_keep = 2;
    cfg.checkpoint_major = 4;
    LocalComm comm;
    CPUModel model(cfg.model_config, 2, 8);
    model.init_random(1);
    std::filesystem::create_directories(dir.path + "/ckpt_00000003");  // an incomplete leftover
    write_checkpoints(cfg, model, comm, {1, 2, 3, 4, 5, 6, 7, 8, 9});
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    REQUIRE(names == std::vector<std::string>{"ckpt_00000004", "ckpt_00000008", "ckpt_00000009"});
}

TEST_CASE("manifest: round trip, and malformed manifests are errors naming the field", "[checkpoint]") {
    const ParamLayout layout = GPT2Params::layout(tiny_model());
    Manifest m;
    m.step = 42;
    m.world_size = 1;
    m.model = tiny_model();
    m.run_config = {{"seed", 1}};
    m.data = {3, 1, 4, 0};
    m.sampler_rng = {1, 2, 3, 4};
    m.model_rng = {{"stochastic_rounding_seed", 99}};
    m.tensors = manifest_tensors(layout);
    std::vector<FlatRange> all = {{0, layout.num_params}};
    m.files.push_back(describe_rank_file(layout, {{STATE_PARAMS, StateDtype::F32}}, all, 0, "rank_00000.bin"));
    m.files[0].crc32c = 0xDEADBEEF;
    const std::string text = manifest_text(manifest_json(m));
    Manifest back = parse_manifest(text, "test");
    REQUIRE(back.step == 42);
    REQUIRE(back.data == m.data);
    REQUIRE(back.sampler_rng == m.sampler_rng);
    REQUIRE(back.model_rng == m.model_rng);
    REQUIRE(back.files.size() == 1);
    REQUIRE(back.files[0].crc32c == 0xDEADBEEF);
    REQUIRE(back.files[0].bytes == layout.num_params * 4);
    REQUIRE(back.files[0].buffers[0].slices.size() == m.files[0].buffers[0].slices.size());
    REQUIRE(manifest_text(manifest_json(back)) == text);

    auto broken = [&](auto edit) {
        nlohmann::json j = nlohmann::json::parse(text);
        edit(j);
        return j.dump();
    };
    REQUIRE_THROWS_WITH(parse_manifest(text.substr(0, text.size() / 2), "m"), Contains("not valid JSON"));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j.erase("step"); }), "m"),
                        Contains("missing field manifest.step"));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["format_version"] = 9; }), "m"),
                        Contains("format_version is 9"));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["model"]["channels"] = "wide"; }), "m"),
                        Contains("model.channels is \"wide\""));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["files"][0]["buffers"][0]["slices"][0][2] = 1u << 30; }), "m"),
                        Contains("lies outside its tensor"));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["files"][0]["path"] = "../x"; }), "m"),
                        Contains("must be a plain file name"));
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["files"][0]["buffers"][0]["dtype"] = "f16"; }), "m"),
                        Contains("dtype 'f16'"));
    // A changed dtype: the same elements in half the bytes would be read as garbage.
    REQUIRE_THROWS_WITH(parse_manifest(broken([](auto& j) { j["files"][0]["buffers"][0]["dtype"] = "bf16"; }), "m"),
                        Contains("expected the slices back to back (a changed dtype or slice?)"));
    const uint64_t longer = layout.num_params * 4 + 4;
    REQUIRE_THROWS_WITH(parse_manifest(broken([&](auto& j) { j["files"][0]["bytes"] = longer; }), "m"),
                        Contains("the slices end at byte"));
}

TEST_CASE("metrics: a resumed run keeps the records before its step and drops the ones it repeats", "[checkpoint]") {
    TempDir dir;
    const std::string path = dir.path + "/metrics.jsonl";
    {
        std::ofstream f(path);
        f << R"({"step": 0, "val_loss": 11})" << "\n"
          << R"({"step": 1, "train_loss": 10})" << "\n"
          << R"({"step": 2, "train_loss": 9})" << "\n"
          << R"({"step": 2, "val_loss": 9.5})" << "\n"
          << R"({"checkpoint": "ckpt_00000002", "step": 2})" << "\n"
          << R"({"step": 3, "train_loss": 8})" << "\n"
          << "{\"step\": 4, \"tra";  // cut off by the kill
    }
    {
        MetricsLog log;
        log.open(path, 2);
        log.log_val(2, 9.5f);
    }
    // The step's own record and its checkpoint's stay; its evaluation, written again, comes once.
    std::string kept = read_text_file(path);
    REQUIRE(kept.substr(0, kept.rfind("{\"step\":2,")) ==
            "{\"step\": 0, \"val_loss\": 11}\n{\"step\": 1, \"train_loss\": 10}\n{\"step\": 2, \"train_loss\": 9}\n"
            "{\"checkpoint\": \"ckpt_00000002\", \"step\": 2}\n");
    REQUIRE(kept.find("\"val_loss\":9.5") != std::string::npos);
}

TEST_CASE("metrics: after a rollback the abandoned records are marked superseded, the events kept", "[checkpoint]") {
    TempDir dir;
    const std::string path = dir.path + "/metrics.jsonl";
    MetricsLog log(path);
    for (int step = 1; step <= 3; step++) {
        StepMetrics m;
        m.step = step;
        log.log_step(m);
        if (step == 2) log.log_val(2, 9.0f);
    }
    log.log_event("guard: step 3 update skipped", {{"step", 3}, {"event", "skip"}});
    log.supersede_after(2);  // back to the state after step 2
    log.log_val(2, 9.0f);
    log.log_step(StepMetrics{3});
    std::vector<nlohmann::json> records;
    std::istringstream lines(read_text_file(path));
    for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
    REQUIRE(records.size() == 7);
    auto superseded = [&](size_t i) { return records[i].value("superseded", false); };
    CHECK_FALSE(superseded(0));  // step 1
    CHECK_FALSE(superseded(1));  // step 2
    CHECK(superseded(2));        // step 2's evaluation: the run repeats it
    CHECK(superseded(3));        // step 3
    CHECK_FALSE(superseded(4));  // the skip event: what happened stays
    CHECK_FALSE(superseded(5));  // the evaluation of step 2 again, and step 3 again, appended
    CHECK_FALSE(superseded(6));
    CHECK(records[6]["step"] == 3);
    // What a reader keeps: one record per step, in order.
    std::vector<int> steps;
    for (const nlohmann::json& r : records)
        if (r.contains("train_loss") && !r.value("superseded", false)) steps.push_back(r["step"].get<int>());
    CHECK(steps == std::vector<int>{1, 2, 3});
}

TEST_CASE("metrics: a record the disk refuses is cut off whole and warned about once, and the log goes on",
          "[checkpoint]") {
    TempDir dir;
    const std::string path = dir.path + "/metrics.jsonl";
    MetricsLog log(path);
    log.log_record({{"step", 1}});
    const rlim_t whole = (rlim_t)std::filesystem::file_size(path);
    // The file may grow by 10 bytes only, as on a disk that fills up: the next records are cut off
    // mid-line (a file-size limit fails writes past it with EFBIG; its signal would end the process).
    rlimit saved{};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    rlimit full = saved;
    full.rlim_cur = whole + 10;
    void (*saved_signal)(int) = signal(SIGXFSZ, SIG_IGN);
    std::string warnings;
    {
        StderrCapture captured;
        REQUIRE(setrlimit(RLIMIT_FSIZE, &full) == 0);
        const std::string padding(200, 'x');
        CHECK_NOTHROW(log.log_record({{"step", 2}, {"padding", padding}}));
        CHECK_NOTHROW(log.log_record({{"step", 3}, {"padding", padding}}));
        setrlimit(RLIMIT_FSIZE, &saved);
        signal(SIGXFSZ, saved_signal);
        warnings = captured.text();
    }
    CHECK(std::filesystem::file_size(path) == whole);  // the partial record is gone
    log.log_record({{"step", 4}});                       // room again: the log goes on
    std::istringstream lines(read_text_file(path));
    std::vector<int> steps;
    for (std::string line; std::getline(lines, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int>());
    CHECK(steps == std::vector<int>{1, 4});
    CHECK_THAT(warnings, Contains("warning: metrics: cannot write") && Contains(path) &&
                             Contains("training goes on, without the records that cannot be written (said once)"));
    CHECK(warnings.find("warning:") == warnings.rfind("warning:"));  // once, though two records were lost
}
