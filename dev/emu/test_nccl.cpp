// dev/emu/test_nccl.cpp: the emulated NCCL (dev/emu/nccl.cpp) on 1, 2 and 4 MPI ranks, as llmc's
// comm_nccl.cuh uses it. A plain MPI program (Catch2 does not run under mpirun): every rank runs
// every check; a failure prints the check's name and the rank and aborts the launch (exit 1).
// Run by dev/emu/run_nccl_test.sh. Two modes must instead end the process with an error naming the
// call: `--host-buffer` passes a host buffer to ncclAllReduce; `--short-receive` (2 ranks) receives
// 4 floats of an 8-float send.
//
// Each check states the property it holds:
//   - init from an id broadcast over MPI (non-blocking, polled like llmc; blocking; an id made by
//     a rank that is not rank 0 of the new communicator; a subset of the world the others skip),
//   - split into several colors ordered by key, NCCL_SPLIT_NOCOLOR giving a null communicator,
//   - all-reduce (fp32 and bf16 sums bitwise equal to a rank-order fp32 sum rounded once; int32
//     max/min/prod; fp32 avg; in place), reduce-scatter (this rank's slice of that same sum),
//     all-gather (also in place), broadcast from a non-zero root (also in place),
//   - sends and receives to both neighbours in one group, small and large (past MPI's eager limit),
//   - a receive posted before the peer issues its send, on another stream than this rank's send,
//   - asynchronous error ncclSuccess, argument errors with NCCL's codes, abort, finalize, destroy.
#include <nccl.h>
#include <cuda_bf16.h>

#include "llmc/dist/comm_mpi.h"  // llmc::mpi_mutex

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int world_rank = 0, world_size = 1;

[[noreturn]] void fail_check(const char* check, const std::string& detail) {
    fprintf(stderr, "rank %d of %d: FAIL %s: %s\n", world_rank, world_size, check, detail.c_str());
    fflush(stderr);
    std::lock_guard<std::mutex> lock(llmc::mpi_mutex());
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::exit(1);
}

void expect(bool ok, const char* check, const std::string& detail) {
    if (!ok) fail_check(check, detail);
}

void expect_nccl(ncclResult_t got, ncclResult_t want, const char* check, const char* call) {
    if (got != want)
        fail_check(check, llmc::strformat("%s returned %d (%s), expected %d (%s); last error: %s", call, (int)got,
                                          ncclGetErrorString(got), (int)want, ncclGetErrorString(want),
                                          ncclGetLastError(nullptr)));
}
#define NCCL_OK(call, check) expect_nccl((call), ncclSuccess, check, #call)

// The host's MPI calls hold llmc's lock too, as llmc's own do.
template <class Call>
void host_mpi(Call&& call) {
    std::lock_guard<std::mutex> lock(llmc::mpi_mutex());
    call();
}

// Every rank got here; rank 0 reports the check as passed.
void passed(const char* check) {
    host_mpi([] { MPI_Barrier(MPI_COMM_WORLD); });
    if (world_rank == 0) printf("ok %d rank(s): %s\n", world_size, check);
    fflush(stdout);
}

template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t count = 0;
    explicit DeviceBuffer(size_t n) : count(n) {
        if (cudaMalloc((void**)&ptr, n * sizeof(T)) != cudaSuccess) fail_check("cudaMalloc", "out of memory");
    }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void fill(const std::vector<T>& values) { memcpy(ptr, values.data(), values.size() * sizeof(T)); }
    std::vector<T> read() const { return std::vector<T>(ptr, ptr + count); }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Polls the communicator until its creation or finalization is done, as llmc's settle() does.
void settle(ncclComm_t comm, const char* check) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(comm, &state), check);
    expect_nccl(state, ncclSuccess, check, "ncclCommGetAsyncError's asyncError");
}

void sync(cudaStream_t stream) { cudaStreamSynchronize(stream); }

// Each rank's own values, different on every rank and element, none exactly representable sums.
std::vector<float> values(int rank, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)((i * 7 + rank * 13) % 101) * 0.013f - 0.6f + (float)rank * 1.7e-3f;
    return v;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
    std::vector<__nv_bfloat16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
    return out;
}

