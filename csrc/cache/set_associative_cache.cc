#include "cache/set_associative_cache.h"

#include <algorithm>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace mtrains {
namespace {

constexpr int64_t kNeverLocked = std::numeric_limits<int64_t>::min();
constexpr size_t kPrefetchAhead = 32;  // indices between a set's prefetch and its scan
constexpr size_t kMetaAhead = 64;  // indices between a slot's state prefetch and its lock
constexpr size_t kMapAhead = 64;   // indices between a map entry's prefetch and its load
constexpr size_t kMissAhead = 4;  // misses between a set's prefetch and its victim scan
// TinyLFU: the window's share of a set's ways (at least one way), as Caffeine's 1% window.
constexpr double kWindowShare = 0.01;

struct PolicyName {
  const char* name;
  CachePolicy policy;
};
constexpr PolicyName kPolicies[] = {
    {"lru", CachePolicy::kLru}, {"lfu", CachePolicy::kLfu}, {"tinylfu", CachePolicy::kTinyLfu}};

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Empties the plan's loads and write-backs (a plan's first act).
void ClearMoves(StepPlan* plan) {
  plan->load_rows.clear();
  plan->load_slots.clear();
  plan->evict_rows.clear();
  plan->evict_slots.clear();
}

}  // namespace

CachePolicy ParseCachePolicy(const std::string& name) {
  std::string valid;
  for (const PolicyName& p : kPolicies) {
    if (name == p.name) return p.policy;
    valid += std::string(valid.empty() ? "'" : ", '") + p.name + "'";
  }
  throw std::invalid_argument("cache_algorithm='" + name + "' must be one of " + valid);
}

const char* CachePolicyName(CachePolicy policy) {
  for (const PolicyName& p : kPolicies)
    if (p.policy == policy) return p.name;
  return "unknown";
}

SetAssociativeCache::SetAssociativeCache(uint64_t num_slots, uint32_t ways, CachePolicy policy,
                                         uint64_t map_rows, bool keyed)
    : num_slots_(num_slots),
      ways_(static_cast<uint32_t>(std::min<uint64_t>(ways, num_slots))),
      num_sets_(ways == 0 || num_slots == 0
                    ? 0
                    : num_slots / std::min<uint64_t>(ways, num_slots)),
      policy_(policy),
      window_ways_(std::max<uint32_t>(
          1, static_cast<uint32_t>(kWindowShare * std::min<uint64_t>(ways, num_slots) + 0.5))),
      map_rows_(map_rows),
      keyed_(keyed) {
  if (num_slots == 0) throw std::invalid_argument("cache must have at least one slot");
  if (keyed && map_rows > 0)
    throw std::invalid_argument("a keyed cache has no dense map (its keys are not bounded by the table): map_rows=" +
                                std::to_string(map_rows) + " must be 0");
  if (ways == 0 || ways > 1024)
    throw std::invalid_argument("ways=" + std::to_string(ways) + " must be in [1, 1024]");
  if (map_rows > 0 && num_slots >= kMaxMapSlots)
    throw std::invalid_argument("a dense row-to-slot map holds 32-bit slots: num_slots=" +
                                std::to_string(num_slots) + " must be below " +
                                std::to_string(kMaxMapSlots));
  slot_of_row_.assign(map_rows, kNoSlot);
  // Slots past num_sets * ways (when num_slots is not a multiple) join the overflow pool.
  slot_row_.assign(num_slots, kEmpty);
  if (keyed) tier_row_.assign(num_slots, kEmpty);
  static_assert(sizeof(SlotMeta) == 16, "a slot's state is 16 bytes");
  meta_.assign(num_slots, SlotMeta{kNeverLocked, 0});
  if (policy_ != CachePolicy::kLru) freq_.assign(num_slots, 0);
  if (policy_ == CachePolicy::kLfu) {
    sketch_width_ = 1024;
    while (sketch_width_ < num_slots * 4) sketch_width_ <<= 1;
    sketch_.assign(4 * sketch_width_, 0);
  }
  if (policy_ == CachePolicy::kTinyLfu) tiny_sketch_ = std::make_unique<FrequencySketch>(num_slots);
}

