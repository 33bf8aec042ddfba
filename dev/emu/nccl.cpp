// dev/emu/nccl.cpp: the NCCL calls llmc makes, emulated over MPI, one emulated GPU per MPI process.
//
// The idea: a communicator is an MPI communicator, and each NCCL call is an MPI transfer that starts
// at the call and completes on the stream. A call first runs the stream's earlier work (its input
// is then ready), starts MPI's non-blocking operation into a staging buffer, and enqueues a
// StreamOp that tests it and, once it is done, reduces and writes the output. Starting at the call
// matters: llmc posts a receive, later the matching send, and the peer does the same, so nothing
// may wait at a call for something a peer does after its own call.
//
// What is emulated:
//   - ncclGetUniqueId, ncclCommInitRank(Config): the id carries the world rank of the process that
//     made it and a per-process counter. Only the members call init, so the members send their
//     world rank to that process (point-to-point on MPI_COMM_WORLD, tags kHelloTag and kReplyTag,
//     reserved here), it answers with the member list, and the members make the communicator with
//     MPI_Comm_create_group (collective over the members alone). The process that made the id must
//     be a member (llmc's rank 0 is).
//   - ncclCommSplit: every parent rank shares (color, key) with MPI_Iallgather on the parent, then
//     each color's members make their communicator with MPI_Comm_create_group. That is MPI_Comm_split
//     in two steps: the blocking step is left for when every member has already arrived, so the MPI
//     lock (which llmc's comm threads and heartbeat also take) is never held while waiting for a
//     rank that is still computing. NCCL_SPLIT_NOCOLOR gives a null communicator.
//   - config.blocking = 0: init and split return ncclInProgress until done, and
//     ncclCommGetAsyncError (which advances them) says ncclInProgress, then ncclSuccess. They may
//     also finish at once and return ncclSuccess. The parent of a split is in progress until the
//     split is done. Finalize is non-blocking the same way.
//   - A 1-rank communicator uses no MPI at all (MPI need not be initialised); a send to itself
//     goes through an in-process mailbox.
//   - AllReduce (sum, prod, max, min, avg), ReduceScatter, AllGather, Broadcast, Send, Recv, on
//     int8/uint8, int32/uint32, int64/uint64, fp16, fp32, fp64 and bf16 (fp8 moves but does not
//     reduce). ncclGroupStart/End collect calls and start them together at the outermost End, with
//     one StreamOp per stream in call order.
//   - Reductions gather every rank's buffer and combine it in rank order in fp32 (fp64 for fp64, the
//     type itself for integers), then round once, so every rank gets bitwise the same result.
//     ReduceScatter keeps this rank's slice of the same sum.
//   - Argument errors return NCCL's codes (ncclInvalidArgument, ncclInvalidUsage) with a message for
//     ncclGetLastError (printed to stderr too when NCCL_DEBUG is set); a buffer that is not device
//     memory, or a receive whose send has another size, is emu::fatal, as a GPU would fault or hang.
//   - Every MPI call holds llmc::mpi_mutex() (MPI is initialised MPI_THREAD_SERIALIZED) for that call
//     alone; all other state is guarded by emu::api_lock().
//
// What is not:
//   - No NVLink, network, channels, protocols or algorithms: results are not bitwise NCCL's. NCCL's
//     ring sums in another order and, for bf16 and fp16, rounds at every step; here each element is
//     summed in fp32 in rank order and rounded once. Timing and overlap are nothing like a GPU's.
//   - A call waits for its stream's earlier work, earlier NCCL calls on that stream included, where
//     a GPU returns at once and its kernel waits: a rank's second collective on a stream returns
//     only once every rank has issued the first. A program whose ranks need something this rank
//     does after that call, before they issue the first, hangs here and not on a GPU.
//   - No NCCL stream deadlock is detected. A send queued on a stream behind a receive whose matching
//     send the peer queues behind its own receive hangs on a GPU; here it hangs in the later call,
//     so a caller's timeout on an event never fires.
//   - Operations in one group on different streams do not make those streams wait for each other.
//   - MPI_Comm_create_group still blocks (holding the MPI lock) until every member has called it;
//     members get there right after the rendezvous, so that wait is short.
//   - A transfer is at most INT_MAX bytes per rank (MPI's int counts): larger is ncclInvalidArgument.
//   - Memory: a collective stages every rank's buffer (nranks x the buffer) on the receiving side.
//   - No ncclCommInitAll, ncclReduce, ncclAlltoAll, user reduction ops, buffer or window
//     registration, ncclMemAlloc, ncclCommShrink/Revoke. ncclCommInitRank inside a group is not
//     deferred to ncclGroupEnd. After destroy or abort a communicator's handle stays allocated (a few
//     bytes) so that using it is a clean ncclInvalidArgument instead of undefined behaviour; an
//     aborted communicator's in-flight buffers and MPI communicator are leaked (MPI may still write).
#include <nccl.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dev/emu/stream.h"
#include "llmc/dist/comm_mpi.h"  // llmc::mpi_mutex, llmc::PollBackoff, llmc::strformat

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

struct ncclComm;

namespace {

using Lock = std::unique_lock<std::recursive_mutex>;
using llmc::strformat;

// Tags reserved on MPI_COMM_WORLD for the init rendezvous (llmc sends nothing point-to-point on
// MPI_COMM_WORLD: its communicators are duplicates of it) and for MPI_Comm_create_group.
constexpr int kHelloTag = 31001, kReplyTag = 31002, kCreateTag = 31003;
// Every message of a communicator has one tag: MPI keeps the messages between two ranks in order,
// which is NCCL's rule for matching sends with receives.
constexpr int kP2pTag = 0;
constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's

// ---------------------------------------------------------------------------------------------
// Errors

char last_error[1024] = "";

// Records `message` for ncclGetLastError (and, in a group, for ncclGroupEnd) and returns `code`.
ncclResult_t fail(ncclResult_t code, const std::string& message);

[[noreturn]] void fatal(const char* call, const std::string& message) { emu::fatal(call, message.c_str()); }

std::string mpi_error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return strformat("MPI error %d", code);
    return std::string(text, length);
}

// Runs one MPI call under llmc's MPI lock (MPI_THREAD_SERIALIZED: one call at a time per process).
template <class Call>
int mpi(Call&& call) {
    std::lock_guard<std::mutex> lock(llmc::mpi_mutex());
    return call();
}

bool mpi_running() {
    int initialized = 0, finalized = 0;
    mpi([&] { return MPI_Initialized(&initialized); });
    mpi([&] { return MPI_Finalized(&finalized); });
    return initialized && !finalized;
}

