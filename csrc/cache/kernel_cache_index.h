// KernelCacheIndex: the row-cache indexes of every table of one TieredEmbeddingBags,
// planned in one call per step.
//
// A step's indices come table-major (table t's are [bounds[t], bounds[t+1])); PlanStep
// remaps all of them to their tables' cache slots and reports, only for the tables that
// have any, the rows to load and the dirty rows to write back. A step whose rows are all
// cached therefore costs one call and no per-table work on the caller's side. The
// per-table scratch plans are reused from step to step.
//
// A keyed table (a virtual table: its ids are 64-bit keys, its rows given by an id index)
// has a keyed SetAssociativeCache: PlanStep locks its hits by key, hands its misses to a
// MissResolver for their tier rows, then places them; its moves are in tier rows.
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
#include "common/status.h"
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
  bool keyed = false;      // ids are keys, rows come from a MissResolver (no dense map)
};

// Resolves a keyed table's missed keys to tier rows, between the locking of its hits and
// the placing of its misses (PlanStep calls it on the planning thread, with no cache's lock
// held, for every keyed table of every step).
class MissResolver {
 public:
  virtual ~MissResolver() = default;
  // Table `table`'s keys keys[0..n) of step `step`: slot_of[i] >= 0 for hits (tier_row_of[i]
  // their tier row), -1 at the positions misses[0..num_misses) (ascending). Must fill
  // tier_row_of[i] (>= 0) for every miss position, the same row wherever a key repeats.
  // Called for every keyed table in every step, even with no misses: the id index sees each
  // step's hits' tier rows, to count their accesses and keep them from eviction. It may call
  // cache(table).Forget for keys of no live step (an eviction from the id index), and must
  // not call PlanStep or Reset. A non-ok status stops the plan (PlanStep returns it).
  virtual Status ResolveMisses(size_t table, int64_t step, int64_t oldest_live_step, const int64_t* keys,
                               size_t n, const int64_t* slot_of, const size_t* misses, size_t num_misses,
                               int64_t* tier_row_of) = 0;
};

class KernelCacheIndex {
 public:
  // One cache per table, of `tables[t].slots` slots, with a dense map over the table's rows
  // where `tables[t].dense_map` (which then needs `rows` >= 1), keyed where
  // `tables[t].keyed` (which takes no dense map). Throws std::invalid_argument on bad
  // values, naming the table.
  KernelCacheIndex(const std::vector<TableCacheSpec>& tables, uint32_t ways, CachePolicy policy);
  // One cache of `slots[t]` slots per table, none with a map.
  KernelCacheIndex(const std::vector<uint64_t>& slots, uint32_t ways, CachePolicy policy);

  size_t num_tables() const { return caches_.size(); }
  SetAssociativeCache& cache(size_t table) { return *caches_.at(table); }
  // Whether table `table`'s cache is keyed.
  bool keyed(size_t table) const { return tables_.at(table).keyed; }
  // Replaces table `table`'s cache by an empty one of the same spec, map included (its rows
  // were replaced underneath).
  void Reset(size_t table);
  // Announces step `step` of the look-ahead window to every table's cache
  // (SetAssociativeCache::Reserve), its indices table-major as PlanStep takes them.
  void Reserve(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step) EXCLUDES(plan_mu_);
  // Every table's SetAssociativeCache::ReleaseAfter (no PlanStep may run meanwhile).
  void ReleaseAfter(int64_t last_live_step) EXCLUDES(plan_mu_);

  // Plans step `step` over every table (SetAssociativeCache::Plan's contract per table).
  // `bounds` has num_tables() + 1 entries; `slot_of_index` receives bounds.back() slots.
  // Returns k: (*moves)[0, k) are the tables with rows to load or write back, in table
  // order. Entries are reused from step to step (their vectors keep their capacity), so none
  // is allocated once they have grown; entries past k are stale.
  // Keyed tables (their indices are keys) need `resolver`, `tier_row_of_index` (bounds.back()
  // entries: a keyed table's get each index's tier row; the others' are left as they were)
  // and `status`, else std::invalid_argument naming the table. Their hits are locked first
  // (LockHits) and their misses resolved (`resolver`, table by table), before any table is
  // placed; so when a resolver returns a non-ok status, PlanStep stores it in *status and
  // returns 0 having placed nothing: only the keyed tables resolved so far have their hits
  // locked for `step` (as a step that does not run: they unlock as oldest_live_step passes
  // it). *status is ok otherwise. A resolver that leaves a miss without a tier row makes
  // PlanStep throw std::invalid_argument, also before placing anything.
  size_t PlanStep(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step,
                  int64_t oldest_live_step, bool train, int64_t* slot_of_index, std::vector<TableMoves>* moves,
                  MissResolver* resolver = nullptr, int64_t* tier_row_of_index = nullptr,
                  Status* status = nullptr) EXCLUDES(plan_mu_);

 private:
  const uint32_t ways_;
  const CachePolicy policy_;
  // Throws std::invalid_argument unless `bounds` has num_tables() + 1 entries, ascending from >= 0.
  void CheckBounds(const std::vector<int64_t>& bounds) const;
  // Throws std::invalid_argument naming the first keyed table when an argument it needs is null.
  void CheckKeyedArgs(const MissResolver* resolver, const int64_t* tier_row_of_index, const Status* status) const;
  // Passes 1 and 2 of every keyed table (LockHits), each followed by its resolver call;
  // stops at the first non-ok status.
  Status LockAndResolveKeyed(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step,
                             int64_t oldest_live_step, bool train, int64_t* slot_of_index, MissResolver* resolver,
                             int64_t* tier_row_of_index) REQUIRES(plan_mu_);
  // Copies table `table`'s plan into the next entry of `moves` when it moves any row.
  static void AddMoves(size_t table, const StepPlan& plan, std::vector<TableMoves>* moves, size_t* used);

  const std::vector<TableCacheSpec> tables_;
  std::vector<size_t> keyed_tables_;  // the keyed tables' numbers, ascending
  std::vector<std::unique_ptr<SetAssociativeCache>> caches_;
  Mutex plan_mu_;
  std::vector<StepPlan> scratch_ GUARDED_BY(plan_mu_);  // per table, reused across steps
};

}  // namespace mtrains
