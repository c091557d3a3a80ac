#include "kernel/id_index.h"

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <unordered_set>

namespace mtrains {
namespace {

constexpr double kMaxLoad = 0.85;  // grow the table past this load
constexpr double kGrowth = 1.4;
constexpr uint64_t kMinSlots = 64;
constexpr size_t kAhead = 8;  // lookups between a prefetch and the probe that reads it

uint64_t Mix(uint64_t x) {  // SplitMix64's finalizer: every id bit moves every slot bit
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

namespace {

// Bits of an entry's row number: enough for every row and one more value (an entry of all
// ones is the empty slot), so a table of up to 2^31 - 2 rows leaves bits for a fingerprint.
uint32_t RowBits(uint64_t capacity) {
  uint32_t bits = 1;
  while ((uint64_t(1) << bits) < capacity + 2 && bits < 32) ++bits;
  return bits;
}

}  // namespace

IdIndex::IdIndex(uint64_t capacity, bool counts, bool times)
    : capacity_(capacity),
      keep_counts_(counts),
      keep_times_(times),
      row_bits_(RowBits(capacity)),
      fp_bits_(32 - row_bits_),
      row_mask_(row_bits_ == 32 ? 0xFFFFFFFFu : (uint32_t(1) << row_bits_) - 1),
      fp_mask_(fp_bits_ == 0 ? 0u : (uint32_t(1) << fp_bits_) - 1) {
  if (capacity == 0 || capacity >= kEmptySlot)
    throw std::invalid_argument("a virtual table needs between 1 and 2^32 - 2 rows, got " +
                                std::to_string(capacity));
  MutexLock lock(&mu_);
  table_.assign(kMinSlots, kEmptySlot);
  counters_.capacity = capacity;
}

uint64_t IdIndex::Home(int64_t id) const {
  // Multiply-shift range reduction: any table size, no division.
  return static_cast<uint64_t>((__uint128_t(Mix(static_cast<uint64_t>(id))) * table_.size()) >> 64);
}

uint32_t IdIndex::Entry(int64_t id, uint32_t row) const {
  return fp_bits_ ? (uint32_t(Mix(static_cast<uint64_t>(id)) & fp_mask_) << row_bits_) | row : row;
}

uint64_t IdIndex::Probe(int64_t id, bool* found) const {
  const uint64_t m = table_.size();
  uint64_t s = Home(id);
  // An entry whose fingerprint differs holds another id: only a matching one costs a look
  // at the row's id (a cache miss), so a probe past other ids' entries stays in the table.
  const uint32_t fp = Entry(id, 0);
  const uint32_t fp_part = ~row_mask_;
  for (;;) {
    const uint32_t e = table_[s];
    if (e == kEmptySlot) {
      *found = false;
      return s;
    }
    if ((e & fp_part) == fp && ids_[e & row_mask_] == id) {
      *found = true;
      return s;
    }
    if (++s == m) s = 0;
  }
}

void IdIndex::GrowRows() {
  if (ids_.size() == ids_.capacity()) {
    const uint64_t want = std::min<uint64_t>(
        capacity_, std::max<uint64_t>(kMinSlots, ids_.size() + ids_.size() / 8 + 1));
    ids_.reserve(want);
    if (keep_counts_) counts_.reserve(want);
    if (keep_times_) times_.reserve(want);
  }
  ids_.push_back(kLastFree);
  if (keep_counts_) counts_.push_back(0.f);
  if (keep_times_) times_.push_back(0);
  ++rows_used_;
}

uint32_t IdIndex::Insert(int64_t id, uint64_t slot) {
  uint32_t row;
  if (free_head_ >= 0) {
    row = PopFree();
  } else {
    row = static_cast<uint32_t>(rows_used_);
    GrowRows();
  }
  ids_[row] = id;
  if (keep_counts_) counts_[row] = 0.f;
  if (keep_times_) times_[row] = 0;
  made_.emplace_back(row, id);
  table_[slot] = Entry(id, row);
  ++live_;
  ++counters_.ids_created;
  if (double(live_) > kMaxLoad * double(table_.size())) Rehash(uint64_t(double(table_.size()) * kGrowth) + 1);
  return row;
}

void IdIndex::Rehash(uint64_t slots) {
  // From the row -> id array, in row order: ids_ is read sequentially and only the new
  // table's slots are random (asked for a few rows ahead); the old table goes first.
  std::vector<uint32_t>().swap(table_);
  table_.assign(slots, kEmptySlot);
  for (uint64_t r = 0; r < rows_used_; ++r) {
    if (r + kAhead < rows_used_ && !Free(ids_[r + kAhead])) __builtin_prefetch(&table_[Home(ids_[r + kAhead])]);
    if (Free(ids_[r])) continue;
    bool found;
    table_[Probe(ids_[r], &found)] = Entry(ids_[r], static_cast<uint32_t>(r));
  }
}

void IdIndex::Erase(uint64_t slot) {
  const uint32_t row = table_[slot] & row_mask_;
  PushFree(row);
  DropFresh(row);
  --live_;
  ++counters_.ids_evicted;
  // Backward-shift deletion: move up every later entry of the run whose home does not lie
  // cyclically in (hole, its slot], so that no probe meets a hole before its entry.
  const uint64_t m = table_.size();
  uint64_t hole = slot, j = slot;
  for (;;) {
    if (++j == m) j = 0;
    const uint32_t e = table_[j];
    if (e == kEmptySlot) break;
    const uint64_t home = Home(ids_[e & row_mask_]);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      table_[hole] = e;
      hole = j;
    }
  }
  table_[hole] = kEmptySlot;
}

Status IdIndex::Map(const int64_t* ids, size_t n, bool create, uint32_t now, int64_t* rows,
                    std::vector<int64_t>* created_at) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i)
    if (ids[i] < 0)
      return Status::InvalidArgument("id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                     " is negative");
  const size_t created_before = created_at->size();
  made_.clear();
  for (size_t i = 0; i < n; ++i) {
    PrefetchProbe(ids, i, n);
    const int64_t id = ids[i];
    bool found;
    const uint64_t slot = Probe(id, &found);
    if (found) {
      rows[i] = table_[slot] & row_mask_;
    } else if (!create) {
      rows[i] = -1;
      continue;
    } else if (FreeRows() == 0) {
      // Undo this call's new ids: the index is as it was.
      for (size_t k = created_before; k < created_at->size(); ++k) {
        bool again;
        const uint64_t s = Probe(ids[(*created_at)[k]], &again);
        if (again) Erase(s);
      }
      const uint64_t undone = created_at->size() - created_before;
      counters_.ids_created -= undone;
      counters_.ids_evicted -= undone;
      created_at->resize(created_before);
      made_.clear();
      return Status::IoError(ENOSPC, "all " + std::to_string(capacity_) + " rows of the virtual table hold live ids");
    } else {
      rows[i] = Insert(id, slot);
      created_at->push_back(int64_t(i));
    }
    const uint32_t r = static_cast<uint32_t>(rows[i]);
    if (keep_counts_) counts_[r] += 1.f;
    if (keep_times_) times_[r] = now;
  }
  if (!made_.empty()) {  // the step's new rows are fresh until the mover loads them
    MutexLock fresh_lock(&fresh_mu_);
    fresh_.reserve(fresh_.size() + made_.size());
    for (const auto& [row, id] : made_) fresh_[row] = id;
  }
  return Status::Ok();
}

void IdIndex::DropFresh(uint32_t row) {
  MutexLock lock(&fresh_mu_);
  fresh_.erase(row);
}

void IdIndex::PrefetchProbe(const int64_t* ids, size_t i, size_t n) const {
  // A lookup is two dependent cache misses in a table much larger than the cache: the id's
  // home slot, then the id of the row there (what Probe compares first). Ask for the slot
  // 2 * kAhead ids ahead, and for the row's id kAhead ahead, once its slot has arrived.
  if (i + 2 * kAhead < n) __builtin_prefetch(&table_[Home(ids[i + 2 * kAhead])]);
  if (i + kAhead < n) {
    const uint32_t e = table_[Home(ids[i + kAhead])];
    if (e != kEmptySlot) __builtin_prefetch(&ids_[e & row_mask_]);
  }
}

uint64_t IdIndex::CountMissing(const int64_t* ids, size_t n) const {
  MutexLock lock(&mu_);
  std::unordered_set<int64_t> missing;
  for (size_t i = 0; i < n; ++i) {
    bool found;
    Probe(ids[i], &found);
    if (!found) missing.insert(ids[i]);
  }
  return missing.size();
}

void IdIndex::Find(const int64_t* ids, size_t n, int64_t* rows) const {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    PrefetchProbe(ids, i, n);
    bool found;
    const uint64_t slot = Probe(ids[i], &found);
    rows[i] = found ? int64_t(table_[slot] & row_mask_) : -1;
  }
}

