// zero.h: ZeroEngine, which owns the parameter, gradient and optimizer memory of one rank and runs
// ZeRO stages 0-3 over a Communicator.
//
//   stage 0  every rank holds everything; each bucket's gradient is all-reduced as soon as the last
//            micro-batch's backward finishes it; every rank runs AdamW on all parameters.
//   stage 1  optimizer state sharded: gradients are reduce-scattered bucket by bucket, each rank
//            runs AdamW on its shard, then every bucket's parameters are all-gathered.
//   stage 2  gradients sharded too: no full gradient buffer exists. Backward writes a layer's
//            gradient into one of two reusable bucket buffers, which is reduce-scattered (every
//            micro-batch) and added into this rank's gradient shard while backward goes on.
//   stage 3  parameters sharded too: each layer's parameters are all-gathered into one of two
//            reusable buffers just before its forward and again before its backward (the next
//            layer's gather is in flight meanwhile), and released after use.
// The model asks for memory bucket by bucket (acquire_params, grad_buffer) and reports progress
// (grads_ready); it never knows the stage. Collectives go through the Communicator's own thread or
// stream, so they overlap compute; the time the trainer spends blocked on them is the step's
// exposed communication time.
//
// The engine allocates exactly the buffers buffer_specs() lists, and the --plan printout reads the
// same list, so the plan is what gets allocated.
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "adamw.h"
#include "comm.h"
#include "model.h"
#include "model_config.h"
#include "zero_plan.h"

namespace llmc {

// One buffer a model allocates: what it is for, its length in elements and the element size (the
// engine's buffers are fp32; the CUDA model's parameters are bf16, its activations counted in bytes).
struct BufferSpec {
    const char* name;
    MemoryKind kind;
    size_t count;
    size_t element_bytes = sizeof(float);
    size_t bytes() const { return count * element_bytes; }
};

// Every buffer the engine allocates for a plan (the single size function for engine and planner).
inline std::vector<BufferSpec> buffer_specs(const ZeroPlan& plan) {
    using K = MemoryKind;
    const ZeroPlan::Bucket &embedding = plan.embedding(), &layer = plan.layer(), &final_norm = plan.final_norm();
    std::vector<BufferSpec> specs;
    if (!plan.shards_parameters()) {
        specs.push_back({"parameters", K::Parameters, plan.padded_num_params});
    } else {
        specs.push_back({"parameter shard", K::Parameters, plan.shard_num_params});
        specs.push_back({"gathered embeddings", K::Parameters, embedding.padded_extent});
        specs.push_back({"gathered final norm", K::Parameters, final_norm.padded_extent});
        specs.push_back({"gathered layers (2)", K::Parameters, 2 * layer.padded_extent});
    }
    if (!plan.shards_gradients()) {
        specs.push_back({"gradients", K::Gradients, plan.padded_num_params});
        if (plan.shards_optimizer()) specs.push_back({"gradient shard", K::Gradients, plan.shard_num_params});
    } else {
        specs.push_back({"gradient shard", K::Gradients, plan.shard_num_params});
        specs.push_back({"embedding gradients", K::Gradients, embedding.padded_extent});
        specs.push_back({"final norm gradients", K::Gradients, final_norm.padded_extent});
        specs.push_back({"layer gradients (2)", K::Gradients, 2 * layer.padded_extent});
        specs.push_back({"reduce-scatter landing", K::CommBuffers,
                         embedding.shard_size + final_norm.shard_size + 2 * layer.shard_size});
    }
    const size_t moments = plan.shards_optimizer() ? plan.shard_num_params : plan.padded_num_params;
    specs.push_back({"AdamW m", K::OptimizerState, moments});
    specs.push_back({"AdamW v", K::OptimizerState, moments});
    return specs;
}

class ZeroEngine {
public:
    ZeroEngine(const ParamLayout& layout, const ZeroPlan& plan, Communicator& comm)
        : layout_(layout), plan_(plan), comm_(comm) {
        if (comm.world_size() != plan.world_size || comm.rank() != plan.rank)
            fail(strformat("ZeroEngine: the plan is for rank %d of %d but the communicator is rank %d of %d",
                           plan.rank, plan.world_size, comm.rank(), comm.world_size()));
        for (const BufferSpec& spec : buffer_specs(plan)) {
            buffers_.emplace_back(spec.count, 0.0f);
            allocated_bytes_[(int)spec.kind] += spec.bytes();
        }
        // Name the buffers in the order buffer_specs() made them.
        size_t i = 0;
        auto next = [&]() { return buffers_[i++].data(); };
        if (!plan.shards_parameters()) {
            params_full_ = next();
        } else {
            params_shard_ = next();
            embedding_params_.data = next();
            final_params_.data = next();
            float* layers = next();
            layer_params_[0].data = layers;
            layer_params_[1].data = layers + plan.layer().padded_extent;
        }
        if (!plan.shards_gradients()) {
            grads_full_ = next();
            if (plan.shards_optimizer()) grads_shard_ = next();
        } else {
            grads_shard_ = next();
            embedding_grads_.data = next();
            final_grads_.data = next();
            float* layers = next();
            layer_grads_[0].data = layers;
            layer_grads_[1].data = layers + plan.layer().padded_extent;
            float* landing = next();
            embedding_grads_.landing = landing;
            final_grads_.landing = embedding_grads_.landing + plan.embedding().shard_size;
            layer_grads_[0].landing = final_grads_.landing + plan.final_norm().shard_size;
            layer_grads_[1].landing = layer_grads_[0].landing + plan.layer().shard_size;
        }
        m_ = next();
        v_ = next();
    }

