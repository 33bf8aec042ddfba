// gpt2_cuda.cuh: GPT2CUDA, the product's model: GPT-2 training on GPUs in bf16 with llmc's own
// kernels, behind the same Model interface as the fp32 CPU reference (gpt2_cpu.h).
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
// Determinism: every kernel reduces in a fixed order and cuBLASLt runs one cached algorithm per
// shape, so two runs with the same seed and config produce bitwise identical losses.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/encoder.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/kernels/nvtx.cuh"
#include "llmc/model.h"
#include "llmc/models/gpt2/model_file.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/kernels/phase_timer.cuh"
#include "llmc/dist/zero.h"
#include "llmc/dist/device_memory.cuh"
#include "llmc/dist/staged_comm.cuh"

namespace llmc {

enum class Recompute { None = 0, Gelu = 1, GeluLayerNorm = 2, Block = 3 };

struct GPT2CUDAOptions {
    Recompute recompute = Recompute::None;
    int classifier_chunk_rows = 8192;  // logits rows computed at once (8192 x 50304 bf16 = 786 MiB)
};

// A per-layer activation: L slices back to back, or, when backward recomputes it, one slice that
// every layer reuses (layer_stride 0).
template <typename T>
struct LayerTensor {
    T* base = nullptr;
    size_t layer_stride = 0;
    T* at(int layer) const { return base + (size_t)layer * layer_stride; }
};

// Where each activation lives in the activation allocation for a call with B x T tokens. Sizes
// grow with B and T, so any B <= max_B, T <= max_T fits in the allocation made for max_B x max_T.
struct CudaActivationLayout {
    floatX* encoded;                                     // (BT, C): layer 0's input
    LayerTensor<floatX> residual2, residual3;            // (BT, C) after attention, after the MLP
    LayerTensor<floatX> ln1, qkv, atty, ln2, fch, fch_gelu;
    LayerTensor<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
    floatX* lnf;
    float *lnf_mean, *lnf_rstd;
    floatX* logits;                                      // (chunk rows, Vp); dlogits in place
    float* row_loss;                                     // (BT)
    int *inputs, *targets;                               // (BT) token ids on the device
    floatX *dresidual, *dC, *d3C, *d4C;                  // backward: residual-stream and layer gradients
    float* scratch;                                      // kernel scratch (bias/LN partials, attention D)

    size_t total_bytes = 0;

    static size_t bytes_for(const ModelConfig& c, int B, int T, const GPT2CUDAOptions& o) {
        return CudaActivationLayout(c, B, T, o, nullptr).total_bytes;
    }

