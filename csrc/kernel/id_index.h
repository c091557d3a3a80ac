// IdIndex: the rows of one virtual table, every id its own row, made on first lookup.
//
// A virtual table's ids span a space far larger than its rows (raw 64-bit ids); the kernel
// under it (row cache, step mover, stores) works on dense rows [0, capacity). The index
// maps each live id to its row with no collisions: an open-addressing table (linear
// probing) of 32-bit entries -- a row number and, in the bits the row numbers leave, a
// fingerprint of the id -- whose keys are kept once, in the row -> id array `ids_`, so a
// lookup compares the full id, only where the fingerprint matches. A row costs its id (8 B, up to 9 B with the array's
// growth room) plus its table entry (4 B / load, the load kept in [0.61, 0.85] by growing
// 1.4x): 12.7-15.6 B. Rows freed by eviction are reused (a free list threaded through
// their `ids_` entries costs nothing more); the arrays grow with the rows ever used, not
// with the capacity, and keep their size after an eviction pass.
//
// Fresh rows: a row taken by a new id still holds its previous id's bytes on the tier (or
// never-written bytes). It stays fresh until the step mover first loads it into a cache
// slot (VirtualTierRows), which then makes the id's initial value instead of reading the
// tier; the caller keeps that slot dirty, so the tier gets the new bytes.
//
// Eviction metadata per row, only what the policy reads: an access count (float,
// multiplied by the decay at each eviction pass, as FBGEMM's count policies do) and the
// last access time (uint32 seconds on the caller's clock).
//
// Thread-safety: every method takes the index's mutex, except TakeFresh, which takes only
// the fresh rows' own: the I/O thread takes a step's fresh rows while the plan thread maps
// a later step, without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace mtrains {

// Which live ids an eviction pass removes (FBGEMM's rules): with `count_threshold` > 0,
// those whose decayed count is below it; with `ttl_seconds` > 0, those unused for longer;
// with both, only those both rules name. With neither, none.
struct EvictionRule {
  double decay_rate = 1.0;     // counts are multiplied by this first (when counted)
  double count_threshold = 0;  // 0: the count does not decide
  uint64_t ttl_seconds = 0;    // 0: the last use does not decide
};

struct IdIndexStats {
  uint64_t live = 0;         // ids holding a row
  uint64_t capacity = 0;     // rows the table has
  uint64_t rows_used = 0;    // rows ever taken (the arrays' length)
  uint64_t table_slots = 0;  // entries of the hash table
  uint64_t index_bytes = 0;  // the hash table and the row -> id array (allocated)
  uint64_t metadata_bytes = 0;  // counts and times (allocated)
  uint64_t ids_created = 0, ids_evicted = 0, eviction_passes = 0, fresh_loads = 0;
};

class IdIndex {
 public:
  // A table of `capacity` rows (< 2^32 - 1); `counts` / `times`: keep that metadata.
  // Throws std::invalid_argument on a bad capacity.
  IdIndex(uint64_t capacity, bool counts, bool times);

  // Rows of ids[0..n) into rows[0..n) (ids >= 0). With `create`, an id without a row takes
  // a free one (fresh), and the position of its first occurrence is appended to
  // `created_at`; without, it maps to -1. Each occurrence counts one access at time `now`.
  // IoError(ENOSPC) when the free rows run out, with nothing changed.
  Status Map(const int64_t* ids, size_t n, bool create, uint32_t now, int64_t* rows,
             std::vector<int64_t>* created_at) EXCLUDES(mu_);
  // Distinct ids of ids[0..n) that hold no row.
  uint64_t CountMissing(const int64_t* ids, size_t n) const EXCLUDES(mu_);
  // Rows of ids[0..n) (-1: none), changing nothing.
  void Find(const int64_t* ids, size_t n, int64_t* rows) const EXCLUDES(mu_);
  // Counts one access at time `now` of each of rows[0..n) (live rows, found without a
  // lookup: a cache hit's), as Map counts a found id's. Nothing to do without metadata.
  void Touch(const int64_t* rows, size_t n, uint32_t now) EXCLUDES(mu_);
  // Whether Map and Touch keep per-row metadata (counts or times).
  bool keeps_metadata() const { return keep_counts_ || keep_times_; }
  // Ids holding a row.
  uint64_t live() const EXCLUDES(mu_);

  // For each of rows[0..n): whether it was fresh (fresh[i]), then no longer fresh, and the
  // id it was made for (ids[i]; -1 for a row that was not fresh).
  void TakeFresh(const int64_t* rows, size_t n, uint8_t* fresh, int64_t* ids) EXCLUDES(fresh_mu_);

