// fp8_linears.cuh: the CUDA model's FP8 products (--fp8 1): each block's qkv, attention projection,
// fc and fc projection with their inputs and weights cast to E4M3 and their output gradients to
// E5M2 (kernels/fp8.cuh), multiplied by cuBLASLt's FP8 products (matmul.cuh).
//
// The one idea: it quantizes exactly what cpu::Fp8Linears (the CPU model's simulation) quantizes,
// with the same scales, so the emulated suite can hold the two models to each other. A scale per
// (layer, product, operand) lives on the device; current scaling measures each tensor before its
// cast, delayed scaling takes the scale its history set at the last step's end (the casts measure
// the step's amax as they write, and the maximum over the data-parallel ranks joins the history).
// Until the first step has ended there is no history, and delayed scaling scales as current does,
// as the CPU model's does. The backward casts the saved bf16 input again, with the forward's scale,
// instead of keeping an FP8 copy: no activation memory, the same codes. It takes that scale as the
// forward left it rather than measuring the same values again, and so does a recomputed forward.
//
// The weights are cast once a step, not at every use: a weight changes only when the parameters do
// (AdamW, a load, a resume: ZeroEngine::params_version) and its scale only at a step's end, so its
// E4M3 copy and the transpose the backward's dinp product reads are cast at their first use after
// either changed and reused by every micro-batch's forward, recomputation and backward: the codes a
// cast at every use would give, at a cost of 2 bytes a weight (the bf16 weights' size). Under ZeRO-3
// a rank holds a layer's weights only while they are gathered, and a whole copy would undo the
// sharding: there the gather itself carries the codes (fp8_gather.cuh: each rank casts its slice
// once a step, and this class is the engine's GatherCodec), or, with --fp8-gather 0, the weights
// are gathered in bf16 and cast at every use into one product's slot.
#pragma once

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "llmc/ckpt/shard_state.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/zero.h"
#include "llmc/numerics/fp8.h"
#include "llmc/kernels/fp8.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/matmul.cuh"
#include "llmc/kernels/phase_timer.cuh"
#include "llmc/models/cuda/fp8_gather.cuh"

