// Deterministic initial values of rows that were never written, and dtype conversion.
//
// Weight j of row r is lo + (hi - lo) * u, where u in [0, 1) is the top 24 bits of
// SplitMix64(seed, r, j): a pure function of (seed, row, column), so a 1 TB table needs no
// initialisation pass and reads the same values in every process and after every reopen.
// Optimizer-state values start at zero.
#pragma once

#include <cstdint>

#include "storage/block_format.h"

namespace mtrains {

// Fills `out` (row_bytes of `dtype`) with the initial value of row `row`.
void LazyInitRow(uint64_t seed, uint64_t row, double lo, double hi, uint32_t dim,
                 uint32_t state_dim, DType dtype, uint8_t* out);

// IEEE float32 -> float16 / bfloat16 with round-to-nearest-even.
uint16_t FloatToHalf(float f);
uint16_t FloatToBFloat16(float f);
// IEEE float16 -> float32 (exact).
float HalfToFloat(uint16_t h);

}  // namespace mtrains
