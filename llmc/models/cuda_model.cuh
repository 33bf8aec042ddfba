// cuda_model.cuh: CUDAModel, the product's model: either family (GPT-2 or Llama, models/family.h)
// trained on GPUs in bf16 (or FP8 products) with llmc's own kernels, behind the same Model interface
// as the fp32 CPU reference (models/cpu_model.h), walking the same layers. Its parts are in
// models/cuda/: the activation layout, the FP8 products and their ZeRO-3 gather, ring attention.
//
// Memory. The parameters, gradients and optimizer state belong to the same ZeRO engine as the CPU
// model's (dist/zero.h), here with device memory (dist/device_memory.cuh), laid out from the same
// parameter table (params.h), so the two models read and write the same model files: bf16 weights
// (what the kernels read), fp32 master weights (what AdamW updates, and what a model file holds; the
// bf16 weights are stochastically rounded copies, unbiased, so updates far below a bf16 ulp still add
// up), fp32 gradients (accumulated across micro-batches without bf16 rounding) and fp32 AdamW
// moments. The model reaches them bucket by bucket through a BucketView, walking its layers exactly
// as the CPU model does, so ZeRO stages 0-3 work the same way on both. Activations are bf16, their
// statistics (LayerNorm mean and rstd, attention log-sum-exp, losses) fp32, all cut out of one
// allocation sized for max_B x max_T. memory_specs() lists every allocation; the constructor
// allocates exactly that list and --plan prints it.
//
// Recomputation (-r) trades compute for activation memory; backward recomputes what was not kept:
//   0 keep everything
//   1 GELU output (4C per token per layer) recomputed from the pre-activation
//   2 also both LayerNorm outputs, recomputed from the saved mean and rstd
//   3 whole blocks: only each layer's input residual is kept; backward re-runs the layer's forward
// Recomputed tensors are bitwise equal to the forward's (same deterministic kernels on the same
// inputs), so settings 1-3 give identical gradients. Setting 0 fuses the GELU into the fc matmul's
// epilogue instead, which may round differently in the last bit.
//
// The classifier is chunked over rows: each chunk's logits are computed, turned into loss and
// dlogits in place by one kernel, and immediately pushed back through the lm head (dlnf for those
// rows, and the chunk's share of dwte), so the B x T x V logits never exist at once.
//
// Data parallelism: the engine's collectives run on a device communicator. Over NCCL (a GPU per
// rank) they run on NCCL's stream, overlapping compute. Over MPI they go through pinned host
// memory (StagedComm), which lets several ranks share one GPU. One rank without a launcher uses a
// StagedComm over the local communicator, where every collective is a copy or nothing.
//
// Tensor parallelism (Megatron-LM, with Korthikanti et al.'s sequence parallelism): the same cut and
// the same math as CPUModel's (models/cpu_model.h), on a device communicator of the tensor-parallel group.
// Each rank holds its piece of the model (GPT2Params::layout with its TpShard): its heads of qkv and
// the attention projection, its 4C/tp hidden units of the MLP, its Vp/tp rows of wte. Column-
// parallel products (qkv, fc) read all B x T rows of a LayerNorm output, gathered from every rank's
// n = BT/tp rows under sequence parallelism; row-parallel products (attproj, fcproj) and the
// vocabulary-parallel embedding produce partial sums, reduce-scattered to each rank's rows (or
// all-reduced without sequence parallelism) before the bias and the residual are added. The
// classifier is vocabulary-parallel: each row's (max, sum of exp, target logit) over the rank's
// columns are all-gathered, never the logits. Backward mirrors it; LayerNorm weight gradients, each
// rank's from its own rows, are summed over the group. Collectives start after the compute stream's
// earlier work (an event and order_after) and the host waits on their handles before issuing the
// kernels that read their results. What overlaps (NCCL; StagedComm runs every collective inside its
// call): in each layer's backward, the gather of ln2's rows with the MLP projection's backward, the
// gather of ln1's rows with the attention projection's and the attention's backward, and each
// column-parallel product's input-gradient reduction with its weight gradient. The forward's
// gathers and reductions, the classifier's statistics and the LayerNorm weight-gradient sums are
// exposed (each is needed by the very next kernel), and counted in take_exposed_comm_ms.
//
// Context parallelism (--cp, docs/context-parallel.md): as CPUModel's, each rank runs every layer on
// 2 of the 2 x cp chunks of each sequence (context_parallel.h), with their global positions in the
// embedding; attention is ring attention over the context group's device communicator from
// attention.cuh's ring-pair kernels (CudaRingAttention, models/cuda/ring_attention.cuh); the loss is the mean
// over the group's rows, and the data-parallel communicator the model is given is the data x
// context group's, so ZeRO sums the context ranks' partial gradients. With tensor parallelism the
// ring runs per tensor rank over its heads (sequence parallelism cuts a context rank's rows again
// into tp blocks); under pipeline parallelism each stage's context group rings its own layers, and
// the stages' messages carry the rank's rows.
//
// Mixture of experts (ModelConfig::num_experts, kernels/moe.cuh): a block with experts routes its
// ln2 rows and runs its experts in place of the MLP (or beside it, the shared expert), as CPUModel
// does; its routing and the experts' activations are kept per MoE block in an allocation of their
// own, sized for dropless routing of max_B x max_T tokens (or the capacity's cap), which backward
// reads whatever the recomputation setting (-r 3 re-runs a block's forward up to its MLP only). The
// forward of each MoE block waits for its routing's row counts (one stream synchronisation, see
// moe.cuh). With data parallelism (ZeRO 0-3) and expert parallelism (--ep: this rank holds a block
// of the experts; each block's rows go to their experts' ranks and back, ExpertRows below, the
// routes' counts over the host group as CPUModel sends them); tensor, pipeline and context
// parallelism are refused.
//
// Determinism: every kernel reduces in a fixed order and cuBLASLt runs one cached algorithm per
// shape, so two runs with the same seed and config produce bitwise identical losses.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/rmsnorm.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/kernels/swiglu.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/dist/expert_parallel.h"
#include "llmc/kernels/moe.cuh"
#include "llmc/kernels/nvtx.cuh"
#include "llmc/model.h"
#include "llmc/models/cuda/fp8_linears.cuh"
#include "llmc/models/model_file.h"
#include "llmc/models/family.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/kernels/phase_timer.cuh"
#include "llmc/dist/context_parallel.h"
#include "llmc/dist/pipeline_stage.h"
#include "llmc/dist/zero.h"
#include "llmc/dist/device_memory.cuh"
#include "llmc/dist/staged_comm.cuh"
#include "llmc/models/cuda/activations.cuh"
#include "llmc/models/parallel_groups.h"
#include "llmc/models/cuda/ring_attention.cuh"

namespace llmc {

class CUDAModel : public Model, private PipelineStage {
public:
    // Each slice of a ZeRO shard is a multiple of 8 elements, so every tensor stays 16-byte aligned.
    // One rank has nothing to shard: it runs ZeRO-0 whatever the stage asked for, which saves the
    // copies a sharded stage would make between its full and shard buffers.
    static constexpr size_t SHARD_ALIGN = 8;
    static int effective_stage(int stage, int world_size) { return world_size == 1 ? 0 : stage; }
    // ZeRO over the data-parallel group (rank of world_size) of tensor rank tp.rank's piece of the
    // pipeline stage `slice` (GPT2Params::stage_slice; the whole model by default).
    // With expert parallelism, `ep`'s block of the experts, sharded over the expert data group
    // (expert_rank of expert_world_size: the data-parallel ranks that hold the same experts).
    static ZeroPlan zero_plan(const ModelConfig& c, int stage, int rank, int world_size, const TpShape& tp = {},
                              const StageSlice& slice = {}, EpShard ep = {}, int expert_rank = -1,
                              int expert_world_size = -1) {
        return ZeroPlan(model_layout(c, {tp.rank, tp.size}, slice, ep), effective_stage(stage, world_size), rank,
                        world_size, SHARD_ALIGN, expert_rank, expert_world_size);
    }

