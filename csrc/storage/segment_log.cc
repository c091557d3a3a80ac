// SegmentLog (segment_log.h): construction, the append head (reserve, append, rotate,
// the queue of full segments and its flush), commit, and rows served from segments still in
// memory. The map's persistence is in segment_log_map.cc, segment space in
// segment_log_space.cc.
#include "storage/segment_log.h"

#include <algorithm>
#include <stdexcept>

#include "storage/segment_log_internal.h"

namespace mtrains {

using segment_log_internal::kMaxGcBatchSegments;
using segment_log_internal::kSpareBuffers;

SegmentLog::SegmentLog(const TableHeader& header, Device* log, Device* meta)
    : h_(header), log_(log), meta_(meta), entries_per_page_(header.EntriesPerMapPage()),
      seg_bytes_(header.SegmentBytes()), map_(header.num_rows, header.LogSlots()),
      journal_(header, meta) {
  cp_dirty_.assign((h_.map_pages + 63) / 64, 0);
  // Journalling a row costs about 8 bytes of memory until the commit; past an eighth of the
  // table's rows, a checkpoint is the cheaper way to persist the map anyway.
  max_changed_ = std::max<uint64_t>(1 << 16, h_.num_rows / 8);
  live_.assign(h_.num_segments, 0);
  state_.assign(h_.num_segments, SegState::kFree);
  pin_count_.assign(h_.num_segments, 0);
  free_.reserve(h_.num_segments);
  for (uint64_t s = h_.num_segments; s-- > 0;) free_.push_back(s);
  // Segments kept free for the collector: consolidating victims that are mostly live takes
  // several spare segments at once. At most what the log has beyond the rows' own space.
  const uint64_t needed = h_.SegmentsForAllRows();
  const uint64_t spare = h_.num_segments > needed + 2 ? h_.num_segments - needed - 2 : 1;
  gc_reserve_ = std::max<uint64_t>(
      1, std::min<uint64_t>(spare, std::clamp<uint64_t>(h_.num_segments / 16, 3, kMaxGcBatchSegments)));
}

SegmentLog::~SegmentLog() = default;

uint64_t SegmentLog::DramBytes() const {
  return map_.MemoryBytes() + changed_.capacity() * sizeof(uint64_t) +
         cp_dirty_.capacity() * sizeof(uint64_t) + live_.capacity() * sizeof(uint32_t) +
         state_.capacity() * sizeof(SegState) + pin_count_.capacity() * sizeof(uint32_t) +
         (free_.capacity() + pending_.capacity()) * sizeof(uint64_t);
}

uint64_t SegmentLog::HeadSlotsLeft() const {
  if (!head_) return 0;
  return h_.geometry.SlotsIn(h_.segment_blocks - head_->next_block) - head_->index_in_block;
}

uint64_t SegmentLog::MaxReserve() const {
  return h_.slots_per_segment * std::max<uint64_t>(1, std::min<uint64_t>(h_.num_segments / 16, 64));
}

Status SegmentLog::Reserve(uint64_t appends) {
  if (appends > MaxReserve())
    return Status::InvalidArgument("cannot reserve " + std::to_string(appends) +
                                   " appends at once (limit " + std::to_string(MaxReserve()) + ")");
  const uint64_t batch = GcBatch();
  uint64_t best_free = free_.size(), stalled_rounds = 0;
  bool over_budget_allowed = false;  // the collector could not get under the space budget
  for (;;) {
    const uint64_t left = HeadSlotsLeft();
    if (appends <= left) return Status::Ok();
    const uint64_t need = (appends - left + h_.slots_per_segment - 1) / h_.slots_per_segment;
    const uint64_t budget = SegmentBudget();
    const bool in_budget = over_budget_allowed || SegmentsInUse() + need <= budget;
    if (free_.size() >= need + gc_reserve_ && in_budget) return Status::Ok();
    if (!pending_.empty()) {
      MTRAINS_RETURN_IF_ERROR(Commit());
    } else {
      // Enough free segments for the collector's reserve, and in use down to the budget.
      const uint64_t for_budget = h_.num_segments - std::min(h_.num_segments, budget) + need + batch;
      const uint64_t free_before = free_.size();
      MTRAINS_RETURN_IF_ERROR(CollectGarbage(std::max(need + gc_reserve_ + batch, for_budget)));
      if (pinned_segments_ > 0 && pending_.empty() && free_.size() <= free_before) {
        // The dead space is held by pins, which the collector must not take: write on in
        // never-used segments, down to the last.
        if (free_.size() >= need) return Status::Ok();
        return LogFull();
      }
    }
    // Moving live rows and sealing the head at each commit can cost as much space as the
    // victims free (tiny segments): give up rather than spin.
    if (free_.size() > best_free) {
      best_free = free_.size();
      stalled_rounds = 0;
    } else if (++stalled_rounds >= 8) {
      if (free_.size() >= need + gc_reserve_ && !over_budget_allowed) {
        over_budget_allowed = true;  // the budget is a target: past it, take fresh segments
        stalled_rounds = 0;
        continue;
      }
      return Status::IoError(
          ENOSPC, "the log cannot reclaim space: garbage collection frees no more than it uses "
                  "(" + std::to_string(free_.size()) + " of " + std::to_string(h_.num_segments) +
                  " segments free, " + std::to_string(pinned_segments_) +
                  " pinned by snapshots; create the table with larger segment_blocks or "
                  "overprovision, or unpin snapshots)");
    }
  }
}

void SegmentLog::RotateHead() {
  if (head_) {
    const uint64_t seg = head_->seg;
    queue_.push_back({seg, std::move(head_->buf), head_->persisted});
    buffered_[seg] = queue_.back().buf.data();
    if (live_[seg] == 0) {
      Release(seg);
    } else {
      state_[seg] = SegState::kSealed;
    }
  }
  if (free_.empty()) throw std::logic_error("SegmentLog::Append without Reserve");
  const uint64_t seg = free_.back();
  free_.pop_back();
  state_[seg] = SegState::kHead;
  head_ = std::make_unique<Head>();
  head_->seg = seg;
  head_->buf = TakeSegmentBuffer();
  buffered_[seg] = head_->buf.data();
}

AlignedBuffer SegmentLog::TakeSegmentBuffer() {
  if (spare_buffers_.empty()) return AlignedBuffer(seg_bytes_, 4096);
  AlignedBuffer b = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  return b;
}

void SegmentLog::Append(uint64_t row, const uint8_t* data) {
  if (!head_ || HeadSlotsLeft() == 0) RotateHead();
  Head& hd = *head_;
  const BlockGeometry& g = h_.geometry;
  const uint32_t B = h_.block_size;
  const uint64_t block = hd.seg * h_.segment_blocks + hd.next_block;  // in the log
  uint8_t* blk = hd.buf.data() + uint64_t(hd.next_block) * B;
  PutRow(g, blk, hd.index_in_block, row, data);
  const uint64_t slot = g.SlotAt(block, hd.index_in_block);
  if (!g.packed()) {
    for (uint32_t k = 0; k < g.blocks_per_row; ++k)
      SealLogBlock(blk + uint64_t(k) * B, B, h_.table_uuid, block + k);
    hd.next_block += g.blocks_per_row;
  } else if (++hd.index_in_block == g.rows_per_block) {
    SealLogBlock(blk, B, h_.table_uuid, block);
    ++hd.next_block;
    hd.index_in_block = 0;
  }
  const uint64_t old = map_.Get(row);
  if (old != 0) {
    DecLive(SegmentOfSlot(old - 1));
  } else {
    ++live_rows_;
  }
  map_.Set(row, slot + 1);
  ++live_[hd.seg];
  if (pin_count_[hd.seg] > 0) ++pinned_live_rows_;
  MarkMapDirty(row);
  ++counters_.rows_appended;
  ++append_seq_;
}

void SegmentLog::SealOpenBlock() {
  if (!head_ || !h_.geometry.packed() || head_->index_in_block == 0) return;
  Head& hd = *head_;
  const uint64_t block = hd.seg * h_.segment_blocks + hd.next_block;
  SealLogBlock(hd.buf.data() + uint64_t(hd.next_block) * h_.block_size, h_.block_size,
               h_.table_uuid, block);
  ++hd.next_block;
  hd.index_in_block = 0;
}

const uint8_t* SegmentLog::BufferedSegment(uint64_t seg) const {
  auto it = buffered_.find(seg);
  return it == buffered_.end() ? nullptr : it->second;
}

Status SegmentLog::FlushQueue() {
  if (queue_.empty()) return Status::Ok();
  std::vector<IoOp> ops;
  ops.reserve(queue_.size());
  for (const Queued& q : queue_) {
    if (q.from_block >= h_.segment_blocks) continue;
    const uint64_t off = q.seg * seg_bytes_ + uint64_t(q.from_block) * h_.block_size;
    ops.push_back({off, q.buf.data() + uint64_t(q.from_block) * h_.block_size,
                   static_cast<uint32_t>(seg_bytes_ - uint64_t(q.from_block) * h_.block_size)});
  }
  MTRAINS_RETURN_IF_ERROR(log_->Write(ops.data(), ops.size()));
  for (Queued& q : queue_) {
    buffered_.erase(q.seg);
    if (spare_buffers_.size() < kSpareBuffers) spare_buffers_.push_back(std::move(q.buf));
  }
  queue_.clear();
  return Status::Ok();
}

Status SegmentLog::Commit() {
  MTRAINS_RETURN_IF_ERROR(FlushQueue());
  if (head_) {
    SealOpenBlock();
    Head& hd = *head_;
    if (hd.next_block > hd.persisted) {
      const uint64_t B = h_.block_size;
      IoOp op{hd.seg * seg_bytes_ + hd.persisted * B, hd.buf.data() + hd.persisted * B,
              static_cast<uint32_t>((hd.next_block - hd.persisted) * B)};
      MTRAINS_RETURN_IF_ERROR(log_->Write(&op, 1));
      hd.persisted = hd.next_block;
    }
  }
  MTRAINS_RETURN_IF_ERROR(log_->Sync());  // data before the map that points to it
  MTRAINS_RETURN_IF_ERROR(PersistMap());
  for (uint64_t seg : pending_) {
    state_[seg] = SegState::kFree;
    free_.push_back(seg);
  }
  counters_.gc_segments_freed += pending_.size();
  pending_.clear();
  ++counters_.commits;
  return Status::Ok();
}

Status SegmentLog::ReadBufferedSlot(uint64_t slot, uint64_t row, uint8_t* out, bool* found) const {
  const uint64_t seg = SegmentOfSlot(slot);
  const uint8_t* data = BufferedSegment(seg);
  *found = data != nullptr;
  if (data == nullptr) return Status::Ok();
  const BlockGeometry& g = h_.geometry;
  const uint64_t block = g.BlockOfSlot(slot), block_in_seg = block - seg * h_.segment_blocks;
  const uint8_t* blocks = data + block_in_seg * h_.block_size;
  // The head's buffer past what was appended may hold another segment's old bytes; its
  // open block is not sealed yet, every other block in memory is.
  const bool in_head = head_ && head_->seg == seg;
  const bool open_block = in_head && g.packed() && block_in_seg == head_->next_block &&
                          g.IndexInBlock(slot) < head_->index_in_block;
  if (in_head && block_in_seg >= head_->next_block && !open_block)
    return Status::Corruption("log slot " + std::to_string(slot) + " (row " + std::to_string(row) +
                              ") was never written");
  for (uint32_t k = 0; !open_block && k < g.blocks_per_row; ++k)
    MTRAINS_RETURN_IF_ERROR(VerifyLogBlock(blocks + uint64_t(k) * h_.block_size, h_.block_size,
                                           h_.table_uuid, block + k));
  return GetRow(g, blocks, slot, row, out);
}

bool SegmentLog::CopyBufferedRow(uint64_t slot, uint64_t row, uint8_t* out) {
  const uint64_t seg = SegmentOfSlot(slot);
  const uint8_t* data = BufferedSegment(seg);
  if (data == nullptr) return false;
  const uint64_t block_in_seg = h_.geometry.BlockOfSlot(slot) - seg * h_.segment_blocks;
  // In-memory segments were built by Append, so the id check cannot fail.
  (void)GetRow(h_.geometry, data + block_in_seg * h_.block_size, slot, row, out);
  ++counters_.buffer_reads;
  return true;
}

}  // namespace mtrains
