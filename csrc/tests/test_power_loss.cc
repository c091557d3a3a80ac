// Standalone driver: the segment log under a BlockStore across power cuts, not just kills.
//
// A scripted workload runs the table's on-disk life on RecordingDevices (the main file:
// header, map pages and journal; and the log): Create's header and sync, then
// generations of row writes, each generation flushed (SegmentLog::Commit, what
// BlockStore::Flush ends in) except every fourth, enough of them on a small log to make the
// collector move rows and free segments, the map journal grow, and checkpoints rewrite map
// pages and start journal epochs; a clean close seals the journal. Every row version is
// recognisable (row id and generation in its bytes, the rest a hash of both).
//
// CrashImages then cuts the power before every event of the record, several times each:
// the state at each device's last sync, every in-flight write applied in order, and random
// orders of in-flight writes each lost, applied, or torn (each 512-byte sector old or new).
// Each image is opened as BlockStore::Open opens a table (header decoded, map checkpoint
// loaded, journal replayed: SegmentLog::LoadMap) and every row read as BlockStore reads
// it (its blocks verified, the row id checked). Checks, per image:
//   - once Create returned, the table opens (a refusal would lose flushes that returned);
//   - every row reads as a version written to it, no older than its version at the last
//     flush that returned (that flush is never lost), never a mix or garbage;
//   - a row never written by a returned flush may read as never written.
//
// Usage: test_power_loss [scratch_dir]   (the scratch directory is unused: all in memory)
// Environment: POWER_LOSS_IMAGES (crash images, default 1000), POWER_LOSS_SEED (default 1).
// Prints one "power-loss:" summary line; exits 1 (listing the first failures) if any check
// fails, and aborts on a failed CHECK.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "storage/block_format.h"
#include "storage/device.h"
#include "storage/recording_device.h"
#include "storage/segment_log.h"
#include "tests/check.h"

