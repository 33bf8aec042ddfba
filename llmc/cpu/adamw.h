// cpu/adamw.h: host fp32 AdamW and the squared-gradient sum used for global-norm clipping, both over a
// flat element range [begin, end) of the ParamLayout buffers.
//
// A range is what a ZeRO shard owns, so it may start or end in the middle of a tensor; the update
// therefore walks the layout's segments (tensor slices) that intersect the range and picks weight
// decay per segment (the layout's is_decayed of its tensor), never per range. Semantics are PyTorch's AdamW: decoupled decay
// p -= lr * wd * p, then p -= lr * mhat / (sqrt(vhat) + eps) with 1-based bias correction.
//
// sum_squares is reproducible bit for bit: the range is cut into fixed blocks (not one block per
// thread), each block sums in double, and the block sums are added in block order, so the result
// does not depend on the thread count or on scheduling.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "llmc/model.h"
#include "llmc/params/layout.h"
#include "llmc/utils.h"

namespace llmc {

inline void check_param_range(const ParamLayout& layout, size_t begin, size_t end, const char* who) {
    if (begin > end || end > layout.num_params)
        fail(strformat("%s: range [%zu, %zu) is not within the %zu parameters", who, begin, end,
                       layout.num_params));
}

namespace detail {

// The update of elements [0, n) of one tensor's slice, `decay` already chosen for the tensor.
// Vector and scalar paths perform the same IEEE operations in the same order, every multiply-add
// spelled out as an FMA (so the compiler has nothing left to contract differently), hence an
// element's result does not depend on which path, or which range split, handled it. The vector
// path exists because libm's sqrtf may set errno: unless the build passes -fno-math-errno, GCC
// will not vectorise a loop that calls it, and the scalar loop is 4x slower than memory. (The
// all-ones masked sqrt sidesteps GCC 12's false "may be used uninitialized" on _mm512_sqrt_ps.)
inline void adamw_span(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                       float beta2, float eps, float decay, float bias_correction1, float bias_correction2,
                       float grad_multiplier) {
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    size_t i = 0;
#if defined(__AVX512F__)
    const __m512 mult = _mm512_set1_ps(grad_multiplier), b1 = _mm512_set1_ps(beta1), b2 = _mm512_set1_ps(beta2);
    const __m512 c1 = _mm512_set1_ps(one_minus_beta1), c2 = _mm512_set1_ps(one_minus_beta2);
    const __m512 bc1 = _mm512_set1_ps(bias_correction1), bc2 = _mm512_set1_ps(bias_correction2);
    const __m512 eps_v = _mm512_set1_ps(eps), neg_lr = _mm512_set1_ps(-lr), decay_v = _mm512_set1_ps(decay);
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grads + i), mult);
        const __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(c1, g));
        const __m512 vi = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(c2, g), g));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        const __m512 mhat = _mm512_div_ps(mi, bc1), vhat = _mm512_div_ps(vi, bc2);
        const __m512 p = _mm512_loadu_ps(params + i);
        const __m512 adam = _mm512_div_ps(mhat, _mm512_add_ps(_mm512_mask_sqrt_ps(vhat, 0xFFFF, vhat), eps_v));
        const __m512 step = _mm512_fmadd_ps(decay_v, p, adam);
        _mm512_storeu_ps(params + i, _mm512_fmadd_ps(neg_lr, step, p));
    }
#endif
    for (; i < n; i++) {
        const float g = grads[i] * grad_multiplier;
        const float mi = std::fma(beta1, m[i], one_minus_beta1 * g);
        const float vi = std::fma(beta2, v[i], (one_minus_beta2 * g) * g);
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / bias_correction1, vhat = vi / bias_correction2;
        const float step = std::fma(decay, params[i], mhat / (std::sqrt(vhat) + eps));
        params[i] = std::fma(-lr, step, params[i]);
    }
}

}  // namespace detail

// AdamW on n contiguous elements that share one weight decay (one tensor slice, or part of one).
inline void adamw_contiguous(float* params, const float* grads, float* m, float* v, size_t n, float decay,
                             const AdamWConfig& opt, int step, float grad_multiplier) {
    if (step < 1) fail(strformat("adamw: step must be >= 1 (1-based for bias correction), got %d", step));
    const float bias_correction1 = (float)(1.0 - std::pow((double)opt.beta1, step));
    const float bias_correction2 = (float)(1.0 - std::pow((double)opt.beta2, step));
    constexpr size_t CHUNK_ELEMS = 1 << 14;  // static chunks: each element's thread is fixed
    const size_t num_chunks = (n + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
#pragma omp parallel for schedule(static) if (num_chunks > 1)
    for (size_t c = 0; c < num_chunks; c++) {
        const size_t at = c * CHUNK_ELEMS, count = std::min(CHUNK_ELEMS, n - at);
        detail::adamw_span(params + at, grads + at, m + at, v + at, count, opt.lr, opt.beta1, opt.beta2, opt.eps,
                           decay, bias_correction1, bias_correction2, grad_multiplier);
    }
}

// AdamW on the flat range [begin, end) of buffers in ParamLayout order, decay chosen per segment.
inline void adamw_update(const ParamLayout& layout, float* params, const float* grads, float* m, float* v,
                         size_t begin, size_t end, const AdamWConfig& opt, int step, float grad_multiplier) {
    check_param_range(layout, begin, end, "adamw_update");
    if (step < 1) fail(strformat("adamw_update: step must be >= 1 (1-based for bias correction), got %d", step));
    for (const ParamLayout::Segment& s : layout.segments()) {
        const size_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
        if (lo >= hi) continue;
        const float decay = layout.is_decayed(s.tensor) ? opt.weight_decay : 0.0f;
        adamw_contiguous(params + lo, grads + lo, m + lo, v + lo, hi - lo, decay, opt, step, grad_multiplier);
    }
}

inline double sum_squares(const float* x, size_t begin, size_t end) {
    if (begin > end) fail(strformat("sum_squares: begin %zu is after end %zu", begin, end));
    constexpr size_t BLOCK_ELEMS = 1 << 15;
    const size_t num_blocks = (end - begin + BLOCK_ELEMS - 1) / BLOCK_ELEMS;
    std::vector<double> block_sums(num_blocks);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < num_blocks; b++) {
        const size_t lo = begin + b * BLOCK_ELEMS, hi = std::min(lo + BLOCK_ELEMS, end);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        block_sums[b] = s;
    }
    double total = 0.0;
    for (double s : block_sums) total += s;
    return total;
}

}  // namespace llmc
