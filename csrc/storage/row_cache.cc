#include "storage/row_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mtrains {

RowCache::RowCache(uint64_t capacity, uint32_t row_bytes)
    : capacity_(capacity), row_bytes_(row_bytes) {
  if (capacity > (1ull << 31))
    throw std::invalid_argument("DRAM cache of " + std::to_string(capacity) +
                                " rows exceeds the 2^31-row limit");
  data_.resize(capacity * row_bytes);
  slot_row_.assign(capacity, kEmpty);
  ref_.assign(capacity, 0);
  dirty_.assign(capacity, 0);
  uint64_t table = 16;
  while (table < capacity * 2) table <<= 1;
  mask_ = table - 1;
  table_.assign(capacity ? table : 0, Entry{kEmpty, 0});
}

uint64_t RowCache::FindIndex(uint64_t row) const {
  if (capacity_ == 0) return kNone;
  for (uint64_t i = Hash(row) & mask_;; i = (i + 1) & mask_) {
    if (table_[i].key == row) return i;
    if (table_[i].key == kEmpty) return kNone;
  }
}

uint8_t* RowCache::Lookup(uint64_t row) {
  const uint64_t idx = FindIndex(row);
  if (idx == kNone) return nullptr;
  const uint64_t slot = table_[idx].slot;
  ref_[slot] = 1;
  return data_.data() + slot * row_bytes_;
}

void RowCache::LookupMany(const int64_t* rows, size_t n, uint8_t** ptrs) {
  if (capacity_ == 0) {
    for (size_t i = 0; i < n; ++i) ptrs[i] = nullptr;
    return;
  }
  // Two-stage pipeline: prefetch the table entry kAhead rows ahead, then look up and
  // prefetch the row's first cache lines kAhead/2 rows ahead of its use by the caller.
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < std::min(n, kAhead); ++i)
    __builtin_prefetch(&table_[Hash(static_cast<uint64_t>(rows[i])) & mask_]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n)
      __builtin_prefetch(&table_[Hash(static_cast<uint64_t>(rows[i + kAhead])) & mask_]);
    uint8_t* p = Lookup(static_cast<uint64_t>(rows[i]));
    if (p != nullptr) {
      __builtin_prefetch(p);
      __builtin_prefetch(p + 64);
    }
    ptrs[i] = p;
  }
}

void RowCache::EraseIndex(uint64_t idx) {
  // Backward-shift deletion keeps probe sequences intact without tombstones.
  uint64_t hole = idx;
  for (uint64_t i = (hole + 1) & mask_; table_[i].key != kEmpty; i = (i + 1) & mask_) {
    const uint64_t home = Hash(table_[i].key) & mask_;
    // Move entry i into the hole if its home is not in the cyclic range (hole, i].
    const bool in_range = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
    if (!in_range) {
      table_[hole] = table_[i];
      hole = i;
    }
  }
  table_[hole].key = kEmpty;
}

RowCache::Reservation RowCache::Insert(uint64_t row) {
  Reservation r;
  uint64_t slot;
  if (size_ < capacity_) {
    slot = size_++;
  } else {
    // CLOCK: skip recently used slots, clearing their bit.
    while (ref_[hand_]) {
      ref_[hand_] = 0;
      hand_ = (hand_ + 1) % capacity_;
    }
    slot = hand_;
    hand_ = (hand_ + 1) % capacity_;
    r.evicted = true;
    r.victim_row = slot_row_[slot];
    r.victim_dirty = dirty_[slot] != 0;
    if (r.victim_dirty) --dirty_count_;
    dirty_[slot] = 0;
    EraseIndex(FindIndex(r.victim_row));
  }
  slot_row_[slot] = row;
  // Inserted with the reference bit clear: a row earns protection by a second access.
  // (Setting it on insert lets a burst of new rows set every bit, after which the hand
  // clears them all and evicts hot rows -- a measured hit-rate collapse under Zipf reads.)
  ref_[slot] = 0;
  uint64_t i = Hash(row) & mask_;
  while (table_[i].key != kEmpty) i = (i + 1) & mask_;
  table_[i] = Entry{row, slot};
  r.data = data_.data() + slot * row_bytes_;
  return r;
}

void RowCache::DirtyRowsIn(uint64_t first, uint64_t count, std::vector<int64_t>* out) const {
  if (dirty_count_ == 0 || count == 0) return;
  if (count < size_) {  // a short range: probe the index for each of its rows
    for (uint64_t row = first; row < first + count; ++row) {
      const uint64_t idx = FindIndex(row);
      if (idx != kNone && dirty_[table_[idx].slot]) out->push_back(static_cast<int64_t>(row));
    }
    return;
  }
  // Slots [0, size_) are the filled ones (slots are taken in order and never freed).
  for (uint64_t s = 0; s < size_; ++s) {
    const uint64_t row = slot_row_[s];
    if (dirty_[s] && row >= first && row - first < count) out->push_back(static_cast<int64_t>(row));
  }
}

void RowCache::MarkDirty(uint64_t row) {
  const uint64_t idx = FindIndex(row);
  if (idx == kNone) return;
  const uint64_t slot = table_[idx].slot;
  if (!dirty_[slot]) {
    dirty_[slot] = 1;
    ++dirty_count_;
  }
}

}  // namespace mtrains
