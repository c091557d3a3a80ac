// Standalone driver for the row-cache index (SetAssociativeCache), driven the way
// TieredEmbeddingBags drives it: a prefetch thread plans steps ahead while the training
// thread marks a planned step dirty, reads counters() and capacity(), takes the dirty
// rows (flush) and lists occupied() slots (set_rows, reads through the cache). Run plain
// and under ASan/UBSan and TSan by scripts/sanitize.sh.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/frequency_sketch.h"
#include "cache/set_associative_cache.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

// Checks one step's plan: each index has a slot below capacity, a row maps to one slot,
// and nothing is both loaded and written back.
void CheckPlan(const std::vector<int64_t>& idx, const StepPlan& p, uint64_t capacity) {
  CHECK(p.slot_of_index.size() == idx.size());
  std::unordered_map<int64_t, int64_t> slot_of_row;
  std::unordered_map<int64_t, int64_t> row_of_slot;
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t s = p.slot_of_index[i];
    CHECK(s >= 0 && uint64_t(s) < capacity) << "slot " << s << " outside capacity " << capacity;
    auto [it, fresh] = slot_of_row.emplace(idx[i], s);
    CHECK(it->second == s) << "row " << idx[i] << " got two slots";
    auto [jt, fresh2] = row_of_slot.emplace(s, idx[i]);
    CHECK(jt->second == idx[i]) << "slot " << s << " holds two rows of one step";
  }
  std::set<int64_t> loaded(p.load_rows.begin(), p.load_rows.end());
  for (int64_t r : p.evict_rows) CHECK(!loaded.count(r)) << "row " << r << " evicted and loaded";
}

// Sequential plans against a model of which row each slot holds.
void TestSequentialModel(CachePolicy policy) {
  SetAssociativeCache cache(64, 8, policy);
  std::mt19937_64 rng(3);
  std::unordered_map<int64_t, int64_t> row_in_slot;  // model: slot -> row
  std::set<int64_t> dirty_rows;
  StepPlan plan;
  for (int64_t step = 0; step < 3000; ++step) {
    std::vector<int64_t> idx(1 + rng() % 40);
    for (auto& r : idx) r = static_cast<int64_t>(rng() % (step % 100 < 50 ? 100 : 5000));
    const bool train = step % 3 != 0;
    cache.Plan(idx.data(), idx.size(), step, step - 1, train, &plan);
    CheckPlan(idx, plan, cache.capacity());
    for (size_t k = 0; k < plan.evict_rows.size(); ++k) {
      CHECK(row_in_slot[plan.evict_slots[k]] == plan.evict_rows[k]);
      CHECK(dirty_rows.erase(plan.evict_rows[k]) == 1) << "evicted row " << plan.evict_rows[k] << " was clean";
    }
    for (size_t k = 0; k < plan.load_rows.size(); ++k) {
      auto it = row_in_slot.find(plan.load_slots[k]);
      if (it != row_in_slot.end() && !std::count(plan.evict_rows.begin(), plan.evict_rows.end(), it->second))
        dirty_rows.erase(it->second);  // a clean victim
      row_in_slot[plan.load_slots[k]] = plan.load_rows[k];
    }
    for (size_t i = 0; i < idx.size(); ++i) {
      CHECK(row_in_slot[plan.slot_of_index[i]] == idx[i]) << "step " << step << " index " << i;
      if (train) dirty_rows.insert(idx[i]);
    }
    if (step % 97 == 0) {
      std::vector<int64_t> rows, slots;
      cache.TakeDirty(step + 1, &rows, &slots);
      CHECK(std::set<int64_t>(rows.begin(), rows.end()) == dirty_rows) << "take_dirty disagrees with the model";
      dirty_rows.clear();
    }
  }
  std::vector<int64_t> rows, slots;
  cache.Occupied(&rows, &slots);
  CHECK(rows.size() == row_in_slot.size());
  for (size_t k = 0; k < rows.size(); ++k) CHECK(row_in_slot.at(slots[k]) == rows[k]);
  std::vector<int64_t> bad{int64_t(cache.capacity())};
  bool threw = false;
  try {
    cache.MarkDirty(bad.data(), 1);
  } catch (const std::out_of_range&) {
    threw = true;
  }
  CHECK(threw) << "MarkDirty accepted a slot outside the cache";
}