namespace mtrains {
namespace {

constexpr uint32_t kDim = 6, kStateDim = 2, kRowBytes = (kDim + kStateDim) * 4;
constexpr uint64_t kRows = 2000;
constexpr uint32_t kGenerations = 60;
// Marks: the generation whose appends begin, and the generation of a flush that returned
// (0: Create returned).
constexpr uint64_t kGenMark = 1ull << 32, kFlushMark = 2ull << 32;

uint32_t Mix32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
// Word 0 = row id, word 1 = generation, the rest a hash of both.
void FillRow(uint64_t row, uint32_t gen, uint8_t* out) {
  uint32_t w[kRowBytes / 4];
  w[0] = static_cast<uint32_t>(row);
  w[1] = gen;
  for (uint32_t i = 2; i < kRowBytes / 4; ++i) w[i] = Mix32(row * 1000003 + gen * 31 + i);
  std::memcpy(out, w, kRowBytes);
}
// The generation of a row written by FillRow, or -1 for any other bytes.
int64_t GenerationOf(uint64_t row, const uint8_t* data) {
  uint8_t want[kRowBytes];
  uint32_t gen;
  std::memcpy(&gen, data + 4, 4);
  FillRow(row, gen, want);
  return std::memcmp(want, data, kRowBytes) == 0 ? int64_t(gen) : -1;
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  CHECK(end != nullptr && *end == '\0') << name << "=" << v << " is not a non-negative integer";
  return x;
}

struct Workload {
  TableHeader h;
  WriteRecord record;
  uint32_t meta_id = 0, log_id = 0;
  std::vector<std::vector<uint32_t>> written;             // per row: generations, ascending
  std::map<uint32_t, std::vector<uint32_t>> flushed;      // generation -> each row's version
  SegmentLogCounters counters;
};

// Rows of generation `gen`: the whole table over the first three, then a hot set rewritten
// (the collector's work) with a few rows anywhere; distinct.
std::vector<uint64_t> RowsOf(uint32_t gen, std::mt19937_64* rng) {
  std::vector<uint64_t> rows;
  if (gen <= 3) {
    for (uint64_t r = (gen - 1) * kRows / 3; r < gen * kRows / 3; ++r) rows.push_back(r);
    return rows;
  }
  std::vector<uint8_t> taken(kRows, 0);
  auto take = [&](uint64_t r) {
    if (!taken[r]) taken[r] = 1, rows.push_back(r);
  };
  for (int i = 0; i < 220; ++i) take((*rng)() % 400);
  for (int i = 0; i < 30; ++i) take((*rng)() % kRows);
  return rows;
}

void RunWorkload(uint64_t seed, Workload* w) {
  TableHeader& h = w->h;
  h.num_rows = kRows;
  h.dim = kDim;
  h.state_dim = kStateDim;
  h.segment_blocks = 4;
  h.table_uuid = 0x5057E2105ull;
  CHECK_OK(ComputeLayout(&h, 0.3));
  RecordingDevice meta(&w->record, h.MainFileBytes(), 4096), log(&w->record, h.LogBytes(), 4096);
  w->meta_id = meta.id();
  w->log_id = log.id();
  // Create: the header block, synced.
  AlignedBuffer header(h.block_size, 4096);
  CHECK_OK(EncodeHeader(h, header.data()));
  IoOp op{0, header.data(), h.block_size};
  CHECK_OK(meta.Write(&op, 1));
  CHECK_OK(meta.Sync());
  std::vector<uint32_t> version(kRows, 0);
  w->written.assign(kRows, {});
  w->flushed[0] = version;
  w->record.Mark(kFlushMark | 0);

  SegmentLog seg(h, &log, &meta);
  std::mt19937_64 rng(seed);
  uint8_t row[kRowBytes];
  for (uint32_t gen = 1; gen <= kGenerations; ++gen) {
    w->record.Mark(kGenMark | gen);
    const std::vector<uint64_t> rows = RowsOf(gen, &rng);
    for (size_t start = 0; start < rows.size();) {
      const size_t n = std::min<size_t>(rows.size() - start, seg.MaxReserve());
      CHECK_OK(seg.Reserve(n));
      for (size_t i = start; i < start + n; ++i) {
        FillRow(rows[i], gen, row);
        seg.Append(rows[i], row);
        version[rows[i]] = gen;
        w->written[rows[i]].push_back(gen);
      }
      start += n;
    }
    if (gen % 4 == 3 && gen != kGenerations) continue;  // not flushed: the next flush takes it
    CHECK_OK(seg.Commit());
    if (gen == kGenerations) CHECK_OK(seg.SealJournal());  // the clean close
    w->flushed[gen] = version;
    w->record.Mark(kFlushMark | gen);
  }
  w->counters = seg.counters();
  CHECK(w->counters.gc_segments_freed > 0 && w->counters.gc_rows_moved > 0)
      << "the workload did not make the collector free segments";
  CHECK(w->counters.map_checkpoints > 1 && w->counters.map_journal_commits > 1)
      << "the workload did not exercise both the map journal and checkpoints: "
      << w->counters.map_checkpoints << " checkpoints, " << w->counters.map_journal_commits << " journal commits";
}

struct Tally {
  uint64_t images = 0, points = 0, synced = 0, in_order = 0, random = 0, refused_uncreated = 0;
  uint64_t failures = 0;
  uint64_t torn_map_pages = 0;  // images opened over a map page torn mid-checkpoint
  std::vector<std::string> examples;
};

// What the last marks before a crash point promise.
struct Promise {
  bool created = false;                         // Create returned
  uint32_t gen = 0;                             // generations begun (no later version exists)
  const std::vector<uint32_t>* flushed = nullptr;  // versions as of the last flush that returned
};

// Opens the image as BlockStore::Open does and reads every row. Returns "" when it holds
// up to `p`, else what is wrong. `refused` tells whether it failed to open.
std::string CheckImage(const Workload& w, const Promise& p, Device* meta, Device* log, bool* refused, Tally* t) {
  *refused = false;
  AlignedBuffer hb(w.h.block_size, 4096);
  IoOp op{0, hb.data(), w.h.block_size};
  CHECK_OK(meta->Read(&op, 1));
  TableHeader h;
  Status st = DecodeHeader(hb.data(), w.h.block_size, &h);
  SegmentLog seg(st.ok() ? h : w.h, log, meta);
  if (st.ok()) st = seg.LoadMap(-1);
  if (!st.ok()) {
    *refused = true;
    if (st.message().empty()) return "refused to open without saying why";
    if (!p.created) return "";  // Create never returned: there is no table to keep
    return "refused to open (" + std::string(testing::CodeName(st.code())) + "): " + st.message();
  }
  if (!p.created) return "";
  t->torn_map_pages += seg.counters().torn_map_pages > 0;
  const BlockGeometry& g = h.geometry;
  const uint32_t B = h.block_size;
  AlignedBuffer blocks(h.LogBytes(), 4096);
  IoOp all{0, blocks.data(), static_cast<uint32_t>(h.LogBytes())};
  CHECK_OK(log->Read(&all, 1));
  std::vector<int8_t> verified(h.LogBytes() / B, -1);  // per block: unknown, bad, good
  uint8_t out[kRowBytes];
  for (uint64_t r = 0; r < kRows; ++r) {
    const uint32_t least = (*p.flushed)[r];
    const uint64_t loc = seg.Location(r);
    const std::string what = "row " + std::to_string(r) + " (version " + std::to_string(least) +
                             " at the last returned flush, generation " + std::to_string(p.gen) + " begun)";
    if (loc == 0) {
      if (least > 0) return what + " is lost: the map does not name it";
      continue;
    }
    const uint64_t first = g.BlockOfSlot(loc - 1);
    for (uint32_t k = 0; k < g.blocks_per_row; ++k) {
      int8_t& v = verified[first + k];
      if (v < 0) v = VerifyLogBlock(blocks.data() + (first + k) * B, B, h.table_uuid, first + k).ok();
      if (!v) return what + " points to log block " + std::to_string(first + k) + ", which fails verification";
    }
    st = GetRow(g, blocks.data() + first * B, loc - 1, r, out);
    if (!st.ok()) return what + ": " + st.message();
    const int64_t gen = GenerationOf(r, out);
    if (gen < 0) return what + " reads bytes that are no version of it (a mix or garbage)";
    const std::vector<uint32_t>& gens = w.written[r];
    if (!std::binary_search(gens.begin(), gens.end(), static_cast<uint32_t>(gen)) || gen > p.gen)
      return what + " reads generation " + std::to_string(gen) + ", never written to it by then";
    if (gen < least) return what + " reads the older generation " + std::to_string(gen) + ": a returned flush is lost";
  }
  return "";
}


void CheckAllImages(const Workload& w, uint64_t wanted, uint64_t seed, Tally* t) {
  const std::vector<RecordedEvent> events = w.record.Events();
  CrashImages images(events, w.record.DeviceSizes());
  // Crash points with writes in flight get the random variants; spread `wanted` over them.
  uint64_t busy_points = 0;
  {
    CrashImages dry(events, w.record.DeviceSizes());
    for (size_t p = 0; p <= events.size(); ++p) {
      dry.AdvanceTo(p);
      busy_points += dry.InFlight(w.meta_id) + dry.InFlight(w.log_id) > 0;
    }
  }
  const uint64_t per_busy = std::max<uint64_t>(2, (wanted + busy_points - 1) / std::max<uint64_t>(1, busy_points));
  std::mt19937_64 rng(seed * 7919 + 1);
  MemoryDevice meta(w.h.MainFileBytes(), 4096), log(w.h.LogBytes(), 4096);  // each image, in turn
  Promise promise;
  for (size_t p = 0; p <= events.size(); ++p) {
    images.AdvanceTo(p);
    if (p > 0 && events[p - 1].kind == RecordedEvent::Kind::kMark) {
      const uint64_t m = events[p - 1].mark;
      const uint32_t gen = static_cast<uint32_t>(m);
      if ((m & ~0xFFFFFFFFull) == kGenMark) promise.gen = gen;
      if ((m & ~0xFFFFFFFFull) == kFlushMark) promise.created = true, promise.flushed = &w.flushed.at(gen);
    }
    if (promise.flushed == nullptr) promise.flushed = &w.flushed.at(0);
    const bool busy = images.InFlight(w.meta_id) + images.InFlight(w.log_id) > 0;
    ++t->points;
    const uint64_t variants = busy ? per_busy : 1;
    for (uint64_t v = 0; v < variants; ++v) {
      const CrashMode mode = v == 0 ? CrashMode::kSyncedOnly : v == 1 ? CrashMode::kAllInOrder : CrashMode::kRandom;
      std::string how_meta, how_log;
      CHECK_OK(images.Build(w.meta_id, mode, &rng, &meta, &how_meta));
      CHECK_OK(images.Build(w.log_id, mode, &rng, &log, &how_log));
      bool refused = false;
      const std::string bad = CheckImage(w, promise, &meta, &log, &refused, t);
      ++t->images;
      t->synced += mode == CrashMode::kSyncedOnly;
      t->in_order += mode == CrashMode::kAllInOrder;
      t->random += mode == CrashMode::kRandom;
      t->refused_uncreated += refused && bad.empty();
      if (bad.empty()) continue;
      ++t->failures;
      if (t->examples.size() < 10)
        t->examples.push_back("crash before event " + std::to_string(p) + " of " + std::to_string(events.size()) +
                              " (main file: " + how_meta + "; log: " + how_log + "): " + bad);
    }
  }
}

// The torn-page rule's limits: a map page that fails verification is Corruption without
// the checkpoint mark in the journal descriptor, and with it too unless every entry names
// a slot that holds its row.
void TestDamagedPageIsNotATear() {
  TableHeader h;
  h.num_rows = kRows;
  h.dim = kDim;
  h.state_dim = kStateDim;
  h.segment_blocks = 4;
  h.table_uuid = 0x7EA2;
  CHECK_OK(ComputeLayout(&h, 1.0));
  MemoryDevice meta(h.MainFileBytes(), 4096), log(h.LogBytes(), 4096);
  uint8_t row[kRowBytes];
  uint64_t epoch = 0;
  {
    SegmentLog seg(h, &log, &meta);
    std::mt19937_64 rng(9);
    for (uint32_t gen = 1; seg.counters().map_checkpoints == 0; ++gen) {
      CHECK(gen < 1000) << "no checkpoint";
      CHECK_OK(seg.Reserve(100));
      for (int i = 0; i < 100; ++i) {
        const uint64_t r = gen == 1 ? uint64_t(i) : rng() % kRows;
        FillRow(r, gen, row);
        seg.Append(r, row);
      }
      CHECK_OK(seg.Commit());
    }
  }
  AlignedBuffer page(4096, 4096), desc(4096, 4096);
  IoOp page_op{h.map_offset, page.data(), 4096}, desc_op{h.journal_offset, desc.data(), 4096};
  CHECK_OK(meta.Read(&desc_op, 1));
  CHECK_OK(DecodeJournalDescriptor(desc.data(), h.table_uuid, &epoch));
  CHECK_OK(meta.Read(&page_op, 1));
  uint64_t entry;
  std::memcpy(&entry, page.data() + 8 * 5, 8);
  CHECK(entry != 0) << "row 5 was written";
  page.data()[8 * 5] ^= 0x40;  // row 5 now names another row's slot
  CHECK_OK(meta.Write(&page_op, 1));
  for (bool mark : {false, true}) {
    EncodeJournalDescriptor(desc.data(), h.table_uuid, epoch, mark);
    CHECK_OK(meta.Write(&desc_op, 1));
    SegmentLog s(h, &log, &meta);
    const Status st = s.LoadMap(-1);
    CHECK(st.code() == StatusCode::kCorruption) << "mark " << mark << ": " << testing::CodeName(st.code());
    CHECK(st.message().find("location-map page 0") != std::string::npos) << st.message();
    CHECK(!mark || st.message().find("row 5") != std::string::npos) << st.message();
  }
  // The page as written, under the mark: it verifies, and the table opens.
  page.data()[8 * 5] ^= 0x40;
  CHECK_OK(meta.Write(&page_op, 1));
  SegmentLog s(h, &log, &meta);
  CHECK_OK(s.LoadMap(-1));
  CHECK(s.Location(5) == entry) << s.Location(5) << " != " << entry;
}

}  // namespace
}  // namespace mtrains

