// On-disk format of a BlockStore table (format version 2). All integers little-endian.
//
// Main file:
//   [0, B)                  header block (TableHeader, crc32c-protected)
//   [map_offset, +map_pages*B)  location-map checkpoint: one u64 per row = slot + 1 (0: never
//                           written), packed EntriesPerMapPage() to a page, each page ending
//                           in a MapPageFooter (magic, crc32c, page index)
//   [log_offset, ...)       the log (unless striped over other files): num_segments
//                           segments of segment_blocks blocks of B bytes
//   [journal_offset, +journal_bytes)  the map journal (right after the log, or at log_offset
//                           when the log is striped): a descriptor block (magic, crc32c,
//                           uuid, epoch, flags: 1 while a checkpoint rewrites map pages),
//                           then journal blocks of kJournalBlockBytes, each a
//                           JournalBlockHeader and delta-coded (row, slot + 1) records. The
//                           map is the checkpoint with the current epoch's complete commits
//                           replayed over it (map_journal.h).
// Version 1 had no journal region (the map pages were the whole map); it is refused.
// A log block holds rows_per_block rows packed from offset 0, then the row id of each slot
// (u64, kEmptySlot when unused), then a LogBlockFooter (magic, crc32c, table uuid, block
// index). A row wider than one block spans blocks_per_row consecutive blocks, each holding
// a chunk, the row id and a footer. BlockGeometry (below) is the one place that turns
// these rules into numbers. Blocks that were never written are all zeros (holes of a
// sparse file) and are never referenced by the map.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace mtrains {

constexpr char kTableMagic[8] = {'M', 'T', 'R', 'N', 'B', 'L', 'K', '1'};
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kLogBlockMagic = 0x4B4C4247;  // "GBLK"
constexpr uint32_t kMapPageMagic = 0x5041504D;   // "MPAP"
constexpr uint64_t kEmptySlot = ~0ull;
constexpr uint32_t kLogFooterBytes = 24;
constexpr uint32_t kMapFooterBytes = 16;
constexpr uint32_t kJournalMagic = 0x4C4E524A;      // "JRNL"
constexpr uint32_t kJournalDescMagic = 0x4353444A;  // "JDSC"
constexpr uint32_t kJournalBlockBytes = 4096;
constexpr uint32_t kJournalHeaderBytes = 56;

enum class DType : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
uint32_t DTypeBytes(DType d);
const char* DTypeName(DType d);

// Where rows sit in the log's blocks. Slots are numbered over the whole log: when rows are
// packed (rows_per_block >= 1), slot s is entry s % rows_per_block of block
// s / rows_per_block; when a row spans blocks, slot s fills blocks [s * blocks_per_row,
// (s + 1) * blocks_per_row). Inside a block, entry k's row starts at byte k * row_bytes
// (a spanning row's chunk at 0), the row ids of its IdsPerBlock() entries end where the
// footer starts, and the bytes between the last row and the first id are zero padding.
struct BlockGeometry {
  uint32_t block_size = 0;      // bytes per block
  uint32_t row_bytes = 0;       // bytes per row
  uint32_t rows_per_block = 0;  // >= 1 when rows are packed; 0 when a row spans blocks
  uint32_t blocks_per_row = 1;  // blocks per slot (1 when packed)

  // The geometry of rows of `row_bytes` (>= 1) in blocks of `block_size` bytes (>= 4096).
  static BlockGeometry Of(uint32_t row_bytes, uint32_t block_size);

  bool packed() const { return rows_per_block >= 1; }
  // Row-id entries of a block: rows_per_block, or 1 (a spanning row's id, in each block).
  uint32_t IdsPerBlock() const { return packed() ? rows_per_block : 1; }
  // Bytes of a spanning row held by each of its blocks (the last one holds the rest).
  uint32_t ChunkBytes() const { return block_size - kLogFooterBytes - 8; }
  // Offsets in a block of entry `index`'s row and of its row id.
  uint32_t RowOffset(uint32_t index) const { return index * row_bytes; }
  uint32_t IdOffset(uint32_t index) const {
    return block_size - kLogFooterBytes - 8 * (IdsPerBlock() - index);
  }

