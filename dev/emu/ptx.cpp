// dev/emu/ptx.cpp: the emulated PTX instructions of ptx.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
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

// ---- wgmma ----

namespace emu::ptx {

namespace {

constexpr uint32_t FULL_MASK = 0xffffffffu;

// A matrix descriptor, decoded (PTX ISA, "Matrix Descriptor Format"): byte addresses and offsets,
// and the swizzle's width in bytes (0: none).
struct Descriptor {
    uint32_t start, lbo, sbo;
    int swizzle_bytes;
};

// Bits 14-15, 30-31, 46-48 and 52-61 are not fields of wgmma's descriptor (tcgen05's descriptor
// gives some of them a meaning): set, they fault rather than be ignored. So does a base offset: the
// ISA does not say how the hardware applies it, so its effect is not emulated.
Descriptor decode_descriptor(uint64_t desc, const char* what, const char* operand) {
    constexpr uint64_t NOT_FIELDS = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3ffull << 52);
    char message[200];
    if (desc & NOT_FIELDS) {
        snprintf(message, sizeof message,
                 "%s descriptor 0x%016llx sets bits outside its fields (14-15, 30-31, 46-48, 52-61)",
                 operand, (unsigned long long)desc);
        device_fault(what, message);
    }
    if ((desc >> 49) & 7) {
        snprintf(message, sizeof message,
                 "%s descriptor 0x%016llx has a matrix base offset (%d): not emulated (start each swizzle "
                 "pattern on its boundary: 256, 512 or 1024 bytes)",
                 operand, (unsigned long long)desc, (int)((desc >> 49) & 7));
        device_fault(what, message);
    }
    constexpr int SWIZZLE_BYTES[4] = {0, 128, 64, 32};  // the field: none, 128B, 64B, 32B
    return Descriptor{(uint32_t)(desc & 0x3fff) << 4, (uint32_t)((desc >> 16) & 0x3fff) << 4,
                      (uint32_t)((desc >> 32) & 0x3fff) << 4, SWIZZLE_BYTES[desc >> 62]};
}

// The shared address of element (mn, k) of a bf16 operand (MN: A's row m or B's column n; K: 0..15),
// from the ISA's canonical layouts ("Shared Memory Matrix Layout", "Strides", "Canonical Layouts";
// in bytes, bf16 being 2): a core matrix, or a swizzle atom's row, is 16 bytes of 8 elements along the
// major dimension, and
//   K-major, no swizzle: 8x16-byte core matrices (8 MN by 8 K), 16 bytes per MN; the next 8 MN at
//     SBO, the next 8 K at LBO;
//   K-major, W-byte swizzle (W = 32, 64, 128): MN at W bytes, K contiguous (the 16 K of one
//     instruction are 32 bytes of a W-byte row); the next 8 MN at SBO; LBO unused;
//   MN-major, no swizzle: core matrices of 8 MN (16 bytes) by 8 K, 16 bytes per K; the next 8 MN
//     at SBO, the next 8 K at LBO;
//   MN-major, W-byte swizzle: W/2 MN contiguous, K at W bytes; the next W/2 MN at LBO, the next 8 K
//     at SBO.
// Then the swizzle, CuTe's Swizzle<B, 4, 3> (B = 1, 2, 3 for 32, 64, 128 bytes) read on byte
// addresses: bits 4..4+B (the 16-byte unit within a W-byte row) XOR bits 7..7+B. It is applied to
// the address itself, start included, so a pattern starts on its boundary (256, 512, 1024 bytes)
// exactly when the base offset is 0, as the descriptor format says, and a start moved within a row
// (the next 16 K of a K-major tile: start + 32 bytes) reads the same swizzled rows. The ISA's text
// leaves three of these readings to the reader: the swizzle's unit (bytes: the only one under which
// its figures move whole 16-byte cells), its anchoring (the absolute address), and LBO for a K-major
// swizzled operand ("not used, assumed to be 1": ignored). build/test_ptx on an H100/H200 decides.
uint32_t operand_address(const Descriptor& d, bool mn_major, int mn, int k) {
    const uint32_t w = (uint32_t)d.swizzle_bytes;
    uint32_t a;
    if (!mn_major && w == 0)
        a = d.start + mn / 8 * d.sbo + mn % 8 * 16 + k / 8 * d.lbo + k % 8 * 2;
    else if (!mn_major)
        a = d.start + mn / 8 * d.sbo + mn % 8 * w + k * 2;
    else if (w == 0)
        a = d.start + mn / 8 * d.sbo + mn % 8 * 2 + k / 8 * d.lbo + k % 8 * 16;
    else
        a = d.start + mn / (w / 2) * d.lbo + mn % (w / 2) * 2 + k / 8 * d.sbo + k % 8 * w;
    if (w) a ^= ((a >> 7) & (w / 16 - 1)) << 4;
    return a;
}

// The operand's element, from dynamic shared memory: a descriptor holds 18 bits of a shared address,
// which the emulator reads as an offset in the shared arena (whose shared window address is 2^31, 18
// low bits zero; the block's dynamic shared memory starts DYNAMIC_SHARED_OFFSET bytes in), so a
// wgmma operand must be there; outside the launch's dynamic shared memory it faults.
float operand_element(const Descriptor& d, bool mn_major, int mn, int k, const char* operand) {
    const uint32_t a = operand_address(d, mn_major, mn, k);  // from the arena's start
    if (a < DYNAMIC_SHARED_OFFSET || (size_t)a + 2 > DYNAMIC_SHARED_OFFSET + block_dynamic_shared_bytes()) {
        char message[200];
        snprintf(message, sizeof message,
                 "%s element (%d, %d) at shared offset %u lies beyond the block's %zu bytes of dynamic "
                 "shared memory",
                 operand, mn, k, a, block_dynamic_shared_bytes());
        device_fault("wgmma.mma_async", message);
    }
    uint16_t bits;
    memcpy(&bits, dynamic_shared_base() - DYNAMIC_SHARED_OFFSET + a, 2);
    return __bfloat162float(__ushort_as_bfloat16(bits));
}

// One warp's part of a wgmma: rows 16 q .. 16 q + 15 of D (q: the warp's place in its warpgroup),
// from the same rows of A and all of B. The register fragments (PTX ISA, "Matrix Fragments for
// wgmma.mma_async.m64nNk16", Figures 148 and 149), with g = lane / 4, t = lane % 4:
//   A: a[0]: row g, K 2t, 2t+1; a[1]: row g+8, same K; a[2]: row g, K 2t+8, 2t+9; a[3]: row g+8, same
//      (the lower K in the low half), rows counted from 16 q;
//   D: d[4j], d[4j+1]: row g, columns 8j+2t, 8j+2t+1; d[4j+2], d[4j+3]: row g+8, same columns,
//      for j = 0 .. N/8-1.
// Products of bf16 are exact in fp32; each output sums over K in order, from the accumulator (scale-d)
// or from 0.
void land(const WgmmaOp& op, int q) {
    float A[16][16], B[16][256];
    if (op.a_in_registers) {
        for (int l = 0; l < 32; l++) {
            const int g = l / 4, t = 2 * (l % 4);
            const uint32_t* a = op.a[l];
            A[g][t] = low_half(a[0]), A[g][t + 1] = high_half(a[0]);
            A[g + 8][t] = low_half(a[1]), A[g + 8][t + 1] = high_half(a[1]);
            A[g][t + 8] = low_half(a[2]), A[g][t + 9] = high_half(a[2]);
            A[g + 8][t + 8] = low_half(a[3]), A[g + 8][t + 9] = high_half(a[3]);
        }
    } else {
        const Descriptor da = decode_descriptor(op.desc_a, "wgmma.mma_async", "A");
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) A[r][k] = operand_element(da, op.trans_a, 16 * q + r, k, "A");
    }
    const Descriptor db = decode_descriptor(op.desc_b, "wgmma.mma_async", "B");
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < op.n; n++) B[k][n] = operand_element(db, op.trans_b, n, k, "B");
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = 2 * (l % 4);
        float* d = op.d[l];
        for (int j = 0; j < op.n / 8; j++)
            for (int i = 0; i < 4; i++) {
                const int row = g + 8 * (i / 2), col = 8 * j + t + i % 2;
                float sum = op.scale_d ? d[4 * j + i] : 0.0f;
                for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
                d[4 * j + i] = sum;
            }
    }
}