uint64_t SetAssociativeCache::SetOf(int64_t row) const {
  // Multiply-shift range reduction: uniform over [0, num_sets) without a division.
  return static_cast<uint64_t>((__uint128_t(Mix(static_cast<uint64_t>(row))) * num_sets_) >> 64);
}

void SetAssociativeCache::PrefetchSet(uint64_t first) const {
  const int64_t* tags = slot_row_.data() + first;
  for (uint32_t w = 0; w < ways_; w += 8) __builtin_prefetch(tags + w);
}

void SetAssociativeCache::PrefetchVictimSet(uint64_t first) const {
  PrefetchSet(first);
  const char* meta = reinterpret_cast<const char*>(meta_.data() + first);
  for (size_t b = 0; b < ways_ * sizeof(SlotMeta); b += 64) __builtin_prefetch(meta + b);
  if (!freq_.empty()) {
    const char* freq = reinterpret_cast<const char*>(freq_.data() + first);
    for (size_t b = 0; b < ways_ * sizeof(uint32_t); b += 64) __builtin_prefetch(freq + b);
  }
  if (!reserved_.empty()) {  // the window's locks, which the scan reads beside the slot states
    const char* reserved = reinterpret_cast<const char*>(reserved_.data() + first);
    for (size_t b = 0; b < ways_ * sizeof(int64_t); b += 64) __builtin_prefetch(reserved + b);
  }
}

int64_t SetAssociativeCache::FindSlot(int64_t row) const {
  if (!Mapped(row)) return FindSlotFrom(row, SetOf(row) * ways_);
  const uint32_t s = slot_of_row_[static_cast<uint64_t>(row)];
  return s == kNoSlot ? kEmpty : static_cast<int64_t>(s);
}

void SetAssociativeCache::MapRow(int64_t row, int64_t slot) {
  if (Mapped(row)) slot_of_row_[static_cast<uint64_t>(row)] = slot == kEmpty ? kNoSlot : static_cast<uint32_t>(slot);
}

template <bool kCounted>
inline void SetAssociativeCache::LockHit(SlotMeta* meta, uint32_t* freq, int64_t slot, int64_t row, int64_t step,
                                         bool train, uint64_t& clock, uint64_t& hits) {
  SlotMeta& m = meta[slot];
  if (kCounted) {
    if (m.step != step) {  // first sight of this row in this step
      ++hits;
      m.step = step;
      if (train) m.set_dirty(true);
      if (policy_ == CachePolicy::kLfu) {
        if (!counted_ahead_) {
          CountAccess(row);
          if (freq[slot] < std::numeric_limits<uint32_t>::max()) ++freq[slot];
        }
      } else {
        freq[slot] = counted_ahead_ ? tiny_sketch_->Estimate(static_cast<uint64_t>(row)) : TouchTinyLfu(row);
      }
    }
  } else {  // the same without a branch (first sights and repeats interleave unpredictably)
    const bool first = m.step != step;
    hits += first;
    m.step = step;
    // One load and one store of the flags' word: the stamp, the dirty bit set at a first
    // sight when training, the window bit kept.
    m.bits = (m.bits & ~SlotMeta::kStampMask) | ((first && train) ? SlotMeta::kDirty : 0) |
             (++clock & SlotMeta::kStampMask);
    return;
  }
  m.set_stamp(++clock);
}