// The specification of a sum: every rank's value in rank order, added in fp32.
template <class Input>
std::vector<float> rank_order_sum(Input input, int ranks, size_t n) {
    std::vector<float> sum = input(0, n);
    for (int r = 1; r < ranks; r++) {
        std::vector<float> v = input(r, n);
        for (size_t i = 0; i < n; i++) sum[i] += v[i];
    }
    return sum;
}

// bf16 inputs as fp32 values. Element 0 is 1 on rank 0 and 2^-9 elsewhere: rounding after each
// addition would keep 1 at every step; rounded once, 4 ranks give 1 + 3 * 2^-9 -> 1 + 2^-7.
std::vector<float> bf16_input(int rank, size_t n) {
    std::vector<float> v = values(rank, n);
    for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(x));
    v[0] = rank == 0 ? 1.0f : 0.001953125f;
    return v;
}

// ---------------------------------------------------------------------------------------------
// Creation

ncclUniqueId broadcast_id(int root) {
    ncclUniqueId id{};
    if (world_rank == root) NCCL_OK(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_mpi([&] { MPI_Bcast(&id, sizeof id, MPI_BYTE, root, MPI_COMM_WORLD); });
    return id;
}

void expect_shape(ncclComm_t comm, int rank, int count, const char* check) {
    int got_rank = -1, got_count = -1, device = -1;
    NCCL_OK(ncclCommUserRank(comm, &got_rank), check);
    NCCL_OK(ncclCommCount(comm, &got_count), check);
    NCCL_OK(ncclCommCuDevice(comm, &device), check);
    expect(got_rank == rank && got_count == count, check,
           llmc::strformat("rank %d of %d, expected rank %d of %d", got_rank, got_count, rank, count));
}

// The world, created non-blocking and polled, as llmc's NcclComm does.
ncclComm_t init_world() {
    const char* check = "non-blocking init of the world from a broadcast id";
    ncclUniqueId id = broadcast_id(0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclCommInitRankConfig(&comm, world_size, id, world_rank, &config);
    expect(result == ncclSuccess || result == ncclInProgress, check, ncclGetErrorString(result));
    settle(comm, check);
    expect_shape(comm, world_rank, world_size, check);
    passed(check);
    return comm;
}

// Sums `value` over the communicator's ranks (an int32 all-reduce), waiting for it.
int32_t sum_over(ncclComm_t comm, int32_t value, cudaStream_t stream, const char* check) {
    DeviceBuffer<int32_t> buf(1);
    buf.fill({value});
    NCCL_OK(ncclAllReduce(buf.ptr, buf.ptr, 1, ncclInt32, ncclSum, comm, stream), check);
    sync(stream);
    return buf.read()[0];
}

// Ranks in reverse world order, blocking init, the id made by world rank 0 (here the last rank).
void check_reversed_init(cudaStream_t stream) {
    const char* check = "blocking init whose id comes from a rank other than rank 0";
    ncclUniqueId id = broadcast_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, world_size, id, world_size - 1 - world_rank), check);
    expect_shape(comm, world_size - 1 - world_rank, world_size, check);
    DeviceBuffer<int32_t> mine(1), all(world_size);
    mine.fill({world_rank});
    NCCL_OK(ncclAllGather(mine.ptr, all.ptr, 1, ncclInt32, comm, stream), check);
    sync(stream);
    std::vector<int32_t> got = all.read();
    for (int r = 0; r < world_size; r++)
        expect(got[r] == world_size - 1 - r, check, llmc::strformat("rank %d is world rank %d", r, got[r]));
    NCCL_OK(ncclCommDestroy(comm), check);
    passed(check);
}