// The calling thread's warp, which must belong to a whole warpgroup of the block.
WgmmaWarp& this_warp(const char* what) {
    const int warp = current().warp;
    if ((warp / 4 + 1) * 128 > block_threads()) {
        char message[160];
        snprintf(message, sizeof message,
                 "warp %d is in warpgroup %d, which a block of %d threads does not hold whole (a warpgroup is 4 "
                 "consecutive warps from a multiple of 4)",
                 warp, warp / 4, block_threads());
        device_fault(what, message);
    }
    return wgmma_warp(warp);
}

struct WgmmaDeposit {
    WgmmaWarp* warp;
    float* d;
    const uint32_t* a;
    uint64_t desc_a, desc_b;
    uint32_t n;
    uint8_t a_in_registers, scale_d, trans_a, trans_b;
};
static_assert(sizeof(WgmmaDeposit) <= 64);

// At the warp's wgmma.mma_async, once every lane is there: the operation, checked against the
// warp's lanes and its warpgroup's other warps, lands now (every schedule but the forward one) or
// waits in the warp's current group for the wgmma.wait_group that retires it.
void mma_issue_combine(const unsigned char (*deposits)[64], unsigned char (*)[64]) {
    const char* what = "wgmma.mma_async";
    WgmmaDeposit lane[32];
    for (int l = 0; l < 32; l++) memcpy(&lane[l], deposits[l], sizeof lane[l]);
    const WgmmaDeposit& f = lane[0];
    WgmmaOp op;
    op.desc_a = f.a_in_registers ? 0 : f.desc_a, op.desc_b = f.desc_b, op.n = (int)f.n;
    op.a_in_registers = f.a_in_registers, op.scale_d = f.scale_d, op.trans_a = f.trans_a, op.trans_b = f.trans_b;
    for (int l = 0; l < 32; l++) {
        const WgmmaDeposit& x = lane[l];
        if (x.warp != f.warp || x.desc_b != f.desc_b || (!f.a_in_registers && x.desc_a != f.desc_a) || x.n != f.n ||
            x.a_in_registers != f.a_in_registers || x.scale_d != f.scale_d || x.trans_a != f.trans_a ||
            x.trans_b != f.trans_b)
            device_fault(what, "the lanes of a warp gave different descriptors, shapes or scale-d (.aligned)");
        op.a[l] = x.a, op.d[l] = x.d;
    }
    WgmmaWarp& w = *f.warp;
    if (!w.fenced) {
        char message[200];
        snprintf(message, sizeof message,
                 "no wgmma.fence before warp %d's first wgmma.mma_async (the PTX ISA requires one before the first "
                 "wgmma.mma_async of a warpgroup)",
                 w.warp);
        device_fault(what, message);
    }
    // The warpgroup's warps must issue the same sequence: the first to reach each one records it.
    WgmmaWarpgroup& group = wgmma_warpgroup(w.warp / 4);
    const WgmmaIssue issue{op.desc_a, op.desc_b,
                           (uint32_t)op.n | (uint32_t)op.a_in_registers << 16 | (uint32_t)op.scale_d << 17 |
                               (uint32_t)op.trans_a << 18 | (uint32_t)op.trans_b << 19};
    const uint64_t index = w.issued++;
    if (index - group.first < group.issues.size()) {
        if (!(group.issues[index - group.first] == issue)) {
            char message[240];
            snprintf(message, sizeof message,
                     "warp %d's wgmma.mma_async number %llu differs from another warp's of its warpgroup (shape, "
                     "A in registers or not, scale-d, transposes or descriptors; .aligned, and a descriptor must be "
                     "the same across the warpgroup)",
                     w.warp, (unsigned long long)index);
            device_fault(what, message);
        }
    } else {
        group.issues.push_back(issue);
    }
    uint64_t all_issued = w.issued;
    for (int i = 0; i < 4; i++) all_issued = std::min(all_issued, wgmma_warp(w.warp / 4 * 4 + i).issued);
    for (; group.first < all_issued; group.first++) group.issues.pop_front();
    if (copies_land_at_issue())
        land(op, w.warp % 4);
    else
        w.pending.push_back(op);
}

