// What the row-cache bindings hand to Python: id vectors as tensors, counters as a dict.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>

#include <cstring>
#include <string>
#include <vector>

#include "cache/set_associative_cache.h"

namespace mtrains {

inline at::Tensor ToTensor(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

inline c10::Dict<std::string, int64_t> CountersDict(const CacheCounters& c) {
  c10::Dict<std::string, int64_t> d;
  d.insert("lookups", c.lookups);
  d.insert("unique_rows", c.unique_rows);
  d.insert("hits", c.hits);
  d.insert("misses", c.misses);
  d.insert("evictions", c.evictions);
  d.insert("overflow_assignments", c.overflow_assignments);
  return d;
}

}  // namespace mtrains