void IdIndex::Touch(const int64_t* rows, size_t n, uint32_t now) {
  if (!keeps_metadata()) return;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = uint64_t(rows[i]);
    if (r >= rows_used_ || Free(ids_[r])) continue;
    if (keep_counts_) counts_[r] += 1.f;
    if (keep_times_) times_[r] = now;
  }
}

uint64_t IdIndex::live() const {
  MutexLock lock(&mu_);
  return live_;
}

void IdIndex::TakeFresh(const int64_t* rows, size_t n, uint8_t* fresh, int64_t* ids) {
  MutexLock lock(&fresh_mu_);
  for (size_t i = 0; i < n; ++i) {
    fresh[i] = 0;
    ids[i] = -1;
    if (fresh_.empty() || rows[i] < 0 || rows[i] >= int64_t(capacity_)) continue;
    auto it = fresh_.find(static_cast<uint32_t>(rows[i]));
    if (it == fresh_.end()) continue;
    fresh[i] = 1;
    ids[i] = it->second;
    fresh_.erase(it);
    ++fresh_loads_;
  }
}

void IdIndex::Evict(const EvictionRule& rule, uint32_t now, const int64_t* keep_rows, size_t nk,
                    std::vector<int64_t>* ids, std::vector<int64_t>* rows) {
  MutexLock lock(&mu_);
  ++counters_.eviction_passes;
  const bool by_count = keep_counts_ && rule.count_threshold > 0;
  const bool by_time = keep_times_ && rule.ttl_seconds > 0;
  if (keep_counts_ && rule.decay_rate != 1.0)
    for (uint64_t r = 0; r < rows_used_; ++r) counts_[r] = float(double(counts_[r]) * rule.decay_rate);
  if (!by_count && !by_time) return;
  std::vector<uint8_t> keep(rows_used_, 0);
  for (size_t k = 0; k < nk; ++k)
    if (keep_rows[k] >= 0 && uint64_t(keep_rows[k]) < rows_used_) keep[keep_rows[k]] = 1;
  for (uint64_t r = 0; r < rows_used_; ++r) {
    if (Free(ids_[r]) || keep[r]) continue;
    const bool cold = !by_count || double(counts_[r]) < rule.count_threshold;
    const bool stale = !by_time || (now > times_[r] && now - times_[r] > rule.ttl_seconds);
    if (!(cold && stale)) continue;
    bool found;
    const int64_t id = ids_[r];
    const uint64_t slot = Probe(id, &found);
    Erase(slot);
    ids->push_back(id);
    rows->push_back(int64_t(r));
  }
}

