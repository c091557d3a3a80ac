// BlockStoreTierRows: the SSD tier's rows in a BlockStore (storage/block_store.h).
//
// A move packs the evicted slots into a buffer, hands it and the missing ids to one
// BlockStore::Exchange (the log appends' device writes overlapping the reads), then copies
// the rows read into their slots. Both buffers are kept from move to move.
#pragma once

#include <cstdint>
#include <vector>

#include "kernel/tier_rows.h"
#include "storage/block_store.h"

namespace mtrains {

class BlockStoreTierRows : public TierRows {
 public:
  // `store` is not owned and must outlive this object.
  explicit BlockStoreTierRows(BlockStore* store);

  size_t row_bytes() const override { return row_bytes_; }
  Status Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
              const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) override;
  Status Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) override;

 private:
  BlockStore* const store_;
  const size_t row_bytes_;
  std::vector<uint8_t> evicted_, loaded_;  // reused: no allocation per step once grown
};

}  // namespace mtrains
