// train_gpt.cu: the llmc trainer. Flags and config -> model -> train loop -> final model file.
//
// One source, two binaries: nvcc builds `train_gpt` (the CUDA model) and the host compiler builds
// `train_gpt_cpu` from this same file with -DLLMC_CPU_ONLY (the fp32 CPU reference model). Both run
// the same host code: launch (MPI when started by mpirun/srun), config, data loading, schedule,
// ZeRO sharding, train loop, metrics. Only make_model differs.
#include <cstdio>
#include <memory>
#include <string>


#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/config.h"
#include "llmc/models/gpt2/model_file.h"
#include "llmc/planner.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"

#ifdef LLMC_CPU_ONLY
#include "llmc/models/gpt2/gpt2_cpu.h"
#else
#ifndef LLMC_NO_NCCL
#include "llmc/dist/comm_nccl.cuh"
#endif
#include "llmc/models/gpt2/gpt2_cuda.cuh"
#endif

using namespace llmc;

#ifndef LLMC_CPU_ONLY
static GPT2CUDAOptions cuda_options(const RunConfig& cfg) {
    GPT2CUDAOptions o;
    o.recompute = (Recompute)cfg.recompute;
    return o;
}
#endif

// The stage that runs: the CUDA model shards nothing on one rank (GPT2CUDA::zero_plan).
static int effective_zero_stage(const RunConfig& cfg) {
#ifdef LLMC_CPU_ONLY
    return cfg.zero_stage;
#else
    return GPT2CUDA::effective_stage(cfg.zero_stage, cfg.world_size);
#endif
}

// The model for this rank. The CUDA model's collectives run on a device communicator that
// make_model creates (NCCL, or MPI staged through host memory) in grad_comm, which must outlive the
// model.
static std::unique_ptr<Model> make_model(const RunConfig& cfg, Communicator& comm, const Launch& launch,
                                         std::unique_ptr<Communicator>& grad_comm) {
#ifdef LLMC_CPU_ONLY
    (void)launch;
    (void)grad_comm;
    if (comm.rank() == 0)
        printf("device: CPU, %d OpenMP threads per rank (OMP_NUM_THREADS sets them)\n", omp_get_max_threads());
    try {
        return std::make_unique<GPT2CPU>(cfg.model_config, cfg.batch_size, cfg.seq_len, comm, cfg.zero_stage);
    } catch (const std::bad_alloc&) {
        fail(strformat("out of memory allocating the CPU model for B %d x T %d (activations grow with B*T, the "
                       "logits with B*T*vocab): reduce -b or -t, or shard more with -z", cfg.batch_size, cfg.seq_len));
    }
#else
    std::string why;
    if (!cuda_device_present(&why))
        fail(strformat("no CUDA device available (%s); train on the CPU with ./train_gpt_cpu", why.c_str()));
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    // NCCL needs a GPU per rank; through MPI several ranks may share one.
    const bool nccl = launch.under_launcher && cfg.gpu_comm == "nccl";
    if (nccl && launch.local_rank >= devices)
        fail(strformat("--gpu-comm nccl needs a GPU per rank, but local rank %d of %d has only %d GPU(s) on its "
                       "node; launch fewer ranks per node, or pass --gpu-comm mpi to let ranks share GPUs",
                       launch.local_rank, launch.local_size, devices));
    const int device = launch.local_rank % devices;
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (comm.rank() == 0)
        printf("device: %s, %.1f GiB, bf16 with fp32 master weights, recompute %d%s\n", prop.name,
               prop.totalGlobalMem / 1073741824.0, cfg.recompute,
               nccl ? ", collectives over NCCL" : comm.world_size() > 1 ? ", collectives over MPI via host memory" : "");
#ifdef LLMC_NO_NCCL
    if (nccl)
        fail("--gpu-comm nccl: this train_gpt was built without NCCL (make NO_NCCL=1); pass --gpu-comm mpi, or "
             "rebuild with NCCL");
    grad_comm = std::make_unique<StagedComm>(comm);
#else
    if (nccl) grad_comm = std::make_unique<NcclComm>(comm, device, cfg.comm_timeout_s);
    else grad_comm = std::make_unique<StagedComm>(comm);
#endif
    DataParallel dp;
    dp.comm = grad_comm.get();
    dp.host = &comm;
    dp.zero_stage = cfg.zero_stage;
    return std::make_unique<GPT2CUDA>(cfg.model_config, cfg.batch_size, cfg.seq_len, cuda_options(cfg), dp);
#endif
}

