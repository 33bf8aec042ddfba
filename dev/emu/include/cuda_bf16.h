// The emulation build's <cuda_bf16.h>: the toolkit's header, whose conversions and arithmetic are
// host functions too under g++, followed by the emulated device language (which needs bf16 for its
// warp shuffles), whichever of the two headers a file includes first.
#pragma once
#include_next <cuda_bf16.h>
#include <cuda_runtime.h>