// World ranks 1.. (rank 0 alone on 1 rank) make a communicator; world rank 0 never calls init.
void check_subset_init(cudaStream_t stream) {
    const char* check = "init of a subset of the world that leaves rank 0 out";
    const int first = world_size > 1 ? 1 : 0, members = world_size - first, maker = world_size - 1;
    ncclUniqueId id = broadcast_id(maker);
    if (world_rank >= first) {
        ncclComm_t comm = nullptr;
        NCCL_OK(ncclCommInitRank(&comm, members, id, world_rank - first), check);
        expect_shape(comm, world_rank - first, members, check);
        int32_t sum = sum_over(comm, world_rank, stream, check);
        int32_t want = 0;
        for (int w = first; w < world_size; w++) want += w;
        expect(sum == want, check, llmc::strformat("the members' world ranks sum to %d, expected %d", sum, want));
        NCCL_OK(ncclCommDestroy(comm), check);
    }
    passed(check);
}

// Colors rank % 2 (the last rank NOCOLOR when there are several), keys descending with the rank.
void check_split(ncclComm_t world, cudaStream_t stream) {
    const char* check = "split into colors by key, NCCL_SPLIT_NOCOLOR giving no communicator";
    const bool none = world_size > 1 && world_rank == world_size - 1;
    const int color = none ? NCCL_SPLIT_NOCOLOR : world_rank % 2;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    ncclResult_t result = ncclCommSplit(world, color, -world_rank, &child, &config);
    expect(result == ncclSuccess || result == ncclInProgress, check, ncclGetErrorString(result));
    settle(world, check);
    if (none) {
        expect(child == nullptr, check, "NCCL_SPLIT_NOCOLOR returned a communicator");
        passed(check);
        return;
    }
    settle(child, check);
    std::vector<int> members;  // by key: descending world rank
    for (int w = world_size - 1; w >= 0; w--)
        if (w % 2 == color && !(world_size > 1 && w == world_size - 1)) members.push_back(w);
    int rank = (int)(std::find(members.begin(), members.end(), world_rank) - members.begin());
    expect_shape(child, rank, (int)members.size(), check);
    int32_t want = 0;
    for (int w : members) want += w;
    int32_t sum = sum_over(child, world_rank, stream, check);
    expect(sum == want, check, llmc::strformat("color %d sums world ranks to %d, expected %d", color, sum, want));
    NCCL_OK(ncclCommDestroy(child), check);
    passed(check);
}

// ---------------------------------------------------------------------------------------------
// Collectives

void check_all_reduce_f32(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "fp32 all-reduce equals the rank-order fp32 sum, bitwise, also in place";
    const size_t n = 1000;
    DeviceBuffer<float> send(n), recv(n);
    send.fill(values(world_rank, n));
    NCCL_OK(ncclAllReduce(send.ptr, recv.ptr, n, ncclFloat32, ncclSum, comm, stream), check);
    sync(stream);
    std::vector<float> want = rank_order_sum(values, world_size, n);
    expect(same_bits(recv.read(), want), check, "out of place differs");
    NCCL_OK(ncclAllReduce(send.ptr, send.ptr, n, ncclFloat32, ncclSum, comm, stream), check);
    while (cudaStreamQuery(stream) == cudaErrorNotReady) {}  // completes by polling, like cudaEventQuery
    expect(same_bits(send.read(), want), check, "in place differs");
    passed(check);
}

void check_all_reduce_bf16(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "bf16 all-reduce is the rank-order fp32 sum rounded once";
    const size_t n = 1000;
    DeviceBuffer<__nv_bfloat16> buf(n);
    buf.fill(to_bf16(bf16_input(world_rank, n)));
    NCCL_OK(ncclAllReduce(buf.ptr, buf.ptr, n, ncclBfloat16, ncclSum, comm, stream), check);
    sync(stream);
    std::vector<__nv_bfloat16> got = buf.read(), want = to_bf16(rank_order_sum(bf16_input, world_size, n));
    expect(same_bits(got, want), check, "differs from the rank-order sum");
    if (world_size == 4)
        expect(__bfloat162float(got[0]) == 1.0078125f, check,
               llmc::strformat("1 + 3 * 2^-9 gave %.9g, expected 1 + 2^-7", __bfloat162float(got[0])));
    passed(check);
}

