// SegmentLog: the log-structured row layout under a BlockStore.
//
// Rows are appended to an in-memory head segment; full segments are written with large
// sequential I/O. A location map (LocationMap in memory, sized by the rows written) says
// which log slot holds each row's latest version. Superseded slots are dead; a greedy
// garbage collector rewrites the live rows of the emptiest segments and frees them.
// Persistence: each Commit appends the rows whose location changed to the map journal
// (map_journal.h), and once the journal outgrows twice the map pages changed since the
// last checkpoint, writes those pages in place (the checkpoint) and empties the journal
// instead. So the map bytes a Commit writes follow the rows it wrote, not the table.
// Crash safety: a freed segment is reused only after a Commit has made a map that no
// longer references it durable, and Commit makes log data durable before the journal
// records or map pages that point to it. So the persisted map always names durable,
// intact slots. Map pages are written in place, so a power cut during a checkpoint may
// tear them (some sectors old, some new). A checkpoint first marks the journal descriptor
// (durably) and clears the mark when it starts the next epoch; LoadMap accepts a page that
// fails verification only under that mark, as such a tear -- its footer whole, and every
// entry naming a verified slot holding its row (each then the row's version before or
// after the interrupted commit) -- and the next commit checkpoints it whole again.
//
// Pins: a checkpoint that hard-links the log keeps the segments its map entries point
// into. A pinned segment is never a collector's victim, and when its last live row goes
// it is retained (kRetained) rather than freed; the pinned segments' space beyond their
// live rows counts outside the space budget, so writes go on in never-used segments.
// Pins live in memory only.
//
// Not thread-safe: the owning BlockStore serialises all calls.
//
// Implementation, one job a file: segment_log.cc (the append head, the queue of full
// segments, commit), segment_log_map.cc (the map's persistence), segment_log_space.cc
// (segment liveness, pins, garbage collection).
#pragma once

#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/status.h"
#include "storage/block_format.h"
#include "storage/device.h"
#include "storage/location_map.h"
#include "storage/map_journal.h"

namespace mtrains {

struct SegmentLogCounters {
  uint64_t rows_appended = 0;   // appends from the store (user writes, evictions, flushes)
  uint64_t gc_rows_moved = 0;   // appends by the garbage collector
  uint64_t gc_segments_freed = 0;
  uint64_t commits = 0;
  uint64_t buffer_reads = 0;    // rows served from segments not yet on disk
  uint64_t map_checkpoints = 0;            // commits that wrote map pages (and a new epoch)
  uint64_t map_journal_commits = 0;        // commits that appended to the journal
  uint64_t map_journal_bytes_written = 0;  // journal blocks (bytes)
  uint64_t map_checkpoint_bytes_written = 0;  // map pages and journal descriptors (bytes)
  uint64_t torn_map_pages = 0;  // pages LoadMap found torn by an interrupted checkpoint
};

class SegmentLog {
 public:
  // `log` holds the segments (offset 0 = segment 0); `meta` is the main file, whose map
  // region starts at header.map_offset. Both must outlive the log.
  SegmentLog(const TableHeader& header, Device* log, Device* meta);
  ~SegmentLog();
  SegmentLog(const SegmentLog&) = delete;
  SegmentLog& operator=(const SegmentLog&) = delete;

  // Reads and verifies the map checkpoint (skipping the holes the meta device reports:
  // Device::DataExtents), replays the map journal over it and rebuilds segment liveness.
  Status LoadMap();

  // Slot of the row's latest version + 1, or 0 when the row was never written.
  uint64_t Location(uint64_t row) const { return map_.Get(row); }
  // For a loop over rows at random (Location or Append of each): the map's lines of a row
  // `far` ahead, then of one `near` ahead (LocationMap::PrefetchEntry, PrefetchValue).
  void PrefetchLocation(uint64_t far_row, uint64_t near_row) const {
    map_.PrefetchEntry(far_row);
    map_.PrefetchValue(near_row);
  }

