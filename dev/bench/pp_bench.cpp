// pp_bench: the pipeline's bubble, measured. Each rank runs one stage of a CPUModel pipeline and
// counts the time it waits on its neighbours (CPUModel::take_pipeline_wait_ms: every receive and the
// loss broadcast, so the bubble plus the messages' own time) over the step's wall time. Printed per
// micro-batch count m and schedule next to the formula's bubble, (P - 1) / (m + P - 1) / V, which
// assumes every stage takes the same time per micro-batch.
//
//   mpirun -np P build/pp_bench [steps]       (dev/bench/pp_bench.sh builds and runs it)
//
// The model is a d8-like stack with a small vocabulary (8 layers, C 128, 4 heads, vocab 512, T 64,
// B 4), so the embedding and the head barely unbalance the first and last stages. Tokens are random.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cpu_model.h"

using namespace llmc;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    Launch launch = bootstrap_launch(&argc, &argv);
    try {
        const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
        std::unique_ptr<Communicator> world = make_host_communicator(launch);
        const int P = world->world_size();
        ModelConfig c = model_preset("d4", 64, 512);
        c.num_layers = 8;
        c.num_heads = 4;
        c.channels = 128;
        const int B = 4, T = 64;
        ParallelDims dims;
        dims.pp = P;
        ProcessGroups groups(*world, dims);
        if (launch.rank == 0)
            printf("| P | schedule | m | formula bubble | measured idle, mean over stages | per stage | step ms |\n"
                   "|---|---|---|---|---|---|---|\n");
        for (int V : {1, 2})
            for (int m : {4, 8, 16}) {
                if (V > 1 && (P < 2 || m % P != 0)) continue;
                PipelineParallel pipe{make_pipeline_split(c.num_layers, P, V), m};
                CPUModel model(c, B, T, groups.dp(), 0, groups.tp(), false, groups.pp(), pipe);
                model.init_random(1);
                Rng rng(2);
                std::vector<int> inputs((size_t)m * B * T), targets(inputs.size());
                for (size_t i = 0; i < inputs.size(); i++) {
                    inputs[i] = (int)rng.below(c.vocab_size);
                    targets[i] = (int)rng.below(c.vocab_size);
                }
                double wait_ms = 0, step_ms = 0;
                for (int step = 0; step <= steps; step++) {  // step 0 warms up
                    world->barrier().wait();
                    const auto t0 = Clock::now();
                    model.zero_grad();
                    model.forward_backward_step(inputs.data(), targets.data(), m, B, T, 1.0f / m);
                    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                    const double waited = model.take_pipeline_wait_ms();
                    model.take_exposed_comm_ms();
                    if (step > 0) wait_ms += waited, step_ms += ms;
                }
                const std::vector<double> all = all_gather_doubles(*world, {wait_ms / step_ms, step_ms / steps});
                if (launch.rank != 0) continue;
                double mean = 0, slowest = 0;
                std::string per_stage;
                for (int r = 0; r < P; r++) {
                    mean += all[2 * r] / P;
                    slowest = std::max(slowest, all[2 * r + 1]);
                    per_stage += strformat("%s%.0f%%", r ? " / " : "", 100 * all[2 * r]);
                }
                printf("| %d | %s | %d | %.1f%% | %.1f%% | %s | %.0f |\n", P,
                       V > 1 ? strformat("interleaved, V %d", V).c_str() : "1F1B", m,
                       100 * pipeline_bubble_fraction(P, m, V), 100 * mean, per_stage.c_str(), slowest);
                fflush(stdout);
            }
    } catch (const std::exception& e) {
        fprintf(stderr, "pp_bench: %s\n", e.what());
        abort_launch(launch, 1);
    }
    finalize_launch(launch);
    return 0;
}
