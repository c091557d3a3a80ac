// CRC-32C (Castagnoli), the checksum of every block the store writes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mtrains {

// Extends `crc` over `len` bytes at `data`. Start with crc = 0. Uses the SSE4.2 crc32
// instruction when the CPU has it, a table otherwise; both give identical results.
// Thread-safe.
uint32_t Crc32c(uint32_t crc, const void* data, size_t len);

}  // namespace mtrains
