// train_gpt.cu: the llmc trainer. Flags and config -> model -> train loop -> final model file.
//
// One source, two binaries: nvcc builds `train_gpt` (the CUDA model) and the host compiler builds
// `train_gpt_cpu` from this same file with -DLLMC_CPU_ONLY (the fp32 CPU reference model). Both run
// the same host code: launch (MPI when started by mpirun/srun), config, data loading, schedule,
// ZeRO sharding, train loop, metrics. Only the backend that makes the model differs. With --prompt
// either binary instead continues a text with the -e model and exits.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "llmc/text/bpe_encoder.h"
#include "llmc/ckpt/output_dir.h"
#include "llmc/config.h"
#include "llmc/dist/bootstrap.h"
#include "llmc/dist/config_check.h"
#include "llmc/dist/flight_recorder.h"
#ifndef LLMC_NO_MPI
#include "llmc/dist/heartbeat.h"
#endif
#include "llmc/dist/process_groups.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/failures/faults.h"
#include "llmc/failures/health.h"
#include "llmc/models/model_file.h"
#include "llmc/numerics/rng.h"
#include "llmc/text/sampler.h"
#include "llmc/planning/step_plan.h"
#include "llmc/text/tokenizer.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"

// The one choice between the two binaries: which backend makes the model (models/backend.h).
#ifdef LLMC_CPU_ONLY
#include "llmc/models/cpu_backend.h"
using Backend = llmc::CpuBackend;
#else
#include "llmc/models/cuda_backend.cuh"
using Backend = llmc::CudaBackend;
#endif

using namespace llmc;

// Resolves the config for world_size ranks, reading the -e model file's header if it names one.
static void resolve(RunConfig& cfg, int world_size) {
    if (!cfg.model_shape.empty()) apply_model_shape(cfg);
    ModelConfig file_config;
    bool from_file = !is_llama_preset(cfg.model);  // a preset of either family, or a file
    if (from_file) {
        try {
            file_config = read_model_header(cfg.model);
        } catch (const Error& e) {
            fail(strformat("-e '%s' is not a preset (d4 d6 d12 d24 d36 d48 llama3-8b llama3-70b llama3-405b) and not a usable model file: %s",
                           cfg.model.c_str(), e.what()));
        }
    }
    resolve_run_config(cfg, world_size, from_file ? &file_config : nullptr);
}

static MemoryPlan stage_plan(const RunConfig& cfg, int pp_rank) { return Backend::memory_plan(cfg, 0, 0, pp_rank); }

// --plan N: the memory plan of rank 0 of N, computed without allocating anything, the step predicted
// on --topology and the goodput at the best checkpoint intervals (step_plan.h); with --plan-format
// json only the predictions, as one object.
static void print_plan(RunConfig cfg) {
    const Topology topology = read_topology(cfg.topology);
    resolve(cfg, cfg.plan);
    const std::string memory_report = Backend::plan_report(cfg);  // refuses what the backend cannot run
    const StepEstimate step = estimate_run(cfg, topology);
    const double memory = peak_rank_bytes(cfg, stage_plan);
    const GoodputPlan goodput = plan_goodput(cfg, topology, step.step_s, checkpoint_rank_bytes(cfg, stage_plan));
    if (cfg.plan_format == "json") {
        nlohmann::json j = step_json(cfg, topology, step, memory);
        j["goodput"] = goodput_json(goodput);
        printf("%s\n", j.dump(2).c_str());
        return;
    }
    fputs(memory_report.c_str(), stdout);
    if (!cfg.model_shape.empty())
        printf("--model-shape: planned as the GPT-2 of its layers, width, heads and vocabulary; its %.2fB parameters "
               "need %s on the busiest rank\n", run_shape(cfg).params() / 1e9, format_bytes(memory).c_str());
    fputs(step_report(cfg, topology, step).c_str(), stdout);
    fputs(goodput_report(cfg, goodput).c_str(), stdout);
}

// --plan-search N: every layout of N GPUs for the -d batch, best first (step_plan.h).
static void print_plan_search(const RunConfig& cfg) {
    if (!cfg.given.count("total_batch_tokens"))
        fail("--plan-search needs the global batch: give -d (tokens per optimizer step)");
    const Topology topology = read_topology(cfg.topology);
    fputs(search_report(search_layouts(cfg, cfg.plan_search, topology, resolve, stage_plan), topology).c_str(), stdout);
}