    // Assigns consecutive 256-byte aligned slices of `base`; with nullptr only total_bytes is set.
    CudaActivationLayout(const ModelConfig& c, int B, int T, const GPT2CUDAOptions& o, char* base) {
        const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads;
        const size_t Vp = c.padded_vocab_size;
        const int r = (int)o.recompute;
        auto take = [&](auto*& p, size_t count) {
            using T_ = std::remove_reference_t<decltype(*p)>;
            p = base ? reinterpret_cast<T_*>(base + total_bytes) : nullptr;
            total_bytes += (count * sizeof(T_) + 255) / 256 * 256;
        };
        // kept: L slices; recomputed in backward: one. Every slice starts on a 256-byte boundary, so
        // a layer's tensors are aligned alike whatever the setting (cuBLASLt picks its algorithm by
        // alignment, and recomputation must not change which one runs).
        auto layered = [&](auto& t, size_t per_layer, bool kept) {
            constexpr size_t per_256_bytes = 256 / sizeof(*t.base);
            const size_t stride = (per_layer + per_256_bytes - 1) / per_256_bytes * per_256_bytes;
            take(t.base, kept ? L * stride : stride);
            t.layer_stride = kept ? stride : 0;
        };
        take(encoded, BT * C);
        layered(residual3, BT * C, true);
        layered(residual2, BT * C, r < 3);
        layered(ln1, BT * C, r < 2);
        layered(ln1_mean, BT, r < 3);
        layered(ln1_rstd, BT, r < 3);
        layered(qkv, BT * 3 * C, r < 3);
        layered(atty, BT * C, r < 3);
        layered(lse, NH * BT, r < 3);
        layered(ln2, BT * C, r < 2);
        layered(ln2_mean, BT, r < 3);
        layered(ln2_rstd, BT, r < 3);
        layered(fch, BT * 4 * C, r < 3);
        layered(fch_gelu, BT * 4 * C, r < 1);
        take(lnf, BT * C);
        take(lnf_mean, BT);
        take(lnf_rstd, BT);
        take(logits, std::min(BT, (size_t)o.classifier_chunk_rows) * Vp);
        take(row_loss, BT);
        take(inputs, BT);
        take(targets, BT);
        take(dresidual, BT * C);
        take(dC, BT * C);
        take(d3C, BT * 3 * C);
        take(d4C, BT * 4 * C);
        size_t scratch_floats = std::max({matmul_backward_scratch_floats((int)BT, 4 * (int)C),
                                          matmul_backward_scratch_floats((int)BT, 3 * (int)C),
                                          matmul_backward_scratch_floats((int)BT, (int)C),
                                          layernorm_backward_scratch_floats((int)BT, (int)C),
                                          attention_backward_scratch_floats(B, T, (int)NH)});
        take(scratch, scratch_floats);
    }
};

// Where a GPT2CUDA's gradients and parameters are communicated, and how they are sharded.
struct DataParallel {
    Communicator* comm = nullptr;  // device buffers (NcclComm, StagedComm); nullptr: one rank, no launcher
    Communicator* host = nullptr;  // host buffers, for scalars (the gradient norm); nullptr: the local one
    int zero_stage = 0;
};

class GPT2CUDA : public Model {
public:
    // Each slice of a ZeRO shard is a multiple of 8 elements, so every tensor stays 16-byte aligned.
    // One rank has nothing to shard: it runs ZeRO-0 whatever the stage asked for, which saves the
    // copies a sharded stage would make between its full and shard buffers.
    static constexpr size_t SHARD_ALIGN = 8;
    static int effective_stage(int stage, int world_size) { return world_size == 1 ? 0 : stage; }
    static ZeroPlan zero_plan(const ModelConfig& c, int stage, int rank, int world_size) {
        return ZeroPlan(GPT2Params::layout(c), effective_stage(stage, world_size), rank, world_size, SHARD_ALIGN);
    }

