#include "kernel/block_store_tier_rows.h"

namespace mtrains {
namespace {

constexpr size_t kAhead = 8;  // slots between a slot's prefetch and its copy

}  // namespace

BlockStoreTierRows::BlockStoreTierRows(BlockStore* store)
    : store_(store), row_bytes_(store->header().geometry.row_bytes) {}

Status BlockStoreTierRows::Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots,
                                size_t nw, const int64_t* load_ids, const int64_t* load_slots, size_t nr,
                                StageCpu* cpu) {
  if (slots.row_bytes() != row_bytes_)
    return Status::InvalidArgument(store_->path() + ": cache slots hold rows of " +
                                   std::to_string(slots.row_bytes()) + " bytes; the store's are " +
                                   std::to_string(row_bytes_));
  const uint64_t t0 = ThreadCpuNs();
  if (evicted_.size() < nw * row_bytes_) evicted_.resize(nw * row_bytes_ + nw * row_bytes_ / 2);
  for (size_t i = 0; i < nw; ++i) {
    if (i + kAhead < nw) slots.Prefetch<SlotRows::kMoveLocality>(evict_slots[i + kAhead], false);
    slots.CopyOut(evict_slots[i], evicted_.data() + i * row_bytes_);
  }
  if (loaded_.size() < nr * row_bytes_) loaded_.resize(nr * row_bytes_ + nr * row_bytes_ / 2);
  const uint64_t t1 = ThreadCpuNs();
  // The store verifies each block it reads: verify is part of read here.
  Status st = store_->Exchange(evict_ids, nw, evicted_.data(), load_ids, nr, loaded_.data());
  const uint64_t t2 = ThreadCpuNs();
  cpu->write_back_ns += t1 - t0;
  cpu->read_ns += t2 - t1;
  if (!st.ok()) return st;
  for (size_t i = 0; i < nr; ++i) {
    if (i + kAhead < nr) slots.Prefetch<SlotRows::kMoveLocality>(load_slots[i + kAhead], true);
    slots.CopyIn(loaded_.data() + i * row_bytes_, load_slots[i]);
  }
  cpu->copy_ns += ThreadCpuNs() - t2;
  return Status::Ok();
}

Status BlockStoreTierRows::Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) {
  const uint64_t t0 = ThreadCpuNs();
  Status st = store_->Read(ids, n, out);
  cpu->read_ns += ThreadCpuNs() - t0;
  return st;
}

}  // namespace mtrains
