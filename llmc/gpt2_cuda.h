// gpt2_cuda.h: GPT2CUDA, the product's model: GPT-2 training on one GPU in bf16 with llmc's own
// kernels, behind the same Model interface as the fp32 CPU reference (gpt2_cpu.h).
//
// Memory. The parameters live in flat buffers in ParamLayout's bucket-major order, the CPU
// reference's order, so model files and checkpoints are shared: bf16 weights (what the kernels
// read), fp32 master weights (what AdamW updates; the bf16 weights are stochastically rounded
// copies, unbiased, so updates far below a bf16 ulp still add up), fp32 gradients (accumulated
// across micro-batches without bf16 rounding) and fp32 AdamW moments. Activations are bf16, their
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
// Data parallelism (ZeRO-0): every rank keeps everything, and once the step's last micro-batch has
// finished a bucket's gradient (the final LayerNorm, each layer, then the embeddings), the bucket is
// all-reduced over the ranks. Over NCCL (device buffers) each bucket's all-reduce starts on the
// communicator's stream as soon as its gradient is done, overlapping the rest of backward. Over MPI
// (host buffers; several ranks may share one GPU) the whole gradient goes through pinned host
// memory after backward. Sharded stages (ZeRO-1..3) are not implemented for the CUDA model yet.
//
// Determinism: every kernel reduces in a fixed order and cuBLASLt runs one cached algorithm per
// shape, so two runs with the same seed and config produce bitwise identical losses.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "attention.cuh"
#include "classifier.cuh"
#include "cuda_common.h"
#include "encoder.cuh"
#include "gelu.cuh"
#include "global_norm.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "model.h"
#include "model_config.h"
#include "model_file.h"
#include "model_init.h"
#include "phase_timer.cuh"
#include "zero.h"

namespace llmc {

enum class Recompute { None = 0, Gelu = 1, GeluLayerNorm = 2, Block = 3 };

// How the gradients of data-parallel ranks are summed.
enum class GradSync { None, Device, HostStaged };
// A device communicator is used even for one rank (mpirun -np 1 --gpu-comm nccl), which runs the
// NCCL path end to end on a single GPU.
inline GradSync grad_sync_for(const Communicator* comm) {
    if (comm && comm->uses_device_buffers()) return GradSync::Device;
    return comm && comm->world_size() > 1 ? GradSync::HostStaged : GradSync::None;
}

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
    float* norm_partials;
    double* norm;

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
        take(norm_partials, global_norm_partials_count());
        take(norm, 1);
    }
};

