// exit_codes.h: what the trainer's exit status says, so a supervisor (scripts/supervise.sh) knows
// whether relaunching can help. One table; every path that ends the process uses it.
//
//   0  EXIT_OK            the run finished
//   1  EXIT_CONFIG        a bad flag, file or value, or a checkpoint this run refuses: relaunching
//                         the same command fails the same way, so a supervisor must not
//   2  EXIT_RUNTIME       an error during training that is not one of the below (an I/O error)
//   3  EXIT_COMM_TIMEOUT  a collective did not finish in --comm-timeout-s: a rank hung or died
//   4  EXIT_PEER_DEAD     a rank was seen to die (its process is gone) before the timeout
//   5  EXIT_DIVERGED      training cannot go on numerically (non-finite loss with nothing to roll back to)
//   6  EXIT_CORRUPTION    a rank's parameters diverged from its replicas twice: faulty hardware
//   7  EXIT_CKPT_FAILED   a checkpoint failed to write under --ckpt-fail-stop 1
//   8  EXIT_STRAGGLER     the start-up health check found a straggler under --straggler-action refuse
//                         (health.h): not a configuration error, but relaunching on the same nodes
//                         finds the same slow rank, so a supervisor reports it rather than restarts
// A process killed by a signal has no code of its own (a shell reports 128 + the signal).
#pragma once

namespace llmc {

enum ExitCode : int {
    EXIT_OK = 0,
    EXIT_CONFIG = 1,
    EXIT_RUNTIME = 2,
    EXIT_COMM_TIMEOUT = 3,
    EXIT_PEER_DEAD = 4,
    EXIT_DIVERGED = 5,
    EXIT_CORRUPTION = 6,
    EXIT_CKPT_FAILED = 7,
    EXIT_STRAGGLER = 8,
};

// Whether a relaunch from the newest checkpoint can get past a failure that ended with this code.
inline bool exit_code_is_restartable(int code) {
    return code == EXIT_RUNTIME || code == EXIT_COMM_TIMEOUT || code == EXIT_PEER_DEAD || code == EXIT_CKPT_FAILED ||
           code > 128;
}

}  // namespace llmc