void IdIndex::Remove(const int64_t* ids, size_t n, std::vector<int64_t>* rows) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    bool found;
    const uint64_t slot = Probe(ids[i], &found);
    if (!found) continue;
    rows->push_back(table_[slot] & row_mask_);
    Erase(slot);
  }
}

void IdIndex::Entries(std::vector<int64_t>* ids, std::vector<int64_t>* rows) const {
  MutexLock lock(&mu_);
  for (uint64_t r = 0; r < rows_used_; ++r) {
    if (Free(ids_[r])) continue;
    ids->push_back(ids_[r]);
    rows->push_back(int64_t(r));
  }
}

void IdIndex::Metadata(const int64_t* rows, size_t n, float* counts, uint32_t* times) const {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    const bool live = r >= 0 && uint64_t(r) < rows_used_ && !Free(ids_[r]);
    counts[i] = live && keep_counts_ ? counts_[r] : 0.f;
    times[i] = live && keep_times_ ? times_[r] : 0;
  }
}

Status IdIndex::Assign(const int64_t* ids, const int64_t* rows, size_t n, const float* counts,
                       const uint32_t* times) {
  MutexLock lock(&mu_);
  std::vector<uint8_t> taken;
  std::unordered_set<int64_t> seen;
  seen.reserve(n);
  uint64_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || uint64_t(rows[i]) >= capacity_)
      return Status::InvalidArgument("row " + std::to_string(rows[i]) + " is outside the virtual table's " +
                                     std::to_string(capacity_) + " rows");
    if (ids[i] < 0) return Status::InvalidArgument("id " + std::to_string(ids[i]) + " is negative");
    if (!seen.insert(ids[i]).second) return Status::InvalidArgument("id " + std::to_string(ids[i]) + " is given twice");
    top = std::max<uint64_t>(top, uint64_t(rows[i]) + 1);
  }
  taken.assign(top, 0);
  for (size_t i = 0; i < n; ++i) {
    if (taken[rows[i]]) return Status::InvalidArgument("row " + std::to_string(rows[i]) + " is given twice");
    taken[rows[i]] = 1;
  }
  ids_.assign(top, kLastFree);
  ids_.shrink_to_fit();
  counts_.assign(keep_counts_ ? top : 0, 0.f);
  times_.assign(keep_times_ ? top : 0, 0);
  {
    MutexLock fresh_lock(&fresh_mu_);
    fresh_.clear();
  }
  rows_used_ = top;
  live_ = n;
  uint64_t slots = kMinSlots;
  while (double(n) > kMaxLoad * double(slots)) slots = uint64_t(double(slots) * kGrowth) + 1;
  table_.assign(slots, kEmptySlot);
  for (size_t i = 0; i < n; ++i) {
    ids_[rows[i]] = ids[i];
    if (keep_counts_ && counts) counts_[rows[i]] = counts[i];
    if (keep_times_ && times) times_[rows[i]] = times[i];
    bool found;
    table_[Probe(ids[i], &found)] = Entry(ids[i], static_cast<uint32_t>(rows[i]));
  }
  free_head_ = -1;
  for (uint64_t r = top; r-- > 0;)  // the lowest free row first
    if (!taken[r]) PushFree(static_cast<uint32_t>(r));
  return Status::Ok();
}

IdIndexStats IdIndex::Stats() const {
  MutexLock lock(&mu_);
  IdIndexStats s = counters_;
  s.live = live_;
  s.rows_used = rows_used_;
  s.table_slots = table_.size();
  s.index_bytes = table_.capacity() * sizeof(uint32_t) + ids_.capacity() * sizeof(int64_t);
  {
    MutexLock fresh_lock(&fresh_mu_);
    s.fresh_loads = fresh_loads_;
  }
  s.metadata_bytes = counts_.capacity() * sizeof(float) + times_.capacity() * sizeof(uint32_t);
  return s;
}

}  // namespace mtrains