// ---------------------------------------------------------------------------------------------
// Transfers: one NCCL call's data movement, started at the call (or ncclGroupEnd) and completed on
// its stream.

struct Transfer : std::enable_shared_from_this<Transfer> {
    enum class Stage { kCollected, kStarted, kTransferred, kDelivered, kFailed, kAbandoned };
    const char* call = "";  // "ncclAllReduce", for messages
    ncclComm* comm = nullptr;
    Stage stage = Stage::kCollected;
    size_t staging_bytes = 0;
    std::vector<char> staging;  // what MPI writes into, until the output is written
    std::vector<MPI_Request> requests;
    bool awaiting_self_send = false;  // a 1-rank communicator's receive waiting in the mailbox
    bool is_receive = false;          // its size is checked against the matching send's
    size_t expected_bytes = 0;
    std::function<int(Transfer&)> start;     // posts the MPI requests (or copies locally); an MPI code
    std::function<void(Transfer&)> deliver;  // writes the output from staging

    bool finished() const { return stage == Stage::kDelivered || stage == Stage::kFailed || stage == Stage::kAbandoned; }
    bool test();
    void finish();
};

std::vector<std::shared_ptr<void>>& abandoned() {
    static std::vector<std::shared_ptr<void>> kept;  // never freed: MPI may still write into them
    return kept;
}

// Communicator creations in progress (init rendezvous and splits), advanced by whoever polls.
struct Creation {
    uint64_t serial = 0;
    virtual ~Creation() = default;
    // One step that waits for nothing (except MPI_Comm_create_group, once every member is there).
    // True when done: the communicator exists, or its async error says why not.
    virtual bool advance() = 0;
    // Its communicator was aborted before it was done; what MPI may still write into is kept.
    virtual void abandon() {}
};

}  // namespace

// The handle behind ncclComm_t. Never deleted: a destroyed or aborted one stays as a tombstone.
struct ncclComm {
    int rank = 0, nranks = 1, device = 0;
    bool blocking = true;
    MPI_Comm mpi = MPI_COMM_NULL;      // MPI_COMM_NULL for one rank
    Creation* creation = nullptr;      // its init or split, while in progress
    int pending_splits = 0;            // splits of this communicator in progress
    bool finalizing = false, destroyed = false, aborted = false;
    ncclResult_t async_error = ncclSuccess;
    std::string error_message;  // the async error's
    std::vector<std::shared_ptr<Transfer>> in_flight;  // started, not yet delivered
    // A 1-rank communicator's messages to itself: sends not yet received, receives not yet sent.
    std::deque<std::vector<char>> self_mail;
    std::deque<std::shared_ptr<Transfer>> self_waiting;

    bool dead() const { return destroyed || aborted; }
    void set_async_error(ncclResult_t code, const std::string& message) {
        if (async_error != ncclSuccess) return;
        async_error = code;
        error_message = message;
        fail(code, message);
    }
};