template <bool kCounted, bool kKeyed>
void SetAssociativeCache::FindAndLockByScan(const int64_t* indices, size_t n, int64_t step, bool train,
                                            int64_t* slot_of, int64_t* tier_row_of) {
  // Pass 1: set tags prefetched a few indices ahead; each set's first slot, hashed once,
  // waits in a ring until its scan.
  uint64_t first_of[kPrefetchAhead];
  for (size_t i = 0; i < std::min(n, kPrefetchAhead); ++i) {
    first_of[i] = SetOf(indices[i]) * ways_;
    PrefetchSet(first_of[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t first = first_of[i % kPrefetchAhead];
    if (i + kPrefetchAhead < n) {
      first_of[i % kPrefetchAhead] = SetOf(indices[i + kPrefetchAhead]) * ways_;
      PrefetchSet(first_of[i % kPrefetchAhead]);
    }
    // A key of kEmpty would match the empty slots; a row never is one (the caller checks rows).
    if (kKeyed && indices[i] == kEmpty)
      throw std::invalid_argument("key " + std::to_string(kEmpty) + " at position " + std::to_string(i) +
                                  " is reserved (a keyed cache's empty tag)");
    slot_of[i] = FindSlotFrom(indices[i], first);
  }
  // Pass 2: the hits' slot state prefetched a few indices ahead. Members in locals, which
  // the slots' stores cannot alias.
  SlotMeta* const meta = meta_.data();
  uint32_t* const freq = freq_.data();
  const int64_t* const tiers = tier_row_.data();
  uint64_t clock = clock_, hits = 0;
  for (size_t i = 0; i < n + kMetaAhead; ++i) {
    if (i < n && slot_of[i] != kEmpty) {
      __builtin_prefetch(meta + slot_of[i], 1);
      if (kCounted) __builtin_prefetch(freq + slot_of[i], 1);
      if (kKeyed) __builtin_prefetch(tiers + slot_of[i]);
    }
    if (i < kMetaAhead) continue;
    const size_t j = i - kMetaAhead;
    if (slot_of[j] != kEmpty) {
      LockHit<kCounted>(meta, freq, slot_of[j], indices[j], step, train, clock, hits);
      if (kKeyed) tier_row_of[j] = tiers[slot_of[j]];
    } else {
      miss_scratch_.push_back(j);
    }
  }
  clock_ = clock;
  counters_.unique_rows += hits;
  counters_.hits += hits;
}

template <bool kCounted>
void SetAssociativeCache::FindAndLockByMap(const int64_t* indices, size_t n, int64_t step, bool train,
                                           int64_t* slot_of) {
  // Passes 1 and 2 in one pipelined loop: at iteration i, index i's map entry is
  // prefetched, index i - kMapAhead's read (and its slot's state prefetched), index
  // i - kMapAhead - kMetaAhead's slot locked. Pass 2 changes no map entry, so this is the
  // order of two separate passes. Members in locals, which the slots' stores cannot alias.
  const uint64_t map_rows = map_rows_;
  const uint32_t* const map = slot_of_row_.data();
  SlotMeta* const meta = meta_.data();
  uint32_t* const freq = freq_.data();
  uint64_t clock = clock_, hits = 0;
  for (size_t i = 0; i < n + kMapAhead + kMetaAhead; ++i) {
    if (i < n && static_cast<uint64_t>(indices[i]) < map_rows) __builtin_prefetch(map + indices[i]);
    if (i >= kMapAhead && i - kMapAhead < n) {
      const size_t k = i - kMapAhead;
      const uint64_t row = static_cast<uint64_t>(indices[k]);
      int64_t slot;
      if (row < map_rows) {
        slot = map[row] == kNoSlot ? kEmpty : static_cast<int64_t>(map[row]);
      } else {
        slot = FindSlotFrom(indices[k], SetOf(indices[k]) * ways_);
      }
      slot_of[k] = slot;
      if (slot != kEmpty) {
        __builtin_prefetch(meta + slot, 1);
        if (kCounted) __builtin_prefetch(freq + slot, 1);
      }
    }
    if (i < kMapAhead + kMetaAhead) continue;
    const size_t j = i - kMapAhead - kMetaAhead;
    if (slot_of[j] != kEmpty)
      LockHit<kCounted>(meta, freq, slot_of[j], indices[j], step, train, clock, hits);
    else
      miss_scratch_.push_back(j);
  }
  clock_ = clock;
  counters_.unique_rows += hits;
  counters_.hits += hits;
}

int64_t SetAssociativeCache::FindSlotFrom(int64_t row, uint64_t first) const {
  const int64_t* tags = slot_row_.data() + first;
  uint32_t w = 0;
#if defined(__SSE2__)
  // Four ways per round: two 64-bit compares made of 32-bit ones (SSE2 has no 64-bit
  // compare), a way matching when both its halves do.
  const __m128i key = _mm_set1_epi64x(row);
  for (; w + 4 <= ways_; w += 4) {
    const __m128i a = _mm_cmpeq_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tags + w)), key);
    const __m128i b = _mm_cmpeq_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tags + w + 2)), key);
    const int hit = _mm_movemask_pd(_mm_castsi128_pd(_mm_and_si128(a, _mm_shuffle_epi32(a, 0xB1)))) |
                    (_mm_movemask_pd(_mm_castsi128_pd(_mm_and_si128(b, _mm_shuffle_epi32(b, 0xB1)))) << 2);
    if (hit) return static_cast<int64_t>(first + w + uint32_t(__builtin_ctz(unsigned(hit))));
  }
