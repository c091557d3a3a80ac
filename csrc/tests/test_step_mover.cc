// Standalone driver (no torch, no Python) for the kernel's step mover (csrc/kernel/): rows
// between cache slots and a mapped table (checksummed, flagged, plain) or a BlockStore on
// an in-memory Env, loads past the TBE, bad ids, corrupt rows, counters read while moves
// run. Run plain and under ASan/UBSan and TSan by scripts/sanitize.sh.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "kernel/block_store_tier_rows.h"
#include "kernel/mapped_tier_rows.h"
#include "kernel/step_mover.h"
#include "storage/block_store.h"
#include "storage/lazy_init.h"
#include "testing/memory_env.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::CodeName;
using testing::Run;

constexpr uint32_t kDim = 6, kStateDim = 1;
constexpr size_t kRowBytes = (kDim + kStateDim) * 4, kWeightBytes = kDim * 4, kStateBytes = kStateDim * 4;
constexpr uint64_t kRows = 200;
constexpr int64_t kSlots = 32;
constexpr uint64_t kSeed = 7;

// The TBE side: weights and state of kSlots slots.
struct Tbe {
  std::vector<uint8_t> weights = std::vector<uint8_t>(kSlots * kWeightBytes);
  std::vector<uint8_t> state = std::vector<uint8_t>(kSlots * kStateBytes);
  SlotRows slots() {
    SlotRows s;
    s.weights = weights.data();
    s.weight_bytes = kWeightBytes;
    s.state = state.data();
    s.state_bytes = kStateBytes;
    s.slots = kSlots;
    return s;
  }
  std::vector<uint8_t> Row(int64_t slot) {
    std::vector<uint8_t> r(kRowBytes);
    slots().CopyOut(slot, r.data());
    return r;
  }
};

// Row bytes a test writes: id and version in the first two words, a hash after.
std::vector<uint8_t> MakeRow(int64_t id, uint32_t version) {
  std::vector<uint8_t> r(kRowBytes);
  for (size_t i = 0; i < kRowBytes / 4; ++i) {
    const uint32_t w = i == 0 ? uint32_t(id) : i == 1 ? version : uint32_t(id * 2654435761u + version * 40503u + i);
    std::memcpy(r.data() + 4 * i, &w, 4);
  }
  return r;
}

std::vector<uint8_t> LazyRow(int64_t id) {
  std::vector<uint8_t> r(kRowBytes);
  LazyInitRow(kSeed, uint64_t(id), -0.5, 0.5, kDim, kStateDim, DType::kFloat32, r.data());
  return r;
}

struct Mapped {
  std::vector<uint8_t> rows = std::vector<uint8_t>(kRows * kRowBytes, 0);
  std::vector<uint32_t> sums = std::vector<uint32_t>(kRows, 0);
  std::vector<uint8_t> flags = std::vector<uint8_t>(kRows, 0);
  std::unique_ptr<MappedTierRows> Tier(MappedTierRows::Words kind) {
    MappedTierRows::Layout l;
    l.rows = rows.data();
    l.num_rows = kRows;
    l.kind = kind;
    l.words = kind == MappedTierRows::Words::kChecksums ? static_cast<void*>(sums.data())
              : kind == MappedTierRows::Words::kWrittenFlags ? static_cast<void*>(flags.data())
                                                              : nullptr;
    l.dim = kDim;
    l.state_dim = kStateDim;
    l.seed = kSeed;
    l.init_lo = -0.5;
    l.init_hi = 0.5;
    l.name = "table.scm";
    l.first_row_offset = 4096;
    return std::make_unique<MappedTierRows>(l);
  }
};

Status MoveOne(StepMover* mover, Tbe* tbe, const std::vector<int64_t>& evict_ids, const std::vector<int64_t>& evict_slots,
               const std::vector<int64_t>& load_ids, const std::vector<int64_t>& load_slots, MoveResult* result,
               int64_t tbe_slots = kSlots) {
  TableMove m;
  m.slots = tbe->slots();
  m.slots.slots = tbe_slots;
  m.evict_ids = evict_ids.data();
  m.evict_slots = evict_slots.data();
  m.num_evict = evict_ids.size();
  m.load_ids = load_ids.data();
  m.load_slots = load_slots.data();
  m.num_load = load_ids.size();
  return mover->Move(m, result);
}

