#include "common/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mtrains {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t SoftwareCrc(uint32_t crc, const uint8_t* p, size_t len) {
  static const Table table;
  for (size_t i = 0; i < len; ++i) crc = table.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle: one
// dependent chain runs at a third of the instruction's rate, three independent chains over
// adjacent stretches at nearly all of it (a 4 KiB block: about 3x faster), joined by
// shifting the earlier chains' registers over the later stretches' length (ShiftTable).
// Long buffers take 256-byte stretches; an embedding row (a few hundred bytes: 516 for 128
// fp32 weights and a state) takes 128-byte ones for its first 384 bytes.
constexpr size_t kStride = 256;
constexpr size_t kRowStride = 128;

__attribute__((target("sse4.2"))) uint32_t SingleStream(uint32_t crc, const uint8_t* p,
                                                         size_t len) {
  uint64_t c = crc;
  while (len >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    len -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (len--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// The CRC register is linear over GF(2): running it over `Stride` zero bytes from state x
// gives the xor of that run from each of x's bytes alone, tabulated per byte position.
template <size_t Stride>
struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    static const uint8_t zeros[Stride] = {};
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = SingleStream(b << (8 * k), zeros, Stride);
  }
  uint32_t Shift(uint32_t x) const {
    return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24];
  }
};

// One block of three adjacent `Stride`-byte stretches from `crc`: the CRC after them.
template <size_t Stride>
__attribute__((target("sse4.2"))) inline uint32_t ThreeStreams(uint32_t crc, const uint8_t* p) {
  static const ShiftTable<Stride> shift;
  uint64_t c0 = crc, c1 = 0, c2 = 0;
  for (size_t i = 0; i < Stride; i += 8) {
    uint64_t v0, v1, v2;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p + Stride + i, 8);
    std::memcpy(&v2, p + 2 * Stride + i, 8);
    c0 = _mm_crc32_u64(c0, v0);
    c1 = _mm_crc32_u64(c1, v1);
    c2 = _mm_crc32_u64(c2, v2);
  }
  // crc over A|B|C = shift(shift(crc over A) ^ crc0 over B) ^ crc0 over C.
  return shift.Shift(shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
         static_cast<uint32_t>(c2);
}

__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t crc, const uint8_t* p,
                                                        size_t len) {
  while (len >= 3 * kStride) {
    crc = ThreeStreams<kStride>(crc, p);
    p += 3 * kStride;
    len -= 3 * kStride;
  }
  if (len >= 3 * kRowStride) {
    crc = ThreeStreams<kRowStride>(crc, p);
    p += 3 * kRowStride;
    len -= 3 * kRowStride;
  }
  return SingleStream(crc, p, len);
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~HardwareCrc(crc, p, len);
#endif
  return ~SoftwareCrc(crc, p, len);
}

}  // namespace mtrains
