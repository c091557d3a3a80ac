// BatchBounds: checks a TBE batch and finds each table's slice of its indices, in one pass.
//
// A batch's indices come feature-major (FBGEMM's layout): feature f's bags are consecutive
// offsets, a table's features adjacent and tables in order, so table t's indices are one
// slice [bounds[t], bounds[t + 1]). The caller turns a reported problem into an error that
// names the table (torchrec_mtrains/kernels/batch.py); here it is only located.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mtrains {

// What a batch check found wrong.
enum class BatchProblemKind : int64_t {
  kOk = 0,
  kBadEnds = 1,       // offsets[0] != 0 or offsets[-1] != len(indices); pos, value: first, last
  kDecreasing = 2,    // offsets[pos] = value < offsets[pos - 1]
  kIdOutOfRange = 3,  // indices[pos] = value is outside table `table`
};

struct BatchProblem {
  BatchProblemKind kind = BatchProblemKind::kOk;
  int64_t table = -1, pos = -1, value = 0;
};

// The batch's layout: table t has table_rows[t] ids; feature f belongs to table
// table_of_feature[f] (non-decreasing). feature_batch[f]: the bags of feature f (a variable
// batch per feature), offsets then have sum + 1 entries; empty: every feature has B bags and
// offsets F * B + 1.
struct BatchLayout {
  std::vector<int64_t> table_rows;
  std::vector<int64_t> table_of_feature;
};

// Fills bounds (tables + 1 entries) and returns the first problem (kind kOk: none).
// Throws std::invalid_argument for offsets whose length does not fit the layout.
BatchProblem BatchTableBounds(const int64_t* indices, size_t n, const int64_t* offsets, size_t m,
                              const BatchLayout& layout, const std::vector<int64_t>& feature_batch,
                              std::vector<int64_t>* bounds);

}  // namespace mtrains