int main(int, char**) {
  using namespace mtrains;
  const uint64_t wanted = EnvOr("POWER_LOSS_IMAGES", 1000);
  const uint64_t seed = EnvOr("POWER_LOSS_SEED", 1);
  testing::Run("power loss: a damaged map page is not taken for a torn one", TestDamagedPageIsNotATear);
  Workload w;
  testing::Run("power loss: record the workload", [&] { RunWorkload(seed, &w); });
  Tally t;
  testing::Run("power loss: check the crash images", [&] { CheckAllImages(w, wanted, seed, &t); });
  const SegmentLogCounters& c = w.counters;
  std::printf("power-loss: block_store images=%" PRIu64 " points=%" PRIu64 " synced=%" PRIu64 " in_order=%" PRIu64
               " random=%" PRIu64 " refused_before_create=%" PRIu64 " torn_map_page_opens=%" PRIu64 " failures=%" PRIu64
              " gc_segments_freed=%" PRIu64
              " map_checkpoints=%" PRIu64 " journal_commits=%" PRIu64 "\n",
              t.images, t.points, t.synced, t.in_order, t.random, t.refused_uncreated, t.torn_map_pages, t.failures,
              c.gc_segments_freed, c.map_checkpoints, c.map_journal_commits);
  for (const std::string& e : t.examples) std::printf("  FAIL %s\n", e.c_str());
  std::fflush(stdout);
  if (t.failures > 0 || t.images < wanted) {
    std::fprintf(stderr, "test_power_loss: %" PRIu64 " of %" PRIu64 " crash images failed (%" PRIu64 " wanted)\n",
                 t.failures, t.images, wanted);
    return 1;
  }
  std::fprintf(stderr, "test_power_loss: all passed\n");
  return 0;
}
