// config/resolve.h: from the options to a run: the mesh, the model's shape and the batch arithmetic
// resolved and checked (each error names the flag), and what the rest of llmc derives from a
// resolved config: the pipeline split, the learning-rate schedule, the FP8 options, config.json.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/config/options.h"
#include "llmc/config/run_config.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/dist/parallel_dims.h"
#include "llmc/dist/pipeline_schedule.h"
#include "llmc/kernels/attention_tuning.h"
#include "llmc/models/family.h"
#include "llmc/models/llama/config.h"
#include "llmc/numerics/fp8.h"
#include "llmc/training/schedule.h"
#include "llmc/utils.h"

namespace llmc {

// How the resolved config cuts the model's layers into pipeline stages (one stage without --pp).
inline PipelineSplit pipeline_split(const RunConfig& cfg) {
    return make_pipeline_split(cfg.model_config.num_layers, cfg.pp, cfg.pp_virtual, cfg.pp_layers);
}
// The pipeline a config asks for (one stage without --pp): its split, and a step's micro-batches.
inline PipelineParallel pipeline_of(const RunConfig& cfg) { return {pipeline_split(cfg), cfg.grad_accum_steps}; }

// Whether the run evaluates where validation runs (after step 0, every -v steps and after the last):
// validation data (-j) or HellaSwag (-h 1), with -v above 0.
inline bool evaluates(const RunConfig& cfg) {
    return cfg.val_every > 0 && (!cfg.val_data.empty() || cfg.hellaswag == 1);
}

namespace detail {

inline void require(bool ok, const std::string& message) {
    if (!ok) fail(message);
}

// --eval-hellaswag FILE asks for HellaSwag (-h 1) unless -h itself is given: a run's config.json,
// fed back with --config, gives both, and its -h stands.
inline void resolve_evaluation(RunConfig& cfg) {
    if (cfg.given.count("eval_hellaswag") && !cfg.given.count("hellaswag")) cfg.hellaswag = 1;
    require(cfg.hellaswag == 0 || !cfg.eval_hellaswag.empty(), "-h 1 needs a HellaSwag file: --eval-hellaswag is empty");
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
    require(cfg.dp_shard >= 0 && (cfg.dp_shard == 0 || cfg.dims.dp % cfg.dp_shard == 0),
            strformat("--dp-shard %d must be 0 or divide the %d data-parallel rank(s) (%d rank(s) / (pp %d x cp %d x tp %d)): "
                      "ZeRO shards over groups of that many data ranks, which replicate one another (0: one group "
                      "of all of them)", cfg.dp_shard, cfg.dims.dp, world_size, cfg.pp, cfg.cp, cfg.tp));
    cfg.dims.dp_shard = cfg.dp_shard == cfg.dims.dp ? 0 : cfg.dp_shard;
    cfg.dims.validate(world_size);
}

// The model shape: the -e model file's header, or a preset with the shape flags.
inline void resolve_model(RunConfig& cfg, const ModelConfig* model_from_file) {
    cfg.model_is_file = model_from_file != nullptr;
    if (model_from_file) {
        cfg.model_config = *model_from_file;
        require(!cfg.num_layers && !cfg.num_heads && !cfg.channels && !cfg.max_seq_len,
                "--num-layers/--num-heads/--channels/--max-seq-len override presets only, but -e names a model file");
        if (cfg.given.count("arch"))
            require(parse_arch(cfg.arch, "--arch") == model_from_file->arch,
                    strformat("--arch %s, but -e names a model file that holds a %s model", cfg.arch.c_str(),
                              arch_name(model_from_file->arch)));
        cfg.arch = arch_name(model_from_file->arch);
        require(!cfg.kv_heads && !cfg.ffn_hidden && !cfg.rope_theta,
                "--kv-heads/--ffn-hidden/--rope-theta shape a preset, but -e names a model file, whose header says "
                "its shape");
        for (const char* flag : {"experts", "top_k", "moe_every", "moe_shared"})
            require(!cfg.given.count(flag), strformat("--%s shapes a preset, but -e names a model file, whose header "
                                                     "says its experts", flag == std::string("top_k") ? "top-k" : flag));
    } else {
        require(cfg.vocab_size > 0 && cfg.vocab_size <= ModelConfig::kMaxVocab,
                strformat("--vocab-size must be in [1, %d], got %d", ModelConfig::kMaxVocab, cfg.vocab_size));
        require(cfg.num_layers >= 0 && cfg.num_heads >= 0 && cfg.channels >= 0 && cfg.max_seq_len >= 0,
                strformat("--num-layers/--num-heads/--channels/--max-seq-len must be positive (or 0: the preset's), "
                          "got %d/%d/%d/%d", cfg.num_layers, cfg.num_heads, cfg.channels, cfg.max_seq_len));
        const bool published = !is_model_preset(cfg.model) && is_llama_preset(cfg.model);  // llama3-*
        if (published && !cfg.given.count("arch")) cfg.arch = "llama";
        const ModelArch arch = parse_arch(cfg.arch, "--arch");
        require(arch == ModelArch::Llama || !published,
                strformat("-e %s is a Llama shape, but --arch is gpt2", cfg.model.c_str()));
        require(arch == ModelArch::Llama || (!cfg.kv_heads && !cfg.ffn_hidden && !cfg.rope_theta),
                "--kv-heads/--ffn-hidden/--rope-theta shape a Llama model: give --arch llama");
        require(cfg.kv_heads >= 0 && cfg.ffn_hidden >= 0 && cfg.rope_theta >= 0,
                strformat("--kv-heads, --ffn-hidden and --rope-theta must be positive (or 0: the preset's), got "
                          "%d, %d, %g", cfg.kv_heads, cfg.ffn_hidden, cfg.rope_theta));
        // (the published Llama 3 shapes were trained at 8192 tokens; a Llama has no position table, so
        // max_seq_len only bounds -t)
        ModelConfig m = arch == ModelArch::Llama ? llama_preset(cfg.model, published ? 8192 : 1024, cfg.vocab_size)
                                                 : model_preset(cfg.model, 1024, cfg.vocab_size);
        if (cfg.num_layers) m.num_layers = cfg.num_layers;
        if (cfg.num_heads) m.num_heads = cfg.num_heads;
        if (cfg.channels) m.channels = cfg.channels;
        if (cfg.max_seq_len) m.max_seq_len = cfg.max_seq_len;
        if (arch == ModelArch::Llama) {  // a changed shape derives its kv heads and MLP width anew
            if (cfg.num_heads) m.kv_heads = llama_kv_heads(m.num_heads);
            if (cfg.channels) m.ffn_hidden = llama_ffn_hidden(m.channels);
            if (cfg.kv_heads) m.kv_heads = cfg.kv_heads;
            if (cfg.ffn_hidden) m.ffn_hidden = cfg.ffn_hidden;
            if (cfg.rope_theta) m.rope_theta = cfg.rope_theta;
        }
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
    require(experts == 0 || !cfg.dims.hybrid(),
            strformat("--dp-shard %d with a mixture-of-experts model (%d experts) is not supported yet: its expert "
                      "buckets are sharded over their expert data group, which hybrid sharding does not cut; drop "
                      "--dp-shard", cfg.dp_shard, experts));
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
    require(cfg.hellaswag == 0 || cfg.hellaswag == 1, strformat("-h (hellaswag) must be 0 or 1, got %d", cfg.hellaswag));
    require(cfg.steps > 0 || (cfg.steps == 0 && evaluates(cfg)),
            cfg.steps == 0
                ? std::string("-x 0 trains nothing and only evaluates a model (e.g. -e model.bin -x 0 -h 1), but nothing "
                              "is evaluated here: give -h 1 or validation data (-j), and -v above 0")
                : strformat("-x (steps) must be positive (or 0 to evaluate only), got %d%s", cfg.steps,
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
    (void)parse_attention_kernels(cfg.attention, "--attention");  // the CUDA model sets it (cuda_backend.cuh)
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
    detail::resolve_evaluation(cfg);
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
        {"dp_shard", cfg.dims.shard_size()},
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
