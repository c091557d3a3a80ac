// BlockStore's data path: reads (DRAM cache, log, lazy initial rows), writes and exchanges
// through the segment log, flush, snapshot copies, close and stats. Creating and opening a
// table is in block_store_open.cc (block_store.h is the contract of both).
#include "storage/block_store.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <system_error>
#include <thread>
#include <utility>

#include "common/aligned_buffer.h"
#include "storage/block_store_internal.h"
#include "storage/lazy_init.h"

namespace mtrains {

using block_store_internal::kAlignment;

BlockStore::~BlockStore() {
  const Status st = Close();
  if (!st.ok()) std::cerr << "torchrec_mtrains BlockStore: " << st.message() << std::endl;
}

void BlockStore::Abandon() {
  FairMutexLock lock(&mu_);
  ReleaseLocked();
}

void BlockStore::ReleaseLocked() {
  seg_log_.reset();
  cache_.reset();
  log_.reset();
  meta_.reset();
  lock_.reset();
  closed_ = true;
}

Status BlockStore::CheckUsable() const {
  if (closed_) return Status::Closed(path_ + " is closed");
  if (read_only_)
    return Status::InvalidArgument(path_ + " is open as a read-only snapshot reader: only "
                                           "read_locations, stats and close work");
  return Status::Ok();
}

Status BlockStore::CheckIds(const int64_t* ids, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || static_cast<uint64_t>(ids[i]) >= h_.num_rows)
      return Status::OutOfRange(path_ + ": row id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " +
                                std::to_string(h_.num_rows) + ")");
  }
  return Status::Ok();
}

Status BlockStore::Read(const int64_t* ids, size_t n, uint8_t* out) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(CheckIds(ids, n));
  MTRAINS_RETURN_IF_ERROR(ReadLocked(ids, n, out));
  // Dirty rows evicted by this read wait in full segments; write them now if the device
  // takes them. If it does not (a full disk), they stay in memory and the next Write or
  // Flush reports the error: a read that has its rows does not fail for them.
  (void)seg_log_->FlushQueue();
  return Status::Ok();
}

Status BlockStore::StorageOrder(const int64_t* ids, size_t n, int64_t* order) {
  std::vector<uint64_t> slot(n);  // map value (slot + 1); 0: in the cache or never written
  {
    FairMutexLock lock(&mu_);
    MTRAINS_RETURN_IF_ERROR(CheckUsable());
    MTRAINS_RETURN_IF_ERROR(CheckIds(ids, n));
    for (size_t i = 0; i < n; ++i) {
      const uint64_t row = static_cast<uint64_t>(ids[i]);
      slot[i] = cache_->Contains(row) ? 0 : seg_log_->Location(row);
    }
  }
  // Ordered outside the lock (training's reads and writes need not wait) by a stable LSD
  // radix sort on the map value, 16 bits a pass: O(n) a pass, a few passes for any log.
  uint64_t max_value = 0;
  for (size_t i = 0; i < n; ++i) max_value = std::max(max_value, slot[i]);
  std::vector<int64_t> from(n), to(n);
  std::vector<uint64_t> key_to(n);
  for (size_t i = 0; i < n; ++i) from[i] = static_cast<int64_t>(i);
  std::vector<uint64_t> count(1 << 16);
  for (uint32_t shift = 0; shift == 0 || (shift < 64 && (max_value >> shift) != 0); shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < n; ++i) ++count[(slot[i] >> shift) & 0xffff];
    uint64_t sum = 0;
    for (uint64_t& c : count) sum += std::exchange(c, sum);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t at = count[(slot[i] >> shift) & 0xffff]++;
      to[at] = from[i];
      key_to[at] = slot[i];
    }
    from.swap(to);
    slot.swap(key_to);  // the keys travel with their positions
  }
  std::copy(from.begin(), from.end(), order);
  return Status::Ok();
}

