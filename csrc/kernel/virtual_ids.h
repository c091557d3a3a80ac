// VirtualIds: a kernel's virtual tables between their caches and their id indexes.
//
// A virtual table's cache is keyed by the table's own ids (cache/kernel_cache_index.h,
// TableCacheSpec::keyed): a hit finds its slot, and the slot's tier row, without the id
// index. The plan calls ResolveMisses for each virtual table once its hits are locked; the
// id index (kernel/id_index.h) is consulted only for the ids the cache missed:
//   - a missed id with a row gets it; one without takes a free row (fresh: the step mover
//     makes its initial value at its first load, kernel/virtual_tier_rows.h);
//   - each access is counted where the policy keeps counts or times (hits by their row,
//     without a lookup);
//   - an eviction pass runs once a step took the live ids past the policy's trigger, or
//     when a step's new ids would not fit the rows: it removes the ids the policy names,
//     never those of a live step (the step still in its backward and every step planned
//     after it), and drops them from the cache unwritten. The L2-norm policy reads rows'
//     weights: its pass is the caller's (NormEviction, Python's RowWeights);
//   - after a checkpoint's restore, the steps the saved run had mapped but not computed
//     (`replay`) are looked up again without counting them twice.
// No row is ever looked up twice on a hit, and nothing here allocates once its scratch
// vectors have grown to the batch.
//
// Thread-safety: ResolveMisses runs on the plan thread; the others may run on any thread
// (between steps for Restored). The NormEviction hook runs under the object's lock: it must
// not call back into this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/kernel_cache_index.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "kernel/id_index.h"

namespace mtrains {

// One virtual table's index and policy.
struct VirtualTable {
  size_t table = 0;  // the kernel's table number
  std::string name;
  std::shared_ptr<IdIndex> index;
  uint64_t trigger_ids = 0;  // a pass runs when a step takes the live ids past this (0: only when full)
  EvictionRule rule;         // the count and time rules (FBGEMM's)
  bool by_norm = false;      // the L2-norm rule: a pass is NormEviction's
  // Seconds now for the policy: the wall clock, or (false) what SetNow gave (a test's clock).
  bool wall_clock = true;
  bool evicts() const { return by_norm || rule.count_threshold > 0 || rule.ttl_seconds > 0; }
};

// The L2-norm policy's pass over table `table`: removes the ids whose rows' weights have a
// norm below the threshold, except those holding keep_rows[0..n), and drops them from the
// cache; returns how many ids it removed, or -1 when it failed (the callee keeps its error).
struct NormEviction {
  void* context = nullptr;
  int64_t (*evict)(void* context, int64_t step, int64_t table, const int64_t* keep_rows, int64_t n) = nullptr;
};

class VirtualIds : public MissResolver {
 public:
  // `cache`: the kernel's index, whose virtual tables are keyed; `norm`: the L2-norm pass.
  VirtualIds(KernelCacheIndex* cache, NormEviction norm) : cache_(cache), norm_(norm) {}
  // Adds a virtual table, before the first step. Throws std::invalid_argument for a table
  // named twice, a missing index, a table the cache does not key by id, or an L2-norm rule
  // without a pass to call.
  void Add(VirtualTable table) EXCLUDES(mu_);

  bool IsVirtual(size_t table) const { return table < slot_of_table_.size() && slot_of_table_[table] >= 0; }

  // Seconds now of the next steps' policy, for a table without the wall clock.
  void SetNow(size_t table, int64_t now) EXCLUDES(mu_);
  // Each virtual table's seconds now, in table order, for a step submitted now.
  void Now(std::vector<uint32_t>* out) const EXCLUDES(mu_);
  // The step about to be planned runs at these seconds (Now's, on the plan thread).
  void BeginStep(const std::vector<uint32_t>& now) EXCLUDES(mu_);

  Status ResolveMisses(size_t table, int64_t step, int64_t oldest_live_step, const int64_t* keys, size_t n,
                       const int64_t* slot_of, const size_t* misses, size_t num_misses,
                       int64_t* tier_row_of) override EXCLUDES(mu_);

  // Sets flags[i] = 1 at each position i of table `table`'s part of the last planned step
  // whose id was given a row by it (flags: that part's).
  void MarkCreated(size_t table, uint8_t* flags) const EXCLUDES(mu_);

  // The live ids at which table `table`'s next pass may run.
  uint64_t NextPassAt(size_t table) const EXCLUDES(mu_);
  // Table `table`'s ids found by the cache (no id lookup) and ids looked up in its index.
  std::pair<uint64_t, uint64_t> Lookups(size_t table) const EXCLUDES(mu_);
  // The planned steps after `last_live_step` were dropped: their rows are no longer kept.
  void Dropped(int64_t last_live_step) EXCLUDES(mu_);
  // After a restore (no step pending): `replay` steps are looked up again without being
  // counted; the next pass waits for `next_pass_at` live ids (-1: as after a pass now).
  void Restored(size_t table, uint64_t replay, int64_t next_pass_at) EXCLUDES(mu_);

 private:
  struct State {
    VirtualTable spec;
    uint64_t next_pass_at = 0, replay = 0;
    uint64_t cache_found = 0, index_lookups = 0;
    uint32_t now = 0;          // this step's
    int64_t given_now = 0;     // SetNow's
    // Rows of the steps planned and not yet done, oldest first: never evicted (kept only
    // where the policy evicts).
    std::deque<std::pair<int64_t, std::vector<int64_t>>> step_rows;
    std::vector<std::vector<int64_t>> spare;  // step_rows' vectors, for reuse
    std::vector<int64_t> created;
  };

  State& StateOf(size_t table) REQUIRES(mu_);
  const State& StateOf(size_t table) const REQUIRES(mu_);
  // Table `s`'s rows of live steps (steps >= oldest_live), into keep_.
  void ProtectedRows(State& s, int64_t oldest_live) REQUIRES(mu_);
  // One eviction pass, keeping keep_ as well; drops the evicted ids from the cache.
  Status EvictPass(State& s, int64_t step) REQUIRES(mu_);
  void PassDone(State& s) REQUIRES(mu_);
  Status FullError(const State& s, const int64_t* ids, size_t n) const;
  void RecordStep(State& s, int64_t step, const int64_t* rows, size_t n) REQUIRES(mu_);
  // Forgets the rows kept for table `s`'s steps after `step` (their vectors kept for reuse).
  void ForgetStepsAfter(State& s, int64_t step) REQUIRES(mu_);

  KernelCacheIndex* const cache_;
  const NormEviction norm_;
  std::vector<int> slot_of_table_;  // kernel table -> states_ entry, -1: dense
  mutable Mutex mu_;
  std::vector<State> states_ GUARDED_BY(mu_);
  // Scratch of one resolve, reused.
  std::vector<int64_t> miss_ids_ GUARDED_BY(mu_), miss_rows_ GUARDED_BY(mu_), hit_rows_ GUARDED_BY(mu_);
  std::vector<int64_t> created_at_ GUARDED_BY(mu_), keep_ GUARDED_BY(mu_), evicted_ids_ GUARDED_BY(mu_),
      evicted_rows_ GUARDED_BY(mu_);
};

}  // namespace mtrains
