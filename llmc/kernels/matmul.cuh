// matmul.cuh: the linear layers' products through cuBLASLt, with the bias, the GELU and the residual
// add fused into the product's epilogue, and a deterministic bias gradient.
//
// The one idea: a row-major (rows x cols) matrix is, byte for byte, a column-major (cols x rows)
// matrix with leading dimension cols. cuBLASLt is column-major, so each PyTorch-shaped product is
// handed to it transposed, and no data is ever moved:
//   forward  out (BT x OC) = inp W^T   becomes  out^T (OC x BT)  = op_T(W as C x OC)   * inp^T (C x BT)
//   dinp     dinp (BT x C) = dout W    becomes  dinp^T (C x BT)  = W^T (C x OC)        * dout^T (OC x BT)
//   dweight  dW (OC x C) += dout^T inp becomes  dW^T (C x OC)   += inp^T (C x BT)      * op_T(dout^T as OC x BT)
// The bias (one value per output channel) is then a per-row vector of the column-major D, which is
// exactly what cuBLASLt's BIAS epilogues broadcast, and the GELU input (pre_gelu) has D's layout.
//
// Determinism: cuBLASLt repeats its bits for the same algorithm on the same GPU (architecture and SM
// count) with the same library version. So the algorithm is chosen once per (shape, epilogue,
// types) and cached, and the same one runs every call. The heuristic only sees algorithms without
// split-K (REDUCTION_SCHEME_NONE: each output element is one dot product in a fixed order), and the
// bias gradient, which cuBLASLt would reduce its own way (BGRADB), is our two-stage kernel with a
// fixed summation order. REDUCTION_SCHEME_COMPUTE_TYPE (fp32 partials in the workspace, reduced by
// a separate kernel) is very likely deterministic too, but nothing documents it, so it stays
// excluded; OUTPUT_TYPE would round a bf16 product's partials to bf16, and INPLACE reduces through
// the output buffer with counters.
//
// Split-K of our own, for the weight gradients (small outputs, k = B x T): their k is cut into
// slices (split_k.h says how many, per shape and card), each slice one batch of a batched product
// into fp32 partials, which split_k_sum_kernel adds to the gradient in slice order. Every part of
// that is fixed by the shape: the same bits every run.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <climits>
#include <map>
#include <optional>
#include <string>

#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/split_k.h"

namespace llmc {

namespace matmul_detail {

// One cuBLASLt product in its column-major terms: D (m x n) = op(A) (m x k) op(B) (k x n) + beta C,
// then the epilogue. A matrix is tight (leading dimension = its stored row count) unless lda/ldb
// say otherwise; C and D share one tight layout, and the GELU input `aux` has D's shape with leading
// dimension m. With batch > 1, `batch` such products whose A, B and D start stride_a, stride_b and
// stride_d elements apart (the split-K slices of one product; no bias, aux or C then).
struct Gemm {
    const char* op = "";  // the launcher and its PyTorch-level shape, for error messages only
    int BT = 0, C = 0, OC = 0;

    int m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false;
    const void* a = nullptr;  // stored (k x m) when transposed, else (m x k)
    const void* b = nullptr;  // stored (n x k) when transposed, else (k x n)
    int64_t lda = 0, ldb = 0;  // 0: tight
    int batch = 1;
    int64_t stride_a = 0, stride_b = 0, stride_d = 0;
    cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF;  // or fp8 (E4M3, E5M2)
    const float* a_scale = nullptr;  // fp8: the device scalars that multiply the product (Fp8Scale::scale_inv)
    const float* b_scale = nullptr;
    const void* c = nullptr;    // read only when beta != 0
    void* d = nullptr;
    cudaDataType_t cd_type = CUDA_R_16BF;
    float beta = 0.0f;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const floatX* bias = nullptr;  // m values (BIAS epilogues)
    // The GELU input: an output of GELU_AUX*, an input of DGELU; cuBLASLt takes either as an
    // attribute value, so it is held here as read-only.
    const floatX* aux = nullptr;
};

// cuBLASLt derives the alignment it may assume for the bias and aux buffers from their addresses,
// so the algorithm chosen for one call is reused only for pointers aligned at least as well.
inline int pointer_alignment(const void* p) {
    if (!p) return 0;
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lowest_bit = address & (~address + 1);
    return (int)(lowest_bit < 256 ? lowest_bit : 256);
}

struct GemmKey {
    int m, n, k;
    int64_t lda, ldb;
    int batch;
    bool transpose_a, transpose_b;
    int a_type, b_type, cd_type, epilogue;
    int bias_alignment, aux_alignment;
    auto operator<=>(const GemmKey&) const = default;
};

inline const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        default: return "other";
    }
}

inline const char* type_name(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return "fp32";
        case CUDA_R_16BF: return "bf16";
        case CUDA_R_8F_E4M3: return "e4m3";
        case CUDA_R_8F_E5M2: return "e5m2";
        default: return "other";
    }
}

inline std::string describe(const Gemm& g) {
    return strformat("%s (BT %d, C %d, OC %d; cuBLASLt m %d n %d k %d, op(A) %c, op(B) %c, %s A, %s B, %s C/D, "
                     "beta %g, epilogue %s%s)",
                     g.op, g.BT, g.C, g.OC, g.m, g.n, g.k, g.transpose_a ? 'T' : 'N', g.transpose_b ? 'T' : 'N',
                     type_name(g.a_type), type_name(g.b_type), type_name(g.cd_type), (double)g.beta,
                     epilogue_name(g.epilogue), g.batch > 1 ? strformat(", %d batches", g.batch).c_str() : "");
}

