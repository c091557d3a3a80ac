// Standalone driver: a BlockStore across power cuts, not just kills.
//
// A scripted workload runs the real BlockStore on a MemoryEnv whose files record every
// write and sync in one order (csrc/testing/memory_env.h): Create (the header, synced),
// then generations of row writes through a small write-back row cache, each generation
// flushed except every fourth, a snapshot pinned and later unpinned, a close and reopen
// midway, enough writes on a small log to make the collector move rows and free segments,
// the map journal grow, and checkpoints rewrite map pages and start journal epochs; a clean
// close seals the journal. Every row version is recognisable (row id and generation in its
// bytes, the rest a hash of both).
//
// CrashImages then cuts the power before every event of the record, several times each:
// the state at the file's last sync, every in-flight write applied in order, and random
// orders of in-flight writes each lost, applied, or torn (each 512-byte sector old or new).
// Each image is opened with BlockStore::Open and every row read with BlockStore::Read.
// Checks, per image:
//   - once Create returned, the table opens (a refusal would lose flushes that returned);
//   - every row reads as a version written to it, no older than its version at the last
//     flush that returned (that flush is never lost), never a mix or garbage;
//   - a row never written by a returned flush may read as never written (its initial value).
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
#include "storage/block_store.h"
#include "storage/device.h"
#include "storage/lazy_init.h"
#include "storage/segment_log.h"
#include "testing/memory_env.h"
#include "testing/recording_device.h"
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

constexpr char kPath[] = "/power-loss/table";
// The log on two stripe files of its own: a sync of the main file (the map) makes none of
// the log durable, the strictest order the store must keep.
const std::vector<std::string> kStripes{"/power-loss/table.stripe0", "/power-loss/table.stripe1"};
constexpr uint32_t kPinGen = 20, kUnpinGen = 23, kReopenGen = 30;

struct Workload {
  TableHeader h;
  WriteRecord record;
  std::vector<std::string> files;  // the main file, then the stripes
  std::vector<uint32_t> file_ids;  // their devices in the record
  std::vector<std::vector<uint32_t>> written;             // per row: generations, ascending
  std::map<uint32_t, std::vector<uint32_t>> flushed;      // generation -> each row's version
  std::map<std::string, double> totals;                   // counters summed over the opens
};

StoreRuntimeOptions Runtime(Env* env) {
  StoreRuntimeOptions rt;
  rt.env = env;
  rt.dram_cache_mb = 0.01;  // ~140 rows: dirty rows are evicted into the log between flushes
  rt.queue_depth = 8;
  return rt;
}