#endif
  for (; w < ways_; ++w)
    if (tags[w] == row) return static_cast<int64_t>(first + w);
  if (!overflow_map_.empty()) {
    auto it = overflow_map_.find(row);
    if (it != overflow_map_.end()) return it->second;
  }
  return kEmpty;
}

uint32_t SetAssociativeCache::Frequency(int64_t row) const {
  uint32_t f = std::numeric_limits<uint32_t>::max();
  const uint64_t h = Mix(static_cast<uint64_t>(row) ^ 0x5851F42D4C957F2Dull);
  for (int k = 0; k < 4; ++k) {
    const uint64_t i = (h >> (16 * k)) & (sketch_width_ - 1);
    f = std::min<uint32_t>(f, sketch_[k * sketch_width_ + i]);
  }
  return f;
}

void SetAssociativeCache::CountAccess(int64_t row) {
  const uint64_t h = Mix(static_cast<uint64_t>(row) ^ 0x5851F42D4C957F2Dull);
  for (int k = 0; k < 4; ++k) {
    uint16_t& c = sketch_[k * sketch_width_ + ((h >> (16 * k)) & (sketch_width_ - 1))];
    if (c != std::numeric_limits<uint16_t>::max()) ++c;
  }
  // Aging: halve every counter (and the cached frequencies) after 10 adds per counter, so
  // old popularity fades.
  if (++sketch_adds_ >= 10 * sketch_width_) {
    for (auto& c : sketch_) c >>= 1;
    for (auto& f : freq_) f >>= 1;
    sketch_adds_ = 0;
  }
}

int64_t SetAssociativeCache::PickVictim(uint64_t first, uint64_t count,
                                        int64_t oldest_live_step) const {
  int64_t best = kEmpty;
  for (uint64_t s = first; s < first + count; ++s) {
    const SlotMeta& m = meta_[s];
    if (Locked(s, oldest_live_step)) continue;
    if (slot_row_[s] == kEmpty) return static_cast<int64_t>(s);
    if (best == kEmpty) {
      best = static_cast<int64_t>(s);
      continue;
    }
    const SlotMeta& b = meta_[best];
    const bool better = policy_ == CachePolicy::kLru
                            ? m.stamp() < b.stamp()
                            : (freq_[s] < freq_[best] || (freq_[s] == freq_[best] && m.stamp() < b.stamp()));
    if (better) best = static_cast<int64_t>(s);
  }
  return best;
}

uint32_t SetAssociativeCache::TouchTinyLfu(int64_t row) {
  if (tiny_sketch_->Add(static_cast<uint64_t>(row)))
    for (auto& f : freq_) f >>= 1;  // the sketch halved its counters
  return tiny_sketch_->Estimate(static_cast<uint64_t>(row));
}

