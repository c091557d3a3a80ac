// On-disk format of a BlockStore table (format version 1). All integers little-endian.
//
// Main file:
//   [0, B)                  header block (TableHeader, crc32c-protected)
//   [map_offset, +map_pages*B)  location map: one u64 per row = slot + 1 (0: never written),
//                           packed EntriesPerMapPage() to a page, each page ending in a
//                           MapPageFooter (magic, crc32c, page index)
//   [log_offset, ...)       the log (unless striped over other files): num_segments
//                           segments of segment_blocks blocks of B bytes
// A log block holds rows_per_block rows packed from offset 0, then the row id of each slot
// (u64, kEmptySlot when unused), then a LogBlockFooter (magic, crc32c, table uuid, block
// index). A row wider than one block spans blocks_per_row consecutive blocks, each holding
// a chunk, the row id and a footer. Blocks that were never written are all zeros (holes of
// a sparse file) and are never referenced by the map.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace mtrains {

constexpr char kTableMagic[8] = {'M', 'T', 'R', 'N', 'B', 'L', 'K', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kLogBlockMagic = 0x4B4C4247;  // "GBLK"
constexpr uint32_t kMapPageMagic = 0x5041504D;   // "MPAP"
constexpr uint64_t kEmptySlot = ~0ull;
constexpr uint32_t kLogFooterBytes = 24;
constexpr uint32_t kMapFooterBytes = 16;

enum class DType : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
uint32_t DTypeBytes(DType d);
const char* DTypeName(DType d);

// Everything that describes a table; persisted in the header block.
struct TableHeader {
  uint64_t num_rows = 0;
  uint32_t dim = 0;
  uint32_t state_dim = 0;
  DType dtype = DType::kFloat32;
  uint32_t block_size = 4096;
  uint64_t seed = 0;
  double init_lo = -0.01, init_hi = 0.01;
  uint32_t segment_blocks = 256;
  uint64_t num_segments = 0;
  uint64_t table_uuid = 0;
  std::vector<std::string> stripe_paths;  // empty: the log lives in the main file

  // Derived layout (computed by ComputeLayout, not trusted from disk).
  uint32_t row_bytes = 0;       // (dim + state_dim) * dtype size
  uint32_t rows_per_block = 0;  // >= 1 when rows are packed; 0 when a row spans blocks
  uint32_t blocks_per_row = 1;  // blocks per slot (1 when packed)
  uint64_t slots_per_segment = 0;
  uint64_t map_offset = 0, map_pages = 0, log_offset = 0;

  uint64_t SegmentBytes() const { return uint64_t(segment_blocks) * block_size; }
  uint64_t LogBytes() const { return num_segments * SegmentBytes(); }
  // Size the main file is truncated to (sparse).
  uint64_t MainFileBytes() const {
    return stripe_paths.empty() ? log_offset + LogBytes() : log_offset;
  }
  uint64_t EntriesPerMapPage() const { return (block_size - kMapFooterBytes) / 8; }
};

// Validates the user-facing fields and fills the derived ones. `overprovision` (>= 0.1)
// sizes the log relative to the space all rows need (ignored when num_segments is set).
// Returns InvalidArgument naming the field on bad values.
Status ComputeLayout(TableHeader* h, double overprovision);

// Serialises the header into one block of h.block_size bytes. Fails (InvalidArgument)
// when the stripe paths do not fit in the header's 4 KiB.
Status EncodeHeader(const TableHeader& h, uint8_t* block);
// Parses and validates a header read from the first `len` bytes of a file. Never reads
// past `len`; returns FormatError / Corruption naming the bad field on any inconsistency.
Status DecodeHeader(const uint8_t* data, size_t len, TableHeader* h);

// Seals a log block: writes the footer (magic, uuid, index) and its crc32c.
void SealLogBlock(uint8_t* block, uint32_t block_size, uint64_t uuid, uint64_t block_index);
// Verifies a log block read back from disk.
Status VerifyLogBlock(const uint8_t* block, uint32_t block_size, uint64_t uuid,
                      uint64_t block_index);

// Seals / verifies a map page (an all-zero page is valid: it was never written).
void SealMapPage(uint8_t* page, uint32_t block_size, uint64_t uuid, uint64_t page_index);
Status VerifyMapPage(const uint8_t* page, uint32_t block_size, uint64_t uuid,
                     uint64_t page_index, bool* never_written);

}  // namespace mtrains