void issue(const WgmmaDeposit& mine) {
    char none;
    warp_combine(FULL_MASK, &mine, sizeof mine, &none, 0, "wgmma.mma_async", mma_issue_combine);
}

void check_shape(int n) {
    if (n < 8 || n > 256 || n % 8 != 0) device_fault("wgmma.mma_async", "N must be a multiple of 8 in [8, 256]");
}

// fence, commit_group and wait_group: .sync makes each a warp collective; the deposit is the warp's
// state (and wait_group's N, which must agree).
struct WarpDeposit {
    WgmmaWarp* warp;
    int n;
};
WarpDeposit warp_deposit(const unsigned char (*deposits)[64], const char* what) {
    WarpDeposit first, other;
    memcpy(&first, deposits[0], sizeof first);
    for (int l = 1; l < 32; l++) {
        memcpy(&other, deposits[l], sizeof other);
        if (other.warp != first.warp || other.n != first.n)
            device_fault(what, "the lanes of a warp gave different operands (.aligned)");
    }
    return first;
}
WgmmaWarp& warp_of(const unsigned char (*deposits)[64], const char* what) { return *warp_deposit(deposits, what).warp; }

void fence_combine(const unsigned char (*deposits)[64], unsigned char (*)[64]) {
    warp_of(deposits, "wgmma.fence").fenced = true;
}
void commit_combine(const unsigned char (*deposits)[64], unsigned char (*)[64]) {
    WgmmaWarp& w = warp_of(deposits, "wgmma.commit_group");
    w.group_ends.push_back(w.pending.size());
}
// Lands every group but the `pending` most recent committed ones, oldest first.
void wait_combine(const unsigned char (*deposits)[64], unsigned char (*)[64]) {
    const WarpDeposit mine = warp_deposit(deposits, "wgmma.wait_group");
    WgmmaWarp& w = *mine.warp;
    const size_t pending = (size_t)mine.n;
    const size_t groups = w.group_ends.size();
    if (groups <= pending) return;
    const size_t done_groups = groups - pending;
    const size_t done_ops = w.group_ends[done_groups - 1];
    for (size_t i = 0; i < done_ops; i++) land(w.pending[i], w.warp % 4);
    w.pending.erase(w.pending.begin(), w.pending.begin() + (ptrdiff_t)done_ops);
    w.group_ends.erase(w.group_ends.begin(), w.group_ends.begin() + (ptrdiff_t)done_groups);
    for (size_t& end : w.group_ends) end -= done_ops;
}

