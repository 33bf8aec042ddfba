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
//
// Expert parallelism: a layer's expert bucket is sharded and reduced over the expert data group
// (the ranks that hold the same experts; zero_plan.h), every other bucket over the engine's
// data-parallel communicator; set_expert_parallel gives the engine that group.
//
// Hybrid sharding (HSDP, --dp-shard): the engine's communicator is one shard group, and the ranks
// that hold the same shard in the other groups are its replicas (set_replicas). Everything above
// happens inside the shard group (a stage 3 gather never leaves it); then, once a step's gradient is
// reduced there, each rank's part of it (its slice under stages 1-3, all of it under stage 0) is
// summed over the replicas, so every replica takes the same AdamW step on the whole data-parallel
// gradient while only 1/N of it crossed between the groups.
//
// A bucket may travel packed in stage 3's gathers (GatherCodec: the CUDA model's FP8 weights as one
// byte an element, models/cuda/fp8_gather.cuh): each rank packs its slice, the packed chunks are
// gathered, and the codec unpacks them once the gather has landed.
//
// One engine serves both models. Where its buffers live and how data moves in them is a Memory
// policy: HostMemory (host_memory.h: fp32 parameters that are their own master copy, for the CPU
// model), and DeviceMemory (device_memory.cuh: bf16 parameters with separate fp32 master weights,
// kernels on the compute stream, collectives ordered after it). The policy's precision decides the buffer list;
// the sharding logic is the same code for both.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/ckpt/shard_state.h"
#include "llmc/dist/comm.h"
#include "llmc/model.h"
#include "llmc/params/layout.h"
#include "llmc/dist/zero_plan.h"

namespace llmc {

// One buffer a model allocates: what it is for, its length in elements and the element size (the
// engine's buffers are fp32; the CUDA model's parameters are bf16, its activations counted in bytes).
struct BufferSpec {
    std::string name;
    MemoryKind kind;
    size_t count;
    size_t element_bytes = sizeof(float);
    size_t bytes() const { return count * element_bytes; }
};

// One copy of a checkpoint snapshot from the engine's memory into host memory.
struct HostCopy {
    void* host;
    const void* src;
    size_t bytes;
};

// How a model stores its parameters: their element size, and whether fp32 master weights are kept
// apart from them (and updated by AdamW, the parameters then being rounded copies).
struct ParamPrecision {
    size_t param_bytes;
    bool separate_master;
};
constexpr ParamPrecision FP32_PARAMETERS{sizeof(float), false};  // the CPU model
constexpr ParamPrecision BF16_PARAMETERS_FP32_MASTER{2, true};   // the CUDA model

// Every buffer the engine allocates for a plan (the single size function for engine and planner).
inline std::vector<BufferSpec> buffer_specs(const ZeroPlan& plan, ParamPrecision precision = FP32_PARAMETERS) {
    using K = MemoryKind;
    const size_t pb = precision.param_bytes;
    std::vector<BufferSpec> specs;
    if (!plan.shards_parameters()) {
        specs.push_back({"parameters", K::Parameters, plan.padded_num_params, pb});
    } else {
        specs.push_back({"parameter shard", K::Parameters, plan.shard_num_params, pb});
        for (const ZeroPlan::Bucket& k : plan.buckets)
            if (k.resident) specs.push_back({"gathered " + k.name, K::Parameters, k.padded_extent, pb});
        specs.push_back({"gathered " + plan.rotating_name() + " (2)", K::Parameters, 2 * plan.rotating_extent(), pb});
    }
    if (precision.separate_master) {
        if (plan.shards_optimizer())
            specs.push_back({"master weight shard", K::MasterWeights, plan.shard_num_params});
        else
            specs.push_back({"master weights", K::MasterWeights, plan.padded_num_params});
    }
    if (!plan.shards_gradients()) {
        specs.push_back({"gradients", K::Gradients, plan.padded_num_params});
        if (plan.shards_optimizer()) specs.push_back({"gradient shard", K::Gradients, plan.shard_num_params});
    } else {
        specs.push_back({"gradient shard", K::Gradients, plan.shard_num_params});
        size_t landing = 2 * plan.rotating_shard_size();
        for (const ZeroPlan::Bucket& k : plan.buckets)
            if (k.resident) {
                specs.push_back({k.name + " gradients", K::Gradients, k.padded_extent});
                landing += k.shard_size;
            }
        specs.push_back({plan.rotating_name() + " gradients (2)", K::Gradients, 2 * plan.rotating_extent()});
        specs.push_back({"reduce-scatter landing", K::CommBuffers, landing});
    }
    const size_t moments = plan.shards_optimizer() ? plan.shard_num_params : plan.padded_num_params;
    specs.push_back({"AdamW m", K::OptimizerState, moments});
    specs.push_back({"AdamW v", K::OptimizerState, moments});
    return specs;
}

// The buffers a checkpoint saves for a model of this precision (ckpt/shard_state.h), in file order.
inline std::vector<StateBuffer> checkpoint_buffers(ParamPrecision precision) {
    std::vector<StateBuffer> list = {{STATE_PARAMS, precision.param_bytes == 2 ? StateDtype::BF16 : StateDtype::F32}};
    if (precision.separate_master) list.push_back({STATE_MASTER, StateDtype::F32});
    list.push_back({STATE_ADAM_M, StateDtype::F32});
    list.push_back({STATE_ADAM_V, StateDtype::F32});
    return list;
}
// Host bytes of one rank's checkpoint snapshot: its owned slice of every bucket, in every buffer.
inline size_t checkpoint_snapshot_bytes(const ZeroPlan& plan, ParamPrecision precision) {
    size_t owned = 0, bytes = 0;
    for (const ZeroPlan::Bucket& k : plan.buckets) owned += k.owned_end - k.owned_begin;
    for (const StateBuffer& b : checkpoint_buffers(precision)) bytes += owned * state_dtype_bytes(b.dtype);
    return bytes;
}

// How a bucket's parameters travel in stage 3's all-gather when not as they are stored. The engine
// asks for this rank's slice packed (a chunk of chunk_bytes, the same on every rank), gathers every
// rank's chunk into the codec's landing buffer for the rotating gather buffer it uses (0 or 1), and,
// once the gather has landed, has the codec unpack them: what travelled as stored into that gather
// buffer (`whole`, where the model reads it through BucketView), the rest (the FP8 weights' codes)
// where the codec keeps it; `whole` holds nothing of the latter. Only rotating (non-resident)
// buckets may be packed. The codec runs its kernels on the memory's stream.
template <class Param>
class GatherCodec {
public:
    virtual ~GatherCodec() = default;
    virtual bool packs(int bucket) const = 0;
    virtual size_t chunk_bytes(int bucket) const = 0;
    // This rank's slice of the bucket packed, from `shard` (the rank's whole parameter shard, every
    // bucket's slice at its shard_offset) as of `version` (shared_params_version: packing may
    // exchange data between the ranks, so what decides it must be the same on every rank).
    virtual const void* pack(int bucket, const Param* shard, uint64_t version) = 0;
    virtual void* landing(int buffer) = 0;
    virtual void unpack(int bucket, int buffer, Param* whole) = 0;
    // The engine dropped every gathered buffer (invalidate_gathered).
    virtual void forget_gathered() = 0;
};

template <class Memory>
class ZeroEngine : public ShardedState {
public:
    using Param = typename Memory::Param;

