// config/options.h: the run configuration's options: every flag, its default and its documentation in one
// table.
//
// One table (run_options) drives everything: command-line parsing (llm.c's short letters, each
// with llm.c's meaning, and readable long names), `--config run.json` (keys are the long names),
// `--help`, and the resolved config.json written into the output directory, so any run can be
// repeated exactly. Command-line flags override the JSON file wherever they appear on the line.
// llm.c's letters that llmc has no option for (llmc_only_flags) are accepted only where their value
// describes what llmc does anyway, and otherwise refused, so no llm.c command line silently means
// something else here.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/config/run_config.h"
#include "llmc/utils.h"

namespace llmc {

// One row per option: how it is spelled, where it is stored and what it means.
struct RunOption {
    const char* short_flag;  // llm.c's letter, or "" when it has none
    const char* name;        // long flag (--name, - and _ both accepted) and JSON key
    std::variant<int RunConfig::*, float RunConfig::*, std::string RunConfig::*, bool RunConfig::*,
                 uint64_t RunConfig::*> field;
    const char* doc;
};

inline const std::vector<RunOption>& run_options() {
    static const std::vector<RunOption> options = {
        {"-i", "train_data", &RunConfig::train_data, "glob of training token shards"},
        {"-j", "val_data", &RunConfig::val_data, "glob of validation token shards (\"\" disables validation)"},
        {"", "tokenizer", &RunConfig::tokenizer, "tokenizer file for decoding samples (\"\" disables sampling)"},
        {"-o", "output_dir", &RunConfig::output_dir, "directory for config.json, metrics.jsonl, model.bin and the checkpoints ckpt_<step>/"},
        {"-e", "model", &RunConfig::model, "preset d4 d6 d12 d24 d36 d48 (either family; with --arch llama also llama3-8b llama3-70b llama3-405b), or a model file to start from (its header says its family and shape)"},
        {"", "arch", &RunConfig::arch, "model family of a preset: gpt2 (LayerNorm, learned positions, GELU MLP, tied head) or llama (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head; CPU model: data, tensor, pipeline parallelism, FP8; CUDA model: data, tensor, pipeline parallelism, -r); the llama3-* presets are llama"},
        {"", "kv_heads", &RunConfig::kv_heads, "with --arch llama: key/value heads, dividing the heads (0: the preset's, a quarter of the heads where they divide)"},
        {"", "ffn_hidden", &RunConfig::ffn_hidden, "with --arch llama: the SwiGLU MLP's width (0: the preset's, 8C/3 rounded up to a multiple of 256)"},
        {"", "rope_theta", &RunConfig::rope_theta, "with --arch llama: the rotary embedding's base (0: 500000, Llama 3's)"},
        {"", "num_layers", &RunConfig::num_layers, "override the preset's layer count"},
        {"", "num_heads", &RunConfig::num_heads, "override the preset's head count"},
        {"", "channels", &RunConfig::channels, "override the preset's channel count"},
        {"", "max_seq_len", &RunConfig::max_seq_len, "override the preset's maximum sequence length (1024)"},
        {"", "vocab_size", &RunConfig::vocab_size, "vocabulary size of a preset model (padded to a multiple of 128)"},
        {"", "experts", &RunConfig::experts, "mixture of experts: expert MLPs per MoE block of a preset model (0: dense GPT-2; CPU model with data, expert, pipeline and tensor parallelism, no --cp; CUDA model with data and expert parallelism)"},
        {"", "top_k", &RunConfig::top_k, "with --experts: experts each token is routed to"},
        {"", "moe_every", &RunConfig::moe_every, "with --experts: every N-th block has experts (the last of each N), the others GPT-2's MLP"},
        {"", "moe_shared", &RunConfig::moe_shared, "with --experts: 1 keeps the block's dense MLP as an always-on shared expert beside the routed ones"},
        {"", "capacity_factor", &RunConfig::capacity_factor, "with --experts: each expert takes at most cf x tokens x top-k / experts tokens, the rest dropped and counted (0: dropless)"},
        {"", "moe_balance_coef", &RunConfig::moe_balance_coef, "with --experts: the load-balancing loss's weight in the training loss"},
        {"", "moe_z_coef", &RunConfig::moe_z_coef, "with --experts: the router z-loss's weight in the training loss"},
        {"", "fp8", &RunConfig::fp8, "1: each block's four linear layers multiply in FP8 (E4M3 inputs and weights, E5M2 gradients, fp32 accumulation; the CPU model simulates it exactly)"},
        {"", "fp8_scaling", &RunConfig::fp8_scaling, "with --fp8 1: current (each tensor's own amax) or delayed (the largest amax of its last --fp8-history steps)"},
        {"", "fp8_history", &RunConfig::fp8_history, "with --fp8-scaling delayed: steps of amax each tensor's scale comes from"},
        {"", "fp8_gather", &RunConfig::fp8_gather, "with --fp8 1 -z 3 (CUDA model): 1 all-gathers the four weights as their FP8 codes (half the bytes), 0 as bf16, cast at each use"},
        {"", "attention", &RunConfig::attention, "CUDA model, head size 64: attention's kernels: auto (on an H100 or H200 Hopper's warpgroup products, the forward's version per T from llmc/kernels/attention_table.h, the backward fed by TMA; elsewhere mma), mma (mma.sync, any card), wgmma or tma (Hopper only)"},
        {"-b", "batch_size", &RunConfig::batch_size, "micro-batch size B (sequences per rank per forward)"},
        {"-t", "seq_len", &RunConfig::seq_len, "sequence length T"},
        {"-d", "total_batch_tokens", &RunConfig::total_batch_tokens, "tokens per optimizer step (0: B*T*ranks); more means gradient accumulation"},
        {"-x", "steps", &RunConfig::steps, "optimizer steps to train"},
        {"-l", "lr", &RunConfig::lr, "peak learning rate"},
        {"-k", "lr_schedule", &RunConfig::lr_schedule, "cosine | linear | constant | wsd"},
        {"-u", "warmup_steps", &RunConfig::warmup_steps, "linear warmup steps"},
        {"-q", "final_lr_frac", &RunConfig::final_lr_frac, "final learning rate as a fraction of the peak"},
        {"", "wsd_decay_frac", &RunConfig::wsd_decay_frac, "wsd: fraction of the steps spent in the cooldown"},
        {"-c", "weight_decay", &RunConfig::weight_decay, "AdamW decoupled weight decay (matrices only)"},
        {"", "beta1", &RunConfig::beta1, "AdamW beta1"},
        {"", "beta2", &RunConfig::beta2, "AdamW beta2"},
        {"", "eps", &RunConfig::eps, "AdamW epsilon"},
        {"", "grad_clip", &RunConfig::grad_clip, "clip the global gradient norm to this (0: off)"},
        {"", "seed", &RunConfig::seed, "seed for weight init, data shuffling and sampling"},
        {"", "shuffle", &RunConfig::shuffle, "shuffle training windows each epoch (0 or 1)"},
        {"-v", "val_every", &RunConfig::val_every, "evaluate validation loss every N steps (0: never)"},
        {"-m", "val_steps", &RunConfig::val_steps, "validation windows of B x T tokens per evaluation, over all data-parallel ranks together (the same set on any mesh)"},
        {"-h", "hellaswag", &RunConfig::hellaswag, "1: HellaSwag accuracy (llm.c's acc_norm) of --eval-hellaswag's items where validation runs: every -v steps and after the last (with -x 0 -e model.bin: evaluate that model only)"},
        {"", "eval_hellaswag", &RunConfig::eval_hellaswag, "the HellaSwag evaluation file, llm.c's format (dev/data/hellaswag.py makes it); giving one implies -h 1 unless -h is given"},
        {"-s", "sample_every", &RunConfig::sample_every, "print samples every N steps (0: never)"},
        {"-g", "sample_tokens", &RunConfig::sample_tokens, "tokens to generate per sample"},
        {"", "temperature", &RunConfig::temperature, "sampling temperature"},
        {"", "prompt", &RunConfig::prompt, "continue this text by -g tokens with the -e model, print it and exit: no training, nothing written"},
        {"", "bpe_dir", &RunConfig::bpe_dir, "directory of GPT-2's encoder.json and vocab.bpe, to encode --prompt"},
        {"-z", "zero_stage", &RunConfig::zero_stage, "ZeRO stage: 0 all-reduce, 1 shard optimizer, 2 + gradients, 3 + parameters"},
        {"", "tp", &RunConfig::tp, "tensor-parallel ranks (Megatron-LM): each layer's matrices split over tp adjacent ranks; world = dp x pp x cp x tp, ZeRO shards over dp (x cp)"},
        {"", "sp", &RunConfig::sequence_parallel, "with --tp > 1: 1 runs LayerNorms and residual adds on 1/tp of the tokens per rank (sequence parallelism), 0 on all of them"},
        {"", "pp", &RunConfig::pp, "pipeline stages: the layers cut into pp consecutive stages on different ranks, the step's micro-batches (-d / (B*T*dp)) flowing through them; world = dp x pp x cp x tp"},
        {"", "pp_schedule", &RunConfig::pp_schedule, "pipeline schedule: 1f1b (one forward, one backward) or interleaved (--pp-virtual chunks per rank, a bubble --pp-virtual times smaller)"},
        {"", "pp_virtual", &RunConfig::pp_virtual, "chunks of layers per pipeline rank for --pp-schedule interleaved (at least 2)"},
        {"", "pp_layers", &RunConfig::pp_layers, "layers per (virtual) pipeline stage, comma-separated, e.g. 5,7 (default: as even as it goes, the spare layers away from the first stage)"},
        {"", "pp_print_schedule", &RunConfig::pp_print_schedule, "1: print every pipeline rank's schedule of forwards and backwards (with --plan N: and exit)"},
        {"", "cp", &RunConfig::cp, "context-parallel ranks: every sequence split over cp ranks (chunks i and 2cp-1-i of 2cp on rank i), attention by ring attention; -t must divide by 2 x cp; world = dp x pp x cp x tp, ZeRO shards over dp x cp"},
        {"", "dp_shard", &RunConfig::dp_shard, "hybrid sharding (HSDP): ZeRO shards over groups of N consecutive data-parallel ranks (with their context ranks) and the dp/N groups replicate one another: gradients reduce-scattered inside a group, then only its 1/N slice all-reduced across the groups, ZeRO-3's gathers inside; N divides dp; 0 (default): one group of all dp ranks"},
        {"", "ep", &RunConfig::ep, "expert-parallel ranks (with --experts; CUDA model: with data parallelism only): the data-parallel ranks in groups of ep, each holding experts/ep of every MoE block's experts, tokens sent to their experts' ranks and back; ep divides dp, ZeRO shards the experts over the dp/ep ranks that hold the same ones"},
        {"", "gpu_comm", &RunConfig::gpu_comm, "CUDA model on several ranks: nccl (one GPU per rank) or mpi (gradients through host memory; ranks may share a GPU)"},
        {"", "peak_tflops", &RunConfig::peak_tflops, "one GPU's dense bf16 peak TFLOP/s for the step line's MFU (0: from the table of known GPUs by name)"},
        {"", "comm_timeout_s", &RunConfig::comm_timeout_s, "seconds before a collective that has not finished is an error"},
        {"", "heartbeat_s", &RunConfig::heartbeat_s, "seconds between the ranks' heartbeats, which see a dead rank fast and name missing ranks at a timeout (0: off)"},
        {"", "peer_dead_s", &RunConfig::peer_dead_s, "seconds without a heartbeat after which a rank is declared dead (the job ends with exit code 4)"},
        {"", "world_size", &RunConfig::expected_world_size, "the number of ranks this run expects (0: any); a launch with another count is an error"},
        {"-r", "recompute", &RunConfig::recompute, "CUDA model activation recomputation: 0 none, 1 GELU, 2 GELU + LayerNorm, 3 whole block (the CPU model stores all)"},
        {"-n", "checkpoint_every", &RunConfig::checkpoint_every, "write a checkpoint every N steps and at the end (0: never)"},
        {"-nk", "checkpoint_keep", &RunConfig::checkpoint_keep, "keep only the newest K checkpoints (0: all)"},
        {"-nm", "checkpoint_major", &RunConfig::checkpoint_major, "also keep every checkpoint whose step is a multiple of M (0: none)"},
        {"-y", "resume", &RunConfig::resume, "1: resume from the newest complete checkpoint in output_dir (starts fresh if there is none)"},
        {"", "resume_from", &RunConfig::resume_from, "resume from this checkpoint directory (or the newest complete one before it)"},
        {"", "overwrite", &RunConfig::overwrite, "1: a fresh run (or --resume-from) may delete the checkpoints another run left in output_dir"},
        {"", "local_ckpt_every", &RunConfig::local_ckpt_every, "also a local checkpoint every N steps in node-local storage, replicated on the next node (0: none)"},
        {"", "local_ckpt_dir", &RunConfig::local_ckpt_dir, "the local checkpoints' directory (node k of run <id> uses <dir>/run_<id>/node_<k>, k in 5 digits: node_00001; e.g. /dev/shm or NVMe)"},
        {"", "local_ckpt_keep", &RunConfig::local_ckpt_keep, "local checkpoints kept per node"},
        {"", "ranks_per_node", &RunConfig::ranks_per_node, "ranks that share one node's local storage (0: the launcher's count)"},
        {"", "ckpt_sync", &RunConfig::ckpt_sync, "write checkpoints synchronously, stalling training (0 or 1; for comparison)"},
        {"", "ckpt_fail_stop", &RunConfig::ckpt_fail_stop, "a checkpoint that fails to write stops the run (0 or 1; else training goes on)"},
        {"-sl", "skip_update_lossz", &RunConfig::skip_update_lossz, "skip the update when the loss's z-score over the last 100 steps exceeds this (0: off)"},
        {"-sg", "skip_update_gradz", &RunConfig::skip_update_gradz, "skip the update when the gradient norm's z-score over the last 100 steps exceeds this (0: off)"},
        {"", "max_skips", &RunConfig::max_skips, "after this many skipped updates in a row, roll back to the newest checkpoint (0: never)"},
        {"", "fingerprint_every", &RunConfig::fingerprint_every, "every N steps compare the replicas' parameter CRC32C (data-parallel and context-parallel ranks; with --ep those that hold the same experts; 0: never)"},
        {"", "model_dtype", &RunConfig::model_dtype, "the final model.bin's numbers: fp32 (llm.c's version 3) or bf16 (version 5)"},
        {"", "faults", &RunConfig::faults, "inject faults for testing, e.g. kill@12:1,nan_grad@5 (see llmc/failures/faults.h; also LLMC_FAULTS)"},
        {"", "straggler_factor", &RunConfig::straggler_factor, "health check at start: name ranks slower than the median by this factor as stragglers (0: no check)"},
        {"", "straggler_action", &RunConfig::straggler_action, "warn (train anyway) or refuse (exit 8) when the health check names a straggler"},
        {"", "log_rank_times", &RunConfig::log_rank_times, "1: every step, each rank's compute time into metrics.jsonl, naming the slowest rank"},
        {"", "plan", &RunConfig::plan, "print the per-rank memory plan and the predicted step time for this many ranks, then exit (0: train)"},
        {"", "plan_format", &RunConfig::plan_format, "--plan's output: text, or json (one object: step_time_s, tokens_per_s_per_gpu, model_tflops_per_gpu, hw_tflops_per_gpu, mfu, memory_gib, breakdown, goodput)"},
        {"", "plan_search", &RunConfig::plan_search, "rank every layout (dp, tp, pp, ZeRO stage, -r, -b) of this many GPUs for the -d batch, print the best and why the others lose, then exit"},
        {"", "topology", &RunConfig::topology, "the cluster --plan predicts on: h100 (DGX H100), a100 (DGX A100) or a JSON file (keys in llmc/planning/cluster.h)"},
        {"", "model_shape", &RunConfig::model_shape, "with --plan: the model as a JSON file of layers, hidden, heads, kv_heads, ffn_hidden, ffn (gelu|swiglu), vocab, tied"},
        {"", "failure_rate", &RunConfig::failure_rate, "--plan's goodput: failures per GPU-hour (default: Llama 3's 1.97e-5, 419 in 54 days on 16,384 H100s)"},
        {"", "restart_s", &RunConfig::restart_s, "--plan's goodput: seconds from a failure to training again, restoring the checkpoint not included"},
        {"", "storage_gbps", &RunConfig::storage_gbps, "--plan's goodput: shared storage bandwidth per node, GB/s (default 1: Llama 3's 2 TB/s over 2,048 nodes)"},
        {"", "local_recovers", &RunConfig::local_recovers, "--plan's goodput: share of failures the local tier (--local-ckpt-every) restarts from; the others need the shared one"},
    };
    return options;
}

// llm.c's letters that have no llmc option. A flag never means something else here than in llm.c:
// the value that describes what llmc always does (`same`, e.g. -a 0: no overfitting) is accepted and
// sets nothing; any other value is refused with what llmc offers instead.
struct LlmcOnlyFlag {
    const char* flag;
    const char* same;  // the accepted value, or "" when every value is refused
    const char* instead;
};

inline const std::vector<LlmcOnlyFlag>& llmc_only_flags() {
    static const char* launcher = "llmc takes the ranks and GPUs per node from mpirun or srun: launch with "
                                  "`mpirun -np N` or `srun`, no flag needed";
    static const std::vector<LlmcOnlyFlag> flags = {
        {"-a", "0", "llm.c's -a 1 overfits a single batch; llmc has no such debug mode"},
        {"-w", "1", "llmc always keeps fp32 master weights for the optimizer (llm.c's -w 1)"},
        {"-f", "", "llm.c's -f switches TF32 for fp32 matmuls; llmc's CUDA matmuls are bf16 with fp32 accumulation "
                   "and its CPU model is plain fp32, so there is no TF32 to switch"},
        {"-ge", "", "llm.c's -ge picks the GELU fusion; llmc's CUDA model fuses the GELU into the fc matmul when "
                    "-r is 0 and recomputes it otherwise (see -r)"},
        {"-lg", "", "llm.c's -lg logs GPU state every N steps; llmc has no such log (use nvidia-smi alongside)"},
        {"-pn", "", launcher}, {"-pr", "", launcher}, {"-pg", "", launcher}, {"-pi", "", launcher},
        {"-pm", "", launcher}, {"-ps", "", launcher}, {"-pf", "", launcher},
        {"-pp", "", "llm.c's -pp is the shared file system path of NCCL's fs start-up (-pm fs), which llmc does not "
                    "need (it takes the ranks from mpirun or srun); llmc's --pp (two dashes) is something else, the "
                    "number of pipeline stages, e.g. --pp 2"},
    };
    return flags;
}

namespace detail {

// A float as the JSON number with the fewest digits that reads back to the same float (0.001, not
// 0.0010000000474974513), so config.json is readable and round trips exactly.
inline nlohmann::json json_value(float v) {
    char buf[32];
    auto result = std::to_chars(buf, buf + sizeof buf, v);
    return std::strtod(std::string(buf, result.ptr).c_str(), nullptr);
}
template <typename T>
nlohmann::json json_value(const T& v) { return v; }

inline std::string flag_name(const RunOption& o) {
    std::string n = o.name;
    for (char& ch : n) if (ch == '_') ch = '-';
    return "--" + n;
}

// A number option's text is either not a number of its kind ("expects ...") or one outside what the
// field holds ("out of range"), each said as such: 1e300 is a number, just not a float.
inline void set_from_string(RunConfig& cfg, const RunOption& o, const std::string& where, const std::string& text) {
    auto bad = [&](const char* expected) {
        fail(strformat("%s expects %s, got '%s'", where.c_str(), expected, text.c_str()));
    };
    auto out_of_range = [&](const char* range) {
        fail(strformat("%s: '%s' is out of range: the option is %s", where.c_str(), text.c_str(), range));
    };
    std::visit([&](auto member) {
        using T = std::remove_reference_t<decltype(cfg.*member)>;
        char* end = nullptr;
        errno = 0;
        if constexpr (std::is_same_v<T, std::string>) {
            cfg.*member = text;
        } else if constexpr (std::is_same_v<T, bool>) {
            if (text == "1" || text == "true") cfg.*member = true;
            else if (text == "0" || text == "false") cfg.*member = false;
            else bad("0 or 1");
        } else if constexpr (std::is_same_v<T, float>) {
            float v = strtof(text.c_str(), &end);
            // inf passes here (a timeout may be "never"); resolve_run_config says which flags take it.
            if (text.empty() || *end || std::isnan(v)) bad("a number");
            if (errno == ERANGE) out_of_range("a 32-bit float: 0 or a magnitude from about 1.2e-38 to 3.4e+38");
            cfg.*member = v;
        } else if constexpr (std::is_same_v<T, int>) {
            long v = strtol(text.c_str(), &end, 10);
            if (text.empty() || *end) bad("an integer");
            if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
                out_of_range("a 32-bit integer, from -2147483648 to 2147483647");
            cfg.*member = (int)v;
        } else {
            unsigned long long v = strtoull(text.c_str(), &end, 10);
            if (text.empty() || text[0] == '-' || *end) bad("a non-negative integer");
            if (errno == ERANGE) out_of_range("a 64-bit unsigned integer, from 0 to 18446744073709551615");
            cfg.*member = (T)v;
        }
    }, o.field);
    cfg.given.insert(o.name);
}

// JSON types are strict: a string option takes a string, a number option a number (an integer one
// an integer), a boolean option true/false (or 0/1, as on the command line). `true` is not a batch
// size and "8" is not a number. The value is then range-checked exactly as the command line's.
inline void set_from_json(RunConfig& cfg, const RunOption& o, const std::string& where, const nlohmann::json& value) {
    const char* expected = std::visit([&](auto member) -> const char* {
        using T = std::remove_reference_t<decltype(cfg.*member)>;
        if constexpr (std::is_same_v<T, std::string>) return value.is_string() ? nullptr : "a string";
        else if constexpr (std::is_same_v<T, bool>)
            return value.is_boolean() || (value.is_number_integer() && (value == 0 || value == 1)) ? nullptr
                                                                                                 : "true, false, 0 or 1";
        else if constexpr (std::is_same_v<T, float>) return value.is_number() ? nullptr : "a number";
        else return value.is_number_integer() ? nullptr : "an integer";
    }, o.field);
    if (expected) fail(strformat("%s expects %s, got %s", where.c_str(), expected, value.dump().c_str()));
    std::string text = value.is_string() ? value.get<std::string>()
                     : value.is_boolean() ? (value.get<bool>() ? "1" : "0")
                     : value.dump();
    set_from_string(cfg, o, where, text);
}

inline const RunOption* find_option(const std::string& spelled) {
    std::string key = spelled;
    bool is_long = key.rfind("--", 0) == 0;
    if (is_long) {
        key = key.substr(2);
        for (char& ch : key) if (ch == '-') ch = '_';
    }
    for (const RunOption& o : run_options()) {
        if (is_long ? key == o.name : spelled == o.short_flag) return &o;
    }
    return nullptr;
}

}  // namespace detail

// Reads a JSON config file: an object of long option names to values. A key given twice is an
// error (JSON parsers silently keep one of them), and so is any key but the options' and
// "resolved", the derived values a run's own config.json holds: they are recomputed, not read.
inline void apply_config_file(RunConfig& cfg, const std::string& path) {
    nlohmann::json j;
    std::vector<std::set<std::string>> keys_per_object;  // of the objects being parsed, innermost last
    std::string duplicate;
    auto find_duplicates = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (event == E::object_start) keys_per_object.emplace_back();
        if (event == E::object_end) keys_per_object.pop_back();
        if (event == E::key && !keys_per_object.back().insert(parsed.get<std::string>()).second && duplicate.empty())
            duplicate = parsed.get<std::string>();
        return true;
    };
    std::string text;
    try {
        text = read_text_file(path);
    } catch (const Error& e) {
        fail(strformat("--config: %s", e.what()));
    }
    try {
        j = nlohmann::json::parse(text, find_duplicates);
    } catch (const nlohmann::json::exception& e) {
        fail(strformat("config file '%s' is not valid JSON: %s", path.c_str(), e.what()));
    }
    if (!duplicate.empty())
        fail(strformat("config file '%s': key '%s' appears more than once (which one was meant?)", path.c_str(),
                       duplicate.c_str()));
    if (!j.is_object()) fail(strformat("config file '%s' must hold a JSON object of option names to values", path.c_str()));
    for (auto& [key, value] : j.items()) {
        if (key == "resolved") continue;
        const RunOption* o = detail::find_option("--" + key);
        if (!o) fail(strformat("config file '%s': unknown option '%s' (see --help for the names)", path.c_str(), key.c_str()));
        detail::set_from_json(cfg, *o, strformat("config file '%s': option '%s'", path.c_str(), key.c_str()), value);
    }
    cfg.config_file = path;
}