// Owning wrappers for the descriptors of one call. Their destroy functions only free host memory;
// a destructor cannot report their status, so it is ignored there.
class LtMatmulDesc {
public:
    LtMatmulDesc() { CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
    ~LtMatmulDesc() { (void)cublasLtMatmulDescDestroy(desc_); }
    LtMatmulDesc(const LtMatmulDesc&) = delete;
    LtMatmulDesc& operator=(const LtMatmulDesc&) = delete;
    template <typename T>
    void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof(value)));
    }
    cublasLtMatmulDesc_t get() const { return desc_; }

private:
    cublasLtMatmulDesc_t desc_ = nullptr;
};

class LtLayout {
public:
    // A column-major rows x cols matrix with leading dimension ld (elements); `batch` of them,
    // `stride` elements apart.
    LtLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int batch = 1, int64_t stride = 0) {
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, (uint64_t)rows, (uint64_t)cols, ld));
        if (batch > 1) {
            set(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (int32_t)batch);
            set(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
        }
    }
    ~LtLayout() { (void)cublasLtMatrixLayoutDestroy(layout_); }
    LtLayout(const LtLayout&) = delete;
    LtLayout& operator=(const LtLayout&) = delete;
    cublasLtMatrixLayout_t get() const { return layout_; }

private:
    template <typename T>
    void set(cublasLtMatrixLayoutAttribute_t attribute, const T& value) {
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, attribute, &value, sizeof(value)));
    }
    cublasLtMatrixLayout_t layout_ = nullptr;
};

class LtPreference {
public:
    LtPreference() { CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference_)); }
    ~LtPreference() { (void)cublasLtMatmulPreferenceDestroy(preference_); }
    LtPreference(const LtPreference&) = delete;
    LtPreference& operator=(const LtPreference&) = delete;
    template <typename T>
    void set(cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference_, attribute, &value, sizeof(value)));
    }
    cublasLtMatmulPreference_t get() const { return preference_; }

private:
    cublasLtMatmulPreference_t preference_ = nullptr;
};

inline size_t element_bytes(cudaDataType_t t) {
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1;  // fp32, bf16, or an FP8 format
}
inline const void* advance(const void* p, cudaDataType_t t, int64_t elements) {
    return static_cast<const uint8_t*>(p) + elements * (int64_t)element_bytes(t);
}

}  // namespace matmul_detail

// The split-K partial sums added to an fp32 output in slice order:
//   out[i] += ((p_0[i] + p_1[i]) + p_2[i]) + ...,  p_s = partials + s * count.
// Four elements a thread (count % 4 == 0: the outputs are m x n with m and n multiples of 8).
__global__ void split_k_sum_kernel(float* out, const float* partials, int slices, size_t count) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= count) return;
    float4 sum = *reinterpret_cast<const float4*>(partials + i);
    for (int s = 1; s < slices; s++) {
        const float4 p = *reinterpret_cast<const float4*>(partials + (size_t)s * count + i);
        sum.x += p.x, sum.y += p.y, sum.z += p.z, sum.w += p.w;
    }
    float4 o = *reinterpret_cast<const float4*>(out + i);
    o.x += sum.x, o.y += sum.y, o.z += sum.z, o.w += sum.w;
    *reinterpret_cast<float4*>(out + i) = o;
}

// The cuBLASLt handle, its workspace, the weight gradients' split-K partials and the algorithm
// chosen for each product shape. Not thread-safe, and the buffers are shared by every call: products
// that may run concurrently (on different streams) need a context each.
class MatmulContext {
public:
    static constexpr size_t WORKSPACE_BYTES = size_t(32) << 20;  // what cuBLAS asks for on Hopper
    // The split-K slices' fp32 partial sums: 14 slices of GPT-2 124M's 768 x 768 attention projection.
    static constexpr size_t SPLIT_K_PARTIAL_BYTES = size_t(32) << 20;

    MatmulContext()
        : workspace_(WORKSPACE_BYTES, "cuBLASLt workspace"),
          partials_(SPLIT_K_PARTIAL_BYTES / sizeof(float), "split-K partials") {
        CUBLAS_CHECK(cublasLtCreate(&handle_));
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        device_name_ = prop.name;
        sms_ = prop.multiProcessorCount;
    }
    ~MatmulContext() { (void)cublasLtDestroy(handle_); }  // nothing to report to from a destructor
    MatmulContext(const MatmulContext&) = delete;
    MatmulContext& operator=(const MatmulContext&) = delete;

    size_t workspace_bytes() const { return workspace_.bytes(); }
    size_t device_bytes() const { return workspace_.bytes() + partials_.bytes(); }

    // Every weight gradient cut into `slices` parts of k (where k is long enough; tests and the
    // workbench's sweep); 0 (the default): each shape's own split (split_k.h).
    void force_split_k(int slices) {
        if (slices < 0) fail(strformat("force_split_k: %d slices, expected 0 (per shape) or more", slices));
        forced_split_k_ = slices;
    }
    // How a weight gradient with an (m x n) output (cuBLASLt's terms) over k rows is cut.
    SplitK split_k(int m, int n, int k) const {
        return choose_split_k(m, n, k, device_name_.c_str(), sms_, partials_.bytes(), forced_split_k_);
    }

