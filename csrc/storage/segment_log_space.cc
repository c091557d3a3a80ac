// SegmentLog's segment space: liveness per segment, the space budget, pins that keep
// snapshot segments, and the greedy garbage collector that frees the emptiest segments
// (segment_log.h).
#include "storage/segment_log.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "storage/segment_log_internal.h"

namespace mtrains {

using segment_log_internal::kMinFreeSegments;
using segment_log_internal::kMaxGcBatchSegments;

uint64_t SegmentLog::GcBatch() const {
  return std::clamp<uint64_t>(h_.num_segments / 16, 2, kMaxGcBatchSegments);
}

uint64_t SegmentLog::SegmentBudget() const {
  // The log is sized for every row at once, but a lazily initialised table may only ever
  // write a few of them: spend space in proportion to the rows written (the overprovision
  // the table was created with), not to the table.
  const double per_row_space = double(h_.num_segments) / double(std::max<uint64_t>(1, h_.SegmentsForAllRows()));
  const uint64_t live_segments = (live_rows_ + h_.slots_per_segment - 1) / h_.slots_per_segment;
  const uint64_t budget = static_cast<uint64_t>(std::ceil(double(live_segments) * per_row_space)) +
                          2 * gc_reserve_ + GcBatch() + PinnedDeadSegments();
  return std::min(h_.num_segments, budget);
}

uint64_t SegmentLog::PinnedDeadSegments() const {
  // The pinned segments' live rows are in the live rows' share already.
  return pinned_segments_ - std::min(pinned_segments_, pinned_live_rows_ / h_.slots_per_segment);
}

uint64_t SegmentLog::SegmentsInUse() const {
  return h_.num_segments - free_.size() - pending_.size();
}

void SegmentLog::RebuildSegments() {
  std::fill(live_.begin(), live_.end(), 0);
  live_rows_ = 0;
  map_.ForEach([this](uint64_t, uint64_t value) {
    ++live_[SegmentOfSlot(value - 1)];
    ++live_rows_;
  });
  free_.clear();
  pending_.clear();
  pinned_live_rows_ = 0;
  for (uint64_t s = h_.num_segments; s-- > 0;) {
    if (pin_count_[s] > 0) pinned_live_rows_ += live_[s];
    if (live_[s] > 0) {
      state_[s] = SegState::kSealed;
    } else if (pin_count_[s] > 0) {
      state_[s] = SegState::kRetained;
    } else {
      state_[s] = SegState::kFree;
      free_.push_back(s);
    }
  }
}

void SegmentLog::DecLive(uint64_t seg) {
  if (pin_count_[seg] > 0) --pinned_live_rows_;
  if (--live_[seg] == 0 &&
      (state_[seg] == SegState::kSealed || state_[seg] == SegState::kQuarantined)) {
    Release(seg);
  }
}

void SegmentLog::Release(uint64_t seg) {
  if (pin_count_[seg] > 0) {
    state_[seg] = SegState::kRetained;
  } else {
    state_[seg] = SegState::kPending;
    pending_.push_back(seg);
  }
}

void SegmentLog::AddPins(const std::vector<uint64_t>& segs) {
  bool taken = false;  // a free or pending segment became retained
  for (uint64_t seg : segs) {
    if (pin_count_[seg]++ > 0) continue;
    ++pinned_segments_;
    pinned_live_rows_ += live_[seg];
    if (state_[seg] == SegState::kFree || state_[seg] == SegState::kPending) {
      state_[seg] = SegState::kRetained;
      taken = true;
    }
  }
  if (!taken) return;
  // One pass over each list (a segment at a time would cost the free list's length each).
  auto retained = [this](uint64_t seg) { return state_[seg] == SegState::kRetained; };
  free_.erase(std::remove_if(free_.begin(), free_.end(), retained), free_.end());
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), retained), pending_.end());
}

void SegmentLog::DropPin(uint64_t seg) {
  if (--pin_count_[seg] > 0) return;
  --pinned_segments_;
  pinned_live_rows_ -= live_[seg];
  if (state_[seg] == SegState::kRetained) {
    state_[seg] = SegState::kPending;  // free after the next commit, like any freed segment
    pending_.push_back(seg);
  }
}

void SegmentLog::PinLive(uint64_t tag) {
  std::vector<uint64_t> segs;
  for (uint64_t s = 0; s < h_.num_segments; ++s)
    if (live_[s] > 0) segs.push_back(s);
  AddPins(segs);  // before dropping the old set: nothing is freed between
  auto it = pins_.find(tag);
  if (it != pins_.end())
    for (uint64_t s : it->second) DropPin(s);
  pins_[tag] = std::move(segs);
}

void SegmentLog::PinLocations(uint64_t tag, const uint64_t* locations, size_t n) {
  std::vector<uint64_t> segs(n);
  for (size_t i = 0; i < n; ++i) segs[i] = SegmentOfSlot(locations[i] - 1);
  std::sort(segs.begin(), segs.end());
  segs.erase(std::unique(segs.begin(), segs.end()), segs.end());
  std::vector<uint64_t>& have = pins_[tag];
  std::vector<uint64_t> added, merged;
  std::set_difference(segs.begin(), segs.end(), have.begin(), have.end(), std::back_inserter(added));
  AddPins(added);
  std::merge(have.begin(), have.end(), added.begin(), added.end(), std::back_inserter(merged));
  have = std::move(merged);
}