    // The communicators in `dp`, `tp`, `pp` and `cp` must outlive the model. max_T: whole sequences
    // (a context-parallel rank allocates for its max_T / cp rows of each).
    CUDAModel(const ModelConfig& config, int max_B, int max_T, const CUDAModelOptions& options = {},
             const DataParallel& dp = {}, const TensorParallelGroup& tp = {}, const PipelineGroup& pp = {},
             const ContextParallelGroup& cp = {}, const ExpertParallelGroup& ep = {})
        : config_(validated(config, tp.shape().size)), tp_(tp.shape()),
          pp_host_(pp.host ? *pp.host : local_communicator()),
          pipe_(checked_pipeline("CUDAModel", config.num_layers, pp_host_, pp.pipe)),
          stage_(pipeline_stage_shape(pipe_, pp_host_.rank())),
          layout_(model_layout(config, {tp_.rank, tp_.size},
                               model_stage_slice(config, pipe_.split, pp_host_.rank()), ep.shard())),
          max_B_(max_B), max_T_(max_T), options_(options),
          host_(dp.host ? *dp.host : local_communicator()), comm_(dp.comm ? *dp.comm : staged_local_),
          whole_(dp.whole ? *dp.whole : comm_),
          tp_host_(tp.host ? *tp.host : local_communicator()), tp_comm_(tp.comm ? *tp.comm : staged_local_),
          pp_comm_(pp.comm ? *pp.comm : staged_local_), cp_host_(cp.host ? *cp.host : local_communicator()),
          cp_comm_(cp.comm ? *cp.comm : staged_local_), cp_{cp.size(), cp_comm_.rank(), max_T},
          ep_host_(ep.host ? *ep.host : local_communicator()), ep_comm_(ep.comm ? *ep.comm : staged_local_),
          expert_data_(ep.expert_data ? *ep.expert_data : comm_),
          memory_(stream_.get(), host_),
          engine_(layout_,
                  ZeroPlan(layout_, effective_stage(dp.zero_stage, comm_.world_size()), comm_.rank(),
                           comm_.world_size(), SHARD_ALIGN, expert_data_.rank(), expert_data_.world_size()),
                  comm_, memory_),
          encoder_backward_(max_B, std::max(1, max_T / cp.size())) {
        if (max_B < 1) fail(strformat("CUDAModel: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("CUDAModel: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        if (options.classifier_chunk_rows < 1)
            fail(strformat("CUDAModel: classifier_chunk_rows must be >= 1, got %d", options.classifier_chunk_rows));
        if (!comm_.uses_device_buffers())
            fail(strformat("CUDAModel: the %s communicator works on host buffers; wrap it in a StagedComm",
                           comm_.backend()));
        // The gradient norm of a sharded stage is summed over host_: it must span the same ranks.
        if (host_.world_size() != comm_.world_size() || host_.rank() != comm_.rank())
            fail(strformat("CUDAModel: the host communicator is rank %d of %d but the device one rank %d of %d",
                           host_.rank(), host_.world_size(), comm_.rank(), comm_.world_size()));
        if (dp.replicas) {
            if (!dp.replicas->uses_device_buffers() || !whole_.uses_device_buffers())
                fail("CUDAModel: hybrid sharding's replica and whole data-parallel groups need device communicators");
            if (whole_.world_size() != comm_.world_size() * dp.replicas->world_size())
                fail(strformat("CUDAModel: %d shard groups of %d ranks do not make the %d ranks of the whole group",
                               dp.replicas->world_size(), comm_.world_size(), whole_.world_size()));
            engine_.set_replicas(*dp.replicas);
        }
        if (!tp_comm_.uses_device_buffers())
            fail(strformat("CUDAModel: the tensor-parallel %s communicator works on host buffers; wrap it in a "
                           "StagedComm", tp_comm_.backend()));
        if (tp_host_.world_size() != tp_comm_.world_size() || tp_host_.rank() != tp_comm_.rank())
            fail(strformat("CUDAModel: the tensor-parallel host communicator is rank %d of %d but the device one rank "
                           "%d of %d", tp_host_.rank(), tp_host_.world_size(), tp_comm_.rank(), tp_comm_.world_size()));
        if (tp_.sequence_parallel && max_T / cp.size() % tp_.size != 0)
            fail(strformat("CUDAModel: sequence parallelism over %d tensor-parallel ranks needs max_T / cp (%d / %d) "
                           "divisible by them", tp_.size, max_T, cp.size()));
        if (!pp_comm_.uses_device_buffers())
            fail(strformat("CUDAModel: the pipeline %s communicator works on host buffers; wrap it in a StagedComm",
                           pp_comm_.backend()));
        if (pp_host_.world_size() != pp_comm_.world_size() || pp_host_.rank() != pp_comm_.rank())
            fail(strformat("CUDAModel: the pipeline host communicator is rank %d of %d but the device one rank %d of %d",
                           pp_host_.rank(), pp_host_.world_size(), pp_comm_.rank(), pp_comm_.world_size()));
        if (cp_.size > 1) {
            ContextSplit::check(max_T, cp_.size, "CUDAModel");
            if (!cp_comm_.uses_device_buffers() || cp_host_.world_size() != cp_comm_.world_size() ||
                cp_host_.rank() != cp_comm_.rank())
                fail(strformat("CUDAModel: the context-parallel communicators (%s, rank %d of %d; host rank %d of %d) "
                               "must be a device one and a host one over the same ranks",
                               cp_comm_.backend(), cp_comm_.rank(), cp_comm_.world_size(), cp_host_.rank(),
                               cp_host_.world_size()));
        }
        if (options.fp8.enabled && (tp_.size > 1 || stage_.pipelined || cp_.size > 1))
            fail("CUDAModel: FP8 products (--fp8) run with data parallelism only so far (no --tp, --pp or --cp)");
        matmul_.force_split_k(options.split_k);
        engine_.set_tensor_parallel(tp_host_);
        engine_.set_pipeline_parallel(pp_host_);
        if (ep.comm) check_expert_group(ep);
        chunks_ = pipeline_chunks(pipe_.split, pp_host_.rank());
        if (stage_.pipelined) {
            // The lm head's backward runs inside its forward (chunk by chunk, see forward_chunk) and
            // leaves dlnf in scratch for backward_chunk: nothing may run between the two.
            const PipeSchedule s = make_pipeline_schedule(pipe_.split.stages, pipe_.micro_batches, pipe_.split.chunks);
            if (!head_backward_follows_forward(s, pp_host_.rank()))
                fail("CUDAModel: the pipeline schedule runs other passes between the head's forward and backward");
            // Where activations and gradients travel between the stages (pipeline_links): over NCCL
            // a communicator per edge, as its streams need.
            links_ = pipeline_links(pp_comm_, pipe_.edge_links || std::string(pp_comm_.backend()) == "nccl");
        }
        acts_.allocate(CudaActivationLayout::bytes_for(config_, max_B, max_T / cp_.size, options_, tp_, stage_, cp_.size),
                       "activations");
        pinned_tokens_ = PinnedBuffer<int>(2 * (size_t)max_B * max_T, "token upload");
        pinned_losses_ = PinnedBuffer<float>((size_t)max_B * max_T * (stage_.pipelined ? pipe_.micro_batches : 1),
                                             "loss download");
        pinned_logits_ = PinnedBuffer<floatX>(config_.padded_vocab_size, "logits download");
        const Fp8WeightCopies fp8_copies = fp8_weight_copies(options_.fp8, engine_.plan());
        fp8_ = Fp8LinearsCUDA(layout_.num_layers(), Fp8BlockWeights(config_), options_.fp8, fp8_copies,
                              whole_.world_size(), stream_.get());
        fp8_.time_casts_in(&timer_);
        engine_.attach_replicated_state(&fp8_);
        if (fp8_gathers_codes(options_.fp8, engine_.plan())) {
            fp8_.gather_weights(layout_, engine_.plan(), comm_);
            engine_.set_gather_codec(&fp8_);
        }
        own_activation_bytes_ = acts_.bytes() + encoder_backward_.device_bytes() + matmul_.device_bytes() +
                                DeviceMemory::scratch_bytes() + fp8_.allocated_bytes();
        if (config_.num_experts > 0) allocate_experts();
    }

    // What ZeRO-3's gather of a layer sends from each rank with its weights as FP8 codes, and as
    // bf16 (--fp8 1 -z 3 --fp8-gather 1; else zeros), for the startup line and --plan.
    static std::pair<size_t, size_t> fp8_gather_chunk_bytes(const ModelConfig& c, const ZeroPlan& plan,
                                                            const Fp8Options& o) {
        if (!fp8_gathers_codes(o, plan)) return {0, 0};
        return Fp8WeightGather::chunk_bytes(model_layout(c), Fp8BlockWeights(c), plan);
    }
    // What one rank's ZeRO-3 gathers send less with the weights as codes (the planner's bytes), or 0.
    static double fp8_gather_bytes_saved(const ModelConfig& c, const ZeroPlan& plan, const Fp8Options& o) {
        if (!fp8_gathers_codes(o, plan)) return 0;
        return Fp8WeightGather::bytes_saved(model_layout(c), Fp8BlockWeights(c), plan);
    }

    // Everything the model allocates on the GPU for this config and plan (what --plan prints; the
    // constructor's allocations add up to the same bytes).
    // (max_T: whole sequences, of which a rank of a context group of cp holds max_T / cp rows.)
    static std::vector<BufferSpec> memory_specs(const ModelConfig& c, int max_B, int max_T, const CUDAModelOptions& o,
                                                const ZeroPlan& plan, const TpShape& tp = {},
                                                const StageShape& stage = {}, int cp = 1, int ep = 1) {
        using K = MemoryKind;
        const int rows = max_T / cp;
        std::vector<BufferSpec> specs = buffer_specs(plan, DeviceMemory::precision);
        specs.push_back({stage.slots > 1 ? strformat("activations (%d micro-batches)", stage.slots) : "activations",
                         K::Activations, CudaActivationLayout::bytes_for(c, max_B, rows, o, tp, stage, cp), 1});
        specs.push_back({"encoder backward index", K::Activations, EncoderBackward::device_bytes_for(max_B, std::max(1, rows)), 1});
        specs.push_back({"cuBLASLt workspace", K::Activations, MatmulContext::WORKSPACE_BYTES, 1});
        specs.push_back({"split-K partials", K::Activations, MatmulContext::SPLIT_K_PARTIAL_BYTES, 1});
        specs.push_back({"gradient norm scratch", K::Activations, DeviceMemory::scratch_bytes(), 1});
        if (o.fp8.enabled) {
            const int layers = stage.layers < 0 ? c.num_layers : stage.layers;
            const Fp8WeightCopies copies = fp8_weight_copies(o.fp8, plan);
            const Fp8BlockWeights weights(c);
            specs.push_back({"FP8 scales and amax histories", K::Activations,
                             Fp8LinearsCUDA::device_bytes(layers, o.fp8, plan.world_size), 1});
            specs.push_back({fp8_weight_copies_name(copies), K::Activations,
                             Fp8LinearsCUDA::weight_bytes(layers, weights, o.fp8, copies, plan.world_size), 1});
            if (copies == Fp8WeightCopies::Gathered)
                specs.push_back({"FP8 gather (packed slices, landing, codes)", K::Activations,
                                 Fp8WeightGather::device_bytes(model_layout(c), weights, plan), 1});
        }
        if (c.num_experts > 0)
            specs.push_back({"expert activations", K::Activations, moe_bytes(c, max_B, max_T, o, ep), 1});
        return specs;
    }
    // The MoE blocks' routing and expert activations for max_B x max_T tokens (moe.cuh's MoeMemory),
    // on an expert group of ep ranks.
    static size_t moe_bytes(const ModelConfig& c, int max_B, int max_T, const CUDAModelOptions& o, int ep = 1) {
        return MoeMemory::bytes_for(moe_shape_of(c, max_B * max_T, o), moe_blocks(c), ep);
    }

    const ModelConfig& config() const override { return config_; }
    const ParamLayout& layout() const override { return layout_; }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are zeroed, the bf16 weights are the
    // master weights rounded to nearest. Every rank passes the same seed or file and keeps its shard
    // (of its tensor-parallel piece, cut from the whole model).
    void init_random(uint64_t seed) override {
        std::vector<float> whole(whole_layout().num_params);
        init_params(whole_layout(), whole.data(), seed);
        reset(piece_of(whole), (uint32_t)(seed ^ (seed >> 32)));
    }
    void load(const std::string& path) override {
        std::vector<float> whole(whole_layout().num_params);
        read_model_file(path, config_, whole.data());
        reset(piece_of(whole), 0x5eed1234u);
    }
    // Writes the fp32 master weights: they are the model; the bf16 weights are derived from them.
    // A collective (sharded master weights and tensor-parallel pieces are gathered); rank 0 writes.
    void save(const std::string& path, bool bf16 = false) override {
        std::vector<float> whole(whole_layout().num_params);
        get_master_weights(whole.data());
        if (comm_.rank() == 0 && tp_.rank == 0 && pp_host_.rank() == 0)
            write_model_file(path, config_, whole.data(), bf16 ? MODEL_FILE_VERSION_BF16 : MODEL_FILE_VERSION_FP32);
    }
    // Sets the master weights from a whole-model fp32 buffer (the whole model's ParamLayout order;
    // each tensor-parallel rank keeps its piece) and resets the optimizer; bf16 weights rounded to
    // nearest. For tests that give this model and the CPU reference the same weights.
    void set_master_weights(const float* whole) {
        std::vector<float> copy(whole, whole + whole_layout().num_params);
        reset(piece_of(copy), memory_.sr_seed);
    }
    // The whole model's fp32 master weights in its ParamLayout order (whole_num_params() floats), on
    // every rank; a collective where they are sharded or cut. Each rank puts the elements it holds
    // first-hand (ParamLayout::is_primary) into a zeroed whole and sums over the tensor-parallel and
    // pipeline groups fill in the rest exactly (x + 0 is x), as CPUModel::get_whole_params does.
    void get_master_weights(float* whole) {
        if (layout_.is_whole()) {
            engine_.get_params(whole);
            memory_.release_transient();
            return;
        }
        std::vector<float> local(layout_.num_params);
        engine_.get_params(local.data());
        memory_.release_transient();
        std::fill(whole, whole + whole_layout().num_params, 0.0f);
        copy_between_layouts(whole_layout(), whole, layout_, local.data(), false, /*primary_only=*/true);
        // of the expert group, whose ranks all hold the tensors that are not per-expert, rank 0 puts those
        if (ep_host_.rank() > 0)
            for (const ParamLayout::Segment& seg : whole_layout().segments())
                if (!whole_layout().is_per_expert(seg.tensor)) std::fill(whole + seg.begin, whole + seg.end, 0.0f);
        for (Communicator* group : {&tp_host_, &pp_host_, &ep_host_})
            if (group->world_size() > 1) group->all_reduce_sum(whole, whole_layout().num_params, CommDtype::F32).wait();
    }
    size_t whole_num_params() const { return whole_layout().num_params; }
    // The fp32 gradients of this rank's piece in its ParamLayout order (layout(); the whole model
    // without tensor parallelism), for tests of an unsharded model (ZeRO-0).
    void get_grads(float* full) {
        const float* grads = engine_.full_grads();
        if (!grads || engine_.plan().shards_optimizer())
            fail("CUDAModel: get_grads needs the whole gradient on this rank (ZeRO-0)");
        for (const ZeroPlan::Bucket& k : engine_.plan().buckets)
            memory_.download(full + k.begin, grads + k.padded_begin, k.size);
    }

    void zero_grad() override { engine_.zero_grad(); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(inputs, targets, B, T, "forward_backward");
        if (stage_.pipelined)
            fail("CUDAModel: a pipeline-parallel model runs a whole step at once (forward_backward_step)");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        const CudaActivationLayout a = activations(B, local.T, 0);
        forward_chunk(a, 0, local.inputs, local.targets, B, local.T, Pass::Train, grad_scale);
        backward_chunk(a, 0, local.inputs, B, local.T, last_micro_batch);
        return mean_loss(B * local.T);
    }
    double forward_backward_step(const int* inputs, const int* targets, int micro_batches, int B, int T,
                                 float grad_scale) override {
        if (!stage_.pipelined) return Model::forward_backward_step(inputs, targets, micro_batches, B, T, grad_scale);
        for (int m = 0; m < micro_batches; m++)
            check_batch(inputs + (size_t)m * B * T, targets + (size_t)m * B * T, B, T, "forward_backward_step");
        const LocalBatch local = local_batch(inputs, targets, micro_batches * B, T);
        return run_schedule(local.inputs, local.targets, micro_batches, B, local.T, grad_scale);
    }
    float evaluate(const int* inputs, const int* targets, int B, int T) override {
        check_batch(inputs, targets, B, T, "evaluate");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        return forward_through_stages(local.inputs, local.targets, B, local.T, Pass::Evaluate);
    }
    // The forward leaves the last stage's losses of this rank's positions in pinned_losses_ (all rows
    // on every tensor rank): the context ranks' are gathered and put back in place, then the last
    // stage broadcasts them.
    void evaluate_rows(const int* inputs, const int* targets, int B, int T, float* row_losses) override {
        check_batch(inputs, targets, B, T, "evaluate_rows");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        forward_through_stages(local.inputs, local.targets, B, local.T, Pass::Evaluate);
        if (stage_.head) {
            const float* mine = pinned_losses_.get();
            const size_t n = (size_t)B * local.T;
            if (cp_.size == 1) {
                std::copy(mine, mine + n, row_losses);
            } else {
                std::vector<float> gathered(n * cp_.size);
                cp_host_.all_gather(mine, gathered.data(), n, CommDtype::F32).wait();
                cp_.place_gathered(gathered.data(), B, row_losses);
            }
        }
        if (stage_.pipelined)
            wait(pp_host_.broadcast(row_losses, (size_t)B * T * sizeof(float), pipe_.split.last_rank()));
    }
    // Every rank of the tensor and pipeline groups calls it with the same tokens and gets the whole row.
    void next_token_logits(const int* tokens, int T, float* logits_out) override {
        llmc::check_batch(config_, max_B_, max_T_, tokens, nullptr, 1, T, "next_token_logits");
        // Sequence and context parallelism cut the rows into equal blocks: pad with token 0 to a length
        // they cut. Attention is causal, so the padding cannot change the logits at position T - 1,
        // which the context rank holding it broadcasts.
        const int unit = cp_.padding_unit(tp_.sequence_parallel ? tp_.size : 1);
        std::vector<int> padded(tokens, tokens + T);
        padded.resize((T + unit - 1) / unit * unit, 0);
        if ((int)padded.size() > max_T_)
            fail(strformat("next_token_logits: %d tokens padded to %d (a multiple of %d) exceed max_T %d", T,
                           (int)padded.size(), unit, max_T_));
        const LocalBatch local = local_batch(padded.data(), nullptr, 1, (int)padded.size());
        forward_through_stages(local.inputs, nullptr, 1, local.T, Pass::LastLogits, cp_.local_index_at_owner(T - 1));
        if (stage_.head) {
            const CudaActivationLayout a = activations(1, local.T, 0);
            const int cols = vocab_cols();
            CUDA_CHECK(cudaMemcpyAsync(pinned_logits_.get(), a.logits, cols * sizeof(floatX), cudaMemcpyDeviceToHost,
                                       stream_.get()));
            stream_.synchronize();
            float* mine = logits_out + (size_t)tp_.rank * cols;
            for (int i = 0; i < cols; i++) mine[i] = __bfloat162float(pinned_logits_.get()[i]);
            if (tp_.size > 1) tp_host_.all_gather(mine, logits_out, cols, CommDtype::F32).wait();
            if (cp_.size > 1)
                cp_host_.broadcast(logits_out, config_.padded_vocab_size * sizeof(float), cp_.owner_of(T - 1)).wait();
        }
        if (stage_.pipelined)
            wait(pp_host_.broadcast(logits_out, config_.padded_vocab_size * sizeof(float), pipe_.split.last_rank()));
    }

    double grad_norm_squared() override {
        NvtxRange range("grad norm");
        PhaseScope phase(timer_, "grad norm", stream_.get());
        return engine_.grad_norm_squared();
    }
    // AdamW on this rank's shard (one launch per tensor slice), then, under ZeRO-1/2, the bf16
    // parameters all-gathered. The stochastic rounding bits depend on (seed, step, element) only.
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) override {
        if (step < 1) fail(strformat("adamw_step: step must be >= 1 (1-based for bias correction), got %d", step));
        NvtxRange range("adamw");
        PhaseScope phase(timer_, "adamw", stream_.get());
        fp8_.end_step(whole_.world_size() > 1 ? &whole_ : nullptr);
        engine_.adamw_step(opt, step, grad_multiplier);
    }
    Fp8Stats take_fp8_stats() override { return fp8_.take_stats(); }
    // The FP8 weight casts so far (fp8_linears.cuh), for the tests.
    uint64_t fp8_weight_casts() const { return fp8_.weight_casts(); }
    uint64_t fp8_amax_passes() const { return fp8_.amax_passes(); }
    void set_fp8_fused_amax(bool on) { fp8_.set_fused_amax(on); }

    RouterStats take_router_stats() override { return router_stats_.take(); }

    double take_exposed_comm_ms() override {
        const double tp_ms = tp_exposed_ms_;
        tp_exposed_ms_ = 0;
        return engine_.take_exposed_comm_ms() + fp8_.take_exposed_comm_ms() + tp_ms + ring_.take_wait_ms();
    }
    ShardedState& sharded_state() override { return engine_; }
    size_t allocated_bytes(MemoryKind kind) const override {
        return engine_.allocated_bytes(kind) + (kind == MemoryKind::Activations ? own_activation_bytes_ : 0);
    }

    // Per-phase GPU milliseconds (matmul, attention, ...) for the benchmark; off unless enabled.
    void enable_phase_timing(bool on) { timer_.enable(on); }
    void collect_phase_ms(std::map<std::string, double>& totals) {
        stream_.synchronize();
        timer_.collect(totals);
    }
    cudaStream_t stream() const { return stream_.get(); }

private:
    // Every tensor-parallel rank's piece keeps the kernels' alignment: C/tp and Vp/tp multiples of 8.
    static const ModelConfig& validated(const ModelConfig& c, int tp) {
        c.validate();
        if (c.channels % 8 != 0)
            fail(strformat("CUDAModel: channels (%d) must be a multiple of 8 (16-byte vector loads)", c.channels));
        if (c.padded_vocab_size % 8 != 0)
            fail(strformat("CUDAModel: padded_vocab_size (%d) must be a multiple of 8", c.padded_vocab_size));
        if (c.head_size() != 32 && c.head_size() != 64 && c.head_size() != 128)
            fail(strformat("CUDAModel: head size channels / num_heads = %d must be 32, 64 or 128 (the attention "
                           "kernels' instantiations)",
                           c.head_size()));
        if (c.arch == ModelArch::Llama && (c.mlp_hidden() / std::max(tp, 1)) % 8 != 0)
            fail(strformat("CUDAModel: the SwiGLU width / --tp = %d / %d must be a multiple of 8 (16-byte vector loads)",
                           c.mlp_hidden(), tp));
        if (tp == 1) return c;
        if (tp < 1 || c.num_heads % tp != 0)
            fail(strformat("CUDAModel: --tp %d must be a positive divisor of num_heads (%d)", tp, c.num_heads));
        check_tensor_parallel_shape(c, tp);  // a Llama's kv heads and MLP width too
        if ((c.channels / tp) % 8 != 0)
            fail(strformat("CUDAModel: channels / --tp = %d / %d must be a multiple of 8 (16-byte vector loads)",
                           c.channels, tp));
        if (c.padded_vocab_size % (8 * tp) != 0)
            fail(strformat("CUDAModel: padded_vocab_size (%d) must be a multiple of 8 x --tp %d (each rank's "
                           "vocabulary slice a multiple of 8)", c.padded_vocab_size, tp));
        return c;
    }

    // T: this rank's rows of each sequence.
    CudaActivationLayout activations(int B, int T, int slot) const {
        CudaActivationLayout a(config_, B, T, options_, acts_.get(), tp_, stage_, slot, cp_.size);
        if (a.total_bytes > acts_.bytes())
            fail(strformat("CUDAModel: activations for B %d x T %d need %zu bytes, %zu allocated", B, T, a.total_bytes,
                           acts_.bytes()));
        return a;
    }

    void check_batch(const int* inputs, const int* targets, int B, int T, const char* who) const {
        llmc::check_batch(config_, max_B_, max_T_, inputs, targets, B, T, who);
        ContextSplit::check(T, cp_.size, who);
        if (tp_.sequence_parallel && (B * T / cp_.size) % tp_.size != 0)
            fail(strformat("%s: sequence parallelism needs B*T/cp = %d*%d/%d divisible by the %d tensor-parallel ranks",
                           who, B, T, cp_.size, tp_.size));
    }

    // The whole model's layout (model files, init), and this rank's piece of a whole-model buffer.
    const ParamLayout& whole_layout() const { return layout_.is_whole() ? layout_ : whole_layout_; }
    std::vector<float> piece_of(std::vector<float>& whole) const { return piece_of_whole(whole_layout(), whole, layout_); }

    void reset(const std::vector<float>& full, uint32_t sr_seed) {
        memory_.sr_seed = sr_seed;
        engine_.set_params(full.data());
        engine_.reset_optimizer();
        memory_.release_transient();
        stream_.synchronize();
    }

    // Parameters and gradients are reached only through the bucket view (zero.h), so the model
    // never knows how they are sharded.
    // A tensor the family lacks (-1 in BlockTensors: GPT-2's biases and wpe in a Llama) is null.
    const floatX* param(int tensor, int layer = 0) const { return tensor < 0 ? nullptr : buckets_.param(tensor, layer); }
    float* grad(int tensor, int layer = 0) const { return tensor < 0 ? nullptr : buckets_.grad(tensor, layer); }
    void release_all() { buckets_.release_all(); }

    // Copies the batch to the device through pinned memory, once the previous upload has left it.
    void upload_tokens(const CudaActivationLayout& a, const int* inputs, const int* targets, int BT) {
        int* staged = pinned_tokens_.get();
        CUDA_CHECK(cudaEventSynchronize(tokens_uploaded_.get()));
        std::memcpy(staged, inputs, BT * sizeof(int));
        CUDA_CHECK(cudaMemcpyAsync(a.inputs, staged, BT * sizeof(int), cudaMemcpyHostToDevice, stream_.get()));
        if (targets) {
            std::memcpy(staged + BT, targets, BT * sizeof(int));
            CUDA_CHECK(
                cudaMemcpyAsync(a.targets, staged + BT, BT * sizeof(int), cudaMemcpyHostToDevice, stream_.get()));
        }
        CUDA_CHECK(cudaEventRecord(tokens_uploaded_.get(), stream_.get()));
    }

    // What a forward pass leaves behind: per-row losses (Evaluate), losses plus dlnf and the lm head's
    // share of dwte, ready for backward() (Train), or only row logits_row's logits (LastLogits; -1:
    // the last row). Under tensor parallelism dlnf is this rank's partial sum over its vocabulary
    // columns, which backward() reduces over the group.
    enum class Pass { Evaluate, Train, LastLogits };

    // The forward pass of one chunk of this rank's layers (the whole model without a pipeline) on a
    // checked batch, in the activation slot `a`: from the embedding, or from the input received into
    // the slot; where the chunk ends the model, through the head. Host token ids; the device copies
    // are uploaded here.
    void forward_chunk(const CudaActivationLayout& a, int chunk, const int* inputs, const int* targets, int B, int T,
                       Pass pass, float grad_scale, int logits_row = -1) {
        last_B_ = B;
        last_T_ = T;
        fp8_.set_recording(pass == Pass::Train);
        fp8_.use_weights(engine_.params_version());
        moe_training_ = pass == Pass::Train;
        moe_grad_scale_ = grad_scale;  // the auxiliary losses' gradients scale as the loss's
        const PipelineChunk& ch = chunks_[chunk];
        const int C = config_.channels, V = config_.vocab_size;
        const int Vp = config_.padded_vocab_size, Vl = vocab_cols(), BT = B * T, n = tp_.rows(BT);
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        if (ch.embedding || ch.head) upload_tokens(a, inputs, targets, BT);
        // a.positions: the global position of each of the rank's rows (the embedding's, and RoPE's)
        if (cp_.size > 1 && (ch.embedding || widths_.rotary))
            CUDA_CHECK(cudaMemcpyAsync(a.positions, batcher_.positions().data(), T * sizeof(int), cudaMemcpyHostToDevice,
                                       s));
        buckets_.acquire_resident();
        // RoPE's angles of this pass's T positions, which backward (and its recomputation) reads too:
        // any pass run between a forward and its backward (a pipeline's other micro-batches) has the
        // same T and positions.
        if (widths_.rotary && ch.end > ch.begin) {
            PhaseScope phase(timer_, "rope", s);
            rope_table(a.rope, T, widths_.head_size, config_.rope_theta, a.positions, s);
        }
        if (ch.embedding) embedding_forward(a, chunk_input(a, chunk, BT), B, T);
        for (int l = ch.begin; l < ch.end; l++) {
            NvtxRange range("forward", l);
            buckets_.enter_layer(l, Walk::Forward, ch.begin, ch.end);
            layer_forward(a, l, B, T, false);
            buckets_.leave_layer(l, Walk::Forward);
        }
        if (!ch.head) {
            if (pass != Pass::Train) release_all();
            return;
        }
        norm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, chunk_output(a, ch, BT), P.normf_w, P.normf_b, 0, n);
        const floatX* lnf = gather_rows(a.lnf, a.full, BT, C);  // all BT rows
        if (pass == Pass::LastLogits) {
            {
                PhaseScope phase(timer_, LM_HEAD_PHASE, s);
                const int row = logits_row < 0 ? BT - 1 : logits_row;
                matmul_forward(matmul_, a.logits, nullptr, lnf + (size_t)row * C, param(P.head), nullptr, nullptr, 1,
                               C, Vl, s);
            }
            release_all();
            return;
        }
        const bool train = pass == Pass::Train;
        // The lm head's backward runs here, chunk by chunk, so its gradient buffer is taken now (under
        // ZeRO-2 this zeroes a fresh one): GPT-2's tied wte, to which backward_chunk adds the
        // encoder's share; a Llama's lm_head, in the final norm's bucket.
        if (train) buckets_.take_grads(layout_.bucket_of(P.head));
        // The whole backward is linear in the loss gradient, so grad_scale enters once, here. The loss
        // is the mean over the context group's rows (each rank's weight gradients its part of the sum).
        const float dloss = grad_scale / ((float)BT * cp_.size);
        const int rows_at_once = std::min(BT, options_.classifier_chunk_rows);
        for (int r0 = 0; r0 < BT; r0 += rows_at_once) {
            const int rows = std::min(rows_at_once, BT - r0);
            const floatX* lnf_rows = lnf + (size_t)r0 * C;
            {
                PhaseScope phase(timer_, LM_HEAD_PHASE, s);
                matmul_forward(matmul_, a.logits, nullptr, lnf_rows, param(P.head), nullptr, nullptr, rows, C, Vl, s);
            }
            if (tp_.size == 1) {
                PhaseScope phase(timer_, "classifier", s);
                fused_classifier(a.logits, a.row_loss + r0, a.targets + r0, dloss, rows, V, Vp, train, s);
            } else {  // vocabulary-parallel: only each row's max, sum of exponentials and target logit travel
                float* mine = a.ce_stats + (size_t)tp_.rank * rows * 3;
                {
                    PhaseScope phase(timer_, "classifier", s);
                    classifier_local_stats(mine, a.logits, a.targets + r0, rows, vocab_begin(), vocab_real(), Vl, s);
                }
                tp_wait(after_compute([&] {
                    return tp_comm_.all_gather(mine, a.ce_stats, (size_t)rows * 3, CommDtype::F32);
                }));
                PhaseScope phase(timer_, "classifier", s);
                classifier_from_stats(a.logits, a.row_loss + r0, a.targets + r0, a.ce_stats, tp_.size, dloss, rows, V,
                                      vocab_begin(), vocab_real(), Vl, train, s);
            }
            if (train) {
                PhaseScope phase(timer_, LM_HEAD_BACKWARD_PHASE, s);
                // the lm head has no bias, so no bias-gradient scratch
                matmul_backward(matmul_, a.dC + (size_t)r0 * C, grad(P.head), nullptr, nullptr, a.logits, lnf_rows,
                                param(P.head), nullptr, rows, C, Vl, s);
            }
        }
        // Training keeps the embeddings and final norm for backward; an evaluation is done with them.
        if (!train) release_all();
    }

