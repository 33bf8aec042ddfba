// ckpt/shard_state.h: ShardedState, what a checkpoint needs from a model: its training state as
// this rank holds it under ZeRO, in ParamLayout's flat element order.
//
// The state is a few flat buffers (parameters, fp32 master weights where the model keeps them apart,
// AdamW m and v), all indexed like the flat parameter buffer. A rank WRITES its owned ranges (its
// ZeRO slice of every bucket, whatever the stage, so every rank writes an equal part at once) and,
// on resume, FILLS the ranges it holds (everything under stage 0, its slice where the stage shards
// the buffer), which need not be what any one rank of the writing run owned: the checkpoint reader
// assembles them from whichever files hold them. ZeroEngine (dist/zero.h) implements this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// Element type of a saved buffer, as the manifest names it ("f32", "bf16").
enum class StateDtype { F32, BF16 };
inline size_t state_dtype_bytes(StateDtype d) { return d == StateDtype::F32 ? 4 : 2; }
inline const char* state_dtype_name(StateDtype d) { return d == StateDtype::F32 ? "f32" : "bf16"; }
inline StateDtype parse_state_dtype(const std::string& s, const std::string& where) {
    if (s == "f32") return StateDtype::F32;
    if (s == "bf16") return StateDtype::BF16;
    fail(strformat("%s: dtype '%s' is not one of f32, bf16", where.c_str(), s.c_str()));
}

// The names of the saved buffers. A checkpoint of a model without separate master weights (the
// fp32 CPU model) has no "master_weights"; its "params" are the fp32 master copy.
inline constexpr const char* STATE_PARAMS = "params";
inline constexpr const char* STATE_MASTER = "master_weights";
inline constexpr const char* STATE_ADAM_M = "adam_m";
inline constexpr const char* STATE_ADAM_V = "adam_v";

struct StateBuffer {
    std::string name;
    StateDtype dtype;
};

// Elements [begin, end) of ParamLayout's flat order.
struct FlatRange {
    size_t begin = 0, end = 0;
    size_t size() const { return end - begin; }
    bool operator==(const FlatRange&) const = default;
};

// Small state a model keeps whole and identical on every rank besides its tensors (the FP8 scaling
// histories): saved by name in the checkpoint's manifest when the checkpoint is taken, and given
// back on resume.
class ReplicatedState {
public:
    virtual ~ReplicatedState() = default;
    virtual std::vector<std::pair<std::string, std::vector<float>>> named_values() const = 0;
    // False for a name it does not keep (the checkpoint's run kept state this one does not).
    virtual bool restore(const std::string& name, const std::vector<float>& values, const std::string& where) = 0;
};

class ShardedState {
public:
    virtual ~ShardedState() = default;

    // The buffers a checkpoint saves, in the order the rank files hold them.
    virtual std::vector<StateBuffer> state_buffers() const = 0;
    // The ranges this rank writes, ascending (the same for every buffer).
    virtual std::vector<FlatRange> owned_ranges() const = 0;

    // Bytes of a snapshot: every buffer's owned elements, buffer after buffer, each in owned_ranges order.
    size_t snapshot_bytes() const {
        size_t elements = 0, bytes = 0;
        for (const FlatRange& r : owned_ranges()) elements += r.size();
        for (const StateBuffer& b : state_buffers()) bytes += elements * state_dtype_bytes(b.dtype);
        return bytes;
    }
    // Host memory for snapshots (pinned on a GPU), at least `bytes` long, owned by the model and
    // reused from one snapshot to the next.
    virtual void* snapshot_memory(size_t bytes) = 0;
    // Starts copying the snapshot into `host` (snapshot_bytes() long) and returns; the copy runs on
    // while the caller goes on with forward and backward, which do not change the state. The next
    // optimizer step waits for it, so the snapshot is of the state as it is now.
    virtual void start_snapshot(void* host) = 0;
    // Blocks until the snapshot started last is all in host memory. Any thread may call it.
    virtual void wait_snapshot() = 0;

    // The ranges this rank holds of buffer `buffer` (an index into state_buffers()), ascending.
    virtual std::vector<FlatRange> held_ranges(int buffer) const = 0;
    // Fills every held range of the buffer: read(range, out) must write the range's elements, as
    // fp32, to out. Gathered parameter copies are dropped (they are gathered again when needed).
    virtual void restore(int buffer, const std::function<void(FlatRange, float*)>& read) = 0;

    // ---- guards and fault injection (train_loop.h, faults.h) ----

    // CRC32C of this rank's copy of the replicated parameters (and of fp32 master weights where it
    // holds them whole), bitwise identical on every data-parallel replica of a healthy run; nullopt
    // where the parameters are sharded (ZeRO-3: nothing is replicated to compare).
    virtual std::optional<uint32_t> replica_fingerprint() { return std::nullopt; }
    // Fault injection: writes a NaN into one element of the gradient this rank feeds into the global
    // norm (after backward, before the norm).
    virtual void poison_gradient() { fail("this model has no gradient to poison"); }
    // Fault injection: flips one mantissa bit of one parameter in this rank's memory; says which.
    virtual std::string flip_parameter_bit() { fail("this model has no parameter bit to flip"); }

    // Small state the model keeps whole on every rank besides its tensors (ReplicatedState), if any.
    void attach_replicated_state(ReplicatedState* state) { replicated_ = state; }
    ReplicatedState* replicated_state() const { return replicated_; }

    // Named random-number states the model keeps (the CUDA model's stochastic-rounding seed).
    virtual std::vector<std::pair<std::string, uint64_t>> rng_states() const { return {}; }
    virtual void set_rng_state(const std::string& name, uint64_t value) {
        fail(strformat("this model keeps no random state named '%s' (value %llu)", name.c_str(),
                       (unsigned long long)value));
    }

private:
    ReplicatedState* replicated_ = nullptr;
};

}  // namespace llmc