    const ZeroPlan& plan() const { return plan_; }
    // The whole parameter / gradient buffer, or nullptr where the stage shards it.
    float* full_params() { return params_full_; }
    float* full_grads() { return grads_full_; }

    // Zeroes gradients and AdamW moments: a fresh start from new parameters.
    void reset_optimizer() {
        zero_grad();
        std::memset(m_, 0, optimizer_count() * sizeof(float));
        std::memset(v_, 0, optimizer_count() * sizeof(float));
    }
    size_t allocated_bytes(MemoryKind kind) const { return allocated_bytes_[(int)kind]; }

    // ---- parameters ----

    // Sets every parameter from a full buffer in ParamLayout order (the same on every rank).
    void set_params(const float* full) {
        for (size_t b = 0; b < plan_.buckets.size(); b++) {
            const auto& k = plan_.buckets[b];
            if (!plan_.shards_parameters())
                std::memcpy(params_full_ + k.padded_begin, full + k.begin, k.size * sizeof(float));
            else
                std::memcpy(params_shard_ + k.shard_offset, full + k.begin + k.owned_begin,
                            (k.owned_end - k.owned_begin) * sizeof(float));
        }
        invalidate_gathered();
    }

    // Writes every parameter into `full` (ParamLayout order). A collective under stage 3.
    void get_params(float* full) {
        for (size_t b = 0; b < plan_.buckets.size(); b++) {
            const auto& k = plan_.buckets[b];
            const float* src = plan_.shards_parameters() ? gather_blocking((int)b) : params_full_ + k.padded_begin;
            std::memcpy(full + k.begin, src, k.size * sizeof(float));
        }
        invalidate_gathered();
    }

    // The bucket's parameters, whole (bucket-relative offsets as in ParamLayout::offset_in_bucket).
    // Under stage 3 this waits for the bucket's all-gather, starting it if no prefetch did.
    const float* acquire_params(int bucket) {
        if (!plan_.shards_parameters()) return params_full_ + plan_.buckets[bucket].padded_begin;
        ParamSlot* slot = find_param_slot(bucket);
        if (!slot) {
            prefetch_params(bucket);
            slot = find_param_slot(bucket);
        }
        if (!slot) fail(strformat("ZeroEngine: no free parameter buffer for bucket %d (release one first)", bucket));
        finish(slot->pending);
        slot->in_use = true;
        return slot->data;
    }
    // Starts gathering a bucket's parameters if a buffer is free (stage 3; otherwise nothing).
    void prefetch_params(int bucket) {
        if (!plan_.shards_parameters() || find_param_slot(bucket)) return;
        ParamSlot* slot = free_param_slot(bucket);
        if (!slot) return;
        const auto& k = plan_.buckets[bucket];
        slot->bucket = bucket;
        slot->in_use = false;
        std::memcpy(slot->data + (size_t)plan_.rank * k.shard_size, params_shard_ + k.shard_offset,
                    k.shard_size * sizeof(float));
        float* own = slot->data + (size_t)plan_.rank * k.shard_size;
        slot->pending = std::make_unique<CommHandle>(comm_.all_gather(own, slot->data, k.shard_size, CommDtype::F32));
    }
    // The caller is done with the bucket's parameters for now (its buffer may be reused).
    void release_params(int bucket) {
        if (!plan_.shards_parameters()) return;
        if (ParamSlot* slot = find_param_slot(bucket)) slot->in_use = false;
    }

    // ---- gradients ----

