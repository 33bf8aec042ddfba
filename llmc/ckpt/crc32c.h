// ckpt/crc32c.h: CRC32C (Castagnoli), the checksum of every checkpoint file.
//
// CRC32C because x86 (SSE4.2) and ARM (CRC extension) compute it in hardware at several GB/s, so
// checksumming a checkpoint costs far less than writing it; the same checksum as iSCSI, ext4 and
// Google's storage stack, so other tools can verify a file (e.g. Python's `crc32c` package). Where
// the instruction is missing, a table-driven software path gives the same value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace llmc {

namespace detail {

// The reflected polynomial 0x82F63B78, one table of 256 entries: the byte-at-a-time software path.
inline const std::array<uint32_t, 256>& crc32c_table() {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    return table;
}

inline uint32_t crc32c_software(uint32_t state, const uint8_t* p, size_t n) {
    const std::array<uint32_t, 256>& t = crc32c_table();
    for (size_t i = 0; i < n; i++) state = t[(state ^ p[i]) & 0xFF] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline uint32_t crc32c_sse42(uint32_t state, const uint8_t* p, size_t n) {
    uint64_t s = state;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        std::memcpy(&word, p, 8);
        s = _mm_crc32_u64(s, word);
    }
    uint32_t s32 = (uint32_t)s;
    for (; n > 0; p++, n--) s32 = _mm_crc32_u8(s32, *p);
    return s32;
}
inline bool cpu_has_sse42() {
    static const bool has = __builtin_cpu_supports("sse4.2");
    return has;
}
#endif

}  // namespace detail

// Extends a CRC32C over n more bytes: crc32c(crc32c(0, a), b) == crc32c(0, a followed by b), so a
// file can be checksummed chunk by chunk as it is written. crc32c(0, "123456789") == 0xE3069283.
// force_software: the table path even where the instruction exists (to test that both agree).
inline uint32_t crc32c(uint32_t crc, const void* data, size_t n, bool force_software = false) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    uint32_t state = ~crc;
#if defined(__x86_64__)
    if (!force_software && detail::cpu_has_sse42()) return ~detail::crc32c_sse42(state, p, n);
#endif
    (void)force_software;
    return ~detail::crc32c_software(state, p, n);
}

}  // namespace llmc