namespace {

struct GroupState {
    int depth = 0;
    ncclResult_t error = ncclSuccess;  // the first failed call's, returned by ncclGroupEnd
    std::vector<std::pair<cudaStream_t, std::shared_ptr<Transfer>>> calls;
};
thread_local GroupState group;  // NCCL's groups are per thread

ncclResult_t fail(ncclResult_t code, const std::string& message) {
    snprintf(last_error, sizeof last_error, "%s", message.c_str());
    if (const char* debug = getenv("NCCL_DEBUG"); debug && strcmp(debug, "VERSION") != 0)
        fprintf(stderr, "emulated NCCL WARN %s\n", message.c_str());
    if (group.depth > 0 && group.error == ncclSuccess) group.error = code;
    return code;
}

// MPI_Testall of the transfer's requests; true once it no longer waits for MPI.
bool Transfer::test() {
    if (stage != Stage::kStarted) return true;
    if (awaiting_self_send) return false;
    if (requests.empty()) {
        stage = Stage::kTransferred;
        return true;
    }
    int done = 0;
    std::vector<MPI_Status> statuses(requests.size());
    int code = mpi([&] { return MPI_Testall((int)requests.size(), requests.data(), &done, statuses.data()); });
    if (code == MPI_ERR_IN_STATUS)
        for (const MPI_Status& status : statuses) {
            int error_class = MPI_SUCCESS;
            mpi([&] { return MPI_Error_class(status.MPI_ERROR, &error_class); });
            if (error_class == MPI_ERR_TRUNCATE)
                fatal(call, strformat("the matching ncclSend is longer than this receive of %zu bytes (a send and its "
                                      "receive must be the same size)", expected_bytes));
        }
    if (code != MPI_SUCCESS) {
        stage = Stage::kFailed;
        comm->set_async_error(ncclSystemError, strformat("%s on rank %d of %d failed in MPI: %s", call, comm->rank,
                                                         comm->nranks, mpi_error_text(code).c_str()));
        return true;
    }
    if (!done) return false;
    if (is_receive) {
        int got = 0;
        mpi([&] { return MPI_Get_count(&statuses[0], MPI_BYTE, &got); });
        if ((size_t)got != expected_bytes)
            fatal(call, strformat("received %d bytes from the matching ncclSend, expected %zu (a send and its receive "
                                  "must be the same size)", got, expected_bytes));
    }
    stage = Stage::kTransferred;
    return true;
}

void Transfer::finish() {
    if (stage != Stage::kTransferred) return;
    if (deliver) deliver(*this);
    stage = Stage::kDelivered;
    staging = std::vector<char>();
}

void start_transfer(Transfer& t) {
    std::erase_if(t.comm->in_flight, [](const std::shared_ptr<Transfer>& old) { return old->finished(); });
    t.comm->in_flight.push_back(t.shared_from_this());
    t.stage = Transfer::Stage::kStarted;
    t.staging.resize(t.staging_bytes);
    int code = t.start(t);
    if (code != MPI_SUCCESS) {
        t.stage = Transfer::Stage::kFailed;
        t.comm->set_async_error(ncclSystemError, strformat("%s on rank %d of %d could not start in MPI: %s", t.call,
                                                           t.comm->rank, t.comm->nranks, mpi_error_text(code).c_str()));
        return;
    }
    if (t.requests.empty() && !t.awaiting_self_send) t.stage = Transfer::Stage::kTransferred;
}

// The StreamOp's work: tests every transfer (each MPI_Test also drives MPI's progress), and once all
// are done writes their outputs in call order. With `block` it polls until then, never holding a
// lock while it sleeps.
bool complete(const std::vector<std::shared_ptr<Transfer>>& transfers, bool block) {
    llmc::PollBackoff backoff;
    for (;;) {
        {
            Lock lock(emu::api_lock());
            bool all_done = true;
            for (const auto& t : transfers) all_done = t->test() && all_done;
            if (all_done) {
                for (const auto& t : transfers) t->finish();
                return true;
            }
        }
        if (!block) return false;
        backoff.pause();
    }
}

// Starts a group's calls (or one call): runs each stream's earlier work, so that the inputs are
// ready, then starts every transfer in call order, then puts one StreamOp per stream on it.
ncclResult_t launch(const std::vector<std::pair<cudaStream_t, std::shared_ptr<Transfer>>>& calls) {
    std::vector<cudaStream_t> streams;
    for (const auto& [stream, t] : calls)
        if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
    ncclResult_t result = ncclSuccess;
    for (const auto& [stream, t] : calls) {
        if (t->comm->dead()) {
            t->stage = Transfer::Stage::kAbandoned;
            result = fail(ncclInvalidArgument, strformat("%s: the communicator was destroyed or aborted before "
                                                         "ncclGroupEnd", t->call));
            continue;
        }
    }
    for (cudaStream_t stream : streams) {
        std::vector<std::shared_ptr<Transfer>> on_stream;
        for (const auto& [s, t] : calls)
            if (s == stream) on_stream.push_back(t);
        emu::StreamOp op;
        op.what = calls.size() == 1 ? on_stream.front()->call : "ncclGroupEnd";
        // The transfers start when the stream reaches them (their inputs are then written); the
        // runtime runs the stream up to them at once, as far as it can without blocking.
        op.run = [on_stream](bool block) {
            for (const auto& t : on_stream)
                if (t->stage == Transfer::Stage::kCollected) start_transfer(*t);
            return complete(on_stream, block);
        };
        op.progress = true;
        emu::enqueue(stream, std::move(op));
    }
    return result;
}

// A call outside a group starts at once; inside one it waits for the outermost ncclGroupEnd.
ncclResult_t submit(cudaStream_t stream, std::shared_ptr<Transfer> t) {
    if (group.depth > 0) {
        group.calls.emplace_back(stream, std::move(t));
        return ncclSuccess;
    }
    return launch({{stream, std::move(t)}});
}

// ---------------------------------------------------------------------------------------------
// Argument checks

std::unordered_set<const ncclComm*>& all_comms() {
    static std::unordered_set<const ncclComm*> comms;  // every communicator made, tombstones included
    return comms;
}

// A handle this library made and that is neither destroyed nor aborted.
ncclResult_t check_live(const char* call, const ncclComm* comm) {
    if (!comm) return fail(ncclInvalidArgument, strformat("%s: comm is NULL", call));
    if (!all_comms().count(comm))
        return fail(ncclInvalidArgument, strformat("%s: comm %p is not a communicator (corrupted comm object)", call,
                                                   (const void*)comm));
    if (comm->dead())
        return fail(ncclInvalidArgument, strformat("%s: the communicator was %s", call,
                                                   comm->aborted ? "aborted (ncclCommAbort)" : "destroyed (ncclCommDestroy)"));
    return ncclSuccess;
}

// Ready for work, as NCCL's ncclCommEnsureReady: created, not finalized, no asynchronous error.
ncclResult_t check_ready(const char* call, const ncclComm* comm) {
    if (ncclResult_t bad = check_live(call, comm)) return bad;
    if (comm->creation || comm->pending_splits > 0)
        return fail(ncclInvalidArgument, strformat("%s: attempt to use the communicator before its initialisation or "
                                                   "split returned ncclSuccess (poll ncclCommGetAsyncError)", call));
    if (comm->async_error != ncclSuccess) {
        fail(comm->async_error, strformat("%s: the communicator has an asynchronous error: %s", call,
                                          comm->error_message.c_str()));
        return comm->async_error;
    }
    if (comm->finalizing) return fail(ncclInvalidUsage, strformat("%s: the communicator was finalized", call));
    return ncclSuccess;
}

size_t type_bytes(ncclDataType_t type) {
    switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

ncclResult_t check_type(const char* call, ncclDataType_t type) {
    if (type_bytes(type) == 0)
        return fail(ncclInvalidArgument, strformat("%s: invalid type %d (expected an ncclDataType_t below %d)", call,
                                                   (int)type, (int)ncclNumTypes));
    return ncclSuccess;
}

ncclResult_t check_reduction(const char* call, ncclDataType_t type, ncclRedOp_t op) {
    if (ncclResult_t bad = check_type(call, type)) return bad;
    if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2)
        return fail(ncclInvalidArgument, strformat("%s: reductions of fp8 (type %d) are not emulated", call, (int)type));
    if ((int)op < 0 || (int)op >= (int)ncclNumOps)
        return fail(ncclInvalidArgument, strformat("%s: reduction operation %d unknown to this communicator (expected "
                                                   "ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg)", call, (int)op));
    return ncclSuccess;
}

// The bytes one rank contributes: `count` elements, with `blocks` of them in a buffer (a
// reduce-scatter's input, an all-gather's output), within MPI's int counts.
ncclResult_t message_bytes(const char* call, size_t count, ncclDataType_t type, int blocks, size_t* bytes) {
    if (ncclResult_t bad = check_type(call, type)) return bad;
    size_t element = type_bytes(type);
    if (count > SIZE_MAX / element / (size_t)blocks)
        return fail(ncclInvalidArgument, strformat("%s: count %zu of %zu-byte elements overflows", call, count, element));
    *bytes = count * element;
    if (*bytes > (size_t)INT_MAX)
        return fail(ncclInvalidArgument, strformat("%s: %zu bytes per rank exceed the emulator's limit of %d (MPI's "
                                                   "int counts)", call, *bytes, INT_MAX));
    return ncclSuccess;
}

// NCCL needs its buffers in device memory; a host pointer would fault on the GPU.
void require_device(const char* call, const char* name, const void* ptr, size_t bytes) {
    if (bytes == 0 || emu::is_device_range(ptr, bytes)) return;
    fatal(call, strformat("%s %p .. +%zu bytes is not inside one cudaMalloc'd allocation (NCCL reads and writes device "
                          "memory only)", name, ptr, bytes));
}

ncclResult_t check_peer(const char* call, const ncclComm* comm, int peer) {
    if (peer < 0 || peer >= comm->nranks)
        return fail(ncclInvalidArgument, strformat("%s: peer %d out of range (the communicator has ranks 0..%d)", call,
                                                   peer, comm->nranks - 1));
    return ncclSuccess;
}

std::shared_ptr<Transfer> new_transfer(const char* call, ncclComm* comm, size_t staging_bytes) {
    auto t = std::make_shared<Transfer>();
    t->call = call;
    t->comm = comm;
    t->staging_bytes = staging_bytes;
    return t;
}

// ---------------------------------------------------------------------------------------------
// Reductions: element by element, the ranks' values combined in rank order in the accumulator
// type, rounded once into the output.

template <class T>
struct Element {
    using Acc = T;
    static Acc load(T v) { return v; }
    static T store(Acc a) { return a; }
};
template <>
struct Element<__nv_bfloat16> {
    using Acc = float;
    static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __nv_bfloat16 store(float a) { return __float2bfloat16_rn(a); }  // round to nearest even
};
template <>
struct Element<__half> {
    using Acc = float;
    static float load(__half v) { return __half2float(v); }
    static __half store(float a) { return __float2half_rn(a); }
};

// Integer sums and products wrap, as on the GPU, instead of being signed overflow.
template <class A>
A add(A a, A b) {
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a + (std::make_unsigned_t<A>)b);
    else return a + b;
}
template <class A>
A multiply(A a, A b) {
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a * (std::make_unsigned_t<A>)b);
    else return a * b;
}