  // One eviction pass: decays the counts, then removes the ids `rule` names, except those
  // holding rows in keep_rows[0..nk). Their ids and rows are appended to the vectors.
  void Evict(const EvictionRule& rule, uint32_t now, const int64_t* keep_rows, size_t nk,
             std::vector<int64_t>* ids, std::vector<int64_t>* rows) EXCLUDES(mu_);
  // Removes ids[0..n) (those without a row are skipped); appends the rows freed.
  void Remove(const int64_t* ids, size_t n, std::vector<int64_t>* rows) EXCLUDES(mu_);

  // Every live (id, row), by row.
  void Entries(std::vector<int64_t>* ids, std::vector<int64_t>* rows) const EXCLUDES(mu_);
  // The access count and last access time of rows[0..n) (0 where not kept or not live).
  void Metadata(const int64_t* rows, size_t n, float* counts, uint32_t* times) const EXCLUDES(mu_);
  // Empties the index, then gives ids[i] row rows[i] with the given metadata (null: 0),
  // none of them fresh (their rows hold their bytes). InvalidArgument, nothing changed,
  // for a row outside the capacity, a row or id given twice, or a negative id.
  Status Assign(const int64_t* ids, const int64_t* rows, size_t n, const float* counts,
                const uint32_t* times) EXCLUDES(mu_);

  IdIndexStats Stats() const EXCLUDES(mu_);
  uint64_t capacity() const { return capacity_; }

 private:
  static constexpr uint32_t kEmptySlot = 0xFFFFFFFFu;
  // A free row's entry in ids_ links the free list: -2 - (the next free row), or kLastFree.
  static constexpr int64_t kLastFree = -1;
  static bool Free(int64_t entry) { return entry < 0; }
  void PushFree(uint32_t row) REQUIRES(mu_) {
    ids_[row] = free_head_ < 0 ? kLastFree : -2 - free_head_;
    free_head_ = row;
  }
  uint32_t PopFree() REQUIRES(mu_) {
    const uint32_t row = static_cast<uint32_t>(free_head_);
    free_head_ = ids_[row] == kLastFree ? -1 : -2 - ids_[row];
    return row;
  }

  uint64_t Home(int64_t id) const REQUIRES(mu_);
  // The table entry of `id` at `row`: the row number in the low row_bits_, a fingerprint
  // of the id (bits of its hash that Home does not use) in the others.
  uint32_t Entry(int64_t id, uint32_t row) const;
  // The table slot holding `id`'s row, or the empty slot where it would go (*found false).
  uint64_t Probe(int64_t id, bool* found) const REQUIRES(mu_);
  // Asks for the cache lines the probes of the ids after ids[i] read first.
  void PrefetchProbe(const int64_t* ids, size_t i, size_t n) const REQUIRES(mu_);
  // Takes a free row for `id` (its table slot `slot`, empty). Precondition: one is free.
  uint32_t Insert(int64_t id, uint64_t slot) REQUIRES(mu_);
  // Removes the entry at table slot `slot` (backward-shift deletion) and frees its row.
  void Erase(uint64_t slot) REQUIRES(mu_);
  void Rehash(uint64_t slots) REQUIRES(mu_);
  void GrowRows() REQUIRES(mu_);
  uint64_t FreeRows() const REQUIRES(mu_) { return capacity_ - live_; }
  // Marks `row` no longer fresh (its id went before its first load).
  void DropFresh(uint32_t row) EXCLUDES(fresh_mu_);

  const uint64_t capacity_;
  const bool keep_counts_, keep_times_;
  const uint32_t row_bits_, fp_bits_;  // an entry's split: row number, fingerprint
  const uint32_t row_mask_, fp_mask_;
  mutable Mutex mu_;
  std::vector<uint32_t> table_ GUARDED_BY(mu_);  // row numbers, kEmptySlot
  std::vector<int64_t> ids_ GUARDED_BY(mu_);     // row -> id; the free list in free rows
  // Fresh rows -> the id each was made for (see the top): only rows not yet loaded, few.
  mutable Mutex fresh_mu_;  // taken after mu_ where both are held
  std::unordered_map<uint32_t, int64_t> fresh_ GUARDED_BY(fresh_mu_);
  uint64_t fresh_loads_ GUARDED_BY(fresh_mu_) = 0;
  std::vector<std::pair<uint32_t, int64_t>> made_ GUARDED_BY(mu_);  // a Map's new rows, scratch
  std::vector<float> counts_ GUARDED_BY(mu_);
  std::vector<uint32_t> times_ GUARDED_BY(mu_);
  int64_t free_head_ GUARDED_BY(mu_) = -1;       // first freed row (below rows_used_), -1: none
  uint64_t rows_used_ GUARDED_BY(mu_) = 0;       // rows [0, rows_used_) were ever taken
  uint64_t live_ GUARDED_BY(mu_) = 0;
  IdIndexStats counters_ GUARDED_BY(mu_);
};

}  // namespace mtrains