int64_t SetAssociativeCache::AdmitSlot(uint64_t first, int64_t oldest_live_step) {
  // One scan: a free slot, the window's unlocked rows (least recent first) and main's victim.
  int64_t empty = kEmpty, victim = kEmpty;
  uint32_t window = 0;
  std::pair<uint64_t, int64_t> unlocked_window[1024];  // (stamp, slot); ways <= 1024
  uint32_t unlocked = 0;
  for (uint64_t s = first; s < first + ways_; ++s) {
    const SlotMeta& m = meta_[s];
    window += m.window();
    if (Locked(s, oldest_live_step)) continue;
    if (slot_row_[s] == kEmpty) {
      if (empty == kEmpty) empty = static_cast<int64_t>(s);
      continue;
    }
    if (m.window()) {
      unlocked_window[unlocked++] = {m.stamp(), static_cast<int64_t>(s)};
      continue;
    }
    if (victim == kEmpty || freq_[s] < freq_[victim] ||
        (freq_[s] == freq_[victim] && m.stamp() < meta_[victim].stamp()))
      victim = static_cast<int64_t>(s);
  }
  if (empty != kEmpty) {  // filling: everything is admitted, the first rows as the window
    meta_[empty].set_window(window < window_ways_);
    return empty;
  }
  // Window rows past the share (left by steps whose new rows outnumbered it) join main,
  // the least recent first: main's order judges them from now on.
  std::sort(unlocked_window, unlocked_window + unlocked);
  uint32_t keep = unlocked;
  while (keep > window_ways_) {
    const int64_t s = unlocked_window[unlocked - keep].second;
    meta_[s].set_window(false);
    --keep;
    if (victim == kEmpty || freq_[s] < freq_[victim] ||
        (freq_[s] == freq_[victim] && meta_[s].stamp() < meta_[victim].stamp()))
      victim = s;
  }
  const int64_t candidate = keep ? unlocked_window[unlocked - keep].second : kEmpty;
  if (candidate != kEmpty && victim != kEmpty) {
    // The contest: the window's least recent row against main's victim.
    const uint32_t fc = tiny_sketch_->Estimate(static_cast<uint64_t>(slot_row_[candidate]));
    const uint32_t fv = tiny_sketch_->Estimate(static_cast<uint64_t>(slot_row_[victim]));
    if (fc > fv) {
      meta_[candidate].set_window(false);
      meta_[victim].set_window(true);
      return victim;
    }
    return candidate;
  }
  if (candidate != kEmpty) return candidate;
  if (victim != kEmpty) meta_[victim].set_window(true);  // every window row is locked: lend a main slot
  return victim;
}

int64_t SetAssociativeCache::TakeOverflowSlot(int64_t oldest_live_step) {
  const uint64_t first = num_sets_ * ways_;
  const uint64_t pool = slot_row_.size() - first;
  // A pool found all locked stays so until the oldest live step moves (or a release): the
  // misses after the first of a step then grow it without scanning it again.
  if (oldest_live_step != overflow_locked_for_) {
    for (uint64_t k = 0; k < pool; ++k) {
      const uint64_t s = first + (overflow_cursor_ + k) % pool;
      if (!Locked(s, oldest_live_step)) {
        overflow_cursor_ = (s - first + 1) % pool;
        return static_cast<int64_t>(s);
      }
    }
    overflow_locked_for_ = oldest_live_step;
  }
  // Every overflow slot is locked: grow the pool (the caller grows the storage behind it).
  if (map_rows_ > 0 && slot_row_.size() >= kMaxMapSlots)
    throw std::length_error("the cache's overflow pool would take it past " + std::to_string(kMaxMapSlots) +
                            " slots, more than its dense row-to-slot map can hold");
  slot_row_.push_back(kEmpty);
  if (keyed_) tier_row_.push_back(kEmpty);
  meta_.push_back(SlotMeta{kNeverLocked, 0});
  if (!freq_.empty()) freq_.push_back(0);
  if (!reserved_.empty()) reserved_.push_back(kNeverLocked);
  return static_cast<int64_t>(slot_row_.size() - 1);
}

template <bool kKeyed>
void SetAssociativeCache::Place(int64_t key, int64_t tier_row, int64_t slot, int64_t step, bool train,
                                StepPlan* plan) {
  const int64_t old = slot_row_[slot];
  SlotMeta& m = meta_[slot];
  const bool overflow = static_cast<uint64_t>(slot) >= num_sets_ * ways_;
  if (old != kEmpty) {
    ++counters_.evictions;
    if (m.dirty()) {
      plan->evict_rows.push_back(kKeyed ? tier_row_[slot] : old);
      plan->evict_slots.push_back(slot);
    }
    if (overflow) overflow_map_.erase(old);
    MapRow(old, kEmpty);
  }
  slot_row_[slot] = key;
  if (kKeyed) tier_row_[slot] = tier_row;
  MapRow(key, slot);
  m.set_dirty(train);
  m.step = step;
  m.set_stamp(++clock_);
  if (policy_ == CachePolicy::kLfu)
    freq_[slot] = Frequency(key);
  else if (policy_ == CachePolicy::kTinyLfu)
    freq_[slot] = tiny_sketch_->Estimate(static_cast<uint64_t>(key));
  if (overflow) {
    overflow_map_[key] = slot;
    ++counters_.overflow_assignments;
  }
  if (!reserved_.empty()) ReserveFromWindow(key, slot, step);
  plan->load_rows.push_back(tier_row);
  plan->load_slots.push_back(slot);
}

