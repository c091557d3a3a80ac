// StepMover: a kernel's row moves for one step, every table in one call, in C++.
//
// After the cache index planned a step (cache/kernel_cache_index.h), each table with rows
// to move has dirty rows to write back (evicted from their slots) and missing rows to load
// (into the slots the plan gave them). The mover does both through the table's TierRows:
// straight between the slots and the tier where the tier allows (DRAM, SCM), through one
// reused buffer per direction otherwise (SSD). Loads into overflow slots past the TBE
// (the TBE grows between steps) are read into a buffer the caller copies in later.
//
// Each table's stage CPU time and row counts accumulate in counters(table).
// Thread-safety: every method takes one mutex, so a tier is never replaced while a move
// runs on it and counters are read whole; the kernel moves on its prefetch thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "kernel/tier_rows.h"

namespace mtrains {

struct MoveCounters {
  StageCpu cpu;
  uint64_t rows_loaded = 0, rows_written_back = 0, moves = 0;
};

// One table's rows to move for a step (pointers into the plan; not owned).
struct TableMove {
  size_t table = 0;
  SlotRows slots;
  const int64_t* evict_ids = nullptr;
  const int64_t* evict_slots = nullptr;
  size_t num_evict = 0;
  const int64_t* load_ids = nullptr;
  const int64_t* load_slots = nullptr;
  size_t num_load = 0;
};

// What one table's move left for its caller: the loads whose slots are past the TBE
// (positions in its load list, and their rows) and how many rows read were never written.
struct MoveResult {
  std::vector<int64_t> overflow_positions;
  std::vector<uint8_t> overflow_rows;  // overflow_positions.size() * row_bytes
  uint64_t lazy_rows = 0;
};

class StepMover {
 public:
  explicit StepMover(size_t num_tables);

  size_t num_tables() const { return num_tables_; }
  // Table `table`'s rows now live in `tier` (null: none; a move of the table then fails).
  void SetTier(size_t table, std::unique_ptr<TierRows> tier) EXCLUDES(mu_);
  // Table `table`'s tier becomes wrap(its tier): a tier over the tier (a virtual table's
  // rows). InvalidArgument, nothing changed, when the table has no tier.
  Status WrapTier(size_t table, const std::function<std::unique_ptr<TierRows>(std::unique_ptr<TierRows>)>& wrap)
      EXCLUDES(mu_);

  // Moves one table's rows (TierRows::Move), the loads past its TBE into `result`.
  // InvalidArgument for a table without a tier or an evicted slot past the TBE.
  Status Move(const TableMove& move, MoveResult* result) EXCLUDES(mu_);

  MoveCounters counters(size_t table) const EXCLUDES(mu_);

 private:
  const size_t num_tables_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<TierRows>> tiers_ GUARDED_BY(mu_);
  std::vector<MoveCounters> counters_ GUARDED_BY(mu_);
  std::vector<int64_t> in_ids_ GUARDED_BY(mu_), in_slots_ GUARDED_BY(mu_), out_ids_ GUARDED_BY(mu_);
};

}  // namespace mtrains