// Loads, write-backs and reloads through `tier`: what a slot gets is what the tier holds.
// `lazy_rows`: never-written rows read as their initial value; `counts_lazy`: the tier
// counts them (a BlockStore counts them in its own stats).
void CheckRoundTrip(std::unique_ptr<TierRows> tier, bool lazy_rows, bool counts_lazy) {
  StepMover mover(1);
  mover.SetTier(0, std::move(tier));
  Tbe tbe;
  MoveResult r;
  // Step 1: rows 10..19 into slots 0..9 (never written: their initial values).
  std::vector<int64_t> ids, slots;
  for (int64_t i = 0; i < 10; ++i) ids.push_back(10 + i), slots.push_back(i);
  CHECK_OK(MoveOne(&mover, &tbe, {}, {}, ids, slots, &r));
  for (int64_t i = 0; i < 10 && lazy_rows; ++i)
    CHECK(tbe.Row(i) == LazyRow(10 + i)) << "slot " << i << " is not row " << 10 + i << "'s initial value";
  CHECK(r.lazy_rows == (counts_lazy ? 10u : 0u)) << r.lazy_rows;
  // Training changes them; step 2 evicts them (written back) and loads rows 100..109.
  for (int64_t i = 0; i < 10; ++i) tbe.slots().CopyIn(MakeRow(10 + i, 1).data(), i);
  std::vector<int64_t> load2, slots2;
  for (int64_t i = 0; i < 10; ++i) load2.push_back(100 + i), slots2.push_back(i);
  CHECK_OK(MoveOne(&mover, &tbe, ids, slots, load2, slots2, &r));
  // Step 3: rows 10..19 come back into slots 20..29 with the values written back.
  std::vector<int64_t> slots3;
  for (int64_t i = 0; i < 10; ++i) slots3.push_back(20 + i);
  CHECK_OK(MoveOne(&mover, &tbe, {}, {}, ids, slots3, &r));
  for (int64_t i = 0; i < 10; ++i) CHECK(tbe.Row(20 + i) == MakeRow(10 + i, 1)) << "row " << 10 + i << " lost its write-back";
  CHECK(r.lazy_rows == 0) << r.lazy_rows;
  // A row both written back and loaded in one move loads its new value; loads past the
  // TBE (slots >= 24 here) come back as overflow rows, in order, after the write-back.
  tbe.slots().CopyIn(MakeRow(10, 2).data(), 20);
  CHECK_OK(MoveOne(&mover, &tbe, {10}, {20}, {11, 10, 12}, {2, 25, 3}, &r, 24));
  CHECK(r.overflow_positions == std::vector<int64_t>{1}) << r.overflow_positions.size();
  CHECK(r.overflow_rows == MakeRow(10, 2)) << "overflow load did not read the row just written back";
  CHECK(tbe.Row(2) == MakeRow(11, 1) && tbe.Row(3) == MakeRow(12, 1)) << "in-TBE loads beside an overflow load";
  // Bad ids: OutOfRange before anything is written; an evicted slot past the TBE.
  const std::vector<uint8_t> before = tbe.Row(5);
  Status st = MoveOne(&mover, &tbe, {int64_t(kRows)}, {0}, {}, {}, &r);
  CHECK(st.code() == StatusCode::kOutOfRange) << CodeName(st.code()) << " " << st.message();
  st = MoveOne(&mover, &tbe, {}, {}, {-1}, {5}, &r);
  CHECK(st.code() == StatusCode::kOutOfRange) << CodeName(st.code());
  CHECK(tbe.Row(5) == before) << "a refused move changed a slot";
  st = MoveOne(&mover, &tbe, {3}, {kSlots}, {}, {}, &r);
  CHECK(st.code() == StatusCode::kInvalidArgument) << CodeName(st.code());
  const MoveCounters c = mover.counters(0);
  CHECK(c.moves == 4 && c.rows_loaded == 33 && c.rows_written_back == 11) << c.moves << " " << c.rows_loaded << " " << c.rows_written_back;
  CHECK(c.cpu.read_ns > 0) << "no read time counted";
}