  // The first block of `slot`, and the slot's entry in that block (0 for a spanning row).
  uint64_t BlockOfSlot(uint64_t slot) const {
    return packed() ? slot / rows_per_block : slot * blocks_per_row;
  }
  uint32_t IndexInBlock(uint64_t slot) const {
    return packed() ? static_cast<uint32_t>(slot % rows_per_block) : 0;
  }
  // The slot of entry `index` of `block` (a spanning row's first block, index 0).
  uint64_t SlotAt(uint64_t block, uint32_t index) const {
    return packed() ? block * rows_per_block + index : block / blocks_per_row;
  }
  // Whole slots in `blocks` consecutive blocks that start at a slot boundary.
  uint64_t SlotsIn(uint64_t blocks) const {
    return packed() ? blocks * rows_per_block : blocks / blocks_per_row;
  }
  // `blocks` rounded up to whole slots.
  uint64_t WholeSlotBlocks(uint64_t blocks) const {
    return (blocks + blocks_per_row - 1) / blocks_per_row * blocks_per_row;
  }
};

// Writes row `row` (geometry.row_bytes at `data`) as entry `index` of the packed block at
// `blocks`, or, for a spanning row (index 0), into its blocks_per_row blocks at `blocks`.
// Entry 0 first zeroes the block(s) and, packed, marks every entry empty. Sealing is the
// caller's.
void PutRow(const BlockGeometry& g, uint8_t* blocks, uint32_t index, uint64_t row,
            const uint8_t* data);
// The row id stored for entry `index` of `block` (kEmptySlot when unused).
uint64_t RowIdAt(const BlockGeometry& g, const uint8_t* block, uint32_t index);
// Copies the row at `slot` out of its blocks (`blocks`: the slot's first block onwards),
// checking that they hold row `row`; Corruption naming the block otherwise.
Status GetRow(const BlockGeometry& g, const uint8_t* blocks, uint64_t slot, uint64_t row,
              uint8_t* out);

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
  BlockGeometry geometry;  // rows in blocks, from (dim + state_dim) * dtype size
  uint64_t slots_per_segment = 0;
  uint64_t map_offset = 0, map_pages = 0, log_offset = 0;
  uint64_t journal_offset = 0, journal_bytes = 0;

  uint64_t SegmentBytes() const { return uint64_t(segment_blocks) * block_size; }
  uint64_t LogBytes() const { return num_segments * SegmentBytes(); }
  // Slots of the whole log, and the segments that hold every row once.
  uint64_t LogSlots() const { return num_segments * slots_per_segment; }
  uint64_t SegmentsForAllRows() const {
    return (num_rows + slots_per_segment - 1) / slots_per_segment;
  }
  // Size the main file is truncated to (sparse): it ends with the journal region.
  uint64_t MainFileBytes() const { return journal_offset + journal_bytes; }
  // Journal blocks the journal region holds after its descriptor.
  uint64_t JournalCapacity() const { return journal_bytes / kJournalBlockBytes - 1; }
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

// The fixed part of a journal block (kJournalHeaderBytes): magic u32, crc32c u32 (of the
// block's bytes from offset 8 on), then these fields in this order, then the payload.
struct JournalBlockHeader {
  uint64_t uuid = 0;
  uint64_t epoch = 0;
  uint64_t position = 0;  // index of the block in the journal (0 = first after the descriptor)
  uint64_t start = 0;     // position of the first block of its commit
  uint64_t nonce = 0;     // random per commit: blocks of one commit share it
  uint32_t last = 0;      // 1 on the last block of its commit
  uint32_t payload = 0;   // bytes of records after the header
};
// Seals a journal block (kJournalBlockBytes; the payload already in place).
void SealJournalBlock(uint8_t* block, const JournalBlockHeader& hdr);
// Parses a journal block: Corruption when its magic, crc or uuid is wrong or its header is
// inconsistent, with `*torn` set when the magic or crc is (what a torn write leaves);
// `*zero` is set instead, with Ok, when the block is all zeros (never written).
Status VerifyJournalBlock(const uint8_t* block, uint64_t uuid, JournalBlockHeader* hdr, bool* zero,
                          bool* torn);
// Writes / parses the descriptor block (kJournalBlockBytes) naming the journal's epoch and
// whether a checkpoint is rewriting the map pages (a power cut may then have torn them).
// Its fields fit in the first 512-byte sector, so a torn write leaves one version whole.
// Decoding an all-zero block gives epoch 0 (never written); anything else that is not a
// sealed descriptor of this table is Corruption. Descriptors written before the flag
// existed read as not pending.
void EncodeJournalDescriptor(uint8_t* block, uint64_t uuid, uint64_t epoch,
                             bool checkpoint_pending = false);
Status DecodeJournalDescriptor(const uint8_t* block, uint64_t uuid, uint64_t* epoch,
                               bool* checkpoint_pending = nullptr);

}  // namespace mtrains