inline std::string run_config_help(const char* program) {
    std::string out = strformat("usage: %s [flags]\n\nFlags (a --config FILE.json sets the same options by long name):\n", program);
    RunConfig defaults;
    for (const RunOption& o : run_options()) {
        std::string spelled = o.short_flag[0] ? strformat("%s, %s", o.short_flag, detail::flag_name(o).c_str())
                                              : "    " + detail::flag_name(o);
        std::string value = std::visit([&](auto member) {
            return detail::json_value(defaults.*member).dump();
        }, o.field);
        out += strformat("  %-26s %s (default %s)\n", spelled.c_str(), o.doc, value.c_str());
    }
    out += "      --config FILE          read options from a JSON file; later flags override it\n";
    out += "  -h, --help                 print this help (-h with a value is llm.c's HellaSwag flag, --hellaswag)\n";
    out += "\nllm.c's letters llmc has no option for (accepted only with the value that describes what llmc does):\n ";
    for (const LlmcOnlyFlag& f : llmc_only_flags())
        out += f.same[0] ? strformat(" %s %s", f.flag, f.same) : strformat(" %s", f.flag);
    out += "\n";
    return out;
}

// An llm.c letter llmc has no option for: accepted when `value` describes what llmc does, else
// refused with what llmc offers instead. Returns false for a flag that is not one of those.
inline bool check_llmc_only_flag(const std::string& flag, const std::string& value) {
    for (const LlmcOnlyFlag& f : llmc_only_flags()) {
        if (flag != f.flag) continue;
        if (f.same[0] && value == f.same) return true;
        fail(strformat("flag %s %s is llm.c's and llmc does not offer it: %s", flag.c_str(), value.c_str(), f.instead));
    }
    return false;
}

// Parses argv into cfg. Returns false when --help was asked for (the caller prints the help).
// -h alone (last, or followed by another flag) asks for help; -h with a value is llm.c's HellaSwag
// flag (--hellaswag).
inline bool parse_run_args(RunConfig& cfg, int argc, const char* const* argv) {
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--help") return false;
        if (arg == "-h" && (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] != '\0'))) return false;
        std::string value;
        bool has_inline_value = false;
        size_t eq = arg.find('=');
        if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
            has_inline_value = true;
        }
        if (!has_inline_value) {
            if (i + 1 >= argc) fail(strformat("flag %s needs a value", arg.c_str()));
            value = argv[++i];
        }
        if (arg == "--config") {
            apply_config_file(cfg, value);
            continue;
        }
        if (check_llmc_only_flag(arg, value)) continue;
        const RunOption* o = detail::find_option(arg);
        if (!o) fail(strformat("unknown flag '%s' (run with --help for the list)", arg.c_str()));
        detail::set_from_string(cfg, *o, strformat("flag %s", arg.c_str()), value);
    }
    return true;
}

}  // namespace llmc