void check_other_reductions(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "int32 max, min and prod, fp32 avg";
    DeviceBuffer<int32_t> ints(3);
    ints.fill({world_rank, world_rank, world_rank + 1});
    NCCL_OK(ncclAllReduce(ints.ptr, ints.ptr, 1, ncclInt32, ncclMax, comm, stream), check);
    NCCL_OK(ncclAllReduce(ints.ptr + 1, ints.ptr + 1, 1, ncclInt32, ncclMin, comm, stream), check);
    NCCL_OK(ncclAllReduce(ints.ptr + 2, ints.ptr + 2, 1, ncclInt32, ncclProd, comm, stream), check);
    DeviceBuffer<float> avg(1);
    avg.fill({(float)world_rank});
    NCCL_OK(ncclAllReduce(avg.ptr, avg.ptr, 1, ncclFloat32, ncclAvg, comm, stream), check);
    sync(stream);
    int32_t factorial = 1;
    for (int r = 1; r <= world_size; r++) factorial *= r;
    std::vector<int32_t> got = ints.read();
    expect(got[0] == world_size - 1 && got[1] == 0 && got[2] == factorial, check,
           llmc::strformat("max %d min %d prod %d, expected %d 0 %d", got[0], got[1], got[2], world_size - 1, factorial));
    float want_avg = (float)(world_size - 1) / 2;
    expect(avg.read()[0] == want_avg, check, llmc::strformat("avg %g, expected %g", avg.read()[0], want_avg));
    passed(check);
}

void check_reduce_scatter(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "reduce-scatter keeps this rank's slice of the all-reduce's sum (fp32, bf16)";
    const size_t per_rank = 257, n = per_rank * world_size;
    DeviceBuffer<float> send(n), recv(per_rank);
    send.fill(values(world_rank, n));
    NCCL_OK(ncclReduceScatter(send.ptr, recv.ptr, per_rank, ncclFloat32, ncclSum, comm, stream), check);
    DeviceBuffer<__nv_bfloat16> send16(n);
    send16.fill(to_bf16(bf16_input(world_rank, n)));
    // In place: this rank's block of the input is the output, as llmc's ZeRO shards do.
    __nv_bfloat16* slice16 = send16.ptr + world_rank * per_rank;
    NCCL_OK(ncclReduceScatter(send16.ptr, slice16, per_rank, ncclBfloat16, ncclSum, comm, stream), check);
    sync(stream);
    std::vector<float> sum = rank_order_sum(values, world_size, n);
    std::vector<float> want(sum.begin() + world_rank * per_rank, sum.begin() + (world_rank + 1) * per_rank);
    expect(same_bits(recv.read(), want), check, "fp32 slice differs");
    std::vector<__nv_bfloat16> sum16 = to_bf16(rank_order_sum(bf16_input, world_size, n));
    std::vector<__nv_bfloat16> want16(sum16.begin() + world_rank * per_rank, sum16.begin() + (world_rank + 1) * per_rank);
    std::vector<__nv_bfloat16> got16(slice16, slice16 + per_rank);
    expect(same_bits(got16, want16), check, "bf16 slice differs");
    passed(check);
}

void check_all_gather(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "all-gather puts rank r's block at r (bf16; in place)";
    const size_t per_rank = 300, n = per_rank * world_size;
    DeviceBuffer<__nv_bfloat16> send(per_rank), recv(n), in_place(n);
    send.fill(to_bf16(values(world_rank, per_rank)));
    memcpy(in_place.ptr + world_rank * per_rank, send.ptr, per_rank * sizeof(__nv_bfloat16));
    NCCL_OK(ncclAllGather(send.ptr, recv.ptr, per_rank, ncclBfloat16, comm, stream), check);
    NCCL_OK(ncclAllGather(in_place.ptr + world_rank * per_rank, in_place.ptr, per_rank, ncclBfloat16, comm, stream), check);
    sync(stream);
    std::vector<__nv_bfloat16> want;
    for (int r = 0; r < world_size; r++) {
        std::vector<__nv_bfloat16> block = to_bf16(values(r, per_rank));
        want.insert(want.end(), block.begin(), block.end());
    }
    expect(same_bits(recv.read(), want), check, "out of place differs");
    expect(same_bits(in_place.read(), want), check, "in place differs");
    passed(check);
}