    // Runs one product; any failure names the product's shape and epilogue. With `optional`, a shape
    // cuBLASLt has no algorithm for runs nothing and returns false.
    bool run(const matmul_detail::Gemm& g, cudaStream_t stream, bool optional = false) {
        try {
            return run_unlabelled(g, stream, optional);
        } catch (const Error& e) {
            fail(strformat("%s: %s", matmul_detail::describe(g).c_str(), e.what()));
        }
    }

    // A weight gradient: D (fp32, tight, = C) += op(A) op(B), g with beta 1 and no epilogue. Unsplit,
    // cuBLASLt adds the product to D itself; split (split_k), the slices' products go to the
    // partials (one batched call, one more for a shorter last slice) and split_k_sum_kernel adds
    // them to D in slice order.
    void run_accumulating(const matmul_detail::Gemm& g, cudaStream_t stream) {
        using namespace matmul_detail;
        if (g.beta != 1.0f || g.c != g.d || g.cd_type != CUDA_R_32F || g.epilogue != CUBLASLT_EPILOGUE_DEFAULT ||
            g.batch != 1)
            fail(strformat("%s: run_accumulating takes an fp32 D += product with no epilogue", describe(g).c_str()));
        const SplitK split = split_k(g.m, g.n, g.k);
        if (split.slices == 1) {
            run(g, stream);
            return;
        }

        Gemm slice = g;
        slice.c = nullptr;
        slice.beta = 0.0f;
        slice.lda = g.lda ? g.lda : (g.transpose_a ? g.k : g.m);  // the slices keep the whole matrix's rows
        slice.ldb = g.ldb ? g.ldb : (g.transpose_b ? g.n : g.k);
        // One slice further along k: down the stored (k x m) A, across the stored (m x k) A; likewise B.
        slice.stride_a = g.transpose_a ? split.slice_k : (int64_t)split.slice_k * slice.lda;
        slice.stride_b = g.transpose_b ? (int64_t)split.slice_k * slice.ldb : split.slice_k;
        slice.stride_d = (int64_t)g.m * g.n;
        // Where cuBLASLt has no algorithm for the batched slices (the emulated one always has), the
        // product runs whole: a choice made by the shape and the library alone, the same every run.
        auto run_slices = [&](int first, int count, int k, bool optional) {
            Gemm p = slice;
            p.k = k;
            p.batch = count;
            p.a = advance(g.a, g.a_type, first * slice.stride_a);
            p.b = advance(g.b, g.b_type, first * slice.stride_b);
            p.d = partials_.get() + first * slice.stride_d;
            return run(p, stream, optional);
        };
        const int full = split.full_slices(g.k);
        if (!run_slices(0, full, split.slice_k, true)) {
            run(g, stream);
            return;
        }
        if (full < split.slices) run_slices(full, 1, split.last_k(g.k), false);

        const size_t count = (size_t)g.m * g.n;
        constexpr int threads = 256;
        LLMC_LAUNCH(split_k_sum_kernel, (unsigned)ceil_div(count / 4, (size_t)threads), threads, 0, stream)(
            static_cast<float*>(g.d), partials_.get(), split.slices, count);
        CUDA_CHECK_LAUNCH();
    }

private:
    // Every pointer llmc passes is 16-byte aligned (the convention of every tensor), and the
    // heuristic is told so: the default (256) could pick an algorithm that a layer's offset
    // pointer does not satisfy.
    static constexpr uint32_t MIN_ALIGNMENT_BYTES = 16;

