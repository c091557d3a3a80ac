// SetAssociativeCache: the row-cache index of TieredEmbeddingBags (one per table).
//
// Maps row ids to slots of a cache whose rows live elsewhere (the FBGEMM TBE's weights).
// `num_slots` regular slots form sets of `ways`; a row's set is a hash of its id. Each
// step's rows are locked in their slots until the step is done (slot locking), so the
// prefetch of step i+1 never evicts a row that step i is computing on. When every way of a
// row's set is locked, the row takes a slot of the overflow pool (fully associative,
// slots [num_slots, num_slots + overflow)), which grows on demand: callers must size the
// storage behind the slots to capacity() before touching slots at or above its old value.
//
// Replacement: LRU (least recently used step), LFU (fewest accesses, counted in a
// count-min sketch with periodic halving so that counts outlive eviction) or TinyLFU
// (W-TinyLFU as in Caffeine, made slot-neutral for a set-associative cache): each slot is
// tagged "window" or "main". New rows enter the set's window (LRU); a row that needs a
// slot takes the window's least recently used unlocked row's slot, unless that row is
// estimated more frequent (FrequencySketch: count-min + doorkeeper + aging) than the main
// region's victim (fewest accesses, then least recent): then the window row's slot is
// retagged main and the victim's slot becomes the window slot the new row takes. Only
// tags change, no row moves. Rows of a live step stay where they are, so a window whose
// rows are all locked lends itself the main victim's slot; unlocked window rows past the
// window's share are retagged main (the main region's order then judges them).
// Dense row-to-slot map (optional, `map_rows` > 0): one 32-bit entry per table row in [0,
// map_rows) holding the row's slot or none, kept in step with the slots' rows (placements,
// evictions, Forget, overflow slots alike). A lookup of a row in that range is then one load
// instead of a scan of its set's tags, and an LRU hit touches two cache lines (its entry and
// its slot's state). Misses still pick their victim from their set as without the map, so a
// plan is the same with or without it: the map only finds rows faster. A row outside
// [0, map_rows) (the caller's ids are validated against the table, so none should come) is
// looked up by the set scan and never written to the map. It costs 4 bytes per table row.
// Keyed mode (`keyed`, a virtual table's cache): the tags are the table's keys (64-bit ids,
// not bounded by the table) and each slot also records its key's tier row (the row in the
// backing store), given by the caller for each miss. Lookups, sets, frequencies, the
// overflow pool and Forget go by key; everything reported about the backing store (loads,
// write-backs, TakeDirty, Occupied) is in tier rows. So a virtual table finds its cached
// rows by id and consults its id index only for the ids the cache misses: it plans in two
// calls, LockHits then PlaceMisses, and resolves the misses' keys to tier rows between them.
// Keys are any int64 but -1, the empty slots' tag. A keyed cache has no dense map and costs
// 8 more bytes a slot. Its caller keeps tier rows distinct among the cached keys (it
// Forgets a key before giving its row to another).
// Look-ahead window (Reserve): the caller may announce the keys of steps it has not planned
// yet, in step order. A cached key a window step uses is locked for that step as a live
// step's is (never a victim until that step is past), and so is a missed key placed while a
// later window step uses it; among the rest the policy picks. Admission: a missed key no
// window step uses enters as its set's least recent (LRU's next victim, LFU's on a tie), so
// a row read once does not displace one in use. Which keys stay cached
// changes, never a step's slots' contents. Costs 8 bytes a slot, and one map of the
// window's keys, from the first Reserve on.
// Thread-safe: every method but num_slots(), map_rows(), keyed() and misses() takes one mutex.
// TieredEmbeddingBags plans on its prefetch thread while the training thread calls MarkDirty,
// capacity() and counters() (the binding releases the GIL), so the index must not rely on its
// callers taking turns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/frequency_sketch.h"
#include "cache/window_steps.h"

#include "common/huge_page_allocator.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mtrains {

enum class CachePolicy { kLru, kLfu, kTinyLfu };

// "lru", "lfu" or "tinylfu" -> the policy; throws std::invalid_argument naming the bad value
// and the valid ones.
CachePolicy ParseCachePolicy(const std::string& name);
// The policy's name as ParseCachePolicy takes it.
const char* CachePolicyName(CachePolicy policy);

