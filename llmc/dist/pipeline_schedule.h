// pipeline_schedule.h: how a pipeline cuts the layers (PipelineSplit) and the order each rank runs
// its passes in (PipeSchedule: plain lists of actions, one list per rank). CPUModel::run_schedule
// executes them.
//
// The idea: with pipeline parallelism the model's layers are cut into stages on different ranks, and
// the step's m micro-batches flow through them: forward from the first stage to the last, backward
// back. A schedule says, for each rank, in which order it runs its (forward or backward, micro-batch,
// chunk) actions. It is only data, so it is printed (--pp-print-schedule) and checked here without
// a model: every micro-batch's forward on a stage comes after
// the previous stage's, its backward after the next stage's and after its own forward, and a
// simulation of the ranks exchanging activations and gradients finishes (no rank waits on a message
// that is never sent).
//
//   1F1B (PipeDream-flush, Narayanan et al. 2021): rank r of P first runs P - 1 - r forwards (the
//   warm-up), then alternates one forward and one backward, then runs the remaining backwards. At
//   most P - r micro-batches' activations are held at once, instead of all m (GPipe).
//   Interleaved 1F1B: each rank holds V chunks of layers (virtual stages r, r + P, r + 2P, ... of
//   V P), and micro-batches go through the chunks in groups of P, so the pipeline fills V times
//   faster and the bubble shrinks by V, at V times the point-to-point messages. Needs m % P == 0.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

enum class PipeOp { Forward, Backward };

struct PipeAction {
    PipeOp op;
    int micro_batch;
    int chunk;  // which of the rank's V chunks (0 for 1F1B): virtual stage chunk * P + rank
    bool operator==(const PipeAction&) const = default;
};

struct PipeSchedule {
    int stages = 1;         // P: ranks in the pipeline
    int chunks = 1;         // V: chunks per rank (1: plain 1F1B)
    int micro_batches = 1;  // m
    std::vector<std::vector<PipeAction>> ranks;  // ranks[r]: rank r's actions, in order

    int virtual_stages() const { return stages * chunks; }
    int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
};

// How a model's L layers are cut into the P x V virtual stages of a pipeline (stage v on rank v % P,
// as its chunk v / P): `layers[v]` consecutive layers each, in order. The first virtual stage also
// runs the embedding, the last the final norm and the head.
struct PipelineSplit {
    int stages = 1;           // P
    int chunks = 1;           // V
    std::vector<int> layers;  // per virtual stage

    int virtual_stages() const { return stages * chunks; }
    int first_layer(int vstage) const {
        int first = 0;
        for (int v = 0; v < vstage; v++) first += layers.at(v);
        return first;
    }
    int rank_of(int vstage) const { return vstage % stages; }
    // The global layers rank `rank` holds, ascending (its chunks' layers, chunk after chunk).
    std::vector<int> rank_layers(int rank) const {
        std::vector<int> out;
        for (int c = 0; c < chunks; c++) {
            const int v = c * stages + rank;
            for (int l = first_layer(v); l < first_layer(v) + layers.at(v); l++) out.push_back(l);
        }
        return out;
    }
    int last_rank() const { return rank_of(virtual_stages() - 1); }
    bool holds_first(int rank) const { return rank_of(0) == rank; }
    bool holds_last(int rank) const { return last_rank() == rank; }
    // The rank `rank` sums the tied embedding's gradient with: the last stage's for the first, the
    // first's for the last; -1 for a middle stage, or where one rank holds both.
    int tied_embedding_peer(int rank) const {
        if (holds_first(rank) == holds_last(rank)) return -1;
        return holds_first(rank) ? last_rank() : rank_of(0);
    }
    std::string describe() const {
        std::string out;
        for (int v = 0; v < virtual_stages(); v++) out += strformat("%s%d", v ? "," : "", layers[v]);
        return out;
    }
};

