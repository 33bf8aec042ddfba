// layernorm_eps.h: GPT-2's LayerNorm epsilon, one constant for the CPU reference (cpu/ops.h), the
// CUDA kernels (kernels/layernorm.cuh) and the kernel workbench, so the two models cannot drift apart.
#pragma once

namespace llmc {

constexpr float LAYERNORM_EPS = 1e-5f;  // added to the variance before the inverse square root

}  // namespace llmc