    ZeroEngine(const ParamLayout& layout, const ZeroPlan& plan, Communicator& comm, Memory& memory)
        : layout_(layout), plan_(plan), comm_(comm), mem_(memory) {
        if (comm.world_size() != plan.world_size || comm.rank() != plan.rank)
            fail(strformat("ZeroEngine: the plan is for rank %d of %d but the communicator is rank %d of %d",
                           plan.rank, plan.world_size, comm.rank(), comm.world_size()));
        std::vector<void*> buffers;
        for (const BufferSpec& spec : buffer_specs(plan, Memory::precision)) {
            buffers.push_back(mem_.allocate(spec));
            allocated_bytes_[(int)spec.kind] += spec.bytes();
        }
        // Name the buffers in the order buffer_specs() made them.
        size_t i = 0;
        auto next_param = [&]() { return static_cast<Param*>(buffers[i++]); };
        auto next = [&]() { return static_cast<float*>(buffers[i++]); };
        // One slot per resident bucket, in bucket order, then the two rotating ones.
        int num_resident = 0;
        for (const ZeroPlan::Bucket& k : plan.buckets) resident_index_.push_back(k.resident ? num_resident++ : -1);
        resident_params_.resize(num_resident);
        resident_grads_.resize(num_resident);
        for (ParamSlot& s : resident_params_) param_slots_.push_back(&s);
        for (ParamSlot& s : rotating_params_) param_slots_.push_back(&s);
        const size_t rotating = plan.rotating_extent();
        if (!plan.shards_parameters()) {
            params_full_ = next_param();
        } else {
            params_shard_ = next_param();
            for (ParamSlot& slot : resident_params_) slot.data = next_param();
            Param* pair = next_param();
            rotating_params_[0].data = pair;
            rotating_params_[1].data = pair + rotating;
        }
        if (Memory::precision.separate_master) {
            if (plan.shards_optimizer()) master_shard_ = next();
            else master_full_ = next();
        }
        if (!plan.shards_gradients()) {
            grads_full_ = next();
            if (plan.shards_optimizer()) grads_shard_ = next();
        } else {
            grads_shard_ = next();
            for (GradSlot& slot : resident_grads_) slot.data = next();
            float* pair = next();
            rotating_grads_[0].data = pair;
            rotating_grads_[1].data = pair + rotating;
            // The landing buffer holds one slice per slot, in the same order.
            float* landing = next();
            for (size_t b = 0; b < plan.buckets.size(); b++)
                if (plan.buckets[b].resident) {
                    resident_grads_[resident_index_[b]].landing = landing;
                    landing += plan.buckets[b].shard_size;
                }
            rotating_grads_[0].landing = landing;
            rotating_grads_[1].landing = landing + plan.rotating_shard_size();
        }
        m_ = next();
        v_ = next();
    }

    const ZeroPlan& plan() const { return plan_; }
    // The whole parameter / gradient buffer, or nullptr where the stage shards it.
    Param* full_params() { return params_full_; }
    float* full_grads() { return grads_full_; }

    // Zeroes gradients and AdamW moments: a fresh start from new parameters.
    void reset_optimizer() {
        zero_grad();
        mem_.zero(m_, optimizer_count() * sizeof(float));
        mem_.zero(v_, optimizer_count() * sizeof(float));
    }
    size_t allocated_bytes(MemoryKind kind) const { return allocated_bytes_[(int)kind]; }

    // ---- parameters ----

