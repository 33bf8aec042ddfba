// gather_bench: ZeRO-3's all-gather of one layer, as bf16 against packed with its four weights as
// FP8 codes (models/cuda/fp8_gather.cuh), timed over the MPI communicator on host buffers. The
// sizes are what the CUDA model's ZeRO plan gives a layer of GPT-2 124M (d12) and 1.5B (d48) on this
// many ranks (dist/packed_gather.h's chunk for the packed gather, the shard for bf16); the median
// of the repetitions is printed with the bytes each rank receives.
//
//   mpirun -np N build/gather_bench [repetitions [bf16|packed [d12|d48]]]
//     (dev/bench/gather_bench.sh builds and runs it; naming one kind and one model runs only those
//     gathers, for farm-bench to time whole runs against each other)
//
// What it measures is the bytes' cost on this machine's MPI (shared memory on one node): whether
// halving them halves the time there. NCCL between GPUs needs a multi-GPU machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/packed_gather.h"
#include "llmc/models/gpt2/params.h"

using namespace llmc;
using Clock = std::chrono::steady_clock;

namespace {

// The median milliseconds of `reps` all-gathers of `bytes` a rank (after one to warm up).
double median_gather_ms(Communicator& comm, size_t bytes, int reps) {
    std::vector<uint8_t> all(bytes * comm.world_size(), (uint8_t)comm.rank());
    uint8_t* mine = all.data() + bytes * comm.rank();
    std::vector<double> ms;
    for (int i = 0; i <= reps; i++) {
        comm.barrier().wait();
        const auto t0 = Clock::now();
        comm.all_gather(mine, all.data(), bytes, CommDtype::U8).wait();
        if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    Launch launch = bootstrap_launch(&argc, &argv);
    try {
        const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
        const std::string only = argc > 2 ? argv[2] : "", only_model = argc > 3 ? argv[3] : "";
        if (reps < 1 || (only != "" && only != "bf16" && only != "packed"))
            fail("usage: gather_bench [repetitions >= 1 [bf16|packed [d12|d48]]]");
        std::unique_ptr<Communicator> world = make_host_communicator(launch);
        const int N = world->world_size();
        if (launch.rank == 0)
            printf("| model | ranks | bf16 a rank | packed a rank | bf16 ms | packed ms | packed / bf16 (bytes, time) |\n"
                   "|---|---|---|---|---|---|---|\n");
        for (const char* preset : {"d12", "d48"}) {
            if (!only_model.empty() && only_model != preset) continue;
            const ModelConfig c = model_preset(preset);
            const ParamLayout layout = GPT2Params::layout(c);
            const ZeroPlan plan(layout, 3, world->rank(), N, 8);  // the CUDA model's shard alignment
            const int b = layout.layer_bucket(0);
            std::vector<ElementRange> weights;
            for (int t : GPT2Params::LINEAR_WEIGHTS)
                weights.push_back({layout.offset_in_bucket(t, 0), layout.tensor_size(t)});
            const size_t bf16 = plan.buckets[b].shard_size * 2;
            const size_t packed = plan_packed_bucket(plan.buckets[b], weights, 2).chunk_bytes;
            const double bf16_ms = only == "packed" ? 0 : median_gather_ms(*world, bf16, reps);
            const double packed_ms = only == "bf16" ? 0 : median_gather_ms(*world, packed, reps);
            if (launch.rank == 0)
                printf("| %s | %d | %.2f MB | %.2f MB | %.3f | %.3f | %.2f, %.2f |\n", preset, N, bf16 / 1e6,
                       packed / 1e6, bf16_ms, packed_ms, (double)packed / bf16, packed_ms / bf16_ms);
        }
    } catch (const std::exception& e) {
        fprintf(stderr, "gather_bench: %s\n", e.what());
        abort_launch(launch, 1);
    }
    finalize_launch(launch);
    return 0;
}
