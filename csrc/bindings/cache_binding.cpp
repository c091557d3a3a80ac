// TorchScript binding of the row-cache index: torch.classes.mtrains.SetAssociativeCache.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <tuple>

#include "bindings/cache_tensors.h"
#include "cache/set_associative_cache.h"

namespace mtrains {
namespace {

class CacheHandle : public torch::CustomClassHolder {
 public:
  CacheHandle(int64_t num_slots, int64_t ways, const std::string& policy) {
    TORCH_CHECK_VALUE(num_slots >= 1, "cache num_slots=", num_slots, " must be >= 1");
    TORCH_CHECK_VALUE(ways >= 1 && ways <= 1024, "cache ways=", ways, " must be in [1, 1024]");
    CachePolicy parsed = CachePolicy::kLru;
    try {
      parsed = ParseCachePolicy(policy);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    cache_ = std::make_unique<SetAssociativeCache>(num_slots, static_cast<uint32_t>(ways), parsed);
  }

  // -> (slot per index, load_rows, load_slots, evict_rows, evict_slots)
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> plan(
      const at::Tensor& indices, int64_t step, int64_t oldest_live_step, bool train) {
    TORCH_CHECK_VALUE(indices.device().is_cpu() && indices.scalar_type() == at::kLong &&
                          indices.dim() == 1 && indices.is_contiguous(),
                      "indices must be a contiguous 1-D int64 CPU tensor");
    StepPlan plan;  // per call: the handle's methods may run on several threads at once
    cache_->Plan(indices.data_ptr<int64_t>(), indices.numel(), step, oldest_live_step, train, &plan);
    return {ToTensor(plan.slot_of_index), ToTensor(plan.load_rows), ToTensor(plan.load_slots),
            ToTensor(plan.evict_rows), ToTensor(plan.evict_slots)};
  }

  void reserve(const at::Tensor& indices, int64_t step) {
    TORCH_CHECK_VALUE(indices.device().is_cpu() && indices.scalar_type() == at::kLong &&
                          indices.dim() == 1 && indices.is_contiguous(),
                      "indices must be a contiguous 1-D int64 CPU tensor");
    try {
      cache_->Reserve(indices.data_ptr<int64_t>(), indices.numel(), step);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }

  void mark_dirty(const at::Tensor& slots) {
    TORCH_CHECK_VALUE(slots.device().is_cpu() && slots.scalar_type() == at::kLong && slots.dim() == 1,
                      "slots must be a 1-D int64 CPU tensor");
    const at::Tensor c = slots.contiguous();
    try {
      cache_->MarkDirty(c.data_ptr<int64_t>(), c.numel());
    } catch (const std::out_of_range& e) {
      TORCH_CHECK_INDEX(false, e.what());
    }
  }

  std::tuple<at::Tensor, at::Tensor> take_dirty(int64_t live_step) {
    std::vector<int64_t> rows, slots;
    cache_->TakeDirty(live_step, &rows, &slots);
    return {ToTensor(rows), ToTensor(slots)};
  }

  std::tuple<at::Tensor, at::Tensor> occupied() {
    std::vector<int64_t> rows, slots;
    cache_->Occupied(&rows, &slots);
    return {ToTensor(rows), ToTensor(slots)};
  }

  int64_t capacity() { return static_cast<int64_t>(cache_->capacity()); }

  c10::Dict<std::string, int64_t> counters() {
    const CacheCounters c = cache_->counters();
    return CountersDict(c);
  }

 private:
  std::unique_ptr<SetAssociativeCache> cache_;
};

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::CacheHandle;
  m.class_<CacheHandle>("SetAssociativeCache")
      .def(torch::init<int64_t, int64_t, std::string>(),
           "(num_slots, ways, policy 'lru'|'lfu'|'tinylfu'): a set-associative row-cache index.")
      .def("plan", &CacheHandle::plan,
           "(indices, step, oldest_live_step, train) -> (slot per index, load_rows, "
           "load_slots, evict_rows, evict_slots): assigns and locks slots for one step.")
      .def("reserve", &CacheHandle::reserve,
           "(indices, step): announces a look-ahead window step's rows; none is evicted until that step is past.")
      .def("mark_dirty", &CacheHandle::mark_dirty,
           "(slots): marks occupied slots dirty (their rows will be updated).")
      .def("take_dirty", &CacheHandle::take_dirty,
           "(live_step) -> (rows, slots) of dirty slots; those not locked by a step >= "
           "live_step become clean.")
      .def("occupied", &CacheHandle::occupied, "-> (rows, slots) of occupied slots.")
      .def("capacity", &CacheHandle::capacity,
           "Regular + overflow slots: the rows the storage behind the cache must have.")
      .def("counters", &CacheHandle::counters,
           "lookups, unique_rows, hits, misses, evictions, overflow_assignments.");
}
