// Standalone fuzz driver for the table-header parser (DecodeHeader) and the block / map-page
// verifiers: a deterministic random loop (seeded, so a failure reproduces) over arbitrary
// bytes, mutations of a valid header (bit flips, truncation, overwritten fields) with and
// without a recomputed crc32c, and structured headers with extreme field values. Checks
// that parsing never reads out of bounds (ASan), never overflows (UBSan), and that every
// accepted header describes a layout whose sizes fit in 64 bits.
//
// Environment: FUZZ_ITERS (default 200000), FUZZ_SEED (default 1).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/crc32c.h"
#include "storage/block_format.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

constexpr size_t kHeader = 4096;

void Reseal(std::vector<uint8_t>* b) {
  if (b->size() < kHeader) return;
  const uint32_t crc = Crc32c(0, b->data(), kHeader - 4);
  std::memcpy(b->data() + kHeader - 4, &crc, 4);
}

// Invariants of an accepted header: everything the store later sizes and allocates from
// it is consistent and free of overflow.
void CheckAccepted(const TableHeader& h) {
  CHECK(h.num_rows >= 1 && h.dim >= 1 && h.geometry.row_bytes >= 1);
  CHECK(h.block_size >= 4096 && (h.block_size & (h.block_size - 1)) == 0);
  CHECK(h.num_segments >= 1 && h.segment_blocks >= 1 && h.slots_per_segment >= 1);
  const unsigned __int128 log = (unsigned __int128)h.num_segments * h.segment_blocks * h.block_size;
  CHECK(log == h.LogBytes()) << "log size overflows: num_segments=" << h.num_segments
                             << " segment_blocks=" << h.segment_blocks << " block_size=" << h.block_size;
  // Header, map, the log unless striped, then the map journal region.
  const unsigned __int128 journal = ((unsigned __int128)h.map_pages * 2 + 16) * h.block_size;
  const unsigned __int128 main_file = (unsigned __int128)h.log_offset + (h.stripe_paths.empty() ? log : 0) + journal;
  CHECK(journal == h.journal_bytes && h.journal_offset + h.journal_bytes == h.MainFileBytes());
  CHECK(main_file == h.MainFileBytes() && main_file < ((unsigned __int128)1 << 63))
      << "main file size overflows: log_offset=" << h.log_offset << " num_segments=" << h.num_segments
      << " segment_blocks=" << h.segment_blocks << " block_size=" << h.block_size
      << " stripes=" << h.stripe_paths.size();
  CHECK(h.map_offset == h.block_size && h.log_offset == h.map_offset + h.map_pages * h.block_size);
  CHECK(h.map_pages * h.EntriesPerMapPage() >= h.num_rows);
  CHECK((unsigned __int128)h.num_rows * 8 < ((unsigned __int128)1 << 63));
  // Total slots the map may point to must be countable.
  CHECK((unsigned __int128)h.num_segments * h.slots_per_segment < ((unsigned __int128)1 << 64));
  for (const auto& s : h.stripe_paths) CHECK(s.size() < kHeader);
}

uint64_t Extreme(std::mt19937_64& rng) {
  switch (rng() % 6) {
    case 0: return 0;
    case 1: return ~0ull >> (rng() % 64);
    case 2: return 1ull << (rng() % 64);
    case 3: return (1ull << (rng() % 64)) - 1;
    case 4: return rng() % 1000;
    default: return rng();
  }
}

TableHeader ValidHeader(std::mt19937_64& rng) {
  TableHeader h;
  h.num_rows = 1 + rng() % 100000;
  h.dim = 1 + rng() % 300;
  h.state_dim = rng() % 3;
  h.dtype = static_cast<DType>(rng() % 3);
  h.block_size = 4096u << (rng() % 3);
  h.segment_blocks = 1 + rng() % 256;
  h.seed = rng();
  h.table_uuid = rng() | 1;
  for (uint64_t i = rng() % 3; i > 0 && rng() % 4 == 0; --i) h.stripe_paths.push_back("/tmp/stripe" + std::to_string(i));
  CHECK_OK(ComputeLayout(&h, 0.5));
  return h;
}

