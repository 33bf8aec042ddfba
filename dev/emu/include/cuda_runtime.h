// The emulation build's <cuda_runtime.h> (dev/emu/emu.h says what the emulator is). It is found
// before the CUDA toolkit's on the include path: the toolkit's header, compiled by g++, gives the
// runtime API's types, constants and declarations, and the emulator (dev/emu/runtime.cpp) defines
// the functions. Then emu.h adds what nvcc would: the device language and the kernel launch.
#pragma once
#include_next <cuda_runtime.h>
#include <cuda_bf16.h>
#include "dev/emu/emu.h"
