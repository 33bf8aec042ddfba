// dev/emu/launch.h: a kernel launch in the emulation build. LLMC_LAUNCH (cuda_common.cuh) becomes
//   emu::Launch(kernel, "kernel", grid, block, shared_bytes, stream)(args...)
// which converts the arguments to the kernel's parameter types, as a call would, keeps a copy of
// them (a GPU's parameter space), checks the configuration against an H100's limits and puts the
// grid on the stream (runtime.cpp runs it).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace emu {

struct LaunchConfig {
    const void* function = nullptr;  // the kernel's address: cudaFuncSetAttribute's key
    const char* name = "";
    dim3 grid, block;
    size_t shared_bytes = 0;
    cudaStream_t stream = nullptr;
};

// What one CUDA thread runs: the kernel called with the launch's arguments.
using ThreadBody = void (*)(const void* closure);

// The device memory a launch may touch, for the race check: the ranges its pointer arguments point
// into; `all_memory` when an argument is a struct that may hold pointers of its own.
struct LaunchMemory {
    std::vector<const void*> pointers;
    bool all_memory = false;
};

void launch_kernel(const LaunchConfig& config, std::shared_ptr<const void> closure, ThreadBody body,
                   LaunchMemory memory);

template <typename... P>
class Launch {
public:
    using Kernel = void (*)(P...);
    Launch(Kernel kernel, const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream)
        : kernel_(kernel), config_{reinterpret_cast<const void*>(kernel), name, grid, block, shared_bytes, stream} {}

    void operator()(std::type_identity_t<P>... args) const {
        auto closure = std::make_shared<Closure>(Closure{kernel_, std::tuple<std::decay_t<P>...>(args...)});
        LaunchMemory memory;
        (note_argument(memory, args), ...);
        launch_kernel(config_, std::move(closure), &Closure::run, std::move(memory));
    }

private:
    struct Closure {
        Kernel kernel;
        std::tuple<std::decay_t<P>...> args;
        static void run(const void* self) {
            const Closure& c = *static_cast<const Closure*>(self);
            std::apply(c.kernel, c.args);
        }
    };
    template <typename A>
    static void note_argument(LaunchMemory& memory, const A& arg) {
        if constexpr (std::is_pointer_v<A>) memory.pointers.push_back(static_cast<const void*>(arg));
        else if constexpr (std::is_class_v<A>) memory.all_memory = true;
    }

    Kernel kernel_;
    LaunchConfig config_;
};

}  // namespace emu
