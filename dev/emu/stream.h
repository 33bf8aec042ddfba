// dev/emu/stream.h: the emulator's streams, as the emulated libraries (cuBLASLt, NCCL) see them.
//
// A stream is a queue of operations that run later, in order. Nothing runs when it is enqueued: an
// operation runs when the host needs its result (cudaStreamSynchronize, cudaEventSynchronize or
// cudaEventQuery on an event after it, a blocking cudaMemcpy, cudaDeviceSynchronize), or when work
// that waits for it must run. Then only what is needed runs, and other streams' work stays
// queued: a consumer that forgot to wait for its producer (a missing cudaStreamWaitEvent) reads
// the producer's output before it is written, and the test that checks the output fails, every time.
//
// All of the emulated CUDA API holds one process-wide lock (api_lock) while it works, so host
// threads (the checkpoint writer, a comm thread) may call it at once.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <mutex>

namespace emu {

// Held by every emulated API call for its whole duration (recursive: an operation may call back in).
std::recursive_mutex& api_lock();

// An operation on a stream. `run(block)` does the work and returns true when it is complete. With
// block == false it may instead return false (for example an MPI request still in flight): it is
// then called again later, until it returns true. With block == true it must finish before it
// returns (it may poll and sleep; it must not hold other locks while it waits). `what` names it in
// error messages ("cublasLtMatmul", "ncclAllReduce").
struct StreamOp {
    const char* what = "";
    std::function<bool(bool block)> run;
    // Communication (an NCCL call): it must not wait for the host to need it, or two ranks that
    // each wait for the other's transfer would hang where GPUs do not. So the stream runs up to it
    // as soon as it is enqueued, as far as it can without blocking, and every later emulated call
    // that waits or polls drives it on (run(false)) until it completes, like a GPU's copy engine.
    bool progress = false;
};

// Puts an operation at the end of `stream` (0 or cudaStreamLegacy: the legacy default stream).
void enqueue(cudaStream_t stream, StreamOp op);
// The same, for work that always completes at once.
void enqueue(cudaStream_t stream, const char* what, std::function<void()> work);

// Runs everything enqueued on `stream` so far (and, first, whatever that work waits for on other
// streams). Returns when it has all run.
void drain(cudaStream_t stream);

// Whether `ptr .. ptr + bytes` lies inside one cudaMalloc'd allocation (the emulator's device memory).
bool is_device_range(const void* ptr, size_t bytes);

// Reports an error the program made that a GPU would turn into a fault or undefined behaviour (an
// out-of-bounds copy, a bad argument to an emulated library), naming `where`, and aborts the process.
[[noreturn]] void fatal(const char* where, const char* message);

}  // namespace emu