// `blocks` holds `ranks` blocks of `count` elements, rank after rank.
template <class T, class Combine>
void reduce_blocks(const void* blocks, int ranks, size_t count, void* out, Combine combine, bool average) {
    using E = Element<T>;
    const T* in = (const T*)blocks;
    T* result = (T*)out;
    for (size_t i = 0; i < count; i++) {
        typename E::Acc acc = E::load(in[i]);
        for (int r = 1; r < ranks; r++) acc = combine(acc, E::load(in[(size_t)r * count + i]));
        if (average) acc = acc / (typename E::Acc)ranks;
        result[i] = E::store(acc);
    }
}

template <class T>
void reduce_typed(ncclRedOp_t op, const void* blocks, int ranks, size_t count, void* out) {
    using A = typename Element<T>::Acc;
    switch (op) {
    case ncclSum: return reduce_blocks<T>(blocks, ranks, count, out, add<A>, false);
    case ncclAvg: return reduce_blocks<T>(blocks, ranks, count, out, add<A>, true);
    case ncclProd: return reduce_blocks<T>(blocks, ranks, count, out, multiply<A>, false);
    case ncclMax: return reduce_blocks<T>(blocks, ranks, count, out, [](A a, A b) { return b > a ? b : a; }, false);
    case ncclMin: return reduce_blocks<T>(blocks, ranks, count, out, [](A a, A b) { return b < a ? b : a; }, false);
    default: fatal("reduction", strformat("operation %d passed the argument check", (int)op));
    }
}

void reduce(ncclDataType_t type, ncclRedOp_t op, const void* blocks, int ranks, size_t count, void* out) {
    switch (type) {
    case ncclInt8: return reduce_typed<int8_t>(op, blocks, ranks, count, out);
    case ncclUint8: return reduce_typed<uint8_t>(op, blocks, ranks, count, out);
    case ncclInt32: return reduce_typed<int32_t>(op, blocks, ranks, count, out);
    case ncclUint32: return reduce_typed<uint32_t>(op, blocks, ranks, count, out);
    case ncclInt64: return reduce_typed<int64_t>(op, blocks, ranks, count, out);
    case ncclUint64: return reduce_typed<uint64_t>(op, blocks, ranks, count, out);
    case ncclFloat16: return reduce_typed<__half>(op, blocks, ranks, count, out);
    case ncclFloat32: return reduce_typed<float>(op, blocks, ranks, count, out);
    case ncclFloat64: return reduce_typed<double>(op, blocks, ranks, count, out);
    case ncclBfloat16: return reduce_typed<__nv_bfloat16>(op, blocks, ranks, count, out);
    default: fatal("reduction", strformat("type %d passed the argument check", (int)type));
    }
}

// ---------------------------------------------------------------------------------------------
// Starting transfers. On one rank there is nothing to move: the staging buffer is the input.

int start_all_gather(Transfer& t, const void* send, size_t bytes) {
    if (t.comm->nranks == 1) {
        memcpy(t.staging.data(), send, bytes);
        return MPI_SUCCESS;
    }
    t.requests.resize(1);
    return mpi([&] {
        return MPI_Iallgather(send, (int)bytes, MPI_BYTE, t.staging.data(), (int)bytes, MPI_BYTE, t.comm->mpi,
                              &t.requests[0]);
    });
}

// Block r of every rank's `send` into block [rank] of this rank's staging: a reduce-scatter's inputs.
int start_all_to_all(Transfer& t, const void* send, size_t block_bytes) {
    if (t.comm->nranks == 1) {
        memcpy(t.staging.data(), send, block_bytes);
        return MPI_SUCCESS;
    }
    t.requests.resize(1);
    return mpi([&] {
        return MPI_Ialltoall(send, (int)block_bytes, MPI_BYTE, t.staging.data(), (int)block_bytes, MPI_BYTE,
                             t.comm->mpi, &t.requests[0]);
    });
}

int start_broadcast(Transfer& t, const void* send, size_t bytes, int root) {
    if (t.comm->rank == root) memcpy(t.staging.data(), send, bytes);
    if (t.comm->nranks == 1) return MPI_SUCCESS;
    t.requests.resize(1);
    return mpi([&] { return MPI_Ibcast(t.staging.data(), (int)bytes, MPI_BYTE, root, t.comm->mpi, &t.requests[0]); });
}

// A 1-rank communicator's send to itself: to the oldest waiting receive, or into the mailbox.
void send_to_self(Transfer& t, const void* send, size_t bytes) {
    ncclComm* comm = t.comm;
    if (comm->self_waiting.empty()) {
        comm->self_mail.emplace_back((const char*)send, (const char*)send + bytes);
        return;
    }
    std::shared_ptr<Transfer> recv = comm->self_waiting.front();
    comm->self_waiting.pop_front();
    if (recv->expected_bytes != bytes)
        fatal("ncclSend", strformat("sent %zu bytes to itself, but the matching ncclRecv expects %zu (a send and its "
                                    "receive must be the same size)", bytes, recv->expected_bytes));
    memcpy(recv->staging.data(), send, bytes);
    recv->awaiting_self_send = false;
    recv->stage = Transfer::Stage::kTransferred;
}

void receive_from_self(Transfer& t) {
    ncclComm* comm = t.comm;
    if (comm->self_mail.empty()) {
        t.awaiting_self_send = true;
        comm->self_waiting.push_back(t.shared_from_this());
        return;
    }
    std::vector<char> mail = std::move(comm->self_mail.front());
    comm->self_mail.pop_front();
    if (mail.size() != t.expected_bytes)
        fatal("ncclRecv", strformat("received %zu bytes from its own ncclSend, expected %zu (a send and its receive must "
                                    "be the same size)", mail.size(), t.expected_bytes));
    t.staging = std::move(mail);
}

