// Standalone driver for KernelCacheIndex: one PlanStep over several tables must give each
// table exactly what its own SetAssociativeCache plans for its slice of the step, and report
// moves only for the tables that have rows to load or write back; keyed tables beside them
// get their misses' tier rows from a MissResolver (a small id index here) and report tier
// rows. Run plain and under ASan/UBSan and TSan by scripts/sanitize.sh.
#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/kernel_cache_index.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

void TestMatchesPerTableCaches(CachePolicy policy) {
  const std::vector<uint64_t> slots = {16, 64, 1000};  // the last one holds its whole table
  const std::vector<int64_t> rows = {500, 200, 300};
  KernelCacheIndex index(slots, 8, policy);
  std::vector<std::unique_ptr<SetAssociativeCache>> alone;
  for (uint64_t n : slots) alone.push_back(std::make_unique<SetAssociativeCache>(n, 8, policy));
  std::mt19937_64 rng(5);
  std::vector<TableMoves> moves;
  StepPlan want;
  for (int64_t step = 0; step < 500; ++step) {
    std::vector<int64_t> indices, bounds = {0};
    for (size_t t = 0; t < slots.size(); ++t) {
      const size_t n = rng() % 30;  // may be 0: a table without indices this step
      for (size_t i = 0; i < n; ++i) indices.push_back(int64_t(rng() % uint64_t(rows[t])));
      bounds.push_back(int64_t(indices.size()));
    }
    std::vector<int64_t> slot_of(indices.size());
    const bool train = step % 4 != 0;
    const size_t used = index.PlanStep(indices.data(), bounds, step, step - 1, train, slot_of.data(), &moves);
    CHECK(used <= moves.size());
    size_t next_move = 0;
    for (size_t t = 0; t < slots.size(); ++t) {
      const size_t lo = size_t(bounds[t]), n = size_t(bounds[t + 1]) - lo;
      alone[t]->Plan(indices.data() + lo, n, step, step - 1, train, &want);
      for (size_t i = 0; i < n; ++i) CHECK(slot_of[lo + i] == want.slot_of_index[i]) << "table " << t;
      const bool moved = !want.load_rows.empty() || !want.evict_rows.empty();
      if (!moved) {
        CHECK(next_move == used || moves[next_move].table != int64_t(t)) << "table " << t << " has no moves";
        continue;
      }
      CHECK(next_move < used && moves[next_move].table == int64_t(t)) << "table " << t << " lost its moves";
      const TableMoves& m = moves[next_move++];
      CHECK(m.load_rows == want.load_rows && m.load_slots == want.load_slots);
      CHECK(m.evict_rows == want.evict_rows && m.evict_slots == want.evict_slots);
    }
    CHECK(next_move == used) << "moves for a table in no order";
  }
  // Warm: the whole-table cache sees no misses once every row was loaded.
  CHECK(index.cache(2).counters().misses <= uint64_t(rows[2]));
}

// Tables with dense maps plan what the same tables without them plan, through resets too.
void TestDenseMapsMatch(CachePolicy policy) {
  const std::vector<TableCacheSpec> with = {{16, 500, true}, {64, 200, false}, {1000, 300, true}};
  std::vector<TableCacheSpec> without = with;
  for (auto& t : without) t.dense_map = false;
  KernelCacheIndex a(with, 8, policy), b(without, 8, policy);
  CHECK(a.cache(0).map_rows() == 500 && a.cache(1).map_rows() == 0 && a.cache(2).map_rows() == 300);
  std::mt19937_64 rng(21);
  std::vector<TableMoves> ma, mb;
  for (int64_t step = 0; step < 400; ++step) {
    std::vector<int64_t> indices, bounds = {0};
    for (const auto& t : with) {
      const size_t n = rng() % 40;
      for (size_t i = 0; i < n; ++i) indices.push_back(int64_t(rng() % t.rows));
      bounds.push_back(int64_t(indices.size()));
    }
    std::vector<int64_t> sa(indices.size()), sb(indices.size());
    a.PlanStep(indices.data(), bounds, step, step - 1, true, sa.data(), &ma);
    b.PlanStep(indices.data(), bounds, step, step - 1, true, sb.data(), &mb);
    CHECK(sa == sb) << "step " << step;
    CHECK(ma.size() == mb.size()) << "step " << step;
    for (size_t k = 0; k < ma.size(); ++k)
      CHECK(ma[k].table == mb[k].table && ma[k].load_rows == mb[k].load_rows &&
            ma[k].load_slots == mb[k].load_slots && ma[k].evict_rows == mb[k].evict_rows &&
            ma[k].evict_slots == mb[k].evict_slots) << "step " << step << " table " << ma[k].table;
    if (step % 100 == 99) {  // a reset table starts empty, its map too
      a.Reset(2);
      b.Reset(2);
      CHECK(a.cache(2).map_rows() == 300);
    }
  }
}