    void zero_grad() {
        if (grads_full_) std::memset(grads_full_, 0, plan_.padded_num_params * sizeof(float));
        if (grads_shard_) std::memset(grads_shard_, 0, plan_.shard_num_params * sizeof(float));
    }

    // Where backward accumulates (+=) this bucket's gradient. Under stages 2-3 a zeroed bucket buffer,
    // valid until grads_ready(bucket); otherwise the bucket's part of the full gradient buffer.
    float* grad_buffer(int bucket) {
        if (!plan_.shards_gradients()) return grads_full_ + plan_.buckets[bucket].padded_begin;
        GradSlot* slot = grad_slot_for(bucket);
        fold(*slot);  // the buffer's previous reduce-scatter must land before it is overwritten
        slot->bucket = bucket;
        std::memset(slot->data, 0, plan_.buckets[bucket].padded_extent * sizeof(float));
        return slot->data;
    }

    // Backward has finished this bucket's gradient for the current micro-batch. last_micro_batch:
    // the step's gradient is now complete, so stages 0-1 start its collective too.
    void grads_ready(int bucket, bool last_micro_batch) {
        const auto& k = plan_.buckets[bucket];
        if (plan_.shards_gradients()) {
            GradSlot* slot = grad_slot_for(bucket);
            slot->pending = std::make_unique<CommHandle>(
                comm_.reduce_scatter_sum(slot->data, slot->landing, k.shard_size, CommDtype::F32));
            in_flight_.push_back(slot);
        } else if (last_micro_batch) {
            float* grads = grads_full_ + k.padded_begin;
            if (plan_.shards_optimizer())
                whole_step_ops_.push_back(std::make_unique<CommHandle>(
                    comm_.reduce_scatter_sum(grads, grads_shard_ + k.shard_offset, k.shard_size, CommDtype::F32)));
            else
                whole_step_ops_.push_back(
                    std::make_unique<CommHandle>(comm_.all_reduce_sum(grads, k.padded_extent, CommDtype::F32)));
        }
    }

    // Waits for every gradient collective of this micro-batch and lands the results.
    void finish_backward() {
        while (!in_flight_.empty()) {
            fold(*in_flight_.front());
        }
        for (auto& op : whole_step_ops_) finish(op);
        whole_step_ops_.clear();
        // Parameters gathered for this forward/backward are not kept between micro-batches.
        invalidate_gathered();
    }

    // ---- optimizer ----

    // The squared global gradient norm (identical on every rank; a collective under stages 1-3).
    double grad_norm_squared() {
        if (!plan_.shards_optimizer()) return sum_squares(grads_full_, 0, plan_.padded_num_params);
        const double local = sum_squares(grads_shard_, 0, plan_.shard_num_params);
        return llmc::sum_over_ranks(comm_, local);
    }

    // AdamW on this rank's shard; then, under stages 1-2, every bucket's parameters are all-gathered.
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) {
        for (size_t b = 0; b < plan_.buckets.size(); b++) {
            const auto& k = plan_.buckets[b];
            // The rank's slice of the bucket, relative to the bucket: all of it under stage 0.
            size_t lo = plan_.shards_optimizer() ? k.owned_begin : 0;
            size_t hi = plan_.shards_optimizer() ? k.owned_end : k.size;
            for (const ParamLayout::Segment& seg : layout_.segments()) {
                if (seg.end <= k.begin + lo || seg.begin >= k.begin + hi) continue;
                const size_t seg_lo = std::max(lo, seg.begin > k.begin ? seg.begin - k.begin : 0);
                const size_t seg_hi = std::min(hi, seg.end - k.begin);
                const float decay = ParamLayout::is_decayed(seg.tensor) ? opt.weight_decay : 0.0f;
                float* p = param_for_update(k, seg_lo);
                const float* g = plan_.shards_optimizer() ? grads_shard_ + k.shard_offset + (seg_lo - lo)
                                                          : grads_full_ + k.padded_begin + seg_lo;
                size_t state_at = plan_.shards_optimizer() ? k.shard_offset + (seg_lo - lo) : k.padded_begin + seg_lo;
                adamw_contiguous(p, g, m_ + state_at, v_ + state_at, seg_hi - seg_lo, decay, opt, step,
                                 grad_multiplier);
            }
        }
        if (plan_.shards_optimizer() && !plan_.shards_parameters()) {
            for (const auto& k : plan_.buckets) {
                float* bucket = params_full_ + k.padded_begin;
                whole_step_ops_.push_back(std::make_unique<CommHandle>(comm_.all_gather(
                    bucket + (size_t)plan_.rank * k.shard_size, bucket, k.shard_size, CommDtype::F32)));
            }
            for (auto& op : whole_step_ops_) finish(op);
            whole_step_ops_.clear();
        }
        invalidate_gathered();
    }

