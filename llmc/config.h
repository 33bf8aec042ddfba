// config.h: the run configuration: every flag, its default and its documentation in one table.
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
#include <string>
#include <variant>
#include <vector>

#include <set>

#include <nlohmann/json.hpp>

#include "llmc/dist/context_parallel.h"
#include "llmc/dist/parallel_dims.h"
#include "llmc/dist/pipeline_schedule.h"
#include "llmc/numerics/fp8.h"
#include "llmc/planning/goodput.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/training/schedule.h"
#include "llmc/utils.h"

namespace llmc {

struct RunConfig {
    // data
    std::string train_data = "data/default/default_train_*.bin";
    std::string val_data = "data/default/default_val_*.bin";
    std::string tokenizer = "data/gpt2_tokenizer.bin";
    std::string output_dir = "out";
    // model: a preset name or a model file, and optional shape overrides for presets
    std::string model = "d4";
    int num_layers = 0, num_heads = 0, channels = 0, max_seq_len = 0;  // 0: the preset's value
    int vocab_size = 50257;
    // mixture of experts (a preset's; a model file's header says its own): cpu/moe.h
    int experts = 0, top_k = 2, moe_every = 1, moe_shared = 0;
    float capacity_factor = 0;     // 0: dropless
    float moe_balance_coef = 0.01f, moe_z_coef = 0.001f;  // the auxiliary losses' weights in the loss
    // FP8 products (fp8.h; the CPU model's simulation: cpu/fp8_linear.h)
    int fp8 = 0;
    std::string fp8_scaling = "current";
    int fp8_history = 16;
    int fp8_gather = 1;  // ZeRO-3: the weights' all-gather carries their FP8 codes (models/gpt2/fp8_gather.cuh)
    // batch
    int batch_size = 8;          // B: sequences per micro-batch per data-parallel rank
    int seq_len = 128;           // T
    int total_batch_tokens = 0;  // tokens per optimizer step over all ranks; 0 means B*T*dims.dp
    // optimization
    int steps = 500;
    float lr = 1.5e-3f;
    std::string lr_schedule = "cosine";
    int warmup_steps = 30;
    float final_lr_frac = 0.1f;
    float wsd_decay_frac = 0.2f;
    float weight_decay = 0.1f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float grad_clip = 1.0f;  // global gradient-norm clip; 0 disables
    uint64_t seed = 1337;
    bool shuffle = true;
    // evaluation and sampling
    int val_every = 100;  // 0 disables
    int val_steps = 10;   // validation windows (B x T tokens each) per evaluation, over all ranks together
    int sample_every = 250;  // 0 disables
    int sample_tokens = 48;
    float temperature = 1.0f;
    std::string prompt;  // --prompt: continue this text by -g tokens, print it and exit (no training)
    std::string bpe_dir = "data/gpt2_bpe";  // GPT-2's encoder.json and vocab.bpe, to encode --prompt
    // data parallelism
    int zero_stage = 0;           // 0 all-reduce, 1 + sharded optimizer, 2 + sharded gradients, 3 + sharded parameters
    float comm_timeout_s = 600;   // a collective not finished after this long is an error
    float heartbeat_s = 0.5;      // ranks exchange a status this often (0: no heartbeat; heartbeat.h)
    float peer_dead_s = 5;        // a rank silent for this long is dead
    std::string gpu_comm = "nccl";  // CUDA model on several ranks: nccl (a GPU per rank) or mpi (via host memory)
    float peak_tflops = 0;        // one device's dense bf16 peak for MFU (0: the GPU's from mfu.h's table)
    int plan = 0;                 // >0: print the memory plan for this many ranks and exit
    std::string plan_format = "text";  // --plan's output: text, or json (the predicted step as one object)
    int plan_search = 0;          // >0: rank every layout of this many GPUs (step_plan.h) and exit
    std::string topology = "h100";     // --plan's cluster: h100, a100 or a JSON file (cluster.h)
    std::string model_shape;      // --plan's model: a JSON shape file instead of the -e preset (cluster.h)
    // --plan's goodput (goodput.h): failures, restarts and the shared storage of the cluster
    float failure_rate = (float)kLlama3FailuresPerGpuHour;  // failures per GPU-hour
    float restart_s = 600;        // seconds from a failure to training again, restores not included
    float storage_gbps = 1;       // shared storage's read and write bandwidth per node, GB/s
    float local_recovers = 0.9f;  // share of failures the local tier restarts from
    // tensor parallelism (gpt2_cpu.h)
    int tp = 1;                   // ranks per tensor-parallel group: world = dp x pp x cp x tp
    int sequence_parallel = 1;    // with tp > 1: LayerNorms and the residual stream on 1/tp of the tokens
    // pipeline parallelism (pipeline_schedule.h, gpt2_cpu.h)
    int pp = 1;                           // pipeline stages: world = dp x pp x cp x tp
    std::string pp_schedule = "1f1b";     // 1f1b | interleaved
    int pp_virtual = 1;                   // chunks of layers per rank (interleaved: at least 2)
    std::string pp_layers;                // layers per virtual stage, "5,7" ("": as even as it goes)
    int pp_print_schedule = 0;            // 1: print the pipeline schedule (every rank's actions)
    // context parallelism (context_parallel.h, cpu/ring_attention.h)
    int cp = 1;                           // ranks per context group, each sequence split over them
    // expert parallelism (dist/expert_parallel.h)
    int ep = 1;                           // ranks per expert group, carved from the data-parallel ranks
    // memory
    int recompute = 0;  // CUDA model: 0 store all activations, 1 recompute GELU, 2 + LayerNorms, 3 whole blocks
    int expected_world_size = 0;  // >0: the launch must have exactly this many ranks
    // checkpoints (checkpoint.h)
    int checkpoint_every = 0;     // -n: every N steps and at the end (0: never)
    int checkpoint_keep = 0;      // -nk: keep the newest K (0: all)
    int checkpoint_major = 0;     // -nm: also keep every step that is a multiple of M (0: none)
    int resume = 0;               // -y 1: resume from the newest complete checkpoint in output_dir
    std::string resume_from;      // a checkpoint directory to resume from (implies resume)
    bool overwrite = false;       // a new run may delete the checkpoints another run left in output_dir
    bool ckpt_sync = false;       // write checkpoints on the training thread (for comparison)
    int local_ckpt_every = 0;     // the local tier: every N steps into node-local storage, replicated on the next node
    std::string local_ckpt_dir = "/dev/shm/llmc";  // its root: node k of run <id> writes <dir>/run_<id>/node_<k>/ (node_00001)
    int local_ckpt_keep = 2;      // local checkpoints kept per node
    int ranks_per_node = 0;       // consecutive ranks that share a node's local storage (0: as the launcher says)
    bool ckpt_fail_stop = false;  // a failed checkpoint write stops training (else logged, training goes on)
    // guards (train_loop.h)
    float skip_update_lossz = 0;  // -sl: skip the update when the loss's z-score exceeds this (0: off)
    float skip_update_gradz = 0;  // -sg: the same for the gradient norm (0: off)
    int max_skips = 5;            // this many skipped updates in a row roll back to the newest checkpoint
    int fingerprint_every = 100;  // compare the replicas' parameter fingerprints every N steps (0: never)
    std::string model_dtype = "fp32";
    // stragglers (health.h)
    float straggler_factor = 2.0f;          // start-up health check: a rank this much slower than the median (0: no check)
    std::string straggler_action = "warn";  // warn | refuse (exit 8) when the health check names a straggler
    bool log_rank_times = false;            // every step's compute time of every rank into metrics.jsonl
    std::string faults;  // fault injection for tests (faults.h), added to LLMC_FAULTS  // the final model.bin: fp32 (llm.c version 3) or bf16 (version 5)
    std::string config_file;  // --config, for the record