// ---------------------------------------------------------------------------------------------
// Communicator creation

struct Process {
    uint64_t next_id = 0;      // this process's ids, so each rendezvous is told apart
    uint64_t next_serial = 0;  // creations'
    // In call order. Only the front advances: MPI_Comm_create_group must come in the same order on
    // every member, which is the order every member made its calls in.
    std::deque<std::unique_ptr<Creation>> creations;
    std::vector<std::array<int64_t, 4>> stashed_hellos;  // for ids whose rendezvous has not started
};
Process& process() {
    static Process p;
    return p;
}

void advance_creations() {
    auto& creations = process().creations;
    while (!creations.empty() && creations.front()->advance()) creations.pop_front();
}

bool creation_pending(uint64_t serial) {
    for (const auto& c : process().creations)
        if (c->serial == serial) return true;
    return false;
}

// Waits, polling, until `done`; api_lock is let go between polls so other threads' CUDA calls run.
template <class Done>
void wait_until(Lock& lock, Done done) {
    llmc::PollBackoff backoff;
    while (!done()) {
        lock.unlock();
        backoff.pause();
        lock.lock();
    }
}

Creation* enqueue_creation(std::unique_ptr<Creation> creation) {
    creation->serial = process().next_serial++;
    process().creations.push_back(std::move(creation));
    return process().creations.back().get();
}

// A blocking communicator's call returns once the creation is done; a non-blocking one's returns
// ncclInProgress while it is not.
ncclResult_t settle_creation(Lock& lock, uint64_t serial, bool blocking, const ncclComm* comm) {
    advance_creations();
    if (blocking) wait_until(lock, [&] {
        advance_creations();
        return !creation_pending(serial);
    });
    if (creation_pending(serial)) return ncclInProgress;
    return comm ? comm->async_error : ncclSuccess;
}

// Makes the communicator of `ranks` (ranks of `parent`, in the new rank order) on each of them.
int create_group(MPI_Comm parent, const std::vector<int>& ranks, MPI_Comm* out) {
    MPI_Group all = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
    int code = mpi([&] { return MPI_Comm_group(parent, &all); });
    if (code == MPI_SUCCESS) code = mpi([&] { return MPI_Group_incl(all, (int)ranks.size(), ranks.data(), &members); });
    if (code == MPI_SUCCESS) code = mpi([&] { return MPI_Comm_create_group(parent, members, kCreateTag, out); });
    if (code == MPI_SUCCESS) code = mpi([&] { return MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN); });
    if (members != MPI_GROUP_NULL) mpi([&] { return MPI_Group_free(&members); });
    if (all != MPI_GROUP_NULL) mpi([&] { return MPI_Group_free(&all); });
    return code;
}

// true once every request is complete; an MPI failure is returned in *code.
bool test_all(std::vector<MPI_Request>& requests, int* code) {
    int done = 0;
    *code = mpi([&] { return MPI_Testall((int)requests.size(), requests.data(), &done, MPI_STATUSES_IGNORE); });
    return *code != MPI_SUCCESS || done;
}

ncclComm* new_comm(int rank, int nranks, bool blocking) {
    auto* comm = new ncclComm;  // never deleted (see ncclComm)
    comm->rank = rank;
    comm->nranks = nranks;
    comm->blocking = blocking;
    if (cudaGetDevice(&comm->device) != cudaSuccess) comm->device = 0;
    all_comms().insert(comm);
    return comm;
}

bool blocking_config(const ncclConfig_t* config, bool inherited) {
    if (!config || config->blocking == NCCL_CONFIG_UNDEF_INT) return inherited;
    return config->blocking != 0;
}

ncclResult_t check_config(const char* call, const ncclConfig_t* config) {
    if (config && config->magic != kConfigMagic)
        return fail(ncclInvalidArgument, strformat("%s: the config was not initialised with NCCL_CONFIG_INITIALIZER "
                                                   "(magic 0x%x, expected 0x%x)", call, config->magic, kConfigMagic));
    return ncclSuccess;
}

// What ncclGetUniqueId writes into the id: who answers the rendezvous, and which of its ids it is.
struct IdContents {
    char tag[8];         // kIdTag: the id came from ncclGetUniqueId
    int32_t root_world;  // the world rank that made it; -1 when MPI was not running
    uint32_t unused;
    uint64_t counter;    // that process's count of ids
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES);
constexpr char kIdTag[8] = "emuNCCL";

// ncclCommInitRank with more than one rank: the members tell the id's maker their world ranks, it
// answers with the member list, and all of them make the MPI communicator.
class InitRendezvous : public Creation {
public:
    InitRendezvous(ncclComm* comm, const IdContents& id, int world_rank)
        : comm_(comm), id_(id), world_rank_(world_rank), members_(comm->nranks, -1) {}

    bool advance() override {
        for (;;) {
            int code = MPI_SUCCESS;
            switch (phase_) {
            case Phase::kStart:
                if (world_rank_ == id_.root_world) {
                    members_[comm_->rank] = world_rank_;
                    joined_ = 1;
                    phase_ = Phase::kCollect;
                } else {
                    if ((code = post_hello()) != MPI_SUCCESS) return failed_in_mpi(code);
                    phase_ = Phase::kAwaitReply;
                }
                break;
            case Phase::kCollect:
                if ((code = take_hellos()) != MPI_SUCCESS) return failed_in_mpi(code);
                if (status_ == ncclSuccess && joined_ < comm_->nranks) return false;
                if ((code = post_replies()) != MPI_SUCCESS) return failed_in_mpi(code);
                phase_ = Phase::kAwaitReply;
                break;
            case Phase::kAwaitReply:
                if (!test_all(requests_, &code)) return false;
                if (code != MPI_SUCCESS) return failed_in_mpi(code);
                if (world_rank_ != id_.root_world) read_reply();
                if (status_ != ncclSuccess) return done(status_, rejection_);
                phase_ = Phase::kCreate;
                break;
            case Phase::kCreate:
                if ((code = create_group(MPI_COMM_WORLD, members_, &comm_->mpi)) != MPI_SUCCESS)
                    return failed_in_mpi(code);
                return done(ncclSuccess, "");
            }
        }
    }

private:
    enum class Phase { kStart, kCollect, kAwaitReply, kCreate };

    int post_hello() {
        hello_ = {(int64_t)id_.counter, comm_->rank, comm_->nranks, world_rank_};
        reply_.assign(1 + comm_->nranks, 0);
        requests_.assign(2, MPI_REQUEST_NULL);
        int code = mpi([&] {
            return MPI_Isend(hello_.data(), 4, MPI_INT64_T, id_.root_world, kHelloTag, MPI_COMM_WORLD, &requests_[0]);
        });
        if (code != MPI_SUCCESS) return code;
        return mpi([&] {
            return MPI_Irecv(reply_.data(), (int)reply_.size(), MPI_INT, id_.root_world, kReplyTag, MPI_COMM_WORLD,
                             &requests_[1]);
        });
    }