void check_broadcast(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "broadcast from the last rank (non-zero on several), also in place";
    const int root = world_size - 1;
    const size_t n = 5000;
    std::vector<uint8_t> payload(n);
    for (size_t i = 0; i < n; i++) payload[i] = (uint8_t)(i * 31 + 7);
    DeviceBuffer<uint8_t> send(n), recv(n), in_place(n);
    std::vector<uint8_t> mine = world_rank == root ? payload : std::vector<uint8_t>(n, 0);
    send.fill(mine);
    in_place.fill(mine);
    NCCL_OK(ncclBroadcast(send.ptr, recv.ptr, n, ncclUint8, root, comm, stream), check);
    NCCL_OK(ncclBroadcast(in_place.ptr, in_place.ptr, n, ncclUint8, root, comm, stream), check);
    sync(stream);
    expect(recv.read() == payload, check, "out of place differs");
    expect(in_place.read() == payload, check, "in place differs");
    passed(check);
}

// ---------------------------------------------------------------------------------------------
// Point to point

// What `sender` sends in `direction` (0: to its next rank, 1: to its previous one).
std::vector<float> message(int sender, int direction, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(sender * 1000 + direction * 100) + (float)(i % 97);
    return v;
}

// Every rank sends to and receives from both neighbours in one group: sends on one stream,
// receives on another. On 2 ranks both neighbours are the one peer; on 1, the rank itself.
void check_group_exchange(ncclComm_t comm, cudaStream_t sends, cudaStream_t recvs, size_t n, const char* check) {
    const int next = (world_rank + 1) % world_size, prev = (world_rank + world_size - 1) % world_size;
    DeviceBuffer<float> to_next(n), to_prev(n), from_prev(n), from_next(n);
    to_next.fill(message(world_rank, 0, n));
    to_prev.fill(message(world_rank, 1, n));
    NCCL_OK(ncclGroupStart(), check);
    NCCL_OK(ncclSend(to_next.ptr, n, ncclFloat32, next, comm, sends), check);
    NCCL_OK(ncclRecv(from_prev.ptr, n, ncclFloat32, prev, comm, recvs), check);
    NCCL_OK(ncclSend(to_prev.ptr, n, ncclFloat32, prev, comm, sends), check);
    NCCL_OK(ncclRecv(from_next.ptr, n, ncclFloat32, next, comm, recvs), check);
    NCCL_OK(ncclGroupEnd(), check);
    sync(recvs);
    sync(sends);
    expect(from_prev.read() == message(prev, 0, n), check, llmc::strformat("the message from rank %d differs", prev));
    expect(from_next.read() == message(next, 1, n), check, llmc::strformat("the message from rank %d differs", next));
    passed(check);
}

// Pairs (0,1), (2,3) (rank 0 with itself on 1 rank): each posts its receive on stream A, waits
// until its peer has done the same, then sends on stream B. A call that waited for its transfer
// would never reach the barrier.
void check_receive_before_send(ncclComm_t comm, cudaStream_t a, cudaStream_t b) {
    const char* check = "a receive posted before the peer issues its send, each on its own stream";
    const int peer = (world_rank ^ 1) < world_size ? world_rank ^ 1 : world_rank;
    const size_t n = 1 << 20;  // 4 MiB: past MPI's eager limit, so the send needs the receive
    DeviceBuffer<float> out(n), in(n);
    out.fill(message(world_rank, 0, n));
    NCCL_OK(ncclRecv(in.ptr, n, ncclFloat32, peer, comm, a), check);
    host_mpi([] { MPI_Barrier(MPI_COMM_WORLD); });
    NCCL_OK(ncclSend(out.ptr, n, ncclFloat32, peer, comm, b), check);
    bool a_done = false, b_done = false;  // polled, as llmc polls its events
    while (!a_done || !b_done) {
        a_done = a_done || cudaStreamQuery(a) == cudaSuccess;
        b_done = b_done || cudaStreamQuery(b) == cudaSuccess;
    }
    expect(in.read() == message(peer, 0, n), check, llmc::strformat("the message from rank %d differs", peer));
    passed(check);
}

