// dev/emu/ptx.cpp: the emulated PTX instructions of ptx.h.
#include <cuda_runtime.h>

#include <cstring>

#include "dev/emu/fibers.h"

namespace emu::ptx {

namespace {

void check_alignment(const void* p, int bytes, const char* what, const char* operand) {
    if (reinterpret_cast<uintptr_t>(p) % (uintptr_t)bytes != 0) {
        char message[128];
        snprintf(message, sizeof message, "%s address %p is not %d-byte aligned", operand, p, bytes);
        device_fault(what, message);
    }
}

void complete(const PendingCopy& c) {
    if (c.src_bytes > 0) memcpy(c.dst, c.src, (size_t)c.src_bytes);
    if (c.src_bytes < c.copy_bytes) memset(static_cast<char*>(c.dst) + c.src_bytes, 0, (size_t)(c.copy_bytes - c.src_bytes));
}

// One bf16 pair as the low and high halves of a 32-bit register.
float low_half(uint32_t r) { return __bfloat162float(__ushort_as_bfloat16((unsigned short)(r & 0xffffu))); }
float high_half(uint32_t r) { return __bfloat162float(__ushort_as_bfloat16((unsigned short)(r >> 16))); }

}  // namespace

void cp_async(uint32_t shared_dst, const void* global_src, int copy_bytes, int src_bytes) {
    void* dst = shared_pointer(shared_dst);
    check_alignment(dst, copy_bytes, "cp.async", "shared destination");
    if (src_bytes < 0 || src_bytes > copy_bytes) device_fault("cp.async", "src-size beyond cp-size");
    if (src_bytes > 0) check_alignment(global_src, copy_bytes, "cp.async", "global source");
    const PendingCopy copy{dst, global_src, copy_bytes, src_bytes};
    if (copies_land_at_issue()) complete(copy);
    else this_thread_copies().copies.push_back(copy);
}

void cp_async_commit() {
    PendingCopies& p = this_thread_copies();
    p.group_ends.push_back(p.copies.size());
}

void cp_async_wait(int pending) {
    PendingCopies& p = this_thread_copies();
    const size_t groups = p.group_ends.size();
    if (groups <= (size_t)pending) return;
    const size_t done_groups = groups - (size_t)pending;
    const size_t done_copies = p.group_ends[done_groups - 1];
    for (size_t i = 0; i < done_copies; i++) complete(p.copies[i]);
    p.copies.erase(p.copies.begin(), p.copies.begin() + (ptrdiff_t)done_copies);
    p.group_ends.erase(p.group_ends.begin(), p.group_ends.begin() + (ptrdiff_t)done_groups);
    for (size_t& end : p.group_ends) end -= done_copies;
}

namespace {

// The whole warp's registers, read when every lane has given its row address, as the one warp-wide
// instruction reads them: a lane that writes a row right after must not change another's registers.
template <bool TRANSPOSE>
void ldmatrix_combine(const unsigned char (*deposits)[64], unsigned char (*results)[64]) {
    const char* what = TRANSPOSE ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    uint32_t addresses[32];
    for (int l = 0; l < 32; l++) memcpy(&addresses[l], deposits[l], sizeof addresses[l]);
    for (int lane = 0; lane < 32; lane++) {
        uint32_t r[4];
        for (int i = 0; i < 4; i++) {
            // Element (row, col) of matrix i: column col of the row whose address lane 8i + row gave.
            auto element = [&](int row, int col) {
                const void* row_start = shared_pointer(addresses[8 * i + row]);
                check_alignment(row_start, 16, what, "row");
                uint16_t v;
                memcpy(&v, static_cast<const char*>(row_start) + 2 * col, 2);
                return (uint32_t)v;
            };
            const int a = lane / 4, b = 2 * (lane % 4);
            r[i] = TRANSPOSE ? element(b, a) | element(b + 1, a) << 16 : element(a, b) | element(a, b + 1) << 16;
        }
        memcpy(results[lane], r, sizeof r);
    }
}

}  // namespace

void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address, bool transpose) {
    warp_combine(0xffffffffu, &shared_address, sizeof shared_address, r, sizeof r,
                 transpose ? "ldmatrix.x4.trans" : "ldmatrix.x4",
                 transpose ? ldmatrix_combine<true> : ldmatrix_combine<false>);
}

namespace {

struct MmaOperands {
    uint32_t a[4], b[2];
    float c[4];
};

// The whole product, once for the warp: A (16 x 16) and B (16 x 8) from the lanes' fragments, then
// each lane's four outputs.
void mma_combine(const unsigned char (*deposits)[64], unsigned char (*results)[64]) {
    float A[16][16], B[16][8];
    MmaOperands o[32];
    for (int l = 0; l < 32; l++) {
        memcpy(&o[l], deposits[l], sizeof(MmaOperands));
        const int g = l / 4, t = 2 * (l % 4);
        A[g][t] = low_half(o[l].a[0]), A[g][t + 1] = high_half(o[l].a[0]);
        A[g + 8][t] = low_half(o[l].a[1]), A[g + 8][t + 1] = high_half(o[l].a[1]);
        A[g][t + 8] = low_half(o[l].a[2]), A[g][t + 9] = high_half(o[l].a[2]);
        A[g + 8][t + 8] = low_half(o[l].a[3]), A[g + 8][t + 9] = high_half(o[l].a[3]);
        B[t][g] = low_half(o[l].b[0]), B[t + 1][g] = high_half(o[l].b[0]);
        B[t + 8][g] = low_half(o[l].b[1]), B[t + 9][g] = high_half(o[l].b[1]);
    }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = 2 * (l % 4);
        const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {t, t + 1, t, t + 1};
        float d[4];
        for (int i = 0; i < 4; i++) {
            float sum = o[l].c[i];
            for (int k = 0; k < 16; k++) sum += A[rows[i]][k] * B[k][cols[i]];
            d[i] = sum;
        }
        memcpy(results[l], d, sizeof d);
    }
}

}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
    warp_combine(0xffffffffu, &mine, sizeof mine, d, sizeof d, "mma.sync.m16n8k16", mma_combine);
}

}  // namespace emu::ptx