    // The id's maker: takes this rendezvous's hellos, from the stash and from MPI, stashing others'.
    int take_hellos() {
        auto& stash = process().stashed_hellos;
        for (size_t i = 0; i < stash.size();) {
            if (stash[i][0] != (int64_t)id_.counter) {
                i++;
                continue;
            }
            record(stash[i]);
            stash.erase(stash.begin() + (ptrdiff_t)i);
        }
        for (;;) {
            int arrived = 0;
            MPI_Message message;
            int code = mpi([&] {
                return MPI_Improbe(MPI_ANY_SOURCE, kHelloTag, MPI_COMM_WORLD, &arrived, &message, MPI_STATUS_IGNORE);
            });
            if (code != MPI_SUCCESS || !arrived) return code;
            std::array<int64_t, 4> hello{};
            code = mpi([&] { return MPI_Mrecv(hello.data(), 4, MPI_INT64_T, &message, MPI_STATUS_IGNORE); });
            if (code != MPI_SUCCESS) return code;
            if (hello[0] == (int64_t)id_.counter) record(hello);
            else stash.push_back(hello);
        }
    }

    void record(const std::array<int64_t, 4>& hello) {
        const int64_t rank = hello[1], nranks = hello[2], world = hello[3];
        if (nranks != comm_->nranks) {
            reject(strformat("world rank %lld joined with nranks %lld, world rank %d with %d", (long long)world,
                             (long long)nranks, world_rank_, comm_->nranks));
        } else if (rank < 0 || rank >= nranks || members_[rank] != -1) {
            reject(strformat("world rank %lld joined as rank %lld, which is out of range or taken by world rank %d",
                             (long long)world, (long long)rank, rank >= 0 && rank < nranks ? members_[rank] : -1));
        } else {
            members_[rank] = (int)world;
            joined_++;
        }
        joined_world_.push_back((int)world);
    }

    void reject(const std::string& why) {
        if (status_ != ncclSuccess) return;
        status_ = ncclInvalidUsage;
        rejection_ = "ncclCommInitRank: the ranks disagree: " + why;
    }

    // Every member that joined gets the list (or the rejection).
    int post_replies() {
        reply_.assign(1 + comm_->nranks, 0);
        reply_[0] = (int)status_;
        std::copy(members_.begin(), members_.end(), reply_.begin() + 1);
        requests_.assign(joined_world_.size(), MPI_REQUEST_NULL);
        for (size_t i = 0; i < joined_world_.size(); i++) {
            int code = mpi([&] {
                return MPI_Isend(reply_.data(), (int)reply_.size(), MPI_INT, joined_world_[i], kReplyTag, MPI_COMM_WORLD,
                                 &requests_[i]);
            });
            if (code != MPI_SUCCESS) return code;
        }
        return MPI_SUCCESS;
    }

    void read_reply() {
        status_ = (ncclResult_t)reply_[0];
        if (status_ != ncclSuccess)
            rejection_ = strformat("ncclCommInitRank: the id's maker (world rank %d) rejected the communicator: the "
                                   "ranks disagree on nranks or on who is which rank", id_.root_world);
        std::copy(reply_.begin() + 1, reply_.end(), members_.begin());
    }

    bool failed_in_mpi(int code) {
        return done(ncclSystemError, strformat("ncclCommInitRank of rank %d of %d failed in MPI: %s", comm_->rank,
                                               comm_->nranks, mpi_error_text(code).c_str()));
    }
    bool done(ncclResult_t code, const std::string& message) {
        if (code != ncclSuccess) comm_->set_async_error(code, message);
        comm_->creation = nullptr;
        return true;
    }

    ncclComm* comm_;
    IdContents id_;
    int world_rank_;
    Phase phase_ = Phase::kStart;
    std::vector<int> members_;       // world ranks, by rank
    std::vector<int> joined_world_;  // the maker: who sent a hello
    int joined_ = 0;
    ncclResult_t status_ = ncclSuccess;
    std::string rejection_;
    std::array<int64_t, 4> hello_{};
    std::vector<int> reply_;  // [status, world rank of rank 0, 1, ...]
    std::vector<MPI_Request> requests_;
};

// ncclCommSplit: every parent rank's (color, key), then each color's communicator.
class Split : public Creation {
public:
    Split(ncclComm* parent, ncclComm* child, int color, int key)
        : parent_(parent), child_(child), color_(color), key_(key) {}

    // The parent no longer waits for it; its all-gather on the parent completes in MPI's background.
    void abandon() override { parent_->pending_splits--; }

    bool advance() override {
        int code = MPI_SUCCESS;
        if (parent_->dead()) return done(ncclInvalidUsage, "ncclCommSplit: the parent communicator was aborted");
        if (!started_) {
            started_ = true;
            gathered_.assign(2 * (size_t)parent_->nranks, 0);
            int mine[2] = {color_, key_};
            if (parent_->nranks == 1) {
                std::copy(mine, mine + 2, gathered_.begin());
            } else {
                requests_.assign(1, MPI_REQUEST_NULL);
                code = mpi([&] {
                    return MPI_Iallgather(mine, 2, MPI_INT, gathered_.data(), 2, MPI_INT, parent_->mpi, &requests_[0]);
                });
                if (code != MPI_SUCCESS) return failed_in_mpi(code);
            }
        }
        if (!requests_.empty() && !test_all(requests_, &code)) return false;
        if (code != MPI_SUCCESS) return failed_in_mpi(code);
        if (!child_) return done(ncclSuccess, "");
        std::vector<int> members = members_in_order();
        child_->nranks = (int)members.size();
        child_->rank = (int)(std::find(members.begin(), members.end(), parent_->rank) - members.begin());
        if (members.size() > 1 && (code = create_group(parent_->mpi, members, &child_->mpi)) != MPI_SUCCESS)
            return failed_in_mpi(code);
        return done(ncclSuccess, "");
    }

private:
    // The parent ranks of this color, by key and then parent rank (NCCL's and MPI_Comm_split's order).
    std::vector<int> members_in_order() const {
        std::vector<int> members;
        for (int r = 0; r < parent_->nranks; r++)
            if (gathered_[2 * r] == color_) members.push_back(r);
        std::stable_sort(members.begin(), members.end(),
                         [&](int a, int b) { return gathered_[2 * a + 1] < gathered_[2 * b + 1]; });
        return members;
    }