Status BlockStore::Exchange(const int64_t* write_ids, size_t nw, const uint8_t* write_rows,
                            const int64_t* read_ids, size_t nr, uint8_t* out) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(CheckIds(write_ids, nw));
  MTRAINS_RETURN_IF_ERROR(CheckIds(read_ids, nr));
  MTRAINS_RETURN_IF_ERROR(WriteLocked(write_ids, nw, write_rows));
  Status flushed;
  MTRAINS_RETURN_IF_ERROR(ReadLocked(read_ids, nr, out, &flushed));
  if (flushed.ok()) flushed = seg_log_->FlushQueue();  // victims of the rows just cached
  return flushed.WithContext(
      path_ + ": the rows were accepted and are held in memory, but writing them to the "
              "device failed (flush() retries)");
}

Status BlockStore::ReadLocked(const int64_t* ids, size_t n, uint8_t* out, Status* flush_beside) {
  const uint32_t rb = h_.geometry.row_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> misses;  // (row, position)
  hit_ptrs_.resize(n);
  cache_->LookupMany(ids, n, hit_ptrs_.data());
  for (size_t i = 0; i < n; ++i) {
    if (hit_ptrs_[i] != nullptr) {
      std::memcpy(out + i * rb, hit_ptrs_[i], rb);
    } else {
      misses.emplace_back(static_cast<uint64_t>(ids[i]), i);
    }
  }
  cache_hits_ += n - misses.size();
  cache_misses_ += misses.size();
  rows_read_ += n;
  if (misses.empty()) {
    if (flush_beside != nullptr) *flush_beside = seg_log_->FlushQueue();
    return Status::Ok();
  }
  std::sort(misses.begin(), misses.end());
  std::vector<std::pair<uint64_t, uint64_t>> disk;  // (slot, row)
  std::vector<uint8_t*> disk_dest;
  std::vector<size_t> firsts;  // index in misses of each distinct row
  for (size_t k = 0; k < misses.size(); ++k) {
    PrefetchLocations(misses.size(), k, [&](size_t j) { return misses[j].first; });
    if (k > 0 && misses[k].first == misses[k - 1].first) continue;
    firsts.push_back(k);
    const uint64_t row = misses[k].first;
    uint8_t* dest = out + misses[k].second * rb;
    const uint64_t loc = seg_log_->Location(row);
    if (loc == 0) {
      LazyInitRow(h_.seed, row, h_.init_lo, h_.init_hi, h_.dim, h_.state_dim, h_.dtype, dest);
      ++lazy_rows_;
    } else if (!seg_log_->CopyBufferedRow(loc - 1, row, dest)) {
      disk.emplace_back(loc - 1, row);
      disk_dest.push_back(dest);
    }
  }
  if (flush_beside != nullptr && !disk.empty() && seg_log_->QueuedSegments() > 0) {
    // The queued segments are in memory and no read below touches them (their rows were
    // served by CopyBufferedRow), and ReadFromDisk uses only the header's block geometry,
    // not the SegmentLog: the two may run at once, on the device's read and write rings.
    // The helper gets the log itself: it runs while this thread holds mu_ (joined below).
    SegmentLog* const log = seg_log_.get();
    std::thread writer;
    try {
      writer = std::thread([log, flush_beside] { *flush_beside = log->FlushQueue(); });
    } catch (const std::system_error&) {  // no thread to spare: write after the reads
    }
    const Status st = ReadFromDisk(&disk, disk_dest);
    if (writer.joinable()) {
      writer.join();
    } else {
      *flush_beside = seg_log_->FlushQueue();
    }
    MTRAINS_RETURN_IF_ERROR(st);
  } else {
    MTRAINS_RETURN_IF_ERROR(ReadFromDisk(&disk, disk_dest));
    if (flush_beside != nullptr) *flush_beside = seg_log_->FlushQueue();
  }
  for (size_t k = 1, first = 0; k < misses.size(); ++k) {
    if (misses[k].first != misses[k - 1].first) {
      first = k;
      continue;
    }
    std::memcpy(out + misses[k].second * rb, out + misses[first].second * rb, rb);
  }
  if (cache_->capacity() == 0) return Status::Ok();
  // Cache what was read. A dirty victim is written back first; if the log cannot take it
  // (device full), the rows are simply not cached: nothing is lost.
  const uint64_t max_chunk = seg_log_->MaxReserve();
  for (size_t start = 0; start < firsts.size(); start += max_chunk) {
    const size_t end = std::min<size_t>(firsts.size(), start + max_chunk);
    const uint64_t appends = std::min<uint64_t>(end - start, cache_->dirty_count());
    if (!seg_log_->Reserve(appends).ok()) break;
    for (size_t k = start; k < end; ++k) {
      const auto& m = misses[firsts[k]];
      MTRAINS_RETURN_IF_ERROR(InsertIntoCache(m.first, out + m.second * rb, false));
    }
  }
  return Status::Ok();
}