void SegmentLog::Unpin(uint64_t tag) {
  auto it = pins_.find(tag);
  if (it == pins_.end()) return;
  for (uint64_t s : it->second) DropPin(s);
  pins_.erase(it);
}

std::vector<uint64_t> SegmentLog::PinTags() const {
  std::vector<uint64_t> tags;
  for (const auto& [tag, segs] : pins_) tags.push_back(tag);
  return tags;
}

uint64_t SegmentLog::retained_segments() const {
  return static_cast<uint64_t>(std::count(state_.begin(), state_.end(), SegState::kRetained));
}

Status SegmentLog::LogFull() const {
  std::string why = "the log is full: all " + std::to_string(h_.num_segments) + " segments hold live rows";
  if (pinned_segments_ > 0)
    why += " or are pinned by snapshots (" + std::to_string(pinned_segments_) +
           " pinned segments; unpin snapshots to free them)";
  return Status::IoError(ENOSPC, why + " (create the table with a larger overprovision)");
}

Status SegmentLog::CollectGarbage(uint64_t target_free) {
  MTRAINS_RETURN_IF_ERROR(FlushQueue());
  Status first_error;
  while (free_.size() + pending_.size() < target_free) {
    uint64_t victim = h_.num_segments;
    for (uint64_t s = 0; s < h_.num_segments; ++s) {
      if (state_[s] == SegState::kSealed && pin_count_[s] == 0 && (victim == h_.num_segments || live_[s] < live_[victim]))
        victim = s;
    }
    if (victim == h_.num_segments || live_[victim] >= h_.slots_per_segment) break;
    // The victim's rows go to the head; a head without room for them takes a free segment
    // (a victim has fewer live rows than a segment holds, so one is enough).
    if (live_[victim] > HeadSlotsLeft() && free_.size() < kMinFreeSegments) break;
    Status st = MoveLiveRows(victim);
    if (st.code() == StatusCode::kCorruption) {  // the victim is quarantined: go on
      if (first_error.ok()) first_error = st;
    } else if (!st.ok()) {
      return st;  // e.g. the device failed to read the victim: nothing changed, report it
    }
  }
  if (pending_.empty()) {
    if (!first_error.ok()) return first_error;
    // Dead space held by pins is not reclaimable, but never-used segments still take rows.
    if (pinned_segments_ > 0 && !free_.empty()) return Status::Ok();
    return LogFull();
  }
  MTRAINS_RETURN_IF_ERROR(Commit());
  return first_error;
}

Status SegmentLog::MoveLiveRows(uint64_t victim) {
  const uint32_t B = h_.block_size;
  const uint8_t* data = BufferedSegment(victim);
  AlignedBuffer disk;
  if (data == nullptr) {
    disk = AlignedBuffer(seg_bytes_, 4096);
    IoOp op{victim * seg_bytes_, disk.data(), static_cast<uint32_t>(seg_bytes_)};
    MTRAINS_RETURN_IF_ERROR(log_->Read(&op, 1));
    data = disk.data();
  }
  const uint32_t expected = live_[victim];
  uint32_t moved = 0;
  std::vector<uint8_t> row_buf(h_.geometry.row_bytes);
  const uint64_t first_block = victim * h_.segment_blocks;
  const BlockGeometry& g = h_.geometry;
  const uint32_t bps = g.blocks_per_row;
  for (uint32_t b = 0; b + bps <= h_.segment_blocks && moved < expected; b += bps) {
    const uint8_t* blocks = data + uint64_t(b) * B;
    bool intact = true;
    for (uint32_t k = 0; k < bps && intact; ++k)
      intact = VerifyLogBlock(blocks + uint64_t(k) * B, B, h_.table_uuid, first_block + b + k).ok();
    if (!intact) continue;  // never written, stale, or damaged: live rows are counted below
    // A spanning row's id is in each of its blocks; the first one's is read here.
    for (uint32_t k = 0; k < g.IdsPerBlock(); ++k) {
      const uint64_t slot = g.SlotAt(first_block + b, k);
      const uint64_t id = RowIdAt(g, blocks, k);
      if (id >= h_.num_rows || map_.Get(id) != slot + 1) continue;  // empty or superseded
      MTRAINS_RETURN_IF_ERROR(GetRow(g, blocks, slot, id, row_buf.data()));
      --counters_.rows_appended;  // Append counts user appends; this one is the collector's
      Append(id, row_buf.data());
      ++counters_.gc_rows_moved;
      ++moved;
    }
  }
  if (moved < expected) {
    state_[victim] = SegState::kQuarantined;
    return Status::Corruption("segment " + std::to_string(victim) + ": " +
                              std::to_string(expected - moved) +
                              " live rows are in blocks that fail verification");
  }
  return Status::Ok();
}

}  // namespace mtrains