// Set once the first training step starts: an error after it is a runtime failure, not a
// configuration error (exit_codes.h).
static bool g_training_started = false;

// Every input (flags, model file, data, tokenizer, checkpoint) is checked before the output
// directory is touched: a run that fails on a bad input leaves an earlier run's files as they were.
// Rank 0 then makes and locks the directory, clears temporaries a killed run left there, settles
// whose run it holds (ckpt/output_dir.h), and writes config.json once the first step starts.
static void train(RunConfig& cfg, Communicator& comm, const Launch& launch) {
    // ckpt/output_dir.h: -y 1 on another number of ranks keeps the total batch.
    const std::string batch_from = inherit_total_batch(cfg);
    if (comm.rank() == 0 && !batch_from.empty())
        printf("resume: -d %d (total_batch_tokens) from '%s', the run this one continues\n", cfg.total_batch_tokens,
               batch_from.c_str());
    resolve(cfg, comm.world_size());
    check_ranks_agree(cfg, comm);  // dist/config_check.h: one config, one binary
    if (cfg.ranks_per_node == 0) cfg.ranks_per_node = launch.local_size;
    faults().refuse_unreachable([&](const Fault& f) { return why_fault_never_fires(f, cfg, launch.under_launcher); });
    const bool is_rank0 = comm.rank() == 0;
    if (is_rank0) {
        const ModelConfig& m = cfg.model_config;
        const std::string experts =
            m.num_experts ? strformat(" | %d experts, top %d, every %d block(s)%s, capacity %s", m.num_experts,
                                      m.moe_top_k, m.moe_every, m.moe_shared ? " + shared" : "",
                                      cfg.capacity_factor > 0 ? strformat("%g", cfg.capacity_factor).c_str() : "dropless")
                          : "";
        // a Llama says its family and what only it has: kv heads, the SwiGLU width, the RoPE base
        const bool llama = m.arch == ModelArch::Llama;
        const std::string family = llama ? " (llama)" : "";
        const std::string kv = llama ? strformat(" (%d kv)", m.kv_head_count()) : "";
        const std::string mlp = llama ? strformat(" | SwiGLU %d | RoPE base %g", m.mlp_hidden(), m.rope_theta) : "";
        printf("model: %s%s | L %d | heads %d%s | C %d%s | vocab %d (padded %d) | max T %d | %.2fM parameters%s\n",
               cfg.model.c_str(), family.c_str(), m.num_layers, m.num_heads, kv.c_str(), m.channels, mlp.c_str(),
               m.vocab_size, m.padded_vocab_size, m.max_seq_len, num_params(m) / 1e6, experts.c_str());
        printf("batch: B %d x T %d x %d data-parallel rank(s) x %d accumulation = %d tokens per step, %d steps, "
               "ZeRO-%d over %s\n",
               cfg.batch_size, cfg.seq_len, cfg.dims.dp, cfg.grad_accum_steps, cfg.total_batch_tokens, cfg.steps,
               Backend::effective_zero_stage(cfg), comm.backend());
        if (cfg.dims.hybrid())
            printf("hybrid sharding: ZeRO inside %d group(s) of %d data-parallel rank(s)%s; each bucket's reduced slice "
                   "all-reduced over its %d replicas\n", cfg.dims.replicas(), cfg.dims.shard_size(),
                   cfg.dims.cp > 1 ? strformat(" (x cp %d)", cfg.dims.cp).c_str() : "", cfg.dims.replicas());
        if (cfg.dims.tp > 1 || cfg.dims.pp > 1 || cfg.dims.cp > 1 || cfg.dims.ep > 1)
            printf("mesh: %d rank(s) = dp %d x pp %d%s x tp %d%s%s%s\n", cfg.world_size, cfg.dims.dp, cfg.dims.pp,
                   cfg.dims.cp > 1 ? strformat(" x cp %d", cfg.dims.cp).c_str() : "", cfg.dims.tp,
                   cfg.dims.tp == 1 ? ""
                   : cfg.sequence_parallel ? "; tensor parallel with sequence parallelism"
                                           : "; tensor parallel without sequence parallelism",
                   cfg.dims.cp == 1 ? ""
                                    : strformat("; context parallel, %d of each sequence's %d positions per rank, "
                                                "ring attention, ZeRO over dp x cp", cfg.seq_len / cfg.dims.cp,
                                                cfg.seq_len).c_str(),
                   cfg.dims.ep == 1 ? ""
                                    : strformat("; expert parallel: dp in groups of ep %d, %d of each MoE block's %d "
                                                "experts per rank, experts' ZeRO over the %d rank(s) that hold them",
                                                cfg.dims.ep, cfg.model_config.num_experts / cfg.dims.ep,
                                                cfg.model_config.num_experts, cfg.dims.dp / cfg.dims.ep).c_str());
        if (cfg.dims.pp > 1) {
            const PipelineSplit split = pipeline_split(cfg);
            printf("pipeline: %d stages, %s schedule, layers per virtual stage %s, %d micro-batches, bubble %.1f%%\n",
                   cfg.dims.pp, cfg.pp_schedule.c_str(), split.describe().c_str(), cfg.grad_accum_steps,
                   100 * pipeline_bubble_fraction(cfg.dims.pp, cfg.grad_accum_steps, split.chunks));
            if (cfg.pp_print_schedule)
                fputs(pipeline_schedule_text(make_pipeline_schedule(cfg.dims.pp, cfg.grad_accum_steps, split.chunks))
                          .c_str(), stdout);
        }
    }
    // ZeRO shards over the data x context group, and the train loop splits the batch over dp.
    ProcessGroups groups(comm, cfg.dims);
    const double straggler_factor = health_check(cfg, groups.world());  // before anything is allocated (health.h)
    BuiltModel built = Backend::make_model(cfg, groups, launch);
    Model* model = built.model.get();
    if (cfg.model_is_file) model->load(cfg.model);
    else model->init_random(cfg.seed);

    Trainer trainer(cfg, *model, groups.dp(), cfg.output_dir + "/metrics.jsonl", &groups.world(),
                    cfg.dims.ep > 1 ? &groups.expert_data() : &groups.dp_cp());
    trainer.set_peak_tflops(built.peak_tflops);
    trainer.set_straggler_factor(straggler_factor);
    trainer.set_zero_replicas(&groups.zero_replicas());
    claim_output_dir(cfg, groups.world());  // ckpt/output_dir.h: locked, and whose run this is
    TrainSummary summary = trainer.run([&] {
        if (is_rank0) write_text_file_atomic(cfg.output_dir + "/config.json", run_config_json(cfg).dump(2) + "\n");
        g_training_started = true;
    });

    // -x 0 evaluated the model it was given: there is nothing new to save.
    if (summary.evaluated_only) {
        if (is_rank0) printf("done: %s | no model saved\n", summary_text(summary).c_str());
        return;
    }
    std::string model_path = cfg.output_dir + "/model.bin";
    model->save(model_path, cfg.model_dtype == "bf16");  // a collective: rank 0 writes
    if (is_rank0) printf("done: %s | model saved to %s\n", summary_text(summary).c_str(), model_path.c_str());
}