void warp_step(const char* what, int n, WarpCombine combine) {
    const WarpDeposit mine{&this_warp(what), n};
    char none;
    warp_combine(FULL_MASK, &mine, sizeof mine, &none, 0, what, combine);
}

}  // namespace

void wgmma_fence() { warp_step("wgmma.fence", 0, fence_combine); }
void wgmma_commit_group() { warp_step("wgmma.commit_group", 0, commit_combine); }
void wgmma_wait_group(int pending) {
    if (pending < 0) device_fault("wgmma.wait_group", "N must not be negative");
    warp_step("wgmma.wait_group", pending, wait_combine);
}

void wgmma_mma_async(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b) {
    const char* what = "wgmma.mma_async";
    check_shape(n);
    (void)decode_descriptor(desc_a, what, "A");
    (void)decode_descriptor(desc_b, what, "B");
    issue(WgmmaDeposit{&this_warp(what), d, nullptr, desc_a, desc_b, (uint32_t)n, 0, scale_d, trans_a, trans_b});
}

void wgmma_mma_async_rs(float* d, int n, const uint32_t* a, uint64_t desc_b, bool scale_d, bool trans_b) {
    const char* what = "wgmma.mma_async";
    check_shape(n);
    (void)decode_descriptor(desc_b, what, "B");
    issue(WgmmaDeposit{&this_warp(what), d, a, 0, desc_b, (uint32_t)n, 1, scale_d, 0, trans_b});
}

