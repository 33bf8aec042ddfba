// test_device_comm.cu: the device communicators' all_to_all_v (expert parallelism's token exchange)
// against results every rank computes alone, on device buffers: NcclComm (--gpu-comm nccl) and
// StagedComm (--gpu-comm mpi). Uneven blocks, some empty, f32 and bf16, from every rank to every
// rank, itself included, and two exchanges in flight at once. Under mpirun, one GPU per rank: the
// emulated ones in test/emu/run_emu_tests.sh (NCCL refuses two ranks on one real GPU).
//   mpirun -np N test_device_comm
#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "llmc/dist/bootstrap.h"
#ifndef LLMC_NO_NCCL
#include "llmc/dist/comm_nccl.cuh"
#endif
#include "llmc/dist/staged_comm.cuh"
#include "test/mpi/mpi_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

// Rank `from` sends a2a_count(from, to) elements to `to`; element i of that block is value(from, to, i).
size_t a2a_count(int from, int to, size_t scale) { return (size_t)((from * 3 + to * 5 + 1) % 4) * scale; }
float value(int from, int to, size_t i) { return (float)(from * 1000 + to * 100) + (float)(i % 97) / 8.0f; }

template <typename T>
T as(float x) {
    if constexpr (sizeof(T) == 4) return x;
    else return (uint16_t)(std::bit_cast<uint32_t>(x) >> 16);  // exact: the values have few mantissa bits
}

struct Exchange {
    std::vector<size_t> send_counts, recv_counts;
    size_t sent = 0, received = 0;
    Exchange(int rank, int world, size_t scale) : send_counts(world), recv_counts(world) {
        for (int r = 0; r < world; r++) {
            send_counts[r] = a2a_count(rank, r, scale), recv_counts[r] = a2a_count(r, rank, scale);
            sent += send_counts[r], received += recv_counts[r];
        }
    }
};

template <typename T>
struct DeviceBlocks {
    T* out = nullptr;
    T* in = nullptr;
    DeviceBlocks(const Exchange& x, int rank, int world) {
        std::vector<T> host;
        for (int r = 0; r < world; r++)
            for (size_t i = 0; i < x.send_counts[r]; i++) host.push_back(as<T>(value(rank, r, i)));
        CUDA_CHECK(cudaMalloc(&out, (x.sent + 1) * sizeof(T)));
        CUDA_CHECK(cudaMalloc(&in, (x.received + 1) * sizeof(T)));
        CUDA_CHECK(cudaMemcpy(out, host.data(), x.sent * sizeof(T), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(in, 0xFF, (x.received + 1) * sizeof(T)));
    }
    ~DeviceBlocks() {
        cudaFree(out);
        cudaFree(in);
    }
    // Every element received equals what its sender computed.
    void check_received(const Exchange& x, int rank, int world, const std::string& what) {
        std::vector<T> host(x.received);
        CUDA_CHECK(cudaMemcpy(host.data(), in, x.received * sizeof(T), cudaMemcpyDeviceToHost));
        size_t at = 0;
        for (int r = 0; r < world; r++)
            for (size_t i = 0; i < x.recv_counts[r]; i++, at++)
                check(host[at] == as<T>(value(r, rank, i)),
                      strformat("%s: element %zu of rank %d's block differs", what.c_str(), i, r));
    }
};

template <typename T>
void exchange(Communicator& comm, size_t scale, CommDtype dtype, const std::string& what) {
    const int rank = comm.rank(), world = comm.world_size();
    const Exchange x(rank, world, scale), y(rank, world, scale + 3);
    DeviceBlocks<T> first(x, rank, world), second(y, rank, world);
    CommHandle a = comm.all_to_all_v(first.out, x.send_counts.data(), first.in, x.recv_counts.data(), dtype);
    CommHandle b = comm.all_to_all_v(second.out, y.send_counts.data(), second.in, y.recv_counts.data(), dtype);
    b.wait();
    a.wait();
    first.check_received(x, rank, world, what);
    second.check_received(y, rank, world, what + ", the second in flight");
}

void run_suite(Communicator& comm, const char* name) {
    for (size_t scale : {(size_t)1, (size_t)1000, (size_t)100000}) {
        exchange<float>(comm, scale, CommDtype::F32, strformat("%s f32, scale %zu", name, scale));
        exchange<uint16_t>(comm, scale, CommDtype::BF16, strformat("%s bf16, scale %zu", name, scale));
    }
    comm.barrier().wait();
    say(strformat("[%s, %d rank(s)] all_to_all_v f32 and bf16 on device buffers: uneven blocks, some empty, "
                  "two in flight", name, comm.world_size()));
}

}  // namespace

int main(int argc, char** argv) {
    launch = bootstrap_launch(&argc, &argv);
    std::string why;
    if (!cuda_device_present(&why)) {
        const int status = no_gpu_exit_status("test_device_comm", why);
        finalize_launch(launch);
        return status;
    }
    try {
        std::unique_ptr<Communicator> host = make_host_communicator(launch);
        host->timeout_s = 120;
        int devices = 0;
        CUDA_CHECK(cudaGetDeviceCount(&devices));
        const int device = launch.local_rank % devices;
        CUDA_CHECK(cudaSetDevice(device));
        StagedComm staged(*host);
        run_suite(staged, "StagedComm");
#ifndef LLMC_NO_NCCL
        NcclComm nccl(*host, device, 120);
        run_suite(nccl, "NcclComm");
#endif
    } catch (const std::exception& e) {
        fprintf(stderr, "test_device_comm: rank %d: %s\n", launch.rank, e.what());
        abort_launch(launch, 1);
    }
    finalize_launch(launch);
    return 0;
}