// --prompt: the prompt's tokens and -g more must fit the model's context of max_seq_len tokens.
static void check_prompt_fits(size_t prompt_tokens, int new_tokens, int max_seq_len) {
    if (prompt_tokens >= (size_t)max_seq_len)
        fail(strformat("--prompt is %zu tokens (with the <|endoftext|> before it), but the model attends to at most "
                       "%d (its max_seq_len) and needs room for -g tokens after it: shorten the prompt",
                       prompt_tokens, max_seq_len));
    const int room = max_seq_len - (int)prompt_tokens;
    if (new_tokens > room)
        fail(strformat("-g %d with --prompt: the model attends to %d tokens (its max_seq_len) and the prompt takes %zu "
                       "of them (with the <|endoftext|> before it), so at most %d can follow: give -g %d or less",
                       new_tokens, max_seq_len, prompt_tokens, room, room));
}

// --prompt: the text, encoded with GPT-2's BPE after an <|endoftext|> (as every training document
// starts), continued by -g tokens sampled from the -e model at --temperature, each printed as it is
// drawn. The prompt and its continuation must fit the model's context (max_seq_len), which is all it
// attends to. Nothing is trained or written.
static void prompt(RunConfig& cfg, Communicator& comm, const Launch& launch) {
    if (comm.world_size() > 1) fail("--prompt runs on one rank: start it without mpirun or srun");
    resolve(cfg, 1);
    if (cfg.tokenizer.empty()) fail("--prompt needs a --tokenizer file to decode the sampled tokens");
    BpeEncoder bpe(cfg.bpe_dir);
    Tokenizer tokenizer(cfg.tokenizer);
    if (tokenizer.vocab_size() != cfg.model_config.vocab_size)
        fail(strformat("tokenizer '%s' has %d tokens but the model's vocab_size is %d", cfg.tokenizer.c_str(),
                       tokenizer.vocab_size(), cfg.model_config.vocab_size));
    std::vector<int> tokens = {tokenizer.eot_token()};
    for (int id : bpe.encode(cfg.prompt)) tokens.push_back(id);
    check_prompt_fits(tokens.size(), cfg.sample_tokens, cfg.model_config.max_seq_len);
    // One sequence, with the model's whole context.
    cfg.batch_size = 1;
    cfg.seq_len = cfg.model_config.max_seq_len;
    ProcessGroups groups(comm, cfg.dims);  // one rank: every group is the world
    BuiltModel built = Backend::make_model(cfg, groups, launch);
    if (cfg.model_is_file) built.model->load(cfg.model);
    else built.model->init_random(cfg.seed);
    Rng rng(sampling_seed(cfg.seed));
    printf("%s", cfg.prompt.c_str());
    fflush(stdout);
    generate(*built.model, tokens, cfg.sample_tokens, cfg.temperature, rng, [&](int id) {
        const std::string& bytes = tokenizer.decode(id);
        fwrite(bytes.data(), 1, bytes.size(), stdout);
        fflush(stdout);
    });
    printf("\n");
}