    // One transformer block's forward. `for_backward`: a whole-block recomputation, which stops
    // before the MLP projection (its output, the next residual, is kept and not needed again).
    // Under tensor parallelism the LayerNorms run on this rank's n rows, qkv and fc (column-parallel)
    // on all BT rows gathered, and the two projections (row-parallel) are reduced over the group.
    void layer_forward(const CudaActivationLayout& a, int l, int B, int T, bool for_backward) {
        const int C = config_.channels, NH = widths_.heads, HS = widths_.head_size;
        const int Cl = C / tp_.size, BT = B * T, n = tp_.rows(BT);
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        const floatX* residual = layer_input(a, l, B * T);
        norm_forward(a.ln1.at(l), a.ln1_mean.at(l), a.ln1_rstd.at(l), residual, P.norm1_w, P.norm1_b, l, n,
                     fp8_fused_amax(l, FP8_QKV, FP8_INPUT));
        const floatX* ln1 = gather_rows(a.ln1.at(l), a.full, BT, C);
        {
            PhaseScope phase(timer_, matmul_phase(FP8_QKV, false), s);
            linear_forward(a, l, FP8_QKV, a.qkv.at(l), nullptr, ln1, param(P.qkv_w, l), param(P.qkv_b, l), nullptr,
                           BT, C, (int)widths_.qkv);
        }
        if (widths_.rotary) {  // a Llama's q and k rotated in place; what is kept is rotated
            PhaseScope phase(timer_, "rope", s);
            rope_forward(a.qkv.at(l), a.rope, B, T, NH, widths_.kv_heads, HS, s);
        }
        attention_layer_forward(a, l, B, T, NH, HS);
        row_parallel_forward(a, l, FP8_ATTPROJ, a.residual2.at(l), a.atty.at(l), param(P.attproj_w, l),
                             param(P.attproj_b, l), residual, BT, Cl, C);
        float* amax = layout_.has(P.up_w, l) ? fp8_fused_amax(l, FP8_FC, FP8_INPUT) : nullptr;
        norm_forward(a.ln2.at(l), a.ln2_mean.at(l), a.ln2_rstd.at(l), a.residual2.at(l), P.norm2_w, P.norm2_b, l, n,
                     amax);
        mlp_forward(a, l, BT, for_backward);
    }

