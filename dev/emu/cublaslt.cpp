// dev/emu/cublaslt.cpp: the cuBLASLt C API that llmc calls, on the CPU, with the real header's
// signatures (cublasLt.h is included; libcublasLt is not linked).
//
// The one idea: a product is validated when it is called, the way cuBLASLt refuses it, and runs
// later on its stream: the call copies every value it needs (shapes, types, pointers, alpha, beta)
// into the operation, so the descriptors may be destroyed at once. The work converts A and B to
// fp32 once, multiplies with the CPU model's GEMM (llmc/cpu/gemm.h: packed, cache-blocked,
// OpenMP-parallel, every output summed in the same order for any thread count), then applies the
// scaling and the epilogue in fp32 and rounds once, to nearest even, where the output is bf16.
//
// Emulated:
//   - handles, matmul descriptors, matrix layouts and preferences, with every attribute the header
//     declares: a size that differs from the attribute's type, or an unknown attribute, is
//     CUBLAS_STATUS_INVALID_VALUE; values are checked when they are used, not when they are set;
//   - D = alpha op(A) op(B) + beta C, column-major, op N or T (CUBLAS_OP_C is T on real types), compute
//     type CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, host pointer mode; A and B both CUDA_R_16BF
//     (C and D then CUDA_R_16BF or CUDA_R_32F) or both CUDA_R_32F (C and D CUDA_R_32F); C and D of
//     one type; C is not read when beta == 0 (it may then be null); C == D in place; strided
//     batches (one batch count for all four matrices, any non-negative strides);
//   - fp8 products as Hopper runs them: A and B CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 (not both E5M2),
//     decoded exactly, accumulated in fp32 and multiplied by A's and B's per-tensor scales
//     (A_SCALE_POINTER, B_SCALE_POINTER: device scalars read when the product runs) with alpha; C
//     and D bf16 or fp32; only "TN" (A transposed, B not), k and every leading dimension's bytes a
//     multiple of 16, A, B and the scale pointers 16-byte aligned, else NOT_SUPPORTED (the scales'
//     alignment at cublasLtMatmul only, as the real library checks it); the forward epilogues (none,
//     bias, ReLU, GELU, GELU aux) with a bf16 bias. Gradient epilogues (DGELU, BGRAD*), fp8
//     outputs, C's and D's scales, D's amax and block scaling are NOT_SUPPORTED: not emulated;
//   - the epilogues DEFAULT, RELU, RELU_BIAS, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS,
//     DGELU, DGELU_BGRAD, BGRADA, BGRADB, in the order the header gives: (scaled product + beta C)
//     + bias, the GELU input stored to aux, then the activation. GELU is the tanh form (llmc's
//     cpu::gelu_sigmoid); RELU maps NaN to 0, as cuBLASLt's does. DGELU multiplies by GELU'(aux).
//     A bias has D's type or CUDA_R_32F; aux has D's type. The bias gradients: DGELU_BGRAD sums
//     the rows of the fp32 result before it is rounded (m values), BGRADA sums op(A) over k (m
//     values), BGRADB sums op(B) over k (n values); each sum runs in ascending index order. With
//     batches the bias and aux advance by BIAS_BATCH_STRIDE and EPILOGUE_AUX_BATCH_STRIDE;
//   - cublasLtMatmulAlgoGetHeuristic returns one algorithm (no workspace, no split-K, wavesCount
//     1, so any workspace limit and reduction-scheme mask admit it) or CUBLAS_STATUS_NOT_SUPPORTED
//     (also for a MAX_WAVES_COUNT below 1 or a search mode other than BEST_FIT); IMPL_MASK is
//     stored and ignored. cublasLtMatmul accepts algo == NULL (cuBLASLt's implicit heuristic) and
//     any workspace, null included;
//   - refusals: an unsupported type, compute type, order, batch mode, pointer mode, TRANSC, fill
//     mode or epilogue is NOT_SUPPORTED, as is a pointer less aligned than the algorithm assumes
//     (below). Shapes that do not fit the transposes, ld < rows, differing batch counts, an aux
//     ld that is not a multiple of 8 or below D's rows, an aux batch stride that is not a
//     multiple of 8, a missing pointer that the product or its epilogue needs, C == D with
//     different layouts, a zero dimension, and an algorithm from a product of other types are
//     INVALID_VALUE; so are an aux type other than D's and the fp8 attributes (scale and amax
//     pointers, scale modes) on other types, which the header says cublasLtMatmul refuses with
//     INVALID_VALUE.
//   - Alignment: an algorithm may assume what the preference's MIN_ALIGNMENT_{A,B,C,D}_BYTES
//     promise (default 256), up to 16 bytes (no kernel loads more at once), and for the bias and
//     aux buffers the alignment of the pointers the descriptor held at the heuristic (the header:
//     the heuristic "depends on its value to determine expected pointer alignment"), up to 16
//     bytes. cublasLtMatmul with a pointer aligned less than its algorithm assumes returns
//     CUBLAS_STATUS_NOT_SUPPORTED: the status the real library returns for under-aligned
//     operands (PyTorch's cublasLt addmm failures with 2-byte-aligned inputs), and what the docs
//     give for "the configured operation is not supported", rather than INVALID_VALUE ("parameters
//     in conflict"). The real library may run a product whose pointers are aligned less than the
//     preference promised, when the algorithm it chose needs less; the emulator is stricter.
//   - When the work runs, every matrix, the bias and aux must lie inside one cudaMalloc'd
//     allocation (emu::is_device_range), else emu::fatal names the operand.
//
// Not emulated: other types (fp16, int8, complex, fp64), other compute types (16F, TF32,
// pedantic, emulated), device pointer modes, the ReLU bit-mask epilogues (RELU_AUX, RELU_AUX_BIAS,
// DRELU, DRELU_BGRAD), row-major and tiled orders, pointer-array batches, planar complex,
// cublasLtMatrixTransform, algorithm enumeration and configuration (cublasLtMatmulAlgoGetIds,
// AlgoInit, AlgoConfig*, AlgoCheck), the search modes other than BEST_FIT, the logger. The bits
// differ from a GPU's (another summation order, tensor-core rounding, the hardware tanh): results
// agree to within fp32 accumulation error, not bit for bit. Zero-sized products are refused (llmc never asks for
// one; what the real library does with them is not documented).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "dev/emu/stream.h"
#include "llmc/cpu/gemm.h"
#include "llmc/cpu/ops.h"