  // Makes the next `appends` calls of Append infallible, collecting garbage and committing
  // as needed. `appends` must not exceed MaxReserve().
  Status Reserve(uint64_t appends);
  uint64_t MaxReserve() const;
  // Appends a row version and points the map at it. Precondition: covered by Reserve.
  void Append(uint64_t row, const uint8_t* data);

  // Writes full segments waiting in memory (sequential, batched). While it runs, no other
  // method may be called, but another thread may read the slots of segments not in memory
  // from the log device (their layout is the header's BlockGeometry: block_format.h).
  Status FlushQueue();
  // Full segments waiting in memory for FlushQueue.
  size_t QueuedSegments() const { return queue_.size(); }
  // Persists everything appended so far and the map: after it returns ok, a reopen sees
  // every row as of this call.
  Status Commit();
  // For a clean close, after a Commit: marks the journal's end with an empty commit, so
  // that damage to the last commit reads as Corruption rather than as a torn tail.
  Status SealJournal();

  // Copies the row at `slot` out of a segment still in memory; false if it is on disk only
  // (then read its blocks from the log device and GetRow them: block_format.h).
  bool CopyBufferedRow(uint64_t slot, uint64_t row, uint8_t* out);

  // Pins under `tag` exactly the segments holding live rows, replacing the tag's set.
  void PinLive(uint64_t tag);
  // Adds to `tag`'s set the segments of map values `locations[0..n)` (each in
  // [1, LogSlots]); free or pending ones are taken back and retained.
  void PinLocations(uint64_t tag, const uint64_t* locations, size_t n);
  // Drops `tag`'s pins (unknown: no-op); dead segments no longer pinned become pending.
  void Unpin(uint64_t tag);
  bool IsPinned(uint64_t tag) const { return pins_.count(tag) != 0; }
  std::vector<uint64_t> PinTags() const;
  uint64_t pinned_segments() const { return pinned_segments_; }
  uint64_t retained_segments() const;
  // Appends (the store's and the collector's) since the log was created or loaded.
  uint64_t append_seq() const { return append_seq_; }
  // After LoadMap, before any append: makes the map exactly the entries (rows ascending,
  // values in [1, LogSlots]; checked by the caller), rebuilds segment liveness (segments
  // no entry points into become free) and marks the rows whose value changed for the
  // next Commit. Rows cleared to 0 cannot be journalled: the commit then checkpoints.
  void Adopt(const int64_t* rows, const uint64_t* locations, size_t n);
  // Copies the row at `slot` out of a segment still in memory, checking that the slot
  // holds `row` (Corruption otherwise); *found is false when the segment is on disk only.
  Status ReadBufferedSlot(uint64_t slot, uint64_t row, uint8_t* out, bool* found) const;

  const SegmentLogCounters& counters() const { return counters_; }
  uint64_t free_segments() const { return free_.size(); }
  uint64_t gc_reserve_segments() const { return gc_reserve_; }
  uint64_t live_rows() const { return live_rows_; }
  // Heap bytes of the per-row structures: the location map, the rows changed since the
  // last commit, and the bitmap of map pages changed since the last checkpoint (plus the
  // per-segment tables).
  uint64_t DramBytes() const;
  const LocationMap& location_map() const { return map_; }
  uint64_t journal_bytes() const { return journal_.bytes(); }

 private:
  // kRetained: no live rows, kept for a pin (not free, not a victim).
  enum class SegState : uint8_t { kFree, kHead, kSealed, kPending, kQuarantined, kRetained };
  struct Head {
    uint64_t seg = 0;
    AlignedBuffer buf;
    uint32_t next_block = 0;     // first block not yet complete
    uint32_t index_in_block = 0; // next slot in next_block (packed rows)
    uint32_t persisted = 0;      // blocks [0, persisted) are on disk
  };
  struct Queued {
    uint64_t seg;
    AlignedBuffer buf;
    uint32_t from_block;  // blocks before this one are already on disk
  };