void SetAssociativeCache::Plan(const int64_t* indices, size_t n, int64_t step,
                               int64_t oldest_live_step, bool train, StepPlan* plan) {
  plan->slot_of_index.resize(n);
  PlanInto(indices, n, step, oldest_live_step, train, plan->slot_of_index.data(), plan);
}

void SetAssociativeCache::PlanInto(const int64_t* indices, size_t n, int64_t step, int64_t oldest_live_step,
                                   bool train, int64_t* slot_of, StepPlan* plan) {
  if (keyed_) throw std::invalid_argument("a keyed cache plans with LockHits and PlaceMisses (its misses need tier rows)");
  MutexLock lock(&mu_);
  ClearMoves(plan);
  LockHitsLocked(indices, n, step, train, slot_of, nullptr);
  PlaceMissesLocked<false>(indices, nullptr, step, oldest_live_step, train, slot_of, plan);
}

size_t SetAssociativeCache::LockHits(const int64_t* keys, size_t n, int64_t step, bool train, int64_t* slot_of,
                                     int64_t* tier_row_of) {
  if (keyed_ && tier_row_of == nullptr)
    throw std::invalid_argument("LockHits of a keyed cache needs tier_row_of (its hits' tier rows)");
  MutexLock lock(&mu_);
  return LockHitsLocked(keys, n, step, train, slot_of, tier_row_of);
}

size_t SetAssociativeCache::LockHitsLocked(const int64_t* keys, size_t n, int64_t step, bool train,
                                           int64_t* slot_of, int64_t* tier_row_of) {
  // Passes 1 and 2: find every key's slot, then lock every hit before any miss takes a
  // victim, so no row this step uses is evicted by it (and no row is both written back and
  // loaded in one step).
  miss_scratch_.clear();
  planned_n_ = n;
  last_planned_ = std::max(last_planned_, step);
  window_.SetPlannedThrough(last_planned_);
  const bool counted = policy_ != CachePolicy::kLru;
  if (map_rows_ > 0) {
    if (counted)
      FindAndLockByMap<true>(keys, n, step, train, slot_of);
    else
      FindAndLockByMap<false>(keys, n, step, train, slot_of);
  } else if (keyed_) {
    if (counted)
      FindAndLockByScan<true, true>(keys, n, step, train, slot_of, tier_row_of);
    else
      FindAndLockByScan<false, true>(keys, n, step, train, slot_of, tier_row_of);
  } else {
    if (counted)
      FindAndLockByScan<true, false>(keys, n, step, train, slot_of, nullptr);
    else
      FindAndLockByScan<false, false>(keys, n, step, train, slot_of, nullptr);
  }
  counters_.lookups += n;  // after the passes: a refused key counts no lookup
  return miss_scratch_.size();
}

void SetAssociativeCache::PlaceMisses(const int64_t* keys, size_t n, const int64_t* tier_row_of, int64_t step,
                                      int64_t oldest_live_step, bool train, int64_t* slot_of, StepPlan* plan) {
  if (n != planned_n_)
    throw std::invalid_argument("PlaceMisses of " + std::to_string(n) + " keys after a LockHits of " +
                                std::to_string(planned_n_));
  if (keyed_) CheckTierRows(keys, tier_row_of);
  MutexLock lock(&mu_);
  ClearMoves(plan);
  if (keyed_)
    PlaceMissesLocked<true>(keys, tier_row_of, step, oldest_live_step, train, slot_of, plan);
  else
    PlaceMissesLocked<false>(keys, nullptr, step, oldest_live_step, train, slot_of, plan);
}