// The kernel's threads: a prefetch thread plans steps (up to `ahead` queued) while the
// training thread consumes them in order, marking each dirty and polling the index.
// `map_rows` > 0: the cache keeps a dense row-to-slot map over that many rows.
void TestPrefetchPipeline(CachePolicy policy, uint64_t map_rows = 0) {
  SetAssociativeCache cache(256, 16, policy, map_rows);  // small: overflow slots get used
  struct Job {
    int64_t step;
    std::vector<int64_t> idx;
    StepPlan plan;
    uint64_t capacity;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> ready;
  std::atomic<int64_t> last_forward{-1};
  constexpr int64_t kSteps = 1500;
  constexpr size_t kAhead = 3;
  std::thread prefetch([&] {
    std::mt19937_64 rng(5);
    for (int64_t step = 0; step < kSteps; ++step) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return ready.size() < kAhead; });
      }
      Job j;
      j.step = step;
      j.idx.resize(100 + rng() % 200);
      for (auto& r : j.idx) r = static_cast<int64_t>(rng() % 3000);
      const int64_t oldest_live = std::max<int64_t>(0, last_forward.load());
      cache.Plan(j.idx.data(), j.idx.size(), step, oldest_live, step % 5 != 0, &j.plan);
      j.capacity = cache.capacity();
      {
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back(std::move(j));
      }
      cv.notify_all();
    }
  });
  uint64_t polls = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    Job j;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !ready.empty(); });
      j = std::move(ready.front());
      ready.pop_front();
    }
    cv.notify_all();
    CHECK(j.step == step);
    CheckPlan(j.idx, j.plan, j.capacity);
    last_forward.store(step);
    // forward(): planned in eval mode, trains after all (prefetches may be running).
    if (step % 5 == 0) cache.MarkDirty(j.plan.slot_of_index.data(), j.plan.slot_of_index.size());
    // cache_stats() and the overflow check of _finish, concurrently with plans.
    const CacheCounters c = cache.counters();
    CHECK(c.hits + c.misses == c.unique_rows) << c.hits << " + " << c.misses << " != " << c.unique_rows;
    CHECK(cache.capacity() >= 256);
    if (step % 50 == 0) {
      std::vector<int64_t> rows, slots;
      cache.Occupied(&rows, &slots);
      CHECK(rows.size() == slots.size() && rows.size() <= cache.capacity());
      cache.TakeDirty(std::max<int64_t>(0, step), &rows, &slots);
      CHECK(rows.size() == slots.size());
    }
    ++polls;
  }
  prefetch.join();
  CHECK(polls == uint64_t(kSteps));
}

// Everything two caches return, the same calls made on both: one with a dense row-to-slot
// map, one without. The map is only a faster lookup, so the two must agree exactly.
class MapTwins {
 public:
  MapTwins(uint64_t slots, uint32_t ways, CachePolicy policy, uint64_t rows)
      : plain_(slots, ways, policy), mapped_(slots, ways, policy, rows) {
    CHECK(plain_.map_rows() == 0 && mapped_.map_rows() == rows);
  }

