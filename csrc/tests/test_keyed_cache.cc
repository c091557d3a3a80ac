// Standalone driver for the keyed mode of SetAssociativeCache and for its plan in two calls
// (LockHits, then PlaceMisses): a keyed cache over big random 64-bit ids against a model of
// which key each slot holds, its reports in tier rows through a fixed id -> row bijection;
// and Plan == LockHits + PlaceMisses, with and without a dense map, keyed or not when the
// keys are the rows. Run plain and under ASan/UBSan and TSan by scripts/sanitize.sh.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/set_associative_cache.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

// Big random ids (negative ones included) with distinct tier rows: a random permutation of
// [0, size).
struct Bijection {
  std::vector<int64_t> keys;
  std::unordered_map<int64_t, int64_t> row_of, key_of;

  Bijection(size_t size, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::set<int64_t> seen;
    while (keys.size() < size) {
      const int64_t k = int64_t(rng());
      if (k != -1 && seen.insert(k).second) keys.push_back(k);  // -1 would read as an empty tag
    }
    std::vector<int64_t> rows(size);
    for (size_t r = 0; r < size; ++r) rows[r] = int64_t(r);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (size_t i = 0; i < size; ++i) {
      row_of[keys[i]] = rows[i];
      key_of[rows[i]] = keys[i];
    }
  }
};

// What the keyed cache should hold: slot -> key, the dirty keys and each key's last step.
class KeyedModel {
 public:
  KeyedModel(SetAssociativeCache* cache, const Bijection* ids) : cache_(cache), ids_(ids) {}

  // Plans one step in two calls, forgetting `forget_between` (keys of no live step) between
  // them, and checks everything the cache reports against the model.
  void Step(const std::vector<int64_t>& keys, int64_t step, int64_t oldest_live, bool train,
            const std::vector<int64_t>& forget_between) {
    const size_t n = keys.size();
    std::vector<int64_t> slot_of(n, -2), tier_row_of(n, -2);
    const size_t num_misses = cache_->LockHits(keys.data(), n, step, train, slot_of.data(), tier_row_of.data());
    CheckLockedHits(keys, slot_of, tier_row_of, num_misses);
    Forget(forget_between);
    for (size_t i : cache_->misses()) tier_row_of[i] = ids_->row_of.at(keys[i]);
    cache_->PlaceMisses(keys.data(), n, tier_row_of.data(), step, oldest_live, train, slot_of.data(), &plan_);
    CheckPlacement(keys, slot_of, oldest_live);
    for (size_t i = 0; i < n; ++i) {
      CHECK(slot_of[i] >= 0 && uint64_t(slot_of[i]) < cache_->capacity()) << "step " << step << " index " << i;
      CHECK(key_in_slot_.at(slot_of[i]) == keys[i]) << "step " << step << ": slot " << slot_of[i] << " holds "
                                                    << key_in_slot_.at(slot_of[i]) << ", not key " << keys[i];
      last_step_[keys[i]] = step;
      if (train) dirty_.insert(keys[i]);
    }
    CheckOccupied();
  }

  // Forget by key: each key cached empties its slot, and only that one.
  void Forget(const std::vector<int64_t>& keys) {
    uint64_t cached = 0;
    for (int64_t k : keys) {
      for (auto it = key_in_slot_.begin(); it != key_in_slot_.end(); ++it) {
        if (it->second != k) continue;
        key_in_slot_.erase(it);
        dirty_.erase(k);
        ++cached;
        break;
      }
    }
    CHECK(cache_->Forget(keys.data(), keys.size()) == cached);
  }

  // TakeDirty returns the dirty keys' tier rows and cleans them all (no step is live).
  void TakeDirty(int64_t step) {
    std::vector<int64_t> rows, slots;
    cache_->TakeDirty(step + 1, &rows, &slots);
    std::set<int64_t> want;
    for (int64_t k : dirty_) want.insert(ids_->row_of.at(k));
    CHECK(std::set<int64_t>(rows.begin(), rows.end()) == want) << "TakeDirty's rows are not the dirty keys' tier rows";
    for (size_t k = 0; k < rows.size(); ++k) CHECK(ids_->key_of.at(rows[k]) == key_in_slot_.at(slots[k]));
    dirty_.clear();
  }

  // Keys cached now that no step from `oldest_live` on uses, nor `coming` (the next step's
  // keys): safe to forget.
  std::vector<int64_t> Unlocked(int64_t oldest_live, size_t most, const std::vector<int64_t>& coming = {}) const {
    std::vector<int64_t> out;
    for (const auto& [slot, key] : key_in_slot_)
      if (out.size() < most && last_step_.at(key) < oldest_live &&
          std::find(coming.begin(), coming.end(), key) == coming.end())
        out.push_back(key);
    return out;
  }

