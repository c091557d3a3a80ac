#include "kernel/batch_bounds.h"

#include <algorithm>
#include <stdexcept>

namespace mtrains {

BatchProblem BatchTableBounds(const int64_t* indices, size_t n, const int64_t* offsets, size_t m,
                              const BatchLayout& layout, const std::vector<int64_t>& feature_batch,
                              std::vector<int64_t>* bounds) {
  const size_t tables = layout.table_rows.size(), features = layout.table_of_feature.size();
  if (feature_batch.empty()) {
    if (features == 0 || m < 1 || (m - 1) % features != 0)
      throw std::invalid_argument("offsets length " + std::to_string(m) + " is not F * B + 1 with F = " +
                                  std::to_string(features));
  } else {
    if (feature_batch.size() != features)
      throw std::invalid_argument("feature_batch has " + std::to_string(feature_batch.size()) + " entries for " +
                                  std::to_string(features) + " features");
    int64_t end = 0;
    for (size_t f = 0; f < features; ++f) {
      if (feature_batch[f] < 0) throw std::invalid_argument("feature_batch[" + std::to_string(f) + "] is negative");
      end += feature_batch[f];
    }
    if (int64_t(m) != end + 1)
      throw std::invalid_argument("offsets length " + std::to_string(m) +
                                  " is not the feature batches' sum + 1 = " + std::to_string(end + 1));
  }
  bounds->assign(tables + 1, 0);
  BatchProblem p;
  if (offsets[0] != 0 || offsets[m - 1] != int64_t(n)) {
    p.kind = BatchProblemKind::kBadEnds;
    p.pos = offsets[0];
    p.value = offsets[m - 1];
    return p;
  }
  for (size_t i = 1; i < m; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      p.kind = BatchProblemKind::kDecreasing;
      p.pos = int64_t(i);
      p.value = offsets[i];
      return p;
    }
  }
  // Table t spans from its first feature's start to its last feature's end (the offset
  // index where feature f's bags end: `end`, computed as the features go).
  size_t end = 0;
  for (size_t f = 0; f < features; ++f) {
    const int64_t t = layout.table_of_feature[f];
    if (t < 0 || size_t(t) >= tables)
      throw std::invalid_argument("table_of_feature names table " + std::to_string(t) + " of " +
                                  std::to_string(tables));
    end += feature_batch.empty() ? (m - 1) / features : size_t(feature_batch[f]);
    (*bounds)[size_t(t) + 1] = offsets[end];
  }
  for (size_t t = 0; t < tables; ++t) (*bounds)[t + 1] = std::max((*bounds)[t + 1], (*bounds)[t]);
  for (size_t t = 0; t < tables; ++t) {
    const uint64_t rows = uint64_t(layout.table_rows[t]);
    for (int64_t i = (*bounds)[t]; i < (*bounds)[t + 1]; ++i) {
      if (uint64_t(indices[i]) >= rows) {  // negatives wrap
        p.kind = BatchProblemKind::kIdOutOfRange;
        p.table = int64_t(t);
        p.pos = i;
        p.value = indices[i];
        return p;
      }
    }
  }
  return p;
}

}  // namespace mtrains