    // Sets every parameter (and master weight) from a full fp32 host buffer in ParamLayout order
    // (the same on every rank).
    void set_params(const float* full) {
        for (size_t b = 0; b < plan_.buckets.size(); b++) {
            const auto& k = plan_.buckets[b];
            const size_t owned = k.owned_end - k.owned_begin;
            if (!plan_.shards_parameters())
                mem_.upload_params(params_full_ + k.padded_begin, full + k.begin, k.size);
            else
                mem_.upload_params(params_shard_ + k.shard_offset, full + k.begin + k.owned_begin, owned);
            if constexpr (Memory::precision.separate_master) {
                if (!plan_.shards_optimizer())
                    mem_.upload(master_full_ + k.padded_begin, full + k.begin, k.size);
                else
                    mem_.upload(master_shard_ + k.shard_offset, full + k.begin + k.owned_begin, owned);
            }
        }
        params_version_++, shared_params_version_++;
        invalidate_gathered();
    }

    // Writes every master weight (the parameters, where they are their own master) into the fp32
    // host buffer `full` in ParamLayout order. A collective where the master weights are sharded.
    void get_params(float* full) {
        for (size_t b = 0; b < plan_.buckets.size(); b++) {
            const auto& k = plan_.buckets[b];
            if constexpr (!Memory::precision.separate_master) {
                const Param* src = plan_.shards_parameters() ? gather_blocking((int)b) : params_full_ + k.padded_begin;
                mem_.download(full + k.begin, src, k.size);
            } else {
                const float* src = plan_.shards_optimizer() ? gather_master_blocking(k) : master_full_ + k.padded_begin;
                mem_.download(full + k.begin, src, k.size);
            }
        }
        invalidate_gathered();
    }

    // The bucket's parameters, whole (bucket-relative offsets as in ParamLayout::offset_in_bucket).
    // Under stage 3 this waits for the bucket's all-gather, starting it if no prefetch did.
    const Param* acquire_params(int bucket) {
        if (!plan_.shards_parameters()) return params_full_ + plan_.buckets[bucket].padded_begin;
        ParamSlot* slot = find_param_slot(bucket);
        if (!slot) {
            prefetch_params(bucket);
            slot = find_param_slot(bucket);
        }
        if (!slot) fail(strformat("ZeroEngine: no free parameter buffer for bucket %d (release one first)", bucket));
        finish(slot->pending);
        if (slot->packed) {
            codec_->unpack(bucket, rotating_index(slot), slot->data);
            slot->packed = false;
        }
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
        slot->packed = codec_ && codec_->packs(bucket);
        if (slot->packed) {
            const void* chunk = codec_->pack(bucket, params_shard_, shared_params_version_);
            mem_.before_collective(comm_of(k));
            slot->pending = std::make_unique<CommHandle>(comm_of(k).all_gather(
                chunk, codec_->landing(rotating_index(slot)), codec_->chunk_bytes(bucket), CommDtype::U8));
            return;
        }
        Param* own = slot->data + (size_t)k.rank * k.shard_size;
        mem_.copy(own, params_shard_ + k.shard_offset, k.shard_size * sizeof(Param));
        mem_.before_collective(comm_of(k));
        slot->pending =
            std::make_unique<CommHandle>(comm_of(k).all_gather(own, slot->data, k.shard_size, Memory::param_dtype));
    }
    // Stage 3: bucket gathers go through `codec` where it packs them (null: none do). The codec must
    // outlive the engine's use of it.
    void set_gather_codec(GatherCodec<Param>* codec) {
        if (codec)
            for (int b = 0; b < (int)plan_.buckets.size(); b++)
                if (codec->packs(b) && (plan_.buckets[b].resident || !plan_.shards_parameters()))
                    fail(strformat("ZeroEngine: bucket %d ('%s') cannot travel packed: only stage 3's rotating "
                                   "buckets are gathered so", b, plan_.buckets[b].name.c_str()));
        invalidate_gathered();
        codec_ = codec;
    }
    // The caller is done with the bucket's parameters for now (its buffer may be reused).
    void release_params(int bucket) {
        if (!plan_.shards_parameters()) return;
        if (ParamSlot* slot = find_param_slot(bucket)) slot->in_use = false;
    }

    // ---- gradients ----

    void zero_grad() {
        if (grads_full_) mem_.zero(grads_full_, plan_.padded_num_params * sizeof(float));
        if (grads_shard_) mem_.zero(grads_shard_, plan_.shard_num_params * sizeof(float));
    }

    // Where backward accumulates (+=) this bucket's gradient. Under stages 2-3 a zeroed bucket buffer,
    // valid until grads_ready(bucket); otherwise the bucket's part of the full gradient buffer.
    float* grad_buffer(int bucket) {
        if (!plan_.shards_gradients()) return grads_full_ + plan_.buckets[bucket].padded_begin;
        GradSlot* slot = grad_slot_for(bucket);
        fold(*slot);  // the buffer's previous reduce-scatter must land before it is overwritten
        slot->bucket = bucket;
        mem_.zero(slot->data, plan_.buckets[bucket].padded_extent * sizeof(float));
        return slot->data;
    }

    // Backward has finished this bucket's gradient for the current micro-batch. last_micro_batch:
    // the step's gradient is now complete, so stages 0-1 start its collective too.
    void grads_ready(int bucket, bool last_micro_batch) {
        const auto& k = plan_.buckets[bucket];
        Communicator& comm = comm_of(k);
        if (plan_.shards_gradients() || last_micro_batch) mem_.before_collective(comm);
        if (last_micro_batch) replicas_due_ = true;
        if (plan_.shards_gradients()) {
            GradSlot* slot = grad_slot_for(bucket);
            slot->pending = std::make_unique<CommHandle>(
                comm.reduce_scatter_sum(slot->data, slot->landing, k.shard_size, CommDtype::F32));
            in_flight_.push_back(slot);
        } else if (last_micro_batch) {
            float* grads = grads_full_ + k.padded_begin;
            if (plan_.shards_optimizer())
                whole_step_ops_.push_back(std::make_unique<CommHandle>(
                    comm.reduce_scatter_sum(grads, grads_shard_ + k.shard_offset, k.shard_size, CommDtype::F32)));
            else
                whole_step_ops_.push_back(
                    std::make_unique<CommHandle>(comm.all_reduce_sum(grads, k.padded_extent, CommDtype::F32)));
        }
    }