void wgmma_check_descriptor(uint32_t shared_address, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    const char* what = "wgmma descriptor";
    // shared_window_base(): the arena at 2^31, the block's dynamic shared memory a little after it
    const uint32_t dynamic_start = (1u << 31) + DYNAMIC_SHARED_OFFSET;
    if (shared_address < dynamic_start || shared_address - dynamic_start >= block_dynamic_shared_bytes())
        device_fault(what,
                     "the operand is not in the block's dynamic shared memory: the emulator reads a descriptor's 18 "
                     "address bits as an offset there (dynamic_shared_memory<T>())");
    if ((shared_address | lbo_bytes | sbo_bytes) % 16 != 0)
        device_fault(what, "the start address and the byte offsets must be multiples of 16");
    if (lbo_bytes >> 18 || sbo_bytes >> 18) device_fault(what, "a byte offset beyond the field's 18 bits");
}

}  // namespace emu::ptx

// ---- mbarrier and TMA ----

namespace emu::ptx {

namespace {

// The ISA's ranges: the expected count 1 .. 2^20 - 1, the tx-count -(2^20 - 1) .. 2^20 - 1.
constexpr int64_t MBARRIER_MAX = (1 << 20) - 1;

[[noreturn]] void barrier_fault(const char* what, const void* bar, const char* format, long long a = 0,
                                long long b = 0) {
    char detail[300], message[400];
    snprintf(detail, sizeof detail, format, a, b);
    snprintf(message, sizeof message, "the mbarrier at %p: %s", bar, detail);
    device_fault(what, message);
}

void check_barrier_address(const void* bar, const char* what) {
    if (!in_shared_memory(bar, 8))
        barrier_fault(what, bar, "not in shared memory (an mbarrier object lives in .shared::cta)");
    if (reinterpret_cast<uintptr_t>(bar) % 8 != 0) barrier_fault(what, bar, "not 8-byte aligned");
}

Mbarrier& barrier_at(const void* bar, const char* what) {
    check_barrier_address(bar, what);
    Mbarrier* b = find_mbarrier(bar);
    if (!b) barrier_fault(what, bar, "used before mbarrier.init (in this block)");
    return *b;
}

// After an arrival or a transaction: the phase completes when nothing is pending.
void settle(Mbarrier& b, const void* bar, const char* what) {
    if (b.tx < -MBARRIER_MAX || b.tx > MBARRIER_MAX)
        barrier_fault(what, bar, "tx-count %lld beyond the ISA's range of +-(2^20 - 1)", (long long)b.tx);
    if (b.pending == 0 && b.tx < 0)
        barrier_fault(what, bar,
                      "tx-count underflow: %lld more bytes completed than expect_tx announced, with no arrival "
                      "pending (the phase can never complete)",
                      -(long long)b.tx);
    if (b.pending == 0 && b.tx == 0) {
        release_mbarrier_waiters(b, (uint32_t)(b.phase & 1));
        b.phase++, b.pending = b.expected;
    }
}

void arrive(void* bar, uint32_t expect_bytes, const char* what) {
    Mbarrier& b = barrier_at(bar, what);
    if (b.pending == 0)
        barrier_fault(what, bar,
                      "arrive count underflow: no arrival is pending (all %lld have arrived; the phase waits only "
                      "for its transactions)",
                      (long long)b.expected);
    b.tx += expect_bytes;
    b.pending--;
    settle(b, bar, what);
}

uint32_t swizzled(uint32_t address, uint32_t swizzle_bytes) {
    return swizzle_bytes ? address ^ ((address >> 7) & (swizzle_bytes / 16 - 1)) << 4 : address;
}

// The copy's box, read from global memory now, into shared memory.
void land(const PendingTensorCopy& c) {
    const TensorMap& m = c.map;
    const uint32_t eb = m.element_bytes, row_bytes = m.box[0] * eb;
    for (uint32_t r = 0; r < m.box[1]; r++)
        for (uint32_t col = 0; col < m.box[0]; col++) {
            const int64_t gx = (int64_t)c.x + col, gy = (int64_t)c.y + r;
            unsigned char* to = static_cast<unsigned char*>(shared_pointer(swizzled(c.dst + r * row_bytes + col * eb,
                                                                                    m.swizzle_bytes)));
            if (gx < 0 || gy < 0 || (uint64_t)gx >= m.dims[0] || (uint64_t)gy >= m.dims[1])
                memset(to, 0, eb);
            else
                memcpy(to, m.base + (uint64_t)gy * m.row_stride + (uint64_t)gx * eb, eb);
        }
}

int64_t box_bytes(const TensorMap& m) { return (int64_t)m.box[0] * m.box[1] * m.element_bytes; }

void complete_tx(Mbarrier& b, const void* bar, int64_t bytes) {
    b.tx -= bytes;
    settle(b, bar, "cp.async.bulk.tensor (complete_tx)");
}

}  // namespace

void mbarrier_init(void* bar, uint32_t count) {
    const char* what = "mbarrier.init";
    check_barrier_address(bar, what);
    if (count < 1 || count > MBARRIER_MAX)
        barrier_fault(what, bar, "expected arrival count %lld outside 1 .. 2^20 - 1", (long long)count);
    if (const Mbarrier* old = find_mbarrier(bar); old && !old->copies.empty())
        barrier_fault(what, bar, "initialised again while %lld bulk copies on it are in flight",
                      (long long)old->copies.size());
    Mbarrier& b = new_mbarrier(bar);
    b.expected = b.pending = count;
}

void mbarrier_arrive(void* bar) { arrive(bar, 0, "mbarrier.arrive"); }

void mbarrier_arrive_expect_tx(void* bar, uint32_t bytes) {
    if (bytes > MBARRIER_MAX)
        barrier_fault("mbarrier.arrive.expect_tx", bar, "txCount %lld beyond 2^20 - 1", (long long)bytes);
    arrive(bar, bytes, "mbarrier.arrive.expect_tx");
}

bool mbarrier_try_wait_parity(void* bar, uint32_t parity) {
    const char* what = "mbarrier.try_wait.parity";
    Mbarrier& b = barrier_at(bar, what);
    if (parity > 1) barrier_fault(what, bar, "phaseParity %lld: the operand is a parity, 0 or 1", (long long)parity);
    if (!mbarrier_ready(b, parity)) wait_mbarrier(b, parity, bar);
    return true;
}

void tma_copy_2d(void* dst, const void* tensor_map, int x, int y, void* bar) {
    const char* what = "cp.async.bulk.tensor.2d";
    TensorMap m;
    memcpy(&m, tensor_map, sizeof m);
    if (m.magic != TensorMap::MAGIC)
        device_fault(what, "the tensor map was not made by cuTensorMapEncodeTiled (the emulator's, through "
                           "cudaGetDriverEntryPoint): its opaque bytes hold no tensor map");
    char message[300];
    const int64_t bytes = box_bytes(m);
    const uint32_t alignment = m.swizzle_bytes ? 8 * m.swizzle_bytes : 128;
    if (!in_shared_memory(dst, (size_t)((bytes + 127) / 128 * 128))) {
        snprintf(message, sizeof message, "the destination %p (%lld bytes) is not in the block's shared memory", dst,
                 (long long)bytes);
        device_fault(what, message);
    }
    const uint32_t dst_address = (uint32_t)__cvta_generic_to_shared(dst);
    if (dst_address % alignment != 0) {
        snprintf(message, sizeof message,
                 "the destination (shared address 0x%x) is not %u-byte aligned (the ISA: 128 bytes; with a %u-byte "
                 "swizzle the emulator requires its pattern's %u-byte boundary)",
                 dst_address, alignment, m.swizzle_bytes, alignment);
        device_fault(what, message);
    }
    // The ISA fills a box's out-of-bound elements with zeros, and an H200 does so for boxes partly
    // past either end or before the start (2026-11-28); one wholly outside the tensor (there: 4 x 16 at
    // column 100 of 72) stopped the kernel with "illegal instruction", so here it is a fault too.
    const bool outside = (int64_t)x >= (int64_t)m.dims[0] || (int64_t)y >= (int64_t)m.dims[1] ||
                         (int64_t)x + m.box[0] <= 0 || (int64_t)y + m.box[1] <= 0;
    if (outside) {
        snprintf(message, sizeof message,
                 "the box of %u x %u elements at (x %d, y %d) lies wholly outside the %llu x %llu tensor (an H200 "
                 "faults with \"illegal instruction\")",
                 m.box[1], m.box[0], x, y, (unsigned long long)m.dims[1], (unsigned long long)m.dims[0]);
        device_fault(what, message);
    }
    Mbarrier& b = barrier_at(bar, what);
    const PendingTensorCopy copy{dst_address, m, x, y};
    if (copies_land_at_issue()) {
        land(copy);
        complete_tx(b, bar, bytes);
    } else {
        b.copies.push_back(copy);
    }
}

namespace {

struct SetmaxnregDeposit {
    WgmmaWarp* warp;
    int regs;  // +REGS: .inc, -REGS: .dec
};

void setmaxnreg_combine(const unsigned char (*deposits)[64], unsigned char (*)[64]) {
    SetmaxnregDeposit first, other;
    memcpy(&first, deposits[0], sizeof first);
    for (int l = 1; l < 32; l++) {
        memcpy(&other, deposits[l], sizeof other);
        if (other.warp != first.warp || other.regs != first.regs)
            device_fault("setmaxnreg", "the lanes of a warp executed different setmaxnreg instructions (.aligned)");
    }
    first.warp->setmaxnreg.push_back(first.regs);
}

}  // namespace

void setmaxnreg(int regs, bool increase) {
    const char* what = increase ? "setmaxnreg.inc" : "setmaxnreg.dec";
    if (regs < 24 || regs > 256 || regs % 8 != 0)
        device_fault(what, "the register count must be a multiple of 8 in [24, 256]");
    const SetmaxnregDeposit mine{&this_warp(what), increase ? regs : -regs};
    char none;
    warp_combine(FULL_MASK, &mine, sizeof mine, &none, 0, what, setmaxnreg_combine);
}

}  // namespace emu::ptx

namespace emu {

bool mbarrier_ready(Mbarrier& b, uint32_t parity) {
    if ((b.phase & 1) != parity) return true;
    // The forward schedule's copies land now if only they keep the phase from completing.
    if (b.pending == 0 && !b.copies.empty()) {
        std::vector<PendingTensorCopy> copies;
        copies.swap(b.copies);
        for (const PendingTensorCopy& c : copies) {
            ptx::land(c);
            ptx::complete_tx(b, b.address, ptx::box_bytes(c.map));
        }
    }
    return (b.phase & 1) != parity;
}

}  // namespace emu
