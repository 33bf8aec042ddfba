// models/parallel_groups.h: the communicators a model is given for each axis of the mesh (data,
// tensor, pipeline, context, expert) and what each axis cuts, in the terms any model family uses.
// dist/process_groups.h makes the communicators; a model's backend hands them over in these.
#pragma once

#include "llmc/dist/comm.h"
#include "llmc/dist/pipeline_schedule.h"
#include "llmc/params/layout.h"

namespace llmc {

// How a model is cut over its tensor-parallel group: `size` ranks, this one `rank`; with
// `sequence_parallel` the LayerNorms, the residual stream and the embedding hold n = BT/size of a
// batch's token rows (contiguous blocks in rank order). What the activation layout and the memory
// plan need to know, without a communicator.
struct TpShape {
    int size = 1, rank = 0;
    bool sequence_parallel = false;
    int rows(int BT) const { return sequence_parallel ? BT / size : BT; }
};

// Where a model's gradients and parameters are communicated, and how they are sharded. Under hybrid
// sharding (--dp-shard) `comm` and `host` are one shard group, `replicas` the groups' ranks that hold
// the same shard, and `whole` the whole data x context group (for what every replica must agree on:
// FP8's delayed scales).
struct DataParallel {
    Communicator* comm = nullptr;      // device buffers (NcclComm, StagedComm); nullptr: one rank, no launcher
    Communicator* host = nullptr;      // host buffers, for scalars (the gradient norm); nullptr: the local one
    Communicator* replicas = nullptr;  // device buffers; nullptr: no hybrid sharding
    Communicator* whole = nullptr;     // device buffers; nullptr: comm
    int zero_stage = 0;
};

// The tensor-parallel group of a model (see TpShape): the activations' collectives run on `comm`,
// the gradient norm's scalars and the whole-model gathers (save, get_master_weights) on `host`,
// which must span the same ranks in the same order.
struct TensorParallelGroup {
    Communicator* comm = nullptr;  // device buffers; nullptr: no tensor parallelism
    Communicator* host = nullptr;  // host buffers over the same ranks
    bool sequence_parallel = true;
    TpShape shape() const {
        const int size = comm ? comm->world_size() : 1;
        return {size, comm ? comm->rank() : 0, sequence_parallel && size > 1};
    }
};

// The pipeline group of a model and its cut into stages (pipeline_stage.h): activations and
// their gradients travel on `comm` (and on a second communicator split from it, one per direction);
// the losses, the logits, the gradient norm's scalars and the whole-model gathers on `host`, which
// must span the same ranks in the same order.
struct PipelineGroup {
    Communicator* comm = nullptr;  // device buffers; nullptr: no pipeline
    Communicator* host = nullptr;  // host buffers over the same ranks
    PipelineParallel pipe;         // the layers' split and a step's micro-batches
};

// The context-parallel group of a model (--cp, context_parallel.h): each rank holds 2 of the 2 x
// size chunks of every sequence; ring attention's key/value blocks and their gradients travel on
// `comm`, the loss sums and sampling's logits on `host`, which must span the same ranks in the same
// order. The data-parallel group of such a model is the data x context group (ZeRO sums the context
// ranks' partial gradients like data-parallel ones).
struct ContextParallelGroup {
    Communicator* comm = nullptr;  // device buffers; nullptr: no context parallelism
    Communicator* host = nullptr;  // host buffers over the same ranks
    int size() const { return comm ? comm->world_size() : 1; }
};

// The expert group of a model (--ep, dist/expert_parallel.h): ep data-parallel ranks that each
// hold a block of every MoE block's experts. Rows travel on `comm`, the routes' counts on `host`
// (the same ranks in the same order); `expert_data` (device buffers) is the group of data-parallel
// ranks that hold the same experts, over which ZeRO reduces and shards them.
struct ExpertParallelGroup {
    Communicator* comm = nullptr;         // device buffers; nullptr: no expert parallelism
    Communicator* host = nullptr;         // host buffers over the same ranks
    Communicator* expert_data = nullptr;  // device buffers
    EpShard shard() const { return comm ? EpShard{comm->rank(), comm->world_size()} : EpShard{}; }
};

}  // namespace llmc