    // Waits for every gradient collective of this micro-batch and lands the results; after a step's
    // last micro-batch, sums the reduced gradient over the replicas (hybrid sharding).
    void finish_backward() {
        while (!in_flight_.empty()) {
            fold(*in_flight_.front());
        }
        for (auto& op : whole_step_ops_) finish(op);
        whole_step_ops_.clear();
        if (replicas_due_ && replicas_) sum_over_replicas();
        replicas_due_ = false;
        // Parameters gathered for this forward/backward are not kept between micro-batches.
        invalidate_gathered();
    }

    // ---- optimizer ----

    // Tensor parallelism: the model is cut over `tp` too (the layout is this tensor rank's piece), so
    // the gradient norm sums the cut tensors over the tensor group and counts the replicated ones
    // (LayerNorms, wpe, some biases; the same on every tensor rank) once.
    // (A host communicator: the scalars of the norm travel on it.)
    void set_tensor_parallel(Communicator& tp) {
        if (tp.uses_device_buffers())
            fail("ZeroEngine: the tensor-parallel group's communicator must work on host buffers");
        tp_ = &tp;
    }
    // Pipeline parallelism: the layout is one stage's part of the model, so the gradient norm sums
    // the stages (over `pp`, a host communicator) and leaves out a stage's copies (the tied embedding
    // on the last stage, counted by the first).
    void set_pipeline_parallel(Communicator& pp) {
        if (pp.uses_device_buffers())
            fail("ZeroEngine: the pipeline group's communicator must work on host buffers");
        pp_ = &pp;
    }

    // Expert parallelism: the layout holds the experts of `ep` rank ep.rank(), and `expert_data` is
    // the data-parallel group of the ranks that hold the same ones (the plan's expert buckets are
    // sharded over it). The gradient norm sums the experts over `ep` (host communicators).
    void set_expert_parallel(Communicator& expert_data, Communicator& ep) {
        if (expert_data.world_size() != plan_.expert_world_size || expert_data.rank() != plan_.expert_rank)
            fail(strformat("ZeroEngine: the plan's expert data rank is %d of %d but the communicator is rank %d of %d",
                           plan_.expert_rank, plan_.expert_world_size, expert_data.rank(), expert_data.world_size()));
        if (ep.uses_device_buffers()) fail("ZeroEngine: the expert-parallel group's communicator must work on host buffers");
        expert_comm_ = &expert_data;
        ep_ = &ep;
    }

    // Hybrid sharding: `replicas` holds this rank's place in every other shard group (the same slice
    // of every bucket), in the same order on every member. The plan's buckets must all be sharded over
    // the engine's communicator (no expert buckets over another group: their norm and their replicas
    // would be another group's).
    void set_replicas(Communicator& replicas) {
        replicas_ = nullptr;
        if (replicas.world_size() == 1) return;  // one group: nothing to sum, whatever the buckets
        for (const auto& k : plan_.buckets)
            if (k.world_size != plan_.world_size)
                fail(strformat("ZeroEngine: hybrid sharding needs every bucket sharded over the shard group; bucket "
                               "'%s' is sharded over %d ranks, the group has %d", k.name.c_str(), k.world_size,
                               plan_.world_size));
        replicas_ = &replicas;
    }
    int replica_rank() const { return replicas_ ? replicas_->rank() : 0; }

    // The squared global gradient norm (identical on every rank; a collective under stages 1-3 and
    // under tensor, pipeline and expert parallelism). Under stages 1-3 the data-parallel sum covers
    // the experts too: each expert element is owned by one rank of its expert data group, and each
    // expert-parallel rank's group holds other experts.
    double grad_norm_squared() {
        const bool split = tp_ && tp_->world_size() > 1, staged = pp_ && pp_->world_size() > 1;
        const bool experts_apart = ep_ && ep_->world_size() > 1 && !plan_.shards_optimizer();
        if (!split && !staged && !experts_apart) {
            if (!plan_.shards_optimizer()) return mem_.sum_squares(grads_full_, plan_.padded_num_params);
            const double local = mem_.sum_squares(grads_shard_, plan_.shard_num_params);
            return llmc::sum_over_ranks(host_comm(), local);
        }
        // cut tensors, replicated tensors, the experts' cut and replicated tensors (each expert's MLP
        // is cut over the tensor group as the dense one is)
        enum { CUT, REPLICATED, CUT_EXPERTS, REPLICATED_EXPERTS, KINDS };
        std::vector<double> sums(KINDS, 0.0);
        for_each_held_piece([&](const ZeroPlan::Bucket& k, const ParamLayout::Segment& seg, size_t lo, size_t hi) {
            const double squares = mem_.sum_squares(grad_for_update(k, lo), hi - lo);
            // A stage's copy counts once, on the stage that holds the original; but a non-finite
            // value in the copy (which AdamW would apply here alone) still makes the norm non-finite.
            if (layout_.is_stage_copy(seg.tensor) && std::isfinite(squares)) return;
            sums[(layout_.is_split(seg.tensor) ? CUT : REPLICATED) + (k.experts ? CUT_EXPERTS : 0)] += squares;
        });
        if (plan_.shards_optimizer()) {
            const std::vector<double> all = all_gather_doubles(host_comm(), sums);
            sums.assign(KINDS, 0.0);
            for (size_t i = 0; i < all.size(); i++) sums[i % KINDS] += all[i];
        }
        if (experts_apart)
            for (int kind : {CUT_EXPERTS, REPLICATED_EXPERTS}) sums[kind] = llmc::sum_over_ranks(*ep_, sums[kind]);
        const double cut = sums[CUT] + sums[CUT_EXPERTS];
        const double stage = (split ? llmc::sum_over_ranks(*tp_, cut) : cut) + sums[REPLICATED] + sums[REPLICATED_EXPERTS];
        return staged ? llmc::sum_over_ranks(*pp_, stage) : stage;
    }