void TestDenseMapNeedsRows() {
  bool threw = false;
  try {
    KernelCacheIndex index({TableCacheSpec{8, 0, true}}, 4, CachePolicy::kLru);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw) << "a dense map without the table's rows was accepted";
}

void TestBadBounds() {
  KernelCacheIndex index({8, 8}, 4, CachePolicy::kLru);
  std::vector<TableMoves> moves;
  int64_t idx[2] = {0, 1}, slots[2];
  bool threw = false;
  try {
    index.PlanStep(idx, {0, 2}, 0, 0, true, slots, &moves);  // one bound short
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw) << "bounds of the wrong length were accepted";
  threw = false;
  try {
    index.PlanStep(idx, {0, 2, 1}, 0, 0, true, slots, &moves);  // decreasing
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw) << "decreasing bounds were accepted";
}

// The prefetch thread plans while the training thread reads counters and capacities and
// takes dirty rows of every table.
void TestPlanBesideReaders() {
  KernelCacheIndex index({32, 32, 32}, 8, CachePolicy::kLfu);
  std::thread planner([&] {
    std::mt19937_64 rng(9);
    std::vector<TableMoves> moves;
    for (int64_t step = 0; step < 2000; ++step) {
      std::vector<int64_t> indices(60);
      for (auto& r : indices) r = int64_t(rng() % 400);
      std::vector<int64_t> slot_of(indices.size());
      index.PlanStep(indices.data(), {0, 20, 40, 60}, step, step - 1, true, slot_of.data(), &moves);
    }
  });
  std::vector<int64_t> rows, slots;
  for (int k = 0; k < 2000; ++k) {
    for (size_t t = 0; t < index.num_tables(); ++t) {
      (void)index.cache(t).counters();
      (void)index.cache(t).capacity();
      if (k % 50 == 0) index.cache(t).TakeDirty(0, &rows, &slots);
    }
  }
  planner.join();
}

// A virtual table's id index for the tests: an id gets a row at its first miss, from a
// pool of `rows` per table; an empty pool evicts the id least recently used by a step
// before oldest_live_step (Forget in the cache, its row reused). Checks what PlanStep tells
// it: hits come with their rows (never asked for), misses are not cached.
class TestResolver : public MissResolver {
 public:
  TestResolver(KernelCacheIndex* index, int64_t rows) : index_(index), rows_(rows) {}

  Status ResolveMisses(size_t table, int64_t step, int64_t oldest_live_step, const int64_t* keys, size_t n,
                       const int64_t* slot_of, const size_t* misses, size_t num_misses,
                       int64_t* tier_row_of) override {
    CHECK(index_->keyed(table)) << "the resolver was called for table " << table;
    ++calls;
    if (step == fail_step && table == fail_table) return Status::IoError(EIO, "the id index failed");
    Ids& ids = ids_[table];
    std::vector<char> missed(n, 0);
    for (size_t k = 0; k < num_misses; ++k) {
      CHECK(k == 0 || misses[k] > misses[k - 1]) << "misses out of order";
      CHECK(misses[k] < n && slot_of[misses[k]] == -1) << "miss " << misses[k] << " has a slot";
      missed[misses[k]] = 1;
    }
    for (size_t i = 0; i < n; ++i) {
      ids.last_step[keys[i]] = step;  // this step's ids are not evicted
      auto it = ids.row_of.find(keys[i]);
      const bool cached = it != ids.row_of.end() && cached_rows_[table].count(it->second);
      CHECK(cached == !missed[i]) << "key " << keys[i] << (cached ? " cached but missed" : " hit but not cached");
      if (missed[i]) continue;
      CHECK(slot_of[i] >= 0 && tier_row_of[i] == it->second) << "hit " << keys[i] << " with row " << tier_row_of[i];
      ++hits_seen;
    }
    std::vector<int64_t>& loads = want_loads_[table];
    loads.clear();
    for (size_t k = 0; k < num_misses && !leave_unfilled; ++k) {
      const int64_t key = keys[misses[k]];
      auto it = ids.row_of.find(key);
      if (it == ids.row_of.end()) {
        it = ids.row_of.emplace(key, NewRow(table, oldest_live_step)).first;
        loads.push_back(it->second);
      } else if (std::find(loads.begin(), loads.end(), it->second) == loads.end()) {
        loads.push_back(it->second);  // known to the index, not cached
      }
      tier_row_of[misses[k]] = it->second;
    }
    return Status::Ok();
  }