void SetAssociativeCache::CheckTierRows(const int64_t* keys, const int64_t* tier_row_of) const {
  if (tier_row_of == nullptr && !miss_scratch_.empty())
    throw std::invalid_argument("PlaceMisses of a keyed cache needs tier_row_of (its misses' tier rows)");
  for (size_t i : miss_scratch_)
    if (tier_row_of[i] < 0)
      throw std::invalid_argument("key " + std::to_string(keys[i]) + " at position " + std::to_string(i) +
                                  " missed with tier row " + std::to_string(tier_row_of[i]) + " (must be >= 0)");
}

template <bool kKeyed>
void SetAssociativeCache::PlaceMissesLocked(const int64_t* keys, const int64_t* tier_row_of, int64_t step,
                                            int64_t oldest_live_step, bool train, int64_t* slot_of,
                                            StepPlan* plan) {
  const bool lfu = policy_ == CachePolicy::kLfu;
  const bool tiny = policy_ == CachePolicy::kTinyLfu;
  // Pass 3: place the misses in order (a key missing at several positions is placed once),
  // each one's set -- tags and slot metadata, which the victim scan reads whole --
  // prefetched a few misses ahead.
  const std::vector<size_t>& misses = miss_scratch_;
  uint64_t miss_first[kMissAhead];
  for (size_t j = 0; j < std::min(misses.size(), kMissAhead); ++j) {
    miss_first[j] = SetOf(keys[misses[j]]) * ways_;
    PrefetchVictimSet(miss_first[j]);
    if (!reserved_.empty()) window_.Prefetch(keys[misses[j]]);
  }
  for (size_t j = 0; j < misses.size(); ++j) {
    const size_t i = misses[j];
    const uint64_t first = miss_first[j % kMissAhead];
    if (j + kMissAhead < misses.size()) {
      miss_first[j % kMissAhead] = SetOf(keys[misses[j + kMissAhead]]) * ways_;
      PrefetchVictimSet(miss_first[j % kMissAhead]);
      if (!reserved_.empty()) window_.Prefetch(keys[misses[j + kMissAhead]]);  // ReserveFromWindow's Find
    }
    const int64_t key = keys[i];
    int64_t slot = Mapped(key) ? FindSlot(key) : FindSlotFrom(key, first);
    if (slot != kEmpty) {  // placed earlier in this pass
      meta_[slot].set_stamp(++clock_);
    } else {
      ++counters_.unique_rows;
      ++counters_.misses;
      if (lfu && !counted_ahead_) CountAccess(key);
      if (tiny && !counted_ahead_) TouchTinyLfu(key);
      slot = tiny ? AdmitSlot(first, oldest_live_step) : PickVictim(first, ways_, oldest_live_step);
      if (slot == kEmpty) slot = TakeOverflowSlot(oldest_live_step);
      Place<kKeyed>(key, kKeyed ? tier_row_of[i] : key, slot, step, train, plan);
    }
    slot_of[i] = slot;
  }
}

void SetAssociativeCache::Reserve(const int64_t* keys, size_t n, int64_t step) {
  MutexLock lock(&mu_);
  if (step <= last_reserved_ || step <= last_planned_)
    throw std::invalid_argument("Reserve of step " + std::to_string(step) + ": window steps come after step " +
                                std::to_string(std::max(last_reserved_, last_planned_)) +
                                " (the last one planned or announced)");
  if (reserved_.empty()) reserved_.assign(slot_row_.size(), kNeverLocked);
  last_reserved_ = step;
  counted_ahead_ = true;
  // Where FindSlot will look (the map entry, else the set's tags) and where the window's
  // Note will, prefetched a few keys ahead, as the plan's first pass does.
  auto prefetch = [this](int64_t key) REQUIRES(mu_) {
    if (Mapped(key))
      __builtin_prefetch(slot_of_row_.data() + key);
    else
      PrefetchSet(SetOf(key) * ways_);
    window_.Prefetch(key);
  };
  for (size_t i = 0; i < std::min(n, kPrefetchAhead); ++i) prefetch(keys[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) prefetch(keys[i + kPrefetchAhead]);
    if (keyed_ && keys[i] == kEmpty) continue;  // refused by the plan, never a cached key
    const bool first_sight = window_.Note(keys[i], step);
    const int64_t slot = FindSlot(keys[i]);
    if (slot != kEmpty) reserved_[slot] = step;  // steps ascend: the latest is the largest
    if (!first_sight) continue;
    // The policy counts the access now, a window ahead of the plan (which then counts none).
    if (policy_ == CachePolicy::kLfu) {
      CountAccess(keys[i]);
      if (slot != kEmpty && freq_[slot] < std::numeric_limits<uint32_t>::max()) ++freq_[slot];
    } else if (policy_ == CachePolicy::kTinyLfu) {
      const uint32_t estimate = TouchTinyLfu(keys[i]);
      if (slot != kEmpty) freq_[slot] = estimate;
    }
  }
}

