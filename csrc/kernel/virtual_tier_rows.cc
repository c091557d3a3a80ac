#include "kernel/virtual_tier_rows.h"

#include <utility>

#include "storage/lazy_init.h"

namespace mtrains {

VirtualTierRows::VirtualTierRows(std::unique_ptr<TierRows> tier, std::shared_ptr<IdIndex> index,
                                 const InitialRows& init)
    : tier_(std::move(tier)), index_(std::move(index)), init_(init), row_(tier_->row_bytes()) {}

void VirtualTierRows::Split(const int64_t* rows, size_t n) {
  fresh_flags_.resize(n);
  owner_ids_.resize(n);
  index_->TakeFresh(rows, n, fresh_flags_.data(), owner_ids_.data());
  fresh_at_.clear();
  fresh_ids_.clear();
  tier_at_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (fresh_flags_[i]) {
      fresh_at_.push_back(int64_t(i));
      fresh_ids_.push_back(owner_ids_[i]);
    } else {
      tier_at_.push_back(int64_t(i));
    }
  }
}

void VirtualTierRows::MakeInitial(int64_t id, uint8_t* out) const {
  LazyInitRow(init_.seed, uint64_t(id + init_.id_offset), init_.lo, init_.hi, init_.dim, init_.state_dim,
              init_.dtype, out);
}

Status VirtualTierRows::Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
                             const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) {
  Split(load_ids, nr);
  if (fresh_at_.empty())
    return tier_->Move(slots, evict_ids, evict_slots, nw, load_ids, load_slots, nr, cpu);
  tier_rows_.clear();
  tier_slots_.clear();
  for (int64_t i : tier_at_) {
    tier_rows_.push_back(load_ids[i]);
    tier_slots_.push_back(load_slots[i]);
  }
  Status st = tier_->Move(slots, evict_ids, evict_slots, nw, tier_rows_.data(), tier_slots_.data(),
                          tier_rows_.size(), cpu);
  if (!st.ok()) return st;
  const uint64_t t0 = ThreadCpuNs();
  for (size_t k = 0; k < fresh_at_.size(); ++k) {
    MakeInitial(fresh_ids_[k], row_.data());
    slots.CopyIn(row_.data(), load_slots[fresh_at_[k]]);
  }
  cpu->copy_ns += ThreadCpuNs() - t0;
  cpu->lazy_rows += fresh_at_.size();
  return Status::Ok();
}

Status VirtualTierRows::Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) {
  Split(ids, n);
  const size_t rb = row_bytes();
  if (fresh_at_.empty()) return tier_->Read(ids, n, out, cpu);
  tier_rows_.clear();
  for (int64_t i : tier_at_) tier_rows_.push_back(ids[i]);
  tier_out_.resize(tier_rows_.size() * rb);
  Status st = tier_->Read(tier_rows_.data(), tier_rows_.size(), tier_out_.data(), cpu);
  if (!st.ok()) return st;
  for (size_t k = 0; k < tier_at_.size(); ++k)
    std::copy(tier_out_.data() + k * rb, tier_out_.data() + (k + 1) * rb, out + size_t(tier_at_[k]) * rb);
  for (size_t k = 0; k < fresh_at_.size(); ++k) MakeInitial(fresh_ids_[k], out + size_t(fresh_at_[k]) * rb);
  cpu->lazy_rows += fresh_at_.size();
  return Status::Ok();
}

}  // namespace mtrains