  uint64_t SegmentOfSlot(uint64_t slot) const {
    return h_.geometry.BlockOfSlot(slot) / h_.segment_blocks;
  }
  uint64_t HeadSlotsLeft() const;
  // Segments the collector frees at once beyond the need (and keeps in reserve).
  uint64_t GcBatch() const;
  // Segments the log may hold before it collects garbage rather than take a fresh one.
  uint64_t SegmentBudget() const;
  // Segments holding data: neither free nor freed awaiting a commit.
  uint64_t SegmentsInUse() const;
  void RotateHead();              // queue the full head, take a free segment
  void SealOpenBlock();           // seal the partially filled head block
  void DecLive(uint64_t seg);
  // Liveness, states and the free list from the map (and the pins).
  void RebuildSegments();
  // ENOSPC: no segment left to take (naming the pinned ones).
  Status LogFull() const;
  // A segment whose last live row went (not the head): retained if pinned, else pending.
  void Release(uint64_t seg);
  void AddPins(const std::vector<uint64_t>& segs);
  // Pinned segments' space beyond their live rows: what pins keep that the collector
  // cannot reclaim (outside the space budget).
  uint64_t PinnedDeadSegments() const;
  void DropPin(uint64_t seg);
  void MarkMapDirty(uint64_t row);
  // Marks a map page for the next checkpoint (not the journal).
  void MarkPageForCheckpoint(uint64_t page);
  // Whether a map page that fails verification may be one a power cut tore mid-write.
  bool TornMapPage(const uint8_t* page, uint64_t index) const;
  // After the journal's replay: checks that every entry of the torn `pages` names a log
  // slot that holds its row (Corruption otherwise), and has the next commit rewrite them.
  Status CheckTornMapPages(const std::vector<uint64_t>& pages);
  const uint8_t* BufferedSegment(uint64_t seg) const;
  Status CollectGarbage(uint64_t target_free);
  Status MoveLiveRows(uint64_t victim);
  // Journals the rows changed since the last commit, or checkpoints (see the top).
  Status PersistMap();
  // Writes the map pages changed since the last checkpoint and starts a journal epoch.
  Status Checkpoint();
  Status WriteDirtyMapPages();
  // Map pages per batched I/O: at most 8 MiB, and no more than `pages`.
  uint64_t MapChunkPages(uint64_t pages) const;
  AlignedBuffer TakeSegmentBuffer();

  const TableHeader h_;
  Device* const log_;
  Device* const meta_;
  const uint64_t entries_per_page_;
  const uint64_t seg_bytes_;
  LocationMap map_;
  MapJournal journal_;
  std::vector<uint64_t> cp_dirty_;  // bit per map page changed since the last checkpoint
  uint64_t cp_dirty_pages_ = 0;
  std::vector<uint64_t> changed_;   // rows appended since the last commit (repeats allowed)
  uint64_t max_changed_ = 0;        // past this many, the next commit checkpoints instead
  bool force_checkpoint_ = false;   // changed_ overflowed, or a checkpoint failed
  AlignedBuffer journal_buf_;
  std::vector<uint32_t> live_;
  std::vector<SegState> state_;
  std::vector<uint64_t> free_, pending_;
  std::unique_ptr<Head> head_;
  std::vector<Queued> queue_;
  std::unordered_map<uint64_t, const uint8_t*> buffered_;  // segment -> bytes in memory
  std::vector<AlignedBuffer> spare_buffers_;
  uint64_t live_rows_ = 0;
  std::map<uint64_t, std::vector<uint64_t>> pins_;  // tag -> its segments, ascending
  std::vector<uint32_t> pin_count_;  // per segment: tags pinning it
  uint64_t pinned_segments_ = 0;     // segments with pin_count_ > 0
  uint64_t pinned_live_rows_ = 0;    // live rows in those segments
  uint64_t append_seq_ = 0;
  uint64_t gc_reserve_ = 1;  // free segments user appends leave to the collector
  SegmentLogCounters counters_;
};

}  // namespace mtrains