void SetAssociativeCache::ReserveFromWindow(int64_t key, int64_t slot, int64_t step) {
  const int64_t until = window_.Find(key, step);
  reserved_[slot] = until == WindowSteps::kNone ? kNeverLocked : until;
  // Admission: a row no window step uses enters as its set's least recent, so that it, not a
  // row in use, is the next victim once its step is past.
  if (until == WindowSteps::kNone) meta_[slot].set_stamp(0);
}

void SetAssociativeCache::MarkDirty(const int64_t* slots, size_t n) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || static_cast<uint64_t>(slots[i]) >= slot_row_.size())
      throw std::out_of_range("slot " + std::to_string(slots[i]) + " is outside the cache");
    if (slot_row_[slots[i]] != kEmpty) meta_[slots[i]].set_dirty(true);
  }
}

void SetAssociativeCache::TakeDirty(int64_t live_step, std::vector<int64_t>* rows,
                                    std::vector<int64_t>* slots) {
  MutexLock lock(&mu_);
  rows->clear();
  slots->clear();
  const auto& row_of = keyed_ ? tier_row_ : slot_row_;
  for (uint64_t s = 0; s < slot_row_.size(); ++s) {
    if (slot_row_[s] != kEmpty && meta_[s].dirty()) {
      rows->push_back(row_of[s]);
      slots->push_back(static_cast<int64_t>(s));
      if (meta_[s].step < live_step) meta_[s].set_dirty(false);
    }
  }
}

uint64_t SetAssociativeCache::Forget(const int64_t* keys, size_t n) {
  MutexLock lock(&mu_);
  overflow_locked_for_ = kNeverLocked;
  uint64_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t slot = FindSlot(keys[i]);
    if (slot == kEmpty) continue;
    if (static_cast<uint64_t>(slot) >= num_sets_ * ways_) overflow_map_.erase(keys[i]);
    MapRow(keys[i], kEmpty);
    slot_row_[slot] = kEmpty;
    if (keyed_) tier_row_[slot] = kEmpty;
    if (!reserved_.empty()) reserved_[slot] = kNeverLocked;
    meta_[slot].set_dirty(false);
    ++dropped;
  }
  return dropped;
}

uint64_t SetAssociativeCache::ReleaseAfter(int64_t last_live_step) {
  MutexLock lock(&mu_);
  overflow_locked_for_ = kNeverLocked;
  const int64_t to = last_live_step < 0 ? kNeverLocked : last_live_step;
  uint64_t released = 0;
  for (SlotMeta& m : meta_) {
    if (m.step <= last_live_step) continue;
    m.step = to;
    ++released;
  }
  // The window's steps were dropped too: their keys are no longer kept.
  for (int64_t& r : reserved_)
    if (r > last_live_step) r = kNeverLocked;
  window_.Clear();
  return released;
}

void SetAssociativeCache::Occupied(std::vector<int64_t>* rows, std::vector<int64_t>* slots) const {
  MutexLock lock(&mu_);
  rows->clear();
  slots->clear();
  const auto& row_of = keyed_ ? tier_row_ : slot_row_;
  for (uint64_t s = 0; s < slot_row_.size(); ++s) {
    if (slot_row_[s] != kEmpty) {
      rows->push_back(row_of[s]);
      slots->push_back(static_cast<int64_t>(s));
    }
  }
}

}  // namespace mtrains
