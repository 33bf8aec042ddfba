// dev/emu/test_cublaslt.cpp: the emulated cuBLASLt (cublaslt.cpp) against a double-precision
// reference computed here: every transpose, type (fp8 with its scales too), beta and epilogue llmc's matmul.cuh can ask for,
// odd shapes, padded leading dimensions, strided batches; the combinations cuBLASLt refuses; an
// operand outside device memory. A bf16 output must be within 1e-2 of the reference, an fp32 one
// within 1e-5 (relative error of the whole tensor, test/rel_error.h: a NaN never passes).
//
// Built by make/emu.mk (make build/emu/test_cublaslt), run by make test-emu.
// The timings: build/emu/test_cublaslt "[.timing]".
#include <catch2/catch.hpp>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test/rel_error.h"

namespace {

constexpr cudaDataType_t BF16 = CUDA_R_16BF, FP32 = CUDA_R_32F, E4M3 = CUDA_R_8F_E4M3, E5M2 = CUDA_R_8F_E5M2;

bool is_fp8(cudaDataType_t type) { return type == E4M3 || type == E5M2; }
size_t element_bytes(cudaDataType_t type) { return type == FP32 ? 4 : is_fp8(type) ? 1 : 2; }
__nv_fp8_interpretation_t fp8_kind(cudaDataType_t type) { return type == E4M3 ? __NV_E4M3 : __NV_E5M2; }
uint8_t to_fp8(cudaDataType_t type, float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fp8_kind(type)); }
float from_fp8(cudaDataType_t type, uint8_t code) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, fp8_kind(type)))); }
float round_to(cudaDataType_t type, float x) {
    if (is_fp8(type)) return from_fp8(type, to_fp8(type, x));
    return type == BF16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}
double tolerance(cudaDataType_t type) { return type == BF16 ? 1e-2 : 1e-5; }
const char* type_name(cudaDataType_t type) {
    return type == BF16 ? "bf16" : type == FP32 ? "fp32" : type == E4M3 ? "e4m3" : "e5m2";
}

// ---------------------------------------------------------------------------------------------
// Host and device buffers.

// A batch of column-major matrices, values representable in `type`: (i, j) of batch b at
// values[b * stride + j * ld + i]. Padding (rows beyond `rows`, slack between batches) is random
// too, so a product that reads or writes it shows.
struct HostMatrix {
    cudaDataType_t type = BF16;
    int64_t rows = 0, cols = 0, ld = 0, stride = 0;
    int batch = 1;
    std::vector<float> values;

    float& at(int b, int64_t i, int64_t j) { return values[(size_t)(b * stride + j * ld + i)]; }
    float at(int b, int64_t i, int64_t j) const { return values[(size_t)(b * stride + j * ld + i)]; }
    size_t bytes() const { return values.size() * element_bytes(type); }
};

HostMatrix random_matrix(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int batch,
                         float limit, std::mt19937& rng) {
    HostMatrix m{type, rows, cols, ld, stride, batch, {}};
    m.values.resize((size_t)(batch * stride));
    std::uniform_real_distribution<float> uniform(-limit, limit);
    for (float& v : m.values) v = round_to(type, uniform(rng));
    return m;
}

