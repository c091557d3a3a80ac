// Standalone driver for KernelCacheIndex: one PlanStep over several tables must give each
// table exactly what its own SetAssociativeCache plans for its slice of the step, and report
// moves only for the tables that have rows to load or write back. Run plain and under
// ASan/UBSan and TSan by scripts/sanitize.sh.
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
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
  std::fprintf(stderr, "test_kernel_cache_index: all passed\n");
  return 0;
}