// How a model is cut over its pipeline group: which layers each virtual stage runs, and how many
// micro-batches a step's schedule has (which sets the activations held at once).
struct PipelineParallel {
    PipelineSplit split;  // empty: one stage, the whole model
    int micro_batches = 1;
    bool edge_links = false;  // a communicator per directed edge for the messages (pipeline_links)
};

// The split of num_layers layers over stages x chunks virtual stages: `spec` ("4,4,3,1": layers per
// virtual stage), or, when spec is empty, as even as it goes, the layers left over going to the
// virtual stages after the first (which also runs the embedding) from the second on.
inline PipelineSplit make_pipeline_split(int num_layers, int stages, int chunks, const std::string& spec = "") {
    PipelineSplit split;
    split.stages = stages;
    split.chunks = chunks;
    const int S = stages * chunks;
    if (stages < 1 || chunks < 1) fail(strformat("--pp %d and --pp-virtual %d must be at least 1", stages, chunks));
    if (spec.empty()) {
        if (num_layers < S)
            fail(strformat("--pp %d x --pp-virtual %d makes %d virtual stages, more than the model's %d layers (each "
                           "stage needs at least one)", stages, chunks, S, num_layers));
        split.layers.assign(S, num_layers / S);
        for (int v = 0; v < num_layers % S; v++) split.layers[(v + 1) % S]++;
        return split;
    }
    int total = 0;
    for (size_t at = 0; at <= spec.size();) {
        size_t end = spec.find(',', at);
        if (end == std::string::npos) end = spec.size();
        const std::string item = spec.substr(at, end - at);
        char* rest = nullptr;
        const long n = strtol(item.c_str(), &rest, 10);
        if (item.empty() || *rest != '\0' || n < 1 || n > num_layers)
            fail(strformat("--pp-layers '%s': '%s' is not a layer count in [1, %d] (expected one count per virtual "
                           "stage, comma-separated, e.g. 5,7)", spec.c_str(), item.c_str(), num_layers));
        split.layers.push_back((int)n);
        total += (int)n;
        at = end + 1;
    }
    if ((int)split.layers.size() != S)
        fail(strformat("--pp-layers '%s' names %zu stage(s) but --pp %d x --pp-virtual %d makes %d virtual stages",
                       spec.c_str(), split.layers.size(), stages, chunks, S));
    if (total != num_layers)
        fail(strformat("--pp-layers '%s' adds up to %d layers but the model has %d", spec.c_str(), total, num_layers));
    return split;
}

// How many micro-batches rank `rank` holds the activations of at once when it runs schedule s: a
// micro-batch's are kept from its first forward on the rank until its last backward there.
inline int pipeline_activation_slots(const PipeSchedule& s, int rank) {
    std::vector<int> pending(s.micro_batches, 0);  // per micro-batch: chunks forwarded, not yet backwarded
    int held = 0, peak = 0;
    for (const PipeAction& a : s.ranks.at(rank)) {
        int& p = pending[a.micro_batch];
        if (a.op == PipeOp::Forward && p++ == 0) held++;
        if (a.op == PipeOp::Backward && --p == 0) held--;
        peak = std::max(peak, held);
    }
    return peak;
}

// Whether every backward through the last virtual stage on rank `rank` directly follows the forward
// of the same micro-batch there (true of both schedules here: the last stage has no warm-up). A
// model may then keep what the head's forward leaves for its backward in scratch memory that the
// rank's other passes also use.
inline bool head_backward_follows_forward(const PipeSchedule& s, int rank) {
    const std::vector<PipeAction>& a = s.ranks.at(rank);
    const int head_chunk = s.chunks - 1;
    if (rank != (s.virtual_stages() - 1) % s.stages) return true;  // no head here
    for (size_t i = 0; i < a.size(); i++) {
        if (a[i].chunk != head_chunk) continue;
        const bool paired = a[i].op == PipeOp::Forward
                                ? i + 1 < a.size() && a[i + 1] == PipeAction{PipeOp::Backward, a[i].micro_batch, head_chunk}
                                : i > 0 && a[i - 1] == PipeAction{PipeOp::Forward, a[i].micro_batch, head_chunk};
        if (!paired) return false;
    }
    return true;
}