void TestHeaderRoundTrip() {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) {
    const TableHeader h = ValidHeader(rng);
    std::vector<uint8_t> block(h.block_size);
    CHECK_OK(EncodeHeader(h, block.data()));
    TableHeader g;
    CHECK_OK(DecodeHeader(block.data(), kHeader, &g));
    CHECK(g.num_rows == h.num_rows && g.dim == h.dim && g.num_segments == h.num_segments &&
          g.table_uuid == h.table_uuid && g.stripe_paths == h.stripe_paths && g.log_offset == h.log_offset);
    CheckAccepted(g);
  }
}

void TestHeaderFuzz() {
  const long iters = std::getenv("FUZZ_ITERS") ? std::atol(std::getenv("FUZZ_ITERS")) : 200000;
  const uint64_t seed = std::getenv("FUZZ_SEED") ? std::strtoull(std::getenv("FUZZ_SEED"), nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  uint64_t accepted = 0, rejected = 0;
  for (long it = 0; it < iters; ++it) {
    std::vector<uint8_t> b;
    const int mode = static_cast<int>(rng() % 6);
    if (mode == 0) {  // arbitrary bytes, sometimes behind a valid magic
      b.resize(rng() % (kHeader + 64));
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      if (b.size() >= 8 && rng() % 2) std::memcpy(b.data(), kTableMagic, 8);
      if (rng() % 2) Reseal(&b);
    } else {  // a valid header, mutated
      const TableHeader h = ValidHeader(rng);
      b.resize(h.block_size);
      CHECK_OK(EncodeHeader(h, b.data()));
      b.resize(kHeader);
      if (mode == 1) {  // bit flips
        for (uint64_t k = 1 + rng() % 4; k > 0; --k) b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
      } else if (mode == 2) {  // an extreme value in a field (offsets of EncodeHeader)
        static const size_t kFields[][2] = {{8, 4}, {12, 4}, {16, 8}, {24, 4}, {28, 4}, {32, 4}, {36, 4},
                                            {40, 8}, {48, 8}, {56, 8}, {64, 8}, {72, 8}, {80, 4}, {84, 2}};
        for (uint64_t k = 1 + rng() % 3; k > 0; --k) {
          const auto& f = kFields[rng() % (sizeof(kFields) / sizeof(kFields[0]))];
          const uint64_t v = Extreme(rng);
          std::memcpy(b.data() + f[0], &v, f[1]);
        }
      } else if (mode == 3) {  // stripe count / path lengths running off the header
        const uint32_t n = static_cast<uint32_t>(Extreme(rng) % 2048);
        std::memcpy(b.data() + 80, &n, 4);
        for (size_t p = 84; p + 2 < kHeader && rng() % 3; p += 2 + rng() % 64) {
          const uint16_t len = static_cast<uint16_t>(Extreme(rng));
          std::memcpy(b.data() + p, &len, 2);
        }
      } else if (mode == 4) {  // truncation
        b.resize(rng() % (kHeader + 1));
      } else {  // every size field extreme at once (a hostile header with a valid crc)
        static const size_t kSizes[][2] = {{12, 4}, {16, 8}, {24, 4}, {28, 4}, {36, 4}, {64, 8}};
        for (const auto& f : kSizes) {
          if (rng() % 2) continue;
          const uint64_t v = Extreme(rng);
          std::memcpy(b.data() + f[0], &v, f[1]);
        }
      }
      if (rng() % 4 != 0) Reseal(&b);
    }
    TableHeader h;
    const Status st = DecodeHeader(b.data(), b.size(), &h);
    if (st.ok()) {
      CheckAccepted(h);
      ++accepted;
    } else {
      CHECK(st.code() == StatusCode::kFormatError || st.code() == StatusCode::kCorruption)
          << "unexpected code " << testing::CodeName(st.code()) << ": " << st.message();
      CHECK(!st.message().empty());
      ++rejected;
    }
  }
  std::fprintf(stderr, "         %ld inputs (seed %llu): %llu accepted, %llu rejected\n", iters,
               (unsigned long long)seed, (unsigned long long)accepted, (unsigned long long)rejected);
}

// Log blocks and map pages: a sealed block verifies; any single bit flip, a wrong uuid or a
// wrong index is refused; random bytes never verify (nor crash).
void TestBlockVerifiers() {
  std::mt19937_64 rng(9);
  for (uint32_t B : {4096u, 8192u}) {
    std::vector<uint8_t> blk(B);
    for (int i = 0; i < 300; ++i) {
      for (auto& x : blk) x = static_cast<uint8_t>(rng());
      const uint64_t uuid = rng(), index = rng() % 1000000;
      CHECK(!VerifyLogBlock(blk.data(), B, uuid, index).ok());
      SealLogBlock(blk.data(), B, uuid, index);
      CHECK_OK(VerifyLogBlock(blk.data(), B, uuid, index));
      CHECK_CODE(VerifyLogBlock(blk.data(), B, uuid + 1, index), kCorruption);
      CHECK_CODE(VerifyLogBlock(blk.data(), B, uuid, index + 1), kCorruption);
      const size_t at = rng() % B;
      blk[at] ^= uint8_t(1u << (rng() % 8));
      CHECK_CODE(VerifyLogBlock(blk.data(), B, uuid, index), kCorruption);
      bool fresh = true;
      SealMapPage(blk.data(), B, uuid, index);
      CHECK_OK(VerifyMapPage(blk.data(), B, uuid, index, &fresh));
      CHECK(!fresh);
      blk[rng() % B] ^= uint8_t(1u << (rng() % 8));
      CHECK_CODE(VerifyMapPage(blk.data(), B, uuid, index, &fresh), kCorruption);
    }
    std::fill(blk.begin(), blk.end(), 0);
    bool fresh = false;
    CHECK_OK(VerifyMapPage(blk.data(), B, 1, 0, &fresh));
    CHECK(fresh);
  }
}

// BlockGeometry against the version-1 layout written out by hand: packed rows at k *
// row_bytes, their ids ending at the footer (B - 24), a spanning row's chunks of B - 32 bytes
// with its id at B - 32. Files written before the geometry existed must keep opening.
void TestBlockGeometry() {
  struct Case {
    uint32_t row_bytes, block_size, rows_per_block, blocks_per_row;
  };
  const Case cases[] = {
      {4 * 65, 4096, (4096 - 24) / (4 * 65 + 8), 1},  // a typical packed row
      {8, 4096, (4096 - 24) / 16, 1},                  // the narrowest row
      {4064, 4096, 1, 1},                               // exactly one row and its id
      {4065, 4096, 0, 2},                               // one byte too wide: spans 2 blocks
      {4 * 2048, 4096, 0, 3},                           // ceil(8192 / 4064)
      {4 * 2048, 8192, 0, 2},
      {4 * 1000, 65536, (65536 - 24) / 4008, 1},
  };
  std::mt19937_64 rng(5);
  for (const Case& c : cases) {
    const BlockGeometry g = BlockGeometry::Of(c.row_bytes, c.block_size);
    CHECK(g.rows_per_block == c.rows_per_block && g.blocks_per_row == c.blocks_per_row)
        << "row_bytes=" << c.row_bytes << " block_size=" << c.block_size << ": rows_per_block="
        << g.rows_per_block << " blocks_per_row=" << g.blocks_per_row;
    const uint32_t B = c.block_size;
    CHECK(g.IdOffset(g.IdsPerBlock() - 1) + 8 == B - kLogFooterBytes);
    if (g.packed()) {
      const uint32_t last = c.rows_per_block - 1;
      CHECK(g.IdOffset(0) == B - 24 - 8 * c.rows_per_block && g.IdOffset(last) == B - 32);
      CHECK(g.RowOffset(last) + c.row_bytes <= g.IdOffset(0)) << "rows overlap ids";
      CHECK(g.BlockOfSlot(1000) == 1000 / c.rows_per_block &&
            g.IndexInBlock(1000) == 1000 % c.rows_per_block);
    } else {
      CHECK(g.ChunkBytes() == B - 32 && g.IdOffset(0) == B - 32);
      CHECK(uint64_t(g.blocks_per_row - 1) * g.ChunkBytes() < c.row_bytes &&
            c.row_bytes <= uint64_t(g.blocks_per_row) * g.ChunkBytes());
      CHECK(g.BlockOfSlot(7) == 7ull * c.blocks_per_row && g.IndexInBlock(7) == 0);
    }
    for (uint64_t slot = 0; slot < 3000; slot += 7)
      CHECK(g.SlotAt(g.BlockOfSlot(slot), g.IndexInBlock(slot)) == slot) << "slot " << slot;
    const uint64_t whole = (10 + c.blocks_per_row - 1) / c.blocks_per_row;  // spanning slots
    CHECK(g.SlotsIn(g.WholeSlotBlocks(10)) == (g.packed() ? 10ull * c.rows_per_block : whole));
    // Put rows into a fresh block group and read them back; the bytes sit where the
    // hand-written layout says; a wrong row id is refused.
    const uint32_t entries = g.IdsPerBlock();
    std::vector<uint8_t> blocks(uint64_t(B) * g.blocks_per_row, 0xAB);
    std::vector<std::vector<uint8_t>> rows(entries, std::vector<uint8_t>(c.row_bytes));
    const uint64_t first_block = 12;  // a slot starts there (a multiple of blocks_per_row)
    for (uint32_t k = 0; k < entries; ++k) {
      for (auto& x : rows[k]) x = static_cast<uint8_t>(rng());
      PutRow(g, blocks.data(), k, 100 + k, rows[k].data());
    }
    for (uint32_t k = 0; k < entries; ++k) {
      const uint64_t slot = g.SlotAt(first_block, k);
      std::vector<uint8_t> out(c.row_bytes);
      CHECK_OK(GetRow(g, blocks.data(), slot, 100 + k, out.data()));
      CHECK(out == rows[k]);
      CHECK(RowIdAt(g, blocks.data(), k) == 100 + k);
      CHECK_CODE(GetRow(g, blocks.data(), slot, 99, out.data()), kCorruption);
      uint64_t id;
      if (g.packed()) {
        CHECK(std::memcmp(blocks.data() + uint64_t(k) * c.row_bytes, rows[k].data(),
                          c.row_bytes) == 0);
        std::memcpy(&id, blocks.data() + B - 24 - 8 * uint64_t(entries) + 8 * k, 8);
      } else {
        std::memcpy(&id, blocks.data() + uint64_t(g.blocks_per_row - 1) * B + B - 32, 8);
        CHECK(std::memcmp(blocks.data(), rows[k].data(), B - 32) == 0);
      }
      CHECK(id == 100 + k);
    }
    // Between the last row and the first id: zeros (the 0xAB of the old contents is gone).
    for (uint32_t b = 0; b < g.blocks_per_row; ++b) {
      const uint8_t* blk = blocks.data() + uint64_t(b) * B;
      const uint32_t used = g.packed() ? entries * c.row_bytes
                                       : std::min(g.ChunkBytes(), c.row_bytes - b * g.ChunkBytes());
      for (uint32_t i = used; i < g.IdOffset(0); ++i) CHECK(blk[i] == 0) << "padding byte " << i;
    }
    if (g.packed() && entries > 1) {  // a block's first entry marks the others empty
      std::vector<uint8_t> one(B, 0xCD);
      PutRow(g, one.data(), 0, 5, rows[0].data());
      CHECK(RowIdAt(g, one.data(), 1) == kEmptySlot &&
            RowIdAt(g, one.data(), entries - 1) == kEmptySlot);
    }
  }
  // A table header carries the geometry of its rows.
  TableHeader h;
  h.num_rows = 1000;
  h.dim = 1500;
  h.state_dim = 1;
  h.segment_blocks = 5;
  CHECK_OK(ComputeLayout(&h, 0.5));
  CHECK(h.geometry.row_bytes == 6004 && h.geometry.blocks_per_row == 2 && h.segment_blocks == 6 &&
        h.slots_per_segment == 3 && h.SegmentsForAllRows() == 334);
}

// Journal blocks and the journal descriptor: a sealed one verifies with its fields; any bit
// flip or another uuid is refused (a flip of the magic or crc as possibly torn, a valid block
// of another table as not); an all-zero block reads as never written; random bytes never
// verify (nor crash).
void TestJournalVerifiers() {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> b(kJournalBlockBytes);
  for (int it = 0; it < 2000; ++it) {
    std::fill(b.begin(), b.end(), 0);
    JournalBlockHeader hdr;
    hdr.uuid = rng() | 1;
    hdr.epoch = rng() % 5;
    hdr.position = rng() % 1000;
    hdr.start = hdr.position - rng() % (hdr.position + 1);
    hdr.nonce = rng();
    hdr.last = rng() % 2;
    hdr.payload = static_cast<uint32_t>(rng() % (kJournalBlockBytes - kJournalHeaderBytes + 1));
    for (uint32_t i = 0; i < hdr.payload; ++i) b[kJournalHeaderBytes + i] = static_cast<uint8_t>(rng());
    SealJournalBlock(b.data(), hdr);
    JournalBlockHeader got;
    bool zero = true, torn = true;
    CHECK_OK(VerifyJournalBlock(b.data(), hdr.uuid, &got, &zero, &torn));
    CHECK(!zero && got.epoch == hdr.epoch && got.position == hdr.position && got.start == hdr.start &&
          got.nonce == hdr.nonce && got.last == hdr.last && got.payload == hdr.payload);
    CHECK(VerifyJournalBlock(b.data(), hdr.uuid + 1, &got, &zero, &torn).code() == StatusCode::kCorruption && !torn);
    const size_t at = rng() % b.size();
    b[at] ^= uint8_t(1u << (rng() % 8));
    CHECK(VerifyJournalBlock(b.data(), hdr.uuid, &got, &zero, &torn).code() == StatusCode::kCorruption && torn)
        << "flip at " << at;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (rng() % 2) std::memcpy(b.data(), &kJournalMagic, 4);
    CHECK(!VerifyJournalBlock(b.data(), hdr.uuid, &got, &zero, &torn).ok());
    uint64_t epoch = 1;
    CHECK(DecodeJournalDescriptor(b.data(), hdr.uuid, &epoch).code() == StatusCode::kCorruption);
    EncodeJournalDescriptor(b.data(), hdr.uuid, hdr.epoch + 7);
    CHECK_OK(DecodeJournalDescriptor(b.data(), hdr.uuid, &epoch));
    CHECK(epoch == hdr.epoch + 7);
    CHECK(DecodeJournalDescriptor(b.data(), hdr.uuid ^ 2, &epoch).code() == StatusCode::kCorruption);
    b[rng() % b.size()] ^= 1;
    CHECK(DecodeJournalDescriptor(b.data(), hdr.uuid, &epoch).code() == StatusCode::kCorruption);
  }
  std::fill(b.begin(), b.end(), 0);
  JournalBlockHeader got;
  bool zero = false, torn = false;
  CHECK_OK(VerifyJournalBlock(b.data(), 5, &got, &zero, &torn));
  CHECK(zero);
  uint64_t epoch = 9;
  CHECK_OK(DecodeJournalDescriptor(b.data(), 5, &epoch));
  CHECK(epoch == 0);
}

}  // namespace
}  // namespace mtrains