    // The step's gradient of a bucket as AdamW will read it (after finish_backward): this rank's
    // shard of it, or all of it; count is set to its length. For summing a gradient that two
    // pipeline stages each hold a part of (the tied embedding), before the norm.
    float* update_grads(int bucket, size_t* count) {
        const auto& k = plan_.buckets.at(bucket);
        *count = plan_.shards_optimizer() ? k.owned_end - k.owned_begin : k.size;
        return grad_for_update(k, plan_.shards_optimizer() ? k.owned_begin : 0);
    }

    // AdamW on this rank's shard; then, under stages 1-2, every bucket's parameters are all-gathered.
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) {
        mem_.before_update();  // a checkpoint snapshot still copying must finish reading first
        for_each_held_piece([&](const ZeroPlan::Bucket& k, const ParamLayout::Segment& seg, size_t lo, size_t hi) {
            const float decay = layout_.is_decayed(seg.tensor) ? opt.weight_decay : 0.0f;
            const size_t state_at = plan_.shards_optimizer() ? k.shard_offset + (lo - k.owned_begin) : k.padded_begin + lo;
            mem_.adamw(param_for_update(k, lo), master_for(k, lo), grad_for_update(k, lo), m_ + state_at, v_ + state_at,
                       hi - lo, decay, opt, step, grad_multiplier, k.begin + lo);
        });
        if (plan_.shards_optimizer() && !plan_.shards_parameters()) {
            mem_.before_collective(comm_);
            if (expert_comm_) mem_.before_collective(*expert_comm_);
            for (const auto& k : plan_.buckets) {
                Param* bucket = params_full_ + k.padded_begin;
                whole_step_ops_.push_back(std::make_unique<CommHandle>(comm_of(k).all_gather(
                    bucket + (size_t)k.rank * k.shard_size, bucket, k.shard_size, Memory::param_dtype)));
            }
            for (auto& op : whole_step_ops_) finish(op);
            whole_step_ops_.clear();
        }
        params_version_++, shared_params_version_++;
        invalidate_gathered();
    }

    // Drops every gathered parameter buffer (stage 3): after a forward-only pass, and whenever the
    // parameters change.
    void invalidate_gathered() {
        for (ParamSlot* s : param_slots_) {
            finish(s->pending);
            s->bucket = -1;
            s->in_use = false;
            s->packed = false;
        }
        if (codec_) codec_->forget_gathered();
    }

    // Advances whenever the parameters change (set, updated, restored, a bit flipped): what a cast
    // of them (the FP8 weights, fp8_linears.cuh) is kept for.
    uint64_t params_version() const { return params_version_; }
    // Advances only with the changes every rank makes together (set, updated, restored; not a flipped
    // bit, which is one rank's): what a packed gather decides on (GatherCodec::pack).
    uint64_t shared_params_version() const { return shared_params_version_; }

    // Milliseconds the caller spent blocked on collectives since the last call.
    double take_exposed_comm_ms() {
        double ms = exposed_ms_;
        exposed_ms_ = 0;
        return ms;
    }

    // ---- checkpoint state (ckpt/shard_state.h) ----

    std::vector<StateBuffer> state_buffers() const override { return checkpoint_buffers(Memory::precision); }
    // This rank's ZeRO slice of every bucket, whatever the stage: under stage 0 the replicas are
    // the same, and each rank writing a different 1/N of them spreads the writing over all ranks.
    // Under hybrid sharding the first shard group's ranks write their slices and the replicas none
    // (they hold the same), so the files are those of a run sharded over one group.
    std::vector<FlatRange> owned_ranges() const override {
        std::vector<FlatRange> ranges;
        if (replica_rank() > 0) return ranges;
        for (const auto& k : plan_.buckets)
            if (k.owned_end > k.owned_begin) ranges.push_back({k.begin + k.owned_begin, k.begin + k.owned_end});
        return ranges;
    }
    void* snapshot_memory(size_t bytes) override { return mem_.snapshot_memory(bytes); }
    void start_snapshot(void* host) override {
        std::vector<HostCopy> copies;
        if (replica_rank() > 0) return mem_.start_host_copies(copies);  // owns nothing (owned_ranges)
        char* at = static_cast<char*>(host);
        const std::vector<StateBuffer> buffers = state_buffers();
        for (int b = 0; b < (int)buffers.size(); b++)
            for (const auto& k : plan_.buckets) {
                const size_t n = k.owned_end - k.owned_begin, bytes = n * state_dtype_bytes(buffers[b].dtype);
                if (n == 0) continue;
                copies.push_back({at, state_at(b, k, k.owned_begin), bytes});
                at += bytes;
            }
        mem_.start_host_copies(copies);
    }
    void wait_snapshot() override { mem_.wait_host_copies(); }