  void Plan(const std::vector<int64_t>& idx, int64_t step, int64_t oldest_live, bool train) {
    plain_.Plan(idx.data(), idx.size(), step, oldest_live, train, &a_);
    mapped_.Plan(idx.data(), idx.size(), step, oldest_live, train, &b_);
    CHECK(a_.slot_of_index == b_.slot_of_index) << "step " << step << ": slots differ";
    CHECK(a_.load_rows == b_.load_rows && a_.load_slots == b_.load_slots) << "step " << step << ": loads differ";
    CHECK(a_.evict_rows == b_.evict_rows && a_.evict_slots == b_.evict_slots) << "step " << step << ": evictions differ";
    CHECK(plain_.capacity() == mapped_.capacity()) << "step " << step;
  }
  void Forget(const std::vector<int64_t>& rows) {
    CHECK(plain_.Forget(rows.data(), rows.size()) == mapped_.Forget(rows.data(), rows.size()));
  }
  void MarkDirty(const std::vector<int64_t>& slots) {
    plain_.MarkDirty(slots.data(), slots.size());
    mapped_.MarkDirty(slots.data(), slots.size());
  }
  void CheckSame(int64_t live_step) {
    std::vector<int64_t> ra, sa, rb, sb;
    plain_.TakeDirty(live_step, &ra, &sa);
    mapped_.TakeDirty(live_step, &rb, &sb);
    CHECK(ra == rb && sa == sb) << "dirty rows differ";
    plain_.Occupied(&ra, &sa);
    mapped_.Occupied(&rb, &sb);
    CHECK(ra == rb && sa == sb) << "occupied slots differ";
    const CacheCounters x = plain_.counters(), y = mapped_.counters();
    CHECK(x.lookups == y.lookups && x.unique_rows == y.unique_rows && x.hits == y.hits && x.misses == y.misses &&
          x.evictions == y.evictions && x.overflow_assignments == y.overflow_assignments)
        << "counters differ: hits " << x.hits << " vs " << y.hits << ", evictions " << x.evictions << " vs "
        << y.evictions;
  }
  const StepPlan& plan() const { return b_; }
  const CacheCounters counters() const { return mapped_.counters(); }

 private:
  SetAssociativeCache plain_, mapped_;
  StepPlan a_, b_;
};

// Random steps with evictions, overflow (several live steps lock ways), Forget (a virtual
// table's evictions), MarkDirty and TakeDirty: every plan is the same with the map and
// without, for caches of one set, of sets and a tail of overflow slots, and larger than
// their table.
void TestMapPlansIdentical(CachePolicy policy) {
  struct Shape {
    uint64_t slots, rows;
    uint32_t ways;
  };
  for (const Shape& shape : {Shape{64, 500, 8}, Shape{1000, 5000, 32}, Shape{37, 300, 8}, Shape{5, 40, 8},
                             Shape{300, 100, 16}}) {
    MapTwins twins(shape.slots, shape.ways, policy, shape.rows);
    std::mt19937_64 rng(shape.slots * 31 + shape.rows);
    int64_t oldest_live = 0;
    for (int64_t step = 0; step < 2000; ++step) {
      std::vector<int64_t> idx(1 + rng() % (step % 7 == 0 ? 400 : 60));
      const uint64_t span = step % 200 < 100 ? shape.rows / 5 + 1 : shape.rows;  // hot phases, then the table
      for (auto& r : idx) r = int64_t(rng() % 3 == 0 ? rng() % span : (rng() % 8) * (rng() % 8) % shape.rows);
      if (rng() % 3 == 0) oldest_live = step - int64_t(rng() % 4);
      twins.Plan(idx, step, oldest_live, rng() % 4 != 0);
      if (step % 13 == 0) {
        std::vector<int64_t> gone(1 + rng() % 20);
        for (auto& r : gone) r = int64_t(rng() % shape.rows);
        twins.Forget(gone);
      }
      if (step % 17 == 0) twins.MarkDirty({twins.plan().slot_of_index.front()});
      if (step % 29 == 0) twins.CheckSame(oldest_live);
    }
    twins.CheckSame(0);
    const CacheCounters c = twins.counters();
    CHECK(c.hits > 0) << "slots " << shape.slots << ": a workload without hits";
    if (shape.slots < shape.rows) {
      CHECK(c.evictions > 0) << "slots " << shape.slots << ": a workload without evictions";
    }
    if (shape.slots < 100) {
      CHECK(c.overflow_assignments > 0) << "slots " << shape.slots << ": no overflow slot used";
    }
  }
}

// Ids at or past the map's rows (the caller validates ids against the table, so none should
// come) are found by the set scan and never written to the map: plans still agree.
void TestMapRowsOutsideTheMap() {
  MapTwins twins(64, 8, CachePolicy::kLru, 100);
  std::mt19937_64 rng(17);
  for (int64_t step = 0; step < 500; ++step) {
    std::vector<int64_t> idx(1 + rng() % 50);
    for (auto& r : idx) r = int64_t(rng() % 160);  // a third past the map
    twins.Plan(idx, step, step - int64_t(rng() % 3), true);
    if (step % 11 == 0) twins.Forget({int64_t(rng() % 160), int64_t(rng() % 160)});
  }
  twins.CheckSame(0);
}