// ---------------------------------------------------------------------------------------------
// Errors and teardown

void expect_error(ncclResult_t got, ncclResult_t want, const char* check, const char* call, const char* mentions) {
    expect_nccl(got, want, check, call);
    std::string last = ncclGetLastError(nullptr);
    expect(last.find(mentions) != std::string::npos, check,
           llmc::strformat("%s: the last error \"%s\" does not mention \"%s\"", call, last.c_str(), mentions));
}
#define EXPECT_ERROR(call, want, mentions) expect_error((call), want, check, #call, mentions)

void check_argument_errors(ncclComm_t comm, cudaStream_t stream) {
    const char* check = "bad arguments return NCCL's error codes and a last error";
    DeviceBuffer<float> buf(4);
    EXPECT_ERROR(ncclSend(buf.ptr, 4, ncclFloat32, world_size, comm, stream), ncclInvalidArgument, "peer");
    EXPECT_ERROR(ncclRecv(buf.ptr, 4, ncclFloat32, -1, comm, stream), ncclInvalidArgument, "peer");
    EXPECT_ERROR(ncclAllReduce(buf.ptr, buf.ptr, 4, (ncclDataType_t)99, ncclSum, comm, stream), ncclInvalidArgument,
                 "type");
    EXPECT_ERROR(ncclAllReduce(buf.ptr, buf.ptr, 4, ncclFloat32, (ncclRedOp_t)77, comm, stream), ncclInvalidArgument,
                 "reduction operation");
    EXPECT_ERROR(ncclAllReduce(buf.ptr, buf.ptr, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, stream), ncclInvalidArgument,
                 "overflows");
    EXPECT_ERROR(ncclBroadcast(buf.ptr, buf.ptr, 4, ncclFloat32, world_size, comm, stream), ncclInvalidArgument, "root");
    EXPECT_ERROR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
    NCCL_OK(ncclGroupStart(), check);
    EXPECT_ERROR(ncclSend(buf.ptr, 4, ncclFloat32, world_size, comm, stream), ncclInvalidArgument, "peer");
    EXPECT_ERROR(ncclGroupEnd(), ncclInvalidArgument, "peer");  // the group fails with its bad call
    ncclComm_t none = nullptr;
    ncclUniqueId id{};
    EXPECT_ERROR(ncclCommInitRank(&none, 0, id, 0), ncclInvalidArgument, "nranks");
    EXPECT_ERROR(ncclCommInitRank(&none, 1, id, 0), ncclInvalidArgument, "ncclGetUniqueId");
    EXPECT_ERROR(ncclCommSplit(comm, -5, 0, &none, nullptr), ncclInvalidArgument, "color");
    ncclResult_t state;
    EXPECT_ERROR(ncclCommGetAsyncError(nullptr, &state), ncclInvalidArgument, "NULL");
    passed(check);
}

// An aborted or destroyed communicator refuses work instead of crashing.
void check_abort_and_destroy(ncclComm_t world, cudaStream_t stream) {
    const char* check = "an aborted or destroyed communicator returns ncclInvalidArgument";
    DeviceBuffer<float> buf(4);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;  // the world is non-blocking, which a split would otherwise inherit
    ncclComm_t aborted = nullptr, destroyed = nullptr;
    NCCL_OK(ncclCommSplit(world, 0, world_rank, &aborted, &config), check);
    NCCL_OK(ncclCommSplit(world, 0, world_rank, &destroyed, &config), check);
    NCCL_OK(ncclCommAbort(aborted), check);
    NCCL_OK(ncclCommDestroy(destroyed), check);  // not finalized: destroy finalizes it
    EXPECT_ERROR(ncclAllReduce(buf.ptr, buf.ptr, 4, ncclFloat32, ncclSum, aborted, stream), ncclInvalidArgument,
                 "aborted");
    EXPECT_ERROR(ncclAllReduce(buf.ptr, buf.ptr, 4, ncclFloat32, ncclSum, destroyed, stream), ncclInvalidArgument,
                 "destroyed");
    NCCL_OK(ncclCommAbort(nullptr), check);
    NCCL_OK(ncclCommDestroy(nullptr), check);
    passed(check);
}