    // ---- what differs between the families (family.h), each behind one call of the walk ----

    // The embedding of this rank's rows of the uploaded tokens (a.inputs) into x: the token's wte row,
    // plus (GPT-2) its position's wpe row; vocabulary-parallel under tensor parallelism (each rank
    // embeds the tokens it holds rows for, and the sum has them all).
    void embedding_forward(const CudaActivationLayout& a, floatX* x, int B, int T) {
        const BlockTensors& P = tensors_;
        const int C = config_.channels, BT = B * T, n = tp_.rows(BT), Vl = vocab_cols();
        cudaStream_t s = stream_.get();
        PhaseScope phase(timer_, "encoder", s);
        if (tp_.size == 1 && P.wpe >= 0) {
            encoder_forward(x, a.inputs, param(P.wte), param(P.wpe), B, T, C, s, a.positions);
        } else if (tp_.size == 1) {  // a Llama's embedding: the token's row, no position table
            embedding_forward_range(x, a.inputs, param(P.wte), 0, config_.padded_vocab_size, BT, C, s);
        } else {
            embedding_forward_range(a.partial, a.inputs, param(P.wte), vocab_begin(), vocab_begin() + Vl, BT, C,
                                    s);
            tp_wait(reduce_rows(a.partial, x, BT, C));
            const int row0 = tp_.sequence_parallel ? tp_.rank * n : 0;  // this rank's first token row
            if (P.wpe >= 0) add_positions(x, reduced(a.partial, x), param(P.wpe), row0, n, T, C, s, a.positions);
            else if (reduced(a.partial, x) != x)
                CUDA_CHECK(cudaMemcpyAsync(x, a.partial, (size_t)n * C * sizeof(floatX), cudaMemcpyDeviceToDevice, s));
        }
    }