void TestMapConfiguration() {
  std::string what;
  try {
    SetAssociativeCache too_many(SetAssociativeCache::kMaxMapSlots, 32, CachePolicy::kLru, 10);
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  CHECK(what.find("32-bit") != std::string::npos) << "a map over 2^32 - 1 slots was accepted: " << what;
  SetAssociativeCache without(8, 8, CachePolicy::kLru);
  CHECK(without.map_rows() == 0);
}

// Count-min bound on a Zipf(1.05) stream with a fixed seed, within one sample period (no
// aging): every estimate >= min(true count, 15); the over-estimate exceeds e / width * N + 1
// (N: additions that reached the counters; +1: a doorkeeper false positive) for at most
// delta = e^-4 of the keys, unseen keys included.
void TestSketchErrorBound() {
  FrequencySketch sketch(4096);  // width 4096, sample 40960 additions
  CHECK(sketch.width() == 4096 && sketch.sample_size() == 40960);
  constexpr uint64_t kKeys = 50000, kAdds = 30000;
  std::vector<double> cdf(kKeys);
  double sum = 0;
  for (uint64_t k = 0; k < kKeys; ++k) cdf[k] = sum += std::pow(double(k + 1), -1.05);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, sum);
  std::unordered_map<uint64_t, uint32_t> truth;
  for (uint64_t i = 0; i < kAdds; ++i) {
    const uint64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
    const uint64_t key = rank * 0x9E3779B97F4A7C15ull + 17;  // scattered ids
    CHECK(!sketch.Add(key)) << "aged within the first sample";
    ++truth[key];
  }
  uint64_t counted = 0;  // additions past a key's first: what reached the counters
  for (const auto& [key, c] : truth) counted += c - 1;
  const double bound = std::exp(1.0) / sketch.width() * counted + 1;
  uint64_t over = 0, keys = 0;
  auto check = [&](uint64_t key, uint32_t c) {
    const uint32_t est = sketch.Estimate(key);
    CHECK(est >= std::min<uint32_t>(c, FrequencySketch::kMaxCount + 1))
        << "key " << key << " estimate " << est << " below its count " << c;
    over += est > c + bound;
    ++keys;
  };
  for (const auto& [key, c] : truth) check(key, c);
  for (uint64_t k = 0; k < kKeys; ++k) {  // unseen keys too (their true count is 0)
    const uint64_t key = k * 0x9E3779B97F4A7C15ull + 17;
    if (!truth.count(key)) check(key, 0);
  }
  CHECK(over <= std::exp(-4.0) * keys) << over << " of " << keys << " keys over the bound " << bound;
  CHECK(sketch.Estimate(truth.begin()->first) >= 1);
}

// Aging: after sample_size additions every counter is halved and the doorkeeper cleared.
void TestSketchAgingHalves() {
  FrequencySketch sketch(64);  // width 64, sample 640
  for (int i = 0; i < 12; ++i) CHECK(!sketch.Add(7));
  CHECK(sketch.Estimate(7) == 12) << sketch.Estimate(7);  // doorkeeper 1 + counters 11
  CHECK(sketch.Estimate(8) == 0);
  bool aged = false;
  while (!aged) aged = sketch.Add(1000);  // one other key fills the sample
  CHECK(sketch.additions() == 0);
  CHECK(sketch.Estimate(7) == 5) << sketch.Estimate(7);  // 11 / 2, doorkeeper cleared
  CHECK(sketch.Estimate(1000) == 7) << sketch.Estimate(1000);  // saturated 15 / 2
  sketch.Add(7);  // first addition of the new period: the doorkeeper only
  CHECK(sketch.Estimate(7) == 6) << sketch.Estimate(7);
}