class DeviceBuffer {
public:
    explicit DeviceBuffer(size_t bytes) {
        REQUIRE(cudaMalloc(&ptr_, bytes) == cudaSuccess);
        const std::vector<char> zeros(bytes, 0);  // no test reads memory it did not write
        REQUIRE(cudaMemcpy(ptr_, zeros.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~DeviceBuffer() { (void)cudaFree(ptr_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return ptr_; }
    char* bytes() const { return static_cast<char*>(ptr_); }

private:
    void* ptr_ = nullptr;
};

void upload(void* dst, const HostMatrix& m) {
    std::vector<uint8_t> raw(m.bytes());
    for (size_t i = 0; i < m.values.size(); i++) {
        if (m.type == FP32) std::memcpy(&raw[i * 4], &m.values[i], 4);
        else if (is_fp8(m.type)) raw[i] = to_fp8(m.type, m.values[i]);
        else {
            const __nv_bfloat16 h = __float2bfloat16_rn(m.values[i]);
            std::memcpy(&raw[i * 2], &h, 2);
        }
    }
    REQUIRE(cudaMemcpy(dst, raw.data(), raw.size(), cudaMemcpyHostToDevice) == cudaSuccess);
}

void download(HostMatrix& m, const void* src) {
    std::vector<uint8_t> raw(m.bytes());
    REQUIRE(cudaMemcpy(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (size_t i = 0; i < m.values.size(); i++) {
        if (m.type == FP32) std::memcpy(&m.values[i], &raw[i * 4], 4);
        else if (is_fp8(m.type)) m.values[i] = from_fp8(m.type, raw[i]);
        else {
            __nv_bfloat16 h;
            std::memcpy(&h, &raw[i * 2], 2);
            m.values[i] = __bfloat162float(h);
        }
    }
}

class Handle {
public:
    Handle() { REQUIRE(cublasLtCreate(&handle_) == CUBLAS_STATUS_SUCCESS); }
    ~Handle() { (void)cublasLtDestroy(handle_); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    cublasLtHandle_t get() const { return handle_; }

private:
    cublasLtHandle_t handle_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// One product: its shape and options, its operands, and the descriptors llmc's MatmulContext makes.

struct Case {
    int64_t m, n, k;
    bool transa = false, transb = false;
    cudaDataType_t ab_type = BF16, cd_type = BF16;
    int b_type = -1;     // B's type where it differs from A's (fp8 products may mix E4M3 and E5M2)
    int bias_type = -1;  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; -1 (unset): D's type (bf16 for fp8 products)
    float a_scale = 0.0f, b_scale = 0.0f;  // fp8: A_SCALE_POINTER / B_SCALE_POINTER set to these (0: unset)
    float alpha = 1.0f, beta = 0.0f;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    int batch = 1;
    int64_t pad = 0;        // extra rows in every leading dimension, and slack between batches
    bool in_place = false;  // C and D are one buffer

    cudaDataType_t b_storage() const { return b_type == -1 ? ab_type : (cudaDataType_t)b_type; }
    cudaDataType_t bias_storage() const {
        if (bias_type != -1) return (cudaDataType_t)bias_type;
        return is_fp8(ab_type) ? BF16 : cd_type;
    }
    double scale() const { return (a_scale ? a_scale : 1.0) * (b_scale ? b_scale : 1.0); }
};

std::string describe(const Case& c) {
    char s[256];
    std::snprintf(s, sizeof(s), "m %lld n %lld k %lld, op(A) %c op(B) %c, %s A, %s B, %s C/D, alpha %g beta %g, "
                  "scales %g %g, epilogue %d, batch %d, pad %lld%s",
                  (long long)c.m, (long long)c.n, (long long)c.k, c.transa ? 'T' : 'N', c.transb ? 'T' : 'N',
                  type_name(c.ab_type), type_name(c.b_storage()), type_name(c.cd_type), c.alpha, c.beta, c.a_scale,
                  c.b_scale, (int)c.epilogue, c.batch, (long long)c.pad, c.in_place ? ", C == D" : "");
    return s;
}

bool adds_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool is_bias_grad(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool writes_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool reads_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool uses_aux(cublasLtEpilogue_t e) { return writes_aux(e) || reads_aux(e); }
bool applies_gelu(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || writes_aux(e);
}
bool applies_relu(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }

int64_t aux_ld(const Case& c) { return (c.m + 7) / 8 * 8 + (c.pad ? 8 : 0); }
int64_t bias_length(const Case& c) { return c.epilogue == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m; }

// The host copies of every operand; D starts random, so untouched padding can be checked.
struct Operands {
    HostMatrix a, b, c, d, aux, bias;  // bias: a column of bias_length rows per batch
};

Operands make_operands(const Case& c, std::mt19937& rng) {
    Operands o;
    const int64_t a_rows = c.transa ? c.k : c.m, a_cols = c.transa ? c.m : c.k;
    const int64_t b_rows = c.transb ? c.n : c.k, b_cols = c.transb ? c.k : c.n;
    auto matrix = [&](cudaDataType_t type, int64_t rows, int64_t cols, float limit) {
        const int64_t ld = rows + c.pad;
        return random_matrix(type, rows, cols, ld, ld * cols + 3 * c.pad, c.batch, limit, rng);
    };
    o.a = matrix(c.ab_type, a_rows, a_cols, 1.0f);
    o.b = matrix(c.b_storage(), b_rows, b_cols, 1.0f);
    o.c = matrix(c.cd_type, c.m, c.n, 1.0f);
    o.d = c.in_place ? o.c : matrix(c.cd_type, c.m, c.n, 1.0f);
    const int64_t ald = aux_ld(c);
    o.aux = random_matrix(c.cd_type, c.m, c.n, ald, ald * c.n + (c.pad ? 8 : 0), c.batch, 3.0f, rng);
    const int64_t length = bias_length(c);
    o.bias = random_matrix(c.bias_storage(), length, 1, length, length + c.pad, c.batch, 1.0f, rng);
    return o;
}

// Device copies of the operands, each with 64 bytes to spare so that a test may offset a pointer.
struct DeviceOperands {
    static constexpr size_t SLACK = 64;
    DeviceBuffer a, b, c, d, aux, bias, scales;  // scales: A's, then B's 16 bytes on (fp8 kernels need that)
    DeviceOperands(const Operands& o, const Case& cs)
        : a(o.a.bytes() + SLACK), b(o.b.bytes() + SLACK), c(o.c.bytes() + SLACK), d(o.d.bytes() + SLACK),
          aux(o.aux.bytes() + SLACK), bias(o.bias.bytes() + SLACK), scales(8 * sizeof(float)) {
        upload(a.get(), o.a), upload(b.get(), o.b), upload(c.get(), o.c), upload(d.get(), o.d);
        upload(aux.get(), o.aux), upload(bias.get(), o.bias);
        const float values[8] = {cs.a_scale, 0, 0, 0, cs.b_scale, 0, 0, 0};
        REQUIRE(cudaMemcpy(scales.get(), values, sizeof(values), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    const float* a_scale() const { return static_cast<const float*>(scales.get()); }
    const float* b_scale() const { return a_scale() + 4; }
    void* d_pointer(const Case& cs) const { return cs.in_place ? c.get() : d.get(); }
};

// The descriptors of one case, set as llmc's MatmulContext sets them (and with batches and padding).
class Setup {
public:
    Setup(const Case& c, const DeviceOperands& dev) : Setup(c, dev.bias.get(), dev.aux.get()) {
        if (c.a_scale) set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(dev.a_scale()));
        if (c.b_scale) set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(dev.b_scale()));
    }
    Setup(const Case& c, const void* bias, const void* aux) {
        REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, FP32) == CUBLAS_STATUS_SUCCESS);
        set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)(c.transa ? CUBLAS_OP_T : CUBLAS_OP_N));
        set(CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)(c.transb ? CUBLAS_OP_T : CUBLAS_OP_N));
        set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)c.epilogue);
        if (adds_bias(c.epilogue) || is_bias_grad(c.epilogue)) {
            set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
            if (c.bias_type != -1) set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)c.bias_type);
            if (c.batch > 1) set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_length(c) + c.pad);
        }
        if (uses_aux(c.epilogue)) {
            set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
            set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld(c));
            if (c.batch > 1) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_ld(c) * c.n + (c.pad ? 8 : 0));
        }
        a = layout(c, c.ab_type, c.transa ? c.k : c.m, c.transa ? c.m : c.k);
        b = layout(c, c.b_storage(), c.transb ? c.n : c.k, c.transb ? c.k : c.n);
        cl = layout(c, c.cd_type, c.m, c.n);
        d = layout(c, c.cd_type, c.m, c.n);
        REQUIRE(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS);
        prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (uint64_t)32 << 20);
        prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, (uint32_t)CUBLASLT_REDUCTION_SCHEME_NONE);
        for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            prefer(attribute, (uint32_t)16);
    }
    ~Setup() {
        (void)cublasLtMatmulDescDestroy(desc);
        for (auto l : {a, b, cl, d}) (void)cublasLtMatrixLayoutDestroy(l);
        (void)cublasLtMatmulPreferenceDestroy(preference);
    }
    Setup(const Setup&) = delete;
    Setup& operator=(const Setup&) = delete;

    template <typename T>
    void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
        REQUIRE(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS);
    }
    template <typename T>
    void prefer(cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
        REQUIRE(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)) ==
                CUBLAS_STATUS_SUCCESS);
    }
    template <typename T>
    static void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attribute, const T& value) {
        REQUIRE(cublasLtMatrixLayoutSetAttribute(l, attribute, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS);
    }

    cublasStatus_t heuristic(cublasLtHandle_t handle, cublasLtMatmulAlgo_t* algo) const {
        cublasLtMatmulHeuristicResult_t result{};
        int returned = 0;
        const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, cl, d, preference, 1, &result, &returned);
        if (status == CUBLAS_STATUS_SUCCESS) {
            REQUIRE(returned == 1);
            CHECK(result.state == CUBLAS_STATUS_SUCCESS);
            CHECK(result.workspaceSize == 0);
            CHECK(result.wavesCount == 1.0f);
            *algo = result.algo;
        }
        return status;
    }

    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, cl = nullptr, d = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;