Status BlockStore::ReadFromDisk(std::vector<std::pair<uint64_t, uint64_t>>* wanted,
                                const std::vector<uint8_t*>& dest, bool name_locations) {
  if (wanted->empty()) return Status::Ok();
  const BlockGeometry& g = h_.geometry;
  const uint32_t B = h_.block_size, bps = g.blocks_per_row;
  std::vector<size_t> order(wanted->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return (*wanted)[a].first < (*wanted)[b].first; });
  // The distinct first blocks of the wanted slots, ascending; the rows blocks[k] holds are
  // order[first[k], first[k + 1]).
  std::vector<uint64_t> blocks;
  std::vector<size_t> first;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint64_t block = g.BlockOfSlot((*wanted)[order[i]].first);
    if (blocks.empty() || blocks.back() != block) {
      blocks.push_back(block);
      first.push_back(i);
    }
  }
  first.push_back(order.size());
  // Verifies the blocks of blocks[k] (at `data`) and copies out its wanted rows.
  auto extract = [&](size_t k, const uint8_t* data) {
    auto where = [&](size_t i) {
      const auto& [slot, row] = (*wanted)[order[i]];
      return "row " + std::to_string(row) + " at location " + std::to_string(slot + 1);
    };
    for (uint32_t j = 0; j < bps; ++j) {
      Status st = VerifyLogBlock(data + uint64_t(j) * B, B, h_.table_uuid, blocks[k] + j);
      if (!st.ok()) return name_locations ? st.WithContext(where(first[k])) : st;
    }
    for (size_t i = first[k]; i < first[k + 1]; ++i) {
      const auto& [slot, row] = (*wanted)[order[i]];
      Status st = GetRow(g, data, slot, row, dest[order[i]]);
      if (!st.ok()) return name_locations ? st.WithContext(where(i)) : st;
    }
    return Status::Ok();
  };
  const LogRuns runs = PlanLogRuns(blocks);
  // Verify and extract each extent as it arrives, while the device reads the next ones.
  Status st;
  if (!runs.offsets.empty()) {
    const uint32_t run_bytes = runs.blocks * B;
    st = log_->ReadStream(runs.offsets.data(), runs.offsets.size(), run_bytes,
                          std::max<uint32_t>(4, read_window_ * bps / runs.blocks),
                          [&](size_t r, const uint8_t* data) {
                            for (size_t k = runs.members[r].first; k < runs.members[r].second; ++k)
                              MTRAINS_RETURN_IF_ERROR(extract(k, data + (blocks[k] * B - runs.offsets[r])));
                            return Status::Ok();
                          });
    run_reads_ += runs.offsets.size();
  }
  if (st.ok() && !runs.singles.empty()) {
    std::vector<uint64_t> offsets(runs.singles.size());
    for (size_t s = 0; s < offsets.size(); ++s) offsets[s] = blocks[runs.singles[s]] * B;
    st = log_->ReadStream(offsets.data(), offsets.size(), bps * B, read_window_,
                          [&](size_t s, const uint8_t* data) { return extract(runs.singles[s], data); });
  }
  if (!st.ok()) return st.WithContext(path_);
  disk_rows_ += order.size();
  return Status::Ok();
}

