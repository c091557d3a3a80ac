// SlotRows: one table's cache slots in the FBGEMM TBE, as the row mover sees them.
//
// The TBE keeps a table's weights and its optimizer state in two tensors; a store row is
// the slot's weight bytes followed by its state bytes (torchrec_mtrains/layout.py). These
// helpers move a row between the two forms without an intermediate buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/crc32c.h"

namespace mtrains {

struct SlotRows {
  uint8_t* weights = nullptr;
  size_t weight_bytes = 0;  // per slot
  uint8_t* state = nullptr;  // null when the optimizer keeps no state
  size_t state_bytes = 0;   // per slot
  int64_t slots = 0;        // slots the TBE has (overflow slots past it are not here)

  size_t row_bytes() const { return weight_bytes + state_bytes; }
  uint8_t* weights_of(int64_t slot) const { return weights + size_t(slot) * weight_bytes; }
  uint8_t* state_of(int64_t slot) const { return state + size_t(slot) * state_bytes; }

  // row = weights[slot] ++ state[slot].
  void CopyOut(int64_t slot, uint8_t* row) const {
    std::memcpy(row, weights_of(slot), weight_bytes);
    if (state_bytes) std::memcpy(row + weight_bytes, state_of(slot), state_bytes);
  }
  // weights[slot] ++ state[slot] = row.
  void CopyIn(const uint8_t* row, int64_t slot) const {
    std::memcpy(weights_of(slot), row, weight_bytes);
    if (state_bytes) std::memcpy(state_of(slot), row + weight_bytes, state_bytes);
  }
  // crc32c of the slot's row bytes (weights then state), as if they were contiguous.
  uint32_t Crc(int64_t slot) const {
    const uint32_t c = Crc32c(0, weights_of(slot), weight_bytes);
    return state_bytes ? Crc32c(c, state_of(slot), state_bytes) : c;
  }
  // The tier movers' locality (a few rows ahead of each copy): into L2, since a row is many lines
  // and those rows' lines into L1 would fill its few miss buffers and stall the prefetches.
  static constexpr int kMoveLocality = 1;

  // Asks for the cache lines of the slot's row (a few rows ahead of a copy). kLocality is
  // __builtin_prefetch's: 3 into L1; 1 into L2, for loops that fetch many lines a row, which
  // would fill L1's few miss buffers and wait on them.
  template <int kLocality = 3>
  void Prefetch(int64_t slot, bool for_write) const {
    PrefetchBytes<kLocality>(weights_of(slot), weight_bytes, for_write);
    if (state_bytes) PrefetchBytes<kLocality>(state_of(slot), state_bytes, for_write);
  }

  template <int kLocality = 3>
  static void PrefetchBytes(const uint8_t* p, size_t bytes, bool for_write) {
    for (size_t b = 0; b < bytes; b += 64) {
      if (for_write) {
        __builtin_prefetch(p + b, 1, kLocality);
      } else {
        __builtin_prefetch(p + b, 0, kLocality);
      }
    }
    if (bytes) {
      if (for_write) {
        __builtin_prefetch(p + bytes - 1, 1, kLocality);
      } else {
        __builtin_prefetch(p + bytes - 1, 0, kLocality);
      }
    }
  }
};

}  // namespace mtrains