    // Resolved by resolve(): the model shape, the mesh and the batch arithmetic.
    ModelConfig model_config;
    int world_size = 1;  // ranks in the launch
    ParallelDims dims;   // how they are laid out; the batch is split over the dims.dp data-parallel ranks
    int grad_accum_steps = 1;
    bool model_is_file = false;
    std::string run_id;  // this run's identity (ckpt/output_dir.h), set once the output directory is claimed
    std::set<std::string> given;  // the options set by a flag or --config, by their long names
};

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
        {"-e", "model", &RunConfig::model, "preset d4 d6 d12 d24 d36 d48, or a model file to start from"},
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
// the value that describes what llmc always does (`same`, e.g. -h 0: no HellaSwag) is accepted and
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
        {"-h", "0", "llm.c's -h 1 runs the HellaSwag evaluation, which llmc does not have (validation loss: -v, -m); "
                    "for llmc's help use --help"},
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
    out += "  -h, --help                 print this help (-h with a value is llm.c's HellaSwag flag: -h 0 is "
           "accepted, -h 1 refused)\n";
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
// flag (llmc_only_flags).
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

// Tensor parallelism over tp ranks cuts the heads, the MLP's 4C hidden units and the padded
// vocabulary into tp equal parts (params.h says which tensors), so each must divide.
inline void check_tensor_parallel_shape(const ModelConfig& m, int tp) {
    if (tp == 1) return;
    auto divides = [&](const char* what, long long n) {
        if (n % tp != 0)
            fail(strformat("--tp %d must divide the model's %s (%lld): tensor parallelism gives each rank an equal part",
                           tp, what, n));
    };
    divides("head count", m.num_heads);
    divides("MLP width 4 x channels", 4LL * m.channels);
    divides("padded vocabulary", m.padded_vocab_size);
}

// How the resolved config cuts the model's layers into pipeline stages (one stage without --pp).
inline PipelineSplit pipeline_split(const RunConfig& cfg) {
    return make_pipeline_split(cfg.model_config.num_layers, cfg.pp, cfg.pp_virtual, cfg.pp_layers);
}
// The pipeline a config asks for (one stage without --pp): its split, and a step's micro-batches.
inline PipelineParallel pipeline_of(const RunConfig& cfg) { return {pipeline_split(cfg), cfg.grad_accum_steps}; }

namespace detail {

inline void require(bool ok, const std::string& message) {
    if (!ok) fail(message);
}

// The mesh: the launch's rank count, and dp x pp x cp x tp with the pipeline schedule's options.
inline void resolve_mesh(RunConfig& cfg, int world_size) {
    require(cfg.expected_world_size >= 0,
            strformat("--world-size must be a rank count >= 1 (or 0: any), got %d", cfg.expected_world_size));
    if (cfg.expected_world_size > 0 && cfg.expected_world_size != world_size)
        fail(strformat("--world-size is %d but the job was launched with %d rank(s)", cfg.expected_world_size,
                       world_size));
    cfg.world_size = world_size;
    require(cfg.tp >= 1, strformat("--tp must be >= 1, got %d", cfg.tp));
    require(cfg.pp >= 1, strformat("--pp must be >= 1, got %d", cfg.pp));
    require(cfg.cp >= 1, strformat("--cp must be >= 1, got %d", cfg.cp));
    require(world_size % ((long long)cfg.tp * cfg.pp * cfg.cp) == 0,
            cfg.cp == 1 ? strformat("--pp %d x --tp %d does not divide the %d rank(s): the world is dp x pp x tp ranks",
                                    cfg.pp, cfg.tp, world_size)
                        : strformat("--pp %d x --cp %d x --tp %d does not divide the %d rank(s): the world is dp x pp x "
                                    "cp x tp ranks", cfg.pp, cfg.cp, cfg.tp, world_size));
    require(cfg.sequence_parallel == 0 || cfg.sequence_parallel == 1,
            strformat("--sp must be 0 or 1, got %d", cfg.sequence_parallel));
    require(cfg.pp_schedule == "1f1b" || cfg.pp_schedule == "interleaved",
            strformat("--pp-schedule must be 1f1b or interleaved, got '%s'", cfg.pp_schedule.c_str()));
    require(cfg.pp_schedule == "interleaved" ? cfg.pp_virtual >= 2 : cfg.pp_virtual == 1,
            cfg.pp_schedule == "interleaved"
                ? strformat("--pp-schedule interleaved needs --pp-virtual >= 2 chunks per rank, got %d", cfg.pp_virtual)
                : strformat("--pp-virtual %d needs --pp-schedule interleaved (1f1b runs one chunk per rank)",
                            cfg.pp_virtual));
    require(cfg.pp_virtual == 1 || cfg.pp > 1,
            strformat("--pp-schedule interleaved needs --pp >= 2 (got --pp %d): it interleaves the stages' chunks", cfg.pp));
    require(cfg.pp_print_schedule == 0 || cfg.pp_print_schedule == 1,
            strformat("--pp-print-schedule must be 0 or 1, got %d", cfg.pp_print_schedule));
    require(cfg.pp > 1 || cfg.pp_layers.empty(), "--pp-layers needs --pp > 1 (it says how the layers are cut into stages)");
    cfg.dims = ParallelDims::data_parallel(world_size / (cfg.tp * cfg.pp * cfg.cp));
    cfg.dims.tp = cfg.tp;
    cfg.dims.pp = cfg.pp;
    cfg.dims.cp = cfg.cp;
    require(cfg.ep >= 1 && cfg.dims.dp % cfg.ep == 0,
            strformat("--ep %d must be >= 1 and divide the %d data-parallel rank(s) (%d rank(s) / (pp %d x cp %d x tp "
                      "%d)): expert groups are carved from the data-parallel ranks", cfg.ep, cfg.dims.dp, world_size,
                      cfg.pp, cfg.cp, cfg.tp));
    cfg.dims.ep = cfg.ep;
    cfg.dims.validate(world_size);
}

// The model shape: the -e model file's header, or a preset with the shape flags.
inline void resolve_model(RunConfig& cfg, const ModelConfig* model_from_file) {
    cfg.model_is_file = model_from_file != nullptr;
    if (model_from_file) {
        cfg.model_config = *model_from_file;
        require(!cfg.num_layers && !cfg.num_heads && !cfg.channels && !cfg.max_seq_len,
                "--num-layers/--num-heads/--channels/--max-seq-len override presets only, but -e names a model file");
        for (const char* flag : {"experts", "top_k", "moe_every", "moe_shared"})
            require(!cfg.given.count(flag), strformat("--%s shapes a preset, but -e names a model file, whose header "
                                                     "says its experts", flag == std::string("top_k") ? "top-k" : flag));
    } else {
        require(cfg.vocab_size > 0 && cfg.vocab_size <= ModelConfig::kMaxVocab,
                strformat("--vocab-size must be in [1, %d], got %d", ModelConfig::kMaxVocab, cfg.vocab_size));
        require(cfg.num_layers >= 0 && cfg.num_heads >= 0 && cfg.channels >= 0 && cfg.max_seq_len >= 0,
                strformat("--num-layers/--num-heads/--channels/--max-seq-len must be positive (or 0: the preset's), "
                          "got %d/%d/%d/%d", cfg.num_layers, cfg.num_heads, cfg.channels, cfg.max_seq_len));
        ModelConfig m = model_preset(cfg.model, 1024, cfg.vocab_size);
        if (cfg.num_layers) m.num_layers = cfg.num_layers;
        if (cfg.num_heads) m.num_heads = cfg.num_heads;
        if (cfg.channels) m.channels = cfg.channels;
        if (cfg.max_seq_len) m.max_seq_len = cfg.max_seq_len;
        m.num_experts = cfg.experts, m.moe_top_k = cfg.top_k, m.moe_every = cfg.moe_every, m.moe_shared = cfg.moe_shared;
        cfg.model_config = m;
    }
    cfg.model_config.validate();
    check_tensor_parallel_shape(cfg.model_config, cfg.tp);
    const int experts = cfg.model_config.num_experts;
    if (experts > 0)
        require(cfg.cp == 1,
                strformat("a mixture-of-experts model (%d experts) trains with data, expert, pipeline and tensor "
                          "parallelism (-z 0-3, --ep, --pp, --tp), not yet context parallelism: drop --cp %d",
                          experts, cfg.cp));
    require(cfg.ep == 1 || experts > 0,
            strformat("--ep %d splits a mixture-of-experts model's experts, but the model is dense (give --experts, "
                      "or a model file with experts)", cfg.ep));
    require(experts == 0 || experts % cfg.ep == 0,
            strformat("--ep %d must divide the model's %d experts: each expert-parallel rank holds an equal block of "
                      "them", cfg.ep, experts));
    require(cfg.capacity_factor >= 0 && std::isfinite(cfg.capacity_factor),
            strformat("--capacity-factor must be 0 (dropless) or positive, got %g", cfg.capacity_factor));
    require(cfg.moe_balance_coef >= 0 && cfg.moe_z_coef >= 0,
            strformat("--moe-balance-coef and --moe-z-coef must be >= 0, got %g and %g", cfg.moe_balance_coef,
                      cfg.moe_z_coef));
    if (cfg.fp8)
        require(cfg.tp == 1 && cfg.pp == 1 && cfg.cp == 1 && cfg.model_config.num_experts == 0,
                strformat("--fp8 1 runs a dense model with data parallelism (-z 0-3) only so far: drop --tp %d / "
                          "--pp %d / --cp %d / --experts %d", cfg.tp, cfg.pp, cfg.cp, cfg.model_config.num_experts));
}

// The batch arithmetic: tokens per micro-batch over the data-parallel ranks, the accumulation steps
// that make -d, and what the pipeline and sequence parallelism need of them.
inline void resolve_batch(RunConfig& cfg) {
    require(cfg.batch_size > 0, strformat("-b (batch_size) must be positive, got %d", cfg.batch_size));
    require(cfg.seq_len > 0, strformat("-t (seq_len) must be positive, got %d", cfg.seq_len));
    require(cfg.seq_len <= cfg.model_config.max_seq_len,
            strformat("-t (seq_len) %d exceeds the model's max_seq_len %d", cfg.seq_len, cfg.model_config.max_seq_len));
    // Each data-parallel rank reads its own micro-batches; the other dimensions share theirs.
    long long micro_tokens = (long long)cfg.batch_size * cfg.seq_len * cfg.dims.dp;
    require(micro_tokens <= INT32_MAX,
            strformat("-b x -t x ranks = %d x %d x %d = %lld tokens per micro-batch over all ranks, more than the "
                      "limit of %d: reduce -b or -t", cfg.batch_size, cfg.seq_len, cfg.dims.dp, micro_tokens, INT32_MAX));
    // The largest activation buffers hold B*T rows of the vocabulary, of 4C, or of T (attention,
    // per head): their element counts must stay far from 64-bit overflow. Beyond this limit no
    // machine holds them anyway; within it, the memory plan says whether this one does.
    const ModelConfig& mc = cfg.model_config;
    const double widest_row = std::max({(double)mc.padded_vocab_size, 4.0 * mc.channels,
                                        (double)mc.num_heads * cfg.seq_len});
    require((double)cfg.batch_size * cfg.seq_len * widest_row * (mc.num_layers + 1) < 0x1p50,
            strformat("-b %d x -t %d with this model (L %d, C %d, heads %d, padded vocab %d) needs activation "
                      "buffers of more than 2^50 elements: reduce -b or -t", cfg.batch_size, cfg.seq_len,
                      mc.num_layers, mc.channels, mc.num_heads, mc.padded_vocab_size));
    if (cfg.total_batch_tokens == 0) cfg.total_batch_tokens = (int)micro_tokens;
    require(cfg.total_batch_tokens > 0 && cfg.total_batch_tokens % micro_tokens == 0,
            strformat("-d (total_batch_tokens) %d must be a positive multiple of B*T*ranks = %d*%d*%d = %lld (ranks: "
                      "the data-parallel ones; on more ranks, a smaller -b keeps the total batch)",
                      cfg.total_batch_tokens, cfg.batch_size, cfg.seq_len, cfg.dims.dp, micro_tokens));
    cfg.grad_accum_steps = (int)(cfg.total_batch_tokens / micro_tokens);
    // The pipeline: the layers cut into stages (fails naming --pp-layers or the stage count), and the
    // step's micro-batches, which the interleaved schedule sends through the stages in groups of pp.
    pipeline_split(cfg);
    require(cfg.pp_virtual == 1 || cfg.grad_accum_steps % cfg.pp == 0,
            strformat("--pp-schedule interleaved needs the step's micro-batch count (-d / (B*T*dp) = %d) to be a "
                      "multiple of --pp %d: change -d, -b or -t", cfg.grad_accum_steps, cfg.pp));
    // Sequence parallelism cuts each micro-batch's B*T token rows into tp blocks; with T divisible,
    // any sequence (sampling pads to a multiple of tp) can be cut too.
    // Context parallelism cuts each sequence into 2 cp equal chunks (context_parallel.h).
    const std::string cp_problem = ContextSplit::split_problem(cfg.seq_len, cfg.cp);
    require(cp_problem.empty(), cp_problem);
    require(cfg.tp == 1 || !cfg.sequence_parallel || cfg.seq_len / cfg.cp % cfg.tp == 0,
            cfg.cp == 1 ? strformat("--sp 1 cuts the token rows over the --tp %d ranks and needs -t (seq_len) %d "
                                    "divisible by them (change -t, or --sp 0)", cfg.tp, cfg.seq_len)
                        : strformat("--sp 1 cuts a context rank's token rows over the --tp %d ranks and needs -t / --cp "
                                    "= %d / %d divisible by them (change -t, or --sp 0)", cfg.tp, cfg.seq_len, cfg.cp));
}

// Every other option in its range.
inline void check_training_options(const RunConfig& cfg, int world_size) {
    require(cfg.steps > 0, strformat("-x (steps) must be positive, got %d%s", cfg.steps,
                                     cfg.steps == -1 ? " (llm.c's -x -1, one epoch, is not offered: give the step count)" : ""));
    // Float options are finite and in range (a NaN fails every comparison, so each check is written
    // as "ok if"); only the timeouts take inf, for "never".
    require(cfg.lr > 0 && cfg.lr <= 1, strformat("-l (lr) must be in (0, 1], got %g", cfg.lr));
    require(cfg.lr_schedule.find('/') == std::string::npos && cfg.lr_schedule.find(".bin") == std::string::npos,
            strformat("-k (lr_schedule) '%s' looks like a file: -k is llm.c's learning-rate schedule; the tokenizer "
                      "file is --tokenizer", cfg.lr_schedule.c_str()));
    parse_lr_schedule(cfg.lr_schedule);
    require(cfg.warmup_steps >= 0, strformat("-u (warmup_steps) must be >= 0, got %d", cfg.warmup_steps));
    require(cfg.final_lr_frac >= 0 && cfg.final_lr_frac <= 1,
            strformat("-q (final_lr_frac) must be in [0, 1], got %g", cfg.final_lr_frac));
    require(cfg.wsd_decay_frac > 0 && cfg.wsd_decay_frac <= 1,
            strformat("--wsd-decay-frac must be in (0, 1], got %g", cfg.wsd_decay_frac));
    require(cfg.weight_decay >= 0 && cfg.lr * cfg.weight_decay < 1,
            strformat("-c (weight_decay) must be >= 0 and below 1/lr = %g (each update multiplies the matrices by "
                      "1 - lr * weight_decay), got %g", 1 / cfg.lr, cfg.weight_decay));
    require(cfg.beta1 >= 0 && cfg.beta1 < 1, strformat("--beta1 must be in [0, 1), got %g", cfg.beta1));
    require(cfg.beta2 >= 0 && cfg.beta2 < 1, strformat("--beta2 must be in [0, 1), got %g", cfg.beta2));
    require(cfg.eps > 0 && cfg.eps < 1, strformat("--eps must be in (0, 1), got %g", cfg.eps));
    require(cfg.grad_clip >= 0 && std::isfinite(cfg.grad_clip),
            strformat("--grad-clip must be finite and >= 0 (0: off), got %g", cfg.grad_clip));
    require(cfg.val_every >= 0, strformat("-v (val_every) must be >= 0, got %d", cfg.val_every));
    require(cfg.val_steps > 0, strformat("-m (val_steps) must be positive, got %d", cfg.val_steps));
    require(cfg.sample_every >= 0, strformat("-s (sample_every) must be >= 0, got %d", cfg.sample_every));
    require(cfg.sample_tokens > 0, strformat("-g (sample_tokens) must be positive, got %d", cfg.sample_tokens));
    require(cfg.temperature > 0 && std::isfinite(cfg.temperature),
            strformat("--temperature must be finite and positive, got %g", cfg.temperature));
    require(!cfg.output_dir.empty(), "-o (output_dir) must not be empty");
    require(cfg.zero_stage >= 0 && cfg.zero_stage <= 3, strformat("-z (zero_stage) must be 0, 1, 2 or 3, got %d", cfg.zero_stage));
    require(cfg.fp8 == 0 || cfg.fp8 == 1, strformat("--fp8 must be 0 or 1, got %d", cfg.fp8));
    require(cfg.fp8_scaling == "current" || cfg.fp8_scaling == "delayed",
            strformat("--fp8-scaling must be current or delayed, got '%s'", cfg.fp8_scaling.c_str()));
    require(cfg.fp8_history >= 1, strformat("--fp8-history must be >= 1 step, got %d", cfg.fp8_history));
    require(cfg.fp8_gather == 0 || cfg.fp8_gather == 1, strformat("--fp8-gather must be 0 or 1, got %d", cfg.fp8_gather));
    require(cfg.gpu_comm == "nccl" || cfg.gpu_comm == "mpi",
            strformat("--gpu-comm must be nccl or mpi, got '%s'", cfg.gpu_comm.c_str()));
    require(cfg.peak_tflops >= 0, strformat("--peak-tflops must be >= 0, got %g", cfg.peak_tflops));
    require(cfg.comm_timeout_s > 0, strformat("--comm-timeout-s must be positive, got %g", cfg.comm_timeout_s));
    require(cfg.heartbeat_s >= 0 && std::isfinite(cfg.heartbeat_s),
            strformat("--heartbeat-s must be finite and >= 0, got %g", cfg.heartbeat_s));
    require(cfg.heartbeat_s == 0 || cfg.peer_dead_s > 2 * cfg.heartbeat_s,
            strformat("--peer-dead-s (%g) must exceed two heartbeats (--heartbeat-s %g)", cfg.peer_dead_s, cfg.heartbeat_s));
    require(cfg.recompute >= 0 && cfg.recompute <= 3,
            strformat("-r (recompute) must be 0 (none), 1 (GELU), 2 (GELU + LayerNorm) or 3 (whole block), got %d",
                      cfg.recompute));
    require(cfg.checkpoint_every >= 0, strformat("-n (checkpoint_every) must be >= 0, got %d", cfg.checkpoint_every));
    require(cfg.checkpoint_keep >= 0, strformat("-nk (checkpoint_keep) must be >= 0, got %d", cfg.checkpoint_keep));
    require(cfg.checkpoint_major >= 0, strformat("-nm (checkpoint_major) must be >= 0, got %d", cfg.checkpoint_major));
    require(cfg.model_dtype == "fp32" || cfg.model_dtype == "bf16",
            strformat("--model-dtype must be fp32 or bf16, got '%s'", cfg.model_dtype.c_str()));
    require(cfg.skip_update_lossz >= 0 && std::isfinite(cfg.skip_update_lossz),
            strformat("-sl (skip_update_lossz) must be finite and >= 0, got %g", cfg.skip_update_lossz));
    require(cfg.skip_update_gradz >= 0 && std::isfinite(cfg.skip_update_gradz),
            strformat("-sg (skip_update_gradz) must be finite and >= 0, got %g", cfg.skip_update_gradz));
    require(cfg.max_skips >= 0, strformat("--max-skips must be >= 0, got %d", cfg.max_skips));
    require(cfg.fingerprint_every >= 0, strformat("--fingerprint-every must be >= 0, got %d", cfg.fingerprint_every));
    require(cfg.local_ckpt_every >= 0, strformat("--local-ckpt-every must be >= 0, got %d", cfg.local_ckpt_every));
    require(cfg.local_ckpt_every == 0 || !cfg.local_ckpt_dir.empty(), "--local-ckpt-every needs a --local-ckpt-dir");
    require(cfg.local_ckpt_keep >= 1, strformat("--local-ckpt-keep must be >= 1, got %d", cfg.local_ckpt_keep));
    require(cfg.ranks_per_node >= 0, strformat("--ranks-per-node must be >= 0, got %d", cfg.ranks_per_node));
    require(cfg.ranks_per_node == 0 || world_size % cfg.ranks_per_node == 0,
            strformat("--ranks-per-node %d does not divide the %d rank(s) into whole nodes", cfg.ranks_per_node,
                      world_size));
    require(cfg.resume == 0 || cfg.resume == 1, strformat("-y (resume) must be 0 or 1, got %d", cfg.resume));
    require(cfg.straggler_factor == 0 || (cfg.straggler_factor >= 1 && std::isfinite(cfg.straggler_factor)),
            strformat("--straggler-factor must be 0 (no check) or a finite number >= 1, got %g", cfg.straggler_factor));
    require(cfg.straggler_action == "warn" || cfg.straggler_action == "refuse",
            strformat("--straggler-action must be warn or refuse, got '%s'", cfg.straggler_action.c_str()));
    require(cfg.plan >= 0, strformat("--plan must be a rank count >= 1 (or 0 to train), got %d", cfg.plan));
    require(cfg.plan_search >= 0, strformat("--plan-search must be a GPU count >= 1 (or 0: no search), got %d", cfg.plan_search));
    require(cfg.plan == 0 || cfg.plan_search == 0, "--plan and --plan-search are two modes: give one");
    require(cfg.plan_format == "text" || cfg.plan_format == "json",
            strformat("--plan-format must be text or json, got '%s'", cfg.plan_format.c_str()));
    require(cfg.failure_rate > 0 && std::isfinite(cfg.failure_rate),
            strformat("--failure-rate must be a positive number of failures per GPU-hour, got %g", cfg.failure_rate));
    require(cfg.restart_s >= 0 && std::isfinite(cfg.restart_s),
            strformat("--restart-s must be a number of seconds >= 0, got %g", cfg.restart_s));
    require(cfg.storage_gbps > 0 && std::isfinite(cfg.storage_gbps),
            strformat("--storage-gbps must be a positive bandwidth in GB/s per node, got %g", cfg.storage_gbps));
    require(cfg.local_recovers >= 0 && cfg.local_recovers <= 1,
            strformat("--local-recovers must be a share between 0 and 1, got %g", cfg.local_recovers));
}

}  // namespace detail

// Validates the options and derives the model shape and batch arithmetic for world_size ranks.
// model_from_file is the header of the -e model file when -e names a file, else nullptr. The
// checks run in this order, so an error names the first problem a reader of the flags would see.
inline void resolve_run_config(RunConfig& cfg, int world_size, const ModelConfig* model_from_file) {
    detail::resolve_mesh(cfg, world_size);
    detail::resolve_model(cfg, model_from_file);
    detail::resolve_batch(cfg);
    detail::check_training_options(cfg, world_size);
}

inline LrSchedule lr_schedule_of(const RunConfig& cfg) {
    LrSchedule s;
    s.kind = parse_lr_schedule(cfg.lr_schedule);
    s.max_lr = cfg.lr;
    s.warmup_steps = cfg.warmup_steps;
    s.total_steps = cfg.steps;
    s.final_lr_frac = cfg.final_lr_frac;
    s.wsd_decay_frac = cfg.wsd_decay_frac;
    return s;
}

// The resolved configuration as written to <output_dir>/config.json: every training option by its
// long name (so the file can be fed back with --config; not --prompt, another mode) plus, under
// "resolved", what was derived.
inline nlohmann::json run_config_json(const RunConfig& cfg) {
    nlohmann::json j;
    for (const RunOption& o : run_options()) {
        // A training run's record: "prompt" in a --config file, even "", asks for the other mode.
        if (std::string(o.name) == "prompt") continue;
        std::visit([&](auto member) { j[o.name] = detail::json_value(cfg.*member); }, o.field);
    }
    const ModelConfig& m = cfg.model_config;
    j["resolved"] = {
        {"model", {{"max_seq_len", m.max_seq_len}, {"vocab_size", m.vocab_size},
                   {"padded_vocab_size", m.padded_vocab_size}, {"num_layers", m.num_layers},
                   {"num_heads", m.num_heads}, {"channels", m.channels}, {"num_experts", m.num_experts},
                   {"moe_top_k", m.moe_top_k}, {"moe_every", m.moe_every}, {"moe_shared", m.moe_shared},
                   {"num_params", num_params(m)}}},
        {"world_size", cfg.world_size},
        {"dp_size", cfg.dims.dp},
        {"tp_size", cfg.dims.tp},
        {"pp_size", cfg.dims.pp},
        {"cp_size", cfg.dims.cp},
        {"ep_size", cfg.dims.ep},
        {"pp_layers", pipeline_split(cfg).describe()},
        {"grad_accum_steps", cfg.grad_accum_steps},
        {"model_is_file", cfg.model_is_file},
        {"config_file", cfg.config_file},
    };
    return j;
}

// --fp8, --fp8-scaling, --fp8-history, --fp8-gather as both models take them.
inline Fp8Options fp8_options(const RunConfig& cfg) {
    return {cfg.fp8 == 1, cfg.fp8_scaling == "delayed" ? Fp8Scaling::Delayed : Fp8Scaling::Current, cfg.fp8_history,
            cfg.fp8_gather == 1};
}

}  // namespace llmc