namespace mtrains {
namespace {

// The bit-at-a-time definition of CRC-32C (reflected 0x82F63B78, pre/post inverted).
uint32_t ReferenceCrc32c(uint32_t crc, const uint8_t* p, size_t len) {
  crc = ~crc;
  for (size_t i = 0; i < len; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

// Crc32c (the three-stream hardware paths from 384 bytes on) against the definition: every
// length to 2 KiB and a block's, at odd alignments, in one call and split in two.
void TestCrc32c() {
  CHECK(Crc32c(0, "123456789", 9) == 0xE3069283u) << "the CRC-32C check value";
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(9000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t len = 0; len <= 2048; ++len) lengths.push_back(len);
  for (size_t len : {4076, 4096, 8172, 8192}) lengths.push_back(len);
  for (size_t len : lengths) {
    const size_t off = rng() % 8;
    const uint32_t seed = static_cast<uint32_t>(rng());
    const uint32_t want = ReferenceCrc32c(seed, buf.data() + off, len);
    CHECK(Crc32c(seed, buf.data() + off, len) == want) << "len " << len << " offset " << off;
    const size_t cut = len == 0 ? 0 : rng() % len;
    CHECK(Crc32c(Crc32c(seed, buf.data() + off, cut), buf.data() + off + cut, len - cut) == want)
        << "len " << len << " split at " << cut;
  }
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("crc32c against its definition", TestCrc32c);
  Run("header encode/decode round trip", TestHeaderRoundTrip);
  Run("header parser fuzz", TestHeaderFuzz);
  Run("log block / map page verifiers", TestBlockVerifiers);
  Run("journal block / descriptor verifiers", TestJournalVerifiers);
  Run("block geometry and the row layout", TestBlockGeometry);
  std::fprintf(stderr, "test_block_format: all passed\n");
  return 0;
}