void TestMappedChecksummed() {
  Mapped m;
  CheckRoundTrip(m.Tier(MappedTierRows::Words::kChecksums), true, true);
  // Written rows carry their checksum; a flipped bit is reported, naming the row.
  for (int64_t id = 10; id < 20; ++id) {
    const uint32_t crc = Crc32c(0, m.rows.data() + id * kRowBytes, kRowBytes);
    CHECK(m.sums[id] == (crc ? crc : 1u)) << "row " << id;
  }
  StepMover mover(1);
  mover.SetTier(0, m.Tier(MappedTierRows::Words::kChecksums));
  m.rows[15 * kRowBytes + 3] ^= 0x10;
  Tbe tbe;
  MoveResult r;
  Status st = MoveOne(&mover, &tbe, {}, {}, {14, 15}, {0, 1}, &r);
  CHECK(st.code() == StatusCode::kCorruption) << CodeName(st.code());
  CHECK(st.message().find("table.scm: row 15 (byte offset " + std::to_string(4096 + 15 * kRowBytes) + ")") == 0)
      << st.message();
  MoveResult unused;
  st = MoveOne(&mover, &tbe, {}, {}, {15}, {40}, &unused, kSlots);  // the overflow read path
  CHECK(st.code() == StatusCode::kCorruption) << CodeName(st.code());
}

void TestMappedFlagsAndPlain() {
  Mapped flagged;
  CheckRoundTrip(flagged.Tier(MappedTierRows::Words::kWrittenFlags), true, true);
  for (int64_t id = 10; id < 20; ++id) CHECK(flagged.flags[id] == 1) << "row " << id << " not marked written";
  Mapped plain;
  CheckRoundTrip(plain.Tier(MappedTierRows::Words::kNone), false, false);
}

void TestNoTier() {
  StepMover mover(2);
  Tbe tbe;
  MoveResult r;
  TableMove m;
  m.table = 1;
  m.slots = tbe.slots();
  CHECK(mover.Move(m, &r).code() == StatusCode::kInvalidArgument) << "a table without a tier moved";
  m.table = 5;
  CHECK(mover.Move(m, &r).code() == StatusCode::kInvalidArgument) << "a table past the mover moved";
}

std::unique_ptr<BlockStore> MemoryStore(MemoryEnv* env) {
  TableOptions t;
  t.num_rows = kRows;
  t.dim = kDim;
  t.state_dim = kStateDim;
  t.seed = kSeed;
  t.init_lo = -0.5;
  t.init_hi = 0.5;
  t.segment_blocks = 4;
  StoreRuntimeOptions rt;
  rt.env = env;
  rt.dram_cache_mb = 0;
  rt.queue_depth = 4;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create("/mem/mover.blk", t, rt, false, &s));
  return s;
}

void TestBlockStore() {
  MemoryEnv env;
  std::unique_ptr<BlockStore> store = MemoryStore(&env);
  CheckRoundTrip(std::make_unique<BlockStoreTierRows>(store.get()), true, false);
  // The store holds what the slots wrote back.
  std::vector<uint8_t> out(kRowBytes);
  const int64_t id = 11;
  CHECK_OK(store->Read(&id, 1, out.data()));
  CHECK(out == MakeRow(11, 1)) << "the store does not hold row 11's write-back";
  CHECK_OK(store->Close());
}

// Moves on one thread while another reads the counters and a third swaps another table's
// tier (TSan checks the locking).
void TestConcurrentCounters() {
  MemoryEnv env;
  std::unique_ptr<BlockStore> store = MemoryStore(&env);
  Mapped mapped;
  StepMover mover(2);
  mover.SetTier(0, std::make_unique<BlockStoreTierRows>(store.get()));
  mover.SetTier(1, mapped.Tier(MappedTierRows::Words::kChecksums));
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) (void)mover.counters(0), (void)mover.counters(1);
  });
  std::thread swapper([&] {
    for (int i = 0; i < 50; ++i) mover.SetTier(1, mapped.Tier(MappedTierRows::Words::kChecksums));
  });
  Tbe tbe;
  MoveResult r;
  std::mt19937_64 rng(3);
  for (int step = 0; step < 200; ++step) {
    std::vector<int64_t> ids(8), slots(8);
    for (int i = 0; i < 8; ++i) ids[i] = int64_t(rng() % kRows), slots[i] = i;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    slots.resize(ids.size());
    CHECK_OK(MoveOne(&mover, &tbe, {}, {}, ids, slots, &r));
  }
  done = true;
  reader.join();
  swapper.join();
  CHECK(mover.counters(0).moves == 200) << mover.counters(0).moves;
  CHECK_OK(store->Close());
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("mapped rows with checksums: round trip, corruption, bad ids, overflow", TestMappedChecksummed);
  Run("mapped rows with written flags, and plain rows", TestMappedFlagsAndPlain);
  Run("a table without a tier", TestNoTier);
  Run("block store rows: round trip, bad ids, overflow", TestBlockStore);
  Run("counters and tier swaps beside moves", TestConcurrentCounters);
  std::fprintf(stderr, "test_step_mover: all passed\n");
  return 0;
}
