// dev/emu/kernel_resources.h: what nvcc made of each kernel of the program, for the launch check.
// g++ cannot see __launch_bounds__, nor count a kernel's registers or its static shared memory, and
// those decide on a GPU whether a launch fits: a block of more threads than the kernel's bound, or
// of more registers than an SM has, or with more shared memory than 227 KB, is refused there. Where
// nvcc exists, make/emu.mk compiles each emulated program's source with nvcc -ptx and ptxas -v for
// sm_90a, and dev/emu/kernel_table.sh writes its kernels' figures as a table linked into the
// program; runtime.cpp checks every launch against it. A program built without nvcc has no table,
// and its launches are checked against the H100's general limits only.
#pragma once

#include <cstddef>

namespace emu {

struct KernelResources {
    const void* function;  // the kernel in this program (null: g++'s build does not have it)
    const char* symbol;    // its mangled name
    int max_threads;       // __launch_bounds__' first argument (.maxntid); 0 when it has none
    int registers;         // per thread, as ptxas allocated them for sm_90a
    int static_shared;     // bytes of __shared__ declared in the kernel
};

// Called once, at start-up, by the generated table. Returns true (a value to initialise with).
bool register_kernel_resources(const KernelResources* table, size_t n);

}  // namespace emu