BlockStore::LogRuns BlockStore::PlanLogRuns(const std::vector<uint64_t>& blocks) const {
  const BlockGeometry& g = h_.geometry;
  const uint32_t bps = g.blocks_per_row;
  LogRuns runs;
  runs.blocks = bps * std::max<uint32_t>(1, kRunBlocks / bps);
  const uint64_t E = runs.blocks, device_blocks = log_->size() / h_.block_size;
  for (size_t k = 0; k < blocks.size();) {
    const uint64_t run = blocks[k] / E;
    size_t end = k;
    while (end < blocks.size() && blocks[end] / E == run) ++end;
    const uint64_t lo = run * E;
    // A quarter of a run's blocks wanted cost about as much, read one by one at random,
    // as the whole run read sequentially. A run must lie inside one segment (a stripe).
    const bool dense = E > bps && (end - k) * bps * 4 >= E && lo + E <= device_blocks &&
                       lo / h_.segment_blocks == (lo + E - 1) / h_.segment_blocks;
    if (dense) {
      runs.members.emplace_back(k, end);
      runs.offsets.push_back(lo * h_.block_size);
    } else {
      for (size_t j = k; j < end; ++j) runs.singles.push_back(j);
    }
    k = end;
  }
  return runs;
}

Status BlockStore::InsertIntoCache(uint64_t row, const uint8_t* data, bool dirty) {
  RowCache::Reservation r = cache_->Insert(row);
  if (r.evicted && r.victim_dirty) seg_log_->Append(r.victim_row, r.data);
  std::memcpy(r.data, data, h_.geometry.row_bytes);
  if (dirty) cache_->MarkDirty(row);
  return Status::Ok();
}

Status BlockStore::Write(const int64_t* ids, size_t n, const uint8_t* rows) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(CheckIds(ids, n));
  MTRAINS_RETURN_IF_ERROR(WriteLocked(ids, n, rows));
  return seg_log_->FlushQueue().WithContext(
      path_ + ": the rows were accepted and are held in memory, but writing earlier rows to "
              "the device failed (flush() retries)");
}

Status BlockStore::WriteLocked(const int64_t* ids, size_t n, const uint8_t* rows) {
  const uint32_t rb = h_.geometry.row_bytes;
  const uint64_t max_chunk = seg_log_->MaxReserve();
  for (size_t start = 0; start < n; start += max_chunk) {
    const size_t end = std::min<size_t>(n, start + max_chunk);
    // Each row appends at most once: directly, or by evicting a dirty row (possibly one
    // dirtied earlier in this chunk).
    Status st = seg_log_->Reserve(end - start);
    if (!st.ok()) return st.WithContext(path_);
    for (size_t i = start; i < end; ++i) {
      const uint64_t row = static_cast<uint64_t>(ids[i]);
      const uint8_t* src = rows + i * rb;
      if (cache_->capacity() == 0) {
        PrefetchLocations(end, i, [&](size_t j) { return static_cast<uint64_t>(ids[j]); });
        seg_log_->Append(row, src);
        continue;
      }
      uint8_t* p = cache_->Lookup(row);
      if (p != nullptr) {
        std::memcpy(p, src, rb);
        cache_->MarkDirty(row);
      } else {
        MTRAINS_RETURN_IF_ERROR(InsertIntoCache(row, src, true));
      }
    }
    rows_written_ += end - start;
  }
  return Status::Ok();
}

Status BlockStore::Flush() {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  return FlushLocked();
}

Status BlockStore::FlushLocked() {
  const uint64_t max_chunk = seg_log_->MaxReserve();
  while (cache_->dirty_count() > 0) {
    const uint64_t k = std::min<uint64_t>(cache_->dirty_count(), max_chunk);
    Status st = seg_log_->Reserve(k);
    if (!st.ok()) return st.WithContext(path_);
    SegmentLog* const log = seg_log_.get();  // the lambda runs here, under mu_
    cache_->DrainDirty(k, [log](uint64_t row, const uint8_t* data) { log->Append(row, data); });
  }
  return seg_log_->Commit().WithContext(path_);
}