private:
    static cublasLtMatrixLayout_t layout(const Case& c, cudaDataType_t type, int64_t rows, int64_t cols) {
        cublasLtMatrixLayout_t l = nullptr;
        REQUIRE(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, rows + c.pad) ==
                CUBLAS_STATUS_SUCCESS);
        if (c.batch > 1) {
            set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (int32_t)c.batch);
            set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, (rows + c.pad) * cols + 3 * c.pad);
        }
        return l;
    }
};

cublasStatus_t matmul(cublasLtHandle_t handle, const Setup& s, const Case& c, const DeviceOperands& dev,
                      const cublasLtMatmulAlgo_t* algo) {
    return cublasLtMatmul(handle, s.desc, &c.alpha, dev.a.get(), s.a, dev.b.get(), s.b, &c.beta, dev.c.get(), s.cl,
                          dev.d_pointer(c), s.d, algo, nullptr, 0, nullptr);
}

// ---------------------------------------------------------------------------------------------
// The reference, in double.

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
    const double k = std::sqrt(2.0 / M_PI), th = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

double op_a(const Case& c, const HostMatrix& a, int b, int64_t i, int64_t k) {
    return c.transa ? a.at(b, k, i) : a.at(b, i, k);
}
double op_b(const Case& c, const HostMatrix& m, int b, int64_t k, int64_t j) {
    return c.transb ? m.at(b, j, k) : m.at(b, k, j);
}

struct Reference {
    std::vector<double> d, aux, bias;  // D and aux m x n per batch (tight), bias bias_length per batch
};

// One element of D before the activation: alpha op(A) op(B) + beta C + bias.
double pre_activation(const Case& c, const Operands& o, int b, int64_t i, int64_t j) {
    double sum = 0.0;
    for (int64_t k = 0; k < c.k; k++) sum += op_a(c, o.a, b, i, k) * op_b(c, o.b, b, k, j);
    double t = c.alpha * c.scale() * sum;
    if (c.beta != 0.0f) t += c.beta * (double)o.c.at(b, i, j);
    if (adds_bias(c.epilogue)) t += o.bias.at(b, i, 0);
    return t;
}

double activation(const Case& c, const Operands& o, int b, int64_t i, int64_t j, double t) {
    if (applies_relu(c.epilogue)) return t > 0.0 ? t : 0.0;
    if (applies_gelu(c.epilogue)) return gelu(t);
    if (reads_aux(c.epilogue)) return t * gelu_grad(o.aux.at(b, i, j));
    return t;
}

// Bias gradients: rows of D, or op(A) / op(B) summed over k.
double bias_grad(const Case& c, const Operands& o, const std::vector<double>& d, int b, int64_t index) {
    double sum = 0.0;
    if (c.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)
        for (int64_t j = 0; j < c.n; j++) sum += d[(size_t)((b * c.n + j) * c.m + index)];
    else if (c.epilogue == CUBLASLT_EPILOGUE_BGRADA)
        for (int64_t k = 0; k < c.k; k++) sum += op_a(c, o.a, b, index, k);
    else
        for (int64_t k = 0; k < c.k; k++) sum += op_b(c, o.b, b, k, index);
    return sum;
}

Reference reference(const Case& c, const Operands& o) {
    Reference r;
    r.d.resize((size_t)(c.batch * c.m * c.n));
    r.aux.resize(r.d.size());
    for (int b = 0; b < c.batch; b++)
        for (int64_t j = 0; j < c.n; j++)
            for (int64_t i = 0; i < c.m; i++) {
                const size_t at = (size_t)((b * c.n + j) * c.m + i);
                r.aux[at] = pre_activation(c, o, b, i, j);
                r.d[at] = activation(c, o, b, i, j, r.aux[at]);
            }
    if (is_bias_grad(c.epilogue))
        for (int b = 0; b < c.batch; b++)
            for (int64_t i = 0; i < bias_length(c); i++) r.bias.push_back(bias_grad(c, o, r.d, b, i));
    return r;
}