struct CacheCounters {
  uint64_t lookups = 0;       // indices seen
  uint64_t unique_rows = 0;   // distinct rows per step, summed
  uint64_t hits = 0, misses = 0;
  uint64_t evictions = 0;     // misses that displaced a row
  uint64_t overflow_assignments = 0;
};

// What one step needs from the backing tier.
struct StepPlan {
  std::vector<int64_t> slot_of_index;  // remapped indices (slot per input index)
  std::vector<int64_t> load_rows, load_slots;    // misses: read these rows into these slots
  std::vector<int64_t> evict_rows, evict_slots;  // dirty rows displaced: write back first
};

class SetAssociativeCache {
 public:
  // `num_slots` >= 1; ways in [1, 1024] (a cache smaller than `ways` is one set).
  // `map_rows` > 0 keeps a dense row-to-slot map over rows [0, map_rows) (4 bytes a row,
  // allocated here); then `num_slots` must be below kMaxMapSlots. 0: no map.
  // `keyed`: keyed mode (above), which takes no map.
  // Throws std::invalid_argument on bad values.
  SetAssociativeCache(uint64_t num_slots, uint32_t ways, CachePolicy policy, uint64_t map_rows = 0,
                      bool keyed = false);

  // The map's entries are 32-bit slots: a cache with a map holds fewer slots than this,
  // overflow slots included (growing past it throws std::length_error from Plan).
  static constexpr uint64_t kMaxMapSlots = 0xFFFFFFFFull;
  // Bytes of the dense map per table row.
  static constexpr uint64_t kMapBytesPerRow = 4;

  // Plans step `step` over `indices` (row ids, validated by the caller): finds or assigns a
  // slot for each distinct row and locks it for `step`. Slots locked by a step >=
  // `oldest_live_step` are never evicted, nor are rows of this step that were resident, so a
  // row is never both evicted and loaded by one plan. When `train`, the step's slots become dirty
  // (their rows will be updated), so evicting them later means writing them back.
  void Plan(const int64_t* indices, size_t n, int64_t step, int64_t oldest_live_step, bool train,
            StepPlan* plan) EXCLUDES(mu_);
  // Plan, writing each index's slot to `slot_of_index` (n entries, caller-owned) instead of
  // `plan->slot_of_index` (left as it was); `plan` gets the loads and write-backs.
  // Plan and PlanInto are for a non-keyed cache (a keyed one throws std::invalid_argument:
  // its misses need tier rows); they are LockHits and PlaceMisses in one call.
  void PlanInto(const int64_t* indices, size_t n, int64_t step, int64_t oldest_live_step, bool train,
                int64_t* slot_of_index, StepPlan* plan) EXCLUDES(mu_);

  // A plan in two calls, for a caller that resolves the misses in between (a keyed cache's).
  // LockHits: Plan's first half over `keys` (ids of the table; rows unless keyed): each key's
  // slot, or -1 for a miss, in slot_of[0..n); each hit locked for `step` and stamped, dirty
  // when `train`; lookups and hits counted. A keyed cache also writes each hit's tier row to
  // tier_row_of[i] (leaving the misses' entries as they were); a non-keyed one ignores
  // `tier_row_of` (may be null: its keys are its tier rows). Returns the number of misses,
  // whose positions misses() then lists. Throws std::invalid_argument for a keyed cache
  // without `tier_row_of` or given the key -1, before locking any hit.
  size_t LockHits(const int64_t* keys, size_t n, int64_t step, bool train, int64_t* slot_of,
                  int64_t* tier_row_of) EXCLUDES(mu_);
  // The positions of the last LockHits' misses, ascending; valid until the next LockHits or
  // Plan of this cache. Not locked: it belongs to the planning thread (one planner at a time);
  // Forget, MarkDirty and the readers that other threads call never touch it.
  const std::vector<size_t>& misses() const { return miss_scratch_; }
  // PlaceMisses: the second half of the plan begun by the last LockHits (same `keys`, `n`,
  // `step`, `train`), which may run after other calls (Forget of keys no live step uses,
  // MarkDirty, readers): places every miss, taking tier_row_of[i] as the tier row of the
  // miss at position i (a keyed cache; a non-keyed one ignores `tier_row_of`). A key missing
  // at several positions is placed once, with its first position's tier row. Fills slot_of
  // at the misses; `plan` (cleared first) gets the loads (tier rows and slots) and the dirty
  // victims' write-backs (their tier rows and slots); plan->slot_of_index is left as it was.
  // Throws std::invalid_argument when `n` is not the last LockHits' or, keyed, when a miss
  // has no tier row (null `tier_row_of`, or a negative one), before placing any.
  void PlaceMisses(const int64_t* keys, size_t n, const int64_t* tier_row_of, int64_t step,
                   int64_t oldest_live_step, bool train, int64_t* slot_of, StepPlan* plan) EXCLUDES(mu_);

