// RowCache: the store's DRAM row cache, write-back, CLOCK replacement.
//
// Holds up to `capacity` rows of `row_bytes` each in one contiguous buffer, indexed by an
// open-addressing hash table (linear probing, backward-shift deletion) from row id to
// slot. Not thread-safe: the owning BlockStore serialises access.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mtrains {

class RowCache {
 public:
  RowCache(uint64_t capacity, uint32_t row_bytes);

  uint64_t capacity() const { return capacity_; }
  uint64_t size() const { return size_; }

  // Returns the row's bytes and marks it recently used, or nullptr when absent.
  uint8_t* Lookup(uint64_t row);
  // Whether the row is held (changes no state, not even its CLOCK bit).
  bool Contains(uint64_t row) const { return capacity_ > 0 && FindIndex(row) != kNone; }
  // Lookup of many rows at once (ptrs[i] for rows[i]), with software prefetching of the
  // hash table and the rows: several times faster than a loop of Lookup on large caches.
  void LookupMany(const int64_t* rows, size_t n, uint8_t** ptrs);

  // A slot chosen for a new row. When `evicted` is true, the slot held row `victim_row`,
  // whose bytes are still at `data` and, if `victim_dirty`, must be written back before
  // the caller overwrites them.
  struct Reservation {
    uint8_t* data = nullptr;
    bool evicted = false;
    uint64_t victim_row = 0;
    bool victim_dirty = false;
  };
  // Reserves a slot for `row` (which must be absent); capacity() must be > 0. The row is
  // inserted clean; call MarkDirty to make it dirty.
  Reservation Insert(uint64_t row);
  void MarkDirty(uint64_t row);
  // Calls fn(row, data) for up to `max_rows` dirty rows, in row-id order, and marks them
  // clean. Returns how many were drained.
  template <typename Fn>
  uint64_t DrainDirty(uint64_t max_rows, Fn fn);
  uint64_t dirty_count() const { return dirty_count_; }
  // Appends to `out`, in no particular order, the dirty rows in [first, first + count).
  // Costs min(count, size()) probes or slot visits; changes no state (not even CLOCK bits).
  void DirtyRowsIn(uint64_t first, uint64_t count, std::vector<int64_t>* out) const;

 private:
  uint64_t FindIndex(uint64_t row) const;  // index in table_ or kNone
  void EraseIndex(uint64_t idx);
  static uint64_t Hash(uint64_t row) { return (row * 0x9E3779B97F4A7C15ull) >> 17; }

  static constexpr uint64_t kNone = ~0ull;
  static constexpr uint64_t kEmpty = ~0ull;

  const uint64_t capacity_;
  const uint32_t row_bytes_;
  std::vector<uint8_t> data_;        // capacity_ * row_bytes_
  std::vector<uint64_t> slot_row_;   // row held by each slot, kEmpty if free
  std::vector<uint8_t> ref_, dirty_; // CLOCK reference bit, dirty bit per slot
  struct Entry {
    uint64_t key;   // row id or kEmpty
    uint64_t slot;  // index into data_
  };
  std::vector<Entry> table_;  // open addressing, linear probing
  uint64_t mask_ = 0;
  uint64_t size_ = 0, hand_ = 0, dirty_count_ = 0;
};

template <typename Fn>
uint64_t RowCache::DrainDirty(uint64_t max_rows, Fn fn) {
  std::vector<std::pair<uint64_t, uint32_t>> dirty;
  dirty.reserve(dirty_count_);
  for (uint64_t s = 0; s < capacity_; ++s)
    if (dirty_[s]) dirty.emplace_back(slot_row_[s], static_cast<uint32_t>(s));
  std::sort(dirty.begin(), dirty.end());
  if (dirty.size() > max_rows) dirty.resize(max_rows);
  for (const auto& [row, slot] : dirty) {
    fn(row, data_.data() + uint64_t(slot) * row_bytes_);
    dirty_[slot] = 0;
  }
  dirty_count_ -= dirty.size();
  return dirty.size();
}

}  // namespace mtrains