#if !defined(__FMA__)
#warning "built without FMA instructions (add -march=native): llmc/cpu/gemm.h then calls std::fma for each multiply-add, about 200x slower"
#endif

struct cublasLtContext {
    uint64_t magic;
};

namespace {

constexpr uint64_t HANDLE_MAGIC = 0x746c73616c627563ull;  // "cublaslt"
constexpr uint64_t ALGO_MAGIC = 0x6f676c61744c756dull;    // "muLtalgo"
constexpr uint32_t WIDEST_ACCESS_BYTES = 16;              // the most any kernel loads at once

// ---------------------------------------------------------------------------------------------
// Descriptors. Each lives inside the header's opaque struct (so the *Init functions work on
// caller-provided storage too); fields have the types the header documents for their attributes.

struct MatmulDescData {
    int32_t compute_type, scale_type;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
    int32_t fill_mode = CUBLAS_FILL_MODE_FULL;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias_pointer = nullptr;
    int64_t bias_batch_stride = 0;
    const void* aux_pointer = nullptr;
    int64_t aux_ld = 0, aux_batch_stride = 0, alpha_vector_batch_stride = 0;
    int32_t sm_count_target = 0;
    const void* a_scale = nullptr, *b_scale = nullptr, *c_scale = nullptr, *d_scale = nullptr;
    const void* amax_d = nullptr;
    int32_t aux_data_type = -1;
    const void* aux_scale = nullptr, *aux_amax = nullptr;
    int8_t fast_accum = 0;
    int32_t bias_data_type = -1;
    int32_t a_scale_mode = 0, b_scale_mode = 0, c_scale_mode = 0, d_scale_mode = 0, aux_scale_mode = 0;
    const void* d_out_scale = nullptr;
    int32_t d_out_scale_mode = 0;
    cublasLtEmulationDesc_t emulation = nullptr;
};

struct LayoutData {
    uint32_t type;
    int32_t order = CUBLASLT_ORDER_COL;
    uint64_t rows, cols;
    int64_t ld;
    int64_t batch_stride = 0, plane_offset = 0;
    int32_t batch_count = 1;
    uint32_t batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
};

struct PreferenceData {
    uint32_t search_mode = CUBLASLT_SEARCH_BEST_FIT;
    uint32_t reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
    float max_waves_count = 0.0f;
    uint64_t max_workspace_bytes = 0;
    uint64_t impl_mask = ~uint64_t(0);
};

// What the heuristic hands out in cublasLtMatmulAlgo_t: the types it was chosen for and the
// alignments it assumes.
struct AlgoRecord {
    uint64_t magic;
    int32_t types[4];      // A, B, C, D
    uint32_t alignment[4];  // A, B, C, D
    uint32_t bias_alignment, aux_alignment;
};

static_assert(sizeof(MatmulDescData) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutData) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(PreferenceData) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(AlgoRecord) <= sizeof(cublasLtMatmulAlgo_t));
static_assert(alignof(MatmulDescData) <= alignof(cublasLtMatmulDescOpaque_t));

template <typename Data, typename Opaque>
Data& data_of(Opaque* opaque) {
    return *std::launder(reinterpret_cast<Data*>(opaque));
}

// One attribute's storage: where it is and how many bytes it takes. `at` is null for an attribute
// the descriptor does not have.
struct Field {
    void* at = nullptr;
    size_t bytes = 0;
};
template <typename T>
Field field(T& value) {
    return {&value, sizeof(T)};
}