  // Announces step `step`'s keys (rows unless keyed), a step after every one planned so far
  // and every one announced so far: until `step` is past, none of them is evicted (above).
  // Throws std::invalid_argument for a step not after the last planned or announced one.
  void Reserve(const int64_t* keys, size_t n, int64_t step) EXCLUDES(mu_);

  // Marks `slots` dirty (a step planned in eval mode that trains after all).
  void MarkDirty(const int64_t* slots, size_t n) EXCLUDES(mu_);
  // Slots whose rows are dirty, with their (tier) rows (flush). Marks them clean, except slots
  // locked by a step >= `live_step` (planned or running: their rows will change again).
  void TakeDirty(int64_t live_step, std::vector<int64_t>* rows, std::vector<int64_t>* slots)
      EXCLUDES(mu_);
  // Drops `keys` (rows unless keyed) from the cache without writing them back (their rows
  // now belong to another id: a virtual table's eviction); returns how many were cached.
  // The caller ensures no live step uses them.
  uint64_t Forget(const int64_t* keys, size_t n) EXCLUDES(mu_);
  // Planned steps after `last_live_step` were dropped and will never run: the slots they
  // locked are relocked to `last_live_step` (a step still in its backward may share them;
  // none when it is negative), so they free up as the steps after it pass. Returns how many.
  uint64_t ReleaseAfter(int64_t last_live_step) EXCLUDES(mu_);
  // Occupied slots and their (tier) rows (reading the table through the cache).
  void Occupied(std::vector<int64_t>* rows, std::vector<int64_t>* slots) const EXCLUDES(mu_);

