// KernelCacheIndex: the row-cache indexes of every table of one TieredEmbeddingBags,
// planned in one call per step.
//
// A step's indices come table-major (table t's are [bounds[t], bounds[t+1])); PlanStep
// remaps all of them to their tables' cache slots and reports, only for the tables that
// have any, the rows to load and the dirty rows to write back. A step whose rows are all
// cached therefore costs one call and no per-table work on the caller's side. The
// per-table scratch plans are reused from step to step.
//
// Thread-safety: PlanStep calls are serialised by the index (one planner at a time, the
// prefetch thread); every per-table method goes to that table's SetAssociativeCache, which
// is thread-safe. Reset must not run while a PlanStep does (callers reset between steps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/set_associative_cache.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mtrains {

// One table's rows to move for a step.
struct TableMoves {
  int64_t table = 0;
  std::vector<int64_t> load_rows, load_slots;    // misses: read these rows into these slots
  std::vector<int64_t> evict_rows, evict_slots;  // dirty rows displaced: write back first
};

// One table's cache.
struct TableCacheSpec {
  uint64_t slots = 1;      // cache slots (>= 1)
  uint64_t rows = 0;       // the table's rows (ids in [0, rows)); needed for the map
  bool dense_map = false;  // keep a dense row-to-slot map (SetAssociativeCache, 4 bytes a row)
};

class KernelCacheIndex {
 public:
  // One cache per table, of `tables[t].slots` slots, with a dense map over the table's rows
  // where `tables[t].dense_map` (which then needs `rows` >= 1). Throws
  // std::invalid_argument on bad values, naming the table.
  KernelCacheIndex(const std::vector<TableCacheSpec>& tables, uint32_t ways, CachePolicy policy);
  // One cache of `slots[t]` slots per table, none with a map.
  KernelCacheIndex(const std::vector<uint64_t>& slots, uint32_t ways, CachePolicy policy);

  size_t num_tables() const { return caches_.size(); }
  SetAssociativeCache& cache(size_t table) { return *caches_.at(table); }
  // Replaces table `table`'s cache by an empty one of the same spec, map included (its rows
  // were replaced underneath).
  void Reset(size_t table);

  // Plans step `step` over every table (SetAssociativeCache::Plan's contract per table).
  // `bounds` has num_tables() + 1 entries; `slot_of_index` receives bounds.back() slots.
  // Returns k: (*moves)[0, k) are the tables with rows to load or write back. Entries are
  // reused from step to step (their vectors keep their capacity), so none is allocated
  // once they have grown; entries past k are stale.
  size_t PlanStep(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step,
                int64_t oldest_live_step, bool train, int64_t* slot_of_index,
                std::vector<TableMoves>* moves) EXCLUDES(plan_mu_);

 private:
  const uint32_t ways_;
  const CachePolicy policy_;
  const std::vector<TableCacheSpec> tables_;
  std::vector<std::unique_ptr<SetAssociativeCache>> caches_;
  Mutex plan_mu_;
  std::vector<StepPlan> scratch_ GUARDED_BY(plan_mu_);  // per table, reused across steps
};

}  // namespace mtrains