    bool failed_in_mpi(int code) {
        return done(ncclSystemError, strformat("ncclCommSplit of rank %d of %d failed in MPI: %s", parent_->rank,
                                               parent_->nranks, mpi_error_text(code).c_str()));
    }
    bool done(ncclResult_t code, const std::string& message) {
        parent_->pending_splits--;
        if (child_) {
            if (code != ncclSuccess) child_->set_async_error(code, message);
            child_->creation = nullptr;
        } else if (code != ncclSuccess) {
            fail(code, message);
        }
        return true;
    }

    ncclComm* parent_;
    ncclComm* child_;  // null for NCCL_SPLIT_NOCOLOR
    int color_, key_;
    bool started_ = false;
    std::vector<int> gathered_;  // (color, key) of every parent rank
    std::vector<MPI_Request> requests_;
};

// ---------------------------------------------------------------------------------------------
// Finalize, destroy, abort

// Tests every transfer still in flight; true when none is (the network is quiet).
bool transfers_done(ncclComm* comm) {
    bool done = true;
    for (const auto& t : comm->in_flight) done = t->test() && done;
    return done;
}

// The communicator's state, as ncclCommGetAsyncError reports it.
ncclResult_t comm_state(ncclComm* comm) {
    if (comm->async_error != ncclSuccess) return comm->async_error;
    if (comm->creation || comm->pending_splits > 0) return ncclInProgress;
    if (comm->finalizing && !transfers_done(comm)) return ncclInProgress;
    return ncclSuccess;
}

// Whatever MPI may still write into (transfers, a rendezvous) is kept for good; the stream's
// operations complete without writing outputs, as NCCL's kernels exit on abort.
void abandon_work(ncclComm* comm) {
    for (auto& t : comm->in_flight) {
        if (t->finished()) continue;
        t->stage = Transfer::Stage::kAbandoned;
        abandoned().push_back(t);
    }
    comm->in_flight.clear();
    comm->self_waiting.clear();
    // Its own creation stops here; the splits it is the parent of fail when next advanced.
    auto& creations = process().creations;
    for (auto it = creations.begin(); it != creations.end(); ++it)
        if (it->get() == comm->creation) {
            (*it)->abandon();
            abandoned().push_back(std::shared_ptr<Creation>(std::move(*it)));
            creations.erase(it);
            break;
        }
    comm->creation = nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The NCCL API

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (ncclGetLastError says more)";
    case ncclSystemError: return "unhandled system error (ncclGetLastError says more)";
    case ncclInternalError: return "internal error (ncclGetLastError says more)";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError says more)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError says more)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

