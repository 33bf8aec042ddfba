// bootstrap.h: how this process learns its place in a launch (rank, world, ranks on this node), and
// the host communicator that goes with it.
//
// The idea: decide from the launcher's environment variables, before touching MPI, whether we were
// launched at all. A binary run directly (a shell, an sbatch script) is one rank and makes no MPI
// call, so it needs neither a launcher nor a working MPI setup; only a launched process calls
// MPI_Init_thread.
//
// Built with -DLLMC_NO_MPI (make NO_MPI=1, for a single-GPU machine without MPI installed), the
// binary runs only as one rank and refuses a launch by mpirun or srun.
//
// main() calls bootstrap_launch first, make_host_communicator next, and on a fatal error
// abort_launch (so the other ranks do not wait out their timeouts); on success it destroys every
// communicator and then calls finalize_launch.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "llmc/dist/comm.h"
#ifndef LLMC_NO_MPI
#include "llmc/dist/comm_mpi.h"  // and <mpi.h>, without its C++ bindings
#endif
#include "llmc/utils.h"

namespace llmc {

struct Launch {
    int rank = 0, world_size = 1;
    int local_rank = 0, local_size = 1;  // among the ranks on this node (pick the GPU with local_rank)
    bool under_launcher = false;         // MPI was initialised
};

// Which launcher started this process and how many ranks it says it started (0 when it does not
// say), read from the variables each launcher sets in its ranks' environment.
struct LauncherEnv {
    const char* name = nullptr;  // nullptr: not launched
    int declared_ranks = 0;
};

inline LauncherEnv detect_launcher() {
    auto positive_int = [](const char* variable) {
        const char* text = getenv(variable);
        return text ? std::max(0, atoi(text)) : 0;
    };
    // srun sets SLURM_STEP_NUM_TASKS for the tasks of a job step; an sbatch shell has SLURM_NTASKS
    // and SLURM_PROCID too, but runs one process, so those alone do not mean a launch.
    int slurm_tasks = positive_int("SLURM_STEP_NUM_TASKS");
    if (getenv("OMPI_COMM_WORLD_SIZE")) return {"Open MPI's mpirun", positive_int("OMPI_COMM_WORLD_SIZE")};
    if (getenv("PMIX_RANK")) return {"a PMIx launcher", slurm_tasks};
    if (getenv("PMI_RANK")) return {"a PMI launcher (MPICH's mpiexec or srun --mpi=pmi2)", positive_int("PMI_SIZE")};
    if (slurm_tasks > 1) return {"srun", slurm_tasks};
    return {};
}

inline Launch bootstrap_launch(int* argc, char*** argv) {
    Launch launch;
    LauncherEnv launcher = detect_launcher();
    if (!launcher.name) return launch;
#ifdef LLMC_NO_MPI
    (void)argc;
    (void)argv;
    fail(strformat("started by %s, but this binary was built without MPI (make NO_MPI=1), so it runs only as one "
                   "rank: run it directly, or rebuild with MPI",
                   launcher.name));
#else
    // The comm thread and the main thread both call MPI, one at a time (mpi_mutex).
    int provided = 0;
    LLMC_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    launch.under_launcher = true;
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        fail(strformat("the MPI library provides thread level %d, below MPI_THREAD_SERIALIZED (%d) which llmc's "
                       "communication thread needs; use an MPI built with thread support",
                       provided, MPI_THREAD_SERIALIZED));
    }
    LLMC_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    LLMC_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &launch.rank));
    LLMC_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &launch.world_size));
    // An MPI that cannot reach its launcher initialises every process as a world of one; they would
    // all train as rank 0 and overwrite each other's files.
    if (launcher.declared_ranks > 0 && launcher.declared_ranks != launch.world_size) {
        MPI_Finalize();
        fail(strformat("%s started %d ranks but MPI_COMM_WORLD has %d: the MPI library did not connect to the "
                       "launcher (with srun, pass --mpi=pmix or the plugin your MPI was built for)",
                       launcher.name, launcher.declared_ranks, launch.world_size));
    }
    MPI_Comm node;
    LLMC_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, launch.rank, MPI_INFO_NULL, &node));
    LLMC_MPI_CHECK(MPI_Comm_rank(node, &launch.local_rank));
    LLMC_MPI_CHECK(MPI_Comm_size(node, &launch.local_size));
    LLMC_MPI_CHECK(MPI_Comm_free(&node));
    return launch;
#endif
}

inline std::unique_ptr<Communicator> make_host_communicator(const Launch& launch) {
#ifndef LLMC_NO_MPI
    if (launch.under_launcher) return std::make_unique<MpiComm>();
#endif
    (void)launch;
    return std::make_unique<LocalComm>();
}

// Ends every rank of the launch with `code`; call it after printing the error. Without a launcher
// it is exit(code).
[[noreturn]] inline void abort_launch(const Launch& launch, int code) {
    fflush(stdout);
    fflush(stderr);
#ifndef LLMC_NO_MPI
    if (launch.under_launcher) {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        MPI_Abort(MPI_COMM_WORLD, code);
    }
#endif
    (void)launch;
    std::exit(code);
}

// Call once every communicator is destroyed.
inline void finalize_launch(const Launch& launch) {
#ifndef LLMC_NO_MPI
    if (!launch.under_launcher) return;
    std::lock_guard<std::mutex> lock(mpi_mutex());
    LLMC_MPI_CHECK(MPI_Finalize());
#else
    (void)launch;
#endif
}

}  // namespace llmc