 private:
  void CheckLockedHits(const std::vector<int64_t>& keys, const std::vector<int64_t>& slot_of,
                       const std::vector<int64_t>& tier_row_of, size_t num_misses) const {
    const std::vector<size_t>& misses = cache_->misses();
    CHECK(misses.size() == num_misses);
    size_t next_miss = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = std::find_if(key_in_slot_.begin(), key_in_slot_.end(), [&](const auto& e) { return e.second == keys[i]; });
      if (it == key_in_slot_.end()) {
        CHECK(slot_of[i] == -1 && tier_row_of[i] == -2) << "key " << keys[i] << " is not cached";
        CHECK(next_miss < misses.size() && misses[next_miss++] == i) << "miss " << i << " not listed in order";
      } else {
        CHECK(slot_of[i] == it->first) << "key " << keys[i] << " found in slot " << slot_of[i] << ", not " << it->first;
        CHECK(tier_row_of[i] == ids_->row_of.at(keys[i])) << "hit " << keys[i] << " got tier row " << tier_row_of[i];
      }
    }
    CHECK(next_miss == misses.size());
  }

  // Loads are the distinct missed keys' tier rows in order; write-backs the dirty victims'
  // (never a key of a live step); then the model takes the loads.
  void CheckPlacement(const std::vector<int64_t>& keys, const std::vector<int64_t>& slot_of, int64_t oldest_live) {
    std::vector<int64_t> want_loads;
    std::set<int64_t> seen;
    for (size_t i : cache_->misses())
      if (seen.insert(keys[i]).second) want_loads.push_back(ids_->row_of.at(keys[i]));
    CHECK(plan_.load_rows == want_loads) << "loads are not the missed keys' tier rows";
    std::vector<int64_t> want_evict_rows, want_evict_slots;
    for (size_t k = 0; k < plan_.load_rows.size(); ++k) {
      const int64_t slot = plan_.load_slots[k];
      auto it = key_in_slot_.find(slot);
      if (it != key_in_slot_.end()) {
        CHECK(last_step_.at(it->second) < oldest_live) << "key " << it->second << " of a live step evicted";
        if (dirty_.erase(it->second)) {
          want_evict_rows.push_back(ids_->row_of.at(it->second));
          want_evict_slots.push_back(slot);
        }
      }
      key_in_slot_[slot] = ids_->key_of.at(plan_.load_rows[k]);
    }
    CHECK(plan_.evict_rows == want_evict_rows && plan_.evict_slots == want_evict_slots)
        << "write-backs are not the dirty victims' tier rows";
    for (size_t i : cache_->misses()) CHECK(slot_of[i] >= 0);
  }

  // Occupied's (tier row, slot) pairs are the model's (key, slot) ones through the bijection.
  void CheckOccupied() const {
    std::vector<int64_t> rows, slots;
    cache_->Occupied(&rows, &slots);
    CHECK(rows.size() == key_in_slot_.size()) << rows.size() << " occupied slots, model " << key_in_slot_.size();
    for (size_t k = 0; k < rows.size(); ++k)
      CHECK(ids_->row_of.at(key_in_slot_.at(slots[k])) == rows[k]) << "slot " << slots[k] << " reports row " << rows[k];
  }

  SetAssociativeCache* const cache_;
  const Bijection* const ids_;
  std::map<int64_t, int64_t> key_in_slot_;
  std::set<int64_t> dirty_;
  std::unordered_map<int64_t, int64_t> last_step_;
  StepPlan plan_;
};

// Random steps over 600 ids in a 64-slot cache: hot phases, table-wide ones, three live steps
// at a time now and then (every way locked: the overflow pool), eval steps, Forget between the
// two calls and after, TakeDirty.
void TestKeyedModel(CachePolicy policy) {
  const Bijection ids(600, 7);
  SetAssociativeCache cache(64, 8, policy, 0, true);
  CHECK(cache.keyed() && cache.map_rows() == 0);
  KeyedModel model(&cache, &ids);
  std::mt19937_64 rng(11);
  for (int64_t step = 0; step < 1500; ++step) {
    const bool wide = step % 150 >= 100;
    std::vector<int64_t> keys(1 + rng() % (wide ? 120 : 40));
    for (auto& k : keys) k = ids.keys[rng() % (wide ? ids.keys.size() : 50)];
    const int64_t oldest_live = step % 40 < 10 ? step - 3 : step - 1;
    std::vector<int64_t> between;
    if (step % 7 == 0) between = model.Unlocked(oldest_live, 3, keys);
    model.Step(keys, step, oldest_live, step % 5 != 0, between);
    if (step % 23 == 0) model.Forget(model.Unlocked(oldest_live, 2));
    if (step % 37 == 0) model.TakeDirty(step);
  }
  const CacheCounters c = cache.counters();
  CHECK(c.hits > 0 && c.evictions > 0) << "hits " << c.hits << ", evictions " << c.evictions;
  CHECK(c.overflow_assignments > 0 && cache.capacity() > 64) << "no overflow slot used";
  CHECK(c.hits + c.misses == c.unique_rows);
}

