// TorchScript binding of IdIndex (torch.classes.mtrains.IdIndex): a virtual table's ids to
// its rows. Calls from Python run without the GIL (TorchScript method calls release it).
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/id_index_handle.h"

namespace mtrains {
namespace {

using StatusTuple = IdIndexHandle::StatusTuple;

StatusTuple ToTuple(const Status& st) { return {static_cast<int64_t>(st.code()), st.sys_errno(), st.message()}; }

void CheckIds(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(), name,
                    " must be a contiguous 1-D int64 CPU tensor");
}

at::Tensor ToTensor(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({int64_t(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

uint32_t Seconds(int64_t now) {
  TORCH_CHECK_VALUE(now >= 0 && now <= int64_t(UINT32_MAX), "now = ", now, " must be in [0, 2^32) seconds");
  return uint32_t(now);
}

}  // namespace

// -> (status, rows, positions of the ids created)
std::tuple<IdIndexHandle::StatusTuple, at::Tensor, at::Tensor> IdIndexHandle::map(const at::Tensor& ids, bool create, int64_t now) {
  CheckIds(ids, "ids");
  const uint32_t t = Seconds(now);
  at::Tensor rows = at::empty_like(ids);
  std::vector<int64_t> created;
  Status st;
  {
    st = index()->Map(ids.data_ptr<int64_t>(), size_t(ids.numel()), create, t, rows.data_ptr<int64_t>(), &created);
  }
  return {ToTuple(st), rows, ToTensor(created)};
}

int64_t IdIndexHandle::count_missing(const at::Tensor& ids) {
  CheckIds(ids, "ids");
  return int64_t(index()->CountMissing(ids.data_ptr<int64_t>(), size_t(ids.numel())));
}

at::Tensor IdIndexHandle::find(const at::Tensor& ids) {
  CheckIds(ids, "ids");
  at::Tensor rows = at::empty_like(ids);
  index()->Find(ids.data_ptr<int64_t>(), size_t(ids.numel()), rows.data_ptr<int64_t>());
  return rows;
}

// -> (ids evicted, their rows)
std::tuple<at::Tensor, at::Tensor> IdIndexHandle::evict(double decay_rate, double count_threshold, int64_t ttl_seconds,
                                         int64_t now, const at::Tensor& keep_rows) {
  CheckIds(keep_rows, "keep_rows");
  TORCH_CHECK_VALUE(decay_rate >= 0 && decay_rate <= 1, "decay_rate = ", decay_rate, " must be in [0, 1]");
  TORCH_CHECK_VALUE(count_threshold >= 0 && ttl_seconds >= 0, "eviction thresholds must be >= 0");
  EvictionRule rule;
  rule.decay_rate = decay_rate;
  rule.count_threshold = count_threshold;
  rule.ttl_seconds = uint64_t(ttl_seconds);
  const uint32_t t = Seconds(now);
  std::vector<int64_t> ids, rows;
  {
    index()->Evict(rule, t, keep_rows.data_ptr<int64_t>(), size_t(keep_rows.numel()), &ids, &rows);
  }
  return {ToTensor(ids), ToTensor(rows)};
}

at::Tensor IdIndexHandle::remove(const at::Tensor& ids) {
  CheckIds(ids, "ids");
  std::vector<int64_t> rows;
  {
    index()->Remove(ids.data_ptr<int64_t>(), size_t(ids.numel()), &rows);
  }
  return ToTensor(rows);
}

std::tuple<at::Tensor, at::Tensor> IdIndexHandle::entries() {
  std::vector<int64_t> ids, rows;
  {
    index()->Entries(&ids, &rows);
  }
  return {ToTensor(ids), ToTensor(rows)};
}

// -> (counts float32, last-use seconds int64)
std::tuple<at::Tensor, at::Tensor> IdIndexHandle::metadata(const at::Tensor& rows) {
  CheckIds(rows, "rows");
  const int64_t n = rows.numel();
  at::Tensor counts = at::empty({n}, at::kFloat);
  std::vector<uint32_t> times(static_cast<size_t>(n));
  {
    index()->Metadata(rows.data_ptr<int64_t>(), size_t(n), counts.data_ptr<float>(), times.data());
  }
  at::Tensor t = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) t.data_ptr<int64_t>()[i] = int64_t(times[size_t(i)]);
  return {counts, t};
}

IdIndexHandle::StatusTuple IdIndexHandle::assign(const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& times) {
  CheckIds(ids, "ids");
  CheckIds(rows, "rows");
  CheckIds(times, "times");
  const int64_t n = ids.numel();
  TORCH_CHECK_VALUE(rows.numel() == n && counts.numel() == n && times.numel() == n,
                    "assign needs as many rows, counts and times as ids");
  TORCH_CHECK_VALUE(counts.scalar_type() == at::kFloat && counts.is_contiguous(), "counts must be contiguous float32");
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = Seconds(times.data_ptr<int64_t>()[i]);
  return ToTuple(index()->Assign(ids.data_ptr<int64_t>(), rows.data_ptr<int64_t>(), size_t(n),
                                 counts.data_ptr<float>(), t.data()));
}

c10::Dict<std::string, int64_t> IdIndexHandle::stats() {
  const IdIndexStats s = index()->Stats();
  c10::Dict<std::string, int64_t> d;
  d.insert("live_ids", int64_t(s.live));
  d.insert("capacity", int64_t(s.capacity));
  d.insert("rows_used", int64_t(s.rows_used));
  d.insert("table_slots", int64_t(s.table_slots));
  d.insert("index_bytes", int64_t(s.index_bytes));
  d.insert("metadata_bytes", int64_t(s.metadata_bytes));
  d.insert("ids_created", int64_t(s.ids_created));
  d.insert("ids_evicted", int64_t(s.ids_evicted));
  d.insert("eviction_passes", int64_t(s.eviction_passes));
  d.insert("fresh_loads", int64_t(s.fresh_loads));
  return d;
}

IdIndexHandle::IdIndexHandle(int64_t capacity, bool counts, bool times) {
  TORCH_CHECK_VALUE(capacity >= 1 && capacity < int64_t(UINT32_MAX) - 1, "a virtual table needs between 1 and "
                    "2^32 - 2 rows, got ", capacity);
  index_ = std::make_shared<IdIndex>(uint64_t(capacity), counts, times);
}

}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::IdIndexHandle;
  m.class_<IdIndexHandle>("IdIndex")
      .def(torch::init<int64_t, bool, bool>(), "(capacity, counts, times): a virtual table's id -> row index.")
      .def("map", &IdIndexHandle::map, "(ids, create, now) -> (status, rows, positions of the ids created).")
      .def("count_missing", &IdIndexHandle::count_missing, "(ids) -> distinct ids without a row.")
      .def("find", &IdIndexHandle::find, "(ids) -> rows (-1: none).")
      .def("evict", &IdIndexHandle::evict,
           "(decay_rate, count_threshold, ttl_seconds, now, keep_rows) -> (ids evicted, their rows).")
      .def("remove", &IdIndexHandle::remove, "(ids) -> rows freed.")
      .def("entries", &IdIndexHandle::entries, "() -> (ids, rows) of every live id, by row.")
      .def("metadata", &IdIndexHandle::metadata, "(rows) -> (counts, last-use seconds).")
      .def("assign", &IdIndexHandle::assign, "(ids, rows, counts, times) -> status: the index becomes exactly these.")
      .def("stats", &IdIndexHandle::stats, "() -> counters and bytes.");
}