    // Runs g; where cuBLASLt has no algorithm for it, fails, or with `optional` returns false having
    // run nothing.
    bool run_unlabelled(const matmul_detail::Gemm& g, cudaStream_t stream, bool optional = false) {
        using namespace matmul_detail;
        LtMatmulDesc desc;
        desc.set(CUBLASLT_MATMUL_DESC_TRANSA, g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
        desc.set(CUBLASLT_MATMUL_DESC_TRANSB, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
        desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
        if (g.bias) {
            desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
            desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
        }
        if (g.a_scale) desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.a_scale));
        if (g.b_scale) desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.b_scale));
        if (g.aux) {
            // EPILOGUE_AUX_DATA_TYPE is left unset: it defaults to D's type, bf16 here, and the
            // header documents setting it only for fp8 kernels (where other values are rejected).
            desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux));
            desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (int64_t)g.m);
        }
        const int64_t a_rows = g.transpose_a ? g.k : g.m, b_rows = g.transpose_b ? g.n : g.k;
        const LtLayout a(g.a_type, a_rows, g.transpose_a ? g.m : g.k, g.lda ? g.lda : a_rows, g.batch, g.stride_a);
        const LtLayout b(g.b_type, b_rows, g.transpose_b ? g.k : g.n, g.ldb ? g.ldb : b_rows, g.batch, g.stride_b);
        const LtLayout cd(g.cd_type, g.m, g.n, g.m, g.batch, g.stride_d);

        const std::optional<cublasLtMatmulAlgo_t> algo = algorithm(g, desc, a, b, cd);
        if (!algo) {
            if (optional) return false;
            fail(strformat("cuBLASLt has no algorithm for this product on this GPU (asked for: no split-K "
                           "reduction, or one reduced in a separate step; %u-byte alignment; at most %zu bytes of "
                           "workspace)",
                           MIN_ALIGNMENT_BYTES, workspace_.bytes()));
        }
        const float alpha = 1.0f;
        CUBLAS_CHECK(cublasLtMatmul(handle_, desc.get(), &alpha, g.a, a.get(), g.b, b.get(), &g.beta,
                                    g.c ? g.c : g.d, cd.get(), g.d, cd.get(), &*algo, workspace_.get(),
                                    workspace_.bytes(), stream));
        return true;
    }

    // The algorithm for g's shape (chosen once, then cached), or none where cuBLASLt has none.
    std::optional<cublasLtMatmulAlgo_t> algorithm(const matmul_detail::Gemm& g, const matmul_detail::LtMatmulDesc& desc,
                                                  const matmul_detail::LtLayout& a, const matmul_detail::LtLayout& b,
                                                  const matmul_detail::LtLayout& cd) {
        using namespace matmul_detail;
        const GemmKey key{g.m,           g.n,           g.k,         g.lda,        g.ldb,
                          g.batch,       g.transpose_a, g.transpose_b, (int)g.a_type, (int)g.b_type,
                          (int)g.cd_type, (int)g.epilogue, pointer_alignment(g.bias), pointer_alignment(g.aux)};
        if (auto it = algorithms_.find(key); it != algorithms_.end()) return it->second;

        // Split-K is avoided where cuBLASLt has another algorithm; where it has none, a split-K whose
        // parts are summed by a separate reduction (in the compute or the output type: a fixed
        // order, so the same bits every run) is accepted. An H200 had no other algorithm for d12's
        // FP8 weight gradients (m 768 n 768 k 131072, E4M3 x E5M2 into fp32).
        const uint32_t schemes[2] = {CUBLASLT_REDUCTION_SCHEME_NONE,
                                     CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
        for (uint32_t scheme : schemes) {
            cublasLtMatmulHeuristicResult_t result{};
            const cublasStatus_t status = heuristic(desc, a, b, cd, scheme, &result);
            if (status == CUBLAS_STATUS_NOT_SUPPORTED) continue;
            CUBLAS_CHECK(status);
            return algorithms_.emplace(key, result.algo).first->second;
        }
        return algorithms_.emplace(key, std::nullopt).first->second;
    }

    // The heuristic's best algorithm under these reduction schemes; NOT_SUPPORTED where it has none.
    cublasStatus_t heuristic(const matmul_detail::LtMatmulDesc& desc, const matmul_detail::LtLayout& a,
                             const matmul_detail::LtLayout& b, const matmul_detail::LtLayout& cd,
                             uint32_t reduction_schemes, cublasLtMatmulHeuristicResult_t* result) {
        using namespace matmul_detail;
        LtPreference preference;
        preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (uint64_t)workspace_.bytes());
        preference.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_schemes);
        preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, MIN_ALIGNMENT_BYTES);
        preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, MIN_ALIGNMENT_BYTES);
        preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, MIN_ALIGNMENT_BYTES);
        preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, MIN_ALIGNMENT_BYTES);
        int returned = 0;
        const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc.get(), a.get(), b.get(), cd.get(),
                                                                     cd.get(), preference.get(), 1, result, &returned);
        if (status == CUBLAS_STATUS_SUCCESS && (returned == 0 || result->state != CUBLAS_STATUS_SUCCESS))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        return status;
    }

    DeviceBuffer<uint8_t> workspace_;
    DeviceBuffer<float> partials_;
    std::string device_name_;
    int sms_ = 0;
    int forced_split_k_ = 0;
    cublasLtHandle_t handle_ = nullptr;
    std::map<matmul_detail::GemmKey, std::optional<cublasLtMatmulAlgo_t>> algorithms_;  // none: cuBLASLt has none
};

// ---------------------------------------------------------------------------------------------
// Argument checks shared by the launchers.

namespace matmul_detail {

inline void check_shape(const char* op, int BT, int C, int OC) {
    if (BT < 1) fail(strformat("%s: BT = %d rows, expected at least 1", op, BT));
    if (C < 8 || C % 8 != 0) fail(strformat("%s: C = %d, expected a positive multiple of 8", op, C));
    if (OC < 8 || OC % 8 != 0) fail(strformat("%s: OC = %d, expected a positive multiple of 8", op, OC));
}

// `required`: a null pointer is an error; otherwise null means "not used".
inline void check_pointer(const char* op, const char* name, const void* p, bool required) {
    if (!p && required) fail(strformat("%s: %s is null", op, name));
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        fail(strformat("%s: %s = %p is not 16-byte aligned (every llmc tensor is)", op, name, p));
}

// An output must not share memory with an input of the same call (`bytes` each).
// A forward product's output: out = product + bias + residual (cuBLASLt's C, beta 1), or with
// pre_gelu the GELU_AUX epilogues (pre_gelu = product + bias, out = GELU(pre_gelu)).
inline void set_forward_output(Gemm& g, floatX* out, floatX* pre_gelu, const floatX* bias, const floatX* residual) {
    g.d = out;
    g.c = residual;
    g.beta = residual ? 1.0f : 0.0f;
    g.cd_type = CUDA_R_16BF;
    g.bias = bias;
    g.aux = pre_gelu;
    g.epilogue = pre_gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                          : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
}

inline void check_disjoint(const char* op, const char* out_name, const void* out, size_t out_bytes,
                           const char* in_name, const void* in, size_t in_bytes) {
    if (!out || !in) return;
    const uintptr_t o = reinterpret_cast<uintptr_t>(out), i = reinterpret_cast<uintptr_t>(in);
    if (o < i + in_bytes && i < o + out_bytes)
        fail(strformat("%s: %s (%p) overlaps %s (%p)", op, out_name, out, in_name, in));
}

}  // namespace matmul_detail