    std::vector<FlatRange> held_ranges(int buffer) const override {
        std::vector<FlatRange> ranges;
        for (const auto& k : plan_.buckets) {
            const bool sharded = buffer == 0 ? plan_.shards_parameters() : plan_.shards_optimizer();
            const size_t lo = sharded ? k.owned_begin : 0, hi = sharded ? k.owned_end : k.size;
            if (hi > lo) ranges.push_back({k.begin + lo, k.begin + hi});
        }
        return ranges;
    }
    void restore(int buffer, const std::function<void(FlatRange, float*)>& read) override {
        mem_.before_update();
        std::vector<float> staged;
        for (const FlatRange& r : held_ranges(buffer)) {
            staged.resize(r.size());
            read(r, staged.data());
            const int b = bucket_containing(r.begin);
            const size_t offset = r.begin - plan_.buckets[b].begin;
            void* dst = const_cast<void*>(state_at(buffer, plan_.buckets[b], offset));
            if (buffer == 0) mem_.upload_params(static_cast<Param*>(dst), staged.data(), r.size());
            else mem_.upload(static_cast<float*>(dst), staged.data(), r.size());
        }
        params_version_++, shared_params_version_++;
        invalidate_gathered();
        if constexpr (requires { mem_.release_transient(); }) mem_.release_transient();  // not planned memory
    }
    // ---- guards and fault injection (ckpt/shard_state.h) ----

    // Every bucket's parameters (padding left out), then the master weights where this rank holds
    // them whole (ZeRO-0 with separate master weights).
    std::optional<uint32_t> replica_fingerprint() override {
        if (plan_.shards_parameters()) return std::nullopt;
        uint32_t crc = 0;
        for (const auto& k : plan_.buckets) crc = mem_.crc32c(crc, params_full_ + k.padded_begin, k.size * sizeof(Param));
        if constexpr (Memory::precision.separate_master) {
            if (!plan_.shards_optimizer())
                for (const auto& k : plan_.buckets)
                    crc = mem_.crc32c(crc, master_full_ + k.padded_begin, k.size * sizeof(float));
        }
        return crc;
    }
    // The first element of the gradient this rank's norm reads: its shard, or the whole gradient.
    void poison_gradient() override {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        float* g = plan_.shards_optimizer() ? grads_shard_ : grads_full_ + plan_.buckets[0].padded_begin;
        mem_.write_bytes(g, &nan, sizeof(float));
    }
    // Bit 21 (fp32) or 5 (bf16) of the middle element of the first bucket in this rank's parameter
    // memory (and of its master weight where this rank holds that whole).
    std::string flip_parameter_bit() override {
        mem_.before_update();  // a checkpoint snapshot may still be reading the parameters
        const auto& k = plan_.buckets[0];
        size_t offset = k.size / 2;
        Param* p = params_full_ + k.padded_begin + offset;
        if (plan_.shards_parameters()) {
            offset = k.owned_begin;
            p = params_shard_ + k.shard_offset;
        }
        auto flip = [&](void* where, size_t bytes, int bit) {
            uint32_t word = 0;
            mem_.read_bytes(&word, where, bytes);
            word ^= 1u << bit;
            mem_.write_bytes(where, &word, bytes);
        };
        const int bit = sizeof(Param) == 4 ? 21 : 5;
        flip(p, sizeof(Param), bit);
        if constexpr (Memory::precision.separate_master) {
            if (!plan_.shards_optimizer()) flip(master_full_ + k.padded_begin + offset, sizeof(float), 21);
        }
        params_version_++;
        invalidate_gathered();
        return strformat("bit %d of parameter %zu (flat index)", bit, k.begin + offset);
    }

    std::vector<std::pair<std::string, uint64_t>> rng_states() const override {
        if constexpr (requires { mem_.sr_seed; }) return {{"stochastic_rounding_seed", mem_.sr_seed}};
        return {};
    }
    void set_rng_state(const std::string& name, uint64_t value) override {
        if constexpr (requires { mem_.sr_seed; }) {
            if (name == "stochastic_rounding_seed") {
                mem_.sr_seed = (uint32_t)value;
                return;
            }
        }
        ShardedState::set_rng_state(name, value);
    }

private:
    struct ParamSlot {
        Param* data = nullptr;
        int bucket = -1;
        bool in_use = false;
        bool packed = false;  // its gather is of packed chunks (GatherCodec), not yet unpacked
        std::unique_ptr<CommHandle> pending;
    };
    int rotating_index(const ParamSlot* slot) const {
        if (slot != &rotating_params_[0] && slot != &rotating_params_[1])
            fail("ZeroEngine: a packed gather into a resident bucket's buffer");
        return slot == &rotating_params_[0] ? 0 : 1;
    }
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