    // The communicators in `dp` must outlive the model.
    GPT2CUDA(const ModelConfig& config, int max_B, int max_T, const GPT2CUDAOptions& options = {},
             const DataParallel& dp = {})
        : config_(validated(config)), layout_(GPT2Params::layout(config)), max_B_(max_B), max_T_(max_T), options_(options),
          host_(dp.host ? *dp.host : local_communicator()), comm_(dp.comm ? *dp.comm : staged_local_),
          memory_(stream_.get(), host_),
          engine_(layout_, zero_plan(config, dp.zero_stage, comm_.rank(), comm_.world_size()), comm_, memory_),
          encoder_backward_(max_B, max_T) {
        if (max_B < 1) fail(strformat("GPT2CUDA: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("GPT2CUDA: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        if (options.classifier_chunk_rows < 1)
            fail(strformat("GPT2CUDA: classifier_chunk_rows must be >= 1, got %d", options.classifier_chunk_rows));
        if (!comm_.uses_device_buffers())
            fail(strformat("GPT2CUDA: the %s communicator works on host buffers; wrap it in a StagedComm",
                           comm_.backend()));
        // The gradient norm of a sharded stage is summed over host_: it must span the same ranks.
        if (host_.world_size() != comm_.world_size() || host_.rank() != comm_.rank())
            fail(strformat("GPT2CUDA: the host communicator is rank %d of %d but the device one rank %d of %d",
                           host_.rank(), host_.world_size(), comm_.rank(), comm_.world_size()));
        acts_.allocate(CudaActivationLayout::bytes_for(config_, max_B, max_T, options_), "activations");
        pinned_tokens_ = PinnedBuffer<int>(2 * (size_t)max_B * max_T, "token upload");
        pinned_losses_ = PinnedBuffer<float>((size_t)max_B * max_T, "loss download");
        pinned_logits_ = PinnedBuffer<floatX>(config_.padded_vocab_size, "logits download");
        own_activation_bytes_ = acts_.bytes() + encoder_backward_.device_bytes() + matmul_.workspace_bytes() +
                                DeviceMemory::scratch_bytes();
    }

    // Everything the model allocates on the GPU for this config and plan (what --plan prints; the
    // constructor's allocations add up to the same bytes).
    static std::vector<BufferSpec> memory_specs(const ModelConfig& c, int max_B, int max_T, const GPT2CUDAOptions& o,
                                                const ZeroPlan& plan) {
        using K = MemoryKind;
        std::vector<BufferSpec> specs = buffer_specs(plan, DeviceMemory::precision);
        specs.push_back({"activations", K::Activations, CudaActivationLayout::bytes_for(c, max_B, max_T, o), 1});
        specs.push_back({"encoder backward index", K::Activations, EncoderBackward::device_bytes_for(max_B, max_T), 1});
        specs.push_back({"cuBLASLt workspace", K::Activations, MatmulContext::WORKSPACE_BYTES, 1});
        specs.push_back({"gradient norm scratch", K::Activations, DeviceMemory::scratch_bytes(), 1});
        return specs;
    }

    const ModelConfig& config() const override { return config_; }
    const ParamLayout& layout() const override { return layout_; }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are zeroed, the bf16 weights are the
    // master weights rounded to nearest. Every rank passes the same seed or file and keeps its shard.
    void init_random(uint64_t seed) override {
        std::vector<float> full(layout_.num_params);
        init_params(layout_, full.data(), seed);
        reset(full, (uint32_t)(seed ^ (seed >> 32)));
    }
    void load(const std::string& path) override {
        std::vector<float> full(layout_.num_params);
        read_model_file(path, config_, full.data());
        reset(full, 0x5eed1234u);
    }
    // Writes the fp32 master weights: they are the model; the bf16 weights are derived from them.
    // A collective (sharded master weights are gathered); rank 0 writes.
    void save(const std::string& path, bool bf16 = false) override {
        std::vector<float> full(layout_.num_params);
        get_master_weights(full.data());
        if (comm_.rank() == 0)
            write_model_file(path, config_, full.data(), bf16 ? MODEL_FILE_VERSION_BF16 : MODEL_FILE_VERSION_FP32);
    }
    // Sets the master weights from a full fp32 buffer (ParamLayout order) and resets the optimizer;
    // bf16 weights rounded to nearest. For tests that give this model and the CPU reference the same
    // weights.
    void set_master_weights(const float* full) {
        reset(std::vector<float>(full, full + layout_.num_params), memory_.sr_seed);
    }
    // The fp32 master weights in ParamLayout order (a collective where they are sharded).
    void get_master_weights(float* full) {
        engine_.get_params(full);
        memory_.release_transient();
    }
    // The fp32 gradients in ParamLayout order, for tests of an unsharded model (ZeRO-0).
    void get_grads(float* full) {
        const float* grads = engine_.full_grads();
        if (!grads || engine_.plan().shards_optimizer())
            fail("GPT2CUDA: get_grads needs the whole gradient on this rank (ZeRO-0)");
        for (const ZeroPlan::Bucket& k : engine_.plan().buckets)
            memory_.download(full + k.begin, grads + k.padded_begin, k.size);
    }

    void zero_grad() override { engine_.zero_grad(); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(config_, max_B_, max_T_, inputs, targets, B, T, "forward_backward");
        encoder_backward_.prepare(inputs, B, T, stream_.get());
        forward(inputs, targets, B, T, Pass::Train, grad_scale);
        backward(B, T, last_micro_batch);
        return mean_loss(B * T);
    }
    float evaluate(const int* inputs, const int* targets, int B, int T) override {
        check_batch(config_, max_B_, max_T_, inputs, targets, B, T, "evaluate");
        forward(inputs, targets, B, T, Pass::Evaluate, 0.0f);
        return mean_loss(B * T);
    }
    void next_token_logits(const int* tokens, int T, float* logits_out) override {
        check_batch(config_, max_B_, max_T_, tokens, nullptr, 1, T, "next_token_logits");
        forward(tokens, nullptr, 1, T, Pass::LastLogits, 0.0f);
        const CudaActivationLayout a = activations(1, T);
        const int Vp = config_.padded_vocab_size;
        CUDA_CHECK(cudaMemcpyAsync(pinned_logits_.get(), a.logits, Vp * sizeof(floatX), cudaMemcpyDeviceToHost,
                                   stream_.get()));
        stream_.synchronize();
        for (int i = 0; i < Vp; i++) logits_out[i] = __bfloat162float(pinned_logits_.get()[i]);
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
        engine_.adamw_step(opt, step, grad_multiplier);
    }

    double take_exposed_comm_ms() override { return engine_.take_exposed_comm_ms(); }
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
    static const ModelConfig& validated(const ModelConfig& c) {
        c.validate();
        if (c.channels % 8 != 0)
            fail(strformat("GPT2CUDA: channels (%d) must be a multiple of 8 (16-byte vector loads)", c.channels));
        if (c.padded_vocab_size % 8 != 0)
            fail(strformat("GPT2CUDA: padded_vocab_size (%d) must be a multiple of 8", c.padded_vocab_size));
        if (c.head_size() != 32 && c.head_size() != 64 && c.head_size() != 128)
            fail(strformat("GPT2CUDA: head size channels / num_heads = %d must be 32, 64 or 128 (the attention "
                           "kernels' instantiations)",
                           c.head_size()));
        return c;
    }


    CudaActivationLayout activations(int B, int T) const {
        CudaActivationLayout a(config_, B, T, options_, acts_.get());
        if (a.total_bytes > acts_.bytes())
            fail(strformat("GPT2CUDA: activations for B %d x T %d need %zu bytes, %zu allocated", B, T, a.total_bytes,
                           acts_.bytes()));
        return a;
    }

    void reset(const std::vector<float>& full, uint32_t sr_seed) {
        memory_.sr_seed = sr_seed;
        engine_.set_params(full.data());
        engine_.reset_optimizer();
        memory_.release_transient();
        stream_.synchronize();
    }

    // Parameters and gradients are reached only through the bucket view (zero.h), so the model
    // never knows how they are sharded.
    const floatX* param(int tensor, int layer = 0) const { return buckets_.param(tensor, layer); }
    float* grad(int tensor, int layer = 0) const { return buckets_.grad(tensor, layer); }
    void release_all() { buckets_.release_all(); }

    // Copies the batch to the device through pinned memory (the previous call has synchronised, so
    // the pinned buffer is free).
    void upload_tokens(const CudaActivationLayout& a, const int* inputs, const int* targets, int BT) {
        int* staged = pinned_tokens_.get();
        std::memcpy(staged, inputs, BT * sizeof(int));
        CUDA_CHECK(cudaMemcpyAsync(a.inputs, staged, BT * sizeof(int), cudaMemcpyHostToDevice, stream_.get()));
        if (targets) {
            std::memcpy(staged + BT, targets, BT * sizeof(int));
            CUDA_CHECK(
                cudaMemcpyAsync(a.targets, staged + BT, BT * sizeof(int), cudaMemcpyHostToDevice, stream_.get()));
        }
    }

    // What a forward pass leaves behind: per-row losses (Evaluate), losses plus dlnf and the lm head's
    // share of dwte, ready for backward() (Train), or only the last position's logits.
    enum class Pass { Evaluate, Train, LastLogits };

    void forward(const int* inputs, const int* targets, int B, int T, Pass pass, float grad_scale) {
        last_B_ = B;
        last_T_ = T;
        const CudaActivationLayout a = activations(B, T);
        const int C = config_.channels, L = config_.num_layers, V = config_.vocab_size;
        const int Vp = config_.padded_vocab_size, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = GPT2Params;
        upload_tokens(a, inputs, targets, BT);
        buckets_.acquire_resident();
        {
            PhaseScope phase(timer_, "encoder", s);
            encoder_forward(a.encoded, a.inputs, param(P::WTE), param(P::WPE), B, T, C, s);
        }
        for (int l = 0; l < L; l++) {
            NvtxRange range("forward", l);
            buckets_.enter_layer(l, Walk::Forward);
            layer_forward(a, l, B, T, false);
            buckets_.leave_layer(l, Walk::Forward);
        }
        const floatX* last_residual = a.residual3.at(L - 1);
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last_residual, param(P::LNFW), param(P::LNFB), BT, C, s);
        }
        if (pass == Pass::LastLogits) {
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_forward(matmul_, a.logits, nullptr, a.lnf + (size_t)(BT - 1) * C, param(P::WTE), nullptr,
                               nullptr, 1, C, Vp, s);
            }
            release_all();
            return;
        }
        const bool train = pass == Pass::Train;
        // The lm head's backward runs here, chunk by chunk, so the embedding gradient buffer is
        // taken now (under ZeRO-2 this zeroes a fresh one) and backward() adds the encoder's share.
        if (train) buckets_.take_grads(layout_.bucket_of(P::WTE));
        // The whole backward is linear in the loss gradient, so grad_scale enters once, here.
        const float dloss = grad_scale / BT;
        const int chunk = std::min(BT, options_.classifier_chunk_rows);
        for (int r0 = 0; r0 < BT; r0 += chunk) {
            const int rows = std::min(chunk, BT - r0);
            const floatX* lnf_rows = a.lnf + (size_t)r0 * C;
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_forward(matmul_, a.logits, nullptr, lnf_rows, param(P::WTE), nullptr, nullptr, rows, C, Vp, s);
            }
            {
                PhaseScope phase(timer_, "classifier", s);
                fused_classifier(a.logits, a.row_loss + r0, a.targets + r0, dloss, rows, V, Vp, train, s);
            }
            if (train) {
                PhaseScope phase(timer_, "matmul", s);
                // the lm head has no bias, so no bias-gradient scratch
                matmul_backward(matmul_, a.dC + (size_t)r0 * C, grad(P::WTE), nullptr, nullptr, a.logits, lnf_rows,
                                param(P::WTE), nullptr, rows, C, Vp, s);
            }
        }
        // Training keeps the embeddings and final norm for backward; an evaluation is done with them.
        if (!train) release_all();
    }

    // One transformer block's forward. `for_backward`: a whole-block recomputation, which stops
    // before the MLP projection (its output, the next residual, is kept and not needed again).
    void layer_forward(const CudaActivationLayout& a, int l, int B, int T, bool for_backward) {
        const int C = config_.channels, NH = config_.num_heads, HS = C / NH, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = GPT2Params;
        const floatX* residual = l == 0 ? a.encoded : a.residual3.at(l - 1);
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_forward(a.ln1.at(l), a.ln1_mean.at(l), a.ln1_rstd.at(l), residual, param(P::LN1W, l),
                              param(P::LN1B, l), BT, C, s);
        }
        {
            PhaseScope phase(timer_, "matmul", s);
            matmul_forward(matmul_, a.qkv.at(l), nullptr, a.ln1.at(l), param(P::QKVW, l), param(P::QKVB, l), nullptr,
                           BT, C, 3 * C, s);
        }
        {
            PhaseScope phase(timer_, "attention", s);
            attention_forward(a.atty.at(l), a.lse.at(l), a.qkv.at(l), B, T, NH, HS, s);
        }
        {
            PhaseScope phase(timer_, "matmul", s);
            matmul_forward(matmul_, a.residual2.at(l), nullptr, a.atty.at(l), param(P::ATTPROJW, l),
                           param(P::ATTPROJB, l), residual, BT, C, C, s);
        }
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_forward(a.ln2.at(l), a.ln2_mean.at(l), a.ln2_rstd.at(l), a.residual2.at(l), param(P::LN2W, l),
                              param(P::LN2B, l), BT, C, s);
        }
        if (options_.recompute == Recompute::None) {
            PhaseScope phase(timer_, "matmul", s);
            matmul_forward(matmul_, a.fch_gelu.at(l), a.fch.at(l), a.ln2.at(l), param(P::FCW, l), param(P::FCB, l),
                           nullptr, BT, C, 4 * C, s);
        } else {
            // GELU as its own kernel, so that backward's recomputation reproduces it bit for bit
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_forward(matmul_, a.fch.at(l), nullptr, a.ln2.at(l), param(P::FCW, l), param(P::FCB, l), nullptr,
                               BT, C, 4 * C, s);
            }
            PhaseScope phase(timer_, "gelu", s);
            gelu_forward(a.fch_gelu.at(l), a.fch.at(l), (size_t)BT * 4 * C, s);
        }
        if (for_backward) return;
        PhaseScope phase(timer_, "matmul", s);
        matmul_forward(matmul_, a.residual3.at(l), nullptr, a.fch_gelu.at(l), param(P::FCPROJW, l),
                       param(P::FCPROJB, l), a.residual2.at(l), BT, 4 * C, C, s);
    }

    // Rebuilds what layer l's backward needs and the forward did not keep.
    void recompute_layer(const CudaActivationLayout& a, int l, int B, int T) {
        const int C = config_.channels, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = GPT2Params;
        switch (options_.recompute) {
        case Recompute::None:
            return;
        case Recompute::Block:
            layer_forward(a, l, B, T, true);
            return;
        case Recompute::GeluLayerNorm: {
            PhaseScope phase(timer_, "layernorm", s);
            const floatX* residual = l == 0 ? a.encoded : a.residual3.at(l - 1);
            layernorm_recompute(a.ln1.at(l), residual, a.ln1_mean.at(l), a.ln1_rstd.at(l), param(P::LN1W, l),
                                param(P::LN1B, l), BT, C, s);
            layernorm_recompute(a.ln2.at(l), a.residual2.at(l), a.ln2_mean.at(l), a.ln2_rstd.at(l), param(P::LN2W, l),
                                param(P::LN2B, l), BT, C, s);
        }
            [[fallthrough]];
        case Recompute::Gelu: {
            PhaseScope phase(timer_, "gelu", s);
            gelu_forward(a.fch_gelu.at(l), a.fch.at(l), (size_t)BT * 4 * C, s);
        }
        }
    }

    // Backward of the Pass::Train forward that just ran on the same batch, from the dlnf it left in
    // dC. Parameter gradients accumulate (+=). Each bucket is handed to the engine (grads_ready) as
    // soon as its gradient is complete, so its communication overlaps the rest of backward.
    void backward(int B, int T, bool last_micro_batch) {
        const CudaActivationLayout a = activations(B, T);
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads, HS = C / NH, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = GPT2Params;
        const int embedding = layout_.bucket_of(P::WTE), final_norm = layout_.bucket_of(P::LNFW);
        buckets_.take_grads(final_norm);
        CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, (size_t)BT * C * sizeof(floatX), s));
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_backward(a.dresidual, grad(P::LNFW), grad(P::LNFB), a.scratch, a.dC, a.residual3.at(L - 1),
                               param(P::LNFW), a.lnf_mean, a.lnf_rstd, BT, C, s);
        }
        buckets_.grads_ready(final_norm, last_micro_batch);
        for (int l = L - 1; l >= 0; l--) {
            NvtxRange range("backward", l);
            buckets_.enter_layer(l, Walk::Backward);
            recompute_layer(a, l, B, T);
            const floatX* residual = l == 0 ? a.encoded : a.residual3.at(l - 1);
            // dresidual is d(residual3[l]); the MLP projection read fch_gelu, whose GELU came from fch
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_backward(matmul_, a.d4C, grad(P::FCPROJW, l), grad(P::FCPROJB, l), a.scratch, a.dresidual,
                                a.fch_gelu.at(l), param(P::FCPROJW, l), a.fch.at(l), BT, 4 * C, C, s);
                matmul_backward(matmul_, a.dC, grad(P::FCW, l), grad(P::FCB, l), a.scratch, a.d4C, a.ln2.at(l),
                                param(P::FCW, l), nullptr, BT, C, 4 * C, s);
            }
            {
                PhaseScope phase(timer_, "layernorm", s);
                layernorm_backward(a.dresidual, grad(P::LN2W, l), grad(P::LN2B, l), a.scratch, a.dC, a.residual2.at(l),
                                   param(P::LN2W, l), a.ln2_mean.at(l), a.ln2_rstd.at(l), BT, C, s);
            }
            // dresidual is now d(residual2[l]); the attention projection read atty
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_backward(matmul_, a.dC, grad(P::ATTPROJW, l), grad(P::ATTPROJB, l), a.scratch, a.dresidual,
                                a.atty.at(l), param(P::ATTPROJW, l), nullptr, BT, C, C, s);
            }
            {
                PhaseScope phase(timer_, "attention", s);
                attention_backward(a.d3C, a.scratch, a.dC, a.qkv.at(l), a.atty.at(l), a.lse.at(l), B, T, NH, HS, s);
            }
            {
                PhaseScope phase(timer_, "matmul", s);
                matmul_backward(matmul_, a.dC, grad(P::QKVW, l), grad(P::QKVB, l), a.scratch, a.d3C, a.ln1.at(l),
                                param(P::QKVW, l), nullptr, BT, C, 3 * C, s);
            }
            {
                PhaseScope phase(timer_, "layernorm", s);
                layernorm_backward(a.dresidual, grad(P::LN1W, l), grad(P::LN1B, l), a.scratch, a.dC, residual,
                                   param(P::LN1W, l), a.ln1_mean.at(l), a.ln1_rstd.at(l), BT, C, s);
            }
            buckets_.leave_layer(l, Walk::Backward, last_micro_batch);
        }
        {
            PhaseScope phase(timer_, "encoder", s);
            encoder_backward_.backward(grad(P::WTE), grad(P::WPE), a.dresidual, B, T, C, s);
        }
        buckets_.grads_ready(embedding, last_micro_batch);
        // Drain the compute stream first, so that what the engine then waits for is only the
        // communication backward did not hide (the step's exposed communication time).
        stream_.synchronize();
        engine_.finish_backward();
        release_all();
    }

    // The mean of the per-row losses of the last forward, summed on the host in row order.
    float mean_loss(int BT) {
        const CudaActivationLayout a = activations(last_B_, last_T_);
        CUDA_CHECK(cudaMemcpyAsync(pinned_losses_.get(), a.row_loss, BT * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_.get()));
        stream_.synchronize();
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += pinned_losses_.get()[r];
        return (float)(total / BT);
    }

    // Declaration order is construction order: the stream and communicators before the memory
    // and the engine that use them.
    ModelConfig config_;
    ParamLayout layout_;
    int max_B_, max_T_;
    GPT2CUDAOptions options_;
    int last_B_ = 1, last_T_ = 1;
    CudaStream stream_;
    Communicator& host_;
    StagedComm staged_local_{local_communicator()};  // the communicator of one rank without a launcher
    Communicator& comm_;
    DeviceMemory memory_;
    ZeroEngine<DeviceMemory> engine_;
    BucketView<DeviceMemory> buckets_{layout_, engine_};  // the buckets acquired for the pass under way
    using Walk = BucketView<DeviceMemory>::Direction;
    MatmulContext matmul_;
    EncoderBackward encoder_backward_;
    PhaseTimer timer_;
    DeviceBuffer<char> acts_;
    PinnedBuffer<int> pinned_tokens_;
    PinnedBuffer<float> pinned_losses_;
    PinnedBuffer<floatX> pinned_logits_;
    size_t own_activation_bytes_ = 0;  // activations, encoder index, cuBLASLt workspace, norm scratch
};

}  // namespace llmc