template <typename Fn>
std::string ThrownBy(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Bad uses of a keyed cache are refused before they change anything.
void TestKeyedMisuse() {
  CHECK(ThrownBy([] { SetAssociativeCache(8, 4, CachePolicy::kLru, 100, true); }).find("dense map") !=
        std::string::npos);
  SetAssociativeCache cache(8, 4, CachePolicy::kLru, 0, true);
  StepPlan plan;
  const int64_t keys[2] = {int64_t(0x9E3779B97F4A7C15ull), 42};
  int64_t slot_of[2], tier_row_of[2] = {-1, -1};
  CHECK(!ThrownBy([&] { cache.Plan(keys, 2, 0, 0, true, &plan); }).empty()) << "Plan of a keyed cache";
  CHECK(!ThrownBy([&] { cache.LockHits(keys, 2, 0, true, slot_of, nullptr); }).empty()) << "no tier_row_of";
  const int64_t reserved[2] = {7, -1};
  CHECK(ThrownBy([&] { cache.LockHits(reserved, 2, 0, true, slot_of, tier_row_of); }).find("reserved") !=
        std::string::npos) << "the key -1 (the empty tag) was accepted";
  CHECK(cache.counters().lookups == 0) << "a refused LockHits counted lookups";
  CHECK(cache.LockHits(keys, 2, 0, true, slot_of, tier_row_of) == 2);
  CHECK(ThrownBy([&] { cache.PlaceMisses(keys, 1, tier_row_of, 0, 0, true, slot_of, &plan); }).find("LockHits of 2") !=
        std::string::npos);
  tier_row_of[0] = 5;  // the second miss has no row
  CHECK(ThrownBy([&] { cache.PlaceMisses(keys, 2, tier_row_of, 0, 0, true, slot_of, &plan); }).find("key 42") !=
        std::string::npos);
  std::vector<int64_t> rows, slots;
  cache.Occupied(&rows, &slots);
  CHECK(rows.empty()) << "a refused PlaceMisses placed a key";
  tier_row_of[1] = 9;
  cache.PlaceMisses(keys, 2, tier_row_of, 0, 0, true, slot_of, &plan);
  CHECK((plan.load_rows == std::vector<int64_t>{5, 9}));
  cache.Occupied(&rows, &slots);
  CHECK((std::set<int64_t>(rows.begin(), rows.end()) == std::set<int64_t>{5, 9}));
}

// Three caches given the same calls: `whole_` plans in one call (Plan), `split_` in two
// (LockHits, PlaceMisses), and `keyed_` is a keyed cache whose keys are their own tier rows
// (so it hashes the same). All three must agree on everything.
class SplitTriplet {
 public:
  SplitTriplet(uint64_t slots, uint32_t ways, CachePolicy policy, uint64_t map_rows)
      : whole_(slots, ways, policy, map_rows), split_(slots, ways, policy, map_rows),
        keyed_(slots, ways, policy, 0, true) {}

  void Plan(const std::vector<int64_t>& idx, int64_t step, int64_t oldest_live, bool train) {
    const size_t n = idx.size();
    whole_.Plan(idx.data(), n, step, oldest_live, train, &a_);
    std::vector<int64_t> sb(n), sk(n), tk(n, -1);
    const size_t misses = split_.LockHits(idx.data(), n, step, train, sb.data(), step % 2 ? nullptr : tk.data());
    CHECK(keyed_.LockHits(idx.data(), n, step, train, sk.data(), tk.data()) == misses);
    CHECK(split_.misses() == keyed_.misses());
    for (size_t i : keyed_.misses()) tk[i] = idx[i];
    for (size_t i = 0; i < n; ++i) CHECK(tk[i] == idx[i]);  // the hits' tier rows are their keys
    split_.PlaceMisses(idx.data(), n, nullptr, step, oldest_live, train, sb.data(), &b_);
    keyed_.PlaceMisses(idx.data(), n, tk.data(), step, oldest_live, train, sk.data(), &k_);
    CHECK(a_.slot_of_index == sb && sb == sk) << "step " << step << ": slots differ";
    for (const StepPlan* p : {&b_, &k_}) {
      CHECK(a_.load_rows == p->load_rows && a_.load_slots == p->load_slots) << "step " << step << ": loads differ";
      CHECK(a_.evict_rows == p->evict_rows && a_.evict_slots == p->evict_slots) << "step " << step << ": evictions differ";
    }
    CHECK(whole_.capacity() == split_.capacity() && whole_.capacity() == keyed_.capacity());
  }
  void Forget(const std::vector<int64_t>& rows) {
    const uint64_t dropped = whole_.Forget(rows.data(), rows.size());
    CHECK(split_.Forget(rows.data(), rows.size()) == dropped && keyed_.Forget(rows.data(), rows.size()) == dropped);
  }
  void MarkDirty(const std::vector<int64_t>& slots) {
    for (SetAssociativeCache* c : {&whole_, &split_, &keyed_}) c->MarkDirty(slots.data(), slots.size());
  }
  void CheckSame(int64_t live_step) {
    std::vector<int64_t> ra, sa, rb, sb;
    whole_.TakeDirty(live_step, &ra, &sa);
    for (SetAssociativeCache* c : {&split_, &keyed_}) {
      c->TakeDirty(live_step, &rb, &sb);
      CHECK(ra == rb && sa == sb) << "dirty rows differ";
    }
    whole_.Occupied(&ra, &sa);
    const CacheCounters x = whole_.counters();
    for (SetAssociativeCache* c : {&split_, &keyed_}) {
      c->Occupied(&rb, &sb);
      CHECK(ra == rb && sa == sb) << "occupied slots differ";
      const CacheCounters y = c->counters();
      CHECK(x.lookups == y.lookups && x.unique_rows == y.unique_rows && x.hits == y.hits && x.misses == y.misses &&
            x.evictions == y.evictions && x.overflow_assignments == y.overflow_assignments)
          << "counters differ: hits " << x.hits << " vs " << y.hits << ", evictions " << x.evictions << " vs "
          << y.evictions;
    }
  }
  const StepPlan& plan() const { return a_; }
  CacheCounters counters() const { return whole_.counters(); }

 private:
  SetAssociativeCache whole_, split_, keyed_;
  StepPlan a_, b_, k_;
};

// Random steps with evictions, overflow, Forget, MarkDirty and TakeDirty, as the dense
// map's twin test, for each policy, with and without the map.
void TestSplitPlansIdentical(CachePolicy policy, bool map) {
  struct Shape {
    uint64_t slots, rows;
    uint32_t ways;
  };
  for (const Shape& shape : {Shape{64, 500, 8}, Shape{1000, 5000, 32}, Shape{37, 300, 8}, Shape{300, 100, 16}}) {
    SplitTriplet caches(shape.slots, shape.ways, policy, map ? shape.rows : 0);
    std::mt19937_64 rng(shape.slots * 7 + shape.rows);
    int64_t oldest_live = 0;
    for (int64_t step = 0; step < 1500; ++step) {
      std::vector<int64_t> idx(1 + rng() % (step % 7 == 0 ? 400 : 60));
      const uint64_t span = step % 200 < 100 ? shape.rows / 5 + 1 : shape.rows;
      for (auto& r : idx) r = int64_t(rng() % 3 == 0 ? rng() % span : (rng() % 8) * (rng() % 8) % shape.rows);
      if (rng() % 3 == 0) oldest_live = step - int64_t(rng() % 4);
      caches.Plan(idx, step, oldest_live, rng() % 4 != 0);
      if (step % 13 == 0) {
        std::vector<int64_t> gone(1 + rng() % 20);
        for (auto& r : gone) r = int64_t(rng() % shape.rows);
        caches.Forget(gone);
      }
      if (step % 17 == 0) caches.MarkDirty({caches.plan().slot_of_index.front()});
      if (step % 29 == 0) caches.CheckSame(oldest_live);
    }
    caches.CheckSame(0);
    const CacheCounters c = caches.counters();
    CHECK(c.hits > 0) << "slots " << shape.slots << ": a workload without hits";
    if (shape.slots < 100) {
      CHECK(c.overflow_assignments > 0) << "slots " << shape.slots << ": no overflow slot used";
    }
  }
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu}) {
    const std::string name = CachePolicyName(p);
    Run(("keyed cache: plans vs model through the id -> row bijection (" + name + ")").c_str(),
        [p] { TestKeyedModel(p); });
    Run(("cache: Plan == LockHits + PlaceMisses == keyed by rows (" + name + ")").c_str(),
        [p] { TestSplitPlansIdentical(p, false); });
    Run(("cache: Plan == LockHits + PlaceMisses == keyed by rows, dense map (" + name + ")").c_str(),
        [p] { TestSplitPlansIdentical(p, true); });
  }
  Run("keyed cache: misuse is refused", TestKeyedMisuse);
  std::fprintf(stderr, "test_keyed_cache: all passed\n");
  return 0;
}