    // Stage 3 parameter buffers: each resident bucket has its own, the others share two.
    ParamSlot* find_param_slot(int bucket) {
        for (ParamSlot* s : param_slots_)
            if (s->bucket == bucket) return s;
        return nullptr;
    }
    ParamSlot* free_param_slot(int bucket) {
        if (resident_index_[bucket] >= 0) return &resident_params_[resident_index_[bucket]];
        for (ParamSlot& s : rotating_params_)
            if (!s.in_use && !s.pending) return &s;
        return nullptr;
    }
    const Param* gather_blocking(int bucket) {
        const Param* p = acquire_params(bucket);
        release_params(bucket);
        return p;
    }
    // A bucket's sharded master weights gathered whole, into the memory's transient buffer (saving).
    const float* gather_master_blocking(const ZeroPlan::Bucket& k) {
        float* whole = mem_.transient(k.padded_extent);
        float* own = whole + (size_t)k.rank * k.shard_size;
        mem_.copy(own, master_shard_ + k.shard_offset, k.shard_size * sizeof(float));
        mem_.before_collective(comm_of(k));
        CommHandle h = comm_of(k).all_gather(own, whole, k.shard_size, CommDtype::F32);
        wait_counted(h);
        return whole;
    }
    // Where the fp32 master copy of bucket k's element `bucket_offset` lives: the parameter itself
    // (no separate master), or the master buffer, laid out like the AdamW moments.
    float* master_for(const ZeroPlan::Bucket& k, size_t bucket_offset) {
        if constexpr (!Memory::precision.separate_master) {
            return param_for_update(k, bucket_offset);
        } else {
            if (!plan_.shards_optimizer()) return master_full_ + k.padded_begin + bucket_offset;
            return master_shard_ + k.shard_offset + (bucket_offset - k.owned_begin);
        }
    }
    // The group bucket k is reduced and sharded over.
    Communicator& comm_of(const ZeroPlan::Bucket& k) { return k.experts && expert_comm_ ? *expert_comm_ : comm_; }
    // The step's reduced gradient, as far as this rank holds it (its slices, or every bucket whole),
    // all-reduced over the replicas: one collective a bucket, in bucket order.
    void sum_over_replicas() {
        mem_.before_collective(*replicas_);
        for (const auto& k : plan_.buckets) {
            float* g = plan_.shards_optimizer() ? grads_shard_ + k.shard_offset : grads_full_ + k.padded_begin;
            const size_t n = plan_.shards_optimizer() ? k.shard_size : k.padded_extent;
            whole_step_ops_.push_back(
                std::make_unique<CommHandle>(replicas_->all_reduce_sum(g, n, CommDtype::F32)));
        }
        for (auto& op : whole_step_ops_) finish(op);
        whole_step_ops_.clear();
    }
    // Scalars (the gradient norm) travel through host memory on the host communicator.
    Communicator& host_comm() { return comm_.uses_device_buffers() ? mem_.host_comm(comm_) : comm_; }
    // Stage 2-3 gradient buffers: each resident bucket has its own, the others alternate two.
    GradSlot* grad_slot_for(int bucket) {
        if (resident_index_[bucket] >= 0) return &resident_grads_[resident_index_[bucket]];
        for (GradSlot& s : rotating_grads_)
            if (s.bucket == bucket) return &s;
        // the rotating buffer whose reduce-scatter was issued first is the one to reuse
        GradSlot& a = rotating_grads_[0];
        GradSlot& b = rotating_grads_[1];
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
            mem_.add(grads_shard_ + k.shard_offset, slot.landing, k.shard_size);
            for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
                if (*it == &slot) { in_flight_.erase(it); break; }
        }
        slot.bucket = -1;
    }

    // Where element `bucket_offset` of bucket k sits in state buffer `buffer` (state_buffers()
    // order); the element must be one this rank holds (held_ranges).
    const void* state_at(int buffer, const ZeroPlan::Bucket& k, size_t bucket_offset) const {
        auto in = [&](auto* full, auto* shard, bool sharded) -> const void* {
            return sharded ? shard + k.shard_offset + (bucket_offset - k.owned_begin) : full + k.padded_begin + bucket_offset;
        };
        if (buffer == 0) return in(params_full_, params_shard_, plan_.shards_parameters());
        if (Memory::precision.separate_master && buffer == 1)
            return in(master_full_, master_shard_, plan_.shards_optimizer());
        const int moment = buffer - (Memory::precision.separate_master ? 2 : 1);
        return moment == 0 ? in(m_, m_, plan_.shards_optimizer()) : in(v_, v_, plan_.shards_optimizer());
    }
    int bucket_containing(size_t flat) const {
        for (int b = 0; b < (int)plan_.buckets.size(); b++)
            if (flat >= plan_.buckets[b].begin && flat < plan_.buckets[b].begin + plan_.buckets[b].size) return b;
        fail(strformat("ZeroEngine: flat element %zu is past the last bucket", flat));
    }

    // Calls fn(bucket, segment, lo, hi) for every piece of one tensor slice that this rank's optimizer
    // updates: [lo, hi) relative to the bucket, its owned slice (or all of it under stage 0).
    template <typename Fn>
    void for_each_held_piece(Fn fn) {
        for (const auto& k : plan_.buckets) {
            const size_t lo = plan_.shards_optimizer() ? k.owned_begin : 0;
            const size_t hi = plan_.shards_optimizer() ? k.owned_end : k.size;
            for (const ParamLayout::Segment& seg : layout_.segments()) {
                if (seg.end <= k.begin + lo || seg.begin >= k.begin + hi) continue;
                fn(k, seg, std::max(lo, seg.begin > k.begin ? seg.begin - k.begin : 0), std::min(hi, seg.end - k.begin));
            }
        }
    }
    // The step's gradient of bucket k's element `bucket_offset` (one this rank updates).
    float* grad_for_update(const ZeroPlan::Bucket& k, size_t bucket_offset) {
        if (plan_.shards_optimizer()) return grads_shard_ + k.shard_offset + (bucket_offset - k.owned_begin);
        return grads_full_ + k.padded_begin + bucket_offset;
    }
    Param* param_for_update(const ZeroPlan::Bucket& k, size_t bucket_offset) {
        if (plan_.shards_parameters()) return params_shard_ + k.shard_offset + (bucket_offset - k.owned_begin);
        return params_full_ + k.padded_begin + bucket_offset;
    }

    const ParamLayout& layout_;
    ZeroPlan plan_;
    Communicator& comm_;
    Communicator* tp_ = nullptr;  // the tensor-parallel group, when the layout is a piece of the model
    Communicator* pp_ = nullptr;  // the pipeline group, when the layout is a stage's part of it
    Communicator* expert_comm_ = nullptr;  // the expert data group (expert buckets), when not comm_
    Communicator* replicas_ = nullptr;     // hybrid sharding: this shard's replicas (null: none)
    bool replicas_due_ = false;            // the step's last micro-batch ran: sum over the replicas
    Communicator* ep_ = nullptr;  // the expert-parallel group, when the layout holds some of the experts
    Memory& mem_;
    size_t allocated_bytes_[(int)MemoryKind::Count] = {};
    Param *params_full_ = nullptr, *params_shard_ = nullptr;
    float *master_full_ = nullptr, *master_shard_ = nullptr;  // separate master weights only
    float *grads_full_ = nullptr, *grads_shard_ = nullptr;
    float *m_ = nullptr, *v_ = nullptr;
    std::vector<int> resident_index_;  // per bucket: its slot in resident_params_/resident_grads_, or -1
    std::vector<ParamSlot> resident_params_;
    std::vector<GradSlot> resident_grads_;
    ParamSlot rotating_params_[2];
    std::vector<ParamSlot*> param_slots_;  // every one of the above (stage 3's gathered buffers)
    GradSlot rotating_grads_[2];
    std::deque<GradSlot*> in_flight_;
    std::vector<std::unique_ptr<CommHandle>> whole_step_ops_;
    double exposed_ms_ = 0;
    uint64_t params_version_ = 0, shared_params_version_ = 0;  // see params_version, shared_params_version
    GatherCodec<Param>* codec_ = nullptr;  // stage 3's packed gathers (set_gather_codec), or none
};