int main(int argc, char** argv) {
    Launch launch;
    try {
        launch = bootstrap_launch(&argc, &argv);
        RunConfig cfg;
        if (!parse_run_args(cfg, argc, argv)) {
            if (launch.rank == 0) fputs(run_config_help(argv[0]).c_str(), stdout);
        } else if (cfg.plan > 0) {
            if (launch.rank == 0) print_plan(cfg);
        } else if (cfg.plan_search > 0) {
            if (launch.rank == 0) print_plan_search(cfg);
        } else {
            faults().add(cfg.faults, "--faults");
            std::unique_ptr<Communicator> comm = make_host_communicator(launch);
            comm->timeout_s = cfg.comm_timeout_s;
            // Several ranks: a dead rank is seen within --peer-dead-s, a timeout names who is missing,
            // and a rank the launcher kills prints what it was doing (dist/heartbeat.h).
#ifndef LLMC_NO_MPI
            std::unique_ptr<Heartbeat> heartbeat;
            if (launch.world_size > 1 && cfg.heartbeat_s > 0) {
                heartbeat = std::make_unique<Heartbeat>(cfg.heartbeat_s, cfg.peer_dead_s);
                install_termination_report();
            }
#endif
            if (!cfg.given.count("prompt")) train(cfg, *comm, launch);
            else prompt(cfg, *comm, launch);
        }
    } catch (const std::exception& e) {
        fprintf(stderr, "error%s: %s\n", launch.world_size > 1 ? strformat(" (rank %d)", launch.rank).c_str() : "",
                e.what());
        fflush(stderr);
        const Error* error = dynamic_cast<const Error*>(&e);
        int code = error && error->exit_code ? error->exit_code : g_training_started ? EXIT_RUNTIME : EXIT_CONFIG;
        flight_recorder().silence_termination_report();  // this error is the cause: no report after it
        // A configuration error is found by every rank at about the same point: a moment's grace
        // lets the others print it too, and so end silenced, before the abort kills them; a rank
        // that is not failing is waiting in a collective, and prints its report when killed.
        if (launch.under_launcher && code == EXIT_CONFIG) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (launch.under_launcher) abort_launch(launch, code);
        return code;
    }
    finalize_launch(launch);
    return 0;
}