// ---------------------------------------------------------------------------------------------
// Bias gradient: dbias[c] += sum over rows of dout[r][c], in two passes with a fixed order. Pass 1:
// block (x, y) owns rows [64x, 64x + 64) and columns [256y, 256y + 256); its 8 row lanes each sum
// every 8th row of 8 adjacent columns (one 16-byte load per row), the lanes are added in order, and
// the block's partial sums go to partials[x][column]. Pass 2: one thread per column adds the
// partials of all row blocks in order. Nothing depends on the GPU's size or scheduling.

constexpr int BIAS_GRAD_ROWS_PER_BLOCK = 64;
constexpr int BIAS_GRAD_ROW_LANES = 8;                                       // threadIdx.y
constexpr int BIAS_GRAD_COLUMN_GROUPS = 32;                                  // threadIdx.x, 8 columns each
constexpr int BIAS_GRAD_COLUMNS_PER_BLOCK = BIAS_GRAD_COLUMN_GROUPS * x128::size;  // 256
constexpr int BIAS_GRAD_THREADS = BIAS_GRAD_ROW_LANES * BIAS_GRAD_COLUMN_GROUPS;   // 256
static_assert(BIAS_GRAD_THREADS == BIAS_GRAD_COLUMNS_PER_BLOCK, "pass 1 ends with one thread per column");

inline size_t matmul_backward_scratch_floats(int BT, int OC) {
    return (size_t)ceil_div(BT, BIAS_GRAD_ROWS_PER_BLOCK) * (size_t)OC;
}