// A communicator's own asynchronous error, else the process's last error (NCCL's is per process too).
const char* ncclGetLastError(ncclComm_t comm) {
    Lock lock(emu::api_lock());
    if (comm && all_comms().count(comm) && comm->async_error != ncclSuccess) return comm->error_message.c_str();
    return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    Lock lock(emu::api_lock());
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    IdContents id{};
    memcpy(id.tag, kIdTag, sizeof id.tag);
    id.root_world = -1;
    if (mpi_running()) mpi([&] { return MPI_Comm_rank(MPI_COMM_WORLD, &id.root_world); });
    id.counter = process().next_id++;
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
    Lock lock(emu::api_lock());
    const char* call = "ncclCommInitRank";
    if (!comm) return fail(ncclInvalidArgument, strformat("%s: comm is NULL", call));
    if (nranks < 1) return fail(ncclInvalidArgument, strformat("%s: invalid nranks %d (expected >= 1)", call, nranks));
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, strformat("%s: rank %d out of range (expected 0..%d)", call, rank, nranks - 1));
    if (ncclResult_t bad = check_config(call, config)) return bad;
    IdContents id;
    memcpy(&id, commId.internal, sizeof id);
    if (memcmp(id.tag, kIdTag, sizeof id.tag) != 0)
        return fail(ncclInvalidArgument, strformat("%s: the id did not come from ncclGetUniqueId (or not all of it "
                                                   "reached this rank)", call));
    int world_rank = 0, world_size = 1;
    if (nranks > 1) {
        if (!mpi_running())
            return fail(ncclInvalidUsage, strformat("%s: %d ranks need MPI (one emulated GPU per MPI process), and MPI "
                                                    "is not running", call, nranks));
        mpi([&] { return MPI_Comm_rank(MPI_COMM_WORLD, &world_rank); });
        mpi([&] { return MPI_Comm_size(MPI_COMM_WORLD, &world_size); });
        if (nranks > world_size)
            return fail(ncclInvalidArgument, strformat("%s: nranks %d exceeds MPI_COMM_WORLD's %d processes (the "
                                                       "emulator runs one rank per process)", call, nranks, world_size));
        if (id.root_world < 0 || id.root_world >= world_size)
            return fail(ncclInvalidUsage, strformat("%s: the id was made by world rank %d, not a rank of MPI_COMM_WORLD "
                                                    "(was it made before MPI_Init?)", call, id.root_world));
    }
    ncclComm* made = new_comm(rank, nranks, blocking_config(config, true));
    *comm = made;
    if (nranks == 1) return ncclSuccess;
    made->creation = enqueue_creation(std::make_unique<InitRendezvous>(made, id, world_rank));
    return settle_creation(lock, made->creation->serial, made->blocking, made);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    Lock lock(emu::api_lock());
    const char* call = "ncclCommSplit";
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (!newcomm) return fail(ncclInvalidArgument, strformat("%s: newcomm is NULL", call));
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, strformat("%s: invalid color %d (expected >= 0 or NCCL_SPLIT_NOCOLOR)", call, color));
    if (ncclResult_t bad = check_config(call, config)) return bad;
    bool blocking = blocking_config(config, comm->blocking);
    ncclComm* child = nullptr;
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = new_comm(0, 1, blocking);
        child->device = comm->device;
    }
    *newcomm = child;
    comm->pending_splits++;
    Creation* split = enqueue_creation(std::make_unique<Split>(comm, child, color, key));
    if (child) child->creation = split;
    return settle_creation(lock, split->serial, blocking, child);
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    Lock lock(emu::api_lock());
    if (ncclResult_t bad = check_ready("ncclCommUserRank", comm)) return bad;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    Lock lock(emu::api_lock());
    if (ncclResult_t bad = check_ready("ncclCommCount", comm)) return bad;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    Lock lock(emu::api_lock());
    if (ncclResult_t bad = check_ready("ncclCommCuDevice", comm)) return bad;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclAllReduce";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = check_reduction(call, datatype, op)) return bad;
    if (ncclResult_t bad = message_bytes(call, count, datatype, comm->nranks, &bytes)) return bad;
    require_device(call, "sendbuff", sendbuff, bytes);
    require_device(call, "recvbuff", recvbuff, bytes);
    const int ranks = comm->nranks;
    auto t = new_transfer(call, comm, ranks * bytes);
    t->start = [=](Transfer& t) { return start_all_gather(t, sendbuff, bytes); };
    t->deliver = [=](Transfer& t) { reduce(datatype, op, t.staging.data(), ranks, count, recvbuff); };
    return submit(stream, std::move(t));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclReduceScatter";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = check_reduction(call, datatype, op)) return bad;
    if (ncclResult_t bad = message_bytes(call, recvcount, datatype, comm->nranks, &bytes)) return bad;
    const int ranks = comm->nranks;
    require_device(call, "sendbuff", sendbuff, ranks * bytes);
    require_device(call, "recvbuff", recvbuff, bytes);
    auto t = new_transfer(call, comm, ranks * bytes);
    t->start = [=](Transfer& t) { return start_all_to_all(t, sendbuff, bytes); };
    t->deliver = [=](Transfer& t) { reduce(datatype, op, t.staging.data(), ranks, recvcount, recvbuff); };
    return submit(stream, std::move(t));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclAllGather";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = message_bytes(call, sendcount, datatype, comm->nranks, &bytes)) return bad;
    const size_t total = comm->nranks * bytes;
    require_device(call, "sendbuff", sendbuff, bytes);
    require_device(call, "recvbuff", recvbuff, total);
    auto t = new_transfer(call, comm, total);
    t->start = [=](Transfer& t) { return start_all_gather(t, sendbuff, bytes); };
    t->deliver = [=](Transfer& t) { memcpy(recvbuff, t.staging.data(), total); };
    return submit(stream, std::move(t));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclBroadcast";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = message_bytes(call, count, datatype, 1, &bytes)) return bad;
    if (root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, strformat("%s: invalid root %d (root should be in the 0..%d range)", call, root,
                                                   comm->nranks - 1));
    if (comm->rank == root) require_device(call, "sendbuff", sendbuff, bytes);  // read on the root only
    require_device(call, "recvbuff", recvbuff, bytes);
    auto t = new_transfer(call, comm, bytes);
    t->start = [=](Transfer& t) { return start_broadcast(t, sendbuff, bytes, root); };
    t->deliver = [=](Transfer& t) { memcpy(recvbuff, t.staging.data(), bytes); };
    return submit(stream, std::move(t));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclSend";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = message_bytes(call, count, datatype, 1, &bytes)) return bad;
    if (ncclResult_t bad = check_peer(call, comm, peer)) return bad;
    require_device(call, "sendbuff", sendbuff, bytes);
    auto t = new_transfer(call, comm, 0);
    // MPI reads the buffer while the send is in flight, as NCCL's kernel would: nothing on this
    // stream may write it before the send completes.
    t->start = [=](Transfer& t) {
        if (t.comm->nranks == 1) {
            send_to_self(t, sendbuff, bytes);
            return MPI_SUCCESS;
        }
        t.requests.resize(1);
        return mpi([&] { return MPI_Isend(sendbuff, (int)bytes, MPI_BYTE, peer, kP2pTag, t.comm->mpi, &t.requests[0]); });
    };
    return submit(stream, std::move(t));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Lock lock(emu::api_lock());
    const char* call = "ncclRecv";
    size_t bytes = 0;
    if (ncclResult_t bad = check_ready(call, comm)) return bad;
    if (ncclResult_t bad = message_bytes(call, count, datatype, 1, &bytes)) return bad;
    if (ncclResult_t bad = check_peer(call, comm, peer)) return bad;
    require_device(call, "recvbuff", recvbuff, bytes);
    auto t = new_transfer(call, comm, bytes);
    t->is_receive = true;
    t->expected_bytes = bytes;
    t->start = [=](Transfer& t) {
        if (t.comm->nranks == 1) {
            receive_from_self(t);
            return MPI_SUCCESS;
        }
        t.requests.resize(1);
        return mpi([&] {
            return MPI_Irecv(t.staging.data(), (int)bytes, MPI_BYTE, peer, kP2pTag, t.comm->mpi, &t.requests[0]);
        });
    };
    t->deliver = [=](Transfer& t) { memcpy(recvbuff, t.staging.data(), bytes); };
    return submit(stream, std::move(t));
}

ncclResult_t ncclGroupStart() {
    if (group.depth == 0) group.error = ncclSuccess;
    group.depth++;
    return ncclSuccess;
}

// The outermost End starts the collected calls; a call that failed its checks fails the whole group.
ncclResult_t ncclGroupEnd() {
    Lock lock(emu::api_lock());
    if (group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group (no matching ncclGroupStart)");
    if (--group.depth > 0) return ncclSuccess;
    auto calls = std::move(group.calls);
    group.calls.clear();
    ncclResult_t error = group.error;
    group.error = ncclSuccess;
    if (error != ncclSuccess) return error;
    return launch(calls);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    Lock lock(emu::api_lock());
    if (ncclResult_t bad = check_live("ncclCommGetAsyncError", comm)) return bad;
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    advance_creations();
    *asyncError = comm_state(comm);
    return ncclSuccess;
}

// Finishes the communicator's transfers with its peers (its streams still deliver the outputs).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    Lock lock(emu::api_lock());
    if (ncclResult_t bad = check_ready("ncclCommFinalize", comm)) return bad;
    comm->finalizing = true;
    if (comm->blocking) wait_until(lock, [&] { return transfers_done(comm); });
    return transfers_done(comm) ? ncclSuccess : ncclInProgress;
}

// Destroying a communicator that was not finalized finalizes it first, blocking, as NCCL does.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    Lock lock(emu::api_lock());
    if (!comm) return ncclSuccess;
    if (ncclResult_t bad = check_live("ncclCommDestroy", comm)) return bad;
    if (comm->creation || comm->pending_splits > 0)
        return fail(ncclInvalidArgument, "ncclCommDestroy: the communicator's initialisation or split is still in "
                                         "progress (ncclCommAbort stops it)");
    comm->finalizing = true;
    wait_until(lock, [&] { return transfers_done(comm); });
    if (comm->mpi != MPI_COMM_NULL) mpi([&] { return MPI_Comm_free(&comm->mpi); });
    comm->destroyed = true;
    comm->self_mail.clear();
    comm->self_waiting.clear();
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    Lock lock(emu::api_lock());
    if (!comm) return ncclSuccess;
    if (ncclResult_t bad = check_live("ncclCommAbort", comm)) return bad;
    abandon_work(comm);
    comm->aborted = true;
    return ncclSuccess;
}

}  // extern "C"
