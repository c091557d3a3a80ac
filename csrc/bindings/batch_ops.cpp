// Checking a TBE batch and finding each table's slice of its indices, in one pass
// (torch.ops.mtrains.batch_table_bounds). The Python side (torchrec_mtrains/kernels/batch.py)
// turns a reported problem into an error naming the table; here it is only located.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace mtrains {
namespace {

// What batch_table_bounds found wrong (0: nothing).
enum BatchProblem : int64_t {
  kOk = 0,
  kBadEnds = 1,        // offsets[0] != 0 or offsets[-1] != len(indices); pos, value: first, last
  kDecreasing = 2,     // offsets[pos] < offsets[pos - 1]
  kIdOutOfRange = 3,   // indices[pos] = value is outside its table (table)
};

// indices, offsets: contiguous 1-D int64 (checked by the caller). table_rows[t]: rows of
// table t; table_of_feature[f]: the table of feature f (non-decreasing). feature_batch[f]:
// the bags of feature f (variable batch per feature), len(offsets) = sum + 1; empty: every
// feature has B bags, len(offsets) = F * B + 1. Returns (bounds [T + 1]: table t's indices
// are [bounds[t], bounds[t+1]), problem, table, pos, value).
std::tuple<std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t> BatchTableBounds(
    const at::Tensor& indices, const at::Tensor& offsets, const std::vector<int64_t>& table_rows,
    const std::vector<int64_t>& table_of_feature, const std::vector<int64_t>& feature_batch) {
  const int64_t n = indices.numel(), m = offsets.numel();
  const int64_t tables = int64_t(table_rows.size()), features = int64_t(table_of_feature.size());
  // ends[f]: the offset index where feature f's bags end.
  std::vector<int64_t> ends(size_t(features), 0);
  if (feature_batch.empty()) {
    TORCH_CHECK_VALUE(features > 0 && m >= 1 && (m - 1) % features == 0, "offsets length ", m,
                      " is not F * B + 1 with F = ", features);
    for (int64_t f = 0; f < features; ++f) ends[size_t(f)] = (f + 1) * ((m - 1) / features);
  } else {
    TORCH_CHECK_VALUE(int64_t(feature_batch.size()) == features, "feature_batch has ", feature_batch.size(),
                      " entries for ", features, " features");
    int64_t end = 0;
    for (int64_t f = 0; f < features; ++f) {
      TORCH_CHECK_VALUE(feature_batch[size_t(f)] >= 0, "feature_batch[", f, "] is negative");
      ends[size_t(f)] = end += feature_batch[size_t(f)];
    }
    TORCH_CHECK_VALUE(m == end + 1, "offsets length ", m, " is not the feature batches' sum + 1 = ", end + 1);
  }
  const int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  std::vector<int64_t> bounds(size_t(tables) + 1, 0);
  if (off[0] != 0 || off[m - 1] != n) return {bounds, kBadEnds, -1, off[0], off[m - 1]};
  for (int64_t i = 1; i < m; ++i)
    if (off[i] < off[i - 1]) return {bounds, kDecreasing, -1, i, off[i]};
  // Table t spans from its first feature's start to its last feature's end.
  for (int64_t f = 0; f < features; ++f) {
    const int64_t t = table_of_feature[size_t(f)];
    TORCH_CHECK_VALUE(t >= 0 && t < tables, "table_of_feature names table ", t, " of ", tables);
    bounds[size_t(t) + 1] = off[ends[size_t(f)]];
  }
  for (int64_t t = 0; t < tables; ++t) bounds[size_t(t) + 1] = std::max(bounds[size_t(t) + 1], bounds[size_t(t)]);
  for (int64_t t = 0; t < tables; ++t) {
    const uint64_t rows = uint64_t(table_rows[size_t(t)]);
    for (int64_t i = bounds[size_t(t)]; i < bounds[size_t(t) + 1]; ++i)
      if (uint64_t(idx[i]) >= rows) return {bounds, kIdOutOfRange, t, i, idx[i]};  // negatives wrap
  }
  return {bounds, kOk, -1, -1, 0};
}

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("batch_table_bounds(Tensor indices, Tensor offsets, int[] table_rows, int[] table_of_feature, "
        "int[] feature_batch=[]) "
        "-> (int[], int, int, int, int)");
}

TORCH_LIBRARY_IMPL(mtrains, CPU, m) { m.impl("batch_table_bounds", &mtrains::BatchTableBounds); }
