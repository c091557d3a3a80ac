#include "storage/segment_log.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>

namespace mtrains {
namespace {

constexpr uint64_t kMinFreeSegments = 1;   // a collector's victim needs one to move into
constexpr uint64_t kMaxGcBatchSegments = 64;  // segments a collection frees beyond the need
constexpr uint64_t kMapChunkBytes = 8 << 20;  // map bytes per batched I/O (buffer size)
constexpr size_t kSpareBuffers = 4;
constexpr uint64_t kJournalPerCheckpoint = 2;  // journal bytes per checkpoint byte before one

}  // namespace

uint64_t SegmentLog::MapChunkPages(uint64_t pages) const {
  return std::max<uint64_t>(1, std::min<uint64_t>(pages, kMapChunkBytes / h_.block_size));
}

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

SegmentLog::~SegmentLog() = default;

void SegmentLog::MarkMapDirty(uint64_t row) {
  const uint64_t page = row / entries_per_page_;
  uint64_t& word = cp_dirty_[page / 64];
  const uint64_t bit = 1ull << (page % 64);
  if ((word & bit) == 0) {
    word |= bit;
    ++cp_dirty_pages_;
  }
  if (force_checkpoint_) return;
  changed_.push_back(row);
  if (changed_.size() > max_changed_) {
    force_checkpoint_ = true;
    std::vector<uint64_t>().swap(changed_);
  }
}

uint64_t SegmentLog::DramBytes() const {
  return map_.MemoryBytes() + changed_.capacity() * sizeof(uint64_t) +
         cp_dirty_.capacity() * sizeof(uint64_t) + live_.capacity() * sizeof(uint32_t) +
         state_.capacity() * sizeof(SegState) + pin_count_.capacity() * sizeof(uint32_t) +
         (free_.capacity() + pending_.capacity()) * sizeof(uint64_t);
}

Status SegmentLog::LoadMap(int meta_fd) {
  const uint64_t B = h_.block_size;
  const uint64_t total_slots = h_.LogSlots();
  const uint64_t chunk_pages = MapChunkPages(h_.map_pages);
  AlignedBuffer buf(chunk_pages * B, 4096);
  std::vector<uint64_t> torn;  // pages a power cut may have torn mid-checkpoint
  Status first_damage;         // the first one's verification error
  auto load_pages = [&](uint64_t first, uint64_t count) -> Status {
    while (count > 0) {
      const uint64_t n = std::min<uint64_t>(count, chunk_pages);
      IoOp op{h_.map_offset + first * B, buf.data(), static_cast<uint32_t>(n * B)};
      MTRAINS_RETURN_IF_ERROR(meta_->Read(&op, 1));
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t page = first + i;
        const uint8_t* pg = buf.data() + i * B;
        bool fresh = false;
        const Status verified = VerifyMapPage(pg, h_.block_size, h_.table_uuid, page, &fresh);
        if (!verified.ok() && !TornMapPage(pg, page)) return verified;
        if (!verified.ok()) {  // accepted only if a checkpoint was cut short (after the replay)
          if (torn.empty()) first_damage = verified;
          torn.push_back(page);
        }
        if (fresh) continue;
        const uint64_t row0 = page * entries_per_page_;
        const uint64_t rows = std::min<uint64_t>(entries_per_page_, h_.num_rows - row0);
        for (uint64_t r = 0; r < rows; ++r) {
          uint64_t e;
          std::memcpy(&e, pg + r * 8, 8);
          if (e == 0) continue;
          if (e > total_slots)
            return Status::Corruption("location-map page " + std::to_string(page) + ": row " +
                                      std::to_string(row0 + r) + " points past the log");
          map_.Set(row0 + r, e);
        }
      }
      first += n;
      count -= n;
    }
    return Status::Ok();
  };
  // Visit only the extents of the map region that hold data (the rest are holes).
  const uint64_t begin = h_.map_offset, end = h_.log_offset;
  uint64_t off = begin;
  while (off < end) {
    off_t data = lseek(meta_fd, static_cast<off_t>(off), SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // no data after off
    if (data < 0) {                          // SEEK_DATA unsupported: read everything
      MTRAINS_RETURN_IF_ERROR(load_pages((off - begin) / B, (end - off) / B));
      break;
    }
    if (static_cast<uint64_t>(data) >= end) break;
    off_t hole = lseek(meta_fd, data, SEEK_HOLE);
    const uint64_t lo = (static_cast<uint64_t>(data) - begin) / B * B + begin;
    uint64_t hi = hole < 0 ? end : std::min<uint64_t>(end, static_cast<uint64_t>(hole));
    hi = std::min(end, (hi - begin + B - 1) / B * B + begin);
    MTRAINS_RETURN_IF_ERROR(load_pages((lo - begin) / B, (hi - lo) / B));
    off = hi;
  }
  MTRAINS_RETURN_IF_ERROR(journal_.Replay([this](uint64_t row, uint64_t value) {
    map_.Set(row, value);
    MarkPageForCheckpoint(row / entries_per_page_);
  }));
  // Only a checkpoint that marked the descriptor and did not finish can have torn pages.
  if (!torn.empty() && !journal_.checkpoint_pending()) return first_damage;
  MTRAINS_RETURN_IF_ERROR(CheckTornMapPages(torn));
  RebuildSegments();
  return Status::Ok();
}

bool SegmentLog::TornMapPage(const uint8_t* page, uint64_t index) const {
  // A torn page's footer sector is whole, from the old page or the new one: the map page
  // footer of this page, or the zeros of a page never written before.
  const uint8_t* f = page + h_.block_size - kMapFooterBytes;
  uint32_t magic;
  uint64_t got_index;
  std::memcpy(&magic, f, 4);
  std::memcpy(&got_index, f + 8, 8);
  if (magic == kMapPageMagic) return got_index == index;
  return std::all_of(f, f + kMapFooterBytes, [](uint8_t b) { return b == 0; });
}

Status SegmentLog::CheckTornMapPages(const std::vector<uint64_t>& pages) {
  if (pages.empty()) return Status::Ok();
  // A checkpoint marks the descriptor, writes map pages in place, syncs, then starts the
  // next journal epoch (clearing the mark): a power cut before that sync can tear a page at
  // any sector (one sector as of the last checkpoint, the next as of the interrupted
  // commit). Each entry is then the row's value before that commit or after it, and the
  // journal replayed over it (still the old epoch) brings the rows it names to their value
  // before that commit: every entry names a durable version, as any interrupted commit
  // leaves. Damage of another kind would not: every entry of the page must name a verified
  // log slot that holds its row, or the map is Corruption as before. (Called only under
  // the mark.)
  const BlockGeometry& g = h_.geometry;
  const uint32_t B = h_.block_size;
  AlignedBuffer blocks(uint64_t(B) * g.blocks_per_row, 4096);
  std::vector<uint8_t> row_buf(g.row_bytes);
  for (uint64_t page : pages) {
    const uint64_t row0 = page * entries_per_page_;
    const uint64_t rows = std::min<uint64_t>(entries_per_page_, h_.num_rows - row0);
    uint64_t have = ~0ull;  // the first block in `blocks`
    for (uint64_t row = row0; row < row0 + rows; ++row) {
      const uint64_t value = map_.Get(row);
      if (value == 0) continue;
      const uint64_t first = g.BlockOfSlot(value - 1);
      Status st;
      if (first != have) {
        IoOp op{first * B, blocks.data(), B * g.blocks_per_row};
        MTRAINS_RETURN_IF_ERROR(log_->Read(&op, 1));
        have = first;
        for (uint32_t k = 0; st.ok() && k < g.blocks_per_row; ++k)
          st = VerifyLogBlock(blocks.data() + uint64_t(k) * B, B, h_.table_uuid, first + k);
        if (!st.ok()) have = ~0ull;
      }
      if (st.ok()) st = GetRow(g, blocks.data(), value - 1, row, row_buf.data());
      if (!st.ok())
        return Status::Corruption("location-map page " + std::to_string(page) +
                                  " fails verification, and is not a page torn by an interrupted "
                                  "checkpoint: row " + std::to_string(row) + " -> slot " +
                                  std::to_string(value - 1) + ": " + st.message());
    }
    MarkPageForCheckpoint(page);
  }
  // The next commit rewrites the pages whole (a checkpoint), ending the torn state.
  force_checkpoint_ = true;
  std::vector<uint64_t>().swap(changed_);
  counters_.torn_map_pages += pages.size();
  return Status::Ok();
}

void SegmentLog::MarkPageForCheckpoint(uint64_t page) {
  uint64_t& word = cp_dirty_[page / 64];
  if ((word & (1ull << (page % 64))) == 0) ++cp_dirty_pages_;
  word |= 1ull << (page % 64);
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

void SegmentLog::Adopt(const int64_t* rows, const uint64_t* locations, size_t n) {
  // Rows of the loaded map the entries leave out (collected first: ForEach must not see
  // the map change under it).
  std::vector<uint64_t> dropped;
  size_t i = 0;
  map_.ForEach([&](uint64_t row, uint64_t) {
    while (i < n && static_cast<uint64_t>(rows[i]) < row) ++i;
    if (i == n || static_cast<uint64_t>(rows[i]) != row) dropped.push_back(row);
  });
  if (!dropped.empty()) {
    // The journal cannot record a row going back to never-written: checkpoint the pages.
    force_checkpoint_ = true;
    std::vector<uint64_t>().swap(changed_);
  }
  for (uint64_t row : dropped) {
    map_.Set(row, 0);
    MarkMapDirty(row);
  }
  for (size_t k = 0; k < n; ++k) {
    const uint64_t row = static_cast<uint64_t>(rows[k]);
    if (map_.Get(row) == locations[k]) continue;
    map_.Set(row, locations[k]);
    MarkMapDirty(row);
  }
  RebuildSegments();
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

Status SegmentLog::PersistMap() {
  std::sort(changed_.begin(), changed_.end());
  changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
  bool checkpoint = force_checkpoint_;
  uint64_t blocks = 0;
  if (!checkpoint && !changed_.empty()) {
    std::vector<MapRecord> records;
    records.reserve(changed_.size());
    for (uint64_t row : changed_) records.push_back({row, map_.Get(row)});
    blocks = journal_.Encode(records, &journal_buf_);
    // Checkpoint once the journal would outgrow twice what the checkpoint writes: map
    // bytes then stay within 1.5x the journal's, itself a few bytes per changed row.
    checkpoint = !journal_.Fits(blocks) ||
                 journal_.bytes() + blocks * kJournalBlockBytes > kJournalPerCheckpoint * cp_dirty_pages_ * h_.block_size;
  }
  if (checkpoint) {
    Status st = Checkpoint();
    if (!st.ok()) {
      // Until a checkpoint succeeds the descriptor on disk may already name the next epoch:
      // journalling into the current one could be ignored, so the next commit checkpoints.
      force_checkpoint_ = true;
      std::vector<uint64_t>().swap(changed_);
      return st;
    }
    force_checkpoint_ = false;
  } else if (blocks > 0) {
    MTRAINS_RETURN_IF_ERROR(journal_.Append(journal_buf_, blocks, true));
    counters_.map_journal_bytes_written += blocks * kJournalBlockBytes;
    ++counters_.map_journal_commits;
    MTRAINS_RETURN_IF_ERROR(meta_->Sync());
  } else {
    MTRAINS_RETURN_IF_ERROR(meta_->Sync());
  }
  std::vector<uint64_t>().swap(changed_);  // gives the memory back (it can be large)
  if (journal_buf_.size() > (8u << 20)) journal_buf_ = AlignedBuffer();
  return Status::Ok();
}

Status SegmentLog::Checkpoint() {
  // The mark, durable before any page is overwritten, lets LoadMap tell pages a power cut
  // tore from damage of any other kind.
  MTRAINS_RETURN_IF_ERROR(journal_.MarkCheckpointPending());
  counters_.map_checkpoint_bytes_written += kJournalBlockBytes;
  MTRAINS_RETURN_IF_ERROR(meta_->Sync());
  MTRAINS_RETURN_IF_ERROR(WriteDirtyMapPages());
  MTRAINS_RETURN_IF_ERROR(meta_->Sync());  // the pages before the journal that covered them goes
  MTRAINS_RETURN_IF_ERROR(journal_.StartEpoch());
  counters_.map_checkpoint_bytes_written += kJournalBlockBytes;
  MTRAINS_RETURN_IF_ERROR(meta_->Sync());
  std::fill(cp_dirty_.begin(), cp_dirty_.end(), 0);
  cp_dirty_pages_ = 0;
  ++counters_.map_checkpoints;
  return Status::Ok();
}

Status SegmentLog::SealJournal() {
  if (!journal_.last_commit_has_records()) return Status::Ok();
  const uint64_t blocks = journal_.Encode({}, &journal_buf_);
  if (!journal_.Fits(blocks)) return Status::Ok();  // the next open treats the end as clean anyway
  MTRAINS_RETURN_IF_ERROR(journal_.Append(journal_buf_, blocks, false));
  counters_.map_journal_bytes_written += blocks * kJournalBlockBytes;
  return meta_->Sync();
}

Status SegmentLog::WriteDirtyMapPages() {
  const uint64_t B = h_.block_size;
  std::vector<uint64_t> dirty;
  dirty.reserve(cp_dirty_pages_);
  for (uint64_t w = 0; w < cp_dirty_.size(); ++w)
    for (uint64_t bits = cp_dirty_[w]; bits != 0; bits &= bits - 1)
      dirty.push_back(w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits)));
  const size_t chunk_pages = MapChunkPages(dirty.size());
  AlignedBuffer buf(chunk_pages * B, 4096);
  for (size_t start = 0; start < dirty.size(); start += chunk_pages) {
    const size_t n = std::min(chunk_pages, dirty.size() - start);
    std::vector<IoOp> ops;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t page = dirty[start + i];
      uint8_t* pg = buf.data() + i * B;
      std::memset(pg, 0, B);
      const uint64_t row0 = page * entries_per_page_;
      const uint64_t rows = std::min<uint64_t>(entries_per_page_, h_.num_rows - row0);
      map_.Fill(row0, rows, reinterpret_cast<uint64_t*>(pg));
      SealMapPage(pg, h_.block_size, h_.table_uuid, page);
      const uint64_t off = h_.map_offset + page * B;
      if (!ops.empty() && ops.back().offset + ops.back().len == off &&
          static_cast<uint8_t*>(ops.back().buf) + ops.back().len == pg) {
        ops.back().len += static_cast<uint32_t>(B);  // coalesce adjacent pages
      } else {
        ops.push_back({off, pg, static_cast<uint32_t>(B)});
      }
    }
    MTRAINS_RETURN_IF_ERROR(meta_->Write(ops.data(), ops.size()));
    counters_.map_checkpoint_bytes_written += n * B;
  }
  return Status::Ok();
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