  // Before each PlanStep: the rows the keyed tables' caches hold.
  void SnapshotCached() {
    for (size_t t = 0; t < index_->num_tables(); ++t) {
      if (!index_->keyed(t)) continue;
      std::vector<int64_t> rows, slots;
      index_->cache(t).Occupied(&rows, &slots);
      cached_rows_[t] = std::set<int64_t>(rows.begin(), rows.end());
    }
  }
  int64_t RowOf(size_t table, int64_t key) const { return ids_.at(table).row_of.at(key); }
  // The last call's loads for `table`: the distinct missed ids' rows, in order.
  const std::vector<int64_t>& want_loads(size_t table) { return want_loads_[table]; }

  int64_t fail_step = -1;
  size_t fail_table = 0;
  bool leave_unfilled = false;
  uint64_t calls = 0, hits_seen = 0, evictions = 0, forgotten = 0;

 private:
  struct Ids {
    std::unordered_map<int64_t, int64_t> row_of;
    std::unordered_map<int64_t, int64_t> last_step;
    int64_t next_row = 0;
  };

  int64_t NewRow(size_t table, int64_t oldest_live_step) {
    Ids& ids = ids_[table];
    if (ids.next_row < rows_) return ids.next_row++;
    int64_t victim = 0, oldest = oldest_live_step;
    bool found = false;
    for (const auto& [key, row] : ids.row_of) {
      const int64_t last = ids.last_step.at(key);
      if (last < oldest) {
        victim = key;
        oldest = last;
        found = true;
      }
    }
    CHECK(found) << "table " << table << ": every id is live; the test's pool is too small";
    const int64_t row = ids.row_of.at(victim);
    ids.row_of.erase(victim);
    ++evictions;
    forgotten += index_->cache(table).Forget(&victim, 1);
    return row;
  }

  KernelCacheIndex* const index_;
  const int64_t rows_;
  std::map<size_t, Ids> ids_;
  std::map<size_t, std::set<int64_t>> cached_rows_;
  std::map<size_t, std::vector<int64_t>> want_loads_;
};

std::vector<int64_t> RandomIds(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<int64_t> seen;
  std::vector<int64_t> ids;
  while (ids.size() < count) {
    const int64_t id = int64_t(rng());
    if (id != -1 && seen.insert(id).second) ids.push_back(id);
  }
  return ids;
}

