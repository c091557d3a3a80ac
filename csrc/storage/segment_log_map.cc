// SegmentLog's location map on disk: loading the checkpoint and replaying the journal
// (accepting only pages a power cut tore mid-checkpoint), journalling the rows a commit
// changed, checkpointing the changed pages, adopting a snapshot's map (segment_log.h).
#include "storage/segment_log.h"

#include <algorithm>
#include <cstring>

#include "storage/segment_log_internal.h"

namespace mtrains {

using segment_log_internal::kMapChunkBytes;
using segment_log_internal::kJournalPerCheckpoint;

uint64_t SegmentLog::MapChunkPages(uint64_t pages) const {
  return std::max<uint64_t>(1, std::min<uint64_t>(pages, kMapChunkBytes / h_.block_size));
}

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

Status SegmentLog::LoadMap() {
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
  // Visit only the extents of the map region that hold data (the rest are holes), each
  // widened to whole pages.
  const uint64_t begin = h_.map_offset, end = h_.log_offset;
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  MTRAINS_RETURN_IF_ERROR(meta_->DataExtents(begin, end, &extents));
  uint64_t loaded = begin;  // pages below it are loaded
  for (const auto& [data, hole] : extents) {
    const uint64_t lo = std::max(loaded, (data - begin) / B * B + begin);
    const uint64_t hi = std::min(end, (hole - begin + B - 1) / B * B + begin);
    if (lo >= hi) continue;
    MTRAINS_RETURN_IF_ERROR(load_pages((lo - begin) / B, (hi - lo) / B));
    loaded = hi;
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

}  // namespace mtrains