Status BlockStore::Snapshot(const std::string& dst) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  if (dst.empty() || dst == path_)
    return Status::InvalidArgument("snapshot destination '" + dst + "' must differ from " + path_);
  MTRAINS_RETURN_IF_ERROR(
      env_->CheckNotLocked(dst, block_store_internal::kWhat).WithContext("cannot snapshot " + path_ + " to " + dst));
  // Copy under temporary names, then rename: a crash never leaves a half snapshot at dst.
  TableHeader snap = h_;
  std::vector<std::pair<std::string, std::string>> copies;  // (src, final dst)
  for (size_t i = 0; i < h_.stripe_paths.size(); ++i) {
    snap.stripe_paths[i] = dst + ".stripe" + std::to_string(i);
    copies.emplace_back(h_.stripe_paths[i], snap.stripe_paths[i]);
  }
  AlignedBuffer header(h_.block_size, kAlignment);
  MTRAINS_RETURN_IF_ERROR(EncodeHeader(snap, header.data()).WithContext("snapshot to " + dst));
  MTRAINS_RETURN_IF_ERROR(FlushLocked());
  copies.emplace_back(path_, dst);  // the main file last: it names the stripes
  for (const auto& [src, final_dst] : copies) {
    const std::string tmp = final_dst + ".tmp";
    Status st = env_->CopyFile(src, tmp);
    if (st.ok() && final_dst == dst && !h_.stripe_paths.empty())
      st = env_->WriteFileHead(tmp, header.data(), h_.block_size);
    if (st.ok()) st = env_->RenameFile(tmp, final_dst);
    if (!st.ok()) {
      (void)env_->RemoveFile(tmp);
      return st;
    }
  }
  return env_->SyncDir(dst);
}

Status BlockStore::Close() {
  FairMutexLock lock(&mu_);
  if (closed_) return Status::Ok();
  if (seg_log_) {
    MTRAINS_RETURN_IF_ERROR(FlushLocked());
    MTRAINS_RETURN_IF_ERROR(seg_log_->SealJournal().WithContext(path_));
  }
  ReleaseLocked();
  return Status::Ok();
}

Status BlockStore::CheckRowRange(uint64_t first, uint64_t count) const {
  if (first <= h_.num_rows && count <= h_.num_rows - first) return Status::Ok();
  const std::string stop = count > ~first ? "2^64 or more" : std::to_string(first + count);
  return Status::OutOfRange(path_ + ": row range [" + std::to_string(first) + ", " + stop +
                            ") is outside [0, " + std::to_string(h_.num_rows) + ")");
}

void BlockStore::MapEntries(uint64_t first, uint64_t count, std::vector<int64_t>* rows,
                            std::vector<uint64_t>* locations) const {
  // The map's values a window at a time: the scratch stays small however wide the range.
  constexpr uint64_t kWindowRows = 16 * LocationMap::kChunkRows;
  const LocationMap& map = seg_log_->location_map();
  std::vector<uint64_t> loc(std::min(count, kWindowRows));
  for (uint64_t lo = first, end = first + count; lo < end; lo += kWindowRows) {
    const uint64_t n = std::min(kWindowRows, end - lo);
    map.Fill(lo, n, loc.data());
    for (uint64_t i = 0; i < n; ++i) {
      if (loc[i] == 0) continue;
      rows->push_back(static_cast<int64_t>(lo + i));
      if (locations != nullptr) locations->push_back(loc[i]);
    }
  }
}