__global__ void __launch_bounds__(BIAS_GRAD_THREADS)
    bias_grad_partials_kernel(float* partials, const floatX* dout, int BT, int OC) {
    __shared__ __align__(16) float lane_sums[BIAS_GRAD_ROW_LANES][BIAS_GRAD_COLUMNS_PER_BLOCK];
    const int lane = threadIdx.y, group = threadIdx.x;
    const int block_col = blockIdx.y * BIAS_GRAD_COLUMNS_PER_BLOCK;
    const int col = block_col + group * x128::size;  // OC % 8 == 0: a group is wholly in or out
    const int row_begin = blockIdx.x * BIAS_GRAD_ROWS_PER_BLOCK;
    const int row_end = min(BT, row_begin + BIAS_GRAD_ROWS_PER_BLOCK);

    float sum[x128::size] = {};
    if (col < OC) {
        for (int r = row_begin + lane; r < row_end; r += BIAS_GRAD_ROW_LANES) {
            // a plain (cached) load: the dinp and dweight products read dout next
            const x128 d = load128(dout + (size_t)r * OC + col);
#pragma unroll
            for (int i = 0; i < x128::size; i++) sum[i] += __bfloat162float(d[i]);
        }
    }
    float4* mine = reinterpret_cast<float4*>(&lane_sums[lane][group * x128::size]);
    mine[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
    mine[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
    __syncthreads();

    const int t = threadIdx.y * BIAS_GRAD_COLUMN_GROUPS + threadIdx.x;  // 0..255: one column each
    const int out_col = block_col + t;
    if (out_col < OC) {
        float total = 0.0f;
#pragma unroll
        for (int l = 0; l < BIAS_GRAD_ROW_LANES; l++) total += lane_sums[l][t];
        partials[(size_t)blockIdx.x * OC + out_col] = total;
    }
}

__global__ void bias_grad_sum_kernel(float* dbias, const float* partials, int row_blocks, int OC) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    float total = 0.0f;
#pragma unroll 8
    for (int b = 0; b < row_blocks; b++) total += partials[(size_t)b * OC + col];
    dbias[col] += total;
}

// dbias (OC) += column sums of dout (BT x OC); `scratch` holds matmul_backward_scratch_floats(BT, OC)
// floats.
inline void bias_backward(float* dbias, float* scratch, const floatX* dout, int BT, int OC, cudaStream_t stream) {
    const char* op = "bias_backward";
    if (BT < 1) fail(strformat("%s: BT = %d rows, expected at least 1", op, BT));
    if (OC < 8 || OC % 8 != 0) fail(strformat("%s: OC = %d, expected a positive multiple of 8", op, OC));
    matmul_detail::check_pointer(op, "dbias", dbias, true);
    matmul_detail::check_pointer(op, "scratch", scratch, true);
    matmul_detail::check_pointer(op, "dout", dout, true);
    const int row_blocks = ceil_div(BT, BIAS_GRAD_ROWS_PER_BLOCK);
    const int col_blocks = ceil_div(OC, BIAS_GRAD_COLUMNS_PER_BLOCK);
    if (col_blocks > 65535) fail(strformat("%s: OC = %d columns is too many (at most %d)", op, OC, 65535 * 256));
    const dim3 grid(row_blocks, col_blocks), block(BIAS_GRAD_COLUMN_GROUPS, BIAS_GRAD_ROW_LANES);
    LLMC_LAUNCH(bias_grad_partials_kernel, grid, block, 0, stream)(scratch, dout, BT, OC);
    CUDA_CHECK_LAUNCH();
    constexpr int SUM_THREADS = 256;
    LLMC_LAUNCH(bias_grad_sum_kernel, ceil_div(OC, SUM_THREADS), SUM_THREADS, 0, stream)(dbias, scratch, row_blocks, OC);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The launchers.
//
// GELU in the epilogues: the cuBLAS docs say only "GELU". It is the tanh approximation, 0.5 x (1 +
// tanh(sqrt(2/pi) (x + 0.044715 x^3))): the form XLA and Transformer Engine fuse into these
// epilogues, and the function of gelu.cuh and cpu::gelu_forward (written there as x * sigmoid(2u),
// one accurate expf). If cuBLASLt evaluates tanh like CUTLASS's GELU_taylor, with the hardware
// tanh.approx.f32 (relative error ~2^-11), the two differ by at most ~2.5e-4 |x|: below bf16's
// resolution of the result except in the tail x < -2, where GELU is tiny and the error, large
// relative to it, is immaterial to training. (The erf form differs from the tanh form by up to 5e-4,
// near x = -2.7; dev/cuda/matmul.cu prints how far the epilogue is from each there.) DGELU
// multiplies by the derivative of the same tanh form.

// out (BT x OC) = inp (BT x C) @ weight^T + bias + residual; weight is (OC x C) row-major. bias (OC)
// and residual (BT x OC) may be null; residual is added as cuBLASLt's C with beta = 1 and must not
// overlap out. With pre_gelu (BT x OC): pre_gelu = inp @ weight^T + bias and out = GELU(pre_gelu),
// in the one GELU_AUX(_BIAS) product; residual must then be null.
inline void matmul_forward(MatmulContext& ctx, floatX* out, floatX* pre_gelu, const floatX* inp,
                           const floatX* weight, const floatX* bias, const floatX* residual, int BT, int C, int OC,
                           cudaStream_t stream) {
    using namespace matmul_detail;
    const char* op = "matmul_forward";
    check_shape(op, BT, C, OC);
    check_pointer(op, "out", out, true);
    check_pointer(op, "pre_gelu", pre_gelu, false);
    check_pointer(op, "inp", inp, true);
    check_pointer(op, "weight", weight, true);
    check_pointer(op, "bias", bias, false);
    check_pointer(op, "residual", residual, false);
    if (pre_gelu && residual)
        fail(strformat("%s (BT %d, C %d, OC %d): a residual cannot be added after a fused GELU; pass residual = "
                       "nullptr with pre_gelu",
                       op, BT, C, OC));
    const size_t out_bytes = (size_t)BT * OC * sizeof(floatX);
    check_disjoint(op, "out", out, out_bytes, "residual", residual, out_bytes);
    check_disjoint(op, "out", out, out_bytes, "pre_gelu", pre_gelu, out_bytes);
    check_disjoint(op, "out", out, out_bytes, "inp", inp, (size_t)BT * C * sizeof(floatX));
    check_disjoint(op, "pre_gelu", pre_gelu, out_bytes, "inp", inp, (size_t)BT * C * sizeof(floatX));

    Gemm g;
    g.op = op;
    g.BT = BT, g.C = C, g.OC = OC;
    g.m = OC, g.n = BT, g.k = C;
    g.transpose_a = true;  // W (OC x C) row-major is a column-major (C x OC): op_T makes it (OC x C)
    g.a = weight;
    g.b = inp;  // inp (BT x C) row-major is inp^T as a column-major (C x BT)
    set_forward_output(g, out, pre_gelu, bias, residual);
    ctx.run(g, stream);
}

// The backward of matmul_forward (the residual's gradient is the caller's already):
//   dinp (BT x C) = dout (BT x OC) @ weight, OVERWRITTEN; skipped if dinp is null. With pre_gelu
//     (BT x C, the input of the GELU whose output was `inp`), dinp is also multiplied elementwise by
//     GELU'(pre_gelu) in the product's DGELU epilogue: it becomes the pre-activation's gradient.
//   dweight (OC x C, fp32) += dout^T @ inp: bf16 operands, fp32 C = D with beta = 1, so gradients
//     accumulate in fp32 across micro-batches (or, where k = BT is split, the slices' partials added
//     in order: MatmulContext::run_accumulating); skipped if dweight is null (inp is then unused). A
//     tensor-parallel model calls this twice, dinp first and the weight gradient second, so that the
//     reduction of dinp over the group travels while the weight gradient is computed.
//   dbias (OC, fp32) += column sums of dout, by bias_backward in `scratch`
//     (matmul_backward_scratch_floats(BT, OC) floats); skipped if dbias is null.
inline void matmul_backward(MatmulContext& ctx, floatX* dinp, float* dweight, float* dbias, float* scratch,
                            const floatX* dout, const floatX* inp, const floatX* weight, const floatX* pre_gelu,
                            int BT, int C, int OC, cudaStream_t stream) {
    using namespace matmul_detail;
    const char* op = "matmul_backward";
    check_shape(op, BT, C, OC);
    check_pointer(op, "dinp", dinp, false);
    check_pointer(op, "dweight", dweight, false);
    check_pointer(op, "dbias", dbias, false);
    check_pointer(op, "scratch", scratch, dbias != nullptr);
    check_pointer(op, "dout", dout, true);
    check_pointer(op, "inp", inp, dweight != nullptr);
    check_pointer(op, "weight", weight, dinp != nullptr);
    check_pointer(op, "pre_gelu", pre_gelu, false);
    const size_t dinp_bytes = (size_t)BT * C * sizeof(floatX);
    check_disjoint(op, "dinp", dinp, dinp_bytes, "dout", dout, (size_t)BT * OC * sizeof(floatX));
    check_disjoint(op, "dinp", dinp, dinp_bytes, "pre_gelu", pre_gelu, dinp_bytes);
    check_disjoint(op, "dinp", dinp, dinp_bytes, "weight", weight, (size_t)OC * C * sizeof(floatX));

    if (dbias) bias_backward(dbias, scratch, dout, BT, OC, stream);

    if (dinp) {
        Gemm g;
        g.op = "matmul_backward dinp";
        g.BT = BT, g.C = C, g.OC = OC;
        g.m = C, g.n = BT, g.k = OC;
        g.a = weight;  // W (OC x C) row-major is W^T as a column-major (C x OC)
        g.b = dout;    // dout (BT x OC) row-major is dout^T as a column-major (OC x BT)
        g.d = dinp;
        g.beta = 0.0f;
        g.cd_type = CUDA_R_16BF;
        g.aux = pre_gelu;  // (BT x C) row-major: dinp's layout
        g.epilogue = pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
        ctx.run(g, stream);
    }
    if (!dweight) return;

    Gemm g;
    g.op = "matmul_backward dweight";
    g.BT = BT, g.C = C, g.OC = OC;
    g.m = C, g.n = OC, g.k = BT;
    g.a = inp;  // inp (BT x C) row-major is inp^T as a column-major (C x BT)
    g.transpose_b = true;
    g.b = dout;  // dout^T as a column-major (OC x BT); op_T makes it dout (BT x OC)
    g.c = dweight;
    g.d = dweight;  // dweight (OC x C) row-major is dweight^T as a column-major (C x OC)
    g.beta = 1.0f;
    g.cd_type = CUDA_R_32F;
    ctx.run_accumulating(g, stream);  // k = BT cut into slices where the output is small (split_k.h)
}

// ---------------------------------------------------------------------------------------------
// FP8 products (--fp8 1). Hopper's FP8 kernels take only the "TN" form: both operands stored along
// k. The forward's operands already are (W is OC x C, inp BT x C: both rows of k = C); the dinp
// product reads W^T (C x OC) and the dweight product inp^T (C x BT) and dout^T (OC x BT), which
// fp8_cast writes beside the row-major copies. cuBLASLt multiplies the fp32 product by both
// operands' inverse scales, then applies the bias and GELU epilogues as for bf16. k and every
// leading dimension must be a multiple of 16 bytes: C, OC and BT multiples of 16.

// An FP8 tensor as the products take it: its codes, its format, and the device scalar that turns
// them back into values (Fp8Scale::scale_inv).
struct Fp8Tensor {
    const uint8_t* data = nullptr;
    cudaDataType_t type = CUDA_R_8F_E4M3;
    const float* scale_inv = nullptr;
};

namespace matmul_detail {

inline void check_fp8_shape(const char* op, int BT, int C, int OC) {
    if (BT < 16 || BT % 16 || C < 16 || C % 16 || OC < 16 || OC % 16)
        fail(strformat("%s: BT %d, C %d, OC %d: FP8 products need each a positive multiple of 16 (Hopper's FP8 "
                       "kernels read k and every leading dimension in 16-byte steps)",
                       op, BT, C, OC));
}
inline void check_fp8_tensor(const char* op, const char* name, const Fp8Tensor& t) {
    check_pointer(op, name, t.data, true);
    if (!t.scale_inv) fail(strformat("%s: %s has no scale", op, name));
    if (t.type != CUDA_R_8F_E4M3 && t.type != CUDA_R_8F_E5M2)
        fail(strformat("%s: %s is not E4M3 or E5M2", op, name));
}
// The checked core of every FP8 product: D (m x n) = op_T(a) b, both stored along k.
inline Gemm fp8_gemm(const char* op, int BT, int C, int OC, int m, int n, int k, const char* a_name,
                     const Fp8Tensor& a, const char* b_name, const Fp8Tensor& b) {
    check_fp8_shape(op, BT, C, OC);
    check_fp8_tensor(op, a_name, a);
    check_fp8_tensor(op, b_name, b);
    Gemm g;
    g.op = op;
    g.BT = BT, g.C = C, g.OC = OC;
    g.m = m, g.n = n, g.k = k;
    g.transpose_a = true, g.transpose_b = false;
    g.a = a.data, g.a_type = a.type, g.a_scale = a.scale_inv;
    g.b = b.data, g.b_type = b.type, g.b_scale = b.scale_inv;
    return g;
}

}  // namespace matmul_detail

// out (BT x OC) = inp W^T + bias (+ residual), or with pre_gelu: pre_gelu = inp W^T + bias and out =
// GELU(pre_gelu); from E4M3 copies of inp (BT x C) and weight (OC x C). As matmul_forward otherwise.
inline void matmul_forward_fp8(MatmulContext& ctx, floatX* out, floatX* pre_gelu, const Fp8Tensor& inp,
                               const Fp8Tensor& weight, const floatX* bias, const floatX* residual, int BT, int C,
                               int OC, cudaStream_t stream) {
    using namespace matmul_detail;
    const char* op = "matmul_forward_fp8";
    Gemm g = fp8_gemm(op, BT, C, OC, OC, BT, C, "weight", weight, "inp", inp);
    check_pointer(op, "out", out, true);
    check_pointer(op, "pre_gelu", pre_gelu, false);
    check_pointer(op, "bias", bias, false);
    check_pointer(op, "residual", residual, false);
    if (pre_gelu && residual) fail(strformat("%s: a residual cannot be added after a fused GELU", op));
    set_forward_output(g, out, pre_gelu, bias, residual);
    ctx.run(g, stream);
}

// dinp (BT x C) = dout (BT x OC, E5M2) W, from weight_t = W^T (C x OC, E4M3); OVERWRITTEN. The GELU
// backward, where one follows, is the caller's (gelu_backward_inplace): FP8 products take no DGELU.
inline void matmul_backward_dinp_fp8(MatmulContext& ctx, floatX* dinp, const Fp8Tensor& dout,
                                     const Fp8Tensor& weight_t, int BT, int C, int OC, cudaStream_t stream) {
    using namespace matmul_detail;
    const char* op = "matmul_backward_dinp_fp8";
    Gemm g = fp8_gemm(op, BT, C, OC, C, BT, OC, "weight_t", weight_t, "dout", dout);
    check_pointer(op, "dinp", dinp, true);
    g.d = dinp;
    g.cd_type = CUDA_R_16BF;
    ctx.run(g, stream);
}

// dweight (OC x C, fp32) += dout^T inp, from dout_t = dout^T (OC x BT, E5M2) and inp_t = inp^T (C x
// BT, E4M3). The bias gradient is bias_backward's, from the bf16 dout.
inline void matmul_backward_dweight_fp8(MatmulContext& ctx, float* dweight, const Fp8Tensor& dout_t,
                                        const Fp8Tensor& inp_t, int BT, int C, int OC, cudaStream_t stream) {
    using namespace matmul_detail;
    const char* op = "matmul_backward_dweight_fp8";
    Gemm g = fp8_gemm(op, BT, C, OC, C, OC, BT, "inp_t", inp_t, "dout_t", dout_t);
    check_pointer(op, "dweight", dweight, true);
    g.c = dweight;
    g.d = dweight;
    g.beta = 1.0f;
    g.cd_type = CUDA_R_32F;
    ctx.run_accumulating(g, stream);
}

// ---------------------------------------------------------------------------------------------
// The epilogue of a row-parallel product (tensor parallelism), whose sum over the group arrives only
// after the product: out (rows x C) = base + sum + bias in fp32, rounded once to bf16. out may be sum
// (in place); bias (C) is broadcast over the rows, or null (none). One thread per 8 channels.

__global__ void bias_residual_add_kernel(floatX* out, const floatX* sum, const floatX* bias, const floatX* base,
                                         int rows, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)rows * chunks) return;
    const size_t offset = index / chunks * C + (index % chunks) * x128::size;
    const int channel = (int)(index % chunks) * x128::size;
    const x128 s = load128(sum + offset), r = load128(base + offset);
    x128 result;
    if (bias) {
        const x128 b = load128(bias + channel);
#pragma unroll
        for (int i = 0; i < x128::size; i++)
            result[i] = __float2bfloat16_rn(__bfloat162float(r[i]) + __bfloat162float(s[i]) + __bfloat162float(b[i]));
    } else {  // a product without a bias (a Llama's)
#pragma unroll
        for (int i = 0; i < x128::size; i++)
            result[i] = __float2bfloat16_rn(__bfloat162float(r[i]) + __bfloat162float(s[i]));
    }
    store128(out + offset, result);
}

inline void bias_residual_add(floatX* out, const floatX* sum, const floatX* bias, const floatX* base, int rows, int C,
                              cudaStream_t stream) {
    if (rows < 1 || C < 8 || C % 8 != 0)
        fail(strformat("bias_residual_add: rows = %d, C = %d; expected rows >= 1 and C a positive multiple of 8", rows,
                       C));
    if (!out || !sum || !base) fail("bias_residual_add: out, sum and base must all be given (bias may be null)");
    const int threads = 256;
    const size_t blocks = ceil_div((size_t)rows * (C / x128::size), (size_t)threads);
    if (blocks > (size_t)INT_MAX) fail(strformat("bias_residual_add: rows = %d x C = %d is too large", rows, C));
    LLMC_LAUNCH(bias_residual_add_kernel, (unsigned)blocks, threads, 0, stream)(out, sum, bias, base, rows, C);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