// TinyLFU: a row seen once takes the window's slot rather than evicting a frequent row,
// and a frequent row in the window wins the contest against main's victim.
void TestTinyLfuAdmission() {
  SetAssociativeCache cache(8, 8, CachePolicy::kTinyLfu);  // one set, a one-way window
  StepPlan plan;
  int64_t step = 0;
  for (int rep = 0; rep < 6; ++rep)  // rows 0..7, each in six steps: all frequent
    for (int64_t r = 0; r < 8; ++r, ++step) cache.Plan(&r, 1, step, step, false, &plan);
  for (int64_t r = 100; r < 140; ++r, ++step) {  // a scan of rows seen once
    cache.Plan(&r, 1, step, step, false, &plan);
    CHECK(plan.load_rows.size() == 1);
  }
  std::vector<int64_t> rows, slots;
  cache.Occupied(&rows, &slots);
  const std::set<int64_t> resident(rows.begin(), rows.end());
  int frequent = 0;
  int64_t lost = -1;
  for (int64_t r = 0; r < 8; ++r) {
    frequent += resident.count(r);
    if (!resident.count(r)) lost = r;
  }
  CHECK(frequent == 7) << "the scan evicted " << 8 - frequent << " frequent rows (one window way: 1 expected)";
  CHECK(resident.count(139) == 1);
  // The one frequent row lost was the window's first occupant (a tie with main's victim
  // does not promote). Coming back it takes the window slot...
  cache.Plan(&lost, 1, step, step, false, &plan);
  ++step;
  CHECK(plan.load_rows == std::vector<int64_t>{lost});
  // ...then a new row pushes it out of the window: now seen seven times, more than main's
  // victim (six), it moves to main and the victim leaves; the scan rows after it only
  // ever take the window slot.
  for (int64_t x = 200; x < 210; ++x, ++step) cache.Plan(&x, 1, step, step, false, &plan);
  cache.Occupied(&rows, &slots);
  const std::set<int64_t> after(rows.begin(), rows.end());
  CHECK(after.count(lost) == 1) << "the frequent window row lost to main's victim";
  frequent = 0;
  for (int64_t r = 0; r < 8; ++r) frequent += after.count(r);
  CHECK(frequent == 7 && after.count(209) == 1) << frequent << " frequent rows left";
}

void TestParsePolicy() {
  CHECK(ParseCachePolicy("lru") == CachePolicy::kLru);
  CHECK(ParseCachePolicy("lfu") == CachePolicy::kLfu);
  CHECK(ParseCachePolicy("tinylfu") == CachePolicy::kTinyLfu);
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu})
    CHECK(ParseCachePolicy(CachePolicyName(p)) == p);
  std::string what;
  try {
    ParseCachePolicy("fifo");
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  CHECK(what.find("'fifo'") != std::string::npos && what.find("'tinylfu'") != std::string::npos) << what;
}

// Steps dropped before they ran (ReleaseAfter): their slots are relocked to the step still
// live (its own rows may share them), so once it passes the next plans take them instead of
// growing the overflow pool; with no step live they are free at once.
void TestReleaseAfter(CachePolicy policy) {
  auto rows_of = [](int64_t first, int64_t n) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
    return rows;
  };
  StepPlan plan;
  {  // nothing taken: steps 0-2 dropped, all free
    SetAssociativeCache cache(16, 4, policy);
    for (int64_t step = 0; step < 3; ++step) {
      const std::vector<int64_t> rows = rows_of(100 * (step + 1), 16);
      cache.Plan(rows.data(), rows.size(), step, 0, true, &plan);
    }
    const uint64_t grown = cache.capacity();
    CHECK(grown > 16) << "the dropped steps' rows did not overflow: the test proves nothing";
    cache.ReleaseAfter(-1);
    const std::vector<int64_t> next = rows_of(1000, 16);
    cache.Plan(next.data(), next.size(), 3, 0, true, &plan);
    CHECK(cache.capacity() == grown) << "the pool grew again: " << cache.capacity();
  }
  // Step 0 taken (in its backward), steps 1-3 dropped.
  SetAssociativeCache cache(16, 4, policy);
  const std::vector<int64_t> live = {1, 2, 3};
  cache.Plan(live.data(), live.size(), 0, 0, true, &plan);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<int64_t> rows = rows_of(100 * step, 16);
    cache.Plan(rows.data(), rows.size(), step, 0, true, &plan);
  }
  CHECK(cache.ReleaseAfter(0) > 0);
  const std::vector<int64_t> step4 = rows_of(1000, 13);
  cache.Plan(step4.data(), step4.size(), 4, 0, true, &plan);  // step 0 still live
  std::vector<int64_t> rows, slots;
  cache.Occupied(&rows, &slots);
  for (int64_t r : live) CHECK(std::count(rows.begin(), rows.end(), r) == 1) << "live row " << r << " evicted";
  const uint64_t before = cache.capacity();
  const std::vector<int64_t> step5 = rows_of(2000, 16);
  cache.Plan(step5.data(), step5.size(), 5, 4, true, &plan);  // step 4 taken: step 0 passed
  CHECK(cache.capacity() == before) << "the released slots were not reused: " << before << " -> "
                                    << cache.capacity();
}