    // Drops every gathered parameter buffer (stage 3): after a forward-only pass, and whenever the
    // parameters change.
    void invalidate_gathered() {
        for (ParamSlot* s : {&embedding_params_, &final_params_, &layer_params_[0], &layer_params_[1]}) {
            finish(s->pending);
            s->bucket = -1;
            s->in_use = false;
        }
    }

    // Milliseconds the caller spent blocked on collectives since the last call.
    double take_exposed_comm_ms() {
        double ms = exposed_ms_;
        exposed_ms_ = 0;
        return ms;
    }

private:
    struct ParamSlot {
        float* data = nullptr;
        int bucket = -1;
        bool in_use = false;
        std::unique_ptr<CommHandle> pending;
    };
    struct GradSlot {
        float* data = nullptr;
        float* landing = nullptr;  // this rank's reduced slice arrives here, then is added to the shard
        int bucket = -1;
        std::unique_ptr<CommHandle> pending;
    };

    size_t optimizer_count() const {
        return plan_.shards_optimizer() ? plan_.shard_num_params : plan_.padded_num_params;
    }

    void wait_counted(CommHandle& h) {
        h.wait();
        exposed_ms_ += h.wait_ms();
    }
    void finish(std::unique_ptr<CommHandle>& h) {
        if (!h) return;
        wait_counted(*h);
        h.reset();
    }

    // Stage 3 parameter buffers: embeddings and final norm have their own, layers share two.
    ParamSlot* find_param_slot(int bucket) {
        for (ParamSlot* s : {&embedding_params_, &final_params_, &layer_params_[0], &layer_params_[1]})
            if (s->bucket == bucket) return s;
        return nullptr;
    }
    ParamSlot* free_param_slot(int bucket) {
        if (bucket == 0) return &embedding_params_;
        if (bucket == (int)plan_.buckets.size() - 1) return &final_params_;
        for (ParamSlot& s : layer_params_)
            if (!s.in_use && !s.pending) return &s;
        return nullptr;
    }
    const float* gather_blocking(int bucket) {
        const float* p = acquire_params(bucket);
        release_params(bucket);
        return p;
    }
    // Stage 2-3 gradient buffers: embeddings and final norm have their own, layers alternate two.
    GradSlot* grad_slot_for(int bucket) {
        if (bucket == 0) return &embedding_grads_;
        if (bucket == (int)plan_.buckets.size() - 1) return &final_grads_;
        for (GradSlot& s : layer_grads_)
            if (s.bucket == bucket) return &s;
        // the layer buffer whose reduce-scatter was issued first is the one to reuse
        GradSlot& a = layer_grads_[0];
        GradSlot& b = layer_grads_[1];
        if (a.bucket < 0) return &a;
        if (b.bucket < 0) return &b;
        for (GradSlot* s : in_flight_)
            if (s == &a || s == &b) return s;
        return &a;
    }
    // Waits for the slot's reduce-scatter (if any) and adds the landed slice into the gradient shard.
    void fold(GradSlot& slot) {
        if (slot.pending) {
            finish(slot.pending);
            const auto& k = plan_.buckets[slot.bucket];
            float* shard = grads_shard_ + k.shard_offset;
            for (size_t i = 0; i < k.shard_size; i++) shard[i] += slot.landing[i];
            for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
                if (*it == &slot) { in_flight_.erase(it); break; }
        }
        slot.bucket = -1;
    }

    float* param_for_update(const ZeroPlan::Bucket& k, size_t bucket_offset) {
        if (plan_.shards_parameters()) return params_shard_ + k.shard_offset + (bucket_offset - k.owned_begin);
        return params_full_ + k.padded_begin + bucket_offset;
    }

    const ParamLayout& layout_;
    ZeroPlan plan_;
    Communicator& comm_;
    std::vector<std::vector<float>> buffers_;
    size_t allocated_bytes_[(int)MemoryKind::Count] = {};
    float *params_full_ = nullptr, *params_shard_ = nullptr, *grads_full_ = nullptr, *grads_shard_ = nullptr;
    float *m_ = nullptr, *v_ = nullptr;
    ParamSlot embedding_params_, final_params_, layer_params_[2];
    GradSlot embedding_grads_, final_grads_, layer_grads_[2];
    std::deque<GradSlot*> in_flight_;
    std::vector<std::unique_ptr<CommHandle>> whole_step_ops_;
    double exposed_ms_ = 0;
};

}  // namespace llmc