// Keyed tables (0 and 2) beside a dense-map table (1) and a plain one (3): the non-keyed
// tables plan as their own caches do, the keyed ones hold every step's keys, load exactly
// their misses' rows and never ask for a hit's; a failing resolver stops the plan with its
// status, placing nothing; an id index that evicts ids (Forget) keeps working.
void TestKeyedTables(CachePolicy policy) {
  const std::vector<TableCacheSpec> specs = {
      {16, 0, false, true}, {64, 200, true, false}, {32, 0, false, true}, {16, 100, false, false}};
  KernelCacheIndex index(specs, 8, policy);
  CHECK(index.keyed(0) && !index.keyed(1) && index.keyed(2) && !index.keyed(3));
  std::vector<std::unique_ptr<SetAssociativeCache>> alone(specs.size());
  for (size_t t : {size_t(1), size_t(3)})
    alone[t] = std::make_unique<SetAssociativeCache>(specs[t].slots, 8, policy, specs[t].dense_map ? specs[t].rows : 0);
  TestResolver resolver(&index, 150);
  const std::vector<int64_t> ids = RandomIds(400, 3);
  std::mt19937_64 rng(13);
  std::vector<TableMoves> moves;
  StepPlan want;
  for (int64_t step = 0; step < 600; ++step) {
    std::vector<int64_t> indices, bounds = {0};
    for (size_t t = 0; t < specs.size(); ++t) {
      const size_t n = rng() % 30;
      const uint64_t span = step % 100 < 50 ? 40 : (specs[t].keyed ? ids.size() : specs[t].rows);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng() % span;
        indices.push_back(specs[t].keyed ? ids[r] : int64_t(r));
      }
      bounds.push_back(int64_t(indices.size()));
    }
    const int64_t oldest_live = step % 20 < 5 ? step - 3 : step - 1;
    const bool train = step % 4 != 0;
    const bool fails = step % 97 == 50;
    resolver.fail_step = fails ? step : -1;
    resolver.fail_table = 2;
    std::vector<int64_t> slot_of(indices.size()), tier_row_of(indices.size(), -7);
    std::vector<std::vector<int64_t>> before(specs.size()), after(specs.size());
    auto occupied = [&](std::vector<std::vector<int64_t>>* rows) {
      std::vector<int64_t> slots;
      for (size_t t = 0; t < specs.size(); ++t) {
        index.cache(t).Occupied(&(*rows)[t], &slots);
        (*rows)[t].insert((*rows)[t].end(), slots.begin(), slots.end());
      }
    };
    if (fails) occupied(&before);
    resolver.SnapshotCached();
    Status status = Status::IoError(EIO, "not overwritten");
    const size_t used = index.PlanStep(indices.data(), bounds, step, oldest_live, train, slot_of.data(), &moves,
                                       &resolver, tier_row_of.data(), &status);
    if (fails) {
      CHECK(used == 0 && status.code() == StatusCode::kIoError && status.message() == "the id index failed")
          << "step " << step << ": " << status.message();
      occupied(&after);
      CHECK(before == after) << "a failed plan placed rows";
      continue;  // the non-keyed tables were not planned: their references skip the step too
    }
    CHECK_OK(status);
    size_t next_move = 0;
    for (size_t t = 0; t < specs.size(); ++t) {
      const size_t lo = size_t(bounds[t]), n = size_t(bounds[t + 1]) - lo;
      const TableMoves* m = next_move < used && moves[next_move].table == int64_t(t) ? &moves[next_move++] : nullptr;
      if (specs[t].keyed) {
        std::vector<int64_t> rows, slots;
        index.cache(t).Occupied(&rows, &slots);
        std::map<int64_t, int64_t> row_in_slot;
        for (size_t k = 0; k < rows.size(); ++k) row_in_slot[slots[k]] = rows[k];
        for (size_t i = lo; i < lo + n; ++i) {
          CHECK(tier_row_of[i] == resolver.RowOf(t, indices[i])) << "step " << step << " index " << i;
          CHECK(row_in_slot.at(slot_of[i]) == tier_row_of[i]) << "step " << step << ": slot " << slot_of[i]
                                                             << " does not hold key " << indices[i] << "'s row";
        }
        const std::vector<int64_t> no_loads;
        CHECK((m ? m->load_rows : no_loads) == (n ? resolver.want_loads(t) : no_loads))
            << "step " << step << " table " << t << ": loads are not the missed ids' rows";
        continue;
      }
      for (size_t i = lo; i < lo + n; ++i) CHECK(tier_row_of[i] == -7) << "a non-keyed table's tier row was written";
      alone[t]->Plan(indices.data() + lo, n, step, oldest_live, train, &want);
      for (size_t i = 0; i < n; ++i) CHECK(slot_of[lo + i] == want.slot_of_index[i]) << "table " << t;
      CHECK(m ? m->load_rows == want.load_rows && m->evict_rows == want.evict_rows && m->load_slots == want.load_slots &&
                    m->evict_slots == want.evict_slots
              : want.load_rows.empty() && want.evict_rows.empty())
          << "step " << step << " table " << t;
    }
    CHECK(next_move == used) << "moves for a table in no order";
  }
  CHECK(resolver.calls > 1000 && resolver.hits_seen > 1000) << resolver.calls << " calls, " << resolver.hits_seen
                                                            << " hits seen";
  CHECK(resolver.evictions > 100 && resolver.forgotten > 0) << "the id index evicted " << resolver.evictions
                                                            << " ids, " << resolver.forgotten << " of them cached";
  CHECK(index.cache(0).counters().overflow_assignments > 0) << "the keyed table never overflowed";
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