// The bubble fraction of the step the schedule idles in, with forward and backward of one
// micro-batch taking the same time on every stage: (P - 1) / (m + P - 1) for 1F1B, divided by V
// when interleaved.
inline double pipeline_bubble_fraction(int stages, int micro_batches, int chunks = 1) {
    return (double)(stages - 1) / (micro_batches + stages - 1) / chunks;
}

namespace detail {

// Megatron-LM's order of a rank's k-th forward (or backward) in the interleaved schedule:
// micro-batches go through the chunks in groups of P.
inline PipeAction interleaved_action(PipeOp op, int k, int P, int V) {
    const int group = k / (P * V), in_group = k % (P * V);
    int chunk = in_group / P;
    if (op == PipeOp::Backward) chunk = V - 1 - chunk;
    return {op, group * P + in_group % P, chunk};
}

}  // namespace detail

// 1F1B (chunks == 1) or interleaved 1F1B (chunks > 1) for `stages` ranks and `micro_batches` micro-batches.
inline PipeSchedule make_pipeline_schedule(int stages, int micro_batches, int chunks = 1) {
    if (stages < 1) fail(strformat("pipeline schedule: --pp must be at least 1, got %d", stages));
    if (micro_batches < 1)
        fail(strformat("pipeline schedule: the micro-batch count (gradient accumulation steps) must be at least 1, got %d",
                       micro_batches));
    if (chunks < 1) fail(strformat("pipeline schedule: --pp-virtual must be at least 1, got %d", chunks));
    if (chunks > 1 && micro_batches % stages != 0)
        fail(strformat("pipeline schedule: the interleaved schedule needs the micro-batch count (%d) to be a multiple "
                       "of --pp (%d)", micro_batches, stages));
    PipeSchedule s;
    s.stages = stages;
    s.chunks = chunks;
    s.micro_batches = micro_batches;
    const int P = stages, V = chunks, m = micro_batches, total = m * V;
    for (int r = 0; r < P; r++) {
        // Forwards run before the first backward: enough to fill the pipeline behind this rank.
        const int warmup = V == 1 ? std::min(P - 1 - r, m) : std::min((P - 1 - r) * 2 + (V - 1) * P, total);
        auto forward = [&](int k) { return V == 1 ? PipeAction{PipeOp::Forward, k, 0} : detail::interleaved_action(PipeOp::Forward, k, P, V); };
        auto backward = [&](int k) { return V == 1 ? PipeAction{PipeOp::Backward, k, 0} : detail::interleaved_action(PipeOp::Backward, k, P, V); };
        std::vector<PipeAction> actions;
        for (int k = 0; k < warmup; k++) actions.push_back(forward(k));
        for (int k = 0; k < total - warmup; k++) {
            actions.push_back(forward(warmup + k));
            actions.push_back(backward(k));
        }
        for (int k = total - warmup; k < total; k++) actions.push_back(backward(k));
        s.ranks.push_back(std::move(actions));
    }
    return s;
}

// The schedule as text, one line per rank: F3.1 is the forward of micro-batch 3 in chunk 1.
inline std::string pipeline_schedule_text(const PipeSchedule& s) {
    std::string out = strformat("pipeline schedule: %d stage(s) x %d chunk(s), %d micro-batch(es), bubble %.1f%%\n",
                                s.stages, s.chunks, s.micro_batches,
                                100 * pipeline_bubble_fraction(s.stages, s.micro_batches, s.chunks));
    for (int r = 0; r < (int)s.ranks.size(); r++) {
        out += strformat("  rank %d:", r);
        for (const PipeAction& a : s.ranks[r])
            out += s.chunks == 1 ? strformat(" %c%d", a.op == PipeOp::Forward ? 'F' : 'B', a.micro_batch)
                                 : strformat(" %c%d.%d", a.op == PipeOp::Forward ? 'F' : 'B', a.micro_batch, a.chunk);
        out += "\n";
    }
    return out;
}

