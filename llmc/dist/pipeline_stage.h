// pipeline_stage.h: one rank's part of a pipeline step, written once for both models. The schedule
// (pipeline_schedule.h) says which passes a rank runs in which order; this file runs them: which
// chunks of layers the rank holds (PipelineChunk), how many micro-batches' activations it keeps at
// once (StageShape), the step itself with its messages (run_pipeline_step), a forward pass through
// every stage for evaluation and sampling (run_pipeline_forward), and the tied embedding's gradient
// summed over the first and the last stage (sum_with_peer).
//
// A model takes part through PipelineStage: its forward and backward of one chunk, where a chunk's
// input and output live in an activation slot, a buffer messages land in, and how its memory is
// copied and ordered against communication. CPUModel's buffers are host memory and every call is
// synchronous; CUDAModel's are device memory behind a stream, and before_messages() orders the
// communicator after the work issued so far.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmc/dist/comm.h"
#include "llmc/dist/pipeline_schedule.h"
#include "llmc/utils.h"

namespace llmc {

// What part of the model a rank runs under pipeline parallelism, for sizing its activations: its
// `layers` layers in `chunks` chunks, the embedding and the head where it runs the first and the last
// virtual stage, and `slots` micro-batches' activations held at once (its schedule's peak). The
// default is the whole model, one micro-batch at a time.
struct StageShape {
    int layers = -1;  // -1: all of the model's
    int chunks = 1;
    bool embedding = true, head = true;
    bool pipelined = false;  // activations and their gradients travel between ranks
    int slots = 1;
};

// What pipeline rank `rank` runs and holds (the whole model without a pipeline).
inline StageShape pipeline_stage_shape(const PipelineParallel& pipe, int rank) {
    const PipelineSplit& split = pipe.split;  // empty (the default) is one stage too
    if (split.virtual_stages() == 1) return {};
    StageShape shape;
    shape.layers = (int)split.rank_layers(rank).size();
    shape.chunks = split.chunks;
    shape.embedding = split.holds_first(rank);
    shape.head = split.holds_last(rank);
    shape.pipelined = true;
    shape.slots =
        pipeline_activation_slots(make_pipeline_schedule(split.stages, pipe.micro_batches, split.chunks), rank);
    return shape;
}

// `pipe` for a model of num_layers layers on the pipeline group `pp` (an empty split: the even one),
// or a clear error naming `model`.
inline PipelineParallel checked_pipeline(const char* model, int num_layers, const Communicator& pp,
                                         PipelineParallel pipe) {
    if (pipe.split.layers.empty()) pipe.split = make_pipeline_split(num_layers, pp.world_size(), 1);
    const PipelineSplit& s = pipe.split;
    int layers = 0;
    for (int n : s.layers) layers += n;
    if (s.stages != pp.world_size() || (int)s.layers.size() != s.virtual_stages() || layers != num_layers)
        fail(strformat("%s: the pipeline split (%d stage(s) x %d chunk(s), layers %s) does not fit a pipeline group "
                       "of %d rank(s) and a model of %d layers",
                       model, s.stages, s.chunks, s.describe().c_str(), pp.world_size(), num_layers));
    if (s.chunks > 1 && s.stages == 1)
        fail(strformat("%s: an interleaved pipeline needs at least 2 stages (--pp-virtual > 1 with --pp 1)", model));
    if (pipe.micro_batches < 1)
        fail(strformat("%s: a pipeline step needs at least 1 micro-batch, got %d", model, pipe.micro_batches));
    return pipe;
}

// One of a rank's chunks: its local layers [begin, end), run as virtual stage `vstage`, which is the
// first (runs the embedding) or the last (runs the final norm and the head) or neither.
struct PipelineChunk {
    int begin, end, vstage;
    bool embedding, head;
};

// Rank `rank`'s chunks in virtual-stage order, its local layers numbered chunk after chunk
// (PipelineSplit::rank_layers).
inline std::vector<PipelineChunk> pipeline_chunks(const PipelineSplit& split, int rank) {
    std::vector<PipelineChunk> chunks;
    for (int c = 0, begin = 0; c < split.chunks; c++) {
        const int v = c * split.stages + rank;
        chunks.push_back({begin, begin + split.layers.at(v), v, v == 0, v == split.virtual_stages() - 1});
        begin += split.layers[v];
    }
    return chunks;
}

// A step's micro-batches as the model was given them (host token ids, micro-batch after micro-batch),
// kept for its PipelineStage calls while the step runs.
struct PipelineBatch {
    const int *inputs = nullptr, *targets = nullptr;
    int B = 1, T = 1;
    float grad_scale = 1.0f;
    int rows() const { return B * T; }
    const int* inputs_of(int mb) const { return inputs + (size_t)mb * B * T; }
    const int* targets_of(int mb) const { return targets + (size_t)mb * B * T; }
};

// What a model gives the pipeline step. Every buffer is in the model's memory (host or device) and
// holds one message: this rank's rows of the residual stream after a chunk (message_bytes).
class PipelineStage {
public:
    virtual ~PipelineStage() = default;
    // The forward of micro-batch `micro_batch` through chunk `chunk` in activation slot `slot`, its
    // input already in chunk_input (or the embedding's); returns the micro-batch's mean loss where
    // the chunk ends the model (anything elsewhere).
    virtual double pipeline_forward(int chunk, int micro_batch, int slot) = 0;
    // Its backward: from residual_grad() (the gradient of the chunk's output, or the loss where the
    // chunk ends the model) to residual_grad() holding the gradient of the chunk's input.
    virtual void pipeline_backward(int chunk, int micro_batch, int slot, bool last_micro_batch) = 0;
    virtual void* chunk_input(int chunk, int slot) = 0;
    virtual void* chunk_output(int chunk, int slot) = 0;
    virtual void* residual_grad() = 0;
    // Message buffers, apart from the slots: 0 receives, 1 and 2 send input gradients (one may still
    // be on its way while the other is filled).
    virtual void* message_buffer(int which) = 0;
    // Copies between the model's buffers, after the work issued before it.
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;
    // into[i] += from[i], both in the model's memory (float addition commutes, so two ranks adding
    // each other's parts get the same bits).
    virtual void add(float* into, const float* from, size_t count) = 0;
    // Messages on `comm` issued after this call see what the work issued before it wrote, and
    // overwrite only what it has finished reading (nothing to do where every call is synchronous).
    virtual void before_messages(Communicator& comm) { (void)comm; }
    // Waits for a message; the model counts the time as the pipeline's.
    virtual void wait(CommHandle h) { h.wait(); }
};

// Where a rank's pipeline messages travel: activations to the next stage and from the previous one,
// gradients the other way; each on a communicator, to or from the peer's rank in it. With interleaving
// the last rank's next stage is the first rank, and the first rank's previous stage the last.
struct PipelineLink {
    Communicator* comm = nullptr;
    int peer = -1;
};
struct PipelineLinks {
    PipelineLink send_activations, recv_activations, send_grads, recv_grads;
    std::vector<std::unique_ptr<Communicator>> owned;  // the communicators made for them
};

// One of a pipeline group's 2P directed edges (e = 2 x sender + 0 for activations, 1 for gradients).
struct PipelineEdge {
    int sender, receiver;
    bool activations;
};
inline PipelineEdge pipeline_edge(int e, int P) {
    const int s = e / 2;
    const bool activations = e % 2 == 0;
    return {s, activations ? (s + 1) % P : (s + P - 1) % P, activations};
}
// The colour rank `rank` splits with for edge e: e for the edge's two ranks; for any other rank one
// of its own (a group of one, dropped), as every rank takes part in every split.
inline int pipeline_edge_color(int e, int P, int rank) {
    const PipelineEdge x = pipeline_edge(e, P);
    return rank == x.sender || rank == x.receiver ? e : 2 * P + rank;
}

// The links of pipeline rank pp.rank() (collective over the pipeline group `pp`, which it splits).
//   per_edge false: two communicators, one per direction (pp itself for activations, a split of it
//     for gradients), so each carries the messages between two ranks in the order both post them.
//     Right for backends that complete a message whatever else is queued (MPI, and StagedComm).
//   per_edge true: a communicator per directed edge, so none carries both a rank's sends and its
//     receives. NCCL needs it: a communicator is one stream, whose later operations wait behind a
//     send until the peer receives, and the interleaved schedule posts its receive from the
//     previous stage before its own send to the next one on the same stream, on every rank at once.
inline PipelineLinks pipeline_links(Communicator& pp, bool per_edge) {
    const int P = pp.world_size(), r = pp.rank();
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    PipelineLinks links;
    if (!per_edge) {
        links.owned.push_back(pp.split(0, r));
        Communicator& grads = *links.owned.back();
        links.send_activations = {&pp, next};
        links.recv_activations = {&pp, prev};
        links.send_grads = {&grads, prev};
        links.recv_grads = {&grads, next};
        return links;
    }
    for (int e = 0; e < 2 * P; e++) {
        std::unique_ptr<Communicator> comm = pp.split(pipeline_edge_color(e, P, r), r);
        const PipelineEdge x = pipeline_edge(e, P);
        if (r != x.sender && r != x.receiver) continue;
        const int other = r == x.sender ? x.receiver : x.sender;
        const PipelineLink link{comm.get(), other < r ? 0 : 1};  // ranked by pipeline rank
        if (r == x.sender) (x.activations ? links.send_activations : links.send_grads) = link;
        else (x.activations ? links.recv_activations : links.recv_grads) = link;
        links.owned.push_back(std::move(comm));
    }
    return links;
}

// One step of a pipelined model on pipeline rank `rank`: its actions of the step's schedule (1F1B or
// interleaved), each the forward or backward of one micro-batch through one chunk. A chunk's input
// arrives from the previous virtual stage and its output leaves for the next; going backward, the
// output's gradient arrives and the input's leaves (on `links`). The receive an action needs is
// posted as soon as the one before it has landed, so it travels while this rank computes; sends go
// out as soon as their data is ready and are waited for only before their buffer is reused. A micro-batch's activations stay in one slot
// from its first forward on this rank to its last backward there; `slots` must cover the schedule's
// peak. Returns the sum of the micro-batches' losses on the rank of the last stage, 0 elsewhere.
// Every message is put on its way when it is issued (a look at its handle: NcclComm defers messages
// until then, to group an exchange), because this rank may next block on another communicator
// waiting for a message that the peer sends only after receiving this one.
inline double run_pipeline_step(PipelineStage& stage, const PipelineSplit& split, int rank, int micro_batches,
                                int slots, size_t message_bytes, const PipelineLinks& links) {
    const int m = micro_batches, S = split.virtual_stages();
    const PipeSchedule schedule = make_pipeline_schedule(split.stages, m, split.chunks);
    const std::vector<PipeAction>& actions = schedule.ranks.at(rank);
    if (pipeline_activation_slots(schedule, rank) > slots)
        fail(strformat("pipeline step: %d micro-batches hold %d micro-batches' activations on pipeline rank %d, but "
                       "the model was sized for %d (PipelineParallel::micro_batches)",
                       m, pipeline_activation_slots(schedule, rank), rank, slots));
    const std::vector<PipelineChunk> chunks = pipeline_chunks(split, rank);

    std::vector<int> slot_of(m, -1), pending(m, 0), free_slots;
    for (int s = slots - 1; s >= 0; s--) free_slots.push_back(s);
    std::vector<CommHandle> slot_send(slots);  // each slot's output, on its way forward
    CommHandle grad_send[2];                   // input gradients, from message buffers 1 and 2
    int grad_sends = 0;

    auto vstage = [&](const PipeAction& a) { return chunks[a.chunk].vstage; };
    auto needs_recv = [&](const PipeAction& a) { return a.op == PipeOp::Forward ? vstage(a) > 0 : vstage(a) < S - 1; };
    void* landing = stage.message_buffer(0);
    CommHandle recv;
    size_t recv_for = actions.size();  // the action whose receive is in flight (none)
    auto post_recv_after = [&](size_t i) {
        recv_for = actions.size();
        for (size_t j = i; j < actions.size(); j++)
            if (needs_recv(actions[j])) {
                const PipelineLink& link =
                    actions[j].op == PipeOp::Forward ? links.recv_activations : links.recv_grads;
                stage.before_messages(*link.comm);  // the previous message has been copied out of `landing`
                recv = link.comm->recv(landing, message_bytes, link.peer);
                recv.done();
                recv_for = j;
                return;
            }
    };
    post_recv_after(0);

    double loss_sum = 0.0;
    for (size_t i = 0; i < actions.size(); i++) {
        const PipeAction& act = actions[i];
        const PipelineChunk& ch = chunks[act.chunk];
        const int mb = act.micro_batch;
        const bool forward = act.op == PipeOp::Forward;
        if (forward && pending[mb]++ == 0) {
            slot_of[mb] = free_slots.back();
            free_slots.pop_back();
            stage.wait(slot_send[slot_of[mb]]);  // the slot's previous output has left
        }
        const int slot = slot_of[mb];
        if (recv_for == i) {
            stage.wait(recv);
            stage.copy(forward ? stage.chunk_input(act.chunk, slot) : stage.residual_grad(), landing, message_bytes);
            post_recv_after(i + 1);
        }
        if (forward) {
            const double loss = stage.pipeline_forward(act.chunk, mb, slot);
            if (ch.head) {
                loss_sum += loss;
            } else {
                stage.wait(slot_send[slot]);  // the slot's output of an earlier chunk (interleaved) has left
                const PipelineLink& link = links.send_activations;
                stage.before_messages(*link.comm);
                slot_send[slot] = link.comm->send(stage.chunk_output(act.chunk, slot), message_bytes, link.peer);
                slot_send[slot].done();  // a look sends a message NcclComm deferred (see comm_nccl.cuh)
            }
        } else {
            stage.pipeline_backward(act.chunk, mb, slot, mb == m - 1);
            if (!ch.embedding) {  // the gradient of the chunk's input goes back to the previous stage
                const int k = grad_sends++ % 2;
                stage.wait(grad_send[k]);
                void* buf = stage.message_buffer(1 + k);
                stage.copy(buf, stage.residual_grad(), message_bytes);
                const PipelineLink& link = links.send_grads;
                stage.before_messages(*link.comm);
                grad_send[k] = link.comm->send(buf, message_bytes, link.peer);
                grad_send[k].done();
            }
            if (--pending[mb] == 0) free_slots.push_back(slot);
        }
    }
    for (CommHandle& h : slot_send) stage.wait(h);
    for (CommHandle& h : grad_send) stage.wait(h);
    return loss_sum;
}

// A forward pass through every virtual stage in order, one micro-batch in slot 0, stage after stage:
// what evaluation and sampling run. `forward(chunk)` runs the model's pass of one of this rank's
// chunks (its input received into chunk_input) and returns its result; returns the last chunk's
// result on the rank of the last stage (0 elsewhere).
template <typename Forward>
double run_pipeline_forward(PipelineStage& stage, const PipelineSplit& split, int rank, size_t message_bytes,
                            const PipelineLinks& links, Forward forward) {
    double result = 0.0;
    const std::vector<PipelineChunk> chunks = pipeline_chunks(split, rank);
    for (int c = 0; c < (int)chunks.size(); c++) {
        const PipelineChunk& ch = chunks[c];
        if (!ch.embedding) {
            const PipelineLink& link = links.recv_activations;
            stage.before_messages(*link.comm);
            stage.wait(link.comm->recv(stage.chunk_input(c, 0), message_bytes, link.peer));
        }
        const double r = forward(c);
        if (ch.head) result = r;
        else {
            const PipelineLink& link = links.send_activations;
            stage.before_messages(*link.comm);
            stage.wait(link.comm->send(stage.chunk_output(c, 0), message_bytes, link.peer));
        }
    }
    return result;
}

// Sums a gradient that this rank and `peer` each hold a part of (the tied embedding: the first
// stage's encoder part, the last stage's head part): both end with the sum, the same bits on both.
// It travels in pieces through `scratch` (scratch_floats of the model's memory, which may differ
// between the two ranks: the pieces are the smaller one's), so no buffer the size of the gradient
// is needed.
inline void sum_with_peer(PipelineStage& stage, Communicator& comm, float* mine, size_t count, int peer,
                          float* scratch, size_t scratch_floats, Communicator& host) {
    uint64_t sizes[2] = {scratch_floats, 0};  // mine, the peer's
    CommHandle r = host.recv(&sizes[1], sizeof(uint64_t), peer);
    CommHandle s = host.send(&sizes[0], sizeof(uint64_t), peer);
    stage.wait(s);
    stage.wait(r);
    const size_t piece = (size_t)std::min(sizes[0], sizes[1]);
    if (piece == 0) fail("sum_with_peer: no scratch memory");
    for (size_t at = 0; at < count; at += piece) {
        const size_t n = std::min(piece, count - at);
        stage.before_messages(comm);  // `mine` is final and the previous piece has left `scratch`
        r = comm.recv(scratch, n * sizeof(float), peer);
        s = comm.send(mine + at, n * sizeof(float), peer);
        stage.wait(s);
        stage.wait(r);
        stage.add(mine + at, scratch, n);
    }
}

}  // namespace llmc