class GPT2CUDA : public Model {
public:
    // grad_comm: the ranks gradients are summed over (ZeRO-0); nullptr or a world of one for one GPU.
    // It must outlive the model.
    GPT2CUDA(const ModelConfig& config, int max_B, int max_T, const GPT2CUDAOptions& options = {},
             Communicator* grad_comm = nullptr)
        : config_(validated(config)), layout_(config), max_B_(max_B), max_T_(max_T), options_(options),
          grad_comm_(grad_comm), grad_sync_(grad_sync_for(grad_comm)), encoder_backward_(max_B, max_T) {
        if (max_B < 1) fail(strformat("GPT2CUDA: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("GPT2CUDA: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        if (options.classifier_chunk_rows < 1)
            fail(strformat("GPT2CUDA: classifier_chunk_rows must be >= 1, got %d", options.classifier_chunk_rows));
        const size_t n = layout_.num_params;
        params_.allocate(n, "bf16 parameters");
        master_.allocate(n, "fp32 master weights");
        grads_.allocate(n, "fp32 gradients");
        m_.allocate(n, "AdamW m");
        v_.allocate(n, "AdamW v");
        acts_.allocate(CudaActivationLayout::bytes_for(config_, max_B, max_T, options_), "activations");
        pinned_tokens_ = PinnedBuffer<int>(2 * (size_t)max_B * max_T, "token upload");
        pinned_losses_ = PinnedBuffer<float>((size_t)max_B * max_T, "loss download");
        pinned_logits_ = PinnedBuffer<floatX>(config_.padded_vocab_size, "logits download");
        pinned_norm_ = PinnedBuffer<double>(1, "gradient norm download");
        add_allocation(MemoryKind::Parameters, params_.bytes());
        add_allocation(MemoryKind::MasterWeights, master_.bytes());
        add_allocation(MemoryKind::Gradients, grads_.bytes());
        add_allocation(MemoryKind::OptimizerState, m_.bytes() + v_.bytes());
        add_allocation(MemoryKind::Activations,
                       acts_.bytes() + encoder_backward_.device_bytes() + matmul_.workspace_bytes());
        if (grad_sync_ == GradSync::HostStaged) {
            staged_grads_ = PinnedBuffer<float>(n, "gradient staging for the MPI all-reduce");
            add_allocation(MemoryKind::CommBuffers, n * sizeof(float));
        }
    }

    // Everything the model allocates on the GPU for this config (what --plan prints; the
    // constructor's allocations add up to the same bytes).
    static std::vector<BufferSpec> memory_specs(const ModelConfig& c, int max_B, int max_T,
                                                const GPT2CUDAOptions& o, GradSync sync = GradSync::None) {
        using K = MemoryKind;
        const size_t n = ParamLayout(c).num_params;
        std::vector<BufferSpec> specs = {
            {"bf16 parameters", K::Parameters, n, sizeof(floatX)},
            {"fp32 master weights", K::MasterWeights, n, sizeof(float)},
            {"fp32 gradients", K::Gradients, n, sizeof(float)},
            {"AdamW m", K::OptimizerState, n, sizeof(float)},
            {"AdamW v", K::OptimizerState, n, sizeof(float)},
            {"activations", K::Activations, CudaActivationLayout::bytes_for(c, max_B, max_T, o), 1},
            {"encoder backward index", K::Activations, EncoderBackward::device_bytes_for(max_B, max_T), 1},
            {"cuBLASLt workspace", K::Activations, MatmulContext::WORKSPACE_BYTES, 1},
        };
        if (sync == GradSync::HostStaged)
            specs.push_back({"gradient staging (pinned host)", K::CommBuffers, n, sizeof(float)});
        return specs;
    }

    const ModelConfig& config() const override { return config_; }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are zeroed, the bf16 weights are the
    // master weights rounded to nearest.
    void init_random(uint64_t seed) override {
        std::vector<float> full(layout_.num_params);
        init_gpt2_params(config_, full.data(), seed);
        reset(full, (uint32_t)(seed ^ (seed >> 32)));
    }
    void load(const std::string& path) override {
        std::vector<float> full(layout_.num_params);
        read_model_file(path, config_, full.data());
        reset(full, 0x5eed1234u);
    }
    // Writes the fp32 master weights: they are the model; the bf16 weights are derived from them.
    // Every rank holds them all (ZeRO-0), so rank 0 writes and the others have nothing to do.
    void save(const std::string& path) override {
        if (grad_comm_ && grad_comm_->rank() != 0) return;
        std::vector<float> full(layout_.num_params);
        get_master_weights(full.data());
        write_model_file(path, config_, full.data());
    }
    // Sets the master weights from a full fp32 buffer (ParamLayout order); bf16 weights rounded to
    // nearest. For tests that give this model and the CPU reference the same weights.
    void set_master_weights(const float* full) { reset(std::vector<float>(full, full + layout_.num_params), sr_seed_); }
    void get_master_weights(float* full) {
        CUDA_CHECK(cudaMemcpyAsync(full, master_.get(), master_.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
        stream_.synchronize();
    }
    // The fp32 gradients (ParamLayout order), for tests.
    void get_grads(float* full) {
        CUDA_CHECK(cudaMemcpyAsync(full, grads_.get(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
        stream_.synchronize();
    }

    void zero_grad() override { CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_.get())); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(config_, max_B_, max_T_, inputs, targets, B, T, "forward_backward");
        encoder_backward_.prepare(inputs, B, T, stream_.get());
        forward(inputs, targets, B, T, Pass::Train, grad_scale);
        backward(B, T, last_micro_batch);
        const float loss = mean_loss(B * T);
        if (last_micro_batch) finish_grad_sync();
        return loss;
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
        const CudaActivationLayout a = activations(last_B_, last_T_);
        {
            PhaseScope phase(timer_, "grad norm", stream_.get());
            global_norm_squared(a.norm, a.norm_partials, grads_.get(), layout_.num_params, false, stream_.get());
        }
        CUDA_CHECK(cudaMemcpyAsync(pinned_norm_.get(), a.norm, sizeof(double), cudaMemcpyDeviceToHost, stream_.get()));
        stream_.synchronize();
        return *pinned_norm_.get();
    }

    // AdamW over the whole flat buffer, one launch per run of consecutive tensors that share a weight
    // decay. The stochastic rounding bits depend on (seed, step, element), never on the launch.
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) override {
        if (step < 1) fail(strformat("adamw_step: step must be >= 1 (1-based for bias correction), got %d", step));
        PhaseScope phase(timer_, "adamw", stream_.get());
        const uint32_t seed = hash_u32(sr_seed_ ^ hash_u32((uint32_t)step));
        const auto& segs = layout_.segments();
        for (size_t i = 0; i < segs.size();) {
            const bool decayed = ParamLayout::is_decayed(segs[i].tensor);
            size_t j = i + 1;
            while (j < segs.size() && ParamLayout::is_decayed(segs[j].tensor) == decayed) j++;
            const size_t lo = segs[i].begin, count = segs[j - 1].end - lo;
            adamw_update(params_.get() + lo, master_.get() + lo, grads_.get() + lo, m_.get() + lo, v_.get() + lo, count,
                         opt.lr, opt.beta1, opt.beta2, opt.eps, decayed ? opt.weight_decay : 0.0f, step,
                         grad_multiplier, seed, lo, stream_.get());
            i = j;
        }
    }

    double take_exposed_comm_ms() override {
        const double ms = exposed_comm_ms_;
        exposed_comm_ms_ = 0.0;
        return ms;
    }
    size_t allocated_bytes(MemoryKind kind) const override { return allocated_bytes_[(int)kind]; }

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

    void add_allocation(MemoryKind kind, size_t bytes) { allocated_bytes_[(int)kind] += bytes; }

    CudaActivationLayout activations(int B, int T) const {
        CudaActivationLayout a(config_, B, T, options_, acts_.get());
        if (a.total_bytes > acts_.bytes())
            fail(strformat("GPT2CUDA: activations for B %d x T %d need %zu bytes, %zu allocated", B, T, a.total_bytes,
                           acts_.bytes()));
        return a;
    }

    void reset(const std::vector<float>& full, uint32_t sr_seed) {
        sr_seed_ = sr_seed;
        cudaStream_t s = stream_.get();
        CUDA_CHECK(cudaMemcpyAsync(master_.get(), full.data(), master_.bytes(), cudaMemcpyHostToDevice, s));
        copy_master_to_params(params_.get(), master_.get(), layout_.num_params, s);
        CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), s));
        CUDA_CHECK(cudaMemsetAsync(m_.get(), 0, m_.bytes(), s));
        CUDA_CHECK(cudaMemsetAsync(v_.get(), 0, v_.bytes(), s));
        stream_.synchronize();  // `full` is pageable host memory owned by the caller
    }

    const floatX* param(int tensor, int layer = 0) const { return params_.get() + layout_.offset(tensor, layer); }
    float* grad(int tensor, int layer = 0) { return grads_.get() + layout_.offset(tensor, layer); }

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
        using P = ParamLayout;
        upload_tokens(a, inputs, targets, BT);
        {
            PhaseScope phase(timer_, "encoder", s);
            encoder_forward(a.encoded, a.inputs, param(P::WTE), param(P::WPE), B, T, C, s);
        }
        for (int l = 0; l < L; l++) layer_forward(a, l, B, T, false);
        const floatX* last_residual = a.residual3.at(L - 1);
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last_residual, param(P::LNFW), param(P::LNFB), BT, C, s);
        }
        if (pass == Pass::LastLogits) {
            PhaseScope phase(timer_, "matmul", s);
            matmul_forward(matmul_, a.logits, nullptr, a.lnf + (size_t)(BT - 1) * C, param(P::WTE), nullptr, nullptr, 1,
                           C, Vp, s);
            return;
        }
        const bool train = pass == Pass::Train;
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
    }

    // One transformer block's forward. `for_backward`: a whole-block recomputation, which stops
    // before the MLP projection (its output, the next residual, is kept and not needed again).
    void layer_forward(const CudaActivationLayout& a, int l, int B, int T, bool for_backward) {
        const int C = config_.channels, NH = config_.num_heads, HS = C / NH, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = ParamLayout;
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
        using P = ParamLayout;
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

    // The step's gradient for this bucket is complete (called during the last micro-batch's
    // backward): over NCCL its all-reduce is issued now, behind the compute stream's work so far.
    void bucket_ready(int bucket, bool last_micro_batch) {
        if (!last_micro_batch || grad_sync_ != GradSync::Device) return;
        CUDA_CHECK(cudaEventRecord(bucket_done_.get(), stream_.get()));
        grad_comm_->order_after(bucket_done_.get());
        pending_.push_back(grad_comm_->all_reduce_sum(grads_.get() + layout_.bucket_begin(bucket),
                                                      layout_.bucket_size(bucket), CommDtype::F32));
    }

    // Completes the step's gradient all-reduce. The compute stream is drained first, so the time
    // counted as exposed is only what communication adds after backward.
    void finish_grad_sync() {
        if (grad_sync_ == GradSync::None) return;
        stream_.synchronize();
        if (grad_sync_ == GradSync::Device) {
            for (CommHandle& h : pending_) {
                h.wait();
                exposed_comm_ms_ += h.wait_ms();
            }
            pending_.clear();
            return;
        }
        const size_t bytes = layout_.num_params * sizeof(float);
        CUDA_CHECK(cudaMemcpyAsync(staged_grads_.get(), grads_.get(), bytes, cudaMemcpyDeviceToHost, stream_.get()));
        stream_.synchronize();
        CommHandle h = grad_comm_->all_reduce_sum(staged_grads_.get(), layout_.num_params, CommDtype::F32);
        h.wait();
        exposed_comm_ms_ += h.wait_ms();
        CUDA_CHECK(cudaMemcpyAsync(grads_.get(), staged_grads_.get(), bytes, cudaMemcpyHostToDevice, stream_.get()));
        stream_.synchronize();  // the staging buffer is reused next step
    }

    // Backward of the Pass::Train forward that just ran on the same batch, from the dlnf it left in
    // dC. Parameter gradients accumulate (+=) into the fp32 gradient buffer; on the last micro-batch
    // each finished bucket is handed to bucket_ready.
    void backward(int B, int T, bool last_micro_batch) {
        const CudaActivationLayout a = activations(B, T);
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads, HS = C / NH, BT = B * T;
        cudaStream_t s = stream_.get();
        using P = ParamLayout;
        CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, (size_t)BT * C * sizeof(floatX), s));
        {
            PhaseScope phase(timer_, "layernorm", s);
            layernorm_backward(a.dresidual, grad(P::LNFW), grad(P::LNFB), a.scratch, a.dC, a.residual3.at(L - 1),
                               param(P::LNFW), a.lnf_mean, a.lnf_rstd, BT, C, s);
        }
        bucket_ready(layout_.final_bucket(), last_micro_batch);
        for (int l = L - 1; l >= 0; l--) {
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
            bucket_ready(layout_.layer_bucket(l), last_micro_batch);
        }
        {
            PhaseScope phase(timer_, "encoder", s);
            encoder_backward_.backward(grad(P::WTE), grad(P::WPE), a.dresidual, B, T, C, s);
        }
        bucket_ready(ParamLayout::EMBEDDING_BUCKET, last_micro_batch);
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

    ModelConfig config_;
    ParamLayout layout_;
    int max_B_, max_T_;
    GPT2CUDAOptions options_;
    Communicator* grad_comm_;
    GradSync grad_sync_;
    int last_B_ = 1, last_T_ = 1;
    uint32_t sr_seed_ = 0;
    double exposed_comm_ms_ = 0.0;
    std::vector<CommHandle> pending_;  // the step's bucket all-reduces in flight (NCCL)

    CudaStream stream_;
    MatmulContext matmul_;
    EncoderBackward encoder_backward_;
    PhaseTimer timer_;
    DeviceBuffer<floatX> params_;
    DeviceBuffer<float> master_, grads_, m_, v_;
    DeviceBuffer<char> acts_;
    PinnedBuffer<int> pinned_tokens_;
    PinnedBuffer<float> pinned_losses_;
    PinnedBuffer<floatX> pinned_logits_;
    PinnedBuffer<double> pinned_norm_;
    PinnedBuffer<float> staged_grads_;  // MPI: the gradient on its way through host memory
    CudaEvent bucket_done_;
    size_t allocated_bytes_[(int)MemoryKind::Count] = {};
};

}  // namespace llmc
