// MapJournal: the redo log of location-map changes between map checkpoints.
//
// The journal region of the main file (block_format.h) is a descriptor block followed by
// journal blocks of kJournalBlockBytes. The descriptor names the current epoch (0 while it
// was never written). Each Commit that does not checkpoint appends one commit: the
// (row, slot + 1) records of the rows whose location changed since the previous commit,
// sorted by row, in one or more consecutive blocks. A block carries the table uuid, the
// epoch, its position, the position of its commit's first block, a random commit nonce and
// a last-block flag, all under a crc32c. Records are delta/varint coded per block.
//
// Replay (at open) applies, in order, every commit whose blocks are all intact and
// present, and stops at the first block that is a hole, of another epoch, stale, or
// damaged. A damaged block followed by a commit that started after it (the journal went
// on after the damage) is Corruption; otherwise it is the torn tail of a Commit a crash
// interrupted, which never returned, and is dropped. A clean close of a store that
// journalled appends an empty commit, so damage to its last real commit is detected too.
//
// A checkpoint (the map pages written in place) is followed by StartEpoch, which makes
// the journal empty by naming the next epoch in the descriptor: blocks of older epochs
// are ignored from then on. Replaying the old epoch's records onto the new checkpoint (a
// crash between the two) leaves each row at its version of either side of that Commit,
// all of them durable, as any interrupted Commit may.
//
// Not thread-safe (the owning SegmentLog is serialised by its BlockStore).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/status.h"
#include "storage/block_format.h"
#include "storage/device.h"

namespace mtrains {

struct MapRecord {
  uint64_t row;
  uint64_t value;  // slot + 1
};

class MapJournal {
 public:
  // `meta` is the main file; the journal region is header.journal_offset onwards.
  MapJournal(const TableHeader& header, Device* meta);

  // Reads the descriptor and applies every complete commit of the current epoch through
  // `apply` (records checked: row < num_rows, 1 <= value <= log slots), leaving the journal
  // positioned after the last one. Corruption names the offset of the bad block.
  Status Replay(const std::function<void(uint64_t row, uint64_t value)>& apply);

  // Encodes one commit of `records` (sorted by row, distinct rows) at the current end into
  // `out` (whole blocks, sealed); returns the number of blocks. Nothing is written.
  uint64_t Encode(const std::vector<MapRecord>& records, AlignedBuffer* out);
  // Whether `blocks` more blocks fit in the region.
  bool Fits(uint64_t blocks) const { return end_ + blocks <= capacity_; }
  // Writes `blocks` blocks made by the last Encode and, on success, makes them part of the
  // journal (the caller syncs the device before relying on them).
  Status Append(const AlignedBuffer& encoded, uint64_t blocks, bool has_records);
  // Marks the descriptor (same epoch) as "a checkpoint is rewriting the map pages": a
  // power cut before StartEpoch may leave torn pages, which LoadMap then accepts only as
  // such (segment_log.h). The caller syncs before writing any page.
  Status MarkCheckpointPending();
  // Empties the journal: writes the descriptor of the next epoch (the caller syncs).
  Status StartEpoch();
  // Whether the descriptor Replay read was marked by MarkCheckpointPending.
  bool checkpoint_pending() const { return checkpoint_pending_; }

  // Bytes of journal blocks in the current epoch.
  uint64_t bytes() const { return end_ * kJournalBlockBytes; }
  // Whether the last commit appended by this object holds records (a clean close then
  // appends an empty commit behind it; a store that only read appends nothing).
  bool last_commit_has_records() const { return last_has_records_; }
  uint64_t epoch() const { return epoch_; }

 private:
  uint64_t BlockOffset(uint64_t pos) const {
    return h_.journal_offset + kJournalBlockBytes * (1 + pos);
  }
  Status ReadBlocks(uint64_t pos, uint64_t n, AlignedBuffer* buf);
  // After the journal ended at the damaged block `pos`: Corruption when a commit that
  // started after `complete_end` follows it.
  Status CheckTail(uint64_t pos, uint64_t complete_end);

  const TableHeader h_;
  Device* const meta_;
  const uint64_t capacity_;  // journal blocks the region holds
  uint64_t epoch_ = 0;
  uint64_t end_ = 0;         // blocks of complete commits in this epoch
  bool last_has_records_ = false;
  bool checkpoint_pending_ = false;
  std::mt19937_64 rng_;
};

}  // namespace mtrains