    // A pre-norm of n rows: GPT-2's LayerNorm (weight and bias; mean and rstd kept) or a Llama's
    // RMSNorm (weight; rstd kept). `layer` picks a per-layer norm's weights; `amax` as the kernels'.
    void norm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, int weight, int bias, int layer, int n,
                      float* amax = nullptr) {
        PhaseScope phase(timer_, "layernorm", stream_.get());
        if (widths_.layernorm)
            layernorm_forward(out, mean, rstd, inp, param(weight, layer), param(bias, layer), n, config_.channels,
                              stream_.get(), amax);
        else
            rmsnorm_forward(out, rstd, inp, param(weight, layer), n, config_.channels, stream_.get(), amax);
    }
    // Its recomputation from the kept statistics (-r 2).
    void norm_recompute(floatX* out, const floatX* inp, const float* mean, const float* rstd, int weight, int bias,
                        int layer, int n) {
        if (widths_.layernorm)
            layernorm_recompute(out, inp, mean, rstd, param(weight, layer), param(bias, layer), n, config_.channels,
                                stream_.get());
        else
            rmsnorm_recompute(out, inp, rstd, param(weight, layer), n, config_.channels, stream_.get());
    }
    // Its backward: dinp += the input's gradient, dweight (and dbias) += the parameters'.
    void norm_backward(const CudaActivationLayout& a, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                       const floatX* inp, int weight, int layer, const float* mean, const float* rstd, int n,
                       float* amax = nullptr) {
        PhaseScope phase(timer_, "layernorm", stream_.get());
        if (widths_.layernorm)
            layernorm_backward(dinp, dweight, dbias, a.scratch, dout, inp, param(weight, layer), mean, rstd, n,
                               config_.channels, stream_.get(), amax);
        else
            rmsnorm_backward(dinp, dweight, a.scratch, dout, inp, param(weight, layer), rstd, n, config_.channels,
                             stream_.get(), amax);
    }
    // The MLP's activation of its input product (fch) into fch_gelu: GELU, or SwiGLU of the gate and up
    // halves.
    void mlp_activation(const CudaActivationLayout& a, int l, int BT, float* amax) {
        PhaseScope phase(timer_, widths_.swiglu ? "swiglu" : "gelu", stream_.get());
        if (widths_.swiglu) swiglu_forward(a.fch_gelu.at(l), a.fch.at(l), BT, (int)widths_.hidden, stream_.get(), amax);
        else gelu_forward(a.fch_gelu.at(l), a.fch.at(l), (size_t)BT * widths_.hidden, stream_.get(), amax);
    }

    // Block l's MLP, residual3 = residual2 + MLP(ln2): GPT-2's, the experts' (moe.cuh), or both (the
    // shared expert beside the routed ones, added after it as CPUModel adds them). `for_backward`: a
    // whole-block recomputation, which stops before the dense projection and leaves the experts'
    // activations as the forward kept them.
    void mlp_forward(const CudaActivationLayout& a, int l, int BT, bool for_backward) {
        const int C = config_.channels, U = (int)widths_.up, H = (int)widths_.hidden;
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        const floatX* ln2 = gather_rows(a.ln2.at(l), a.full, BT, C);
        const bool dense = layout_.has(P.up_w, l);
        if (dense && options_.recompute == Recompute::None && !widths_.swiglu) {
            // GPT-2's GELU in the product's epilogue (SwiGLU pairs two columns: its own kernel)
            PhaseScope phase(timer_, matmul_phase(FP8_FC, false), s);
            linear_forward(a, l, FP8_FC, a.fch_gelu.at(l), a.fch.at(l), ln2, param(P.up_w, l), param(P.up_b, l),
                           nullptr, BT, C, U);
        } else if (dense) {
            // the activation as its own kernel, so that backward's recomputation reproduces it bit for bit
            {
                PhaseScope phase(timer_, matmul_phase(FP8_FC, false), s);
                linear_forward(a, l, FP8_FC, a.fch.at(l), nullptr, ln2, param(P.up_w, l), param(P.up_b, l), nullptr,
                               BT, C, U);
            }
            mlp_activation(a, l, BT, for_backward ? nullptr : fp8_fused_amax(l, FP8_FCPROJ, FP8_INPUT));
        }
        if (for_backward) return;
        if (dense)
            row_parallel_forward(a, l, FP8_FCPROJ, a.residual3.at(l), a.fch_gelu.at(l), param(P.down_w, l),
                                 param(P.down_b, l), a.residual2.at(l), BT, H, C);
        if (!is_moe_layer(l)) return;
        PhaseScope phase(timer_, "experts", s);
        const int b = moe_index_[l];
        moe_summaries_[b] = moe_forward(matmul_, a.residual3.at(l), dense ? a.residual3.at(l) : a.residual2.at(l),
                                        moe_memory_.block(b), ln2, moe_weights(l), moe_shape(BT), pinned_moe_.get(), s,
                                        moe_exchange(b));
        const MoeSummary& m = moe_summaries_[b];
        if (!moe_training_) return;
        router_stats_.add_pass(m.balance_loss, m.z_loss, m.dropped, (long)BT * config_.moe_top_k, m.share);
        if (moe_exchange(b) && m.assignments() > 0)  // the busiest rank of the expert group, for the step line
            for (int rows : moe_exchanges_[b]->rows_out())
                router_stats_.max_rank_load = std::max(router_stats_.max_rank_load, (double)rows / m.assignments());
    }
    // Its backward on one rank: from dresidual = d(residual3[l]) to d(ln2[l]) in dC.
    void mlp_backward(const CudaActivationLayout& a, int l, int BT) {
        const int C = config_.channels, U = (int)widths_.up, H = (int)widths_.hidden;
        cudaStream_t s = stream_.get();
        using P = GPT2Params;
        const BlockTensors& t = tensors_;
        const bool dense = layout_.has(t.up_w, l);
        if (dense && !widths_.swiglu) {  // the MLP projection read fch_gelu, whose GELU (in its epilogue) came from fch
            linear_backward(a, l, FP8_FCPROJ, a.d4C, grad(t.down_w, l), grad(t.down_b, l), a.dresidual,
                            a.fch_gelu.at(l), param(t.down_w, l), a.fch.at(l), BT, H, C);
        } else if (dense) {  // SwiGLU's backward as its own kernel, from fch's gate and up halves
            linear_backward(a, l, FP8_FCPROJ, a.dhidden, grad(t.down_w, l), grad(t.down_b, l), a.dresidual,
                            a.fch_gelu.at(l), param(t.down_w, l), nullptr, BT, H, C);
            PhaseScope phase(timer_, "swiglu", s);
            swiglu_backward(a.d4C, a.dhidden, a.fch.at(l), BT, H, s);
        }
        if (dense)
            linear_backward(a, l, FP8_FC, a.dC, grad(t.up_w, l), grad(t.up_b, l), a.d4C, a.ln2.at(l),
                            param(t.up_w, l), nullptr, BT, C, U);
        if (!is_moe_layer(l)) return;
        PhaseScope phase(timer_, "experts", s);
        const int b = moe_index_[l];
        const MoeGradsF32 g{grad(P::ROUTERW, l), grad(P::EFCW, l), grad(P::EFCB, l), grad(P::EFCPROJW, l),
                            grad(P::EFCPROJB, l)};
        moe_backward(matmul_, a.dC, dense, g, moe_memory_.scratch(), a.dresidual, a.ln2.at(l), moe_memory_.block(b),
                     moe_summaries_[b], moe_weights(l), moe_shape(BT), options_.moe.balance_coef * moe_grad_scale_,
                     options_.moe.z_coef * moe_grad_scale_, s, moe_exchange(b));
    }

    // out = base + inp W^T + bias. One rank: one product with the bias and the residual in its
    // epilogue. Tensor parallel (W cut by input columns, inp this rank's columns of all BT rows): each
    // rank's product is a partial sum, reduced over the group (to this rank's rows under sequence
    // parallelism) before the bias and the residual (this rank's rows) are added.
    void row_parallel_forward(const CudaActivationLayout& a, int l, Fp8Product product, floatX* out,
                              const floatX* inp, const floatX* weight, const floatX* bias, const floatX* base, int BT,
                              int IC, int C) {
        cudaStream_t s = stream_.get();
        PhaseScope phase(timer_, matmul_phase(product, false), s);
        if (tp_.size == 1) {
            linear_forward(a, l, product, out, nullptr, inp, weight, bias, base, BT, IC, C);
            return;
        }
        matmul_forward(matmul_, a.partial, nullptr, inp, weight, nullptr, nullptr, BT, IC, C, s);
        tp_wait(reduce_rows(a.partial, out, BT, C));
        bias_residual_add(out, reduced(a.partial, out), bias, base, tp_.rows(BT), C, s);
    }

    // The phases a product's GPU time counts under (PhaseTimer; bench_train_step --profile times each
    // product forward and backward): "matmul <product>[ backward]", the lm head's too.
    static constexpr const char* LM_HEAD_PHASE = "matmul lm head";
    static constexpr const char* LM_HEAD_BACKWARD_PHASE = "matmul lm head backward";
    static const char* matmul_phase(Fp8Product product, bool backward) {
        static const char* names[2][FP8_PRODUCTS] = {
            {"matmul qkv", "matmul attproj", "matmul fc", "matmul fcproj"},
            {"matmul qkv backward", "matmul attproj backward", "matmul fc backward", "matmul fcproj backward"}};
        return names[backward][product];
    }

    // Where the kernel writing block l's product's operand measures its amax for the FP8 cast that
    // follows (Fp8LinearsCUDA::fused_amax), else null (bf16, or a product cut over tensor ranks).
    float* fp8_fused_amax(int l, Fp8Product product, Fp8Operand operand) {
        return tp_.size == 1 ? fp8_.fused_amax(l, product, operand) : nullptr;
    }

    // The same for the residual gradient a LayerNorm's backward leaves in dresidual when it is layer
    // l's fc projection's output gradient: a layer of the chunk with a dense MLP (its backward casts
    // it next, on this rank), else null.
    float* residual_grad_amax(int l, const PipelineChunk& ch) {
        if (l < ch.begin || l >= ch.end || !layout_.has(tensors_.down_w, l)) return nullptr;
        return fp8_fused_amax(l, FP8_FCPROJ, FP8_GRAD);
    }

    // Block l's product `product` (matmul_forward's arguments): in bf16, or in FP8 (--fp8).
    void linear_forward(const CudaActivationLayout& a, int l, Fp8Product product, floatX* out, floatX* pre_gelu,
                        const floatX* inp, const floatX* weight, const floatX* bias, const floatX* residual, int BT,
                        int C, int OC) {
        if (fp8_.enabled())
            fp8_.forward(matmul_, a.fp8, l, product, out, pre_gelu, inp, weight, bias, residual, BT, C, OC);
        else
            matmul_forward(matmul_, out, pre_gelu, inp, weight, bias, residual, BT, C, OC, stream_.get());
    }
    // Its backward (matmul_backward's arguments).
    void linear_backward(const CudaActivationLayout& a, int l, Fp8Product product, floatX* dinp, float* dweight,
                         float* dbias, const floatX* dout, const floatX* inp, const floatX* weight,
                         const floatX* pre_gelu, int BT, int C, int OC) {
        PhaseScope phase(timer_, matmul_phase(product, true), stream_.get());
        if (fp8_.enabled())
            fp8_.backward(matmul_, a.fp8, l, product, dinp, dweight, dbias, a.scratch, dout, inp, weight, pre_gelu, BT,
                          C, OC);
        else
            matmul_backward(matmul_, dinp, dweight, dbias, a.scratch, dout, inp, weight, pre_gelu, BT, C, OC,
                            stream_.get());
    }

    // Rebuilds what layer l's backward needs and the forward did not keep.
    void recompute_layer(const CudaActivationLayout& a, int l, int B, int T) {
        const int BT = B * T, n = tp_.rows(BT);
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        switch (options_.recompute) {
        case Recompute::None:
            return;
        case Recompute::Block:
            fp8_.set_recomputing(true);  // its casts were measured and counted in the forward
            layer_forward(a, l, B, T, true);
            fp8_.set_recomputing(false);
            return;
        case Recompute::GeluLayerNorm: {
            PhaseScope phase(timer_, "layernorm", s);
            const floatX* residual = layer_input(a, l, B * T);
            norm_recompute(a.ln1.at(l), residual, a.ln1_mean.at(l), a.ln1_rstd.at(l), P.norm1_w, P.norm1_b, l, n);
            norm_recompute(a.ln2.at(l), a.residual2.at(l), a.ln2_mean.at(l), a.ln2_rstd.at(l), P.norm2_w, P.norm2_b, l,
                           n);
        }
            [[fallthrough]];
        case Recompute::Gelu:
            if (!layout_.has(P.up_w, l)) return;  // experts only: they keep their own GELU output
            mlp_activation(a, l, BT, nullptr);
        }
    }