Status BlockStore::WrittenRows(uint64_t first, uint64_t count, std::vector<int64_t>* out) {
  out->clear();
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(CheckRowRange(first, count));
  MapEntries(first, count, out, nullptr);
  // Dirty cached rows: first writes not yet appended, or rewrites of rows already listed.
  const size_t in_map = out->size();
  cache_->DirtyRowsIn(first, count, out);
  std::sort(out->begin() + in_map, out->end());
  std::inplace_merge(out->begin(), out->begin() + in_map, out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return Status::Ok();
}

std::vector<std::pair<std::string, double>> BlockStore::Stats() {
  FairMutexLock lock(&mu_);
  std::vector<std::pair<std::string, double>> s;
  auto add = [&](const char* k, double v) { s.emplace_back(k, v); };
  add("rows_read", rows_read_);
  add("rows_written", rows_written_);
  add("cache_hits", cache_hits_);
  add("cache_misses", cache_misses_);
  add("lazy_init_rows", lazy_rows_);
  add("disk_rows_read", disk_rows_);
  add("disk_run_reads", run_reads_);
  if (closed_) return s;
  const DeviceCounters lc = log_->counters(), mc = meta_->counters();
  if (read_only_) {  // no log state: the devices' counters
    add("device_reads", lc.reads + mc.reads);
    add("device_bytes_read", lc.bytes_read + mc.bytes_read);
    add("device_bytes_written", lc.bytes_written + mc.bytes_written);
    add("log_segments", h_.num_segments);
    return s;
  }
  const SegmentLogCounters& sl = seg_log_->counters();
  add("buffer_rows_read", sl.buffer_reads);
  add("cache_capacity_rows", cache_->capacity());
  add("cache_rows", cache_->size());
  add("cache_dirty_rows", cache_->dirty_count());
  add("device_reads", lc.reads + mc.reads);
  add("device_writes", lc.writes + mc.writes);
  add("device_syncs", lc.syncs + mc.syncs);
  add("device_bytes_read", lc.bytes_read + mc.bytes_read);
  add("device_bytes_written", lc.bytes_written + mc.bytes_written);
  add("log_bytes_written", lc.bytes_written);
  add("map_bytes_written", mc.bytes_written);  // journal, checkpoint pages, descriptors
  add("map_journal_bytes_written", sl.map_journal_bytes_written);
  add("map_checkpoint_bytes_written", sl.map_checkpoint_bytes_written);
  add("map_checkpoints", sl.map_checkpoints);
  add("map_journal_commits", sl.map_journal_commits);
  add("torn_map_pages", sl.torn_map_pages);  // accepted at open: a checkpoint a crash cut short
  add("map_journal_bytes", seg_log_->journal_bytes());
  const LocationMap& lm = seg_log_->location_map();
  add("map_dram_bytes", lm.MemoryBytes());
  add("map_dense_chunks", lm.dense_chunks());
  add("map_sparse_chunks", lm.sparse_chunks());
  add("map_value_bits", lm.value_bits());
  // Memory per logical row of everything kept per row (the location map, the rows changed
  // since the last commit, the checkpoint bitmap, the per-segment tables); not the cache.
  add("dram_bytes_per_row", double(seg_log_->DramBytes()) / double(h_.num_rows));
  const Device& raw = *log_;
  add("read_latency_p50_us", raw.read_latency().Percentile(0.50) / 1000.0);
  add("read_latency_p99_us", raw.read_latency().Percentile(0.99) / 1000.0);
  add("read_latency_p999_us", raw.read_latency().Percentile(0.999) / 1000.0);
  add("write_latency_p50_us", raw.write_latency().Percentile(0.50) / 1000.0);
  add("write_latency_p99_us", raw.write_latency().Percentile(0.99) / 1000.0);
  add("rows_appended", sl.rows_appended);
  add("gc_rows_moved", sl.gc_rows_moved);
  add("gc_segments_freed", sl.gc_segments_freed);
  add("commits", sl.commits);
  add("live_rows", seg_log_->live_rows());
  add("free_segments", seg_log_->free_segments());
  add("gc_reserve_segments", seg_log_->gc_reserve_segments());
  add("log_segments", h_.num_segments);
  add("pinned_segments", seg_log_->pinned_segments());
  add("retained_segments", seg_log_->retained_segments());
  add("pin_tags", seg_log_->PinTags().size());
  // Device bytes written per byte of rows the caller wrote (what wears the flash out), and
  // per byte of rows appended to the log (after the cache merged repeated writes).
  const double device_bytes = double(lc.bytes_written + mc.bytes_written);
  const double user_bytes = double(rows_written_) * h_.geometry.row_bytes;
  const double appended_bytes = double(sl.rows_appended) * h_.geometry.row_bytes;
  add("write_amplification", user_bytes > 0 ? device_bytes / user_bytes : 0.0);
  add("log_write_amplification", appended_bytes > 0 ? device_bytes / appended_bytes : 0.0);
  return s;
}

}  // namespace mtrains