// A model's view of the engine during a pass: which buckets' parameters it holds (acquire and
// release, the next bucket prefetched) and where each bucket's gradient accumulates. Both models
// reach their parameters and gradients only through this, so they never know how they are sharded,
// and both walk their layers through enter_layer/leave_layer, so the ZeRO sequence (acquire,
// prefetch the next layer, take the gradient buffer, hand it over, release) is written once.
template <class Memory>
class BucketView {
public:
    using Param = typename Memory::Param;
    enum class Direction { Forward, Backward };

    BucketView(const ParamLayout& layout, ZeroEngine<Memory>& engine)
        : layout_(layout), engine_(engine), params_(layout.num_buckets(), nullptr),
          grads_(layout.num_buckets(), nullptr) {}

    // A tensor (one layer's slice of a per-layer tensor) in its acquired bucket.
    const Param* param(int tensor, int layer = 0) const {
        return params_[layout_.bucket_of(tensor, layer)] + layout_.offset_in_bucket(tensor, layer);
    }
    float* grad(int tensor, int layer = 0) const {
        return grads_[layout_.bucket_of(tensor, layer)] + layout_.offset_in_bucket(tensor, layer);
    }

    // Start of a pass: every resident bucket (used at both ends of the pass) is acquired, all their
    // gathers in flight before the first wait. They are held until release_all().
    void acquire_resident() {
        for (int b = 0; b < layout_.num_buckets(); b++)
            if (layout_.is_resident(b)) engine_.prefetch_params(b);
        for (int b = 0; b < layout_.num_buckets(); b++)
            if (layout_.is_resident(b)) params_[b] = engine_.acquire_params(b);
    }
    // Layer l's parameters (its bucket, and its expert bucket if it has one) for its forward or
    // backward, with the gather of the layer that comes next in that direction started (within the
    // pass's layers [first, end): a pipeline chunk's, or all); going backward, also the buffers its
    // gradient accumulates into.
    void enter_layer(int layer, Direction d, int first = 0, int end = -1) {
        if (end < 0) end = layout_.num_layers();
        const int next = d == Direction::Forward ? layer + 1 : layer - 1;
        const int next_bucket = next >= first && next < end ? layout_.layer_bucket(next) : -1;
        const int experts = layout_.expert_bucket(layer);
        acquire(layout_.layer_bucket(layer), experts < 0 ? next_bucket : -1);
        if (experts >= 0) acquire(experts, next_bucket);
        if (d == Direction::Backward) {
            take_grads(layout_.layer_bucket(layer));
            if (experts >= 0) take_grads(experts);
        }
    }
    // Done with layer l; going backward its gradient is complete and its collectives start.
    void leave_layer(int layer, Direction d, bool last_micro_batch = false) {
        for (int b : {layout_.layer_bucket(layer), layout_.expert_bucket(layer)}) {
            if (b < 0) continue;
            if (d == Direction::Backward) grads_ready(b, last_micro_batch);
            release(b);
        }
    }

    // Makes a bucket's parameters available (waiting for its gather under ZeRO-3) and starts
    // fetching the bucket that will be needed next (-1: none).
    void acquire(int bucket, int next_bucket) {
        params_[bucket] = engine_.acquire_params(bucket);
        if (next_bucket >= 0) engine_.prefetch_params(next_bucket);
    }
    void release(int bucket) {
        engine_.release_params(bucket);
        params_[bucket] = nullptr;
    }
    // Where this micro-batch's gradient of the bucket accumulates (a fresh zeroed buffer under ZeRO-2).
    void take_grads(int bucket) { grads_[bucket] = engine_.grad_buffer(bucket); }
    // The bucket's gradient for this micro-batch is complete (see ZeroEngine::grads_ready).
    void grads_ready(int bucket, bool last_micro_batch) { engine_.grads_ready(bucket, last_micro_batch); }
    // The pass is over: every gathered parameter buffer and every pointer is given up.
    void release_all() {
        engine_.invalidate_gathered();
        std::fill(params_.begin(), params_.end(), nullptr);
        std::fill(grads_.begin(), grads_.end(), nullptr);
    }

private:
    const ParamLayout& layout_;
    ZeroEngine<Memory>& engine_;
    std::vector<const Param*> params_;
    std::vector<float*> grads_;
};

}  // namespace llmc
