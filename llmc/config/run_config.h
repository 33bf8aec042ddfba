// config/run_config.h: RunConfig, every option of a run and what resolving them derives (the mesh,
// the model's shape, the batch arithmetic). Its options' spellings, defaults and documentation are
// config/options.h's table; the checks and derivations, config/resolve.h.
#pragma once

#include <set>
#include <string>

#include "llmc/dist/parallel_dims.h"
#include "llmc/models/gpt2/config.h"
#include "llmc/planning/failure_rates.h"

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
    // the family (models/family.h) and what only Llama's shape has: 0 is the preset's value
    std::string arch = "gpt2";
    int kv_heads = 0, ffn_hidden = 0;
    float rope_theta = 0;
    // mixture of experts (a preset's; a model file's header says its own): cpu/moe.h
    int experts = 0, top_k = 2, moe_every = 1, moe_shared = 0;
    float capacity_factor = 0;     // 0: dropless
    float moe_balance_coef = 0.01f, moe_z_coef = 0.001f;  // the auxiliary losses' weights in the loss
    // FP8 products (fp8.h; the CPU model's simulation: cpu/fp8_linear.h)
    int fp8 = 0;
    std::string fp8_scaling = "current";
    int fp8_history = 16;
    int fp8_gather = 1;  // ZeRO-3: the weights' all-gather carries their FP8 codes (models/cuda/fp8_gather.cuh)
    // the CUDA model's attention kernels at head size 64 (kernels/attention_hopper.cuh): auto, mma, wgmma, tma
    std::string attention = "auto";
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
    int hellaswag = 0;  // -h 1: HellaSwag accuracy where validation runs (training/hellaswag.h)
    std::string eval_hellaswag = "data/hellaswag/hellaswag_val.bin";  // its items (data/eval_loader.h)
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
    // tensor parallelism (models/cpu_model.h)
    int tp = 1;                   // ranks per tensor-parallel group: world = dp x pp x cp x tp
    int sequence_parallel = 1;    // with tp > 1: LayerNorms and the residual stream on 1/tp of the tokens
    // pipeline parallelism (pipeline_schedule.h, models/cpu_model.h)
    int pp = 1;                           // pipeline stages: world = dp x pp x cp x tp
    std::string pp_schedule = "1f1b";     // 1f1b | interleaved
    int pp_virtual = 1;                   // chunks of layers per rank (interleaved: at least 2)
    std::string pp_layers;                // layers per virtual stage, "5,7" ("": as even as it goes)
    int pp_print_schedule = 0;            // 1: print the pipeline schedule (every rank's actions)
    // context parallelism (context_parallel.h, cpu/ring_attention.h)
    int cp = 1;                           // ranks per context group, each sequence split over them
    // expert parallelism (dist/expert_parallel.h)
    int ep = 1;                           // ranks per expert group, carved from the data-parallel ranks
    int dp_shard = 0;                     // hybrid sharding: ZeRO over groups of this many data ranks (0: all)
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

}  // namespace llmc
