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
//
// MPI_Init and MPI_Finalize have no timeout: a rank that never starts, or one that stops before
// MPI_Finalize, holds the others there for ever. Each is watched by a Watchdog thread; past
// LLMC_BOOTSTRAP_TIMEOUT_S seconds (default 600) it names the step and ends this process with
// exit code 3 (EXIT_COMM_TIMEOUT). It cannot make the MPI call return, only end the process in it.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "llmc/dist/comm.h"
#ifndef LLMC_NO_MPI
#include "llmc/dist/comm_mpi.h"  // and <mpi.h>, without its C++ bindings
#endif
#include "llmc/failures/exit_codes.h"
#include "llmc/failures/faults.h"
#include "llmc/utils.h"

namespace llmc {

// Ends the process with `code` after printing `message`, unless destroyed (disarmed) within
// `seconds`.
class Watchdog {
public:
    Watchdog(double seconds, std::string message, int code) {
        thread_ = std::thread([this, seconds, message = std::move(message), code] {
            std::unique_lock<std::mutex> lock(mutex_);
            if (cv_.wait_until(lock, deadline_after(seconds), [&] { return disarmed_; })) return;
            fprintf(stderr, "error: %s\n", message.c_str());
            fflush(stdout);
            fflush(stderr);
            _exit(code);
        });
    }
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            disarmed_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool disarmed_ = false;
    std::thread thread_;
};

// LLMC_BOOTSTRAP_TIMEOUT_S: how long MPI_Init and MPI_Finalize may take (seconds; default 600).
inline double bootstrap_timeout_s() {
    const char* text = getenv("LLMC_BOOTSTRAP_TIMEOUT_S");
    if (!text) return 600;
    char* end = nullptr;
    const double v = strtod(text, &end);
    if (!*text || *end || !(v > 0))
        fail(strformat("LLMC_BOOTSTRAP_TIMEOUT_S must be a positive number of seconds, got '%s'", text));
    return v;
}

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
    const double timeout_s = bootstrap_timeout_s();
    const char* env_rank = getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK")
                         : getenv("PMIX_RANK")            ? getenv("PMIX_RANK")
                         : getenv("PMI_RANK")             ? getenv("PMI_RANK")
                                                          : "?";
    Watchdog watchdog(timeout_s,
                      strformat("(rank %s) MPI start-up (MPI_Init, then the node split) did not finish within %g s "
                                "(LLMC_BOOTSTRAP_TIMEOUT_S): a rank of the %d %s started did not start or cannot "
                                "reach the others",
                                env_rank, timeout_s, launcher.declared_ranks, launcher.name),
                      EXIT_COMM_TIMEOUT);
    if (int ms = faults().value("slow_init", atoi(env_rank))) {
        fprintf(stderr, "fault injection: rank %s sleeps %d ms before MPI_Init\n", env_rank, ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
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
    const double timeout_s = bootstrap_timeout_s();
    Watchdog watchdog(timeout_s,
                      strformat("(rank %d) MPI_Finalize did not return within %g s (LLMC_BOOTSTRAP_TIMEOUT_S): another "
                                "rank stopped before it; this rank's work is done",
                                launch.rank, timeout_s),
                      EXIT_COMM_TIMEOUT);
    std::lock_guard<std::mutex> lock(mpi_mutex());
    LLMC_MPI_CHECK(MPI_Finalize());
#else
    (void)launch;
#endif
}

}  // namespace llmc
