// VirtualTierRows: a virtual table's rows on its tier (kernel/id_index.h), as the step
// mover moves them.
//
// The rows live in the tier below (any TierRows: DRAM, SCM, SSD), addressed by the rows
// the IdIndex gave the ids. A row the index marks fresh (just taken by a new id) is not
// read from the tier, which still holds its previous id's bytes: its slot gets the new
// id's initial value instead, LazyInitRow of (seed, id + id_offset), the same value a
// dense table gives its row of that number. `id_offset` makes ids global (a row-wise
// shard's first id), so a row's initial value does not depend on the sharding.
#pragma once

#include <memory>
#include <vector>

#include "kernel/id_index.h"
#include "kernel/tier_rows.h"
#include "storage/block_format.h"

namespace mtrains {

struct InitialRows {
  uint64_t seed = 0;
  double lo = 0, hi = 0;
  uint32_t dim = 0, state_dim = 0;
  DType dtype = DType::kFloat32;
  int64_t id_offset = 0;
};

class VirtualTierRows : public TierRows {
 public:
  VirtualTierRows(std::unique_ptr<TierRows> tier, std::shared_ptr<IdIndex> index, const InitialRows& init);

  size_t row_bytes() const override { return tier_->row_bytes(); }
  Status Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
              const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) override;
  Status Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) override;

 private:
  // Splits rows[0..n) into fresh ones (fresh_at_: positions, fresh_ids_: their ids) and
  // the others (tier_at_), taking them from the index's fresh set.
  void Split(const int64_t* rows, size_t n);
  void MakeInitial(int64_t id, uint8_t* out) const;

  std::unique_ptr<TierRows> tier_;
  std::shared_ptr<IdIndex> index_;
  const InitialRows init_;
  std::vector<uint8_t> fresh_flags_, row_;
  std::vector<int64_t> owner_ids_, fresh_at_, fresh_ids_, tier_at_, tier_rows_, tier_slots_;
  std::vector<uint8_t> tier_out_;
};

}  // namespace mtrains