// A keyed table needs a resolver, tier rows and a status; a resolver must give every miss a
// row; a keyed table takes no dense map.
void TestKeyedMisuse() {
  CHECK(ThrownBy([] { KernelCacheIndex({{8, 100, false, false}, {8, 100, true, true}}, 4, CachePolicy::kLru); })
            .find("table 1") != std::string::npos);
  KernelCacheIndex index({{8, 100, false, false}, {8, 0, false, true}}, 4, CachePolicy::kLru);
  TestResolver resolver(&index, 100);
  std::vector<TableMoves> moves;
  const int64_t idx[3] = {1, 77, 78};
  const std::vector<int64_t> bounds = {0, 1, 3};
  int64_t slots[3], rows[3];
  Status status;
  CHECK(ThrownBy([&] { index.PlanStep(idx, bounds, 0, 0, true, slots, &moves); }).find("table 1") !=
        std::string::npos) << "a keyed table planned without a resolver";
  CHECK(ThrownBy([&] { index.PlanStep(idx, bounds, 0, 0, true, slots, &moves, &resolver, rows); }).find("table 1") !=
        std::string::npos) << "a keyed table planned without a status";
  resolver.SnapshotCached();
  resolver.leave_unfilled = true;
  CHECK(ThrownBy([&] { index.PlanStep(idx, bounds, 0, 0, true, slots, &moves, &resolver, rows, &status); })
            .find("no tier row") != std::string::npos) << "a miss without a row was placed";
  std::vector<int64_t> occupied, occupied_slots;
  for (size_t t = 0; t < 2; ++t) {
    index.cache(t).Occupied(&occupied, &occupied_slots);
    CHECK(occupied.empty()) << "table " << t << ": a refused plan placed rows";
  }
  resolver.leave_unfilled = false;
  CHECK(index.PlanStep(idx, bounds, 1, 1, true, slots, &moves, &resolver, rows, &status) == 2);
  CHECK_OK(status);
  CHECK(moves[1].table == 1 && moves[1].load_rows == (std::vector<int64_t>{0, 1}));
}

// The prefetch thread plans keyed tables (its id index evicting ids) while the training
// thread reads counters and occupied slots and takes dirty rows.
void TestKeyedPlanBesideReaders() {
  KernelCacheIndex index({{32, 0, false, true}, {32, 400, true, false}}, 8, CachePolicy::kTinyLfu);
  std::thread planner([&] {
    TestResolver resolver(&index, 100);
    const std::vector<int64_t> ids = RandomIds(400, 5);
    std::mt19937_64 rng(9);
    std::vector<TableMoves> moves;
    Status status;
    for (int64_t step = 0; step < 1000; ++step) {
      std::vector<int64_t> indices(60);
      for (size_t i = 0; i < indices.size(); ++i) indices[i] = i < 30 ? ids[rng() % 400] : int64_t(rng() % 400);
      std::vector<int64_t> slot_of(indices.size()), tier_row_of(indices.size());
      resolver.SnapshotCached();
      index.PlanStep(indices.data(), {0, 30, 60}, step, step - 1, true, slot_of.data(), &moves, &resolver,
                     tier_row_of.data(), &status);
      CHECK_OK(status);
    }
  });
  std::vector<int64_t> rows, slots;
  for (int k = 0; k < 1000; ++k) {
    for (size_t t = 0; t < index.num_tables(); ++t) {
      (void)index.cache(t).counters();
      if (k % 20 == 0) index.cache(t).Occupied(&rows, &slots);
      if (k % 50 == 0) index.cache(t).TakeDirty(0, &rows, &slots);
    }
  }
  planner.join();
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("kernel cache index: one plan == per-table plans (lru)", [] { TestMatchesPerTableCaches(CachePolicy::kLru); });
  Run("kernel cache index: one plan == per-table plans (lfu)", [] { TestMatchesPerTableCaches(CachePolicy::kLfu); });
  Run("kernel cache index: dense maps plan as without (lru)", [] { TestDenseMapsMatch(CachePolicy::kLru); });
  Run("kernel cache index: dense maps plan as without (lfu)", [] { TestDenseMapsMatch(CachePolicy::kLfu); });
  Run("kernel cache index: dense maps plan as without (tinylfu)", [] { TestDenseMapsMatch(CachePolicy::kTinyLfu); });
  Run("kernel cache index: a dense map needs the table's rows", TestDenseMapNeedsRows);
  Run("kernel cache index: bad bounds", TestBadBounds);
  Run("kernel cache index: planning beside readers", TestPlanBesideReaders);
  for (CachePolicy p : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kTinyLfu})
    Run((std::string("kernel cache index: keyed tables with a miss resolver (") + CachePolicyName(p) + ")").c_str(),
        [p] { TestKeyedTables(p); });
  Run("kernel cache index: keyed tables' misuse", TestKeyedMisuse);
  Run("kernel cache index: keyed planning beside readers", TestKeyedPlanBesideReaders);
  std::fprintf(stderr, "test_kernel_cache_index: all passed\n");
  return 0;
}