    // Backward of the Pass::Train forward of the same chunk and batch in slot `a`, which ran just
    // before where the chunk ends the model (it left dlnf in dC), else from the gradient of the
    // chunk's output, which the caller put into dresidual. Parameter gradients accumulate (+=), and
    // dresidual ends as the gradient of the chunk's input. Each bucket is handed to the engine
    // (grads_ready) as soon as its gradient is complete, so its communication overlaps the rest of
    // backward.
    void backward_chunk(const CudaActivationLayout& a, int chunk, const int* inputs, int B, int T,
                        bool last_micro_batch) {
        const PipelineChunk& ch = chunks_[chunk];
        const int C = config_.channels, BT = B * T, n = tp_.rows(BT);
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        // The embedding's and the final norm's buckets, where this stage holds them (a middle stage
        // holds neither, the first no final norm; the last GPT-2's tied embedding too).
        const int embedding = ch.embedding || (ch.head && P.tied()) ? layout_.bucket_of(P.wte) : -1;
        const int final_norm = ch.head ? layout_.bucket_of(P.normf_w) : -1;
        // The encoder's backward groups the batch's positions by token: on the host now, uploaded
        // while the layers' backward runs.
        if (ch.embedding)
            encoder_backward_.prepare(inputs, B, T, s, vocab_begin(), vocab_begin() + vocab_cols());
        buckets_.acquire_resident();  // a pipeline may have run other passes since this chunk's forward
        if (ch.head) {
            if (P.tied() && !ch.embedding) buckets_.grads_ready(embedding, last_micro_batch);  // the head's part of wte
            // (a Llama's lm_head shares the final norm's bucket, which the head's forward took)
            if (P.tied()) buckets_.take_grads(final_norm);
            CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, (size_t)n * C * sizeof(floatX), s));
            const floatX* dlnf = a.dC;
            if (tp_.size > 1) {  // each rank's dlnf is a partial sum over its vocabulary columns
                tp_wait(reduce_rows(a.dC, a.dln, BT, C));
                dlnf = reduced(a.dC, a.dln);
            }
            start_layernorm_grads(a);
            // dresidual becomes the last layer's fc projection's output gradient
            norm_backward(a, a.dresidual, layernorm_grad(a, P.normf_w, 0, 0), layernorm_grad(a, P.normf_b, 0, 1), dlnf,
                          chunk_output(a, ch, BT), P.normf_w, 0, a.lnf_mean, a.lnf_rstd, n,
                          residual_grad_amax(ch.end - 1, ch));
            finish_layernorm_grads(a, {{P.normf_w, 0}, {P.normf_b, 0}});
            buckets_.grads_ready(final_norm, last_micro_batch);
        }
        for (int l = ch.end - 1; l >= ch.begin; l--) {
            NvtxRange range("backward", l);
            buckets_.enter_layer(l, Walk::Backward, ch.begin, ch.end);
            recompute_layer(a, l, B, T);
            if (tp_.size == 1) layer_backward(a, ch, l, B, T);
            else layer_backward_tensor_parallel(a, l, B, T);
            buckets_.leave_layer(l, Walk::Backward, last_micro_batch);
        }
        if (ch.embedding) {
            // This rank's vocabulary rows of wte (prepare() kept only their positions); wpe whole,
            // from all rows' gradients (the same on every tensor-parallel rank).
            if (!(ch.head && P.tied())) buckets_.take_grads(embedding);
            const floatX* dresidual = gather_rows(a.dresidual, a.dfull, BT, C);
            PhaseScope phase(timer_, "encoder", s);
            encoder_backward_.backward(grad(P.wte), grad(P.wpe), dresidual, B, T, C, s, a.positions);
        }
        if (ch.embedding) buckets_.grads_ready(embedding, last_micro_batch);
        // Drain the compute stream first, so that what the engine then waits for is only the
        // communication backward did not hide (the step's exposed communication time).
        stream_.synchronize();
        engine_.finish_backward();
        release_all();
    }

    // One layer's backward on one rank, from dresidual = d(residual3[l]); l is a layer of chunk ch.
    void layer_backward(const CudaActivationLayout& a, const PipelineChunk& ch, int l, int B, int T) {
        const int C = config_.channels, NH = widths_.heads, HS = widths_.head_size, BT = B * T;
        const BlockTensors& P = tensors_;
        const floatX* residual = layer_input(a, l, B * T);
        mlp_backward(a, l, BT);  // dresidual is d(residual3[l]); dC becomes d(ln2[l])
        norm_backward(a, a.dresidual, grad(P.norm2_w, l), grad(P.norm2_b, l), a.dC, a.residual2.at(l), P.norm2_w, l,
                      a.ln2_mean.at(l), a.ln2_rstd.at(l), BT, fp8_fused_amax(l, FP8_ATTPROJ, FP8_GRAD));
        // dresidual is now d(residual2[l]); the attention projection read atty
        linear_backward(a, l, FP8_ATTPROJ, a.dC, grad(P.attproj_w, l), grad(P.attproj_b, l), a.dresidual,
                        a.atty.at(l), param(P.attproj_w, l), nullptr, BT, C, C);
        attention_layer_backward(a, l, B, T, NH, HS);  // d3C: the gradient of qkv (before RoPE)
        linear_backward(a, l, FP8_QKV, a.dC, grad(P.qkv_w, l), grad(P.qkv_b, l), a.d3C, a.ln1.at(l),
                        param(P.qkv_w, l), nullptr, BT, C, (int)widths_.qkv);
        norm_backward(a, a.dresidual, grad(P.norm1_w, l), grad(P.norm1_b, l), a.dC, residual, P.norm1_w, l,
                      a.ln1_mean.at(l), a.ln1_rstd.at(l), BT,
                      residual_grad_amax(l - 1, ch));  // dresidual becomes d(residual3[l - 1])
    }

    // One layer's backward under tensor parallelism, the mirror of layer_forward: each row-parallel
    // product's output gradient is gathered to all rows first (sequence parallel), each column-
    // parallel product's input gradient is a partial sum, reduced over the group. Each collective is
    // issued as early as its data allows and waited for as late as its reader allows:
    //   - ln2's rows are gathered beside dresidual's and travel during the MLP projection's backward;
    //   - fc's and qkv's input gradients are computed first, and reduced while their weight
    //     gradients are computed;
    //   - ln1's rows are gathered right after the LayerNorm's backward and travel during the
    //     attention projection's backward, the attention's backward and qkv's input gradient.
    // `full` holds ln2's rows, then ln1's: ln1's gather is issued after fc's weight gradient, the last
    // reader of ln2's, and the collective starts only after the kernels issued before it.
    void layer_backward_tensor_parallel(const CudaActivationLayout& a, int l, int B, int T) {
        const int C = config_.channels, NH = widths_.heads, HS = widths_.head_size;
        const int Cl = C / tp_.size, BT = B * T, n = tp_.rows(BT);
        const int QKV = (int)widths_.qkv, U = (int)widths_.up, H = (int)widths_.hidden;
        cudaStream_t s = stream_.get();
        const BlockTensors& P = tensors_;
        const floatX* residual = layer_input(a, l, B * T);
        const floatX* dresidual = gathered(a.dresidual, a.dfull);  // all BT rows, once gathered
        start_layernorm_grads(a);
        // dresidual is d(residual3[l]); the MLP projection read fch_gelu, whose GELU (or SwiGLU) came from fch
        CommHandle dresidual_rows = gather_rows_async(a.dresidual, a.dfull, BT, C);
        CommHandle ln2_rows = gather_rows_async(a.ln2.at(l), a.full, BT, C);
        tp_wait(dresidual_rows);
        {
            PhaseScope phase(timer_, matmul_phase(FP8_FCPROJ, true), s);
            // GPT-2's GELU backward in the product's epilogue; SwiGLU's its own kernel after it
            matmul_backward(matmul_, widths_.swiglu ? a.dhidden : a.d4C, grad(P.down_w, l), grad(P.down_b, l),
                            a.scratch, dresidual, a.fch_gelu.at(l), param(P.down_w, l),
                            widths_.swiglu ? nullptr : a.fch.at(l), BT, H, C, s);
            if (widths_.swiglu) swiglu_backward(a.d4C, a.dhidden, a.fch.at(l), BT, H, s);
            matmul_backward(matmul_, a.dC, nullptr, nullptr, nullptr, a.d4C, nullptr, param(P.up_w, l), nullptr, BT,
                            C, U, s);
        }
        CommHandle dln2 = reduce_rows(a.dC, a.dln, BT, C);
        tp_wait(ln2_rows);
        {
            PhaseScope phase(timer_, matmul_phase(FP8_FC, true), s);
            matmul_backward(matmul_, nullptr, grad(P.up_w, l), grad(P.up_b, l), a.scratch, a.d4C,
                            gathered(a.ln2.at(l), a.full), nullptr, nullptr, BT, C, U, s);
        }
        tp_wait(dln2);
        norm_backward(a, a.dresidual, layernorm_grad(a, P.norm2_w, l, 0), layernorm_grad(a, P.norm2_b, l, 1),
                      reduced(a.dC, a.dln), a.residual2.at(l), P.norm2_w, l, a.ln2_mean.at(l), a.ln2_rstd.at(l), n);
        // dresidual is now d(residual2[l]); the attention projection read atty
        dresidual_rows = gather_rows_async(a.dresidual, a.dfull, BT, C);
        CommHandle ln1_rows = gather_rows_async(a.ln1.at(l), a.full, BT, C);
        tp_wait(dresidual_rows);
        {
            PhaseScope phase(timer_, matmul_phase(FP8_ATTPROJ, true), s);
            matmul_backward(matmul_, a.dC, grad(P.attproj_w, l), grad(P.attproj_b, l), a.scratch, dresidual,
                            a.atty.at(l), param(P.attproj_w, l), nullptr, BT, Cl, C, s);
        }
        attention_layer_backward(a, l, B, T, NH, HS);  // d3C: the gradient of this rank's qkv (before RoPE)
        {
            PhaseScope phase(timer_, matmul_phase(FP8_QKV, true), s);
            matmul_backward(matmul_, a.dC, nullptr, nullptr, nullptr, a.d3C, nullptr, param(P.qkv_w, l), nullptr, BT,
                            C, QKV, s);
        }
        CommHandle dln1 = reduce_rows(a.dC, a.dln, BT, C);
        tp_wait(ln1_rows);
        {
            PhaseScope phase(timer_, matmul_phase(FP8_QKV, true), s);
            matmul_backward(matmul_, nullptr, grad(P.qkv_w, l), grad(P.qkv_b, l), a.scratch, a.d3C,
                            gathered(a.ln1.at(l), a.full), nullptr, nullptr, BT, C, QKV, s);
        }
        tp_wait(dln1);
        norm_backward(a, a.dresidual, layernorm_grad(a, P.norm1_w, l, 2), layernorm_grad(a, P.norm1_b, l, 3),
                      reduced(a.dC, a.dln), residual, P.norm1_w, l, a.ln1_mean.at(l), a.ln1_rstd.at(l), n);
        finish_layernorm_grads(a, {{P.norm2_w, l}, {P.norm2_b, l}, {P.norm1_w, l}, {P.norm1_b, l}});
    }

    // ---- mixture of experts (kernels/moe.cuh) ----

    // One MoE block's expert-parallel exchange (moe.cuh's MoeExchange): the routes' counts over the
    // host group (ExpertExchange, as CPUModel's), the rows over the device group in bf16, and between
    // the order they arrive in and the experts' order a copy per block of rows, on the stream.
    class ExpertRows : public MoeExchange {
    public:
        ExpertRows(CUDAModel& model, int experts) : model_(model), experts_(experts) {}
        void plan(const MoeSummary& m) override { routes_.plan(model_.ep_host_, m.begin, experts_); }
        const std::vector<int>& local_begin() const override { return routes_.local_begin(); }
        const std::vector<int>& rows_out() const { return routes_.rows_out(); }
        void dispatch(const floatX* mine, floatX* theirs, int C, cudaStream_t stream) override {
            floatX* staging = model_.moe_memory_.scratch().staging;
            exchange(mine, routes_.rows_out(), staging, routes_.rows_in(), C);
            routes_.for_each_block([&](size_t source_row, size_t expert_row, size_t rows) {
                copy_rows(theirs + expert_row * C, staging + source_row * C, rows * C, stream);
            });
        }
        void give_back(const floatX* theirs, floatX* mine, int C, cudaStream_t stream) override {
            floatX* staging = model_.moe_memory_.scratch().staging;
            routes_.for_each_block([&](size_t source_row, size_t expert_row, size_t rows) {
                copy_rows(staging + source_row * C, theirs + expert_row * C, rows * C, stream);
            });
            exchange(staging, routes_.rows_in(), mine, routes_.rows_out(), C);
        }

    private:
        static void copy_rows(floatX* to, const floatX* from, size_t count, cudaStream_t stream) {
            CUDA_CHECK(cudaMemcpyAsync(to, from, count * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
        }
        void exchange(const floatX* send, const std::vector<int>& rows_send, floatX* recv,
                      const std::vector<int>& rows_recv, int C) {
            std::vector<size_t> send_counts(rows_send.size()), recv_counts(rows_recv.size());
            for (size_t q = 0; q < rows_send.size(); q++)
                send_counts[q] = (size_t)rows_send[q] * C, recv_counts[q] = (size_t)rows_recv[q] * C;
            model_.before_messages(model_.ep_comm_);
            model_.wait(model_.ep_comm_.all_to_all_v(send, send_counts.data(), recv, recv_counts.data(),
                                                     CommDtype::BF16));
        }
        CUDAModel& model_;
        int experts_;
        ExpertExchange routes_;
    };
    MoeExchange* moe_exchange(int block) { return moe_exchanges_.empty() ? nullptr : moe_exchanges_[block].get(); }

    // The expert group's communicators agree with each other and with the model.
    void check_expert_group(const ExpertParallelGroup& ep) {
        if (!ep.host || !ep.expert_data)
            fail("CUDAModel: an expert group needs its host communicator and its expert data group");
        if (!ep_comm_.uses_device_buffers() || !expert_data_.uses_device_buffers())
            fail("CUDAModel: the expert group's rows and the expert data group's buckets need device communicators");
        if (ep_host_.world_size() != ep_comm_.world_size() || ep_host_.rank() != ep_comm_.rank())
            fail(strformat("CUDAModel: the expert group's host communicator is rank %d of %d, its device one %d of %d",
                           ep_host_.rank(), ep_host_.world_size(), ep_comm_.rank(), ep_comm_.world_size()));
        if (config_.num_experts == 0 || config_.num_experts % ep_comm_.world_size() != 0)
            fail(strformat("CUDAModel: %d experts cannot be split over an expert group of %d ranks", config_.num_experts,
                           ep_comm_.world_size()));
        engine_.set_expert_parallel(expert_data_, ep_host_);
    }

    static int moe_blocks(const ModelConfig& c) {
        int blocks = 0;
        for (int l = 0; l < c.num_layers; l++) blocks += c.is_moe_layer(l);
        return blocks;
    }
    static cpu::MoeShape moe_shape_of(const ModelConfig& c, int rows, const CUDAModelOptions& o) {
        return {rows, c.channels, 4 * c.channels, c.num_experts, c.moe_top_k, o.moe.capacity_factor};
    }
    cpu::MoeShape moe_shape(int BT) const { return moe_shape_of(config_, BT, options_); }
    bool is_moe_layer(int l) const { return config_.is_moe_layer(layout_.global_layer(l)); }
    MoeWeightsBf16 moe_weights(int l) const {
        using P = GPT2Params;
        return {param(P::ROUTERW, l), param(P::EFCW, l), param(P::EFCB, l), param(P::EFCPROJW, l),
                param(P::EFCPROJB, l)};
    }
    // The MoE blocks' memory (moe_bytes), numbered in layer order.
    void allocate_experts() {
        if (tp_.size > 1 || stage_.pipelined || cp_.size > 1)
            fail(strformat("CUDAModel: a mixture-of-experts model (%d experts) runs with data parallelism only on "
                           "CUDA, not --tp %d / --pp %d / --cp %d",
                           config_.num_experts, tp_.size, pp_host_.world_size(), cp_.size));
        const int ep = ep_comm_.world_size();
        moe_acts_.allocate(moe_bytes(config_, max_B_, max_T_, options_, ep), "expert activations");
        moe_memory_ = MoeMemory(moe_shape(max_B_ * max_T_), moe_blocks(config_), moe_acts_.get(), ep);
        pinned_moe_ = PinnedBuffer<int>(moe_summary_words(config_.num_experts), "routing summary download");
        moe_index_.assign(layout_.num_layers(), -1);
        int blocks = 0;
        for (int l = 0; l < layout_.num_layers(); l++)
            if (is_moe_layer(l)) moe_index_[l] = blocks++;
        moe_summaries_.resize(blocks);
        if (ep > 1)
            for (int b = 0; b < blocks; b++) moe_exchanges_.push_back(std::make_unique<ExpertRows>(*this, config_.num_experts));
        own_activation_bytes_ += moe_acts_.bytes();
    }
    // ---- tensor parallelism: the collectives of the tensor-parallel group ----
    // Each starts once the compute stream's work issued before it is done (after_compute); the host
    // waits on its handle (tp_wait) before issuing the kernels that read its result.

    // This rank's vocabulary slice: its first row of wte, its width and how many of it are real tokens.
    int vocab_cols() const { return config_.padded_vocab_size / tp_.size; }
    int vocab_begin() const { return tp_.rank * vocab_cols(); }
    int vocab_real() const { return std::clamp(config_.vocab_size - vocab_begin(), 0, vocab_cols()); }

    template <typename Issue>
    CommHandle after_compute(Issue issue) {
        before_messages(tp_comm_);
        return issue();
    }
    void tp_wait(CommHandle h) {
        h.wait();
        tp_exposed_ms_ += h.wait_ms();
    }
    // All BT rows of a (rows x C) tensor this rank holds its n rows of, gathered into `full` under
    // sequence parallelism (else there is nothing to gather: every rank holds all rows).
    CommHandle gather_rows_async(const floatX* mine, floatX* full, int BT, int C) {
        if (!tp_.sequence_parallel) return {};
        return after_compute(
            [&] { return tp_comm_.all_gather(mine, full, (size_t)tp_.rows(BT) * C, CommDtype::BF16); });
    }
    const floatX* gathered(const floatX* mine, const floatX* full) const {
        return tp_.sequence_parallel ? full : mine;
    }
    const floatX* gather_rows(const floatX* mine, floatX* full, int BT, int C) {
        tp_wait(gather_rows_async(mine, full, BT, C));
        return gathered(mine, full);
    }
    // Sums the group's partial products (BT rows of C): reduce-scattered into this rank's rows `mine`
    // under sequence parallelism, else all-reduced in place; reduced() says where the sum is.
    CommHandle reduce_rows(floatX* partial, floatX* mine, int BT, int C) {
        return after_compute([&] {
            if (tp_.sequence_parallel)
                return tp_comm_.reduce_scatter_sum(partial, mine, (size_t)tp_.rows(BT) * C, CommDtype::BF16);
            return tp_comm_.all_reduce_sum(partial, (size_t)BT * C, CommDtype::BF16);
        });
    }
    floatX* reduced(floatX* partial, floatX* mine) const { return tp_.sequence_parallel ? mine : partial; }

    // Where a layer's LayerNorm weight gradients accumulate: straight into the gradient buffer, or,
    // under sequence parallelism (each rank saw only its rows, so each holds a partial sum), into a
    // scratch that finish_layernorm_grads sums over the group and adds in.
    float* layernorm_grad(const CudaActivationLayout& a, int tensor, int layer, int slot) {
        if (tensor < 0) return nullptr;  // RMSNorm's bias
        return tp_.sequence_parallel ? a.dln_weights + (size_t)slot * config_.channels : grad(tensor, layer);
    }
    void start_layernorm_grads(const CudaActivationLayout& a) {
        if (tp_.sequence_parallel)
            CUDA_CHECK(cudaMemsetAsync(a.dln_weights, 0, 4 * (size_t)config_.channels * sizeof(float), stream_.get()));
    }
    void finish_layernorm_grads(const CudaActivationLayout& a, std::initializer_list<std::pair<int, int>> tensors) {
        if (!tp_.sequence_parallel) return;
        const size_t C = config_.channels;
        tp_wait(after_compute(
            [&] { return tp_comm_.all_reduce_sum(a.dln_weights, tensors.size() * C, CommDtype::F32); }));
        int slot = 0;
        for (auto [tensor, layer] : tensors) {
            const float* sum = a.dln_weights + slot++ * C;
            if (tensor >= 0) add_into(grad(tensor, layer), sum, C, stream_.get());
        }
    }

    // The mean of the last forward's BT row losses (group_mean).
    float mean_loss(int BT) {
        const CudaActivationLayout a = activations(last_B_, last_T_, 0);
        CUDA_CHECK(cudaMemcpyAsync(pinned_losses_.get(), a.row_loss, BT * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_.get()));
        stream_.synchronize();
        return group_mean(pinned_losses_.get(), BT);
    }
    // The mean of a micro-batch's BT row losses, summed on the host in row order; under context
    // parallelism the sums of the group's ranks are added (in rank order: the same bits on every
    // rank) and divided by all their rows.
    float group_mean(const float* row_losses, int BT) {
        if (cp_.size == 1) return mean_of(row_losses, BT);
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += row_losses[r];
        return (float)(sum_over_ranks(cp_host_, total) / ((double)BT * cp_.size));
    }
    static float mean_of(const float* row_losses, int BT) {
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += row_losses[r];
        return (float)(total / BT);
    }

    // ---- context parallelism: this rank's positions, and ring attention (context_parallel.h) ----

    LocalBatch local_batch(const int* inputs, const int* targets, int sequences, int T) {
        return batcher_.take(cp_, inputs, targets, sequences, T);
    }

    // Layer l's attention over this rank's NH heads: the plain kernel, or the ring over the context group.
    // A Llama's grouped kv heads are read by the kernels where they are (AttentionHeads, kernels/attention_tiles.cuh).
    void attention_layer_forward(const CudaActivationLayout& a, int l, int B, int T, int NH, int HS) {
        PhaseScope phase(timer_, "attention", stream_.get());
        const int KVH = widths_.kv_heads;
        if (cp_.size == 1)
            attention_forward(a.atty.at(l), a.lse.at(l), a.qkv.at(l), B, T, NH, KVH, HS, stream_.get(),
                              fp8_fused_amax(l, FP8_ATTPROJ, FP8_INPUT));
        else
            ring_.forward(a.atty.at(l), a.lse.at(l), a.qkv.at(l), ring_buffers(a), B, T, NH, KVH, HS, stream_.get());
    }
    // Its backward, into a.d3C from the output's gradient in a.dC (each kv head's dk and dv summed over
    // its group by the kernels), so that d3C is the gradient of the qkv product's output: a Llama's q
    // and k gradients rotated back (RoPE's backward) by the kernels as they store them, or, around the
    // ring (whose pairs sum in fp32 first), by rope_backward after it.
    void attention_layer_backward(const CudaActivationLayout& a, int l, int B, int T, int NH, int HS) {
        PhaseScope phase(timer_, "attention", stream_.get());
        const int KVH = widths_.kv_heads;
        const float* rope = widths_.rotary ? a.rope : nullptr;
        if (cp_.size == 1) {
            attention_backward(a.d3C, a.scratch, a.dC, a.qkv.at(l), a.atty.at(l), a.lse.at(l), B, T, NH, KVH, HS,
                               stream_.get(), fp8_fused_amax(l, FP8_QKV, FP8_GRAD), rope);
        } else {
            ring_.backward(a.d3C, a.dC, a.qkv.at(l), a.atty.at(l), a.lse.at(l), ring_buffers(a), B, T, NH, KVH, HS,
                           stream_.get());
            if (rope) rope_backward(a.d3C, rope, B, T, NH, KVH, HS, stream_.get());
        }
    }

    // The ring's buffers in the activation layout (models/cuda/ring_attention.cuh).
    static RingBuffers ring_buffers(const CudaActivationLayout& a) {
        return {a.ring_kv, a.pair_out, a.pair_lse, a.ring_acc, a.ring_dkv, a.scratch};
    }

    // ---- pipeline parallelism: this rank's part of a step (pipeline_stage.h runs the schedule) ----

    // A chunk's input in the slot (the embedding's output, or what the previous stage sent), and its
    // output: the residual stream after its last layer (this rank's rows of both).
    floatX* chunk_input(const CudaActivationLayout& a, int chunk, int BT) const {
        return a.encoded + (size_t)chunk * tp_.rows(BT) * config_.channels;
    }
    floatX* chunk_output(const CudaActivationLayout& a, const PipelineChunk& ch, int /*BT*/) const {
        return a.residual3.at(ch.end - 1);
    }
    // Layer l's input: its chunk's input where it is the chunk's first layer, else the previous layer's output.
    const floatX* layer_input(const CudaActivationLayout& a, int l, int BT) const {
        for (int c = 0; c < (int)chunks_.size(); c++)
            if (chunks_[c].begin == l) return chunk_input(a, c, BT);
        return a.residual3.at(l - 1);
    }
    size_t message_bytes(int BT) const { return (size_t)tp_.rows(BT) * config_.channels * sizeof(floatX); }

    PipelineBatch step_;  // the step under way, for the PipelineStage calls below

    // PipelineStage: the passes and buffers of the step under way. Each forward through the head
    // leaves its micro-batch's row losses on their way to the host (pinned_losses_, one block per
    // micro-batch), summed once the step's work is done.
    double pipeline_forward(int chunk, int mb, int slot) override {
        const int BT = step_.rows();
        const size_t at = (size_t)mb * BT;
        const CudaActivationLayout a = activations(step_.B, step_.T, slot);
        forward_chunk(a, chunk, step_.inputs_of(mb), step_.targets_of(mb), step_.B, step_.T, Pass::Train,
                      step_.grad_scale);
        if (chunks_[chunk].head)
            CUDA_CHECK(cudaMemcpyAsync(pinned_losses_.get() + at, a.row_loss, BT * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_.get()));
        return 0.0;
    }
    void pipeline_backward(int chunk, int mb, int slot, bool last_micro_batch) override {
        backward_chunk(activations(step_.B, step_.T, slot), chunk, step_.inputs_of(mb),
                       step_.B, step_.T, last_micro_batch);
    }
    void* chunk_input(int chunk, int slot) override {
        return chunk_input(activations(step_.B, step_.T, slot), chunk, step_.rows());
    }
    void* chunk_output(int chunk, int slot) override {
        return chunk_output(activations(step_.B, step_.T, slot), chunks_[chunk], step_.rows());
    }
    void* residual_grad() override { return activations(step_.B, step_.T, 0).dresidual; }
    void* message_buffer(int which) override {
        const CudaActivationLayout a = activations(step_.B, step_.T, 0);
        return which == 0 ? a.recv : a.send_grad + (size_t)(which - 1) * tp_.rows(step_.rows()) * config_.channels;
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
    }
    void add(float* into, const float* from, size_t count) override { add_into(into, from, count, stream_.get()); }
    void before_messages(Communicator& comm) override {
        CUDA_CHECK(cudaEventRecord(comm_ready_.get(), stream_.get()));
        comm.order_after(comm_ready_.get());
    }
    void wait(CommHandle h) override {
        h.wait();
        tp_exposed_ms_ += h.wait_ms();  // the pipeline's waits count as exposed communication
    }

    // A forward pass through every virtual stage in order, one micro-batch, stage after stage: what
    // evaluation and sampling run (Pass::Evaluate or LastLogits). Returns the mean loss on every rank
    // (Evaluate).
    float forward_through_stages(const int* inputs, const int* targets, int B, int T, Pass pass,
                                 int logits_row = -1) {
        const CudaActivationLayout a = activations(B, T, 0);
        auto forward = [&](int chunk) {
            forward_chunk(a, chunk, inputs, targets, B, T, pass, 0.0f, logits_row);
            return chunks_[chunk].head && pass == Pass::Evaluate ? mean_loss(B * T) : 0.0f;
        };
        if (!stage_.pipelined) return forward(0);
        step_ = {inputs, targets, B, T, 0.0f};
        float loss = (float)run_pipeline_forward(*this, pipe_.split, pp_host_.rank(), message_bytes(B * T), links_,
                                                 forward);
        wait(pp_host_.broadcast(&loss, sizeof(loss), pipe_.split.last_rank()));
        return loss;
    }

    // One step of a pipeline-parallel model (run_pipeline_step): returns the sum of the micro-batch
    // losses, computed by the last stage and broadcast to the others. Then the tied embedding's two
    // copies, the first stage's and the last's, each holding a part of its gradient, both get the
    // sum, so both take the same AdamW update and stay equal.
    double run_schedule(const int* inputs, const int* targets, int m, int B, int T, float grad_scale) {
        if (m > pipe_.micro_batches)
            fail(strformat("CUDAModel: a step of %d micro-batches, but the model was made for %d "
                           "(PipelineParallel::micro_batches)", m, pipe_.micro_batches));
        step_ = {inputs, targets, B, T, grad_scale};
        const int rank = pp_host_.rank(), BT = B * T;
        run_pipeline_step(*this, pipe_.split, rank, m, stage_.slots, message_bytes(BT), links_);
        stream_.synchronize();
        double loss_sum = 0.0;
        if (stage_.head)
            for (int mb = 0; mb < m; mb++) loss_sum += group_mean(pinned_losses_.get() + (size_t)mb * BT, BT);
        wait(pp_host_.broadcast(&loss_sum, sizeof(loss_sum), pipe_.split.last_rank()));
        if (const int peer = pipe_.split.tied_embedding_peer(rank); peer >= 0 && tensors_.tied()) {
            size_t count = 0;
            float* mine = engine_.update_grads(layout_.bucket_of(tensors_.wte), &count);
            sum_with_peer(*this, pp_comm_, mine, count, peer, reinterpret_cast<float*>(acts_.get()),
                          acts_.bytes() / sizeof(float), pp_host_);
        }
        return loss_sum;
    }

    // Declaration order is construction order: the stream and communicators before the memory
    // and the engine that use them.
    ModelConfig config_;
    TpShape tp_;
    Communicator& pp_host_;  // the pipeline group: host buffers
    PipelineParallel pipe_;
    StageShape stage_;
    std::vector<PipelineChunk> chunks_;  // this rank's chunks of layers, in virtual-stage order
    ParamLayout layout_;  // this rank's piece (the whole model without tensor or pipeline parallelism)
    ParamLayout whole_layout_{model_param_table(config_)};
    BlockTensors tensors_ = block_tensors(config_);  // which tensor plays each part of a block (family.h)
    BlockWidths widths_{config_, tp_.size};          // this rank's widths of a block's activations
    int max_B_, max_T_;
    CUDAModelOptions options_;
    int last_B_ = 1, last_T_ = 1;
    CudaStream stream_;
    Communicator& host_;
    StagedComm staged_local_{local_communicator()};  // the communicator of one rank without a launcher
    Communicator& comm_;
    Communicator& whole_;  // the whole data x context group: comm_, or the shard groups together
    Communicator& tp_host_;  // the tensor-parallel group: host buffers
    Communicator& tp_comm_;  // the tensor-parallel group: device buffers
    Communicator& pp_comm_;  // the pipeline group: device buffers
    Communicator& cp_host_;  // the context group: host buffers
    Communicator& cp_comm_;  // the context group: device buffers (ring attention)
    ContextSplit cp_;        // this rank's positions of the batch under way
    CudaRingAttention ring_{cp_comm_, cp_};  // attention around the context group (--cp)
    Communicator& ep_host_;  // the expert group: host buffers (the routes' counts)
    Communicator& ep_comm_;  // the expert group: device buffers (the rows)
    Communicator& expert_data_;  // the data-parallel ranks with this rank's experts: device buffers
    LocalBatcher batcher_;   // local_batch's
    PipelineLinks links_;    // the stages' messages: on pp_comm_ and splits of it
    CudaEvent comm_ready_;   // recorded before communication that reads or writes what compute did
    CudaEvent tokens_uploaded_;  // the last upload has left pinned_tokens_
    double tp_exposed_ms_ = 0;
    DeviceMemory memory_;
    ZeroEngine<DeviceMemory> engine_;
    BucketView<DeviceMemory> buckets_{layout_, engine_};  // the buckets acquired for the pass under way
    using Walk = BucketView<DeviceMemory>::Direction;
    MatmulContext matmul_;
    EncoderBackward encoder_backward_;
    PhaseTimer timer_;
    DeviceBuffer<char> acts_;
    Fp8LinearsCUDA fp8_;  // the blocks' FP8 products and scales (--fp8; inert otherwise)
    PinnedBuffer<int> pinned_tokens_;
    PinnedBuffer<float> pinned_losses_;
    PinnedBuffer<floatX> pinned_logits_;
    size_t own_activation_bytes_ = 0;  // activations, encoder index, cuBLASLt workspace and split-K
                                       // partials, norm scratch, expert activations
    DeviceBuffer<char> moe_acts_;      // the MoE blocks' routing and expert activations (moe_memory_)
    MoeMemory moe_memory_;
    PinnedBuffer<int> pinned_moe_;     // a routing's summary on its way to the host
    std::vector<int> moe_index_;       // per local layer: its MoE block's number (-1: none)
    std::vector<MoeSummary> moe_summaries_;  // per MoE block: its last forward's routing
    std::vector<std::unique_ptr<ExpertRows>> moe_exchanges_;  // per MoE block, under expert parallelism
    float moe_grad_scale_ = 1.0f;      // the training forward's grad_scale, for the auxiliary losses
    bool moe_training_ = false;        // the forward under way is a training pass
    RouterStats router_stats_;         // since the last take_router_stats
};

}  // namespace llmc
