// test/rel_error.h: the relative error every llmc comparison uses (CPU tests, GPU tests, kernel
// workbench): per tensor, ||a - b|| / ||b||, with b the reference. It is +inf whenever `a` holds a
// NaN or an infinity, so a broken computation can never pass a tolerance.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace llmc {

inline double rel_error(const float* a, const float* b, size_t n) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
        const double d = (double)a[i] - (double)b[i];
        diff += d * d;
        ref += (double)b[i] * b[i];
    }
    if (ref == 0.0) return diff == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
    return std::sqrt(diff / ref);
}

inline double rel_error(double a, double b) {
    if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
    return std::fabs(a - b) / std::fabs(b);
}

}  // namespace llmc