namespace llmc {

// Where a product's FP8 weight comes from: a copy cast once a step (ZeRO 0-2), a cast of the
// gathered bf16 weight at every use (ZeRO-3, --fp8-gather 0), or the gathered codes (ZeRO-3).
enum class Fp8WeightCopies { Cached, AtEachUse, Gathered };
inline Fp8WeightCopies fp8_weight_copies(const Fp8Options& o, const ZeroPlan& plan) {
    if (!plan.shards_parameters()) return Fp8WeightCopies::Cached;
    return o.gather ? Fp8WeightCopies::Gathered : Fp8WeightCopies::AtEachUse;
}
// --fp8 1 whose ZeRO-3 gathers carry the weights' codes (fp8_gather.cuh).
inline bool fp8_gathers_codes(const Fp8Options& o, const ZeroPlan& plan) {
    return o.enabled && fp8_weight_copies(o, plan) == Fp8WeightCopies::Gathered;
}
// What the memory plan calls their buffers.
inline const char* fp8_weight_copies_name(Fp8WeightCopies copies) {
    switch (copies) {
    case Fp8WeightCopies::Cached: return "FP8 weights and transposes (cast once a step)";
    case Fp8WeightCopies::AtEachUse: return "FP8 weight and transpose";
    case Fp8WeightCopies::Gathered: return "FP8 weight transpose, gathered weights' amaxes and clipping";
    }
    return "";
}

// The FP8 copies of activations one product needs at once (the activation layout's scratch): its
// input, its output gradient, and their transposes. The weights' copies are Fp8LinearsCUDA's own.
struct Fp8Scratch {
    uint8_t *input = nullptr, *input_t = nullptr, *grad = nullptr, *grad_t = nullptr;
};

class Fp8LinearsCUDA : public ReplicatedState, public GatherCodec<floatX> {
public:
    Fp8LinearsCUDA() = default;
    // `weights`: the block's four product weights and their sizes; `copies`: where the weights' codes
    // come from (Gathered: then gather_weights);
    // `dp_ranks`: the data-parallel ranks whose step amaxes delayed scaling takes the maximum of;
    // `stream`: the model's, on which every kernel runs (the host reads the state after it).
    Fp8LinearsCUDA(int layers, const Fp8BlockWeights& weights, const Fp8Options& options, Fp8WeightCopies copies,
                   int dp_ranks, cudaStream_t stream)
        : options_(options), tensors_(layers * FP8_TENSORS_PER_LAYER), block_weights_(weights), copies_(copies),
          stream_(stream) {
        if (!options.enabled) return;
        if (options.history < 1) fail(strformat("--fp8-history must be >= 1 step, got %d", options.history));
        scales_ = DeviceBuffer<Fp8Scale>(tensors_, "FP8 scales");
        histories_ = DeviceBuffer<float>((size_t)tensors_ * options.history, "FP8 amax histories");
        largest_ = DeviceBuffer<float>(tensors_, "FP8 formats' largest values");
        clips_ = DeviceBuffer<Fp8Clip>(FP8_TENSORS_PER_LAYER, "FP8 clipping counts");
        step_amaxes_ = DeviceBuffer<float>(step_amax_floats(tensors_, options, dp_ranks), "FP8 step amaxes");
        const std::vector<Fp8Scale> fresh(tensors_);
        CUDA_CHECK(cudaMemcpy(scales_.get(), fresh.data(), sizeof(Fp8Scale) * tensors_, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(histories_.get(), 0, sizeof(float) * tensors_ * options.history));
        std::vector<float> largest(tensors_);
        for (int i = 0; i < tensors_; i++) largest[i] = fp8::info(fp8_format(i % FP8_OPERANDS)).largest;
        CUDA_CHECK(cudaMemcpy(largest_.get(), largest.data(), sizeof(float) * tensors_, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(clips_.get(), 0, sizeof(Fp8Clip) * FP8_TENSORS_PER_LAYER));
        const size_t weight_bytes = weight_copy_bytes(layers, weights, copies);
        if (copies != Fp8WeightCopies::Gathered) weights_ = DeviceBuffer<uint8_t>(weight_bytes, "FP8 weights");
        weights_t_ = DeviceBuffer<uint8_t>(weight_bytes, "FP8 weights transposed");
        if (copies != Fp8WeightCopies::AtEachUse)
            weight_clips_ = DeviceBuffer<Fp8Clip>((size_t)layers * FP8_PRODUCTS, "FP8 weights' clipping");
        cast_epoch_.assign((size_t)layers * FP8_PRODUCTS, 0);
    }
    Fp8LinearsCUDA(Fp8LinearsCUDA&&) = default;
    Fp8LinearsCUDA& operator=(Fp8LinearsCUDA&&) = default;

    bool enabled() const { return options_.enabled; }
    // The model's phase timer: the casts' time counts as "fp8 amax" and "fp8 cast", not as their product's.
    void time_casts_in(PhaseTimer* timer) { timer_ = timer; }
    // Training passes count clipping and measure delayed scaling's step amax; evaluations only cast.
    void set_recording(bool recording) { recording_ = recording; }
    // A whole-block recomputation casts the forward's inputs again (bitwise the same values): with
    // the scales the forward took, counting nothing.
    void set_recomputing(bool recomputing) { recomputing_ = recomputing; }

    // The scales, histories and counters this allocates (the memory plan's line).
    static size_t device_bytes(int layers, const Fp8Options& o, int dp_ranks) {
        if (!o.enabled) return 0;
        const size_t tensors = (size_t)layers * FP8_TENSORS_PER_LAYER;
        return tensors * (sizeof(Fp8Scale) + sizeof(float) * (o.history + 1)) +
               sizeof(Fp8Clip) * FP8_TENSORS_PER_LAYER + sizeof(float) * step_amax_floats(tensors, o, dp_ranks);
    }
    // The weights' FP8 copies and transposes this allocates (the memory plan's other line): every
    // layer's four weights when cached, else the largest one's slot (GPT-2's 4C x C; gathered: the
    // transpose's only, the codes being the gather's, Fp8WeightGather::device_bytes).
    static size_t weight_bytes(int layers, const Fp8BlockWeights& w, const Fp8Options& o, Fp8WeightCopies copies,
                               int dp_ranks) {
        if (!o.enabled) return 0;
        const size_t clips = sizeof(Fp8Clip) * layers * FP8_PRODUCTS;
        switch (copies) {
        case Fp8WeightCopies::Cached: return 2 * weight_copy_bytes(layers, w, copies) + clips;
        case Fp8WeightCopies::AtEachUse: return 2 * weight_copy_bytes(layers, w, copies);
        case Fp8WeightCopies::Gathered:  // + every rank's amaxes and clipping counts (gather_weights)
            return weight_copy_bytes(layers, w, copies) + clips +
                   (sizeof(float) + sizeof(Fp8Clip)) * layers * FP8_PRODUCTS * dp_ranks;
        }
        return 0;
    }

    // Device bytes allocated (what the memory plan's FP8 lines must add up to).
    size_t allocated_bytes() const {
        return scales_.bytes() + histories_.bytes() + largest_.bytes() + step_amaxes_.bytes() + clips_.bytes() +
               weights_.bytes() + weights_t_.bytes() + weight_clips_.bytes() + rank_amaxes_.bytes() +
               rank_clips_.bytes() + gather_.allocated_bytes();
    }

    // ZeRO-3 (Fp8WeightCopies::Gathered): the weights travel in `plan`'s gathers as their codes, the
    // amaxes and clipping counts of every rank's slices exchanged over `dp` (the engine's
    // communicator). The engine then takes this as its GatherCodec.
    void gather_weights(const ParamLayout& layout, const ZeroPlan& plan, Communicator& dp) {
        if (!enabled()) return;
        if (copies_ != Fp8WeightCopies::Gathered || dp.world_size() != plan.world_size)
            fail("Fp8LinearsCUDA::gather_weights: made for other weight copies, or for another communicator");
        const size_t n = (size_t)layout.num_layers() * FP8_PRODUCTS * dp.world_size();
        gather_ = Fp8WeightGather(layout, block_weights_, plan, stream_);
        dp_ = &dp;
        rank_amaxes_ = DeviceBuffer<float>(n, "FP8 gather's weight amaxes");
        rank_clips_ = DeviceBuffer<Fp8Clip>(n, "FP8 gather's clipping counts");
    }

    // GatherCodec: a layer's parameters packed with its weights' codes (fp8_gather.cuh). The first
    // pack after the parameters or the scales changed packs every layer's slice.
    bool packs(int bucket) const override { return gather_.packs(bucket); }
    size_t chunk_bytes(int bucket) const override { return gather_.chunk_bytes(bucket); }
    const void* pack(int bucket, const floatX* shard, uint64_t version) override {
        if (version != packed_version_ || scales_epoch_ != packed_scales_epoch_) pack_weights(shard, version);
        return gather_.packed(bucket);
    }
    void* landing(int buffer) override { return gather_.landing(buffer); }
    void unpack(int bucket, int buffer, floatX* whole) override { gather_.unpack(bucket, buffer, whole); }
    void forget_gathered() override { gather_.forget(); }

    // The parameters the weights are cast from, by ZeroEngine::params_version: a new version makes
    // every cached cast stale. The model calls it before each pass.
    void use_weights(uint64_t params_version) {
        if (params_version == params_version_) return;
        params_version_ = params_version;
        epoch_++;
    }
    // Milliseconds blocked on pack_weights' collectives since the last call (the step's exposed
    // communication, with the engine's).
    double take_exposed_comm_ms() { return std::exchange(exposed_comm_ms_, 0.0); }
    // Weight casts so far (one per weight and step when cached), for the tests.
    uint64_t weight_casts() const { return weight_casts_; }
    // For the tests: amax passes of their own so far, and fused_amax turned off (every cast that
    // measures then makes a pass).
    uint64_t amax_passes() const { return amax_passes_; }
    void set_fused_amax(bool on) { fuse_amax_ = on; }

    // Where the kernel that writes product p's operand o of layer l (LayerNorm, attention, GELU,
    // forward or backward) measures the operand's amax as it writes it, so that its cast needs no
    // pass of its own: a pointer for that kernel where the cast will measure (current scaling, delayed
    // before its first step's end; not a recomputation, whose casts keep the forward's scales), else
    // null. A kernel given the pointer must run, and the cast must follow, before the next one is
    // asked for.
    float* fused_amax(int l, Fp8Product p, Fp8Operand o) {
        if (!enabled() || !fuse_amax_ || recomputing_ || scales_from_history()) return nullptr;
        premeasured_ = scale(l, p, o);
        return &premeasured_->amax_now;
    }

    // out (BT x OC) = inp W^T + bias (+ residual), or GELU into out with pre_gelu, as matmul_forward.
    void forward(MatmulContext& ctx, const Fp8Scratch& x, int l, Fp8Product p, floatX* out, floatX* pre_gelu,
                 const floatX* inp, const floatX* weight, const floatX* bias, const floatX* residual, int BT, int C,
                 int OC) {
        cudaStream_t s = stream_;
        const CastUse use = recomputing_ ? CastUse::Again : recording_ ? CastUse::Record : CastUse::Measure;
        const Fp8Tensor in = cast(x.input, nullptr, l, p, FP8_INPUT, inp, BT, C, use, s);
        const Fp8Tensor w = cast_weight(l, p, weight, OC, C, false, use).first;
        matmul_forward_fp8(ctx, out, pre_gelu, in, w, bias, residual, BT, C, OC, s);
    }

    // The backward of forward, as matmul_backward: dinp (overwritten; multiplied by GELU'(pre_gelu)
    // where given), dweight += , dbias += (from the bf16 dout, in `scratch`).
    void backward(MatmulContext& ctx, const Fp8Scratch& x, int l, Fp8Product p, floatX* dinp, float* dweight,
                  float* dbias, float* scratch, const floatX* dout, const floatX* inp, const floatX* weight,
                  const floatX* pre_gelu, int BT, int C, int OC) {
        cudaStream_t s = stream_;
        if (dbias) bias_backward(dbias, scratch, dout, BT, OC, s);
        cast(x.grad, x.grad_t, l, p, FP8_GRAD, dout, BT, OC, recording_ ? CastUse::Record : CastUse::Measure, s);
        const Fp8Tensor grad{x.grad, CUDA_R_8F_E5M2, fp8_scale_inv(scale(l, p, FP8_GRAD))};
        const Fp8Tensor grad_t{x.grad_t, CUDA_R_8F_E5M2, grad.scale_inv};
        const Fp8Tensor weight_t = cast_weight(l, p, weight, OC, C, true, CastUse::Again).second;
        cast(nullptr, x.input_t, l, p, FP8_INPUT, inp, BT, C, CastUse::Again, s);  // the transpose is all it reads
        const Fp8Tensor input_t{x.input_t, CUDA_R_8F_E4M3, fp8_scale_inv(scale(l, p, FP8_INPUT))};
        matmul_backward_dinp_fp8(ctx, dinp, grad, weight_t, BT, C, OC, s);
        if (pre_gelu)  // dinp is then the gradient of the fc product's output, which its backward casts next
            gelu_backward_inplace(dinp, pre_gelu, (size_t)BT * C, s, fused_amax(l, FP8_FC, FP8_GRAD));
        matmul_backward_dweight_fp8(ctx, dweight, grad_t, input_t, BT, C, OC, s);
    }

    // The end of an optimizer step: with delayed scaling, every tensor's step amax (the maximum over
    // `dp`, a device communicator; null for one rank) joins its history and sets its next scale.
    void end_step(Communicator* dp) {
        cudaStream_t s = stream_;
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return;
        if (dp && dp->world_size() > 1) {
            const int ranks = dp->world_size();
            if (step_amaxes_.count() != step_amax_floats(tensors_, options_, ranks))
                fail(strformat("Fp8LinearsCUDA: made for another number of data-parallel ranks than %d", ranks));
            float* mine = step_amaxes_.get() + (size_t)tensors_ * ranks;
            fp8_step_amax_out(mine, scales_.get(), tensors_, s);
            CUDA_CHECK(cudaStreamSynchronize(s));  // a few floats once a step: the collective reads them next
            dp->all_gather(mine, step_amaxes_.get(), tensors_, CommDtype::F32).wait();
            fp8_step_amax_max(scales_.get(), step_amaxes_.get(), tensors_, ranks, s);
        }
        fp8_delayed_update(scales_.get(), histories_.get(), largest_.get(), tensors_, options_.history, s);
        primed_ = true;
        epoch_++, scales_epoch_++;  // new weight scales
    }

    // What the casts of training passes clipped since the last call (a copy to the host).
    Fp8Stats take_stats() {
        cudaStream_t s = stream_;
        Fp8Stats stats;
        if (!enabled()) return stats;
        Fp8Clip clips[FP8_TENSORS_PER_LAYER];
        CUDA_CHECK(cudaMemcpyAsync(clips, clips_.get(), sizeof(clips), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaMemsetAsync(clips_.get(), 0, sizeof(clips), s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (int p = 0; p < FP8_PRODUCTS; p++)
            for (int o = 0; o < FP8_OPERANDS; o++) {
                const Fp8Clip& c = clips[p * FP8_OPERANDS + o];
                stats.counts[p][o] = {c.elements, c.overflows, c.underflows};
            }
        return stats;
    }

    // ReplicatedState: delayed scaling's state in cpu::Fp8Linears' layout (per tensor its scale,
    // whether it has one, its history's length and the history oldest first), so a checkpoint of
    // either model resumes on the other.
    std::vector<std::pair<std::string, std::vector<float>>> named_values() const override {
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return {};
        const int H = options_.history;
        std::vector<Fp8Scale> scales(tensors_);
        std::vector<float> rings((size_t)tensors_ * H);
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the last step's update is on the model's stream
        CUDA_CHECK(cudaMemcpy(scales.data(), scales_.get(), sizeof(Fp8Scale) * tensors_, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(rings.data(), histories_.get(), sizeof(float) * rings.size(), cudaMemcpyDeviceToHost));
        std::vector<float> out;
        for (int i = 0; i < tensors_; i++) {
            const Fp8Scale& s = scales[i];
            out.push_back(s.scale);
            out.push_back(s.primed ? 1.0f : 0.0f);
            out.push_back((float)s.history_count);
            const size_t oldest = s.history_count < (uint32_t)H ? 0 : s.history_next;
            for (int h = 0; h < H; h++)
                out.push_back(h < (int)s.history_count ? rings[(size_t)i * H + (oldest + h) % H] : 0.0f);
        }
        return {{"fp8_scaling", out}};
    }
    bool restore(const std::string& name, const std::vector<float>& values, const std::string& where) override {
        if (name != "fp8_scaling") return false;
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return true;  // no use for the histories
        const int H = options_.history;
        const size_t per_tensor = fp8_state_floats_per_tensor(H);
        check_fp8_state_size(values.size(), tensors_, H, where);
        std::vector<Fp8Scale> scales(tensors_);
        std::vector<float> rings((size_t)tensors_ * H, 0.0f);
        bool all_primed = true;
        for (int i = 0; i < tensors_; i++) {
            const float* v = values.data() + i * per_tensor;
            Fp8Scale& s = scales[i];
            s.scale = v[0], s.scale_inv = 1.0f / v[0], s.primed = v[1] != 0.0f;
            s.history_count = (uint32_t)std::min<float>(v[2], (float)H);
            s.history_next = s.history_count % H;
            for (uint32_t h = 0; h < s.history_count; h++) rings[(size_t)i * H + h] = v[3 + h];
            all_primed = all_primed && s.primed;
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(cudaMemcpy(scales_.get(), scales.data(), sizeof(Fp8Scale) * tensors_, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(histories_.get(), rings.data(), sizeof(float) * rings.size(), cudaMemcpyHostToDevice));
        primed_ = all_primed;
        epoch_++, scales_epoch_++;  // new weight scales
        return true;
    }

private:
    // Delayed scaling over several ranks: every rank's step amaxes, then this rank's own.
    static size_t step_amax_floats(size_t tensors, const Fp8Options& o, int dp_ranks) {
        return o.scaling == Fp8Scaling::Delayed && dp_ranks > 1 ? tensors * (dp_ranks + 1) : 0;
    }

    Fp8Scale* scale(int l, Fp8Product p, Fp8Operand o) const {
        return scales_.get() + ((size_t)l * FP8_PRODUCTS + p) * FP8_OPERANDS + o;
    }

    // A product's weight (OC x C): its FP8 copy's place when cached, product after product, layer
    // after layer (else one slot every product shares, at 0).
    static size_t weight_copy_bytes(int layers, const Fp8BlockWeights& w, Fp8WeightCopies copies) {
        return copies == Fp8WeightCopies::Cached ? layers * w.per_layer() : w.largest();
    }
    size_t weight_offset(int l, Fp8Product p) const {
        return (size_t)l * block_weights_.per_layer() + block_weights_.before(p);
    }

    // How a cast takes its scale. Measure: current scaling (and delayed before its first step's end)
    // measures the tensor. Record: so does a training pass, which also joins delayed scaling's step
    // amax and counts what it clipped. Again: the values the tensor's last cast had (a backward's
    // input, a recomputed forward's), so that cast's scale, no pass over them, nothing counted.
    enum class CastUse { Measure, Record, Again };

    // Block l's product p's weight (OC x C) in E4M3, and its transpose where cast (`transpose`, or
    // always when cached), as `copies_` makes them: each way below. `weight`: the bf16 weight (not
    // read where gathered: the gather brought only its codes).
    std::pair<Fp8Tensor, Fp8Tensor> cast_weight(int l, Fp8Product p, const floatX* weight, int OC, int C,
                                                bool transpose, CastUse use) {
        switch (copies_) {
        case Fp8WeightCopies::Cached: return cached_weight(l, p, weight, OC, C, use);
        case Fp8WeightCopies::Gathered: return gathered_weight(l, p, OC, C, transpose, use);
        case Fp8WeightCopies::AtEachUse: break;
        }
        weight_casts_++;  // cast now, as a cast of the product's input is
        uint8_t* qt = weights_t_.get();
        const Fp8Tensor w = cast(weights_.get(), transpose ? qt : nullptr, l, p, FP8_WEIGHT, weight, OC, C, use, stream_);
        return {w, {qt, w.type, w.scale_inv}};
    }
    // Cached: cast at its first use after use_weights or the scales changed, measuring its amax for
    // delayed scaling's step (the weight a training pass would measure: it does not change within
    // the step), counting what it clipped at every Record use, as a cast at each use would.
    std::pair<Fp8Tensor, Fp8Tensor> cached_weight(int l, Fp8Product p, const floatX* weight, int OC, int C,
                                                  CastUse use) {
        const size_t i = (size_t)l * FP8_PRODUCTS + p;
        uint8_t *q = weights_.get() + weight_offset(l, p), *qt = weights_t_.get() + weight_offset(l, p);
        if (cast_epoch_[i] != epoch_) {
            weight_casts_++;
            cast_epoch_[i] = epoch_;
            CUDA_CHECK(cudaMemsetAsync(weight_clips_.get() + i, 0, sizeof(Fp8Clip), stream_));
            cast_into(q, qt, l, p, FP8_WEIGHT, weight, OC, C, weight_clips_.get() + i, true,
                      options_.scaling == Fp8Scaling::Delayed, stream_);
        }
        return weight_tensors(l, p, q, qt, use);
    }
    // Gathered: the codes the gather brought (pack_weights cast them), counted as cached ones, with
    // the transpose made from them where asked for.
    std::pair<Fp8Tensor, Fp8Tensor> gathered_weight(int l, Fp8Product p, int OC, int C, bool transpose, CastUse use) {
        uint8_t *q = gather_.codes(l, p), *qt = weights_t_.get();
        if (transpose) {
            PhaseScope phase(timer(), "fp8 cast", stream_);
            fp8_transpose(qt, q, OC, C, stream_);
        }
        return weight_tensors(l, p, q, qt, use);
    }
    // A cast made once and used several times: its clipping counted at every Record use.
    std::pair<Fp8Tensor, Fp8Tensor> weight_tensors(int l, Fp8Product p, uint8_t* q, uint8_t* qt, CastUse use) {
        if (use == CastUse::Record)
            fp8_clip_add(clips_.get() + (int)p * FP8_OPERANDS + FP8_WEIGHT,
                         weight_clips_.get() + (size_t)l * FP8_PRODUCTS + p, stream_);
        const Fp8Tensor w{q, CUDA_R_8F_E4M3, fp8_scale_inv(scale(l, p, FP8_WEIGHT))};
        return {w, {qt, w.type, w.scale_inv}};
    }

    // x (rows x cols) cast into q (and its transpose into qt, if given) with its tensor's scale, as
    // `use` says.
    Fp8Tensor cast(uint8_t* q, uint8_t* qt, int l, Fp8Product p, Fp8Operand o, const floatX* x, int rows, int cols,
                   CastUse use, cudaStream_t s) {
        const bool record = use == CastUse::Record;
        Fp8Clip* clip = record ? clips_.get() + (int)p * FP8_OPERANDS + o : nullptr;
        return cast_into(q, qt, l, p, o, x, rows, cols, clip, use != CastUse::Again,
                         record && options_.scaling == Fp8Scaling::Delayed, s);
    }
    // cast's work, counting into `clip` (optional), measuring x first where `measure` and current
    // scaling (or delayed before its first step's end) asks, and the step's amax where `record_amax`.
    Fp8Tensor cast_into(uint8_t* q, uint8_t* qt, int l, Fp8Product p, Fp8Operand o, const floatX* x, int rows, int cols,
                        Fp8Clip* clip, bool measure, bool record_amax, cudaStream_t s) {
        Fp8Scale* sc = scale(l, p, o);
        const fp8::Format f = fp8_format(o);
        if (measure && !scales_from_history()) {
            PhaseScope phase(timer(), "fp8 amax", s);
            if (premeasured_ == sc) {
                fp8_scale_from_amax(sc, f, s);  // its producer measured it (fused_amax)
            } else {
                fp8_current_scale(sc, x, (size_t)rows * cols, f, s);
                amax_passes_++;
            }
        }
        if (premeasured_ == sc) premeasured_ = nullptr;
        PhaseScope phase(timer(), "fp8 cast", s);
        fp8_cast(q, qt, sc, clip, x, rows, cols, f, record_amax, s);
        return {q, f == fp8::Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, fp8_scale_inv(sc)};
    }

    // Packs this rank's slice of every layer for the gathers (the GatherCodec's pack), from `shard`,
    // with each weight's scale: from the largest amax of every rank's slices where the scale is
    // measured, else from its history (the slices' amax then joining the step's). What each
    // weight's slices clipped, summed over the ranks, is what a cast of the whole weight counts.
    void pack_weights(const floatX* shard, uint64_t version) {
        cudaStream_t s = stream_;
        const int n = gather_.tensors(), ranks = dp_->world_size();
        float* my_amaxes = rank_amaxes_.get() + (size_t)n * dp_->rank();
        Fp8Clip* my_clips = rank_clips_.get() + (size_t)n * dp_->rank();
        Fp8Scale* weight_scales = scale(0, FP8_QKV, FP8_WEIGHT);  // (l, p)'s at (l * 4 + p) * FP8_OPERANDS
        if (!scales_from_history()) {
            PhaseScope phase(timer(), "fp8 amax", s);
            gather_.measure(shard, my_amaxes);
            CUDA_CHECK(cudaStreamSynchronize(s));  // a float a weight, once a step: the collective reads them next
            wait_counted(dp_->all_gather(my_amaxes, rank_amaxes_.get(), n, CommDtype::F32));
            fp8_scales_from_ranks(weight_scales, FP8_OPERANDS, rank_amaxes_.get(), n, ranks, s);
            amax_passes_ += n;
        }
        PhaseScope phase(timer(), "fp8 cast", s);
        gather_.pack(shard, weight_scales, FP8_OPERANDS, my_clips, options_.scaling == Fp8Scaling::Delayed);
        CUDA_CHECK(cudaStreamSynchronize(s));
        wait_counted(dp_->all_gather(my_clips, rank_clips_.get(), n * sizeof(Fp8Clip), CommDtype::U8));
        fp8_clip_sum(weight_clips_.get(), rank_clips_.get(), n, ranks, s);
        weight_casts_ += n;
        packed_version_ = version, packed_scales_epoch_ = scales_epoch_;
    }
    void wait_counted(CommHandle h) {
        h.wait();
        exposed_comm_ms_ += h.wait_ms();
    }

    // Delayed scaling once every tensor has a history: the scales are set, no cast measures.
    bool scales_from_history() const { return options_.scaling == Fp8Scaling::Delayed && primed_; }

    PhaseTimer& timer() {
        static PhaseTimer off;  // never enabled
        return timer_ ? *timer_ : off;
    }

    Fp8Options options_;
    int tensors_ = 0;
    Fp8BlockWeights block_weights_;  // the products' weights and their sizes
    Fp8WeightCopies copies_ = Fp8WeightCopies::Cached;
    cudaStream_t stream_ = nullptr;
    PhaseTimer* timer_ = nullptr;  // none: the casts are not timed
    bool recording_ = true, recomputing_ = false;
    bool primed_ = false;  // delayed scaling: every tensor has a scale from its history
    bool fuse_amax_ = true;
    Fp8Scale* premeasured_ = nullptr;  // the scale whose amax a producing kernel measured (fused_amax)
    DeviceBuffer<Fp8Scale> scales_;
    DeviceBuffer<float> histories_, largest_, step_amaxes_;
    DeviceBuffer<Fp8Clip> clips_;
    // The weights' FP8 copies and transposes (weight_offset), what each cached cast clipped, and the
    // epoch each (layer, product) was cast in: stale when it is not epoch_, which a new parameter
    // version (use_weights) or new scales (end_step, restore) advance.
    DeviceBuffer<uint8_t> weights_, weights_t_;
    DeviceBuffer<Fp8Clip> weight_clips_;
    std::vector<uint64_t> cast_epoch_;
    uint64_t epoch_ = 1, params_version_ = 0, weight_casts_ = 0, amax_passes_ = 0;
    // ZeRO-3's gathered codes (gather_weights): the packing, the epoch it packed in, the engine's
    // communicator, and every rank's amaxes and clipping counts of its slices (ranks x layers x 4).
    Fp8WeightGather gather_;
    uint64_t scales_epoch_ = 1;  // advanced when the weights' scales change (end_step, restore)
    uint64_t packed_version_ = 0, packed_scales_epoch_ = 0;  // what the packed slices were cast from
    double exposed_comm_ms_ = 0;  // pack_weights' waits on its collectives (take_exposed_comm_ms)
    Communicator* dp_ = nullptr;
    DeviceBuffer<float> rank_amaxes_;
    DeviceBuffer<Fp8Clip> rank_clips_;
};

}  // namespace llmc
