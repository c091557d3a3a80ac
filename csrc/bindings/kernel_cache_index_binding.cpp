// TorchScript binding of KernelCacheIndex (torch.classes.mtrains.KernelCacheIndex): one
// call per step plans every table's cache (the step mover moves the rows); and
// torch.ops.mtrains.mark_row_bits and mark_looked_up_rows, which record a step's rows in
// per-table bitmaps.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/cache_tensors.h"
#include "bindings/engine_parts.h"
#include "cache/kernel_cache_index.h"
#include "kernel/tier_rows.h"

namespace mtrains {
namespace {

void CheckIndexVector(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
                    name, " must be a contiguous 1-D int64 CPU tensor");
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class KernelCacheIndexHandle : public torch::CustomClassHolder {
 public:
  // `keyed`: one entry per table, or empty (no table keyed).
  KernelCacheIndexHandle(const std::vector<int64_t>& slots, const std::vector<int64_t>& rows,
                         const c10::List<bool>& dense_map, int64_t ways, const std::string& policy,
                         const c10::List<bool>& keyed) {
    TORCH_CHECK_VALUE(!slots.empty(), "a kernel cache index needs at least one table");
    TORCH_CHECK_VALUE(rows.size() == slots.size() && dense_map.size() == slots.size(), "slots (", slots.size(),
                      "), rows (", rows.size(), ") and dense_map (", dense_map.size(),
                      ") must have one entry per table");
    TORCH_CHECK_VALUE(keyed.empty() || keyed.size() == slots.size(), "keyed (", keyed.size(),
                      ") must have one entry per table (", slots.size(), ") or none");
    std::vector<TableCacheSpec> tables;
    for (size_t t = 0; t < slots.size(); ++t) {
      const bool is_keyed = !keyed.empty() && keyed.get(t);
      TORCH_CHECK_VALUE(slots[t] >= 1, "cache slots of table ", t, " = ", slots[t], " must be >= 1");
      TORCH_CHECK_VALUE(rows[t] >= 1, "rows of table ", t, " = ", rows[t], " must be >= 1");
      TORCH_CHECK_VALUE(!dense_map.get(t) || uint64_t(slots[t]) < SetAssociativeCache::kMaxMapSlots,
                        "table ", t, ": a dense row-to-slot map holds 32-bit slots; cache slots = ", slots[t],
                        " must be below ", SetAssociativeCache::kMaxMapSlots);
      TORCH_CHECK_VALUE(!(is_keyed && dense_map.get(t)), "table ", t,
                        " is keyed: its cache has no dense row-to-slot map (dense_map must be False)");
      tables.push_back(TableCacheSpec{uint64_t(slots[t]), uint64_t(rows[t]), bool(dense_map.get(t)), is_keyed});
    }
    TORCH_CHECK_VALUE(ways >= 1 && ways <= 1024, "cache ways=", ways, " must be in [1, 1024]");
    CachePolicy parsed;
    try {
      parsed = ParseCachePolicy(policy);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    index_ = std::make_unique<KernelCacheIndex>(tables, uint32_t(ways), parsed);
  }

  // Plans one step over every table.
  // -> (slot per index, tables with rows to move, and for each of those: load_rows,
  //     load_slots, evict_rows, evict_slots; seconds planning all tables, and the calling
  //     thread's CPU ns for it)
  std::tuple<at::Tensor, std::vector<int64_t>, std::vector<at::Tensor>, std::vector<at::Tensor>,
             std::vector<at::Tensor>, std::vector<at::Tensor>, double, int64_t>
  plan_step(const at::Tensor& indices, const std::vector<int64_t>& bounds, int64_t step,
            int64_t oldest_live_step, bool train) {
    CheckIndexVector(indices, "indices");
    const size_t tables = index_->num_tables();
    TORCH_CHECK_VALUE(bounds.size() == tables + 1 && bounds.back() == indices.numel(),
                      "bounds must have tables + 1 entries ending at len(indices)");
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t cpu0 = ThreadCpuNs();
    at::Tensor remapped = at::empty({indices.numel()}, at::kLong);
    size_t used = 0;
    try {
      used = index_->PlanStep(indices.data_ptr<int64_t>(), bounds, step, oldest_live_step, train,
                              remapped.data_ptr<int64_t>(), &moves_);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    std::vector<int64_t> moved;
    std::vector<at::Tensor> load_rows, load_slots, evict_rows, evict_slots;
    for (size_t k = 0; k < used; ++k) {
      const TableMoves& m = moves_[k];
      moved.push_back(m.table);
      load_rows.push_back(ToTensor(m.load_rows));
      load_slots.push_back(ToTensor(m.load_slots));
      evict_rows.push_back(ToTensor(m.evict_rows));
      evict_slots.push_back(ToTensor(m.evict_slots));
    }
    return {remapped, moved, load_rows, load_slots, evict_rows, evict_slots, SecondsSince(t0),
            int64_t(ThreadCpuNs() - cpu0)};
  }

  void mark_dirty(int64_t table, const at::Tensor& slots) {
    CheckIndexVector(slots, "slots");
    try {
      Cache(table).MarkDirty(slots.data_ptr<int64_t>(), slots.numel());
    } catch (const std::out_of_range& e) {
      TORCH_CHECK_INDEX(false, e.what());
    }
  }

  int64_t forget(int64_t table, const at::Tensor& keys) {
    CheckIndexVector(keys, "keys");
    return int64_t(Cache(table).Forget(keys.data_ptr<int64_t>(), size_t(keys.numel())));
  }

  std::tuple<at::Tensor, at::Tensor> take_dirty(int64_t table, int64_t live_step) {
    std::vector<int64_t> rows, slots;
    Cache(table).TakeDirty(live_step, &rows, &slots);
    return {ToTensor(rows), ToTensor(slots)};
  }

  std::tuple<at::Tensor, at::Tensor> occupied(int64_t table) {
    std::vector<int64_t> rows, slots;
    Cache(table).Occupied(&rows, &slots);
    return {ToTensor(rows), ToTensor(slots)};
  }

  // Whether each table's cache keeps a dense row-to-slot map.
  c10::List<bool> dense_maps() {
    c10::List<bool> out;
    for (size_t t = 0; t < index_->num_tables(); ++t) out.push_back(index_->cache(t).map_rows() > 0);
    return out;
  }

  // Whether each table's cache is keyed.
  c10::List<bool> keyed() {
    c10::List<bool> out;
    for (size_t t = 0; t < index_->num_tables(); ++t) out.push_back(index_->keyed(t));
    return out;
  }

  std::vector<int64_t> capacities() {
    std::vector<int64_t> out;
    for (size_t t = 0; t < index_->num_tables(); ++t) out.push_back(int64_t(index_->cache(t).capacity()));
    return out;
  }

  c10::Dict<std::string, int64_t> counters(int64_t table) {
    const CacheCounters c = Cache(table).counters();
    return CountersDict(c);
  }

  KernelCacheIndex* index() { return index_.get(); }

  void reset(int64_t table) {
    Cache(table);  // range check
    index_->Reset(size_t(table));
  }

 private:
  SetAssociativeCache& Cache(int64_t table) {
    TORCH_CHECK_INDEX(table >= 0 && size_t(table) < index_->num_tables(), "table ", table, " is outside [0, ",
                      index_->num_tables(), ")");
    return index_->cache(size_t(table));
  }

  std::unique_ptr<KernelCacheIndex> index_;
  std::vector<TableMoves> moves_;  // plan_step's, reused (one planner at a time)
};

uint8_t* BitmapData(const at::Tensor& bits, size_t t) {
  TORCH_CHECK_VALUE(bits.device().is_cpu() && bits.scalar_type() == at::kByte && bits.dim() == 1 &&
                        bits.is_contiguous(), "bitmap ", t, " must be a contiguous 1-D uint8 CPU tensor");
  return bits.data_ptr<uint8_t>();
}

void CheckBounds(const std::vector<at::Tensor>& bitmaps, const at::Tensor& indices,
                 const std::vector<int64_t>& bounds) {
  CheckIndexVector(indices, "indices");
  TORCH_CHECK_VALUE(bounds.size() == bitmaps.size() + 1 && bounds.back() <= indices.numel(),
                    "bounds must have one entry more than bitmaps and end inside indices");
  for (size_t t = 0; t + 1 < bounds.size(); ++t) {
    TORCH_CHECK_VALUE(0 <= bounds[t] && bounds[t] <= bounds[t + 1], "bounds must ascend from 0");
  }
}

// bitmaps[t] |= bit of each row id of table t (indices[bounds[t], bounds[t+1]), ids checked
// by the caller against the table: here only against the bitmap's size).
void MarkRowBits(const std::vector<at::Tensor>& bitmaps, const at::Tensor& indices,
                 const std::vector<int64_t>& bounds) {
  CheckBounds(bitmaps, indices, bounds);
  const int64_t* idx = indices.data_ptr<int64_t>();
  for (size_t t = 0; t < bitmaps.size(); ++t) {
    uint8_t* b = BitmapData(bitmaps[t], t);
    const uint64_t limit = uint64_t(bitmaps[t].numel()) * 8;
    for (int64_t i = bounds[t]; i < bounds[t + 1]; ++i) {
      const uint64_t id = uint64_t(idx[i]);
      TORCH_CHECK_INDEX(id < limit, "row id ", idx[i], " at position ", i, " is outside bitmap ", t, " (", limit,
                        " rows)");
      b[id >> 3] |= uint8_t(1u << (id & 7));
    }
  }
}

// As MarkRowBits for the lookups of a kernel this project does not own (FBGEMM's): an id
// outside [0, rows[t]) marks row 0, the row FBGEMM's bounds check computes it on (or its
// lookup fails), and never raises here.
void MarkLookedUpRows(const std::vector<at::Tensor>& bitmaps, const at::Tensor& indices,
                      const std::vector<int64_t>& bounds, const std::vector<int64_t>& rows) {
  CheckBounds(bitmaps, indices, bounds);
  TORCH_CHECK_VALUE(rows.size() == bitmaps.size(), "rows must have one entry per bitmap");
  const int64_t* idx = indices.data_ptr<int64_t>();
  for (size_t t = 0; t < bitmaps.size(); ++t) {
    uint8_t* b = BitmapData(bitmaps[t], t);
    TORCH_CHECK_VALUE(rows[t] >= 1 && uint64_t(rows[t]) <= uint64_t(bitmaps[t].numel()) * 8, "rows[", t, "]=",
                      rows[t], " must be in [1, the bitmap's ", bitmaps[t].numel() * 8, " bits]");
    const uint64_t limit = uint64_t(rows[t]);
    for (int64_t i = bounds[t]; i < bounds[t + 1]; ++i) {
      uint64_t id = uint64_t(idx[i]);
      id = id < limit ? id : 0;
      b[id >> 3] |= uint8_t(1u << (id & 7));
    }
  }
}

}  // namespace

KernelCacheIndex* KernelCacheIndexOfHandle(const c10::IValue& handle,
                                           c10::intrusive_ptr<c10::intrusive_ptr_target>* keep) {
  TORCH_CHECK_VALUE(
      handle.isObject() && handle.type() == c10::getCustomClassType<c10::intrusive_ptr<KernelCacheIndexHandle>>(),
      "expected a torch.classes.mtrains.KernelCacheIndex, got ", handle.type()->str());
  auto h = handle.toCustomClass<KernelCacheIndexHandle>();
  *keep = h;
  return h->index();
}

}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::KernelCacheIndexHandle;
  m.class_<KernelCacheIndexHandle>("KernelCacheIndex")
      .def(torch::init<std::vector<int64_t>, std::vector<int64_t>, c10::List<bool>, int64_t, std::string,
                       c10::List<bool>>(),
           "(slots per table, rows per table, dense row-to-slot map per table (4 bytes a table row), ways, "
           "policy 'lru'|'lfu'|'tinylfu', keyed per table ([]: none; a keyed table's cache is found by id and "
           "reports tier rows, and is planned by the step engine with its id index)): the row-cache indexes of "
           "a kernel's tables.",
           {torch::arg("slots"), torch::arg("rows"), torch::arg("dense_map"), torch::arg("ways"), torch::arg("policy"),
            torch::arg("keyed") = c10::IValue(c10::List<bool>())})
      .def("plan_step", &KernelCacheIndexHandle::plan_step,
           "(indices, bounds, step, oldest_live_step, train) -> (slot per index, moved tables, "
           "load_rows, load_slots, evict_rows, evict_slots, plan seconds, plan CPU ns). Not for an index "
           "with keyed tables (ValueError): their misses need the id index.")
      .def("mark_dirty", &KernelCacheIndexHandle::mark_dirty, "(table, slots): marks slots dirty.")
      .def("forget", &KernelCacheIndexHandle::forget,
           "(table, keys) -> how many were cached: drops them (rows, or a keyed table's ids) without writing "
           "them back.")
      .def("take_dirty", &KernelCacheIndexHandle::take_dirty,
           "(table, live_step) -> (rows, slots) of dirty slots (a keyed table's tier rows); those not locked "
           "by a step >= live_step become clean.")
      .def("occupied", &KernelCacheIndexHandle::occupied,
           "(table) -> (rows, slots) of occupied slots (a keyed table's tier rows).")
      .def("dense_maps", &KernelCacheIndexHandle::dense_maps,
           "Whether each table's cache keeps a dense row-to-slot map.")
      .def("keyed", &KernelCacheIndexHandle::keyed, "Whether each table's cache is keyed (found by id).")
      .def("capacities", &KernelCacheIndexHandle::capacities,
           "Regular + overflow slots of each table: the rows the storage behind it must have.")
      .def("counters", &KernelCacheIndexHandle::counters,
           "(table) -> lookups, unique_rows, hits, misses, evictions, overflow_assignments.")
      .def("reset", &KernelCacheIndexHandle::reset, "(table): empties the table's cache.");
  m.def("mark_row_bits(Tensor[] bitmaps, Tensor indices, int[] bounds) -> ()");
  m.def("mark_looked_up_rows(Tensor[] bitmaps, Tensor indices, int[] bounds, int[] rows) -> ()");
}

TORCH_LIBRARY_IMPL(mtrains, CPU, m) {
  m.impl("mark_row_bits", &mtrains::MarkRowBits);
  m.impl("mark_looked_up_rows", &mtrains::MarkLookedUpRows);
}