  uint64_t num_slots() const { return num_slots_; }
  // Rows the dense map covers ([0, map_rows())); 0 without a map.
  uint64_t map_rows() const { return map_rows_; }
  // Whether the cache is keyed (its tags are keys, its reports tier rows).
  bool keyed() const { return keyed_; }
  // Regular + overflow slots: the storage behind the slots must have this many rows.
  uint64_t capacity() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return slot_row_.size();
  }
  // A consistent copy of the counters (taken between plans).
  CacheCounters counters() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return counters_;
  }

 private:
  static constexpr int64_t kEmpty = -1;
  // A slot's state, 16 bytes: four to a cache line, none across two.
  struct SlotMeta {
    static constexpr uint64_t kStampMask = (uint64_t{1} << 62) - 1;
    static constexpr uint64_t kDirty = uint64_t{1} << 62, kWindow = uint64_t{1} << 63;

    int64_t step;   // last step that locked the slot
    uint64_t bits;  // stamp (bits 0-61), dirty (bit 62), window (bit 63)

    // Last access time (LRU; LFU tie-break): the clock, which counts lookups (one per index
    // planned) and so does not reach 2^62.
    uint64_t stamp() const { return bits & kStampMask; }
    bool dirty() const { return (bits & kDirty) != 0; }
    // TinyLFU: the slot belongs to its set's window (else to main).
    bool window() const { return (bits & kWindow) != 0; }
    void set_stamp(uint64_t stamp) { bits = (bits & ~kStampMask) | (stamp & kStampMask); }
    void set_dirty(bool dirty) { bits = (bits & ~kDirty) | (dirty ? kDirty : 0); }
    void set_window(bool window) { bits = (bits & ~kWindow) | (window ? kWindow : 0); }
  };

  uint64_t SetOf(int64_t row) const;
  // Whether slot `s` is locked: by a live step (>= oldest_live_step) or for a window step.
  bool Locked(uint64_t s, int64_t oldest_live_step) const REQUIRES(mu_) {
    return meta_[s].step >= oldest_live_step || (!reserved_.empty() && reserved_[s] >= oldest_live_step);
  }
  // A key placed in `slot` at step `step`: locked for the last window step using it, if any;
  // else made its set's least recent (the window's admission).
  void ReserveFromWindow(int64_t key, int64_t slot, int64_t step) REQUIRES(mu_);
  void PrefetchSet(uint64_t first) const REQUIRES(mu_);
  // PrefetchSet and the set's slot state and frequencies (what a victim scan reads).
  void PrefetchVictimSet(uint64_t first) const REQUIRES(mu_);
  // The slot holding `row` (its set starting at slot `first`, else the overflow pool), or
  // kEmpty: a scan of the set's tags, without the map.
  int64_t FindSlotFrom(int64_t row, uint64_t first) const REQUIRES(mu_);
  // Whether the dense map covers `row`.
  bool Mapped(int64_t row) const { return static_cast<uint64_t>(row) < map_rows_; }
  // The slot holding `row`, or kEmpty: its map entry when the map covers it, else the scan
  // of its set (FindSlotFrom).
  int64_t FindSlot(int64_t row) const REQUIRES(mu_);
  // LockHits under the lock.
  size_t LockHitsLocked(const int64_t* keys, size_t n, int64_t step, bool train, int64_t* slot_of,
                        int64_t* tier_row_of) REQUIRES(mu_);
  // Throws std::invalid_argument unless every miss of the last LockHits has a tier row >= 0.
  void CheckTierRows(const int64_t* keys, const int64_t* tier_row_of) const;
  // PlaceMisses under the lock, its arguments checked; kKeyed: keyed_ (a non-keyed miss's
  // tier row is its key).
  template <bool kKeyed>
  void PlaceMissesLocked(const int64_t* keys, const int64_t* tier_row_of, int64_t step, int64_t oldest_live_step,
                         bool train, int64_t* slot_of, StepPlan* plan) REQUIRES(mu_);
  // Plan's passes 1 and 2, with the set scan or through the map: each index's slot, or
  // kEmpty, in `slot_of`; each hit locked (LockHit), and when kKeyed its tier row written to
  // `tier_row_of`; the misses' positions, in order, in miss_scratch_.
  template <bool kCounted, bool kKeyed>
  void FindAndLockByScan(const int64_t* indices, size_t n, int64_t step, bool train, int64_t* slot_of,
                         int64_t* tier_row_of) REQUIRES(mu_);
  template <bool kCounted>
  void FindAndLockByMap(const int64_t* indices, size_t n, int64_t step, bool train, int64_t* slot_of)
      REQUIRES(mu_);
  // Pass 2 on one index of `row` found in `slot` (`meta` and `freq`: meta_'s and freq_'s
  // data, hoisted by the caller where the slots' stores cannot alias them): at the first sight of the row in `step` locks the slot for it, counts a hit in
  // `hits`, marks it dirty when `train` and, when kCounted (LFU, TinyLFU), counts the
  // access; then stamps it with ++clock.
  template <bool kCounted>
  void LockHit(SlotMeta* meta, uint32_t* freq, int64_t slot, int64_t row, int64_t step, bool train,
               uint64_t& clock, uint64_t& hits) REQUIRES(mu_);
  // Records that `slot` holds `row` (kEmpty: holds nothing) in the map, for a mapped row.
  void MapRow(int64_t row, int64_t slot) REQUIRES(mu_);
  int64_t PickVictim(uint64_t first, uint64_t count, int64_t oldest_live_step) const
      REQUIRES(mu_);
  int64_t TakeOverflowSlot(int64_t oldest_live_step) REQUIRES(mu_);
  uint32_t Frequency(int64_t row) const REQUIRES(mu_);
  void CountAccess(int64_t row) REQUIRES(mu_);
  // TinyLFU: counts an access of `row` in the sketch (aging the slots' frequencies with
  // it) and returns its estimate.
  uint32_t TouchTinyLfu(int64_t row) REQUIRES(mu_);
  // TinyLFU: the slot of set [first, first + ways) a new row takes (tagged window), or
  // kEmpty when every way is locked.
  int64_t AdmitSlot(uint64_t first, int64_t oldest_live_step) REQUIRES(mu_);
  // Puts `key` (tier row `tier_row`; kKeyed: keyed_) in `slot`, displacing its key.
  template <bool kKeyed>
  void Place(int64_t key, int64_t tier_row, int64_t slot, int64_t step, bool train, StepPlan* plan)
      REQUIRES(mu_);

  const uint64_t num_slots_;
  const uint32_t ways_;
  const uint64_t num_sets_;
  const CachePolicy policy_;
  const uint32_t window_ways_;  // TinyLFU: unlocked window rows a set keeps
  const uint64_t map_rows_;     // rows the dense map covers (0: no map)
  const bool keyed_;
  mutable Mutex mu_;
  // Key in each slot (its row unless keyed_), kEmpty if none (a set's ways adjacent).
  // The arrays a lookup reads at random sit on huge pages where the kernel gives them
  // (HugePageAllocator): a 1M-slot cache's are 24 MiB, a 8M-row table's map 32 MiB.
  std::vector<int64_t, HugePageAllocator<int64_t>> slot_row_ GUARDED_BY(mu_);
  std::vector<SlotMeta, HugePageAllocator<SlotMeta>> meta_ GUARDED_BY(mu_);
  // Keyed: each slot's tier row (kEmpty if none), as long as slot_row_; empty otherwise (a
  // non-keyed slot's key is its tier row).
  std::vector<int64_t, HugePageAllocator<int64_t>> tier_row_ GUARDED_BY(mu_);
  // Per slot, LFU: the row's access frequency (sketch estimate, then hits); TinyLFU: the
  // sketch's estimate at the row's last access. Empty for LRU (beside SlotMeta rather than
  // in it: an LRU hit touches no frequency).
  std::vector<uint32_t, HugePageAllocator<uint32_t>> freq_ GUARDED_BY(mu_);
  uint64_t overflow_cursor_ GUARDED_BY(mu_) = 0;  // CLOCK hand over the overflow slots
  // The oldest live step for which the overflow pool was found all locked (INT64_MIN: none).
  int64_t overflow_locked_for_ GUARDED_BY(mu_) = INT64_MIN;
  std::unordered_map<int64_t, int64_t> overflow_map_ GUARDED_BY(mu_);  // key -> overflow slot
  // The dense map: slot of each row in [0, map_rows_), kNoSlot if none (empty without a map).
  static constexpr uint32_t kNoSlot = 0xFFFFFFFFu;
  std::vector<uint32_t, HugePageAllocator<uint32_t>> slot_of_row_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  // Look-ahead window (empty until the first Reserve): per slot, the last window step it is
  // locked for (kNeverLocked: none); the window's keys and their last steps; the last
  // step announced and the last planned.
  std::vector<int64_t, HugePageAllocator<int64_t>> reserved_ GUARDED_BY(mu_);
  WindowSteps window_ GUARDED_BY(mu_);
  int64_t last_reserved_ GUARDED_BY(mu_) = -1, last_planned_ GUARDED_BY(mu_) = -1;
  // From the first Reserve on, LFU and TinyLFU count a step's accesses when it is announced
  // (so a row's frequency includes the window's uses), and its plan counts none.
  bool counted_ahead_ GUARDED_BY(mu_) = false;
  // Count-min sketch for LFU: 4 rows of `sketch_width_` 16-bit counters, one count per
  // distinct row per step, halved periodically (aging).
  std::vector<uint16_t> sketch_ GUARDED_BY(mu_);
  uint64_t sketch_width_ GUARDED_BY(mu_) = 0, sketch_adds_ GUARDED_BY(mu_) = 0;
  // TinyLFU's sketch (null for the other policies).
  std::unique_ptr<FrequencySketch> tiny_sketch_ GUARDED_BY(mu_);
  CacheCounters counters_ GUARDED_BY(mu_);
  // The planning thread's alone (hence not guarded: misses() reads it unlocked): the last
  // LockHits' miss positions, reused across steps, and its `n`.
  std::vector<size_t> miss_scratch_;
  size_t planned_n_ = 0;
};

}  // namespace mtrains
