// BlockStore's snapshots: pins that keep a point in time's log segments from reuse, the
// map entries that name its rows, reading rows at given locations (also from a read-only
// reader of a linked file), and adopting a snapshot as the table's contents. Checkpoints
// build on these (block_store.h; docs/storage.md, "Pinned snapshots").
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "storage/block_store.h"

namespace mtrains {

Status BlockStore::OpenAdopted(const std::string& path, const StoreRuntimeOptions& runtime,
                               const int64_t* rows, const uint64_t* locations, size_t n,
                               uint64_t pin_tag, std::unique_ptr<BlockStore>* out) {
  std::unique_ptr<BlockStore> store;
  MTRAINS_RETURN_IF_ERROR(Open(path, runtime, &store));
  const TableHeader& h = store->header();
  Status st;
  for (size_t i = 0; st.ok() && i < n; ++i) {
    if (rows[i] < 0 || static_cast<uint64_t>(rows[i]) >= h.num_rows)
      st = Status::InvalidArgument(path + ": adopted row " + std::to_string(rows[i]) + " at position " +
                                   std::to_string(i) + " is outside [0, " + std::to_string(h.num_rows) + ")");
    else if (i > 0 && rows[i] <= rows[i - 1])
      st = Status::InvalidArgument(path + ": adopted rows must be strictly ascending: row " +
                                   std::to_string(rows[i]) + " at position " + std::to_string(i) +
                                   " follows " + std::to_string(rows[i - 1]));
    else if (locations[i] == 0 || locations[i] > h.LogSlots())
      st = Status::InvalidArgument(path + ": location " + std::to_string(locations[i]) + " of row " +
                                   std::to_string(rows[i]) + " is outside [1, " +
                                   std::to_string(h.LogSlots()) + "]");
  }
  if (st.ok()) {
    FairMutexLock lock(&store->mu_);
    store->seg_log_->Adopt(rows, locations, n);
    store->seg_log_->PinLocations(pin_tag, locations, n);
    st = store->seg_log_->Commit().WithContext(path);
  }
  if (!st.ok()) {
    store->Abandon();  // bad entries: nothing was written; a failed commit: nothing more
    return st;
  }
  *out = std::move(store);
  return Status::Ok();
}

Status BlockStore::PinSnapshot(uint64_t tag) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(FlushLocked());
  seg_log_->PinLive(tag);
  snapshot_appends_[tag] = seg_log_->append_seq();
  return Status::Ok();
}

Status BlockStore::SnapshotEntries(uint64_t tag, uint64_t first, uint64_t count,
                                   std::vector<int64_t>* rows, std::vector<uint64_t>* locations) {
  rows->clear();
  locations->clear();
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  MTRAINS_RETURN_IF_ERROR(CheckRowRange(first, count));
  auto it = snapshot_appends_.find(tag);
  if (it == snapshot_appends_.end() || !seg_log_->IsPinned(tag))
    return Status::InvalidArgument(path_ + ": snapshot tag " + std::to_string(tag) +
                                   " is not pinned (pin_snapshot it first)");
  if (it->second != seg_log_->append_seq())
    return Status::InvalidArgument(
        path_ + ": the entries of snapshot tag " + std::to_string(tag) + " are gone: " +
        std::to_string(seg_log_->append_seq() - it->second) +
        " rows were appended to the log since it was pinned (pin_snapshot again)");
  MapEntries(first, count, rows, locations);
  return Status::Ok();
}

Status BlockStore::PinLocations(uint64_t tag, const uint64_t* locations, size_t n) {
  FairMutexLock lock(&mu_);
  MTRAINS_RETURN_IF_ERROR(CheckUsable());
  if (seg_log_->append_seq() != 0)
    return Status::InvalidArgument(
        path_ + ": cannot pin locations for tag " + std::to_string(tag) + ": " +
        std::to_string(seg_log_->append_seq()) +
        " rows were appended since the store was opened, so a segment freed before may "
        "already be reused (pin right after open)");
  const uint64_t slots = h_.LogSlots();
  for (size_t i = 0; i < n; ++i) {
    if (locations[i] == 0 || locations[i] > slots)
      return Status::InvalidArgument(path_ + ": location " + std::to_string(locations[i]) +
                                     " at position " + std::to_string(i) + " is outside [1, " +
                                     std::to_string(slots) + "]");
  }
  seg_log_->PinLocations(tag, locations, n);
  return Status::Ok();
}

void BlockStore::UnpinSnapshot(uint64_t tag) {
  FairMutexLock lock(&mu_);
  if (!CheckUsable().ok()) return;
  seg_log_->Unpin(tag);
  snapshot_appends_.erase(tag);
}

std::vector<uint64_t> BlockStore::PinTags() {
  FairMutexLock lock(&mu_);
  if (!CheckUsable().ok()) return {};
  return seg_log_->PinTags();
}

Status BlockStore::ReadLocations(const int64_t* rows, const uint64_t* locations, size_t n,
                                 uint8_t* out) {
  FairMutexLock lock(&mu_);
  if (closed_) return Status::Closed(path_ + " is closed");
  MTRAINS_RETURN_IF_ERROR(CheckIds(rows, n));
  const uint64_t slots = h_.LogSlots();
  for (size_t i = 0; i < n; ++i) {
    if (locations[i] == 0 || locations[i] > slots)
      return Status::InvalidArgument(path_ + ": location " + std::to_string(locations[i]) + " of row " +
                                     std::to_string(rows[i]) + " at position " + std::to_string(i) +
                                     " is outside [1, " + std::to_string(slots) + "]");
  }
  const uint32_t rb = h_.geometry.row_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> disk;  // (slot, row)
  std::vector<uint8_t*> dest;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t row = static_cast<uint64_t>(rows[i]);
    bool in_memory = false;
    if (seg_log_) {  // a live store may still hold the segment in memory
      Status st = seg_log_->ReadBufferedSlot(locations[i] - 1, row, out + i * rb, &in_memory);
      if (!st.ok())
        return st.WithContext(path_ + ": row " + std::to_string(row) + " at location " +
                              std::to_string(locations[i]));
    }
    if (!in_memory) {
      disk.emplace_back(locations[i] - 1, row);
      dest.push_back(out + i * rb);
    }
  }
  return ReadFromDisk(&disk, dest, true);
}

}  // namespace mtrains
