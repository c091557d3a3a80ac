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
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

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
void TestPrefetchPipeline(CachePolicy policy) {
  SetAssociativeCache cache(256, 16, policy);  // small: overflow slots get used
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

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("cache: sequential plans vs model (lru)", [] { TestSequentialModel(CachePolicy::kLru); });
  Run("cache: sequential plans vs model (lfu)", [] { TestSequentialModel(CachePolicy::kLfu); });
  Run("cache: prefetch thread + training thread (lru)", [] { TestPrefetchPipeline(CachePolicy::kLru); });
  Run("cache: prefetch thread + training thread (lfu)", [] { TestPrefetchPipeline(CachePolicy::kLfu); });
  std::fprintf(stderr, "test_set_associative_cache: all passed\n");
  return 0;
}