// The look-ahead window on one set of four ways: a row a window step uses is no victim, in
// either way it came to be kept (cached when the step was announced, or loaded after it);
// the row the policy would pick is kept instead; keyed or not, a dropped window keeps none,
// the map of window keys outlives its rebuilds, and steps must be announced in order.
void TestLookaheadWindow(CachePolicy policy, bool keyed) {
  auto plan = [&](SetAssociativeCache& c, std::vector<int64_t> ids, int64_t step) {
    StepPlan p;
    std::vector<int64_t> tiers(ids.size()), slots(ids.size());
    if (!keyed) {
      c.Plan(ids.data(), ids.size(), step, step, false, &p);
      return p.load_rows;
    }
    c.LockHits(ids.data(), ids.size(), step, false, slots.data(), tiers.data());
    for (size_t i : c.misses()) tiers[i] = ids[i] + 1000;
    c.PlaceMisses(ids.data(), ids.size(), tiers.data(), step, step, false, slots.data(), &p);
    for (int64_t& r : p.load_rows) r -= 1000;
    return p.load_rows;
  };
  auto cached = [&](SetAssociativeCache& c) {
    std::vector<int64_t> rows, slots;
    c.Occupied(&rows, &slots);
    if (keyed)
      for (int64_t& r : rows) r -= 1000;
    return std::set<int64_t>(rows.begin(), rows.end());
  };
  {
    // Without a window the fifth row evicts row 1 (least recent, least frequent); with step 3
    // using row 1 announced, it evicts row 2 instead.
    for (bool window : {false, true}) {
      SetAssociativeCache c(4, 4, policy, 0, keyed);
      int64_t step = 0;
      for (int64_t r : {1, 2, 3, 4}) plan(c, {r}, step++);  // steps 0-3
      plan(c, {2, 3, 4}, step++);                            // step 4: rows 2-4 used again
      if (window) {
        const std::vector<int64_t> later = {1, 9};
        c.Reserve(later.data(), later.size(), 7);
      }
      CHECK(plan(c, {5}, step++) == std::vector<int64_t>{5});  // step 5
      const std::set<int64_t> now = cached(c);
      CHECK(now.count(1) == (window ? 1u : 0u)) << CachePolicyName(policy) << " window " << window;
      // A row loaded while a window step uses it is kept for that step: row 9 (step 7's).
      if (!window) continue;
      CHECK(plan(c, {9}, step++) == std::vector<int64_t>{9});  // step 6
      CHECK(plan(c, {6}, step) == std::vector<int64_t>{6});   // step 7 is not planned yet
      const std::set<int64_t> kept = cached(c);
      CHECK(kept.count(1) && kept.count(9)) << "a window row was evicted";
      // Dropped: the window's steps never run, none of their rows is kept any more; four new
      // rows in one step then fit the four ways (a kept row would send one to overflow).
      const std::vector<int64_t> dropped = {1, 9, 6, 5};
      c.Reserve(dropped.data(), dropped.size(), step + 1);
      c.ReleaseAfter(step);
      step += 2;
      plan(c, {20, 21, 22, 23}, step);
      CHECK(cached(c) == (std::set<int64_t>{20, 21, 22, 23}) && c.capacity() == 4) << "a dropped window keeps rows";
      bool threw = false;
      try {
        const std::vector<int64_t> late = {1};
        c.Reserve(late.data(), 1, step);  // not after the last planned step
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      CHECK(threw) << "a window step announced out of order was accepted";
    }
  }
  {
    // Admission: with a window, a missed row no window step uses enters as the set's least
    // recent, so the next miss displaces it, not the rows in use (LRU would take row 2).
    SetAssociativeCache c(4, 4, policy, 0, keyed);
    for (int64_t r : {1, 2, 3, 4}) plan(c, {r}, r - 1);  // steps 0-3
    const std::vector<int64_t> later = {99};
    c.Reserve(later.data(), later.size(), 20);
    plan(c, {5}, 4);
    plan(c, {6}, 5);
    if (policy == CachePolicy::kLru) {
      CHECK(cached(c) == (std::set<int64_t>{2, 3, 4, 6})) << "a row no window step uses displaced one in use";
    }
  }
  {
    // Many window steps over many keys: the map of window keys is rebuilt many times and keeps
    // every live step's rows (every row of the 3 announced steps stays cached).
    SetAssociativeCache c(512, 8, policy, 0, keyed);
    std::mt19937_64 rng(5);
    std::vector<std::vector<int64_t>> steps;
    for (int s = 0; s < 200; ++s) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 300; ++i) ids.push_back(int64_t(rng() % 20000));
      steps.push_back(ids);
    }
    const int k = 3;
    for (int a = 0; a <= k; ++a) c.Reserve(steps[a].data(), steps[a].size(), a);
    for (int s = 0; s < 200; ++s) {
      plan(c, steps[s], s);
      if (s + k + 1 < 200) c.Reserve(steps[s + k + 1].data(), steps[s + k + 1].size(), s + k + 1);
      // A row used by a planned step s2 and by a window step after s is still cached.
      const std::set<int64_t> now = cached(c);
      for (int s2 = std::max(0, s - k + 1); s2 <= s; ++s2)
        for (int a = s + 1; a <= std::min(s2 + k, 199); ++a)
          for (int64_t r : steps[a])
            if (std::count(steps[s2].begin(), steps[s2].end(), r)) {
              CHECK(now.count(r)) << "row " << r << " of steps " << s2 << " and " << a << " evicted by step " << s;
            }
    }
  }
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("cache: sequential plans vs model (lru)", [] { TestSequentialModel(CachePolicy::kLru); });
  Run("cache: sequential plans vs model (lfu)", [] { TestSequentialModel(CachePolicy::kLfu); });
  Run("cache: prefetch thread + training thread (lru)", [] { TestPrefetchPipeline(CachePolicy::kLru); });
  Run("cache: prefetch thread + training thread (lfu)", [] { TestPrefetchPipeline(CachePolicy::kLfu); });
  Run("cache: sequential plans vs model (tinylfu)", [] { TestSequentialModel(CachePolicy::kTinyLfu); });
  Run("cache: prefetch thread + training thread (tinylfu)",
      [] { TestPrefetchPipeline(CachePolicy::kTinyLfu); });
  Run("sketch: count-min error bound on a Zipf stream", TestSketchErrorBound);
  Run("sketch: aging halves the counts", TestSketchAgingHalves);
  Run("cache: tinylfu keeps frequent rows through a scan", TestTinyLfuAdmission);
  Run("cache: policy names", TestParsePolicy);
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu})
    for (bool keyed : {false, true})
      Run((std::string("cache: the look-ahead window keeps its rows (") + CachePolicyName(p) + (keyed ? ", keyed)" : ")"))
              .c_str(),
          [p, keyed] { TestLookaheadWindow(p, keyed); });
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu})
    Run("cache: dropped steps release their slots", [p] { TestReleaseAfter(p); });
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu}) {
    const std::string name = CachePolicyName(p);
    Run(("cache: plans with the dense map == without (" + name + ")").c_str(), [p] { TestMapPlansIdentical(p); });
    Run(("cache: prefetch thread + training thread, dense map (" + name + ")").c_str(),
        [p] { TestPrefetchPipeline(p, 3000); });
  }
  Run("cache: ids outside the dense map", TestMapRowsOutsideTheMap);
  Run("cache: dense map configuration", TestMapConfiguration);
  std::fprintf(stderr, "test_set_associative_cache: all passed\n");
  return 0;
}