// Resolves the config for world_size ranks, reading the -e model file's header if it names one.
static void resolve(RunConfig& cfg, int world_size) {
    ModelConfig file_config;
    bool from_file = !is_model_preset(cfg.model);
    if (from_file) {
        try {
            file_config = read_model_header(cfg.model);
        } catch (const Error& e) {
            fail(strformat("-e '%s' is not a preset (d4 d6 d12 d24 d36 d48) and not a usable model file: %s",
                           cfg.model.c_str(), e.what()));
        }
    }
    resolve_run_config(cfg, world_size, from_file ? &file_config : nullptr);
}

// --plan N: the memory plan of rank 0 of N, computed without allocating anything.
static void print_plan(RunConfig cfg) {
    resolve(cfg, cfg.plan);
#ifdef LLMC_CPU_ONLY
    ZeroPlan zero(ParamLayout(cfg.model_config), cfg.zero_stage, 0, cfg.plan);
    std::vector<BufferSpec> buffers = GPT2CPU::memory_specs(zero, cfg.model_config, cfg.batch_size, cfg.seq_len);
    const char* kind = "fp32 CPU model";
#else
    ZeroPlan zero = GPT2CUDA::zero_plan(cfg.model_config, cfg.zero_stage, 0, cfg.plan);
    std::vector<BufferSpec> buffers =
        GPT2CUDA::memory_specs(cfg.model_config, cfg.batch_size, cfg.seq_len, cuda_options(cfg), zero);
    const char* kind = "CUDA model (bf16 weights and activations, fp32 master weights, gradients and moments)";
#endif
#ifdef LLMC_CPU_ONLY
    const ParamPrecision precision = HostMemory::precision;
#else
    const ParamPrecision precision = DeviceMemory::precision;
#endif
    fputs(memory_plan_report(cfg, zero, plan_memory(cfg, zero, buffers, precision), kind).c_str(), stdout);
#ifndef LLMC_CPU_ONLY
    printf("activations by recomputation setting (-r):");
    for (int r = 0; r <= 3; r++) {
        RunConfig alt = cfg;
        alt.recompute = r;
        printf(" %d: %s%s", r,
               format_bytes((double)CudaActivationLayout::bytes_for(cfg.model_config, cfg.batch_size, cfg.seq_len,
                                                                   cuda_options(alt)))
                   .c_str(),
               r < 3 ? "," : "\n");
    }
#endif
}

static void train(RunConfig& cfg, Communicator& comm, const Launch& launch) {
    resolve(cfg, comm.world_size());
    const bool is_rank0 = comm.rank() == 0;
    if (is_rank0) {
        make_dirs(cfg.output_dir);
        write_text_file_atomic(cfg.output_dir + "/config.json", run_config_json(cfg).dump(2) + "\n");
        const ModelConfig& m = cfg.model_config;
        printf("model: %s | L %d | heads %d | C %d | vocab %d (padded %d) | max T %d | %.2fM parameters\n",
               cfg.model.c_str(), m.num_layers, m.num_heads, m.channels, m.vocab_size, m.padded_vocab_size,
               m.max_seq_len, ParamLayout(m).num_params / 1e6);
        printf("batch: B %d x T %d x %d rank(s) x %d accumulation = %d tokens per step, %d steps, ZeRO-%d over %s\n",
               cfg.batch_size, cfg.seq_len, cfg.dims.dp, cfg.grad_accum_steps, cfg.total_batch_tokens, cfg.steps,
               effective_zero_stage(cfg), comm.backend());
    }
    std::unique_ptr<Communicator> grad_comm;  // declared first: the model holds a pointer to it
    std::unique_ptr<Model> model = make_model(cfg, comm, launch, grad_comm);
    if (cfg.model_is_file) model->load(cfg.model);
    else model->init_random(cfg.seed);

    ProcessGroups groups(comm, cfg.dims);  // the train loop works on the data-parallel group
    Trainer trainer(cfg, *model, groups.dp(), cfg.output_dir + "/metrics.jsonl");
    TrainSummary summary = trainer.run();

    std::string model_path = cfg.output_dir + "/model.bin";
    model->save(model_path);  // a collective: rank 0 writes
    if (is_rank0)
        printf("done: val loss %.4f -> %.4f | train loss %.4f | %.0f tok/s mean | model saved to %s\n",
               summary.first_val_loss, summary.last_val_loss, summary.last_train_loss, summary.mean_tokens_per_s,
               model_path.c_str());
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
        } else {
            std::unique_ptr<Communicator> comm = make_host_communicator(launch);
            comm->timeout_s = cfg.comm_timeout_s;
            train(cfg, *comm, launch);
        }
    } catch (const std::exception& e) {
        fprintf(stderr, "error%s: %s\n", launch.world_size > 1 ? strformat(" (rank %d)", launch.rank).c_str() : "",
                e.what());
        fflush(stderr);
        if (launch.under_launcher) abort_launch(launch, 1);
        return 1;
    }
    finalize_launch(launch);
    return 0;
}
