// torch.ops.mtrains.batch_table_bounds: a TBE batch checked and split by table in one pass
// (kernel/batch_bounds.h). The Python side (torchrec_mtrains/kernels/batch.py) turns a
// reported problem into an error naming the table.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <stdexcept>
#include <tuple>
#include <vector>

#include "kernel/batch_bounds.h"

namespace mtrains {
namespace {

// indices, offsets: contiguous 1-D int64 (checked by the caller). Returns (bounds [T + 1]:
// table t's indices are [bounds[t], bounds[t+1]), problem, table, pos, value).
std::tuple<std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t> BatchTableBoundsOp(
    const at::Tensor& indices, const at::Tensor& offsets, const std::vector<int64_t>& table_rows,
    const std::vector<int64_t>& table_of_feature, const std::vector<int64_t>& feature_batch) {
  std::vector<int64_t> bounds;
  BatchProblem p;
  try {
    p = BatchTableBounds(indices.data_ptr<int64_t>(), size_t(indices.numel()), offsets.data_ptr<int64_t>(),
                         size_t(offsets.numel()), BatchLayout{table_rows, table_of_feature}, feature_batch, &bounds);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  return {bounds, int64_t(p.kind), p.table, p.pos, p.value};
}

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("batch_table_bounds(Tensor indices, Tensor offsets, int[] table_rows, int[] table_of_feature, "
        "int[] feature_batch=[]) "
        "-> (int[], int, int, int, int)");
}

TORCH_LIBRARY_IMPL(mtrains, CPU, m) { m.impl("batch_table_bounds", &mtrains::BatchTableBoundsOp); }