// What running the schedule does, simulated with every forward taking `forward_time` and every
// backward `backward_time` and messages arriving at once: each action starts when its rank is free
// and its input exists (the previous virtual stage's forward of the micro-batch; the next virtual
// stage's backward of it and its own forward). Fails naming the stuck ranks if the ranks would wait
// on each other forever.
struct PipeSimulation {
    double makespan = 0;                  // time until the last action ends
    std::vector<double> busy;             // per rank: time spent computing
    std::vector<int> peak_in_flight;      // per rank: most (micro-batch, chunk) forwards not yet backwarded
    double bubble() const {               // idle time over the step, averaged over ranks
        double idle = 0;
        for (double b : busy) idle += makespan - b;
        return idle / (makespan * busy.size());
    }
};

inline PipeSimulation simulate_pipeline(const PipeSchedule& s, double forward_time = 1.0, double backward_time = 2.0) {
    const int P = s.stages, S = s.virtual_stages(), m = s.micro_batches;
    // done[op][virtual stage][micro-batch]: when that action ended (< 0: not yet)
    std::vector<std::vector<std::vector<double>>> done(2, std::vector<std::vector<double>>(S, std::vector<double>(m, -1)));
    std::vector<size_t> next(P, 0);
    std::vector<double> free_at(P, 0);
    PipeSimulation sim;
    sim.busy.assign(P, 0);
    sim.peak_in_flight.assign(P, 0);
    std::vector<int> in_flight(P, 0);
    size_t remaining = 0;
    for (const auto& actions : s.ranks) remaining += actions.size();
    while (remaining > 0) {
        bool progressed = false;
        for (int r = 0; r < P; r++) {
            if (next[r] >= s.ranks[r].size()) continue;
            const PipeAction& a = s.ranks[r][next[r]];
            if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= s.chunks)
                fail(strformat("pipeline schedule: rank %d's action %zu names micro-batch %d, chunk %d", r, next[r],
                               a.micro_batch, a.chunk));
            const int v = s.virtual_stage(r, a.chunk);
            double ready = free_at[r];
            bool inputs = true;
            auto needs = [&](int op, int stage) {
                if (stage < 0 || stage >= S) return;
                if (done[op][stage][a.micro_batch] < 0) inputs = false;
                else ready = std::max(ready, done[op][stage][a.micro_batch]);
            };
            if (a.op == PipeOp::Forward) {
                needs(0, v - 1);
            } else {
                needs(0, v);
                needs(1, v + 1);
            }
            if (!inputs) continue;
            const int op = a.op == PipeOp::Forward ? 0 : 1;
            if (done[op][v][a.micro_batch] >= 0)
                fail(strformat("pipeline schedule: rank %d runs %s of micro-batch %d in chunk %d twice", r,
                               op ? "the backward" : "the forward", a.micro_batch, a.chunk));
            const double t = op ? backward_time : forward_time;
            done[op][v][a.micro_batch] = free_at[r] = ready + t;
            sim.busy[r] += t;
            in_flight[r] += op ? -1 : 1;
            sim.peak_in_flight[r] = std::max(sim.peak_in_flight[r], in_flight[r]);
            sim.makespan = std::max(sim.makespan, free_at[r]);
            next[r]++;
            remaining--;
            progressed = true;
        }
        if (!progressed) {
            std::string stuck;
            for (int r = 0; r < P; r++)
                if (next[r] < s.ranks[r].size()) stuck += strformat(" %d", r);
            fail("pipeline schedule: deadlock: ranks" + stuck + " each wait for a message that is never sent");
        }
    }
    for (int v = 0; v < S; v++)
        for (int mb = 0; mb < m; mb++)
            if (done[0][v][mb] < 0 || done[1][v][mb] < 0)
                fail(strformat("pipeline schedule: micro-batch %d never runs %s on virtual stage %d", mb,
                               done[0][v][mb] < 0 ? "forward" : "backward", v));
    return sim;
}

}  // namespace llmc