cublasStatus_t set_field(Field f, const void* buf, size_t bytes) {
    if (!f.at || !buf || bytes != f.bytes) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(f.at, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

// sizeInBytes == 0 asks for the size; otherwise it must be the attribute's size.
cublasStatus_t get_field(Field f, void* buf, size_t bytes, size_t* written) {
    if (!f.at) return CUBLAS_STATUS_INVALID_VALUE;
    if (bytes == 0) {
        if (!written) return CUBLAS_STATUS_INVALID_VALUE;
        *written = f.bytes;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || bytes != f.bytes) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, f.at, bytes);
    if (written) *written = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

Field desc_field(MatmulDescData& d, cublasLtMatmulDescAttributes_t attribute) {
    switch (attribute) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return field(d.compute_type);
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return field(d.scale_type);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return field(d.pointer_mode);
        case CUBLASLT_MATMUL_DESC_TRANSA: return field(d.transa);
        case CUBLASLT_MATMUL_DESC_TRANSB: return field(d.transb);
        case CUBLASLT_MATMUL_DESC_TRANSC: return field(d.transc);
        case CUBLASLT_MATMUL_DESC_FILL_MODE: return field(d.fill_mode);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return field(d.epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return field(d.bias_pointer);
        case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return field(d.bias_batch_stride);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return field(d.aux_pointer);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return field(d.aux_ld);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return field(d.aux_batch_stride);
        case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE: return field(d.alpha_vector_batch_stride);
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: return field(d.sm_count_target);
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return field(d.a_scale);
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return field(d.b_scale);
        case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return field(d.c_scale);
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return field(d.d_scale);
        case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return field(d.amax_d);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return field(d.aux_data_type);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER: return field(d.aux_scale);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER: return field(d.aux_amax);
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return field(d.fast_accum);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return field(d.bias_data_type);
        case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return field(d.a_scale_mode);
        case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return field(d.b_scale_mode);
        case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return field(d.c_scale_mode);
        case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return field(d.d_scale_mode);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE: return field(d.aux_scale_mode);
        case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER: return field(d.d_out_scale);
        case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE: return field(d.d_out_scale_mode);
        case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR: return field(d.emulation);
        default: return {};
    }
}

Field layout_field(LayoutData& l, cublasLtMatrixLayoutAttribute_t attribute) {
    switch (attribute) {
        case CUBLASLT_MATRIX_LAYOUT_TYPE: return field(l.type);
        case CUBLASLT_MATRIX_LAYOUT_ORDER: return field(l.order);
        case CUBLASLT_MATRIX_LAYOUT_ROWS: return field(l.rows);
        case CUBLASLT_MATRIX_LAYOUT_COLS: return field(l.cols);
        case CUBLASLT_MATRIX_LAYOUT_LD: return field(l.ld);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return field(l.batch_count);
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return field(l.batch_stride);
        case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return field(l.plane_offset);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return field(l.batch_mode);
        default: return {};
    }
}

Field preference_field(PreferenceData& p, cublasLtMatmulPreferenceAttributes_t attribute) {
    switch (attribute) {
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return field(p.search_mode);
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return field(p.max_workspace_bytes);
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return field(p.reduction_scheme_mask);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return field(p.min_alignment[0]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return field(p.min_alignment[1]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return field(p.min_alignment[2]);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return field(p.min_alignment[3]);
        case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return field(p.max_waves_count);
        case CUBLASLT_MATMUL_PREF_IMPL_MASK: return field(p.impl_mask);
        default: return {};
    }
}

// ---------------------------------------------------------------------------------------------
// The product as validated: everything the work needs except the pointers and scalars.

bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }
size_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : is_fp8(type) ? 1 : 2; }

// One matrix: column-major rows x cols, leading dimension ld, batch_stride elements between batches.
struct Matrix {
    cudaDataType_t type;
    int64_t rows, cols, ld, batch_stride;

    size_t span_bytes(int batch) const {
        return (size_t)((batch - 1) * batch_stride + (cols - 1) * ld + rows) * element_bytes(type);
    }
};

struct EpilogueOps {
    bool bias_in = false, relu = false, gelu = false, aux_out = false, dgelu = false;
    enum class BiasGrad { NONE, OF_D, OF_A, OF_B } bias_grad = BiasGrad::NONE;

    bool uses_bias() const { return bias_in || bias_grad != BiasGrad::NONE; }
    bool uses_aux() const { return aux_out || dgelu; }
};

// False for an epilogue the emulator does not implement (the ReLU bit-mask ones) or that does not exist.
bool decode_epilogue(uint32_t epilogue, EpilogueOps* ops) {
    using BiasGrad = EpilogueOps::BiasGrad;
    EpilogueOps o;
    switch (epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT: break;
        case CUBLASLT_EPILOGUE_RELU: o.relu = true; break;
        case CUBLASLT_EPILOGUE_RELU_BIAS: o.relu = o.bias_in = true; break;
        case CUBLASLT_EPILOGUE_BIAS: o.bias_in = true; break;
        case CUBLASLT_EPILOGUE_GELU: o.gelu = true; break;
        case CUBLASLT_EPILOGUE_GELU_BIAS: o.gelu = o.bias_in = true; break;
        case CUBLASLT_EPILOGUE_GELU_AUX: o.gelu = o.aux_out = true; break;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: o.gelu = o.aux_out = o.bias_in = true; break;
        case CUBLASLT_EPILOGUE_DGELU: o.dgelu = true; break;
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: o.dgelu = true, o.bias_grad = BiasGrad::OF_D; break;
        case CUBLASLT_EPILOGUE_BGRADA: o.bias_grad = BiasGrad::OF_A; break;
        case CUBLASLT_EPILOGUE_BGRADB: o.bias_grad = BiasGrad::OF_B; break;
        default: return false;
    }
    *ops = o;
    return true;
}

struct Problem {
    int64_t m, n, k;
    int batch;
    bool transa, transb;
    Matrix a, b, c, d;
    EpilogueOps ops;
    cudaDataType_t bias_type;
    int64_t bias_length, bias_batch_stride;
    int64_t aux_ld, aux_batch_stride;  // aux has D's type and m x n shape
    bool fp8;                          // A and B are fp8: the product is scaled by A's and B's scales
};

bool parse_transpose(int32_t op, bool* transposed) {
    // For real types CUBLAS_OP_C is the transpose, as everywhere in cuBLAS.
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) return false;
    *transposed = op != CUBLAS_OP_N;
    return true;
}

// What the matmul descriptor asks for besides the epilogue.
cublasStatus_t check_operation(const MatmulDescData& d) {
    if (d.compute_type != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.transc != CUBLAS_OP_N || d.fill_mode != CUBLAS_FILL_MODE_FULL) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// The fp8-only attributes. On other types the header has cublasLtMatmul refuse them with
// INVALID_VALUE. On fp8 products the emulator takes A's and B's per-tensor scales; the others (C's
// and D's scales, D's amax, the aux scales, block scaling modes) are not emulated.
cublasStatus_t check_fp8_attributes(const MatmulDescData& d, bool fp8) {
    const void* emulated[] = {d.a_scale, d.b_scale};
    const void* not_emulated[] = {d.c_scale, d.d_scale, d.amax_d, d.aux_scale, d.aux_amax, d.d_out_scale};
    const bool modes = d.a_scale_mode || d.b_scale_mode || d.c_scale_mode || d.d_scale_mode || d.aux_scale_mode ||
                       d.d_out_scale_mode;
    bool any = modes;
    for (const void* p : emulated) any = any || p;
    for (const void* p : not_emulated) any = any || p;
    if (!fp8) return any ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
    for (const void* p : not_emulated)
        if (p) return CUBLAS_STATUS_NOT_SUPPORTED;
    return modes ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t read_layout(const LayoutData& l, Matrix* out) {
    if (l.type != CUDA_R_16BF && l.type != CUDA_R_32F && !is_fp8((cudaDataType_t)l.type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.order != CUBLASLT_ORDER_COL || l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l.plane_offset != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.rows > (uint64_t)INT32_MAX || l.cols > (uint64_t)INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l.rows == 0 || l.cols == 0 || l.ld < (int64_t)l.rows) return CUBLAS_STATUS_INVALID_VALUE;
    if (l.batch_count < 1 || l.batch_stride < 0) return CUBLAS_STATUS_INVALID_VALUE;
    *out = Matrix{(cudaDataType_t)l.type, (int64_t)l.rows, (int64_t)l.cols, l.ld, l.batch_stride};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_types(const Problem& p) {
    if (p.c.type != p.d.type || is_fp8(p.d.type)) return CUBLAS_STATUS_NOT_SUPPORTED;  // fp8 outputs: not emulated
    if (p.fp8) {
        // E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 (the docs' table: no E5M2 x E5M2), into bf16 or fp32.
        if (!is_fp8(p.a.type) || !is_fp8(p.b.type)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (p.a.type == CUDA_R_8F_E5M2 && p.b.type == CUDA_R_8F_E5M2) return CUBLAS_STATUS_NOT_SUPPORTED;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (p.a.type != p.b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (p.a.type == CUDA_R_32F && p.d.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// The docs' requirements for fp8 kernels on Hopper: the "TN" format (A transposed, B not), so both
// operands are read along k, and 16-byte alignment: k and every leading dimension in bytes a
// multiple of 16 (the pointers are checked against the algorithm, which assumes 16 for A and B).
cublasStatus_t check_fp8_layout(const Problem& p) {
    if (!p.transa || p.transb) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (p.k % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const Matrix* m : {&p.a, &p.b, &p.c, &p.d})
        if ((m->ld * (int64_t)element_bytes(m->type)) % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// op(A) is m x k, op(B) k x n, C and D m x n.
cublasStatus_t derive_shape(Problem* p) {
    p->m = p->transa ? p->a.cols : p->a.rows;
    p->k = p->transa ? p->a.rows : p->a.cols;
    const int64_t b_rows = p->transb ? p->b.cols : p->b.rows;
    p->n = p->transb ? p->b.rows : p->b.cols;
    if (b_rows != p->k || p->d.rows != p->m || p->d.cols != p->n || p->c.rows != p->m || p->c.cols != p->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_epilogue(const MatmulDescData& d, Problem* p) {
    if (!decode_epilogue(d.epilogue, &p->ops)) return CUBLAS_STATUS_NOT_SUPPORTED;
    // fp8 products: the forward epilogues only (the emulator's choice: gradients of fp8 operands are
    // not taken in the epilogue), and a bf16 bias whatever D's type (the docs' table).
    if (p->fp8 && (p->ops.dgelu || p->ops.bias_grad != EpilogueOps::BiasGrad::NONE)) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int32_t default_bias_type = p->fp8 ? (int32_t)CUDA_R_16BF : (int32_t)p->d.type;
    const int32_t bias_type = d.bias_data_type == -1 ? default_bias_type : d.bias_data_type;
    if (p->ops.uses_bias()) {
        const bool allowed = p->fp8 ? bias_type == CUDA_R_16BF : bias_type == p->d.type || bias_type == CUDA_R_32F;
        if (!allowed) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    p->bias_type = (cudaDataType_t)bias_type;
    p->bias_length = p->ops.bias_grad == EpilogueOps::BiasGrad::OF_B ? p->n : p->m;
    p->bias_batch_stride = d.bias_batch_stride;
    if (p->bias_batch_stride < 0) return CUBLAS_STATUS_INVALID_VALUE;
    p->aux_ld = d.aux_ld;
    p->aux_batch_stride = d.aux_batch_stride;
    if (!p->ops.uses_aux()) return CUBLAS_STATUS_SUCCESS;
    // The header: the GELU input's ld "must be divisible by 8 and be no less than the number of rows
    // in the output matrix", its batch stride "must be divisible by 8"; its type is D's.
    if (d.aux_data_type != -1 && d.aux_data_type != p->d.type) return CUBLAS_STATUS_INVALID_VALUE;
    if (p->aux_ld % 8 != 0 || p->aux_ld < p->m) return CUBLAS_STATUS_INVALID_VALUE;
    if (p->aux_batch_stride % 8 != 0 || p->aux_batch_stride < 0) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// Validates everything the heuristic and the product share; fills `p`.
cublasStatus_t describe_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Problem* p) {
    if (!desc || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
    const MatmulDescData& op = data_of<MatmulDescData>(desc);
    cublasStatus_t status = check_operation(op);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (!parse_transpose(op.transa, &p->transa) || !parse_transpose(op.transb, &p->transb))
        return CUBLAS_STATUS_INVALID_VALUE;
    const LayoutData* layouts[4] = {&data_of<LayoutData>(a), &data_of<LayoutData>(b), &data_of<LayoutData>(c),
                                    &data_of<LayoutData>(d)};
    Matrix* matrices[4] = {&p->a, &p->b, &p->c, &p->d};
    for (int i = 0; i < 4; i++) {
        if ((status = read_layout(*layouts[i], matrices[i])) != CUBLAS_STATUS_SUCCESS) return status;
        if (layouts[i]->batch_count != layouts[3]->batch_count) return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->batch = layouts[3]->batch_count;
    p->fp8 = is_fp8(p->a.type) || is_fp8(p->b.type);
    if ((status = check_types(*p)) != CUBLAS_STATUS_SUCCESS) return status;
    if ((status = check_fp8_attributes(op, p->fp8)) != CUBLAS_STATUS_SUCCESS) return status;
    if ((status = derive_shape(p)) != CUBLAS_STATUS_SUCCESS) return status;
    if (p->fp8 && (status = check_fp8_layout(*p)) != CUBLAS_STATUS_SUCCESS) return status;
    return check_epilogue(op, p);
}

// The largest power of two (at most `cap`) that divides the address; a null pointer has `cap`.
uint32_t alignment_of(const void* ptr, uint32_t cap) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
    if (address == 0) return cap;
    return (uint32_t)std::min<uintptr_t>(address & (~address + 1), cap);
}

AlgoRecord make_algo_record(const Problem& p, const MatmulDescData& desc, const PreferenceData& preference) {
    AlgoRecord r{};
    r.magic = ALGO_MAGIC;
    const Matrix* matrices[4] = {&p.a, &p.b, &p.c, &p.d};
    for (int i = 0; i < 4; i++) {
        r.types[i] = matrices[i]->type;
        r.alignment[i] = std::min(preference.min_alignment[i], WIDEST_ACCESS_BYTES);
    }
    r.bias_alignment = p.ops.uses_bias() ? alignment_of(desc.bias_pointer, WIDEST_ACCESS_BYTES) : 1;
    r.aux_alignment = p.ops.uses_aux() ? alignment_of(desc.aux_pointer, WIDEST_ACCESS_BYTES) : 1;
    return r;
}

// ---------------------------------------------------------------------------------------------
// One product as it is enqueued: the problem, its pointers and its scalars, copied by value.

struct Call {
    Problem p;
    const void* a;
    const void* b;
    const void* c;  // null when beta == 0 and none was given
    void* d;
    void* bias;  // read by the BIAS epilogues, written by the BGRAD ones
    void* aux;   // written by GELU_AUX*, read by DGELU*
    float alpha, beta;
    const float* a_scale;  // fp8: device scalars read when the product runs (null: 1)
    const float* b_scale;
};

// Pointers that the product and its epilogue need must be given.
cublasStatus_t bind_pointers(const MatmulDescData& desc, const void* alpha, const void* beta, const void* a,
                             const void* b, const void* c, void* d, Call* call) {
    const Problem& p = call->p;
    if (!alpha || !beta || !a || !b || !d) return CUBLAS_STATUS_INVALID_VALUE;
    call->alpha = *static_cast<const float*>(alpha);
    call->beta = *static_cast<const float*>(beta);
    if (!c && call->beta != 0.0f) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.ops.uses_bias() && !desc.bias_pointer) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.ops.uses_aux() && !desc.aux_pointer) return CUBLAS_STATUS_INVALID_VALUE;
    // In place (C == D) the two must describe the same memory.
    if (c == d && (p.c.ld != p.d.ld || p.c.batch_stride != p.d.batch_stride)) return CUBLAS_STATUS_INVALID_VALUE;
    call->a = a, call->b = b, call->c = c, call->d = d;
    call->bias = p.ops.uses_bias() ? const_cast<void*>(desc.bias_pointer) : nullptr;
    call->aux = p.ops.uses_aux() ? const_cast<void*>(desc.aux_pointer) : nullptr;
    call->a_scale = static_cast<const float*>(desc.a_scale);
    call->b_scale = static_cast<const float*>(desc.b_scale);
    return CUBLAS_STATUS_SUCCESS;
}

// The algorithm must come from the heuristic for these types, and the pointers must be aligned as
// it assumes. algo == NULL is cuBLASLt's implicit heuristic, which sees the pointers themselves.
cublasStatus_t check_algorithm(const cublasLtMatmulAlgo_t* algo, const Call& call) {
    if (call.p.fp8 && (alignment_of(call.a, 16) < 16 || alignment_of(call.b, 16) < 16))
        return CUBLAS_STATUS_NOT_SUPPORTED;  // fp8 kernels need 16-byte aligned A and B, whatever the algorithm
    // ... and 16-byte aligned scale pointers: an H200's cuBLASLt 13.0 refused a scale 4 bytes into
    // an allocation with NOT_SUPPORTED at cublasLtMatmul, after its heuristic had accepted it
    // (dev/cuda/NOTES.md, first GPU session)
    for (const float* scale : {call.a_scale, call.b_scale})
        if (scale && alignment_of(scale, 16) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!algo) return CUBLAS_STATUS_SUCCESS;
    AlgoRecord r;
    std::memcpy(&r, algo, sizeof(r));
    const Problem& p = call.p;
    const Matrix* matrices[4] = {&p.a, &p.b, &p.c, &p.d};
    if (r.magic != ALGO_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; i++)
        if (r.types[i] != matrices[i]->type) return CUBLAS_STATUS_INVALID_VALUE;
    const void* pointers[4] = {call.a, call.b, call.c, call.d};
    for (int i = 0; i < 4; i++)
        if (pointers[i] && alignment_of(pointers[i], 256) < r.alignment[i]) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (call.bias && alignment_of(call.bias, 256) < r.bias_alignment) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (call.aux && alignment_of(call.aux, 256) < r.aux_alignment) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// The work.

void require_device(const void* ptr, size_t bytes, const char* operand) {
    if (emu::is_device_range(ptr, bytes)) return;
    char message[256];
    std::snprintf(message, sizeof(message),
                  "%s (%p, %zu bytes) is not inside one cudaMalloc'd allocation: expected device memory", operand,
                  ptr, bytes);
    emu::fatal("cublasLtMatmul", message);
}

void require_device_memory(const Call& call) {
    const Problem& p = call.p;
    require_device(call.a, p.a.span_bytes(p.batch), "matrix A");
    require_device(call.b, p.b.span_bytes(p.batch), "matrix B");
    if (call.beta != 0.0f) require_device(call.c, p.c.span_bytes(p.batch), "matrix C");
    require_device(call.d, p.d.span_bytes(p.batch), "matrix D");
    if (call.a_scale) require_device(call.a_scale, sizeof(float), "A's scale (A_SCALE_POINTER)");
    if (call.b_scale) require_device(call.b_scale, sizeof(float), "B's scale (B_SCALE_POINTER)");
    if (call.bias) {
        const size_t elements = (size_t)((p.batch - 1) * p.bias_batch_stride + p.bias_length);
        require_device(call.bias, elements * element_bytes(p.bias_type), "the bias vector (BIAS_POINTER)");
    }
    if (call.aux) {
        const Matrix aux{p.d.type, p.m, p.n, p.aux_ld, p.aux_batch_stride};
        require_device(call.aux, aux.span_bytes(p.batch), "the epilogue's aux matrix (EPILOGUE_AUX_POINTER)");
    }
}

const void* offset(const void* base, cudaDataType_t type, int64_t elements) {
    return static_cast<const char*>(base) + elements * (int64_t)element_bytes(type);
}
void* offset(void* base, cudaDataType_t type, int64_t elements) {
    return static_cast<char*>(base) + elements * (int64_t)element_bytes(type);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>((uint32_t)bits << 16); }

// fp8 decodes with CUDA's own conversion (exact: every fp8 value is a half).
float fp8_to_float(uint8_t code, cudaDataType_t type) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(code, type == CUDA_R_8F_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}

void load(float* out, const void* src, cudaDataType_t type, int64_t n) {
    if (type == CUDA_R_32F) {
        std::memcpy(out, src, (size_t)n * sizeof(float));
        return;
    }
    if (is_fp8(type)) {
        const uint8_t* s = static_cast<const uint8_t*>(src);
        for (int64_t i = 0; i < n; i++) out[i] = fp8_to_float(s[i], type);
        return;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_float(s[i]);
}

void store(void* dst, cudaDataType_t type, const float* values, int64_t n) {
    if (type == CUDA_R_32F) {
        std::memcpy(dst, values, (size_t)n * sizeof(float));
        return;
    }
    __nv_bfloat16* d = static_cast<__nv_bfloat16*>(dst);
    for (int64_t i = 0; i < n; i++) d[i] = __float2bfloat16_rn(values[i]);
}

// An fp32 view of one stored matrix: column j at data + j * ld.
struct FloatMatrix {
    const float* data;
    int64_t ld;
};

// fp32 operands are used where they lie; bf16 ones are converted into `scratch`, packed tight.
FloatMatrix as_float(const Matrix& m, const void* base, int batch, std::vector<float>& scratch) {
    const void* src = offset(base, m.type, batch * m.batch_stride);
    if (m.type == CUDA_R_32F) return {static_cast<const float*>(src), m.ld};
    scratch.resize((size_t)(m.rows * m.cols));
    float* out = scratch.data();
#pragma omp parallel for schedule(static) if (m.rows * m.cols > 65536)
    for (int64_t j = 0; j < m.cols; j++) load(out + j * m.rows, offset(src, m.type, j * m.ld), m.type, m.rows);
    return {out, m.rows};
}

// out[i] = sum over j of x(i, j), j ascending: the order of every sum is fixed.
void sum_across_columns(FloatMatrix x, int64_t rows, int64_t cols, float* out) {
    constexpr int64_t ROWS_PER_TASK = 256;
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t i0 = 0; i0 < rows; i0 += ROWS_PER_TASK) {
        const int64_t i1 = std::min(rows, i0 + ROWS_PER_TASK);
        std::fill(out + i0, out + i1, 0.0f);
        for (int64_t j = 0; j < cols; j++) {
            const float* column = x.data + j * x.ld;
            for (int64_t i = i0; i < i1; i++) out[i] += column[i];
        }
    }
}

// out[j] = sum over i of x(i, j), i ascending.
void sum_down_columns(FloatMatrix x, int64_t rows, int64_t cols, float* out) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t j = 0; j < cols; j++) {
        const float* column = x.data + j * x.ld;
        float sum = 0.0f;
        for (int64_t i = 0; i < rows; i++) sum += column[i];
        out[j] = sum;
    }
}

float gelu(float x) { return x * llmc::cpu::gelu_sigmoid(x); }

// d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x), the tanh form's derivative.
float gelu_grad(float x) {
    const float s = llmc::cpu::gelu_sigmoid(x);
    const float du_dx = llmc::cpu::GELU_K * (1.0f + 3.0f * llmc::cpu::GELU_A * x * x);
    return s + 2.0f * x * s * (1.0f - s) * du_dx;
}

struct Scratch {
    std::vector<float> a, b, product, column, bias, bias_grad;
};

// Column j of the result, in fp32: scaling, C, bias, aux, activation; then stored to D.
void epilogue_column(const Call& call, int batch, int64_t j, float* t, const float* bias, float* column) {
    const Problem& p = call.p;
    const int64_t m = p.m;
    for (int64_t i = 0; i < m; i++) t[i] *= call.alpha;
    if (call.beta != 0.0f) {
        load(column, offset(call.c, p.c.type, batch * p.c.batch_stride + j * p.c.ld), p.c.type, m);
        for (int64_t i = 0; i < m; i++) t[i] += call.beta * column[i];
    }
    if (p.ops.bias_in)
        for (int64_t i = 0; i < m; i++) t[i] += bias[i];
    void* aux = call.aux ? offset(call.aux, p.d.type, batch * p.aux_batch_stride + j * p.aux_ld) : nullptr;
    if (p.ops.aux_out) store(aux, p.d.type, t, m);
    if (p.ops.relu)
        for (int64_t i = 0; i < m; i++) t[i] = t[i] > 0.0f ? t[i] : 0.0f;  // NaN becomes 0, as in cuBLASLt
    if (p.ops.gelu) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) t[i] = gelu(t[i]);
    }
    if (p.ops.dgelu) {
        load(column, aux, p.d.type, m);
#pragma omp simd
        for (int64_t i = 0; i < m; i++) t[i] *= gelu_grad(column[i]);
    }
    store(offset(call.d, p.d.type, batch * p.d.batch_stride + j * p.d.ld), p.d.type, t, m);
}

void apply_epilogue(const Call& call, int batch, Scratch& s) {
    const Problem& p = call.p;
    const float* bias = nullptr;
    if (p.ops.bias_in) {
        s.bias.resize((size_t)p.m);
        load(s.bias.data(), offset(call.bias, p.bias_type, batch * p.bias_batch_stride), p.bias_type, p.m);
        bias = s.bias.data();
    }
#pragma omp parallel if (p.m * p.n > 16384)
    {
        std::vector<float> column((size_t)p.m);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < p.n; j++)
            epilogue_column(call, batch, j, s.product.data() + j * p.m, bias, column.data());
    }
}

// BGRADA / BGRADB: sums of op(A) over k (one per row of D) or of op(B) over k (one per column).
void operand_bias_grad(const Problem& p, FloatMatrix a, FloatMatrix b, float* out) {
    if (p.ops.bias_grad == EpilogueOps::BiasGrad::OF_A) {
        if (p.transa) sum_down_columns(a, p.k, p.m, out);  // A stored k x m
        else sum_across_columns(a, p.m, p.k, out);
    } else {
        if (p.transb) sum_across_columns(b, p.n, p.k, out);  // B stored n x k
        else sum_down_columns(b, p.k, p.n, out);
    }
}

void run_batch(const Call& call, int batch, Scratch& s) {
    using BiasGrad = EpilogueOps::BiasGrad;
    const Problem& p = call.p;
    const FloatMatrix a = as_float(p.a, call.a, batch, s.a);
    const FloatMatrix b = as_float(p.b, call.b, batch, s.b);
    // The column-major m x n product is the row-major n x m product op(B)^T op(A)^T, which is
    // what the CPU GEMM computes; each transpose flips how it reads the operand.
    s.product.resize((size_t)(p.m * p.n));
    const llmc::cpu::MatRef lhs{b.data, (size_t)b.ld, p.transb};
    const llmc::cpu::MatRef rhs{a.data, (size_t)a.ld, p.transa};
    llmc::cpu::gemm((int)p.n, (int)p.m, (int)p.k, lhs, rhs, s.product.data(), (size_t)p.m, false);

    if (p.ops.bias_grad == BiasGrad::OF_A || p.ops.bias_grad == BiasGrad::OF_B) {
        s.bias_grad.resize((size_t)p.bias_length);
        operand_bias_grad(p, a, b, s.bias_grad.data());
    }
    apply_epilogue(call, batch, s);
    if (p.ops.bias_grad == BiasGrad::OF_D) {
        s.bias_grad.resize((size_t)p.m);
        sum_across_columns({s.product.data(), p.m}, p.m, p.n, s.bias_grad.data());
    }
    if (p.ops.bias_grad != BiasGrad::NONE)
        store(offset(call.bias, p.bias_type, batch * p.bias_batch_stride), p.bias_type, s.bias_grad.data(),
              p.bias_length);
}

// fp8: the scales multiply the fp32 product with alpha, before C and the epilogue.
void run_matmul(const Call& call) {
    require_device_memory(call);
    Call scaled = call;
    if (call.a_scale) scaled.alpha *= *call.a_scale;
    if (call.b_scale) scaled.alpha *= *call.b_scale;
    thread_local Scratch scratch;  // grows to the largest product this thread has run, then is reused
    for (int batch = 0; batch < call.p.batch; batch++) run_batch(scaled, batch, scratch);
}

template <typename Opaque>
cublasStatus_t create(Opaque** out) {
    if (!out) return CUBLAS_STATUS_INVALID_VALUE;
    Opaque* opaque = new (std::nothrow) Opaque;
    if (!opaque) return CUBLAS_STATUS_ALLOC_FAILED;
    *out = opaque;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The C API.

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new (std::nothrow) cublasLtContext{HANDLE_MAGIC};
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle || handle->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    }
    return "unknown status";
}

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

size_t CUBLASWINAPI cublasLtGetCudartVersion(void) { return CUDART_VERSION; }

cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int* value) {
    if (!value) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
        case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
        case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
        case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

// Matmul descriptors.

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size,
                                                            cublasComputeType_t compute_type,
                                                            cudaDataType_t scale_type) {
    if (!desc || size < sizeof(MatmulDescData)) return CUBLAS_STATUS_ALLOC_FAILED;
    MatmulDescData* d = new (desc) MatmulDescData;
    d->compute_type = compute_type;
    d->scale_type = scale_type;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                                     cudaDataType_t scale_type) {
    const cublasStatus_t status = create(desc);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    return cublasLtMatmulDescInit_internal(*desc, sizeof(**desc), compute_type, scale_type);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attribute, const void* buf,
                                                           size_t bytes) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(desc_field(data_of<MatmulDescData>(desc), attribute), buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attribute, void* buf,
                                                           size_t bytes, size_t* written) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(desc_field(data_of<MatmulDescData>(desc), attribute), buf, bytes, written);
}

// Matrix layouts.

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size,
                                                              cudaDataType type, uint64_t rows, uint64_t cols,
                                                              int64_t ld) {
    if (!layout || size < sizeof(LayoutData)) return CUBLAS_STATUS_ALLOC_FAILED;
    LayoutData* l = new (layout) LayoutData;
    l->type = (uint32_t)type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
    const cublasStatus_t status = create(layout);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    return cublasLtMatrixLayoutInit_internal(*layout, sizeof(**layout), type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attribute,
                                                             const void* buf, size_t bytes) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(layout_field(data_of<LayoutData>(layout), attribute), buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attribute, void* buf,
                                                             size_t bytes, size_t* written) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(layout_field(data_of<LayoutData>(layout), attribute), buf, bytes, written);
}

// Heuristic preferences.

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t preference,
                                                                  size_t size) {
    if (!preference || size < sizeof(PreferenceData)) return CUBLAS_STATUS_ALLOC_FAILED;
    new (preference) PreferenceData;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
    const cublasStatus_t status = create(preference);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    return cublasLtMatmulPreferenceInit_internal(*preference, sizeof(**preference));
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
    delete preference;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                                 cublasLtMatmulPreferenceAttributes_t attribute,
                                                                 const void* buf, size_t bytes) {
    if (!preference) return CUBLAS_STATUS_INVALID_VALUE;
    return set_field(preference_field(data_of<PreferenceData>(preference), attribute), buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t preference,
                                                                 cublasLtMatmulPreferenceAttributes_t attribute,
                                                                 void* buf, size_t bytes, size_t* written) {
    if (!preference) return CUBLAS_STATUS_INVALID_VALUE;
    return get_field(preference_field(data_of<PreferenceData>(preference), attribute), buf, bytes, written);
}

// The heuristic: one algorithm for any supported product. It needs no workspace and never splits k,
// so every workspace limit and reduction-scheme mask admit it.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t preference, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[],
                                                           int* returned) {
    if (!handle || handle->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested <= 0 || !results || !returned || !preference) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    Problem p;
    const cublasStatus_t status = describe_problem(desc, a, b, c, d, &p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    const PreferenceData& pref = data_of<PreferenceData>(preference);
    if (pref.search_mode != CUBLASLT_SEARCH_BEST_FIT) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (pref.max_waves_count > 0.0f && pref.max_waves_count < 1.0f) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (p.fp8 && (pref.min_alignment[0] < 16 || pref.min_alignment[1] < 16)) return CUBLAS_STATUS_NOT_SUPPORTED;

    results[0] = cublasLtMatmulHeuristicResult_t{};
    const AlgoRecord record = make_algo_record(p, data_of<MatmulDescData>(desc), pref);
    std::memcpy(&results[0].algo, &record, sizeof(record));
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t a_layout, const void* B,
                                           cublasLtMatrixLayout_t b_layout, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t c_layout, void* D, cublasLtMatrixLayout_t d_layout,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace, (void)workspace_bytes;  // the emulated algorithm needs none
    if (!handle || handle->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    Call call;
    cublasStatus_t status = describe_problem(desc, a_layout, b_layout, c_layout, d_layout, &call.p);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    status = bind_pointers(data_of<MatmulDescData>(desc), alpha, beta, A, B, C, D, &call);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    status = check_algorithm(algo, call);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    emu::enqueue(stream, "cublasLtMatmul", [call] { run_matmul(call); });
    return CUBLAS_STATUS_SUCCESS;
}
