#include "storage/lazy_init.h"

#include <cstring>

namespace mtrains {
namespace {

inline uint64_t Mix(uint64_t z) {  // SplitMix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) return sign | (abs > 0x7F800000 ? 0x7E00 : 0x7C00);  // NaN / inf
  if (abs >= 0x477FF000) return sign | 0x7C00;  // overflows to inf
  if (abs < 0x38800000) {                        // subnormal or zero in half
    if (abs < 0x33000000) return sign;
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const int shift = 126 - int(abs >> 23);  // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return sign | h;
  }
  uint32_t h = ((abs - 0x38000000) >> 13);
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | h;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t x;
  if (exp == 0x1F) {
    x = sign | 0x7F800000 | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    x = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else if (mant == 0) {
    x = sign;  // zero
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    x = sign | (uint32_t(112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (x >> 16) | 0x40;  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Writes the row's `dim` uniform values through `put(j, v)`: one loop per dtype, so the
// fp32 one has no branch inside and the compiler vectorises it.
template <typename Put>
void UniformValues(uint64_t base, float flo, float span, uint32_t dim, Put put) {
  for (uint32_t j = 0; j < dim; ++j) {
    const uint64_t r = Mix(base + (uint64_t(j) + 1) * 0x9E3779B97F4A7C15ull);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    put(j, flo + span * u);
  }
}

}  // namespace

void LazyInitRow(uint64_t seed, uint64_t row, double lo, double hi, uint32_t dim,
                 uint32_t state_dim, DType dtype, uint8_t* out) {
  const uint64_t base = Mix(seed ^ 0x9E3779B97F4A7C15ull) ^ Mix(row + 0x632BE59BD9B4E019ull);
  const float span = static_cast<float>(hi - lo), flo = static_cast<float>(lo);
  switch (dtype) {
    case DType::kFloat32:
      UniformValues(base, flo, span, dim, [out](uint32_t j, float v) { std::memcpy(out + 4 * j, &v, 4); });
      break;
    case DType::kFloat16:
      UniformValues(base, flo, span, dim, [out](uint32_t j, float v) {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(out + 2 * j, &h, 2);
      });
      break;
    case DType::kBFloat16:
      UniformValues(base, flo, span, dim, [out](uint32_t j, float v) {
        const uint16_t b = FloatToBFloat16(v);
        std::memcpy(out + 2 * j, &b, 2);
      });
      break;
  }
  std::memset(out + size_t(dim) * DTypeBytes(dtype), 0, size_t(state_dim) * DTypeBytes(dtype));
}

}  // namespace mtrains