// ---------------------------------------------------------------------------------------------
// Checks.

// The m x n region of every batch of `got` against `want` (tight, in double).
double region_error(const HostMatrix& got, const std::vector<double>& want) {
    std::vector<float> g, w;
    for (int b = 0; b < got.batch; b++)
        for (int64_t j = 0; j < got.cols; j++)
            for (int64_t i = 0; i < got.rows; i++) {
                g.push_back(got.at(b, i, j));
                w.push_back((float)want[(size_t)((b * got.cols + j) * got.rows + i)]);
            }
    return llmc::rel_error(g.data(), w.data(), g.size());
}

// Whether every element outside the m x n regions still has its value from `before`.
bool padding_unchanged(const HostMatrix& after, const HostMatrix& before) {
    std::vector<bool> inside(after.values.size(), false);
    for (int b = 0; b < after.batch; b++)
        for (int64_t j = 0; j < after.cols; j++)
            for (int64_t i = 0; i < after.rows; i++) inside[(size_t)(b * after.stride + j * after.ld + i)] = true;
    for (size_t e = 0; e < after.values.size(); e++)
        if (!inside[e] && std::memcmp(&after.values[e], &before.values[e], sizeof(float)) != 0) return false;
    return true;
}

// Runs the case (destroying its descriptors before the work is waited for, as llmc does) and
// returns D, aux and the bias as the device holds them afterwards.
Operands run_case(const Case& c, const Operands& in) {
    const Handle handle;
    const DeviceOperands dev(in, c);
    {
        const Setup setup(c, dev);
        cublasLtMatmulAlgo_t algo;
        REQUIRE(setup.heuristic(handle.get(), &algo) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(matmul(handle.get(), setup, c, dev, &algo) == CUBLAS_STATUS_SUCCESS);
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    Operands out = in;
    download(out.d, dev.d_pointer(c));
    download(out.aux, dev.aux.get());
    download(out.bias, dev.bias.get());
    return out;
}

void check_case(const Case& c, uint32_t seed = 1) {
    INFO(describe(c));
    std::mt19937 rng(seed);
    const Operands in = make_operands(c, rng);
    const Operands out = run_case(c, in);
    const Reference ref = reference(c, in);

    CHECK(region_error(out.d, ref.d) < tolerance(c.cd_type));
    CHECK(padding_unchanged(out.d, in.d));
    if (writes_aux(c.epilogue)) {
        CHECK(region_error(out.aux, ref.aux) < tolerance(c.cd_type));
        CHECK(padding_unchanged(out.aux, in.aux));
    } else {
        CHECK(out.aux.values == in.aux.values);
    }
    if (is_bias_grad(c.epilogue)) {
        CHECK(region_error(out.bias, ref.bias) < tolerance(c.bias_storage()));
        CHECK(padding_unchanged(out.bias, in.bias));
    } else {
        CHECK(out.bias.values == in.bias.values);
    }
}

const cublasLtEpilogue_t ALL_EPILOGUES[] = {
    CUBLASLT_EPILOGUE_DEFAULT,  CUBLASLT_EPILOGUE_RELU,      CUBLASLT_EPILOGUE_RELU_BIAS,
    CUBLASLT_EPILOGUE_BIAS,     CUBLASLT_EPILOGUE_GELU,      CUBLASLT_EPILOGUE_GELU_BIAS,
    CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
    CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Products that must match the reference.

TEST_CASE("every transpose, beta and output type matches the double-precision reference") {
    const int64_t shapes[][3] = {{24, 40, 72}, {7, 5, 3}, {100, 70, 300}};  // 300 > one 256-long k block
    for (const auto& shape : shapes)
        for (bool transa : {false, true})
            for (bool transb : {false, true})
                for (float beta : {0.0f, 1.0f})
                    for (cudaDataType_t cd : {BF16, FP32}) {
                        Case c{shape[0], shape[1], shape[2]};
                        c.transa = transa, c.transb = transb, c.beta = beta, c.cd_type = cd;
                        check_case(c);
                    }
}

TEST_CASE("every epilogue matches the reference, for bf16 and fp32 outputs and every transpose") {
    for (cublasLtEpilogue_t epilogue : ALL_EPILOGUES)
        for (cudaDataType_t cd : {BF16, FP32})
            for (bool transa : {false, true})
                for (bool transb : {false, true}) {
                    Case c{24, 40, 72};
                    c.epilogue = epilogue, c.cd_type = cd, c.transa = transa, c.transb = transb;
                    c.beta = transa ? 1.0f : 0.0f;
                    check_case(c);
                }
}

TEST_CASE("fp8 products (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3), scaled per tensor, match the reference") {
    const std::pair<cudaDataType_t, cudaDataType_t> pairs[] = {{E4M3, E4M3}, {E4M3, E5M2}, {E5M2, E4M3}};
    const std::pair<float, float> scales[] = {{0.0f, 0.0f}, {0.5f, 4.0f}, {0.25f, 0.0f}};
    for (auto [a, b] : pairs)
        for (cudaDataType_t cd : {BF16, FP32})
            for (cublasLtEpilogue_t epilogue : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                                CUBLASLT_EPILOGUE_GELU_AUX_BIAS})
                for (auto [a_scale, b_scale] : scales) {
                    Case c{24, 40, 64};
                    c.transa = true, c.ab_type = a, c.b_type = b, c.cd_type = cd, c.epilogue = epilogue;
                    c.a_scale = a_scale, c.b_scale = b_scale, c.beta = a_scale == 0.5f ? 1.0f : 0.0f;
                    check_case(c);
                }
    Case batched{48, 24, 320};  // k beyond one 256-long block; padded leading dimensions, 2 batches
    batched.transa = true, batched.ab_type = E4M3, batched.cd_type = BF16, batched.a_scale = 2.0f;
    batched.batch = 2, batched.pad = 16;
    check_case(batched);
}

TEST_CASE("an fp32 bias with bf16 outputs, alpha and beta other than 1, fp32 A and B") {
    for (cublasLtEpilogue_t epilogue : {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                                        CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
        Case c{24, 40, 72};
        c.epilogue = epilogue, c.bias_type = FP32, c.alpha = 0.5f, c.beta = -0.75f, c.transa = true;
        check_case(c);
    }
    for (cublasLtEpilogue_t epilogue : ALL_EPILOGUES) {
        Case c{33, 17, 65};
        c.ab_type = FP32, c.cd_type = FP32, c.epilogue = epilogue, c.alpha = 2.0f, c.beta = 0.5f;
        check_case(c);
    }
}

TEST_CASE("strided batches with padded leading dimensions, batched bias and aux") {
    for (cublasLtEpilogue_t epilogue : ALL_EPILOGUES)
        for (cudaDataType_t cd : {BF16, FP32}) {
            Case c{24, 40, 72};
            c.epilogue = epilogue, c.cd_type = cd, c.batch = 3, c.pad = 5, c.transb = true, c.beta = 1.0f;
            check_case(c);
        }
}

TEST_CASE("the products llmc's matmul.cuh makes, with its descriptors") {
    const int64_t BT = 40, C = 64, OC = 96;
    Case forward{OC, BT, C};  // out = inp W^T + bias, GELU fused; C is D with beta 0 (no residual)
    forward.transa = true, forward.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, forward.in_place = true;
    check_case(forward);
    Case residual{OC, BT, C};  // out = inp W^T + bias + residual
    residual.transa = true, residual.epilogue = CUBLASLT_EPILOGUE_BIAS, residual.beta = 1.0f;
    check_case(residual);
    Case dinp{C, BT, OC};  // dinp = dout W, times GELU'(pre_gelu)
    dinp.epilogue = CUBLASLT_EPILOGUE_DGELU, dinp.in_place = true;
    check_case(dinp);
    Case dweight{C, OC, BT};  // dW += dout^T inp in fp32, in place
    dweight.transb = true, dweight.cd_type = FP32, dweight.beta = 1.0f, dweight.in_place = true;
    check_case(dweight);
}

TEST_CASE("results repeat bit for bit, whatever the thread count") {
    Case c{200, 150, 600};  // several k blocks, several GEMM panels
    c.transa = true, c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    std::mt19937 rng(7);
    const Operands in = make_operands(c, rng);
    const int threads = omp_get_max_threads();
    const Operands first = run_case(c, in);
    omp_set_num_threads(1);
    const Operands one_thread = run_case(c, in);
    omp_set_num_threads(3);
    const Operands three_threads = run_case(c, in);
    omp_set_num_threads(threads);
    CHECK(first.d.values == one_thread.d.values);
    CHECK(first.aux.values == one_thread.aux.values);
    CHECK(first.d.values == three_threads.d.values);
}

// ---------------------------------------------------------------------------------------------
// What cuBLASLt refuses.

namespace {

// A valid product (bf16, GELU_AUX_BIAS, m 24 n 40 k 72) whose descriptors a test then spoils.
struct Refusal {
    Case c;
    std::mt19937 rng{3};
    Operands host;
    DeviceOperands dev;
    Handle handle;
    Setup setup;

    explicit Refusal(Case base) : c(base), host(make_operands(c, rng)), dev(host, c), setup(c, dev) {}

    cublasStatus_t heuristic() {
        cublasLtMatmulAlgo_t algo;
        return setup.heuristic(handle.get(), &algo);
    }
    cublasStatus_t run(const cublasLtMatmulAlgo_t* algo = nullptr) { return matmul(handle.get(), setup, c, dev, algo); }
    // Both the heuristic and the product must give `status`.
    void expect(cublasStatus_t status) {
        CHECK(heuristic() == status);
        CHECK(run() == status);
    }
};

Case gelu_case() {
    Case c{24, 40, 72};
    c.transa = true, c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    return c;
}

}  // namespace

TEST_CASE("unsupported types, orders and modes are CUBLAS_STATUS_NOT_SUPPORTED") {
    Refusal r(gelu_case());
    SECTION("C and D of different types") {
        Setup::set_layout(r.setup.cl, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("A and B of different types") {
        Setup::set_layout(r.setup.b, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("fp32 A and B with bf16 C and D") {
        Setup::set_layout(r.setup.a, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        Setup::set_layout(r.setup.b, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("fp16 matrices") {
        Setup::set_layout(r.setup.a, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)CUDA_R_16F);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("a compute type other than 32F") {
        r.setup.set(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, (int32_t)CUBLAS_COMPUTE_32F_FAST_TF32);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("row-major order") {
        Setup::set_layout(r.setup.d, CUBLASLT_MATRIX_LAYOUT_ORDER, (int32_t)CUBLASLT_ORDER_ROW);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("device pointer mode") {
        r.setup.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, (int32_t)CUBLASLT_POINTER_MODE_DEVICE);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("a transposed C") {
        r.setup.set(CUBLASLT_MATMUL_DESC_TRANSC, (int32_t)CUBLAS_OP_T);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("the ReLU bit-mask epilogues") {
        for (auto e : {CUBLASLT_EPILOGUE_RELU_AUX, CUBLASLT_EPILOGUE_RELU_AUX_BIAS, CUBLASLT_EPILOGUE_DRELU,
                       CUBLASLT_EPILOGUE_DRELU_BGRAD}) {
            r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)e);
            r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
        }
    }
    SECTION("a bf16 bias with fp32 outputs") {
        Setup::set_layout(r.setup.cl, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        Setup::set_layout(r.setup.d, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)FP32);
        r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BIAS);
        r.setup.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)BF16);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
}

namespace {
// A valid fp8 product (E4M3 x E4M3 into bf16, GELU_AUX_BIAS, scaled, m 24 n 40 k 64).
Case fp8_case() {
    Case c{24, 40, 64};
    c.transa = true, c.ab_type = E4M3, c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, c.a_scale = 0.5f, c.b_scale = 2.0f;
    return c;
}
}  // namespace

TEST_CASE("fp8 products outside what Hopper's kernels take are CUBLAS_STATUS_NOT_SUPPORTED") {
    Refusal r(fp8_case());
    REQUIRE(r.heuristic() == CUBLAS_STATUS_SUCCESS);
    SECTION("E5M2 x E5M2") {
        Setup::set_layout(r.setup.a, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)E5M2);
        Setup::set_layout(r.setup.b, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)E5M2);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("fp8 A with bf16 B") {
        Setup::set_layout(r.setup.b, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)BF16);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("fp8 outputs") {
        Setup::set_layout(r.setup.cl, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)E4M3);
        Setup::set_layout(r.setup.d, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)E4M3);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("an fp32 bias") {
        r.setup.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)FP32);
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("the gradient epilogues") {
        for (auto e : {CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
                       CUBLASLT_EPILOGUE_BGRADB}) {
            r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)e);
            r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
        }
    }
    SECTION("D's scale and amax, which the emulator does not emulate") {
        r.setup.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<const void*>(r.dev.scales.get()));
        r.expect(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("a scale pointer 4 bytes into its allocation (an H200 refused it at cublasLtMatmul)") {
        const float* aligned[2] = {r.dev.a_scale(), r.dev.b_scale()};
        const cublasLtMatmulDescAttributes_t attributes[2] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                              CUBLASLT_MATMUL_DESC_B_SCALE_POINTER};
        for (int i = 0; i < 2; i++) {
            r.setup.set(attributes[i], static_cast<const void*>(aligned[i] + 1));
            cublasLtMatmulAlgo_t algo;
            CHECK(r.setup.heuristic(r.handle.get(), &algo) == CUBLAS_STATUS_SUCCESS);  // as the real one
            CHECK(r.run(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
            CHECK(r.run() == CUBLAS_STATUS_NOT_SUPPORTED);
            r.setup.set(attributes[i], static_cast<const void*>(aligned[i]));
            CHECK(r.run() == CUBLAS_STATUS_SUCCESS);
        }
    }
    SECTION("A 8-byte aligned, or a preference that promises less than 16 bytes") {
        const float alpha = 1.0f, beta = 0.0f;
        const Setup& s = r.setup;
        CHECK(cublasLtMatmul(r.handle.get(), s.desc, &alpha, r.dev.a.bytes() + 8, s.a, r.dev.b.get(), s.b, &beta,
                             r.dev.c.get(), s.cl, r.dev.d.get(), s.d, nullptr, nullptr, 0, nullptr) ==
              CUBLAS_STATUS_NOT_SUPPORTED);
        r.setup.prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (uint32_t)8);
        CHECK(r.heuristic() == CUBLAS_STATUS_NOT_SUPPORTED);
    }
}

TEST_CASE("fp8 products must be TN with k and leading dimensions multiples of 16 bytes") {
    Case nn{32, 40, 64};
    nn.ab_type = E4M3;
    Refusal(nn).expect(CUBLAS_STATUS_NOT_SUPPORTED);
    Case tt = fp8_case();
    tt.transb = true;
    Refusal(tt).expect(CUBLAS_STATUS_NOT_SUPPORTED);
    Case odd_k = fp8_case();
    odd_k.k = 72;
    Refusal(odd_k).expect(CUBLAS_STATUS_NOT_SUPPORTED);
    Case padded = fp8_case();
    padded.pad = 8;  // A's leading dimension 72 bytes
    Refusal(padded).expect(CUBLAS_STATUS_NOT_SUPPORTED);
    Refusal(fp8_case()).expect(CUBLAS_STATUS_SUCCESS);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("shapes and layouts that contradict each other are CUBLAS_STATUS_INVALID_VALUE") {
    Refusal r(gelu_case());
    SECTION("op(B) rows differ from op(A) columns") {
        Setup::set_layout(r.setup.b, CUBLASLT_MATRIX_LAYOUT_ROWS, (uint64_t)71);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("the transpose of A is not the one its layout was made for") {
        r.setup.set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)CUBLAS_OP_N);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("D has other rows than op(A)") {
        Setup::set_layout(r.setup.d, CUBLASLT_MATRIX_LAYOUT_ROWS, (uint64_t)16);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("C has another shape than D") {
        Setup::set_layout(r.setup.cl, CUBLASLT_MATRIX_LAYOUT_COLS, (uint64_t)39);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("a leading dimension below the rows") {
        Setup::set_layout(r.setup.a, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)71);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("different batch counts") {
        Setup::set_layout(r.setup.a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (int32_t)2);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("the aux ld unset, not a multiple of 8, or below D's rows") {
        for (int64_t ld : {0, 28, 16}) {
            r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
            r.expect(CUBLAS_STATUS_INVALID_VALUE);
        }
    }
    SECTION("an aux batch stride that is not a multiple of 8") {
        r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, (int64_t)964);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("an aux type other than D's") {
        r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, (int32_t)FP32);
        r.expect(CUBLAS_STATUS_INVALID_VALUE);
    }
    SECTION("an fp8 scale or amax pointer on a bf16 product") {
        for (auto attribute : {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
                               CUBLASLT_MATMUL_DESC_AMAX_D_POINTER}) {
            r.setup.set(attribute, static_cast<const void*>(r.dev.scales.get()));
            r.expect(CUBLAS_STATUS_INVALID_VALUE);
            r.setup.set(attribute, static_cast<const void*>(nullptr));
        }
    }
    SECTION("in place (C == D) with another layout for C") {
        r.c.in_place = true;
        Setup::set_layout(r.setup.cl, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)32);
        CHECK(r.heuristic() == CUBLAS_STATUS_SUCCESS);  // the heuristic does not see the pointers
        CHECK(r.run() == CUBLAS_STATUS_INVALID_VALUE);
    }
}

TEST_CASE("missing pointers are CUBLAS_STATUS_INVALID_VALUE, C only when beta reads it") {
    Refusal r(gelu_case());
    const float alpha = 1.0f, beta0 = 0.0f, beta1 = 1.0f;
    const Setup& s = r.setup;
    const cublasLtHandle_t h = r.handle.get();
    void* d = r.dev.d.get();
    CHECK(cublasLtMatmul(h, s.desc, &alpha, nullptr, s.a, r.dev.b.get(), s.b, &beta0, d, s.cl, d, s.d, nullptr,
                         nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(h, s.desc, &alpha, r.dev.a.get(), s.a, r.dev.b.get(), s.b, &beta0, d, s.cl, nullptr, s.d,
                         nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(h, s.desc, nullptr, r.dev.a.get(), s.a, r.dev.b.get(), s.b, &beta0, d, s.cl, d, s.d,
                         nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(h, s.desc, &alpha, r.dev.a.get(), s.a, r.dev.b.get(), s.b, &beta1, nullptr, s.cl, d, s.d,
                         nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmul(h, s.desc, &alpha, r.dev.a.get(), s.a, r.dev.b.get(), s.b, &beta0, nullptr, s.cl, d, s.d,
                         nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS);
    r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(nullptr));
    CHECK(r.run() == CUBLAS_STATUS_INVALID_VALUE);
    r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BIAS);
    r.setup.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr));
    CHECK(r.run() == CUBLAS_STATUS_INVALID_VALUE);
    r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_DEFAULT);
    CHECK(r.run() == CUBLAS_STATUS_SUCCESS);  // a bias pointer the epilogue does not use may be null
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("a pointer less aligned than the algorithm assumes is CUBLAS_STATUS_NOT_SUPPORTED") {
    Refusal r(gelu_case());
    cublasLtMatmulAlgo_t algo;
    REQUIRE(r.setup.heuristic(r.handle.get(), &algo) == CUBLAS_STATUS_SUCCESS);  // 16-byte A, B, C, D and bias
    const Setup& s = r.setup;
    const float alpha = 1.0f, beta = 0.0f;
    char* a = r.dev.a.bytes();
    auto run_with_a = [&](const void* a_pointer, const cublasLtMatmulAlgo_t* with) {
        return cublasLtMatmul(r.handle.get(), s.desc, &alpha, a_pointer, s.a, r.dev.b.get(), s.b, &beta,
                              r.dev.c.get(), s.cl, r.dev.d.get(), s.d, with, nullptr, 0, nullptr);
    };
    CHECK(run_with_a(a, &algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(run_with_a(a + 16, &algo) == CUBLAS_STATUS_SUCCESS);
    CHECK(run_with_a(a + 8, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(run_with_a(a + 2, &algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(run_with_a(a + 2, nullptr) == CUBLAS_STATUS_SUCCESS);  // the implicit heuristic sees the pointer
    CHECK(cudaDeviceSynchronize() == cudaSuccess);

    SECTION("the bias, aligned less than at the heuristic") {
        r.setup.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(r.dev.bias.bytes() + 2));
        CHECK(r.run(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
        cublasLtMatmulAlgo_t for_this_bias;
        REQUIRE(r.setup.heuristic(r.handle.get(), &for_this_bias) == CUBLAS_STATUS_SUCCESS);
        CHECK(r.run(&for_this_bias) == CUBLAS_STATUS_SUCCESS);
    }
    SECTION("the aux, aligned less than at the heuristic") {
        r.setup.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(r.dev.aux.bytes() + 8));
        CHECK(r.run(&algo) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    SECTION("the default preference promises 256 bytes, of which an algorithm uses at most 16") {
        cublasLtMatmulPreference_t fresh;
        REQUIRE(cublasLtMatmulPreferenceCreate(&fresh) == CUBLAS_STATUS_SUCCESS);
        cublasLtMatmulHeuristicResult_t result{};
        int returned = 0;
        REQUIRE(cublasLtMatmulAlgoGetHeuristic(r.handle.get(), s.desc, s.a, s.b, s.cl, s.d, fresh, 1, &result,
                                               &returned) == CUBLAS_STATUS_SUCCESS);
        CHECK(run_with_a(a + 16, &result.algo) == CUBLAS_STATUS_SUCCESS);
        CHECK(run_with_a(a + 8, &result.algo) == CUBLAS_STATUS_NOT_SUPPORTED);
        CHECK(cublasLtMatmulPreferenceDestroy(fresh) == CUBLAS_STATUS_SUCCESS);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("an algorithm is refused for a product of other types, and the heuristic checks its arguments") {
    Refusal bf16(gelu_case());
    cublasLtMatmulAlgo_t algo;
    REQUIRE(bf16.setup.heuristic(bf16.handle.get(), &algo) == CUBLAS_STATUS_SUCCESS);
    Case fp32_case = gelu_case();
    fp32_case.cd_type = FP32;
    Refusal fp32(fp32_case);
    CHECK(fp32.run(&algo) == CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulAlgo_t garbage{};
    CHECK(bf16.run(&garbage) == CUBLAS_STATUS_INVALID_VALUE);

    const Setup& s = bf16.setup;
    cublasLtMatmulHeuristicResult_t result{};
    int returned = -1;
    CHECK(cublasLtMatmulAlgoGetHeuristic(bf16.handle.get(), s.desc, s.a, s.b, s.cl, s.d, s.preference, 0, &result,
                                         &returned) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, s.desc, s.a, s.b, s.cl, s.d, s.preference, 1, &result,
                                         &returned) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasLtMatmulAlgoGetHeuristic(bf16.handle.get(), s.desc, s.a, nullptr, s.cl, s.d, s.preference, 1,
                                         &result, &returned) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("attributes: a wrong size or an unknown attribute is CUBLAS_STATUS_INVALID_VALUE; values round-trip") {
    cublasLtMatmulDesc_t desc;
    REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, FP32) == CUBLAS_STATUS_SUCCESS);
    const uint32_t epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const int64_t ld = 768;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, 8) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)9, &ld, 8) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, nullptr, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, 4) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8) ==
            CUBLAS_STATUS_SUCCESS);
    size_t written = 0;
    CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, &written) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(written == 8);
    CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, nullptr) ==
          CUBLAS_STATUS_INVALID_VALUE);
    uint32_t epilogue_back = 0;
    int64_t ld_back = 0;
    int32_t compute_back = 0;
    CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue_back, 4, &written) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_back, 8, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute_back, 4, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(epilogue_back == epilogue);
    CHECK(ld_back == ld);
    CHECK(compute_back == CUBLAS_COMPUTE_32F);
    CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);

    cublasLtMatrixLayout_t layout;
    REQUIRE(cublasLtMatrixLayoutCreate(&layout, BF16, 24, 40, 32) == CUBLAS_STATUS_SUCCESS);
    uint64_t rows = 0;
    int32_t batch = 0;
    CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, 8, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, 4, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(rows == 24);
    CHECK(batch == 1);
    CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &batch, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayoutOpaque_t storage;  // the *Init form, in the caller's memory
    REQUIRE(cublasLtMatrixLayoutInit(&storage, FP32, 7, 9, 8) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutGetAttribute(&storage, CUBLASLT_MATRIX_LAYOUT_COLS, &rows, 8, nullptr) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(rows == 9);

    cublasLtMatmulPreference_t preference;
    REQUIRE(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS);
    const uint32_t alignment = 16;
    const uint64_t workspace = 32 << 20;
    CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &alignment, 4) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, 8) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignment,
                                               4) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulPreferenceDestroy(preference) == CUBLAS_STATUS_SUCCESS);

    CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
    CHECK(cublasLtGetVersion() == CUBLAS_VERSION);
}

TEST_CASE("a matrix outside device memory is a fatal error, naming the operand, when the product runs") {
    std::fflush(stdout);
    std::fflush(stderr);
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        std::signal(SIGABRT, SIG_DFL);  // the abort must end the child, not Catch's handler
        alarm(30);                      // a hang fails the test instead of stalling it
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        Refusal r(gelu_case());
        std::vector<uint16_t> host_b((size_t)(r.c.k * r.c.n));
        const float alpha = 1.0f, beta = 0.0f;
        const Setup& s = r.setup;
        const cublasStatus_t status =
            cublasLtMatmul(r.handle.get(), s.desc, &alpha, r.dev.a.get(), s.a, host_b.data(), s.b, &beta,
                           r.dev.c.get(), s.cl, r.dev.d.get(), s.d, nullptr, nullptr, 0, nullptr);
        (void)cudaDeviceSynchronize();
        _exit(status == CUBLAS_STATUS_SUCCESS ? 0 : 2);
    }
    close(pipe_fds[1]);
    std::string message;
    char chunk[512];
    for (ssize_t got; (got = read(pipe_fds[0], chunk, sizeof(chunk))) > 0;) message.append(chunk, (size_t)got);
    close(pipe_fds[0]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    INFO("child's stderr: " << message);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGABRT);
    CHECK(message.find("cublasLtMatmul") != std::string::npos);
    CHECK(message.find("matrix B") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Timings (hidden: build/emu/test_cublaslt "[.timing]").

TEST_CASE("timing of the emulated products", "[.timing]") {
    struct Timed {
        const char* name;
        Case c;
    };
    Case cube{512, 512, 512};
    Case fc{768 * 4, 512, 768};  // GPT-2 small's fc layer over 512 tokens: m = OC, n = BT, k = C
    fc.transa = true;
    Case fc_gelu = fc;
    fc_gelu.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const Timed timed[] = {{"512 x 512 x 512, bf16", cube},
                           {"m 3072 n 512 k 768 (T, N), bf16", fc},
                           {"m 3072 n 512 k 768 (T, N), bf16, GELU_AUX_BIAS", fc_gelu}};
    for (const Timed& t : timed) {
        std::mt19937 rng(5);
        const Operands in = make_operands(t.c, rng);
        const Handle handle;
        const DeviceOperands dev(in, t.c);
        const Setup setup(t.c, dev);
        cublasLtMatmulAlgo_t algo;
        REQUIRE(setup.heuristic(handle.get(), &algo) == CUBLAS_STATUS_SUCCESS);
        std::vector<double> ms;
        for (int rep = 0; rep < 8; rep++) {
            const auto start = std::chrono::steady_clock::now();
            REQUIRE(matmul(handle.get(), setup, t.c, dev, &algo) == CUBLAS_STATUS_SUCCESS);
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        }
        std::sort(ms.begin() + 1, ms.end());  // the first run pays for the scratch buffers
        std::printf("%-48s first %7.2f ms, best %7.2f ms, median %7.2f ms (%d threads)\n", t.name, ms[0], ms[1],
                    ms[4], omp_get_max_threads());
    }
}