// Non-blocking finalize polled to ncclSuccess, then destroy, as llmc's NcclComm::~State does.
void check_finalize(ncclComm_t world, cudaStream_t stream) {
    const char* check = "non-blocking finalize settles with collectives in flight, then destroy";
    ncclResult_t state = ncclInProgress;
    NCCL_OK(ncclCommGetAsyncError(world, &state), check);
    expect_nccl(state, ncclSuccess, check, "ncclCommGetAsyncError before finalize");
    DeviceBuffer<float> buf(64);
    buf.fill(std::vector<float>(64, 1.0f));
    NCCL_OK(ncclAllReduce(buf.ptr, buf.ptr, 64, ncclFloat32, ncclSum, world, stream), check);
    ncclResult_t result = ncclCommFinalize(world);
    expect(result == ncclSuccess || result == ncclInProgress, check, ncclGetErrorString(result));
    settle(world, check);
    sync(stream);  // the stream still delivers the output after finalize
    expect(buf.read()[63] == (float)world_size, check, llmc::strformat("sum %g, expected %d", buf.read()[63], world_size));
    NCCL_OK(ncclCommDestroy(world), check);
    passed(check);
}

// A host buffer where NCCL needs device memory: the emulator must stop, naming the call.
void pass_host_buffer() {
    ncclUniqueId id = broadcast_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, world_size, id, world_rank), "init");
    std::vector<float> host(16, 1.0f);
    ncclAllReduce(host.data(), host.data(), 16, ncclFloat32, ncclSum, comm, nullptr);
    fail_check("a host buffer is fatal", "ncclAllReduce accepted a host buffer");
}

// Rank 0 sends 8 floats, rank 1 receives 4: the emulator must stop, naming ncclRecv.
void receive_short_message() {
    ncclUniqueId id = broadcast_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, world_size, id, world_rank), "init");
    DeviceBuffer<float> buf(8);
    if (world_rank == 0) NCCL_OK(ncclSend(buf.ptr, 8, ncclFloat32, 1, comm, nullptr), "ncclSend");
    if (world_rank == 1) NCCL_OK(ncclRecv(buf.ptr, 4, ncclFloat32, 0, comm, nullptr), "ncclRecv");
    cudaStreamSynchronize(nullptr);
    if (world_rank == 1) fail_check("a short receive is fatal", "ncclRecv took 4 floats of an 8-float send");
    host_mpi([] { MPI_Barrier(MPI_COMM_WORLD); });  // rank 0 waits here to be ended with rank 1
}

}  // namespace

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (argc > 1 && std::string(argv[1]) == "--host-buffer") pass_host_buffer();
    if (argc > 1 && std::string(argv[1]) == "--short-receive") receive_short_message();

    int version = 0;
    NCCL_OK(ncclGetVersion(&version), "ncclGetVersion");
    expect(version == NCCL_VERSION_CODE, "ncclGetVersion", llmc::strformat("%d, expected %d", version, NCCL_VERSION_CODE));
    cudaStream_t a = nullptr, b = nullptr;
    cudaStreamCreate(&a);
    cudaStreamCreate(&b);

    ncclComm_t world = init_world();
    check_reversed_init(a);
    check_subset_init(a);
    check_split(world, a);
    check_all_reduce_f32(world, a);
    check_all_reduce_bf16(world, a);
    check_other_reductions(world, a);
    check_reduce_scatter(world, a);
    check_all_gather(world, a);
    check_broadcast(world, a);
    check_group_exchange(world, a, b, 16, "sends and receives to both neighbours in one group (64 bytes)");
    check_group_exchange(world, a, b, 1 << 20, "sends and receives to both neighbours in one group (4 MiB)");
    check_receive_before_send(world, a, b);
    check_argument_errors(world, a);
    check_abort_and_destroy(world, a);
    check_finalize(world, a);

    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    {
        std::lock_guard<std::mutex> lock(llmc::mpi_mutex());
        MPI_Finalize();
    }
    if (world_rank == 0) printf("all emulated NCCL checks passed on %d rank(s)\n", world_size);
    return 0;
}
