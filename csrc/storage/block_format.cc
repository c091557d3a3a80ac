#include "storage/block_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/crc32c.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the on-disk format is little-endian");

namespace mtrains {
namespace {

constexpr uint32_t kHeaderBytes = 4096;  // header content; the header block may be larger
constexpr uint32_t kMinBlock = 4096, kMaxBlock = 1u << 20;
constexpr uint64_t kMaxRows = 1ull << 48;
constexpr uint32_t kMaxRowWidth = 1u << 20;  // values per row

template <typename T>
void Put(uint8_t* p, size_t& pos, T v) {
  std::memcpy(p + pos, &v, sizeof(T));
  pos += sizeof(T);
}
template <typename T>
bool Get(const uint8_t* p, size_t len, size_t& pos, T* v) {
  if (pos + sizeof(T) > len) return false;
  std::memcpy(v, p + pos, sizeof(T));
  pos += sizeof(T);
  return true;
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

uint32_t DTypeBytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }
const char* DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

BlockGeometry BlockGeometry::Of(uint32_t row_bytes, uint32_t block_size) {
  BlockGeometry g;
  g.block_size = block_size;
  g.row_bytes = row_bytes;
  // Each packed row costs its bytes and its 8-byte id; a spanning row's blocks each hold
  // a chunk and the id.
  g.rows_per_block = (block_size - kLogFooterBytes) / (row_bytes + 8);
  if (!g.packed()) g.blocks_per_row = (row_bytes + g.ChunkBytes() - 1) / g.ChunkBytes();
  return g;
}

void PutRow(const BlockGeometry& g, uint8_t* blocks, uint32_t index, uint64_t row,
            const uint8_t* data) {
  const uint32_t B = g.block_size;
  if (g.packed()) {
    if (index == 0) {
      std::memset(blocks, 0, B);
      std::memset(blocks + g.IdOffset(0), 0xFF, 8 * uint64_t(g.IdsPerBlock()));  // kEmptySlot
    }
    std::memcpy(blocks + g.RowOffset(index), data, g.row_bytes);
    std::memcpy(blocks + g.IdOffset(index), &row, 8);
    return;
  }
  uint32_t copied = 0;
  for (uint32_t k = 0; k < g.blocks_per_row; ++k) {
    uint8_t* blk = blocks + uint64_t(k) * B;
    std::memset(blk, 0, B);
    const uint32_t n = std::min(g.ChunkBytes(), g.row_bytes - copied);
    std::memcpy(blk, data + copied, n);
    copied += n;
    std::memcpy(blk + g.IdOffset(0), &row, 8);
  }
}

uint64_t RowIdAt(const BlockGeometry& g, const uint8_t* block, uint32_t index) {
  uint64_t id;
  std::memcpy(&id, block + g.IdOffset(index), 8);
  return id;
}

Status GetRow(const BlockGeometry& g, const uint8_t* blocks, uint64_t slot, uint64_t row,
              uint8_t* out) {
  const uint64_t first = g.BlockOfSlot(slot);
  if (g.packed()) {
    const uint32_t k = g.IndexInBlock(slot);
    const uint64_t id = RowIdAt(g, blocks, k);
    if (id != row)
      return Status::Corruption("log block " + std::to_string(first) + " slot " +
                                std::to_string(k) + " holds row " + std::to_string(id) +
                                ", expected row " + std::to_string(row));
    std::memcpy(out, blocks + g.RowOffset(k), g.row_bytes);
    return Status::Ok();
  }
  uint32_t copied = 0;
  for (uint32_t k = 0; k < g.blocks_per_row; ++k) {
    const uint8_t* blk = blocks + uint64_t(k) * g.block_size;
    const uint64_t id = RowIdAt(g, blk, 0);
    if (id != row)
      return Status::Corruption("log block " + std::to_string(first + k) + " holds row " +
                                std::to_string(id) + ", expected row " + std::to_string(row));
    const uint32_t n = std::min(g.ChunkBytes(), g.row_bytes - copied);
    std::memcpy(out + copied, blk, n);
    copied += n;
  }
  return Status::Ok();
}

Status ComputeLayout(TableHeader* h, double overprovision) {
  if (h->num_rows == 0 || h->num_rows > kMaxRows)
    return Status::InvalidArgument("num_rows=" + std::to_string(h->num_rows) +
                                   " must be in [1, 2^48]");
  if (h->dim == 0 || uint64_t(h->dim) + h->state_dim > kMaxRowWidth)
    return Status::InvalidArgument("dim=" + std::to_string(h->dim) + " and state_dim=" +
                                   std::to_string(h->state_dim) +
                                   " must give 1 to 2^20 values per row");
  if (uint32_t(h->dtype) > uint32_t(DType::kBFloat16))
    return Status::InvalidArgument("dtype code " + std::to_string(uint32_t(h->dtype)) +
                                   " is unknown");
  if (h->block_size < kMinBlock || h->block_size > kMaxBlock ||
      (h->block_size & (h->block_size - 1)) != 0)
    return Status::InvalidArgument("block_size=" + std::to_string(h->block_size) +
                                   " must be a power of two in [4096, 1048576]");
  if (!std::isfinite(h->init_lo) || !std::isfinite(h->init_hi) || h->init_lo > h->init_hi)
    return Status::InvalidArgument("init_range=(" + std::to_string(h->init_lo) + ", " +
                                   std::to_string(h->init_hi) + ") must be finite with lo <= hi");
  if (h->segment_blocks == 0 || h->segment_blocks > 65536)
    return Status::InvalidArgument("segment_blocks=" + std::to_string(h->segment_blocks) +
                                   " must be in [1, 65536]");
  h->geometry = BlockGeometry::Of((h->dim + h->state_dim) * DTypeBytes(h->dtype), h->block_size);
  // Whole rows per segment (fits 32 bits: segment_blocks <= 65536 was checked above).
  h->segment_blocks = static_cast<uint32_t>(h->geometry.WholeSlotBlocks(h->segment_blocks));
  h->slots_per_segment = h->geometry.SlotsIn(h->segment_blocks);
  if (h->num_segments == 0) {
    if (!(overprovision >= 0.1 && overprovision <= 100.0))
      return Status::InvalidArgument("overprovision=" + std::to_string(overprovision) +
                                     " must be in [0.1, 100]");
    const uint64_t needed = h->SegmentsForAllRows();
    h->num_segments = static_cast<uint64_t>(std::ceil(double(needed) * (1.0 + overprovision))) + 4;
  }
  h->map_pages = (h->num_rows + h->EntriesPerMapPage() - 1) / h->EntriesPerMapPage();
  h->map_offset = h->block_size;
  h->log_offset = h->map_offset + h->map_pages * h->block_size;
  // The journal grows to about twice the map's checkpoint before a checkpoint empties it
  // (segment_log_map.cc); the region is sparse, so its size costs nothing until written.
  h->journal_offset = h->stripe_paths.empty() ? h->log_offset + h->LogBytes() : h->log_offset;
  h->journal_bytes = (2 * h->map_pages + 16) * h->block_size;
  return Status::Ok();
}

Status EncodeHeader(const TableHeader& h, uint8_t* block) {
  size_t need = 96;
  for (const auto& path : h.stripe_paths) {
    if (path.size() > 0xFFFF) return Status::InvalidArgument("stripe path is too long: " + path.substr(0, 80) + "...");
    need += 2 + path.size();
  }
  if (need > kHeaderBytes - 4)
    return Status::InvalidArgument("stripe paths are too long for the header: they take " + std::to_string(need) +
                                   " bytes; the table header holds " + std::to_string(kHeaderBytes - 4));
  std::memset(block, 0, h.block_size);
  size_t pos = 0;
  std::memcpy(block, kTableMagic, 8);
  pos = 8;
  Put(block, pos, kFormatVersion);
  Put(block, pos, h.block_size);
  Put(block, pos, h.num_rows);
  Put(block, pos, h.dim);
  Put(block, pos, h.state_dim);
  Put(block, pos, static_cast<uint32_t>(h.dtype));
  Put(block, pos, h.segment_blocks);
  Put(block, pos, h.seed);
  Put(block, pos, h.init_lo);
  Put(block, pos, h.init_hi);
  Put(block, pos, h.num_segments);
  Put(block, pos, h.table_uuid);
  Put(block, pos, static_cast<uint32_t>(h.stripe_paths.size()));
  for (const auto& s : h.stripe_paths) {
    Put(block, pos, static_cast<uint16_t>(s.size()));
    std::memcpy(block + pos, s.data(), s.size());
    pos += s.size();
  }
  const uint32_t crc = Crc32c(0, block, kHeaderBytes - 4);
  std::memcpy(block + kHeaderBytes - 4, &crc, 4);
  return Status::Ok();
}

Status DecodeHeader(const uint8_t* data, size_t len, TableHeader* h) {
  if (len < kHeaderBytes) return Status::FormatError("file is too short to hold a table header");
  if (std::memcmp(data, kTableMagic, 8) != 0)
    return Status::FormatError("not a torchrec_mtrains block-store table (bad magic)");
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data + kHeaderBytes - 4, 4);
  if (Crc32c(0, data, kHeaderBytes - 4) != stored_crc)
    return Status::Corruption("table header checksum mismatch");
  size_t pos = 8;
  uint32_t version = 0, dtype = 0, nstripes = 0;
  const size_t lim = kHeaderBytes - 4;
  bool ok = Get(data, lim, pos, &version);
  if (ok && version != kFormatVersion)
    return Status::FormatError("format version " + std::to_string(version) +
                               " is not supported (this build reads version " +
                               std::to_string(kFormatVersion) + ")");
  ok = ok && Get(data, lim, pos, &h->block_size) && Get(data, lim, pos, &h->num_rows) &&
       Get(data, lim, pos, &h->dim) && Get(data, lim, pos, &h->state_dim) &&
       Get(data, lim, pos, &dtype) && Get(data, lim, pos, &h->segment_blocks) &&
       Get(data, lim, pos, &h->seed) && Get(data, lim, pos, &h->init_lo) &&
       Get(data, lim, pos, &h->init_hi) && Get(data, lim, pos, &h->num_segments) &&
       Get(data, lim, pos, &h->table_uuid) && Get(data, lim, pos, &nstripes);
  if (!ok) return Status::FormatError("truncated table header");
  h->dtype = static_cast<DType>(dtype);
  if (nstripes > 1024) return Status::FormatError("header names " + std::to_string(nstripes) + " stripes");
  h->stripe_paths.clear();
  for (uint32_t i = 0; i < nstripes; ++i) {
    uint16_t n = 0;
    if (!Get(data, lim, pos, &n) || pos + n > lim)
      return Status::FormatError("truncated stripe path in table header");
    h->stripe_paths.emplace_back(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
  }
  if (h->num_segments == 0) return Status::FormatError("header has num_segments=0");
  const uint64_t nseg = h->num_segments;
  Status st = ComputeLayout(h, 1.0);
  if (!st.ok()) return Status::FormatError("invalid header field: " + st.message());
  if (h->num_segments != nseg || h->num_segments > (1ull << 40))
    return Status::FormatError("invalid header field: num_segments=" + std::to_string(nseg));
  // A header with a valid crc can still be hostile (or written by a buggy tool): bound the
  // log by what Create can produce (overprovision <= 100), so that opening never sizes
  // devices or allocates segment tables from a product that overflowed 64 bits.
  const uint64_t max_segments = h->SegmentsForAllRows() * 101 + 5;
  const unsigned __int128 log_bytes = (unsigned __int128)nseg * h->segment_blocks * h->block_size;
  if (nseg > max_segments || log_bytes + h->log_offset + h->journal_bytes > (unsigned __int128)1 << 62)
    return Status::FormatError("invalid header field: num_segments=" + std::to_string(nseg) +
                               " of " + std::to_string(h->SegmentBytes()) + " bytes for num_rows=" +
                               std::to_string(h->num_rows) + " (at most " +
                               std::to_string(max_segments) + " segments, 2^62 bytes)");
  return Status::Ok();
}

void SealLogBlock(uint8_t* block, uint32_t block_size, uint64_t uuid, uint64_t block_index) {
  uint8_t* f = block + block_size - kLogFooterBytes;
  const uint32_t zero = 0;
  std::memcpy(f, &kLogBlockMagic, 4);
  std::memcpy(f + 4, &zero, 4);
  std::memcpy(f + 8, &uuid, 8);
  std::memcpy(f + 16, &block_index, 8);
  uint32_t crc = Crc32c(0, block, block_size - 20);
  crc = Crc32c(crc, f + 8, 16);
  std::memcpy(f + 4, &crc, 4);
}

Status VerifyLogBlock(const uint8_t* block, uint32_t block_size, uint64_t uuid,
                      uint64_t block_index) {
  const uint8_t* f = block + block_size - kLogFooterBytes;
  uint32_t magic, stored;
  uint64_t got_uuid, got_index;
  std::memcpy(&magic, f, 4);
  std::memcpy(&stored, f + 4, 4);
  std::memcpy(&got_uuid, f + 8, 8);
  std::memcpy(&got_index, f + 16, 8);
  // Named only on failure: this runs once per block read, the message is rarely needed.
  auto where = [block_index] { return "log block " + std::to_string(block_index); };
  if (magic != kLogBlockMagic)
    return Status::Corruption(where() + ": bad block magic (block lost or overwritten)");
  uint32_t crc = Crc32c(0, block, block_size - 20);
  crc = Crc32c(crc, f + 8, 16);
  if (crc != stored) return Status::Corruption(where() + ": crc32c mismatch");
  if (got_uuid != uuid) return Status::Corruption(where() + ": block belongs to another table");
  if (got_index != block_index)
    return Status::Corruption(where() + ": block claims index " + std::to_string(got_index) +
                              " (misdirected write)");
  return Status::Ok();
}

namespace {
uint32_t MapPageCrc(const uint8_t* page, uint32_t block_size, uint64_t uuid, uint64_t index) {
  uint32_t crc = Crc32c(0, page, block_size - kMapFooterBytes);
  crc = Crc32c(crc, &uuid, 8);
  return Crc32c(crc, &index, 8);
}
}  // namespace

void SealMapPage(uint8_t* page, uint32_t block_size, uint64_t uuid, uint64_t page_index) {
  uint8_t* f = page + block_size - kMapFooterBytes;
  const uint32_t crc = MapPageCrc(page, block_size, uuid, page_index);
  std::memcpy(f, &kMapPageMagic, 4);
  std::memcpy(f + 4, &crc, 4);
  std::memcpy(f + 8, &page_index, 8);
}

Status VerifyMapPage(const uint8_t* page, uint32_t block_size, uint64_t uuid,
                     uint64_t page_index, bool* never_written) {
  *never_written = false;
  const uint8_t* f = page + block_size - kMapFooterBytes;
  uint32_t magic, stored;
  uint64_t got_index;
  std::memcpy(&magic, f, 4);
  std::memcpy(&stored, f + 4, 4);
  std::memcpy(&got_index, f + 8, 8);
  const std::string where = "location-map page " + std::to_string(page_index);
  if (magic == 0 && AllZero(page, block_size)) {
    *never_written = true;
    return Status::Ok();
  }
  if (magic != kMapPageMagic) return Status::Corruption(where + ": bad page magic");
  if (got_index != page_index) return Status::Corruption(where + ": misdirected page");
  if (MapPageCrc(page, block_size, uuid, page_index) != stored)
    return Status::Corruption(where + ": crc32c mismatch");
  return Status::Ok();
}

namespace {
uint32_t JournalCrc(const uint8_t* block) { return Crc32c(0, block + 8, kJournalBlockBytes - 8); }
}  // namespace

void SealJournalBlock(uint8_t* block, const JournalBlockHeader& hdr) {
  size_t pos = 8;
  Put(block, pos, hdr.uuid);
  Put(block, pos, hdr.epoch);
  Put(block, pos, hdr.position);
  Put(block, pos, hdr.start);
  Put(block, pos, hdr.nonce);
  Put(block, pos, hdr.last);
  Put(block, pos, hdr.payload);
  std::memcpy(block, &kJournalMagic, 4);
  const uint32_t crc = JournalCrc(block);
  std::memcpy(block + 4, &crc, 4);
}

Status VerifyJournalBlock(const uint8_t* block, uint64_t uuid, JournalBlockHeader* hdr, bool* zero,
                          bool* torn) {
  *zero = false;
  *torn = true;
  uint32_t magic, stored;
  std::memcpy(&magic, block, 4);
  std::memcpy(&stored, block + 4, 4);
  if (magic == 0 && AllZero(block, kJournalBlockBytes)) {
    *zero = true;
    return Status::Ok();
  }
  if (magic != kJournalMagic) return Status::Corruption("bad journal block magic");
  if (JournalCrc(block) != stored) return Status::Corruption("journal block crc32c mismatch");
  *torn = false;
  size_t pos = 8;
  const size_t lim = kJournalHeaderBytes;
  Get(block, lim, pos, &hdr->uuid);
  Get(block, lim, pos, &hdr->epoch);
  Get(block, lim, pos, &hdr->position);
  Get(block, lim, pos, &hdr->start);
  Get(block, lim, pos, &hdr->nonce);
  Get(block, lim, pos, &hdr->last);
  Get(block, lim, pos, &hdr->payload);
  if (hdr->uuid != uuid) return Status::Corruption("journal block belongs to another table");
  if (hdr->payload > kJournalBlockBytes - kJournalHeaderBytes || hdr->start > hdr->position)
    return Status::Corruption("journal block header is inconsistent");
  return Status::Ok();
}

void EncodeJournalDescriptor(uint8_t* block, uint64_t uuid, uint64_t epoch, bool checkpoint_pending) {
  std::memset(block, 0, kJournalBlockBytes);
  size_t pos = 8;
  Put(block, pos, uuid);
  Put(block, pos, epoch);
  Put(block, pos, uint64_t(checkpoint_pending ? 1 : 0));  // flags
  std::memcpy(block, &kJournalDescMagic, 4);
  const uint32_t crc = JournalCrc(block);
  std::memcpy(block + 4, &crc, 4);
}

Status DecodeJournalDescriptor(const uint8_t* block, uint64_t uuid, uint64_t* epoch,
                               bool* checkpoint_pending) {
  *epoch = 0;
  if (checkpoint_pending != nullptr) *checkpoint_pending = false;
  if (AllZero(block, kJournalBlockBytes)) return Status::Ok();
  uint32_t magic, stored;
  uint64_t got_uuid;
  std::memcpy(&magic, block, 4);
  std::memcpy(&stored, block + 4, 4);
  std::memcpy(&got_uuid, block + 8, 8);
  if (magic != kJournalDescMagic) return Status::Corruption("map journal descriptor: bad magic");
  if (JournalCrc(block) != stored) return Status::Corruption("map journal descriptor: crc32c mismatch");
  if (got_uuid != uuid) return Status::Corruption("map journal descriptor belongs to another table");
  std::memcpy(epoch, block + 16, 8);
  uint64_t flags;
  std::memcpy(&flags, block + 24, 8);
  if (checkpoint_pending != nullptr) *checkpoint_pending = (flags & 1) != 0;
  return Status::Ok();
}

}  // namespace mtrains
