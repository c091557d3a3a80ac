// MappedTierRows: a table whose rows are addressable in memory -- the DRAM tier's tensor or
// the SCM tier's mapped file (torchrec_mtrains/storage/scm_store.py has the file format).
//
// Each row may carry a word after the table: the crc32c of its bytes (0 mapped to 1) or a
// written flag, 0 meaning "never written" (the row reads as its lazy initial value,
// lazy_init.h). Rows move straight between the mapping and the cache slots: one copy each
// way, a loaded row's checksum checked on the copy in its slots (the bytes the step will
// use), a written row's computed from the slot it leaves.
#pragma once

#include <cstdint>
#include <string>

#include "kernel/tier_rows.h"
#include "storage/block_format.h"

namespace mtrains {

class MappedTierRows : public TierRows {
 public:
  enum class Words { kNone, kWrittenFlags, kChecksums };

  struct Layout {
    uint8_t* rows = nullptr;  // num_rows * row_bytes, not owned (must outlive this object)
    uint64_t num_rows = 0;
    void* words = nullptr;  // one per row: uint8_t flags or uint32_t checksums; null with kNone
    Words kind = Words::kNone;
    uint32_t dim = 0, state_dim = 0;  // values per row (state in the weights' dtype)
    DType dtype = DType::kFloat32;
    uint64_t seed = 0;  // lazy initial values (kWrittenFlags, kChecksums)
    double init_lo = 0, init_hi = 0;
    std::string name;            // the file (or table) errors name
    uint64_t first_row_offset = 0;  // byte offset of row 0 in the file, for error messages
  };

  // Throws std::invalid_argument when the layout is inconsistent (no rows, words missing).
  explicit MappedTierRows(Layout layout);

  size_t row_bytes() const override { return row_bytes_; }
  Status Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
              const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) override;
  Status Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) override;

 private:
  Status CheckIds(const int64_t* ids, size_t n) const;
  Status CorruptRow(int64_t id) const;
  uint32_t Word(int64_t id) const;  // 0: never written
  void SetWord(int64_t id, uint32_t crc);
  uint8_t* Row(int64_t id) const { return layout_.rows + size_t(id) * row_bytes_; }
  void LazyRow(int64_t id, uint8_t* out) const;

  const Layout layout_;
  const size_t row_bytes_;
};

}  // namespace mtrains