void AddCounters(BlockStore* s, Workload* w) {
  for (const auto& [name, value] : s->Stats()) w->totals[name] += value;
}

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
  MemoryEnv env(&w->record);
  TableOptions t;
  t.num_rows = kRows;
  t.dim = kDim;
  t.state_dim = kStateDim;
  t.segment_blocks = 4;
  t.overprovision = 0.6;
  t.seed = 7;
  t.stripe_paths = kStripes;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(kPath, t, Runtime(&env), false, &s));
  w->h = s->header();
  w->files = {kPath};
  w->files.insert(w->files.end(), kStripes.begin(), kStripes.end());
  for (const std::string& f : w->files) {
    auto* file = dynamic_cast<RecordingDevice*>(env.File(f).get());
    CHECK(file != nullptr) << f << " is not recorded";
    w->file_ids.push_back(file->id());
  }
  std::vector<uint32_t> version(kRows, 0);
  w->written.assign(kRows, {});
  w->flushed[0] = version;
  w->record.Mark(kFlushMark | 0);

  std::mt19937_64 rng(seed);
  for (uint32_t gen = 1; gen <= kGenerations; ++gen) {
    w->record.Mark(kGenMark | gen);
    const std::vector<uint64_t> rows = RowsOf(gen, &rng);
    std::vector<int64_t> ids(rows.begin(), rows.end());
    std::vector<uint8_t> bytes(rows.size() * kRowBytes);
    for (size_t i = 0; i < rows.size(); ++i) {
      FillRow(rows[i], gen, bytes.data() + i * kRowBytes);
      version[rows[i]] = gen;
      w->written[rows[i]].push_back(gen);
    }
    CHECK_OK(s->Write(ids.data(), ids.size(), bytes.data()));
    if (gen % 4 == 3 && gen != kGenerations) continue;  // not flushed: the next flush takes it
    if (gen == kPinGen) {
      CHECK_OK(s->PinSnapshot(1));  // flushes, then keeps the live segments
    } else if (gen == kReopenGen) {
      AddCounters(s.get(), w);
      CHECK_OK(s->Close());
      s.reset();
      CHECK_OK(BlockStore::Open(kPath, Runtime(&env), &s));
    } else if (gen == kGenerations) {
      AddCounters(s.get(), w);
      CHECK_OK(s->Close());  // the clean close: flushed, journal sealed
    } else {
      if (gen == kUnpinGen) s->UnpinSnapshot(1);
      CHECK_OK(s->Flush());
    }
    w->flushed[gen] = version;
    w->record.Mark(kFlushMark | gen);
  }
  CHECK(w->totals["gc_segments_freed"] > 0 && w->totals["gc_rows_moved"] > 0)
      << "the workload did not make the collector free segments";
  CHECK(w->totals["map_checkpoints"] > 1 && w->totals["map_journal_commits"] > 1)
      << "the workload did not exercise both the map journal and checkpoints: "
      << w->totals["map_checkpoints"] << " checkpoints, " << w->totals["map_journal_commits"] << " journal commits";
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

