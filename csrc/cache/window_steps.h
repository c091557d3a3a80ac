// WindowSteps: for each key of the look-ahead window (the batches submitted and not yet
// planned), the last window step that uses it.
//
// A cache asks it when it places a missed key: a key a later window step uses is kept
// from eviction until that step (SetAssociativeCache::Reserve). Open addressing with
// linear probing over a power-of-two table; entries of steps already planned are stale and
// dropped when the table is rebuilt, which happens once the entries fill half of it, so a
// Note or Find costs one probe sequence, amortised, and the table holds about twice the
// window's distinct keys.
// Not thread-safe: its cache's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/huge_page_allocator.h"

namespace mtrains {

class WindowSteps {
 public:
  static constexpr int64_t kNone = -1;

  // Key `key` is used by window step `step` (steps are noted in ascending order); returns
  // whether this is the key's first note for `step`.
  bool Note(int64_t key, int64_t step);
  // The last window step that uses `key` and is after `after`, or kNone.
  int64_t Find(int64_t key, int64_t after) const;
  // Asks for the cache line where Note or Find of `key` starts (a few keys ahead of it: the
  // table is read at random and is larger than the caches).
  void Prefetch(int64_t key) const {
    if (!table_.empty()) __builtin_prefetch(table_.data() + SlotOf(key));
  }
  // Steps up to `last_planned` are no longer in the window: their entries may go.
  void SetPlannedThrough(int64_t last_planned) { planned_through_ = last_planned; }
  // Forgets every entry (the window's steps were dropped).
  void Clear();
  bool empty() const { return used_ == 0; }

 private:
  struct Entry {
    int64_t key = 0;
    int64_t step = kNone;  // kNone: an empty entry (steps are >= 0), so any key may be noted
  };

  size_t SlotOf(int64_t key) const;
  // Rebuilds the table, keeping the entries of steps after planned_through_, at
  // `min_capacity` slots or more.
  void Rebuild(size_t min_capacity);

  // Probed at random, a few MiB to tens of MiB for a window of 16 large batches: huge pages
  // spare a TLB miss a probe.
  using Table = std::vector<Entry, HugePageAllocator<Entry>>;
  Table table_;
  size_t used_ = 0;  // entries taken (live or stale)
  int64_t planned_through_ = kNone;
};

}  // namespace mtrains