// Opens the image with BlockStore::Open and reads every row with BlockStore::Read. Returns
// "" when it holds up to `p`, else what is wrong. `refused` tells whether it failed to open.
std::string CheckImage(const Workload& w, const Promise& p, const std::vector<std::shared_ptr<Device>>& images,
                       bool* refused, Tally* t) {
  *refused = false;
  MemoryEnv env;
  for (size_t i = 0; i < w.files.size(); ++i) env.PutFile(w.files[i], images[i]);
  std::unique_ptr<BlockStore> s;
  Status st = BlockStore::Open(kPath, Runtime(&env), &s);
  if (!st.ok()) {
    *refused = true;
    if (st.message().empty()) return "refused to open without saying why";
    if (!p.created) return "";  // Create never returned: there is no table to keep
    return "refused to open (" + std::string(testing::CodeName(st.code())) + "): " + st.message();
  }
  for (const auto& [name, value] : s->Stats())
    if (name == "torn_map_pages") t->torn_map_pages += value > 0;
  std::vector<int64_t> ids(kRows);
  for (uint64_t r = 0; r < kRows; ++r) ids[r] = static_cast<int64_t>(r);
  std::vector<uint8_t> out(kRows * kRowBytes);
  st = s->Read(ids.data(), kRows, out.data());
  if (!p.created) return "";
  const TableHeader& h = w.h;
  uint8_t initial[kRowBytes];
  for (uint64_t r = 0; r < kRows; ++r) {
    const uint32_t least = (*p.flushed)[r];
    const std::string what = "row " + std::to_string(r) + " (version " + std::to_string(least) +
                             " at the last returned flush, generation " + std::to_string(p.gen) + " begun)";
    if (!st.ok()) {  // find the row the batch failed on
      const Status one = s->Read(&ids[r], 1, out.data() + r * kRowBytes);
      if (!one.ok()) return what + " cannot be read (" + testing::CodeName(one.code()) + "): " + one.message();
    }
    const uint8_t* data = out.data() + r * kRowBytes;
    const int64_t gen = GenerationOf(r, data);
    if (gen < 0) {
      LazyInitRow(h.seed, r, h.init_lo, h.init_hi, h.dim, h.state_dim, h.dtype, initial);
      if (std::memcmp(initial, data, kRowBytes) != 0)
        return what + " reads bytes that are no version of it (a mix or garbage)";
      if (least > 0) return what + " is lost: it reads as never written";
      continue;
    }
    const std::vector<uint32_t>& gens = w.written[r];
    if (!std::binary_search(gens.begin(), gens.end(), static_cast<uint32_t>(gen)) || gen > p.gen)
      return what + " reads generation " + std::to_string(gen) + ", never written to it by then";
    if (gen < least) return what + " reads the older generation " + std::to_string(gen) + ": a returned flush is lost";
  }
  if (!st.ok()) return "reading every row failed, each row alone did not: " + st.message();
  st = s->Close();
  if (!st.ok()) return "the opened image does not close: " + st.message();
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
      bool busy = false;
      for (uint32_t id : w.file_ids) busy = busy || dry.InFlight(id) > 0;
      busy_points += busy;
    }
  }
  const uint64_t per_busy = std::max<uint64_t>(2, (wanted + busy_points - 1) / std::max<uint64_t>(1, busy_points));
  std::mt19937_64 rng(seed * 7919 + 1);
  std::vector<std::shared_ptr<Device>> image;  // each file's bytes, image after image
  const std::vector<uint64_t> sizes = w.record.DeviceSizes();
  for (uint32_t id : w.file_ids) image.push_back(std::make_shared<MemoryDevice>(sizes[id], 4096));
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
    bool busy = false;
    for (uint32_t id : w.file_ids) busy = busy || images.InFlight(id) > 0;
    ++t->points;
    const uint64_t variants = busy ? per_busy : 1;
    for (uint64_t v = 0; v < variants; ++v) {
      const CrashMode mode = v == 0 ? CrashMode::kSyncedOnly : v == 1 ? CrashMode::kAllInOrder : CrashMode::kRandom;
      std::string how;
      for (size_t i = 0; i < w.file_ids.size(); ++i) {
        std::string one;
        CHECK_OK(images.Build(w.file_ids[i], mode, &rng, image[i].get(), &one));
        how += (i == 0 ? "" : "; ") + w.files[i] + ": " + one;
      }
      bool refused = false;
      const std::string bad = CheckImage(w, promise, image, &refused, t);
      ++t->images;
      t->synced += mode == CrashMode::kSyncedOnly;
      t->in_order += mode == CrashMode::kAllInOrder;
      t->random += mode == CrashMode::kRandom;
      t->refused_uncreated += refused && bad.empty();
      if (bad.empty()) continue;
      ++t->failures;
      if (t->examples.size() < 10)
        t->examples.push_back("crash before event " + std::to_string(p) + " of " + std::to_string(events.size()) +
                              " (" + how + "): " + bad);
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
    const Status st = s.LoadMap();
    CHECK(st.code() == StatusCode::kCorruption) << "mark " << mark << ": " << testing::CodeName(st.code());
    CHECK(st.message().find("location-map page 0") != std::string::npos) << st.message();
    CHECK(!mark || st.message().find("row 5") != std::string::npos) << st.message();
  }
  // The page as written, under the mark: it verifies, and the table opens.
  page.data()[8 * 5] ^= 0x40;
  CHECK_OK(meta.Write(&page_op, 1));
  SegmentLog s(h, &log, &meta);
  CHECK_OK(s.LoadMap());
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
  auto total = [&](const char* name) { return static_cast<uint64_t>(w.totals[name]); };
  std::printf("power-loss: block_store images=%" PRIu64 " points=%" PRIu64 " synced=%" PRIu64 " in_order=%" PRIu64
               " random=%" PRIu64 " refused_before_create=%" PRIu64 " torn_map_page_opens=%" PRIu64 " failures=%" PRIu64
              " gc_segments_freed=%" PRIu64
              " map_checkpoints=%" PRIu64 " journal_commits=%" PRIu64 "\n",
              t.images, t.points, t.synced, t.in_order, t.random, t.refused_uncreated, t.torn_map_pages, t.failures,
              total("gc_segments_freed"), total("map_checkpoints"), total("map_journal_commits"));
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
